"""Normalization: every payload (our own and the recorded ones), variations, missing fields."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bot.errors import WebhookError
from bot.intake.normalize import (
    Closed,
    Commands,
    Ignored,
    Normalized,
    Pong,
    is_bot_author,
    normalize_delivery,
)
from bot.intake.verify import Delivery, verify_github_delivery, verify_gitlab_delivery
from bot.model import ReviewRequest
from tests.support.webhook_fixtures import (
    GITHUB_SECRET,
    GITLAB_TOKEN,
    PAYLOADS,
    RECORDED,
    Fixture,
    load_payload,
    load_recorded,
    payload_names,
    recorded_names,
    recorded_params,
    with_comment,
)


def through_intake(fixture: Fixture) -> Normalized:
    """Verify (signed like the forge would) and normalize a fixture."""
    headers = fixture.headers("delivery-1")
    delivery: Delivery
    if fixture.forge == "github":
        delivery = verify_github_delivery(headers, fixture.body, secret=GITHUB_SECRET)
    else:
        delivery = verify_gitlab_delivery(headers, fixture.body, token=GITLAB_TOKEN)
    return normalize_delivery(delivery, bot_login="review-bot")


def vary(name: str, change: Any) -> Normalized:
    """Normalize one of our payloads after `change(payload)` edited it in place."""
    fixture = load_payload(name)
    payload = fixture.payload
    change(payload)
    return through_intake(fixture.with_payload(payload))


def test_every_payload_has_an_expectation() -> None:
    assert payload_names() == sorted(PAYLOADS)


def test_every_recorded_delivery_has_an_expectation() -> None:
    assert recorded_names() == sorted(RECORDED)


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_every_payload_goes_through_intake(name: str) -> None:
    kind, action = PAYLOADS[name]
    check_outcome(through_intake(load_payload(name)), kind, action)


@pytest.mark.parametrize("name", recorded_params())
def test_every_recorded_delivery_goes_through_intake(name: str) -> None:
    kind, action = RECORDED[name]
    check_outcome(through_intake(load_recorded(name)), kind, action)


def check_outcome(outcome: Normalized, kind: str, action: str | None) -> None:
    """The delivery became what its table says: a request with that action, a pong, ..."""
    if kind == "request":
        assert isinstance(outcome, ReviewRequest), outcome
        assert outcome.action == action
        assert outcome.delivery_id == "delivery-1"
        assert outcome.head_sha and outcome.base_ref and outcome.head_ref and outcome.repo
    elif kind == "pong":
        assert isinstance(outcome, Pong)
        assert outcome.zen
    elif kind == "closed":
        assert isinstance(outcome, Closed), outcome
        assert outcome.repo and outcome.number > 0 and "without merging" in outcome.reason
    elif kind == "commands":
        assert isinstance(outcome, Commands), outcome
        assert outcome.commands and all(c.delivery_id == "delivery-1" for c in outcome.commands)
    else:
        assert isinstance(outcome, Ignored), outcome
        assert outcome.reason


def test_github_pull_request_fields_come_from_the_payload() -> None:
    fixture = load_payload("github/pull_request.opened.json")
    pull = fixture.payload["pull_request"]
    outcome = through_intake(fixture)
    assert isinstance(outcome, ReviewRequest)
    assert (outcome.forge, outcome.event) == ("github", "pull_request")
    assert outcome.repo == fixture.payload["repository"]["full_name"] == "acme/inventory"
    assert outcome.number == pull["number"]
    assert outcome.title == pull["title"]
    assert outcome.author == pull["user"]["login"]
    assert not outcome.author_is_bot
    assert (outcome.base_ref, outcome.base_sha) == (pull["base"]["ref"], pull["base"]["sha"])
    assert (outcome.head_ref, outcome.head_sha) == (pull["head"]["ref"], pull["head"]["sha"])
    assert outcome.labels == tuple(label["name"] for label in pull["labels"])
    assert (outcome.files_changed, outcome.additions, outcome.deletions) == (
        pull["changed_files"],
        pull["additions"],
        pull["deletions"],
    )
    assert outcome.installation_id == fixture.payload["installation"]["id"]
    assert not outcome.draft and not outcome.merged


def test_github_merged_pull_request() -> None:
    outcome = through_intake(load_payload("github/pull_request.closed.merged.json"))
    assert isinstance(outcome, ReviewRequest)
    assert outcome.merged and outcome.action == "merged"


def test_gitlab_merge_request_fields_come_from_the_payload() -> None:
    fixture = load_payload("gitlab/merge_request.open.json")
    payload = fixture.payload
    attributes = payload["object_attributes"]
    outcome = through_intake(fixture)
    assert isinstance(outcome, ReviewRequest)
    assert (outcome.forge, outcome.event) == ("gitlab", "merge_request")
    assert outcome.repo == payload["project"]["path_with_namespace"]
    assert outcome.project_id == payload["project"]["id"]
    assert outcome.number == attributes["iid"]
    assert outcome.base_ref == attributes["target_branch"]
    assert outcome.head_ref == attributes["source_branch"]
    assert outcome.head_sha == attributes["last_commit"]["id"]
    assert outcome.labels == tuple(label["title"] for label in payload["labels"])
    assert outcome.author == payload["user"]["username"]
    # GitLab hooks carry no sizes: the policy marks them pending.
    assert (outcome.files_changed, outcome.additions, outcome.deletions) == (None, None, None)


@pytest.mark.parametrize(
    ("action", "changes", "expected"),
    [
        ("edited", {"base": {"ref": {"from": "main"}}}, "edited"),
        ("edited", {"title": {"from": "old"}}, None),
        ("unlabeled", {}, "unlabeled"),
        ("ready_for_review", {}, "ready_for_review"),
        ("reopened", {}, "reopened"),
        ("assigned", {}, None),
        ("converted_to_draft", {}, None),
    ],
)
def test_github_actions(action: str, changes: dict[str, Any], expected: str | None) -> None:
    def change(payload: dict[str, Any]) -> None:
        payload["action"] = action
        payload["changes"] = changes

    outcome = vary("github/pull_request.opened.json", change)
    if expected is None:
        assert isinstance(outcome, Ignored)
    else:
        assert isinstance(outcome, ReviewRequest)
        assert outcome.action == expected


@pytest.mark.parametrize(
    ("login", "user_type", "is_bot"),
    [
        ("dependabot[bot]", "Bot", True),
        ("renovate[bot]", "Bot", True),
        ("some-app[bot]", "User", True),
        ("ci-helper", "Bot", True),
        ("renovate", "User", True),
        ("Dependabot", "User", True),
        ("project_42_bot_1f2e3d", None, True),
        ("group_7_bot", None, True),
        ("robot-fan", "User", False),
        ("codertocat", "User", False),
    ],
)
def test_bot_authors(login: str, user_type: str | None, is_bot: bool) -> None:
    assert is_bot_author(login, user_type=user_type) is is_bot

    def change(payload: dict[str, Any]) -> None:
        payload["pull_request"]["user"]["login"] = login
        payload["pull_request"]["user"]["type"] = user_type

    outcome = vary("github/pull_request.opened.json", change)
    assert isinstance(outcome, ReviewRequest)
    assert outcome.author_is_bot is is_bot


def test_github_draft_and_labels_variation() -> None:
    def change(payload: dict[str, Any]) -> None:
        payload["pull_request"]["draft"] = True
        payload["pull_request"]["labels"] = [{"name": "review-draft"}, {"name": "refactor"}]
        payload["pull_request"]["base"]["ref"] = "hotfix/2.1"

    outcome = vary("github/pull_request.opened.json", change)
    assert isinstance(outcome, ReviewRequest)
    assert outcome.draft and outcome.labels == ("review-draft", "refactor")
    assert outcome.base_ref == "hotfix/2.1"


COMMENT_BODIES = [
    ("/review", [("review", None)]),
    ("Thanks!\n/review priority p3\n/review status", [("priority", "P3"), ("status", None)]),
]
RECORDED_COMMENTS = [
    "github/issue_comment.created.on_pull_request.json",
    "gitlab/note_hook.merge_request.docs.json",
    "gitlab/note_hook.merge_request.atlantis.json",
]


@pytest.mark.parametrize(("body", "verbs"), COMMENT_BODIES)
@pytest.mark.parametrize(
    "name", ["github/issue_comment.created.json", "gitlab/note.merge_request.json"]
)
def test_comments_with_commands(name: str, body: str, verbs: list[tuple[str, str | None]]) -> None:
    check_commands(load_payload(name), body, verbs)


@pytest.mark.parametrize(
    ("name", "body", "verbs"),
    recorded_params([(name, *case) for name in RECORDED_COMMENTS for case in COMMENT_BODIES]),
)
def test_recorded_comments_with_commands(
    name: str, body: str, verbs: list[tuple[str, str | None]]
) -> None:
    check_commands(load_recorded(name), body, verbs)


def check_commands(fixture: Fixture, body: str, verbs: list[tuple[str, str | None]]) -> None:
    """The comment, its body set to `body`, carries these commands, with the payload's ids."""
    outcome = through_intake(with_comment(fixture, body))
    assert isinstance(outcome, Commands)
    assert [(c.verb, c.argument) for c in outcome.commands] == verbs
    assert all(c.delivery_id == "delivery-1" for c in outcome.commands)
    payload = fixture.payload
    if outcome.forge == "github":
        assert outcome.number == payload["issue"]["number"]
        assert outcome.comment_id == payload["comment"]["id"]
        assert outcome.author == payload["comment"]["user"]["login"]
    else:
        assert outcome.number == payload["merge_request"]["iid"]
        assert outcome.comment_id == payload["object_attributes"]["id"]
        assert outcome.project_id == payload["project"]["id"]


