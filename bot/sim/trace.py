"""Review-request traces: load and validate the JSONL format, generate traces of the same family."""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.errors import ReviewBotError
from bot.model import FORGES, Forge, ReviewRequest

TRACE_VERSION = 1


class TraceError(ReviewBotError):
    """A trace file is unreadable or malformed; the message names the line and field."""


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """The first line of a trace."""

    version: int = TRACE_VERSION
    workers: int = 8
    overhead_s: float = 3.0
    seed: int | None = None
    requests: int = 0
    scenario: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "header": True,
            "version": self.version,
            "workers": self.workers,
            "overhead_s": self.overhead_s,
            "seed": self.seed,
            "requests": self.requests,
            "scenario": self.scenario,
        }


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One review request of a trace; `service_s` is for the simulated backend only."""

    id: str
    arrival_s: float
    forge: Forge
    repo: str
    number: int
    event: str
    action: str
    merged: bool
    base_ref: str
    head_ref: str
    labels: tuple[str, ...]
    author: str
    author_is_bot: bool
    draft: bool
    files_changed: int
    additions: int
    deletions: int
    file_lines: tuple[int, ...]
    service_s: float
    depends_on: tuple[str, ...] = ()

    @property
    def total_lines(self) -> int:
        return sum(self.file_lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "arrival_s": self.arrival_s,
            "forge": self.forge,
            "repo": self.repo,
            "number": self.number,
            "event": self.event,
            "action": self.action,
            "merged": self.merged,
            "base_ref": self.base_ref,
            "head_ref": self.head_ref,
            "labels": list(self.labels),
            "author": self.author,
            "author_is_bot": self.author_is_bot,
            "draft": self.draft,
            "files_changed": self.files_changed,
            "additions": self.additions,
            "deletions": self.deletions,
            "file_lines": list(self.file_lines),
            "service_s": self.service_s,
            "depends_on": list(self.depends_on),
            "id": self.id,
        }


@dataclass(frozen=True, slots=True)
class Trace:
    """A header and its requests, in arrival order."""

    header: TraceHeader
    requests: tuple[TraceRequest, ...]
    source: str = "<memory>"

    @property
    def total_service_s(self) -> float:
        return sum(request.service_s for request in self.requests)


def _require(record: dict[str, Any], key: str, kinds: tuple[type, ...], where: str) -> Any:
    if key not in record:
        raise TraceError(f"{where}: missing field {key!r}")
    value = record[key]
    if isinstance(value, bool) and bool not in kinds:
        raise TraceError(f"{where}: field {key!r} must be {kinds[0].__name__}, got a boolean")
    if not isinstance(value, kinds):
        raise TraceError(
            f"{where}: field {key!r} must be {kinds[0].__name__}, got {type(value).__name__}"
        )
    return value


def _string_list(record: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = _require(record, key, (list,), where)
    if not all(isinstance(value, str) for value in values):
        raise TraceError(f"{where}: field {key!r} must be a list of strings")
    return tuple(values)


def parse_header(record: dict[str, Any], where: str = "line 1") -> TraceHeader:
    """Validate a header object; raises TraceError."""
    if record.get("header") is not True:
        raise TraceError(f'{where}: the first line must be the header ("header": true)')
    version = _require(record, "version", (int,), where)
    if version != TRACE_VERSION:
        raise TraceError(f"{where}: unsupported trace version {version} (expected {TRACE_VERSION})")
    workers = record.get("workers", 8)
    overhead = record.get("overhead_s", 3.0)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise TraceError(f"{where}: workers must be a positive integer, got {workers!r}")
    if not isinstance(overhead, int | float) or isinstance(overhead, bool) or overhead < 0:
        raise TraceError(f"{where}: overhead_s must be a non-negative number, got {overhead!r}")
    seed = record.get("seed")
    requests = record.get("requests", 0)
    return TraceHeader(
        version=version,
        workers=workers,
        overhead_s=float(overhead),
        seed=seed if isinstance(seed, int) else None,
        requests=requests if isinstance(requests, int) else 0,
        scenario=str(record.get("scenario", "")),
    )


def parse_request(record: dict[str, Any], where: str) -> TraceRequest:
    """Validate one request object; raises TraceError naming the field."""
    identifier = _require(record, "id", (str,), where)
    where = f"{where} (id {identifier})"
    forge = _require(record, "forge", (str,), where)
    if forge not in FORGES:
        raise TraceError(f"{where}: forge must be one of {', '.join(FORGES)}, got {forge!r}")
    arrival = float(_require(record, "arrival_s", (int, float), where))
    if arrival < 0 or not math.isfinite(arrival):
        raise TraceError(f"{where}: arrival_s must be a non-negative number, got {arrival}")
    file_lines = _require(record, "file_lines", (list,), where)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in file_lines):
        raise TraceError(f"{where}: file_lines must be a list of non-negative integers")
    service = float(_require(record, "service_s", (int, float), where))
    if service <= 0 or not math.isfinite(service):
        raise TraceError(f"{where}: service_s must be positive, got {service}")
    counts = {
        key: _require(record, key, (int,), where)
        for key in ("number", "files_changed", "additions", "deletions")
    }
    if any(value < 0 for value in counts.values()):
        raise TraceError(f"{where}: number, files_changed, additions, deletions must be >= 0")
    return TraceRequest(
        id=identifier,
        arrival_s=arrival,
        forge=forge,
        repo=_require(record, "repo", (str,), where),
        number=counts["number"],
        event=_require(record, "event", (str,), where),
        action=_require(record, "action", (str,), where),
        merged=bool(record.get("merged", False)),
        base_ref=_require(record, "base_ref", (str,), where),
        head_ref=_require(record, "head_ref", (str,), where),
        labels=_string_list(record, "labels", where),
        author=_require(record, "author", (str,), where),
        author_is_bot=bool(_require(record, "author_is_bot", (bool,), where)),
        draft=bool(_require(record, "draft", (bool,), where)),
        files_changed=counts["files_changed"],
        additions=counts["additions"],
        deletions=counts["deletions"],
        file_lines=tuple(file_lines),
        service_s=service,
        depends_on=_string_list(record, "depends_on", where) if "depends_on" in record else (),
    )


def parse_trace(lines: Iterable[str], *, source: str = "<memory>") -> Trace:
    """Parse trace JSONL text; raises TraceError naming the line and the problem."""
    header: TraceHeader | None = None
    requests: list[TraceRequest] = []
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON: {exc.msg}") from exc
        if not isinstance(record, dict):
            raise TraceError(f"{where}: each line must be a JSON object")
        if header is None:
            header = parse_header(record, where)
            continue
        request = parse_request(record, where)
        if request.id in seen:
            raise TraceError(f"{where}: duplicate request id {request.id!r}")
        seen.add(request.id)
        requests.append(request)
    if header is None:
        raise TraceError(f"{source}: empty trace (no header line)")
    for request in requests:
        for dependency in request.depends_on:
            if dependency not in seen:
                raise TraceError(f"{source}: {request.id} depends on unknown request {dependency}")
    ordered = tuple(sorted(requests, key=lambda request: (request.arrival_s, request.id)))
    return Trace(header=header, requests=ordered, source=source)


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file; raises TraceError."""
    location = Path(path)
    try:
        text = location.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{location}: cannot read trace: {exc.strerror or exc}") from exc
    return parse_trace(text.splitlines(), source=str(location))


