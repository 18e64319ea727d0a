"""The connector's LISTEN on real PostgreSQL: woken by NOTIFY, by its connection's end, and a
database it cannot reach as the store's own error."""

from __future__ import annotations

import asyncio
import socket

import asyncpg
import pytest

from bot.db import create_engine, plain_url
from bot.errors import StoreUnavailable
from bot.queue.connector import COMMAND_CHANNEL, QUEUE_CHANNEL, Connector


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
