"""Slash-command deliveries: claimed once by a command worker, executed, marked done.

The deliveries are `webhook_deliveries` rows intake recorded; a worker's claim fences the
attempts before it, and the replies and reactions still to send wait in the row's outbox.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bot.queue.connector import COMMAND_CHANNEL, Connector, Listener
from bot.queue.sql import commands as sql

# Intake records a command delivery as 'command' or 'command_pending' (the worker has not run
# it); a worker's claim makes it 'command_running', and then it becomes one of these.
DONE_OUTCOME = "command_done"
FAILED_OUTCOME = "command_failed"
# The commands ran; their reply and reactions wait for the forge until the delivery's retry_at.
REPLY_PENDING_OUTCOME = "command_reply_pending"


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A command delivery this worker now holds."""

    id: int
    delivery_id: str
    forge: str
    received_at: datetime
    detail: Mapping[str, Any]
    # This claim's attempt (the deliveries' claim_attempt): it fences the attempts before it.
    attempts: int = 1


def midnight_utc(now: datetime) -> datetime:
    """Start of `now`'s day in UTC."""
    moment = now.astimezone(UTC)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


class CommandInbox:
    """The store's part for command deliveries: claims, outcomes, the outbox of replies."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector

    async def listen(self, callback: Callable[[], None]) -> Listener:
        """Call `callback` whenever a command delivery is recorded (LISTEN on its channel)."""
        return await self.connector.listen(COMMAND_CHANNEL, callback)

    async def claim_pending_commands(
        self, *, owner: str, now: datetime, limit: int, lease_s: float, max_age_s: float
    ) -> list[ClaimedDelivery]:
        """Take up to `limit` pending deliveries (or ones stuck past `lease_s`) for `owner`."""
        async with self.connector.transaction() as conn:
            rows = (
                await conn.execute(
                    sql.CLAIM_PENDING_COMMANDS,
                    {
                        "owner": owner,
                        "now": now,
                        "since": now - timedelta(seconds=max_age_s),
                        "stale_before": now - timedelta(seconds=lease_s),
                        "limit": limit,
                    },
                )
            ).all()
        return [
            ClaimedDelivery(
                id=row.id,
                delivery_id=row.delivery_id,
                forge=row.forge,
                received_at=row.received_at,
                detail=row.detail or {},
                attempts=int(row.claim_attempt),
            )
            for row in sorted(rows, key=lambda row: row.id)
        ]

    async def mark_command_done(
        self,
        delivery: ClaimedDelivery,
        *,
        owner: str,
        outcome: str,
        result: Mapping[str, Any],
        job_id: int | None,
    ) -> bool:
        """Record what the delivery's commands did; False when another worker took it over."""
        async with self.connector.transaction() as conn:
            row = (
                await conn.execute(
                    sql.MARK_COMMAND_DONE,
                    {
                        "id": delivery.id,
                        "owner": owner,
                        "outcome": outcome,
                        "job_id": job_id,
                        "result": json.dumps(dict(result), default=str),
                        "attempt": delivery.attempts,
                    },
                )
            ).first()
        return row is not None

    async def save_outbox(
        self,
        delivery: ClaimedDelivery,
        *,
        owner: str,
        outbox: Sequence[Mapping[str, Any]],
        result: Mapping[str, Any],
        job_id: int | None,
    ) -> bool:
        """Store the replies and reactions still to send, with what the commands did; False
        when another worker took the delivery over."""
        saved = {**result, "outbox": list(outbox), "outbox_tries": 0}
        return await self._update_held(
            sql.SAVE_OUTBOX,
            {
                "id": delivery.id,
                "owner": owner,
                "attempt": delivery.attempts,
                "job_id": job_id,
                "saved": json.dumps(saved),
            },
        )

    async def defer_outbox(
        self,
        delivery: ClaimedDelivery,
        *,
        owner: str,
        outbox: Sequence[Mapping[str, Any]],
        tries: int,
        retry_at: datetime,
        error: str,
        reply_id: int | None = None,
    ) -> bool:
        """Give the delivery back with what is still unsent (and the reply, once posted), to
        be claimed again at `retry_at`; False when another worker took it over."""
        deferred: dict[str, Any] = {
            "outbox": list(outbox),
            "outbox_tries": tries,
            "outbox_error": error,
        }
        if reply_id is not None:
            deferred["reply_id"] = reply_id
        return await self._update_held(
            sql.DEFER_OUTBOX,
            {
                "id": delivery.id,
                "owner": owner,
                "attempt": delivery.attempts,
                "retry_at": retry_at,
                "deferred": json.dumps(deferred),
            },
        )

    async def renew_claims(self, ids: Sequence[int], *, owner: str, now: datetime) -> None:
        """Renew the claims `owner` holds on the deliveries `ids`."""
        async with self.connector.transaction() as conn:
            await conn.execute(sql.RENEW_CLAIMS, {"ids": list(ids), "owner": owner, "now": now})

    async def holds(self, delivery: ClaimedDelivery, *, owner: str) -> bool:
        """Whether this claim attempt of `owner` still holds the delivery."""
        return await self._update_held(
            sql.CLAIM_HELD, {"id": delivery.id, "owner": owner, "attempt": delivery.attempts}
        )

    async def _update_held(self, statement: Any, params: Mapping[str, Any]) -> bool:
        async with self.connector.transaction() as conn:
            row = (await conn.execute(statement, dict(params))).first()
        return row is not None

    async def count_raises_today(self, *, forge: str, actor: str, now: datetime) -> int:
        """Accepted raises by `actor` on `forge` since midnight UTC of `now`."""
        async with self.connector.transaction() as conn:
            value = (
                await conn.execute(
                    sql.COUNT_RAISES_TODAY,
                    {"actor": actor, "forge": forge, "since": midnight_utc(now), "now": now},
                )
            ).scalar_one()
        return int(value)

    async def executed_commands(self, delivery: ClaimedDelivery) -> set[int]:
        """Indexes of this delivery's commands already in a job history."""
        async with self.connector.transaction() as conn:
            rows = (
                await conn.execute(
                    sql.SELECT_EXECUTED_COMMANDS,
                    {
                        "delivery_id": delivery.delivery_id,
                        # the history is written by the worker's clock: allow for skew
                        "since": delivery.received_at - timedelta(hours=1),
                    },
                )
            ).all()
        return {int(row.command_index) for row in rows if row.command_index is not None}