def dump_trace(trace: Trace) -> str:
    """Serialize a trace back to JSONL."""
    lines = [json.dumps(trace.header.to_json())]
    lines.extend(json.dumps(request.to_json()) for request in trace.requests)
    return "\n".join(lines) + "\n"


def head_sha_for(request: TraceRequest) -> str:
    """A stable fake commit sha per trace request (one review job per request)."""
    return hashlib.sha1(f"head:{request.id}:{request.number}".encode()).hexdigest()


def to_review_request(request: TraceRequest) -> ReviewRequest | None:
    """The ReviewRequest intake would produce for this event; None when intake ignores it."""
    action = request.action
    if action == "closed":
        if not request.merged:
            return None
        action = "merged"
    return ReviewRequest(
        forge=request.forge,
        repo=request.repo,
        number=request.number,
        title=f"{request.head_ref} ({request.id})",
        author=request.author,
        author_is_bot=request.author_is_bot,
        base_ref=request.base_ref,
        head_ref=request.head_ref,
        base_sha=hashlib.sha1(f"base:{request.base_ref}".encode()).hexdigest(),
        head_sha=head_sha_for(request),
        event="pull_request" if request.forge == "github" else "merge_request",
        action=action,
        draft=request.draft,
        merged=action == "merged",
        labels=request.labels,
        files_changed=request.files_changed,
        additions=request.additions,
        deletions=request.deletions,
        delivery_id=f"trace-{request.id}",
    )


@dataclass(frozen=True, slots=True)
class TraceShape:
    """Parameters of a generated morning: size, peak, tails, mix."""

    requests: int = 1000
    duration_s: float = 10800.0
    peak_at_s: float = 3600.0
    peak_width_s: float = 880.0
    peak_share: float = 0.66
    # Share of big changes (40 files and more); their file count is 40 + (max - 40) * u**tail
    # for uniform u, so a tail under 1 and a larger max make the tail heavier.
    large_share: float = 0.075
    large_tail: float = 1.0
    large_max_files: int = 160
    small_files_median: float = 3.5
    file_lines_median: float = 25.0
    file_lines_sigma: float = 0.62
    base_s_median: float = 9.5
    per_line_s_median: float = 0.07
    per_line_sigma: float = 0.3
    noise_sigma: float = 0.22
    hotfix_per_1000: int = 20
    bot_share: float = 0.053
    refactor_share: float = 0.034
    synchronize_share: float = 0.23
    depends_per_1000: int = 6
    gitlab_share: float = 0.17
    workers: int = 8
    overhead_s: float = 3.0
    repos: tuple[str, ...] = field(
        default=("acme/api", "acme/web", "acme/ml", "acme/infra", "acme/payments", "acme/mobile")
    )


