"""Migrations: up, down, up again on an empty database, and they match the models."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from bot.db import (
    MIGRATION_LOCK_KEY,
    async_url,
    current_head,
    downgrade_database,
    plain_url,
    upgrade_database,
)
from bot.queue.schema import metadata
from bot.queue.store import QueueSettings, QueueStore

TABLES = {"review_jobs", "review_chunks", "webhook_deliveries", "job_history"}


async def _tables(url: str) -> set[str]:
    conn = await asyncpg.connect(plain_url(url))
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    return {row["tablename"] for row in rows}


async def test_upgrade_downgrade_upgrade(empty_db_url: str) -> None:
    assert not (await _tables(empty_db_url)) & TABLES
    await upgrade_database(empty_db_url)
    assert await _tables(empty_db_url) >= TABLES
    await downgrade_database(empty_db_url, "base")
    assert not (await _tables(empty_db_url)) & TABLES
    await upgrade_database(empty_db_url)
    assert await _tables(empty_db_url) >= TABLES


async def test_migrations_match_models(db_url: str) -> None:
    engine = create_async_engine(async_url(db_url))

    def _diff(sync_conn):  # type: ignore[no-untyped-def]
        context = MigrationContext.configure(sync_conn, opts={"compare_type": True})
        return compare_metadata(context, metadata)

    async with engine.connect() as conn:
        differences = await conn.run_sync(_diff)
    await engine.dispose()
    assert differences == []


async def _waiting_advisory_locks(connection: asyncpg.Connection) -> int:
    """Sessions waiting for the migration lock (an advisory lock splits its key in two)."""
    return int(
        await connection.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND ((classid::bigint << 32) | objid::bigint) = $1"
            # pg_locks is the whole server's: other tests' databases migrate beside this one.
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            MIGRATION_LOCK_KEY,
        )
    )


async def test_migrations_wait_for_the_advisory_lock(empty_db_url: str) -> None:
    """A replica migrating holds the lock: another one starting waits, then finds head."""
    holder = await asyncpg.connect(plain_url(empty_db_url))
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        upgrading = asyncio.create_task(upgrade_database(empty_db_url))
        for _ in range(600):  # the upgrade runs in a thread on its own connection
            if await _waiting_advisory_locks(holder) or upgrading.done():
                break
            await asyncio.sleep(0.05)  # polling the server for a real thread; no virtual time
        assert await _waiting_advisory_locks(holder) == 1
        assert not upgrading.done()
        assert not (await _tables(empty_db_url)) & TABLES
        await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
        await upgrading
    finally:
        await holder.close()
    assert await _tables(empty_db_url) >= TABLES


async def _upgrade_as_three_replicas(url: str) -> list[str]:
    """Run `bot db upgrade` in three processes at once, as replicas starting together do;
    each one's standard error, after checking all three succeeded."""
    environment = {**os.environ, "DATABASE_URL": url}
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            "db",
            "upgrade",
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(3)
    ]
    errors = [err.decode() for _, err in [await process.communicate() for process in processes]]
    assert [process.returncode for process in processes] == [0, 0, 0], [
        error[-2000:] for error in errors
    ]
    return errors


async def test_replicas_migrating_together_all_succeed(empty_db_url: str) -> None:
    """Three processes run `bot db upgrade` at once, as replicas starting together do."""
    await _upgrade_as_three_replicas(empty_db_url)
    assert await _tables(empty_db_url) >= TABLES


async def test_fencing_migrations_keep_claims_in_flight(db_url: str) -> None:
    """Claims held while 0009/0010 run move from the jsonb into columns and back, unchanged."""
    await downgrade_database(db_url, "0008_status_outbox")
    conn = await asyncpg.connect(plain_url(db_url))
    try:
        job_id = await conn.fetchval(
            """
            INSERT INTO review_jobs (forge, repo, number, head_sha, base_level, level, state,
                                     dedupe_key, enqueued_at, last_progress_at, planned,
                                     chunks_total, request)
            VALUES ('github', 'acme/shop', 1, 'abc', 2, 2, 'running', 'k1', now(), now(), true,
                    1, jsonb_build_object('posting_by', 'poster-1',
                                          'posting_until', '2026-12-04T18:00:00+00:00',
                                          'title', 'kept'))
            RETURNING id
            """
        )
        await conn.execute(
            """
            INSERT INTO review_chunks (job_id, seq, level, state, available_at, lease_owner,
                                       lease_expires_at, attempts)
            VALUES ($1, 0, 2, 'running', now(), 'w-1', now(), 2)
            """,
            job_id,
        )
        await upgrade_database(db_url, "0009_fencing")
        row = await conn.fetchrow("SELECT * FROM review_jobs WHERE id = $1", job_id)
        assert row["posting_by"] == "poster-1" and row["posting_attempt"] == 1
        assert row["posting_until"].isoformat() == "2026-12-04T18:00:00+00:00"
        assert row["planning_by"] is None and row["planning_attempt"] == 0
        chunk = await conn.fetchrow("SELECT * FROM review_chunks WHERE job_id = $1", job_id)
        assert chunk["lease_attempt"] == 2 and chunk["lease_owner"] == "w-1"
        await upgrade_database(db_url)
        request = json.loads(
            await conn.fetchval("SELECT request FROM review_jobs WHERE id = $1", job_id)
        )
        assert request == {"title": "kept"}
        await downgrade_database(db_url, "0008_status_outbox")
        request = json.loads(
            await conn.fetchval("SELECT request FROM review_jobs WHERE id = $1", job_id)
        )
        assert request["posting_by"] == "poster-1" and request["title"] == "kept"
        assert datetime.fromisoformat(request["posting_until"]) == row["posting_until"]
        await upgrade_database(db_url)
    finally:
        await conn.close()


