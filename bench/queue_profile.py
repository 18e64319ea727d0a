"""Queue profile: where review-bot's queue and pgqueuer spend their time inside PostgreSQL.

Runs each side of bench/queue_throughput.py in the same shape (one review of 10 chunks per
enqueue call from 8 producers, then 8 consumers taking one chunk at a time; smaller by
default), once alone and once while a sampler polls pg_stat_activity every few milliseconds on
a connection of its own. Per queue and phase (enqueue, drain) it counts the share of
active-backend samples in each wait event (`CPU`: active with no wait event), which statement
was waiting (matched by its text against the statements each queue sends), and for lock waits
the lock awaited (pg_locks) and the statement blocking it and what that one was doing
(pg_blocking_pids). Then, on a queue of the benchmark's shape, EXPLAIN (ANALYZE, BUFFERS) of
the dequeue (FETCH_CHUNK), of finishing a chunk (FINISH_CHUNK) and of the two enqueue
statements (SUBMIT_NEW_JOB, PLAN_JOB_AT_ITS_LEVEL), with the SQL and parameters the store
binds, each in a transaction rolled back. Writes bench/results/queue_profile.md.

    python bench/queue_profile.py [--chunks 5000] [--consumers 8] [--interval-ms 5]
                                  [--explain-jobs 2000] [--explain-runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import pkgutil
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
from sqlalchemy import TextClause, event
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg

import bot.queue.sql
from bench.queue_throughput import (
    CHUNKS_PER_JOB,
    bench_plans,
    bench_request,
    enqueue_reviews,
    run_pgqueuer,
    run_review_bot,
)
from bot import devdb
from bot.db import upgrade_database
from bot.model import LEVELS, Level, PolicyDecision
from bot.queue.sql import chunks as chunks_sql
from bot.queue.sql import jobs as jobs_sql
from bot.queue.store import QueueSettings, QueueStore

PHASES = ("enqueue", "drain")
TOP_ROWS = 8

# Every client backend of the bench's database but the sampler's own, unless idle. The lock
# a backend waits for and who holds it are asked for only where a backend waits on a
# heavyweight lock: pg_locks and pg_blocking_pids take the lock manager's partition locks,
# too dear to take for every backend every few milliseconds.
SAMPLE_ACTIVITY = """
SELECT a.pid, a.state, a.wait_event_type, a.wait_event, a.query,
       CASE WHEN a.wait_event_type = 'Lock' THEN pg_blocking_pids(a.pid) END AS blockers,
       CASE WHEN a.wait_event_type = 'Lock' THEN (
           SELECT concat_ws(' ', l.locktype, COALESCE(l.relation, l.classid)::regclass,
                            'objid ' || l.objid, l.mode)
           FROM pg_locks l WHERE l.pid = a.pid AND NOT l.granted LIMIT 1
       ) END AS awaited
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.backend_type = 'client backend' AND a.state IS DISTINCT FROM 'idle'
"""

# The lock a transaction that ran NOTIFY takes at commit, as pg_locks shows it: "database 0",
# AccessExclusive (PreCommit_Notify in PostgreSQL's src/backend/commands/async.c).
NOTIFY_LOCK = "object pg_database objid 0 AccessExclusiveLock"
WAL_WAITS = ("IO:WALSync", "LWLock:WALWrite")

# What asyncpg runs on a new connection, before the first statement of a type it has not met.
DRIVER_FRAGMENTS = {
    "WITH RECURSIVE typeinfo_tree": "asyncpg type introspection",
    "current_setting('jit') AS cur": "asyncpg type introspection",
}


def _normalized(sql: str) -> str:
    return " ".join(sql.split())


class StatementNames:
    """Names statements by their text as pg_stat_activity shows it: the SQL as sent, cut at
    track_activity_query_size, so a sampled query names the statement it is a prefix of."""

    def __init__(self, named: Mapping[str, str]) -> None:
        self._named = [(_normalized(sql), name) for name, sql in named.items()]
        self._seen: dict[str, str] = {}

    def __call__(self, query: str | None) -> str:
        if not query:
            return "(no query)"
        if query not in self._seen:
            text = _normalized(query)
            names = [name for sql, name in self._named if text and sql.startswith(text)]
            names += [name for part, name in DRIVER_FRAGMENTS.items() if part in text]
            self._seen[query] = names[0] if names else f"other: {text[:40]}"
        return self._seen[query]


def review_bot_statements(dialect: Any) -> dict[str, str]:
    """Every named statement in bot.queue.sql, compiled as the store's driver sends it."""
    named: dict[str, str] = {}
    for module_info in pkgutil.iter_modules(bot.queue.sql.__path__):
        module = importlib.import_module(f"bot.queue.sql.{module_info.name}")
        for name, value in vars(module).items():
            if isinstance(value, TextClause):
                named.setdefault(name, str(value.compile(dialect=dialect)))
    return named


