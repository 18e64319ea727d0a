"""A thousand reviews in one hour through one forge identity: what the write budget does.

A generated morning compressed into one hour (1,000 pull requests, most around its middle)
is sent as signed webhooks to what `bot serve` runs (web intake, the dispatcher role with
quiet reviews and statuses, the write budget in PostgreSQL) against the forge emulator,
which enforces GitHub's secondary limits (403 with Retry-After past 80 content-creating
requests a minute or 500 an hour per installation) or GitLab's note creation limit (429
past 300 a minute per token) and answers unchanged GitHub reads 304. GitHub runs as one App
installation, GitLab with one token. Time is compressed (`--speed` trace seconds per wall
second: the bot's clock, the emulator's and the simulated model's); the LLM is the simulated
backend with enough slots that the engines are not what binds. The default, 30x, is what the
committed results use: at 240x on a 2-core machine a wall tenth of a second of the bot's own
work is 24 trace seconds, and GitHub's last review came 16 trace hours in (4.7 at 30x).

Measured from the emulator's request log and the budget's ledger: writes and reads per
review, the forge's refusals met, the wait the budget added before each review was posted
(P0, P1, P2: median and 95th percentile, trace seconds), when the last review was posted,
and reviews never posted.

    python bench/forge_budget.py [--requests 1000] [--speed 30] [--forge github gitlab]
                                 [--out bench/results/forge_budget.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import text

from bot.budget.decide import WriteValue
from bot.budget.ledger import GITHUB_LIMITS, GITLAB_LIMITS, BudgetSettings, PostgresWriteBudget
from bot.clock import EPOCH
from bot.components import dispatcher_settings
from bot.demo import ScaledClock, demo_settings, replay
from bot.emulator import EmulatorState, ForgeEmulator
from bot.emulator.limits import CONTENT_METHODS, NOT_CONTENT_ROUTES
from bot.engine_setup import served_budget
from bot.forges.base import RetryPolicy
from bot.forges.registry import ForgeOptions, build_forges
from bot.llm.simulated import SimulatedBackend
from bot.model import Forge, JobState, Level
from bot.policy import load_policy_book
from bot.serve import open_store, run_role
from bot.sim.trace import Trace, TraceShape, generate_trace

APP_ID = "4242"
OUT = Path(__file__).resolve().parent / "results" / "forge_budget.md"


def one_hour_morning(requests: int, forge: Forge, *, seed: int) -> Trace:
    """`requests` reviews in one hour, two thirds around its middle, all on one forge."""
    shape = TraceShape(
        requests=requests,
        duration_s=3600.0,
        peak_at_s=1800.0,
        peak_width_s=600.0,
        gitlab_share=1.0 if forge == "gitlab" else 0.0,
        depends_per_1000=0,
    )
    trace = generate_trace(shape, seed=seed, scenario="forge-budget")
    wanted = tuple(
        replace(request, forge=forge, depends_on=())
        for request in trace.requests
        if request.action in ("opened", "synchronize")
    )
    return Trace(header=trace.header, requests=wanted, source=trace.source)


def app_key() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@dataclass
class Run:
    """What one forge's hour gave."""

    forge: Forge
    reviews: int
    posted: int
    never_posted: int
    writes: int
    reads: int
    not_modified: int
    refused: int
    delay_s: dict[str, tuple[float, float, int]]  # level -> (median, p95, reviews)
    last_posted_s: float
    trace_s: float
    wall_s: float
    writes_by_kind: dict[str, int]
    reads_by_kind: dict[str, int]
    # Reviewed heads, those whose final check run (GitHub) or commit status (GitLab) was
    # written, and when the last of them was (trace seconds).
    heads: int = 0
    heads_final: int = 0
    last_final_s: float = 0.0


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


