"""Database URLs, engines and migrations."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from alembic import command
from alembic.config import Config
from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bot.config import DEFAULTS
from bot.database_url import async_url, masked_url, plain_url
from bot.errors import ConfigError, StoreError, StoreUnavailable
from bot.migration_ids import RENUMBERED, renumbered
from bot.outage import OutageWatch

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
# The PostgreSQL advisory lock every migration run holds (migrations/env.py): "revbotmg".
MIGRATION_LOCK_KEY = int.from_bytes(b"revbotmg", "big")


@dataclass(frozen=True, slots=True)
class SessionTimeouts:
    """Limits every session of the bot runs under, so no connection holds others hostage: a
    process paused inside a transaction loses it (and its locks) after
    `idle_in_transaction_s`; a statement waits at most `lock_s` for a lock and runs at most
    `statement_s`. Zero turns a limit off."""

    statement_s: float = DEFAULTS.database.statement_timeout_s
    lock_s: float = DEFAULTS.database.lock_timeout_s
    idle_in_transaction_s: float = DEFAULTS.database.idle_in_transaction_timeout_s

    def server_settings(self) -> dict[str, str]:
        """The limits as PostgreSQL session settings (milliseconds)."""
        return {
            "statement_timeout": str(round(self.statement_s * 1000)),
            "lock_timeout": str(round(self.lock_s * 1000)),
            "idle_in_transaction_session_timeout": str(round(self.idle_in_transaction_s * 1000)),
        }


def create_engine(
    url: str,
    *,
    pool_size: int = 10,
    application_name: str = "review-bot",
    timeouts: SessionTimeouts | None = None,
) -> AsyncEngine:
    """Create the async engine every store and report shares, its sessions under `timeouts`."""
    server_settings = {
        "application_name": application_name,
        **(timeouts or SessionTimeouts()).server_settings(),
    }
    engine = create_async_engine(
        async_url(url),
        connect_args={"server_settings": server_settings},
        pool_size=pool_size,
        max_overflow=pool_size,
        # No pre-ping: the driver pings inside a transaction, three round trips (BEGIN, ping,
        # ROLLBACK) on every checkout where a dequeue needs one. Connections the server
        # closed are replaced on checkout instead, at no round trip (_replace_closed).
        pool_pre_ping=False,
        pool_recycle=1800,
        # Transactions always end in commit or rollback (engine.begin()), and single
        # statements run in autocommit, so the pool's rollback on check-in would only add
        # a round trip to every operation.
        pool_reset_on_return=None,
    )
    event.listen(engine.sync_engine.pool, "checkout", _replace_closed)
    return engine


def _replace_closed(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Hand out no pooled connection the server has closed, at no round trip.

    A restart (or pg_terminate_backend) ends every session with an error and closes its
    socket; the driver sees the close as it happens, so a dead pooled connection is known
    before it is used. Without this each one would fail one operation ("connection is
    closed") before being replaced. The pool replaces a connection refused here.
    """
    if dbapi_connection.driver_connection.is_closed():
        raise sa_exc.DisconnectionError("pooled connection closed by the server")


# SQLSTATEs that say the server is going away or not there yet, not that the query is wrong:
# class 08 is "connection exception"; 57P01 admin_shutdown ("terminating connection due to
# administrator command", a fast shutdown or restart), 57P02 crash_shutdown, 57P03
# cannot_connect_now ("the database system is shutting down" / "is starting up"), 53300
# too_many_connections.
UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})
# The same conditions as the drivers word them when no SQLSTATE travels with the error
# (asyncpg's InterfaceError for a connection the server closed, errors raised on connect).
UNAVAILABLE_MESSAGES = (
    "connection is closed",
    "connection was closed",
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "terminating connection due to administrator command",
    "connection refused",
)


def is_database_unavailable(error: BaseException) -> bool:
    """True when `error` means the database cannot be reached now (an outage, a restart, a
    network fault), as opposed to a statement that would fail again on a healthy server."""
    for current in error_chain(error):
        if isinstance(current, OSError | ConnectionError | sa_exc.TimeoutError):
            return True  # refused, reset, unreachable; or the pool waited in vain
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(current, sa_exc.InterfaceError | sa_exc.OperationalError):
            return True
        sqlstate = getattr(current, "sqlstate", None)
        if isinstance(sqlstate, str) and (
            sqlstate.startswith("08") or sqlstate in UNAVAILABLE_SQLSTATES
        ):
            return True
        if type(current).__module__.startswith("asyncpg") and (
            type(current).__name__ == "ConnectionDoesNotExistError"
        ):
            return True
        text = str(current).lower()
        if any(message in text for message in UNAVAILABLE_MESSAGES):
            return True
    return False


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what it wraps: SQLAlchemy's `orig`, else its cause or context; each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        origin = getattr(current, "orig", None)
        current = (
            origin
            if isinstance(origin, BaseException)
            else (current.__cause__ or current.__context__)
        )


# SQLSTATEs of a connection refused for good: no such database (invalid_catalog_name), no such
# role or not allowed by pg_hba.conf (invalid_authorization_specification), a wrong password.
REFUSED_SQLSTATES = frozenset({"3D000", "28000", "28P01"})


class ConnectProblem(NamedTuple):
    """Why a connection failed, in one line; `lasting` when waiting will not help."""

    reason: str
    lasting: bool


