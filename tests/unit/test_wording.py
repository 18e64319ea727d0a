"""The bot's own words follow the forge: GitLab says merge request and MR (pure)."""

from __future__ import annotations

import pytest

from bot.wording import change_name, for_forge


def test_gitlab_says_merge_request_and_mr() -> None:
    text = "Pull requests: cancel this PR's review of the pull request (PRs, PR)."
    assert for_forge(text, "gitlab") == (
        "Merge requests: cancel this MR's review of the merge request (MRs, MR)."
    )
    assert for_forge(text, "github") == text
    assert (change_name("gitlab"), change_name("github")) == ("merge request", "pull request")


@pytest.mark.parametrize(
    "text",
    ["Refused `/review PR`", "`src/PR/pull request.py` left out", "PRIORITY, APR, SPRING"],
)
def test_code_spans_and_other_words_are_left_alone(text: str) -> None:
    assert for_forge(text, "gitlab") == text
