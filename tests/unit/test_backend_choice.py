"""Which LLM backend reviews: real forges never get the simulated backend unless it is chosen."""

from __future__ import annotations

import pytest

from bot.config import load_settings
from bot.errors import ConfigError
from bot.forges.registry import configured_forges
from bot.llm.factory import check_backend_choice

GITHUB_APP = {"GITHUB_APP_ID": "12345", "GITHUB_PRIVATE_KEY": "-----BEGIN RSA PRIVATE KEY-----"}


@pytest.mark.parametrize(
    ("environ", "forges"),
    [
        ({"GITHUB_TOKEN": "ghp-x"}, ("github",)),
        (GITHUB_APP, ("github",)),
        ({"GITLAB_TOKEN": "glpat-x"}, ("gitlab",)),
        ({"GITHUB_TOKEN": "ghp-x", "GITLAB_TOKEN": "glpat-x"}, ("github", "gitlab")),
    ],
)
def test_a_configured_forge_needs_an_explicit_backend(
    environ: dict[str, str], forges: tuple[str, ...]
) -> None:
    settings = load_settings(environ)
    assert settings.llm.backend is None
    assert configured_forges(settings) == forges
    with pytest.raises(ConfigError, match="REVIEW_BOT_LLM is not set") as refused:
        check_backend_choice(settings.llm.backend, forges=configured_forges(settings))
    assert "REVIEW_BOT_LLM=simulated" in str(refused.value)
    assert " and ".join(forges) in str(refused.value)


@pytest.mark.parametrize("chosen", ["simulated", "openai", "vllm", " OpenAI "])
def test_an_explicit_choice_is_kept(chosen: str) -> None:
    settings = load_settings({"GITHUB_TOKEN": "ghp-x", "REVIEW_BOT_LLM": chosen})
    assert check_backend_choice(settings.llm.backend, forges=("github",)) == chosen.strip().lower()


def test_without_forges_the_simulated_backend_stands_in() -> None:
    settings = load_settings({})
    assert configured_forges(settings) == ()
    assert check_backend_choice(settings.llm.backend, forges=()) == "simulated"
