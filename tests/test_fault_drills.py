"""Fault drills against real processes: `bot serve --role web` and two `--role dispatcher`
processes on real PostgreSQL, the forge emulator as GitHub, the simulated model taking real time.

Each drill sends a burst of signed webhooks, does one thing an operator fears (kill -9 of a
dispatcher while chunks run, between a review's last chunk and its posting, or during posting;
PostgreSQL restarted fast and stopped hard; a backend that raises what no contract names) and
then checks the same things: every acknowledged webhook became exactly one posted review,
nothing was posted twice, refused webhooks were not stored, nothing answered 500, and the queue
drained with no process restarted by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from bot import devdb
from bot.database_url import plain_url
from bot.db import upgrade_database
from bot.emulator import (
    EmulatedPull,
    EmulatorState,
    Fault,
    ForgeEmulator,
    generate_file_changes,
    github_pull_request_hook,
    send_webhook,
)
from bot.emulator.app import create_emulator_app
from bot.forges.base import find_marker

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]
SECRET = "fault-drill-secret"
TOKEN = "ghp-fault-drill"
# Short enough that a takeover is quick, long enough that a busy 2-core machine renews in time.
LEASE_S = 6.0
HEARTBEAT_S = 2.0
# Each simulated call takes this share of the GPU seconds it charges: 0.5-1.5 s a chunk here,
# so work is in flight when a fault strikes.
TIME_SCALE = "0.06"
BURST = 100
ORGS = 20
INSTALLATION_BASE = 100
DRAIN_TIMEOUT_S = 120.0
LIVE_STATES = ("waiting", "queued", "running")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], *, timeout_s: float, what: str, every_s: float = 0.1
) -> float:
    """Poll a real process's effects until `predicate` holds; returns the seconds it took."""
    started = time.monotonic()
    while not await predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(every_s)
    return time.monotonic() - started


@dataclass
class BotProcess:
    """One `bot serve` process and the file its log goes to."""

    name: str
    role: str
    port: int
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def owner(self) -> str:
        """The lease owner it writes on what it claims (bot.serve.worker_name)."""
        return f"{socket.gethostname()}-{self.process.pid}"

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def listening(self) -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            assert self.alive, f"{self.name} exited early:\n{self.log()[-3000:]}"
            return False
        writer.close()
        await writer.wait_closed()
        return True

    def kill(self) -> None:
        """kill -9: no shutdown, no release; whatever it held stays behind in the database."""
        self.process.send_signal(signal.SIGKILL)


@dataclass
class Delivery:
    pull: EmulatedPull
    delivery_id: str
    status: int


