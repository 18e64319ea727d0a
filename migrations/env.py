"""Alembic environment: runs migrations over the async engine the bot uses."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from bot.db import MIGRATION_LOCK_KEY, async_url, restamp_renumbered
from bot.queue.schema import metadata

config = context.config
target_metadata = metadata


def _database_url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL is not set: tell Alembic which database to migrate")
    return async_url(str(url))


def _run(connection: Connection) -> None:
    # Replicas that start together all migrate: the first takes this transaction-scoped lock
    # and migrates, the others wait here and then find the database already at head.
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    # Under the lock and in the migrating transaction: the first replica rewrites an id
    # stamped before the renumbering, the others find the current one.
    restamp_renumbered(connection)
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_online() -> None:
    engine = create_async_engine(_database_url())
    async with engine.connect() as conn:
        await conn.run_sync(_run)
        await conn.commit()
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    # bot.db runs Alembic in a worker thread, so this thread has no event loop of its own yet.
    asyncio.run(_run_online())
