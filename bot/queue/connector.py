"""How the bot reaches PostgreSQL: transactions, autocommit statements, read-only snapshots,
NOTIFY and LISTEN, its errors.

The store's parts (bot/queue/jobs.py, chunks.py, history.py), monitoring (bot/obs), the status
publisher (bot/status), the dispatchers' presence and the write budget decide what to run; the
connector only runs it, and translates driver errors into the store's own at this one edge.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.engine import URL, Row
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bot.database_url import plain_url
from bot.db import translate_database_error
from bot.errors import StoreUnavailable
from bot.queue.sql.connection import NOTIFY, PING, READ_ONLY_SNAPSHOT, WAKE_CHANNELS
from bot.queue.wakeups import Wakeups

QUEUE_CHANNEL = "review_bot_queue"  # wakes the dispatchers
COMMAND_CHANNEL = "review_bot_commands"  # wakes the command worker (bot.commands.worker)
# Wakes the status publisher: a trigger on review_jobs NOTIFYs it on every state change, and
# intake wakes it after a new job commits (bot/queue/wakeups.py says why not in the insert).
STATUS_CHANNEL = "review_bot_status"


# How long opening a LISTEN connection may take before the caller polls instead.
LISTEN_CONNECT_TIMEOUT_S = 10.0


@contextmanager
def database_errors() -> Iterator[None]:
    """Translate driver errors at the adapter edge into the store's own errors."""
    try:
        yield
    except (SQLAlchemyError, OSError, ConnectionError) as exc:
        raise translate_database_error(exc) from exc


def to_json(value: Any) -> str:
    """Compact JSON for a jsonb parameter (times and other values as their text)."""
    return json.dumps(value, separators=(",", ":"), default=str)


def listen_dsn(url: URL) -> str:
    """The engine's URL as asyncpg.connect reads it: `ssl` back to libpq's `sslmode` (a query
    parameter asyncpg.connect does not know would reach the server as a setting)."""
    query = dict(url.query)
    if "ssl" in query and "sslmode" not in query:
        query["sslmode"] = query.pop("ssl")
    return plain_url(url.set(query=query).render_as_string(hide_password=False))


class Listener:
    """A LISTEN on its own connection (LISTEN needs one that stays open, outside the pool)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def is_closed(self) -> bool:
        """True once the server closed the connection (a restart): listen again."""
        return bool(self._connection.is_closed())

    async def close(self) -> None:
        if not self._connection.is_closed():
            await self._connection.close()


class DriverRow:
    """A row the driver returned, read as SQLAlchemy's Row is: `row.name` or `row._mapping`."""

    __slots__ = ("_mapping",)

    def __init__(self, record: Mapping[str, Any]) -> None:
        self._mapping = record

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


