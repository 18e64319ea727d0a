"""The in-memory forge the dispatcher and reliability tests put their changes on."""

from __future__ import annotations

from collections.abc import Sequence

from bot.clock import SystemClock
from bot.llm.simulated import SimulatedBackend
from bot.model import FileChange
from bot.pipeline import Pipeline, build_pipeline
from bot.queue.store import QueueStore
from bot.review.planner import PlanningSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.sim.forge import added_lines_patch, memory_forges

# Every test's changes live in one in-memory forge; a job's diff is 40-line files, 40 lines
# a chunk, so a 120-line job is three chunks.
FORGES = memory_forges(SystemClock())
FORTY_LINE_CHUNKS = PlanningSettings(line_budget=40, first_budget=None, backlog_line_budget=None)


def simulated_pipeline(
    store: QueueStore, *, dispatcher: DispatcherSettings, planning: PlanningSettings
) -> Pipeline:
    """The served pipeline over this forge and the simulated backend (3 s a call and 0.01 s
    a line), on the system clock."""
    return build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=SimulatedBackend(overhead_s=3.0, seconds_per_line=0.01),
        clock=SystemClock(),
        dispatcher=dispatcher,
        planning=planning,
    )


def add_change(
    number: int, lines: int, *, head_sha: str, files: Sequence[FileChange] | None = None
) -> None:
    """Put a change of acme/payments on the forge: `files`, or `lines` in 40-line files."""
    if files is None:
        files = [
            FileChange(f"src/module_{i}.py", additions=size, patch=added_lines_patch(size))
            for i, size in enumerate(_even_parts(lines, 40))
        ]
    FORGES["github"].add_change("acme/payments", number, files, head_sha=head_sha)


def _even_parts(lines: int, size: int) -> list[int]:
    parts = [size] * (lines // size)
    return [*parts, lines % size] if lines % size else parts or [lines]