def pgqueuer_statements() -> dict[str, str]:
    """The statements run_pgqueuer sends, rendered by pgqueuer's own query builder."""
    from pgqueuer.adapters.persistence.qb import QueryQueueBuilder

    builder = QueryQueueBuilder()
    dequeue = builder.build_dequeue_query(
        batch_size=1,
        entrypoints=["review"],
        concurrency_limits=[0],
        queue_manager_id=uuid.uuid4(),
        global_concurrency_limit=None,
        heartbeat_timeout=timedelta(seconds=300),
    )
    return {
        "enqueue": builder.build_enqueue_query(),
        "dequeue": dequeue.sql,
        "log_jobs": builder.build_log_job_query(),
    }


def _wait(row: Mapping[str, Any]) -> str:
    if row["wait_event_type"] is None:
        return "CPU"
    return f"{row['wait_event_type']}:{row['wait_event']}"


@dataclass
class PhaseProfile:
    """What the sampler saw in one phase: backend-samples per wait and statement."""

    seconds: float = 0.0
    polls: int = 0
    waits: Counter[str] = field(default_factory=Counter)
    statements: Counter[tuple[str, str]] = field(default_factory=Counter)
    # (waiting statement, its wait, what blocks it: the statement and the wait of a backend
    # pg_blocking_pids names, the lock's holder or a waiter ahead in its queue): a waiter
    # blocked by n backends counts 1/n to each, so the counts add up to the lock-wait samples.
    blockers: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    # (wait, the lock awaited as pg_locks names it: type, relation or catalog, mode)
    locks: Counter[tuple[str, str]] = field(default_factory=Counter)
    idle_in_transaction: int = 0

    @property
    def samples(self) -> int:
        return sum(self.waits.values())


class ActivitySampler:
    """Polls pg_stat_activity on its own connection and files each sample under the phase the
    benchmark says it is in (queue_throughput's phase hook)."""

    def __init__(self, names: Callable[[str | None], str]) -> None:
        self.names = names
        self.phases: dict[str, PhaseProfile] = {}
        self._phase: str | None = None
        self._since = 0.0
        self._stop = asyncio.Event()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        if self._phase is not None:
            self.phases[self._phase].seconds = now - self._since
        self._phase = phase if phase in PHASES else None
        if self._phase is not None:
            self.phases[self._phase] = PhaseProfile()
        self._since = now

    def stop(self) -> None:
        self._stop.set()

    async def run(self, url: str, interval_s: float) -> None:
        conn = await asyncpg.connect(url)
        try:
            sample = await conn.prepare(SAMPLE_ACTIVITY)
            while not self._stop.is_set():
                phase = self._phase
                rows = await sample.fetch()
                # A poll that straddles a phase change belongs to neither.
                if phase is not None and phase == self._phase:
                    self._count(self.phases[phase], rows)
                await asyncio.sleep(interval_s)
        finally:
            await conn.close()

    def _count(self, profile: PhaseProfile, rows: Sequence[Mapping[str, Any]]) -> None:
        profile.polls += 1
        by_pid = {row["pid"]: row for row in rows}
        for row in rows:
            if row["state"] == "idle in transaction":
                profile.idle_in_transaction += 1
            if row["state"] != "active":
                continue
            wait, statement = _wait(row), self.names(row["query"])
            profile.waits[wait] += 1
            profile.statements[statement, wait] += 1
            if row["wait_event_type"] != "Lock":
                continue
            profile.locks[wait, row["awaited"] or "(granted before pg_locks was read)"] += 1
            blockers = row["blockers"] or []
            if not blockers:
                profile.blockers[statement, wait, "(none left when asked)", "-"] += 1
            for pid in blockers:
                blocker = by_pid.get(pid)
                if blocker is None:
                    blocked_by = ("(not in the sample)", "-")
                else:
                    doing = _wait(blocker) if blocker["state"] == "active" else blocker["state"]
                    blocked_by = (self.names(blocker["query"]), doing)
                profile.blockers[statement, wait, *blocked_by] += 1 / len(blockers)


