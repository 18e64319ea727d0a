"""`bot queue ls` and `bot queue show ID`: what a job is, why it is where it is, what went wrong.

Rendering is pure (plain data in, text or JSON-ready dicts out); `load_job_view` is the one read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.model import ANCHOR_OUTCOMES, Chunk, Job, JobState
from bot.queue.store import HistoryEntry, QueueStore

# States a job ends in for a reason other than success; the reason is kept in last_error.
ENDED_WITH_REASON = frozenset(
    {JobState.CANCELLED, JobState.FAILED, JobState.DEAD, JobState.SUPERSEDED}
)


@dataclass(frozen=True, slots=True)
class JobView:
    """One job with its history and chunks, as `bot queue show` prints it."""

    job: Job
    history: Sequence[HistoryEntry]
    chunks: Sequence[Chunk]


async def load_job_view(store: QueueStore, job_id: int) -> JobView | None:
    """The job, its history and its chunks; None when there is no such job."""
    job = await store.get_job(job_id)
    if job is None:
        return None
    return JobView(
        job=job, history=await store.job_history(job_id), chunks=await store.chunk_results(job_id)
    )


def why_ended(job: Job) -> str | None:
    """Why a job ended without a review (cancelled, failed, dead, superseded), if it did."""
    if job.state not in ENDED_WITH_REASON:
        return None
    return job.last_error or "no reason recorded"


def listing_row(job: Job) -> dict[str, Any]:
    """One line of `bot queue ls` as data."""
    return {
        "id": job.id,
        "forge": job.forge,
        "repo": job.repo,
        "number": job.number,
        "level": str(job.level),
        "base_level": str(job.base_level),
        "state": job.state.value,
        "why": why_ended(job),
        "reasons": list(job.reasons),
        "enqueued_at": job.enqueued_at.isoformat(),
    }


def render_listing(rows: Sequence[Mapping[str, Any]]) -> str:
    """The `bot queue ls` table: the policy's reasons, and for an ended job why it ended."""
    header = f"{'id':>6} {'forge':<7} {'repo':<28} {'#':>6} {'lvl':<3} {'base':<4} {'state':<10}"
    lines = [header + " enqueued                   reasons"]
    for row in rows:
        reasons = "; ".join(row["reasons"])
        if row["why"]:
            reasons = f"{row['state']}: {row['why']}" + (f" | {reasons}" if reasons else "")
        lines.append(
            f"{row['id']:>6} {row['forge']:<7} {row['repo'][:28]:<28} {row['number']:>6} "
            f"{row['level']:<3} {row['base_level']:<4} {row['state']:<10} "
            f"{row['enqueued_at'][:25]:<26} {reasons}"
        )
    return "\n".join(lines)


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def chunk_document(chunk: Chunk) -> dict[str, Any]:
    """One chunk as data: where it stands, its attempts and errors, what its review said."""
    result = chunk.result or {}
    return {
        "seq": chunk.seq,
        "id": chunk.id,
        "level": str(chunk.level),
        "state": chunk.state.value,
        "lines": chunk.lines,
        "paths": [str(file.get("path", "")) for file in chunk.files],
        "attempts": chunk.attempts,
        "lease_owner": chunk.lease_owner,
        "started_at": _time(chunk.started_at),
        "finished_at": _time(chunk.finished_at),
        "gpu_seconds": chunk.gpu_seconds,
        "error": chunk.last_error,
        "result_status": result.get("status"),
        "result_error": result.get("error"),
        "findings": len(result.get("findings") or ()),
        "anchoring": anchoring_of([result]),
    }


