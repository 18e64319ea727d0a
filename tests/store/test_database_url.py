"""Every PostgreSQL URL spelling works everywhere: settings, engines, asyncpg, tools, simulate."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from bot import devdb
from bot.cli import main
from bot.config import load_settings
from bot.database_url import async_url, normalize_database_url, plain_url
from bot.db import create_engine
from bot.errors import ConfigError
from bot.queue.store import QueueStore
from bot.sim.trace import TraceShape, dump_trace, generate_trace

SPELLINGS = ("postgresql", "postgres", "postgresql+asyncpg", "postgresql+psycopg")


def spelled(url: str, scheme: str) -> str:
    """`url` written with another scheme, as a user might configure it."""
    return scheme + "://" + url.split("://", 1)[1]


@pytest.mark.parametrize("scheme", SPELLINGS)
def test_every_spelling_normalizes_to_one_form(scheme: str) -> None:
    url = f"{scheme}://bot:s%40cret@db.example:5433/reviews"
    assert normalize_database_url(url) == "postgresql://bot:s%40cret@db.example:5433/reviews"
    assert plain_url(url) == normalize_database_url(url)
    assert async_url(url) == "postgresql+asyncpg://bot:s%40cret@db.example:5433/reviews"
    assert load_settings({"DATABASE_URL": url}).database.url == normalize_database_url(url)


@pytest.mark.parametrize(
    "url", ["mysql://bot@db/reviews", "sqlite:///reviews.db", "not a url", "postgresql://h:x/d"]
)
def test_anything_else_is_refused_naming_the_variable(url: str) -> None:
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        load_settings({"DATABASE_URL": url})


@pytest.mark.parametrize("scheme", SPELLINGS)
async def test_every_spelling_reaches_the_server(pg_server: str, scheme: str) -> None:
    """Creating a database, the engine, and a raw asyncpg connection all accept the spelling."""
    server = spelled(pg_server, scheme)
    name = devdb.unique_database_name("rbt_url")
    url = await devdb.create_database(server, name)
    try:
        assert make_url(url).database == name
        connection = await asyncpg.connect(plain_url(spelled(url, scheme)))
        try:
            assert await connection.fetchval("SELECT current_database()") == name
        finally:
            await connection.close()
        store = QueueStore.from_url(spelled(url, scheme), pool_size=1)
        try:
            async with store.engine.connect() as sql:
                assert (await sql.execute(text("SELECT current_database()"))).scalar() == name
        finally:
            await store.close()
    finally:
        await devdb.drop_database(server, name)


async def test_libpq_sslmode_reaches_the_engine(pg_server: str) -> None:
    """`?sslmode=` (libpq's spelling, what hosted PostgreSQL hands out) works for the engine too."""
    engine = create_engine(f"{pg_server}?sslmode=disable", pool_size=1)
    try:
        async with engine.connect() as sql:
            assert (await sql.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await engine.dispose()
    assert "ssl=require" in async_url("postgres://bot@db/reviews?sslmode=require")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["postgresql+asyncpg", "postgres"])
def test_simulate_with_a_driver_spelling(
    pg_server: str,
    scheme: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace_path = tmp_path / "small.jsonl"
    trace_path.write_text(
        dump_trace(generate_trace(TraceShape(requests=12, duration_s=600.0, peak_at_s=300.0)))
    )
    monkeypatch.setenv("DATABASE_URL", spelled(pg_server, scheme))
    assert main(["simulate", "--trace", str(trace_path), "--json", "--workers", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["completed"] == result["requests"] > 0


def test_the_url_may_come_from_a_secret_file(tmp_path: Path) -> None:
    secret = tmp_path / "database-url"
    secret.write_text("postgres://bot:pw@db:5432/reviewbot\n")
    settings = load_settings({"DATABASE_URL_FILE": str(secret)})
    assert settings.database.url == "postgresql://bot:pw@db:5432/reviewbot"
    # The variable itself wins over the file, as for every secret.
    both = load_settings({"DATABASE_URL": "postgresql://x@h/d", "DATABASE_URL_FILE": str(secret)})
    assert both.database.url == "postgresql://x@h/d"
    with pytest.raises(ConfigError, match=r"DATABASE_URL_FILE=.*missing"):
        load_settings({"DATABASE_URL_FILE": str(tmp_path / "missing")})
