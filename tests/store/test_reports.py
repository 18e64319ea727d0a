"""Report views and `bot report` on a database filled by a real replay."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from bot.clock import EPOCH
from bot.config import DatabaseSettings, Settings
from bot.db import create_engine, plain_url
from bot.model import JobState, Level
from bot.obs.reports import (
    STATEMENTS,
    ReportOptions,
    build_report,
    compare_summaries,
    render_report,
    run_report_command,
    success_verdict,
)
from bot.queue.connector import Connector
from bot.queue.reports import ReportQueries
from bot.queue.store import QueueStore
from tests.support.factories import decide, make_request
from tests.support.obs_helpers import replayed_database


@pytest.fixture(scope="module")
async def replayed(pg_server: str, template_database: str) -> AsyncIterator[tuple[str, Any]]:
    """One replayed database for the module, plus a failure and people's commands."""
    async with replayed_database(pg_server, template_database) as (url, summary):
        store = QueueStore.from_url(url, pool_size=1)
        try:
            late = EPOCH + timedelta(hours=2)
            failed = await store.submit_request(
                make_request(repo="acme/broken", number=99), decide(Level.P2), now=late
            )
            assert failed.job_id is not None
            await store.finish_job(
                failed.job_id, now=late, state=JobState.FAILED, error="diff fetch: 404 Not Found"
            )
            queued = await store.submit_request(
                make_request(repo="acme/api", number=4242, head_sha="c" * 40),
                decide(Level.P2),
                now=late,
            )
            assert queued.job_id is not None
            await store.set_level(
                queued.job_id, Level.P1, now=late, reason="/review-bot priority P1", actor="alice"
            )
            await store.record_command(
                queued.job_id, now=late, actor="alice", command="priority P1", outcome="accepted"
            )
        finally:
            await store.close()
        yield url, summary


async def _report(url: str, name: str, **options: Any) -> Any:
    connector = Connector(create_engine(url, pool_size=1))
    try:
        return await build_report(ReportQueries(connector), name, ReportOptions(slots=2, **options))
    finally:
        await connector.close()


def _by_level(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["level"]: row for row in rows}


async def test_waits_view_matches_the_replay(replayed: tuple[str, Any]) -> None:
    url, summary = replayed
    report = await _report(url, "waits", until=EPOCH + timedelta(hours=1, minutes=30))
    levels = _by_level(report.rows)
    assert levels["all"]["jobs"] == summary["requests"]
    assert levels["all"]["mean_wait_s"] == pytest.approx(
        summary["all"]["time_to_first_chunk"]["mean"], abs=0.01
    )
    assert levels["all"]["p95_wait_s"] == pytest.approx(
        summary["all"]["time_to_first_chunk"]["p95"], abs=0.01
    )
    for name, expected in summary["levels"].items():
        if expected["n"] == 0:
            assert name not in levels
            continue
        assert levels[name]["jobs"] == expected["n"]
        assert levels[name]["mean_wait_s"] == pytest.approx(
            expected["time_to_first_chunk"]["mean"], abs=0.01
        )
        assert levels[name]["max_turnaround_s"] == pytest.approx(
            expected["turnaround"]["max"], abs=0.01
        )
        assert levels[name]["breaches"] == expected["breaches"]
    assert summary["all"]["time_to_first_chunk"]["mean"] > 0, "the trace must make jobs wait"


