"""Noise on the pull request: quiet reviews against a full review on every push.

A generated week of pull requests (GitHub and GitLab), each opened and then pushed to several
times (fixes, new smells, unrelated files, force pushes, rebases), is replayed twice through
what `bot serve` runs: the real policy, queue store (PostgreSQL), planner, simulated model and
poster, against the forge emulator. Once with quiet reviews (REVIEW_BOT_QUIET=true, the
default) and once reviewing every push in full with its own summary (REVIEW_BOT_QUIET=false).
Counted from what the forge received: comments per PR (inline comments plus review, summary
and note bodies), notifications per PR (each created review, comment, discussion or note;
edits notify nobody) and LLM tokens (prompt plus completion).

    python bench/noise.py [--prs 24] [--seed 16] [--out bench/results/noise.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.clock import VirtualClock
from bot.components import local_write_budget, quiet_posting
from bot.config import DEFAULT_POLICY_DIR, ForgeSettings, ReviewSettings, Settings
from bot.emulator import EmulatorState, ForgeEmulator
from bot.emulator.quiet import open_pull_from_trees, push_tree
from bot.forges.base import RetryPolicy
from bot.forges.registry import ForgeOptions, build_forges
from bot.llm.base import LLMRequest
from bot.llm.simulated import SimulatedBackend
from bot.model import LEVELS, Forge, ReviewRequest
from bot.policy import evaluate, load_policy_book
from bot.queue.store import QueueSettings, QueueStore
from bot.review.plan_and_post import ReviewPipeline
from bot.review.prompts import build_messages
from bot.sched.cost import CostEstimate

TOKEN = "bench-token"
SMELLS = (
    "    print(value)",
    "    # TODO handle the empty case",
    '    password = "hunter2-in-the-code"',
    "    return eval(text)",
    "    time.sleep(5)",
)


def module(name: str, rng: random.Random, lines: int) -> str:
    body = [f"def {name}_{index}(value: int) -> int:" for index in range(lines)]
    return "\n".join(f"{line}\n    return value + {i}" for i, line in enumerate(body)) + "\n"


@dataclass
class Scenario:
    """One pull request: its trees, and the pushes that follow (a tree and how it is pushed)."""

    forge: Forge
    repo: str
    number: int
    base: dict[str, str]  # the base the pull request was opened on
    head: dict[str, str]
    pushes: list[tuple[str, dict[str, str], dict[str, str] | None]]  # kind, tree, new base


def with_smell(tree: dict[str, str], path: str, rng: random.Random) -> dict[str, str]:
    text = tree.get(path, "def added(value: int) -> int:\n    return value\n")
    return {**tree, path: text + f"def smell_{rng.randrange(10**6)}(text):\n{rng.choice(SMELLS)}\n"}


def with_edit(tree: dict[str, str], path: str, rng: random.Random) -> dict[str, str]:
    return {**tree, path: tree.get(path, "") + f"# tuned {rng.randrange(10**6)}\n"}


def generate_week(prs: int, seed: int) -> list[Scenario]:
    """Pull requests of 3-12 files with three to six pushes each, of every kind a week brings."""
    rng = random.Random(seed)
    week: list[Scenario] = []
    for number in range(1, prs + 1):
        forge: Forge = "github" if number % 2 else "gitlab"
        repo = "acme/shop" if forge == "github" else "acme/platform/api"
        base = {f"app/mod_{i}.py": module(f"m{i}", rng, 8) for i in range(30)}
        opened_base = base
        touched = rng.sample(sorted(base), rng.randint(3, 12))
        head = dict(base)
        for path in touched:
            head = with_edit(head, path, rng)
        head = with_smell(head, touched[0], rng)
        pushes: list[tuple[str, dict[str, str], dict[str, str] | None]] = []
        tree = head
        for _ in range(rng.randint(3, 6)):
            kind = rng.choices(
                ["fix", "smell", "unrelated", "force", "rebase"], weights=[4, 2, 2, 1, 1]
            )[0]
            path = rng.choice(touched)
            new_base = None
            if kind == "fix":
                tree = with_edit(tree, path, rng)
            elif kind == "smell":
                tree = with_smell(tree, path, rng)
            elif kind == "unrelated":
                other = rng.choice([p for p in base if p not in touched])
                touched.append(other)
                tree = with_edit(tree, other, rng)
            elif kind == "force":
                tree = with_edit(tree, path, rng)
            else:  # a rebase onto a base that moved elsewhere; the PR's own diff is unchanged
                moved = rng.choice([p for p in base if p not in touched])
                new_base = with_edit(base, moved, rng)
                base = new_base
                tree = {**tree, moved: new_base[moved]}
            pushes.append((kind, tree, new_base))
        week.append(Scenario(forge, repo, number, opened_base, head, pushes))
    return week


@dataclass
class Counts:
    """What one mode cost over the week."""

    prs: int
    reviews: int = 0
    comments: int = 0
    notifications: int = 0
    tokens: int = 0
    wall_s: float = 0.0


def request_of(state: EmulatorState, scenario: Scenario, action: str) -> ReviewRequest:
    pull = state.get_pull(scenario.forge, scenario.repo, scenario.number)
    files = pull.files
    github = scenario.forge == "github"
    return ReviewRequest(
        forge=scenario.forge,
        repo=scenario.repo,
        number=scenario.number,
        title=pull.title,
        author="octocat",
        author_is_bot=False,
        base_ref=pull.base_ref,
        head_ref=pull.head_ref,
        base_sha=pull.newest.base_sha,
        head_sha=pull.newest.head_sha,
        event="pull_request" if github else "merge_request",
        action=action,
        files_changed=len(files) if github else None,
        additions=sum(f.additions for f in files) if github else None,
        deletions=sum(f.deletions for f in files) if github else None,
        project_id=pull.project_id,
        installation_id=1 if github else None,
    )


async def run_mode(database_url: str, week: list[Scenario], *, quiet: bool) -> Counts:
    """Replay the week in one mode; counts what the forge received."""
    clock = VirtualClock()
    state = EmulatorState(clock=clock.now)
    state.github_tokens.add(TOKEN)
    state.gitlab_tokens.add(TOKEN)
    book = load_policy_book(DEFAULT_POLICY_DIR)
    backend = SimulatedBackend()
    counts = Counts(prs=len(week))
    # As `bot serve` builds it for the mode: quiet reviews let a running review finish.
    store = QueueStore.from_url(database_url, settings=QueueSettings(supersede_running=not quiet))
    started = time.perf_counter()
    async with ForgeEmulator(state) as emulator:
        settings = Settings(
            forges=ForgeSettings(
                github_api_url=emulator.github_url,
                github_token=TOKEN,
                gitlab_url=emulator.gitlab_url,
                gitlab_token=TOKEN,
            ),
            review=ReviewSettings(quiet=quiet),
        )
        budget = local_write_budget(settings, now=clock.now, sleep=clock.sleep, post_interval_s=0.0)
        async with build_forges(
            settings,
            clock=clock.now,
            sleep=clock.sleep,
            options=ForgeOptions(retry=RetryPolicy(attempts=2)),
            budget=budget,
        ) as forges:
            pipeline = ReviewPipeline(store, forges, book, quiet=quiet_posting(settings, store))

            async def review(scenario: Scenario, action: str) -> None:
                clock.advance(60)
                request = request_of(state, scenario, action)
                await store.submit_request(
                    request, evaluate(book.policy_for(request.repo), request), now=clock.now()
                )
                await pipeline.plan_jobs(clock.now(), CostEstimate())
                while True:
                    leased = await store.fetch_chunk(
                        levels=LEVELS, owner="bench", now=clock.now(), lease_s=60
                    )
                    if leased is None:
                        break
                    chunk = leased.chunk
                    answer = await backend.complete(
                        LLMRequest(
                            messages=build_messages(chunk.files),
                            metadata={"job_id": chunk.job_id, "lines": chunk.lines},
                        )
                    )
                    counts.tokens += answer.prompt_tokens + answer.completion_tokens
                    clock.advance(answer.gpu_seconds)
                    done = await store.finish_chunk(
                        chunk.id,
                        owner="bench",
                        now=clock.now(),
                        gpu_seconds=answer.gpu_seconds,
                        result={"text": answer.text, "worker": answer.worker},
                    )
                    if done.job_complete:
                        await pipeline.job_completed(done.job_id, clock.now())
                counts.reviews += 1

            for scenario in week:
                open_pull_from_trees(
                    state,
                    scenario.forge,
                    scenario.repo,
                    scenario.number,
                    base=scenario.base,
                    head=scenario.head,
                )
                await review(scenario, "opened")
                for kind, tree, new_base in scenario.pushes:
                    push_tree(
                        state,
                        scenario.forge,
                        scenario.repo,
                        scenario.number,
                        tree,
                        force=kind == "force",
                        base=new_base,
                    )
                    await review(scenario, "synchronize")
    await store.close()
    counts.wall_s = time.perf_counter() - started
    for record in state.records:
        if record.kind == "review":
            counts.comments += 1 + len(record.data.get("comments") or ())
            counts.notifications += 1
        elif record.kind in ("issue_comment", "discussion", "note"):
            counts.comments += 1
            counts.notifications += 1
    return counts


@contextlib.asynccontextmanager
async def database(name: str) -> AsyncIterator[str]:
    """A fresh migrated scratch database on DATABASE_URL's server, else a local one."""
    from bot import devdb
    from bot.db import upgrade_database

    with devdb.provision_server() as server_url:
        async with devdb.scratch_database(server_url, name) as url:
            await upgrade_database(url)
            yield url