@dataclass
class Rig:
    """The bot's processes on one database, the emulator they post to, what was sent."""

    db_url: str
    emulator: ForgeEmulator
    logs: Path
    processes: list[BotProcess] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)

    @property
    def state(self) -> EmulatorState:
        return self.emulator.state

    def environment(self, extra: dict[str, str]) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("REVIEW_BOT_", "GITHUB_", "GITLAB_"))
            and key.lower() not in ("http_proxy", "https_proxy")
        }
        env.update(
            DATABASE_URL=self.db_url,
            PYTHONPATH=str(REPO_ROOT),
            GITHUB_WEBHOOK_SECRET=SECRET,
            GITLAB_WEBHOOK_TOKEN=SECRET,
            GITHUB_TOKEN=TOKEN,
            GITHUB_API_URL=self.emulator.github_url,
            REVIEW_BOT_LLM="simulated",
            REVIEW_BOT_SIM_TIME_SCALE=TIME_SCALE,
            REVIEW_BOT_WORKERS="6",
            REVIEW_BOT_LEASE_S=str(LEASE_S),
            REVIEW_BOT_HEARTBEAT_S=str(HEARTBEAT_S),
            REVIEW_BOT_RETRY_BACKOFF_S="0.5",
            # One full review per job, found by its job marker (quiet reviews edit one summary).
            REVIEW_BOT_QUIET="false",
            REVIEW_BOT_STATUS="false",
        )
        env.update(extra)
        return env

    async def start(self, name: str, role: str, **extra: str) -> BotProcess:
        port = _free_port()
        log_path = self.logs / f"{name}.log"
        with log_path.open("wb") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bot",
                "serve",
                "--role",
                role,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-migrate",
                env=self.environment(extra),
                cwd=REPO_ROOT,
                stdout=log_file,
                stderr=log_file,
            )
        started = BotProcess(name, role, port, process, log_path)
        self.processes.append(started)
        return started

    async def start_all(self, **dispatchers: str) -> tuple[BotProcess, BotProcess, BotProcess]:
        """The web role and dispatchers a and b (with `dispatchers` settings besides)."""
        web = await self.start("web", "web")
        a = await self.start("dispatcher-a", "dispatcher", **dispatchers)
        b = await self.start("dispatcher-b", "dispatcher", **dispatchers)
        for process in (web, a, b):
            await wait_for(process.listening, timeout_s=60, what=f"{process.name} to listen")
        return web, a, b

    def add_pulls(self, count: int, *, first: int = 1) -> list[EmulatedPull]:
        """PRs of mixed sizes (most one chunk, every fourth two), every 25th a hotfix (P0, which
        may take a slot back from running lower-level work), spread over the repositories of
        ORGS installations: GitHub's one content POST a second is per installation."""
        pulls = []
        for number in range(first, first + count):
            lines = 160 if number % 4 == 0 else 40 + number % 50
            org = number % ORGS
            pulls.append(
                self.state.add_pull(
                    "github",
                    f"org{org}/shop",
                    number,
                    files=generate_file_changes(changed_lines=lines, files=3, seed=number),
                    base_ref="hotfix/pay" if number % 25 == 0 else "main",
                    installation_id=INSTALLATION_BASE + org,
                )
            )
        return pulls

    async def send(
        self,
        web: BotProcess,
        pulls: list[EmulatedPull],
        *,
        per_second: float | None = None,
        delivery_ids: dict[int, str] | None = None,
    ) -> list[Delivery]:
        """Deliver one signed `pull_request` webhook per PR (all at once, or paced)."""
        url = f"http://127.0.0.1:{web.port}/webhooks/github"
        sent: list[Delivery] = []
        limit = asyncio.Semaphore(16)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

            async def one(pull: EmulatedPull) -> None:
                async with limit:
                    answer = await send_webhook(
                        url,
                        "github",
                        "pull_request",
                        github_pull_request_hook(
                            self.state, pull, installation_id=self.state.installations[pull.repo]
                        ),
                        SECRET,
                        session=session,
                        delivery_id=(delivery_ids or {}).get(pull.number),
                    )
                sent.append(Delivery(pull, answer.delivery_id, answer.status))

            tasks = []
            for pull in pulls:
                tasks.append(asyncio.create_task(one(pull)))
                if per_second:
                    await asyncio.sleep(1 / per_second)  # a forge's pace, in real time
            await asyncio.gather(*tasks)
        self.deliveries.extend(sent)
        return sent

    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(plain_url(self.db_url), timeout=10)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    async def drained(self) -> bool:
        rows = await self.fetch(
            "SELECT count(*) AS n FROM review_jobs WHERE state = ANY($1::text[])", list(LIVE_STATES)
        )
        return int(rows[0]["n"]) == 0

    async def wait_drained(self) -> float:
        return await wait_for(self.drained, timeout_s=DRAIN_TIMEOUT_S, what="the queue to drain")

    def posted_by_job(self) -> Counter[int]:
        """How many times each job's review reached the forge (by its hidden marker)."""
        return Counter(
            job_id
            for record in self.state.posted(forge="github")
            if (job_id := find_marker(record.body)) is not None
        )

    async def check_outcome(self) -> Report:
        """Every acknowledged delivery: one job, done, posted once; refused: not stored."""
        statuses = Counter(d.status for d in self.deliveries)
        assert set(statuses) <= {202, 503}, f"answers other than 202 and 503: {statuses}"
        acknowledged = {d.delivery_id: d for d in self.deliveries if d.status == 202}
        refused = {d.delivery_id for d in self.deliveries if d.status == 503} - set(acknowledged)
        stored = {
            row["delivery_id"]: row["job_id"]
            for row in await self.fetch("SELECT delivery_id, job_id FROM webhook_deliveries")
        }
        assert set(acknowledged) <= set(stored), "an acknowledged webhook was not stored"
        assert not refused & set(stored), f"refused webhooks were stored: {refused & set(stored)}"
        jobs = {
            row["id"]: row
            for row in await self.fetch("SELECT id, state, number, last_error FROM review_jobs")
        }
        numbers = Counter(job["number"] for job in jobs.values())
        assert all(n == 1 for n in numbers.values()), f"a PR got two jobs: {numbers}"
        assert {jobs[stored[d]]["number"] for d in acknowledged} == {
            d.pull.number for d in acknowledged.values()
        }
        not_done = {
            i: (j["state"], j["last_error"]) for i, j in jobs.items() if j["state"] != "done"
        }
        assert not not_done, f"jobs that did not end done: {not_done}"
        posted = self.posted_by_job()
        twice = {job_id: n for job_id, n in posted.items() if n > 1}
        assert not twice, f"reviews posted more than once: {twice}"
        assert set(posted) == set(jobs), (
            f"jobs without a posted review: {sorted(set(jobs) - set(posted))}"
        )
        stuck = await self.fetch(
            "SELECT id, state, lease_owner FROM review_chunks WHERE state <> 'done'"
        )
        assert not stuck, f"chunks left behind: {[tuple(r) for r in stuck]}"
        return Report(
            acknowledged=len(acknowledged),
            refused=len(refused),
            posted=sum(posted.values()),
        )

    async def close(self) -> None:
        for process in self.processes:
            if process.alive:
                process.process.send_signal(signal.SIGTERM)
        for process in self.processes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.process.wait(), timeout=40)
            if process.alive:
                process.process.kill()
                await process.process.wait()


