"""`.review-bot.yaml`: what a repository asks of its reviews (pure parsing and applying).

    version: 1
    reviews:
      auto: true            # review on open and push; false: only when asked with /review
      drafts: false         # false: drafts are not reviewed even where the server would
    paths:
      include: ["src/**"]   # only these paths are reviewed (default: all)
      exclude: ["docs/**"]  # never these
    instructions:           # added to the prompt of chunks with a matching file, fenced
      - path: "migrations/**"
        text: "Every migration must be reversible."
    inline:
      min_severity: minor   # lower findings go to the summary only
      max_comments: 10      # inline comments per review at most

It cannot touch levels: P0 stays trigger-only, and raising a level stays with the server's
policies and permitted commands. A broken file is reported with `file:line` and the server's
defaults apply.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import yaml

from bot.diff import fence_for, file_value
from bot.errors import ReviewBotError
from bot.model import SEVERITIES, FileChange, Job
from bot.policy import _Reader, compile_glob
from bot.yaml_lines import yaml_error_line

SETTINGS_PATH = ".review-bot.yaml"
EXCLUDED = f"excluded by {SETTINGS_PATH}"
# Keys people may reach for that the file deliberately cannot set.
LEVEL_KEYS = frozenset({"level", "levels", "priority", "priorities"})


class RepoSettingsError(ReviewBotError):
    """The settings file is broken; the message names the file and the line of each problem."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.problems: tuple[str, ...] = (_where(line, message),)
        super().__init__(self.problems[0])
        self.line = line

    @classmethod
    def of(cls, problems: Sequence[tuple[int | None, str]]) -> RepoSettingsError:
        """Every problem of the file, in line order (the first one's line is `line`)."""
        ordered = sorted(problems, key=lambda item: item[0] or 0)
        error = cls(ordered[0][1], line=ordered[0][0])
        error.problems = tuple(_where(line, message) for line, message in ordered)
        error.args = ("; ".join(error.problems),)
        return error


def _where(line: int | None, message: str) -> str:
    return (
        f"{SETTINGS_PATH}:{line}: {message}" if line is not None else f"{SETTINGS_PATH}: {message}"
    )


@dataclass(frozen=True, slots=True)
class PathInstruction:
    """Guidance for files matching a glob."""

    glob: str
    text: str


@dataclass(frozen=True, slots=True)
class RepoSettings:
    """A repository's review settings; the defaults are what a repository without a file gets."""

    auto: bool = True
    drafts: bool = True
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    instructions: tuple[PathInstruction, ...] = ()
    min_severity: str | None = None
    max_comments: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "auto": self.auto,
            "drafts": self.drafts,
            "include": list(self.include),
            "exclude": list(self.exclude),
            "instructions": [{"path": i.glob, "text": i.text} for i in self.instructions],
            "min_severity": self.min_severity,
            "max_comments": self.max_comments,
        }


class _Problem(Exception):
    """One problem recorded; the part it was found in is skipped, the rest is still read."""


