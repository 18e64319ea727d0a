"""`bot report NAME`: admin reports over the report views and functions of the migrations.

Reports only read, in read-only transactions, so they run under a role that can do nothing
else. Create it once (as the role that runs the migrations):

    CREATE ROLE review_bot_reader LOGIN PASSWORD 'change-me';
    GRANT CONNECT ON DATABASE reviewbot TO review_bot_reader;
    GRANT USAGE ON SCHEMA public TO review_bot_reader;
    GRANT SELECT ON ALL TABLES IN SCHEMA public TO review_bot_reader;  -- tables and views
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO review_bot_reader;
    ALTER ROLE review_bot_reader SET default_transaction_read_only = on;

then `DATABASE_URL=postgresql://review_bot_reader:change-me@db/reviewbot bot report waits`,
or `psql` with the same role: `SELECT * FROM report_waits_by_level;`.

Reports: waits, durations, workers, engines, repos, largest, commands, failures, alerts, and
`compare --before A --after B` where A and B are periods (`2026-01-05T08:00/2026-01-05T12:00`)
or JSON files written by `bot simulate --json`.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy.exc import ProgrammingError

from bot.clock import SystemClock
from bot.config import DEFAULTS, Settings
from bot.errors import ConfigError, ReviewBotError, StoreError
from bot.model import LEVELS, Level
from bot.queue.reports import STATEMENTS, ReportQueries
from bot.queue.store import QueueStore
from bot.stats import profile_verdict

SUCCESS_REDUCTION = 0.5  # the seed's success criterion: mean wait down at least 50%


class ReportError(ReviewBotError):
    """A report could not be built (unknown name, bad period, missing grant)."""


REPORT_NAMES: tuple[str, ...] = (*STATEMENTS, "compare")
# What each report shows, for `bot report -h`.
REPORT_HELP: Mapping[str, str] = {
    "waits": "per level: count, started, still waiting, mean, P50/P95/P99, max, breaches "
    "(jobs that started after their level's alert threshold, or still wait past it)",
    "durations": "service time P50/P95/P99, P99/P50 and stddev/mean, and what they mean for "
    "scheduling",
    "workers": "throughput and utilization per worker and hour",
    "engines": "chunks, tokens and engine seconds per LLM server and hour",
    "repos": "per repository, slowest first: reviews, wait, turnaround, GPU time, the largest",
    "largest": "the largest reviews by changed lines",
    "commands": "reprioritizations and slash commands, and who made them",
    "failures": "dead and failed jobs with their errors",
    "alerts": "wait alerts raised",
    "compare": "two periods (--before/--after FROM/TO) or two `bot simulate --json` outputs: "
    "did mean wait fall by 50%?",
}


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """Filters and knobs shared by every report."""

    since: datetime | None = None
    until: datetime | None = None
    repo: str | None = None
    thresholds: Mapping[Level, float] = field(
        default_factory=lambda: dict(DEFAULTS.alerts.threshold_s)
    )
    slots: int = DEFAULTS.scheduler.workers
    limit: int = 1000
    # When "still waiting" is judged: the window's end if earlier; the caller's clock.
    now: datetime | None = None

    def as_of(self) -> datetime | None:
        """The moment a job still waiting is measured at: the window's end or now."""
        if self.until is None or self.now is None:
            return self.until or self.now
        return min(self.until, self.now)


@dataclass(frozen=True, slots=True)
class Report:
    """Rows of one report, plus lines of interpretation."""

    name: str
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    missing: str = ""  # how a cell with no value reads in a table or CSV


def parse_time(value: str) -> datetime:
    """An ISO 8601 time (UTC when no offset is given); raises ReportError."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise ReportError(f"not an ISO 8601 time: {value!r}") from exc
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def parse_period(value: str) -> tuple[datetime, datetime]:
    """`START/END` in ISO 8601; raises ReportError."""
    start, sep, end = value.partition("/")
    if not sep:
        raise ReportError(f"not a period START/END: {value!r}")
    since, until = parse_time(start), parse_time(end)
    if until <= since:
        raise ReportError(f"period ends before it starts: {value!r}")
    return since, until


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def durations_verdict(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The seed's rule applied to the overall row of the durations report."""
    for row in rows:
        if row["level"] == "all" and row["p99_over_p50"] is not None:
            return profile_verdict(
                {
                    "p99_over_p50": float(row["p99_over_p50"]),
                    "stddev_over_mean": float(row["stddev_over_mean"] or 0.0),
                }
            )
    return None


