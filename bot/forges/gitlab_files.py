"""Many files at one commit in one GitLab request: the GraphQL query and how its answer reads.

The repository files API costs one request per file; a review of twenty files would spend
twenty against the token's rate limit. GitLab's GraphQL `Repository.blobs(paths:, ref:)` answers
many paths at one ref in one request (GitLab's own blob viewer asks it this way). The paths and
the ref travel as variables, so a path needs no escaping; a path that is not there at the ref
is left out of the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.forges.blobs import MAX_FILE_BYTES

# Paths asked for in one query: the connection's page size, so one page answers them all.
MAX_FILES_PER_QUERY = 100

BLOBS_QUERY = (
    "query($project: ID!, $ref: String!, $paths: [String!]!) {"
    " project(fullPath: $project) { repository {"
    " blobs(paths: $paths, ref: $ref, first: 100) { nodes { path oid size rawTextBlob } }"
    " } } }"
)


def graphql_url(base_url: str) -> str:
    """GitLab's GraphQL endpoint, beside its REST API under the same base URL."""
    return base_url.rstrip("/") + "/api/graphql"


def blobs_variables(project: str, ref: str, paths: Sequence[str]) -> dict[str, Any]:
    """The query's variables: the project's full path, the commit and the paths."""
    return {"project": project, "ref": ref, "paths": list(paths)}


def blob_text(node: Any) -> str | None:
    """A blob's text: None when it is binary (GitLab gives no raw text), over the size a
    prompt would ever read, or holds a NUL."""
    if not isinstance(node, Mapping):
        return None
    text = node.get("rawTextBlob")
    if not isinstance(text, str):
        return None
    size = node.get("size")
    size_bytes = int(size) if isinstance(size, int | str) and str(size).isdigit() else None
    if (size_bytes is not None and size_bytes > MAX_FILE_BYTES) or "\0" in text[:8192]:
        return None
    return text


def blobs_answered(
    paths: Sequence[str], answer: Any
) -> dict[str, tuple[str | None, str | None]] | None:
    """Each asked path's text and blob id from the query's answer, every path answered (a
    path GitLab left out is not there); None when GitLab answered errors and no blobs."""
    if not isinstance(answer, Mapping):
        return None
    data = answer.get("data")
    project = data.get("project") if isinstance(data, Mapping) else None
    if answer.get("errors") and not isinstance(project, Mapping):
        return None
    repository = project.get("repository") if isinstance(project, Mapping) else None
    blobs = repository.get("blobs") if isinstance(repository, Mapping) else None
    nodes = blobs.get("nodes") if isinstance(blobs, Mapping) else None
    found: dict[str, Mapping[str, Any]] = {}
    for node in nodes if isinstance(nodes, list) else ():
        if isinstance(node, Mapping) and isinstance(node.get("path"), str):
            found[str(node["path"])] = node
    answered: dict[str, tuple[str | None, str | None]] = {}
    for path in paths:
        node = found.get(path)
        oid = node.get("oid") if node is not None else None
        answered[path] = (blob_text(node), str(oid) if oid else None)
    return answered


__all__ = [
    "BLOBS_QUERY",
    "MAX_FILES_PER_QUERY",
    "blob_text",
    "blobs_answered",
    "blobs_variables",
    "graphql_url",
]
