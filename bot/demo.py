"""`make demo`: the whole bot on built-in defaults, webhooks in and reviews out, in minutes.

A PostgreSQL that bot.devdb finds or starts (and names), the forge emulator, the web app and an
8-slot dispatcher in one process, and a slice of the morning-burst trace replayed as real signed
webhooks at `--speed` times real time. Every clock of the bot runs at that speed (a scaled
clock), so the waits it prints are in trace seconds, comparable to `bot simulate`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from bot import devdb
from bot.clock import EPOCH
from bot.components import dispatcher_settings, local_write_budget
from bot.config import (
    REPO_ROOT,
    DatabaseSettings,
    ForgeSettings,
    SchedulerSettings,
    Settings,
    StatusKnobs,
)
from bot.db import upgrade_database
from bot.emulator import (
    EmulatorState,
    ForgeEmulator,
    Record,
    build_github_pull_request_event,
    build_gitlab_merge_request_event,
    generate_file_changes,
    github_pull_request_hook,
    gitlab_merge_request_hook,
    send_webhook,
)
from bot.emulator.hooks import pull_hook
from bot.emulator.pushes import Pushed, head_files, push_changes, push_patches
from bot.engine_setup import served_budget
from bot.errors import ConfigError
from bot.forges.base import SUMMARY_MARKER, RetryPolicy
from bot.forges.registry import ForgeOptions, build_forges
from bot.llm.base import LLMBackend
from bot.llm.simulated import SimulatedBackend
from bot.model import FileChange, Forge, Job, JobState
from bot.obs.reports import Report, ReportOptions, build_report, format_table
from bot.policy import load_policy_book
from bot.queue.store import QueueStore
from bot.serve import open_store, run_role
from bot.sim.trace import Trace, TraceRequest, generate_trace, head_sha_for, load_trace

log = logging.getLogger(__name__)

TRACE = REPO_ROOT.parent / "shared" / "traces" / "morning-burst.jsonl"
SECRET = "demo-webhook-secret"
TOKEN = "demo-forge-token"
FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"
SMELLS = (
    "+    print(payload)  # TODO drop the debug output",
    '+    api_key = "sk-demo-not-a-real-key"',
    "+    subprocess.run(command, shell=True)",
)


class ScaledClock:
    """Trace time: starts at EPOCH and runs `speed` times faster than the wall."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._started = time.monotonic()

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=(time.monotonic() - self._started) * self.speed)

    def trace_seconds(self) -> float:
        return (time.monotonic() - self._started) * self.speed


def say(text: str) -> None:
    print(text, flush=True)


def _stable_number(text: str) -> int:
    """A number derived from `text` that is the same in every process (unlike hash())."""
    return zlib.crc32(text.encode())


def recorded_payload(name: str) -> dict[str, Any] | None:
    """A recorded delivery from ../shared/fixtures when it sits beside the repository, else None
    (a plain clone: the emulator then builds the delivery from its own objects)."""
    path = FIXTURES / name
    if not path.is_file():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def demo_files(request: TraceRequest) -> list[FileChange]:
    """Generated diffs with the trace's per-file sizes; about every third change has a smell."""
    files: list[FileChange] = []
    for index, lines in enumerate(request.file_lines):
        [change] = generate_file_changes(
            changed_lines=max(1, lines),
            files=1,
            seed=_stable_number(f"{request.id}:{index}") & 0xFFFF,
        )
        files.append(replace(change, path=f"src/part{index}/{change.path.rsplit('/', 1)[-1]}"))
    # Trace ids differ by source (rNNNN in the shared trace, gSSS-NNNNN when generated).
    if _stable_number(request.id) % 3 == 0:
        smell = SMELLS[len(request.file_lines) % len(SMELLS)]
        patch = (
            f"@@ -10,3 +10,4 @@\n def handle(payload):\n-    pass\n{smell}\n+    return payload\n "
        )
        files.append(FileChange(path="app/handlers.py", additions=2, deletions=1, patch=patch))
    return files


