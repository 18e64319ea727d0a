"""The settings model: every knob the bot reads from its environment, declared once.

Each knob is a field of a section (database, queue, scheduler, window, llm, forges, review,
status, budget, web, alerts) with its type, default, meaning and environment variable; secrets
may come from the file `NAME_FILE` names. `load_settings` reads and validates the whole model
before anything starts; bot.components maps it to the settings objects the components take,
whose defaults are the model's (`DEFAULTS`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic import model_validator as _model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bot.database_url import normalize_database_url
from bot.errors import ConfigError
from bot.model import DEFAULT_CONTEXT_TOKENS, SEVERITIES, Level

REPO_ROOT = Path(__file__).resolve().parent.parent
# An HTTP header field name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
DEFAULT_POLICY_DIR = REPO_ROOT / "policies"

Severity = Literal["critical", "major", "minor", "info"]
assert set(get_args(Severity)) == set(SEVERITIES)


def knob(
    default: Any,
    env: str,
    doc: str,
    *,
    secret: bool = False,
    shown: str | None = None,
    **constraints: Any,
) -> Any:
    """A field read from the environment variable `env` (or `env`_FILE when `secret`).

    `shown` is the default as the README and `--help` give it, when the value alone says too
    little (a default that follows another knob, or none).
    """
    extra: dict[str, Any] = {"env": env}
    if secret:
        extra["secret"] = True
    if shown is not None:
        extra["shown"] = shown
    return Field(default, description=doc, json_schema_extra=extra, **constraints)


class Section(BaseModel):
    """A group of knobs; immutable, unknown names refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def valid_shares(weights: Sequence[float]) -> bool:
    """Four level weights, none negative, P0's positive: 0 is a share too (the level waits for
    the others), and P0 never waits."""
    return len(weights) == 4 and weights[0] > 0 and all(weight >= 0 for weight in weights)


def _split(raw: object) -> object:
    """A comma- (or colon-) separated list from the environment, as a list of its parts."""
    if isinstance(raw, str):
        return [part.strip() for part in raw.replace(":", ",").split(",") if part.strip()]
    return raw


def _lowered(raw: object) -> object:
    return raw.strip().lower() if isinstance(raw, str) else raw


class DatabaseSettings(Section):
    """The PostgreSQL the queue lives in, and the limits of every session on it."""

    url: str | None = knob(
        None,
        "DATABASE_URL",
        "PostgreSQL URL, e.g. `postgresql://bot@db:5432/reviewbot`; `postgres://`, "
        "`postgresql+asyncpg://` and `postgresql+psycopg://` mean the same, and libpq's "
        "`?sslmode=` is honoured",
        secret=True,
    )
    statement_timeout_s: float = knob(
        60.0,
        "REVIEW_BOT_DB_STATEMENT_TIMEOUT_S",
        "PostgreSQL `statement_timeout` on every session of the bot; `0`: none",
        ge=0,
    )
    lock_timeout_s: float = knob(
        10.0,
        "REVIEW_BOT_DB_LOCK_TIMEOUT_S",
        "`lock_timeout`: a statement waits at most this long for a lock another session "
        "holds; `0`: none",
        ge=0,
    )
    idle_in_transaction_timeout_s: float = knob(
        30.0,
        "REVIEW_BOT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S",
        "`idle_in_transaction_session_timeout`: a session idle inside a transaction (its "
        "process paused or stuck) is ended and its locks freed; `0`: none",
        ge=0,
    )
    outage_backoff_s: float = knob(
        1.0,
        "REVIEW_BOT_RETRY_BACKOFF_S",
        "first pause after the database is lost; doubles, with jitter, up to 30 s until it is back",
        gt=0,
    )
    start_wait_s: float = knob(
        30.0,
        "REVIEW_BOT_DB_START_WAIT_S",
        "how long `bot serve` waits at start for a database that does not answer yet (one "
        "started with it) before it exits 2; a database or role that does not exist exits at once",
        ge=0,
    )

    @field_validator("url")
    @classmethod
    def _normalized(cls, url: str | None) -> str | None:
        return normalize_database_url(url) if url else None


class QueueKnobs(Section):
    """What the store does with a failed chunk."""

    max_attempts: int = knob(
        3, "REVIEW_BOT_MAX_ATTEMPTS", "attempts per chunk before its job ends `dead`", ge=1
    )
    retry_backoff_s: float = knob(
        10.0,
        "REVIEW_BOT_CHUNK_RETRY_BACKOFF_S",
        "first pause before a failed chunk is tried again; doubles with each attempt, up to "
        "10 minutes",
        gt=0,
    )


def default_heartbeat_s(lease_s: float) -> float:
    """The heartbeat when none is set: every 30 s, or a third of a shorter lease's."""
    return min(30.0, lease_s / 3)


