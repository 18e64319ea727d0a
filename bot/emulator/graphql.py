"""GitHub's and GitLab's GraphQL endpoints, for the one query the bot sends each: files at a
commit. On GitHub each file is an aliased `object(expression: $eN) { ... on Blob { ... } }` in
`repository(owner:, name:)` (bot/forges/github_files.py); on GitLab the paths go to
`project(fullPath:) { repository { blobs(paths:, ref:) } }` (bot/forges/gitlab_files.py). Any
other query is answered as the forges answer a query they cannot run: 200 with `errors`, so
the bot's fallback to reading file by file is exercised too."""

from __future__ import annotations

import re
from typing import Any

from bot.emulator.http import Context, Reply, check_repo_token, define_route
from bot.emulator.repository import blob_sha, file_at
from bot.emulator.state import GITHUB_DOCS

REPOSITORY = re.compile(r"repository\(\s*owner:\s*\$owner\s*,\s*name:\s*\$name\s*\)")
LOOKUP = re.compile(r"(\w+):\s*object\(\s*expression:\s*\$(\w+)\s*\)\s*\{\s*\.\.\.\s*on\s+Blob")
# GitHub's GraphQL answers text only below this size (larger blobs come back truncated).
TEXT_LIMIT_BYTES = 512 * 1024


def _errors(message: str, kind: str = "INVALID") -> dict[str, Any]:
    return {"errors": [{"type": kind, "message": message}]}


def _blob(text: str) -> dict[str, Any]:
    data = text.encode()
    truncated = len(data) > TEXT_LIMIT_BYTES
    return {
        "text": data[:TEXT_LIMIT_BYTES].decode(errors="ignore") if truncated else text,
        "isBinary": b"\0" in data[:8192],
        "isTruncated": truncated,
        "byteSize": len(data),
        "oid": blob_sha(text),
    }


async def _github_graphql(ctx: Context) -> Any:
    body = await ctx.json()
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        raise Reply(400, {"message": "Problems parsing JSON", "documentation_url": GITHUB_DOCS})
    query = str(body["query"])
    variables = body.get("variables") or {}
    if not isinstance(variables, dict) or not REPOSITORY.search(query):
        return _errors("this emulator answers only the files-at-a-commit query")
    lookups = LOOKUP.findall(query)
    if not lookups:
        return _errors("no object lookup in the query")
    repo = f"{variables.get('owner')}/{variables.get('name')}"
    try:
        check_repo_token(ctx, repo)
    except Reply:
        return {
            "data": {"repository": None},
            **_errors(f"Could not resolve to a Repository with the name '{repo}'.", "NOT_FOUND"),
        }
    found: dict[str, Any] = {}
    for alias, variable in lookups:
        expression = variables.get(variable)
        if not isinstance(expression, str) or ":" not in expression:
            return _errors(f"Variable ${variable} of type String! was provided invalid value")
        ref, path = expression.split(":", 1)
        text = file_at(ctx.state, repo, path, ref)
        found[alias] = _blob(text) if text is not None else None
    return {"data": {"repository": found}}


GITLAB_PROJECT = re.compile(r"project\(\s*fullPath:\s*\$project\s*\)")
GITLAB_BLOBS = re.compile(r"blobs\(\s*paths:\s*\$paths\s*,\s*ref:\s*\$ref\b")


def _gitlab_blob(path: str, text: str) -> dict[str, Any]:
    data = text.encode()
    return {
        "path": path,
        "oid": blob_sha(text),
        "size": str(len(data)),  # GitLab's BigInt travels as a string
        "rawTextBlob": None if b"\0" in data[:8192] else text,
    }


async def _gitlab_graphql(ctx: Context) -> Any:
    body = await ctx.json()
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        return {"errors": [{"message": "No query string was present"}]}
    query = str(body["query"])
    variables = body.get("variables") or {}
    if not (
        isinstance(variables, dict) and GITLAB_PROJECT.search(query) and GITLAB_BLOBS.search(query)
    ):
        return {"errors": [{"message": "this emulator answers only the blobs-at-a-ref query"}]}
    project, ref, paths = variables.get("project"), variables.get("ref"), variables.get("paths")
    if not isinstance(ref, str) or not isinstance(paths, list):
        return {
            "errors": [{"message": "Variable $paths of type [String!]! was provided invalid value"}]
        }
    if project not in ctx.state.projects:
        return {"data": {"project": None}}  # GitLab's answer for a project it does not show
    nodes = []
    for path in paths:
        text = file_at(ctx.state, str(project), str(path), ref)
        if text is not None:
            nodes.append(_gitlab_blob(str(path), text))
    return {"data": {"project": {"repository": {"blobs": {"nodes": nodes}}}}}


GRAPHQL_ROUTES = (
    define_route("github.graphql", "POST", "/graphql", _github_graphql, "github"),
    define_route("gitlab.graphql", "POST", "/api/graphql", _gitlab_graphql, "gitlab"),
)

__all__ = ["GRAPHQL_ROUTES"]
