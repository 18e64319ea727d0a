"""Queue throughput: review-bot's store against pgqueuer on the same PostgreSQL, side by side.

Each side enqueues 20,000 chunks in the same shape, one review of 10 chunks at a time from 8
concurrent producers (one connection each), with the same notification setting (every enqueue
notifies listeners: review-bot's NOTIFY as `bot serve` runs it, pgqueuer's trigger); then 8
concurrent consumers (one connection each) take one chunk at a time, complete it and commit
durably, until the queue is empty. Reported: chunks/s over enqueue + drain, and dequeue latency
P50/P99, the median of three runs, side by side in the same process (the runs alternate).
review-bot also keeps priority order and leases; each run checks that each chunk was completed
exactly once. Writes bench/results/queue.md.

    python bench/queue_throughput.py [--chunks 20000] [--consumers 8] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg

from bot import devdb
from bot.db import upgrade_database
from bot.model import LEVELS, ChunkPlan, Level, PolicyDecision, ReviewRequest
from bot.queue.store import QueueSettings, QueueStore
from bot.stats import percentile

CHUNKS_PER_JOB = 10


def _unobserved(phase: str) -> None:
    """The phase hook of a plain run (bench/queue_profile.py samples the server per phase)."""


def bench_request(number: int) -> ReviewRequest:
    """Review `number` of the benchmark: one pull request, every one of them new."""
    return ReviewRequest(
        forge="github",
        repo="acme/bench",
        number=number,
        title="bench",
        author="dev",
        author_is_bot=False,
        base_ref="main",
        head_ref=f"f/{number}",
        base_sha="b" * 40,
        head_sha=f"{number:040d}",
        event="pull_request",
        action="opened",
    )


def bench_plans() -> list[ChunkPlan]:
    """One review's chunks: CHUNKS_PER_JOB of one file each."""
    return [
        ChunkPlan(files=({"path": f"f{i}.py", "lines": 10},), lines=10)
        for i in range(CHUNKS_PER_JOB)
    ]


