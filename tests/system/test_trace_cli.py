"""`bot trace generate` (named shapes, seeded, any parameter), `bot simulate` on a plain clone,
and help that shows defaults, the environment behind options, and the reports."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from bot import cli
from bot.obs.reports import REPORT_NAMES
from bot.sim.replay import trace_to_replay
from bot.sim.shapes import SHAPES, generated_trace, shape_for
from bot.sim.trace import TraceError, load_trace
from tests.support.serving import REPO_ROOT


def generate(tmp_path: Path, name: str, *options: str) -> Path:
    out = tmp_path / name
    assert cli.main(["trace", "generate", *options, "--out", str(out)]) == 0
    return out


def test_the_same_shape_and_seed_give_the_same_file(tmp_path: Path) -> None:
    first = generate(tmp_path, "a.jsonl", "--shape", "small", "--seed", "4")
    again = generate(tmp_path, "b.jsonl", "--shape", "small", "--seed", "4")
    other = generate(tmp_path, "c.jsonl", "--shape", "small", "--seed", "5")
    assert first.read_bytes() == again.read_bytes()
    assert first.read_bytes() != other.read_bytes()
    trace = load_trace(first)  # what bot simulate reads
    assert (len(trace.requests), trace.header.seed, trace.header.scenario) == (200, 4, "small-4")


def test_shapes_differ_as_documented() -> None:
    morning, flat = generated_trace("morning", seed=2), generated_trace("flat", seed=2)
    storm, heavy = generated_trace("hotfix-storm", seed=2), generated_trace("heavy-tail", seed=2)

    def near_peak(trace_requests: tuple) -> float:  # type: ignore[type-arg]
        return sum(1 for r in trace_requests if 2600 <= r.arrival_s <= 4600) / len(trace_requests)

    assert near_peak(morning.requests) > 0.5 > near_peak(flat.requests)
    hotfixes = sum(1 for r in storm.requests if r.base_ref.startswith("hotfix/"))
    assert hotfixes == 100  # 10% of 1,000
    large = [r.files_changed for r in heavy.requests if r.files_changed >= 40]
    assert len(large) > len([r for r in morning.requests if r.files_changed >= 40])
    assert max(large) > 160  # past the morning's largest
    assert set(SHAPES) == {"morning", "flat", "heavy-tail", "hotfix-storm", "small"}


def test_settings_override_a_shape_and_bad_ones_are_named(tmp_path: Path) -> None:
    out = generate(
        tmp_path,
        "t.jsonl",
        "--shape",
        "small",
        "--requests",
        "50",
        "--set",
        "gitlab_share=1.0",
        "--set",
        "repos=acme/one,acme/two",
    )
    trace = load_trace(out)
    assert len(trace.requests) == 50
    assert {r.forge for r in trace.requests} == {"gitlab"}
    assert {r.repo for r in trace.requests} <= {"acme/one", "acme/two"}
    for settings, message in (
        (["nope=1"], "KEY one of"),
        (["large_share=x"], "'x' is not a number"),
        (["requests=1.5"], "is not an integer"),
        (["repos=noslash"], "owner/name"),
        (["peak_share=2"], "peak_share in [0, 1]"),
    ):
        with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
            shape_for("small", settings)


def test_simulate_without_a_trace_replays_the_generated_morning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = trace_to_replay(None)
    assert trace.requests == generated_trace("morning", seed=1).requests
    assert "bot trace generate --shape morning --seed 1" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["simulate"])
    assert args.trace is None


async def run_bot(env: dict[str, str], cwd: Path, *command: str) -> bytes:
    """`python -m bot COMMAND` as a user runs it; its standard output (it must succeed)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "--log-level",
        "WARNING",
        *command,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=300)
    assert process.returncode == 0, stderr.decode()
    return stdout


@pytest.mark.slow
async def test_generate_then_simulate_on_a_plain_clone(tmp_path: Path, db_url: str) -> None:
    """As a user runs it: a trace written by `bot trace generate`, replayed by `bot simulate`."""
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(REPO_ROOT)}
    out = tmp_path / "small.jsonl"
    await run_bot(env, tmp_path, "trace", "generate", "--shape", "small", "--seed", "3",
                  "--out", str(out))  # fmt: skip
    result = json.loads(await run_bot(env, tmp_path, "simulate", "--trace", str(out), "--json"))
    assert result["posted"] == result["requests"] == 200, result


@pytest.mark.slow
async def test_simulate_schedules_and_plans_with_the_settings_bot_serve_reads(
    tmp_path: Path, db_url: str
) -> None:
    """REVIEW_BOT_WEIGHTS and REVIEW_BOT_BACKLOG_WEIGHTS reach the replay: cutting P1's share
    from 6 (16 while work queues) to 1 makes its reviews wait longer on two workers; and
    REVIEW_BOT_BACKLOG_CHUNK_LINES=0 (no larger chunks while work queues) costs more calls."""
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(REPO_ROOT)}
    out = tmp_path / "small.jsonl"
    await run_bot(env, tmp_path, "trace", "generate", "--shape", "small", "--seed", "4",
                  "--requests", "80", "--out", str(out))  # fmt: skip

    async def replay(**settings: str) -> dict[str, Any]:
        stdout = await run_bot({**env, **settings}, tmp_path, "simulate", "--trace", str(out),
                               "--workers", "2", "--json")  # fmt: skip
        result: dict[str, Any] = json.loads(stdout)
        return result

    def p1_mean(result: dict[str, Any]) -> float:
        return float(result["levels"]["P1"]["turnaround"]["mean"])

    default = await replay()
    starved = await replay(REVIEW_BOT_WEIGHTS="8,1,8,1", REVIEW_BOT_BACKLOG_WEIGHTS="8,1,8,1")
    assert p1_mean(starved) > 1.2 * p1_mean(default)
    small_chunks = await replay(REVIEW_BOT_BACKLOG_CHUNK_LINES="0")
    assert small_chunks["gpu_s"] > default["gpu_s"]


def test_help_shows_defaults_environment_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["serve", "--help"], ["report", "-h"], ["trace", "generate", "-h"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
    text = capsys.readouterr().out
    serve, report, trace = text.split("usage: bot ")[1:]
    assert "(default: 8080)" in serve and "(default: all)" in serve
    assert "$REVIEW_BOT_WORKERS, else 8" in serve and "$REVIEW_BOT_INSECURE_DEV" in serve
    assert "DATABASE_URL" in serve and "GITHUB_WEBHOOK_SECRET" in serve
    for name in REPORT_NAMES:
        assert f"\n  {name} " in report
    assert "(default: table)" in report
    for name in SHAPES:
        assert f"\n  {name} " in trace
    assert "(default: morning)" in trace and "(default: 1)" in trace


def test_an_unknown_report_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", "wait"])
    assert exited.value.code == 2
    assert "invalid choice: 'wait'" in capsys.readouterr().err
