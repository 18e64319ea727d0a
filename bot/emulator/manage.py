"""The emulator's own control surface: which PRs it holds, new PRs from outside, what was posted.

`bot emulator` serves these beside the forge APIs, under `/_emulator/` (a prefix neither GitHub
nor GitLab uses):

    GET  /_emulator/prs      the PRs/MRs the emulator holds, with their head shas
    POST /_emulator/prs      add one (or a list): a PR description, or a recorded webhook
                             payload ({"webhook": {...}}) so the bot finds the PR it names
    GET  /_emulator/posted   what the bot posted (reviews, comments, notes, reactions,
                             statuses, check runs); filters: ?forge=&kind=&repo=&number=

A description may give whole trees instead of patches: {"base": {path: text}, "head": {...}}.
New PRs (and pushes by a new head sha) send their webhook when the emulator has a bot to send
to; bot.emulator.outside serves pushes, files, comments and what is on a PR.

`bot emulator --prs FILE` loads the same descriptions (a JSON list, one object, or JSON lines)
at start. Parsing is pure; the handlers only call it and the emulator's state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web

from bot.emulator.activity import record_number
from bot.emulator.diffs import generate_file_changes
from bot.emulator.hooks import HookTarget, pull_hook, send_hook
from bot.emulator.pushes import ensure_history, push_patches, record_trees
from bot.emulator.quiet import diff_trees
from bot.emulator.state import EMULATOR_STATE, EmulatedPull, EmulatorState, Record
from bot.model import FileChange, Forge

CONTROL_PREFIX = "/_emulator"
MAX_NUMBER = 2**31 - 1


class PullSpecError(ValueError):
    """A PR description that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class PullSpec:
    """A PR/MR to hold: where it is, its refs and shas, and its changed files."""

    forge: Forge
    repo: str
    number: int
    files: tuple[FileChange, ...]
    head_sha: str | None = None
    base_sha: str | None = None
    base_ref: str = "main"
    head_ref: str | None = None
    title: str | None = None
    author: str = "octocat"
    labels: tuple[str, ...] = ()
    draft: bool = False
    # Whole trees (path -> text) of the base and the head, when given instead of patches.
    trees: tuple[Mapping[str, str], Mapping[str, str]] | None = None