def table(full: Counts, quiet: Counts, *, runs: int) -> str:
    def per_pr(value: int, counts: Counts) -> float:
        return value / counts.prs

    rows = [
        ("comments per PR", per_pr(full.comments, full), per_pr(quiet.comments, quiet)),
        (
            "notifications per PR",
            per_pr(full.notifications, full),
            per_pr(quiet.notifications, quiet),
        ),
        ("LLM tokens per PR", per_pr(full.tokens, full), per_pr(quiet.tokens, quiet)),
    ]
    lines = [
        f"{full.prs} pull requests, {full.reviews} reviews (one per push), median of {runs}"
        f" run(s); wall time {full.wall_s:.0f} s (full) and {quiet.wall_s:.0f} s (quiet).",
        "",
        "| per PR | every push in full | quiet reviews | quiet / full |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, before, after in rows:
        ratio = after / before if before else 0.0
        lines.append(f"| {name} | {before:.1f} | {after:.1f} | {ratio:.2f}x |")
    return "\n".join(lines)


def median_counts(runs: list[Counts]) -> Counts:
    return Counts(
        prs=runs[0].prs,
        reviews=runs[0].reviews,
        comments=int(statistics.median(run.comments for run in runs)),
        notifications=int(statistics.median(run.notifications for run in runs)),
        tokens=int(statistics.median(run.tokens for run in runs)),
        wall_s=statistics.median(run.wall_s for run in runs),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prs", type=int, default=24)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("REVIEW_BOT_LOG_LEVEL", "WARNING")
    fulls: list[Counts] = []
    quiets: list[Counts] = []
    for run in range(args.runs):
        week = generate_week(args.prs, args.seed + run)
        async with database("bench_noise_full") as url:
            fulls.append(await run_mode(url, week, quiet=False))
        async with database("bench_noise_quiet") as url:
            quiets.append(await run_mode(url, week, quiet=True))
    report = table(median_counts(fulls), median_counts(quiets), runs=args.runs)
    command = f"python bench/noise.py --prs {args.prs} --seed {args.seed} --runs {args.runs}"
    text = f"# Noise per pull request\n\n`{command}`\n\n{report}\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    asyncio.run(main())
