"""In-process retries: `Retry-After` parsing and backoff around one awaited call (tenacity).

For waits short enough to hold a coroutine through (a forge call, an LLM call). A job that
must wait longer is deferred in the database instead (bot/review/deferral.py).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]
# (the error, the number of attempts made so far) -> seconds to wait before the next one
Delay = Callable[[BaseException, int], float]
BeforeRetry = Callable[[BaseException, int, float], Awaitable[None]]


def parse_retry_after(headers: Mapping[str, str], *, now: datetime) -> float | None:
    """Seconds to wait from `Retry-After` (seconds or HTTP date) or `x-ratelimit-reset`."""
    lowered = {key.lower(): value for key, value in headers.items()}
    value = (lowered.get("retry-after") or "").strip()
    if value:
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds):
            return max(0.0, seconds)
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            return max(0.0, (when - now).total_seconds())
    reset = lowered.get("x-ratelimit-reset")
    if reset and reset.strip().isdigit() and lowered.get("x-ratelimit-remaining") == "0":
        return max(0.0, float(reset) - now.timestamp())
    return None


def exponential_delay(attempt: int, *, base_s: float, max_s: float) -> float:
    """`base_s` doubled for each attempt after the first (attempt counts from 1), capped.

    The one backoff formula of the project: in-process retries, deferred jobs and chunks, LLM
    calls (jittered) and outages (jittered) all double from it. The exponent is bounded so that
    a count in the thousands still gives `max_s`, not an OverflowError.
    """
    return float(min(max_s, base_s * 2.0 ** min(max(attempt - 1, 0), 1000)))


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    retryable: Callable[[BaseException], bool],
    delay: Delay,
    sleep: Sleep,
    before_retry: BeforeRetry | None = None,
) -> T:
    """Await `call` up to `attempts` times while it raises a retryable error; re-raises the last.

    `delay` is asked only before a retry that will happen, so a stateful delay (a jittered one
    drawing from a seeded generator) sees exactly one draw per wait.
    """

    def wait(state: RetryCallState) -> float:
        if state.attempt_number >= attempts or state.outcome is None:
            return 0.0
        error = state.outcome.exception()
        return delay(error, state.attempt_number) if error is not None else 0.0

    async def announce(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if before_retry is not None and error is not None:
            seconds = state.next_action.sleep if state.next_action is not None else 0.0
            await before_retry(error, state.attempt_number, seconds)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait,
        retry=retry_if_exception(retryable),
        sleep=sleep,
        before_sleep=announce,
        reraise=True,
    )
    return await retrying(call)
