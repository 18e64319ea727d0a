"""Engine throughput on the real CPU vLLM: the raw server's best against the whole bot.

Usage: python bench/engine_throughput.py [--url URL] [--reviews 40] [--repeat 3]
                                         [--out bench/results]

Each run, against one CPU vLLM server (scripts/vllm_cpu.sh, started here unless --url):
1. bot: the reviews through the whole bot (signed webhooks -> intake -> PostgreSQL ->
   dispatcher -> openai backend -> CPU vLLM -> poster -> forge emulator; the dispatcher role
   started by bot.serve.run_role, as `bot serve` runs it), all arriving at once,
   with the engine's window fixed at 1, then adaptive; a P0 review (a change into a hotfix
   branch) is sent when half of the reviews are posted;
2. the same P0 review alone on the idle server;
3. raw: the server's completion tokens/s over a concurrency sweep, sent straight to it with
   the very requests the bot sent in this run's first drain (each chunk's first call: its
   system prompt, pull request text, code context, diff and answer schema), best of the sweep.
Chunks and the code context's allowance are sized to the served model as `bot serve` sizes
them (served_budget).
Each drain also reports the answer tokens its P0 room threw away by taking calls back (their
share of the drain's completion tokens) and the share of prompt tokens vLLM served from its
prefix cache, read from the server's /metrics before and after the drain.
The runs follow one another, so machine drift touches baseline and bot alike; the report gives
their medians. Writes bench/results/engine.json and engine.md. Run it alone on the machine (it
measures throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bot.clock import SystemClock  # noqa: E402
from bot.components import dispatcher_settings, local_write_budget  # noqa: E402
from bot.config import (  # noqa: E402
    DatabaseSettings,
    ForgeSettings,
    LLMSettings,
    SchedulerSettings,
    Settings,
    WindowSettings,
)
from bot.demo import SECRET, TOKEN, demo_files, load_demo_trace, send_request  # noqa: E402
from bot.emulator import EmulatorState, ForgeEmulator  # noqa: E402
from bot.engine_setup import ServedBudget, served_budget  # noqa: E402
from bot.errors import LLMRequestRejected  # noqa: E402
from bot.forges.base import RetryPolicy  # noqa: E402
from bot.forges.registry import ForgeOptions, build_forges  # noqa: E402
from bot.llm.base import LLMRequest, LLMResponse  # noqa: E402
from bot.llm.openai_compat import OpenAICompatBackend  # noqa: E402
from bot.llm.vllm_metrics import (  # noqa: E402
    EngineMetrics,
    fetch_engine_metrics,
    prefix_cache_hit_rate,
)
from bot.model import JobState  # noqa: E402
from bot.policy import load_policy_book  # noqa: E402
from bot.review.assemble import classify_skipped_file  # noqa: E402
from bot.review.chunk_review import review_chunk  # noqa: E402
from bot.review.chunking import plan_chunks  # noqa: E402
from bot.serve import open_store, run_role  # noqa: E402
from bot.sim.replay import fresh_database  # noqa: E402
from bot.sim.trace import Trace, TraceRequest  # noqa: E402

SCRIPT = REPO / "scripts" / "vllm_cpu.sh"
MODEL = "smollm2"
MAX_NUM_SEQS = 64
# Answer tokens per chunk (REVIEW_BOT_LLM_MAX_TOKENS) for the bot and the raw calls alike: the
# tiny model tends to write until the limit, and 1,024 a call would make the window-1 drain
# take half an hour on two cores.
ANSWER_TOKENS = 160
# Past its knee (8 on two cores) the server only loses tokens/s: an earlier sweep measured 32.4
# at 32 and 29.8 at 48, each point taking a quarter of an hour.
SWEEP: tuple[int, ...] = (1, 2, 4, 8, 16)
# The adaptive drain starts at the default window (4) and finds the knee by itself.
ADAPTIVE = WindowSettings(floor=1, ceiling=MAX_NUM_SEQS - 16)
DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def vllm_server() -> Iterator[str]:
    """A CPU vLLM server with its engine metrics on /metrics; stopped afterwards."""
    command = [str(SCRIPT), "serve", "--port", str(free_port()), "--timeout", "900", "--metrics"]
    command += ["--max-num-seqs", str(MAX_NUM_SEQS), "--watch-pid", str(os.getpid())]
    # Dev mode serves POST /reset_prefix_cache, so each drain starts with a cold cache.
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    run = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if run.returncode != 0:
        raise SystemExit(f"server did not start:\n{run.stderr[-3000:]}")
    values = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    try:
        yield values["URL"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(values["PID"]), signal.SIGTERM)


def settings_for(url: str, database_url: str = "") -> Settings:
    return Settings(
        database=DatabaseSettings(url=database_url or None),
        forges=ForgeSettings(
            github_webhook_secret=SECRET,
            gitlab_webhook_token=SECRET,
            github_token=TOKEN,
            gitlab_token=TOKEN,
        ),
        llm=LLMSettings(
            backend="openai",
            base_urls=(url,),
            model=MODEL,
            response_format="json_schema",
            max_tokens=ANSWER_TOKENS,
        ),
    )


class RecordingBackend(OpenAICompatBackend):
    """The openai backend, keeping each request the server answered (for the raw sweep) and
    counting those it refused (a prompt over the model's context is refused at once)."""

    def __init__(self, url: str, sent: list[LLMRequest] | None) -> None:
        super().__init__([url], model=MODEL, timeout_s=900.0, response_format="json_schema")
        self.sent = sent
        self.refused = 0

    async def complete(self, request: LLMRequest) -> LLMResponse:
        try:
            response = await super().complete(request)
        except LLMRequestRejected:
            self.refused += 1
            raise
        if self.sent is not None:
            self.sent.append(request)
        return response


def backend_for(url: str, sent: list[LLMRequest] | None = None) -> RecordingBackend:
    """The openai backend as `bot serve` builds it for this server."""
    return RecordingBackend(url, sent)


def workload(count: int) -> tuple[list[TraceRequest], TraceRequest]:
    """`count` small PRs of the demo's morning, and one more sent to a hotfix branch (P0)."""

    def ordinary(trace: Trace) -> list[TraceRequest]:
        # The morning has its own hotfixes: the drains' only P0 is the one sent mid-drain.
        return [
            r
            for r in trace.requests
            if r.action == "opened" and not r.draft and not r.base_ref.startswith("hotfix/")
        ]

    requests = ordinary(load_demo_trace(count + 1, max_lines=60)[0])
    if len(requests) < count + 1:
        requests = ordinary(load_demo_trace(4 * count, max_lines=60)[0])
    reviews = [
        dataclasses.replace(r, labels=(), author_is_bot=False, depends_on=())
        for r in requests[:count]
    ]
    # A hotfix is a small change: the smallest of the next ten. (The demo's diff lines run
    # long, about 50 tokens each; a 40-line one plus its code context outgrows SmolLM2's 4,096
    # tokens, and the server refuses it outright.)
    urgent = min(
        requests[count : count + 10],
        key=lambda r: sum(f.additions + f.deletions for f in demo_files(r)),
    )
    hotfix = dataclasses.replace(
        urgent,
        id="hotfix",
        number=urgent.number + 50_000,
        base_ref="hotfix/2026-12",
        head_ref="fix/urgent",
        labels=(),
        author_is_bot=False,
        depends_on=(),
    )
    return reviews, hotfix


async def cold_cache(url: str, warm: TraceRequest, line_budget: int) -> None:
    """Empty the server's prefix cache, then warm it with one other review's call.

    A drain must not find the P0's prompt cached by an earlier drain (on a CPU whose prefill
    is slow that alone makes a P0 several times faster), yet every drain in service finds
    the system prompt cached: one call of `warm` puts it back.
    """
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/reset_prefix_cache") as response,
    ):
        if response.status != 200:
            raise SystemExit(f"could not reset the prefix cache: HTTP {response.status}")
    planned = plan_chunks(demo_files(warm), line_budget=line_budget, skip=classify_skipped_file)
    backend = backend_for(url)
    try:
        await review_chunk(backend, planned.chunks[0].files, level=1, max_tokens=ANSWER_TOKENS)
    finally:
        await backend.close()


