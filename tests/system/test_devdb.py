"""Provisioning PostgreSQL where none is configured: the throwaway cluster and pgserver paths."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from bot import devdb


def test_database_url_is_used_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql+asyncpg://bot@db.example:5433/reviews")
    with devdb.provision_server() as url:
        assert url == "postgresql://bot@db.example:5433/reviews"


@pytest.mark.parametrize("scheme", ["postgres", "postgresql+psycopg"])
def test_database_url_is_named(monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    monkeypatch.setenv("DATABASE_URL", f"{scheme}://bot:secret@db.example:5433/reviews")
    with devdb.provision() as server:
        assert server.url == "postgresql://bot:secret@db.example:5433/reviews"
        assert server.description == "the server of DATABASE_URL (db.example:5433)"


def test_provision_names_the_throwaway_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no DATABASE_URL and nothing on the local port, a throwaway cluster, named so."""
    if not (devdb._find_binary("initdb") and devdb._find_binary("pg_ctl")):
        pytest.skip("initdb/pg_ctl are not installed here")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with devdb.provision(local_port=devdb._free_port()) as server:
        assert server.description.startswith("a throwaway cluster made with ")
        assert "embedded" not in server.description
        asyncio.run(devdb._check(server.url))


def test_throwaway_cluster_from_initdb_and_pg_ctl() -> None:
    initdb, pg_ctl = devdb._find_binary("initdb"), devdb._find_binary("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("initdb/pg_ctl are not installed here")
    with devdb._throwaway_cluster(initdb, pg_ctl) as url:
        asyncio.run(devdb._check(url))
        data_url = devdb.database_url(url, "other")
        assert data_url.endswith("/other")


@pytest.mark.skipif(
    importlib.util.find_spec("pgserver") is None,
    reason="pgserver is not installed (bot.devdb installs it only when nothing else exists)",
)
def test_pgserver_cluster() -> None:
    with devdb._pgserver_cluster() as url:
        asyncio.run(devdb._check(url))
