"""The `bot` command line: serve, migrate, inspect the queue, simulate, report."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from bot.config import Settings, load_settings
from bot.errors import ConfigError, ReviewBotError
from bot.model import JobState

log = logging.getLogger("bot")


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Alembic announces each of its plugins at INFO on import: noise for every command.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _require_database(settings: Settings) -> str:
    if not settings.database.url:
        raise ConfigError(
            "DATABASE_URL is not set (e.g. postgresql://user@127.0.0.1:5432/reviewbot)"
        )
    return settings.database.url


def _command_db(args: argparse.Namespace, settings: Settings) -> int:
    from bot.db import current_head, downgrade_database, upgrade_database, wait_for_database

    url = _require_database(settings)
    if args.db_command in ("upgrade", "downgrade"):
        # A database that cannot be used is named before "migrating ..." is logged.
        asyncio.run(wait_for_database(url, wait_s=0, backoff_s=settings.database.outage_backoff_s))
    if args.db_command == "upgrade":
        revision = asyncio.run(upgrade_database(url, args.revision))
        print(f"database at {revision}")  # the current id of a revision named by an earlier one
    elif args.db_command == "downgrade":
        revision = asyncio.run(downgrade_database(url, args.revision))
        print(f"database at {revision}")
    else:
        print(current_head())
    return 0


def _command_check(args: argparse.Namespace, settings: Settings) -> int:
    from bot.clock import SystemClock
    from bot.db import create_engine
    from bot.queue.connector import Connector
    from bot.queue.guarantees import GuaranteeLimits, check_guarantees, render_guarantees

    limits = GuaranteeLimits(
        lease_s=settings.scheduler.lease_s,
        heartbeat_s=settings.scheduler.heartbeat_s,
        max_chunk_attempts=settings.queue.max_attempts,
    )

    async def run() -> Any:
        connector = Connector(
            create_engine(
                _require_database(settings), pool_size=1, application_name="review-bot-check"
            )
        )
        try:
            return await check_guarantees(connector, now=SystemClock().now(), limits=limits)
        finally:
            await connector.close()

    results = asyncio.run(run())
    print(render_guarantees(results))
    return 0 if all(result.holds for result in results) else 1


def _command_queue(args: argparse.Namespace, settings: Settings) -> int:
    from bot.queue import inspect
    from bot.queue.store import QueueStore

    async def run() -> Any:
        store = QueueStore.from_url(_require_database(settings), pool_size=1)
        try:
            if args.queue_command == "show":
                view = await inspect.load_job_view(store, args.job_id)
                return None if view is None else inspect.job_document(view)
            state = JobState(args.state) if args.state else None
            jobs = await store.list_jobs(state=state, limit=args.limit)
            return [inspect.listing_row(job) for job in jobs]
        finally:
            await store.close()

    result = asyncio.run(run())
    if result is None:
        print(f"bot: no job {args.job_id}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.queue_command == "show":
        print(inspect.render_job(result))
    else:
        print(inspect.render_listing(result))
    return 0


def _command_serve(args: argparse.Namespace, settings: Settings) -> int:
    from bot.serve import serve

    settings = settings.with_changes(
        web={"insecure_dev": settings.web.insecure_dev or args.insecure_dev}
    )
    if args.workers is not None:
        settings = settings.with_changes(scheduler={"workers": args.workers})
    from bot.runtime import run

    run(
        serve(
            settings,
            role=args.role,
            host=args.host,
            port=args.port,
            migrate=not args.no_migrate,
        )
    )
    return 0


def _command_settings(args: argparse.Namespace, settings: Settings) -> int:
    from bot.config import effective_values, markdown_table

    if args.markdown:
        sys.stdout.write(markdown_table())
    else:
        for name, value in effective_values(settings):
            print(f"{name}={value}")
    return 0


def _command_simulate(args: argparse.Namespace, settings: Settings) -> int:
    from bot.sim.replay import run_simulation_command

    return run_simulation_command(args, settings)


def _command_emulator(args: argparse.Namespace, settings: Settings) -> int:
    from bot.emulator import run_emulator
    from bot.emulator.hooks import HookTarget
    from bot.emulator.manage import PullSpecError

    hooks = None
    if args.bot_url:
        hooks = HookTarget(
            args.bot_url,
            github_secret=settings.forges.github_webhook_secret or "",
            gitlab_token=settings.forges.gitlab_webhook_token or "",
        )
    try:
        run_emulator(host=args.host, port=args.port, prs_file=args.prs, hooks=hooks)
    except PullSpecError as exc:
        raise ConfigError(f"--prs: {exc}") from exc
    return 0


def _command_trace(args: argparse.Namespace, settings: Settings) -> int:
    from bot.sim.shapes import run_trace_command

    return run_trace_command(args)


def _command_report(args: argparse.Namespace, settings: Settings) -> int:
    from bot.obs.reports import run_report_command

    return run_report_command(args, settings)


def _command_demo(args: argparse.Namespace, settings: Settings) -> int:
    from bot.demo import run_demo

    return run_demo(args, settings)


class _HelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default (when it has one); paragraphs of indented lines
    (lists in descriptions and epilogs) are kept as written, the others wrapped."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = text.split("\n\n")
        return "\n\n".join(
            paragraph
            if any(line.startswith("  ") for line in paragraph.splitlines())
            else "\n".join(
                textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
                for line in paragraph.splitlines()
            )
            for paragraph in paragraphs
        )

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "%(default)" in text
            or "default" in text
            or action.default in (None, False, argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


SERVE_ENVIRONMENT = """\
everything else comes from the environment (README, Configuration), chiefly:
  DATABASE_URL           the PostgreSQL the queue lives in
  GITHUB_WEBHOOK_SECRET  what GitHub deliveries are checked with
  GITLAB_WEBHOOK_TOKEN   what GitLab deliveries are checked with
  GITHUB_TOKEN           GitHub API token (or GITHUB_APP_ID and GITHUB_PRIVATE_KEY)
  GITHUB_API_URL         GitHub's API (default https://api.github.com)
  GITLAB_URL             GitLab (default https://gitlab.com), with GITLAB_TOKEN
  REVIEW_BOT_LLM         the LLM backend: openai, vllm or simulated
  REVIEW_BOT_LLM_URLS    the OpenAI-compatible servers (or one router)
  secrets may also come from a file named by NAME_FILE (Docker and Kubernetes secrets)."""


def build_parser() -> argparse.ArgumentParser:
    from bot.llm.batching import PROFILES
    from bot.obs.reports import REPORT_HELP, REPORT_NAMES
    from bot.sim.shapes import DEFAULT_SEED, DEFAULT_SHAPE, SHAPES, shapes_help
    from bot.sim.shapes import listing as described

    parser = argparse.ArgumentParser(
        prog="bot",
        description="review-bot: scheduled AI code review for GitHub and GitLab",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    subparsers = parser.add_subparsers(dest="command", required=True)

    class _Commands:
        """add_parser with this CLI's help formatter on every command."""

        def add_parser(self, name: str, **options: Any) -> argparse.ArgumentParser:
            options.setdefault("formatter_class", _HelpFormatter)
            return subparsers.add_parser(name, **options)

    commands = _Commands()

    db = commands.add_parser("db", help="database migrations")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="migrate up (default: to head)")
    upgrade.add_argument("revision", nargs="?", default="head")
    downgrade = db_commands.add_parser("downgrade", help="migrate down to REV (or base)")
    downgrade.add_argument("revision")
    db_commands.add_parser("head", help="print the newest migration revision")
    db.set_defaults(handler=_command_db)

    serve = commands.add_parser(
        "serve",
        help="run the webhook server and/or the dispatcher",
        description="Run the webhook server (web), the dispatcher, or both in one process.",
        epilog=SERVE_ENVIRONMENT,
    )
    serve.add_argument(
        "--role",
        choices=("web", "dispatcher", "all"),
        default="all",
        help="web: take webhooks, /admin, /metrics; dispatcher: run reviews; all: both",
    )
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on")
    serve.add_argument(
        "--workers",
        type=int,
        default=None,
        help="LLM worker slots of this dispatcher (default: $REVIEW_BOT_WORKERS, else 8)",
    )
    serve.add_argument(
        "--no-migrate",
        action="store_true",
        help="do not migrate the database at start (default: migrate, under an advisory lock)",
    )
    serve.add_argument(
        "--insecure-dev",
        action="store_true",
        help="accept unsigned webhooks when no secret is set, development only "
        "(default: $REVIEW_BOT_INSECURE_DEV, else off)",
    )
    serve.set_defaults(handler=_command_serve)

    settings_command = commands.add_parser(
        "settings",
        help="print the configuration the environment gives (exit 2 when it is invalid)",
        description="Print every setting as NAME=value (secrets as (set)), after checking the "
        "whole configuration; --markdown prints the README's table of variables instead.",
    )
    settings_command.add_argument(
        "--markdown", action="store_true", help="the README's configuration table"
    )
    settings_command.set_defaults(handler=_command_settings)

    queue = commands.add_parser("queue", help="inspect the queue")
    queue_commands = queue.add_subparsers(dest="queue_command", required=True)
    listing = queue_commands.add_parser("ls", help="list jobs, newest first")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("--state", choices=[state.value for state in JobState])
    listing.add_argument("--limit", type=int, default=100)
    show = queue_commands.add_parser("show", help="one job: history, reasons, errors, chunks")
    show.add_argument("job_id", type=int)
    show.add_argument("--json", action="store_true")
    queue.set_defaults(handler=_command_queue)

    check = commands.add_parser(
        "check", help="check the queue's guarantees in SQL; exit 1 when one is broken"
    )
    check.set_defaults(handler=_command_check)

    simulate = commands.add_parser(
        "simulate",
        help="replay a trace under a virtual clock",
        description="Replay a trace through the pipeline bot serve runs (real PostgreSQL: "
        "DATABASE_URL, else a throwaway one), with a virtual clock and the simulated LLM.",
    )
    simulate.add_argument(
        "--trace",
        metavar="FILE",
        help="a JSON-lines trace (default: a generated morning, the trace "
        f"`bot trace generate --shape {DEFAULT_SHAPE} --seed {DEFAULT_SEED}` writes)",
    )
    simulate.add_argument("--policy", choices=("fifo", "priority", "mlfq"), default="mlfq")
    simulate.add_argument(
        "--workers", type=int, default=None, help="GPU workers (default: the trace header's)"
    )
    simulate.add_argument(
        "--estimate",
        choices=("line", "learned"),
        default="line",
        help="a review's expected work: the line over changed lines (as bot serve), or "
        "learned per language, repository and pull request as the morning unfolds",
    )
    simulate.add_argument("--json", action="store_true", help="print the result as JSON")
    simulate.add_argument("--keep", action="store_true", help="keep the simulation database")
    simulate.add_argument(
        "--forge-budget",
        choices=("none", "github", "gitlab"),
        default="none",
        help="post through one installation's (github) or token's (gitlab) write budget, "
        "at the forge's documented limits: the turnaround then counts the posting wait",
    )
    simulate.add_argument(
        "--batching",
        metavar="PROFILE",
        choices=tuple(PROFILES),
        help="replay on batched engines under this cost model, against exclusive slots",
    )
    simulate.set_defaults(handler=_command_simulate)

    trace = commands.add_parser("trace", help="make traces for bot simulate")
    trace_commands = trace.add_subparsers(dest="trace_command", required=True)
    generate = trace_commands.add_parser(
        "generate",
        help="write a generated trace (JSON lines): a named shape, a seed, any parameter",
        formatter_class=_HelpFormatter,
        description="Write a synthetic trace of review requests; the same shape, settings and "
        "seed give the same file. The format is the one bot simulate reads (a header line, "
        "then one request per line).",
        epilog=f"shapes:\n{shapes_help()}\n\nexample:\n  bot trace generate --shape "
        "heavy-tail --seed 3 --set gitlab_share=0.5 --out heavy.jsonl\n"
        "  bot simulate --trace heavy.jsonl --policy mlfq",
    )
    generate.add_argument(
        "--shape", choices=tuple(SHAPES), default=DEFAULT_SHAPE, help="what kind of day (below)"
    )
    generate.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed")
    generate.add_argument(
        "--requests", type=int, default=None, help="number of requests (default: the shape's)"
    )
    generate.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a parameter of the shape (repeatable), e.g. duration_s=7200, "
        "large_share=0.2, hotfix_per_1000=50, gitlab_share=0.5, workers=16, "
        "repos=acme/a,acme/b (every field of bot.sim.trace.TraceShape)",
    )
    generate.add_argument("--out", metavar="FILE", help="write here (default: standard output)")
    trace.set_defaults(handler=_command_trace)

    emulator = commands.add_parser("emulator", help="run the GitHub/GitLab forge emulator")
    emulator.add_argument("--host", default="127.0.0.1", help="address to listen on")
    emulator.add_argument("--port", type=int, default=8900, help="port to listen on")
    emulator.add_argument(
        "--prs",
        metavar="FILE",
        help="also hold these PRs/MRs: a JSON list, object or lines (see POST /_emulator/prs)",
    )
    emulator.add_argument(
        "--bot-url",
        metavar="URL",
        help="send the webhooks of changes made through /_emulator/ to the bot at URL "
        "(e.g. http://127.0.0.1:8080), signed with GITHUB_WEBHOOK_SECRET / GITLAB_WEBHOOK_TOKEN "
        "(default: shown in the answers, not sent)",
    )
    emulator.set_defaults(handler=_command_emulator)

    report = commands.add_parser(
        "report",
        help="admin reports from the database",
        description="Print a report from the database (DATABASE_URL); reports only read.",
        epilog="reports:\n" + described({name: REPORT_HELP[name] for name in REPORT_NAMES}),
    )
    report.add_argument("name", choices=REPORT_NAMES, metavar="NAME", help="which report (below)")
    report.add_argument("--since", help="from this time, e.g. 2026-01-05T08:00 (UTC)")
    report.add_argument("--until", help="until this time (default: now)")
    report.add_argument("--repo", help="only this repository")
    report.add_argument(
        "--format", choices=("table", "csv", "json"), default="table", help="output format"
    )
    report.add_argument("--before", help="compare: the earlier period or simulation JSON")
    report.add_argument("--after", help="compare: the later period or simulation JSON")
    report.set_defaults(handler=_command_report)

    demo = commands.add_parser("demo", help="run the whole bot on embedded defaults")
    demo.add_argument(
        "--requests", type=int, default=200, help="webhooks to replay from the morning burst"
    )
    demo.add_argument("--speed", type=float, default=60.0, help="times faster than real time")
    demo.add_argument(
        "--llm",
        choices=("simulated", "vllm-cpu"),
        default="simulated",
        help="the simulated backend, or a real vLLM on the CPU (a handful of small PRs)",
    )
    demo.add_argument(
        "--long", action="store_true", help="print the whole waits report (default: mean, P95)"
    )
    demo.set_defaults(handler=_command_demo)

    from bot.eval.command import add_eval_parser

    add_eval_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    settings: Settings | None = None
    try:
        settings = load_settings()
        result: int = args.handler(args, settings)
        sys.stdout.flush()  # a closed pipe is found here, not at the interpreter's exit
        return result
    except BrokenPipeError:
        return closed_stdout()
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        talks_to_database = settings is not None and args.command in DATABASE_COMMANDS
        url = settings.database.url if talks_to_database and settings is not None else None
        message = error_line(exc, database_url=url)
        if message is None:
            raise
        print(f"bot: error: {message}", file=sys.stderr)
        return 2


# The commands that talk to DATABASE_URL and nothing else, so a refused connection is its.
DATABASE_COMMANDS = frozenset({"db", "queue", "check", "report", "simulate"})


def error_line(error: Exception, *, database_url: str | None) -> str | None:
    """The one line a command exits 2 with: a database that refused the connection or does
    not answer (named, its password masked), or one of our own errors; None for a bug."""
    from bot.database_url import masked_url
    from bot.db import connect_problem

    problem = connect_problem(error) if database_url else None
    if problem is not None and database_url:
        return f"database {masked_url(database_url)}: {problem.reason}"
    if isinstance(error, ReviewBotError):
        return str(error)
    return None


def closed_stdout() -> int:
    """Exit status 2 with one line on stderr, as for any command that cannot run as asked,
    when the reader of standard output went away: a report cut short is said, not silent.
    Python's recipe: point stdout at /dev/null so the flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    print(CLOSED_STDOUT, file=sys.stderr)
    return 2


CLOSED_STDOUT = "bot: error: standard output was closed before the command finished writing"
