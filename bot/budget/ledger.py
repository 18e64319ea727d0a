"""The write budget's two homes: PostgreSQL (shared by every process) and one process's memory.

Both run the same loop around the pure decision (bot/budget/decide.py): register a claim, ask
whether it spends, wait as long as the decision says (looking again at least every
`poll_max_s`), until it spends, is dropped (news) or is coalesced into a newer write.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncConnection

from bot.budget.decide import (
    HOUR_S,
    BudgetLimits,
    Claim,
    Drop,
    Spend,
    Superseded,
    Verdict,
    Wait,
    WriteValue,
    counted_from,
    decide_spend,
)
from bot.budget.intent import (
    DEFAULT_LEVEL,
    WriteDeferred,
    WriteDropped,
    WriteSuperseded,
    current_intent,
)
from bot.config import DEFAULTS
from bot.errors import ForgeError, StoreError
from bot.queue.connector import Connector
from bot.queue.sql import budget as sql

log = logging.getLogger(__name__)

Now = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]

# The settings' defaults: GitHub's documented secondary limits for content-creating requests
# ("no more than 80 content-generating requests per minute and no more than 500 ... per hour"),
# GitLab's default note creation limit (300 a minute per user) and no hourly one. Besides,
# GitHub advises waiting a second between POST/PATCH/PUT/DELETE requests.
GITHUB_LIMITS = BudgetLimits(
    per_minute=DEFAULTS.budget.github_writes_per_minute,
    per_hour=DEFAULTS.budget.github_writes_per_hour,
    min_interval_s=1.0,
)
GITLAB_LIMITS = BudgetLimits(
    per_minute=DEFAULTS.budget.gitlab_writes_per_minute,
    per_hour=DEFAULTS.budget.gitlab_writes_per_hour,
    min_interval_s=0.0,
)
DEFAULT_LIMITS: Mapping[str, BudgetLimits] = {"github": GITHUB_LIMITS, "gitlab": GITLAB_LIMITS}


@dataclass(frozen=True, slots=True)
class BudgetKey:
    """One forge identity whose writes share a budget."""

    forge: str
    name: str  # "installation:42", or "token:" and a hash of the token

    def __str__(self) -> str:
        return f"{self.forge}:{self.name}"


def token_name(secret: str | None, *, scope: str = "") -> str:
    """The budget name of a token: a short hash, never the token."""
    digest = hashlib.sha256(f"{scope}\0{secret or ''}".encode()).hexdigest()[:16]
    return f"token:{digest}"


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What one write asks of its budget."""

    value: WriteValue
    level: int
    action: str
    asked_at: datetime
    job_id: int | None = None
    target: str | None = None


class WriteBudget(Protocol):
    """What the forge clients need: spend before a write, pause when the forge says so."""

    async def spend(self, key: BudgetKey, *, action: str, value: WriteValue) -> int:
        """Wait for room, then count the write; raises WriteHeld when it must not go out.
        Returns the write's id for `answered`."""

    async def answered(self, key: BudgetKey, write_id: int) -> None:
        """The forge answered write `write_id` (or the call ended): it counts from then on,
        less the lead of `counted_from`."""

    async def hold(self, key: BudgetKey, seconds: float) -> None:
        """No write of `key` before `seconds` from now (the forge's Retry-After)."""


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """Limits per forge, how long a silent claim stays live, how often a waiter looks."""

    limits: Mapping[str, BudgetLimits] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    # A waiter looks again at least every `poll_max_s`: a claim untouched for that and a
    # margin is a stopped process's, and no longer holds the line (a dispatcher killed with
    # writes waiting held every other writer of its installation back for up to 30 s).
    stale_s: float = 15.0
    poll_max_s: float = 10.0

    def __post_init__(self) -> None:
        if self.stale_s <= self.poll_max_s:
            raise ValueError("stale_s must exceed poll_max_s: a live waiter's claim would lapse")

    def limits_of(self, forge: str) -> BudgetLimits:
        return self.limits.get(forge) or DEFAULT_LIMITS.get(forge) or GITHUB_LIMITS


