"""Webhook payloads: the project's own (tests/data/webhooks) and the recorded ones in
../shared/fixtures, what each should become, and signing."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SHARED_DIR, shared_dir

PAYLOADS_DIR = Path(__file__).resolve().parents[1] / "data" / "webhooks"
GITHUB_SECRET = "fixture-secret"
GITLAB_TOKEN = "fixture-token"

# What each delivery becomes: "request" (a review request with that action), "commands",
# "closed" (closed without merging: cancels its queued review), "ignored" or "pong". Every file
# in the directory must be listed in its table.
PAYLOADS: dict[str, tuple[str, str | None]] = {
    "github/pull_request.opened.json": ("request", "opened"),
    "github/pull_request.synchronize.json": ("request", "synchronize"),
    "github/pull_request.labeled.json": ("request", "labeled"),
    "github/pull_request.closed.merged.json": ("request", "merged"),
    "github/pull_request.closed.not_merged.json": ("closed", None),
    "github/issue_comment.created.json": ("ignored", None),  # a question, no command
    "github/issue_comment.created.on_issue.json": ("ignored", None),  # "/review" on an issue
    "github/check_run.rerequested.json": ("commands", None),
    "github/ping.json": ("pong", None),
    "github/push.json": ("ignored", None),
    "gitlab/merge_request.open.json": ("request", "opened"),
    "gitlab/merge_request.update.json": ("request", "synchronize"),
    "gitlab/merge_request.update.title.json": ("ignored", None),
    "gitlab/merge_request.merge.json": ("request", "merged"),
    "gitlab/merge_request.close.json": ("closed", None),
    "gitlab/note.merge_request.json": ("ignored", None),  # a question, no command
    "gitlab/push.json": ("ignored", None),
}
# The deliveries GitHub and GitLab recorded (../shared/fixtures/README.md).
RECORDED: dict[str, tuple[str, str | None]] = {
    "github/pull_request.opened.json": ("request", "opened"),
    "github/pull_request.opened.null_body.json": ("request", "opened"),
    "github/pull_request.synchronize.json": ("request", "synchronize"),
    "github/pull_request.labeled.json": ("request", "labeled"),
    "github/pull_request.closed.merged.json": ("request", "merged"),
    "github/pull_request.closed.not_merged.json": ("closed", None),
    "github/issue_comment.created.on_pull_request.json": ("ignored", None),  # placeholder body
    "github/issue_comment.created.on_issue.json": ("ignored", None),
    "github/issue_comment.created.on_issue.with_installation.json": ("ignored", None),
    "github/ping.json": ("pong", None),
    "github/ping.with_app_id.json": ("pong", None),
    "github/push.new_branch.json": ("ignored", None),
    "github/push.tag_deleted.json": ("ignored", None),
    "github/push.branch_commit.json": ("ignored", None),
    "github/installation.created.json": ("ignored", None),
    "github/installation.deleted.json": ("ignored", None),
    "github/pull_request_review_comment.created.json": ("ignored", None),
    "github/pull_request_review.submitted.json": ("ignored", None),
    "gitlab/merge_request_hook.open.gitlab_com.json": ("request", "opened"),
    "gitlab/merge_request_hook.open.docs.json": ("request", "opened"),
    "gitlab/merge_request_hook.update.new_commits.json": ("request", "synchronize"),
    "gitlab/merge_request_hook.update.edited.json": ("ignored", None),
    "gitlab/merge_request_hook.merge.json": ("request", "merged"),
    "gitlab/merge_request_hook.close.json": ("closed", None),
    "gitlab/note_hook.merge_request.atlantis.json": ("ignored", None),  # "This MR needs work."
    "gitlab/note_hook.merge_request.docs.json": ("ignored", None),
    "gitlab/pipeline_hook.docs.json": ("ignored", None),
    "gitlab/push_hook.docs.json": ("ignored", None),
    "gitlab/push_hook.selfhosted.json": ("ignored", None),
}

_GITLAB_EVENTS = {
    "merge_request": "Merge Request Hook",
    "note": "Note Hook",
    "push": "Push Hook",
    "pipeline": "Pipeline Hook",
}


@dataclass(frozen=True)
class Fixture:
    """One recorded delivery with the headers its forge would send."""

    name: str
    forge: str
    event: str
    body: bytes

    @property
    def payload(self) -> Any:
        return json.loads(self.body)

    def with_payload(self, payload: Any) -> Fixture:
        return Fixture(self.name, self.forge, self.event, json.dumps(payload).encode())

    def headers(self, delivery_id: str | None = None) -> dict[str, str]:
        delivery_id = delivery_id or str(uuid.uuid4())
        if self.forge == "github":
            signature = hmac.new(GITHUB_SECRET.encode(), self.body, hashlib.sha256).hexdigest()
            return {
                "Content-Type": "application/json",
                "X-GitHub-Event": self.event,
                "X-GitHub-Delivery": delivery_id,
                "X-Hub-Signature-256": "sha256=" + signature,
            }
        return {
            "Content-Type": "application/json",
            "X-Gitlab-Event": self.event,
            "X-Gitlab-Token": GITLAB_TOKEN,
            "X-Gitlab-Event-UUID": delivery_id,
            "Idempotency-Key": delivery_id,
        }


def fixtures_dir() -> Path:
    return shared_dir() / "fixtures"


def load_payload(name: str) -> Fixture:
    """One of the project's own payloads, with the event header its forge sends with it."""
    return _fixture(name, (PAYLOADS_DIR / name).read_bytes())


def payload_names() -> list[str]:
    """Every payload file in tests/data/webhooks."""
    return sorted(str(path.relative_to(PAYLOADS_DIR)) for path in PAYLOADS_DIR.glob("*/*.json"))


def recorded_params(cases: Sequence[Any] = ()) -> list[Any]:
    """Cases over recorded deliveries (by default every one) to parametrize a test with; one
    skipped case in their place when ../shared is absent."""
    cases = list(cases) or sorted(RECORDED)
    if (SHARED_DIR / "fixtures").is_dir():
        return cases
    reason = f"{SHARED_DIR / 'fixtures'} is absent: no recorded deliveries to replay"
    first = cases[0] if isinstance(cases[0], tuple) else (cases[0],)
    return [pytest.param(*first, marks=pytest.mark.skip(reason=reason), id="recorded")]


def load_recorded(name: str) -> Fixture:
    """A recorded delivery from ../shared/fixtures (skips the test when it is absent)."""
    return _fixture(name, (fixtures_dir() / name).read_bytes())


def _fixture(name: str, body: bytes) -> Fixture:
    """Give a delivery the event header its forge sends with it."""
    forge, file_name = name.split("/", 1)
    if forge == "github":
        event = file_name.split(".", 1)[0]
    elif file_name == "push_hook.selfhosted.json":
        event = "Service Hook"  # as recorded by the project that captured it (PROVENANCE.tsv)
    else:
        event = _GITLAB_EVENTS[json.loads(body)["object_kind"]]
    return Fixture(name=name, forge=forge, event=event, body=body)


def recorded_names() -> list[str]:
    """Every fixture file present in ../shared/fixtures."""
    root = fixtures_dir()
    return sorted(str(path.relative_to(root)) for path in root.glob("*/*.json"))


def with_comment(fixture: Fixture, text: str) -> Fixture:
    """The comment fixture with its body (or note) set to `text`."""
    payload = fixture.payload
    if fixture.forge == "github":
        assert isinstance(payload["comment"]["body"], str)
        payload["comment"]["body"] = text
    else:
        payload["object_attributes"]["note"] = text
    return fixture.with_payload(payload)
