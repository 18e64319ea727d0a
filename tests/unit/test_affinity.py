"""Prefix affinity's decisions: a review's chunks go home while it has room, and spill only
when waiting would cost more than prefilling the shared prompt again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bot.sched.affinity import ReviewHomes, expected_wait_s, place_chunk


def test_home_with_room_wins_over_the_engine_the_windows_picked() -> None:
    free = {"a": 1, "b": 5}
    assert place_chunk(
        home="a", picked="b", free=free, wait_s=9.0, waited_s=0.0, prefill_s=1.0
    ) == (place_chunk(home="a", picked=None, free=free, wait_s=None, waited_s=0.0, prefill_s=0.0))
    placed = place_chunk(home="a", picked="b", free=free, wait_s=9.0, waited_s=0.0, prefill_s=1.0)
    assert (placed.engine, placed.reason) == ("a", "home")


def test_a_full_home_is_waited_for_only_while_that_is_cheaper_than_a_prefill() -> None:
    free = {"a": 0, "b": 2}
    short = place_chunk(home="a", picked="b", free=free, wait_s=0.2, waited_s=0.0, prefill_s=1.0)
    assert (short.engine, short.reason) == (None, "wait")
    long = place_chunk(home="a", picked="b", free=free, wait_s=3.0, waited_s=0.0, prefill_s=1.0)
    assert (long.engine, long.reason) == ("b", "spill")
    # Waited too long already: spill, whatever is still expected.
    late = place_chunk(home="a", picked="b", free=free, wait_s=0.2, waited_s=1.0, prefill_s=1.0)
    assert late.engine == "b"
    # Nothing known of the home's pace: no reason to wait.
    blind = place_chunk(home="a", picked="b", free=free, wait_s=None, waited_s=0.0, prefill_s=1.0)
    assert blind.engine == "b"
    # Every engine full: wait.
    assert (
        place_chunk(
            home="a", picked=None, free={"a": 0, "b": 0}, wait_s=9.0, waited_s=0.0, prefill_s=0.1
        ).engine
        is None
    )


def test_a_new_review_or_a_forgotten_engine_goes_where_the_windows_say() -> None:
    for home in (None, "gone"):
        placed = place_chunk(
            home=home, picked="b", free={"a": 0, "b": 1}, wait_s=1.0, waited_s=0.0, prefill_s=1.0
        )
        assert (placed.engine, placed.reason) == ("b", "new review")


names = st.sampled_from(["a", "b", "c"])


@given(
    home=st.one_of(st.none(), names),
    free=st.fixed_dictionaries(
        {"a": st.integers(0, 4), "b": st.integers(0, 4), "c": st.integers(0, 4)}
    ),
    wait_s=st.one_of(st.none(), st.floats(0, 100)),
    waited_s=st.floats(0, 100),
    prefill_s=st.floats(0, 100),
)
def test_placement_never_overfills_and_waits_only_when_it_pays(
    home: str | None,
    free: dict[str, int],
    wait_s: float | None,
    waited_s: float,
    prefill_s: float,
) -> None:
    with_room = [name for name, places in free.items() if places > 0]
    picked = max(with_room, key=lambda name: free[name]) if with_room else None
    placed = place_chunk(
        home=home, picked=picked, free=free, wait_s=wait_s, waited_s=waited_s, prefill_s=prefill_s
    )
    if placed.engine is not None:
        assert free[placed.engine] > 0  # never onto a full engine
    if home is not None and free[home] > 0:
        assert placed.engine == home
    if placed.reason == "wait":
        assert home is not None and free[home] == 0
        # Only when there is nowhere else, or the wait is known and cheaper than a prefill.
        assert picked is None or (wait_s is not None and waited_s + wait_s <= prefill_s)
    if placed.reason == "spill":
        assert home is not None and placed.engine != home


def test_the_wait_for_a_place_shortens_with_more_calls_in_flight() -> None:
    assert expected_wait_s(mean_call_s=8.0, in_flight=4) == 2.0
    assert expected_wait_s(mean_call_s=8.0, in_flight=0) == 8.0
    assert expected_wait_s(mean_call_s=None, in_flight=4) is None


def test_a_review_keeps_the_home_of_its_first_chunk_and_old_ones_are_forgotten() -> None:
    homes = ReviewHomes(max_reviews=2)
    homes.settle(1, "a")
    homes.settle(1, "b")  # a spilled chunk does not move the review's home
    assert homes.home_of(1) == "a"
    homes.settle(2, "b")
    homes.settle(3, "c")
    assert homes.home_of(1) is None and homes.home_of(3) == "c"
    homes.forget(3)
    assert homes.home_of(3) is None
