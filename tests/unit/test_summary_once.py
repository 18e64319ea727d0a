"""One living summary even when two attempts at a job both create it: a process paused between
its claim's last check and its request sends it after another attempt took the job over (a
forge has no conditional writes). The clients against the emulator, both forges."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from bot.clock import VirtualClock
from bot.emulator import ForgeEmulator
from bot.errors import LeaseLost
from bot.forges.base import SUMMARY_MARKER
from bot.forges.quiet import QuietForge, quiet_forge_for
from bot.forges.registry import ForgeRegistry
from bot.model import FileChange, Job, JobState, Level
from bot.review.quiet_post import one_summary, upsert_summary
from tests.support.pipeline_helpers import emulator_forges

FILES = [FileChange(path="a.py", additions=1, deletions=0, patch="@@ -0,0 +1 @@\n+x = 1")]


@pytest.fixture
async def forges(emulator: ForgeEmulator, clock: VirtualClock) -> AsyncIterator[ForgeRegistry]:
    registry = emulator_forges(emulator, clock)
    async with registry:
        yield registry


def job_on(forge: str, number: int) -> Job:
    return Job(
        id=7,
        forge=forge,  # type: ignore[arg-type]
        repo="acme/shop",
        number=number,
        head_sha="a" * 40,
        base_level=Level.P1,
        level=Level.P1,
        state=JobState.RUNNING,
        enqueued_at=datetime(2026, 1, 5, tzinfo=UTC),
    )


def summaries(emulator: ForgeEmulator, forge: str, number: int) -> list[dict[str, object]]:
    pull = emulator.state.pulls[(forge, "acme/shop", number)]  # type: ignore[index]
    items = pull.comments if forge == "github" else pull.notes
    return [item for item in items if SUMMARY_MARKER in str(item.get("body") or "")]


def quiet_of(forges: ForgeRegistry, forge: str) -> QuietForge:
    quiet = quiet_forge_for(forges[forge])
    assert quiet is not None
    return quiet


async def held() -> bool:
    return True


async def lost() -> bool:
    return False


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_a_stale_attempt_whose_summary_lands_second_takes_it_back(
    emulator: ForgeEmulator, forges: ForgeRegistry, forge: str
) -> None:
    emulator.state.add_pull(forge, "acme/shop", 3, files=FILES)  # type: ignore[arg-type]
    quiet, job = quiet_of(forges, forge), job_on(forge, 3)
    # The attempt that took the job over wrote the summary first.
    kept = await upsert_summary(quiet, job, "the new attempt's summary", still_held=held, attempt=2)
    # The paused one resumes and sends the create it had checked its claim for.
    late = await quiet.create_summary(job.repo, job.number, "the stale summary")
    with pytest.raises(LeaseLost):
        await one_summary(quiet, job, late, "the stale summary", lost, attempt=1)
    [left] = summaries(emulator, forge, 3)
    assert left["id"] == kept and "the new attempt's summary" in str(left["body"])


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_an_attempt_taking_over_after_a_stale_summary_landed_keeps_the_oldest(
    emulator: ForgeEmulator, forges: ForgeRegistry, forge: str
) -> None:
    emulator.state.add_pull(forge, "acme/shop", 4, files=FILES)  # type: ignore[arg-type]
    quiet, job = quiet_of(forges, forge), job_on(forge, 4)
    # The stale create landed after the new attempt looked and before it wrote.
    stale = await quiet.create_summary(job.repo, job.number, "the stale summary")
    mine = await quiet.create_summary(job.repo, job.number, "the new attempt's summary")
    assert await one_summary(quiet, job, mine, "the new attempt's summary", held, attempt=2) == (
        stale
    )
    [left] = summaries(emulator, forge, 4)
    assert left["id"] == stale and "the new attempt's summary" in str(left["body"])
    # The stale one, finding its claim gone, sees it is the oldest: it keeps it and stops.
    with pytest.raises(LeaseLost):
        await one_summary(quiet, job, stale, "the stale summary", lost, attempt=1)
    [left] = summaries(emulator, forge, 4)
    assert "the new attempt's summary" in str(left["body"])


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_a_first_attempt_that_still_holds_its_claim_reads_nothing_more(
    emulator: ForgeEmulator, forges: ForgeRegistry, forge: str
) -> None:
    emulator.state.add_pull(forge, "acme/shop", 5, files=FILES)  # type: ignore[arg-type]
    quiet, job = quiet_of(forges, forge), job_on(forge, 5)
    created = await quiet.create_summary(job.repo, job.number, "the summary")
    reads = len(emulator.state.requests)
    assert await one_summary(quiet, job, created, "the summary", held, attempt=1) == created
    assert len(emulator.state.requests) == reads