def load_demo_trace(count: int, *, max_lines: int | None = None) -> tuple[Trace, str]:
    """The first `count` requests of the shared morning burst (at most `max_lines` changed
    lines each, when given), or of a generated one."""
    if TRACE.is_file():
        trace = load_trace(TRACE)
        source = str(TRACE)
    else:
        trace = generate_trace(seed=7, scenario="demo")
        source = "a generated trace (../shared is absent)"
    wanted = [
        r
        for r in trace.requests
        if r.action in ("opened", "synchronize")
        and (max_lines is None or sum(r.file_lines) <= max_lines)
    ][:count]
    return Trace(header=trace.header, requests=tuple(wanted), source=source), source


async def send_request(
    emulator: ForgeEmulator, url: str, request: TraceRequest, seen: set[tuple[str, str, int]]
) -> str:
    """Seed (or push to) the PR in the emulator, then deliver its signed webhook."""
    state = emulator.state
    key = (request.forge, request.repo, request.number)
    files = demo_files(request)
    head_sha = head_sha_for(request)
    if key in seen:
        # A child of the head the bot reviewed: the review covers what changed since.
        push_patches(state, state.get_pull(*key), files, head_sha)
    else:
        state.add_pull(
            request.forge,
            request.repo,
            request.number,
            files=files,
            head_sha=head_sha,
            base_ref=request.base_ref,
            head_ref=request.head_ref,
            author=request.author,
            labels=request.labels,
            installation_id=1,
        )
        seen.add(key)
    pull = state.get_pull(request.forge, request.repo, request.number)
    if request.forge == "github":
        fixture = recorded_payload("github/pull_request.opened.json") or github_pull_request_hook(
            state, pull
        )
        payload = build_github_pull_request_event(
            fixture,
            action=request.action,
            repo=request.repo,
            number=request.number,
            title=f"{request.head_ref} ({request.id})",
            base_ref=request.base_ref,
            head_ref=request.head_ref,
            base_sha=pull.newest.base_sha,
            head_sha=head_sha,
            labels=list(request.labels),
            author=request.author,
            author_type="Bot" if request.author_is_bot else "User",
            draft=request.draft,
            changed_files=len(files),
            additions=sum(item.additions for item in files),
            deletions=sum(item.deletions for item in files),
            installation_id=1,
        )
        answer = await send_webhook(
            f"{url}/webhooks/github", "github", "pull_request", payload, SECRET
        )
    else:
        fixture = recorded_payload(
            "gitlab/merge_request_hook.open.gitlab_com.json"
        ) or gitlab_merge_request_hook(state, pull)
        payload = build_gitlab_merge_request_event(
            fixture,
            action="open" if request.action == "opened" else "update",
            repo=request.repo,
            project_id=pull.project_id,
            number=request.number,
            title=f"{request.head_ref} ({request.id})",
            base_ref=request.base_ref,
            head_ref=request.head_ref,
            head_sha=head_sha,
            oldrev=pull.versions[-2].head_sha if len(pull.versions) > 1 else None,
            labels=list(request.labels),
            author=request.author,
            author_is_bot=request.author_is_bot,
            draft=request.draft,
        )
        answer = await send_webhook(
            f"{url}/webhooks/gitlab", "gitlab", "Merge Request Hook", payload, SECRET
        )
    if answer.status >= 300:
        return f"refused {answer.status}"
    return str(json.loads(answer.body).get("status"))