class _BudgetLoop:
    """The spend loop both homes share; subclasses decide one step and forget a claim."""

    def __init__(self, *, now: Now, sleep: Sleep, settings: BudgetSettings | None) -> None:
        self.now = now
        self.sleep = sleep
        self.settings = settings or BudgetSettings()
        self.spent = 0
        self.waited_s = 0.0

    async def _step(
        self, key: BudgetKey, request: ClaimRequest, claim_id: int | None, now: datetime
    ) -> tuple[Verdict, int]:
        raise NotImplementedError

    async def _forget(self, key: BudgetKey, claim_id: int) -> None:
        raise NotImplementedError

    async def _defer(self, key: BudgetKey, claim_id: int, now: datetime) -> None:
        raise NotImplementedError

    async def spend(self, key: BudgetKey, *, action: str, value: WriteValue) -> int:
        intent = current_intent()
        first = self.now()
        request = ClaimRequest(
            asked_at=first,
            value=intent.value if intent is not None and intent.value is not None else value,
            level=intent.level if intent is not None else DEFAULT_LEVEL,
            action=action,
            job_id=intent.job_id if intent is not None else None,
            target=intent.target if intent is not None else None,
        )
        max_wait_s = intent.max_wait_s if intent is not None else None
        claim_id: int | None = None
        try:
            while True:
                now = self.now()
                verdict, claim_id = await self._step(key, request, claim_id, now)
                if isinstance(verdict, Spend):
                    self.spent += 1
                    self.waited_s += (now - first).total_seconds()
                    claim_id = None  # the step removed it
                    return verdict.write_id
                if isinstance(verdict, Drop):
                    claim_id = None
                    raise WriteDropped(f"{action} for {key}: {verdict.reason}")
                if isinstance(verdict, Superseded):
                    claim_id = None
                    raise WriteSuperseded(f"{action} for {key}: a newer write replaces it")
                assert isinstance(verdict, Wait)
                if max_wait_s is not None and (now - first).total_seconds() + verdict.seconds > (
                    max_wait_s
                ):
                    # The claim leaves the line, which must not keep a slot for a writer that
                    # is gone, and keeps its place for the target's next claim until stale.
                    deferred, claim_id = claim_id, None
                    await asyncio.shield(self._defer(key, deferred, now))
                    raise WriteDeferred(
                        f"{action} for {key}: no room for {verdict.seconds:.0f} s",
                        retry_after=verdict.seconds,
                    )
                await self.sleep(min(verdict.seconds, self.settings.poll_max_s))
        finally:
            if claim_id is not None:
                # Cancelled or failed while waiting: leave the line at once.
                await asyncio.shield(self._forget(key, claim_id))