def _parameters(options: ReportOptions) -> dict[str, Any]:
    return {
        "since": options.since,
        "until": options.until,
        "repo": options.repo,
        "t0": options.thresholds.get(Level.P0),
        "t1": options.thresholds.get(Level.P1),
        "t2": options.thresholds.get(Level.P2),
        "as_of": options.as_of(),
        "slots": max(1, options.slots),
        "limit": options.limit,
    }


async def build_report(reports: ReportQueries, name: str, options: ReportOptions) -> Report:
    """Run one named report; raises ReportError, StoreUnavailable or StoreError."""
    if name not in STATEMENTS:
        raise ReportError(f"unknown report {name!r}; choose from {', '.join(REPORT_NAMES)}")
    try:
        found = await reports.run(name, _parameters(options))
    except StoreError as exc:
        # The statement was refused (no such view, no grant): the role or the schema is wrong.
        if isinstance(exc.__cause__, ProgrammingError):
            raise ReportError(
                f"report {name} failed: {exc.__cause__.orig}; is the database migrated (bot db"
                " upgrade) and does the role have SELECT on the report views?"
            ) from exc.__cause__
        raise
    rows = [{key: _plain(value) for key, value in row._mapping.items()} for row in found]
    notes: list[str] = []
    if name == "durations":
        verdict = durations_verdict(rows)
        notes.append(
            f"recommendation: {verdict}" if verdict else "recommendation: no finished reviews"
        )
    if name == "workers":
        notes.append(
            f"utilization assumes {options.slots} slots per worker; rows without an hour "
            "cover the worker's whole window"
        )
    if name == "engines":
        notes.append(
            "gpu_s: engine seconds charged to the chunks (each its share of the batch it ran "
            "in), so tokens_per_gpu_s is what the engine made of its time"
        )
    return Report(name=name, rows=rows, notes=notes)


# --- compare ------------------------------------------------------------------------------


def summary_from_waits(rows: Sequence[Mapping[str, Any]], *, source: str) -> dict[str, Any]:
    """The waits report in the shape `bot simulate --json` writes."""

    def describe(row: Mapping[str, Any], kind: str) -> dict[str, float]:
        return {
            "mean": float(row[f"mean_{kind}_s"] or 0.0),
            "p50": float(row[f"p50_{kind}_s"] or 0.0),
            "p95": float(row[f"p95_{kind}_s"] or 0.0),
            "p99": float(row[f"p99_{kind}_s"] or 0.0),
            "max": float(row[f"max_{kind}_s"] or 0.0),
        }

    summary: dict[str, Any] = {"source": source, "requests": 0, "levels": {}}
    empty = {key: 0.0 for key in ("mean", "p50", "p95", "p99", "max")}
    summary["all"] = {"turnaround": dict(empty), "time_to_first_chunk": dict(empty)}
    for row in rows:
        entry = {
            "n": int(row["jobs"]),
            "turnaround": describe(row, "turnaround"),
            "time_to_first_chunk": describe(row, "wait"),
            "breaches": int(row["breaches"]),
        }
        if row["level"] == "all":
            summary["requests"] = entry["n"]
            summary["all"] = {
                "turnaround": entry["turnaround"],
                "time_to_first_chunk": entry["time_to_first_chunk"],
            }
            summary["breaches"] = entry["breaches"]
        else:
            summary["levels"][row["level"]] = entry
    return summary


def _change(before: float | None, after: float | None) -> float | None:
    """Percent change; None (shown "n/a") when a side has no value or nothing to compare to."""
    if before is None or after is None or before == 0:
        return None
    return round((after - before) / before * 100.0, 1)


def _has_jobs(side: Mapping[str, Any], *, requests: Any = None) -> bool:
    """Whether one side of a comparison saw jobs at this scope (a level with none has no wait)."""
    count = side.get("n", requests)
    return bool(side) and (count is None or int(count) > 0)


