"""The one composition of planner, dispatcher and poster: `bot serve`, `bot simulate` and the
demo all build their review pipeline here, and differ only in the clock, the LLM backend and
the forge clients they pass in (what the replay measures is what is served)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bot.clock import Clock
from bot.forges.base import ForgeClient
from bot.llm.base import LLMBackend
from bot.obs.metrics import Metrics
from bot.policy import PolicyBook
from bot.queue.store import QueueStore
from bot.review.chunk_review import RequestBuilder, chunk_reviewer, default_request
from bot.review.plan_and_post import ReviewPipeline
from bot.review.planner import PlanningSettings
from bot.review.poster import PostingSettings
from bot.review.quiet_post import QuietPosting
from bot.sched.dispatcher import Dispatcher, DispatcherSettings
from bot.sched.engine_pool import EnginePool
from bot.sched.mlfq import ServiceEstimator
from bot.sched.ports import ChunkPreempted
from bot.status.eta import Capacity


@dataclass(frozen=True, slots=True)
class Pipeline:
    """What a dispatching process runs: forge-side planning and posting, and the dispatcher."""

    reviews: ReviewPipeline
    dispatcher: Dispatcher
    planning: PlanningSettings

    def eta_capacity(self) -> Capacity:
        """What the status ETA plays this pipeline with: the dispatcher's slots and knobs,
        and the chunk sizes its planner cuts."""
        return Capacity(
            slots=self.dispatcher.total_slots,
            mlfq=self.dispatcher.settings.mlfq,
            line_budget=self.planning.line_budget,
            first_budget=self.planning.first_budget,
        )


def build_pipeline(
    store: QueueStore,
    *,
    forges: Mapping[str, ForgeClient],
    policies: PolicyBook | None,
    backend: LLMBackend,
    clock: Clock,
    dispatcher: DispatcherSettings,
    planning: PlanningSettings | None = None,
    posting: PostingSettings | None = None,
    metrics: Metrics | None = None,
    build_request: RequestBuilder = default_request,
    on_preempt: ChunkPreempted | None = None,
    estimator: ServiceEstimator | None = None,
    instructions: str | None = None,
    quiet: QuietPosting | None = None,
    engines: EnginePool | None = None,
    answer_tokens: int = 1024,
) -> Pipeline:
    """Wire planner, dispatcher and poster over one store.

    Planning follows the dispatcher's policy (`PlanningSettings.for_policy`): chunks ranked by
    expected remaining work under mlfq, one call per review in arrival order otherwise.
    """
    planned = PlanningSettings.for_policy(dispatcher.policy, planning)
    reviews = ReviewPipeline(
        store,
        forges,
        policies,
        planning=planned,
        posting=posting,
        metrics=metrics,
        quiet=quiet,
        clock=clock,
    )
    running = Dispatcher(
        store,
        backend,
        plan_jobs=reviews.plan_jobs,
        reviewer=chunk_reviewer(
            backend,
            build_request=build_request,
            instructions=instructions,
            max_tokens=answer_tokens,
            context_tokens=planned.context_tokens,
        ),
        settings=dispatcher,
        clock=clock,
        on_job_complete=reviews.job_completed,
        estimator=estimator,
        metrics=metrics,
        on_preempt=on_preempt,
        engines=engines,
    )
    return Pipeline(reviews=reviews, dispatcher=running, planning=planned)


__all__ = ["Pipeline", "build_pipeline"]