class PostgresWriteBudget(_BudgetLoop):
    """The budget every process shares: writes, claims and pauses in PostgreSQL."""

    def __init__(
        self,
        connector: Connector,
        *,
        now: Now,
        sleep: Sleep = asyncio.sleep,
        settings: BudgetSettings | None = None,
    ) -> None:
        super().__init__(now=now, sleep=sleep, settings=settings)
        self.connector = connector

    async def _step(
        self, key: BudgetKey, request: ClaimRequest, claim_id: int | None, now: datetime
    ) -> tuple[Verdict, int]:
        limits = self.settings.limits_of(key.forge)
        stale = now - timedelta(seconds=self.settings.stale_s)
        name = str(key)
        try:
            async with self.connector.transaction() as conn:
                await conn.execute(sql.LOCK_BUDGET, {"key": name})
                blocked_until = await conn.scalar(
                    sql.UPSERT_BUDGET,
                    {
                        "key": name,
                        "forge": key.forge,
                        "per_minute": limits.per_minute,
                        "per_hour": limits.per_hour,
                        "now": now,
                    },
                )
                if claim_id is None:
                    row = (
                        await conn.execute(
                            sql.INSERT_CLAIM,
                            {
                                "key": name,
                                "value": int(request.value),
                                "level": int(request.level),
                                "target": request.target,
                                "job_id": request.job_id,
                                "now": now,
                                "stale": stale,
                            },
                        )
                    ).one()
                    claim_id, requested_at = int(row.id), row.requested_at
                else:
                    requested_at = await conn.scalar(sql.TOUCH_CLAIM, {"id": claim_id, "now": now})
                    if requested_at is None:
                        return Superseded(0), claim_id
                me = Claim(
                    claim_id, request.value, request.level, requested_at, target=request.target
                )
                verdict = await self._decide(conn, name, me, limits, now, stale, blocked_until)
                verdict = await self._settle(conn, name, me, request, verdict, now)
                return verdict, claim_id
        except StoreError as exc:
            raise ForgeError(f"the write budget of {key} is not readable: {exc}") from exc

    async def _decide(
        self,
        conn: AsyncConnection,
        name: str,
        me: Claim,
        limits: BudgetLimits,
        now: datetime,
        stale: datetime,
        blocked_until: datetime | None,
    ) -> Verdict:
        since = now - timedelta(seconds=limits.horizon_s)
        spent = list(
            (await conn.execute(sql.SELECT_SPENT, {"key": name, "since": since})).scalars()
        )
        waiting = [
            Claim(int(row.id), WriteValue(row.value), int(row.level), row.requested_at, row.target)
            for row in await conn.execute(sql.SELECT_CLAIMS, {"key": name, "stale": stale})
        ]
        return decide_spend(me, waiting, spent, now=now, limits=limits, blocked_until=blocked_until)

    async def _settle(
        self,
        conn: AsyncConnection,
        name: str,
        me: Claim,
        request: ClaimRequest,
        verdict: Verdict,
        now: datetime,
    ) -> Verdict:
        """Leave the line unless waiting; record a spend (the verdict returned carries its id)."""
        if isinstance(verdict, Wait):
            return verdict
        await conn.execute(sql.DELETE_CLAIM, {"id": me.id})
        if not isinstance(verdict, Spend):
            return verdict
        write_id = await conn.scalar(
            sql.RECORD_WRITE,
            {
                "key": name,
                "now": now,
                "value": int(request.value),
                "level": int(request.level),
                "action": request.action,
                "job_id": request.job_id,
                "asked_at": request.asked_at,
            },
        )
        # A day of writes stays for reports (how long reviews waited for the budget).
        before = now - timedelta(seconds=24 * HOUR_S)
        await conn.execute(sql.PRUNE_WRITES, {"key": name, "before": before})
        stale = now - timedelta(seconds=HOUR_S)
        await conn.execute(sql.PRUNE_CLAIMS, {"key": name, "before": stale})
        return Spend(write_id=int(write_id))

    async def _best_effort(
        self, statement: TextClause, params: dict[str, Any], *, failed: str, action: str
    ) -> None:
        """Run one statement; when the database is not there, log `failed` and go on."""
        try:
            async with self.connector.transaction() as conn:
                await conn.execute(statement, params)
        except StoreError as exc:
            log.warning("%s: %s", failed, exc, extra={"action": action})

    async def _forget(self, key: BudgetKey, claim_id: int) -> None:
        await self._best_effort(
            sql.DELETE_CLAIM,
            {"id": claim_id},
            failed=f"claim {claim_id} of {key} not removed (it goes stale)",
            action="budget_claim_left",
        )

    async def _defer(self, key: BudgetKey, claim_id: int, now: datetime) -> None:
        await self._best_effort(
            sql.DEFER_CLAIM,
            {"id": claim_id, "now": now},
            failed=f"claim {claim_id} of {key} not marked deferred (it holds the line until stale)",
            action="budget_claim_left",
        )

    async def answered(self, key: BudgetKey, write_id: int) -> None:
        at = counted_from(self.now(), self.settings.limits_of(key.forge))
        # Not re-timed, the write is still counted from its decision: a little early.
        await self._best_effort(
            sql.WRITE_ANSWERED,
            {"id": write_id, "at": at},
            failed=f"write {write_id} of {key} not re-timed",
            action="budget_write_untimed",
        )

    async def hold(self, key: BudgetKey, seconds: float) -> None:
        limits = self.settings.limits_of(key.forge)
        now = self.now()
        try:
            async with self.connector.transaction() as conn:
                await conn.execute(
                    sql.HOLD_BUDGET,
                    {
                        "key": str(key),
                        "forge": key.forge,
                        "per_minute": limits.per_minute,
                        "per_hour": limits.per_hour,
                        "until": now + timedelta(seconds=max(0.0, seconds)),
                        "now": now,
                    },
                )
        except StoreError as exc:
            raise ForgeError(f"the write budget of {key} is not writable: {exc}") from exc
        log.warning(
            "%s told to pause writes for %.0f s",
            key,
            seconds,
            extra={"action": "budget_hold", "budget": str(key)},
        )


