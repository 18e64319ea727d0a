"""Start-up errors as a user meets them: the real `python -m bot`, one line on stderr, exit 2.

An invalid setting or a taken port stops `bot serve` before it migrates the database; a
database, role or address that cannot be used is named (password masked) by every command
that connects; a reader that closes standard output early ends a command the same way.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from bot.cli import CLOSED_STDOUT
from bot.database_url import database_url_with_name, plain_url
from bot.sim.shapes import generated_trace
from bot.sim.trace import dump_trace

REPO = Path(__file__).resolve().parents[2]


def bot(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot", *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_PROXY": "127.0.0.1,localhost", **env},
        cwd=REPO,
        timeout=60,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a command that exited 2, without a traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert lines[0].startswith("bot: error: "), lines[0]
    return lines[0]


async def has_schema(url: str) -> bool:
    connection = await asyncpg.connect(plain_url(url))
    try:
        return await connection.fetchval("SELECT to_regclass('alembic_version')") is not None
    finally:
        await connection.close()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port held by a socket that never listens: connecting to it is refused."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    try:
        yield held.getsockname()[1]
    finally:
        held.close()


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another server listens on."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


SECRETS = {"GITHUB_WEBHOOK_SECRET": "s3cret"}


@pytest.mark.parametrize(
    ("role", "environment", "said"),
    [
        ("all", {"REVIEW_BOT_WINDOW_FLOOR": "abc"}, "REVIEW_BOT_WINDOW_FLOOR must be an integer"),
        ("all", {"REVIEW_BOT_LLM": "bogus"}, "REVIEW_BOT_LLM must be one of"),
        ("dispatcher", {"REVIEW_BOT_LLM": "openai"}, "needs REVIEW_BOT_LLM_URLS"),
        ("web", {"GITHUB_WEBHOOK_SECRET": ""}, "refusing to accept unsigned webhooks"),
        ("all", {"REVIEW_BOT_POLICY_DIR": "/nonexistent"}, "default.yaml not found"),
    ],
)
async def test_an_invalid_setting_stops_serve_before_the_database_is_touched(
    empty_db_url: str, role: str, environment: dict[str, str], said: str
) -> None:
    done = bot(
        "serve",
        "--role",
        role,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        env={"DATABASE_URL": empty_db_url, **SECRETS, **environment},
    )
    assert said in one_error_line(done)
    assert not await has_schema(empty_db_url), "serve migrated before refusing the settings"


async def test_a_taken_port_stops_serve_before_the_database_is_touched(
    empty_db_url: str, taken_port: int
) -> None:
    done = bot(
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(taken_port),
        env={"DATABASE_URL": empty_db_url, **SECRETS},
    )
    line = one_error_line(done)
    assert line == f"bot: error: cannot listen on 127.0.0.1:{taken_port}: Address already in use"
    assert not await has_schema(empty_db_url)


async def test_a_taken_metrics_port_is_named_too(empty_db_url: str, taken_port: int) -> None:
    done = bot(
        "serve",
        "--role",
        "dispatcher",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        env={"DATABASE_URL": empty_db_url, "REVIEW_BOT_METRICS_PORT": str(taken_port)},
    )
    assert f"cannot listen on 127.0.0.1:{taken_port}" in one_error_line(done)
    assert not await has_schema(empty_db_url)


DATABASE_COMMANDS = [
    ("serve", "--host", "127.0.0.1", "--port", "0"),
    ("db", "upgrade"),
    ("queue", "ls"),
    ("report", "waits"),
    ("check",),
    ("simulate", "--trace", "TRACE"),
    ("demo", "--requests", "5"),
]


@pytest.mark.parametrize("command", DATABASE_COMMANDS, ids=lambda command: command[0])
def test_a_database_that_does_not_exist_is_named(
    pg_server: str, command: tuple[str, ...], tmp_path: Path
) -> None:
    trace = tmp_path / "small.jsonl"
    trace.write_text(dump_trace(generated_trace("small")), encoding="utf-8")
    url = database_url_with_name(pg_server, "no_such_db")
    arguments = [str(trace) if argument == "TRACE" else argument for argument in command]
    done = bot(*arguments, env={"DATABASE_URL": url, **SECRETS})
    assert one_error_line(done) == (
        f'bot: error: database {url}: database "no_such_db" does not exist'
    )


@pytest.mark.parametrize("command", DATABASE_COMMANDS[:2], ids=lambda command: command[0])
def test_a_role_that_does_not_exist_is_named_with_its_password_masked(
    pg_server: str, command: tuple[str, ...]
) -> None:
    url = make_url(pg_server).set(username="no_such_role", password="hunter2")
    done = bot(
        *command,
        env={"DATABASE_URL": url.render_as_string(hide_password=False), **SECRETS},
    )
    line = one_error_line(done)
    masked = url.render_as_string(hide_password=True)
    assert line == f'bot: error: database {masked}: role "no_such_role" does not exist'
    assert "hunter2" not in done.stderr + done.stdout


@pytest.mark.parametrize("command", DATABASE_COMMANDS[:3], ids=lambda command: command[0])
def test_an_address_where_nothing_listens_is_named(
    closed_port: int, command: tuple[str, ...]
) -> None:
    url = f"postgresql://bot:hunter2@127.0.0.1:{closed_port}/reviewbot"
    done = bot(
        *command,
        # serve waits this long for a database starting with it; here it does not wait.
        env={"DATABASE_URL": url, "REVIEW_BOT_DB_START_WAIT_S": "0", **SECRETS},
    )
    assert one_error_line(done) == (
        f"bot: error: database postgresql://bot:***@127.0.0.1:{closed_port}/reviewbot: "
        "nothing listens there (connection refused)"
    )


def test_serve_waits_for_the_database_then_names_it(closed_port: int) -> None:
    url = f"postgresql://bot@127.0.0.1:{closed_port}/reviewbot"
    done = bot(
        "serve",
        "--port",
        "0",
        env={
            "DATABASE_URL": url,
            "REVIEW_BOT_DB_START_WAIT_S": "0.3",
            "REVIEW_BOT_RETRY_BACKOFF_S": "0.05",
            **SECRETS,
        },
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"bot: error: database {url}: nothing listens there (connection refused) after 0.3 s"
    )


def closed_early(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command whose reader has gone before it writes (`bot ... | head -0`)."""
    with subprocess.Popen(
        [sys.executable, "-m", "bot", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        cwd=REPO,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        stderr = process.stderr.read()
        returncode = process.wait(timeout=60)
    return subprocess.CompletedProcess(process.args, returncode, "", stderr)


def test_a_closed_stdout_ends_settings_with_one_line_and_2() -> None:
    done = closed_early("settings", env={})
    assert (done.returncode, done.stderr) == (2, CLOSED_STDOUT + "\n")


def test_a_closed_stdout_ends_a_report_with_one_line_and_2(db_url: str) -> None:
    done = closed_early(
        "--log-level", "WARNING", "report", "waits", "--format", "csv", env={"DATABASE_URL": db_url}
    )
    assert (done.returncode, done.stderr) == (2, CLOSED_STDOUT + "\n")