async def profile_run(
    run: Callable[..., Awaitable[dict[str, float]]],
    url: str,
    names: Callable[[str | None], str],
    chunks: int,
    consumers: int,
    interval_s: float,
) -> tuple[dict[str, float], dict[str, PhaseProfile]]:
    """One side of the throughput benchmark with the sampler running beside it."""
    sampler = ActivitySampler(names)
    sampling = asyncio.create_task(sampler.run(url, interval_s))
    try:
        result = await run(url, chunks, consumers, on_phase=sampler.mark)
    finally:
        sampler.stop()
        await sampling
    return result, sampler.phases


# --- EXPLAIN --------------------------------------------------------------------------------


class _Bound(Exception):
    """Carries the SQL and parameters the store was about to send; raised before sending."""

    def __init__(self, sql: str, params: Sequence[Any]) -> None:
        super().__init__(sql)
        self.sql = sql
        self.params = tuple(params)


async def bound_statement(
    store: QueueStore, clause: TextClause, call: Callable[[], Awaitable[object]]
) -> tuple[str, tuple[Any, ...]]:
    """The SQL and positional parameters `call` makes the store send for `clause`, stopped
    before they reach the server: what EXPLAIN then runs is exactly what the store runs."""
    sql = str(clause.compile(dialect=store.engine.dialect))

    def intercept(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement == sql:
            raise _Bound(statement, params)

    def intercept_driver(statement: str, params: Sequence[Any]) -> None:
        intercept(None, None, statement, params)

    # The hottest statements run on the driver itself (Connector.run_on_driver), the rest
    # through SQLAlchemy: either way the statement is stopped before it is sent.
    event.listen(store.engine.sync_engine, "before_cursor_execute", intercept)
    store.connector.driver_observers.append(intercept_driver)
    try:
        await call()
    except _Bound as bound:
        return bound.sql, bound.params
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", intercept)
        store.connector.driver_observers.remove(intercept_driver)
    raise AssertionError(f"the store did not send {clause.text.split()[:4]}")


Setup = Callable[[asyncpg.Connection], Awaitable[tuple[Any, ...]]]


@dataclass
class ExplainCase:
    """A statement to EXPLAIN, after `setup` (in the same transaction) returns its params."""

    name: str
    what: str
    sql: str
    setup: Setup


@dataclass
class Explained:
    case: ExplainCase
    planning_ms: list[float]
    execution_ms: list[float]
    trigger_ms: list[float]
    plan: dict[str, Any]  # the run of median execution time
    text: str  # EXPLAIN (ANALYZE, BUFFERS) in text, one more run


async def _rolled_back(conn: asyncpg.Connection, case: ExplainCase, explain: str) -> Any:
    transaction = conn.transaction()
    await transaction.start()
    try:
        params = await case.setup(conn)
        return await conn.fetch(f"{explain} {case.sql}", *params)
    finally:
        await transaction.rollback()


async def explain_case(conn: asyncpg.Connection, case: ExplainCase, runs: int) -> Explained:
    plans = []
    for _ in range(runs):
        rows = await _rolled_back(conn, case, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)")
        plans.append(json.loads(rows[0][0])[0])
    text_rows = await _rolled_back(conn, case, "EXPLAIN (ANALYZE, BUFFERS)")
    execution = [plan["Execution Time"] for plan in plans]
    median_run = sorted(range(runs), key=execution.__getitem__)[runs // 2]
    return Explained(
        case=case,
        planning_ms=[plan["Planning Time"] for plan in plans],
        execution_ms=execution,
        trigger_ms=[sum(t["Time"] for t in plan.get("Triggers", [])) for plan in plans],
        plan=plans[median_run],
        text="\n".join(row[0] for row in text_rows),
    )


async def explain_queue(server: str, jobs: int, producers: int, runs: int) -> list[Explained]:
    """EXPLAIN ANALYZE the dequeue, finishing and enqueue statements on a queue of `jobs`
    reviews of the benchmark's shape, with the parameters the store binds."""
    async with devdb.scratch_database(server, "bench_profile") as url:
        await upgrade_database(url)
        store = QueueStore.from_url(url, settings=QueueSettings(notify=True), pool_size=producers)
        conn = await asyncpg.connect(url)
        try:
            now = datetime.now(UTC)
            await enqueue_reviews(store, jobs, producers, now)
            # The statistics autovacuum would have gathered by now (it may not have yet).
            await conn.execute("ANALYZE")
            await store.ping()  # the engine's first connect runs its own queries: not these
            cases = await _explain_cases(store, conn, jobs, now)
            return [await explain_case(conn, case, runs) for case in cases]
        finally:
            await conn.close()
            await store.close()


async def _explain_cases(
    store: QueueStore, conn: asyncpg.Connection, jobs: int, now: datetime
) -> list[ExplainCase]:
    owner = "consumer-0"
    fetch_sql, fetch_params = await bound_statement(
        store,
        chunks_sql.FETCH_CHUNK,
        lambda: store.fetch_chunk(levels=LEVELS, owner=owner, now=now, lease_s=300),
    )

    async def fetch_params_only(_: asyncpg.Connection) -> tuple[Any, ...]:
        return fetch_params

    async def after_one_lease(conn: asyncpg.Connection) -> tuple[Any, ...]:
        await conn.fetch(fetch_sql, *fetch_params)
        return fetch_params

    # The chunk the dequeue leases first (the queue is at rest between runs: always the same).
    transaction = conn.transaction()
    await transaction.start()
    head = (await conn.fetchrow(fetch_sql, *fetch_params))["id"]
    await transaction.rollback()
    finish_sql, finish_params = await bound_statement(
        store,
        chunks_sql.FINISH_CHUNK,
        lambda: store.finish_chunk(
            head, owner=owner, now=now, gpu_seconds=0.0, result={"ok": True}
        ),
    )

    async def lease_the_head(conn: asyncpg.Connection) -> tuple[Any, ...]:
        leased = await conn.fetchrow(fetch_sql, *fetch_params)
        assert leased["id"] == head, "the dequeue leased another chunk than the head"
        return finish_params

    number = jobs  # a pull request the queue has not seen
    submit_sql, submit_params = await bound_statement(
        store,
        jobs_sql.SUBMIT_NEW_JOB,
        lambda: store.submit_request(
            bench_request(number),
            PolicyDecision(level=Level(number % 4), reasons=("bench",)),
            now=now,
        ),
    )

    async def submit_params_only(_: asyncpg.Connection) -> tuple[Any, ...]:
        return submit_params

    # plan_job binds the id of the job it plans, which the submission in the same transaction
    # draws from a sequence: bind a stand-in and put the drawn id in its place.
    stand_in = 2**62 + 7
    plan_sql, plan_params = await bound_statement(
        store,
        jobs_sql.PLAN_JOB_AT_ITS_LEVEL,
        lambda: store.plan_job(stand_in, bench_plans(), now=now),
    )
    assert plan_params.count(stand_in) == 1

    async def submit_the_job(conn: asyncpg.Connection) -> tuple[Any, ...]:
        job_id = (await conn.fetchrow(submit_sql, *submit_params))["job_id"]
        return tuple(job_id if value == stand_in else value for value in plan_params)

    return [
        ExplainCase(
            "FETCH_CHUNK",
            "dequeue, a job's first chunk (starts the job)",
            fetch_sql,
            fetch_params_only,
        ),
        ExplainCase(
            "FETCH_CHUNK",
            "dequeue, the next chunk of a started job",
            fetch_sql,
            after_one_lease,
        ),
        ExplainCase("FINISH_CHUNK", "finish a leased chunk", finish_sql, lease_the_head),
        ExplainCase("SUBMIT_NEW_JOB", "enqueue: intake", submit_sql, submit_params_only),
        ExplainCase(
            "PLAN_JOB_AT_ITS_LEVEL",
            f"enqueue: planning, {CHUNKS_PER_JOB} chunks",
            plan_sql,
            submit_the_job,
        ),
    ]


def _nodes(plan: Mapping[str, Any], depth: int = 0) -> Iterator[tuple[int, Mapping[str, Any]]]:
    yield depth, plan
    for child in plan.get("Plans", []):
        yield from _nodes(child, depth + 1)


def _node_line(node: Mapping[str, Any]) -> str:
    words = [node["Node Type"]]
    if "CTE Name" in node:
        words.append(f"CTE {node['CTE Name']}")
    if "Index Name" in node:
        words.append(f"using {node['Index Name']}")
    if "Relation Name" in node:
        words.append(f"on {node['Relation Name']}")
    if "Parent Relationship" in node and node["Parent Relationship"] in ("InitPlan", "SubPlan"):
        words.append(f"({node.get('Subplan Name', 'subplan')})")
    return " ".join(words)


def plan_outline(plan: Mapping[str, Any], depth_limit: int = 3) -> list[str]:
    """The plan's top nodes, indented, with rows, loops and time."""
    lines = []
    for depth, node in _nodes(plan["Plan"]):
        if depth > depth_limit:
            continue
        lines.append(
            "  "
            * depth
            + f"{_node_line(node)}: rows={node['Actual Rows']} loops={node['Actual Loops']}"
            f" time={node['Actual Total Time']:.3f} ms"
        )
    return lines


def scans(plan: Mapping[str, Any]) -> list[str]:
    """Every scan of a table in the plan, as `Node Type on table (index)`."""
    found = []
    for _, node in _nodes(plan["Plan"]):
        if "Relation Name" in node and "Scan" in node["Node Type"]:
            index = f" ({node['Index Name']})" if "Index Name" in node else ""
            found.append(f"{node['Node Type']} on {node['Relation Name']}{index}")
    return list(dict.fromkeys(found))


def _buffers(node: Mapping[str, Any]) -> str:
    return "/".join(
        str(node.get(f"Shared {kind} Blocks", 0)) for kind in ("Hit", "Read", "Dirtied", "Written")
    )


# --- the report -----------------------------------------------------------------------------


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def wait_table(profile: PhaseProfile) -> list[str]:
    lines = [
        "| wait event | share of samples | backends on average |",
        "| --- | ---: | ---: |",
    ]
    for wait, count in profile.waits.most_common(TOP_ROWS):
        lines.append(f"| {wait} | {_share(count, profile.samples)} | {count / profile.polls:.2f} |")
    return lines


def statement_table(profile: PhaseProfile) -> list[str]:
    lines = ["| statement | wait event | share of samples |", "| --- | --- | ---: |"]
    for (statement, wait), count in profile.statements.most_common(TOP_ROWS):
        lines.append(f"| {statement} | {wait} | {_share(count, profile.samples)} |")
    return lines


def lock_table(profile: PhaseProfile) -> list[str]:
    lock_samples = sum(profile.locks.values())
    lines = [
        "| wait event | lock awaited (pg_locks) | share of lock waits |",
        "| --- | --- | ---: |",
    ]
    for (wait, awaited), count in profile.locks.most_common(TOP_ROWS):
        lines.append(f"| {wait} | {awaited} | {_share(count, lock_samples)} |")
    return lines


def blocker_table(profile: PhaseProfile) -> list[str]:
    lock_samples = sum(profile.blockers.values())
    if not lock_samples:
        return ["No sample waited on a heavyweight lock."]
    lines = [
        "| waiting statement | wait event | blocked by | its wait | share of lock waits |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for (statement, wait, blocker, doing), count in profile.blockers.most_common(TOP_ROWS):
        lines.append(
            f"| {statement} | {wait} | {blocker} | {doing} | {_share(count, lock_samples)} |"
        )
    return lines


def _waits_of(profile: PhaseProfile, prefix: str) -> int:
    return sum(count for wait, count in profile.waits.items() if wait.startswith(prefix))


def _wal(profile: PhaseProfile) -> int:
    return sum(count for wait, count in profile.waits.items() if wait in WAL_WAITS)


def _pairs(profile: PhaseProfile) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    """Lock-wait samples per (waiting statement, blocking statement), all of them and those
    whose blocker was waiting for WAL to reach disk."""
    pairs: Counter[tuple[str, str]] = Counter()
    behind_wal: Counter[tuple[str, str]] = Counter()
    for (statement, _, blocker, doing), count in profile.blockers.items():
        pairs[statement, blocker] += count
        if doing in WAL_WAITS:
            behind_wal[statement, blocker] += count
    return pairs, behind_wal


def findings(
    profiles: Mapping[str, Mapping[str, PhaseProfile]],
    results: Mapping[str, Mapping[str, float]],
    unsampled: Mapping[str, Mapping[str, float]],
    explained: Sequence[Explained],
) -> list[str]:
    """Sentences that only restate the figures above them."""
    lines = []
    for phase in PHASES:
        for queue, phases in profiles.items():
            profile = phases[phase]
            locks = _waits_of(profile, "Lock:")
            sentence = (
                f"- {queue}, {phase} ({results[queue][f'{phase}_s']:.2f} s profiled):"
                f" {_share(locks, profile.samples)} of active-backend samples wait on a"
                f" heavyweight lock, {_share(_wal(profile), profile.samples)} for WAL to reach"
                f" disk (IO:WALSync, LWLock:WALWrite),"
                f" {_share(profile.waits['CPU'], profile.samples)} have no wait event."
            )
            if profile.locks:
                awaited = [
                    f"{lock} ({_share(count, locks)})"
                    + (
                        ", the lock a transaction that ran NOTIFY takes at commit (PostgreSQL's"
                        " PreCommit_Notify), so such commits wait for one another"
                        if lock == NOTIFY_LOCK
                        else ""
                    )
                    for (_, lock), count in profile.locks.most_common(2)
                    if count >= 0.1 * locks
                ]
                sentence += " The locks waited for most: " + "; ".join(awaited) + "."
                pairs, behind_wal = _pairs(profile)
                (statement, blocker), count = pairs.most_common(1)[0]
                sentence += (
                    f" {_share(count, locks)} of lock waits are {statement} behind {blocker},"
                    f" {_share(behind_wal[statement, blocker], count)} of those behind one"
                    " waiting for WAL to reach disk."
                )
                if (statement, blocker) == ("FINISH_CHUNK", "FINISH_CHUNK"):
                    sentence += (
                        " FINISH_CHUNK updates two rows: its chunk, leased to one consumer, and"
                        " its job's row in review_jobs, which the finisher of each of the job's"
                        " chunks updates; a row lock is held until its holder's commit."
                    )
            lines.append(sentence)
    executions = [statistics.median(item.execution_ms) for item in explained]
    reads = sum(item.plan["Plan"].get("Shared Read Blocks", 0) for item in explained)
    kinds = Counter(scan.split(" on ")[0] for item in explained for scan in scans(item.plan))
    lines.append(
        f"- Run alone and rolled back (no commit), each of the {len(explained)} EXPLAIN cases"
        f" executes in {min(executions):.2f}-{max(executions):.2f} ms (median),"
        f" {reads} blocks read from outside shared buffers; their table scans: "
        + ", ".join(f"{count} {kind}" for kind, count in kinds.most_common())
        + (", no Seq Scan." if "Seq Scan" not in kinds else ".")
    )
    lines.append(
        "- Drain chunks/s without and with the sampler (one run each): "
        + "; ".join(
            f"{queue} {unsampled[queue]['drain_chunks_per_s']:.0f} and"
            f" {results[queue]['drain_chunks_per_s']:.0f}"
            for queue in results
        )
        + "."
    )
    return lines


def render(
    args: argparse.Namespace,
    facts: Mapping[str, str],
    profiles: Mapping[str, Mapping[str, PhaseProfile]],
    results: Mapping[str, Mapping[str, float]],
    unsampled: Mapping[str, Mapping[str, float]],
    explained: Sequence[Explained],
    wall_s: float,
) -> str:
    command = (
        f"python bench/queue_profile.py --chunks {args.chunks} --consumers {args.consumers}"
        f" --interval-ms {args.interval_ms:g} --explain-jobs {args.explain_jobs}"
        f" --explain-runs {args.explain_runs}"
    )
    lines = [
        "# Queue profile: review-bot's store and pgqueuer inside PostgreSQL",
        "",
        f"`{command}` ({wall_s:.0f} s in all)",
        "",
        f"Machine: {facts['cores']} cores (shared with other work; load average"
        f" {facts['load']} at the start), PostgreSQL {facts['version']},"
        f" synchronous_commit={facts['synchronous_commit']}, fsync={facts['fsync']},"
        f" wal_sync_method={facts['wal_sync_method']},"
        f" track_activity_query_size={facts['track_activity_query_size']}.",
        "",
        f"Each queue ran twice, as bench/queue_throughput.py runs it ({args.chunks} chunks"
        f" enqueued {CHUNKS_PER_JOB} per call by {args.consumers} producers, NOTIFY on enqueue,"
        f" then drained by {args.consumers} consumers), each time on a new database: once"
        " alone, then profiled. During the second run a sampler on its own connection polled"
        f" pg_stat_activity every {args.interval_ms:g} ms (in the benchmark's event loop, so"
        " polls wait while the loop is busy) and counted every active client backend of the"
        " bench's database. A share is of those backend-samples; `CPU` is an active backend"
        " with no wait event (on a 2-core machine that includes waiting for a core);"
        " `backends on average` is samples in that wait per poll. Statements are named by"
        " their text (review-bot's from bot/queue/sql, pgqueuer's from its query builder).",
        "",
        "| queue | run | enqueue s | drain s | drain chunks/s | dequeue P50 ms | dequeue P99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for queue in results:
        for run, row in (("alone", unsampled[queue]), ("profiled", results[queue])):
            lines.append(
                f"| {queue} | {run} | {row['enqueue_s']:.2f} | {row['drain_s']:.2f} |"
                f" {row['drain_chunks_per_s']:.0f} | {row['dequeue_p50_ms']:.2f} |"
                f" {row['dequeue_p99_ms']:.2f} |"
            )
    for phase in PHASES:
        lines += ["", f"## {phase.capitalize()}"]
        for queue, phases in profiles.items():
            profile = phases[phase]
            lines += [
                "",
                f"### {queue}, {phase}: {profile.polls} polls over {profile.seconds:.2f} s,"
                f" {profile.samples} active-backend samples",
                "",
                *wait_table(profile),
                "",
                "Which statement waited:",
                "",
                *statement_table(profile),
                "",
                "Heavyweight lock waits, by the backend blocking them (pg_blocking_pids: the"
                " lock's holder, or a waiter ahead in its queue):",
                "",
                *blocker_table(profile),
            ]
            if profile.locks:
                lines += ["", "The locks waited for:", "", *lock_table(profile)]
            if profile.idle_in_transaction:
                lines += [
                    "",
                    f"Samples of backends idle in a transaction: {profile.idle_in_transaction}.",
                ]
    lines += [
        "",
        "## EXPLAIN (ANALYZE, BUFFERS)",
        "",
        f"On a queue of {args.explain_jobs} reviews of {CHUNKS_PER_JOB} chunks (P0-P3 in turn),"
        " enqueued through the store and then ANALYZEd; each statement with the SQL and"
        " parameters the store sends, in a transaction rolled back (a chunk leased first in the"
        " same transaction where the case needs one), so the queue is the same for every run."
        f" Median (range) of {args.explain_runs} runs; buffers are the whole statement's"
        " (shared hit/read/dirtied/written). A rolled-back EXPLAIN does not commit: its time"
        " has no WAL flush in it.",
        "",
        "| statement | case | planning ms | execution ms | of which triggers ms |"
        " buffers h/r/d/w | scans |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for item in explained:
        execution = item.execution_ms
        lines.append(
            f"| {item.case.name} | {item.case.what} |"
            f" {statistics.median(item.planning_ms):.3f} |"
            f" {statistics.median(execution):.3f} ({min(execution):.3f}-{max(execution):.3f}) |"
            f" {statistics.median(item.trigger_ms):.3f} | {_buffers(item.plan['Plan'])} |"
            f" {'; '.join(scans(item.plan))} |"
        )
    lines += ["", "Top nodes (the run of median execution time):"]
    for item in explained:
        lines += ["", f"{item.case.name}, {item.case.what}:", "", "```", *plan_outline(item.plan)]
        lines += ["```"]
    lines += ["", "<details><summary>Full plans</summary>"]
    for item in explained:
        lines += ["", f"{item.case.name}, {item.case.what}:", "", "```", item.text, "```"]
    lines += [
        "",
        "</details>",
        "",
        "## What this shows",
        "",
        *findings(profiles, results, unsampled, explained),
    ]
    return "\n".join(lines) + "\n"


async def server_facts(server: str) -> dict[str, str]:
    conn = await asyncpg.connect(server)
    try:
        facts = {
            name: str(await conn.fetchval(f"SHOW {name}"))
            for name in (
                "synchronous_commit",
                "fsync",
                "wal_sync_method",
                "track_activity_query_size",
                "server_version",
            )
        }
    finally:
        await conn.close()
    facts["version"] = facts.pop("server_version").split()[0]
    facts["cores"] = str(os.cpu_count())
    facts["load"] = " ".join(f"{value:.2f}" for value in os.getloadavg())
    return facts


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=5_000)
    parser.add_argument("--consumers", type=int, default=8, help="and as many producers")
    parser.add_argument("--interval-ms", type=float, default=5.0, help="between polls")
    parser.add_argument("--explain-jobs", type=int, default=2_000)
    parser.add_argument("--explain-runs", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    interval_s = args.interval_ms / 1000
    profiles: dict[str, dict[str, PhaseProfile]] = {}
    results: dict[str, dict[str, float]] = {}
    unsampled: dict[str, dict[str, float]] = {}
    with devdb.provision_server() as server:
        facts = await server_facts(server)
        ours = StatementNames(review_bot_statements(PGDialect_asyncpg()))
        theirs = StatementNames(pgqueuer_statements())
        sides = (
            ("review-bot", run_review_bot, ours, "bench_rb"),
            ("pgqueuer 1.6", run_pgqueuer, theirs, "bench_pgq"),
        )
        for queue, run, names, prefix in sides:
            # The same run without the sampler first: the difference is what sampling costs.
            async with devdb.scratch_database(server, prefix) as url:
                unsampled[queue] = await run(url, args.chunks, args.consumers)
            async with devdb.scratch_database(server, prefix) as url:
                results[queue], profiles[queue] = await profile_run(
                    run, url, names, args.chunks, args.consumers, interval_s
                )
            print(f"{queue} profiled", file=sys.stderr)
        explained = await explain_queue(
            server, args.explain_jobs, args.consumers, args.explain_runs
        )
    wall_s = time.perf_counter() - started
    text = render(args, facts, profiles, results, unsampled, explained, wall_s)
    results_dir = Path(__file__).with_name("results")
    results_dir.mkdir(exist_ok=True)
    (results_dir / "queue_profile.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    from bot.runtime import run

    raise SystemExit(run(main()))  # the loop `bot serve` runs on, as queue_throughput does
