"""Shared pieces of the planner, poster and end-to-end tests: forges on the emulator, chunks."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.clock import VirtualClock
from bot.components import local_write_budget
from bot.config import ForgeSettings, Settings
from bot.emulator import EmulatedPull, EmulatorState, ForgeEmulator
from bot.forges.base import RetryPolicy
from bot.forges.registry import ForgeOptions, ForgeRegistry, build_forges
from bot.llm.base import LLMRequest
from bot.llm.simulated import SimulatedBackend
from bot.model import LEVELS, FileChange, Forge, ReviewRequest
from bot.policy import PolicyBook, evaluate
from bot.queue.store import QueueStore
from bot.review.planner import claim_and_plan_jobs
from bot.review.prompts import build_messages

GITHUB_TOKEN = "ghp-test-token"
GITLAB_TOKEN = "glpat-test-token"
APP_ID = "4242"

# A patch the simulated reviewer has something to say about (debug output, a TODO, a secret).
SMELLY_PATCH = "\n".join(
    [
        "@@ -1,3 +1,5 @@",
        " def handle(event):",
        "-    return None",
        "+    print(event)  # TODO remove before release",
        '+    token = "hunter2-not-a-real-secret"',
        "+    return event",
        " ",
    ]
)
SMELLY = FileChange(path="app/handler.py", additions=3, deletions=1, patch=SMELLY_PATCH)
LOCK = FileChange(
    path="package-lock.json",
    additions=2,
    deletions=1,
    patch='@@ -1,2 +1,3 @@\n {\n-  "version": "1.0.0",\n+  "version": "1.0.1",\n+  "x": 1\n',
)
IMAGE = FileChange(path="docs/logo.png", status="added")


def make_app_key() -> tuple[str, str]:
    """A GitHub App's private key (PEM) and its public half, as GitHub keeps it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private_pem, public_pem


def emulator_state(clock: VirtualClock) -> EmulatorState:
    state = EmulatorState(clock=clock.now)
    state.github_tokens.add(GITHUB_TOKEN)
    state.gitlab_tokens.add(GITLAB_TOKEN)
    return state


def forge_settings(emulator: ForgeEmulator, **forges: object) -> Settings:
    """Settings that reach the emulator's forges; `forges` changes ForgeSettings' fields."""
    defaults: dict[str, object] = {
        "github_api_url": emulator.github_url,
        "github_token": GITHUB_TOKEN,
        "gitlab_url": emulator.gitlab_url,
        "gitlab_token": GITLAB_TOKEN,
    }
    return Settings(forges=ForgeSettings.model_validate({**defaults, **forges}))


def emulator_forges(
    emulator: ForgeEmulator, clock: VirtualClock, *, attempts: int = 1, post_interval_s: float = 0.0
) -> ForgeRegistry:
    """Real GitHub and GitLab clients pointed at the emulator, sleeping on the virtual clock
    (which records every sleep)."""
    settings = forge_settings(emulator)
    registry = build_forges(
        settings,
        clock=clock.now,
        sleep=clock.sleep,
        options=ForgeOptions(retry=RetryPolicy(attempts=attempts)),
        budget=local_write_budget(
            settings, now=clock.now, sleep=clock.sleep, post_interval_s=post_interval_s
        ),
    )
    return registry


def request_for(pull: EmulatedPull, **overrides: object) -> ReviewRequest:
    """The ReviewRequest intake would make of a seeded pull (GitLab: without sizes)."""
    forge: Forge = pull.forge
    files = pull.files
    sizes: dict[str, object] = {}
    if forge == "github":
        sizes = {
            "files_changed": len(files),
            "additions": sum(item.additions for item in files),
            "deletions": sum(item.deletions for item in files),
        }
    fields: dict[str, object] = {
        "forge": forge,
        "repo": pull.repo,
        "number": pull.number,
        "title": pull.title,
        "author": pull.author,
        "author_is_bot": False,
        "base_ref": pull.base_ref,
        "head_ref": pull.head_ref,
        "base_sha": pull.newest.base_sha,
        "head_sha": pull.newest.head_sha,
        "event": "pull_request" if forge == "github" else "merge_request",
        "action": "opened",
        "project_id": pull.project_id,
        "installation_id": 1 if forge == "github" else None,
        **sizes,
    }
    fields.update(overrides)
    return ReviewRequest(**fields)  # type: ignore[arg-type]


async def run_all_chunks(
    store: QueueStore, backend: SimulatedBackend, clock: VirtualClock, *, owner: str = "worker"
) -> list[int]:
    """Lease and finish every ready chunk with the simulated model; returns completed job ids."""
    completed: list[int] = []
    while True:
        leased = await store.fetch_chunk(levels=LEVELS, owner=owner, now=clock.now(), lease_s=60)
        if leased is None:
            return completed
        chunk = leased.chunk
        response = await backend.complete(
            LLMRequest(
                messages=build_messages(chunk.files),
                metadata={"job_id": chunk.job_id, "chunk_id": chunk.id, "lines": chunk.lines},
            )
        )
        clock.advance(response.gpu_seconds)
        outcome = await store.finish_chunk(
            chunk.id,
            owner=owner,
            now=clock.now(),
            gpu_seconds=response.gpu_seconds,
            result={"text": response.text, "worker": response.worker},
        )
        if outcome.job_complete:
            completed.append(outcome.job_id)


async def reviewed_job(
    store: QueueStore,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
    pull: EmulatedPull,
) -> int:
    """Submit, plan and run every chunk of a pull's review; returns the finished job's id."""
    request = request_for(pull)
    result = await store.submit_request(
        request, evaluate(book.policy_for(request.repo), request), now=clock.now()
    )
    assert result.job_id is not None
    planned = await claim_and_plan_jobs(store, forges, book, now=clock.now())
    assert [o.result for o in planned] == ["planned"]
    completed = await run_all_chunks(store, SimulatedBackend(), clock)
    assert completed == [result.job_id]
    return result.job_id


def reviews_of(emulator: ForgeEmulator, pull: EmulatedPull) -> list[str]:
    kind = "review" if pull.forge == "github" else "note"
    return [
        record.body or ""
        for record in emulator.state.posted(kind=kind, repo=pull.repo, number=pull.number)
    ]
