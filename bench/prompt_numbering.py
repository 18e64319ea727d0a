"""What numbering every diff line costs in prompt tokens, on real commits of real repositories.

Each file diff of the last N non-merge commits is rendered twice, exactly as the prompt shows
it: as before numbering (the patch text, control characters removed) and as now (every line
prefixed with its line number, bot.diff.number_hunks). Tokens are counted by the bot's own
estimate (3 characters a token, what chunking budgets with) and, with --tokenizer, by a real
tokenizer (a tokenizer.json, e.g. SmolLM2's; needs the `tokenizers` package).

    python bench/prompt_numbering.py --git . --git /path/to/clone --commits 200 \
        [--tokenizer ~/.cache/review-bot/models/smollm2-135m-instruct/tokenizer.json] \
        [--out bench/results/prompt_numbering.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.diff import CONTROL, number_hunks, parse_hunks
from bot.llm.vllm_metrics import CHARS_PER_TOKEN

Counter = Callable[[str], int]


def estimate(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def file_patches(repo: str, commits: int) -> Iterator[tuple[str, str]]:
    """(commit, patch from its first @@) of every text file diff of the last commits."""
    log = subprocess.run(
        ["git", "-C", repo, "log", f"-n{commits}", "--no-merges", "-p", "--format=@COMMIT %H"],
        capture_output=True,
        check=True,
    ).stdout.decode("utf-8", errors="replace")
    commit = ""
    current: list[str] | None = None
    for line in log.split("\n"):
        if line.startswith("@COMMIT ") or line.startswith("diff --git "):
            if current:
                yield commit, "\n".join(current)
            current = None
            if line.startswith("@COMMIT "):
                commit = line.split()[1]
            else:
                current = []
        elif current is not None and (current or line.startswith("@@")):
            current.append(line)
    if current:
        yield commit, "\n".join(current)


def before(patch: str) -> str:
    """The fenced body as the prompt showed it before numbering."""
    return CONTROL.sub("", patch.replace("\r\n", "\n")).rstrip("\n")


@dataclass
class Totals:
    files: int = 0
    changed: int = 0
    shown: int = 0
    before: int = 0
    after: int = 0


def measure(repo: str, commits: int, count: Counter) -> tuple[Totals, list[float]]:
    totals = Totals()
    per_commit: dict[str, list[int]] = {}
    for commit, patch in file_patches(repo, commits):
        hunks = parse_hunks(patch)
        if not hunks:
            continue
        old, new = count(before(patch)), count(number_hunks(hunks))
        totals.files += 1
        totals.changed += sum(1 for h in hunks for line in h.lines if line.kind in "+-")
        totals.shown += sum(len(h.lines) for h in hunks)
        totals.before += old
        totals.after += new
        pair = per_commit.setdefault(commit, [0, 0])
        pair[0] += old
        pair[1] += new
    growth = [100.0 * (new - old) / old for old, new in per_commit.values() if old]
    return totals, growth


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--git", action="append", required=True, help="a repository (repeat)")
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--tokenizer", help="a tokenizer.json to count real tokens with")
    parser.add_argument("--out", help="write the markdown table here too")
    args = parser.parse_args()
    counters: dict[str, Counter] = {"estimate (3 chars/token)": estimate}
    if args.tokenizer:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(args.tokenizer)
        counters[f"tokenizer {Path(args.tokenizer).parent.name}"] = lambda text: len(
            tokenizer.encode(text, add_special_tokens=False).ids
        )
    command = (
        "python bench/prompt_numbering.py "
        + " ".join(f"--git {repo}" for repo in args.git)
        + f" --commits {args.commits}"
        + (" --tokenizer <tokenizer.json>" if args.tokenizer else "")
    )
    lines = [
        "# What numbering every diff line costs in prompt tokens",
        "",
        f"`{command}`",
        "",
        "| repository | counted by | file diffs | changed lines | tokens before | tokens after "
        "| per changed line before → after | growth, all | growth per commit, median | P95 |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for repo in args.git:
        name = Path(repo).resolve().name
        if Path(repo).resolve() == Path(__file__).resolve().parents[1]:
            name = "this repository"
        elif name == "repo":  # a mirror's work tree: name it by its owner+name folder
            name = Path(repo).resolve().parent.name.replace("+", "/")
        for label, count in counters.items():
            totals, growth = measure(repo, args.commits, count)
            ordered = sorted(growth)
            p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0
            lines.append(
                f"| {name} | {label} | {totals.files} | {totals.changed} | {totals.before} "
                f"| {totals.after} | {totals.before / max(1, totals.changed):.1f} → "
                f"{totals.after / max(1, totals.changed):.1f} "
                f"| {100.0 * (totals.after - totals.before) / max(1, totals.before):.1f}% "
                f"| {statistics.median(growth) if growth else 0.0:.1f}% | {p95:.1f}% |"
            )
    lines += [
        "",
        "Before: the patch text as the prompt showed it; after: every line as `<number> "
        "<mark><code>`. Growth per commit: the commit's file diffs together, as one review "
        "would show them.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
