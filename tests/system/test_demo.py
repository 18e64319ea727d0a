"""`make demo` on a fresh machine: a clone with no ../shared beside it."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bot.clock import EPOCH
from bot.demo import BREACHES, FIXES, demo_files, fixed_text, pick_pulls, waits_table
from bot.emulator import (
    EmulatorState,
    generate_file_changes,
    github_pull_request_hook,
    gitlab_merge_request_hook,
)
from bot.intake.normalize import normalize_delivery
from bot.intake.verify import Delivery
from bot.llm.simulated import RULES
from bot.model import Job, JobId, JobState, Level, ReviewRequest
from bot.sim.trace import generate_trace

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_COMMAND = (sys.executable, "-m", "bot", "--log-level", "WARNING", "demo")
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git", ".venv", "*.egg-info", "__pycache__", ".*_cache", "bench", "tests"
)


def test_demo_files_take_generated_trace_ids() -> None:
    """The generated trace's ids (gSSS-NNNNN) are not rNNNN; every third or so has a smell."""
    requests = generate_trace(seed=7, scenario="demo").requests[:60]
    assert not requests[0].id.startswith("r")
    changed = [demo_files(request) for request in requests]
    with_smell = sum(any(f.path == "app/handlers.py" for f in files) for files in changed)
    assert 10 <= with_smell <= 30
    assert [demo_files(request) for request in requests] == changed  # the same in every run


def test_emulator_builds_hooks_the_intake_reads() -> None:
    state = EmulatorState()
    files = generate_file_changes(changed_lines=30, files=2, seed=3)
    github = state.add_pull(
        "github", "acme/shop", 7, files=files, base_ref="hotfix/x", labels=["bug"]
    )
    gitlab = state.add_pull("gitlab", "acme/platform/api", 8, files=files, draft=True)
    for pull, event, payload in (
        (github, "pull_request", github_pull_request_hook(state, github, installation_id=42)),
        (gitlab, "Merge Request Hook", gitlab_merge_request_hook(state, gitlab)),
    ):
        delivery = Delivery(forge=pull.forge, event=event, delivery_id="d-1", payload=payload)
        request = normalize_delivery(delivery)
        assert isinstance(request, ReviewRequest)
        assert (request.repo, request.number, request.action) == (pull.repo, pull.number, "opened")
        assert (request.base_ref, request.head_ref) == (pull.base_ref, pull.head_ref)
        assert request.head_sha == pull.newest.head_sha
        assert request.labels == tuple(pull.labels)
        assert request.draft == pull.draft
    github_request = normalize_delivery(
        Delivery(
            forge="github",
            event="pull_request",
            delivery_id="d-2",
            payload=github_pull_request_hook(state, github, installation_id=42),
        )
    )
    assert isinstance(github_request, ReviewRequest)
    assert github_request.installation_id == 42
    assert github_request.files_changed == 2


def make_job(job_id: int, key: tuple[str, str, int], *, state: JobState = JobState.DONE) -> Job:
    forge, repo, number = key
    return Job(
        id=JobId(job_id),
        forge="gitlab" if forge == "gitlab" else "github",
        repo=repo,
        number=number,
        head_sha="0" * 40,
        base_level=Level.P1,
        level=Level.P1,
        state=state,
        enqueued_at=EPOCH,
    )


def test_the_pushes_of_the_second_act_pick_three_reviewed_prs() -> None:
    jobs = [
        make_job(1, ("gitlab", "acme/a", 1)),
        make_job(2, ("github", "acme/b", 2)),
        make_job(3, ("github", "acme/c", 3)),
        make_job(4, ("github", "acme/d", 4), state=JobState.QUEUED),
    ]
    smell = ("github", "acme/c", 3, "app/handlers.py", 11, "TODO")
    picks = pick_pulls(jobs, [smell])
    assert picks == {
        "a fix pushed": ("github", "acme/c", 3),  # the one with a planted smell
        "a new file pushed": ("gitlab", "acme/a", 1),  # GitLab where there is one
        "force-pushed": ("github", "acme/b", 2),  # never a review still queued
    }
    for smelly, fixed in FIXES.items():
        assert fixed_text(f"a\n{smelly}\nb\n") == f"a\n{fixed}\nb\n"
        assert not any(pattern.search(fixed) for pattern, _, _ in RULES)