def connect_problem(error: BaseException) -> ConnectProblem | None:
    """What a failed connection says is wrong with the database or its address: the server's
    own words when it refused the database, role or password (lasting), or that nothing
    answers there (passing: it may be starting); None for any other error."""
    for current in error_chain(error):
        if getattr(current, "sqlstate", None) in REFUSED_SQLSTATES:
            return ConnectProblem(first_line(current), lasting=True)
        if isinstance(current, ConnectionRefusedError):
            return ConnectProblem("nothing listens there (connection refused)", lasting=False)
        if isinstance(current, socket.gaierror):
            return ConnectProblem(f"unknown host ({current.strerror})", lasting=False)
    return None


def first_line(error: BaseException) -> str:
    """An error's message up to its first line break (drivers append background notes)."""
    return (str(error).splitlines() or [type(error).__name__])[0]


UNDEFINED_TABLE = "42P01"


def translate_database_error(error: BaseException, *, what: str = "database error") -> StoreError:
    """Our error for a driver error: StoreUnavailable for outages, a clear StoreError for a
    database without the schema, StoreError (prefixed with `what`) for anything else."""
    if is_database_unavailable(error):
        origin = getattr(error, "orig", None)
        return StoreUnavailable(f"database unavailable: {origin or error}")
    origin = getattr(error, "orig", None)
    # SQLAlchemy wraps the driver's error (`orig`); a statement run on the driver raises it bare.
    if getattr(error if origin is None else origin, "sqlstate", None) == UNDEFINED_TABLE:
        return StoreError(
            "the database has no review-bot schema (or an old one): run `bot db upgrade`"
            f" ({origin})"
        )
    return StoreError(f"{what}: {error}")


async def wait_for_database(url: str, *, wait_s: float, backoff_s: float) -> None:
    """Return once the database takes a connection, waiting up to `wait_s` for one that does
    not answer yet (started together); raises ConfigError, naming the database, when it
    refuses for good (no such database or role) or did not answer in time."""
    engine = create_engine(url, pool_size=1, application_name="review-bot-start")
    outage = OutageWatch("start-up", base_s=backoff_s)
    deadline = asyncio.get_running_loop().time() + wait_s
    try:
        while True:
            try:
                async with engine.connect():
                    break
            except Exception as exc:
                problem = connect_problem(exc)
                if problem is None and is_database_unavailable(exc):
                    problem = ConnectProblem(first_line(exc), lasting=False)  # starting up
                if problem is None:
                    raise
                left = deadline - asyncio.get_running_loop().time()
                if problem.lasting or left <= 0:
                    waited = "" if problem.lasting or not wait_s else f" after {wait_s:g} s"
                    raise ConfigError(
                        f"database {masked_url(url)}: {problem.reason}{waited}"
                    ) from None
                await asyncio.sleep(min(outage.lost(exc), left))
    finally:
        await engine.dispose()
    outage.recovered()


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = url
    return config


def restamp_renumbered(connection: Connection) -> None:
    """Rewrite a revision the database is stamped with under the migrations' earlier numbering
    (bot.migration_ids) to its current id, which Alembic knows; the earlier one it would
    refuse as unknown. migrations/env.py calls this holding the migration lock, in the
    transaction that then migrates, so replicas starting together rewrite it once and a
    migration that fails leaves the database as it was."""
    if connection.execute(text("SELECT to_regclass('alembic_version')")).scalar() is None:
        return  # never migrated: nothing stamped
    stamped = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    for earlier in stamped:
        current = RENUMBERED.get(earlier)
        if current is None:
            continue
        connection.execute(
            text("UPDATE alembic_version SET version_num = :current WHERE version_num = :earlier"),
            {"current": current, "earlier": earlier},
        )
        log.info(
            "database stamped %s under the migrations' earlier numbering: now %s",
            earlier,
            current,
            extra={"action": "db_restamp"},
        )


def _target(revision: str) -> str:
    """`revision`, or its current id when it names a migration by its earlier number (as
    runbooks written before the renumbering do)."""
    target = renumbered(revision)
    if target != revision:
        log.info(
            "revision %s is %s since the migrations were renumbered",
            revision,
            target,
            extra={"action": "db_renumbered_target"},
        )
    return target


async def upgrade_database(url: str, revision: str = "head") -> str:
    """Run migrations up to `revision`; returns the revision migrated to (its current id)."""
    target = _target(revision)
    log.info("migrating database up to %s", target, extra={"action": "db_upgrade"})
    await asyncio.to_thread(command.upgrade, alembic_config(url), target)
    return target


async def downgrade_database(url: str, revision: str) -> str:
    """Run migrations down to `revision` (`base` removes everything); returns the revision
    migrated to (its current id)."""
    target = _target(revision)
    log.info("migrating database down to %s", target, extra={"action": "db_downgrade"})
    await asyncio.to_thread(command.downgrade, alembic_config(url), target)
    return target


def current_head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(
        alembic_config("postgresql://unused/none")
    ).get_current_head()
    if head is None:
        raise ConfigError("no migrations found")
    return head


__all__ = [
    "MIGRATION_LOCK_KEY",
    "alembic_config",
    "async_url",
    "create_engine",
    "current_head",
    "downgrade_database",
    "plain_url",
    "restamp_renumbered",
    "upgrade_database",
    "wait_for_database",
]