@pytest.mark.parametrize(
    ("name", "view"),
    [
        ("waits", "report_waits_by_level"),
        ("durations", "report_durations"),
        ("workers", "report_workers"),
        ("repos", "report_repos"),
    ],
)
async def test_psql_views_are_the_reports(replayed: tuple[str, Any], name: str, view: str) -> None:
    """A view and `bot report` with the defaults give the same rows: one SQL behind both."""
    url, _ = replayed
    connector = Connector(create_engine(url, pool_size=1))
    try:
        # The views judge "still waiting" now, as the report does when given the time.
        options = ReportOptions(slots=8, now=datetime.now(UTC))
        report = await build_report(ReportQueries(connector), name, options)
    finally:
        await connector.close()
    connection = await asyncpg.connect(plain_url(url))
    try:
        rows = await connection.fetch(f"SELECT * FROM {view}")
        views = {
            row["viewname"]
            for row in await connection.fetch(
                "SELECT viewname FROM pg_views WHERE schemaname = 'public'"
            )
        }
    finally:
        await connection.close()
    assert {"report_commands", "report_failures", "report_alerts", "report_waits"} <= views
    assert report.rows, f"the replay must give the {name} report rows"
    plain = [
        {key: float(value) if isinstance(value, Decimal) else value for key, value in row.items()}
        for row in rows
    ]
    if name == "workers":
        plain = [{**row, "hour": row["hour"] and row["hour"].isoformat()} for row in plain]
    assert plain == report.rows


async def test_durations_workers_repos_commands_failures(replayed: tuple[str, Any]) -> None:
    url, summary = replayed
    durations = await _report(url, "durations")
    overall = _by_level(durations.rows)["all"]
    assert overall["jobs"] == summary["completed"]
    assert overall["p99_over_p50"] == pytest.approx(overall["p99_s"] / overall["p50_s"], rel=0.01)
    assert durations.notes[0].startswith("recommendation: P99/P50 = ")
    assert ("pay off" in durations.notes[0]) == (overall["p99_over_p50"] > 10)

    workers = await _report(url, "workers")
    totals = [row for row in workers.rows if row["hour"] is None]
    assert [row["worker"] for row in totals] == ["replay"]
    assert totals[0]["gpu_s"] == pytest.approx(summary["gpu_s"], rel=0.001)
    hourly = [row for row in workers.rows if row["hour"] is not None]
    assert sum(row["chunks"] for row in hourly) == totals[0]["chunks"]
    assert 0 < totals[0]["utilization"] <= 1.0

    repos = await _report(url, "repos")
    turnarounds = [row["mean_turnaround_s"] or 0 for row in repos.rows]
    assert turnarounds == sorted(turnarounds, reverse=True)
    assert sum(row["jobs"] for row in repos.rows) == summary["requests"] + 2

    largest = await _report(url, "largest", limit=3)
    lines = [row["total_lines"] for row in largest.rows]
    assert len(lines) == 3 and lines == sorted(lines, reverse=True)

    commands = await _report(url, "commands")
    assert [(row["kind"], row["actor"]) for row in commands.rows] == [
        ("level", "alice"),
        ("command", "alice"),
    ]
    failures = await _report(url, "failures")
    assert [(row["repo"], row["state"]) for row in failures.rows] == [("acme/broken", "failed")]
    assert failures.rows[0]["last_error"] == "diff fetch: 404 Not Found"

    only_broken = await _report(url, "waits", repo="acme/broken")
    assert _by_level(only_broken.rows)["all"]["jobs"] == 1


@pytest.mark.parametrize("name", sorted(STATEMENTS))
async def test_formats_parse(replayed: tuple[str, Any], name: str) -> None:
    url, _ = replayed
    report = await _report(url, name)
    as_csv, csv_notes = render_report(report, "csv")
    as_json, _ = render_report(report, "json")
    as_table, _ = render_report(report, "table")
    parsed = json.loads(as_json)
    assert parsed["report"] == name and len(parsed["rows"]) == len(report.rows)
    assert csv_notes == report.notes
    records = list(csv.DictReader(io.StringIO(as_csv)))
    assert len(records) == len(report.rows)
    if report.rows:
        assert list(records[0]) == list(report.rows[0])
        assert as_table.splitlines()[0].split() == list(report.rows[0])