class SchedulerSettings(Section):
    """Knobs of the multilevel feedback queue and of a dispatcher's leases."""

    workers: int = knob(
        8,
        "REVIEW_BOT_WORKERS",
        "LLM worker slots per dispatcher on the simulated backend (with LLM servers, their "
        "windows decide)",
        ge=1,
    )
    # P0 never waits for a share. P1 holds most reviews and so most of the mean turnaround.
    # While the queue keeps up, P2 gets 2 slots for P1's 6: its large reviews then end sooner,
    # and so do P1's large reviews dropped to P2 by feedback. While work queues (more ready
    # chunks than two per slot, bot/sched/backlog.py) every slot P2 holds keeps many short P1
    # reviews waiting, and a share of any size kept P2 one slot; so P2's weight is 0 then: it
    # takes a slot only when no other level has work for it (a weight of 0 means that), until
    # the backlog clears or aging lifts a waiting job. P3's small bot reviews keep their slot.
    # The price: P2's first chunks wait out a burst, some past P2's 5-minute wait alert.
    # Against 8:16:2:1 this took the worst of 25 mornings from 1.13x the clairvoyant bound's
    # mean to 1.06x and the public morning from 1.04x to 0.99x, with P2's P95 still within
    # 1.02x the bound's (docs/benchmarks.md, "Weights").
    weights: tuple[int, int, int, int] = knob(
        (8, 6, 2, 1),
        "REVIEW_BOT_WEIGHTS",
        "level weights P0..P3 while the queue keeps up; a level of weight 0 takes a slot only "
        "when no other level has work for it",
        shown="`8,6,2,1`",
    )
    backlog_weights: tuple[int, int, int, int] = knob(
        (8, 16, 0, 1),
        "REVIEW_BOT_BACKLOG_WEIGHTS",
        "level weights P0..P3 while work queues (more ready chunks than two per slot): P2 "
        "waits for the other levels then; set them to REVIEW_BOT_WEIGHTS for one set of shares",
        shown="`8,16,0,1`",
    )
    # GPU seconds a job may use at a level before it drops one (P3 has no quantum).
    quantum_s: tuple[float, float, float] = knob(
        (120.0, 90.0, 240.0),
        "REVIEW_BOT_QUANTUM_S",
        "GPU seconds a job may use at P0, P1, P2 before it drops a level",
        shown="`120,90,240`",
    )
    aging_interval_s: float = knob(
        1800.0,
        "REVIEW_BOT_AGING_S",
        "waiting this long without progress raises a job one level (never into P0)",
        gt=0,
    )
    lease_s: float = knob(
        300.0,
        "REVIEW_BOT_LEASE_S",
        "lease on every stage (planning a job, each chunk, assembling and posting its review); "
        "a process that dies loses its work to others after this",
    )
    heartbeat_s: float = knob(
        30.0,
        "REVIEW_BOT_HEARTBEAT_S",
        "how often a live worker renews its leases; more than a third of the lease is refused "
        "at start",
        shown="`30`, or a third of a shorter lease",
    )
    poll_s: float = 5.0  # fallback poll when LISTEN/NOTIFY is quiet
    learned_costs: bool = knob(
        False,
        "REVIEW_BOT_LEARNED_COSTS",
        "rank reviews by the cost learned per language, repository and pull request (kept in "
        "PostgreSQL) instead of by changed lines alone (mean turnaround 0-3% lower on the "
        "mornings of docs/benchmarks.md)",
    )
    # Larger chunks pay fewer calls' overhead while work queues; while workers are free,
    # short ones win (bot/sched/backlog.py, docs/benchmarks.md "Chunk size").
    backlog_chunk_lines: int = knob(
        800,
        "REVIEW_BOT_BACKLOG_CHUNK_LINES",
        "diff lines per chunk after a review's first while more than two chunks per worker "
        "slot wait (400 otherwise; both at most what the served model's context holds); `0` "
        "keeps 400",
        ge=0,
    )
    # On SIGTERM a dispatcher takes no new chunk and gives its running calls this long to
    # finish; what still runs then is handed back. Keep it under the orchestrator's grace
    # (Kubernetes' terminationGracePeriodSeconds, compose's stop_grace_period).
    shutdown_grace_s: float = knob(
        20.0,
        "REVIEW_BOT_SHUTDOWN_GRACE_S",
        "on SIGTERM a dispatcher takes no new chunk and gives running calls this long to "
        "finish, then hands back what still runs; keep it under the orchestrator's grace "
        "(`terminationGracePeriodSeconds`, compose's `stop_grace_period`)",
    )

    @_model_validator(mode="before")
    @classmethod
    def _heartbeat_follows_lease(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("heartbeat_s") is None and "lease_s" in data:
            try:
                lease_s = float(data["lease_s"])
            except (TypeError, ValueError):
                return data  # the lease's own check names it
            data = {**data, "heartbeat_s": default_heartbeat_s(lease_s)}
        return data

    @field_validator("weights", "backlog_weights", "quantum_s", mode="before")
    @classmethod
    def _listed(cls, raw: object, info: ValidationInfo) -> object:
        listed = _split(raw)
        count = 3 if info.field_name == "quantum_s" else 4
        if isinstance(listed, list) and len(listed) != count:
            what = "positive numbers" if count == 3 else "numbers"
            raise ValueError(f"must be {count} {what}")
        return listed

    @field_validator("quantum_s")
    @classmethod
    def _positive(cls, values: tuple[float, ...]) -> tuple[float, ...]:
        if any(value <= 0 for value in values):
            raise ValueError("must be positive numbers")
        return values

    @field_validator("weights", "backlog_weights")
    @classmethod
    def _shares(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if not valid_shares(values):
            raise ValueError("must be numbers of 0 or more, P0's positive")
        return values


def check_scheduler_settings(settings: SchedulerSettings) -> None:
    """Refuse lease and heartbeat settings that cannot work; raises ConfigError with the reason."""
    if settings.lease_s <= 0:
        raise ConfigError(f"REVIEW_BOT_LEASE_S must be positive, got {settings.lease_s:g}")
    if settings.heartbeat_s <= 0:
        raise ConfigError(f"REVIEW_BOT_HEARTBEAT_S must be positive, got {settings.heartbeat_s:g}")
    if settings.shutdown_grace_s < 0:
        raise ConfigError(
            f"REVIEW_BOT_SHUTDOWN_GRACE_S must be 0 or more, got {settings.shutdown_grace_s:g}"
        )
    # Three heartbeats per lease: one late or lost renewal must not cost a live worker its work.
    if settings.heartbeat_s * 3 > settings.lease_s:
        raise ConfigError(
            f"REVIEW_BOT_HEARTBEAT_S={settings.heartbeat_s:g} is too long for "
            f"REVIEW_BOT_LEASE_S={settings.lease_s:g}: the heartbeat must be at most a third of "
            f"the lease (here {settings.lease_s / 3:g} s), or a live worker loses its leases"
        )


class WindowSettings(Section):
    """Bounds of an engine's (LLM server's) window of chunks in flight, and how it moves."""

    floor: int = knob(
        1,
        "REVIEW_BOT_WINDOW_FLOOR",
        "chunks in flight per LLM server (its window) at least; floor = ceiling fixes it",
    )
    # A 7B model on one data-centre GPU gains throughput up to 32-64 sequences; vLLM's own
    # --max-num-seqs default (256) leaves the engine room for a P0 above this.
    ceiling: int = knob(48, "REVIEW_BOT_WINDOW_CEILING", "chunks in flight per LLM server at most")
    initial: int = knob(
        4,
        "REVIEW_BOT_WINDOW_INITIAL",
        "the window an LLM server starts at, brought within the floor and ceiling",
    )
    # Relative change of tokens/s or latency per token below which an interval shows nothing:
    # chunk sizes vary, and one noisy interval must not move the window.
    tolerance: float = 0.10
    # Refusals or timeouts cut the window by this factor (multiplicative decrease).
    overload_factor: float = 0.5
    # KV-cache usage (0..1) at which more sequences would only make vLLM preempt.
    kv_cache_high: float = 0.95
    # An interval is judged once it holds this many completions (or one window's worth, if
    # larger) and lasted at least `min_interval_s`.
    min_completions: int = 4
    min_interval_s: float = 2.0
    # A grow is kept when tokens/s rose by at least (new/old window) ** min_elasticity: 1 is
    # perfect scaling, 0 none; below it the engine is past its knee. At 0.2 an engine whose
    # step time doubles by two sequences settled at 0.84 of its best tokens/s, close enough
    # to 0.8 that a few percent of noise between intervals walked it below; 0.15 settles at
    # 0.89 there, and higher on larger knees, without noise (tests/unit/test_window.py).
    min_elasticity: float = 0.15
    # Slow start doubles again only while a doubling returned at least 2 ** this in tokens/s:
    # an engine still far from its knee scales nearly linearly (elasticity near 1), and one
    # whose doubling already bent (the CPU server: 4 -> 8 gave 1.25x, elasticity 0.32) would
    # overshoot with the next (8 -> 16 gave 0.94x). Below it, slow start ends at that window.
    slow_start_elasticity: float = 0.65
    # Outside slow start a move is this share of the window (at least one place).
    growth: float = 0.25
    # Quiet intervals in a row after which the window probes a step, up and down in turn, in
    # case the engine or the work changed.
    probe_after: int = 5
    # A P0 call may be slowed by the batch it shares by at most this factor (its pace per
    # answer token against the engine's pace at a low concurrency); lower-level calls beyond
    # that are taken back while it runs (see bot.sched.p0_room).
    p0_slowdown: float = knob(
        1.5,
        "REVIEW_BOT_P0_SLOWDOWN",
        "how much a running P0 call may be slowed by the batch it shares on its engine "
        "(lower-level calls beyond that are taken back)",
    )
    p0_companions: int | None = knob(
        None,
        "REVIEW_BOT_P0_COMPANIONS",
        "a fixed number of calls allowed beside a running P0 call, instead of the learned one",
        shown="(learned)",
    )
    # What prefilling a review's shared prompt again on another engine costs, in seconds: a
    # chunk whose review's engine is full waits there while the wait is expected to cost
    # less (see bot.sched.affinity); 0 never waits.
    affinity_prefill_s: float = knob(
        1.0,
        "REVIEW_BOT_AFFINITY_PREFILL_S",
        "seconds that prefilling a review's shared prompt (system prompt, pull request) again "
        "on another engine costs: a review's chunks go to the engine that ran its first chunk "
        "while its window has room; when it is full they wait there only while the expected "
        "wait is shorter than this, else spill; `0` never waits",
    )

    @_model_validator(mode="before")
    @classmethod
    def _initial_within_bounds(cls, data: Any) -> Any:
        # An initial window left unset is brought within the bounds given.
        if isinstance(data, dict) and data.get("initial") is None:
            fields = cls.model_fields
            try:
                floor = int(data.get("floor", fields["floor"].default))
                ceiling = int(data.get("ceiling", fields["ceiling"].default))
            except (TypeError, ValueError):
                return data
            data = {**data, "initial": max(floor, min(ceiling, fields["initial"].default))}
        return data

    @_model_validator(mode="after")
    def _consistent(self) -> WindowSettings:
        if not 1 <= self.floor <= self.initial <= self.ceiling:
            raise ValueError(
                "window bounds need 1 <= floor <= initial <= ceiling, got "
                f"floor={self.floor} initial={self.initial} ceiling={self.ceiling}"
            )
        if not 0 < self.tolerance < 1:
            raise ValueError("tolerance must be within (0, 1)")
        if not 0 < self.overload_factor < 1:
            raise ValueError("overload_factor must be within (0, 1)")
        if not 0 < self.kv_cache_high <= 1:
            raise ValueError("kv_cache_high must be within (0, 1]")
        if self.min_completions < 1 or self.min_interval_s < 0:
            raise ValueError("min_completions must be >= 1 and min_interval_s >= 0")
        if not 0 < self.min_elasticity < 1:
            raise ValueError("min_elasticity must be within (0, 1)")
        if not self.min_elasticity <= self.slow_start_elasticity <= 1:
            raise ValueError("slow_start_elasticity must be within [min_elasticity, 1]")
        if not 0 < self.growth <= 1 or self.probe_after < 1:
            raise ValueError("growth must be within (0, 1] and probe_after >= 1")
        if self.affinity_prefill_s < 0:
            raise ValueError("affinity_prefill_s must be >= 0")
        if self.p0_slowdown < 1:
            raise ValueError("p0_slowdown must be at least 1")
        if self.p0_companions is not None and self.p0_companions < 0:
            raise ValueError("p0_companions must not be negative")
        return self

    @property
    def fixed(self) -> bool:
        """The window cannot move (floor = ceiling): an exclusive or fixed-size engine."""
        return self.floor == self.ceiling


DEFAULT_WINDOW_FLOOR: int = WindowSettings.model_fields["floor"].default
DEFAULT_WINDOW_INITIAL: int = WindowSettings.model_fields["initial"].default
DEFAULT_WINDOW_CEILING: int = WindowSettings.model_fields["ceiling"].default
DEFAULT_P0_SLOWDOWN: float = WindowSettings.model_fields["p0_slowdown"].default


def check_ceiling(settings: WindowSettings, *, max_num_seqs: int, p0_places: int = 1) -> None:
    """Raise ValueError unless the ceiling leaves `p0_places` of the server's sequences free.

    vLLM's priority scheduling preempts a running sequence only under KV-cache pressure, so a
    P0 chunk starts at once only if the engine has a sequence place the window never fills.
    """
    if settings.ceiling + p0_places > max_num_seqs:
        raise ValueError(
            f"window ceiling {settings.ceiling} leaves no room for a P0 chunk under the "
            f"server's --max-num-seqs {max_num_seqs}: lower the ceiling to at most "
            f"{max_num_seqs - p0_places} or raise --max-num-seqs"
        )


class LLMSettings(Section):
    """The LLM backend and the servers (or router) behind it."""

    # None: REVIEW_BOT_LLM was not set. The simulated backend then stands in only where no
    # real forge could receive its canned reviews (see bot.llm.factory.check_backend_choice).
    backend: str | None = knob(
        None,
        "REVIEW_BOT_LLM",
        "LLM backend: `openai` (vLLM servers), `vllm` (in-process, GPU host), `simulated`. "
        "Unset, `bot serve` refuses to start a dispatcher when forge credentials are "
        "configured (so canned reviews never reach a real PR unasked); with no forge it "
        "stands in as `simulated`",
    )
    base_urls: tuple[str, ...] = knob(
        (),
        "REVIEW_BOT_LLM_URLS",
        "comma-separated OpenAI-compatible base URLs, one per GPU worker, or one router",
    )
    # The URL names one router (vLLM production-stack, llm-d) in front of the servers: one
    # window for it, each review's session key and level passed for its routing.
    router: bool = knob(
        False,
        "REVIEW_BOT_LLM_ROUTER",
        "`REVIEW_BOT_LLM_URLS` names one router (vLLM production-stack, llm-d) in front of the "
        "servers: one window for it, each call carrying its review's session key and level "
        "(see Router mode)",
    )
    session_header: str = knob(
        "x-session-id",
        "REVIEW_BOT_LLM_SESSION_HEADER",
        "router mode: the header carrying a review's session key (production-stack's "
        "`--session-key`)",
    )
    objectives: tuple[str, ...] = knob(
        (),
        "REVIEW_BOT_LLM_OBJECTIVES",
        "router mode: four InferenceObjective names for P0-P3, sent as "
        "`x-gateway-inference-objective` (llm-d, Gateway API inference extension)",
    )
    metrics_url: str | None = knob(
        None,
        "REVIEW_BOT_LLM_METRICS_URL",
        "router mode: where the router's queue metrics are served (llm-d's Endpoint Picker: "
        "its own port)",
        shown="the router's `/metrics`",
    )
    model: str = knob("review-model", "REVIEW_BOT_LLM_MODEL", "model name the servers serve")
    api_key: str | None = knob(
        None, "REVIEW_BOT_LLM_API_KEY", "API key sent to the LLM servers", secret=True
    )
    pass_priority: bool = knob(
        True,
        "REVIEW_BOT_LLM_PRIORITY",
        "pass the job's level as vLLM's `priority` (server started with "
        "`--scheduling-policy priority`)",
    )
    stream: bool = knob(
        True,
        "REVIEW_BOT_LLM_STREAM",
        "stream answers (`stream: true`) so the dispatcher knows each call's answer tokens so "
        "far and, making room for a P0, takes back the calls with the most left, never one "
        "near its end; a server that answers with one JSON body is read as before",
    )
    timeout_s: float = knob(
        600.0, "REVIEW_BOT_LLM_TIMEOUT_S", "seconds one LLM call may take", gt=0
    )
    max_tokens: int = knob(
        1024,
        "REVIEW_BOT_LLM_MAX_TOKENS",
        "answer tokens asked for per chunk; the chunk's line budget leaves room for them in "
        "the model's context",
        ge=1,
    )
    # vLLM's constrained decoding keeps even small models to the output contract.
    response_format: Literal["json_schema", "json_object"] | None = knob(
        "json_schema",
        "REVIEW_BOT_LLM_RESPONSE_FORMAT",
        "constrain answers to the output contract (vLLM guided decoding); `json_object`, or "
        "`none` for servers without it",
    )
    max_num_seqs: int | None = knob(
        None,
        "REVIEW_BOT_LLM_MAX_NUM_SEQS",
        "the servers' `--max-num-seqs`; start-up refuses a window ceiling that leaves no "
        "sequence free for a P0 chunk",
        ge=1,
    )
    # The simulated backend, for demos and fault drills.
    sim_time_scale: float = knob(
        0.0,
        "REVIEW_BOT_SIM_TIME_SCALE",
        "simulated backend only: each call takes this share of the GPU seconds it charges "
        "(`0.5`: 1.5-3 s a call), for demos and fault drills",
        ge=0,
    )
    sim_fault_every: int = knob(
        0,
        "REVIEW_BOT_SIM_FAULT_EVERY",
        "simulated backend only, fault drills: the first call for every Nth chunk raises an "
        "unexpected `RuntimeError`",
        ge=0,
    )

    @field_validator("backend", "metrics_url", mode="before")
    @classmethod
    def _stripped(cls, raw: object) -> object:
        if isinstance(raw, str):
            return raw.strip() or None
        return raw

    @field_validator("backend")
    @classmethod
    def _lower_backend(cls, backend: str | None) -> str | None:
        return backend.lower() if backend else None

    @field_validator("base_urls", "objectives", mode="before")
    @classmethod
    def _comma_list(cls, raw: object) -> object:
        if isinstance(raw, str):
            parts = [part.strip() for part in raw.split(",")]
            return () if parts == [""] else parts
        return raw

    @field_validator("base_urls")
    @classmethod
    def _no_empty_url(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(url for url in urls if url)

    @field_validator("objectives")
    @classmethod
    def _four_objectives(cls, objectives: tuple[str, ...]) -> tuple[str, ...]:
        if objectives and (len(objectives) != 4 or not all(objectives)):
            raise ValueError(
                "must name four InferenceObjectives, for P0, P1, P2 and P3, comma separated"
            )
        return objectives

    @field_validator("session_header", mode="before")
    @classmethod
    def _header(cls, raw: object) -> object:
        if isinstance(raw, str):
            raw = raw.strip()
            if not _HEADER_NAME.fullmatch(raw):
                raise ValueError("must be an HTTP header name")
        return raw

    @field_validator("response_format", mode="before")
    @classmethod
    def _format(cls, raw: object) -> object:
        lowered = _lowered(raw)
        return None if lowered in {"none", "off", "false", "0"} else lowered

    @field_validator("max_num_seqs", mode="before")
    @classmethod
    def _unknown_when_zero(cls, raw: object) -> object:
        return None if raw in ("0", 0) else raw

    @_model_validator(mode="after")
    def _router_has_one_url(self) -> LLMSettings:
        if self.router and len(self.base_urls) != 1:
            raise ValueError(
                "REVIEW_BOT_LLM_ROUTER=true needs exactly one URL in REVIEW_BOT_LLM_URLS (the "
                f"router's), got {len(self.base_urls)}: {', '.join(self.base_urls) or 'none'}"
            )
        return self


class ForgeSettings(Section):
    """The forges: how their webhooks are checked and how their APIs are reached."""

    github_webhook_secret: str | None = knob(
        None,
        "GITHUB_WEBHOOK_SECRET",
        "secret of the GitHub webhook (`X-Hub-Signature-256`)",
        secret=True,
    )
    gitlab_webhook_token: str | None = knob(
        None,
        "GITLAB_WEBHOOK_TOKEN",
        "secret token of the GitLab webhook (`X-Gitlab-Token`)",
        secret=True,
    )
    github_token: str | None = knob(
        None,
        "GITHUB_TOKEN",
        "a token for the GitHub API, or use a GitHub App (`GITHUB_APP_ID`, `GITHUB_PRIVATE_KEY`)",
        secret=True,
    )
    github_app_id: str | None = knob(None, "GITHUB_APP_ID", "GitHub App id")
    github_private_key: str | None = knob(
        None, "GITHUB_PRIVATE_KEY", "GitHub App PEM private key", secret=True
    )
    github_api_url: str = knob(
        "https://api.github.com",
        "GITHUB_API_URL",
        "GitHub's API; GitHub Enterprise: `https://HOST/api/v3`",
    )
    gitlab_url: str = knob("https://gitlab.com", "GITLAB_URL", "the GitLab instance")
    gitlab_token: str | None = knob(
        None, "GITLAB_TOKEN", "a bot token for the GitLab API", secret=True
    )
    bot_login: str = knob(
        "review-bot",
        "REVIEW_BOT_LOGIN",
        "the bot's own account: its comments are never read as commands",
    )


class ReviewSettings(Section):
    """What a review says and where."""

    policy_dir: Path = knob(
        DEFAULT_POLICY_DIR,
        "REVIEW_BOT_POLICY_DIR",
        "where `default.yaml` and per-repository policies live",
        shown="`policies/`",
    )
    quiet: bool = knob(
        True,
        "REVIEW_BOT_QUIET",
        "quiet reviews: findings said once (fingerprints in PostgreSQL), one summary comment "
        "edited in place; `false` posts a full review with its own summary on every push",
    )
    min_inline_severity: Severity = knob(
        "info",
        "REVIEW_BOT_MIN_INLINE_SEVERITY",
        "lowest severity posted as an inline comment (`critical`, `major`, `minor`, `info`); "
        "lower ones are listed in the summary only",
    )
    inline_cap: int = knob(
        50,
        "REVIEW_BOT_INLINE_CAP",
        "inline comments per review at most (the most severe kept); the rest go to the summary",
        ge=0,
    )
    context_tokens: int = knob(
        DEFAULT_CONTEXT_TOKENS,
        "REVIEW_BOT_CONTEXT_TOKENS",
        "prompt tokens per chunk for the pull request's title and description and the code "
        "around each change at the head revision (see [Context](#context-from-the-head-"
        "revision)); at most a quarter of the prompt's room in the served model's context, "
        "and the chunk's line budget leaves room for them; `0` reads no file and shows neither",
        ge=0,
    )

    @field_validator("min_inline_severity", mode="before")
    @classmethod
    def _severity(cls, raw: object) -> object:
        return _lowered(raw)


class StatusKnobs(Section):
    """The review's check run or commit status."""

    enabled: bool = knob(
        True,
        "REVIEW_BOT_STATUS",
        "show each review on its commit: a check run (GitHub App) or commit status (GitHub "
        "token, GitLab) with level, place in line and ETA",
    )
    neutral_at: Severity = knob(
        "major",
        "REVIEW_BOT_STATUS_NEUTRAL_AT",
        "a finished review's check is `neutral` when a finding is at this severity or above "
        "(`critical`, `major`, `minor`, `info`), else `success`",
    )
    interval_s: float = knob(
        5.0,
        "REVIEW_BOT_STATUS_INTERVAL_S",
        "how often the status publisher looks at the queue",
        gt=0,
    )
    updates_per_hour: int = knob(
        120,
        "REVIEW_BOT_STATUS_UPDATES_PER_HOUR",
        "news-only status writes (a moved ETA, place or progress) per forge in any hour; first "
        "statuses and state changes are not counted here (the write budget below still orders "
        "every write); `0`: states only",
        ge=0,
    )

    @field_validator("neutral_at", mode="before")
    @classmethod
    def _severity(cls, raw: object) -> object:
        return _lowered(raw)


class BudgetKnobs(Section):
    """Content-creating requests per forge identity, shared by every process."""

    github_writes_per_minute: int = knob(
        80,
        "REVIEW_BOT_GITHUB_WRITES_PER_MINUTE",
        "content-creating requests per GitHub installation (or token) in any minute, shared by "
        "every process through PostgreSQL (GitHub's documented secondary limits); `0`: not "
        "limited",
        ge=0,
    )
    github_writes_per_hour: int = knob(
        500,
        "REVIEW_BOT_GITHUB_WRITES_PER_HOUR",
        "the same in any hour; `0`: not limited",
        ge=0,
    )
    gitlab_writes_per_minute: int = knob(
        300,
        "REVIEW_BOT_GITLAB_WRITES_PER_MINUTE",
        "the same per GitLab token in any minute (GitLab's default note creation limit is 300 "
        "a minute per user); `0`: not limited",
        ge=0,
    )
    gitlab_writes_per_hour: int = knob(
        0,
        "REVIEW_BOT_GITLAB_WRITES_PER_HOUR",
        "the same per GitLab token in any hour; `0`: not limited",
        ge=0,
    )
    window_scale: float = knob(
        1.0,
        "REVIEW_BOT_FORGE_WINDOW_SCALE",
        "compressed time for tests and benchmarks only: the write budget's minute and hour "
        "last this share of their length",
        gt=0,
    )


class WebSettings(Section):
    """The webhook server, the admin pages and /metrics."""

    insecure_dev: bool = knob(
        False,
        "REVIEW_BOT_INSECURE_DEV",
        "accept unsigned webhooks when a secret is missing (development only; logged loudly)",
    )
    max_body_bytes: int = knob(
        25 * 1024 * 1024,
        "REVIEW_BOT_MAX_BODY_BYTES",
        "largest webhook body accepted, in bytes",
        shown="`26214400` (25 MiB)",
        ge=1,
    )
    admin_token: str | None = knob(
        None,
        "REVIEW_BOT_ADMIN_TOKEN",
        "token for `/admin`; without it nothing admin is served",
        secret=True,
    )
    metrics_port: int | None = knob(
        None,
        "REVIEW_BOT_METRICS_PORT",
        "serve `/metrics` on this port of its own instead of the webhook port (same `--host`), "
        "so only the scraper's network reaches it",
        ge=1,
        le=65535,
    )
    metrics_require_token: bool = knob(
        False,
        "REVIEW_BOT_METRICS_REQUIRE_TOKEN",
        "`/metrics` answers 401 unless the scrape sends `Authorization: Bearer "
        "$REVIEW_BOT_ADMIN_TOKEN` (start is refused without an admin token)",
    )
    # A TLS-terminating proxy in front sets X-Forwarded-Proto; believe it (Secure cookies).
    trust_forwarded_proto: bool = knob(
        False,
        "REVIEW_BOT_TRUST_FORWARDED_PROTO",
        "a TLS-terminating proxy in front sets `X-Forwarded-Proto`: believe it, so the admin "
        "cookie is marked `Secure` (it always is over direct TLS)",
    )


class AlertSettings(Section):
    """Wait thresholds per level (P3 has none) and where alerts go."""

    threshold_s: dict[Level, float] = knob(
        {Level.P0: 10.0, Level.P1: 60.0, Level.P2: 300.0},
        "REVIEW_BOT_ALERT_THRESHOLDS_S",
        "wait alert thresholds for P0, P1, P2",
        shown="`10,60,300`",
    )
    webhook_url: str | None = knob(
        None, "REVIEW_BOT_ALERT_WEBHOOK_URL", "Slack-compatible webhook for alerts"
    )
    min_interval_s: float = 30.0

    @field_validator("threshold_s", mode="before")
    @classmethod
    def _per_level(cls, raw: object) -> object:
        listed = _split(raw)
        if isinstance(listed, list):
            if len(listed) != 3:
                raise ValueError("must be 3 numbers, for P0, P1 and P2")
            return dict(zip((Level.P0, Level.P1, Level.P2), listed, strict=True))
        return raw

    @field_validator("threshold_s")
    @classmethod
    def _positive(cls, thresholds: dict[Level, float]) -> dict[Level, float]:
        if any(value <= 0 for value in thresholds.values()):
            raise ValueError("must be positive numbers")
        return thresholds

    @field_validator("webhook_url", mode="before")
    @classmethod
    def _unset_when_empty(cls, raw: object) -> object:
        return raw or None


class _Environment(PydanticBaseSettingsSource):
    """Each knob from its own variable (or a secret's NAME_FILE), into its section."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads whole sections

    def __call__(self) -> dict[str, Any]:
        values: dict[str, dict[str, Any]] = {}
        for section, name, field, env in knobs(self.settings_cls):
            raw = self.environ.get(env)
            if not raw and _extra(field).get("secret"):
                raw = _read_secret_file(self.environ, env)
            if raw is None or raw == "":
                continue
            values.setdefault(section, {})[name] = raw
        return values


def _read_secret_file(environ: Mapping[str, str], env: str) -> str | None:
    path = environ.get(f"{env}_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{env}_FILE={path!r} cannot be read: {exc.strerror or exc}") from exc


def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


class Settings(BaseSettings):
    """Everything the bot reads from its environment, by component."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    queue: QueueKnobs = Field(default_factory=QueueKnobs)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    window: WindowSettings = Field(default_factory=WindowSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    forges: ForgeSettings = Field(default_factory=ForgeSettings)
    review: ReviewSettings = Field(default_factory=ReviewSettings)
    status: StatusKnobs = Field(default_factory=StatusKnobs)
    budget: BudgetKnobs = Field(default_factory=BudgetKnobs)
    web: WebSettings = Field(default_factory=WebSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Built from keyword arguments only: load_settings hands the environment's sections in.
        return (init_settings,)

    @_model_validator(mode="after")
    def _ceiling_leaves_room_for_p0(self) -> Settings:
        if self.llm.max_num_seqs is not None:
            try:
                check_ceiling(self.window, max_num_seqs=self.llm.max_num_seqs)
            except ValueError as exc:
                raise ValueError(f"REVIEW_BOT_WINDOW_CEILING: {exc}") from exc
        return self

    def with_changes(self, **sections: Any) -> Settings:
        """A copy with some knobs changed: `section={"knob": value}` or a whole section."""
        changed: dict[str, Any] = {}
        for name, change in sections.items():
            current = getattr(self, name)
            changed[name] = (
                current.model_copy(update=change) if isinstance(change, dict) else change
            )
        return self.model_copy(update=changed)


# Every knob at its default. The component settings whose fields the model also sets take their
# defaults from here, so each default is written once, in this module.
DEFAULTS = Settings()


def knobs(settings_cls: type[BaseModel] = Settings) -> Iterator[tuple[str, str, FieldInfo, str]]:
    """(section, field, its FieldInfo, its environment variable) of every knob, in order."""
    for section, section_field in settings_cls.model_fields.items():
        model = section_field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items():
            env = _extra(field).get("env")
            if env:
                yield section, name, field, env


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The whole configuration from the environment; raises ConfigError naming the variable."""
    env = os.environ if environ is None else environ
    sections = _Environment(Settings, env)()
    try:
        settings = Settings(**sections)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, sections)) from None
    check_scheduler_settings(settings.scheduler)
    return settings


_MESSAGES = {
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_parsing": "must be a number",
    "bool_parsing": "must be true or false",
    "greater_than_equal": "must be {ge} or more",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "literal_error": "must be one of {expected}",
    "too_short": "must be {min_length} values",
    "too_long": "must be {max_length} values",
}


def _explain(exc: ValidationError, sections: Mapping[str, Mapping[str, str]]) -> str:
    """One line naming the variable at fault (the first, if several are)."""
    error = exc.errors()[0]
    location = [str(part) for part in error["loc"]]
    context = error.get("ctx") or {}
    if error["type"] == "value_error":
        reason = str(context.get("error", error["msg"]))
    else:
        template = _MESSAGES.get(error["type"])
        reason = template.format(**context) if template else error["msg"].lower()
        if error["type"] == "greater_than" and context.get("gt") == 0:
            reason = "must be positive"
    fields = {(section, name): env for section, name, _, env in knobs(Settings)}
    if len(location) >= 2 and (location[0], location[1]) in fields:
        env = fields[(location[0], location[1])]
        raw = sections.get(location[0], {}).get(location[1])
        shown = "" if raw is None or _is_secret(location[0], location[1]) else f", got {raw!r}"
        return f"{env} {reason}{shown}"
    if location and not re.search(r"\b[A-Z][A-Z0-9_]{3,}\b", reason):
        names = [env for (section, _), env in fields.items() if section == location[0]]
        return f"{', '.join(names)}: {reason}"
    return reason


def _is_secret(section: str, name: str) -> bool:
    model = Settings.model_fields[section].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    return bool(_extra(model.model_fields[name]).get("secret"))


def variables() -> dict[str, FieldInfo]:
    """Every environment variable the settings read, with its field."""
    return {env: field for _, _, field, env in knobs(Settings)}


def secret_variables() -> frozenset[str]:
    """The variables that may come from the file NAME_FILE names instead."""
    return frozenset(env for env, field in variables().items() if _extra(field).get("secret"))


def shown_default(field: FieldInfo) -> str:
    """A knob's default as the README and --help give it."""
    shown = _extra(field).get("shown")
    if isinstance(shown, str):
        return shown
    value = field.get_default(call_default_factory=True)
    if value is None or value == ():
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{value:g}`"
    return f"`{value}`"


def markdown_table() -> str:
    """The README's configuration table, one row per variable, from the model."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for env, field in variables().items():
        name = f"`{env}`" + (" (or `_FILE`)" if _extra(field).get("secret") else "")
        rows.append(f"| {name} | {shown_default(field)} | {field.description} |")
    return "\n".join(rows) + "\n"


def effective_values(settings: Settings) -> Iterator[tuple[str, str]]:
    """(variable, value) of every knob as `settings` holds it; secrets only say whether set."""
    for section, name, field, env in knobs(Settings):
        value = getattr(getattr(settings, section), name)
        if _extra(field).get("secret"):
            yield env, "(set)" if value else ""
        elif isinstance(value, tuple):
            yield env, ",".join(str(part) for part in value)
        elif isinstance(value, dict):
            yield env, ",".join(f"{part:g}" for part in value.values())
        elif isinstance(value, bool):
            yield env, str(value).lower()
        elif isinstance(value, float):
            yield env, f"{value:g}"
        else:
            yield env, "" if value is None else str(value)
