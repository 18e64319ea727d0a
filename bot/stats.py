"""Statistics the reports, the dashboard and the replay share: percentiles, service profiles."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence


def percentile(values: Sequence[float], share: float) -> float:
    """Linear-interpolated percentile (share in 0..1) of a non-empty sequence; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = share * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def service_profile(service_times: Sequence[float]) -> dict[str, float]:
    """P50/P95/P99, P99/P50 and stddev/mean of service times: does scheduling pay off here?"""
    p50 = percentile(service_times, 0.50)
    p99 = percentile(service_times, 0.99)
    mean = statistics.fmean(service_times) if service_times else 0.0
    stddev = statistics.pstdev(service_times) if len(service_times) > 1 else 0.0
    return {
        "p50": round(p50, 3),
        "p95": round(percentile(service_times, 0.95), 3),
        "p99": round(p99, 3),
        "p99_over_p50": round(p99 / p50, 3) if p50 > 0 else 0.0,
        "stddev_over_mean": round(stddev / mean, 3) if mean > 0 else 0.0,
    }


def profile_verdict(profile: Mapping[str, float]) -> str:
    """The rule: P99/P50 over 10 means priorities pay off; stddev under the mean, FIFO suffices."""
    parts: list[str] = []
    if profile["p99_over_p50"] > 10:
        parts.append(f"P99/P50 = {profile['p99_over_p50']:.1f} > 10: priorities pay off")
    else:
        parts.append(f"P99/P50 = {profile['p99_over_p50']:.1f} <= 10: priorities gain little")
    if profile["stddev_over_mean"] < 1:
        parts.append(f"stddev/mean = {profile['stddev_over_mean']:.2f} < 1: FIFO is as good")
    else:
        parts.append(f"stddev/mean = {profile['stddev_over_mean']:.2f} >= 1: FIFO is not enough")
    return "; ".join(parts)
