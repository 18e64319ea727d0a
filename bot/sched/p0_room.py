"""Room for a P0 chunk on a batching engine: how many other calls may share the engine with it.

A P0 chunk is admitted above a full window at once, but admission is not speed. On an engine
past its knee (a CPU, or a GPU batched into compute-bound territory) every decoding step takes
longer the more sequences share it, so a P0 in a batch of twenty crawls at a fraction of its
pace alone. On such an engine the P0 gets room: only `companions` other calls keep running
beside it, and the rest are taken back (their HTTP call closed, which vLLM answers by aborting
the sequence) and queued again: where calls stream their answers, those with the most answer
left and never one near its end, else the most recently started.

How many companions is learned from the engine itself. Every answered call gives a point: its
mean concurrency over its life (latency over its processor-sharing share of engine seconds)
and its latency per answer token. Points fall into buckets by powers of two of concurrency.
The pace alone is the lowest bucket's, followed down to one call along the curve's slope
when the lowest bucket holds several (at most `REFERENCE_MAX`); the P0 may run at the
largest concurrency whose pace, between the buckets on straight lines, stays within
`max_slowdown` of it. On an engine whose steps barely slow with the batch (a GPU under its
knee) that is the whole window and nothing is taken back.
Until the engine has been seen at a low concurrency, the fallback holds: the P0 runs alone
there, which itself gives the low-concurrency point the next P0 is judged by. Pure: points in,
numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The lowest-concurrency bucket must lie at or below this for its pace to stand for "alone";
# a batch of four already slows a compute-bound engine's sequences, but only by a little.
REFERENCE_MAX = 4.0
# Weight of a new point in its bucket's running mean: recent enough to follow a changed
# engine, smooth enough that one long prompt does not move it.
POINT_WEIGHT = 0.3
# A call with at most this share of its answer left is about to give its place back by
# itself: taking it back would throw away nearly all of its work for a moment's room.
NEAR_END_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class PacePoint:
    """A bucket's running means: concurrency and latency per answer token."""

    concurrency: float
    latency_per_token_s: float
    calls: int = 1


def bucket_of(concurrency: float) -> int:
    """Buckets by powers of two: (0, 1] -> 0, (1, 2] -> 1, (2, 4] -> 2, (4, 8] -> 3, ..."""
    return max(0, math.ceil(math.log2(max(1.0, concurrency))))


def add_point(
    curve: Mapping[int, PacePoint], *, concurrency: float, latency_per_token_s: float
) -> dict[int, PacePoint]:
    """The curve with one answered call's point folded into its bucket."""
    if not (concurrency > 0 and latency_per_token_s > 0) or math.isinf(latency_per_token_s):
        return dict(curve)
    key = bucket_of(concurrency)
    updated = dict(curve)
    old = curve.get(key)
    if old is None:
        updated[key] = PacePoint(concurrency, latency_per_token_s)
    else:
        updated[key] = PacePoint(
            concurrency=old.concurrency + POINT_WEIGHT * (concurrency - old.concurrency),
            latency_per_token_s=old.latency_per_token_s
            + POINT_WEIGHT * (latency_per_token_s - old.latency_per_token_s),
            calls=old.calls + 1,
        )
    return updated


def solo_pace(curve: Mapping[int, PacePoint]) -> float | None:
    """Latency per answer token of a call alone on the engine, from the curve; None if unknown.

    The lowest bucket stands for it when it lies at about one call; otherwise the line through
    the two lowest buckets is followed down to one call, never below the lowest's pace shared
    perfectly (as fast as batching can make a call look), which is also the guess while only
    one bucket is known. Unknown without a bucket at or below `REFERENCE_MAX`.
    """
    if not curve:
        return None
    keys = sorted(curve)
    low = curve[keys[0]]
    if low.concurrency > REFERENCE_MAX:
        return None
    if low.concurrency <= 1.5:
        return low.latency_per_token_s
    if len(keys) == 1:
        # No slope yet: assume the worst, a pace shared perfectly, until a second bucket says.
        return low.latency_per_token_s / low.concurrency
    above = curve[keys[1]]
    slope = (above.latency_per_token_s - low.latency_per_token_s) / (
        above.concurrency - low.concurrency
    )
    if slope <= 0:
        return low.latency_per_token_s
    extrapolated = low.latency_per_token_s - slope * (low.concurrency - 1.0)
    return max(extrapolated, low.latency_per_token_s / low.concurrency)


