"""The intake web app against a real database: every payload, limits, redeliveries, outages."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from bot.app import create_app
from bot.clock import VirtualClock
from bot.config import DatabaseSettings, ForgeSettings, Settings, WebSettings
from bot.errors import ConfigError
from bot.model import JobState, Level
from bot.queue.store import QueueStore
from tests.support.web import ClientMaker
from tests.support.webhook_fixtures import (
    GITHUB_SECRET,
    GITLAB_TOKEN,
    PAYLOADS,
    RECORDED,
    Fixture,
    load_payload,
    load_recorded,
    recorded_params,
    with_comment,
)

SETTINGS = Settings(
    forges=ForgeSettings(github_webhook_secret=GITHUB_SECRET, gitlab_webhook_token=GITLAB_TOKEN)
)
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client(store: QueueStore, aiohttp_client: ClientMaker) -> Client:
    # The store is set up first so that it is closed (and its database dropped) only after
    # the app has stopped: fixtures are torn down in the reverse order of their set-up.
    return await aiohttp_client(create_app(SETTINGS, store=store, clock=VirtualClock()))


async def post(client: Client, fixture: Fixture, delivery_id: str | None = None) -> Any:
    path = f"/webhooks/{fixture.forge}"
    return await client.post(path, data=fixture.body, headers=fixture.headers(delivery_id))


async def count(store: QueueStore, table: str) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one())


async def delivery_row(store: QueueStore, delivery_id: str) -> Any:
    async with store.engine.connect() as conn:
        statement = text("SELECT * FROM webhook_deliveries WHERE delivery_id = :id")
        return (await conn.execute(statement, {"id": delivery_id})).one_or_none()


@pytest.mark.parametrize("name", sorted(PAYLOADS))
async def test_every_payload_over_http(client: Client, store: QueueStore, name: str) -> None:
    await check_over_http(client, store, load_payload(name), PAYLOADS[name][0])


@pytest.mark.parametrize("name", recorded_params())
async def test_every_recorded_delivery_over_http(
    client: Client, store: QueueStore, name: str
) -> None:
    await check_over_http(client, store, load_recorded(name), RECORDED[name][0])


async def check_over_http(client: Client, store: QueueStore, fixture: Fixture, kind: str) -> None:
    """The delivery is answered and recorded as what its table says it becomes."""
    response = await post(client, fixture, "d-1")
    answer = await response.json()
    row = await delivery_row(store, "d-1")
    assert row is not None, "every accepted delivery is recorded"
    jobs = await store.list_jobs()
    if kind == "request" and answer["status"] == "queued":
        assert response.status == 202
        assert [job.id for job in jobs] == [answer["job_id"]]
        assert answer["level"] in {"P0", "P1", "P2", "P3"}
        assert answer["reasons"]
        assert row.job_id == answer["job_id"]
    elif kind == "request":
        # The default policy does not review again what was merged outside a hotfix branch.
        assert (response.status, answer["status"]) == (200, "ignored")
        assert row.outcome == "skipped"
        assert jobs == []
    elif kind == "commands":
        assert (response.status, answer["status"]) == (200, "recorded")
        assert row.outcome == "command"
        assert jobs == []
    else:
        assert response.status == 200
        assert answer["status"] == kind
        assert row.outcome == kind
        assert jobs == []


async def test_a_pull_request_is_queued_with_level_and_reasons(
    client: Client, store: QueueStore
) -> None:
    fixture = load_payload("github/pull_request.opened.json")
    response = await post(client, fixture)
    answer = await response.json()
    assert response.status == 202
    assert answer["status"] == "queued"
    assert answer["level"] == "P1"
    assert answer["reasons"] == ["ordinary pull request"]
    job = await store.get_job(answer["job_id"])
    assert job is not None
    assert (job.repo, job.number, job.level, job.state) == (
        "acme/inventory",
        42,
        Level.P1,
        JobState.QUEUED,
    )
    assert job.reasons == ("ordinary pull request",)


async def test_a_hotfix_pull_request_is_p0(client: Client, store: QueueStore) -> None:
    fixture = load_payload("github/pull_request.opened.json")
    payload = fixture.payload
    payload["pull_request"]["base"]["ref"] = "hotfix/1.4.2"
    answer = await (await post(client, fixture.with_payload(payload))).json()
    assert answer["level"] == "P0"
    assert answer["rule"] == "hotfix"
    job = await store.get_job(answer["job_id"])
    assert job is not None and job.level is Level.P0


async def test_closing_without_merge_cancels_the_queued_review(
    client: Client, store: QueueStore
) -> None:
    opened = load_payload("github/pull_request.opened.json")
    queued = await (await post(client, opened)).json()
    closed = load_payload("github/pull_request.closed.not_merged.json").payload
    closed["repository"]["full_name"] = opened.payload["repository"]["full_name"]
    closed["pull_request"]["number"] = opened.payload["pull_request"]["number"]
    fixture = load_payload("github/pull_request.closed.not_merged.json").with_payload(closed)
    answer = await (await post(client, fixture, "close-1")).json()
    assert answer["status"] == "closed"
    assert answer["cancelled"] == [queued["job_id"]]
    job = await store.get_job(queued["job_id"])
    assert job is not None and job.state == JobState.CANCELLED
    assert (await store.job_history(job.id))[-1].reason == "pull request closed without merging"
    again = await (await post(client, fixture, "close-1")).json()
    assert again["status"] == "duplicate"


async def test_gitlab_merge_request_size_is_pending(client: Client) -> None:
    answer = await (await post(client, load_payload("gitlab/merge_request.open.json"))).json()
    assert answer["status"] == "queued"
    assert answer["size_pending"] is True
    assert any("size not known yet" in reason for reason in answer["reasons"])


async def test_redelivery_creates_nothing_new(client: Client, store: QueueStore) -> None:
    for name in ("github/pull_request.opened.json", "gitlab/merge_request.merge.json",
                 "github/ping.json", "github/push.json"):  # fmt: skip
        fixture = load_payload(name)
        delivery_id = str(uuid.uuid4())
        first = await (await post(client, fixture, delivery_id)).json()
        jobs_before = await count(store, "review_jobs")
        deliveries_before = await count(store, "webhook_deliveries")
        again = await post(client, fixture, delivery_id)
        answer = await again.json()
        assert again.status == 200
        assert answer["status"] == "duplicate", (name, first, answer)
        assert answer["duplicate"] == "delivery"
        assert await count(store, "review_jobs") == jobs_before
        assert await count(store, "webhook_deliveries") == deliveries_before


async def test_a_new_push_supersedes_the_queued_review(client: Client, store: QueueStore) -> None:
    opened = load_payload("github/pull_request.opened.json")
    first = await (await post(client, opened)).json()
    pushed = load_payload("github/pull_request.synchronize.json").payload
    pushed["pull_request"]["head"]["sha"] = "f" * 40
    second = await (await post(client, opened.with_payload(pushed))).json()
    assert second["status"] == "queued"
    assert second["superseded"] == [first["job_id"]]
    old = await store.get_job(first["job_id"])
    assert old is not None and old.state is JobState.SUPERSEDED


async def test_a_label_re_evaluates_the_level(client: Client, store: QueueStore) -> None:
    opened = load_payload("github/pull_request.opened.json")
    first = await (await post(client, opened)).json()
    labeled = load_payload("github/pull_request.labeled.json").payload
    labeled["pull_request"]["labels"].append({"name": "refactor"})
    answer = await (await post(client, opened.with_payload(labeled))).json()
    assert answer["status"] == "duplicate"
    assert answer["duplicate"] == "change"
    assert answer["job_id"] == first["job_id"]
    assert answer["level"] == "P2"
    job = await store.get_job(first["job_id"])
    assert job is not None and job.level is Level.P2
    assert await count(store, "review_jobs") == 1


async def test_commands_are_recorded(client: Client, store: QueueStore) -> None:
    fixture = with_comment(
        load_payload("github/issue_comment.created.json"),
        "/review priority p3\n/review status\n/review priority p0",
    )
    response = await post(client, fixture, "c-1")
    answer = await response.json()
    assert (response.status, answer["status"]) == (200, "recorded")
    assert answer["commands"] == [
        {"verb": "priority", "argument": "P3", "raw": "/review priority p3"},
        {"verb": "status", "argument": None, "raw": "/review status"},
    ]
    row = await delivery_row(store, "c-1")
    assert row.outcome == "command"
    assert row.detail["repo"] == "acme/inventory"
    assert row.detail["commands"] == answer["commands"]
    assert "P0 cannot be set" in row.detail["errors"][0]
    again = await (await post(client, fixture, "c-1")).json()
    assert again["status"] == "duplicate"


@pytest.mark.parametrize(
    ("forge_fixture", "edit", "field"),
    [
        (
            "github/pull_request.opened.json",
            lambda p: p["pull_request"]["head"].update(sha="a" * 5000),
            "pull_request.head.sha",
        ),
        (
            "github/pull_request.opened.json",
            lambda p: p["repository"].update(full_name="/api"),
            "repository.full_name",
        ),
        (
            "github/pull_request.opened.json",
            lambda p: p["repository"].update(full_name="acme/x<script>alert(1)</script>"),
            "repository.full_name",
        ),
        (
            "github/pull_request.opened.json",
            lambda p: p["pull_request"]["base"].update(ref="r" * 300),
            "pull_request.base.ref",
        ),
        (
            "gitlab/merge_request.open.json",
            lambda p: p["object_attributes"]["last_commit"].update(id="not-a-sha"),
            "object_attributes.last_commit.id",
        ),
        (
            "github/pull_request.closed.not_merged.json",
            lambda p: p["repository"].update(full_name="x" * 300),
            "repository.full_name",
        ),
    ],
)
async def test_misshapen_fields_are_400_naming_the_field_and_store_nothing(
    client: Client,
    store: QueueStore,
    forge_fixture: str,
    edit: Callable[[dict[str, Any]], None],
    field: str,
) -> None:
    fixture = load_payload(forge_fixture)
    payload = fixture.payload
    edit(payload)
    response = await post(client, fixture.with_payload(payload), "shape-1")
    assert response.status == 400
    answer = await response.json()
    assert field in json.dumps(answer), answer
    assert "<script>" not in await response.text()
    assert await count(store, "review_jobs") == 0
    assert await delivery_row(store, "shape-1") is None


def _signed(body: bytes, event: str = "pull_request", **extra: str) -> dict[str, str]:
    signature = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": "sha256=" + signature,
        **extra,
    }


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Hub-Signature-256": "sha256=" + "0" * 64},
        {"X-Hub-Signature-256": ""},
        {"X-Hub-Signature-256": "sha1=abc"},
    ],
)
async def test_bad_github_signatures_are_401_and_store_nothing(
    client: Client, store: QueueStore, headers: dict[str, str]
) -> None:
    body = load_payload("github/pull_request.opened.json").body
    response = await client.post("/webhooks/github", data=body, headers=_signed(body) | headers)
    assert response.status == 401
    assert (await response.json())["status"] == "rejected"
    assert await count(store, "webhook_deliveries") == 0
    assert await count(store, "review_jobs") == 0


async def test_missing_github_signature_is_401(client: Client, store: QueueStore) -> None:
    body = load_payload("github/pull_request.opened.json").body
    headers = _signed(body)
    del headers["X-Hub-Signature-256"]
    response = await client.post("/webhooks/github", data=body, headers=headers)
    assert response.status == 401
    assert await count(store, "webhook_deliveries") == 0


@pytest.mark.parametrize(
    "token", [None, "", "fixture-toke", GITLAB_TOKEN + "x", GITLAB_TOKEN.upper()]
)
async def test_bad_gitlab_tokens_are_401(
    client: Client, store: QueueStore, token: str | None
) -> None:
    fixture = load_payload("gitlab/merge_request.open.json")
    headers = fixture.headers()
    if token is None:
        del headers["X-Gitlab-Token"]
    else:
        headers["X-Gitlab-Token"] = token
    response = await client.post("/webhooks/gitlab", data=fixture.body, headers=headers)
    assert response.status == 401
    assert await count(store, "webhook_deliveries") == 0


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{oops", "malformed JSON"),
        (b"[]", "JSON object"),
        (b'{"action": "opened"}', "missing field pull_request"),
        (b'{"action": "opened", "pull_request": {"number": 1}}', "missing field pull_request.user"),
    ],
)
async def test_bad_bodies_are_400_with_a_reason(
    client: Client, store: QueueStore, body: bytes, fragment: str
) -> None:
    response = await client.post("/webhooks/github", data=body, headers=_signed(body))
    assert response.status == 400
    assert fragment in (await response.json())["reason"]
    assert await count(store, "webhook_deliveries") == 0


async def test_over_25_mb_is_413(client: Client, store: QueueStore) -> None:
    body = b'{"pad": "' + b"x" * (25 * 1024 * 1024) + b'"}'
    response = await client.post("/webhooks/github", data=io.BytesIO(body), headers=_signed(body))
    assert response.status == 413


async def test_chunked_body_over_the_limit_is_413(
    store: QueueStore, aiohttp_client: ClientMaker
) -> None:
    small = SETTINGS.with_changes(web={"max_body_bytes": 10_000})
    client = await aiohttp_client(create_app(small, store=store))
    body = b'{"pad": "' + b"x" * 20_000 + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    response = await client.post("/webhooks/github", data=chunks(), headers=_signed(body))
    assert response.status == 413
    under = b'{"zen": "' + b"x" * 5_000 + b'"}'
    response = await client.post("/webhooks/github", data=under, headers=_signed(under, "ping"))
    assert response.status == 200


async def test_ping_is_pong(client: Client) -> None:
    response = await post(client, load_payload("github/ping.json"))
    assert response.status == 200
    assert (await response.json())["status"] == "pong"


async def test_unknown_events_are_2xx_and_recorded(client: Client, store: QueueStore) -> None:
    body = b'{"action": "created", "starred_at": null}'
    headers = _signed(body, "star")
    response = await client.post("/webhooks/github", data=body, headers=headers)
    assert response.status == 200
    answer = await response.json()
    assert answer["status"] == "ignored"
    row = await delivery_row(store, headers["X-GitHub-Delivery"])
    assert row.outcome == "ignored"
    headers = load_payload("gitlab/push.json").headers()
    headers["X-Gitlab-Event"] = "Emoji Hook"
    response = await client.post(
        "/webhooks/gitlab", data=b'{"object_kind": "emoji"}', headers=headers
    )
    assert response.status == 200


async def test_health(client: Client) -> None:
    response = await client.get("/healthz")
    assert (response.status, (await response.json())["status"]) == (200, "ok")


@pytest.fixture
async def dead_store() -> AsyncIterator[QueueStore]:
    """A store whose database does not answer (nothing listens on port 1)."""
    unreachable = QueueStore.from_url("postgresql://postgres@127.0.0.1:1/nothing")
    try:
        yield unreachable
    finally:
        await unreachable.close()


async def test_database_outage_is_503(aiohttp_client: ClientMaker, dead_store: QueueStore) -> None:
    client = await aiohttp_client(create_app(SETTINGS, store=dead_store))
    for name in (
        "github/pull_request.opened.json",
        "github/ping.json",
        "github/push.json",
    ):
        response = await post(client, load_payload(name))
        assert response.status == 503, name
        assert response.headers["Retry-After"]
    health = await client.get("/healthz")
    assert health.status == 503
    # Refusals that need no database still answer as such.
    body = b"{}"
    response = await client.post(
        "/webhooks/github", data=body, headers=_signed(body) | {"X-Hub-Signature-256": "sha256=0"}
    )
    assert response.status == 401


def test_refuses_to_start_without_secrets(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="GITHUB_WEBHOOK_SECRET"):
        create_app(Settings(database=DatabaseSettings(url="postgresql://postgres@127.0.0.1/x")))


async def test_insecure_dev_accepts_unsigned_and_warns(
    store: QueueStore, aiohttp_client: ClientMaker, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bot.app"):
        app = create_app(Settings(web=WebSettings(insecure_dev=True)), store=store)
    assert any("INSECURE" in record.getMessage() for record in caplog.records)
    client = await aiohttp_client(app)
    body = load_payload("github/ping.json").body
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "ping",
               "X-GitHub-Delivery": "dev-1"}  # fmt: skip
    response = await client.post("/webhooks/github", data=body, headers=headers)
    assert (response.status, (await response.json())["status"]) == (200, "pong")


async def test_one_forge_configured_refuses_the_other(
    store: QueueStore, aiohttp_client: ClientMaker
) -> None:
    client = await aiohttp_client(
        create_app(Settings(forges=ForgeSettings(github_webhook_secret=GITHUB_SECRET)), store=store)
    )
    fixture = load_payload("gitlab/merge_request.open.json")
    response = await client.post("/webhooks/gitlab", data=fixture.body, headers=fixture.headers())
    assert response.status == 401
    assert "GITLAB_WEBHOOK_TOKEN" in (await response.json())["reason"]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
_header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from("é\u200b／"),
    max_size=40,
)


def _hostile_pull_request(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The recorded pull_request payload with random parts replaced by random JSON."""
    paths = [
        ("action",), ("pull_request",), ("pull_request", "number"), ("pull_request", "title"),
        ("pull_request", "user"), ("pull_request", "user", "login"), ("pull_request", "labels"),
        ("pull_request", "base", "ref"), ("pull_request", "head", "sha"),
        ("pull_request", "changed_files"), ("pull_request", "draft"), ("repository",),
        ("installation",),
    ]  # fmt: skip

    def mutate(changes: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
        payload = json.loads(json.dumps(base))
        for path, value in changes:
            target = payload
            for key in path[:-1]:
                if not isinstance(target, dict) or not isinstance(target.get(key), dict):
                    break
                target = target[key]
            else:
                target[path[-1]] = value
        return payload

    return st.lists(st.tuples(st.sampled_from(paths), _json_values), max_size=4).map(mutate)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_hostile_bodies_and_headers_never_get_a_5xx(
    client: Client, data: st.DataObject
) -> None:
    base = load_payload("github/pull_request.opened.json").payload
    forge = data.draw(st.sampled_from(["github", "gitlab"]))
    body = data.draw(
        st.one_of(
            st.binary(max_size=300),
            _json_values.map(lambda value: json.dumps(value).encode()),
            _hostile_pull_request(base).map(lambda value: json.dumps(value).encode()),
        )
    )
    event = data.draw(
        st.sampled_from(
            [
                "pull_request",
                "issue_comment",
                "ping",
                "Merge Request Hook",
                "Note Hook",
                "System Hook",
            ]
        )
        | _header_text
    )
    headers: dict[str, str] = {}
    if forge == "github":
        headers = _signed(body, event) if data.draw(st.booleans()) else {"X-GitHub-Event": event}
    else:
        headers = {"X-Gitlab-Event": event, "X-Gitlab-Token": GITLAB_TOKEN}
    headers["Content-Type"] = data.draw(
        st.sampled_from(["application/json", "text/plain", "application/json; charset=latin-1",
                         "application/x-www-form-urlencoded", "application/json; charset=bogus"])
    )  # fmt: skip
    extra = data.draw(
        st.dictionaries(
            st.sampled_from(["X-GitHub-Delivery", "Idempotency-Key", "X-Gitlab-Event-UUID",
                             "X-Hub-Signature", "Content-Encoding"]),
            _header_text,
            max_size=3,
        )
    )  # fmt: skip
    headers.update(extra)
    response = await client.post(f"/webhooks/{forge}", data=body, headers=headers)
    assert response.status < 500, (response.status, await response.text())
    if response.status < 300:
        assert (await response.json())["status"] in {
            "queued", "duplicate", "ignored", "pong", "recorded",
        }  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "status"),
    [
        (lambda p: p["pull_request"].update(title="nul \u0000 and lone \ud800 surrogate"), 202),
        (lambda p: p["pull_request"]["labels"].append({"name": "bad\u0000label"}), 202),
        (lambda p: p.update(action="opened\u0000"), 200),
        (lambda p: p["pull_request"].update(number=10**30), 400),
        (lambda p: p["pull_request"].update(changed_files=-1), 400),
    ],
)
async def test_strings_the_database_cannot_hold_do_not_cause_5xx(
    client: Client, store: QueueStore, edit: Callable[[dict[str, Any]], None], status: int
) -> None:
    fixture = load_payload("github/pull_request.opened.json")
    payload = fixture.payload
    edit(payload)
    # json.dumps escapes NUL and lone surrogates as \u0000 / \ud800, exactly as a forge could.
    response = await post(client, fixture.with_payload(payload))
    assert response.status == status, await response.text()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_undecodable_content_encoding_is_400(client: Client, encoding: str) -> None:
    body = b"not compressed at all"
    headers = _signed(body) | {"Content-Encoding": encoding, "Connection": "close"}
    response = await client.post("/webhooks/github", data=body, headers=headers)
    assert response.status == 400
    assert "body cannot be read" in (await response.json())["reason"]
