"""The files an operator deploys from agree with each other and with pyproject."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def make_recipe(target: str) -> list[str]:
    """The command lines of one Makefile target."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe: list[str] = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_make_test_checks_formatting_like_the_gate() -> None:
    recipe = make_recipe("test")
    assert "$(BIN)/ruff format --check bot tests bench migrations" in recipe
    # The format check runs before the suite, so an unformatted tree fails fast.
    assert recipe.index("$(BIN)/ruff format --check bot tests bench migrations") < next(
        i for i, line in enumerate(recipe) if "pytest" in line
    )


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_postgres_both_roles_and_an_optional_gpu_vllm() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "web", "dispatcher", "vllm"}
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test")
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL"), name
    assert "--role" in services["web"]["command"] and "web" in services["web"]["command"]
    assert services["dispatcher"]["command"][:3] == ["serve", "--role", "dispatcher"]
    for role in ("web", "dispatcher"):
        assert services[role]["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert services[role]["environment"]["DATABASE_URL"].endswith("@postgres:5432/reviewbot")
        assert services[role]["env_file"] == ".env"
        # Each role's health check asks the port its command serves on.
        port = services[role]["command"][services[role]["command"].index("--port") + 1]
        assert f"127.0.0.1:{port}/healthz" in " ".join(services[role]["healthcheck"]["test"])
    vllm = services["vllm"]
    assert vllm["profiles"] == ["gpu"]
    assert "--scheduling-policy" in vllm["command"]
    assert vllm["command"][vllm["command"].index("--scheduling-policy") + 1] == "priority"


def test_env_example_covers_compose_and_documents_its_settings() -> None:
    example = (REPO / ".env.example").read_text()
    names = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", example, re.MULTILINE))
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", (REPO / "compose.yaml").read_text()))
    assert used <= names, used - names
    readme = (REPO / "README.md").read_text()
    settings = {name for name in names if name.startswith(("REVIEW_BOT_", "GITHUB_", "GITLAB_"))}
    undocumented = {name for name in settings if f"`{name.removesuffix('_FILE')}" not in readme}
    assert not undocumented, undocumented
    # Every setting the file names is one the bot reads.
    config = (REPO / "bot" / "config.py").read_text()
    unread = {name for name in settings if f'"{name.removesuffix("_FILE")}"' not in config}
    assert not unread, unread


def _lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, separator, version = line.partition("==")
        assert separator and version, f"requirements.lock: not pinned: {line!r}"
        pins[canonicalize_name(name)] = Version(version.split(";")[0].strip())
    return pins


def test_the_lock_pins_every_runtime_dependency_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _lock()
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in requirements.lock (scripts/lock.sh)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside {requirement.specifier}"
        )


def test_the_image_installs_from_the_lock_only() -> None:
    lines = [
        line.strip()
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    installs = [line for line in lines if "pip install" in line]
    assert installs[0] == "RUN pip install --no-deps -r requirements.lock"
    assert lines.index("COPY requirements.lock ./") < lines.index(installs[0])
    # The package itself brings nothing unpinned: --no-deps, then pip check.
    assert all("--no-deps" in line for line in installs)
    assert any("pip check" in line for line in lines)
