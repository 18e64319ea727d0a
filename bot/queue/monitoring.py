"""What monitoring reads and records: the queue at a glance, the dispatchers' heartbeats,
wait alerts and outages, the forges' write budgets, the dashboard's recent work.

bot.obs (metrics, alerts, the dashboard) and the dispatchers' presence decide what these rows
mean; this part only reads and writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bot.queue.connector import Connector
from bot.queue.sql import monitoring as sql


class MonitoringRecords:
    """The store's part for monitoring: snapshots, heartbeats, alerts, budgets."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector

    # -- the queue and the forges' budgets --------------------------------------------------
    async def queue_jobs(self) -> list[Any]:
        """Live jobs per level and state, with the oldest wait."""
        return await self.connector.fetch_all(sql.SELECT_QUEUE_JOBS)

    async def queue_chunks(self, *, now: datetime) -> list[Any]:
        """Chunks per level and state at `now`, leases included."""
        return await self.connector.fetch_all(sql.SELECT_QUEUE_CHUNKS, {"now": now})

    async def forge_budgets(self, *, now: datetime) -> list[Any]:
        """Each forge identity's write budget at `now`: limits, writes spent, writes waiting."""
        return await self.connector.fetch_all(sql.SELECT_FORGE_BUDGETS, {"now": now})

    # -- the dispatchers' heartbeats --------------------------------------------------------
    async def beat(
        self,
        *,
        name: str,
        host: str,
        pid: int,
        started_at: datetime,
        now: datetime,
        slots: int,
        running: int,
        engines: Sequence[Mapping[str, Any]],
        forget_before: datetime,
    ) -> None:
        """Say dispatcher `name` is alive at `now`, and forget the rows of processes gone
        since before `forget_before`."""
        await self.connector.write(
            sql.UPSERT_DISPATCHER,
            {
                "name": name,
                "host": host,
                "pid": pid,
                "started_at": started_at,
                "now": now,
                "slots": slots,
                "running": running,
                "engines": json.dumps(list(engines)),
            },
        )
        await self.connector.write(sql.PRUNE_DISPATCHERS, {"before": forget_before})

    async def leave(self, *, name: str, now: datetime) -> None:
        """Say dispatcher `name` stopped at `now` (so it does not read as crashed)."""
        await self.connector.write(sql.MARK_DISPATCHER_STOPPED, {"name": name, "now": now})

    async def dispatchers(self, *, since: datetime) -> list[Any]:
        """Dispatchers heard from since `since`, alive or not."""
        return await self.connector.fetch_all(sql.SELECT_DISPATCHERS, {"since": since})

    # -- alerts -----------------------------------------------------------------------------
    async def alert_candidates(self, *, cutoff: datetime, limit: int) -> list[Any]:
        """Jobs waiting past their level's threshold (`cutoff` per level) and not yet alerted."""
        return await self.connector.fetch_all(
            sql.SELECT_ALERT_CANDIDATES, {"cutoff": cutoff, "limit": limit}
        )

    async def record_alerts(self, rows: Sequence[Mapping[str, Any]]) -> set[int]:
        """Record wait alerts in one transaction; the job ids recorded now (not before)."""
        recorded: set[int] = set()
        async with self.connector.transaction() as conn:
            for row in rows:
                result = await conn.execute(sql.INSERT_ALERT, dict(row))
                recorded.update(int(r.job_id) for r in result.all())
        return recorded

    async def open_operational_alert(self, *, kind: str, now: datetime, message: str) -> bool:
        """Open an alert of `kind` about the service; False when one is already open."""
        opened = await self.connector.write(
            sql.OPEN_OPERATIONAL_ALERT, {"kind": kind, "now": now, "message": message}
        )
        return bool(opened)

    async def resolve_operational_alert(self, *, kind: str, now: datetime) -> bool:
        """Close the open alert of `kind`; True when this call closed it."""
        return bool(
            await self.connector.write(sql.RESOLVE_OPERATIONAL_ALERT, {"kind": kind, "now": now})
        )

    async def recent_alerts(self, *, limit: int) -> list[Any]:
        """The last `limit` wait alerts, newest first."""
        return await self.connector.fetch_all(sql.SELECT_RECENT_ALERTS, {"limit": limit})

    async def count_alerts(self) -> int:
        """Wait alerts raised so far."""
        return int(await self.connector.fetch_value(sql.COUNT_ALERTS) or 0)

    async def operational_alert_messages(self) -> list[str]:
        """Every operational alert's message, oldest first."""
        rows = await self.connector.fetch_all(sql.SELECT_OPERATIONAL_ALERT_MESSAGES)
        return [str(row.message) for row in rows]

    # -- the dashboard's recent work --------------------------------------------------------
    async def started_waits(self, *, since: datetime, until: datetime) -> list[Any]:
        """How long each review started between `since` and `until` waited, per level."""
        return await self.connector.fetch_all(
            sql.SELECT_STARTED_WAITS, {"since": since, "until": until}
        )

    async def engine_work(self, *, since: datetime, until: datetime) -> list[Any]:
        """What each engine (LLM server) ran between `since` and `until`."""
        return await self.connector.fetch_all(
            sql.SELECT_ENGINE_WORK, {"since": since, "until": until}
        )
