"""The one in-process retry helper and the one Retry-After parser."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot.clock import VirtualClock
from bot.retry import call_with_retries, exponential_delay, parse_retry_after


def test_retry_after_in_seconds_dates_and_rate_limit_reset() -> None:
    now = datetime(2025, 3, 3, 10, 0, tzinfo=UTC)
    assert parse_retry_after({"Retry-After": "30"}, now=now) == 30.0
    assert parse_retry_after({"Retry-After": "1.5"}, now=now) == 1.5
    assert parse_retry_after({"Retry-After": "-4"}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "Mon, 03 Mar 2025 10:01:00 GMT"}, now=now) == 60.0
    assert parse_retry_after({"Retry-After": "soon"}, now=now) is None
    assert parse_retry_after({"Retry-After": "inf"}, now=now) is None
    assert parse_retry_after({}, now=now) is None
    reset = str(int(now.timestamp()) + 90)
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset}
    assert parse_retry_after(headers, now=now) == 90.0
    assert (
        parse_retry_after({"x-ratelimit-remaining": "10", "x-ratelimit-reset": reset}, now=now)
        is None
    )


def test_exponential_delay_doubles_from_the_second_attempt_and_caps() -> None:
    delays = [exponential_delay(attempt, base_s=1.0, max_s=5.0) for attempt in range(1, 6)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_exponential_delay_of_a_long_run_of_failures_is_the_cap() -> None:
    """A retry count in the thousands (a chunk or outage that keeps failing) waits the cap; the
    plain 2 ** n of such a count does not fit a float."""
    assert exponential_delay(10_000, base_s=2.0, max_s=300.0) == 300.0


class Flaky(Exception):
    def __init__(self, retryable: bool) -> None:
        super().__init__("flaky")
        self.retryable = retryable


async def test_retries_until_success_and_asks_the_delay_only_before_a_retry() -> None:
    clock = VirtualClock()
    outcomes: list[Exception | str] = [Flaky(True), Flaky(True), "done"]
    asked: list[int] = []
    announced: list[tuple[int, float]] = []

    async def call() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def delay(error: BaseException, attempt: int) -> float:
        asked.append(attempt)
        return 10.0 * attempt

    async def before_retry(error: BaseException, attempt: int, seconds: float) -> None:
        announced.append((attempt, seconds))

    result = await call_with_retries(
        call,
        attempts=3,
        retryable=lambda error: isinstance(error, Flaky) and error.retryable,
        delay=delay,
        sleep=clock.sleep,
        before_retry=before_retry,
    )
    assert result == "done"
    assert asked == [1, 2]
    assert announced == [(1, 10.0), (2, 20.0)]
    assert clock.sleeps == [10.0, 20.0]


async def test_gives_up_after_the_attempts_without_a_last_wait() -> None:
    clock = VirtualClock()
    calls = 0
    asked: list[int] = []

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise Flaky(True)

    def delay(error: BaseException, attempt: int) -> float:
        asked.append(attempt)
        return 1.0

    with pytest.raises(Flaky):
        await call_with_retries(
            call, attempts=3, retryable=lambda error: True, delay=delay, sleep=clock.sleep
        )
    assert calls == 3
    assert asked == [1, 2]
    assert clock.sleeps == [1.0, 1.0]


async def test_an_error_that_is_not_retryable_is_raised_at_once() -> None:
    clock = VirtualClock()
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise Flaky(False)

    with pytest.raises(Flaky):
        await call_with_retries(
            call,
            attempts=5,
            retryable=lambda error: isinstance(error, Flaky) and error.retryable,
            delay=lambda error, attempt: 1.0,
            sleep=clock.sleep,
        )
    assert calls == 1
    assert clock.sleeps == []
