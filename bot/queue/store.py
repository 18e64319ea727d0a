"""The queue store: one object over PostgreSQL, composed of parts split by what they manage.

Jobs and intake (jobs.py), job levels (levels.py), chunks and their leases (chunks.py),
posting claims (posting.py), the history (history.py), what finished reviews cost (costs.py),
review findings (findings.py), slash-command deliveries (commands.py), check runs and
statuses (status.py), monitoring's reads and heartbeats (monitoring.py) and the admin reports
(reports.py) are each a small class holding the connector; each decides its SQL from its own
named statements (bot/queue/sql/), the connector (connector.py) runs it, and rows become models
in one place (records.py). The forges' shared write budget keeps its ledger in bot.budget.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from bot.db import SessionTimeouts, create_engine
from bot.queue.base import QueueSettings
from bot.queue.chunks import ChunkLeases
from bot.queue.commands import CommandInbox
from bot.queue.connector import COMMAND_CHANNEL, QUEUE_CHANNEL, Connector, Listener
from bot.queue.costs import CostRow, JobCost, ReviewCosts
from bot.queue.findings import FindingStore
from bot.queue.history import JobHistory
from bot.queue.jobs import JobRecords, dedupe_key_for, request_from_json, request_to_json
from bot.queue.levels import JobLevels
from bot.queue.monitoring import MonitoringRecords
from bot.queue.posting import PostingClaims
from bot.queue.records import ChunkOutcome, HistoryEntry, Leased, LevelLoad, SubmitResult
from bot.queue.reports import ReportQueries
from bot.queue.status import StatusRecords


class QueueStore:
    """The queue's parts over one connector, and each part's operations under one name.

    `store.chunks.fetch_chunk` and `store.fetch_chunk` are the same method: the queue's own
    operations are named on the store, so callers need not know which part does what (the
    table below says). The parts other stages own the meaning of (findings, commands, status,
    monitoring, reports) are reached through the part: `store.status.live_jobs()`.
    """

    def __init__(self, engine: AsyncEngine, *, settings: QueueSettings | None = None) -> None:
        self.engine = engine
        self.connector = Connector(engine)
        self.settings = settings or QueueSettings()
        self.levels = JobLevels(self.connector, self.settings)
        self.jobs = JobRecords(self.connector, self.settings, levels=self.levels)
        self.chunks = ChunkLeases(self.connector, self.settings, jobs=self.jobs)
        self.posting = PostingClaims(self.connector, self.settings)
        self.history = JobHistory(self.connector, self.settings)
        self.costs = ReviewCosts(self.connector, self.settings)
        self.commands = CommandInbox(self.connector)
        self.findings = FindingStore(self.connector)
        self.status = StatusRecords(self.connector)
        self.monitoring = MonitoringRecords(self.connector)
        self.reports = ReportQueries(self.connector)
        # levels
        self.set_level = self.levels.set_level
        self.apply_aging = self.levels.apply_aging
        # jobs
        self.record_delivery = self.jobs.record_delivery
        self.submit_request = self.jobs.submit_request
        self.cancel_pull = self.jobs.cancel_pull
        self.fetch_unplanned_jobs = self.jobs.fetch_unplanned_jobs
        self.plan_job = self.jobs.plan_job
        self.finish_job = self.jobs.finish_job
        self.get_job = self.jobs.get_job
        self.find_job = self.jobs.find_job
        self.list_jobs = self.jobs.list_jobs
        self.republish_status = self.jobs.republish_status
        self.queue_position = self.jobs.queue_position
        # chunks
        self.level_load = self.chunks.level_load
        self.engine_load = self.chunks.engine_load
        self.engine_running = self.chunks.engine_running
        self.fetch_chunk = self.chunks.fetch_chunk
        self.move_chunk_engine = self.chunks.move_chunk_engine
        self.heartbeat = self.chunks.heartbeat
        self.finish_chunk = self.chunks.finish_chunk
        self.fail_chunk = self.chunks.fail_chunk
        self.release_chunk = self.chunks.release_chunk
        self.rerank_continuations = self.chunks.rerank_continuations
        self.reclaim_expired = self.chunks.reclaim_expired
        self.chunk_results = self.chunks.chunk_results
        self.chunk_lines = self.chunks.chunk_lines
        # posting
        self.unposted_jobs = self.posting.unposted_jobs
        self.claim_posting = self.posting.claim_posting
        self.holds_posting = self.posting.holds_posting
        self.renew_posting_claims = self.posting.renew_posting_claims
        self.release_posting_claims = self.posting.release_posting_claims
        self.release_planning_claims = self.posting.release_planning_claims
        self.defer_job = self.posting.defer_job
        # history
        self.job_history = self.history.job_history
        self.record_command = self.history.record_command
        # costs
        self.job_cost = self.costs.job_cost
        self.add_costs = self.costs.add_costs
        self.cost_rows = self.costs.cost_rows
        self.forget_old_pull_costs = self.costs.forget_old_pull_costs

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        settings: QueueSettings | None = None,
        pool_size: int = 10,
        application_name: str = "review-bot",
        timeouts: SessionTimeouts | None = None,
    ) -> QueueStore:
        engine = create_engine(
            url, pool_size=pool_size, application_name=application_name, timeouts=timeouts
        )
        return cls(engine, settings=settings)

    async def close(self) -> None:
        await self.connector.close()

    async def listen_for_work(self, callback: Callable[[], None]) -> Listener:
        """Call `callback` whenever work may be ready (LISTEN on the queue channel)."""
        return await self.connector.listen(QUEUE_CHANNEL, callback)

    async def ping(self) -> None:
        """Check the database answers; raises StoreUnavailable."""
        await self.connector.ping()


__all__ = [
    "COMMAND_CHANNEL",
    "QUEUE_CHANNEL",
    "ChunkOutcome",
    "CostRow",
    "HistoryEntry",
    "JobCost",
    "Leased",
    "LevelLoad",
    "QueueSettings",
    "QueueStore",
    "SubmitResult",
    "dedupe_key_for",
    "request_from_json",
    "request_to_json",
]
