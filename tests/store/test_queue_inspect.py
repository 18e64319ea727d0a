"""`bot queue ls` and `bot queue show` on a real database: reasons, history, errors, chunks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bot import cli
from bot.clock import VirtualClock
from bot.model import LEVELS, JobState, Level
from bot.queue.store import QueueStore
from tests.support.factories import decide, make_request, plans


async def _cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    status = await asyncio.to_thread(cli.main, list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def database_env(db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DATABASE_URL", db_url)
    return db_url


async def test_ls_says_why_a_job_was_cancelled(
    store: QueueStore, clock: VirtualClock, database_env: str, capsys: Any
) -> None:
    closed = await store.submit_request(make_request(number=5), decide(Level.P1), now=clock.now())
    live = await store.submit_request(
        make_request(number=6, head_sha="e" * 40), decide(Level.P2, "big refactor"), now=clock.now()
    )
    await store.cancel_pull(
        forge="github",
        repo="acme/payments",
        number=5,
        now=clock.now(),
        reason="pull request closed without merging",
        actor="intake",
    )
    status, out, _ = await _cli(capsys, "queue", "ls")
    assert status == 0
    lines = {int(line.split()[0]): line for line in out.splitlines()[1:]}
    assert lines[closed.job_id].endswith(  # type: ignore[index]
        "cancelled: pull request closed without merging | ordinary pull request"
    )
    assert lines[live.job_id].endswith(" big refactor")  # type: ignore[index]
    status, out, _ = await _cli(capsys, "queue", "ls", "--json", "--state", "cancelled")
    rows = json.loads(out)
    assert [(row["id"], row["why"]) for row in rows] == [
        (closed.job_id, "pull request closed without merging")
    ]


async def test_show_prints_history_reasons_errors_and_chunks(
    store: QueueStore, clock: VirtualClock, database_env: str, capsys: Any
) -> None:
    submitted = await store.submit_request(
        make_request(number=9), decide(Level.P2, "large change"), now=clock.now()
    )
    job_id = submitted.job_id
    assert job_id is not None
    await store.plan_job(job_id, plans(30, 12), now=clock.now())
    await store.set_level(
        job_id, Level.P1, now=clock.now(), reason="/review priority p1", actor="ann"
    )
    clock.advance(3)
    first = await store.fetch_chunk(levels=LEVELS, owner="engine-a", now=clock.now(), lease_s=60)
    assert first is not None
    await store.finish_chunk(
        first.chunk.id,
        owner="engine-a",
        now=clock.now(),
        gpu_seconds=4.5,
        result={"status": "ok", "findings": [{"path": "src/file_0.py"}], "error": None},
    )
    second = await store.fetch_chunk(levels=LEVELS, owner="engine-a", now=clock.now(), lease_s=60)
    assert second is not None
    await store.fail_chunk(
        second.chunk.id, owner="engine-a", now=clock.now(), error="HTTP 400: prompt too long"
    )

    status, out, _ = await _cli(capsys, "queue", "show", str(job_id), "--json")
    assert status == 0
    document = json.loads(out)
    assert (document["state"], document["level"], document["base_level"]) == ("running", "P1", "P2")
    assert document["reasons"][0] == "large change"
    kinds = [(entry["kind"], entry["to"], entry["actor"]) for entry in document["history"]]
    assert ("level", "P1", "ann") in kinds
    assert document["history"][0]["kind"] == "state" and document["history"][0]["from"] is None
    chunks = {chunk["seq"]: chunk for chunk in document["chunks"]}
    assert (chunks[0]["state"], chunks[0]["gpu_seconds"], chunks[0]["findings"]) == ("done", 4.5, 1)
    assert chunks[0]["paths"] == ["src/file_0.py"]
    assert (chunks[1]["state"], chunks[1]["attempts"]) == ("queued", 1)
    assert chunks[1]["error"] == "HTTP 400: prompt too long"

    status, text, _ = await _cli(capsys, "queue", "show", str(job_id))
    assert status == 0
    assert text.startswith(f"job {job_id}: github acme/payments#9 ")
    assert "history:" in text and "by ann: /review priority p1" in text
    assert "       error: HTTP 400: prompt too long" in text
    assert "review ok, 1 findings" in text


async def test_show_of_a_missing_job_is_an_error(database_env: str, capsys: Any) -> None:
    status, out, err = await _cli(capsys, "queue", "show", "424242")
    assert (status, out) == (1, "")
    assert "no job 424242" in err


async def test_a_dead_job_shows_why(
    store: QueueStore, clock: VirtualClock, database_env: str, capsys: Any
) -> None:
    submitted = await store.submit_request(make_request(number=3), decide(), now=clock.now())
    assert submitted.job_id is not None
    await store.plan_job(submitted.job_id, plans(5), now=clock.now())
    leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
    assert leased is not None
    await store.fail_chunk(
        leased.chunk.id, owner="w", now=clock.now(), error="model said no", retryable=False
    )
    job = await store.get_job(submitted.job_id)
    assert job is not None and job.state is JobState.DEAD
    status, out, _ = await _cli(capsys, "queue", "show", str(submitted.job_id))
    assert status == 0
    assert "  state      dead (" in out and "model said no" in out
