"""Where review comments land: `bot eval` on real code, before and after numbered lines and
anchoring by quote, and a real model's floor.

Usage: python bench/review_eval.py [--mutants 200] [--seed 1] [--before REV]
                                   [--real-mutants 12] [--real-url URL | --no-real]
                                   [--out bench/results]

1. For each code base (this repository's tracked Python files, and aiohttp and requests as
   installed in the environment: code nobody tuned the bot for), `bot eval --llm oracle` plants
   the same bugs (same seed) and reviews them twice:
   - before: commit REV (the last one before numbered lines and anchoring), checked out with
     `git worktree` and run with its own `bot eval`, which plants the same bugs and scripts the
     same oracle answers (the run stops if the planted bugs differ), so only the review path
     differs: the prompt, the parser and anchoring;
   - after: this tree.
   `--llm null` runs on this tree too (its recall must be 0).
2. Every review of the after run is posted through the forge emulator by the bot's GitHub
   client; the emulator refuses what GitHub refuses (a line outside the diff, a bad side), and
   each accepted review's request is checked against GitHub's OpenAPI description
   (../shared/openapi; required properties, types, enums).
3. A real model's floor: `bot eval --llm openai` against the CPU vLLM with SmolLM2-135M
   (scripts/vllm_cpu.sh; started here unless --real-url), a few mutants of this repository.
Writes bench/results/review_eval.json and review_eval.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from bot.config import Settings  # noqa: E402
from bot.emulator import EmulatorState, ForgeEmulator  # noqa: E402
from bot.eval.command import Evaluation, evaluate  # noqa: E402
from bot.eval.run import EVAL_REPO  # noqa: E402
from bot.forges.base import RetryPolicy  # noqa: E402
from bot.forges.github import GitHubClient  # noqa: E402

# The last commit of main before the prompt numbered its lines and findings were anchored by
# quote, and before code context reached the prompt: the raw patch, and findings off the diff
# dropped. `bot eval` was already there, so the same bugs meet the older review path.
BEFORE_COMMIT = "211cede"
SCRIPT = REPO / "scripts" / "vllm_cpu.sh"
OPENAPI = REPO.parent / "shared" / "openapi" / "github-rest-subset.json"
REVIEWS_PATH = "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"
TOKEN = "review-eval-token"
# The before commit plants in Python only; the after runs do the same, so both see one set of
# bugs (this repository also holds JavaScript and TypeScript test data).
PYTHON = ("python",)
LANGUAGE_FLAGS = ("--language", "python")
# The tiny model writes until the limit; 200 answer tokens hold one or two findings.
REAL_ANSWER_TOKENS = 200
REAL_MODEL = "smollm2"


def code_bases() -> list[tuple[str, Path]]:
    """(name, folder) of each code base measured."""
    found = [("review-bot", REPO)]
    for name in ("aiohttp", "requests"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append((name, Path(spec.origin).parent))
    return found


def run_eval(
    tree: Path,
    repo: Path,
    *,
    mutants: int,
    seed: int,
    llm: str,
    env: Mapping[str, str] = {},
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """`python -m bot eval ... --json` with the bot package of `tree`."""
    command = [sys.executable, "-m", "bot", "--log-level", "WARNING", "eval", "--repo", str(repo)]
    command += ["--mutants", str(mutants), "--seed", str(seed), "--llm", llm, "--json", *extra]
    environment = {**os.environ, "PYTHONPATH": str(tree), **env}
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=tree, env=environment, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"bot eval failed in {tree}:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


@contextlib.contextmanager
def before_tree(revision: str) -> Iterator[Path]:
    """A detached worktree of `revision` (its own `bot eval`, which plants the same bugs: the
    run checks that it did)."""
    folder = Path(tempfile.mkdtemp(prefix="review-eval-before-"))
    tree = folder / "tree"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), revision],
        check=True,
        capture_output=True,
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(folder, ignore_errors=True)


def resolve(revision: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=12", revision],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def review_request_schema() -> Mapping[str, Any] | None:
    if not OPENAPI.exists():
        return None
    spec = json.loads(OPENAPI.read_text())
    body = spec["paths"][REVIEWS_PATH]["post"]["requestBody"]
    schema: Mapping[str, Any] = body["content"]["application/json"]["schema"]
    return schema


def schema_problems(schema: Mapping[str, Any], value: Any, where: str = "$") -> list[str]:
    """Where `value` breaks an OpenAPI schema: required properties, types, enums (nested)."""
    kinds = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "boolean": bool,
    }
    kind = schema.get("type")
    if value is None:
        return [] if schema.get("nullable") or not kind else [f"{where}: null"]
    expected = kinds.get(str(kind))
    if expected is not None and (
        not isinstance(value, expected) or (expected is int and isinstance(value, bool))
    ):
        return [f"{where}: {type(value).__name__} is not {kind}"]
    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        problems += [
            f"{where}: missing {name!r}" for name in schema.get("required", []) if name not in value
        ]
        for name, part in schema.get("properties", {}).items():
            if name in value:
                problems += schema_problems(part, value[name], f"{where}.{name}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += schema_problems(schema["items"], item, f"{where}[{index}]")
    return problems


async def post_reviews(evaluation: Evaluation) -> dict[str, Any]:
    """Post every review through the emulator with the bot's GitHub client; count refusals."""
    state = EmulatorState()
    state.github_tokens.add(TOKEN)
    schema = review_request_schema()
    rejected_comments = sent_comments = 0
    problems: list[str] = []
    async with ForgeEmulator(state) as emulator, aiohttp.ClientSession() as session:
        client = GitHubClient(
            session,
            base_url=emulator.github_url,
            token=TOKEN,
            retry=RetryPolicy(attempts=2, base_delay_s=0.05),
            post_interval_s=0.0,
        )
        for outcome in evaluation.outcomes:
            review = outcome.review
            state.add_pull(
                "github",
                EVAL_REPO,
                outcome.mutant.id,
                files=[outcome.change],
                head_sha=review.head_sha,
                base_sha=review.base_sha,
            )
            sent_comments += len(review.comments)
            posted = await client.post_review(EVAL_REPO, outcome.mutant.id, review)
            rejected_comments += posted.inline_rejected
    # Every answer the emulator gave a review POST: a 4xx is a refused request, whatever the
    # client then did about it (a summary-only retry, or the rest without the refused one).
    refused = sum(
        1
        for request in state.requests
        if request.method == "POST" and request.path.endswith("/reviews") and request.status >= 400
    )
    accepted = state.posted(kind="review")
    for record in accepted:
        request = {
            "body": record.body,
            "event": record.data.get("event"),
            "commit_id": record.data.get("commit_id"),
            "comments": record.data.get("comments") or [],
        }
        if schema is not None:
            problems += schema_problems(schema, request)
    return {
        "reviews": len(evaluation.outcomes),
        "posted": len(accepted),
        "inline_comments_sent": sent_comments,
        "inline_comments_posted": sum(len(r.data.get("comments") or []) for r in accepted),
        "refused_requests": refused,
        "refused_comments": rejected_comments,
        "schema_checked": schema is not None,
        "schema_problems": problems[:20],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def vllm_server(url: str | None) -> Iterator[str]:
    """The CPU vLLM server at `url`, or one started for the run and stopped afterwards."""
    if url:
        yield url
        return
    command = [str(SCRIPT), "serve", "--port", str(free_port()), "--timeout", "900"]
    command += ["--watch-pid", str(os.getpid())]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SystemExit(f"vLLM did not start:\n{run.stderr[-3000:]}")
    values = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    try:
        yield values["URL"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(values["PID"]), signal.SIGTERM)


def real_model(url: str | None, *, mutants: int, seed: int) -> dict[str, Any]:
    """`bot eval --llm openai` on this repository against SmolLM2-135M on the CPU vLLM."""
    with vllm_server(url) as base_url:
        env = {
            "REVIEW_BOT_LLM_URLS": base_url,
            "REVIEW_BOT_LLM_MODEL": REAL_MODEL,
            "REVIEW_BOT_LLM_RESPONSE_FORMAT": "json_schema",
            "REVIEW_BOT_LLM_MAX_TOKENS": str(REAL_ANSWER_TOKENS),
            "REVIEW_BOT_LLM_TIMEOUT_S": "900",
        }
        return run_eval(
            REPO, REPO, mutants=mutants, seed=seed, llm="openai", env=env, extra=LANGUAGE_FLAGS
        )


def headline(report: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("mutants", "recall", "exact_line_rate", "false_findings_per_pr", "summary_only_rate")
    return {key: report.get(key) for key in keys} | {
        "dropped_per_pr": report.get("dropped_per_pr"),
        "tokens_per_review": report.get("tokens_per_review"),
        "seconds_per_review": report.get("seconds_per_review"),
        "per_oracle_mode": report.get("per_oracle_mode"),
        "per_pattern": report.get("per_pattern"),
        "unparsable_chunks": report.get("unparsable_chunks"),
    }


def rate(value: Any) -> str:
    return "-" if value is None else f"{float(value):.3f}"


def render(results: Mapping[str, Any]) -> str:
    """The markdown report."""
    lines = [
        "# Review accuracy on planted bugs (`bot eval`)",
        "",
        f"Command: `{results['command']}` (seconds and tokens per review are medians; with "
        "the oracle and the null model every figure but seconds is the same for the seed).",
        f"{results['mutants']} bugs per code base, seed {results['seed']}, the ten patterns of "
        "bot/eval/catalogue.py in turn. Before: commit "
        f"`{results['before_commit']}` (a `git worktree` run with its own `bot eval`, which "
        "plants the same bugs and scripts the same oracle answers; the run checks that the "
        "planted bugs are the same), whose prompt is the raw patch and whose parser drops a "
        "finding off the diff. After: this tree (numbered lines, anchoring by quote, code "
        "context).",
        "",
        "## Oracle: recall and exact-line rate, before and after",
        "",
        "| code base | files mutated | before recall | before exact | after recall | after exact "
        "| after false/PR | after summary-only | null recall |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for base in results["code_bases"]:
        before, after, null = base["before"], base["after"], base["null"]
        lines.append(
            f"| {base['name']} | {base['files']} | {rate(before['recall'])} | "
            f"{rate(before['exact_line_rate'])} | {rate(after['recall'])} | "
            f"{rate(after['exact_line_rate'])} | {rate(after['false_findings_per_pr'])} | "
            f"{rate(after['summary_only_rate'])} | {rate(null['recall'])} |"
        )
    lines += [
        "",
        "The oracle knows each planted bug and names its line the ways real models get it "
        "wrong, in a seeded mix (bot/eval/oracle.py): the right line (half of them without a "
        "quote), a line off by 1-5 with the right quote, the wrong side, a quote and no line, "
        "a `./`-prefixed path, a line counted from the hunk's start.",
        "",
        "### By the way the oracle named the line (all code bases)",
        "",
        "| answer | bugs | before recall | before exact | after recall | after exact |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode, row in results["per_oracle_mode"].items():
        lines.append(
            f"| {mode} | {row['mutants']} | {rate(row['before_recall'])} | "
            f"{rate(row['before_exact'])} | {rate(row['after_recall'])} | "
            f"{rate(row['after_exact'])} |"
        )
    first = results["code_bases"][0]
    lines += [
        "",
        f"### Per pattern, after ({first['name']})",
        "",
        "| pattern | bugs | recall | exact | false/PR |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, group in first["after"]["per_pattern"].items():
        lines.append(
            f"| {name} | {group['mutants']} | {rate(group['recall'])} | "
            f"{rate(group['exact_line_rate'])} | {rate(group['false_findings_per_pr'])} |"
        )
    lines += [
        "",
        "## Posted through the forge emulator",
        "",
        "Every review of the after runs, posted by the bot's GitHub client to the emulator "
        "(which refuses what GitHub refuses), each accepted request checked against GitHub's "
        "OpenAPI description of `POST " + REVIEWS_PATH + "`.",
        "",
        "| code base | reviews | inline comments sent | posted | refused requests "
        "| schema problems |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for base in results["code_bases"]:
        posting = base["posting"]
        checked = len(posting["schema_problems"]) if posting["schema_checked"] else "not checked"
        lines.append(
            f"| {base['name']} | {posting['reviews']} | {posting['inline_comments_sent']} | "
            f"{posting['inline_comments_posted']} | {posting['refused_requests']} | {checked} |"
        )
    real = results.get("real_model")
    lines += ["", "## A real model's floor: SmolLM2-135M on the CPU vLLM", ""]
    if real is None:
        lines.append("Not run (--no-real).")
    else:
        tokens, seconds = real["tokens_per_review"], real["seconds_per_review"]
        lines += [
            f"`bot eval --repo . --mutants {real['mutants']} --seed {results['seed']} "
            "--llm openai`, REVIEW_BOT_LLM_URLS at the CPU vLLM (scripts/vllm_cpu.sh), "
            f"{REAL_ANSWER_TOKENS} answer tokens, json_schema decoding.",
            "",
            "| bugs | recall | exact | false/PR | summary-only | dropped/PR | unparsable parts "
            "| tokens/review | s/review |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {real['mutants']} | {rate(real['recall'])} | {rate(real['exact_line_rate'])} | "
            f"{rate(real['false_findings_per_pr'])} | {rate(real['summary_only_rate'])} | "
            f"{rate(real['dropped_per_pr'])} | {real['unparsable_chunks']} | "
            f"{tokens['median']:.0f} | {seconds['median']:.1f} |",
            "",
            "A 135M-parameter model is tiny: this is the floor of the serving path (the prompt, "
            "constrained decoding, parsing and anchoring run for real), not a measure of what "
            "a review model finds.",
        ]
    return "\n".join(lines) + "\n"


def mode_table(bases: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per oracle answer kind, before and after, pooled over the code bases."""
    pooled: dict[str, dict[str, Any]] = {}
    for side in ("before", "after"):
        totals: dict[str, list[float]] = {}
        for base in bases:
            for mode, row in (base[side].get("per_oracle_mode") or {}).items():
                entry = totals.setdefault(mode, [0.0, 0.0, 0.0])
                found = (row["recall"] or 0.0) * row["mutants"]
                entry[0] += row["mutants"]
                entry[1] += found
                entry[2] += (row["exact_line_rate"] or 0.0) * found
        for mode, (count, found, exact) in sorted(totals.items()):
            row = pooled.setdefault(mode, {"mutants": int(count)})
            row[f"{side}_recall"] = round(found / count, 4) if count else None
            row[f"{side}_exact"] = round(exact / found, 4) if found else None
    return pooled


async def after_run(repo: Path, *, mutants: int, seed: int) -> tuple[dict[str, Any], Evaluation]:
    evaluation = await evaluate(
        repo, count=mutants, seed=seed, llm="oracle", settings=Settings(), languages=PYTHON
    )
    return evaluation.report, evaluation


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mutants", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--before", default=BEFORE_COMMIT, help="commit of the before run")
    parser.add_argument("--real-mutants", type=int, default=12)
    parser.add_argument("--real-url", help="a running CPU vLLM (else one is started)")
    parser.add_argument("--no-real", action="store_true", help="skip the real model")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    before_commit = resolve(args.before)
    bases: list[dict[str, Any]] = []
    with before_tree(before_commit) as tree:
        for name, folder in code_bases():
            print(f"{name}: {folder}", flush=True)
            before = run_eval(tree, folder, mutants=args.mutants, seed=args.seed, llm="oracle")
            after, evaluation = asyncio.run(after_run(folder, mutants=args.mutants, seed=args.seed))
            null = run_eval(
                REPO, folder, mutants=args.mutants, seed=args.seed, llm="null", extra=LANGUAGE_FLAGS
            )
            before_sites = [(r["path"], r["lines"]) for r in before["reviews"]]
            after_sites = [(r["path"], r["lines"]) for r in after["reviews"]]
            if before_sites != after_sites:
                raise SystemExit(f"{name}: the before and after runs planted different bugs")
            posting = asyncio.run(post_reviews(evaluation))
            files = len({outcome.mutant.path for outcome in evaluation.outcomes})
            bases.append(
                {
                    "name": name,
                    "folder": str(folder) if name != "review-bot" else ".",
                    "files": files,
                    "before": headline(before),
                    "after": headline(after),
                    "null": headline(null),
                    "posting": posting,
                }
            )
            print(
                f"  before recall {before['recall']} exact {before['exact_line_rate']}; "
                f"after recall {after['recall']} exact {after['exact_line_rate']}; "
                f"null recall {null['recall']}; refused {posting['refused_requests']}",
                flush=True,
            )
    real = None
    if not args.no_real:
        real = headline(real_model(args.real_url, mutants=args.real_mutants, seed=args.seed))
        print(f"real model: recall {real['recall']} exact {real['exact_line_rate']}", flush=True)
    command = (
        "make bench-review"
        if argv is None and not sys.argv[1:]
        else ("python bench/review_eval.py " + " ".join(sys.argv[1:] if argv is None else argv))
    )
    results = {
        "command": command,
        "mutants": args.mutants,
        "seed": args.seed,
        "before_commit": before_commit,
        "code_bases": bases,
        "per_oracle_mode": mode_table(bases),
        "real_model": real,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "review_eval.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "review_eval.md").write_text(render(results))
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