def test_a_bad_command_is_recorded_with_its_error() -> None:
    fixture = with_comment(load_payload("github/issue_comment.created.json"), "/review priority p0")
    outcome = through_intake(fixture)
    assert isinstance(outcome, Commands)
    assert outcome.commands == ()
    assert "P0 cannot be set" in outcome.errors[0]


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["comment"]["user"].update(login="review-bot"),
        lambda p: p["comment"]["user"].update(login="review-bot[bot]", type="Bot"),
        lambda p: p["comment"].update(body="<!-- review-bot:job=3 -->\n/review"),
        lambda p: p["comment"]["user"].update(login="dependabot[bot]", type="Bot"),
        lambda p: p.update(action="edited"),
        lambda p: p["issue"].pop("pull_request"),
    ],
)
def test_comments_that_are_never_commands(change: Any) -> None:
    fixture = with_comment(load_payload("github/issue_comment.created.json"), "/review")
    payload = fixture.payload
    change(payload)
    assert isinstance(through_intake(fixture.with_payload(payload)), Ignored)


def test_gitlab_note_on_an_issue_is_ignored() -> None:
    def change(payload: dict[str, Any]) -> None:
        payload["object_attributes"]["noteable_type"] = "Issue"
        payload["object_attributes"]["note"] = "/review"

    assert isinstance(vary("gitlab/note.merge_request.json", change), Ignored)