async def run_forge(url: str, forge: Forge, *, requests: int, speed: float, seed: int) -> Run:
    """One compressed hour through one installation (GitHub) or token (GitLab)."""
    clock = ScaledClock(speed)

    async def sleep(seconds: float) -> None:  # trace seconds
        await asyncio.sleep(max(0.0, seconds) / speed)

    trace = one_hour_morning(requests, forge, seed=seed)
    state = EmulatorState(clock=clock.now)
    private, public = app_key()
    state.register_app(APP_ID, public)
    settings = demo_settings(url, speed=speed)
    settings = settings.with_changes(
        forges={"github_token": None, "github_app_id": APP_ID, "github_private_key": private},
        # Enough slots that the engines are not what binds: the forge's budget is measured.
        scheduler={"workers": 48},
    )
    store = open_store(settings, pool_size=30)
    policies = load_policy_book(settings.review.policy_dir)
    backend = SimulatedBackend(sleep=asyncio.sleep, time_scale=1.0 / speed)
    budget = PostgresWriteBudget(
        store.connector,
        now=clock.now,
        sleep=sleep,
        # The production limits: a write counts from its answer (less GitHub's one-second
        # interval), so however much trace time a wall millisecond is, the default margin past a
        # window's edge covers when the forge saw it arrive.
        settings=BudgetSettings(
            {"github": GITHUB_LIMITS, "gitlab": GITLAB_LIMITS},
            # A claim lapses after `stale_s`, which must outlast a waiter's look (`poll_max_s`).
            stale_s=30.0 * max(1.0, speed / 20),
            poll_max_s=min(60.0, 20.0 * max(1.0, speed / 20)),
        ),
    )
    started = time.monotonic()
    async with ForgeEmulator(state) as emulator:
        settings = settings.with_changes(
            forges={"github_api_url": emulator.github_url, "gitlab_url": emulator.gitlab_url}
        )
        forges = build_forges(
            settings,
            clock=clock.now,
            sleep=sleep,
            options=ForgeOptions(retry=RetryPolicy(attempts=6, base_delay_s=0.5)),
            budget=budget,
        )
        async with run_role(
            "all",
            settings,
            store=store,
            forges=forges,
            policies=policies,
            clock=clock,
            backend=backend,
            dispatching=replace(
                dispatcher_settings(settings, owner="bench"),
                maintenance_s=1.0,
            ),
            # The configured context allowance, as a chunk's whole (not fitted to the model).
            budget=await served_budget(settings, fit_context=False),
        ) as running:
            answers = await replay(emulator, running.url, trace, clock, speed=speed)
            print(f"{forge}: webhooks answered {dict(Counter(answers))}", flush=True)
            await drained(store.engine, timeout_s=900.0)
            heads = await reviewed_heads(store.engine)
            # The final states queue behind the reviews in the budget: wait for them too.
            await finals_written(emulator.state, forge, heads, timeout_s=900.0)
        run = await measure(store.engine, emulator.state, forge, clock, started)
        finals = final_states(emulator.state, forge, heads)
        run.heads, run.heads_final = len(heads), len(finals)
        run.last_final_s = max(
            ((at - EPOCH).total_seconds() for at in finals.values()), default=0.0
        )
    await store.close()
    return run


async def reviewed_heads(engine: Any) -> set[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT DISTINCT head_sha FROM review_jobs WHERE state = :done"),
            {"done": JobState.DONE.value},
        )
        return {str(row.head_sha) for row in rows}


def final_states(state: EmulatorState, forge: Forge, heads: set[str]) -> dict[str, datetime]:
    """When each reviewed head got its final state on the forge: a completed check run (the
    GitHub App writes check runs), a finished commit status (GitLab)."""
    found: dict[str, datetime] = {}

    def keep(sha: str, when: object) -> None:
        if sha in heads and isinstance(when, str):
            at = datetime.fromisoformat(when.replace("Z", "+00:00"))
            found[sha] = min(found.get(sha, at), at)

    if forge == "github":
        for run in state.check_runs.values():
            if run.get("status") == "completed":
                keep(str(run["head_sha"]), run.get("completed_at"))
    else:
        for status in state.commit_statuses:
            if status.get("_forge") == "gitlab" and status.get("finished_at"):
                keep(str(status["sha"]), status["finished_at"])
    return found


async def finals_written(
    state: EmulatorState, forge: Forge, heads: set[str], *, timeout_s: float
) -> None:
    """Wait until every reviewed head has its final state (or the wall time limit)."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while (count := len(final_states(state, forge, heads))) < len(heads):
        if count != last:
            print(f"  final states: {count} of {len(heads)} heads", flush=True)
            last = count
        if time.monotonic() > deadline:
            print("  stopping: wall time limit", flush=True)
            return
        await asyncio.sleep(2.0)


async def drained(engine: Any, *, timeout_s: float) -> None:
    """Wait until no job is live (or the wall time limit), printing progress."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(text("SELECT state, count(*) FROM review_jobs GROUP BY state"))
            ).all()
        states = {str(state): int(count) for state, count in rows}
        line = " ".join(f"{name}={count}" for name, count in sorted(states.items()))
        if line != last:
            print(f"  jobs: {line}", flush=True)
            last = line
        if not any(states.get(name) for name in ("waiting", "queued", "running")):
            return
        if time.monotonic() > deadline:
            print("  stopping: wall time limit", flush=True)
            return
        await asyncio.sleep(2.0)


