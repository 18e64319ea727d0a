"""The settings model against what documents and deploys it: README, compose, Kubernetes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from bot.config import knobs, load_settings, markdown_table, secret_variables, variables

REPO = Path(__file__).resolve().parents[2]
# Variables the bot's environment holds for others, not settings of the bot.
NOT_SETTINGS = {"POSTGRES_PASSWORD", "POSTGRES_USER", "POSTGRES_DB", "PGUSER", "USER"}


def test_every_knob_has_a_type_a_default_a_meaning_and_one_variable() -> None:
    seen = [env for _, _, _, env in knobs()]
    assert len(seen) == len(set(seen)), "a variable is read by two knobs"
    for _, _, field, env in knobs():
        assert field.description, f"{env} has no meaning"
        assert field.annotation is not None, env
    assert len(seen) >= 60


def test_the_readme_table_is_the_model() -> None:
    readme = (REPO / "README.md").read_text()
    assert markdown_table() in readme, "README.md is stale: paste `bot settings --markdown`"


def test_every_variable_the_docs_name_is_read() -> None:
    read = set(variables()) | {f"{name}_FILE" for name in secret_variables()}
    documents = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for document in documents:
        for name in re.findall(r"\b(REVIEW_BOT_[A-Z0-9_]*[A-Z0-9])\b(?!_\*)", document.read_text()):
            assert name in read, f"{document.name} names {name}, which no setting reads"


def test_every_variable_compose_and_kubernetes_set_is_a_setting() -> None:
    read = set(variables()) | {f"{name}_FILE" for name in secret_variables()}
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    names: set[str] = set()
    bot_image = compose["services"]["web"]["image"]
    for service in compose["services"].values():
        if service.get("image") != bot_image:
            continue  # PostgreSQL, vLLM: their own settings
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.partition("=")[::2] for item in environment)
        names |= set(environment)
    for manifest in sorted((REPO / "deploy" / "k8s").rglob("*.yaml")):
        text = manifest.read_text()
        names |= set(
            re.findall(r"^\s+-?\s*name:\s*((?:REVIEW_BOT|GITHUB|GITLAB|DATABASE)\w*)", text, re.M)
        )
        names |= set(re.findall(r"^\s+((?:REVIEW_BOT|GITHUB|GITLAB|DATABASE)_\w+):", text, re.M))
    assert names, "found no variable in compose.yaml and deploy/k8s"
    unknown = sorted(names - read - NOT_SETTINGS)
    assert not unknown, f"set in compose.yaml or deploy/k8s but read by no setting: {unknown}"


def test_bot_settings_markdown_prints_the_table() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bot", "settings", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
        cwd=REPO,
    )
    assert done.stdout == markdown_table()


def test_defaults_load_from_an_empty_environment() -> None:
    settings = load_settings({})
    assert settings.queue.max_attempts == 3 and settings.database.url is None