def compare_summaries(before: Mapping[str, Any], after: Mapping[str, Any]) -> Report:
    """Before/after rows per level and statistic, and whether mean wait fell by half.

    A scope with no jobs on one side shows "n/a" there, not a zero that reads as -100 %.
    """
    rows: list[dict[str, Any]] = []
    scopes: list[tuple[str, Mapping[str, Any], Mapping[str, Any], bool, bool]] = [
        (
            "all",
            before.get("all", {}),
            after.get("all", {}),
            _has_jobs(before.get("all", {}), requests=before.get("requests")),
            _has_jobs(after.get("all", {}), requests=after.get("requests")),
        )
    ]
    for level in LEVELS:
        name = str(level)
        old_level = before.get("levels", {}).get(name, {})
        new_level = after.get("levels", {}).get(name, {})
        scopes.append((name, old_level, new_level, _has_jobs(old_level), _has_jobs(new_level)))
    for scope, old, new, old_seen, new_seen in scopes:
        if not old_seen and not new_seen:
            continue
        for kind in ("turnaround", "time_to_first_chunk"):
            for statistic in ("mean", "p50", "p95", "p99", "max"):
                old_value = _statistic(old, kind, statistic) if old_seen else None
                new_value = _statistic(new, kind, statistic) if new_seen else None
                rows.append(
                    {
                        "scope": scope,
                        "metric": f"{kind}_{statistic}_s",
                        "before": old_value,
                        "after": new_value,
                        "change_pct": _change(old_value, new_value),
                    }
                )
        if "breaches" in old or "breaches" in new:
            old_breaches = float(old.get("breaches", 0)) if old_seen else None
            new_breaches = float(new.get("breaches", 0)) if new_seen else None
            rows.append(
                {
                    "scope": scope,
                    "metric": "breaches",
                    "before": old_breaches,
                    "after": new_breaches,
                    "change_pct": _change(old_breaches, new_breaches),
                }
            )
    old_mean = float(before.get("all", {}).get("time_to_first_chunk", {}).get("mean", 0.0))
    new_mean = float(after.get("all", {}).get("time_to_first_chunk", {}).get("mean", 0.0))
    notes = [success_verdict(old_mean, new_mean)]
    return Report(name="compare", rows=rows, notes=notes, missing="n/a")


def _statistic(side: Mapping[str, Any], kind: str, statistic: str) -> float:
    return round(float(side.get(kind, {}).get(statistic, 0.0)), 3)


def success_verdict(before_mean: float, after_mean: float) -> str:
    """The seed's criterion in one line: mean wait down at least 50%."""
    if before_mean <= 0:
        return f"mean wait {before_mean:.1f} s -> {after_mean:.1f} s: no wait before to reduce"
    reduction = 1.0 - after_mean / before_mean
    met = "MET" if reduction >= SUCCESS_REDUCTION else "NOT MET"
    return (
        f"mean wait {before_mean:.1f} s -> {after_mean:.1f} s: down {reduction:.0%} "
        f"(criterion: down at least {SUCCESS_REDUCTION:.0%}): {met}"
    )


def _is_file(value: str) -> bool:
    try:
        return Path(value).is_file()
    except OSError:
        return False


