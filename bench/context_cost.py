"""What the pull request's title and description and the code context cost in prompt tokens.

Each review goes through what `bot serve` runs before the model: the planner's chunking
(build_review_plan), its context step (each file's head text, blocks found with tree-sitter,
kept with the chunks: with_contexts) and the chunk prompt (shared_context_for, build_messages).
The prompt is built twice per chunk, with and without the shared part; the cost of a review is
the difference summed over its chunks, in the bot's own token estimate (3 characters a token,
which errs high). Two sets of reviews:

- the demo: the shipped morning-burst trace's pull requests with the demo's generated diffs,
  each file's head text as the emulator serves it (the patch's new side, blank between hunks);
- real diffs: the commits of a git repository (title: the subject; description: the body; each
  changed file at the commit, as the forge's contents API would serve it).

    python bench/context_cost.py [--git .] [--commits 300] [--demo 200]
        [--context-tokens 1536] [--out bench/results/context_cost.md]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.demo import demo_files, load_demo_trace
from bot.emulator.repository import text_from_patch
from bot.forges.base import PullChanges
from bot.llm.vllm_metrics import prompt_tokens_estimate
from bot.model import DEFAULT_CONTEXT_TOKENS, FileChange, Job, JobId, JobState, Level
from bot.review.context_fetch import files_to_read, with_contexts
from bot.review.planner import PlanningSettings, build_review_plan
from bot.review.prompt_context import shared_context_for
from bot.review.prompts import build_messages

EPOCH = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Review:
    """One pull request as the planner sees it, with its files' head texts."""

    title: str
    description: str
    files: tuple[FileChange, ...]
    sources: dict[str, str]


@dataclass(frozen=True, slots=True)
class Cost:
    """Prompt tokens of one review with and without the shared part, and what it dropped."""

    without: int
    with_shared: int
    chunks: int
    over_budget_chunks: int
    drops: Counter[str]
    languages: Counter[str]

    @property
    def added(self) -> int:
        return self.with_shared - self.without


def prompt_tokens(messages: Sequence[dict[str, str]]) -> int:
    return sum(prompt_tokens_estimate(message["content"]) for message in messages)


def measure(review: Review, *, context_tokens: int) -> Cost:
    """Plan the review as the planner does and build each chunk's prompt both ways."""
    job = Job(
        id=JobId(1),
        forge="github",
        repo="bench/context",
        number=1,
        head_sha="0" * 40,
        base_level=Level.P2,
        level=Level.P2,
        state=JobState.QUEUED,
        enqueued_at=EPOCH,
        title=review.title,
        pull_details={"title": review.title, "description": review.description},
    )
    changes = PullChanges(
        base_sha="1" * 40, head_sha="0" * 40, start_sha="1" * 40, files=review.files
    )
    plan = build_review_plan(job, changes, None, settings=PlanningSettings())
    wanted = set(files_to_read(plan.chunks))
    chunks = with_contexts(
        plan.chunks, {path: text for path, text in review.sources.items() if path in wanted}
    )
    without = with_shared = over = 0
    drops: Counter[str] = Counter()
    languages: Counter[str] = Counter()
    for chunk in chunks:
        shared = shared_context_for(job, chunk.files, budget_tokens=context_tokens)
        without += prompt_tokens(build_messages(chunk.files))
        with_shared += prompt_tokens(build_messages(chunk.files, shared=shared))
        if shared is not None:
            over += shared.tokens > context_tokens
            drops.update(shared.dropped)
            languages.update(context.language or "other" for context, _ in shared.files)
    return Cost(without, with_shared, len(chunks), over, drops, languages)


def demo_reviews(count: int) -> tuple[list[Review], str]:
    trace, source = load_demo_trace(count)
    reviews: list[Review] = []
    for request in trace.requests:
        files = tuple(demo_files(request))
        sources = {
            change.path: text_from_patch(change.patch)
            for change in files
            if change.patch and change.status != "removed"
        }
        title = f"Change {request.number} in {request.repo}"
        reviews.append(Review(title, "", files, sources))
    return reviews, source


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def split_patch(text: str) -> Iterator[tuple[str, str]]:
    """(path, hunks) of each file of a `git diff` output (binary files have no hunks)."""
    path: str | None = None
    lines: list[str] = []
    for line in text.split("\n"):
        if line.startswith("diff --git "):
            if path is not None:
                yield path, "\n".join(lines)
            path, lines = line.rsplit(" b/", 1)[-1], []
        elif line.startswith("+++ b/"):
            path = line[len("+++ b/") :]
        elif lines or line.startswith("@@"):
            lines.append(line)
    if path is not None:
        yield path, "\n".join(lines)


