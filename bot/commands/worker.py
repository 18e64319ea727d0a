"""The command worker: claims recorded slash commands, checks who asks, applies them, replies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web

from bot.clock import Clock
from bot.commands.decide import (
    CommandDecision,
    SlashRules,
    Standing,
    clean_error,
    decide,
    render_reply,
)
from bot.commands.inbox import commands_of
from bot.commands.outbox import OutboxItem, build_outbox, run_outbox_pass
from bot.config import DEFAULTS
from bot.errors import ForgeError, StoreError
from bot.forges.base import (
    ForgeClient,
    Permission,
    Reaction,
    render_reply_marker,
)
from bot.lifecycle import cancelled_at_stop, running
from bot.model import TERMINAL_JOB_STATES, Command, Forge, Job, ReviewRequest
from bot.outage import OutageWatch
from bot.policy import PolicyBook, evaluate
from bot.queue.commands import (
    DONE_OUTCOME,
    FAILED_OUTCOME,
    REPLY_PENDING_OUTCOME,
    ClaimedDelivery,
)
from bot.queue.connector import Listener
from bot.queue.store import QueueStore, dedupe_key_for, request_from_json
from bot.review.deferral import RetryBudget
from bot.status.eta import Capacity
from bot.status.standing import EtaModel, read_standings
from bot.wording import for_forge

log = logging.getLogger(__name__)

_NEEDS_PERMISSION = frozenset({"priority", "cancel", "review", "rerun"})


@dataclass(frozen=True, slots=True)
class CommandWorkerSettings:
    """Knobs of the command worker."""

    # Who holds a claim, unique per process (its pid shows in the deliveries' detail).
    owner: str = field(default_factory=lambda: f"commands-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    poll_s: float = 2.0  # fallback when NOTIFY is not heard
    batch: int = 10
    lease_s: float = 120.0  # a claim older than this (its worker died) is taken over
    max_age_s: float = 6 * 3600.0  # commands older than this are not executed any more
    max_attempts: int = 3
    permission_ttl_s: float = 60.0
    # LLM worker slots, for the ETA until the status publisher kept its model.
    workers: int = DEFAULTS.scheduler.workers
    # First pause after the database is lost.
    outage_backoff_s: float = DEFAULTS.database.outage_backoff_s
    # Replies and reactions the forge did not take: tries and backoff, as for reviews.
    reply_budget: RetryBudget = field(
        default_factory=lambda: RetryBudget(max_attempts=5, backoff_s=30.0, max_backoff_s=900.0)
    )


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command (or malformed line) of a delivery did."""

    index: int
    verb: str
    outcome: str
    action: str
    job_id: int | None
    reply: str


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What the worker did with one claimed delivery."""

    delivery_id: str
    outcome: str
    results: tuple[CommandResult, ...] = ()
    reply_id: int | None = None


@dataclass(slots=True)
class PermissionCache:
    """Forge permissions remembered briefly: many commands, one API call."""

    ttl_s: float
    entries: dict[tuple[str, str, str], tuple[Permission, datetime]] = field(default_factory=dict)

    def get(self, key: tuple[str, str, str], *, now: datetime) -> Permission | None:
        entry = self.entries.get(key)
        if entry is None or entry[1] <= now:
            return None
        return entry[0]

    def put(self, key: tuple[str, str, str], permission: Permission, *, now: datetime) -> None:
        self.entries[key] = (permission, now + timedelta(seconds=self.ttl_s))


class CommandWorker:
    """Executes recorded command deliveries once each, off the webhook's hot path."""

    def __init__(
        self,
        store: QueueStore,
        *,
        forges: Mapping[str, ForgeClient],
        policies: PolicyBook,
        clock: Clock,
        settings: CommandWorkerSettings | None = None,
    ) -> None:
        self.store = store
        self.inbox = store.commands
        self.forges = forges
        self.policies = policies
        self.clock = clock
        self.settings = settings or CommandWorkerSettings()
        self.permissions = PermissionCache(ttl_s=self.settings.permission_ttl_s)
        self.executed = 0
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._held: set[int] = set()  # delivery ids of the batch in hand (renewed)

    # -- loop ------------------------------------------------------------------------------

    async def run_once(self) -> list[DeliveryReport]:
        """Claim a batch of pending deliveries and execute each; returns what was done."""
        now = self.clock.now()
        claimed = await self.inbox.claim_pending_commands(
            owner=self.settings.owner,
            now=now,
            limit=self.settings.batch,
            lease_s=self.settings.lease_s,
            max_age_s=self.settings.max_age_s,
        )
        reports = []
        self._held = {delivery.id for delivery in claimed}
        try:
            for delivery in claimed:
                report = await self.execute(delivery)
                self._held.discard(delivery.id)
                if report is not None:
                    reports.append(report)
        finally:
            self._held = set()
        return reports

    async def _renew_claims(self) -> None:
        """While serving, renew the claims of the batch in hand every third of the lease: a
        live worker keeps them however slow the forge is; a dead or paused one loses them."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self.settings.lease_s / 3)
            if not self._held:
                continue
            try:
                await self.inbox.renew_claims(
                    sorted(self._held), owner=self.settings.owner, now=self.clock.now()
                )
            except StoreError as exc:  # the claims may run out; they are fenced then
                log.warning("command claims not renewed: %s", exc,
                            extra={"action": "command_renew_failed"})  # fmt: skip

    async def run(self, *, database_url: str | None = None) -> None:
        """Serve until stop(): wake on NOTIFY (or the poll), execute what is pending."""
        listener = await self._listen(database_url)
        outage = OutageWatch("command worker", base_s=self.settings.outage_backoff_s)
        try:
            async with running([cancelled_at_stop("command-claims", self._renew_claims)]):
                while not self._stopping.is_set():
                    self._wake.clear()
                    wait_s = self.settings.poll_s
                    try:
                        reports = await self.run_once()
                    except StoreError as exc:
                        # Claimed deliveries stay claimed; they are taken over after the lease.
                        reports = []
                        wait_s = outage.lost(exc)
                    else:
                        outage.recovered()
                        if database_url is not None and (listener is None or listener.is_closed()):
                            listener = await self._listen(database_url, quiet=listener is None)
                    if len(reports) >= self.settings.batch:
                        continue  # more may be waiting
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
        finally:
            if listener is not None and not listener.is_closed():
                await listener.close()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def _listen(self, database_url: str | None, *, quiet: bool = False) -> Listener | None:
        """LISTEN for command deliveries through the store, given `database_url`."""
        if database_url is None:
            return None
        try:
            return await self.store.commands.listen(self._wake.set)
        except StoreError as exc:
            if not quiet:
                log.warning(
                    "LISTEN unavailable, polling every %ss: %s",
                    self.settings.poll_s,
                    exc,
                    extra={"action": "commands_listen_failed"},
                )
            return None

    # -- one delivery ----------------------------------------------------------------------

    async def execute(self, delivery: ClaimedDelivery) -> DeliveryReport | None:
        """Run every command of one delivery, reply once, mark it done; None if taken over."""
        extra = {"action": "command_delivery", "delivery_id": delivery.delivery_id}
        if delivery.detail.get("outbox"):
            # The commands ran already: only their reply and reaction are left to send.
            return await self._resume_outbox(delivery)
        if delivery.attempts > self.settings.max_attempts:
            log.error("command delivery %s failed %d times", delivery.delivery_id,
                      delivery.attempts - 1, extra=extra)  # fmt: skip
            return await self._finish(delivery, FAILED_OUTCOME, {"error": "out of attempts"}, ())
        try:
            return await self._execute(delivery)
        except StoreError:
            raise  # the claim stays; it is taken over after the lease, skipping what ran
        except Exception as exc:
            # A bug in one delivery must not stop the others; it is kept with its error.
            log.exception("command delivery %s failed", delivery.delivery_id, extra=extra)
            return await self._finish(delivery, FAILED_OUTCOME, {"error": repr(exc)[:500]}, ())

    async def _execute(self, delivery: ClaimedDelivery) -> DeliveryReport | None:
        detail = delivery.detail
        forge: Forge = "gitlab" if detail.get("forge") == "gitlab" else "github"
        repo = str(detail.get("repo") or "")
        number = int(detail.get("number") or 0)
        author = str(detail.get("author") or "")
        comment_id = int(detail.get("comment_id") or 0)
        client = self.forges.get(forge)
        if not await self.inbox.holds(delivery, owner=self.settings.owner):
            return self._taken_over(delivery)
        if client is not None:
            client.use_installation(repo, detail.get("installation_id"))
            await self._react(client, repo, comment_id, "eyes", number=number)
        commands, errors = commands_of(delivery, forge=forge)
        done = await self.inbox.executed_commands(delivery) if delivery.attempts > 1 else set()
        policy = self.policies.policy_for(repo)
        rules = SlashRules.from_policy(policy)
        permission: Permission | None = None
        if client is not None and any(c.verb in _NEEDS_PERMISSION for c in commands):
            permission = await self._permission(client, forge, repo, author)
        now = self.clock.now()
        raises_today = await self.inbox.count_raises_today(forge=forge, actor=author, now=now)
        results: list[CommandResult] = []
        touched: int | None = None
        for index, command in enumerate(commands):
            if index in done:
                continue
            # A command takes effect only while this claim attempt still holds the delivery.
            if not await self.inbox.holds(delivery, owner=self.settings.owner):
                return self._taken_over(delivery)
            now = self.clock.now()
            job = await self.store.find_job(forge=forge, repo=repo, number=number)
            standing = await self._standing(job) if command.verb == "status" else None
            decision = decide(
                command,
                job=job,
                actor_permission=permission,
                actor_is_author=job is not None and job.author.lower() == author.lower(),
                raises_today=raises_today,
                rules=rules,
                now=now,
                standing=standing,
            )
            decision, job_id = await self._apply(decision, command, job, now=now)
            if decision.is_raise and decision.outcome == "accepted":
                raises_today += 1
            target = job.id if job is not None else job_id
            if target is not None:
                touched = target
                await self.store.record_command(
                    target,
                    now=now,
                    actor=author,
                    command=decision.history_reason,
                    outcome=decision.outcome,
                    detail=_history_detail(
                        delivery, command, decision, index=index, job=job, permission=permission
                    )
                    | {"new_job_id": job_id if job_id != target else None},
                )
            results.append(
                CommandResult(
                    index, command.verb, decision.outcome, decision.action, target,
                    decision.reply_text,
                )
            )  # fmt: skip
        job = await self.store.find_job(forge=forge, repo=repo, number=number)
        for offset, error in enumerate(errors, start=len(commands)):
            if offset in done:
                continue
            text = clean_error(error)
            if job is not None:
                await self.store.record_command(
                    job.id,
                    now=self.clock.now(),
                    actor=author,
                    command=f"malformed command: {text}",
                    outcome="refused",
                    detail={"forge": forge, "verb": "invalid", "delivery_id":
                            delivery.delivery_id, "index": offset, "comment_id": comment_id},
                )  # fmt: skip
            results.append(
                CommandResult(offset, "invalid", "refused", "refuse", job.id if job else None, text)
            )
        self.executed += len(results)
        summary = [
            {"index": r.index, "verb": r.verb, "outcome": r.outcome, "job_id": r.job_id}
            for r in results
        ]
        if client is None or not any(result.reply for result in results):
            # (A Re-run answers on the check run, not with a comment.)
            return await self._finish(
                delivery, DONE_OUTCOME, {"results": summary, "reply_id": None}, results,
                job_id=touched,
            )  # fmt: skip
        body = render_reply(
            [for_forge(result.reply, forge) for result in results],
            author=author,
            marker=render_reply_marker(delivery.id),
        )
        outbox = build_outbox(body, _final_reaction(results))
        saved = await self.inbox.save_outbox(
            delivery, owner=self.settings.owner, outbox=outbox, result={"results": summary},
            job_id=touched,
        )  # fmt: skip
        if not saved:
            return self._taken_over(delivery)
        return await self._send_outbox(
            delivery, client, outbox, tries=0, look_first=False, results=results
        )

    async def _resume_outbox(self, delivery: ClaimedDelivery) -> DeliveryReport | None:
        """Send what a deferred (or crashed) delivery still owes the forge."""
        detail = delivery.detail
        forge: Forge = "gitlab" if detail.get("forge") == "gitlab" else "github"
        client = self.forges.get(forge)
        if client is None:
            error = f"no {forge} client is configured: the reply cannot be posted"
            return await self._finish(delivery, DONE_OUTCOME, {"reply_error": error}, ())
        client.use_installation(str(detail.get("repo") or ""), detail.get("installation_id"))
        return await self._send_outbox(
            delivery,
            client,
            list(detail.get("outbox") or ()),
            tries=int(detail.get("outbox_tries") or 0),
            look_first=True,
            results=(),
        )

    async def _send_outbox(
        self,
        delivery: ClaimedDelivery,
        client: ForgeClient,
        outbox: Sequence[OutboxItem],
        *,
        tries: int,
        look_first: bool,
        results: Sequence[CommandResult],
    ) -> DeliveryReport | None:
        """One pass over the outbox; the delivery ends done, or waits for its retry time."""
        ended = await run_outbox_pass(
            self.inbox, delivery, client, outbox, owner=self.settings.owner,
            now=self.clock.now(), tries=tries, look_first=look_first,
            budget=self.settings.reply_budget,
        )  # fmt: skip
        if ended.ended == "taken_over":
            return self._taken_over(delivery)
        if ended.ended == "deferred":
            return DeliveryReport(
                delivery.delivery_id, REPLY_PENDING_OUTCOME, tuple(results), ended.reply_id
            )
        report = await self._finish(delivery, DONE_OUTCOME, ended.record, results)
        if report is None:
            return None
        return DeliveryReport(report.delivery_id, report.outcome, report.results, ended.reply_id)

    def _taken_over(self, delivery: ClaimedDelivery) -> DeliveryReport | None:
        """Log that another worker holds the delivery now; nothing to report (None)."""
        log.warning(
            "command delivery %s (claim attempt %s): lease lost, dropping result",
            delivery.delivery_id,
            delivery.attempts,
            extra={"action": "lease_lost", "delivery_id": delivery.delivery_id},
        )
        return None

    async def _finish(
        self,
        delivery: ClaimedDelivery,
        outcome: str,
        result: Mapping[str, Any],
        results: Sequence[CommandResult],
        *,
        job_id: int | None = None,
    ) -> DeliveryReport | None:
        marked = await self.inbox.mark_command_done(
            delivery, owner=self.settings.owner, outcome=outcome, result=result, job_id=job_id
        )
        if not marked:
            return self._taken_over(delivery)
        log.info(
            "command delivery %s: %s (%d commands)",
            delivery.delivery_id,
            outcome,
            len(results),
            extra={"action": "command_done", "delivery_id": delivery.delivery_id,
                   "job_id": job_id},
        )  # fmt: skip
        return DeliveryReport(delivery.delivery_id, outcome, tuple(results))

    async def _apply(
        self, decision: CommandDecision, command: Command, job: Job | None, *, now: datetime
    ) -> tuple[CommandDecision, int | None]:
        """Carry out an accepted decision; returns it (adjusted if the job moved on) and a job."""
        if decision.action == "set_level" and job is not None and decision.level is not None:
            changed = await self.store.set_level(
                job.id,
                decision.level,
                now=now,
                reason=decision.history_reason,
                actor=command.author,
                detail={"command": command.raw, "delivery_id": command.delivery_id},
            )
            if not changed:
                return _unchanged(decision, "the review ended or moved meanwhile"), job.id
            return decision, job.id
        if decision.action == "cancel" and job is not None:
            cancelled = await self.store.cancel_pull(
                forge=command.forge,
                repo=command.repo,
                number=command.number,
                now=now,
                reason=decision.history_reason,
                actor=command.author,
            )
            if not cancelled:
                return _unchanged(decision, "the review ended meanwhile"), job.id
            return decision, job.id
        if decision.action == "republish" and job is not None:
            await self.store.republish_status(job.id)
            return decision, job.id
        if decision.action == "requeue" and job is not None:
            requeued, job_id = await self._requeue(decision, command, job, now=now)
            if command.verb == "rerun" and requeued.action == "requeue":
                requeued = replace(requeued, reply_text="")  # its check run tells
            return requeued, job_id
        return decision, job.id if job is not None else None

    async def _requeue(
        self, decision: CommandDecision, command: Command, job: Job, *, now: datetime
    ) -> tuple[CommandDecision, int | None]:
        """Queue a new review of the newest known commit, leveled by the policy."""
        request = request_of(job)
        if request is None:
            return _unchanged(decision, "the stored request of this PR is incomplete"), job.id
        result_decision = evaluate(self.policies.policy_for(job.repo), request)
        if not result_decision.review:
            reason = "; ".join(result_decision.reasons)
            refused = CommandDecision(
                "refuse",
                None,
                f"Refused `/review`: the policy does not review this PR now ({reason}).",
                f"{command.raw}: policy skips it: {reason}",
                outcome="refused",
            )
            return refused, job.id
        # One new job per command comment: a replay of the same comment finds it again.
        # (A Re-run button has no comment: its delivery stands for it.)
        source = command.comment_id or command.delivery_id
        key = f"{dedupe_key_for(request)}!command:{command.forge}:{source}"
        submitted = await self.store.submit_request(
            request,
            result_decision,
            now=now,
            dedupe_key=key,
            actor=command.author,
            extra={
                "requested_by": command.author,
                "command_comment_id": command.comment_id,
                # `/review full`: the whole PR, not what changed since the last review.
                "review_mode": "full" if command.argument == "full" else "incremental",
            },
        )
        level = submitted.level if submitted.level is not None else result_decision.level
        text = (
            f"Queued a new review of the newest commit `{request.head_sha[:12]}` at {level} "
            f"(job {submitted.job_id}; the last one ended {job.state.value})."
        )
        return (
            CommandDecision("requeue", level, text, decision.history_reason + f" as job "
                            f"{submitted.job_id} at {level}"),
            submitted.job_id,
        )  # fmt: skip

    async def _standing(self, job: Job | None) -> Standing | None:
        if job is None:
            return None
        estimate = None
        if job.state not in TERMINAL_JOB_STATES:
            fallback = EtaModel(Capacity(slots=self.settings.workers))
            found = await read_standings(self.store.status, now=self.clock.now(), fallback=fallback)
            estimate = found.estimates.get(job.id)
        level_reason = None
        if job.level != job.base_level:
            history = await self.store.job_history(job.id)
            changes = [entry for entry in history if entry.kind == "level"]
            if changes:
                last = changes[-1]
                level_reason = (
                    f"{last.from_value} -> {last.to_value} by {last.actor}: {last.reason}"
                )
        if estimate is None:
            return Standing(level_reason=level_reason)
        return Standing(
            place=estimate.place,
            start_in_s=estimate.start_in_s,
            finish_in_s=estimate.finish_in_s,
            level_reason=level_reason,
        )

    async def _permission(
        self, client: ForgeClient, forge: str, repo: str, user: str
    ) -> Permission | None:
        """The user's role on the repository, cached briefly; None if the forge cannot say."""
        key = (forge, repo, user.lower())
        now = self.clock.now()
        cached = self.permissions.get(key, now=now)
        if cached is not None:
            return cached
        try:
            permission = await client.get_permission(repo, user)
        except ForgeError as exc:
            log.warning(
                "permission of %s on %s unknown: %s",
                user,
                repo,
                exc,
                extra={"action": "permission_unknown", "forge": forge},
            )
            return None
        self.permissions.put(key, permission, now=now)
        return permission

    async def _react(
        self, client: ForgeClient, repo: str, comment_id: int, reaction: Reaction, *, number: int
    ) -> None:
        if not comment_id:
            return
        try:
            await client.add_reaction(repo, comment_id, reaction, number=number)
        except ForgeError as exc:
            log.warning(
                "reaction %s on comment %s failed: %s",
                reaction,
                comment_id,
                exc,
                extra={"action": "reaction_failed"},
            )