def read_summary_file(path: str) -> dict[str, Any]:
    """A summary written by `bot simulate --json`; raises ReportError."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: not a readable JSON summary: {exc}") from exc
    if not isinstance(data, dict) or "all" not in data:
        raise ReportError(f"{path}: not a `bot simulate --json` summary")
    data.setdefault("source", path)
    return data


async def load_side(
    value: str, *, reports_for: Callable[[], ReportQueries], options: ReportOptions
) -> dict[str, Any]:
    """A `bot simulate --json` file, or a period read from the database."""
    if _is_file(value):
        return read_summary_file(value)
    if "/" not in value:
        raise ReportError(f"{value!r} is neither a file nor a period START/END")
    since, until = parse_period(value)
    window = ReportOptions(
        since=since,
        until=until,
        repo=options.repo,
        thresholds=options.thresholds,
        slots=options.slots,
        limit=options.limit,
        now=options.now,
    )
    report = await build_report(reports_for(), "waits", window)
    return summary_from_waits(report.rows, source=value)


# --- output -------------------------------------------------------------------------------


def _cell(value: Any, missing: str = "") -> str:
    if value is None:
        return missing
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.0f}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def format_table(report: Report) -> str:
    """Aligned columns, then the notes."""
    lines: list[str] = []
    if report.rows:
        columns = list(report.rows[0])
        cells = [
            [_cell(row.get(column), report.missing) for column in columns] for row in report.rows
        ]
        widths = [
            max(len(column), *(len(line[index][:60]) for line in cells))
            for index, column in enumerate(columns)
        ]
        lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
        lines.append("  ".join("-" * w for w in widths))
        for line in cells:
            lines.append(
                "  ".join(c[:60].ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            )
    else:
        lines.append(f"({report.name}: no rows)")
    lines.extend(report.notes)
    return "\n".join(lines)


def format_csv(report: Report) -> str:
    """RFC 4180 CSV of the rows (notes are not data: the caller prints them elsewhere)."""
    buffer = io.StringIO()
    if report.rows:
        writer = csv.DictWriter(buffer, fieldnames=list(report.rows[0]), lineterminator="\n")
        writer.writeheader()
        for row in report.rows:
            writer.writerow(
                {
                    key: json.dumps(value)
                    if isinstance(value, dict | list)
                    else report.missing
                    if value is None
                    else value
                    for key, value in row.items()
                }
            )
    return buffer.getvalue()


def format_json(report: Report) -> str:
    return json.dumps({"report": report.name, "rows": report.rows, "notes": report.notes})


def render_report(report: Report, output_format: str) -> tuple[str, list[str]]:
    """The text for stdout, and lines for stderr (csv keeps its notes off the data)."""
    if output_format == "csv":
        return format_csv(report), list(report.notes)
    if output_format == "json":
        return format_json(report), []
    return format_table(report), []


# --- command ------------------------------------------------------------------------------


def options_from(args: argparse.Namespace, settings: Settings) -> ReportOptions:
    """Report options from the command line and settings; raises ReportError."""
    since = getattr(args, "since", None)
    until = getattr(args, "until", None)
    return ReportOptions(
        since=parse_time(since) if since else None,
        until=parse_time(until) if until else None,
        repo=getattr(args, "repo", None) or None,
        thresholds=dict(settings.alerts.threshold_s),
        slots=settings.scheduler.workers,
        now=SystemClock().now(),
    )


async def run_report(args: argparse.Namespace, settings: Settings) -> Report:
    """Build the report the arguments ask for; raises ConfigError, ReportError, StoreError."""
    name = str(args.name)
    options = options_from(args, settings)
    store: QueueStore | None = None

    def reports_for() -> ReportQueries:
        nonlocal store
        if not settings.database.url:
            raise ConfigError("DATABASE_URL is not set: reports read the queue database")
        if store is None:
            store = QueueStore.from_url(
                settings.database.url, pool_size=1, application_name="review-bot-report"
            )
        return store.reports

    try:
        if name == "compare":
            if not args.before or not args.after:
                raise ReportError("compare needs --before A and --after B")
            before = await load_side(args.before, reports_for=reports_for, options=options)
            after = await load_side(args.after, reports_for=reports_for, options=options)
            return compare_summaries(before, after)
        return await build_report(reports_for(), name, options)
    finally:
        if store is not None:
            await store.close()


def run_report_command(args: argparse.Namespace, settings: Settings) -> int:
    """The `bot report` command: prints the report, returns the exit status."""
    import sys

    report = asyncio.run(run_report(args, settings))
    output, notes = render_report(report, str(getattr(args, "format", "table") or "table"))
    sys.stdout.write(output if output.endswith("\n") or not output else output + "\n")
    for note in notes:
        print(note, file=sys.stderr)
    return 0


__all__ = [
    "REPORT_HELP",
    "REPORT_NAMES",
    "Report",
    "ReportError",
    "ReportOptions",
    "build_report",
    "compare_summaries",
    "render_report",
    "run_report",
    "run_report_command",
    "success_verdict",
]
