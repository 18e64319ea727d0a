"""Read each reviewed file once at the head sha and keep the code around its changes with the
chunks (the I/O shell around bot/review/code_context.py).

A forge that reads many files in one request (GitHub, bot/forges/github_files.py) is asked
for every file at once. Elsewhere each read is a request against a rate limit, and only the
files whose context can reach a prompt are read: a chunk's prompt shows its files' contexts
in order and drops them from the last (bot/review/prompt_context.py), so once the files read
so far fill a chunk's allowance, the chunk's later files would be dropped unread as they
would be dropped read.

A file the forge will not serve (gone, too large, binary, a 5xx after one retry) is reviewed
without context: the context helps a review, it never holds one up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.errors import ForgeError
from bot.forges.base import ForgeClient, PullChanges, ReadsManyFiles
from bot.model import ChunkPlan, Job
from bot.review.code_context import build_file_context
from bot.review.prompt_context import FileContext, fit_shared_context

log = logging.getLogger(__name__)

# Files read at once for one review (each read is one forge request).
MAX_CONCURRENT_READS = 4


@dataclass(frozen=True, slots=True)
class ContextReads:
    """What reading a review's files did: texts by path, how many reads were made and how
    many failed, and how many files were left unread because no prompt had room for them."""

    sources: Mapping[str, str]
    requested: int
    failed: int = 0
    skipped: int = 0


# What a file's context is, from its path, its text at the head and its chunk's patch.
ContextOf = Callable[[str, str, str], FileContext | None]


def _has_text(entry: Mapping[str, Any]) -> bool:
    return bool(entry.get("patch")) and entry.get("status") != "removed"


def files_to_read(chunks: Sequence[ChunkPlan]) -> tuple[str, ...]:
    """The paths whose head text the chunks could use, each once, in chunk order (deleted
    files and files without a textual diff have none)."""
    paths: dict[str, None] = {}
    for chunk in chunks:
        for entry in chunk.files:
            if _has_text(entry):
                paths.setdefault(str(entry["path"]), None)
    return tuple(paths)


def next_reads(
    chunks: Sequence[ChunkPlan],
    known: Mapping[str, str | None],
    *,
    title: str,
    description: str,
    budget_tokens: int,
    context_of: ContextOf,
) -> tuple[str, ...]:
    """The paths to read next: each chunk's first file whose text is not `known` yet (None
    for a file that could not be read), unless the contexts before it already fill the
    chunk's allowance, so that no prompt would show it (`fit_shared_context` drops contexts
    from the last, so a file dropped now stays dropped whatever follows it)."""
    wanted: dict[str, None] = {}
    for chunk in chunks:
        contexts: list[FileContext] = []
        for entry in chunk.files:
            if not _has_text(entry):
                continue
            path = str(entry["path"])
            if path not in known:
                wanted.setdefault(path, None)
                break
            source = known[path]
            found = context_of(path, source, str(entry["patch"])) if source is not None else None
            if found is None:
                continue
            contexts.append(found)
            fitted = fit_shared_context(title, description, contexts, budget_tokens=budget_tokens)
            if len(fitted.files) < len(contexts):
                break
    return tuple(wanted)


async def read_sources(
    client: ForgeClient,
    job: Job,
    changes: PullChanges,
    chunks: Sequence[ChunkPlan],
    *,
    title: str,
    description: str,
    budget_tokens: int,
) -> ContextReads:
    """The head text of every file whose context can reach one of the chunks' prompts within
    `budget_tokens`: all in one request from a forge that reads many files at once, else each
    read at most once, chunks side by side, a chunk's files in order; failures leave a path
    out."""
    blobs = {change.path: change.blob_sha for change in changes.files}
    gate = asyncio.Semaphore(MAX_CONCURRENT_READS)
    failed = 0
    built: dict[tuple[str, str], FileContext | None] = {}

    def context_of(path: str, source: str, patch: str) -> FileContext | None:
        key = (path, patch)
        if key not in built:
            built[key] = build_file_context(path, source, patch)
        return built[key]

    async def read(path: str) -> tuple[str, str | None]:
        nonlocal failed
        async with gate:
            try:
                text = await client.read_file_at(
                    job.repo,
                    path,
                    ref=changes.head_sha,
                    blob_sha=blobs.get(path),
                    project_id=job.pull_details.get("project_id"),
                    installation_id=job.pull_details.get("installation_id"),
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

    known: dict[str, str | None] = {}
    if isinstance(client, ReadsManyFiles):
        # Every file the chunks could use, in one request: reading one more costs nothing.
        try:
            known.update(
                await client.read_files_at(
                    job.repo,
                    files_to_read(chunks),
                    ref=changes.head_sha,
                    blob_shas=blobs,
                    installation_id=job.pull_details.get("installation_id"),
                )
            )
        except ForgeError as exc:
            log.warning(
                "job %s: the files could not be read in one request (%s); reading them one by one",
                job.id,
                exc,
                extra={"action": "context_batch_failed", "job_id": job.id, "forge": job.forge},
            )
    while wanted := next_reads(
        chunks,
        known,
        title=title,
        description=description,
        budget_tokens=budget_tokens,
        context_of=context_of,
    ):
        known.update(await asyncio.gather(*(read(path) for path in wanted)))
    sources = {path: text for path, text in known.items() if text is not None}
    unread = [path for path in files_to_read(chunks) if path not in known]
    return ContextReads(sources=sources, requested=len(known), failed=failed, skipped=len(unread))


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


__all__ = ["ContextReads", "files_to_read", "next_reads", "read_sources", "with_contexts"]