# --- 1. the raw server ----------------------------------------------------------------------


def first_calls(sent: Sequence[LLMRequest]) -> list[LLMRequest]:
    """Each lower-level chunk's first call as the bot sent it (a call taken back or retried
    goes again; the P0 is not part of the drain), at one priority, as the raw calls are."""
    seen: set[Any] = set()
    calls = []
    for request in sent:
        chunk = request.metadata.get("chunk_id")
        if request.priority == 0 or chunk in seen:
            continue
        seen.add(chunk)
        calls.append(dataclasses.replace(request, priority=1, metadata={}))
    return calls


async def raw_sweep(
    url: str, calls: Sequence[LLMRequest], warm: TraceRequest, line_budget: int
) -> list[dict[str, Any]]:
    """Completion tokens/s at each concurrency, the bot's own requests straight to vLLM."""
    rows = []
    backend = backend_for(url)
    try:
        # warm-up, not counted
        await backend.complete(calls[0])
        for concurrency in SWEEP:
            count = max(8, 2 * concurrency)
            todo = [calls[i % len(calls)] for i in range(count)]
            # The same cache state as each drain: an earlier point's prompts found cached
            # would spare this one its prefill, which the bot's drains never are.
            await cold_cache(url, warm, line_budget)
            rows.append(await sweep_point(backend, todo, concurrency))
            print(f"raw c={concurrency}: {rows[-1]['tokens_per_s']} tokens/s", file=sys.stderr)
    finally:
        await backend.close()
    return rows