async def enqueue_reviews(store: QueueStore, jobs: int, producers: int, now: datetime) -> None:
    """Enqueue `jobs` reviews from `producers` concurrent producers, each review as intake and
    planning store it: `submit_request` then `plan_job`, at levels P0-P3 in turn."""

    async def enqueue_range(first: int, last: int) -> None:
        for number in range(first, last):
            level = Level(number % 4)
            result = await store.submit_request(
                bench_request(number), PolicyDecision(level=level, reasons=("bench",)), now=now
            )
            assert result.job_id is not None
            await store.plan_job(result.job_id, bench_plans(), now=now)

    step = max(1, jobs // producers)
    await asyncio.gather(*(enqueue_range(i, min(jobs, i + step)) for i in range(0, jobs, step)))


async def run_review_bot(
    url: str, chunks: int, consumers: int, on_phase: Callable[[str], None] = _unobserved
) -> dict[str, float]:
    await upgrade_database(url)
    # NOTIFY on enqueue, as `bot serve` runs the store (pgqueuer's trigger does the same).
    store = QueueStore.from_url(url, settings=QueueSettings(notify=True), pool_size=consumers)
    now = datetime.now(UTC)
    on_phase("enqueue")
    started, cpu_started = time.perf_counter(), time.process_time()
    await enqueue_reviews(store, chunks // CHUNKS_PER_JOB, consumers, now)
    enqueued, cpu_enqueued = time.perf_counter(), time.process_time()
    on_phase("drain")
    latencies: list[float] = []
    finished: list[int] = []
    levels_seen: list[int] = []

    async def consume(owner: str) -> None:
        while True:
            t0 = time.perf_counter()
            leased = await store.fetch_chunk(
                levels=LEVELS, owner=owner, now=datetime.now(UTC), lease_s=300
            )
            latencies.append(time.perf_counter() - t0)
            if leased is None:
                return
            levels_seen.append(int(leased.chunk.level))
            await store.finish_chunk(
                leased.chunk.id,
                owner=owner,
                now=datetime.now(UTC),
                gpu_seconds=0.0,
                result={"ok": True},
            )
            finished.append(leased.chunk.id)

    await asyncio.gather(*(consume(f"consumer-{i}") for i in range(consumers)))
    drained, cpu_drained = time.perf_counter(), time.process_time()
    on_phase("done")
    await store.close()
    counts = Counter(finished)
    assert len(counts) == chunks and max(counts.values()) == 1, "a chunk was lost or repeated"
    # Priority order: with every chunk queued up front, levels come out in order (allowing
    # the overlap of consumers racing at each level boundary).
    inversions = sum(1 for a, b in itertools.pairwise(levels_seen) if b < a)
    return {
        "enqueue_s": enqueued - started,
        "drain_s": drained - enqueued,
        # The benchmark's own process (producers, then consumers): where it is busy most of
        # the wall time, the client, not PostgreSQL, bounds the queue.
        "enqueue_client_cpu_s": cpu_enqueued - cpu_started,
        "drain_client_cpu_s": cpu_drained - cpu_enqueued,
        "chunks_per_s": chunks / (drained - started),
        "drain_chunks_per_s": chunks / (drained - enqueued),
        "dequeue_p50_ms": percentile(latencies, 0.50) * 1000,
        "dequeue_p99_ms": percentile(latencies, 0.99) * 1000,
        "level_inversions": float(inversions),
    }


async def run_pgqueuer(
    url: str, chunks: int, consumers: int, on_phase: Callable[[str], None] = _unobserved
) -> dict[str, float]:
    from pgqueuer.adapters.persistence.queries import Queries
    from pgqueuer.ports.repository import EntrypointExecutionParameter

    admin = await asyncpg.connect(url)
    await Queries.from_asyncpg_connection(admin).install()
    on_phase("enqueue")
    started, cpu_started = time.perf_counter(), time.process_time()
    jobs = chunks // CHUNKS_PER_JOB

    async def enqueue_range(first: int, last: int) -> None:
        # The same shape as review-bot's: one review's chunks per call, a connection each.
        conn = await asyncpg.connect(url)
        queries = Queries.from_asyncpg_connection(conn)
        try:
            for number in range(first, last):
                await queries.enqueue(
                    ["review"] * CHUNKS_PER_JOB,
                    [b"{}"] * CHUNKS_PER_JOB,
                    [3 - number % 4] * CHUNKS_PER_JOB,
                )
        finally:
            await conn.close()

    step = max(1, jobs // consumers)
    await asyncio.gather(*(enqueue_range(i, min(jobs, i + step)) for i in range(0, jobs, step)))
    enqueued, cpu_enqueued = time.perf_counter(), time.process_time()
    on_phase("drain")
    latencies: list[float] = []
    finished: list[int] = []

    async def consume() -> None:
        conn = await asyncpg.connect(url)
        queries = Queries.from_asyncpg_connection(conn)
        manager_id = uuid.uuid4()
        entrypoints = {"review": EntrypointExecutionParameter(concurrency_limit=0)}
        try:
            while True:
                t0 = time.perf_counter()
                jobs = await queries.dequeue(
                    batch_size=1,
                    entrypoints=entrypoints,
                    queue_manager_id=manager_id,
                    global_concurrency_limit=None,
                    heartbeat_timeout=timedelta(seconds=300),
                )
                latencies.append(time.perf_counter() - t0)
                if not jobs:
                    return
                await queries.log_jobs([(job, "successful", None) for job in jobs])
                finished.extend(int(job.id) for job in jobs)
        finally:
            await conn.close()

    await asyncio.gather(*(consume() for _ in range(consumers)))
    drained, cpu_drained = time.perf_counter(), time.process_time()
    on_phase("done")
    await admin.close()
    counts = Counter(finished)
    assert len(counts) == chunks and max(counts.values()) == 1, "pgqueuer lost or repeated a job"
    return {
        "enqueue_s": enqueued - started,
        "drain_s": drained - enqueued,
        # The benchmark's own process (producers, then consumers): where it is busy most of
        # the wall time, the client, not PostgreSQL, bounds the queue.
        "enqueue_client_cpu_s": cpu_enqueued - cpu_started,
        "drain_client_cpu_s": cpu_drained - cpu_enqueued,
        "chunks_per_s": chunks / (drained - started),
        "drain_chunks_per_s": chunks / (drained - enqueued),
        "dequeue_p50_ms": percentile(latencies, 0.50) * 1000,
        "dequeue_p99_ms": percentile(latencies, 0.99) * 1000,
    }


def _median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: list[tuple[dict[str, float], dict[str, float]]] = []
    with devdb.provision_server() as server:
        conn = await asyncpg.connect(server)
        synchronous_commit = await conn.fetchval("SHOW synchronous_commit")
        fsync = await conn.fetchval("SHOW fsync")
        await conn.close()
        for index in range(args.runs):
            async with devdb.scratch_database(server, "bench_rb") as ours_url:
                ours = await run_review_bot(ours_url, args.chunks, args.consumers)
            async with devdb.scratch_database(server, "bench_pgq") as theirs_url:
                theirs = await run_pgqueuer(theirs_url, args.chunks, args.consumers)
            runs.append((ours, theirs))
            print(
                f"run {index + 1}: review-bot {ours['chunks_per_s']:.0f} chunks/s,"
                f" pgqueuer {theirs['chunks_per_s']:.0f}",
                file=sys.stderr,
            )
    ours = _median_row([run[0] for run in runs])
    theirs = _median_row([run[1] for run in runs])
    ratios = sorted(run[0]["chunks_per_s"] / run[1]["chunks_per_s"] for run in runs)
    ratio = statistics.median(ratios)
    result = {
        "chunks": args.chunks,
        "consumers": args.consumers,
        "runs": args.runs,
        "synchronous_commit": synchronous_commit,
        "fsync": fsync,
        "review_bot": ours,
        "pgqueuer": theirs,
        "throughput_ratio": ratio,
        "throughput_ratios": ratios,
    }
    results = Path(__file__).with_name("results")
    results.mkdir(exist_ok=True)
    (results / "queue_throughput.json").write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    lines = [
        f"{args.chunks} chunks, {args.consumers} producers and {args.consumers} consumers,"
        f" synchronous_commit={synchronous_commit}, fsync={fsync}, NOTIFY on enqueue for both;"
        f" median of {args.runs} runs",
        "",
        "| queue | chunks/s (enqueue+drain) | drain chunks/s | dequeue P50 ms | dequeue P99 ms"
        " | enqueue s (client CPU s) | drain s (client CPU s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in (("review-bot", ours), ("pgqueuer 1.6", theirs)):
        lines.append(
            f"| {name} | {row['chunks_per_s']:.0f} | {row['drain_chunks_per_s']:.0f} |"
            f" {row['dequeue_p50_ms']:.2f} | {row['dequeue_p99_ms']:.2f} |"
            f" {row['enqueue_s']:.2f} ({row['enqueue_client_cpu_s']:.2f}) |"
            f" {row['drain_s']:.2f} ({row['drain_client_cpu_s']:.2f}) |"
        )
    lines += [
        "",
        f"throughput ratio review-bot / pgqueuer: {ratio:.2f} (median;"
        f" {ratios[0]:.2f}-{ratios[-1]:.2f} over {args.runs} runs)",
    ]
    text = "\n".join(lines)
    (results / "queue.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    from bot.runtime import run

    raise SystemExit(run(main()))  # the loop `bot serve` runs on, for both queues
