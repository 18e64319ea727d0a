"""Fault drills on real `bot serve` processes: a web process and dispatcher processes against
real PostgreSQL and the forge emulator, a burst of signed webhooks, then a fault: a dispatcher
killed with SIGKILL while chunks run, between its last chunk and posting, or while a post is on
the wire; the database restarted, and stopped hard for ten seconds; a backend that raises what
no contract names. Each drill checks that every acknowledged webhook became exactly one posted
review, that a refused one was not stored, that nothing answered 500, and that the queue
drained with no process restarted by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import socket
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from bot import devdb
from bot.database_url import async_url
from bot.db import upgrade_database
from bot.demo import SECRET, TOKEN, load_demo_trace, send_request
from bot.emulator import EmulatorState, ForgeEmulator
from bot.emulator.github import seed_issue_comment
from bot.emulator.limits import CONTENT_METHODS, NOT_CONTENT_ROUTES
from bot.emulator.state import Fault
from bot.emulator.webhooks import build_github_issue_comment_event, send_webhook
from bot.errors import ConfigError
from bot.forges.base import SUMMARY_MARKER, find_marker
from bot.model import Forge
from bot.queue.connector import Connector
from bot.queue.guarantees import GuaranteeLimits, check_guarantees, render_guarantees
from bot.sim.trace import TraceRequest
from tests.support.serving import REPO_ROOT, free_port, start_serve, wait_until
from tests.support.webhook_fixtures import load_payload

LEASE_S = 4.0
HEARTBEAT_S = 1.0
BURST = 100
DRAIN_TIMEOUT_S = 150.0
MAX_ATTEMPTS = 3  # REVIEW_BOT_MAX_ATTEMPTS's default, which the drills keep
# A paused process stays stopped for three leases: every lease it held has run out and been
# taken over before it resumes.
PAUSE_S = 3 * LEASE_S
PAUSE_BURST = 40
COMMANDS = 6
REPLY_MARKER_PATTERN = re.compile(r"<!-- review-bot:reply=(\d+) -->")

# Under pytest-xdist (`make test`) the drills run in two lines, one drill of each at a time:
# each starts several `bot serve` processes whose leases run on the wall clock, and two lines
# keep them off each other's time on a two-core machine while halving their share of the run.
DRILLS_A = pytest.mark.xdist_group("drills-a")
DRILLS_B = pytest.mark.xdist_group("drills-b")

pytestmark = [
    pytest.mark.slow,
    # `bot serve` processes on the wall clock, taking any token.
    pytest.mark.emulator(github_tokens=set(), gitlab_tokens=set(), virtual_clock=False),
]


@dataclass
class Served:
    """One `bot serve` process and where its log goes."""

    role: str
    process: asyncio.subprocess.Process
    port: int
    log: Path

    @property
    def owner(self) -> str:
        """The lease owner the process writes (bot.serve.worker_name)."""
        return f"{socket.gethostname()}-{self.process.pid}"

    @property
    def poster_pattern(self) -> str:
        """What its posting claims are written as (bot.review.poster.PostingSettings.owner)."""
        return f"poster-{self.process.pid}-%"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    async def pause(self, seconds: float) -> None:
        """SIGSTOP the process for `seconds` of real time, then SIGCONT it (a GC pause, a
        frozen VM, a container throttled to zero: its sockets stay open, it does nothing)."""
        self.process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)  # the pause itself is what is drilled: real time
        finally:
            self.process.send_signal(signal.SIGCONT)


def _environment(database_url: str, emulator: ForgeEmulator, **extra: str) -> dict[str, str]:
    return {
        **{key: value for key, value in os.environ.items() if not key.startswith("REVIEW_BOT_")},
        "DATABASE_URL": database_url,
        "GITHUB_WEBHOOK_SECRET": SECRET,
        "GITLAB_WEBHOOK_TOKEN": SECRET,
        "GITHUB_TOKEN": TOKEN,
        "GITLAB_TOKEN": TOKEN,
        "GITHUB_API_URL": emulator.github_url,
        "GITLAB_URL": emulator.gitlab_url,
        "REVIEW_BOT_LLM": "simulated",
        # Simulated calls take a twentieth of the trace's GPU time, in real time: work is in
        # flight when the fault comes.
        "REVIEW_BOT_SIM_TIME_SCALE": "0.05",
        "REVIEW_BOT_WORKERS": "4",
        "REVIEW_BOT_LEASE_S": str(LEASE_S),
        "REVIEW_BOT_HEARTBEAT_S": str(HEARTBEAT_S),
        # One posted review per job, found by its marker: the drills count them.
        "REVIEW_BOT_QUIET": "false",
        "REVIEW_BOT_STATUS": "false",
        "PYTHONPATH": str(REPO_ROOT),
        **extra,
    }


@contextlib.asynccontextmanager
async def _serving(
    roles: Sequence[str],
    env: dict[str, str],
    logs: Path,
    *,
    extra_env: Mapping[int, Mapping[str, str]] | None = None,
) -> AsyncIterator[list[Served]]:
    """Start one `bot serve` per role (the one at index i with `extra_env[i]` added); they are
    stopped (SIGTERM, then SIGKILL) afterwards."""
    served: list[Served] = []
    try:
        for index, role in enumerate(roles):
            port = free_port()
            log = logs / f"{index}-{role}.log"
            own_env = {**env, **(extra_env or {}).get(index, {})}
            with log.open("wb") as sink:  # the child keeps its own descriptor
                process = await start_serve(role, port=port, env=own_env, stderr=sink)
            served.append(Served(role, process, port, log))
        for item in served:

            async def listening(item: Served = item) -> bool:
                assert item.process.returncode is None, (
                    f"bot serve --role {item.role} exited: {item.log.read_text()[-3000:]}"
                )
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", item.port)
                except OSError:
                    return False
                writer.close()
                await writer.wait_closed()
                return True

            await wait_until(listening, timeout_s=60, what=f"bot serve --role {item.role}")
            if item.role == "dispatcher":
                # Listening comes before the dispatcher loop: on a loaded machine a dispatcher
                # that was late to its first pass saw a whole burst taken by the other one.
                # Its presence row is written as its loop starts.
                async def serving(item: Served = item) -> bool:
                    assert item.process.returncode is None, item.log.read_text()[-3000:]
                    rows = await _fetch(
                        env["DATABASE_URL"],
                        "SELECT count(*) AS n FROM dispatchers"
                        " WHERE name = $1 AND stopped_at IS NULL",
                        item.owner,
                    )
                    return int(rows[0]["n"]) == 1

                await wait_until(serving, timeout_s=60, what=f"dispatcher {item.owner} serving")
        yield served
    finally:
        for item in served:
            if item.process.returncode is None:
                item.process.send_signal(signal.SIGTERM)
        for item in served:
            try:
                await asyncio.wait_for(item.process.wait(), timeout=30)
            except TimeoutError:
                item.process.kill()
                await item.process.wait()


def _burst(count: int, *, github_every: int = 5) -> list[TraceRequest]:
    """`count` small pull/merge requests of the demo's morning, each its own PR, none a draft;
    one in `github_every` goes to GitHub, the rest to GitLab."""
    trace, _ = load_demo_trace(4 * count, max_lines=60)
    chosen: list[TraceRequest] = []
    seen: set[tuple[str, str, int]] = set()
    for request in trace.requests:
        # Four in five go to GitLab: GitHub's pace of one content POST a second per process
        # would make the drills measure the pacing.
        forge: Forge = "github" if len(chosen) % github_every == 0 else "gitlab"
        key = (forge, request.repo, request.number)
        if request.action != "opened" or request.draft or key in seen:
            continue
        seen.add(key)
        chosen.append(dataclasses.replace(request, forge=forge, depends_on=()))
    assert len(chosen) >= count, f"the demo trace has only {len(chosen)} fitting requests"
    return chosen[:count]


async def _send_all(
    emulator: ForgeEmulator, url: str, requests: Sequence[TraceRequest], *, per_s: float = 0.0
) -> dict[tuple[str, str, int], str]:
    """Each request's answer by its PR ("queued", "refused 503", "no answer: ...")."""
    answers: dict[tuple[str, str, int], str] = {}
    seen: set[tuple[str, str, int]] = set()
    for request in requests:
        key = (request.forge, request.repo, request.number)
        try:
            answers[key] = await send_request(emulator, url, request, seen)
        except (TimeoutError, OSError) as exc:  # no answer: the bot may or may not have it
            answers[key] = f"no answer: {exc!r}"
        if per_s:
            await asyncio.sleep(1.0 / per_s)  # the forge's pace of deliveries
    return answers


