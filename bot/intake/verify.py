"""Webhook verification and decoding for GitHub and GitLab: headers and bytes in, a Delivery out."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gidgethub import BadRequest, ValidationFailure
from gidgethub.sansio import Event

from bot.errors import WebhookError
from bot.model import Forge

GITHUB_SIGNATURE_HEADER = "x-hub-signature-256"
MAX_ID_CHARS = 200


@dataclass(frozen=True, slots=True)
class Delivery:
    """A verified, decoded webhook delivery."""

    forge: Forge
    event: str
    delivery_id: str
    payload: Any


def lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Copy headers into a dict with lower-case names (the first value of a repeated name wins)."""
    lowered: dict[str, str] = {}
    for name, value in headers.items():
        lowered.setdefault(name.lower(), value)
    return lowered


def verify_github_delivery(
    headers: Mapping[str, str], body: bytes, *, secret: str | None
) -> Delivery:
    """Check X-Hub-Signature-256 and decode the body; raises WebhookError (401, 400 or 415)."""
    lowered = lower_headers(headers)
    # Only SHA-256 signatures count: gidgethub would fall back to the SHA-1 header.
    lowered.pop("x-hub-signature", None)
    if secret is None:
        lowered.pop(GITHUB_SIGNATURE_HEADER, None)
    elif not lowered.get(GITHUB_SIGNATURE_HEADER, "").startswith("sha256="):
        raise WebhookError("signature check failed: no sha256= X-Hub-Signature-256", status=401)
    # Present but empty until checked after the signature: an unsigned request learns nothing.
    lowered.setdefault("x-github-event", "")
    lowered.setdefault("x-github-delivery", "")
    try:
        event = Event.from_http(lowered, body, secret=secret)
    except ValidationFailure as exc:
        raise WebhookError(f"signature check failed: {exc}", status=401) from exc
    except BadRequest as exc:
        raise _decode_error(lowered.get("content-type"), body, exc) from exc
    except RecursionError as exc:
        raise WebhookError("malformed JSON: nested too deeply", status=400) from exc
    except (UnicodeError, LookupError) as exc:  # e.g. an unknown charset in Content-Type
        raise WebhookError(f"body cannot be decoded: {exc}", status=400) from exc
    for name in ("x-github-event", "x-github-delivery"):
        if not lowered[name].strip():
            raise WebhookError(f"missing header {_header_title(name)}", status=400)
    if not isinstance(event.data, dict):
        raise WebhookError("body must be a JSON object", status=400)
    return Delivery(
        forge="github",
        event=_bounded(event.event, "X-GitHub-Event"),
        delivery_id=_bounded(event.delivery_id, "X-GitHub-Delivery"),
        payload=event.data,
    )


def verify_gitlab_delivery(
    headers: Mapping[str, str], body: bytes, *, token: str | None
) -> Delivery:
    """Check X-Gitlab-Token in constant time and decode the body; raises WebhookError."""
    lowered = lower_headers(headers)
    if token is not None:
        given = lowered.get("x-gitlab-token")
        if given is None:
            raise WebhookError("token check failed: X-Gitlab-Token is missing", status=401)
        if not hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass")
        ):
            raise WebhookError("token check failed: X-Gitlab-Token does not match", status=401)
    event = lowered.get("x-gitlab-event", "").strip()
    if not event:
        raise WebhookError("missing header X-Gitlab-Event", status=400)
    payload = decode_json(body)
    delivery_id = (
        lowered.get("idempotency-key", "").strip()
        or lowered.get("x-gitlab-event-uuid", "").strip()
        # Old GitLab versions send no id: the same body is the same delivery.
        or "sha256:" + _body_digest(event, body)
    )
    return Delivery(
        forge="gitlab",
        event=_bounded(event, "X-Gitlab-Event"),
        delivery_id=_bounded(delivery_id, "Idempotency-Key"),
        payload=payload,
    )


def decode_json(body: bytes) -> dict[str, Any]:
    """Decode a UTF-8 JSON object; raises WebhookError(400) naming what is wrong."""
    if not body:
        raise WebhookError("body is empty", status=400)
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        reason = f"body is not UTF-8: {exc.reason} at byte {exc.start}"
        raise WebhookError(reason, status=400) from exc
    except json.JSONDecodeError as exc:
        raise WebhookError(
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", status=400
        ) from exc
    except RecursionError as exc:
        raise WebhookError("malformed JSON: nested too deeply", status=400) from exc
    if not isinstance(payload, dict):
        raise WebhookError("body must be a JSON object", status=400)
    return payload


def _decode_error(content_type: str | None, body: bytes, exc: BadRequest) -> WebhookError:
    """Explain why gidgethub refused to decode a signed body."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "application/json":
        try:
            decode_json(body)
        except WebhookError as error:
            return error
    if media in ("application/json", "application/x-www-form-urlencoded"):
        return WebhookError("body cannot be decoded as a webhook payload", status=400)
    return WebhookError(
        f"unsupported Content-Type {content_type!r}: {exc}", status=int(exc.status_code)
    )


def _bounded(value: str, name: str) -> str:
    """Refuse absurd identifiers before they reach the database."""
    cleaned = value.strip()
    if len(cleaned) > MAX_ID_CHARS or not cleaned.isprintable():
        raise WebhookError(f"header {name} is not a valid identifier", status=400)
    return cleaned


def _body_digest(event: str, body: bytes) -> str:
    return hashlib.sha256(event.encode("utf-8", "surrogatepass") + b"\0" + body).hexdigest()


def _header_title(name: str) -> str:
    return {"x-github-event": "X-GitHub-Event", "x-github-delivery": "X-GitHub-Delivery"}[name]