def anchoring_of(results: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How the findings of these chunk results were anchored, per outcome (stored per chunk)."""
    totals = dict.fromkeys(ANCHOR_OUTCOMES, 0)
    for result in results:
        for outcome, count in (result.get("anchoring") or {}).items():
            if outcome in totals:
                totals[outcome] += int(count)
    return totals


def job_document(view: JobView) -> dict[str, Any]:
    """The whole job as JSON-ready data (`bot queue show ID --json`)."""
    job = view.job
    return {
        "id": job.id,
        "forge": job.forge,
        "repo": job.repo,
        "number": job.number,
        "title": job.title,
        "author": job.author,
        "base_ref": job.base_ref,
        "head_ref": job.head_ref,
        "head_sha": job.head_sha,
        "state": job.state.value,
        "why": why_ended(job),
        "level": str(job.level),
        "base_level": str(job.base_level),
        "reasons": list(job.reasons),
        "enqueued_at": _time(job.enqueued_at),
        "ready_at": _time(job.ready_at),
        "first_started_at": _time(job.first_started_at),
        "finished_at": _time(job.finished_at),
        "attempts": job.attempts,
        "last_error": job.last_error,
        "depends_on": list(job.depends_on),
        "chunks_done": job.chunks_done,
        "chunks_total": job.chunks_total,
        "gpu_seconds": round(job.gpu_seconds, 3),
        "anchoring": anchoring_of([chunk.result or {} for chunk in view.chunks]),
        "history": [
            {
                "at": _time(entry.at),
                "kind": entry.kind,
                "from": entry.from_value,
                "to": entry.to_value,
                "reason": entry.reason,
                "actor": entry.actor,
            }
            for entry in view.history
        ],
        "chunks": [chunk_document(chunk) for chunk in view.chunks],
    }


def render_job(document: Mapping[str, Any]) -> str:
    """`bot queue show ID` as text: the job, then its history, then its chunks."""
    lines = [
        f"job {document['id']}: {document['forge']} {document['repo']}#{document['number']} "
        f"{document['title']!r} by {document['author']}",
        f"  state      {document['state']}" + (f" ({document['why']})" if document["why"] else ""),
        f"  level      {document['level']} (at intake {document['base_level']}): "
        + ("; ".join(document["reasons"]) or "no reasons recorded"),
        f"  refs       {document['head_ref']} -> {document['base_ref']} at {document['head_sha']}",
        f"  times      enqueued {document['enqueued_at']}, started "
        f"{document['first_started_at'] or '-'}, finished {document['finished_at'] or '-'}",
        f"  progress   {document['chunks_done']}/{document['chunks_total']} chunks, "
        f"{document['gpu_seconds']} GPU s, {document['attempts']} attempts",
    ]
    anchoring = document.get("anchoring") or {}
    if any(anchoring.values()):
        placed = ", ".join(
            f"{count} {outcome.replace('_', ' ')}" for outcome, count in anchoring.items()
        )
        lines.append(f"  anchoring  {placed}")
    if document["depends_on"]:
        lines.append(f"  waits on   jobs {', '.join(map(str, document['depends_on']))}")
    if document["last_error"]:
        lines.append(f"  last error {document['last_error']}")
    lines.append("history:")
    for entry in document["history"]:
        change = f"{entry['from'] or '-'} -> {entry['to'] or '-'}"
        reason = f": {entry['reason']}" if entry["reason"] else ""
        lines.append(
            f"  {entry['at']}  {entry['kind']:<7} {change:<22} by {entry['actor']}{reason}"
        )
    if not document["history"]:
        lines.append("  (none)")
    lines.append("chunks:")
    for chunk in document["chunks"]:
        gpu = "-" if chunk["gpu_seconds"] is None else f"{chunk['gpu_seconds']:.1f}"
        detail = f"  review {chunk['result_status']}" if chunk["result_status"] else ""
        if chunk["findings"]:
            detail += f", {chunk['findings']} findings"
        lines.append(
            f"  #{chunk['seq']:<3} {chunk['state']:<9} {chunk['level']} {chunk['lines']:>5} lines "
            f"{chunk['attempts']} attempts {gpu:>6} GPU s  {', '.join(chunk['paths'])[:80]}{detail}"
        )
        for error in (chunk["error"], chunk["result_error"]):
            if error:
                lines.append(f"       error: {error}")
    if not document["chunks"]:
        lines.append("  (not planned yet)" if document["chunks_total"] == 0 else "  (none)")
    return "\n".join(lines)
