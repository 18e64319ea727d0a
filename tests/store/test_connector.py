"""The connector on real PostgreSQL: LISTEN woken by NOTIFY, by its connection's end, and a
database it cannot reach as the store's own error; statements run on the driver reading and
failing as through SQLAlchemy."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime

import asyncpg
import pytest

from bot.db import create_engine, plain_url
from bot.errors import StoreError, StoreUnavailable
from bot.queue.connector import COMMAND_CHANNEL, QUEUE_CHANNEL, Connector, to_json
from bot.queue.sql import statement


async def test_listen_wakes_on_notify_of_its_channel_only(db_url: str) -> None:
    connector = Connector(create_engine(db_url))
    woken = asyncio.Event()
    listener = await connector.listen(QUEUE_CHANNEL, woken.set)
    try:
        async with connector.transaction() as conn:
            await connector.notify(conn, COMMAND_CHANNEL, "other")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(woken.wait(), timeout=0.3)
        async with connector.transaction() as conn:
            await connector.notify(conn, QUEUE_CHANNEL, "submitted")
        await asyncio.wait_for(woken.wait(), timeout=5)
    finally:
        await listener.close()
        await connector.close()
    assert listener.is_closed()


async def test_a_listener_whose_connection_ends_wakes_its_caller(db_url: str) -> None:
    connector = Connector(create_engine(db_url, application_name="listener"))
    woken = asyncio.Event()
    listener = await connector.listen(QUEUE_CHANNEL, woken.set)
    admin = await asyncpg.connect(plain_url(db_url))
    try:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        await asyncio.wait_for(woken.wait(), timeout=5)
        assert listener.is_closed()
    finally:
        await admin.close()
        await listener.close()
        await connector.close()


async def test_listen_on_a_database_out_of_reach_raises_store_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])  # nothing listens once the socket is closed
    connector = Connector(create_engine(f"postgresql://nobody@127.0.0.1:{port}/none"))
    try:
        with pytest.raises(StoreUnavailable):
            await connector.listen(QUEUE_CHANNEL, lambda: None)
    finally:
        await connector.close()


PROBE = statement(
    "SELECT CAST(:n AS integer) AS n, CAST(:doc AS jsonb) AS doc, CAST(:at AS timestamptz) AS at,"
    " CAST(:levels AS smallint[]) AS levels, CAST(:n AS integer) + 1 AS next"
)


async def test_a_statement_run_on_the_driver_reads_as_through_sqlalchemy(db_url: str) -> None:
    connector = Connector(create_engine(db_url))
    params = {
        "n": 41,
        "doc": to_json({"files": ["a.py"]}),
        "at": datetime(2026, 1, 5, 9, 30, tzinfo=UTC),
        "levels": [0, 2],
    }
    try:
        [on_driver] = await connector.run_on_driver(PROBE, params)
        async with connector.single_statement() as conn:
            through_sqlalchemy = (await conn.execute(PROBE, params)).one()
    finally:
        await connector.close()
    assert dict(on_driver._mapping) == dict(through_sqlalchemy._mapping)
    assert on_driver.doc == {"files": ["a.py"]} and on_driver.next == 42
    with pytest.raises(AttributeError):
        _ = on_driver.missing


async def test_a_statement_run_on_the_driver_fails_with_the_stores_errors(db_url: str) -> None:
    connector = Connector(create_engine(db_url))
    try:
        with pytest.raises(StoreError, match="bot db upgrade"):
            await connector.run_on_driver(statement("SELECT * FROM no_such_table"), {})
        with pytest.raises(StoreError, match="division by zero") as refused:
            await connector.run_on_driver(statement("SELECT 1 / CAST(:n AS int)"), {"n": 0})
        assert not isinstance(refused.value, StoreUnavailable)
        # The connection that ran them is still good.
        assert (await connector.run_on_driver(PROBE_ONE, {}))[0].one == 1
    finally:
        await connector.close()


PROBE_ONE = statement("SELECT 1 AS one")


async def test_a_driver_connection_the_server_ended_is_not_used_twice(db_url: str) -> None:
    connector = Connector(create_engine(db_url, pool_size=1, application_name="driver-ended"))
    admin = await asyncpg.connect(plain_url(db_url))
    try:
        await connector.run_on_driver(PROBE_ONE, {})  # the pool holds one connection now
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'driver-ended'"
        )
        failures = 0
        for _ in range(2):
            try:
                assert (await connector.run_on_driver(PROBE_ONE, {}))[0].one == 1
                break
            except StoreUnavailable:
                failures += 1  # the end was not seen yet: this connection is dropped
        assert failures <= 1
        assert (await connector.run_on_driver(PROBE_ONE, {}))[0].one == 1
    finally:
        await admin.close()
        await connector.close()