def vllm_backend() -> tuple[LLMBackend, str]:
    """Start the CPU vLLM server (scripts/vllm_cpu.sh; it stops with us); returns backend, URL."""
    from bot.llm.openai_compat import OpenAICompatBackend

    script = REPO_ROOT / "scripts" / "vllm_cpu.sh"
    port = os.environ.get("REVIEW_BOT_VLLM_PORT", "8011")
    say("starting the CPU vLLM server (scripts/vllm_cpu.sh; the first run installs it)...")
    served = subprocess.run(
        [str(script), "serve", "--port", port, "--watch-pid", str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if served.returncode != 0:
        raise ConfigError(f"the CPU vLLM server did not start: {served.stderr.strip()[-2000:]}")
    answers = dict(line.split("=", 1) for line in served.stdout.split() if "=" in line)
    url = answers.get("URL", f"http://127.0.0.1:{port}")
    # scripts/vllm_cpu.sh serves the model under this name; constrained JSON keeps a model
    # this small to the output contract.
    backend = OpenAICompatBackend(
        [url], model="smollm2", timeout_s=600.0, response_format="json_schema"
    )
    return backend, url


def demo_settings(url: str, *, speed: float) -> Settings:
    """Embedded defaults with the emulator's secrets, timed for a replay at `speed`."""
    return Settings(
        database=DatabaseSettings(url=url),
        forges=ForgeSettings(
            github_webhook_secret=SECRET,
            gitlab_webhook_token=SECRET,
            github_token=TOKEN,
            gitlab_token=TOKEN,
        ),
        scheduler=SchedulerSettings(workers=8, lease_s=900.0, heartbeat_s=2.0, poll_s=0.5),
        # The publisher looks at the queue every quarter second of wall time (at 60x, every
        # 15 s of trace time); its rules count in trace time.
        status=StatusKnobs(interval_s=0.25),
    )


async def run_bot_demo(
    url: str, *, requests: int, speed: float, llm: str, long_table: bool = False
) -> int:
    """Everything after the database exists: serve, replay, drain, report."""
    await upgrade_database(url)
    clock = ScaledClock(speed)
    trace, source = load_demo_trace(requests, max_lines=80 if llm == "vllm-cpu" else None)
    if llm == "vllm-cpu":
        # The CPU model's 4,096-token context holds about a hundred changed lines, and a
        # handful of small PRs five seconds apart keeps a real-time demo short.
        trace = Trace(
            header=trace.header,
            requests=tuple(
                dataclasses.replace(request, arrival_s=5.0 * index)
                for index, request in enumerate(trace.requests)
            ),
            source=trace.source,
        )
    say(f"trace: {len(trace.requests)} requests from {source}, replayed at {speed:g}x")
    say(
        f"webhooks: recorded GitHub/GitLab deliveries from {FIXTURES}, with each request's fields"
        if FIXTURES.is_dir()
        else "webhooks: built by the forge emulator from its PRs (../shared/fixtures is absent)"
    )
    # The emulator keeps GitHub's secondary limits (80 writes a minute, 500 an hour) on the
    # trace's clock, as the bot's write budget does: on the wall clock a 60x replay met them
    # 60 times over, and reviews failed on 403s the budget could not foresee.
    emulator_state = EmulatorState(clock=clock.now)
    settings = demo_settings(url, speed=speed)
    store = open_store(settings, pool_size=20)
    policies = load_policy_book(settings.review.policy_dir)
    backend: LLMBackend
    if llm == "vllm-cpu":
        backend, llm_url = vllm_backend()
        # One engine with an adaptive window, chunks cut to the served model's context.
        settings = settings.with_changes(
            llm={"backend": "openai", "base_urls": (llm_url,), "model": "smollm2"}
        )
        say(f"LLM: real vLLM on the CPU at {llm_url} (SmolLM2-135M: a tiny model, poor reviews)")
    else:
        backend = SimulatedBackend(sleep=asyncio.sleep, time_scale=1.0 / speed)
        say("LLM: the simulated backend (trace cost model, time scaled by the speed)")
    started = time.monotonic()
    async with ForgeEmulator(emulator_state) as emulator:
        settings = settings.with_changes(
            forges={"github_api_url": emulator.github_url, "gitlab_url": emulator.gitlab_url}
        )

        async def trace_sleep(seconds: float) -> None:
            await asyncio.sleep(max(0.0, seconds) / speed)

        # The forges' write budget and retries count in trace time, as the dispatcher does.
        forges = build_forges(
            settings,
            clock=clock.now,
            sleep=trace_sleep,
            options=ForgeOptions(retry=RetryPolicy(attempts=4, base_delay_s=0.2 * speed)),
            budget=local_write_budget(settings, now=clock.now, sleep=trace_sleep),
        )
        # The dispatcher beats every heartbeat_s of wall time, which is `speed` times as many
        # seconds on the scaled clock the web process judges liveness by.
        scheduler = {"heartbeat_s": settings.scheduler.heartbeat_s * speed}
        # The roles exactly as `bot serve` runs them: quiet reviews, the status on each commit,
        # recovery and heartbeat; maintenance (aging, lease reclaim) at trace pace.
        async with run_role(
            "all",
            settings.with_changes(scheduler=scheduler),
            store=store,
            forges=forges,
            policies=policies,
            clock=clock,
            backend=backend,
            dispatching=replace(
                dispatcher_settings(settings, owner="demo"),
                maintenance_s=1.0,
            ),
            budget=await served_budget(settings),
        ) as running:
            say(
                f"bot: webhooks at {running.url}/webhooks/{{github,gitlab}}; "
                f"forges at {emulator.base_url}"
            )
            answers = await replay(emulator, running.url, trace, clock, speed=speed)
            say(f"webhooks answered: {dict(Counter(answers))}")
            await drain(store, timeout_s=240.0)
            say("")
            say("pushing to three reviewed PRs again: a fix, a new file, a force-push...")
            stories = await push_again(emulator, running.url, await store.list_jobs(limit=5000))
            await drain(store, timeout_s=120.0)
        elapsed = time.monotonic() - started
        await print_results(
            store, emulator, elapsed=elapsed, trace_s=clock.trace_seconds(), long_table=long_table
        )
        print_stories(emulator.state, stories)
    await store.close()
    say(TRY_NEXT)
    return 0


async def replay(
    emulator: ForgeEmulator, url: str, trace: Trace, clock: ScaledClock, *, speed: float
) -> list[str]:
    """Send each request's webhook at its arrival time (scaled); returns the bot's answers."""
    seen: set[tuple[str, str, int]] = set()
    answers: list[str] = []
    first = trace.requests[0].arrival_s if trace.requests else 0.0
    last_report = 0.0
    for index, request in enumerate(trace.requests, start=1):
        delay = (request.arrival_s - first - clock.trace_seconds()) / speed
        if delay > 0:
            await asyncio.sleep(delay)
        answers.append(await send_request(emulator, url, request, seen))
        if clock.trace_seconds() - last_report >= 600 or index == len(trace.requests):
            last_report = clock.trace_seconds()
            say(f"  t={clock.trace_seconds():7.0f} s  sent {index}/{len(trace.requests)} webhooks")
    return answers


async def drain(store: QueueStore, *, timeout_s: float) -> None:
    """Wait until no job is live any more and every ended job's final status is written,
    printing progress."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        jobs = await store.list_jobs(limit=5000)
        states = Counter(job.state.value for job in jobs)
        live = sum(states[s] for s in ("waiting", "queued", "running"))
        line = " ".join(f"{name}={count}" for name, count in sorted(states.items()))
        if line != last:
            say(f"  jobs: {line}")
            last = line
        # A review that ends just now still owes its head the final status: the publisher
        # writes it on its next pass (after a restart too, from the outbox), so the demo waits
        # for it rather than report a head left pending.
        owed = len(await store.status.owed(limit=5000)) if live == 0 else 0
        if live == 0 and owed == 0:
            return
        if time.monotonic() > deadline:
            say(
                f"  stopping with {live} jobs still live and {owed} final statuses owed "
                "(the demo's time limit)"
            )
            return
        await asyncio.sleep(1.0)


async def print_results(
    store: QueueStore,
    emulator: ForgeEmulator,
    *,
    elapsed: float,
    trace_s: float,
    long_table: bool = False,
) -> None:
    """Per-level waits from the database, what was posted, the alerts raised."""
    report = await build_report(store.reports, "waits", ReportOptions())
    say("")
    say(f"done in {elapsed:.0f} s real ({trace_s:.0f} s of trace time).")
    say(waits_table(report.rows, long=long_table))
    jobs = await store.list_jobs(limit=5000)
    say(f"job states: {dict(Counter(job.state.value for job in jobs))}")
    say(posting_summary(emulator.state, jobs))
    statuses = emulator.state.commit_statuses
    last_state: dict[tuple[str, str, str], str] = {}
    for status in statuses:
        # GitHub's commit statuses have a state, GitLab's a status.
        state = status.get("state") or status.get("status")
        last_state[(status["_forge"], status["_repo"], status["sha"])] = str(state)
    say(
        f"statuses on the commits: {len(statuses)} writes on {len(last_state)} heads, "
        f"now {dict(Counter(last_state.values()))}"
    )
    waited = await store.monitoring.count_alerts()
    service = await store.monitoring.operational_alert_messages()
    say(
        f"alerts: {waited} reviews waited past their level's threshold (bot report alerts); "
        + ("no service alert" if not service else "service alerts: " + "; ".join(service))
    )
    if not any(job.state == JobState.DONE for job in jobs):
        say(f"no review finished: see the bot's log ({LOG_PATH})")


WAIT_COLUMNS = (
    ("level", "level", ""),
    ("jobs", "reviews", ""),
    ("mean_wait_s", "wait mean", "s"),
    ("p95_wait_s", "wait P95", "s"),
    ("mean_turnaround_s", "turnaround mean", "s"),
    ("p95_turnaround_s", "turnaround P95", "s"),
)
BREACHES = (
    "breaches: reviews whose first LLM call came after their level's alert threshold "
    "(REVIEW_BOT_ALERT_THRESHOLDS_S: P0 10 s, P1 60 s, P2 300 s, P3 1800 s), or that still "
    "wait past it"
)


def waits_table(rows: Sequence[dict[str, Any]], *, long: bool = False) -> str:
    """Waits per level from the database, in trace seconds: mean and P95 (`long`: the whole
    report, every column, with what breaches means)."""
    head = (
        "waits by level, from the database, in trace seconds\n"
        "(wait: webhook to the first LLM call; turnaround: webhook to the review posted):"
    )
    if long:
        return "\n".join(
            [head, format_table(Report("waits", [dict(row) for row in rows])), BREACHES]
        )
    table = [[title for _, title, _ in WAIT_COLUMNS]]
    for row in rows:
        table.append(
            [
                str(row[key]) if not unit else f"{float(row[key] or 0):.0f} {unit}"
                for key, _, unit in WAIT_COLUMNS
            ]
        )
    widths = [max(len(line[index]) for line in table) for index in range(len(WAIT_COLUMNS))]
    lines = [
        "  ".join(
            cell.ljust(width) if index == 0 else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in table
    ]
    return "\n".join([head, *lines, "(make demo ARGS=--long: P50/P99/max and breaches too)"])


SUMMARY_KINDS = ("issue_comment", "note")  # where a living summary is created
EDIT_KINDS = ("comment_edit", "note_edit")
Finding = tuple[str, str, int | None, str, int, str]  # forge, repo, number, path, line, body


def findings_of(state: EmulatorState) -> list[Finding]:
    """Every inline finding posted: GitHub review comments and GitLab diff discussions."""
    found: list[Finding] = []
    for record in state.records:
        if record.kind == "review":
            for comment in record.data.get("comments", ()):
                found.append((record.forge, record.repo, record.number, str(comment["path"]),
                              int(comment["line"]), str(comment["body"])))  # fmt: skip
        elif record.kind == "discussion":
            position = record.data.get("position") or {}
            found.append((record.forge, record.repo, record.number, str(position.get("new_path")),
                          int(position.get("new_line") or 0), record.body or ""))  # fmt: skip
    return found


def current_summary(state: EmulatorState, created: Record) -> str:
    """A summary's text after its last edit."""
    body = created.body or ""
    for record in state.records:
        if (
            record.kind in EDIT_KINDS
            and (record.forge, record.repo, record.number)
            == (created.forge, created.repo, created.number)
            and SUMMARY_MARKER in (record.body or "")
        ):
            body = record.body or ""
    return body


def posting_summary(state: EmulatorState, jobs: Sequence[Job]) -> str:
    """What the reviews left on the pull requests, and whether the bot stayed quiet."""
    reviewed = {(job.forge, job.repo, job.number) for job in jobs if job.state == JobState.DONE}
    summaries = Counter(
        (record.forge, record.repo, record.number)
        for record in state.records
        if record.kind in SUMMARY_KINDS and SUMMARY_MARKER in (record.body or "")
    )
    edits = sum(
        1 for r in state.records if r.kind in EDIT_KINDS and SUMMARY_MARKER in (r.body or "")
    )
    findings = findings_of(state)
    said_twice = sum(count - 1 for count in Counter(findings).values() if count > 1)
    quiet = set(summaries) == reviewed and all(c == 1 for c in summaries.values())
    return (
        f"posted: {len(findings)} inline findings; {len(summaries)} living summaries for "
        f"{len(reviewed)} reviewed PRs, edited {edits} times\n"
        + (
            "each reviewed PR: one living summary"
            if quiet
            else f"summaries: expected one on each of {len(reviewed)} PRs, found {dict(summaries)}"
        )
        + ("; no finding said twice" if not said_twice else f"; {said_twice} findings said twice")
    )


# The smells demo_files plants (without the diff's "+"), and what a fix puts in their place.
FIXES = {
    SMELLS[0][1:]: '    log.debug("payload %s", payload)',
    SMELLS[1][1:]: '    api_key = os.environ["API_KEY"]',
    SMELLS[2][1:]: "    subprocess.run(shlex.split(command), check=True)",
}
NEW_FILE = (
    "app/retry.py",
    "def retry(call, attempts=3):\n"
    "    for attempt in range(attempts):\n"
    "        try:\n"
    "            return call()\n"
    "        except OSError:\n"
    '            print("retrying", attempt)\n'
    '    raise RuntimeError("gave up")\n',
)
StoryKind = Literal["a fix pushed", "a new file pushed", "force-pushed"]
PullKey = tuple[Forge, str, int]


@dataclasses.dataclass(frozen=True, slots=True)
class PushStory:
    """One push of the demo's second act and what the bot answered to its webhook."""

    kind: StoryKind
    key: PullKey
    before: str
    after: str
    answer: str


def pick_pulls(jobs: Sequence[Job], findings: Sequence[Finding]) -> dict[StoryKind, PullKey]:
    """Three reviewed PRs to push to again (pure): one whose smell a fix removes (a GitHub one
    if there is), one that gets a new file (a GitLab one if there is), one to force-push."""
    reviewed = list(
        dict.fromkeys(
            (job.forge, job.repo, job.number)
            for job in sorted(jobs, key=lambda job: job.id)
            if job.state == JobState.DONE
        )
    )
    smelly = {finding[:3] for finding in findings if finding[3] == "app/handlers.py"}
    picks: dict[StoryKind, PullKey] = {}
    plan: tuple[tuple[StoryKind, set[Any] | None, Forge], ...] = (
        ("a fix pushed", smelly, "github"),
        ("a new file pushed", None, "gitlab"),
        ("force-pushed", None, "github"),
    )
    for kind, wanted, forge in plan:
        free = [key for key in reviewed if key not in picks.values()]
        fitting = [key for key in free if wanted is None or key in wanted]
        preferred = [key for key in fitting if key[0] == forge]
        if preferred or fitting:
            picks[kind] = (preferred or fitting)[0]
    return picks


def fixed_text(text: str) -> str:
    """The file with each planted smell replaced by its fix."""
    for smell, fix in FIXES.items():
        text = text.replace(smell, fix)
    return text


async def push_again(emulator: ForgeEmulator, url: str, jobs: Sequence[Job]) -> list[PushStory]:
    """Push to reviewed PRs as their authors would, and send each push's webhook."""
    state = emulator.state
    stories = []
    for kind, key in pick_pulls(jobs, findings_of(state)).items():
        forge, repo, number = key
        pull = state.get_pull(forge, repo, number)
        files = head_files(state, pull)
        pushed: Pushed
        if kind == "a fix pushed":
            path = "app/handlers.py"
            pushed = push_changes(
                state, forge, key[1], key[2], files={path: fixed_text(files[path])}
            )
        elif kind == "a new file pushed":
            added = {NEW_FILE[0]: NEW_FILE[1]}
            pushed = push_changes(state, forge, repo, number, files=added)
        else:
            path = pull.files[0].path
            squashed = files[path] + "# the branch's commits squashed into one\n"
            rewritten = {path: squashed}
            pushed = push_changes(state, forge, repo, number, files=rewritten, force=True)
        hook = pull_hook(state, pull, before=pushed.before)
        answer = await send_webhook(
            f"{url}/webhooks/{forge}", forge, hook.event, hook.payload, SECRET
        )
        said = json.loads(answer.body).get("status") if answer.status < 300 else answer.status
        stories.append(PushStory(kind, key, pushed.before, pushed.after, str(said)))
    for story in stories:
        forge, repo, number = story.key
        say(f"  {story.kind}: {forge} {repo} #{number} ({story.before[:7]} -> "
            f"{story.after[:7]}), webhook {story.answer}")  # fmt: skip
    return stories


def inline_on(state: EmulatorState, key: PullKey, head_sha: str) -> list[tuple[str, int, str]]:
    """The inline comments posted on one head of a PR: (path, line, text)."""
    found = []
    for record in state.records:
        if (record.forge, record.repo, record.number) != key:
            continue
        if record.kind == "review" and record.data.get("commit_id") == head_sha:
            for comment in record.data.get("comments", ()):
                found.append((str(comment["path"]), int(comment["line"]), str(comment["body"])))
        elif record.kind == "discussion":
            position = record.data.get("position") or {}
            if position.get("head_sha") == head_sha:
                found.append((str(position.get("new_path")), int(position.get("new_line") or 0),
                              record.body or ""))  # fmt: skip
    return found


def summary_now(state: EmulatorState, key: PullKey) -> tuple[str, int]:
    """A PR's living summary as it reads now, and how many times it was edited."""
    created = next(
        (
            record
            for record in state.records
            if record.kind in SUMMARY_KINDS
            and (record.forge, record.repo, record.number) == key
            and SUMMARY_MARKER in (record.body or "")
        ),
        None,
    )
    if created is None:
        return "", 0
    edits = sum(
        1
        for record in state.records
        if record.kind in EDIT_KINDS
        and (record.forge, record.repo, record.number) == key
        and SUMMARY_MARKER in (record.body or "")
    )
    body = current_summary(state, created).replace(SUMMARY_MARKER, "")
    shown = [line for line in body.strip().splitlines() if not line.startswith("<!--")]
    return "\n".join(shown).strip(), edits


def print_stories(state: EmulatorState, stories: Sequence[PushStory]) -> None:
    """The pushed PRs as a reader finds them: the summary, edited in place; the new comments."""
    for index, story in enumerate(stories, start=1):
        forge, repo, number = story.key
        summary, edits = summary_now(state, story.key)
        say("")
        say(
            f"--- {index}. {forge} {repo} #{number}, {story.kind} "
            f"({story.before[:7]} -> {story.after[:7]}): its summary, edited {edits} "
            f"time{'s' * (edits != 1)} since it was posted ---"
        )
        if story.kind == "a fix pushed":
            say(summary)  # the whole summary once: what was reviewed, resolved, still open
        else:
            for line in summary.splitlines():
                if line.startswith(("**Latest review:**", "**Findings:**", "**Commits")):
                    say(line)
        for path, at, body in inline_on(state, story.key, story.after)[:3]:
            say(f"  new inline comment {path}:{at}: {body.split('<!--')[0].strip()}")


TRY_NEXT = """
try next:
  make demo ARGS=--long                 # the whole waits report (P50/P99/max, breaches)
  bot simulate                          # a whole generated morning, 1,000 requests, virtual clock
  bot trace generate --shape heavy-tail --out heavy.jsonl && bot simulate --trace heavy.jsonl
  bot emulator --port 8900 --bot-url http://127.0.0.1:8080   # then README "Try it by hand":
                                        # open PRs, push, force-push, comment /review, by curl
  bot report -h                         # the reports an admin reads from the database
  bot serve --help                      # the settings, their defaults and environment"""


LOG_PATH = Path(tempfile.gettempdir()) / f"review-bot-demo-{os.getpid()}.log"


def log_to_file(path: Path) -> None:
    """The bot's own log goes to a file, so the demo's output is what a reader sees."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("bot", "alembic"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Find or start a PostgreSQL and run the whole bot on a slice of the morning burst."""
    log_to_file(LOG_PATH)
    requests = int(getattr(args, "requests", 200))
    speed = float(getattr(args, "speed", 60.0))
    llm = str(getattr(args, "llm", "simulated"))
    long_table = bool(getattr(args, "long", False))
    if llm == "vllm-cpu":
        requests = min(requests, 6)
        speed = 1.0
    say("review-bot demo: forge emulator, web app + 8-slot dispatcher")
    say(f"the bot's log: {LOG_PATH}")
    with devdb.provision() as server:
        say(f"PostgreSQL: {server.description}; a scratch database there, dropped after")

        async def run() -> int:
            async with devdb.scratch_database(server.url, "review_bot_demo") as url:
                return await run_bot_demo(
                    url, requests=requests, speed=speed, llm=llm, long_table=long_table
                )

        return asyncio.run(run())


__all__ = ["ScaledClock", "run_demo"]