@pytest.mark.parametrize(
    ("changes", "oldrev", "expected"),
    [
        ({}, "abc123", "synchronize"),
        ({"target_branch": {"previous": "main", "current": "hotfix/1"}}, None, "edited"),
        ({"labels": {"previous": [], "current": [{"title": "refactor"}]}}, None, "labeled"),
        ({"draft": {"previous": True, "current": False}}, None, "ready_for_review"),
        ({"title": {"previous": "a", "current": "b"}}, None, None),
    ],
)
def test_gitlab_update_kinds(
    changes: dict[str, Any], oldrev: str | None, expected: str | None
) -> None:
    def change(payload: dict[str, Any]) -> None:
        payload["object_attributes"]["action"] = "update"
        payload["changes"] = changes
        payload["object_attributes"].pop("oldrev", None)
        if oldrev:
            payload["object_attributes"]["oldrev"] = oldrev

    outcome = vary("gitlab/merge_request.update.title.json", change)
    if expected is None:
        assert isinstance(outcome, Ignored)
    else:
        assert isinstance(outcome, ReviewRequest)
        assert outcome.action == expected


def test_gitlab_system_hook_is_routed_by_object_kind() -> None:
    fixture = load_payload("gitlab/merge_request.open.json")
    outcome = through_intake(Fixture(fixture.name, "gitlab", "System Hook", fixture.body))
    assert isinstance(outcome, ReviewRequest)


def test_gitlab_work_in_progress_is_a_draft() -> None:
    def change(payload: dict[str, Any]) -> None:
        payload["object_attributes"]["draft"] = None
        payload["object_attributes"]["work_in_progress"] = True

    outcome = vary("gitlab/merge_request.open.json", change)
    assert isinstance(outcome, ReviewRequest) and outcome.draft


def _delete(payload: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    for key in parents:
        payload = payload[key]
    del payload[last]


def _set(payload: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        payload = payload[key]
    payload[last] = value


REQUIRED = {
    "github/pull_request.opened.json": [
        "action", "pull_request", "repository.full_name", "pull_request.number",
        "pull_request.user.login", "pull_request.base.ref", "pull_request.base.sha",
        "pull_request.head.ref", "pull_request.head.sha",
    ],
    "gitlab/merge_request.open.json": [
        "object_attributes.action", "project.path_with_namespace", "object_attributes.iid",
        "object_attributes.target_branch", "object_attributes.source_branch",
        "object_attributes.last_commit.id", "user.username",
    ],
    "gitlab/note.merge_request.json": [
        "object_attributes.id", "merge_request.iid", "user.username",
    ],
    "github/issue_comment.created.json": [
        "comment.id", "comment.user.login", "issue.number",
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "path"), [(name, path) for name, paths in REQUIRED.items() for path in paths]
)
def test_missing_fields_are_400_naming_the_field(name: str, path: str) -> None:
    fixture = load_payload(name)
    if "comment" in name or "note" in name:
        fixture = with_comment(fixture, "/review")
    payload = fixture.payload
    _delete(payload, path)
    with pytest.raises(WebhookError) as caught:
        through_intake(fixture.with_payload(payload))
    assert caught.value.status == 400
    assert str(caught.value) == f"missing field {path}"


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        ("pull_request.number", "2", "must be an integer"),
        ("pull_request.number", True, "must be an integer"),
        ("pull_request.changed_files", 1.5, "must be an integer"),
        ("pull_request.draft", "yes", "must be true or false"),
        ("pull_request.labels", "bug", "must be a list"),
        ("pull_request.labels", [{"name": 3}], "labels with a 'name' string"),
        ("pull_request.user", [], "must be an object"),
        ("repository", None, "missing field repository"),
    ],
)
def test_wrongly_typed_fields_are_400(path: str, value: Any, fragment: str) -> None:
    payload = copy.deepcopy(load_payload("github/pull_request.opened.json").payload)
    _set(payload, path, value)
    with pytest.raises(WebhookError) as caught:
        through_intake(load_payload("github/pull_request.opened.json").with_payload(payload))
    assert caught.value.status == 400
    assert fragment in str(caught.value)