def git_reviews(repo: Path, count: int) -> list[Review]:
    """The newest `count` non-merge commits of `repo` as reviews."""
    # Commits with a parent (the root commit has nothing to diff against).
    shas = [
        line.split()[0]
        for line in git(repo, "log", "--no-merges", f"-{count}", "--format=%H %P").split("\n")
        if len(line.split()) == 2
    ]
    reviews: list[Review] = []
    for sha in shas:
        subject, _, body = git(repo, "log", "-1", "--format=%s%n%b", sha).partition("\n")
        status = dict(
            reversed(line.split("\t")[:2])
            for line in git(repo, "diff", "--name-status", "--no-renames", f"{sha}~1", sha)
            .strip()
            .split("\n")
            if "\t" in line
        )
        names = {"A": "added", "D": "removed", "M": "modified"}
        patches = git(repo, "diff", "--no-renames", "-U3", f"{sha}~1", sha)
        files: list[FileChange] = []
        sources: dict[str, str] = {}
        for path, hunks in split_patch(patches):
            state = names.get(status.get(path, "M"), "modified")
            added = sum(1 for line in hunks.split("\n") if line.startswith("+"))
            removed = sum(1 for line in hunks.split("\n") if line.startswith("-"))
            files.append(FileChange(path, added, removed, hunks or None, state))
            if hunks and state != "removed":
                with contextlib.suppress(subprocess.CalledProcessError, UnicodeDecodeError):
                    sources[path] = git(repo, "show", f"{sha}:{path}")
        reviews.append(Review(subject, body.strip(), tuple(files), sources))
    return reviews


def percentile(values: Sequence[int], share: float) -> float:
    ordered = sorted(values)
    rank = max(0, math.ceil(share * len(ordered)) - 1)
    return float(ordered[rank])


def table(name: str, reviewed: Sequence[Cost]) -> list[str]:
    # A commit that changes only skipped files (lock files, images) has no prompt at all.
    costs = [cost for cost in reviewed if cost.chunks]
    added = [cost.added for cost in costs]
    share = [cost.added / cost.with_shared for cost in costs if cost.with_shared]
    per_chunk = [cost.added / cost.chunks for cost in costs if cost.chunks]
    drops: Counter[str] = Counter()
    languages: Counter[str] = Counter()
    for cost in costs:
        drops.update(cost.drops)
        languages.update(cost.languages)
    chunks = sum(cost.chunks for cost in costs)
    return [
        f"| {name} | {len(costs)} | {chunks} | {statistics.median(added):.0f} | "
        f"{percentile(added, 0.95):.0f} | {statistics.median(per_chunk):.0f} | "
        f"{statistics.median(share):.0%} | {sum(cost.over_budget_chunks for cost in costs)} | "
        + ", ".join(f"{key} {value}" for key, value in sorted(drops.items()))
        + " | "
        + ", ".join(f"{key} {value}" for key, value in languages.most_common(6))
        + " |"
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git", type=Path, action="append", default=[])
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--demo", type=int, default=200)
    parser.add_argument("--context-tokens", type=int, default=DEFAULT_CONTEXT_TOKENS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows: list[str] = []
    demo, source = demo_reviews(args.demo)
    rows += table(
        f"demo trace ({Path(source).name})",
        [measure(r, context_tokens=args.context_tokens) for r in demo],
    )
    for repo in args.git or [Path(".")]:
        reviews = git_reviews(repo, args.commits)
        resolved = repo.resolve()
        # A mirror's git directory is named `repo` under `owner+name`.
        name = (
            resolved.parent.name.replace("+", "/") if resolved.name == "repo" else "this repository"
        )
        rows += table(
            f"commits of {name}", [measure(r, context_tokens=args.context_tokens) for r in reviews]
        )
    command = "python bench/context_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# What the title, description and code context cost in prompt tokens",
        "",
        f"`{command.strip()}`",
        "",
        f"Allowance {args.context_tokens} tokens per chunk (REVIEW_BOT_CONTEXT_TOKENS); tokens "
        "by the bot's estimate (3 characters a token, erring high). Added = prompt tokens with "
        "the shared part minus without it, per review (all its chunks).",
        "",
        "| reviews | n | chunks | added per review, median | P95 | per chunk, median | "
        "share of the prompt, median | chunks over the allowance | drops (chunks) | "
        "languages (files shown) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
