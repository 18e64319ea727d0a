"""The batching cost model: solo calls cost the trace's time, batches share steps."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.llm.batching import PROFILES, BatchedEngine, BatchingProfile, get_profile
from tests.conftest import shared_dir

GPU = PROFILES["gpu-7b"]
CPU = PROFILES["cpu-smollm2"]


def test_profiles_reproduce_the_figures_they_were_calibrated_on() -> None:
    # A100 sweep: 75 tokens/s alone, 6.6x at concurrency 8.
    assert GPU.tokens_per_s(1) == pytest.approx(75.0, rel=0.02)
    assert GPU.speedup(8) == pytest.approx(6.6, rel=0.02)
    # An order of magnitude more at 32-64 sequences than at one.
    assert 10 <= GPU.speedup(48) <= 25
    # The CPU server: 32.5, 78.5 and 101.0 tokens/s at 1, 4 and 8.
    assert CPU.tokens_per_s(1) == pytest.approx(32.5, rel=0.02)
    assert CPU.tokens_per_s(4) == pytest.approx(78.5, rel=0.03)
    assert CPU.tokens_per_s(8) == pytest.approx(101.0, rel=0.02)


def test_unknown_profiles_are_named() -> None:
    with pytest.raises(ValueError, match="cpu-smollm2, gpu-7b, h200-8b"):
        get_profile("tpu")
    assert get_profile("gpu-7b") is GPU


def test_a_call_alone_costs_exactly_its_solo_time() -> None:
    engine = BatchedEngine(GPU)
    assert engine.admit("a", solo_s=30.0, lines=200, now_s=100.0) == []
    assert engine.next_event_s() == pytest.approx(100.0 + 200 * 16 / 6500 + 650 / 6500)
    done = engine.advance(200.0)
    assert [f.key for f in done] == ["a"]
    assert done[0].at_s == pytest.approx(130.0)
    assert done[0].latency_s == pytest.approx(30.0)
    assert done[0].engine_s == pytest.approx(30.0)
    assert engine.busy_s == pytest.approx(30.0)
    assert engine.in_flight == 0 and engine.next_event_s() is None


def test_a_batch_finishes_sooner_than_the_same_calls_one_after_another() -> None:
    engine = BatchedEngine(GPU)
    for index in range(8):
        engine.admit(index, solo_s=20.0, lines=100, now_s=0.0)
    done = engine.advance(10_000.0)
    assert len(done) == 8
    makespan = max(f.at_s for f in done)
    # Eight calls in one batch take far less than 8 x 20 s, and more than one call alone.
    assert 20.0 < makespan < 160.0 / 4
    # Engine time is shared: the calls' shares add up to the busy time.
    assert sum(f.engine_s for f in done) == pytest.approx(engine.busy_s)
    assert engine.busy_s == pytest.approx(makespan)


def test_prefill_holds_the_batch_and_then_joins_it() -> None:
    engine = BatchedEngine(CPU)
    engine.admit("long", solo_s=60.0, lines=10, now_s=0.0)
    engine.advance(5.0)
    tokens_before = engine.tokens
    engine.admit("new", solo_s=30.0, lines=400, now_s=5.0)
    prefill_s = CPU.prompt_tokens(400) / CPU.prefill_tokens_per_s
    engine.advance(5.0 + prefill_s / 2)
    assert engine.tokens == pytest.approx(tokens_before)  # decoding waited for the prefill
    engine.advance(5.0 + prefill_s + 1.0)
    assert engine.tokens > tokens_before


def test_a_cancelled_call_leaves_and_reports_the_engine_time_it_used() -> None:
    engine = BatchedEngine(GPU)
    engine.admit("a", solo_s=30.0, lines=10, now_s=0.0)
    engine.admit("b", solo_s=30.0, lines=10, now_s=0.0)
    finished, used = engine.cancel("b", now_s=10.0)
    assert finished == [] and used is not None and 0 < used < 10.0
    assert engine.in_flight == 1
    assert engine.cancel("nobody", now_s=10.0) == ([], None)


def test_profiles_are_checked() -> None:
    with pytest.raises(ValueError):
        BatchingProfile("x", 0.0, 0.001, 100.0, 10, 1.0, source="")


solo_times = st.lists(st.floats(0.5, 120.0), min_size=1, max_size=24)


@settings(max_examples=80, deadline=None)
@given(solo=solo_times, gaps=st.lists(st.floats(0.0, 20.0), min_size=24, max_size=24))
def test_every_call_finishes_no_sooner_than_alone_and_no_later_than_in_line(
    solo: list[float], gaps: list[float]
) -> None:
    engine = BatchedEngine(GPU)
    arrivals, now, done = [], 0.0, []
    for index, cost in enumerate(solo):
        now += gaps[index]
        arrivals.append(now)
        done += engine.admit(index, solo_s=cost, lines=50, now_s=now)
    done += engine.advance(now + sum(solo) + 1.0)
    assert sorted(f.key for f in done) == list(range(len(solo)))
    for finished in done:
        index = int(str(finished.key))
        # Batching never makes a call faster than alone...
        assert finished.latency_s >= solo[index] - 1e-6
    # ...and the engine never takes longer than running the calls one after another.
    assert max(f.at_s for f in done) <= arrivals[0] + sum(solo) + sum(gaps) + 1e-6
    assert engine.busy_s <= sum(solo) + 1e-6
    assert sum(f.engine_s for f in done) == pytest.approx(engine.busy_s)


H200 = PROFILES["h200-8b"]


def test_the_h200_profile_matches_the_shared_measurement() -> None:
    path = shared_dir() / "measurements" / "h200_decode_step.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent: the H200 measurement is not here")
    measured = json.loads(path.read_text(encoding="utf-8"))
    fit = measured["fit"]["4096"]
    assert H200.step_base_s == pytest.approx(fit["base_ms"] / 1000, rel=0.005)
    assert H200.step_per_sequence_s == pytest.approx(fit["per_seq_ms"] / 1000, rel=0.005)
    # The fitted line reproduces every measured 4k decode step within 5%.
    for point in measured["decode"]:
        if point["L"] == 4096:
            assert H200.step_s(point["n"]) * 1000 == pytest.approx(point["step_ms"], rel=0.05)
    # Prefill: the compute-bound prompts (2,048 tokens and more).
    rates = [p["tokens_per_s"] for p in measured["prefill"] if p["P"] >= 2048]
    assert min(rates) * 0.95 <= H200.prefill_tokens_per_s <= max(rates)


def test_the_h200_runs_a_traces_call_faster_than_the_a100_it_was_read_on() -> None:
    # The trace's solo time is A100-class: the same prompt and tokens, on the H200.
    prefill_a100, tokens = GPU.split(30.0, 200)
    prefill_h200, tokens_h200 = H200.split(30.0, 200)
    assert tokens_h200 == pytest.approx(tokens)
    assert prefill_h200 == pytest.approx(prefill_a100 * 6500 / 36000)
    engine = BatchedEngine(H200)
    engine.admit("a", solo_s=30.0, lines=200, now_s=0.0)
    done = engine.advance(1000.0)
    expected = prefill_h200 + tokens * H200.step_s(1)
    assert done[0].latency_s == pytest.approx(expected)
    assert done[0].latency_s < 30.0 / 2
    assert H200.speedup(64) > GPU.speedup(64)
