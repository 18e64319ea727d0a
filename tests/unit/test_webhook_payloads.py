"""Our own GitHub payloads (tests/data/webhooks) say only what GitHub's webhook schemas document."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tests.conftest import shared_dir
from tests.support.webhook_fixtures import PAYLOADS, load_payload

# The schema (in ../shared/openapi/github-webhooks-subset.json) of each GitHub payload; the
# subset has none for `push`, an event the bot ignores.
SCHEMAS = {
    "github/pull_request.opened.json": "pull-request-opened",
    "github/pull_request.synchronize.json": "pull-request-synchronize",
    "github/pull_request.labeled.json": "pull-request-labeled",
    "github/pull_request.closed.merged.json": "pull-request-closed",
    "github/pull_request.closed.not_merged.json": "pull-request-closed",
    "github/issue_comment.created.json": "issue-comment-created",
    "github/issue_comment.created.on_issue.json": "issue-comment-created",
    "github/check_run.rerequested.json": "check-run-rerequested",
    "github/ping.json": "ping",
}
WITHOUT_SCHEMA = {"github/push.json"}

_KINDS = {
    "object": lambda item: isinstance(item, dict),
    "array": lambda item: isinstance(item, list),
    "string": lambda item: isinstance(item, str),
    "integer": lambda item: isinstance(item, int) and not isinstance(item, bool),
    "number": lambda item: isinstance(item, int | float) and not isinstance(item, bool),
    "boolean": lambda item: isinstance(item, bool),
    "null": lambda item: item is None,
}


def _parts(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The schema and every schema it is `allOf`, flattened."""
    return [schema, *(part for sub in schema.get("allOf", []) for part in _parts(sub))]


def undocumented(schema: Mapping[str, Any], value: Any, where: str = "$") -> list[str]:
    """Where `value` goes beyond `schema` (JSON Schema 2020-12): a field it does not list, a
    type, enum value or constant it does not allow; nested. Absent fields are not errors."""
    errors: list[str] = []
    parts = _parts(schema)
    for part in parts:
        kinds = part.get("type")
        if kinds is not None:
            allowed = [kinds] if isinstance(kinds, str) else list(kinds)
            if not any(_KINDS[kind](value) for kind in allowed):
                return [f"{where}: {type(value).__name__} where the schema says {allowed}"]
        if "enum" in part and value not in part["enum"]:
            errors.append(f"{where}: {value!r} is not one of {part['enum']}")
        if "const" in part and value != part["const"]:
            errors.append(f"{where}: {value!r} is not {part['const']!r}")
        for key in ("anyOf", "oneOf"):
            if key in part:
                found = [undocumented(branch, value, where) for branch in part[key]]
                if all(found):
                    errors.append(f"{where}: matches none of {key}: {min(found, key=len)[0]}")
    if isinstance(value, dict):
        properties: dict[str, Any] = {}
        for part in parts:
            properties.update(part.get("properties", {}))
        free_form = not properties or any(
            part.get("additionalProperties") not in (None, False) for part in parts
        )
        for name, item in value.items():
            if name in properties:
                errors += undocumented(properties[name], item, f"{where}.{name}")
            elif not free_form:
                errors.append(f"{where}: {name!r} is not a documented field")
    if isinstance(value, list):
        items = next((part["items"] for part in parts if "items" in part), None)
        if items is not None:
            for index, item in enumerate(value):
                errors += undocumented(items, item, f"{where}[{index}]")
    return errors


def test_every_github_payload_has_its_schema_named() -> None:
    github = {name for name in PAYLOADS if name.startswith("github/")}
    assert github == set(SCHEMAS) | WITHOUT_SCHEMA


def test_the_checker_finds_what_goes_beyond_a_schema() -> None:
    schema = {
        "type": "object",
        "required": ["action"],
        "properties": {
            "action": {"type": "string", "enum": ["opened"]},
            "number": {"type": "integer"},
            "milestone": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {}}]},
            "user": {"allOf": [{"type": "object", "properties": {"login": {"type": "string"}}}]},
        },
    }
    assert undocumented(schema, {"action": "opened", "number": 3, "milestone": None}) == []
    assert undocumented(schema, {"action": "closed"}) == [
        "$.action: 'closed' is not one of ['opened']"
    ]
    assert undocumented(schema, {"number": True}) == [
        "$.number: bool where the schema says ['integer']"
    ]
    assert undocumented(schema, {"milestone": 4})[0].startswith(
        "$.milestone: matches none of anyOf"
    )
    assert undocumented(schema, {"user": {"login": "a", "logn": "b"}}) == [
        "$.user: 'logn' is not a documented field"
    ]


def test_our_github_payloads_match_the_webhook_schemas() -> None:
    """Every field of our GitHub payloads is one GitHub documents for that event and action,
    with a documented type, and the event's top-level required fields are all there."""
    path = shared_dir() / "openapi" / "github-webhooks-subset.json"
    webhooks = json.loads(path.read_text())["webhooks"]
    errors: dict[str, list[str]] = {}
    for name, key in sorted(SCHEMAS.items()):
        schema = webhooks[key]["schema"]
        payload = load_payload(name).payload
        missing = [f"$: required {field!r} is missing" for field in schema.get("required", [])
                   if field not in payload]  # fmt: skip
        found = missing + undocumented(schema, payload)
        if found:
            errors[name] = found
    assert errors == {}
