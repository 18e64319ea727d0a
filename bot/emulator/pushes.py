"""Changing a held pull request from outside: pushes, force-pushes, rebases, files on a branch,
and a person's comment, each kept in the repository history so compares are real.

A pull request seeded from patches gets commits for its base and head whose trees are rebuilt
from the patches (unchanged lines between hunks become filler lines), so a later push is a real
child commit: the bot's compare of the old head with the new one shows only what the push
changed, a force-push leaves the old head off the new head's ancestry, as on GitHub.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bot.diff import parse_hunks
from bot.emulator.github import seed_issue_comment
from bot.emulator.gitlab import seed_note
from bot.emulator.quiet import push_tree, set_default_file
from bot.emulator.repository import Commit, history_of
from bot.emulator.state import EmulatedPull, EmulatorState
from bot.model import FileChange, Forge

PushKind = Literal["push", "force-push", "rebase"]
DEFAULT_BRANCH = "main"


class PushError(ValueError):
    """A change the emulator cannot make; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Pushed:
    """What a push did: the head before and after, and the pull request's files now."""

    pull: EmulatedPull
    kind: PushKind
    before: str
    after: str
    files: tuple[FileChange, ...]


def sides_from_patch(patch: str | None, status: str) -> tuple[str | None, str | None]:
    """The file's text before and after a patch (None where it does not exist); lines the
    patch does not show are the same filler on both sides."""
    old: list[str] = []
    new: list[str] = []
    for index, hunk in enumerate(parse_hunks(patch)):
        for side, start in ((old, hunk.old_start), (new, hunk.new_start)):
            gap = max(0, start - 1 - len(side))
            side.extend(f"# unchanged {index}.{number}" for number in range(gap))
        for line in hunk.lines:
            if line.kind != "+":
                old.append(line.text)
            if line.kind != "-":
                new.append(line.text)
    before = None if status == "added" else "".join(f"{line}\n" for line in old)
    after = None if status == "removed" else "".join(f"{line}\n" for line in new)
    return before, after


def _trees(
    base: Mapping[str, str], files: Sequence[FileChange]
) -> tuple[dict[str, str], dict[str, str]]:
    """The base tree with the old sides of `files` put in, and the head tree they lead to."""
    base = dict(base)
    sides = [
        (change, *sides_from_patch(change.patch, change.status))
        for change in files
        if change.patch is not None
    ]
    for change, before, _ in sides:
        if before is not None:
            base[change.previous_path or change.path] = before
    head = dict(base)
    for change, _, after in sides:
        if change.previous_path:
            head.pop(change.previous_path, None)
        if after is None:
            head.pop(change.path, None)
        else:
            head[change.path] = after
    return base, head


def ensure_history(state: EmulatorState, pull: EmulatedPull) -> None:
    """Give the pull request's base and head commits with whole trees, if it has none yet."""
    history = history_of(state)
    version = pull.newest
    if version.head_sha in history.commits:
        return
    known = history.commits.get(version.base_sha)
    start = known.tree if known else history.default_trees.get(pull.repo, {})
    base, head = _trees(start, version.files)
    if known is None:
        history.commits[version.base_sha] = Commit(version.base_sha, None, base)
    history.commits[version.head_sha] = Commit(version.head_sha, version.base_sha, head)


def record_trees(
    state: EmulatorState, pull: EmulatedPull, base: Mapping[str, str], head: Mapping[str, str]
) -> None:
    """Record a new pull request's base and head commits with these whole trees."""
    history = history_of(state)
    history.default_trees.setdefault(pull.repo, dict(base))
    version = pull.newest
    history.commits[version.base_sha] = Commit(version.base_sha, None, dict(base))
    history.commits[version.head_sha] = Commit(version.head_sha, version.base_sha, dict(head))


def push_patches(
    state: EmulatorState, pull: EmulatedPull, files: Sequence[FileChange], head_sha: str
) -> Pushed:
    """A push described by the pull request's files after it (patches against the base): a
    child of the old head whose tree those patches give."""
    ensure_history(state, pull)
    history = history_of(state)
    before = pull.newest.head_sha
    base_sha = pull.newest.base_sha
    _, head = _trees(history.commits[base_sha].tree, files)
    history.commits[head_sha] = Commit(head_sha, before, head)
    version = state.push(pull.forge, pull.repo, pull.number, files=files, head_sha=head_sha)
    return Pushed(pull, "push", before, version.head_sha, tuple(version.files))


def _apply(tree: dict[str, str], files: Mapping[str, str | None], *, where: str) -> None:
    for path, text in files.items():
        if text is None:
            if path not in tree:
                raise PushError(f"{where}: {path} cannot be deleted: it is not there")
            del tree[path]
        else:
            tree[path] = text