async def sweep_point(
    backend: OpenAICompatBackend, todo: list[LLMRequest], concurrency: int
) -> dict[str, Any]:
    """Send the calls in `todo` with `concurrency` in flight; tokens/s of the lot."""
    count = len(todo)
    tokens = 0
    latencies: list[float] = []

    async def worker() -> None:
        nonlocal tokens
        while todo:
            response = await backend.complete(todo.pop())
            tokens += response.completion_tokens
            latencies.append(response.latency_s)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.monotonic() - started
    return {
        "concurrency": concurrency,
        "calls": count,
        "completion_tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "mean_latency_s": round(statistics.fmean(latencies), 2),
    }


# --- 2. the whole bot -------------------------------------------------------------------------


@dataclass
class Drain:
    mode: str
    reviews: int
    chunks: int
    completion_tokens: int
    wall_s: float
    tokens_per_s: float
    p0_turnaround_s: float | None
    windows: list[tuple[float, int]]
    posted: int
    taken_back: int  # calls taken back for P0 work (their chunks queued again)
    window_reasons: dict[str, int]  # the window's judged intervals, by the reason of each move
    recomputed_tokens: int  # answer tokens the taken-back calls had streamed, thrown away
    recomputed_share: float  # of the drain's completion tokens
    prefix_cache_hit_rate: float | None  # prompt tokens served from vLLM's prefix cache
    refused: int  # calls the server refused (their chunks not reviewed)


async def scrape(url: str) -> EngineMetrics | None:
    async with aiohttp.ClientSession() as session:
        return await fetch_engine_metrics(session, url)


