"""`bot eval`: plant bugs in a repository, review them with a model, report how many it found
and how many of its comments landed on the right line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.config import Settings
from bot.errors import ConfigError
from bot.eval.oracle import NullBackend, OracleBackend
from bot.eval.plant import Mutant, plant_mutants
from bot.eval.run import ReviewOutcome, review_mutants
from bot.eval.score import (
    MutantScore,
    build_report,
    context_pairs,
    render_report,
    score_review,
)
from bot.eval.sources import read_sources
from bot.eval.syntax import FAMILIES, grammar_of
from bot.llm.base import LLMBackend
from bot.llm.factory import create_backend
from bot.review.assemble import classify_skipped_file

log = logging.getLogger(__name__)

MODELS = ("oracle", "null", "simulated", "openai")
DEFAULT_MUTANTS = 50


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The planted bugs, what their reviews produced, and the report."""

    mutants: tuple[Mutant, ...]
    outcomes: tuple[ReviewOutcome, ...]
    report: dict[str, Any]


def reviewable(path: str, patch: str) -> bool:
    """The bot would send this file to the model (not a generated, vendored or minified one)."""
    return classify_skipped_file(path, patch) is None


def plant_in_repo(
    repo: Path, *, count: int, seed: int, languages: Collection[str] | None = None
) -> list[Mutant]:
    """Mutants planted in the repository's source files (of these language families, default
    all); raises ConfigError when none fit."""
    files = [
        file
        for file in read_sources(repo)
        if languages is None or FAMILIES.get(grammar_of(file.path) or "") in languages
    ]
    if not files:
        raise ConfigError(
            f"--repo {repo}: no readable Python, JavaScript or TypeScript files "
            "(UTF-8, LF line ends)"
        )
    mutants = plant_mutants(files, count=count, seed=seed, accept=reviewable)
    if not mutants:
        raise ConfigError(f"--repo {repo}: no site for any bug pattern in its source files")
    if len(mutants) < count:
        log.warning(
            "planted %d of %d bugs: %s has no more sites",
            len(mutants),
            count,
            repo,
            extra={"action": "eval_few_sites"},
        )
    return mutants


def backend_for(
    llm: str, mutants: Sequence[Mutant], *, seed: int, settings: Settings
) -> LLMBackend:
    """The model to review with: a scripted one, or the configured simulated/openai backend."""
    if llm == "oracle":
        return OracleBackend(mutants, seed=seed)
    if llm == "null":
        return NullBackend()
    if llm in ("simulated", "openai"):
        return create_backend(settings.with_changes(llm={"backend": llm}))
    raise ConfigError(f"--llm must be one of {', '.join(MODELS)}, got {llm!r}")


def score_outcome(outcome: ReviewOutcome, backend: LLMBackend) -> MutantScore:
    mutant = outcome.mutant
    return score_review(
        mutant_id=mutant.id,
        pattern=mutant.pattern,
        path=mutant.path,
        first_line=mutant.first_line,
        last_line=mutant.last_line,
        inline=outcome.inline,
        context=context_pairs(mutant.patch),
        summary_only=outcome.summary_only,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        seconds=outcome.seconds,
        mode=backend.mode_of(mutant.id) if isinstance(backend, OracleBackend) else None,
    )


async def evaluate(
    repo: Path,
    *,
    count: int,
    seed: int,
    llm: str,
    settings: Settings,
    languages: Collection[str] | None = None,
) -> Evaluation:
    """Plant, review and score; raises ConfigError for a bad repository or model choice and
    LLMError when the model fails for good."""
    mutants = plant_in_repo(repo, count=count, seed=seed, languages=languages)
    backend = backend_for(llm, mutants, seed=seed, settings=settings)
    try:
        outcomes = await review_mutants(mutants, backend, answer_tokens=settings.llm.max_tokens)
    finally:
        await backend.close()
    scores = [score_outcome(outcome, backend) for outcome in outcomes]
    report = build_report(
        scores,
        context={"repo": str(repo), "seed": seed, "llm": llm, "planted": len(mutants)},
    )
    report["dropped_per_pr"] = round(sum(o.dropped for o in outcomes) / len(outcomes), 4)
    report["unparsable_chunks"] = sum(o.unparsable_chunks for o in outcomes)
    return Evaluation(tuple(mutants), tuple(outcomes), report)


def run_eval_command(args: argparse.Namespace, settings: Settings) -> int:
    """Run `bot eval` and print the report (JSON with --json)."""
    if args.mutants < 1:
        raise ConfigError("--mutants must be at least 1")
    evaluation = asyncio.run(
        evaluate(
            Path(args.repo),
            count=args.mutants,
            seed=args.seed,
            llm=args.llm,
            settings=settings,
            languages=args.language or None,
        )
    )
    if args.json:
        print(json.dumps(evaluation.report, indent=2))
    else:
        print(render_report(evaluation.report))
    return 0


def add_eval_parser(commands: Any) -> None:
    """The `bot eval` subcommand."""
    parser = commands.add_parser(
        "eval", help="plant bugs in a repository's code and measure how the review finds them"
    )
    parser.add_argument("--repo", required=True, help="the repository (a folder) to plant bugs in")
    parser.add_argument("--mutants", type=int, default=DEFAULT_MUTANTS, help="bugs to plant")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--llm", choices=MODELS, default="oracle")
    parser.add_argument(
        "--language",
        action="append",
        choices=sorted(set(FAMILIES.values())),
        help="plant only in this language's files (javascript includes TypeScript; repeatable)",
    )
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run_eval_command)
