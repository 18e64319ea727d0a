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

from bot.demo import demo_files
from bot.emulator import (
    EmulatorState,
    generate_file_changes,
    github_pull_request_hook,
    gitlab_merge_request_hook,
)
from bot.intake.normalize import normalize_delivery
from bot.intake.verify import Delivery
from bot.model import ReviewRequest
from bot.sim.trace import generate_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
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
    assert ast.literal_eval(states.group(1)) == {"done": queued}
    # Quiet reviews, as `bot serve` posts them: one living summary per reviewed PR.
    assert "each reviewed PR: one living summary; no finding said twice" in out
    assert re.search(r"statuses on the commits: \d+ writes", out)
