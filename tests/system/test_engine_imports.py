"""The in-process vLLM path imports only what the vLLM environment has (no database libraries)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The cached vLLM environment has vLLM and its dependencies, not the bot's database stack.
ABSENT_THERE = ("sqlalchemy", "asyncpg", "alembic", "psycopg")


def test_chunk_review_imports_without_database_libraries() -> None:
    blocker = "".join(f"sys.modules[{name!r}] = None\n" for name in ABSENT_THERE)
    program = f"import sys\n{blocker}import bot.review.chunk_review\nimport bot.llm.vllm_engine\n"
    run = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