def _file_lines(rng: random.Random, count: int, shape: TraceShape) -> list[int]:
    mu = math.log(shape.file_lines_median)
    return [
        max(1, min(2000, round(rng.lognormvariate(mu, shape.file_lines_sigma))))
        for _ in range(count)
    ]


def generate_trace(shape: TraceShape | None = None, *, seed: int = 1, scenario: str = "") -> Trace:
    """A synthetic trace of the morning-burst family; the same seed gives the same trace."""
    shape = shape or TraceShape()
    rng = random.Random(seed)
    arrivals = sorted(
        min(shape.duration_s, max(0.0, rng.gauss(shape.peak_at_s, shape.peak_width_s)))
        if rng.random() < shape.peak_share
        else rng.uniform(0.0, shape.duration_s)
        for _ in range(shape.requests)
    )
    hotfix_count = round(shape.hotfix_per_1000 * shape.requests / 1000)
    hotfix_slots = set(rng.sample(range(shape.requests), min(hotfix_count, shape.requests)))
    requests: list[TraceRequest] = []
    used_numbers: set[tuple[str, int]] = set()
    for index, arrival in enumerate(arrivals):
        is_hotfix = index in hotfix_slots
        is_bot = not is_hotfix and rng.random() < shape.bot_share
        large = not is_hotfix and not is_bot and rng.random() < shape.large_share
        if large:
            spread = shape.large_max_files - 40
            files = 40 + round(spread * rng.random() ** shape.large_tail)
        elif is_bot:
            files = rng.randint(1, 4)
        else:
            median = math.log(shape.small_files_median)
            files = max(1, min(39, round(rng.lognormvariate(median, 0.9))))
        file_lines = _file_lines(rng, files, shape)
        total = sum(file_lines)
        additions = round(total * rng.uniform(0.55, 0.9))
        base_s = rng.lognormvariate(math.log(shape.base_s_median), 0.35)
        per_line = rng.lognormvariate(math.log(shape.per_line_s_median), shape.per_line_sigma)
        noise = rng.lognormvariate(0.0, shape.noise_sigma)
        service = shape.overhead_s + (base_s + per_line * total) * noise
        repo = rng.choice(shape.repos)
        number = rng.randint(100, 1999)
        while (repo, number) in used_numbers:
            number = rng.randint(100, 9999)
        used_numbers.add((repo, number))
        labels: tuple[str, ...] = ()
        if is_bot:
            labels = ("dependencies",)
            author, head_ref = "renovate[bot]", f"dependabot/pip/pkg-{number}"
        else:
            author = f"dev{rng.randint(0, 120):03d}"
            head_ref = f"fix/{number}" if is_hotfix else f"feature/{number}"
            if large and rng.random() < shape.refactor_share / max(shape.large_share, 1e-9):
                labels = ("refactor",)
        base_ref = f"hotfix/2026-12-{rng.randint(1, 28):02d}" if is_hotfix else "main"
        merged = is_hotfix and rng.random() < 0.3
        action = (
            "closed"
            if merged
            else ("synchronize" if rng.random() < shape.synchronize_share else "opened")
        )
        requests.append(
            TraceRequest(
                id=f"g{seed:03d}-{index:05d}",
                arrival_s=round(arrival, 3),
                forge="gitlab" if rng.random() < shape.gitlab_share else "github",
                repo=repo,
                number=number,
                event="pull_request",
                action=action,
                merged=merged,
                base_ref=base_ref,
                head_ref=head_ref,
                labels=labels,
                author=author,
                author_is_bot=is_bot,
                draft=False,
                files_changed=files,
                additions=additions,
                deletions=total - additions,
                file_lines=tuple(file_lines),
                service_s=round(service, 3),
            )
        )
    requests = _add_dependencies(rng, requests, shape)
    header = TraceHeader(
        workers=shape.workers,
        overhead_s=shape.overhead_s,
        seed=seed,
        requests=len(requests),
        scenario=scenario or f"generated-{seed}",
    )
    return Trace(header=header, requests=tuple(requests), source=header.scenario)


def _add_dependencies(
    rng: random.Random, requests: Sequence[TraceRequest], shape: TraceShape
) -> list[TraceRequest]:
    """Make a few requests (hotfixes first) stacked on an earlier request of the last hour."""
    result = list(requests)
    wanted = round(shape.depends_per_1000 * len(result) / 1000)
    hotfixes = [i for i, r in enumerate(result) if r.base_ref.startswith("hotfix/")]
    others = [i for i in range(len(result)) if i not in set(hotfixes)]
    rng.shuffle(hotfixes)
    rng.shuffle(others)
    for index in (hotfixes + others)[:wanted]:
        request = result[index]
        earlier = [
            r
            for r in result[:index]
            if 0 < request.arrival_s - r.arrival_s < 3600 and not r.depends_on
        ]
        if not earlier:
            continue
        base = rng.choice(earlier)
        result[index] = _replace_depends(request, (base.id,))
    return result


def _replace_depends(request: TraceRequest, depends_on: tuple[str, ...]) -> TraceRequest:
    values = request.to_json()
    values["depends_on"] = list(depends_on)
    return parse_request(values, request.id)