@dataclass(slots=True)
class _LocalState:
    spent: dict[int, datetime] = field(default_factory=dict)  # write id -> when it counts
    claims: dict[int, tuple[Claim, datetime]] = field(default_factory=dict)
    deferred: set[int] = field(default_factory=set)  # claims out of the line, lending a place
    blocked_until: datetime | None = None


class LocalWriteBudget(_BudgetLoop):
    """One process's budget, for a forge client built without a database (tools, tests)."""

    def __init__(
        self, *, now: Now, sleep: Sleep = asyncio.sleep, settings: BudgetSettings | None = None
    ) -> None:
        super().__init__(now=now, sleep=sleep, settings=settings)
        self._states: dict[str, _LocalState] = {}
        self._ids = 0

    async def _step(
        self, key: BudgetKey, request: ClaimRequest, claim_id: int | None, now: datetime
    ) -> tuple[Verdict, int]:
        state = self._states.setdefault(str(key), _LocalState())
        limits = self.settings.limits_of(key.forge)
        stale = now - timedelta(seconds=self.settings.stale_s)
        if claim_id is None:
            self._ids += 1
            claim_id = self._ids
            same = [
                claim.requested_at
                for claim, seen in state.claims.values()
                if request.target is not None and claim.target == request.target and seen > stale
            ]
            requested_at = min([now, *same])
        elif claim_id in state.claims:
            requested_at = state.claims[claim_id][0].requested_at
        else:
            return Superseded(0), claim_id
        me = Claim(claim_id, request.value, request.level, requested_at, target=request.target)
        state.claims[claim_id] = (me, now)
        long_dead = now - timedelta(seconds=HOUR_S)
        state.claims = {key: item for key, item in state.claims.items() if item[1] > long_dead}
        state.deferred &= state.claims.keys()
        waiting = [
            claim
            for claim, seen in state.claims.values()
            if seen > stale and claim.id not in state.deferred
        ]
        horizon = now - timedelta(seconds=limits.horizon_s)
        state.spent = {key: moment for key, moment in state.spent.items() if moment > horizon}
        spent = sorted(state.spent.values())
        verdict = decide_spend(
            me, waiting, spent, now=now, limits=limits, blocked_until=state.blocked_until
        )
        if not isinstance(verdict, Wait):
            state.claims.pop(claim_id, None)
        if isinstance(verdict, Spend):
            self._ids += 1
            state.spent[self._ids] = now
            verdict = Spend(write_id=self._ids)
        return verdict, claim_id

    async def _forget(self, key: BudgetKey, claim_id: int) -> None:
        self._states.setdefault(str(key), _LocalState()).claims.pop(claim_id, None)

    async def _defer(self, key: BudgetKey, claim_id: int, now: datetime) -> None:
        state = self._states.setdefault(str(key), _LocalState())
        if claim_id in state.claims:
            state.deferred.add(claim_id)

    async def answered(self, key: BudgetKey, write_id: int) -> None:
        spent = self._states.setdefault(str(key), _LocalState()).spent
        if write_id in spent:
            limits = self.settings.limits_of(key.forge)
            spent[write_id] = max(spent[write_id], counted_from(self.now(), limits))

    async def hold(self, key: BudgetKey, seconds: float) -> None:
        state = self._states.setdefault(str(key), _LocalState())
        until = self.now() + timedelta(seconds=max(0.0, seconds))
        state.blocked_until = max(until, state.blocked_until or until)


__all__ = [
    "DEFAULT_LIMITS",
    "GITHUB_LIMITS",
    "GITLAB_LIMITS",
    "BudgetKey",
    "BudgetSettings",
    "ClaimRequest",
    "LocalWriteBudget",
    "PostgresWriteBudget",
    "WriteBudget",
    "token_name",
]
