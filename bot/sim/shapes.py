"""`bot trace generate`: named shapes of generated traces, any parameter overridable, seeded.

A shape is a set of TraceShape parameters (bot.sim.trace); the same shape and seed give the
same trace, byte for byte, so a run can be repeated from its command line alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bot.sim.trace import Trace, TraceError, TraceShape, dump_trace, generate_trace

# name -> (what it is, the TraceShape fields it sets)
SHAPES: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "morning": (
        "the public morning's family: 1,000 requests over 3 h, two thirds around the peak at "
        "1 h, 7.5% large changes, 2% hotfixes, 5% bots, 17% GitLab",
        {},
    ),
    "flat": ("the same mix arriving evenly over the 3 h: no burst", {"peak_share": 0.0}),
    "heavy-tail": (
        "more and bigger refactors: 15% large changes of 40-400 files, most near 400",
        {"large_share": 0.15, "large_tail": 0.5, "large_max_files": 400},
    ),
    "hotfix-storm": (
        "an incident: 10% of the requests are hotfixes (P0) into hotfix/** branches",
        {"hotfix_per_1000": 100},
    ),
    "small": (
        "200 requests over one hour, peak at 30 min: simulates in seconds",
        {"requests": 200, "duration_s": 3600.0, "peak_at_s": 1800.0, "peak_width_s": 300.0},
    ),
}
DEFAULT_SHAPE = "morning"
DEFAULT_SEED = 1


def _value(field: dataclasses.Field[Any], raw: str) -> Any:
    """A TraceShape field's value from text; raises TraceError naming the field."""
    default = field.default
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError as exc:
        kind = "an integer" if isinstance(default, int) else "a number"
        raise TraceError(f"--set {field.name}: {raw!r} is not {kind}") from exc
    repos = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not repos or any("/" not in repo for repo in repos):
        raise TraceError(f"--set {field.name}: give owner/name repositories, comma-separated")
    return repos


def shape_for(name: str, settings: Sequence[str] = ()) -> TraceShape:
    """The named shape with `KEY=VALUE` settings applied; raises TraceError for a bad one."""
    if name not in SHAPES:
        raise TraceError(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    fields = {field.name: field for field in dataclasses.fields(TraceShape)}
    values = dict(SHAPES[name][1])
    for setting in settings:
        key, separator, raw = setting.partition("=")
        if not separator or key.strip() not in fields:
            known = ", ".join(sorted(fields))
            raise TraceError(f"--set {setting!r}: use KEY=VALUE with KEY one of {known}")
        values[key.strip()] = _value(fields[key.strip()], raw.strip())
    shape = TraceShape(**values)
    if shape.requests < 1 or shape.duration_s <= 0 or not 0.0 <= shape.peak_share <= 1.0:
        raise TraceError("a trace needs requests >= 1, duration_s > 0 and peak_share in [0, 1]")
    return shape


def generated_trace(name: str = DEFAULT_SHAPE, *, seed: int = DEFAULT_SEED) -> Trace:
    """A named shape's trace for this seed, labelled `NAME-SEED`."""
    return generate_trace(shape_for(name), seed=seed, scenario=f"{name}-{seed}")


def shapes_help() -> str:
    """The shapes, one per entry, for `--help`."""
    return listing({name: text for name, (text, _) in SHAPES.items()})


def listing(entries: Mapping[str, str]) -> str:
    """Names and what they are, the text wrapped under its name's column."""
    width = max(len(name) for name in entries) + 4
    return "\n".join(
        textwrap.fill(
            text, 96, initial_indent=f"  {name:<{width - 2}}", subsequent_indent=" " * width
        )
        for name, text in entries.items()
    )


def run_trace_command(args: argparse.Namespace) -> int:
    """`bot trace generate`: write the trace (JSON lines) to --out or stdout."""
    shape = shape_for(args.shape, args.set or ())
    if args.requests is not None:
        shape = dataclasses.replace(shape, requests=args.requests)
    trace = generate_trace(shape, seed=args.seed, scenario=f"{args.shape}-{args.seed}")
    text = dump_trace(trace)
    if args.out in (None, "-"):
        sys.stdout.write(text)
    else:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise TraceError(f"{args.out}: cannot write: {exc.strerror or exc}") from exc
    large = sum(1 for request in trace.requests if request.files_changed >= 40)
    hotfixes = sum(1 for request in trace.requests if request.base_ref.startswith("hotfix/"))
    gpu_h = sum(request.service_s for request in trace.requests) / 3600
    print(
        f"{args.shape} seed {args.seed}: {len(trace.requests)} requests over "
        f"{shape.duration_s / 3600:.1f} h, {large} large, {hotfixes} hotfixes, "
        f"{gpu_h:.1f} GPU-hours of review on {shape.workers} workers"
        + ("" if args.out in (None, "-") else f"; written to {args.out}"),
        file=sys.stderr,
    )
    return 0


__all__ = [
    "DEFAULT_SEED",
    "DEFAULT_SHAPE",
    "SHAPES",
    "generated_trace",
    "listing",
    "run_trace_command",
    "shape_for",
    "shapes_help",
]
