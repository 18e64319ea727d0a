"""Webhook verification: GitHub signatures through gidgethub, GitLab tokens, decoding errors."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from gidgethub import ValidationFailure
from gidgethub.sansio import validate_event

from bot.errors import WebhookError
from bot.intake.verify import decode_json, verify_github_delivery, verify_gitlab_delivery

# GitHub's published example (docs: "Validating webhook deliveries").
VECTOR_SECRET = "It's a Secret to Everybody"
VECTOR_PAYLOAD = b"Hello, World!"
VECTOR_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

SECRET = "s3cret"
BODY = json.dumps({"action": "opened", "zen": "Keep it logically awesome."}).encode()


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(body: bytes = BODY, **overrides: str) -> dict[str, str]:
    headers = {
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "Content-Type": "application/json",
        "X-Hub-Signature-256": sign(body),
    }
    headers.update(overrides)
    return headers


def test_githubs_published_vector_validates() -> None:
    validate_event(VECTOR_PAYLOAD, signature=VECTOR_SIGNATURE, secret=VECTOR_SECRET)
    assert sign(VECTOR_PAYLOAD, VECTOR_SECRET) == VECTOR_SIGNATURE


def test_githubs_published_vector_fails_with_another_secret() -> None:
    with pytest.raises(ValidationFailure):
        validate_event(
            VECTOR_PAYLOAD, signature=VECTOR_SIGNATURE, secret="It's a secret to everybody"
        )


def test_githubs_vector_through_verify_reaches_json_decoding() -> None:
    # The signature is right, so the refusal is about the body (not JSON), not the signature.
    headers = github_headers(VECTOR_PAYLOAD, **{"X-Hub-Signature-256": VECTOR_SIGNATURE})
    with pytest.raises(WebhookError) as caught:
        verify_github_delivery(headers, VECTOR_PAYLOAD, secret=VECTOR_SECRET)
    assert caught.value.status == 400
    assert "malformed JSON" in str(caught.value)
    headers["X-Hub-Signature-256"] = VECTOR_SIGNATURE[:-1] + "f"
    with pytest.raises(WebhookError) as caught:
        verify_github_delivery(headers, VECTOR_PAYLOAD, secret=VECTOR_SECRET)
    assert caught.value.status == 401


def test_good_signature_yields_a_delivery() -> None:
    delivery = verify_github_delivery(github_headers(), BODY, secret=SECRET)
    assert delivery.forge == "github"
    assert delivery.event == "ping"
    assert delivery.delivery_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert delivery.payload["zen"] == "Keep it logically awesome."


def test_lower_case_header_names_work() -> None:
    headers = {name.lower(): value for name, value in github_headers().items()}
    assert verify_github_delivery(headers, BODY, secret=SECRET).event == "ping"


@pytest.mark.parametrize(
    "signature",
    [
        sign(BODY, "wrong"),
        sign(BODY + b" "),
        "sha256=",
        "sha256=zz",
        "md5=abc",
        "",
        "sha1=" + hmac.new(SECRET.encode(), BODY, hashlib.sha1).hexdigest(),
    ],
)
def test_bad_signatures_are_401(signature: str) -> None:
    with pytest.raises(WebhookError) as caught:
        verify_github_delivery(
            github_headers(**{"X-Hub-Signature-256": signature}), BODY, secret=SECRET
        )
    assert caught.value.status == 401


def test_missing_signature_is_401() -> None:
    headers = github_headers()
    del headers["X-Hub-Signature-256"]
    with pytest.raises(WebhookError) as caught:
        verify_github_delivery(headers, BODY, secret=SECRET)
    assert caught.value.status == 401


def test_sha1_header_alone_is_not_enough() -> None:
    headers = github_headers()
    del headers["X-Hub-Signature-256"]
    headers["X-Hub-Signature"] = "sha1=" + hmac.new(SECRET.encode(), BODY, hashlib.sha1).hexdigest()
    with pytest.raises(WebhookError) as caught:
        verify_github_delivery(headers, BODY, secret=SECRET)
    assert caught.value.status == 401


def test_without_a_secret_unsigned_and_signed_bodies_pass() -> None:
    headers = github_headers(**{"X-Hub-Signature-256": "sha256=whatever"})
    assert verify_github_delivery(headers, BODY, secret=None).event == "ping"


@pytest.mark.parametrize("missing", ["X-GitHub-Event", "X-GitHub-Delivery"])
def test_missing_github_headers_are_400(missing: str) -> None:
    headers = github_headers()
    del headers[missing]
    with pytest.raises(WebhookError) as caught:
        verify_github_delivery(headers, BODY, secret=SECRET)
    assert caught.value.status == 400
    assert missing in str(caught.value)


@pytest.mark.parametrize(
    ("body", "content_type", "status", "fragment"),
    [
        (b"{not json", "application/json", 400, "malformed JSON"),
        (b"", "application/json", 400, "JSON object"),
        (b"[1, 2]", "application/json", 400, "JSON object"),
        (b"\xff\xfe", "application/json", 400, "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "nested too deeply"),
        (b"{}", "text/plain", 415, "Content-Type"),
        (b"{}", "application/json; charset=no-such-charset", 400, "cannot be decoded"),
        (b"payload=%7Bbad", "application/x-www-form-urlencoded", 400, "cannot be decoded"),
    ],
)
def test_signed_but_undecodable_bodies(
    body: bytes, content_type: str, status: int, fragment: str
) -> None:
    headers = github_headers(body, **{"Content-Type": content_type})
    with pytest.raises(WebhookError) as caught:
        verify_github_delivery(headers, body, secret=SECRET)
    assert caught.value.status == status
    assert fragment in str(caught.value)


def test_form_encoded_github_delivery_is_decoded() -> None:
    from urllib.parse import quote

    body = b"payload=" + quote(BODY.decode()).encode()
    headers = github_headers(body, **{"Content-Type": "application/x-www-form-urlencoded"})
    assert verify_github_delivery(headers, body, secret=SECRET).payload["action"] == "opened"


def gitlab_headers(**overrides: str) -> dict[str, str]:
    headers = {
        "X-Gitlab-Event": "Merge Request Hook",
        "X-Gitlab-Token": "tok-123",
        "X-Gitlab-Event-UUID": "e2f3c1a4-0000-4000-8000-000000000001",
        "Content-Type": "application/json",
    }
    headers.update(overrides)
    return headers


def test_gitlab_token_match() -> None:
    delivery = verify_gitlab_delivery(gitlab_headers(), b'{"object_kind": "x"}', token="tok-123")
    assert delivery.forge == "gitlab"
    assert delivery.event == "Merge Request Hook"
    assert delivery.delivery_id == "e2f3c1a4-0000-4000-8000-000000000001"


@pytest.mark.parametrize("token", ["tok-12", "tok-1234", "TOK-123", "", "tök-123", "\udcff"])
def test_gitlab_wrong_token_is_401(token: str) -> None:
    with pytest.raises(WebhookError) as caught:
        verify_gitlab_delivery(gitlab_headers(**{"X-Gitlab-Token": token}), b"{}", token="tok-123")
    assert caught.value.status == 401


def test_gitlab_missing_token_is_401_before_the_body_is_read() -> None:
    headers = gitlab_headers()
    del headers["X-Gitlab-Token"]
    with pytest.raises(WebhookError) as caught:
        verify_gitlab_delivery(headers, b"not even json", token="tok-123")
    assert caught.value.status == 401


def test_gitlab_idempotency_key_wins_over_event_uuid() -> None:
    headers = gitlab_headers(**{"Idempotency-Key": "retry-key-1"})
    assert verify_gitlab_delivery(headers, b"{}", token="tok-123").delivery_id == "retry-key-1"


def test_gitlab_without_ids_dedupes_by_body() -> None:
    headers = gitlab_headers()
    del headers["X-Gitlab-Event-UUID"]
    first = verify_gitlab_delivery(headers, b'{"a": 1}', token="tok-123").delivery_id
    again = verify_gitlab_delivery(headers, b'{"a": 1}', token="tok-123").delivery_id
    other = verify_gitlab_delivery(headers, b'{"a": 2}', token="tok-123").delivery_id
    assert first == again != other


def test_gitlab_missing_event_is_400() -> None:
    headers = gitlab_headers()
    del headers["X-Gitlab-Event"]
    with pytest.raises(WebhookError) as caught:
        verify_gitlab_delivery(headers, b"{}", token="tok-123")
    assert caught.value.status == 400


def test_absurd_delivery_ids_are_refused() -> None:
    headers = gitlab_headers(**{"Idempotency-Key": "k" * 500})
    with pytest.raises(WebhookError) as caught:
        verify_gitlab_delivery(headers, b"{}", token="tok-123")
    assert caught.value.status == 400


def test_decode_json_names_the_position() -> None:
    with pytest.raises(WebhookError) as caught:
        decode_json(b'{"a":\n  nope}')
    assert "line 2 column 3" in str(caught.value)