def _text(data: Mapping[str, Any], key: str, *, where: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value:
        raise PullSpecError(f"{where}{key} must be a non-empty string")
    return value


def _optional_text(data: Mapping[str, Any], key: str, *, where: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PullSpecError(f"{where}{key} must be a non-empty string")
    return value


def _count(data: Mapping[str, Any], key: str, *, where: str, default: int, low: int = 0) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_NUMBER:
        raise PullSpecError(f"{where}{key} must be an integer from {low}")
    return value


def tree_from_json(value: Any, *, where: str, deletions: bool = False) -> dict[str, Any]:
    """Files by path: {"path": "text"} (with `deletions`, null deletes the path)."""
    if not isinstance(value, Mapping):
        raise PullSpecError(f"{where} must be an object of path: text")
    for path, text in value.items():
        if not path or not (isinstance(text, str) or (deletions and text is None)):
            allowed = "a string or null" if deletions else "a string"
            raise PullSpecError(f"{where}[{path!r}] must be {allowed}")
    return dict(value)


def _trees(
    data: Mapping[str, Any], *, where: str
) -> tuple[Mapping[str, str], Mapping[str, str]] | None:
    if "head" not in data:
        if "base" in data:
            raise PullSpecError(f"{where}base needs head (the files of the pull request's head)")
        return None
    base = tree_from_json(data.get("base", {}), where=f"{where}base")
    head = tree_from_json(data["head"], where=f"{where}head")
    if "files" in data:
        raise PullSpecError(f"{where}files and head exclude each other: give patches or trees")
    if base == head:
        raise PullSpecError(f"{where}head is the same as base: the pull request changes nothing")
    return base, head


def _files(data: Mapping[str, Any], *, where: str, seed: int) -> tuple[FileChange, ...]:
    """Given files, or generated ones (`changed_lines` over `file_count` files)."""
    given = data.get("files")
    if given is None:
        lines = _count(data, "changed_lines", where=where, default=60, low=1)
        count = _count(data, "file_count", where=where, default=2, low=1)
        return tuple(generate_file_changes(changed_lines=lines, files=count, seed=seed))
    if not isinstance(given, list) or not given:
        raise PullSpecError(f"{where}files must be a non-empty list of files")
    files = []
    for index, item in enumerate(given):
        at = f"{where}files[{index}]."
        if not isinstance(item, Mapping):
            raise PullSpecError(f"{where}files[{index}] must be an object")
        patch = item.get("patch")
        if patch is not None and not isinstance(patch, str):
            raise PullSpecError(f"{at}patch must be a string or null")
        files.append(
            FileChange(
                path=_text(item, "path", where=at),
                additions=_count(item, "additions", where=at, default=0),
                deletions=_count(item, "deletions", where=at, default=0),
                patch=patch,
                status=_text(item, "status", where=at, default="modified"),
                previous_path=_optional_text(item, "previous_path", where=at),
            )
        )
    return tuple(files)


def pull_spec_from_json(data: Any, *, where: str = "") -> PullSpec:
    """A PR description as JSON data; raises PullSpecError naming the bad field."""
    if not isinstance(data, Mapping):
        raise PullSpecError(f"{where or 'the body'} must be a JSON object")
    if "webhook" in data:
        return pull_spec_from_webhook(data["webhook"], where=f"{where}webhook.")
    forge = data.get("forge", "github")
    if forge not in ("github", "gitlab"):
        raise PullSpecError(f"{where}forge must be github or gitlab")
    repo = _text(data, "repo", where=where)
    if "/" not in repo.strip("/"):
        raise PullSpecError(f"{where}repo must be owner/name (GitHub) or group/project (GitLab)")
    number = _count(data, "number", where=where, default=0, low=1)
    labels = data.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise PullSpecError(f"{where}labels must be a list of strings")
    draft = data.get("draft", False)
    if not isinstance(draft, bool):
        raise PullSpecError(f"{where}draft must be true or false")
    trees = _trees(data, where=where)
    files = (
        tuple(diff_trees(*trees))
        if trees
        else _files(data, where=where, seed=_count(data, "seed", where=where, default=number))
    )
    return PullSpec(
        forge=forge,
        repo=repo,
        number=number,
        files=files,
        trees=trees,
        head_sha=_optional_text(data, "head_sha", where=where),
        base_sha=_optional_text(data, "base_sha", where=where),
        base_ref=_text(data, "base_ref", where=where, default="main"),
        head_ref=_optional_text(data, "head_ref", where=where),
        title=_optional_text(data, "title", where=where),
        author=_text(data, "author", where=where, default="octocat"),
        labels=tuple(labels),
        draft=draft,
    )


def pull_spec_from_webhook(payload: Any, *, where: str = "webhook.") -> PullSpec:
    """The PR a recorded GitHub `pull_request` or GitLab merge request delivery names."""
    if not isinstance(payload, Mapping):
        raise PullSpecError(f"{where.rstrip('.')} must be a JSON object")
    try:
        if isinstance(payload.get("pull_request"), Mapping):
            pull = payload["pull_request"]
            description: dict[str, Any] = {
                "forge": "github",
                "repo": payload["repository"]["full_name"],
                "number": pull["number"],
                "title": pull.get("title"),
                "author": pull["user"]["login"],
                "base_ref": pull["base"]["ref"],
                "head_ref": pull["head"]["ref"],
                "base_sha": pull["base"]["sha"],
                "head_sha": pull["head"]["sha"],
                "labels": [label["name"] for label in pull.get("labels") or []],
                "draft": bool(pull.get("draft")),
                "changed_lines": max(
                    1, (pull.get("additions") or 0) + (pull.get("deletions") or 0)
                ),
                "file_count": max(1, pull.get("changed_files") or 1),
            }
        elif payload.get("object_kind") == "merge_request":
            attributes = payload["object_attributes"]
            description = {
                "forge": "gitlab",
                "repo": payload["project"]["path_with_namespace"],
                "number": attributes["iid"],
                "title": attributes.get("title"),
                "author": (payload.get("user") or {}).get("username") or "octocat",
                "base_ref": attributes["target_branch"],
                "head_ref": attributes["source_branch"],
                "head_sha": attributes["last_commit"]["id"],
                "labels": [label["title"] for label in payload.get("labels") or []],
                "draft": bool(attributes.get("draft") or attributes.get("work_in_progress")),
            }
        else:
            raise PullSpecError(
                f"{where.rstrip('.')} is neither a GitHub pull_request delivery nor a GitLab "
                "merge request hook"
            )
    except (KeyError, TypeError) as exc:
        raise PullSpecError(f"{where.rstrip('.')} lacks the field {exc}") from exc
    return pull_spec_from_json(description, where=where)


def pull_specs_from_text(text: str, *, source: str) -> list[PullSpec]:
    """Descriptions from a file: a JSON list, one JSON object, or JSON lines."""
    stripped = text.strip()
    if not stripped:
        return []
    try:
        data = json.loads(stripped)
    except ValueError:
        data = None
    if data is not None:
        items = data if isinstance(data, list) else [data]
        return [pull_spec_from_json(item, where=f"{source}[{i}]: ") for i, item in enumerate(items)]
    specs = []
    for line_number, line in enumerate(stripped.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise PullSpecError(f"{source}:{line_number}: not JSON: {exc}") from exc
        specs.append(pull_spec_from_json(item, where=f"{source}:{line_number}: "))
    return specs


def load_pull_specs(path: str) -> list[PullSpec]:
    """Read `--prs FILE`; raises PullSpecError."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PullSpecError(f"{path}: cannot be read: {exc}") from exc
    return pull_specs_from_text(text, source=path)


def add_pull_spec(state: EmulatorState, spec: PullSpec) -> EmulatedPull:
    """Hold the PR: a new one is added (with commits for its base and head); a known one with a
    new head sha gets a push (a child of its old head)."""
    key = (spec.forge, spec.repo, spec.number)
    known = state.pulls.get(key)
    if known is None:
        pull = state.add_pull(
            spec.forge,
            spec.repo,
            spec.number,
            files=spec.files,
            head_sha=spec.head_sha,
            base_sha=spec.base_sha,
            base_ref=spec.base_ref,
            head_ref=spec.head_ref,
            title=spec.title,
            author=spec.author,
            labels=spec.labels,
            draft=spec.draft,
        )
        if spec.trees is not None:
            record_trees(state, pull, *spec.trees)
        else:
            ensure_history(state, pull)
        return pull
    if spec.head_sha is not None and spec.head_sha != known.newest.head_sha:
        push_patches(state, known, spec.files, spec.head_sha)
    return known


def pull_api_url(pull: EmulatedPull, base_url: str) -> str:
    """Where the bot reads this PR on the emulator."""
    if pull.forge == "github":
        return f"{base_url}/repos/{pull.repo}/pulls/{pull.number}"
    return f"{base_url}/api/v4/projects/{quote(pull.repo, safe='')}/merge_requests/{pull.number}"


def pull_json(pull: EmulatedPull, base_url: str) -> dict[str, Any]:
    """One held PR as the control API lists it."""
    return {
        "forge": pull.forge,
        "repo": pull.repo,
        "number": pull.number,
        "title": pull.title,
        "author": pull.author,
        "base_ref": pull.base_ref,
        "head_ref": pull.head_ref,
        "base_sha": pull.newest.base_sha,
        "head_sha": pull.newest.head_sha,
        "files": [change.path for change in pull.files],
        "versions": [version.head_sha for version in pull.versions],
        "state": pull.state,
        "api_url": pull_api_url(pull, base_url),
    }


def record_json(record: Record, number: int | None = None) -> dict[str, Any]:
    """One thing the bot posted (`number`: the pull request a status on its commit is about)."""
    return {
        "forge": record.forge,
        "kind": record.kind,
        "repo": record.repo,
        "number": record.number if number is None else number,
        "body": record.body,
        "data": record.data,
    }


def emulator_banner(state: EmulatorState, base_url: str, hooks: HookTarget | None = None) -> str:
    """What `bot emulator` prints at start: where the APIs are, the PRs held, where to look."""
    lines = [
        f"forge emulator: GitHub API at {base_url}, GitLab API at {base_url}/api/v4",
        f"holding {len(state.pulls)} pull/merge requests:",
    ]
    for pull in state.pulls.values():
        lines.append(
            f"  {pull.forge:<6} {pull.repo}#{pull.number}  head {pull.newest.head_sha}  "
            f"{pull.base_ref} <- {pull.head_ref}  ({len(pull.files)} files)"
        )
    lines += [
        f"posted reviews and comments: GET {base_url}{CONTROL_PREFIX}/posted"
        "[?forge=&kind=&repo=&number=]",
        f'add a PR (a description or {{"webhook": payload}}): POST {base_url}{CONTROL_PREFIX}/prs'
        " (or start with --prs FILE)",
        f"push, set files, comment: POST {CONTROL_PREFIX}/push, PUT {CONTROL_PREFIX}/files, "
        f"POST {CONTROL_PREFIX}/comments; what is on a PR: GET {CONTROL_PREFIX}/activity"
        "?forge=&repo=&number=[&sha=]",
        (
            f"webhooks of those changes go to {hooks.url}/webhooks/{{github,gitlab}}"
            if hooks is not None
            else "webhooks of those changes are shown, not sent (start with --bot-url to send)"
        ),
    ]
    return "\n".join(lines)


def _base_url(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


async def handle_list_pulls(request: web.Request) -> web.Response:
    """GET /_emulator/prs."""
    state = request.app[EMULATOR_STATE]
    base = _base_url(request)
    return web.json_response({"prs": [pull_json(pull, base) for pull in state.pulls.values()]})


async def handle_add_pulls(request: web.Request) -> web.Response:
    """POST /_emulator/prs: one description, or a list; all or nothing."""
    state = request.app[EMULATOR_STATE]
    try:
        data = await request.json()
    except ValueError:
        return web.json_response({"error": "the body must be JSON"}, status=400)
    items: Sequence[Any] = data if isinstance(data, list) else [data]
    try:
        specs = [
            pull_spec_from_json(item, where=f"[{i}]." if isinstance(data, list) else "")
            for i, item in enumerate(items)
        ]
    except PullSpecError as exc:
        return web.json_response({"error": str(exc)}, status=400)
    base = _base_url(request)
    pulls, deliveries = [], []
    for spec in specs:
        known = state.pulls.get((spec.forge, spec.repo, spec.number))
        before = known.newest.head_sha if known is not None else None
        pull = add_pull_spec(state, spec)
        if known is None or pull.newest.head_sha != before:
            sent = await send_hook(request, pull_hook(state, pull, before=before))
            deliveries.append({"event": sent["webhook"]["event"], "delivered": sent["delivered"]})
        pulls.append(pull_json(pull, base))
    return web.json_response({"prs": pulls, "webhooks": deliveries}, status=201)


async def handle_posted(request: web.Request) -> web.Response:
    """GET /_emulator/posted."""
    state = request.app[EMULATOR_STATE]
    query = request.query
    forge = query.get("forge")
    if forge not in (None, "github", "gitlab"):
        return web.json_response({"error": "forge must be github or gitlab"}, status=400)
    number: int | None = None
    if query.get("number"):
        try:
            number = int(query["number"])
        except ValueError:
            return web.json_response({"error": "number must be an integer"}, status=400)
    wanted_kind = query.get("kind") or None
    records = [
        (record, record.number or record_number(state, record.data, record.repo))
        for record in state.posted(forge=forge, kind=wanted_kind, repo=query.get("repo") or None)  # type: ignore[arg-type]
    ]
    return web.json_response(
        {
            "posted": [
                record_json(record, found)
                for record, found in records
                if number is None or found == number
            ]
        }
    )


def add_control_routes(app: web.Application) -> None:
    """Register /_emulator/*; call before the forge API's catch-all route."""
    app.router.add_get(f"{CONTROL_PREFIX}/prs", handle_list_pulls)
    app.router.add_post(f"{CONTROL_PREFIX}/prs", handle_add_pulls)
    app.router.add_get(f"{CONTROL_PREFIX}/posted", handle_posted)


__all__ = [
    "CONTROL_PREFIX",
    "PullSpec",
    "PullSpecError",
    "add_control_routes",
    "add_pull_spec",
    "emulator_banner",
    "load_pull_specs",
    "pull_spec_from_json",
    "pull_spec_from_webhook",
    "pull_specs_from_text",
]