class Connector:
    """One engine, used three ways: transactions, single statements in autocommit, and the
    queue's hottest single statements straight on the driver (`run_on_driver`)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._read_only = engine.execution_options(postgresql_readonly=True)
        self.wakeups = Wakeups(self._send_wakeups)
        self._wake_connection: Any = None
        self._driver_sql: dict[int, tuple[str, tuple[str, ...]]] = {}
        # Called with the SQL and arguments of each statement run on the driver, before it is
        # sent (SQLAlchemy's before_cursor_execute does not see them): a profile reads there
        # what the store sends.
        self.driver_observers: list[Callable[[str, Sequence[Any]], None]] = []

    async def close(self) -> None:
        await self.wakeups.drain()
        if self._wake_connection is not None and not self._wake_connection.is_closed():
            await self._wake_connection.close()
        await self.engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A transaction; connection failures become StoreUnavailable, others StoreError."""
        with database_errors():
            async with self.engine.begin() as conn:
                yield conn

    @asynccontextmanager
    async def single_statement(self) -> AsyncIterator[AsyncConnection]:
        """A connection in autocommit: one statement is one durable transaction, no BEGIN."""
        with database_errors():
            async with self._autocommit.connect() as conn:
                yield conn

    async def run_on_driver(
        self, statement: TextClause, params: Mapping[str, Any]
    ) -> list[DriverRow]:
        """One statement in autocommit, run by asyncpg itself on a pooled connection.

        For the statements every review and every chunk runs (intake, planning, the dequeue,
        finishing a chunk): SQLAlchemy's execution costs about twice the client CPU of the
        driver's (bench/queue_throughput.py, client CPU per phase), and the queue's client
        shares the machine with PostgreSQL. The same SQL (compiled once by the engine's
        dialect), the same pool, session settings and type codecs; errors are translated as
        everywhere else.
        """
        import asyncpg

        sql, names = self._compiled_for_driver(statement)
        args = [params[name] for name in names]
        for observe in self.driver_observers:
            observe(sql, args)
        with database_errors():
            async with self._autocommit.connect() as conn:
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver is not None  # a checked-out connection has its driver's
                try:
                    records = await driver.fetch(sql, *args)
                except (asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                    error = translate_database_error(exc)
                    if isinstance(error, StoreUnavailable):
                        await conn.invalidate()  # not handed out again
                    raise error from exc
                except asyncpg.InternalClientError as exc:
                    # The driver's protocol state is broken, as when the server ended the
                    # session while the connection sat in the pool ("another operation is in
                    # progress"): the connection is dropped, and this call failed for want of one.
                    await conn.invalidate()
                    raise StoreUnavailable(f"database connection broken: {exc}") from exc
        return [DriverRow(record) for record in records]

    def _compiled_for_driver(self, statement: TextClause) -> tuple[str, tuple[str, ...]]:
        """The statement as asyncpg takes it ($1, $2, ...) and its parameters' names in order."""
        found = self._driver_sql.get(id(statement))
        if found is None:
            compiled = statement.compile(dialect=self.engine.dialect)
            found = (compiled.string, tuple(compiled.positiontup or ()))
            self._driver_sql[id(statement)] = found
        return found

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[AsyncConnection]:
        """A read-only REPEATABLE READ transaction, rolled back at the end: reads judged
        together (`bot check`) see one state of the queue."""
        with database_errors():
            async with self.engine.connect() as conn:
                await conn.execute(READ_ONLY_SNAPSHOT)
                yield conn
                await conn.rollback()

    async def fetch_all(
        self, statement: TextClause, params: Mapping[str, Any] | None = None
    ) -> list[Row[Any]]:
        """Every row of one read, in autocommit."""
        async with self.single_statement() as conn:
            return list((await conn.execute(statement, dict(params or {}))).all())

    async def fetch_value(
        self, statement: TextClause, params: Mapping[str, Any] | None = None
    ) -> Any:
        """The first column of one read's first row (None without a row), in autocommit."""
        async with self.single_statement() as conn:
            return await conn.scalar(statement, dict(params or {}))

    async def fetch_read_only(
        self, statement: TextClause, params: Mapping[str, Any] | None = None
    ) -> list[Row[Any]]:
        """Every row of one read in a READ ONLY transaction (reports: they may run under a
        role that can write, and still must not)."""
        with database_errors():
            async with self._read_only.connect() as conn:
                return list((await conn.execute(statement, dict(params or {}))).all())

    async def write(
        self, statement: TextClause, params: Mapping[str, Any] | None = None
    ) -> list[Row[Any]]:
        """One write in its own transaction; the rows it returns (none without RETURNING)."""
        async with self.transaction() as conn:
            result = await conn.execute(statement, dict(params or {}))
            return list(result.all()) if result.returns_rows else []

    async def notify(self, conn: AsyncConnection, channel: str, payload: str) -> None:
        """NOTIFY `channel` when `conn`'s transaction commits."""
        await conn.execute(NOTIFY, {"channel": channel, "payload": payload})

    def wake(self, *channels: str) -> None:
        """Wake `channels`' listeners after a commit, in a NOTIFY of its own sent in the
        background (coalesced: bot/queue/wakeups.py). Never raises for the database."""
        self.wakeups.wake(*channels)

    async def _send_wakeups(self, channels: tuple[str, ...]) -> None:
        """One statement NOTIFYing `channels`, on a connection of its own: the pool's are
        taken by the writers it follows, and an overflow connection would be opened for each
        send and closed after it."""
        import asyncpg

        try:
            if self._wake_connection is None or self._wake_connection.is_closed():
                self._wake_connection = await asyncpg.connect(
                    listen_dsn(self.engine.url), timeout=LISTEN_CONNECT_TIMEOUT_S
                )
            await self._wake_connection.execute(WAKE_CHANNELS, list(channels))
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if self._wake_connection is not None:
                self._wake_connection.terminate()
                self._wake_connection = None
            raise translate_database_error(exc, what="wake-up failed") from exc

    async def ping(self) -> None:
        """Check the database answers; raises StoreUnavailable."""
        async with self.transaction() as conn:
            await conn.execute(PING)

    async def listen(self, channel: str, callback: Callable[[], None]) -> Listener:
        """LISTEN on `channel`: `callback` runs on each NOTIFY, and once more when the server
        closes the connection (so the caller wakes and listens again). Raises StoreError
        (StoreUnavailable when the database cannot be reached)."""
        import asyncpg

        try:
            connection = await asyncpg.connect(
                listen_dsn(self.engine.url), timeout=LISTEN_CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise translate_database_error(exc, what="LISTEN failed") from exc
        try:
            await connection.add_listener(channel, lambda *_: callback())
            connection.add_termination_listener(lambda *_: callback())
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            connection.terminate()
            raise translate_database_error(exc, what="LISTEN failed") from exc
        return Listener(connection)
