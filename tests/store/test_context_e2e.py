"""Code context end to end: the real planner reads each file at the head sha from the forge
emulator (real aiohttp over loopback), the real dispatcher reviews with the simulated model,
and the review is posted; the prompts are read as the model received them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bot.clock import SystemClock
from bot.components import local_write_budget
from bot.emulator import EmulatedPull, Fault, ForgeEmulator
from bot.emulator.quiet import open_pull_from_trees
from bot.forges.base import RetryPolicy
from bot.forges.registry import ForgeOptions, ForgeRegistry, build_forges
from bot.llm.base import LLMRequest, LLMResponse
from bot.llm.simulated import SimulatedBackend
from bot.model import JobState, Level, PolicyDecision
from bot.pipeline import build_pipeline
from bot.queue.store import QueueStore
from bot.review.chunking import DEFAULT_LINE_BUDGET
from bot.review.planned_diffs import PlannedDiffs
from bot.review.planner import PlanningSettings
from bot.review.prompt_context import BEGIN_CONTEXT, BEGIN_PULL_REQUEST
from bot.review.quiet_post import QuietPosting
from bot.sched.dispatcher import DispatcherSettings
from bot.sched.mlfq import MlfqSettings
from tests.support.pipeline_helpers import forge_settings, request_for
from tests.support.serving import wait_until

pytestmark = pytest.mark.emulator(virtual_clock=False)

BASE = {
    "shop/cart.py": (
        "import logging\n"
        "\n"
        "log = logging.getLogger(__name__)\n"
        "\n"
        "\n"
        "class Cart:\n"
        "    def __init__(self) -> None:\n"
        "        self.items: list[int] = []\n"
        "\n"
        "    def apply_discount(self, percent: int) -> int:\n"
        "        if percent < 0 or percent > 100:\n"
        "            raise ValueError(percent)\n"
        "        total = sum(self.items)\n"
        "        discounted = total * (100 - percent) // 100\n"
        "        log.info('discount %s', percent)\n"
        "        log.info('total %s', total)\n"
        "        log.info('items %s', len(self.items))\n"
        "        return discounted\n"
        "\n"
        "\n"
        "def helper() -> None:\n"
        "    pass\n"
    ),
    "web/format.js": (
        "export function formatPrice(cents) {\n"
        "  const euros = Math.floor(cents / 100);\n"
        "  const rest = cents % 100;\n"
        "  const padded = String(rest).padStart(2, '0');\n"
        "  const sign = cents < 0 ? '-' : '';\n"
        "  const text = `${sign}${euros}.${padded}`;\n"
        "  return text;\n"
        "}\n"
    ),
}
HEAD = {
    "shop/cart.py": BASE["shop/cart.py"].replace(
        "        log.info('items %s', len(self.items))\n",
        "        log.info('items %s', len(self.items))  # TODO remove before release\n",
    ),
    "web/format.js": BASE["web/format.js"].replace("return text;", "return text.trim();"),
}


class RecordingBackend(SimulatedBackend):
    """The simulated model, keeping every request it was sent."""

    def __init__(self) -> None:
        super().__init__(sleep=asyncio.sleep, time_scale=0.001)
        self.requests: list[LLMRequest] = []

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        return await super().complete(request)


@pytest.fixture
async def forges(emulator: ForgeEmulator) -> AsyncIterator[ForgeRegistry]:
    settings = forge_settings(emulator)
    registry = build_forges(
        settings,
        options=ForgeOptions(retry=RetryPolicy(attempts=2, base_delay_s=0.01)),
        budget=local_write_budget(
            settings, now=SystemClock().now, sleep=asyncio.sleep, post_interval_s=0
        ),
    )
    async with registry:
        yield registry


async def review(
    store: QueueStore,
    db_url: str,
    forges: ForgeRegistry,
    pull: EmulatedPull,
    *,
    quiet: QuietPosting | None = None,
) -> tuple[int, RecordingBackend]:
    """Submit the pull's review, run one dispatcher until it is done (posted as quiet reviews
    are, as `bot serve` posts by default, with `quiet`); the job and the model."""
    backend = RecordingBackend()
    decision = PolicyDecision(level=Level.P2, reasons=("test",))
    submitted = await store.submit_request(request_for(pull), decision, now=SystemClock().now())
    assert submitted.job_id is not None
    pipeline = build_pipeline(
        store,
        forges=forges,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        dispatcher=DispatcherSettings(
            owner="context-test",
            policy="mlfq",
            slots=2,
            poll_s=0.1,
            mlfq=MlfqSettings(reserved_slots=0),
        ),
        planning=PlanningSettings(context_tokens=1536),
        quiet=quiet,
    )
    runner = asyncio.create_task(pipeline.dispatcher.run(database_url=db_url))

    async def done() -> bool:
        job = await store.get_job(submitted.job_id)  # type: ignore[arg-type]
        return job is not None and job.state == JobState.DONE

    try:
        await wait_until(done, timeout_s=30, what="the review is posted")
    finally:
        pipeline.dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10)
    return submitted.job_id, backend


def user_turns(backend: RecordingBackend) -> list[str]:
    return [request.messages[-1]["content"] for request in backend.requests]


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_the_prompt_shows_the_enclosing_function_and_the_pull_request(
    store: QueueStore, db_url: str, emulator: ForgeEmulator, forges: ForgeRegistry, forge: str
) -> None:
    pull = open_pull_from_trees(
        emulator.state,
        forge,
        "acme/shop",
        7,
        base=BASE,
        head=HEAD,
        title="Log the item count",  # type: ignore[arg-type]
    )
    job_id, backend = await review(store, db_url, forges, pull)

    (prompt,) = user_turns(backend)
    assert BEGIN_PULL_REQUEST in prompt and "Title: Log the item count" in prompt
    # The pull request and the context come before the diff (a review's chunks share them).
    assert prompt.index(BEGIN_PULL_REQUEST) < prompt.index(BEGIN_CONTEXT)
    assert prompt.index(BEGIN_CONTEXT) < prompt.index("BEGIN UNTRUSTED DIFF")
    context = prompt[prompt.index(BEGIN_CONTEXT) : prompt.index("BEGIN UNTRUSTED DIFF")]
    # The method around the change, from its first line, numbered as in the new file; its
    # class's first line as a header; nothing of the function after it.
    assert "\n10:     def apply_discount(self, percent: int) -> int:\n" in context
    assert "\n6: class Cart:\n" in context
    assert "def helper" not in context
    assert "\n1: export function formatPrice(cents) {\n" in context
    posted = emulator.state.posted(forge=forge, repo="acme/shop", number=7)  # type: ignore[arg-type]
    assert posted, "the review was posted"
    job = await store.get_job(job_id)
    assert job is not None and job.pull_details["context_reads"] == {
        "requested": 2,
        "read": 2,
        "failed": 0,
        "skipped": 0,
    }


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_one_review_reads_each_file_once_even_across_chunks(
    store: QueueStore, db_url: str, emulator: ForgeEmulator, forges: ForgeRegistry, forge: str
) -> None:
    # One long file, 1,010 changed lines in ten hunks far apart: over the line budget, so a
    # first chunk of 100 lines and the rest in parts of the same file.
    body = '    """One of many."""\n    a = 1\n    b = 2\n    c = 3\n    d = 4\n'
    base = "".join(f"def f{n}():\n{body}    return {n}\n\n" for n in range(400))
    head = base
    changed = range(10, 400, 40)
    assert 100 * len(changed) > DEFAULT_LINE_BUDGET
    for n in changed:
        head = head.replace(f"    return {n}\n", f"    return {n} + 1\n" * 100)
    pull = open_pull_from_trees(
        emulator.state,
        forge,  # type: ignore[arg-type]
        "acme/shop",
        8,
        base={"big.py": base},
        head={"big.py": head},
    )
    _, backend = await review(store, db_url, forges, pull)

    prompts = user_turns(backend)
    assert len(prompts) >= 2, "the file was reviewed in more than one chunk"
    for prompt in prompts:
        context = prompt[prompt.index(BEGIN_CONTEXT) : prompt.index("BEGIN UNTRUSTED DIFF")]
        assert any(f"def f{n}():" in context for n in changed)
    # Every file in one GraphQL request, none through the per-file API.
    assert emulator.state.count_requests(f"{forge}.graphql") == 1
    assert emulator.state.count_requests(FILE_ROUTE[forge]) == 0


# Each forge's one-file-at-a-time read, where its one request for every file is not answered.
FILE_ROUTE = {"github": "github.contents", "gitlab": "gitlab.file"}


def twenty_modules(emulator: ForgeEmulator, forge: str, number: int) -> EmulatedPull:
    """Twenty modules, each with a changed line inside a 30-line function: one chunk, whose
    context allowance holds a few of the functions, not twenty."""
    body = "".join(f"    step_{n} = prepare({n}, options)\n" for n in range(30))
    base = {
        f"pkg/mod{m:02}.py": f"def run_{m}(options):\n{body}    return step_0\n" for m in range(20)
    }
    head = {
        path: text.replace("step_15 = prepare(15", "step_15 = prepare(-15")
        for path, text in base.items()
    }
    return open_pull_from_trees(
        emulator.state,
        forge,  # type: ignore[arg-type]
        "acme/shop",
        number,
        base=base,
        head=head,
    )


def shown_contexts(backend: RecordingBackend) -> int:
    (prompt,) = user_turns(backend)
    shown = prompt[prompt.index(BEGIN_CONTEXT) : prompt.index("BEGIN UNTRUSTED DIFF")]
    return shown.count("Context: pkg/mod")


async def test_a_forge_read_file_by_file_reads_only_what_a_prompt_has_room_for(
    store: QueueStore, db_url: str, emulator: ForgeEmulator, forges: ForgeRegistry
) -> None:
    # GitLab will not answer the one request for every file (an older GitLab, say).
    emulator.state.add_fault("gitlab.graphql", Fault.server_error(502), times=4)
    job_id, backend = await review(store, db_url, forges, twenty_modules(emulator, "gitlab", 10))

    shown = shown_contexts(backend)
    assert 1 <= shown < 20
    job = await store.get_job(job_id)
    assert job is not None
    reads = job.pull_details["context_reads"]
    # The files the prompt shows, and the one that showed the allowance was full; no more.
    assert emulator.state.count_requests("gitlab.file") == reads["requested"] == shown + 1
    assert reads["skipped"] == 20 - reads["requested"]
    assert emulator.state.posted(forge="gitlab", repo="acme/shop", number=10)


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_every_file_of_a_review_is_read_in_one_request(
    store: QueueStore, db_url: str, emulator: ForgeEmulator, forges: ForgeRegistry, forge: str
) -> None:
    job_id, backend = await review(store, db_url, forges, twenty_modules(emulator, forge, 10))

    # The prompt fits the same allowance in the same order as a forge read file by file.
    assert 1 <= shown_contexts(backend) < 20
    assert emulator.state.count_requests(f"{forge}.graphql", status=200) == 1
    assert emulator.state.count_requests(FILE_ROUTE[forge]) == 0
    job = await store.get_job(job_id)
    assert job is not None
    assert job.pull_details["context_reads"] == {
        "requested": 20,
        "read": 20,
        "failed": 0,
        "skipped": 0,
    }


@pytest.mark.parametrize(
    ("forge", "refusal"),
    [
        ("github", Fault.server_error(502)),
        ("gitlab", Fault.server_error(502)),
        # An older GitLab or a token without the scope: 401, 403 or 404 to /api/graphql.
        ("gitlab", Fault(status=404, message="404 Not Found")),
    ],
)
async def test_when_the_forge_will_not_answer_the_one_request_the_files_are_read_one_by_one(
    store: QueueStore,
    db_url: str,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    forge: str,
    refusal: Fault,
) -> None:
    pull = open_pull_from_trees(
        emulator.state,
        forge,  # type: ignore[arg-type]
        "acme/shop",
        12,
        base=BASE,
        head=HEAD,
        title="Log the count",
    )
    emulator.state.add_fault(f"{forge}.graphql", refusal, times=4)
    _, backend = await review(store, db_url, forges, pull)

    (prompt,) = user_turns(backend)
    assert "\n10:     def apply_discount(self, percent: int) -> int:\n" in prompt
    assert emulator.state.count_requests(FILE_ROUTE[forge]) == 2


@pytest.mark.parametrize(
    ("forge", "route", "fault"),
    [
        ("github", "github.contents", Fault(status=404, message="Not Found")),
        ("github", "github.contents", Fault.server_error(502)),
        ("gitlab", "gitlab.file", Fault(status=404, message="404 File Not Found")),
        ("gitlab", "gitlab.file", Fault.server_error(500)),
    ],
)
async def test_a_file_the_forge_will_not_serve_is_reviewed_without_its_context(
    store: QueueStore,
    db_url: str,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    forge: str,
    route: str,
    fault: Fault,
) -> None:
    pull = open_pull_from_trees(
        emulator.state,
        forge,
        "acme/shop",
        9,
        base=BASE,
        head=HEAD,  # type: ignore[arg-type]
    )
    # The forge's one request for every file fails first: the files are read one by one.
    emulator.state.add_fault(f"{forge}.graphql", Fault.server_error(502), times=4)
    emulator.state.add_fault(route, fault, times=4)  # every read of both files, and a retry
    job_id, backend = await review(store, db_url, forges, pull)

    (prompt,) = user_turns(backend)
    assert BEGIN_CONTEXT not in prompt
    assert "Title: " in prompt  # the pull request's own text is still there
    assert emulator.state.posted(forge=forge, repo="acme/shop", number=9)  # type: ignore[arg-type]
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.DONE
    reads = job.pull_details["context_reads"]
    assert reads["requested"] == 2 and reads["read"] == 0
    assert reads["failed"] == (0 if fault.status == 404 else 2)


@pytest.mark.parametrize("kept", [True, False])
async def test_a_review_reads_the_pull_request_once_and_a_re_read_answers_304(
    store: QueueStore, db_url: str, emulator: ForgeEmulator, forges: ForgeRegistry, kept: bool
) -> None:
    pull = open_pull_from_trees(
        emulator.state, "github", "acme/shop", 11, base=BASE, head=HEAD, title="Log the count"
    )
    # Not kept: as when another process posts, or this one forgot the diff planning read.
    planned = PlannedDiffs() if kept else PlannedDiffs(max_chars=0)
    quiet = QuietPosting(store.findings, planned=planned)
    await review(store, db_url, forges, pull, quiet=quiet)

    assert emulator.state.posted(forge="github", repo="acme/shop", number=11)
    for route in ("github.pull", "github.files"):
        full = emulator.state.count_requests(route, status=200)
        not_modified = emulator.state.count_requests(route, status=304)
        # Planning reads it; the post takes planning's diff, or asks again with the ETag and
        # gets 304 (which GitHub's primary rate limit does not count).
        assert (full, not_modified) == (1, 0 if kept else 1), route
    assert len(planned) == 0  # taken by the post
