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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import yaml

from bot.diff import fence_for, file_value
from bot.errors import ReviewBotError
from bot.model import SEVERITIES, FileChange
from bot.policy import _Reader, compile_glob

SETTINGS_PATH = ".review-bot.yaml"
EXCLUDED = f"excluded by {SETTINGS_PATH}"
# Keys people may reach for that the file deliberately cannot set.
LEVEL_KEYS = frozenset({"level", "levels", "priority", "priorities"})


class RepoSettingsError(ReviewBotError):
    """The settings file is broken; the message names the file and line."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        where = f"{SETTINGS_PATH}:{line}" if line is not None else SETTINGS_PATH
        super().__init__(f"{where}: {message}")
        self.line = line


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


class _SettingsReader(_Reader):
    def fail(self, node: yaml.Node, message: str) -> NoReturn:
        raise RepoSettingsError(message, line=node.start_mark.line + 1)


def _globs(reader: _SettingsReader, node: yaml.Node, what: str) -> tuple[str, ...]:
    found: list[str] = []
    for item, text in reader.strings(node, what):
        try:
            compile_glob(text)
        except ValueError as exc:
            reader.fail(item, f"{what}: bad glob {text!r}: {exc}")
        found.append(text)
    return tuple(found)


def parse_repo_settings(text: str) -> RepoSettings:
    """Parse the settings file; raises RepoSettingsError naming `.review-bot.yaml:line`."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(part for part in (exc.context, exc.problem) if part)
        raise RepoSettingsError(
            f"bad YAML: {problem}", line=mark.line + 1 if mark is not None else None
        ) from exc
    except yaml.YAMLError as exc:
        raise RepoSettingsError(f"bad YAML: {exc}") from exc
    if root is None:
        return RepoSettings()
    reader = _SettingsReader(SETTINGS_PATH)
    if isinstance(root, yaml.MappingNode):
        for key_node, _ in root.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value in LEVEL_KEYS:
                reader.fail(
                    key_node,
                    f"`{key_node.value}` cannot be set here: levels come from the server's "
                    "policies (P0 only from a trigger) and permitted commands",
                )
    top = reader.mapping(
        root, "the settings", {"version", "reviews", "paths", "instructions", "inline"}
    )
    if "version" in top and reader.scalar(top["version"], "version", int) != 1:
        reader.fail(top["version"], "unsupported version (this bot reads 1)")
    values: dict[str, Any] = {}
    if "reviews" in top:
        reviews = reader.mapping(top["reviews"], "reviews", {"auto", "drafts"})
        for key, node in reviews.items():
            values[key] = reader.scalar(node, f"reviews.{key}", bool)
    if "paths" in top:
        paths = reader.mapping(top["paths"], "paths", {"include", "exclude"})
        for key, node in paths.items():
            values[key] = _globs(reader, node, f"paths.{key}")
    if "instructions" in top:
        node = top["instructions"]
        if not isinstance(node, yaml.SequenceNode):
            reader.fail(node, "instructions must be a list of {path, text}")
        instructions = []
        for item in node.value:
            entry = reader.mapping(item, "an instruction", {"path", "text"})
            if "path" not in entry or "text" not in entry:
                reader.fail(item, "an instruction needs both `path` and `text`")
            [glob] = _globs(reader, entry["path"], "instructions.path")
            instructions.append(PathInstruction(glob, reader.text(entry["text"], "text")))
        values["instructions"] = tuple(instructions)
    if "inline" in top:
        inline = reader.mapping(top["inline"], "inline", {"min_severity", "max_comments"})
        if "min_severity" in inline:
            severity = reader.text(inline["min_severity"], "inline.min_severity").lower()
            if severity not in SEVERITIES:
                reader.fail(
                    inline["min_severity"],
                    f"inline.min_severity must be one of {', '.join(SEVERITIES)}",
                )
            values["min_severity"] = severity
        if "max_comments" in inline:
            cap = reader.scalar(inline["max_comments"], "inline.max_comments", int)
            if cap < 0:
                reader.fail(inline["max_comments"], "inline.max_comments must be 0 or more")
            values["max_comments"] = cap
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
    job: Any, files: Iterable[Mapping[str, Any] | Any], server: str | None = None
) -> str | None:
    """The server's instructions plus the repository's for a chunk's paths (job may be None)."""
    request: Mapping[str, Any] = getattr(job, "request", None) or {}
    paths = [str(file_value(file, "path", "")) for file in files]
    repository = instructions_for(request.get("instructions") or (), paths)
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
