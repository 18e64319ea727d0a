"""The write budget in PostgreSQL, shared by processes, against the emulator's secondary limits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta

import aiohttp
import pytest
from aiohttp import web
from sqlalchemy import text

from bot.budget.decide import BudgetLimits, WriteValue
from bot.budget.intent import WriteDeferred, WriteDropped, WriteIntent, writing
from bot.budget.ledger import (
    BudgetKey,
    BudgetSettings,
    LocalWriteBudget,
    PostgresWriteBudget,
    WriteBudget,
)
from bot.clock import VirtualClock
from bot.db import create_engine
from bot.emulator import EmulatorState, Fault, ForgeEmulator, generate_file_changes
from bot.forges.base import RetryPolicy
from bot.forges.github import GitHubClient
from bot.obs.metrics import setup_metrics
from bot.queue.connector import Connector
from bot.queue.monitoring import MonitoringRecords
from tests.support.pipeline_helpers import APP_ID
from tests.support.web import ClientMaker, samples

TOKEN = "ghp-budget"
REPO = "acme/shop"
# A small budget, so a test fills it in a few writes: 10 a minute, no hourly window.
TIGHT = BudgetLimits(per_minute=10, per_hour=0, min_interval_s=0.0, margin_s=0.5)
KEY = BudgetKey("github", "installation:9")


def _tight_with_one_pull(state: EmulatorState) -> None:
    """GitHub's secondary limit at 10 a minute, and the pull request the comments go on."""
    state.set_content_limits("github", per_minute=10, per_hour=0)
    state.add_pull("github", REPO, 1, files=generate_file_changes(changed_lines=10, files=1))


pytestmark = pytest.mark.emulator(
    github_tokens={TOKEN}, gitlab_tokens=set(), prepare=_tight_with_one_pull
)


@pytest.fixture
async def connectors(db_url: str) -> AsyncIterator[tuple[Connector, Connector]]:
    """Two connection pools on one database: what two processes each hold."""
    first = Connector(create_engine(db_url, pool_size=2))
    second = Connector(create_engine(db_url, pool_size=2))
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


def shared(connector: Connector, clock: VirtualClock) -> PostgresWriteBudget:
    # Every sleeper moves the one virtual clock, so a claim's silence looks longer than it is:
    # claims stay live for ten virtual minutes here.
    settings = BudgetSettings({"github": TIGHT}, stale_s=600.0, poll_max_s=1.0)
    return PostgresWriteBudget(connector, now=clock.now, sleep=clock.sleep, settings=settings)


def client(
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    budget: WriteBudget,
) -> GitHubClient:
    return GitHubClient(
        session,
        base_url=emulator.github_url,
        token=TOKEN,
        clock=clock.now,
        sleep=clock.sleep,
        retry=RetryPolicy(attempts=3),
        budget=budget,
    )


def comment_times(emulator: ForgeEmulator) -> list[datetime]:
    return sorted(
        item.at
        for item in emulator.state.requests
        if item.route == "github.comments.create" and item.status == 201
    )


def most_in_a_minute(times: list[datetime]) -> int:
    return max(
        (sum(1 for other in times[index:] if other - start < timedelta(minutes=1)))
        for index, start in enumerate(times)
    )


async def post_comments(github: GitHubClient, count: int, name: str) -> None:
    for index in range(count):
        await github.post_comment(REPO, 1, f"{name} {index}")


async def test_two_processes_sharing_the_budget_never_meet_the_secondary_limit(
    connectors: tuple[Connector, Connector],
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
) -> None:
    """Two processes post 15 comments each through one token: together they keep the
    emulator's 10 a minute, so GitHub never answers 403 and every comment is posted."""
    one = client(emulator, session, clock, shared(connectors[0], clock))
    two = client(emulator, session, clock, shared(connectors[1], clock))
    await asyncio.gather(post_comments(one, 15, "one"), post_comments(two, 15, "two"))
    times = comment_times(emulator)
    assert len(times) == 30
    assert emulator.state.content.refused == 0
    assert most_in_a_minute(times) <= 10


