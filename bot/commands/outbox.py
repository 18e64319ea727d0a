"""What a command delivery still has to tell the forge (its reply, its reaction), sent once.

The commands of a delivery take effect in the database first; what the forge should then show
is kept with the delivery as an outbox and sent in order. A forge failure that may pass (5xx,
rate limits, a network error) hands the rest back to the database with a retry time, the same
backoff the poster uses for reviews (`bot.review.deferral.retry_delay`); any other failure
drops that one item with a log line. The reply carries a hidden marker, so a retry that follows
a post the forge did store finds it instead of posting it twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, cast

from bot.errors import ForgeError, LeaseLost
from bot.forges.base import (
    ForgeClient,
    Reaction,
    guarded_writes,
    may_pass_later,
    render_reply_marker,
)
from bot.queue.commands import ClaimedDelivery, CommandInbox
from bot.review.deferral import RetryBudget, retry_delay

log = logging.getLogger(__name__)

OutboxItem = Mapping[str, Any]  # {"kind": "reply", "body": ...} | {"kind": "reaction", ...}


def build_outbox(reply_body: str, reaction: Reaction) -> list[dict[str, Any]]:
    """The reply first, then the reaction that says how the commands went."""
    return [{"kind": "reply", "body": reply_body}, {"kind": "reaction", "reaction": reaction}]


@dataclass(frozen=True, slots=True)
class ReplyTarget:
    """Where a delivery's outbox goes: the PR/MR and the comment that held the commands."""

    repo: str
    number: int
    comment_id: int
    marker: str


@dataclass(frozen=True, slots=True)
class OutboxResult:
    """What one pass over an outbox did."""

    remaining: tuple[OutboxItem, ...]
    reply_id: int | None = None
    error: ForgeError | None = None  # the failure that may pass and stopped the pass
    dropped: tuple[str, ...] = field(default=())


async def send_outbox(
    client: ForgeClient,
    target: ReplyTarget,
    items: Sequence[OutboxItem],
    *,
    look_first: bool,
) -> OutboxResult:
    """Send the items in order; stop at the first failure that may pass. `look_first`: an
    earlier try may have posted the reply already, so look for its marker before posting."""
    reply_id: int | None = None
    dropped: list[str] = []
    for position, item in enumerate(items):
        try:
            if item.get("kind") == "reply":
                found = (
                    await client.find_comment(target.repo, target.number, target.marker)
                    if look_first
                    else None
                )
                reply_id = (
                    found
                    if found is not None
                    else await client.post_comment(
                        target.repo, target.number, str(item["body"]), marker=target.marker
                    )
                )
            elif target.comment_id:
                await client.add_reaction(
                    target.repo,
                    target.comment_id,
                    cast(Reaction, item["reaction"]),
                    number=target.number,
                )
        except ForgeError as exc:
            if may_pass_later(exc):
                return OutboxResult(tuple(items[position:]), reply_id, exc, tuple(dropped))
            # A refusal (403, 404, 422) will not pass by waiting: the commands already took
            # effect and are in the job history, so only this message is lost.
            log.warning(
                "command %s on %s#%s refused by the forge: %s",
                item.get("kind"),
                target.repo,
                target.number,
                exc,
                extra={"action": "command_outbox_refused", "status": exc.status},
            )
            dropped.append(f"{item.get('kind')}: {exc}")
    return OutboxResult((), reply_id, None, tuple(dropped))


@dataclass(frozen=True, slots=True)
class OutboxDecision:
    """After a pass with a failure that may pass: try again in `delay_s`, or give up."""

    action: Literal["defer", "give_up"]
    tries: int
    delay_s: float = 0.0


def decide_after_failure(
    tries_before: int, error: ForgeError, budget: RetryBudget
) -> OutboxDecision:
    """Defer with the reviews' backoff while tries remain; else give up."""
    tries = tries_before + 1
    if tries < budget.max_attempts:
        return OutboxDecision("defer", tries, retry_delay(tries, error, budget))
    return OutboxDecision("give_up", tries)


@dataclass(frozen=True, slots=True)
class OutboxPass:
    """How one pass over a held delivery's outbox ended; `record` is what to store with the
    delivery when it ends `sent` (everything delivered, or given up on)."""

    ended: Literal["sent", "deferred", "taken_over"]
    reply_id: int | None
    record: Mapping[str, Any] = field(default_factory=dict)


async def run_outbox_pass(
    inbox: CommandInbox,
    delivery: ClaimedDelivery,
    client: ForgeClient,
    outbox: Sequence[OutboxItem],
    *,
    owner: str,
    now: datetime,
    tries: int,
    look_first: bool,
    budget: RetryBudget,
) -> OutboxPass:
    """Send the outbox of a delivery `owner` holds; hand what the forge did not take back to
    the database with its retry time, or give up on it once `budget` is spent."""
    detail = delivery.detail
    target = ReplyTarget(
        repo=str(detail.get("repo") or ""),
        number=int(detail.get("number") or 0),
        comment_id=int(detail.get("comment_id") or 0),
        marker=render_reply_marker(delivery.id),
    )

    async def still_held() -> bool:
        return await inbox.holds(delivery, owner=owner)

    try:
        # Each forge call asks right before it goes out whether this claim still holds.
        with guarded_writes(still_held):
            sent = await send_outbox(client, target, outbox, look_first=look_first)
    except LeaseLost:
        log.warning(
            "command delivery %s (claim attempt %s): lease lost, dropping result",
            delivery.delivery_id,
            delivery.attempts,
            extra={"action": "lease_lost", "delivery_id": delivery.delivery_id},
        )
        return OutboxPass("taken_over", None)
    reply_id = sent.reply_id if sent.reply_id is not None else detail.get("reply_id")
    record: dict[str, Any] = {"outbox": [], "reply_id": reply_id}
    if sent.dropped:
        record["reply_error"] = "; ".join(sent.dropped)[:500]
    if sent.error is None:
        return OutboxPass("sent", reply_id, record)
    decision = decide_after_failure(tries, sent.error, budget)
    extra = {"action": "command_reply_deferred", "delivery_id": delivery.delivery_id}
    if decision.action == "give_up":
        record["reply_error"] = f"gave up after {decision.tries} tries: {sent.error}"[:500]
        log.error("reply to command delivery %s given up: %s", delivery.delivery_id,
                  record["reply_error"], extra=extra)  # fmt: skip
        return OutboxPass("sent", reply_id, record)
    deferred = await inbox.defer_outbox(
        delivery,
        owner=owner,
        outbox=sent.remaining,
        tries=decision.tries,
        retry_at=now + timedelta(seconds=decision.delay_s),
        error=str(sent.error)[:500],
        reply_id=reply_id,
    )
    if not deferred:
        return OutboxPass("taken_over", reply_id)
    log.warning("reply to command delivery %s deferred %.0f s (try %d): %s",
                delivery.delivery_id, decision.delay_s, decision.tries, sent.error,
                extra=extra)  # fmt: skip
    return OutboxPass("deferred", reply_id)


__all__ = [
    "OutboxDecision",
    "OutboxPass",
    "OutboxResult",
    "ReplyTarget",
    "build_outbox",
    "decide_after_failure",
    "run_outbox_pass",
    "send_outbox",
]
