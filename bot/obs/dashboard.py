"""`GET /admin`: a server-rendered page of the queue, its waits and recent alerts.

Charts are inline SVG and the page loads nothing else (its CSP forbids it), so it needs no
network at view time. Access needs the admin token: `Authorization: Bearer TOKEN`, or
`/admin?token=TOKEN` once, which sets an HttpOnly cookie and redirects to a URL without it.
With no admin token configured, /admin does not exist (404).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math
import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import jinja2
from aiohttp import web
from markupsafe import Markup

from bot.clock import Clock
from bot.config import DEFAULTS
from bot.model import LEVELS, Level
from bot.obs.access import bearer_token, came_over_https, token_matches
from bot.obs.liveness import DEFAULT_STALE_S, Liveness, read_liveness
from bot.obs.metrics import QueueSnapshot, read_queue_snapshot
from bot.queue.monitoring import MonitoringRecords
from bot.stats import percentile

COOKIE_NAME = "review_bot_admin"
COOKIE_MAX_AGE_S = 12 * 3600
BUCKET_COUNT = 48
DISTRIBUTION_EDGES: tuple[float, ...] = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
LEVEL_COLORS: Mapping[Level, str] = {
    Level.P0: "#d62728",
    Level.P1: "#ff7f0e",
    Level.P2: "#1f77b4",
    Level.P3: "#7f7f7f",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


# --- authorization (pure) ------------------------------------------------------------------


def session_cookie_value(token: str) -> str:
    """The cookie a valid token buys: derived from it, so the token itself never sits in it."""
    return hmac.new(token.encode(), b"review-bot admin session v1", hashlib.sha256).hexdigest()


def cookie_matches(given: str | None, expected_token: str) -> bool:
    return given is not None and hmac.compare_digest(
        given.encode(), session_cookie_value(expected_token).encode()
    )


# --- data ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WaitPoint:
    """One job's wait, by when it started."""

    level: Level
    started_at: datetime
    wait_s: float


@dataclass(frozen=True, slots=True)
class EngineWork:
    """What one engine did in the window: chunks, busy engine seconds, completion tokens."""

    engine: str
    chunks: int
    busy_s: float
    tokens: int
    prefix_cache_hit_rate: float | None = None  # what its vLLM reports, when it does

    def utilization(self, window_s: float) -> float:
        return min(1.0, self.busy_s / window_s) if window_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class QueuedReview:
    """A review not started yet, with the place and ETA in the words its status gives them."""

    job_id: int
    forge: str
    repo: str
    number: int
    level: Level
    place: int
    place_text: str  # "4th"
    eta_text: str  # "review in about 1 min"


# Where the reviews not started yet stand, read at `now` (the status publisher's own function,
# given by the composition root: monitoring imports nothing of the scheduler).
StandingsReader = Callable[[datetime], Awaitable[Sequence[QueuedReview]]]
NEXT_UP = 20  # reviews listed


@dataclass(frozen=True, slots=True)
class DashboardView:
    """Everything the page shows, read at one instant."""

    now: datetime
    since: datetime
    queue: QueueSnapshot
    waits: Sequence[WaitPoint]
    alerts: Sequence[Mapping[str, Any]] = field(default_factory=list)
    thresholds: Mapping[Level, float] = field(default_factory=dict)
    liveness: Liveness | None = None
    engines: Sequence[EngineWork] = field(default_factory=list)
    engines_since: datetime | None = None  # the window the engine work covers
    next_up: Sequence[QueuedReview] = field(default_factory=list)


async def read_dashboard(
    monitoring: MonitoringRecords,
    *,
    now: datetime,
    hours: float,
    thresholds: Mapping[Level, float],
    dispatcher_stale_s: float = DEFAULT_STALE_S,
) -> DashboardView:
    """Read the page's data; raises StoreUnavailable or StoreError."""
    since = now - timedelta(hours=hours)
    queue = await read_queue_snapshot(monitoring, now=now)
    liveness = await read_liveness(monitoring, now=now, stale_after_s=dispatcher_stale_s)
    rows = await monitoring.started_waits(since=since, until=now)
    alerts = await monitoring.recent_alerts(limit=20)
    engine_rows = await monitoring.engine_work(since=since, until=now)
    engines_since = since
    waits = [
        WaitPoint(level=Level(row.level), started_at=row.first_started_at, wait_s=row.wait_s)
        for row in rows
    ]
    if waits:  # a quiet window would squash the chart into its last minutes
        since = min(point.started_at for point in waits)
    return DashboardView(
        now=now,
        since=since,
        queue=queue,
        waits=waits,
        alerts=[dict(row._mapping) for row in alerts],
        thresholds=thresholds,
        liveness=liveness,
        engines=[
            EngineWork(
                engine=str(row.engine),
                chunks=int(row.chunks),
                busy_s=float(row.busy_s),
                tokens=int(row.tokens or 0),
                prefix_cache_hit_rate=(liveness.prefix_cache_hit_rate or {}).get(str(row.engine)),
            )
            for row in engine_rows
        ],
        engines_since=engines_since,
    )


