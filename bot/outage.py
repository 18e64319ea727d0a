"""Riding out a database outage: back off with jitter, say once that it went and came back."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from bot.retry import exponential_delay

log = logging.getLogger(__name__)

# However long the outage, a role looks again at least this often.
MAX_OUTAGE_BACKOFF_S = 30.0


def backoff_delay(failures: int, *, base_s: float, cap_s: float, jitter: float) -> float:
    """Seconds to wait after `failures` failures in a row: doubling from `base_s` up to
    `cap_s`, then spread over its upper half by `jitter` in [0, 1] so that the processes
    which lost the database together do not all come back at the same instant."""
    if failures < 1:
        return 0.0
    ceiling = exponential_delay(failures, base_s=base_s, max_s=cap_s)
    return ceiling / 2 + ceiling / 2 * min(max(jitter, 0.0), 1.0)


class OutageWatch:
    """One role's view of the database: counts failures in a row, logs the loss once and the
    recovery once, and says how long to wait before the next try."""

    def __init__(
        self,
        role: str,
        *,
        base_s: float = 1.0,
        cap_s: float = MAX_OUTAGE_BACKOFF_S,
        jitter: Callable[[], float] = random.random,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.role = role
        self.base_s = base_s
        self.cap_s = max(cap_s, base_s)
        self.failures = 0
        self._jitter = jitter
        self._monotonic = monotonic
        self._since: float | None = None

    @property
    def available(self) -> bool:
        return self.failures == 0

    def lost(self, error: BaseException) -> float:
        """Record a failed try; returns the seconds to wait before the next one."""
        self.failures += 1
        if self.failures == 1:
            self._since = self._monotonic()
            log.warning(
                "%s: database unavailable, retrying with backoff: %s",
                self.role,
                error,
                extra={"action": "database_lost", "role": self.role},
            )
        return backoff_delay(
            self.failures, base_s=self.base_s, cap_s=self.cap_s, jitter=self._jitter()
        )

    def recovered(self) -> None:
        """Record a successful try; logs the recovery if the database had been away."""
        if self.failures == 0:
            return
        away_s = self._monotonic() - (self._since if self._since is not None else 0.0)
        log.info(
            "%s: database back after %.1f s (%d failed tries)",
            self.role,
            away_s,
            self.failures,
            extra={"action": "database_back", "role": self.role},
        )
        self.failures = 0
        self._since = None


__all__ = ["MAX_OUTAGE_BACKOFF_S", "OutageWatch", "backoff_delay"]
