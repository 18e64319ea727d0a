"""aiohttp shell of the intake: read, verify, normalize, decide, one store call, answer."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from aiohttp import web
from aiohttp.http_exceptions import DecompressSizeError, HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from bot.clock import Clock
from bot.errors import StoreError, StoreUnavailable, WebhookError
from bot.intake.normalize import (
    Closed,
    Commands,
    Ignored,
    Normalized,
    Pong,
    clean_text,
    normalize_delivery,
)
from bot.intake.shape import check_shape
from bot.intake.verify import Delivery, verify_github_delivery, verify_gitlab_delivery
from bot.logsafe import escaped
from bot.model import Forge, ReviewRequest
from bot.obs.liveness import DEFAULT_STALE_S, read_liveness
from bot.policy import PolicyBook, evaluate
from bot.queue.store import QueueStore

log = logging.getLogger(__name__)

SignatureMode = Literal["verify", "insecure", "disabled"]


@dataclass(frozen=True, slots=True)
class IntakeConfig:
    """What the intake handlers need, built once by the composition root."""

    store: QueueStore
    policies: PolicyBook
    clock: Clock
    github_secret: str | None
    gitlab_token: str | None
    insecure_dev: bool
    bot_login: str
    max_body_bytes: int
    dispatcher_stale_s: float = DEFAULT_STALE_S

    def mode(self, forge: Forge) -> SignatureMode:
        """How deliveries of a forge are checked: verified, accepted unsigned, or refused."""
        secret = self.github_secret if forge == "github" else self.gitlab_token
        if secret:
            return "verify"
        return "insecure" if self.insecure_dev else "disabled"


INTAKE_KEY = web.AppKey("intake", IntakeConfig)


def setup_intake(app: web.Application, *, config: IntakeConfig) -> None:
    """Register the webhook and health routes."""
    app[INTAKE_KEY] = config
    app.router.add_post("/webhooks/github", handle_github)
    app.router.add_post("/webhooks/gitlab", handle_gitlab)
    app.router.add_get("/healthz", handle_health)


async def handle_github(request: web.Request) -> web.Response:
    """POST /webhooks/github."""
    return await _handle_delivery(request, "github")


async def handle_gitlab(request: web.Request) -> web.Response:
    """POST /webhooks/gitlab."""
    return await _handle_delivery(request, "gitlab")


async def handle_health(request: web.Request) -> web.Response:
    """GET /healthz: 200 when the database answers, 503 when it does not."""
    config = request.app[INTAKE_KEY]
    try:
        await config.store.ping()
    except StoreUnavailable as exc:
        log.warning("health check failed: %s", exc, extra={"action": "health_failed"})
        return web.json_response({"status": "unavailable", "reason": str(exc)}, status=503)
    # Webhooks are taken whatever the dispatchers do, so their absence is said, not a 503 that
    # would make an orchestrator restart a healthy web process.
    body: dict[str, Any] = {"status": "ok"}
    try:
        liveness = await read_liveness(
            config.store.monitoring, now=config.clock.now(), stale_after_s=config.dispatcher_stale_s
        )
    except StoreError as exc:
        body["liveness_error"] = str(exc)
    else:
        body.update(liveness.to_dict())
        if liveness.dispatchers == 0:
            body["warning"] = "no dispatcher is alive: reviews wait until one starts"
    return web.json_response(body)


async def _handle_delivery(request: web.Request, forge: Forge) -> web.Response:
    """Verify, normalize, decide and record one delivery."""
    config = request.app[INTAKE_KEY]
    mode = config.mode(forge)
    if mode == "disabled":
        variable = "GITHUB_WEBHOOK_SECRET" if forge == "github" else "GITLAB_WEBHOOK_TOKEN"
        raise WebhookError(f"{forge} webhooks are not enabled here ({variable} unset)", status=401)
    body = await read_body(request, config.max_body_bytes)
    if forge == "github":
        delivery = verify_github_delivery(request.headers, body, secret=config.github_secret)
    else:
        delivery = verify_gitlab_delivery(request.headers, body, token=config.gitlab_token)
    outcome = normalize_delivery(delivery, bot_login=config.bot_login)
    check_shape(outcome)
    answer, status = await record_outcome(config, delivery, outcome, now=config.clock.now())
    log.info(
        "%s %s delivery %s: %s",
        forge,
        escaped(delivery.event, limit=60),
        escaped(delivery.delivery_id, limit=80),
        answer["status"],
        extra={
            "action": "webhook_" + str(answer["status"]),
            "forge": forge,
            "delivery_id": delivery.delivery_id,
            "job_id": answer.get("job_id"),
        },
    )
    return web.json_response(answer, status=status)


async def read_body(request: web.Request, limit: int) -> bytes:
    """Read the body, refusing more than `limit` bytes with 413 before and while reading."""
    if request.content_length is not None and request.content_length > limit:
        raise WebhookError(f"body of {request.content_length} bytes exceeds {limit}", status=413)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise WebhookError(f"body exceeds {limit} bytes", status=413) from exc
    except DecompressSizeError as exc:
        raise WebhookError(f"decompressed body exceeds its limit: {exc}", status=413) from exc
    except (RequestPayloadError, HttpProcessingError, ConnectionError) as exc:
        # Bad Content-Encoding data, a broken chunked stream, or a client that went away.
        raise WebhookError(f"body cannot be read: {exc}".strip(), status=400) from exc
    if len(body) > limit:
        raise WebhookError(f"body of {len(body)} bytes exceeds {limit}", status=413)
    return body


async def record_outcome(
    config: IntakeConfig, delivery: Delivery, outcome: Normalized, *, now: datetime
) -> tuple[dict[str, Any], int]:
    """Make the one store call for a normalized delivery; returns the answer and its status."""
    raw_action = delivery.payload.get("action")
    action = clean_text(raw_action)[:100] if isinstance(raw_action, str) else None
    if isinstance(outcome, ReviewRequest):
        return await _submit(config, delivery, outcome, now=now)
    if isinstance(outcome, Closed):
        return await _cancel(config, delivery, outcome, action=action, now=now)
    if isinstance(outcome, Pong):
        status, detail, reasons = "pong", {"zen": outcome.zen}, ["the hook works"]
    elif isinstance(outcome, Ignored):
        status, detail, reasons = "ignored", {"reason": outcome.reason}, [outcome.reason]
    else:
        status, detail, reasons = "recorded", _commands_detail(outcome), list(outcome.errors)
    created = await config.store.record_delivery(
        delivery_id=delivery.delivery_id,
        forge=delivery.forge,
        event=delivery.event,
        action=action,
        outcome="command" if isinstance(outcome, Commands) else status,
        now=now,
        detail=detail,
    )
    if not created:
        return _duplicate(delivery, reasons=[], job_id=None), 200
    answer: dict[str, Any] = {"status": status, "job_id": None, "level": None, "reasons": reasons}
    if isinstance(outcome, Commands):
        answer["commands"] = detail["commands"]
    return answer, 200


async def _cancel(
    config: IntakeConfig,
    delivery: Delivery,
    closed: Closed,
    *,
    action: str | None,
    now: datetime,
) -> tuple[dict[str, Any], int]:
    """A PR closed without merging: record the delivery once, cancel its live reviews."""
    created = await config.store.record_delivery(
        delivery_id=delivery.delivery_id,
        forge=delivery.forge,
        event=delivery.event,
        action=action,
        outcome="closed",
        now=now,
        detail={"repo": closed.repo, "number": closed.number, "reason": closed.reason},
    )
    if not created:
        return _duplicate(delivery, reasons=[], job_id=None), 200
    cancelled = await config.store.cancel_pull(
        forge=closed.forge,
        repo=closed.repo,
        number=closed.number,
        now=now,
        reason=closed.reason,
        actor="intake",
    )
    answer = {
        "status": "closed",
        "job_id": None,
        "level": None,
        "reasons": [closed.reason],
        "cancelled": [int(job_id) for job_id in cancelled],
    }
    return answer, 200


async def _submit(
    config: IntakeConfig, delivery: Delivery, request: ReviewRequest, *, now: datetime
) -> tuple[dict[str, Any], int]:
    """Apply the policy and enqueue (or record a skip)."""
    decision = evaluate(config.policies.policy_for(request.repo), request)
    reasons = list(decision.reasons)
    if not decision.review:
        created = await config.store.record_delivery(
            delivery_id=delivery.delivery_id,
            forge=delivery.forge,
            event=delivery.event,
            action=request.action,
            outcome="skipped",
            now=now,
            detail={
                "repo": request.repo,
                "number": request.number,
                "rule": decision.rule,
                "reasons": reasons,
            },
        )
        if not created:
            return _duplicate(delivery, reasons=[], job_id=None), 200
        return {"status": "ignored", "job_id": None, "level": None, "reasons": reasons}, 200
    result = await config.store.submit_request(
        request,
        decision,
        now=now,
        delivery_id=delivery.delivery_id,
        event=f"{request.event}.{request.action}",
    )
    if result.duplicate_delivery:
        return _duplicate(delivery, reasons=[], job_id=None), 200
    level = str(result.level if result.level is not None else decision.level)
    if not result.created:
        state = result.state.value if result.state is not None else "unknown"
        note = f"same change as job {result.job_id} ({state}); " + (
            f"level now {level}" if result.level_changed else "level unchanged"
        )
        answer = _duplicate(delivery, reasons=[note, *reasons], job_id=result.job_id)
        answer.update(level=level, duplicate="change")
        return answer, 200
    answer = {
        "status": "queued",
        "job_id": result.job_id,
        "level": level,
        "reasons": reasons,
        "rule": decision.rule,
        "size_pending": decision.size_pending,
        "superseded": list(result.superseded),
    }
    return answer, 202


def _duplicate(delivery: Delivery, *, reasons: list[str], job_id: int | None) -> dict[str, Any]:
    """The answer to a delivery that changed nothing."""
    return {
        "status": "duplicate",
        "duplicate": "delivery",
        "job_id": job_id,
        "level": None,
        "reasons": reasons or [f"delivery {delivery.delivery_id} was already received"],
    }


def _commands_detail(outcome: Commands) -> dict[str, Any]:
    """What the command handler needs later, as JSON-ready data."""
    commands: list[Mapping[str, Any]] = [
        {"verb": command.verb, "argument": command.argument, "raw": command.raw}
        for command in outcome.commands
    ]
    return {
        "forge": outcome.forge,
        "repo": outcome.repo,
        "number": outcome.number,
        "author": outcome.author,
        "comment_id": outcome.comment_id,
        "project_id": outcome.project_id,
        "installation_id": outcome.installation_id,
        "commands": commands,
        "errors": list(outcome.errors),
    }