# --- rendering (pure) ----------------------------------------------------------------------

# Autoescape on every template whatever its ending: the page shows repository names, PR titles
# and engine URLs that whoever opens a PR or configures an engine chooses.
_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("bot.obs", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}"


def wait_series(
    waits: Sequence[WaitPoint], *, since: datetime, until: datetime, buckets: int = BUCKET_COUNT
) -> dict[Level, list[float | None]]:
    """Mean wait per level per time bucket (None where no job of that level started)."""
    span = max((until - since).total_seconds(), 1.0)
    sums: dict[Level, list[list[float]]] = {level: [[] for _ in range(buckets)] for level in LEVELS}
    for point in waits:
        offset = (point.started_at - since).total_seconds()
        index = min(buckets - 1, max(0, int(offset / span * buckets)))
        sums[point.level][index].append(point.wait_s)
    return {
        level: [statistics.fmean(values) if values else None for values in per_bucket]
        for level, per_bucket in sums.items()
    }


def wait_histogram(
    waits: Sequence[WaitPoint], edges: Sequence[float] = DISTRIBUTION_EDGES
) -> dict[Level, list[int]]:
    """Jobs per level per wait bucket: [0, e1), [e1, e2), ..., [e_last, inf)."""
    counts = {level: [0] * (len(edges) + 1) for level in LEVELS}
    for point in waits:
        index = next((i for i, edge in enumerate(edges) if point.wait_s < edge), len(edges))
        counts[point.level][index] += 1
    return counts


def histogram_labels(edges: Sequence[float] = DISTRIBUTION_EDGES) -> list[str]:
    def short(seconds: float) -> str:
        return f"{seconds / 60:.0f}m" if seconds >= 60 else f"{seconds:.0f}s"

    labels = [f"<{short(edges[0])}"]
    labels += [f"{short(low)}–{short(high)}" for low, high in itertools.pairwise(edges)]
    labels.append(f"≥{short(edges[-1])}")
    return labels


_TEMPLATES.filters.update(
    num=_number, f1=lambda value: f"{value:.1f}", pct=lambda value: f"{value:.0%}"
)


def _render(template: str, **context: Any) -> Markup:
    return Markup(_TEMPLATES.get_template(template).render(**context))


def svg_grouped_bars(
    chart: str,
    categories: Sequence[str],
    series: Mapping[Level, Sequence[float]],
    *,
    title: str,
    width: int = 560,
    height: int = 240,
) -> Markup:
    """Grouped vertical bars, one group per category, one bar per level."""
    left, bottom, top = 40, 30, 20
    plot_w, plot_h = width - left - 10, height - bottom - top
    peak = max([1.0, *(value for values in series.values() for value in values)])
    group_w = plot_w / max(1, len(categories))
    bar_w = max(1.0, group_w * 0.8 / max(1, len(series)))
    groups = []
    for index, category in enumerate(categories):
        x0 = left + index * group_w + group_w * 0.1
        bars = []
        for offset, (level, values) in enumerate(series.items()):
            value = float(values[index]) if index < len(values) else 0.0
            bar_h = plot_h * value / peak
            bars.append(
                {
                    "level": level,
                    "value": value,
                    "x": x0 + offset * bar_w,
                    "y": top + plot_h - bar_h,
                    "width": bar_w,
                    "height": bar_h,
                    "color": LEVEL_COLORS[level],
                }
            )
        groups.append({"category": category, "bars": bars, "label_x": x0 + group_w * 0.4})
    return _render(
        "bars.svg",
        chart=chart,
        title=title,
        width=width,
        height=height,
        left=left,
        top=top,
        axis_y=top + plot_h,
        peak=peak,
        groups=groups,
    )


