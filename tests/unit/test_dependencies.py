"""Every third-party package the bot imports at module level is declared in pyproject.toml."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

BOT = Path(__file__).resolve().parents[2] / "bot"


def module_level_imports(path: Path) -> set[str]:
    """Top-level names imported by the module's own body (not lazily inside functions)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def declared_distributions() -> set[str]:
    """The review-bot distribution's required (not optional) dependencies, normalized."""
    requirements = importlib.metadata.requires("review-bot") or []
    return {
        re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        for requirement in requirements
        if "extra ==" not in requirement
    }


def test_third_party_imports_are_declared() -> None:
    imported = set().union(*(module_level_imports(path) for path in BOT.rglob("*.py")))
    third_party = {name for name in imported if name not in sys.stdlib_module_names} - {"bot"}
    providers = importlib.metadata.packages_distributions()
    declared = declared_distributions()
    undeclared = {
        name: providers.get(name, ["?"])
        for name in sorted(third_party)
        if not {dist.lower().replace("_", "-") for dist in providers.get(name, [])} & declared
    }
    assert undeclared == {}
