"""Database URLs, engines and migrations."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bot.database_url import async_url, plain_url
from bot.errors import ConfigError

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def create_engine(
    url: str, *, pool_size: int = 10, application_name: str = "review-bot"
) -> AsyncEngine:
    """Create the async engine every store and report shares."""
    return create_async_engine(
        async_url(url),
        connect_args={"server_settings": {"application_name": application_name}},
        pool_size=pool_size,
        max_overflow=pool_size,
        # No pre-ping: it costs a round trip per checkout on the hot path; a dropped
        # connection is invalidated on its first error and the store answers StoreUnavailable.
        pool_recycle=1800,
        # Transactions always end in commit or rollback (engine.begin()), and single
        # statements run in autocommit, so the pool's rollback on check-in would only add
        # a round trip to every operation.
        pool_reset_on_return=None,
    )


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = url
    return config


async def upgrade_database(url: str, revision: str = "head") -> None:
    """Run migrations up to `revision`."""
    log.info("migrating database up to %s", revision, extra={"action": "db_upgrade"})
    await asyncio.to_thread(command.upgrade, alembic_config(url), revision)


async def downgrade_database(url: str, revision: str) -> None:
    """Run migrations down to `revision` (`base` removes everything)."""
    log.info("migrating database down to %s", revision, extra={"action": "db_downgrade"})
    await asyncio.to_thread(command.downgrade, alembic_config(url), revision)


def current_head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(
        alembic_config("postgresql://unused/none")
    ).get_current_head()
    if head is None:
        raise ConfigError("no migrations found")
    return head


__all__ = [
    "alembic_config",
    "async_url",
    "create_engine",
    "current_head",
    "downgrade_database",
    "plain_url",
    "upgrade_database",
]