@pytest.fixture
async def reader_url(replayed: tuple[str, Any], pg_server: str) -> AsyncIterator[str]:
    """A login role with nothing but SELECT, created as the module docstring says."""
    url, _ = replayed
    role = f"review_bot_reader_{secrets.token_hex(4)}"
    database = make_url(url).database
    admin = await asyncpg.connect(plain_url(url))
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        await admin.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
        await admin.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"')
        await admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
        await admin.execute(f'ALTER ROLE "{role}" SET default_transaction_read_only = on')
        yield str(make_url(url).set(username=role, password=None))
    finally:
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.close()
        server = await asyncpg.connect(plain_url(pg_server))
        try:
            await server.execute(f'DROP ROLE IF EXISTS "{role}"')
        finally:
            await server.close()


def _args(name: str, output_format: str, **extra: Any) -> argparse.Namespace:
    values = {
        "name": name,
        "since": None,
        "until": None,
        "repo": None,
        "format": output_format,
        "before": None,
        "after": None,
    }
    values.update(extra)
    return argparse.Namespace(**values)


async def test_reports_run_as_a_read_only_role(
    reader_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(database=DatabaseSettings(url=reader_url))
    for name in sorted(STATEMENTS):
        status = await asyncio.to_thread(run_report_command, _args(name, "json"), settings)
        assert status == 0
        assert json.loads(capsys.readouterr().out)["report"] == name
    engine = create_engine(reader_url, pool_size=1)
    try:
        with pytest.raises(DBAPIError, match=r"read-only transaction|permission denied"):
            async with engine.begin() as conn:
                await conn.execute(text("DELETE FROM alerts"))
        with pytest.raises(DBAPIError, match="permission denied"):
            async with engine.begin() as conn:
                await conn.execute(text("SET TRANSACTION READ WRITE"))
                await conn.execute(text("DELETE FROM alerts"))
    finally:
        await engine.dispose()


async def test_compare_two_periods(replayed: tuple[str, Any], capsys: Any) -> None:
    url, _ = replayed
    first = (EPOCH, EPOCH + timedelta(minutes=10))
    second = (EPOCH + timedelta(minutes=10), EPOCH + timedelta(minutes=40))

    def period(bounds: tuple[Any, Any]) -> str:
        return f"{bounds[0].isoformat()}/{bounds[1].isoformat()}"

    args = _args("compare", "json", before=period(first), after=period(second))
    status = await asyncio.to_thread(
        run_report_command, args, Settings(database=DatabaseSettings(url=url))
    )
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    rows = {(row["scope"], row["metric"]): row for row in result["rows"]}
    before = _by_level((await _report(url, "waits", since=first[0], until=first[1])).rows)
    after = _by_level((await _report(url, "waits", since=second[0], until=second[1])).rows)
    assert rows["all", "time_to_first_chunk_mean_s"]["before"] == pytest.approx(
        before["all"]["mean_wait_s"]
    )
    assert rows["all", "time_to_first_chunk_mean_s"]["after"] == pytest.approx(
        after["all"]["mean_wait_s"]
    )
    assert result["notes"] == [
        success_verdict(before["all"]["mean_wait_s"], after["all"]["mean_wait_s"])
    ]


@pytest.mark.slow
async def test_compare_two_simulations(
    pg_server: str, template_database: str, tmp_path: Path, capsys: Any
) -> None:
    """FIFO against the feedback queue on one trace: the rollout's before/after."""
    files = {}
    for policy in ("fifo", "mlfq"):
        async with replayed_database(pg_server, template_database, policy=policy) as (_, summary):
            files[policy] = tmp_path / f"{policy}.json"
            files[policy].write_text(json.dumps(summary))
    args = _args("compare", "table", before=str(files["fifo"]), after=str(files["mlfq"]))
    assert await asyncio.to_thread(run_report_command, args, Settings()) == 0
    output = capsys.readouterr().out
    fifo = json.loads(files["fifo"].read_text())
    mlfq = json.loads(files["mlfq"].read_text())
    verdict = success_verdict(
        fifo["all"]["time_to_first_chunk"]["mean"], mlfq["all"]["time_to_first_chunk"]["mean"]
    )
    assert output.rstrip().splitlines()[-1] == verdict
    report = compare_summaries(fifo, mlfq)
    p0 = {row["metric"]: row for row in report.rows if row["scope"] == "P0"}
    assert (
        p0["time_to_first_chunk_mean_s"]["after"]
        == mlfq["levels"]["P0"]["time_to_first_chunk"]["mean"]
    )


def test_success_verdict_rule() -> None:
    assert success_verdict(228.0, 100.0).endswith(": MET")
    assert success_verdict(228.0, 114.0).endswith(": MET")
    assert success_verdict(228.0, 115.0).endswith(": NOT MET")
    assert "no wait before" in success_verdict(0.0, 3.0)


async def test_breaches_count_jobs_still_waiting_past_the_threshold(store: QueueStore) -> None:
    """A P0 nobody started is a breach while it waits, not only once it starts."""
    stuck = await store.submit_request(make_request(number=1), decide(Level.P0), now=EPOCH)
    await store.submit_request(
        make_request(number=2, head_sha="d" * 40),
        decide(Level.P0),
        now=EPOCH + timedelta(seconds=55),
    )
    assert stuck.job_id is not None
    options = ReportOptions(now=EPOCH + timedelta(seconds=60))
    levels = _by_level((await build_report(store.reports, "waits", options)).rows)
    # Measured at the window's end when that comes first.
    early = ReportOptions(until=EPOCH + timedelta(seconds=9), now=EPOCH + timedelta(hours=1))
    before_threshold = _by_level((await build_report(store.reports, "waits", early)).rows)
    assert (levels["P0"]["jobs"], levels["P0"]["started"], levels["P0"]["waiting"]) == (2, 0, 2)
    assert levels["P0"]["breaches"] == 1  # 60 s > 10 s; the other has waited 5 s
    assert levels["all"]["breaches"] == 1
    assert before_threshold["P0"]["breaches"] == 0


def test_compare_says_n_a_for_a_level_with_no_jobs_in_a_period() -> None:
    stats = {"mean": 40.0, "p50": 30.0, "p95": 90.0, "p99": 99.0, "max": 100.0}
    side = {"time_to_first_chunk": stats, "turnaround": stats}
    before = {
        "requests": 3,
        "all": side,
        "levels": {"P0": {"n": 1, **side, "breaches": 1}, "P1": {"n": 2, **side, "breaches": 0}},
    }
    after = {
        "requests": 2,
        "all": side,
        "levels": {"P0": {"n": 0, "breaches": 0}, "P1": {"n": 2, **side, "breaches": 0}},
    }
    report = compare_summaries(before, after)
    p0 = {row["metric"]: row for row in report.rows if row["scope"] == "P0"}
    assert p0["time_to_first_chunk_mean_s"] == {
        "scope": "P0",
        "metric": "time_to_first_chunk_mean_s",
        "before": 40.0,
        "after": None,
        "change_pct": None,
    }
    assert p0["breaches"]["after"] is None and p0["breaches"]["change_pct"] is None
    p1 = {row["metric"]: row for row in report.rows if row["scope"] == "P1"}
    assert p1["time_to_first_chunk_mean_s"]["change_pct"] == 0.0
    table, _ = render_report(report, "table")
    p0_line = next(
        line
        for line in table.splitlines()
        if line.startswith("P0 ") and "time_to_first_chunk_mean_s" in line
    )
    assert p0_line.split()[-2:] == ["n/a", "n/a"]
    assert "-100" not in table
    csv_rows = list(csv.DictReader(io.StringIO(render_report(report, "csv")[0])))
    assert {(row["after"], row["change_pct"]) for row in csv_rows if row["scope"] == "P0"} == {
        ("n/a", "n/a")
    }
    assert "P2" not in {row["scope"] for row in report.rows}  # no jobs on either side