async def drain_through_bot(
    url: str,
    reviews: Sequence[TraceRequest],
    hotfix: TraceRequest | None,
    *,
    window: WindowSettings,
    budget: ServedBudget,
    mode: str,
    sent: list[LLMRequest] | None = None,
) -> Drain:
    """Send every review's webhook at once, the hotfix when half are posted; wait for all.
    The requests the bot sends go into `sent` when given."""
    before = await scrape(url)
    async with fresh_database(DATABASE_URL) as database_url:
        settings = settings_for(url, database_url).with_changes(
            window=window,
            scheduler=SchedulerSettings(lease_s=900.0, heartbeat_s=5.0, poll_s=0.5),
        )
        store = open_store(settings, pool_size=20)
        policies = load_policy_book(settings.review.policy_dir)
        backend = backend_for(url, sent)
        clock = SystemClock()
        async with ForgeEmulator(EmulatorState()) as emulator:
            settings = settings.with_changes(
                forges={"github_api_url": emulator.github_url, "gitlab_url": emulator.gitlab_url}
            )
            # The emulator posts at once: GitHub's one content POST a second would measure
            # the forge's pace, not the engine's.
            forges = build_forges(
                settings,
                options=ForgeOptions(retry=RetryPolicy(attempts=4, base_delay_s=0.2)),
                budget=local_write_budget(
                    settings, now=clock.now, sleep=asyncio.sleep, post_interval_s=0.0
                ),
            )
            seen: set[tuple[str, str, int]] = set()
            p0_sent: float | None = None
            # The roles as `bot serve` runs them: engine window, quiet posting, statuses,
            # recovery and heartbeat.
            async with run_role(
                "all",
                settings,
                store=store,
                forges=forges,
                policies=policies,
                clock=clock,
                backend=backend,
                dispatching=dataclasses.replace(
                    dispatcher_settings(settings, owner=f"bench-{mode}"),
                    maintenance_s=5.0,
                ),
                budget=budget,
            ) as running:
                pool = running.dispatcher.engines if running.dispatcher is not None else None
                for request in reviews:
                    await send_request(emulator, running.url, request, seen)
                while True:
                    jobs = await store.list_jobs(limit=5000)
                    finished = sum(job.state == JobState.DONE for job in jobs)
                    live = sum(
                        job.state in (JobState.WAITING, JobState.QUEUED, JobState.RUNNING)
                        for job in jobs
                    )
                    if hotfix is not None and p0_sent is None and finished >= len(reviews) // 2:
                        p0_sent = time.monotonic()
                        await send_request(emulator, running.url, hotfix, seen)
                        continue
                    if live == 0 and (hotfix is None or p0_sent is not None):
                        break
                    await asyncio.sleep(0.5)
                recomputed = (
                    running.dispatcher.recomputed_tokens if running.dispatcher is not None else 0
                )
            posted = len(emulator.state.posted(kind="review")) + len(
                emulator.state.posted(kind="note")
            )
        async with store.engine.connect() as conn:
            row = (
                await conn.execute(
                    sa.text(
                        """
                        SELECT count(*) AS chunks,
                               sum(COALESCE((result -> 'usage' ->> 'completion_tokens')::bigint, 0))
                                   AS tokens,
                               EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) AS wall_s
                        FROM review_chunks WHERE state = 'done'
                        """
                    )
                )
            ).one()
            taken_back = (
                await conn.execute(
                    sa.text(
                        "SELECT count(*) FROM job_history"
                        " WHERE to_value = 'chunk queued' AND from_value = 'chunk running'"
                    )
                )
            ).scalar()
            p0 = None
            if hotfix is not None:
                p0 = (
                    await conn.execute(
                        sa.text(
                            "SELECT EXTRACT(EPOCH FROM finished_at - enqueued_at)"
                            " FROM review_jobs WHERE base_level = 0 AND state = 'done'"
                            " AND repo = :repo AND number = :number"
                        ),
                        {"repo": hotfix.repo, "number": hotfix.number},
                    )
                ).scalar_one_or_none()
        await store.close()
    after = await scrape(url)
    hit_rate = prefix_cache_hit_rate(before, after) if after is not None else None
    tokens = int(row.tokens or 0)
    wall = float(row.wall_s or 0.0)
    windows = list(pool.engines[0].history) if pool is not None else []
    return Drain(
        mode=mode,
        reviews=len(reviews) + (1 if hotfix is not None else 0),
        chunks=int(row.chunks),
        completion_tokens=tokens,
        wall_s=round(wall, 2),
        tokens_per_s=round(tokens / wall, 1) if wall > 0 else 0.0,
        p0_turnaround_s=None if p0 is None else round(float(p0), 2),
        windows=[(round(at - windows[0][0], 1), size) for at, size in windows] if windows else [],
        posted=posted,
        taken_back=int(taken_back or 0),
        window_reasons=dict(pool.engines[0].decisions) if pool is not None else {},
        recomputed_tokens=recomputed,
        recomputed_share=round(recomputed / tokens, 4) if tokens else 0.0,
        prefix_cache_hit_rate=None if hit_rate is None else round(hit_rate, 3),
        refused=backend.refused,
    )