async def test_two_processes_each_with_its_own_budget_meet_the_secondary_limit(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    """The same two processes pacing only themselves (the old per-process pacing) write 20 in
    a minute and meet GitHub's 403s: what the shared budget is for."""
    settings = BudgetSettings({"github": TIGHT})
    one = client(emulator, session, clock, LocalWriteBudget(now=clock.now, sleep=clock.sleep,
                                                             settings=settings))  # fmt: skip
    two = client(emulator, session, clock, LocalWriteBudget(now=clock.now, sleep=clock.sleep,
                                                             settings=settings))  # fmt: skip
    await asyncio.gather(post_comments(one, 10, "one"), post_comments(two, 10, "two"))
    assert emulator.state.content.refused > 0
    assert emulator.state.count_requests("github.comments.create", status=403) > 0


async def test_a_p0_review_is_posted_before_a_p2_review_that_waited_longer(
    connectors: tuple[Connector, Connector], clock: VirtualClock
) -> None:
    """The minute is spent; a P2's review waits, then a P0's arrives in another process: the
    P0 gets the first free slot."""
    first, second = shared(connectors[0], clock), shared(connectors[1], clock)
    with writing(WriteIntent(level=0)):
        for _ in range(10):  # the minute's slots come free 5 s apart
            await first.spend(KEY, action="fill", value=WriteValue.REVIEW)
            clock.advance(5)
    filled = clock.now()

    async def review(budget: PostgresWriteBudget, level: int) -> None:
        with writing(WriteIntent(level=level, job_id=level)):
            await budget.spend(KEY, action="post_review", value=WriteValue.REVIEW)

    p2 = asyncio.create_task(review(first, 2))
    await asyncio.sleep(0)  # the P2 is in line first
    p0 = asyncio.create_task(review(second, 0))
    await asyncio.gather(p2, p0)
    order = [
        row.level
        for row in await connectors[0].fetch_all(
            text("SELECT level FROM forge_writes WHERE action = 'post_review' ORDER BY id")
        )
    ]
    assert order == [0, 2]
    assert clock.now() >= filled + timedelta(seconds=10)  # both waited for a slot


async def test_news_is_dropped_and_a_coalesced_status_is_one_write(
    connectors: tuple[Connector, Connector], clock: VirtualClock
) -> None:
    budget = shared(connectors[0], clock)
    with writing(WriteIntent(level=0)):
        for _ in range(6):
            await budget.spend(KEY, action="fill", value=WriteValue.REVIEW)
    # 4 of 10 left: news must leave half the minute to more valuable writes.
    with writing(WriteIntent(value=WriteValue.NEWS)), pytest.raises(WriteDropped):
        await budget.spend(KEY, action="eta", value=WriteValue.NEWS)
    claims = await connectors[0].fetch_value(text("SELECT count(*) FROM forge_write_claims"))
    writes = await connectors[0].fetch_value(text("SELECT count(*) FROM forge_writes"))
    assert (claims, writes) == (0, 6)


async def test_a_secondary_limit_answer_pauses_every_process(
    connectors: tuple[Connector, Connector],
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
) -> None:
    """GitHub answers one process 403 with Retry-After 30: the other process's next write
    waits those 30 seconds too, instead of meeting the limit again."""
    one = client(emulator, session, clock, shared(connectors[0], clock))
    two = client(emulator, session, clock, shared(connectors[1], clock))
    emulator.state.add_fault("github.comments.create", Fault.secondary_rate_limit(retry_after=30))
    refused_at = clock.now()
    await one.post_comment(REPO, 1, "after the pause")
    await two.post_comment(REPO, 1, "the other process")
    times = comment_times(emulator)
    assert len(times) == 2
    assert all(moment >= refused_at + timedelta(seconds=30) for moment in times)


async def test_metrics_show_the_budget_left_per_installation(
    connectors: tuple[Connector, Connector], aiohttp_client: ClientMaker, clock: VirtualClock
) -> None:
    """/metrics reads every budget from the database: writes left this minute and hour, the
    writes waiting, a pause the forge asked for."""
    budget = PostgresWriteBudget(
        connectors[0],
        now=clock.now,
        sleep=clock.sleep,
        settings=BudgetSettings({"github": BudgetLimits(per_minute=80, per_hour=500)}),
    )
    with writing(WriteIntent(level=0)):
        for _ in range(3):
            await budget.spend(KEY, action="post_review", value=WriteValue.REVIEW)
    clock.advance(61)  # out of the minute, still in the hour
    await budget.spend(KEY, action="post_review", value=WriteValue.REVIEW)
    await budget.hold(KEY, 30)
    app = web.Application()
    setup_metrics(app, monitoring=MonitoringRecords(connectors[1]), clock=clock)
    client = await aiohttp_client(app)
    values = samples(await (await client.get("/metrics")).text())
    labels = (("budget", str(KEY)),)
    assert values["review_bot_forge_writes_left", (*labels, ("window", "minute"))] == 79
    assert values["review_bot_forge_writes_left", (*labels, ("window", "hour"))] == 496
    assert values["review_bot_forge_writes_waiting", labels] == 0
    assert values["review_bot_forge_paused_seconds", labels] == 30


async def test_a_write_that_waits_past_the_token_hour_goes_out_with_a_fresh_token(
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    app_key: tuple[str, str],
) -> None:
    """The installation's hour of writes is spent: the next comment waits for it to turn,
    longer than the installation token it had lives. It goes out with a new token, not a 401."""
    private, public = app_key
    emulator.state.register_app(APP_ID, public)
    budget = LocalWriteBudget(
        now=clock.now,
        sleep=clock.sleep,
        settings=BudgetSettings({"github": BudgetLimits(per_minute=0, per_hour=2)}),
    )
    github = GitHubClient(session, base_url=emulator.github_url, app_id=APP_ID,
                          private_key=private, clock=clock.now, sleep=clock.sleep,
                          budget=budget)  # fmt: skip
    with writing(WriteIntent(level=0)):
        await post_comments(github, 3, "app")
    assert len(comment_times(emulator)) == 3
    assert comment_times(emulator)[-1] - comment_times(emulator)[0] >= timedelta(hours=1)
    assert not [item for item in emulator.state.requests if item.status == 401]


@pytest.mark.parametrize("home", ["postgres", "local"])
async def test_a_write_counts_from_when_the_forge_answered_it(
    home: str, connectors: tuple[Connector, Connector], clock: VirtualClock
) -> None:
    """The minute's 10 writes are decided at once but answered 20 s later (a loaded machine,
    a slow forge): the forge timed them on arrival, so the 11th waits for the minute after the
    answers, not after the decisions. Counting from the decision let one write too many through
    when two dispatchers shared a budget on a busy machine."""
    budget: PostgresWriteBudget | LocalWriteBudget
    if home == "postgres":
        budget = shared(connectors[0], clock)
    else:
        settings = BudgetSettings({"github": TIGHT}, stale_s=600.0, poll_max_s=1.0)
        budget = LocalWriteBudget(now=clock.now, sleep=clock.sleep, settings=settings)
    decided = clock.now()
    with writing(WriteIntent(level=0)):
        written = [
            await budget.spend(KEY, action="fill", value=WriteValue.REVIEW) for _ in range(10)
        ]
        clock.advance(20)
        for write_id in written:
            await budget.answered(KEY, write_id)
        await budget.spend(KEY, action="post_review", value=WriteValue.REVIEW)
    waited = (clock.now() - decided).total_seconds()
    assert waited >= 20 + 60 + TIGHT.margin_s
    assert waited < 20 + 60 + TIGHT.margin_s + 2  # and no longer than the next poll


# No shares kept for more valuable or more urgent writes: only the line's order decides.
PLAIN = BudgetLimits(
    per_minute=10,
    per_hour=0,
    min_interval_s=0.0,
    margin_s=0.5,
    value_reserve=(0.0,) * 6,
    level_reserve=(0.0,) * 4,
)


@pytest.mark.parametrize("home", ["postgres", "local"])
async def test_a_write_whose_writer_gave_up_holds_no_slot_but_keeps_its_place(
    home: str, connectors: tuple[Connector, Connector], clock: VirtualClock
) -> None:
    """The minute is spent, its slots come free 5 s apart. A status that may wait 5 s gives up
    (WriteDeferred); a write behind it in line then takes the first free slot, not the one
    after it. When the status is tried again it keeps the place it had, ahead of a write that
    asked after it. A deferred claim used to hold the first slot until it went stale, so every
    write behind it waited a slot more, and a publisher whose statuses kept giving up held the
    budget one write a pass."""
    settings = BudgetSettings({"github": PLAIN}, stale_s=600.0, poll_max_s=1.0)
    budget: PostgresWriteBudget | LocalWriteBudget
    if home == "postgres":
        budget = PostgresWriteBudget(
            connectors[0], now=clock.now, sleep=clock.sleep, settings=settings
        )
    else:
        budget = LocalWriteBudget(now=clock.now, sleep=clock.sleep, settings=settings)
    filled = clock.now()
    with writing(WriteIntent(level=1)):
        for _ in range(10):
            await budget.spend(KEY, action="fill", value=WriteValue.REVIEW)
            clock.advance(5)
    status = WriteIntent(level=1, value=WriteValue.FIRST_STATUS, target="status:7", max_wait_s=5)
    with writing(status), pytest.raises(WriteDeferred):
        await budget.spend(KEY, action="status", value=WriteValue.FIRST_STATUS)
    with writing(WriteIntent(level=1, value=WriteValue.FIRST_STATUS, target="status:8")):
        await budget.spend(KEY, action="behind", value=WriteValue.FIRST_STATUS)
    first_slot = filled + timedelta(seconds=60 + PLAIN.margin_s)
    assert first_slot <= clock.now() < first_slot + timedelta(seconds=2)

    # From here the test moves the clock: each waiting write sleeps until woken, so both
    # claims are in line before a slot comes free, whichever task the loop runs first.
    stepped = SteppedSleep()
    budget.sleep = stepped.sleep
    order: list[str] = []

    async def write(intent: WriteIntent, action: str) -> None:
        with writing(intent):
            await budget.spend(KEY, action=action, value=WriteValue.FIRST_STATUS)
        order.append(action)

    later_intent = WriteIntent(level=1, value=WriteValue.FIRST_STATUS, target="status:9")
    later = asyncio.create_task(write(later_intent, "later"))
    await stepped.asleep(1)  # the later write is in line first
    retried = asyncio.create_task(write(replace(status, max_wait_s=None), "retried"))
    await stepped.asleep(2)
    clock.set(filled + timedelta(seconds=65 + PLAIN.margin_s))  # the second slot comes free
    await stepped.wake()
    await stepped.asleep(1)
    assert order == ["retried"]
    clock.advance(5)
    await stepped.wake()
    await asyncio.gather(later, retried)
    assert order == ["retried", "later"]


class SteppedSleep:
    """A sleep that returns only when the test wakes the sleepers: it counts who is asleep."""

    def __init__(self) -> None:
        self.sleeping = 0
        self.round = 0
        self.changed = asyncio.Condition()

    async def sleep(self, seconds: float) -> None:
        async with self.changed:
            mine = self.round
            self.sleeping += 1
            self.changed.notify_all()
            await self.changed.wait_for(lambda: self.round != mine)

    async def asleep(self, count: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.sleeping >= count)

    async def wake(self) -> None:
        async with self.changed:
            self.round += 1
            self.sleeping = 0
            self.changed.notify_all()