def request_of(job: Job) -> ReviewRequest | None:
    """The job's stored request for a new review of it (None when fields are missing); the new
    job is not the old delivery's."""
    request = request_from_json(job.pull_details)
    return None if request is None else replace(request, delivery_id=None)


def _unchanged(decision: CommandDecision, why: str) -> CommandDecision:
    return CommandDecision(
        "status",
        decision.level,
        f"Nothing changed: {why}.",
        f"{decision.history_reason} (not applied: {why})",
        outcome="unchanged",
    )


def _history_detail(
    delivery: ClaimedDelivery,
    command: Command,
    decision: CommandDecision,
    *,
    index: int,
    job: Job | None,
    permission: Permission | None,
) -> dict[str, Any]:
    from_level = str(job.level) if job is not None else None
    return {
        "forge": command.forge,
        "verb": command.verb,
        "argument": command.argument,
        "raw": command.raw,
        "action": decision.action,
        "from_level": from_level,
        "to_level": str(decision.level) if decision.level is not None else None,
        "raise": decision.is_raise,
        "permission": permission,
        "delivery_id": delivery.delivery_id,
        "comment_id": command.comment_id,
        "index": index,
    }


def _final_reaction(results: Sequence[CommandResult]) -> Reaction:
    outcomes = {result.outcome for result in results}
    if all(result.verb == "invalid" for result in results):
        return "confused"
    if "refused" in outcomes:
        return "-1"
    return "+1"


# -- composition -------------------------------------------------------------------------------

COMMAND_WORKER_KEY = web.AppKey("command_worker", CommandWorker)


def setup_commands(
    app: web.Application,
    *,
    store: QueueStore,
    forges: Mapping[str, ForgeClient],
    policies: PolicyBook,
    clock: Clock,
    settings: CommandWorkerSettings | None = None,
    database_url: str | None = None,
) -> CommandWorker:
    """Start the command worker with the app (a cleanup_ctx), stop it with the app."""
    worker = CommandWorker(store, forges=forges, policies=policies, clock=clock, settings=settings)
    app[COMMAND_WORKER_KEY] = worker
    url = database_url
    if url is None:
        url = store.engine.url.render_as_string(hide_password=False)

    async def command_worker_context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(worker.run(database_url=url), name="command-worker")
        yield
        worker.stop()
        try:
            await asyncio.wait_for(task, timeout=10.0)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.cleanup_ctx.append(command_worker_context)
    return worker


__all__ = [
    "COMMAND_WORKER_KEY",
    "CommandResult",
    "CommandWorker",
    "CommandWorkerSettings",
    "DeliveryReport",
    "setup_commands",
]