def p0_companions(
    curve: Mapping[int, PacePoint], *, max_slowdown: float, ceiling: int, fallback: int = 0
) -> int:
    """Other calls that may run beside a P0 call on the engine, in [0, ceiling].

    The curve is read as straight lines from the pace alone (at one call) through the
    buckets in order of concurrency; the P0 may share the engine up to the concurrency where
    the line first passes `max_slowdown` times the pace alone, or with the whole window when
    it never does. Without a pace alone (see `solo_pace`), `fallback`.
    """
    solo = solo_pace(curve)
    if solo is None:
        return max(0, min(ceiling, fallback))
    allowed = solo * max_slowdown
    previous = (1.0, solo)
    for key in sorted(curve):
        point = curve[key]
        if point.concurrency <= previous[0]:
            continue
        if point.latency_per_token_s > allowed:
            lower_n, lower_pace = previous
            if lower_pace >= allowed:
                reach = lower_n
            else:
                rise = (point.latency_per_token_s - lower_pace) / (point.concurrency - lower_n)
                reach = lower_n + (allowed - lower_pace) / rise
            # The concurrency reached includes the P0 itself.
            return max(0, min(ceiling, math.floor(reach + 1e-9) - 1))
        previous = (point.concurrency, point.latency_per_token_s)
    # No batch seen so far slowed a call too much: the engine is under its knee.
    return ceiling


@dataclass(frozen=True, slots=True)
class SharingCall:
    """A lower-level call of this process on the engine, as the P0's room sees it.

    `tokens_done` is its answer so far where the backend streams (None: unknown);
    `tokens_expected` the whole answer's length where the backend knows it.
    """

    chunk_id: int
    elapsed_s: float
    tokens_done: int | None = None
    tokens_expected: int | None = None


def tokens_left(call: SharingCall, *, typical_tokens: float | None) -> float | None:
    """Answer tokens the call has still to make; None without progress or a length to expect.

    Without its own expected length a call is expected to answer like the engine's answered
    calls (`typical_tokens`); one already past that is read as near its end.
    """
    if call.tokens_done is None:
        return None
    expected = call.tokens_expected if call.tokens_expected is not None else typical_tokens
    if expected is None or expected <= 0:
        return None
    return max(0.0, expected - call.tokens_done)


def near_end(call: SharingCall, *, typical_tokens: float | None) -> bool:
    """Whether the call has at most `NEAR_END_SHARE` of its answer left (never taken back)."""
    left = tokens_left(call, typical_tokens=typical_tokens)
    if left is None:
        return False
    expected = call.tokens_expected if call.tokens_expected is not None else typical_tokens
    assert expected is not None  # tokens_left said it is known
    return left <= NEAR_END_SHARE * expected


def calls_to_take_back(
    *,
    running: int,
    p0_running: int,
    companions: int,
    ours: Sequence[SharingCall],
    typical_tokens: float | None = None,
) -> tuple[int, ...]:
    """Which of this process's lower-level calls on the engine give way to its P0 calls.

    `running` counts every call on the engine (all processes), `p0_running` the P0 ones. The
    excess over the P0 calls and their companions goes: where every call reports its progress,
    those with the most answer left first (the least work lost, and the most engine time
    given back); otherwise the most recently started first. A call near its end is never
    taken back, even if the P0 then shares the engine with one more call for a moment. A
    process takes back only its own calls, so several processes may together take back a
    little more than needed, never less.
    """
    if p0_running <= 0:
        return ()
    excess = running - p0_running - max(0, companions)
    if excess <= 0:
        return ()
    candidates = [call for call in ours if not near_end(call, typical_tokens=typical_tokens)]
    left = {call.chunk_id: tokens_left(call, typical_tokens=typical_tokens) for call in candidates}
    if candidates and all(value is not None for value in left.values()):
        order = sorted(
            candidates,
            key=lambda call: (-(left[call.chunk_id] or 0.0), call.elapsed_s, -call.chunk_id),
        )
    else:
        order = sorted(candidates, key=lambda call: (call.elapsed_s, -call.chunk_id))
    return tuple(call.chunk_id for call in order[:excess])


__all__ = [
    "NEAR_END_SHARE",
    "POINT_WEIGHT",
    "REFERENCE_MAX",
    "PacePoint",
    "SharingCall",
    "add_point",
    "bucket_of",
    "calls_to_take_back",
    "near_end",
    "p0_companions",
    "solo_pace",
    "tokens_left",
]