def svg_lines(
    chart: str,
    series: Mapping[Level, Sequence[float | None]],
    *,
    since: datetime,
    until: datetime,
    title: str,
    thresholds: Mapping[Level, float],
    width: int = 1140,
    height: int = 260,
) -> Markup:
    """One polyline per level over time (gaps where a bucket is empty), thresholds dashed."""
    left, bottom, top = 50, 30, 20
    plot_w, plot_h = width - left - 10, height - bottom - top
    values = [value for points in series.values() for value in points if value is not None]
    peak = max([1.0, *values])
    buckets = max((len(points) for points in series.values()), default=1)
    step = plot_w / max(1, buckets - 1)

    def y_of(value: float) -> float:
        return top + plot_h - plot_h * min(value, peak) / peak

    runs: list[dict[str, Any]] = []
    for level, points in series.items():
        level_runs: list[list[tuple[str, str]]] = [[]]
        for index, value in enumerate(points):
            if value is None:
                if level_runs[-1]:
                    level_runs.append([])
                continue
            level_runs[-1].append((f"{left + index * step:.1f}", f"{y_of(value):.1f}"))
        runs += [
            {"level": level, "color": LEVEL_COLORS[level], "points": run}
            for run in level_runs
            if run
        ]
    return _render(
        "lines.svg",
        chart=chart,
        title=title,
        width=width,
        height=height,
        left=left,
        top=top,
        axis_y=top + plot_h,
        peak=peak,
        since=since,
        until=until,
        thresholds=[
            {"level": level, "y": y_of(threshold), "color": LEVEL_COLORS[level]}
            for level, threshold in thresholds.items()
            if threshold <= peak
        ],
        runs=runs,
    )


def svg_engine_utilization(
    engines: Sequence[EngineWork], *, window_s: float, width: int = 560
) -> Markup:
    """One horizontal bar per engine: the share of the window it was busy."""
    row_h, left = 22, 180
    return _render(
        "engines.svg",
        width=width,
        height=row_h * len(engines) + 10,
        row_h=row_h,
        left=left,
        plot_w=width - left - 60,
        rows=[
            {"engine": work.engine, "y": 5 + index * row_h, "share": work.utilization(window_s)}
            for index, work in enumerate(engines)
        ],
    )


def _stats_rows(view: DashboardView) -> list[list[str]]:
    rows = []
    for level in LEVELS:
        waits = [point.wait_s for point in view.waits if point.level == level]
        threshold = view.thresholds.get(level)
        breaches = sum(1 for w in waits if threshold is not None and w > threshold)
        rows.append(
            [
                str(level),
                str(len(waits)),
                _number(statistics.fmean(waits)) if waits else "–",
                _number(percentile(waits, 0.5)) if waits else "–",
                _number(percentile(waits, 0.95)) if waits else "–",
                _number(percentile(waits, 0.99)) if waits else "–",
                _number(max(waits)) if waits else "–",
                "–" if threshold is None else f"{breaches} (>{threshold:.0f} s)",
            ]
        )
    return rows