class _SettingsReader(_Reader):
    """A reader that records every problem instead of stopping at the first."""

    def __init__(self) -> None:
        super().__init__(SETTINGS_PATH)
        self.problems: list[tuple[int | None, str]] = []

    def note(self, node: yaml.Node, message: str) -> None:
        self.problems.append((node.start_mark.line + 1, message))

    def fail(self, node: yaml.Node, message: str) -> NoReturn:
        self.note(node, message)
        raise _Problem(message)

    def attempt(self, parse: Callable[[], None]) -> None:
        """Run one part of the parse; a problem in it is recorded and the parse goes on."""
        with contextlib.suppress(_Problem):
            parse()

    def mapping(self, node: yaml.Node, what: str, allowed: set[str]) -> dict[str, yaml.Node]:
        """The known keys of a mapping; unknown and repeated keys are recorded and left out."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping")
        entries: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str) or key not in allowed:
                known = ", ".join(sorted(allowed - LEVEL_KEYS))
                self.note(key_node, f"unknown key {key!r} in {what} (known: {known})")
            elif key in entries:
                self.note(key_node, f"key {key!r} appears twice in {what}")
            else:
                entries[key] = value_node
        return entries


def _globs(reader: _SettingsReader, node: yaml.Node, what: str) -> tuple[str, ...]:
    found: list[str] = []
    for item, text in reader.strings(node, what):
        try:
            compile_glob(text)
        except ValueError as exc:
            reader.note(item, f"{what}: bad glob {text!r}: {exc}")
            continue
        found.append(text)
    return tuple(found)


TOP_KEYS = {"version", "reviews", "paths", "instructions", "inline"}


def parse_repo_settings(text: str) -> RepoSettings:
    """Parse the settings file; raises RepoSettingsError naming `.review-bot.yaml:line` for
    every problem in it (a YAML syntax error stops the reading where it is)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        problem = " ".join(part for part in (exc.context, exc.problem) if part)
        raise RepoSettingsError(f"bad YAML: {problem}", line=yaml_error_line(text, exc)) from exc
    except yaml.YAMLError as exc:
        raise RepoSettingsError(f"bad YAML: {exc}") from exc
    if root is None:
        return RepoSettings()
    reader = _SettingsReader()
    values: dict[str, Any] = {}
    top: dict[str, yaml.Node] = {}

    def read_top() -> None:
        top.update(reader.mapping(root, "the settings", TOP_KEYS | LEVEL_KEYS))
        for key in LEVEL_KEYS & set(top):
            key_node = next(k for k, v in root.value if v is top[key])
            reader.note(
                key_node,
                f"`{key}` cannot be set here: levels come from the server's "
                "policies (P0 only from a trigger) and permitted commands",
            )

    def read_version() -> None:
        if "version" in top and reader.scalar(top["version"], "version", int) != 1:
            reader.fail(top["version"], "unsupported version (this bot reads 1)")

    def read_section(name: str, keys: set[str], read: Callable[[str, yaml.Node], None]) -> None:
        if name not in top:
            return
        section = reader.mapping(top[name], name, keys)
        for key, node in section.items():
            reader.attempt(functools.partial(read, key, node))

    def read_flag(key: str, node: yaml.Node) -> None:
        values[key] = reader.scalar(node, f"reviews.{key}", bool)

    def read_paths(key: str, node: yaml.Node) -> None:
        values[key] = _globs(reader, node, f"paths.{key}")

    def read_inline(key: str, node: yaml.Node) -> None:
        if key == "min_severity":
            severity = reader.text(node, "inline.min_severity").lower()
            if severity not in SEVERITIES:
                reader.fail(node, f"inline.min_severity must be one of {', '.join(SEVERITIES)}")
            values["min_severity"] = severity
        else:
            cap = reader.scalar(node, "inline.max_comments", int)
            if cap < 0:
                reader.fail(node, "inline.max_comments must be 0 or more")
            values["max_comments"] = cap

    def read_instructions() -> None:
        if "instructions" not in top:
            return
        node = top["instructions"]
        if not isinstance(node, yaml.SequenceNode):
            reader.fail(node, "instructions must be a list of {path, text}")
        instructions: list[PathInstruction] = []

        def read_one(item: yaml.Node) -> None:
            entry = reader.mapping(item, "an instruction", {"path", "text"})
            if "path" not in entry or "text" not in entry:
                reader.fail(item, "an instruction needs both `path` and `text`")
            globs = _globs(reader, entry["path"], "instructions.path")
            text = reader.text(entry["text"], "text")
            instructions.extend(PathInstruction(glob, text) for glob in globs[:1])

        for item in node.value:
            reader.attempt(functools.partial(read_one, item))
        values["instructions"] = tuple(instructions)

    reader.attempt(read_top)
    reader.attempt(read_version)
    reader.attempt(lambda: read_section("reviews", {"auto", "drafts"}, read_flag))
    reader.attempt(lambda: read_section("paths", {"include", "exclude"}, read_paths))
    reader.attempt(read_instructions)
    reader.attempt(lambda: read_section("inline", {"min_severity", "max_comments"}, read_inline))
    if reader.problems:
        raise RepoSettingsError.of(reader.problems)
    return RepoSettings(**values)


def _matches(patterns: Iterable[str], path: str) -> bool:
    return any(compile_glob(pattern).fullmatch(path) for pattern in patterns)


def select_files(
    files: Sequence[FileChange], settings: RepoSettings
) -> tuple[tuple[FileChange, ...], tuple[str, ...]]:
    """(files to review, paths left out) by the include and exclude globs."""
    kept: list[FileChange] = []
    left_out: list[str] = []
    for change in files:
        included = not settings.include or _matches(settings.include, change.path)
        if included and not _matches(settings.exclude, change.path):
            kept.append(change)
        else:
            left_out.append(change.path)
    return tuple(kept), tuple(left_out)


def instructions_for(instructions: Iterable[Mapping[str, Any]], paths: Iterable[str]) -> str | None:
    """The instructions whose glob matches any of the paths, each fenced like the diff."""
    wanted = list(paths)
    blocks: list[str] = []
    for item in instructions:
        glob, text = str(item.get("path") or ""), str(item.get("text") or "")
        if not glob or not text.strip():
            continue
        if any(compile_glob(glob).fullmatch(path) for path in wanted):
            fence = fence_for(text)
            blocks.append(f"For files matching {glob}:\n{fence}text\n{text.strip()}\n{fence}")
    return "\n\n".join(blocks) or None


def chunk_instructions(
    job: Job | None, files: Iterable[Mapping[str, Any] | Any], server: str | None = None
) -> str | None:
    """The server's instructions plus the repository's for a chunk's paths (job may be None)."""
    details: Mapping[str, Any] = job.pull_details if job is not None else {}
    paths = [str(file_value(file, "path", "")) for file in files]
    repository = instructions_for(details.get("instructions") or (), paths)
    parts = [part for part in (server, repository) if part and part.strip()]
    return "\n\n".join(parts) or None


__all__ = [
    "EXCLUDED",
    "SETTINGS_PATH",
    "PathInstruction",
    "RepoSettings",
    "RepoSettingsError",
    "chunk_instructions",
    "instructions_for",
    "parse_repo_settings",
    "select_files",
]