async def test_retry_column_migrations_keep_state_in_flight(db_url: str) -> None:
    """Retry times, failed tries and command claims held while 0015/0016 run move from the
    jsonb into columns, are read from there by the store, and go back on a downgrade."""
    await downgrade_database(db_url, "0014_review_costs")
    conn = await asyncpg.connect(plain_url(db_url))
    retry_at = datetime.fromisoformat("2026-12-04T18:00:00+00:00")
    try:
        job_id = await conn.fetchval(
            """
            INSERT INTO review_jobs (forge, repo, number, head_sha, base_level, level, state,
                                     dedupe_key, enqueued_at, last_progress_at, request)
            VALUES ('github', 'acme/shop', 1, 'abc', 2, 2, 'queued', 'k1', now(), now(),
                    jsonb_build_object('retry_at', '2026-12-04T18:00:00+00:00',
                                       'planning_attempts', 2, 'title', 'kept'))
            RETURNING id
            """
        )
        claimed = await conn.fetchval(
            """
            INSERT INTO webhook_deliveries (delivery_id, forge, event, received_at, outcome,
                                            detail)
            VALUES ('d-1', 'github', 'issue_comment', '2026-12-04T17:00:00+00:00',
                    'command_running',
                    jsonb_build_object('claimed_by', 'commands-1',
                                       'claimed_at', '2026-12-04T17:00:05+00:00',
                                       'attempts', 3, 'repo', 'acme/shop'))
            RETURNING id
            """
        )
        deferred = await conn.fetchval(
            """
            INSERT INTO webhook_deliveries (delivery_id, forge, event, received_at, outcome,
                                            detail)
            VALUES ('d-2', 'github', 'issue_comment', '2026-12-04T17:00:00+00:00',
                    'command_reply_pending',
                    jsonb_build_object('claimed_by', 'commands-1', 'attempts', 1,
                                       'retry_at', '2026-12-04T18:00:00+00:00',
                                       'outbox', jsonb_build_array()))
            RETURNING id
            """
        )
        await upgrade_database(db_url, "0015_retry_columns")
        job = await conn.fetchrow("SELECT * FROM review_jobs WHERE id = $1", job_id)
        assert (job["retry_at"], job["planning_failures"], job["posting_failures"]) == (
            retry_at,
            2,
            0,
        )
        row = await conn.fetchrow("SELECT * FROM webhook_deliveries WHERE id = $1", claimed)
        assert (row["claimed_by"], row["claim_attempt"], row["retry_at"]) == ("commands-1", 3, None)
        assert row["claimed_at"] == datetime.fromisoformat("2026-12-04T17:00:05+00:00")
        row = await conn.fetchrow("SELECT * FROM webhook_deliveries WHERE id = $1", deferred)
        assert (row["claim_attempt"], row["retry_at"]) == (1, retry_at)
        await upgrade_database(db_url)
        request = json.loads(
            await conn.fetchval("SELECT request FROM review_jobs WHERE id = $1", job_id)
        )
        assert request == {"title": "kept"}
        detail = json.loads(
            await conn.fetchval("SELECT detail FROM webhook_deliveries WHERE id = $1", claimed)
        )
        assert detail == {"repo": "acme/shop"}

        store = QueueStore.from_url(db_url, settings=QueueSettings(notify=False))
        try:
            early = await store.fetch_unplanned_jobs(now=retry_at - timedelta(seconds=1))
            [due] = await store.fetch_unplanned_jobs(now=retry_at)
            assert not early and due.id == job_id and due.planning_failures == 2
            taken = await store.commands.claim_pending_commands(
                owner="commands-2", now=retry_at, limit=10, lease_s=60, max_age_s=86400
            )
            assert {(item.id, item.attempts) for item in taken} == {(claimed, 4), (deferred, 2)}
        finally:
            await store.close()

        await downgrade_database(db_url, "0014_review_costs")
        request = json.loads(
            await conn.fetchval("SELECT request FROM review_jobs WHERE id = $1", job_id)
        )
        assert request["planning_attempts"] == 2 and request["title"] == "kept"
        assert datetime.fromisoformat(request["retry_at"]) == retry_at
        detail = json.loads(
            await conn.fetchval("SELECT detail FROM webhook_deliveries WHERE id = $1", claimed)
        )
        assert (detail["claimed_by"], detail["attempts"], detail["repo"]) == (
            "commands-2",
            4,
            "acme/shop",
        )
        await upgrade_database(db_url)
    finally:
        await conn.close()


