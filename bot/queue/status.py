"""Check runs and commit statuses: what each job is owed, the publisher's lease, what was
written, and the ETA model every process reads.

The status publisher (bot.status) decides what to write and when; this part only reads and
records it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from bot.queue.connector import STATUS_CHANNEL, Connector, Listener
from bot.queue.sql import status as sql


class StatusRecords:
    """The store's part for statuses: debts, the publisher's lease, reports, the ETA model."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector

    async def live_jobs(self) -> list[Any]:
        """Every live job with its calls and its last written status."""
        return await self.connector.fetch_all(sql.SELECT_LIVE_JOBS)

    async def recent_arrivals(self, *, since: datetime, now: datetime) -> list[Any]:
        """The level and size of each review that arrived between `since` and `now`."""
        return await self.connector.fetch_all(
            sql.SELECT_RECENT_ARRIVALS, {"since": since, "now": now}
        )

    async def recent_writes(self, *, since: datetime) -> list[Any]:
        """Every forge write spent since `since`, with the budget it was spent from."""
        return await self.connector.fetch_all(sql.SELECT_RECENT_WRITES, {"since": since})

    async def ended_among(self, ids: Sequence[int]) -> list[Any]:
        """Which of the jobs `ids` have ended, how and when."""
        return await self.connector.fetch_all(sql.SELECT_ENDED_AMONG, {"ids": list(ids)})

    async def owed(self, *, limit: int) -> list[Any]:
        """Up to `limit` ended jobs whose final status (or a republish) is still owed."""
        return await self.connector.fetch_all(sql.SELECT_OWED, {"limit": limit})

    async def settle_owed(self, *, job_id: int, republish: bool) -> None:
        """Forget a debt that was paid (or that no longer needs paying)."""
        await self.connector.write(sql.SETTLE_OWED, {"job_id": job_id, "republish": republish})

    async def head_states(self, *, forge: str, shas: Sequence[str]) -> list[Any]:
        """The state last written on each of the heads `shas` of `forge`."""
        return await self.connector.fetch_all(
            sql.SELECT_HEAD_STATES, {"forge": forge, "shas": list(shas)}
        )

    async def lead(self, *, name: str, owner: str, now: datetime, until: datetime) -> int | None:
        """Take or renew the lease `name` for `owner` until `until`: the attempt held, or None
        while another owner's lease runs."""
        held = await self.connector.write(
            sql.ACQUIRE_LEASE, {"name": name, "owner": owner, "now": now, "until": until}
        )
        return int(held[0].attempt) if held else None

    async def may_write(
        self, *, name: str, owner: str, attempt: int, job_id: int, final: bool
    ) -> bool:
        """Whether `owner`'s `attempt` still holds the lease and the job can take the status
        (a final one, or progress on a job still live)."""
        found = await self.connector.fetch_value(
            sql.MAY_WRITE,
            {"name": name, "owner": owner, "attempt": attempt, "job_id": job_id, "final": final},
        )
        return found is not None

    async def record_report(self, report: Mapping[str, Any]) -> bool:
        """Remember a status written to the forge; False when the lease attempt that wrote it
        no longer holds (fenced: the new holder owns the record)."""
        return bool(await self.connector.write(sql.RECORD_REPORT, dict(report)))

    async def note_stale_write(
        self,
        *,
        job_id: int,
        state: str,
        conclusion: str | None,
        external_id: str | None,
        now: datetime,
    ) -> None:
        """A fenced-off publisher's write reached the forge: note what the forge shows now,
        and owe an ended job's final status again (see NOTE_STALE_WRITE)."""
        await self.connector.write(
            sql.NOTE_STALE_WRITE,
            {
                "job_id": job_id,
                "state": state,
                "conclusion": conclusion,
                "external_id": external_id,
                "now": now,
            },
        )

    async def save_eta_model(self, *, name: str, model: Mapping[str, Any], now: datetime) -> None:
        """Keep the ETA model `name` for every other process."""
        await self.connector.write(
            sql.UPSERT_ETA_MODEL, {"name": name, "model": json.dumps(model), "now": now}
        )

    async def eta_model(self, *, name: str) -> Any:
        """The ETA model `name` as kept (JSON), or None."""
        return await self.connector.fetch_value(sql.SELECT_ETA_MODEL, {"name": name})

    async def listen(self, callback: Callable[[], None]) -> Listener:
        """Call `callback` whenever a job's state changes (LISTEN on the status channel)."""
        return await self.connector.listen(STATUS_CHANNEL, callback)