def test_the_waits_table_is_short_unless_asked() -> None:
    row = {"level": "P1", "jobs": 12, "started": 12, "waiting": 0, "mean_wait_s": 12.3,
           "p50_wait_s": 10.0, "p95_wait_s": 29.6, "p99_wait_s": 31.0, "max_wait_s": 33.0,
           "breaches": 1, "mean_turnaround_s": 46.1, "p95_turnaround_s": 95.4}  # fmt: skip
    short = waits_table([row])
    assert "P1          12       12 s      30 s             46 s            95 s" in short
    assert max(len(line) for line in short.splitlines()) <= 100
    long = waits_table([row], long=True)
    assert "p99_wait_s" in long and long.endswith(BREACHES) and "P0 10 s, P1 60 s" in BREACHES


@pytest.mark.slow
def test_demo_runs_in_a_clone_without_shared(pg_server: str, tmp_path: Path) -> None:
    """The demo from a copy of the repository alone, on a generated trace and emulator-built
    deliveries, with DATABASE_URL in SQLAlchemy's driver spelling."""
    clone = tmp_path / "review-bot"
    shutil.copytree(REPO_ROOT, clone, ignore=NOT_IN_A_CLONE)
    assert not (tmp_path / "shared").exists()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REVIEW_BOT_", "GITHUB_", "GITLAB_", "PYTHON"))
    }
    env["DATABASE_URL"] = "postgresql+asyncpg://" + pg_server.split("://", 1)[1]
    done = subprocess.run(
        [*DEMO_COMMAND, "--requests", "10", "--speed", "600"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    # Only the clone's own code can say ../shared is absent: the worktree has one beside it.
    assert "from a generated trace (../shared is absent)" in out
    assert "webhooks: built by the forge emulator" in out
    assert "PostgreSQL: the server of DATABASE_URL" in out
    answered = re.search(r"webhooks answered: (\{.*\})", out)
    states = re.search(r"job states: (\{.*\})", out)
    assert answered and states, out
    queued = ast.literal_eval(answered.group(1)).get("queued", 0)
    assert queued >= 8  # a draft is ignored by the default policy
    assert ast.literal_eval(states.group(1)) == {"done": queued + 3}  # and the three pushes
    # Quiet reviews, as `bot serve` posts them: one living summary per reviewed PR.
    assert "each reviewed PR: one living summary; no finding said twice" in out
    # Every reviewed head has its status, however fast its review, and it ended.
    heads = re.search(r"statuses on the commits: \d+ writes on (\d+) heads, now (\{.*\})", out)
    assert heads, out
    assert int(heads.group(1)) == queued + 3
    ended = ast.literal_eval(heads.group(2))
    assert sum(ended.values()) == queued + 3 and not {"pending", "running"} & set(ended)
    # Pushed to again: a summary edited in place, an incremental review, a force-push.
    edited = re.search(r"living summaries for \d+ reviewed PRs, edited (\d+) times", out)
    assert edited and int(edited.group(1)) >= 3, out
    assert re.search(r"a fix pushed \(\w+ -> \w+\): its summary, edited 1 time", out), out
    assert "incremental, since `" in out
    assert "#### Resolved (the code is gone)" in out
    assert re.search(r"new inline comment app/retry\.py:\d+: ", out), out
    assert "full review: history was rewritten: `" in out
    # A short waits table (mean and P95), no false alarm, and what to try next.
    assert "level  reviews  wait mean  wait P95  turnaround mean  turnaround P95" in out
    assert "breaches" not in out.split("try next:")[0].replace("and breaches too", "")
    assert "no service alert" in out and "service alert:" not in out + done.stderr
    assert "try next:" in out and "bot trace generate" in out.split("try next:")[1]
