"""The files an operator deploys from agree with each other and with pyproject."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
