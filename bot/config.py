"""Settings from the environment, with embedded defaults that run the demo."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from bot.database_url import normalize_database_url
from bot.errors import ConfigError
from bot.model import DEFAULT_CONTEXT_TOKENS, SEVERITIES, Level

REPO_ROOT = Path(__file__).resolve().parent.parent
# An HTTP header field name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
DEFAULT_POLICY_DIR = REPO_ROOT / "policies"


# Chunks in flight per engine (LLM server): the bounds bot.sched.window adapts within.
DEFAULT_WINDOW_FLOOR = 1
DEFAULT_WINDOW_INITIAL = 4
# A 7B model on one data-centre GPU gains throughput up to 32-64 sequences; vLLM's own
# --max-num-seqs default (256) leaves the engine room for a P0 above this.
DEFAULT_WINDOW_CEILING = 48
DEFAULT_P0_SLOWDOWN = 1.5


@dataclass(frozen=True, slots=True)
class WindowSettings:
    """Bounds of an engine's window and how eagerly it moves."""

    floor: int = DEFAULT_WINDOW_FLOOR
    ceiling: int = DEFAULT_WINDOW_CEILING
    initial: int = DEFAULT_WINDOW_INITIAL
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
    # 0.89 there, and higher on larger knees, without noise (tests/test_window.py).
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
    p0_slowdown: float = DEFAULT_P0_SLOWDOWN
    # A fixed number of calls that may run beside a P0 call instead of the learned one.
    p0_companions: int | None = None
    # What prefilling a review's shared prompt again on another engine costs, in seconds: a
    # chunk whose review's engine is full waits there while the wait is expected to cost
    # less (see bot.sched.affinity); 0 never waits.
    affinity_prefill_s: float = 1.0

    def __post_init__(self) -> None:
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

    @property
    def fixed(self) -> bool:
        """The window cannot move (floor = ceiling): an exclusive or fixed-size engine."""
        return self.floor == self.ceiling


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


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Knobs of the multilevel feedback queue."""

    workers: int = 8
    weights: tuple[int, int, int, int] = (8, 4, 2, 1)
    # GPU seconds a job may use at a level before it drops one (P3 has no quantum).
    quantum_s: tuple[float, float, float] = (120.0, 90.0, 240.0)
    aging_interval_s: float = 1800.0
    lease_s: float = 300.0
    heartbeat_s: float = 30.0
    max_attempts: int = 3
    retry_backoff_s: float = 10.0
    poll_s: float = 5.0  # fallback poll when LISTEN/NOTIFY is quiet
    # On SIGTERM a dispatcher takes no new chunk and gives its running calls this long to
    # finish; what still runs then is handed back. Keep it under the orchestrator's grace
    # (Kubernetes' terminationGracePeriodSeconds, compose's stop_grace_period).
    shutdown_grace_s: float = 20.0


@dataclass(frozen=True, slots=True)
class AlertSettings:
    """Wait thresholds per level (P3 has none) and where alerts go."""

    threshold_s: Mapping[Level, float] = field(
        default_factory=lambda: {Level.P0: 10.0, Level.P1: 60.0, Level.P2: 300.0}
    )
    webhook_url: str | None = None
    min_interval_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the bot reads from its environment."""

    database_url: str | None = None
    github_webhook_secret: str | None = None
    gitlab_webhook_token: str | None = None
    insecure_dev: bool = False
    github_api_url: str = "https://api.github.com"
    github_token: str | None = None
    github_app_id: str | None = None
    github_private_key: str | None = None
    gitlab_url: str = "https://gitlab.com"
    gitlab_token: str | None = None
    policy_dir: Path = DEFAULT_POLICY_DIR
    # None: REVIEW_BOT_LLM was not set. The simulated backend then stands in only where no
    # real forge could receive its canned reviews (see bot.llm.factory.check_backend_choice).
    llm_backend: str | None = None
    llm_base_urls: tuple[str, ...] = ()
    # REVIEW_BOT_LLM_URLS names one router (vLLM production-stack, llm-d) in front of the
    # servers: one window for it, each review's session key and level passed for its routing.
    llm_router: bool = False
    # The header carrying a review's session key (production-stack's --session-key).
    llm_session_header: str = "x-session-id"
    # InferenceObjective names for P0..P3 (Gateway API inference extension, llm-d), sent in
    # x-gateway-inference-objective; empty: not sent.
    llm_objectives: tuple[str, ...] = ()
    # Where the router's Prometheus metrics are, when not at its base URL's /metrics.
    llm_metrics_url: str | None = None
    llm_model: str = "review-model"
    llm_api_key: str | None = None
    llm_pass_priority: bool = True
    llm_stream: bool = True
    llm_timeout_s: float = 600.0
    # Answer tokens asked for per chunk (the chunk budget leaves room for them).
    llm_max_tokens: int = 1024
    # Prompt tokens per chunk for the PR's title, description and code context (0: none).
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    # vLLM's constrained decoding keeps even small models to the output contract.
    llm_response_format: str | None = "json_schema"
    max_body_bytes: int = 25 * 1024 * 1024
    admin_token: str | None = None
    # /metrics on a port of its own (None: on the main port) and/or behind the admin token.
    metrics_port: int | None = None
    metrics_require_token: bool = False
    # A TLS-terminating proxy in front sets X-Forwarded-Proto; believe it (Secure cookies).
    trust_forwarded_proto: bool = False
    bot_login: str = "review-bot"
    # Chunks in flight per engine (LLM server): bounds of the adaptive window.
    window: WindowSettings = field(default_factory=WindowSettings)
    # The servers' --max-num-seqs, when known: the window ceiling must stay under it.
    llm_max_num_seqs: int | None = None
    # First pause after the database is lost; doubles (with jitter) up to 30 s while it is away.
    outage_backoff_s: float = 1.0
    # The simulated backend, for demos and fault drills: how much of its charged GPU time a
    # call really takes (0: answers at once), and for every how many chunks the first call
    # raises an unexpected error (0: never).
    sim_time_scale: float = 0.0
    sim_fault_every: int = 0
    # Quiet reviews: a review after the first covers what changed, says nothing twice and
    # keeps one summary; off, every push gets a full review with its own summary.
    quiet_reviews: bool = True
    min_inline_severity: str = "info"
    inline_cap: int = 50
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    # The review's check run / commit status with level, place in line and ETA.
    status_enabled: bool = True
    status_neutral_at: str = "major"
    status_interval_s: float = 5.0
    # Limits on every database session (bot.db.SessionTimeouts); 0 turns one off.
    db_statement_timeout_s: float = 60.0
    db_lock_timeout_s: float = 10.0
    db_idle_in_transaction_timeout_s: float = 30.0
    # News-only status writes (a moved ETA, place or progress) per forge per hour; 0: none.
    status_updates_per_hour: int = 120
    # Content-creating requests per forge identity (GitHub installation or token, GitLab
    # token), shared by every process; 0: that window is not limited.
    github_writes_per_minute: int = 80
    github_writes_per_hour: int = 500
    gitlab_writes_per_minute: int = 300
    gitlab_writes_per_hour: int = 0
    # Compressed time for tests and benchmarks: the budget's minute and hour last this share.
    forge_window_scale: float = 1.0

    def with_changes(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


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


def default_heartbeat_s(lease_s: float) -> float:
    """The heartbeat when none is set: every 30 s, or a third of a shorter lease's."""
    return min(30.0, lease_s / 3)


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from exc


def _non_negative_int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = _int(environ, name, default)
    if value < 0:
        raise ConfigError(f"{name} must be 0 or more, got {value}")
    return value


def _positive_int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = _int(environ, name, default)
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")
    return value


def _limit_s(environ: Mapping[str, str], name: str, default: float) -> float:
    """A time limit in seconds: zero (no limit) or more."""
    value = _float(environ, name, default)
    if value < 0:
        raise ConfigError(f"{name} must be 0 (no limit) or more seconds, got {value:g}")
    return value


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from exc


def _positive_float(environ: Mapping[str, str], name: str, default: float) -> float:
    value = _float(environ, name, default)
    if not value > 0:
        raise ConfigError(f"{name} must be positive, got {value:g}")
    return value


def _bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _port(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    port = _int(environ, name, 0)
    if not 1 <= port <= 65535:
        raise ConfigError(f"{name} must be a TCP port (1-65535), got {raw!r}")
    return port


def _numbers(environ: Mapping[str, str], name: str, count: int) -> tuple[float, ...] | None:
    raw = environ.get(name)
    if not raw:
        return None
    parts = [part for part in raw.replace(":", ",").split(",") if part.strip()]
    try:
        values = tuple(float(part) for part in parts)
    except ValueError as exc:
        raise ConfigError(f"{name} must be {count} numbers, got {raw!r}") from exc
    if len(values) != count or any(value <= 0 for value in values):
        raise ConfigError(f"{name} must be {count} positive numbers, got {raw!r}")
    return values


def _named_severity(environ: Mapping[str, str], name: str, default: str) -> str:
    raw = (environ.get(name) or default).strip().lower()
    if raw not in SEVERITIES:
        raise ConfigError(f"{name} must be one of {', '.join(SEVERITIES)}, got {raw!r}")
    return raw


def _response_format(raw: str | None) -> str | None:
    if raw is None or raw == "":
        return "json_schema"
    lowered = raw.strip().lower()
    if lowered in {"none", "off", "false", "0"}:
        return None
    if lowered not in {"json_object", "json_schema"}:
        raise ConfigError(
            f"REVIEW_BOT_LLM_RESPONSE_FORMAT must be json_schema, json_object or none, got {raw!r}"
        )
    return lowered


def _severity(raw: str | None) -> str:
    value = (raw or "info").strip().lower()
    if value not in ("critical", "major", "minor", "info"):
        raise ConfigError(
            f"REVIEW_BOT_MIN_INLINE_SEVERITY must be critical, major, minor or info, got {raw!r}"
        )
    return value


def _secret(environ: Mapping[str, str], name: str) -> str | None:
    """Read NAME, or the file named by NAME_FILE (for Docker/Kubernetes secrets)."""
    value = environ.get(name)
    if value:
        return value
    path = environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE={path!r} cannot be read: {exc}") from exc
    return None


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from environment variables; raises ConfigError naming the bad variable."""
    env = os.environ if environ is None else environ
    weights = _numbers(env, "REVIEW_BOT_WEIGHTS", 4)
    quanta = _numbers(env, "REVIEW_BOT_QUANTUM_S", 3)
    lease_s = _float(env, "REVIEW_BOT_LEASE_S", 300.0)
    scheduler = SchedulerSettings(
        workers=_int(env, "REVIEW_BOT_WORKERS", 8),
        weights=tuple(int(w) for w in weights) if weights else (8, 4, 2, 1),  # type: ignore[arg-type]
        quantum_s=quanta if quanta else SchedulerSettings().quantum_s,  # type: ignore[arg-type]
        aging_interval_s=_float(env, "REVIEW_BOT_AGING_S", 1800.0),
        lease_s=lease_s,
        heartbeat_s=_float(env, "REVIEW_BOT_HEARTBEAT_S", default_heartbeat_s(lease_s)),
        max_attempts=_positive_int(env, "REVIEW_BOT_MAX_ATTEMPTS", 3),
        retry_backoff_s=_positive_float(env, "REVIEW_BOT_CHUNK_RETRY_BACKOFF_S", 10.0),
        shutdown_grace_s=_float(env, "REVIEW_BOT_SHUTDOWN_GRACE_S", 20.0),
    )
    if scheduler.workers < 1:
        raise ConfigError("REVIEW_BOT_WORKERS must be at least 1")
    check_scheduler_settings(scheduler)
    outage_backoff_s = _float(env, "REVIEW_BOT_RETRY_BACKOFF_S", 1.0)
    sim_time_scale = _float(env, "REVIEW_BOT_SIM_TIME_SCALE", 0.0)
    sim_fault_every = _int(env, "REVIEW_BOT_SIM_FAULT_EVERY", 0)
    if sim_time_scale < 0 or sim_fault_every < 0:
        raise ConfigError("REVIEW_BOT_SIM_TIME_SCALE and REVIEW_BOT_SIM_FAULT_EVERY must be >= 0")
    if outage_backoff_s <= 0:
        raise ConfigError(f"REVIEW_BOT_RETRY_BACKOFF_S must be positive, got {outage_backoff_s:g}")
    thresholds = _numbers(env, "REVIEW_BOT_ALERT_THRESHOLDS_S", 3)
    alerts = AlertSettings(
        threshold_s=(
            dict(zip((Level.P0, Level.P1, Level.P2), thresholds, strict=True))
            if thresholds
            else AlertSettings().threshold_s
        ),
        webhook_url=env.get("REVIEW_BOT_ALERT_WEBHOOK_URL") or None,
    )
    window = load_window_settings(env)
    max_num_seqs = _int(env, "REVIEW_BOT_LLM_MAX_NUM_SEQS", 0) or None
    if max_num_seqs is not None:
        try:
            check_ceiling(window, max_num_seqs=max_num_seqs)
        except ValueError as exc:
            raise ConfigError(f"REVIEW_BOT_WINDOW_CEILING: {exc}") from exc
    urls = tuple(u.strip() for u in env.get("REVIEW_BOT_LLM_URLS", "").split(",") if u.strip())
    router = _bool(env, "REVIEW_BOT_LLM_ROUTER", False)
    if router and len(urls) != 1:
        raise ConfigError(
            "REVIEW_BOT_LLM_ROUTER=true needs exactly one URL in REVIEW_BOT_LLM_URLS (the "
            f"router's), got {len(urls)}: {', '.join(urls) or 'none'}"
        )
    session_header = env.get("REVIEW_BOT_LLM_SESSION_HEADER", "x-session-id").strip()
    if not _HEADER_NAME.fullmatch(session_header):
        raise ConfigError(
            f"REVIEW_BOT_LLM_SESSION_HEADER must be an HTTP header name, got {session_header!r}"
        )
    objectives = tuple(name.strip() for name in env.get("REVIEW_BOT_LLM_OBJECTIVES", "").split(","))
    if objectives == ("",):
        objectives = ()
    elif len(objectives) != 4 or not all(objectives):
        raise ConfigError(
            "REVIEW_BOT_LLM_OBJECTIVES must name four InferenceObjectives, for P0, P1, P2 and "
            f"P3, comma separated; got {env.get('REVIEW_BOT_LLM_OBJECTIVES')!r}"
        )
    # The URL carries the database password: it may come from a mounted secret file too.
    raw_url = _secret(env, "DATABASE_URL")
    return Settings(
        database_url=normalize_database_url(raw_url) if raw_url else None,
        github_webhook_secret=_secret(env, "GITHUB_WEBHOOK_SECRET"),
        gitlab_webhook_token=_secret(env, "GITLAB_WEBHOOK_TOKEN"),
        insecure_dev=_bool(env, "REVIEW_BOT_INSECURE_DEV", False),
        github_api_url=env.get("GITHUB_API_URL", "https://api.github.com"),
        github_token=_secret(env, "GITHUB_TOKEN"),
        github_app_id=env.get("GITHUB_APP_ID") or None,
        github_private_key=_secret(env, "GITHUB_PRIVATE_KEY"),
        gitlab_url=env.get("GITLAB_URL", "https://gitlab.com"),
        gitlab_token=_secret(env, "GITLAB_TOKEN"),
        policy_dir=Path(env.get("REVIEW_BOT_POLICY_DIR") or DEFAULT_POLICY_DIR),
        llm_backend=env.get("REVIEW_BOT_LLM", "").strip().lower() or None,
        llm_base_urls=urls,
        llm_router=router,
        llm_session_header=session_header,
        llm_objectives=objectives,
        llm_metrics_url=env.get("REVIEW_BOT_LLM_METRICS_URL", "").strip() or None,
        llm_model=env.get("REVIEW_BOT_LLM_MODEL", "review-model"),
        llm_api_key=_secret(env, "REVIEW_BOT_LLM_API_KEY"),
        llm_pass_priority=_bool(env, "REVIEW_BOT_LLM_PRIORITY", True),
        llm_stream=_bool(env, "REVIEW_BOT_LLM_STREAM", True),
        llm_timeout_s=_float(env, "REVIEW_BOT_LLM_TIMEOUT_S", 600.0),
        llm_max_tokens=_positive_int(env, "REVIEW_BOT_LLM_MAX_TOKENS", 1024),
        context_tokens=_non_negative_int(env, "REVIEW_BOT_CONTEXT_TOKENS", DEFAULT_CONTEXT_TOKENS),
        llm_response_format=_response_format(env.get("REVIEW_BOT_LLM_RESPONSE_FORMAT")),
        max_body_bytes=_int(env, "REVIEW_BOT_MAX_BODY_BYTES", 25 * 1024 * 1024),
        admin_token=_secret(env, "REVIEW_BOT_ADMIN_TOKEN"),
        metrics_port=_port(env, "REVIEW_BOT_METRICS_PORT"),
        metrics_require_token=_bool(env, "REVIEW_BOT_METRICS_REQUIRE_TOKEN", False),
        trust_forwarded_proto=_bool(env, "REVIEW_BOT_TRUST_FORWARDED_PROTO", False),
        bot_login=env.get("REVIEW_BOT_LOGIN", "review-bot"),
        window=window,
        llm_max_num_seqs=max_num_seqs,
        outage_backoff_s=outage_backoff_s,
        sim_time_scale=sim_time_scale,
        sim_fault_every=sim_fault_every,
        quiet_reviews=_bool(env, "REVIEW_BOT_QUIET", True),
        min_inline_severity=_severity(env.get("REVIEW_BOT_MIN_INLINE_SEVERITY")),
        inline_cap=_int(env, "REVIEW_BOT_INLINE_CAP", 50),
        scheduler=scheduler,
        alerts=alerts,
        status_enabled=_bool(env, "REVIEW_BOT_STATUS", True),
        status_neutral_at=_named_severity(env, "REVIEW_BOT_STATUS_NEUTRAL_AT", "major"),
        status_interval_s=_float(env, "REVIEW_BOT_STATUS_INTERVAL_S", 5.0),
        db_statement_timeout_s=_limit_s(env, "REVIEW_BOT_DB_STATEMENT_TIMEOUT_S", 60.0),
        db_lock_timeout_s=_limit_s(env, "REVIEW_BOT_DB_LOCK_TIMEOUT_S", 10.0),
        db_idle_in_transaction_timeout_s=_limit_s(
            env, "REVIEW_BOT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S", 30.0
        ),
        status_updates_per_hour=_non_negative_int(env, "REVIEW_BOT_STATUS_UPDATES_PER_HOUR", 120),
        github_writes_per_minute=_non_negative_int(env, "REVIEW_BOT_GITHUB_WRITES_PER_MINUTE", 80),
        github_writes_per_hour=_non_negative_int(env, "REVIEW_BOT_GITHUB_WRITES_PER_HOUR", 500),
        gitlab_writes_per_minute=_non_negative_int(env, "REVIEW_BOT_GITLAB_WRITES_PER_MINUTE", 300),
        gitlab_writes_per_hour=_non_negative_int(env, "REVIEW_BOT_GITLAB_WRITES_PER_HOUR", 0),
        forge_window_scale=_positive_float(env, "REVIEW_BOT_FORGE_WINDOW_SCALE", 1.0),
    )


def load_window_settings(env: Mapping[str, str]) -> WindowSettings:
    """Window bounds from REVIEW_BOT_WINDOW_FLOOR/_INITIAL/_CEILING and the P0's room from
    REVIEW_BOT_P0_SLOWDOWN/_COMPANIONS; raises ConfigError."""
    floor = _int(env, "REVIEW_BOT_WINDOW_FLOOR", DEFAULT_WINDOW_FLOOR)
    ceiling = _int(env, "REVIEW_BOT_WINDOW_CEILING", DEFAULT_WINDOW_CEILING)
    # An initial window outside the bounds given is brought inside them.
    initial = _int(
        env, "REVIEW_BOT_WINDOW_INITIAL", max(floor, min(ceiling, DEFAULT_WINDOW_INITIAL))
    )
    slowdown = _float(env, "REVIEW_BOT_P0_SLOWDOWN", DEFAULT_P0_SLOWDOWN)
    companions_text = env.get("REVIEW_BOT_P0_COMPANIONS", "").strip()
    companions = _int(env, "REVIEW_BOT_P0_COMPANIONS", 0) if companions_text else None
    prefill_s = _float(env, "REVIEW_BOT_AFFINITY_PREFILL_S", 1.0)
    try:
        return WindowSettings(
            floor=floor,
            ceiling=ceiling,
            initial=initial,
            p0_slowdown=slowdown,
            p0_companions=companions,
            affinity_prefill_s=prefill_s,
        )
    except ValueError as exc:
        raise ConfigError(
            "REVIEW_BOT_WINDOW_FLOOR/_INITIAL/_CEILING, REVIEW_BOT_P0_SLOWDOWN/_COMPANIONS, "
            f"REVIEW_BOT_AFFINITY_PREFILL_S: {exc}"
        ) from exc
