"""Read each reviewed file once at the head sha and keep the code around its changes with the
chunks (the I/O shell around bot/review/code_context.py).

A file the forge will not serve (gone, too large, binary, a 5xx after one retry) is reviewed
without context: the context helps a review, it never holds one up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.errors import ForgeError
from bot.forges.base import ForgeClient, PullChanges
from bot.model import ChunkPlan, Job
from bot.review.code_context import build_file_context

log = logging.getLogger(__name__)

# Files read at once for one review (each read is one forge request).
MAX_CONCURRENT_READS = 4


@dataclass(frozen=True, slots=True)
class ContextReads:
    """What reading a review's files did: texts by path, and how many reads failed."""

    sources: Mapping[str, str]
    requested: int
    failed: int = 0


def files_to_read(chunks: Sequence[ChunkPlan]) -> tuple[str, ...]:
    """The paths whose head text the chunks need, each once, in chunk order (deleted files
    and files without a textual diff have none)."""
    paths: dict[str, None] = {}
    for chunk in chunks:
        for entry in chunk.files:
            if entry.get("patch") and entry.get("status") != "removed":
                paths.setdefault(str(entry["path"]), None)
    return tuple(paths)


async def read_sources(
    client: ForgeClient, job: Job, changes: PullChanges, paths: Sequence[str]
) -> ContextReads:
    """Each path's text at the head sha (read at most once); failures leave a path out."""
    blobs = {change.path: change.blob_sha for change in changes.files}
    gate = asyncio.Semaphore(MAX_CONCURRENT_READS)
    failed = 0

    async def read(path: str) -> tuple[str, str | None]:
        nonlocal failed
        async with gate:
            try:
                text = await client.read_file_at(
                    job.repo,
                    path,
                    ref=changes.head_sha,
                    blob_sha=blobs.get(path),
                    project_id=job.request.get("project_id"),
                    installation_id=job.request.get("installation_id"),
                )
            except ForgeError as exc:
                failed += 1
                log.warning(
                    "job %s: no context for %s (%s); reviewed without it",
                    job.id,
                    path,
                    exc,
                    extra={"action": "context_read_failed", "job_id": job.id, "forge": job.forge},
                )
                return path, None
        return path, text

    found = await asyncio.gather(*(read(path) for path in paths))
    sources = {path: text for path, text in found if text is not None}
    return ContextReads(sources=sources, requested=len(paths), failed=failed)


def with_contexts(chunks: Sequence[ChunkPlan], sources: Mapping[str, str]) -> tuple[ChunkPlan, ...]:
    """The chunks with each file's context (`context` of its entry) where its text is known."""
    result: list[ChunkPlan] = []
    for chunk in chunks:
        files: list[Mapping[str, Any]] = []
        for entry in chunk.files:
            source = sources.get(str(entry.get("path")))
            patch = entry.get("patch")
            found = (
                build_file_context(str(entry["path"]), source, patch)
                if source is not None and isinstance(patch, str)
                else None
            )
            files.append({**entry, "context": found.to_json()} if found is not None else entry)
        result.append(ChunkPlan(files=tuple(files), lines=chunk.lines))
    return tuple(result)


__all__ = ["ContextReads", "files_to_read", "read_sources", "with_contexts"]