def _alert_rows(alerts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for alert in alerts:
        fired = alert.get("fired_at")
        rows.append(
            {
                "fired": fired.strftime("%Y-%m-%d %H:%M:%S")
                if isinstance(fired, datetime)
                else fired,
                "level": alert.get("level"),
                "repo": alert.get("repo"),
                "number": alert.get("number"),
                "waited_s": float(alert.get("waited_s") or 0.0),
                "state": alert.get("state"),
            }
        )
    return rows


def render_dashboard(view: DashboardView) -> str:
    """The whole page as one HTML document."""
    queue = view.queue
    queue_chart = svg_grouped_bars(
        "queue",
        ["waiting", "blocked", "running"],
        {
            level: [queue.waiting[level], queue.blocked[level], queue.running[level]]
            for level in LEVELS
        },
        title="Jobs in the queue now, per level",
    )
    series = wait_series(view.waits, since=view.since, until=view.now)
    waits_chart = svg_lines(
        "waits",
        series,
        since=view.since,
        until=view.now,
        title="Mean wait per level over time (by start time)",
        thresholds=view.thresholds,
    )
    histogram = wait_histogram(view.waits)
    distribution_chart = svg_grouped_bars(
        "distribution",
        histogram_labels(),
        {level: histogram[level] for level in LEVELS},
        title="Wait distribution per level",
    )
    engine_window_s = (view.now - (view.engines_since or view.since)).total_seconds()
    minutes = (view.now - view.since).total_seconds() / 60
    return str(
        _render(
            "dashboard.html",
            stamp=view.now.strftime("%Y-%m-%d %H:%M:%S UTC"),
            window=f"{minutes / 60:.0f} h" if minutes >= 120 else f"{minutes:.0f} min",
            jobs_started=len(view.waits),
            colors=list(LEVEL_COLORS.items()),
            liveness=view.liveness,
            levels=list(LEVELS),
            queue=queue,
            queue_chart=queue_chart,
            next_up=sorted(view.next_up, key=lambda item: item.place)[:NEXT_UP],
            waits_chart=waits_chart,
            distribution_chart=distribution_chart,
            stats_rows=_stats_rows(view),
            engines_chart=svg_engine_utilization(view.engines, window_s=engine_window_s),
            engines=view.engines,
            engine_window_s=engine_window_s,
            alerts=_alert_rows(view.alerts),
        )
    )


# --- handler -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """What /admin needs."""

    monitoring: MonitoringRecords
    clock: Clock
    admin_token: str | None
    thresholds: Mapping[Level, float]
    dispatcher_stale_s: float = DEFAULT_STALE_S
    trust_forwarded_proto: bool = False
    standings: StandingsReader | None = None


ADMIN_KEY = web.AppKey("admin_config", AdminConfig)

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _refuse() -> web.Response:
    return web.Response(
        status=401,
        text="admin token required\n",
        headers={"WWW-Authenticate": 'Bearer realm="review-bot admin"', **_HEADERS},
    )


def _hours(raw: str | None) -> float:
    try:
        value = float(raw) if raw else 24.0
    except ValueError:
        return 24.0
    return 24.0 if not math.isfinite(value) else min(168.0, max(1.0, value))


async def handle_admin(request: web.Request) -> web.StreamResponse:
    """The dashboard, for holders of the admin token only."""
    config = request.app[ADMIN_KEY]
    token = config.admin_token
    if not token:
        raise web.HTTPNotFound()
    if "token" in request.query:
        if not token_matches(request.query["token"], token):
            return _refuse()
        # Trade the token in the URL for a cookie, and drop it from the address bar.
        query = {k: v for k, v in request.query.items() if k != "token"}
        target = request.rel_url.with_query(query) if query else request.rel_url.with_query(None)
        response = web.Response(status=303, headers={"Location": str(target), **_HEADERS})
        response.set_cookie(
            COOKIE_NAME,
            session_cookie_value(token),
            max_age=COOKIE_MAX_AGE_S,
            path="/admin",
            httponly=True,
            samesite="Strict",
            secure=came_over_https(
                direct_tls=request.secure,
                forwarded_proto=request.headers.get("X-Forwarded-Proto"),
                trust_forwarded_proto=config.trust_forwarded_proto,
            ),
        )
        return response
    if not (
        token_matches(bearer_token(request.headers.get("Authorization")), token)
        or cookie_matches(request.cookies.get(COOKIE_NAME), token)
    ):
        return _refuse()
    view = await read_dashboard(
        config.monitoring,
        now=config.clock.now(),
        hours=_hours(request.query.get("hours")),
        thresholds=config.thresholds,
        dispatcher_stale_s=config.dispatcher_stale_s,
    )
    if config.standings is not None:
        view = replace(view, next_up=await config.standings(view.now))
    return web.Response(text=render_dashboard(view), content_type="text/html", headers=_HEADERS)


def setup_admin(
    app: web.Application,
    *,
    admin_token: str | None,
    monitoring: MonitoringRecords,
    clock: Clock,
    thresholds: Mapping[Level, float] | None = None,
    dispatcher_stale_s: float = DEFAULT_STALE_S,
    trust_forwarded_proto: bool = False,
    standings: StandingsReader | None = None,
) -> None:
    """Add `GET /admin`, reading the queue through `monitoring` (and where reviews stand through
    `standings`)."""
    app[ADMIN_KEY] = AdminConfig(
        monitoring=monitoring,
        clock=clock,
        admin_token=admin_token or None,
        dispatcher_stale_s=dispatcher_stale_s,
        trust_forwarded_proto=trust_forwarded_proto,
        standings=standings,
        thresholds=dict(thresholds if thresholds is not None else DEFAULTS.alerts.threshold_s),
    )
    app.router.add_get("/admin", handle_admin)
