"""Ranks of a job's continuations as it runs: what this process knows of each job's size and
progress, and the rank its unstarted chunks carry in the queue (see mlfq.queue_ranks)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from bot.queue.store import Leased, QueueStore
from bot.sched.mlfq import ServiceEstimator, rank_chunks
from bot.sched.ports import PlannedJob


@dataclass(slots=True)
class JobFacts:
    """What the dispatcher knows of a job it planned or ran (for ranks and the estimator)."""

    total_lines: int
    chunk_lines: tuple[int, ...]
    # Progress seen by this process, for re-ranking the job's unstarted continuations.
    next_seq: int = 0
    done_lines: int = 0
    done_chunks: int = 0
    done_gpu_s: float = 0.0
    ranks: tuple[float, ...] = ()  # rank_chunks ranks from chunk `ranks_from` on
    ranks_from: int = 0
    stored_rank: float | None = None  # what the queued continuations carry now
    # The job's expected work beyond the calls' overhead when planned (bot.sched.cost); None
    # for a job another process planned: the estimator's line stands in.
    expected_work_s: float | None = None


class ContinuationRanks:
    """Keeps each job's unstarted continuations ranked by the work the job has left."""

    def __init__(self, store: QueueStore) -> None:
        self.store = store
        self.jobs: dict[int, JobFacts] = {}

    def remember(self, outcome: PlannedJob) -> None:
        """A job this process planned: its chunk sizes and the ranks planning stored."""
        if outcome.result != "planned" or not outcome.chunk_lines:
            return
        self.jobs[outcome.job_id] = JobFacts(
            total_lines=sum(outcome.chunk_lines),
            chunk_lines=outcome.chunk_lines,
            ranks=outcome.ranks,
            stored_rank=outcome.ranks[1] if len(outcome.ranks) > 1 else None,
            expected_work_s=outcome.expected_work_s,
        )

    def known(self, job_id: int) -> JobFacts | None:
        """What this process already knows of a job, without asking the store."""
        return self.jobs.get(job_id)

    def forget(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)

    async def facts_of(self, job_id: int, estimator: ServiceEstimator) -> JobFacts | None:
        """Size facts of a job (cached; read from the store for jobs another process planned)."""
        facts = self.jobs.get(job_id)
        if facts is None:
            chunk_lines = await self.store.chunk_lines(job_id)
            if not chunk_lines:
                return None
            # Ranked afresh: the chunk now leased or finished tells where the job stands.
            ranks = rank_chunks(chunk_lines, estimator=estimator)
            facts = JobFacts(total_lines=sum(chunk_lines), chunk_lines=chunk_lines, ranks=ranks)
            self.jobs[job_id] = facts
        return facts

    async def after_lease(self, leased: Leased, now: datetime, estimator: ServiceEstimator) -> None:
        """A chunk started: the job's continuations take the rank of the chunk after it."""
        facts = await self.facts_of(leased.chunk.job_id, estimator)
        if facts is None or not facts.chunk_lines:
            return
        facts.next_seq = max(facts.next_seq, leased.chunk.seq + 1)
        await self._store_rank(leased.chunk.job_id, facts, now)

    async def after_finish(
        self,
        job_id: int,
        facts: JobFacts,
        lines: int,
        gpu_seconds: float,
        now: datetime,
        estimator: ServiceEstimator,
    ) -> None:
        """The job's own rate is known better now: re-rank what it has left."""
        facts.done_lines += lines
        facts.done_chunks += 1
        facts.done_gpu_s += gpu_seconds
        if not facts.chunk_lines or facts.next_seq >= len(facts.chunk_lines):
            return
        facts.ranks = rank_chunks(
            facts.chunk_lines,
            estimator=estimator,
            done_lines=facts.done_lines,
            done_chunks=facts.done_chunks,
            done_gpu_s=facts.done_gpu_s,
            first_seq=facts.next_seq,
            expected_work_s=facts.expected_work_s,
        )
        facts.ranks_from = facts.next_seq
        await self._store_rank(job_id, facts, now)

    async def _store_rank(self, job_id: int, facts: JobFacts, now: datetime) -> None:
        """Give the job's unstarted continuations the rank of its next chunk (see queue_ranks)."""
        index = facts.next_seq - facts.ranks_from
        if facts.next_seq < 1 or not 0 <= index < len(facts.ranks):
            return
        rank = facts.ranks[index]
        if rank == facts.stored_rank:
            return
        facts.stored_rank = rank
        await self.store.rerank_continuations(job_id, rank=rank, now=now)
