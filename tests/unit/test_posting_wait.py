"""The ETA on the PR includes the wait for the forge's write budget: pure parts."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from bot.budget.ledger import GITHUB_LIMITS, GITLAB_LIMITS
from bot.budget.model import posting_waits
from bot.model import Level
from bot.status.eta import Estimate
from bot.status.standing import BINDING_WAIT_S, binding_waits, budget_key_of, waited

BUDGET = {"github": GITHUB_LIMITS, "gitlab": GITLAB_LIMITS}


def test_reviews_ending_apart_under_a_free_budget_wait_for_nothing() -> None:
    waits = posting_waits([(1, 1, 5.0), (2, 1, 60.0), (3, 2, 120.0)], [], GITHUB_LIMITS)
    assert waits == {1: 0.0, 2: 0.0, 3: 0.0}


def test_a_minute_spent_makes_the_next_review_wait_for_the_minute_to_turn() -> None:
    # 80 writes in the last 20 s: the minute is full until its oldest write is a minute old.
    spent = [-20.0 + i * 0.25 for i in range(80)]
    [(job, wait)] = posting_waits([(7, 1, 0.0)], spent, GITHUB_LIMITS).items()
    assert job == 7 and 40.0 <= wait <= 42.0


def test_reviews_ending_together_take_the_slots_one_after_the_other() -> None:
    waits = posting_waits([(n, 1, 10.0) for n in range(5)], [], GITHUB_LIMITS)
    assert sorted(waits.values()) == [0.0, 1.0, 2.0, 3.0, 4.0]


@given(
    st.lists(st.tuples(st.integers(0, 3), st.floats(0, 600)), min_size=1, max_size=40),
    st.lists(st.floats(-3600, 0), max_size=200),
)
def test_no_wait_is_negative_and_no_two_reviews_share_a_second(
    finishes: list[tuple[int, float]], spent: list[float]
) -> None:
    items = [(index, level, finish) for index, (level, finish) in enumerate(finishes)]
    waits = posting_waits(items, spent, GITHUB_LIMITS)
    assert set(waits) == set(range(len(items)))
    assert all(wait >= 0.0 for wait in waits.values())
    posted = sorted(finish + waits[index] for index, _, finish in items)
    assert all(b - a >= GITHUB_LIMITS.min_interval_s - 1e-6 for a, b in itertools.pairwise(posted))


def _row(job_id: int, forge: str = "github", installation: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(id=job_id, forge=forge, installation_id=installation)


def test_a_job_spends_from_its_installations_budget_else_its_forges_token() -> None:
    known = ["github:installation:7", "github:token:ab12", "gitlab:token:cd34"]
    assert budget_key_of(_row(1, installation=7), known) == "github:installation:7"
    assert budget_key_of(_row(2), known) == "github:token:ab12"
    assert budget_key_of(_row(3, "gitlab"), known) == "gitlab:token:cd34"
    assert budget_key_of(_row(4), []) == "github:token"  # nothing spent yet: one new budget


def test_only_a_binding_wait_moves_an_eta_and_only_of_its_own_budget() -> None:
    rows = [_row(1, installation=7), _row(2, installation=8), _row(3, "gitlab")]
    estimates = {n: Estimate(n, Level.P1, None, 0.0, 30.0) for n in (1, 2, 3)}
    spent = {"github:installation:7": [-20.0 + i * 0.25 for i in range(80)]}
    waits = binding_waits(rows, estimates, spent, budget=BUDGET)
    assert set(waits) == {1} and waits[1] >= BINDING_WAIT_S
    shown = waited(estimates, waits)
    assert shown[1].finish_in_s == 30.0 + waits[1]
    assert shown[2] == estimates[2] and shown[3] == estimates[3]