def push_changes(
    state: EmulatorState,
    forge: Forge,
    repo: str,
    number: int,
    *,
    files: Mapping[str, str | None],
    renames: Mapping[str, str] | None = None,
    force: bool = False,
    base_files: Mapping[str, str | None] | None = None,
) -> Pushed:
    """Push onto the pull request's head: `files` set (text) or delete (None) paths, `renames`
    move them. `force`: the new commit replaces the old ones (its parent is the base).
    `base_files`: a rebase; the base branch gets these changes and the pull request's own
    changes are replayed on it. Raises PushError for a change that cannot be made."""
    pull = state.get_pull(forge, repo, number)
    ensure_history(state, pull)
    history = history_of(state)
    before = pull.newest.head_sha
    old_base = history.commits[pull.newest.base_sha].tree
    head = dict(history.commits[before].tree)
    for old_path, new_path in (renames or {}).items():
        if old_path not in head:
            raise PushError(f"renames: {old_path} is not in the head")
        head[new_path] = head.pop(old_path)
    _apply(head, files, where="files")
    binaries = [change for change in pull.newest.files if change.patch is None]
    if base_files is not None:
        new_base = {**old_base, **history.default_trees.get(repo, {})}
        _apply(new_base, base_files, where="base_files")
        own = {path for path in set(old_base) | set(head) if old_base.get(path) != head.get(path)}
        rebased = dict(new_base)
        for path in own:
            if path in head:
                rebased[path] = head[path]
            else:
                rebased.pop(path, None)
        version = push_tree(state, forge, repo, number, rebased, base=new_base)
        kind: PushKind = "rebase"
    else:
        version = push_tree(state, forge, repo, number, head, force=force)
        kind = "force-push" if force else "push"
    shown = {change.path for change in version.files}
    version.files.extend(change for change in binaries if change.path not in shown)
    return Pushed(pull, kind, before, version.head_sha, tuple(version.files))


def branches(state: EmulatorState, repo: str) -> list[str]:
    """The branches of a repository files can be set on: the default one and each head."""
    heads = sorted({pull.head_ref for pull in state.pulls.values() if pull.repo == repo})
    return [DEFAULT_BRANCH, *heads]


def set_branch_files(
    state: EmulatorState,
    forge: Forge,
    repo: str,
    branch: str,
    files: Mapping[str, str | None],
) -> Pushed | None:
    """Set files on the default branch (what the bot reads `.review-bot.yaml` from; None) or on
    a pull request's head branch (a push, returned). Raises PushError for an unknown branch."""
    if branch == DEFAULT_BRANCH:
        for path, text in files.items():
            set_default_file(state, repo, path, text)
        return None
    pull = next(
        (
            item
            for item in state.pulls.values()
            if item.forge == forge and item.repo == repo and item.head_ref == branch
        ),
        None,
    )
    if pull is None:
        known = ", ".join(branches(state, repo))
        raise PushError(f"branch {branch} is not a branch of {repo} (known: {known})")
    return push_changes(state, forge, repo, pull.number, files=files)


def head_files(state: EmulatorState, pull: EmulatedPull) -> dict[str, str]:
    """The files at the pull request's head (rebuilt from its patches if it has no history)."""
    ensure_history(state, pull)
    return dict(history_of(state).commits[pull.newest.head_sha].tree)


def branch_files(state: EmulatorState, forge: Forge, repo: str, ref: str) -> dict[str, str]:
    """The files on a branch (the default one or a pull request's head) or at a commit sha;
    raises PushError for a ref the repository does not have."""
    history = history_of(state)
    if ref == DEFAULT_BRANCH:
        return dict(history.default_trees.get(repo, {}))
    for pull in state.pulls.values():
        if pull.forge == forge and pull.repo == repo and pull.head_ref == ref:
            ensure_history(state, pull)
            return dict(history.commits[pull.newest.head_sha].tree)
    if ref in history.commits:
        return dict(history.commits[ref].tree)
    known = ", ".join(branches(state, repo))
    raise PushError(f"{ref} is neither a branch of {repo} (known: {known}) nor a commit sha")


def add_comment(
    state: EmulatorState, forge: Forge, repo: str, number: int, *, author: str, body: str
) -> dict[str, Any]:
    """A person's comment on the pull request (an issue comment or a note); returns it."""
    if forge == "github":
        comment_id = seed_issue_comment(state, repo, number, user=author, body=body)
        comments = state.get_pull(forge, repo, number).comments
    else:
        comment_id = seed_note(state, repo, number, user=author, body=body)
        comments = state.get_pull(forge, repo, number).notes
    return next(item for item in comments if item["id"] == comment_id)


__all__ = [
    "DEFAULT_BRANCH",
    "PushError",
    "Pushed",
    "add_comment",
    "branch_files",
    "branches",
    "ensure_history",
    "head_files",
    "push_changes",
    "push_patches",
    "record_trees",
    "set_branch_files",
    "sides_from_patch",
]
