"""The emulated repositories: commits with whole trees, and each file as a commit holds it.

A pull request seeded from trees (bot.emulator.quiet.open_pull_from_trees) has real commits; one
seeded from patches alone (EmulatorState.add_pull) has, at its head, each changed file as its
patch shows the new side, so what the emulator serves agrees with the diff it lists.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from bot.diff import parse_hunks
from bot.emulator.state import EmulatorState

Tree = Mapping[str, str]  # path -> file text


@dataclass(slots=True)
class Commit:
    """One commit: its parent and the whole tree it records."""

    sha: str
    parent: str | None
    tree: dict[str, str]


@dataclass(slots=True)
class RepositoryHistory:
    """Commits of every emulated repository, and each repository's default-branch tree."""

    commits: dict[str, Commit] = field(default_factory=dict)
    default_trees: dict[str, dict[str, str]] = field(default_factory=dict)
    counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def commit(self, tree: Tree, *, parent: str | None, hint: str = "") -> str:
        sha = hashlib.sha1(f"{hint}:{parent}:{next(self.counter)}".encode()).hexdigest()
        self.commits[sha] = Commit(sha, parent, dict(tree))
        return sha

    def ancestors(self, sha: str) -> list[str]:
        """`sha` and its ancestors, newest first."""
        chain: list[str] = []
        current: str | None = sha
        while current is not None and current in self.commits:
            chain.append(current)
            current = self.commits[current].parent
        return chain


_HISTORIES: WeakKeyDictionary[EmulatorState, RepositoryHistory] = WeakKeyDictionary()


def history_of(state: EmulatorState) -> RepositoryHistory:
    """The repository history kept alongside an emulator state."""
    if state not in _HISTORIES:
        _HISTORIES[state] = RepositoryHistory()
    return _HISTORIES[state]


SHA = re.compile(r"[0-9a-f]{40}")


def text_from_patch(patch: str) -> str:
    """A file as a patch shows its new side: each added or unchanged line at its number, the
    lines no hunk shows left blank (the emulator knows nothing else of them)."""
    lines: dict[int, str] = {}
    for hunk in parse_hunks(patch):
        for line in hunk.lines:
            if line.new_line is not None:
                lines[line.new_line] = line.text
    if not lines:
        return ""
    return "".join(f"{lines.get(number, '')}\n" for number in range(1, max(lines) + 1))


def file_at(state: EmulatorState, repo: str, path: str, ref: str | None) -> str | None:
    """A repository file at `ref`: a commit with a whole tree, the head of a seeded pull
    request (its new side, from the patch), or the default branch for a branch name (or
    none); None when the file or the commit is not there."""
    history = history_of(state)
    if ref and ref in history.commits:
        return history.commits[ref].tree.get(path)
    if ref:
        for pull in state.pulls.values():
            if pull.repo != repo:
                continue
            for version in pull.versions:
                if version.head_sha != ref:
                    continue
                change = next((item for item in version.files if item.path == path), None)
                if change is None or change.status == "removed" or not change.patch:
                    return None
                return text_from_patch(change.patch)
        if SHA.fullmatch(ref):
            return None
    return history.default_trees.get(repo, {}).get(path)


def blob_sha(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def blob_sha_at(state: EmulatorState, repo: str, path: str, ref: str) -> str | None:
    """The git blob sha of a file at `ref`, as GitHub lists it with a pull request's files."""
    text = file_at(state, repo, path, ref)
    return blob_sha(text) if text is not None else None
