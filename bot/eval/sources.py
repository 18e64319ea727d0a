"""Read a repository's source files for `bot eval` (the languages of bot.eval.syntax.GRAMMARS;
git's tracked files when it is a git work tree, else a walk that leaves out virtual
environments, dependencies, caches and hidden folders)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bot.errors import ConfigError
from bot.eval.plant import MAX_FILE_BYTES, SourceFile
from bot.eval.syntax import GRAMMARS, grammar_of

SKIPPED_DIRS = frozenset(
    {"__pycache__", "node_modules", "site-packages", "venv", "build", "dist", "env"}
)


def tracked_files(repo: Path) -> list[str] | None:
    """git's tracked source files of the work tree, or None when it is not one."""
    patterns = [f"*{suffix}" for suffix in GRAMMARS]
    try:
        listed = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--", *patterns],
            capture_output=True,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted(name for name in listed.stdout.decode().split("\0") if name)


def walked_files(repo: Path) -> list[str]:
    """Source files under `repo`, outside hidden, cache and environment folders."""
    found: list[str] = []
    for path in repo.rglob("*"):
        if grammar_of(path.name) is None:
            continue
        parts = path.relative_to(repo).parts
        if any(part.startswith(".") or part in SKIPPED_DIRS for part in parts[:-1]):
            continue
        found.append(path.relative_to(repo).as_posix())
    return sorted(found)


def read_sources(repo: Path) -> list[SourceFile]:
    """The repository's source files as text: UTF-8, LF line ends, at most MAX_FILE_BYTES each.
    Raises ConfigError when `repo` is not a folder."""
    if not repo.is_dir():
        raise ConfigError(f"--repo {repo}: not a directory")
    names = tracked_files(repo) if (repo / ".git").exists() else None
    files: list[SourceFile] = []
    for name in names if names is not None else walked_files(repo):
        path = repo / name
        try:
            if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if "\r" not in text and text.strip():
            files.append(SourceFile(name, text))
    return files