async def _fetch(database_url: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        try:
            await asyncio.wait_for(conn.close(), timeout=5)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn.terminate()  # the server went away mid-query: drop the socket all the same


async def _drained(database_url: str) -> bool:
    rows = await _fetch(
        database_url,
        "SELECT count(*) AS live FROM review_jobs WHERE state IN ('waiting', 'queued', 'running')",
    )
    return int(rows[0]["live"]) == 0


def _markers(state: EmulatorState) -> Counter[int | None]:
    posted = state.posted(kind="review") + state.posted(kind="note")
    return Counter(find_marker(record.body) for record in posted)


async def _check_exactly_once(
    database_url: str, state: EmulatorState, answers: dict[tuple[str, str, int], str]
) -> dict[str, int]:
    """Every acknowledged webhook is one done job with one posted review; refused ones left no
    job; nothing answered 500. Returns the answers counted."""
    outcomes = Counter(
        answer if not answer.startswith("no answer") else "no answer" for answer in answers.values()
    )
    assert set(outcomes) <= {"queued", "refused 503", "no answer"}, outcomes
    jobs = await _fetch(database_url, "SELECT id, forge, repo, number, state FROM review_jobs")
    by_pull = {(row["forge"], row["repo"], row["number"]): row for row in jobs}
    assert len(by_pull) == len(jobs), "a pull request got two jobs"
    for key, answer in answers.items():
        if answer == "queued":
            assert key in by_pull, f"{key} was acknowledged and never stored"
        elif answer == "refused 503":
            assert key not in by_pull, f"{key} was refused and stored anyway"
    assert Counter(row["state"] for row in jobs) == {"done": len(jobs)}
    markers = _markers(state)
    assert markers.get(None, 0) == 0, "a review without the job's marker"
    assert {job_id: count for job_id, count in markers.items() if count != 1} == {}
    assert set(markers) == {row["id"] for row in jobs}
    return dict(outcomes)


async def _jobs_posting_by(database_url: str, owner_pattern: str) -> list[int]:
    """Jobs whose every chunk is done and whose assembling and posting a process whose posting
    claims match `owner_pattern` (LIKE) holds."""
    rows = await _fetch(
        database_url,
        """
        SELECT id FROM review_jobs
        WHERE state = 'running' AND planned AND chunks_total > 0
          AND chunks_done = chunks_total AND posting_by LIKE $1 AND posting_until > now()
        """,
        owner_pattern,
    )
    return [row["id"] for row in rows]


async def _check_guarantees(database_url: str) -> None:
    """Every guarantee of the queue holds (bot.queue.guarantees, what `bot check` runs)."""
    connector = Connector(create_async_engine(async_url(database_url)))
    try:
        results = await check_guarantees(
            connector,
            now=datetime.now(UTC),
            limits=GuaranteeLimits(
                lease_s=LEASE_S, heartbeat_s=HEARTBEAT_S, max_chunk_attempts=MAX_ATTEMPTS
            ),
        )
    finally:
        await connector.close()
    assert all(result.holds for result in results), render_guarantees(results)


def _summaries_per_pull(state: EmulatorState) -> Counter[tuple[str, int]]:
    """Living summaries each pull request holds (a GitHub comment, a GitLab note): one that
    two attempts both created is taken back by the later (bot.review.quiet_post.one_summary)."""
    return Counter(
        (pull.repo, pull.number)
        for pull in state.pulls.values()
        for item in (pull.comments if pull.forge == "github" else pull.notes)
        if SUMMARY_MARKER in str(item.get("body") or "")
    )


def _deleted_notes(state: EmulatorState) -> set[object]:
    return {record.data["id"] for record in state.posted(kind="note_delete")}


def _discussion_notes(state: EmulatorState) -> set[object]:
    return {record.data["note_id"] for record in state.posted(kind="discussion")}


def _summaries_taken_back(state: EmulatorState) -> int:
    summaries = _deleted_notes(state) - _discussion_notes(state)
    return len(state.posted(kind="comment_delete")) + len(summaries)


def _discussions_taken_back(state: EmulatorState) -> int:
    return len(_deleted_notes(state) & _discussion_notes(state))


def _repeated_writes(state: EmulatorState) -> list[tuple[str, str, int | None]]:
    """Review bodies and inline findings the forge took more than once and still shows (an
    inline note written twice and taken back by its writer is not repeated on the page)."""
    deleted = _deleted_notes(state)
    writes = Counter(
        (record.kind, record.repo, record.number, record.body)
        for record in state.records
        if record.kind == "review"
        or (record.kind == "discussion" and record.data["note_id"] not in deleted)
    )
    return [(kind, repo, number) for (kind, repo, number, _), n in writes.items() if n > 1]


def _statuses_after_the_end(state: EmulatorState) -> dict[str, bool]:
    """Heads where a status was written after a final one (success, failure, ...), each with
    whether a final status was written over it again: a paused process's write that was on the
    wire as the publisher's lease was taken over lands late, and the leader writes the final
    state over it (a forge has no conditional writes)."""
    written: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for record in state.records:
        if record.kind == "commit_status":
            data = record.data  # GitHub says `state`, GitLab `status`
            sha = str(data.get("sha") or str(data.get("url", "")).rsplit("/", 1)[-1])
            key = (record.forge, record.repo, sha)
            written[key].append(str(data.get("state") or data.get("status")))
    late: dict[str, bool] = {}
    for (forge, repo, sha), states in written.items():
        final = [i for i, value in enumerate(states) if value not in ("pending", "running")]
        if final and any(value in ("pending", "running") for value in states[final[0] :]):
            late[f"{forge} {repo} {sha[:12]}: {' -> '.join(states)}"] = states[-1] not in (
                "pending",
                "running",
            )
    return late


@DRILLS_A
@pytest.mark.parametrize("point", ["chunks running", "before posting", "post on the wire"])
async def test_a_dispatcher_killed_mid_burst_loses_and_repeats_nothing(
    point: str, db_url: str, emulator: ForgeEmulator, tmp_path: Path
) -> None:
    state = emulator.state
    if point == "before posting":
        # The forge is slow to take a review (a first attempt looks for no earlier one): jobs
        # wait, claimed, with nothing on the forge yet. A review the victim sent just before it
        # died may still land, well inside the lease; the survivor's attempt finds it.
        for route in ("github.reviews.create", "gitlab.notes.create", "gitlab.discussions.create"):
            state.add_fault(route, Fault.slow(1.5), times=12)
    elif point == "post on the wire":
        # The forge takes the review at once and answers late: the poster dies in between.
        # The first dozen of each are enough to catch the victim there; the rest go at speed.
        for route in ("github.reviews.create", "gitlab.notes.create"):
            state.add_fault(route, Fault.late_answer(2.0), times=12)
    env = _environment(db_url, emulator)
    async with _serving(["web", "dispatcher", "dispatcher"], env, tmp_path) as served:
        web, victim, survivor = served
        answers = await _send_all(emulator, web.url, _burst(BURST))

        async def at_the_point() -> bool:
            if point == "chunks running":
                rows = await _fetch(
                    db_url,
                    "SELECT count(*) AS n FROM review_chunks"
                    " WHERE state = 'running' AND lease_owner = $1",
                    victim.owner,
                )
                return int(rows[0]["n"]) >= 2
            claimed = await _jobs_posting_by(db_url, victim.poster_pattern)
            on_forge = {job for job in claimed if _markers(state).get(job)}
            if point == "before posting":
                return bool(set(claimed) - on_forge)
            return bool(on_forge)

        await wait_until(at_the_point, timeout_s=60, what=f"the victim at '{point}'")
        victim.kill()
        killed_at = time.monotonic()
        await victim.process.wait()

        async def drained() -> bool:
            assert survivor.process.returncode is None, survivor.log.read_text()[-3000:]
            return await _drained(db_url)

        await wait_until(drained, timeout_s=DRAIN_TIMEOUT_S, what="the queue to drain")
        drain_s = time.monotonic() - killed_at
        assert web.process.returncode is None
    outcomes = await _check_exactly_once(db_url, state, answers)
    assert outcomes == {"queued": BURST}
    await _check_guarantees(db_url)
    print(f"killed at '{point}': {BURST} reviews posted once each, drained {drain_s:.1f} s after")


DRAIN_LINE = re.compile(r"drained: (\d+) running chunks ended within [\d.]+ s, (\d+) handed back")


@DRILLS_A
@pytest.mark.parametrize(
    ("grace_s", "victim_scale"),
    [
        # Calls of 2-10 s against a grace of 30 s: what runs finishes, nothing is handed back.
        (30.0, "0.3"),
        # Calls of 14 s and more against a grace of 1 s: what runs is handed back (at 7 s, a
        # loaded make test once saw both calls end within the grace).
        (1.0, "1.0"),
    ],
    ids=["calls finish within the grace", "calls outlast the grace"],
)
async def test_a_dispatcher_stopped_mid_burst_drains_and_loses_nothing(
    grace_s: float, victim_scale: str, db_url: str, emulator: ForgeEmulator, tmp_path: Path
) -> None:
    # A lease far longer than the drill: a chunk or posting claim the stopped dispatcher kept
    # would hold its review back past the drain timeout instead of being taken over.
    env = _environment(db_url, emulator, REVIEW_BOT_LEASE_S="300", REVIEW_BOT_HEARTBEAT_S="1")
    victim_env = {
        "REVIEW_BOT_SHUTDOWN_GRACE_S": str(grace_s),
        "REVIEW_BOT_SIM_TIME_SCALE": victim_scale,
    }
    roles = ["web", "dispatcher", "dispatcher"]
    async with _serving(roles, env, tmp_path, extra_env={1: victim_env}) as served:
        web, victim, survivor = served
        answers = await _send_all(emulator, web.url, _burst(BURST))

        async def running_on_victim() -> bool:
            rows = await _fetch(
                db_url,
                "SELECT count(*) AS n FROM review_chunks"
                " WHERE state = 'running' AND lease_owner = $1",
                victim.owner,
            )
            return int(rows[0]["n"]) >= 2

        await wait_until(running_on_victim, timeout_s=60, what="chunks running on the victim")
        victim.process.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        code = await asyncio.wait_for(victim.process.wait(), timeout=grace_s + 30)
        exit_s = time.monotonic() - stopped_at
        log = victim.log.read_text()
        assert code == 0, log[-3000:]
        # Nothing of the victim's is left held: no chunk lease, no planning or posting claim.
        held = await _fetch(
            db_url,
            "SELECT (SELECT count(*) FROM review_chunks WHERE state = 'running'"
            "        AND lease_owner = $1) AS chunks,"
            "       (SELECT count(*) FROM review_jobs WHERE state = 'running'"
            "        AND posting_by LIKE $2 AND posting_until IS NOT NULL)"
            "     + (SELECT count(*) FROM review_jobs WHERE NOT planned"
            "        AND planning_by LIKE $3 AND planning_until IS NOT NULL) AS claims",
            victim.owner,
            victim.poster_pattern,
            f"planner-{victim.process.pid}-%",
        )
        assert (held[0]["chunks"], held[0]["claims"]) == (0, 0)
        drained_line = DRAIN_LINE.search(log)
        assert drained_line is not None, log[-3000:]
        ended, handed_back = int(drained_line[1]), int(drained_line[2])
        history = await _fetch(
            db_url,
            "SELECT count(*) AS n FROM job_history"
            " WHERE reason = 'handed back at shutdown' AND actor = $1",
            victim.owner,
        )
        assert int(history[0]["n"]) == handed_back
        if grace_s >= 30:
            assert ended >= 1 and handed_back == 0 and exit_s < grace_s, (
                ended,
                handed_back,
                exit_s,
            )
        else:
            assert handed_back >= 1 and exit_s < grace_s + 10, (ended, handed_back, exit_s)

        async def drained() -> bool:
            assert survivor.process.returncode is None, survivor.log.read_text()[-3000:]
            return await _drained(db_url)

        await wait_until(drained, timeout_s=DRAIN_TIMEOUT_S, what="the queue to drain")
        drain_s = time.monotonic() - stopped_at
        assert web.process.returncode is None
    outcomes = await _check_exactly_once(db_url, emulator.state, answers)
    assert outcomes == {"queued": BURST}
    # Handed-back chunks were not counted as attempts: no chunk ran out of them.
    dead = await _fetch(db_url, "SELECT count(*) AS n FROM review_chunks WHERE state = 'dead'")
    assert int(dead[0]["n"]) == 0
    await _check_guarantees(db_url)
    print(
        f"SIGTERM with a grace of {grace_s:g} s: {ended} running chunks ended, {handed_back}"
        f" handed back, exit after {exit_s:.1f} s; {BURST} reviews posted once each,"
        f" drained {drain_s:.1f} s after"
    )


@DRILLS_B
async def test_a_backend_raising_the_unexpected_loses_no_review(
    db_url: str, emulator: ForgeEmulator, tmp_path: Path
) -> None:
    # Every fifth chunk's first call raises an error no backend contract names.
    env = _environment(db_url, emulator, REVIEW_BOT_SIM_FAULT_EVERY="5")
    async with _serving(["all"], env, tmp_path) as (bot,):
        answers = await _send_all(emulator, bot.url, _burst(BURST))
        await wait_until(
            lambda: _drained(db_url), timeout_s=DRAIN_TIMEOUT_S, what="the queue to drain"
        )
        assert bot.process.returncode is None
    assert await _check_exactly_once(db_url, emulator.state, answers) == {"queued": BURST}
    await _check_guarantees(db_url)
    faulted = await _fetch(
        db_url,
        "SELECT count(*) AS n FROM review_chunks WHERE attempts > 0 AND state = 'done'"
        " AND last_error IS NOT NULL",
    )
    assert int(faulted[0]["n"]) >= BURST // 10, "the drill's faults never fired"


@pytest.fixture
def cluster() -> Iterator[devdb.Cluster]:
    try:
        with devdb.throwaway_cluster() as made:
            yield made
    except ConfigError as exc:
        pytest.skip(f"no PostgreSQL cluster of our own to restart: {exc}")


@DRILLS_B
async def test_the_database_restarting_and_stopping_hard_is_survived(
    cluster: devdb.Cluster, emulator: ForgeEmulator, tmp_path: Path
) -> None:
    name = devdb.unique_database_name("rbt_faults")
    database_url = await devdb.create_database(cluster.url, name)
    await upgrade_database(database_url)
    env = _environment(database_url, emulator)
    requests = _burst(150)
    async with _serving(["web", "dispatcher", "dispatcher"], env, tmp_path) as served:
        web = served[0]
        sending = asyncio.create_task(_send_all(emulator, web.url, requests, per_s=8.0))
        await asyncio.sleep(1.5)  # webhooks arriving, work running
        await asyncio.to_thread(cluster.restart, "fast")
        await asyncio.sleep(1.5)
        await asyncio.to_thread(cluster.stop, "immediate")
        await asyncio.sleep(10.0)  # the database is away for ten seconds
        await asyncio.to_thread(cluster.start)
        back_at = time.monotonic()
        answers = await sending

        async def drained() -> bool:
            for item in served:
                assert item.process.returncode is None, (
                    f"{item.role} exited: {item.log.read_text()[-3000:]}"
                )
            try:
                return await _drained(database_url)
            except (OSError, asyncpg.PostgresError):
                return False

        await wait_until(drained, timeout_s=DRAIN_TIMEOUT_S, what="the queue to drain")
        drain_s = time.monotonic() - back_at
    outcomes = await _check_exactly_once(database_url, emulator.state, answers)
    await _check_guarantees(database_url)
    assert outcomes.get("queued", 0) >= 50, outcomes
    assert outcomes.get("refused 503", 0) >= 1, f"the outage refused nothing: {outcomes}"
    print(f"database restarted and stopped hard: {outcomes}, drained {drain_s:.1f} s after")


@DRILLS_B
@pytest.mark.parametrize("point", ["chunks running", "before posting", "post on the wire"])
async def test_a_dispatcher_paused_for_three_leases_writes_nothing_twice(
    point: str, db_url: str, emulator: ForgeEmulator, tmp_path: Path
) -> None:
    """SIGSTOP a dispatcher mid-burst, SIGCONT it three leases later: quiet reviews with their
    living summaries and statuses on; one review and one summary per PR, no status after a
    job's final one, and the resumed process drops what it held ("lease lost")."""
    state = emulator.state
    if point == "post on the wire":
        # The forge takes the findings or the summary at once and answers late.
        for route in ("github.reviews.create", "gitlab.discussions.create",
                      "github.comments.create", "gitlab.notes.create"):  # fmt: skip
            state.add_fault(route, Fault.late_answer(1.5), times=10)
    env = _environment(
        db_url,
        emulator,
        REVIEW_BOT_QUIET="true",
        REVIEW_BOT_STATUS="true",
        REVIEW_BOT_STATUS_INTERVAL_S="1",
    )
    requests = _burst(PAUSE_BURST, github_every=10)
    async with _serving(["web", "dispatcher", "dispatcher"], env, tmp_path) as served:
        web, victim, _ = served
        answers = await _send_all(emulator, web.url, requests)
        if point == "before posting":
            # Once every job is planned, reading a pull request's changes is slow: that read
            # comes first in posting, so jobs wait there, claimed, between chunks and post. Slow
            # enough that the claim seen is still held when the pause lands on a loaded machine.
            await wait_until(
                lambda: _all_planned(db_url), timeout_s=60, what="every job to be planned"
            )
            for route in ("github.files", "gitlab.changes", "gitlab.diffs"):
                state.add_fault(route, Fault.slow(3.0), times=30)

        async def at_the_point() -> bool:
            if point == "chunks running":
                rows = await _fetch(
                    db_url,
                    "SELECT count(*) AS n FROM review_chunks"
                    " WHERE state = 'running' AND lease_owner = $1",
                    victim.owner,
                )
                return int(rows[0]["n"]) >= 2
            claimed = await _jobs_posting_by(db_url, victim.poster_pattern)
            if point == "before posting":
                return bool(claimed)
            written = {
                find_marker(record.body)
                for record in state.records
                if record.kind in ("review", "discussion", "issue_comment", "note")
            }
            return bool(set(claimed) & written)  # taken by the forge, its answer still to come

        await wait_until(at_the_point, timeout_s=60, what=f"the victim at '{point}'")
        paused_at = time.monotonic()
        await victim.pause(PAUSE_S)

        async def drained() -> bool:
            for item in served:
                assert item.process.returncode is None, item.log.read_text()[-3000:]
            return await _drained(db_url)

        await wait_until(drained, timeout_s=DRAIN_TIMEOUT_S, what="the queue to drain")
        drain_s = time.monotonic() - paused_at
        # The status of each job's end is written once the publisher has seen it end; the
        # final statuses queue in the forges' write budgets behind the reviews (GitHub's one
        # write a second), so on a loaded machine the last may come half a minute after.
        try:
            await wait_until(
                lambda: _statuses_final(db_url), timeout_s=60, what="every final status written"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {await _statuses_not_final(db_url)}") from exc

        async def written_over() -> bool:
            return all(_statuses_after_the_end(state).values())

        # A late write of the paused process lands when it resumes; the leader writes the final
        # state over it at once (the stale process wakes it).
        await wait_until(written_over, timeout_s=30, what="late statuses written over")
    assert Counter(answers.values()) == {"queued": PAUSE_BURST}
    jobs = await _fetch(db_url, "SELECT id, repo, number, state FROM review_jobs")
    assert Counter(row["state"] for row in jobs) == {"done": PAUSE_BURST}
    assert _summaries_per_pull(state) == Counter({(row["repo"], row["number"]): 1 for row in jobs})
    assert _repeated_writes(state) == []
    late = _statuses_after_the_end(state)
    assert all(late.values()), f"a head left showing a review that ended as not ended: {late}"
    await _check_guarantees(db_url)
    dropped = victim.log.read_text().count("lease lost, dropping result")
    assert dropped >= 1, "the resumed dispatcher held nothing that was taken over"
    print(
        f"paused at '{point}' for {PAUSE_S:.0f} s: {PAUSE_BURST} reviews, one summary each "
        f"({_summaries_taken_back(state)} written twice and taken back; inline findings taken "
        f"back: {_discussions_taken_back(state)}; statuses written over a late one: "
        f"{len(late)}), {dropped} stale results "
        f"dropped, drained {drain_s:.1f} s after the pause began"
    )


async def _all_planned(database_url: str) -> bool:
    rows = await _fetch(database_url, "SELECT count(*) AS n FROM review_jobs WHERE NOT planned")
    return int(rows[0]["n"]) == 0


async def _statuses_final(database_url: str) -> bool:
    rows = await _fetch(
        database_url,
        "SELECT count(*) AS open FROM review_jobs j LEFT JOIN status_reports s ON s.job_id = j.id"
        " WHERE s.state IS DISTINCT FROM 'completed'",
    )
    return int(rows[0]["open"]) == 0


async def _statuses_not_final(database_url: str) -> list[dict[str, object]]:
    """The jobs whose status is not written as final yet, with what was written of it."""
    rows = await _fetch(
        database_url,
        "SELECT j.id, j.state, j.finished_at, s.state AS status, s.published_at, s.writes"
        " FROM review_jobs j LEFT JOIN status_reports s ON s.job_id = j.id"
        " WHERE s.state IS DISTINCT FROM 'completed' ORDER BY j.id",
    )
    return [dict(row) for row in rows]


@DRILLS_A
async def test_a_web_process_paused_with_command_replies_on_the_wire_replies_once(
    db_url: str, emulator: ForgeEmulator, tmp_path: Path
) -> None:
    """Two web processes share slash commands; the one whose reply is on the wire (the forge
    took it, its answer is late) is SIGSTOPped for three leases: the other takes its claims
    over, every command gets exactly one reply, and the resumed process drops what it held."""
    fixture = load_payload("github/issue_comment.created.json").payload
    state = emulator.state
    env = _environment(db_url, emulator)
    requests = _burst(COMMANDS, github_every=1)
    async with _serving(["web", "web"], env, tmp_path) as served:
        answers = await _send_all(emulator, served[0].url, requests)
        assert Counter(answers.values()) == {"queued": COMMANDS}
        state.add_fault("github.comments.create", Fault.late_answer(2.0), times=COMMANDS)

        async def send_command(request: TraceRequest, web: Served) -> None:
            body = "/review status"
            comment_id = seed_issue_comment(state, request.repo, request.number, user="lead",
                                            body=body)  # fmt: skip
            payload = build_github_issue_comment_event(
                fixture, body=body, repo=request.repo, number=request.number, author="lead",
                comment_id=comment_id, installation_id=1,
            )  # fmt: skip
            answer = await send_webhook(
                f"{web.url}/webhooks/github", "github", "issue_comment", payload, SECRET
            )
            assert answer.status == 200, answer.body

        victims: list[Served] = []

        async def reply_on_the_wire() -> bool:
            rows = await _fetch(
                db_url,
                "SELECT id, claimed_by AS owner FROM webhook_deliveries"
                " WHERE outcome = 'command_running'",
            )
            replied = {
                int(match.group(1))
                for record in state.posted(kind="issue_comment")
                if (match := REPLY_MARKER_PATTERN.search(record.body or ""))
            }
            for row in rows:
                if row["id"] in replied:
                    pid = str(row["owner"]).split("-")[1]
                    victims.extend(item for item in served if str(item.process.pid) == pid)
                    return True
            return False

        # The first command's reply goes out; its worker stops with the forge's answer due,
        # and the other commands arrive while it is stopped.
        await send_command(requests[0], served[0])
        await wait_until(reply_on_the_wire, timeout_s=60, what="a reply on the wire")
        [victim] = victims
        paused_at = time.monotonic()
        pausing = asyncio.create_task(victim.pause(PAUSE_S))
        [survivor] = [item for item in served if item is not victim]

        async def taken_over() -> bool:
            rows = await _fetch(
                db_url,
                "SELECT count(*) AS n FROM webhook_deliveries WHERE event = 'issue_comment'"
                " AND claimed_by LIKE $1",
                f"commands-{survivor.process.pid}-%",
            )
            return int(rows[0]["n"]) == 1

        await wait_until(taken_over, timeout_s=PAUSE_S, what="the stopped claim taken over")
        for request in requests[1:]:
            await send_command(request, survivor)
        await pausing

        async def all_answered() -> bool:
            rows = await _fetch(
                db_url, "SELECT outcome FROM webhook_deliveries WHERE event = 'issue_comment'"
            )
            outcomes = Counter(row["outcome"] for row in rows)
            assert set(outcomes) <= {"command", "command_running", "command_done"}, outcomes
            return outcomes == {"command_done": COMMANDS}

        await wait_until(all_answered, timeout_s=DRAIN_TIMEOUT_S, what="every command answered")
        answered_s = time.monotonic() - paused_at
        # The resumed process has run on: whatever it still held is dropped, not sent.
        await wait_until(
            lambda: _logged(victim, "lease lost, dropping result"),
            timeout_s=30,
            what="the resumed process to drop its stale claim",
        )
    deliveries = await _fetch(
        db_url, "SELECT id FROM webhook_deliveries WHERE event = 'issue_comment'"
    )
    replies = Counter(
        int(match.group(1))
        for record in state.posted(kind="issue_comment")
        if (match := REPLY_MARKER_PATTERN.search(record.body or ""))
    )
    assert replies == Counter({row["id"]: 1 for row in deliveries})
    await _check_guarantees(db_url)
    print(
        f"web process paused with a reply on the wire for {PAUSE_S:.0f} s: {COMMANDS} commands"
        f" answered once each, {answered_s:.1f} s after the pause began"
    )


async def _logged(served: Served, text: str) -> bool:
    return text in served.log.read_text()


# The shared write budget drill: GitHub's secondary limit shrunk to a few writes a "minute"
# of compressed time, on the emulator and in the bot alike.
BUDGET_PER_MINUTE = 4
BUDGET_TIME_SCALE = 0.1  # a minute lasts 6 s
BUDGET_BURST = 16


@DRILLS_B
async def test_two_dispatcher_processes_share_one_write_budget(
    db_url: str, emulator: ForgeEmulator, tmp_path: Path
) -> None:
    """Two `bot serve` dispatchers post reviews through one GitHub token whose secondary limit
    the emulator enforces (a 403 with Retry-After past it): the budget they share in PostgreSQL
    keeps the two together under it, so GitHub refuses nothing and every review is posted once.
    Each process pacing only itself would spend the limit twice."""
    state = emulator.state
    state.set_content_limits(
        "github", per_minute=BUDGET_PER_MINUTE, per_hour=0, time_scale=BUDGET_TIME_SCALE
    )
    env = _environment(
        db_url,
        emulator,
        REVIEW_BOT_GITHUB_WRITES_PER_MINUTE=str(BUDGET_PER_MINUTE),
        REVIEW_BOT_GITHUB_WRITES_PER_HOUR="0",
        REVIEW_BOT_FORGE_WINDOW_SCALE=str(BUDGET_TIME_SCALE),
        REVIEW_BOT_LEASE_S="300",
        REVIEW_BOT_HEARTBEAT_S="1",
    )
    requests = _burst(BUDGET_BURST, github_every=1)
    async with _serving(["web", "dispatcher", "dispatcher"], env, tmp_path) as served:
        web, *dispatchers = served
        answers = await _send_all(emulator, web.url, requests)

        async def drained() -> bool:
            for item in served:
                assert item.process.returncode is None, item.log.read_text()[-3000:]
            return await _drained(db_url)

        await wait_until(drained, timeout_s=DRAIN_TIMEOUT_S, what="the queue to drain")
    assert Counter(answers.values()) == {"queued": BUDGET_BURST}
    await _check_exactly_once(db_url, state, answers)
    assert state.content.refused == 0
    assert state.count_requests("github.reviews.create", status=403) == 0
    posted_by = [item.log.read_text().count("posted (") for item in dispatchers]
    assert all(count > 0 for count in posted_by), f"one process posted everything: {posted_by}"
    assert sum(posted_by) == BUDGET_BURST
    writes = sorted(
        item.at
        for item in state.requests
        if item.route.startswith("github.")
        and item.method in CONTENT_METHODS
        and item.route not in NOT_CONTENT_ROUTES
        and item.status < 400
    )
    window = 60.0 * BUDGET_TIME_SCALE
    most = max(
        sum(1 for other in writes[index:] if (other - start).total_seconds() < window)
        for index, start in enumerate(writes)
    )
    assert most <= BUDGET_PER_MINUTE, f"{most} writes in one compressed minute"
    print(f"two dispatchers, one budget: {posted_by} reviews posted, at most {most} a minute")
