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