async def measure(
    engine: Any, state: EmulatorState, forge: Forge, clock: ScaledClock, started: float
) -> Run:
    async with engine.connect() as conn:
        jobs = (
            await conn.execute(text("SELECT id, state, base_level, review FROM review_jobs"))
        ).all()
        review_writes = (
            await conn.execute(
                text(
                    "SELECT w.job_id, w.spent_at, w.asked_at, j.base_level FROM forge_writes w"
                    " JOIN review_jobs j ON j.id = w.job_id"
                    " WHERE w.value = :review ORDER BY w.spent_at"
                ),
                {"review": int(WriteValue.REVIEW)},
            )
        ).all()
    reviews = len(jobs)
    posted = sum(1 for job in jobs if job.state == JobState.DONE.value)
    never = sum(
        1 for job in jobs if job.state not in (JobState.DONE.value, JobState.SUPERSEDED.value)
    )
    # A review's wait for the budget: from asking to spending, its first inline write.
    first_write: dict[int, tuple[float, int]] = {}
    for row in review_writes:
        if row.job_id not in first_write:
            waited = (row.spent_at - row.asked_at).total_seconds()
            first_write[row.job_id] = (waited, int(row.base_level))
    delay: dict[str, tuple[float, float, int]] = {}
    for level in (Level.P0, Level.P1, Level.P2):
        waits = [wait for wait, at in first_write.values() if at == int(level)]
        if waits:
            delay[str(level)] = (statistics.median(waits), percentile(waits, 0.95), len(waits))
    writes = reads = not_modified = 0
    kinds: Counter[str] = Counter()
    read_kinds: Counter[str] = Counter()
    for item in state.requests:
        if item.route in ("github.access_token", "github.installation"):
            continue  # credentials
        if item.method in CONTENT_METHODS and item.route not in NOT_CONTENT_ROUTES:
            if item.status < 400:
                writes += 1
                kinds[item.route] += 1
        elif item.status == 304:
            not_modified += 1
        elif item.status < 400:
            reads += 1
            read_kinds[item.route] += 1
    last = max((row.spent_at for row in review_writes), default=None)
    return Run(
        forge=forge,
        reviews=reviews,
        posted=posted,
        never_posted=never,
        writes=writes,
        reads=reads,
        not_modified=not_modified,
        refused=state.content.refused,
        delay_s=delay,
        last_posted_s=(last - EPOCH).total_seconds() if last is not None else 0.0,
        trace_s=clock.trace_seconds(),
        wall_s=time.monotonic() - started,
        writes_by_kind=dict(kinds),
        reads_by_kind=dict(read_kinds),
    )


@contextlib.asynccontextmanager
async def database(name: str) -> AsyncIterator[str]:
    """A fresh migrated scratch database on DATABASE_URL's server, else a local one."""
    from bot import devdb
    from bot.db import upgrade_database

    with devdb.provision_server() as server_url:
        async with devdb.scratch_database(server_url, name) as url:
            await upgrade_database(url)
            yield url


def render(runs: list[Run], *, requests: int, speed: float, seed: int) -> str:
    lines = [
        f"{requests} generated reviews in one hour (seed {seed}), through one GitHub App",
        "installation or one GitLab token of the forge emulator, at "
        f"{speed:g}x compressed time. Limits: GitHub 80 content-creating requests a minute",
        "and 500 an hour (403 with Retry-After past them), GitLab 300 a minute (429).",
        "",
        "| | reviews | posted | never posted | writes / review | reads / review"
        " | 304s / review | refused (403/429) | last review posted (h)"
        " | heads with their final check run / status | last final state (h) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        per = max(1, run.posted)
        lines.append(
            f"| {run.forge} | {run.reviews} | {run.posted} | {run.never_posted} |"
            f" {run.writes / per:.2f} | {run.reads / per:.2f} | {run.not_modified / per:.2f} |"
            f" {run.refused} | {run.last_posted_s / 3600:.2f} |"
            f" {run.heads_final} of {run.heads} | {run.last_final_s / 3600:.2f} |"
        )
    lines += [
        "",
        "Wait the budget added before a review was posted (trace seconds; median / 95th"
        " percentile, reviews):",
        "",
        "| | P0 | P1 | P2 |",
        "| --- | ---: | ---: | ---: |",
    ]
    for run in runs:
        cells = []
        for level in ("P0", "P1", "P2"):
            found = run.delay_s.get(level)
            cells.append(f"{found[0]:.0f} / {found[1]:.0f} ({found[2]})" if found else "-")
        lines.append(f"| {run.forge} | " + " | ".join(cells) + " |")
    lines += ["", "Writes and reads (not 304) by route:", ""]
    for run in runs:
        kinds = ", ".join(f"{name} {count}" for name, count in sorted(run.writes_by_kind.items()))
        reads = ", ".join(f"{name} {count}" for name, count in sorted(run.reads_by_kind.items()))
        lines.append(f"- {run.forge} writes: {kinds}")
        lines.append(f"- {run.forge} reads: {reads}")
    lines += [
        "",
        "Wall time: " + ", ".join(f"{run.forge} {run.wall_s:.0f} s" for run in runs) + ".",
    ]
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> list[Run]:
    runs: list[Run] = []
    for forge in args.forge:
        async with database(f"rb_forge_budget_{forge}") as url:
            run = await run_forge(
                url, forge, requests=args.requests, speed=args.speed, seed=args.seed
            )
            print(json.dumps(run.__dict__, default=str), flush=True)
            runs.append(run)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--speed", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument(
        "--forge", nargs="+", choices=("github", "gitlab"), default=["github", "gitlab"]
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    runs = asyncio.run(main_async(args))
    report = render(runs, requests=args.requests, speed=args.speed, seed=args.seed)
    command = " ".join(["python bench/forge_budget.py", *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"# Forge write budget\n\n`{command}`\n\n{report}")
    print(report)
    return 0 if all(run.never_posted == 0 and run.refused == 0 for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