@dataclass(frozen=True)
class Report:
    acknowledged: int
    refused: int
    posted: int


def no_unexpected_errors(process: BotProcess) -> None:
    """A survivor's log: nothing escaped to the top (no traceback of a task nobody awaited)."""
    log = process.log()
    assert "Task exception was never retrieved" not in log, log[-3000:]
    assert "background task failed" not in log, log[-3000:]


@web.middleware
async def read_whole_request(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Read the body before working on the request, as a forge behind a buffering proxy does:
    a post whose answer is slow (an injected delay) then takes effect even if its sender died
    meanwhile, and only the answer is lost."""
    await request.read()
    return await handler(request)


class BufferingEmulator(ForgeEmulator):
    """The forge emulator with the whole request read before it is handled."""

    async def start(self) -> str:
        app = create_emulator_app(self.state)
        app.middlewares.append(read_whole_request)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self.base_url


@pytest.fixture
async def emulator() -> AsyncIterator[ForgeEmulator]:
    state = EmulatorState()
    state.github_tokens.add(TOKEN)
    async with BufferingEmulator(state) as running:
        yield running


@pytest.fixture
async def rig(db_url: str, emulator: ForgeEmulator, tmp_path: Path) -> AsyncIterator[Rig]:
    made = Rig(db_url, emulator, tmp_path)
    try:
        yield made
    finally:
        await made.close()


# --- kill -9 of a dispatcher --------------------------------------------------------------


async def running_chunks(rig: Rig, process: BotProcess) -> set[int]:
    """Chunks the process holds a lease on."""
    rows = await rig.fetch(
        "SELECT id FROM review_chunks WHERE state = 'running' AND lease_owner = $1",
        process.owner,
    )
    return {int(row["id"]) for row in rows}


async def posting_claims(rig: Rig, process: BotProcess) -> set[int]:
    """Jobs whose chunks are all done and whose posting the process has claimed, unfinished
    (a poster's claims carry its pid: bot.review.poster.PostingSettings.owner)."""
    rows = await rig.fetch(
        "SELECT id FROM review_jobs WHERE state = 'running' AND request->>'posting_by' LIKE $1",
        f"poster-{process.process.pid}-%",
    )
    return {int(row["id"]) for row in rows}


@dataclass(frozen=True)
class KillPoint:
    """Where in a review the dispatcher dies: what the forge is made to do meanwhile, and
    what it holds in the database when it is killed."""

    name: str
    slow_route: str | None  # an emulator route that answers late, so a stage stays open
    holds: Callable[[Rig, BotProcess], Awaitable[set[int]]]
    enough: int


KILL_POINTS = [
    # Chunks leased and their model calls under way.
    KillPoint("while chunks run", None, running_chunks, 4),
    # Every chunk done, the posting claimed, nothing sent yet: the lookup for an earlier post
    # of the review (its marker) hangs.
    KillPoint("after the last chunk, before the post", "github.reviews.list", posting_claims, 2),
    # The review is on the wire: the forge takes it, but the killed process never hears back
    # or records it. The taker-over must find it by its marker, not post it again.
    KillPoint("during the post", "github.reviews.create", posting_claims, 2),
]
SLOW_ROUTE_S = 3.0
SLOW_REQUESTS = 30  # the first requests of the route answer late, then it is fast again


@pytest.mark.parametrize("point", KILL_POINTS, ids=lambda point: point.name.replace(" ", "-"))
async def test_a_dispatcher_killed_mid_review_loses_nothing_and_posts_nothing_twice(
    rig: Rig, point: KillPoint
) -> None:
    if point.slow_route is not None:
        rig.state.add_fault(point.slow_route, Fault.slow(SLOW_ROUTE_S), times=SLOW_REQUESTS)
    web, a, b = await rig.start_all()
    sending = asyncio.create_task(rig.send(web, rig.add_pulls(BURST)))

    async def a_holds_enough() -> bool:
        return len(await point.holds(rig, a)) >= point.enough

    await wait_for(a_holds_enough, timeout_s=60, what=f"dispatcher a to be {point.name}")
    held = await point.holds(rig, a)
    a.kill()
    killed_at = time.monotonic()
    await sending

    async def taken_over() -> bool:
        return not await point.holds(rig, a)

    # Until its leases and claims run out nobody touches what a held; then others do.
    takeover_s = await wait_for(taken_over, timeout_s=DRAIN_TIMEOUT_S, what="a's work to go")
    await rig.wait_drained()
    drain_s = time.monotonic() - killed_at
    report = await rig.check_outcome()
    assert report.acknowledged == BURST and report.posted == BURST
    # Taken back within about one lease (and a heartbeat, and a busy machine's slack), not
    # after a fixed period of minutes.
    assert takeover_s < LEASE_S + 2 * HEARTBEAT_S + SLOW_ROUTE_S + 5, takeover_s
    assert web.alive and b.alive
    no_unexpected_errors(b)
    found = await rig.fetch(
        "SELECT id FROM review_jobs WHERE id = ANY($1::bigint[])"
        " AND (review->>'already_posted')::boolean",
        sorted(held),
    )
    if point.slow_route == "github.reviews.create":
        # At least one review reached the forge from the dead process: found, not reposted.
        assert found, "no review of the killed dispatcher was on the wire when it died"
    print(
        f"\nkill -9 {point.name}: {report.acknowledged} acknowledged, {report.posted} posted"
        f" once each; {len(held)} held by the killed dispatcher, taken back {takeover_s:.1f} s"
        f" after the kill ({len(found)} found already on the forge by their marker); queue"
        f" drained {drain_s:.1f} s after the kill"
    )


# --- PostgreSQL restarted and stopped under the bot ---------------------------------------


@dataclass(frozen=True)
class Cluster:
    """A throwaway PostgreSQL cluster of this test's own (never the machine's shared server),
    stopped and started under the running bot with pg_ctl."""

    url: str
    root: Path
    options: str
    pg_ctl: tuple[str, ...]

    def _run(self, *args: str) -> None:
        data = str(self.root / "data")
        log = str(self.root / "log")
        subprocess.run(
            [*self.pg_ctl, "-D", data, "-l", log, *args], check=True, capture_output=True
        )

    def start(self) -> None:
        self._run("-w", "-o", self.options, "start")

    def stop(self, mode: str) -> None:
        self._run("-w", "-m", mode, "stop")

    def restart(self, mode: str) -> None:
        self._run("-w", "-m", mode, "-o", self.options, "restart")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """initdb into a temp directory, started on a free port (as bot.devdb's fallback does)."""
    initdb, pg_ctl = devdb._find_binary("initdb"), devdb._find_binary("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("initdb/pg_ctl are not installed: no throwaway cluster to restart")
    root = Path(tempfile.mkdtemp(prefix="review-bot-drill-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the cluster runs as an unprivileged user
        owner = devdb._unprivileged_user()
        if owner is None:
            pytest.skip("running as root with no unprivileged user for initdb")
        run_as = ["runuser", "-u", owner, "--"]
        shutil.chown(root, owner)
    subprocess.run(
        [*run_as, initdb, "-D", str(root / "data"), "-U", "postgres", "-A", "trust", "--no-sync"],
        check=True,
        capture_output=True,
    )
    port = devdb._free_port()
    made = Cluster(
        url=f"postgresql://postgres@127.0.0.1:{port}/postgres",
        root=root,
        options=f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off",
        pg_ctl=(*run_as, pg_ctl),
    )
    made.start()
    try:
        yield made
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            made.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


OUTAGE_BURST = 180
OUTAGE_RATE = 10.0  # webhooks a second, all through the restart and the stop


async def test_postgresql_restarted_and_stopped_hard_while_webhooks_arrive(
    cluster: Cluster, emulator: ForgeEmulator, tmp_path: Path
) -> None:
    db_url = await devdb.create_database(cluster.url, "drill")
    await upgrade_database(db_url)
    rig = Rig(db_url, emulator, tmp_path)
    try:
        web_process, a, b = await rig.start_all()
        pulls = rig.add_pulls(OUTAGE_BURST)
        started = time.monotonic()
        sending = asyncio.create_task(rig.send(web_process, pulls, per_second=OUTAGE_RATE))
        await asyncio.sleep(2.0)  # work under way (real processes, real time)
        await asyncio.to_thread(cluster.restart, "fast")
        restarted_at = time.monotonic() - started
        await asyncio.sleep(3.0)
        await asyncio.to_thread(cluster.stop, "immediate")
        stopped_at = time.monotonic() - started
        await asyncio.sleep(10.0)  # the server is away for ten seconds
        await asyncio.to_thread(cluster.start)
        back_at = time.monotonic() - started
        await sending
        refused = [d for d in rig.deliveries if d.status == 503]
        assert refused, "the stop refused no webhook: it did not happen while they arrived"
        stored = {
            row["delivery_id"]
            for row in await rig.fetch("SELECT delivery_id FROM webhook_deliveries")
        }
        assert not {d.delivery_id for d in refused} & stored, "a refused webhook was stored"
        # The forge delivers a refused webhook again, with the same delivery id.
        await rig.send(
            web_process,
            [d.pull for d in refused],
            delivery_ids={d.pull.number: d.delivery_id for d in refused},
        )
        drain_s = await rig.wait_drained()
        report = await rig.check_outcome()
        assert report.acknowledged == OUTAGE_BURST and report.posted == OUTAGE_BURST
        # Nobody restarted anything: every process rode the outage out.
        for process in (web_process, a, b):
            assert process.alive, f"{process.name} exited:\n{process.log()[-3000:]}"
            no_unexpected_errors(process)
        print(
            f"\nPostgreSQL restarted (-m fast) at {restarted_at:.1f} s, stopped (-m immediate)"
            f" at {stopped_at:.1f} s, back at {back_at:.1f} s: {OUTAGE_BURST} webhooks,"
            f" {OUTAGE_BURST - len(refused)} answered 202 at once, {len(refused)} answered 503"
            f" (none stored; all taken when delivered again), {report.posted} posted once each;"
            f" queue drained {drain_s:.1f} s after the last delivery"
        )
    finally:
        await rig.close()


# --- an LLM backend that raises what no contract names ------------------------------------

FAULT_EVERY = 4


async def test_a_backend_raising_unexpected_errors_leaks_no_slot(rig: Rig) -> None:
    web, a, b = await rig.start_all(REVIEW_BOT_SIM_FAULT_EVERY=str(FAULT_EVERY))
    await rig.send(web, rig.add_pulls(BURST))
    drain_s = await rig.wait_drained()
    report = await rig.check_outcome()
    assert report.acknowledged == BURST and report.posted == BURST
    crashed = await rig.fetch(
        "SELECT id, attempts FROM review_chunks WHERE last_error LIKE 'RuntimeError: simulated%'"
    )
    # Far more faults than the two dispatchers have slots: a leaked slot per fault would stall.
    assert len(crashed) > 2 * 6, len(crashed)
    assert all(row["attempts"] >= 2 for row in crashed)  # the failed try counted, then one ran

    async def idle() -> bool:
        rows = await rig.fetch("SELECT name, running FROM dispatchers WHERE stopped_at IS NULL")
        return len(rows) == 2 and all(row["running"] == 0 for row in rows)

    await wait_for(idle, timeout_s=3 * HEARTBEAT_S + 5, what="both dispatchers to hold nothing")
    for process in (web, a, b):
        assert process.alive
        no_unexpected_errors(process)
    assert "failed unexpectedly" in a.log() + b.log()
    print(
        f"\nbackend raising RuntimeError on the first call of every {FAULT_EVERY}th chunk:"
        f" {len(crashed)} crashed calls, {report.posted} reviews posted once each, queue drained"
        f" {drain_s:.1f} s after the burst; no slot held afterwards"
    )
