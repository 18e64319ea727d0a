"""`bot serve`, `bot simulate` and the demo build one pipeline, through one factory."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bot.clock import VirtualClock
from bot.llm.simulated import SimulatedBackend
from bot.pipeline import build_pipeline
from bot.queue.store import QueueStore
from bot.review.planner import ONE_CALL_BUDGET, PlanningSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.sim.forge import memory_forges

REPO = Path(__file__).resolve().parents[2]
BOT = REPO / "bot"
# What only the factory may build: the dispatcher and the forge side of planning and posting.
BUILT_BY_THE_FACTORY = {"Dispatcher", "ReviewPipeline"}
# The entry points that build a pipeline: serve and the replay behind `bot simulate`.
ENTRY_POINTS = ("serve.py", "sim/replay.py")
# What runs the roles as `bot serve` does (quiet posting, statuses, engine windows, recovery,
# heartbeat), through the one function serve runs them with.
SERVED_ROLE = (
    BOT / "serve.py",
    BOT / "demo.py",
    REPO / "bench" / "engine_throughput.py",
    REPO / "bench" / "forge_budget.py",
)
# What a hand-written start and stop sequence calls: run_role's contexts do it instead.
STARTED_BY_HAND = {"AppRunner", "TCPSite", "create_task", "start_metrics_site", "create_app"}


def _calls(path: Path, *, within: str | None = None) -> list[str]:
    """Names of everything called in a module (`f(...)` and `module.f(...)`), or in its
    function named `within`."""
    tree: ast.AST = ast.parse(path.read_text(encoding="utf-8"))
    if within is not None:
        [tree] = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == within
        ]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.append(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names.append(node.func.attr)
    return names


def test_only_the_factory_builds_a_dispatcher_or_a_review_pipeline() -> None:
    builders = {
        str(path.relative_to(BOT)): sorted(BUILT_BY_THE_FACTORY & set(_calls(path)))
        for path in BOT.rglob("*.py")
    }
    assert {name: built for name, built in builders.items() if built} == {
        "pipeline.py": ["Dispatcher", "ReviewPipeline"]
    }


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_serve_and_simulate_build_through_the_factory(entry_point: str) -> None:
    assert "build_pipeline" in _calls(BOT / entry_point)


@pytest.mark.parametrize("module", SERVED_ROLE, ids=lambda path: path.name)
def test_serve_the_demo_and_the_engine_benchmark_run_one_dispatcher_role(module: Path) -> None:
    calls = _calls(module, within="serve" if module.name == "serve.py" else None)
    assert "run_role" in calls
    assert STARTED_BY_HAND & set(calls) == set()
    if module.name != "serve.py":
        assert "build_pipeline" not in calls


async def test_the_factory_wires_planning_and_posting_into_the_dispatcher(
    store: QueueStore,
) -> None:
    clock = VirtualClock()
    pipeline = build_pipeline(
        store,
        forges=memory_forges(clock),
        policies=None,
        backend=SimulatedBackend(),
        clock=clock,
        dispatcher=DispatcherSettings(policy="mlfq"),
    )
    assert pipeline.dispatcher.plan_jobs == pipeline.reviews.plan_jobs
    assert pipeline.dispatcher.on_job_complete == pipeline.reviews.job_completed
    assert pipeline.reviews.planning == pipeline.planning
    assert pipeline.planning.time_slicing


async def test_without_time_slicing_a_review_is_one_call(store: QueueStore) -> None:
    clock = VirtualClock()
    chunked = PlanningSettings(line_budget=300, first_budget=50)
    for policy in ("fifo", "priority"):
        pipeline = build_pipeline(
            store,
            forges=memory_forges(clock),
            policies=None,
            backend=SimulatedBackend(),
            clock=clock,
            dispatcher=DispatcherSettings(policy=policy),
            planning=chunked,
        )
        assert pipeline.planning.line_budget == ONE_CALL_BUDGET
        assert pipeline.planning.first_budget is None
        assert not pipeline.planning.time_slicing