# What the migrations built, one query per kind of object in the public schema; views and
# functions (the SQL reports) included, which the models do not describe.
SCHEMA_QUERIES = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, column_default
        FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2
    """,
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2
    """,
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
    "views": "SELECT viewname, definition FROM pg_views WHERE schemaname = 'public' ORDER BY 1",
    "functions": """
        SELECT proname, pg_get_function_identity_arguments(oid), pg_get_functiondef(oid)
        FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND prokind = 'f'
        ORDER BY 1, 2
    """,
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid)
        FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2
    """,
    "revision": "SELECT version_num FROM alembic_version",
}


async def _schema(url: str) -> dict[str, list[tuple[Any, ...]]]:
    conn = await asyncpg.connect(plain_url(url))
    try:
        return {
            kind: [tuple(row) for row in await conn.fetch(query)]
            for kind, query in SCHEMA_QUERIES.items()
        }
    finally:
        await conn.close()


async def _stamp(url: str, revision: str) -> None:
    """Stamp the database as a deployment did before the migrations were renumbered."""
    conn = await asyncpg.connect(plain_url(url))
    try:
        await conn.execute("UPDATE alembic_version SET version_num = $1", revision)
    finally:
        await conn.close()


def _restamps(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if getattr(record, "action", None) == "db_restamp"
    ]


async def test_database_at_head_stamped_with_its_earlier_id_upgrades(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database at the last renumbered migration (0016, once 0026), stamped with its earlier
    id, is restamped with the current id once, runs only the migrations added since, and
    still goes down and up to named targets, current ones or earlier ones."""
    fresh = await _schema(db_url)
    assert fresh["revision"] == [(current_head(),)] == [("0018_budget_claim_deferred",)]
    await downgrade_database(db_url, "0016_retry_columns_contract")
    await _stamp(db_url, "0026_retry_columns_contract")
    with caplog.at_level(logging.INFO, logger="bot.db"):
        await upgrade_database(db_url)
        await upgrade_database(db_url)
    assert _restamps(caplog) == [
        "database stamped 0026_retry_columns_contract under the migrations' earlier numbering:"
        " now 0016_retry_columns_contract"
    ]
    assert await _schema(db_url) == fresh

    assert await downgrade_database(db_url, "0014_review_costs") == "0014_review_costs"
    assert (await _schema(db_url))["revision"] == [("0014_review_costs",)]
    assert await upgrade_database(db_url, "0015_retry_columns") == "0015_retry_columns"
    # A runbook written before the renumbering names its targets by their earlier ids.
    assert await downgrade_database(db_url, "0024_review_costs") == "0014_review_costs"
    assert (await _schema(db_url))["revision"] == [("0014_review_costs",)]
    assert (
        await upgrade_database(db_url, "0026_retry_columns_contract")
        == "0016_retry_columns_contract"
    )
    assert await upgrade_database(db_url) == "head"
    assert await _schema(db_url) == fresh


async def test_database_mid_chain_stamped_with_its_earlier_id_upgrades(
    empty_db_url: str, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database migrated up to operations (once 0013_operations, the seventh migration that
    ran) and stamped with that earlier id runs the rest of the chain to the same schema as a
    database migrated from empty."""
    await upgrade_database(empty_db_url, "0007_operations")
    await _stamp(empty_db_url, "0013_operations")
    with caplog.at_level(logging.INFO, logger="bot.db"):
        await upgrade_database(empty_db_url)
    assert _restamps(caplog) == [
        "database stamped 0013_operations under the migrations' earlier numbering:"
        " now 0007_operations"
    ]
    assert await _schema(empty_db_url) == await _schema(db_url)


async def test_replicas_restamping_together_all_succeed(empty_db_url: str, db_url: str) -> None:
    """Three replicas start together on a database stamped before the renumbering: the first
    restamps it under the migration lock and migrates, the others find it at head."""
    await upgrade_database(empty_db_url, "0008_status_outbox")
    await _stamp(empty_db_url, "0018_status_outbox")
    errors = await _upgrade_as_three_replicas(empty_db_url)
    assert sum("earlier numbering" in error for error in errors) == 1, errors
    assert await _schema(empty_db_url) == await _schema(db_url)