async def budget_for(url: str, reviews: int) -> ServedBudget:
    """Chunk lines and code context tokens as `bot serve` sizes them for this server."""
    budget = await served_budget(settings_for(url))
    print(
        f"{reviews} reviews, chunks of up to {budget.line_budget} lines and "
        f"{budget.context_tokens} tokens of pull request text and code context",
        file=sys.stderr,
    )
    return budget


async def measure_p0(url: str, count: int) -> dict[str, Any]:
    """The P0 part alone: the hotfix sent into an adaptive drain of `count` reviews, and alone.

    For a machine too slow for the whole run; the throughput columns need the full one.
    """
    reviews, hotfix = workload(count)
    budget = await budget_for(url, len(reviews))
    line_budget = budget.line_budget
    await cold_cache(url, reviews[-1], line_budget)
    loaded = await drain_through_bot(
        url, reviews, hotfix, window=ADAPTIVE, budget=budget, mode="adaptive"
    )
    print(f"P0 loaded: {loaded.p0_turnaround_s} s", file=sys.stderr)
    await cold_cache(url, reviews[-1], line_budget)
    idle = await drain_through_bot(url, [], hotfix, window=ADAPTIVE, budget=budget, mode="p0-idle")
    result: dict[str, Any] = {
        "p0_idle_turnaround_s": idle.p0_turnaround_s,
        "p0_loaded_turnaround_s": loaded.p0_turnaround_s,
        "reviews": len(reviews),
        "line_budget": line_budget,
        "context_tokens": budget.context_tokens,
        "answer_tokens": ANSWER_TOKENS,
        "drains": [dataclasses.asdict(d) for d in (loaded, idle)],
    }
    if idle.p0_turnaround_s and loaded.p0_turnaround_s:
        result["p0_loaded_over_idle"] = round(loaded.p0_turnaround_s / idle.p0_turnaround_s, 2)
    return result


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def drain_table(drains: Sequence[dict[str, Any]], *, first_column: str) -> list[str]:
    """The drains' rows under their header, as both reports print them."""
    lines = [
        f"| {first_column} | chunks | completion tokens/s | P0 turnaround s | taken back "
        "| tokens recomputed | prefix cache hits | calls refused | windows |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for drain in drains:
        sizes = " ".join(str(size) for _, size in drain["windows"][:12])
        hits = drain["prefix_cache_hit_rate"]
        lines.append(
            f"| {drain['mode']} | {drain['chunks']} | {drain['tokens_per_s']} "
            f"| {drain['p0_turnaround_s']} | {drain['taken_back']} "
            f"| {drain['recomputed_tokens']} ({percent(drain['recomputed_share'])}) "
            f"| {'-' if hits is None else percent(hits)} | {drain['refused']} | {sizes} |"
        )
    return lines


def render_p0(result: dict[str, Any]) -> str:
    lines = [
        "### A P0 on the loaded CPU vLLM (`bench/engine_throughput.py --p0-only`)",
        "",
        f"SmolLM2-135M on vllm-cpu 0.32, {result['reviews']} small reviews through the whole bot "
        f"with the adaptive window, one P0 sent when half are posted, then the P0 alone; "
        f"{result['answer_tokens']} answer tokens a chunk at most.",
        "",
        *drain_table(result["drains"], first_column="drain"),
    ]
    lines += [
        "",
        f"P0 loaded {result['p0_loaded_turnaround_s']} s against "
        f"{result['p0_idle_turnaround_s']} s alone ({result.get('p0_loaded_over_idle')}x).",
    ]
    return "\n".join(lines)


async def measure_once(
    url: str,
    reviews: Sequence[TraceRequest],
    hotfix: TraceRequest,
    budget: ServedBudget,
    run: int,
    *,
    window1: bool = True,
) -> dict[str, Any]:
    """One run: window 1 (unless not wanted), adaptive and the idle P0 through the bot, then
    the raw sweep of the first drain's requests."""
    line_budget = budget.line_budget
    sent: list[LLMRequest] = []
    modes = [
        ("window-1", WindowSettings(floor=1, ceiling=1, initial=1), reviews),
        ("adaptive", ADAPTIVE, reviews),
        ("p0-idle", ADAPTIVE, []),
    ]
    if not window1:
        modes = modes[1:]
    drains = []
    for mode, window, todo in modes:
        await cold_cache(url, reviews[-1], line_budget)
        drain = await drain_through_bot(
            url,
            todo,
            hotfix,
            window=window,
            budget=budget,
            mode=mode,
            sent=sent if mode == modes[0][0] else None,
        )
        drains.append(dataclasses.replace(drain, mode=f"{mode} #{run}"))
        print(
            f"run {run} {mode}: {drain.tokens_per_s} tokens/s, P0 {drain.p0_turnaround_s} s, "
            f"windows {[size for _, size in drain.windows]}, moves {drain.window_reasons}, "
            f"taken back {drain.taken_back}, recomputed {drain.recomputed_tokens} "
            f"({drain.recomputed_share}), prefix cache hits {drain.prefix_cache_hit_rate}, "
            f"refused {drain.refused}",
            file=sys.stderr,
        )
    adaptive, idle = drains[-2:]
    first = drains[0] if window1 else None
    raw = await raw_sweep(url, first_calls(sent), reviews[-1], line_budget)
    best = max(raw, key=lambda row: row["tokens_per_s"])
    loaded_over_idle = (
        round(adaptive.p0_turnaround_s / idle.p0_turnaround_s, 3)
        if adaptive.p0_turnaround_s and idle.p0_turnaround_s
        else None
    )
    return {
        "adaptive_over_raw": round(adaptive.tokens_per_s / best["tokens_per_s"], 3),
        "p0_loaded_over_idle": loaded_over_idle,
        "adaptive_recomputed_share": adaptive.recomputed_share,
        "adaptive_prefix_cache_hit_rate": adaptive.prefix_cache_hit_rate,
        "window1_prefix_cache_hit_rate": first.prefix_cache_hit_rate if first else None,
        "raw_best_tokens_per_s": best["tokens_per_s"],
        "raw_best_concurrency": best["concurrency"],
        "window1_tokens_per_s": first.tokens_per_s if first else None,
        "bot_tokens_per_s": adaptive.tokens_per_s,
        "p0_idle_turnaround_s": idle.p0_turnaround_s,
        "p0_loaded_turnaround_s": adaptive.p0_turnaround_s,
        "p0_loaded_window1_turnaround_s": first.p0_turnaround_s if first else None,
        "raw_sweep": raw,
        "drains": [dataclasses.asdict(d) for d in drains],
    }


MEDIAN_KEYS = (
    "raw_best_tokens_per_s",
    "window1_tokens_per_s",
    "bot_tokens_per_s",
    "p0_idle_turnaround_s",
    "p0_loaded_turnaround_s",
    "p0_loaded_window1_turnaround_s",
)
# Per-run ratios and shares, reported by their median and range like the figures above.
RATIO_KEYS = (
    "adaptive_over_raw",
    "p0_loaded_over_idle",
    "adaptive_recomputed_share",
    "adaptive_prefix_cache_hit_rate",
    "window1_prefix_cache_hit_rate",
)


def median_of(runs: Sequence[dict[str, Any]], key: str, digits: int = 2) -> float | None:
    values = [run[key] for run in runs if run[key] is not None]
    return round(statistics.median(values), digits) if values else None


def range_of(runs: Sequence[dict[str, Any]], key: str) -> list[float] | None:
    values = [run[key] for run in runs if run[key] is not None]
    return [min(values), max(values)] if values else None


async def measure(
    url: str,
    count: int,
    repeat: int,
    *,
    window1: bool = True,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`repeat` runs one after another (each its own raw sweep and drains, side by side in
    time), reported by their medians; `on_run` gets the summary of the runs so far after each."""
    reviews, hotfix = workload(count)
    budget = await budget_for(url, len(reviews))
    runs: list[dict[str, Any]] = []
    for run in range(1, repeat + 1):
        runs.append(await measure_once(url, reviews, hotfix, budget, run, window1=window1))
        if on_run is not None:
            on_run(summarize(runs, reviews, budget))
    return summarize(runs, reviews, budget)


def summarize(
    runs: Sequence[dict[str, Any]], reviews: Sequence[TraceRequest], budget: ServedBudget
) -> dict[str, Any]:
    result: dict[str, Any] = {key: median_of(runs, key) for key in MEDIAN_KEYS}
    result["median_of_runs"] = {key: median_of(runs, key, digits=3) for key in RATIO_KEYS}
    result["range_of_runs"] = {key: range_of(runs, key) for key in MEDIAN_KEYS + RATIO_KEYS}
    result.update(
        runs=len(runs),
        reviews=len(reviews),
        line_budget=budget.line_budget,
        context_tokens=budget.context_tokens,
        answer_tokens=ANSWER_TOKENS,
        # Each concurrency's median tokens/s over the runs.
        raw_sweep=[
            {
                "concurrency": rows[0]["concurrency"],
                "calls": rows[0]["calls"],
                "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rows), 1),
                "mean_latency_s": round(statistics.median(r["mean_latency_s"] for r in rows), 2),
            }
            for rows in zip(*(run["raw_sweep"] for run in runs), strict=True)
        ],
        raw_best_concurrency=[run["raw_best_concurrency"] for run in runs],
        drains=[drain for run in runs for drain in run["drains"]],
        per_run=runs,
    )
    best = result["raw_best_tokens_per_s"]
    result["adaptive_over_raw"] = round(result["bot_tokens_per_s"] / best, 3)
    window1 = result["window1_tokens_per_s"]
    result["adaptive_over_window1"] = (
        round(result["bot_tokens_per_s"] / max(0.1, window1), 2) if window1 else None
    )
    if result["p0_idle_turnaround_s"] and result["p0_loaded_turnaround_s"]:
        result["p0_loaded_over_idle"] = round(
            result["p0_loaded_turnaround_s"] / result["p0_idle_turnaround_s"], 2
        )
    return result


def render(result: dict[str, Any]) -> str:
    runs = result["runs"]
    lines = [
        "### Engine throughput on the CPU vLLM (`make bench-engine`)",
        "",
        f"SmolLM2-135M on vllm-cpu 0.32 (`--max-num-seqs {MAX_NUM_SEQS}`), {result['reviews']} "
        f"small reviews plus one P0, chunks of up to {result['line_budget']} lines and "
        f"{result['context_tokens']} tokens of pull request text and code context, "
        f"{ANSWER_TOKENS} answer tokens a chunk at most; {runs} run(s), each its drains and "
        "then a raw sweep of the very requests its first drain sent, "
        "medians below.",
        "",
        "| concurrency (raw server) | calls | completion tokens/s | mean latency s |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for row in result["raw_sweep"]:
        lines.append(
            f"| {row['concurrency']} | {row['calls']} | {row['tokens_per_s']} "
            f"| {row['mean_latency_s']} |"
        )
    lines += [
        "",
        *drain_table(result["drains"], first_column="whole bot, run"),
        "",
        "| median of the runs (range) | tokens/s, s or share |",
        "| --- | ---: |",
        median_row(result, "raw server, best of the sweep", "raw_best_tokens_per_s"),
        median_row(result, "the bot, window 1", "window1_tokens_per_s"),
        median_row(result, "the bot, adaptive window", "bot_tokens_per_s"),
        median_row(result, "P0 turnaround, alone", "p0_idle_turnaround_s"),
        median_row(result, "P0 turnaround, sent into the adaptive drain", "p0_loaded_turnaround_s"),
        median_row(result, "adaptive / raw best, each run", "adaptive_over_raw"),
        median_row(result, "loaded P0 / idle P0, each run", "p0_loaded_over_idle"),
        median_row(
            result,
            "adaptive drain: tokens recomputed / completion tokens",
            "adaptive_recomputed_share",
        ),
        median_row(result, "adaptive drain: prefix cache hits", "adaptive_prefix_cache_hit_rate"),
        median_row(result, "window-1 drain: prefix cache hits", "window1_prefix_cache_hit_rate"),
        "",
        f"Adaptive: {result['adaptive_over_raw']}x the median raw best (each run's best at "
        f"concurrency {', '.join(str(c) for c in result['raw_best_concurrency'])}), "
        + (
            f"{result['adaptive_over_window1']}x window 1; "
            if result["adaptive_over_window1"]
            else ""
        )
        + "the loaded P0 "
        f"{result.get('p0_loaded_over_idle')}x the median idle turnaround.",
    ]
    return "\n".join(lines)


def median_row(result: dict[str, Any], label: str, key: str) -> str:
    median = result["median_of_runs"][key] if key in RATIO_KEYS else result[key]
    spread = result["range_of_runs"].get(key)
    shown = "-" if spread is None else f"{median} ({spread[0]}-{spread[1]})"
    return f"| {label} | {shown} |"


def main() -> int:
    global ANSWER_TOKENS, SWEEP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running CPU vLLM server (else one is started)")
    parser.add_argument("--reviews", type=int, default=40)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs, reported by their medians (default 3)"
    )
    parser.add_argument(
        "--answer-tokens",
        type=int,
        default=ANSWER_TOKENS,
        help="answer tokens per chunk, for the bot and the raw calls alike (a slower CPU "
        "wants fewer to finish in reasonable time)",
    )
    parser.add_argument(
        "--sweep",
        default=",".join(str(c) for c in SWEEP),
        help="the raw server's concurrencies, comma-separated",
    )
    parser.add_argument(
        "--p0-only",
        action="store_true",
        help="only the P0 part (engine_p0.json / .md): a P0 sent into an adaptive drain, and alone",
    )
    parser.add_argument(
        "--without-window-1",
        action="store_true",
        help="no drain with the window fixed at 1 (the longest part of a run; the raw sweep "
        "then replays the adaptive drain's requests)",
    )
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def write(result: dict[str, Any]) -> None:
        name = "engine_p0" if args.p0_only else "engine"
        (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        text = render_p0(result) if args.p0_only else render(result)
        (out / f"{name}.md").write_text(text + "\n")

    # The drains' P1 reviews wait past their alert threshold by design: keep the log to errors.
    logging.getLogger("bot").setLevel(logging.ERROR)
    # One run uses one answer budget and one sweep throughout: set them before anything runs.
    ANSWER_TOKENS = args.answer_tokens
    SWEEP = tuple(int(c) for c in args.sweep.split(","))
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(vllm_server())
        if args.p0_only:
            result = asyncio.run(measure_p0(url, args.reviews))
        else:
            # Each finished run is written at once: a run stopped later keeps the earlier ones.
            result = asyncio.run(
                measure(
                    url,
                    args.reviews,
                    args.repeat,
                    window1=not args.without_window_1,
                    on_run=write,
                )
            )
    write(result)
    print(render_p0(result) if args.p0_only else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
