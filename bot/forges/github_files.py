"""Many files at one commit in one GitHub request: the GraphQL query and how its answer reads.

The REST contents API costs one request per file against the installation's primary limit
(5,000 an hour); a review of twenty files would spend twenty. One GraphQL query looks up each
file as an aliased `object(expression: "<sha>:<path>")`, a single request (GitHub's GraphQL
limit counts it as one point: no connection is paged). The expressions travel as variables, so
a path needs no escaping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.forges.blobs import MAX_FILE_BYTES

# Files asked for in one query.
MAX_FILES_PER_QUERY = 100
BLOB_FIELDS = "... on Blob { text isBinary isTruncated byteSize oid }"


def graphql_url(rest_url: str) -> str:
    """The GraphQL endpoint beside a REST base URL: api.github.com/graphql, and GitHub
    Enterprise Server's /api/graphql beside its /api/v3."""
    base = rest_url.rstrip("/")
    if base.endswith("/api/v3"):
        return base[: -len("/v3")] + "/graphql"
    return base + "/graphql"


def files_query(count: int) -> str:
    """The query for `count` files: variables $owner, $name and $e0..$e<count-1>, each
    "<commit>:<path>", answered as repository.f0..f<count-1>."""
    variables = "".join(f", $e{index}: String!" for index in range(count))
    fields = " ".join(
        f"f{index}: object(expression: $e{index}) {{ {BLOB_FIELDS} }}" for index in range(count)
    )
    return (
        f"query($owner: String!, $name: String!{variables}) "
        f"{{ repository(owner: $owner, name: $name) {{ {fields} }} }}"
    )


def files_variables(owner: str, name: str, ref: str, paths: Sequence[str]) -> dict[str, str]:
    return {
        "owner": owner,
        "name": name,
        **{f"e{index}": f"{ref}:{path}" for index, path in enumerate(paths)},
    }


def blob_text(blob: Any) -> str | None:
    """A looked-up object's text: None when it is no blob (gone, a directory, a submodule),
    binary, cut short by GitHub, over the size a prompt would ever read, or holds a NUL."""
    if not isinstance(blob, Mapping):
        return None
    text = blob.get("text")
    if not isinstance(text, str) or blob.get("isBinary") or blob.get("isTruncated"):
        return None
    size = blob.get("byteSize")
    if (isinstance(size, int) and size > MAX_FILE_BYTES) or "\0" in text[:8192]:
        return None
    return text


def files_answered(
    paths: Sequence[str], repository: Any
) -> dict[str, tuple[str | None, str | None]]:
    """Each asked path's text and blob id from the query's `repository` (every path
    answered; a repository that is not there answers None for each)."""
    found = repository if isinstance(repository, Mapping) else {}
    answered: dict[str, tuple[str | None, str | None]] = {}
    for index, path in enumerate(paths):
        blob = found.get(f"f{index}")
        oid = blob.get("oid") if isinstance(blob, Mapping) else None
        answered[path] = (blob_text(blob), str(oid) if oid else None)
    return answered


__all__ = [
    "MAX_FILES_PER_QUERY",
    "blob_text",
    "files_answered",
    "files_query",
    "files_variables",
    "graphql_url",
]
