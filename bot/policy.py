"""Priority policies as data: ordered rules map a ReviewRequest to a level and its reasons."""

from __future__ import annotations

import enum
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml
from yaml.constructor import SafeConstructor

from bot.errors import PolicyError
from bot.model import Level, PolicyDecision, ReviewRequest
from bot.wording import change_name
from bot.yaml_lines import yaml_error_line

DEFAULT_POLICY_NAME = "default.yaml"
REPO_SEPARATOR = "__"
PERMISSIONS = ("read", "triage", "write", "maintain", "admin")
SIZE_PENDING_REASON = "size not known yet: size rules are checked again once the diff is fetched"
NO_RULE_REASON = "no policy rule matched: ordinary review"
REASON_FIELDS = frozenset(
    {"repo", "number", "author", "base_ref", "head_ref", "action", "labels", "files_changed",
     "changed_lines", "change"}
)  # fmt: skip


class Verdict(enum.Enum):
    """Outcome of checking one rule's conditions."""

    MATCH = "match"
    NO_MATCH = "no_match"
    NEEDS_SIZE = "needs_size"


@dataclass(frozen=True, slots=True)
class Conditions:
    """A rule's `when`: every condition given must hold; lists mean any of."""

    base: tuple[re.Pattern[str], ...] = ()
    head: tuple[re.Pattern[str], ...] = ()
    labels: frozenset[str] = frozenset()
    without_labels: frozenset[str] = frozenset()
    bot_author: bool | None = None
    draft: bool | None = None
    merged: bool | None = None
    action: frozenset[str] = frozenset()
    files_min: int | None = None
    lines_min: int | None = None

    def check(self, request: ReviewRequest) -> Verdict:
        """Check the request; NEEDS_SIZE when only an unknown size stands in the way."""
        labels = {label.casefold() for label in request.labels}
        if (
            (self.base and not any(p.fullmatch(request.base_ref) for p in self.base))
            or (self.head and not any(p.fullmatch(request.head_ref) for p in self.head))
            or (self.labels and not labels & self.labels)
            or (labels & self.without_labels)
            or (self.bot_author is not None and request.author_is_bot != self.bot_author)
            or (self.draft is not None and request.draft != self.draft)
            or (self.merged is not None and request.merged != self.merged)
            or (self.action and request.action not in self.action)
        ):
            return Verdict.NO_MATCH
        unknown = False
        for minimum, actual in (
            (self.files_min, request.files_changed),
            (self.lines_min, request.changed_lines),
        ):
            if minimum is None:
                continue
            if actual is None:
                unknown = True
            elif actual < minimum:
                return Verdict.NO_MATCH
        return Verdict.NEEDS_SIZE if unknown else Verdict.MATCH


@dataclass(frozen=True, slots=True)
class Rule:
    """One policy rule; `review=False` rules skip the review."""

    name: str
    when: Conditions
    level: Level
    reason: str
    review: bool = True
    line: int | None = None


@dataclass(frozen=True, slots=True)
class CommandRules:
    """Who may steer the queue with slash commands (enforced by the command handler)."""

    raise_requires: str = "write"
    author_may_lower: bool = True
    author_may_cancel: bool = True
    raises_per_user_per_day: int = 5


@dataclass(frozen=True, slots=True)
class Policy:
    """An ordered rule list (first match wins) and the command rules, from one file."""

    rules: tuple[Rule, ...]
    command_rules: CommandRules = field(default_factory=CommandRules)
    source: str = "<policy>"


@dataclass(frozen=True, slots=True)
class PolicyBook:
    """The default policy and the repositories that bring their own."""

    default: Policy
    repos: Mapping[str, Policy] = field(default_factory=dict)

    def policy_for(self, repo: str) -> Policy:
        """The repository's own policy if it has one, else the default."""
        return self.repos.get(repo.lower(), self.default)


def evaluate(policy: Policy, request: ReviewRequest) -> PolicyDecision:
    """Decide a request's level and reasons; call again once sizes are known."""
    size_pending = False
    for rule in policy.rules:
        verdict = rule.when.check(request)
        if verdict is Verdict.NEEDS_SIZE:
            size_pending = True
            continue
        if verdict is Verdict.MATCH:
            reasons = [render_reason(rule.reason, request)]
            if size_pending:
                reasons.append(SIZE_PENDING_REASON)
            return PolicyDecision(
                level=rule.level,
                reasons=tuple(reasons),
                review=rule.review,
                rule=rule.name,
                size_pending=size_pending,
            )
    reasons = [NO_RULE_REASON] + ([SIZE_PENDING_REASON] if size_pending else [])
    return PolicyDecision(level=Level.P1, reasons=tuple(reasons), size_pending=size_pending)


def render_reason(template: str, request: ReviewRequest) -> str:
    """Fill a rule's reason template with the request's facts."""
    values: dict[str, object] = {
        "repo": request.repo,
        "number": request.number,
        "author": request.author,
        "base_ref": request.base_ref,
        "head_ref": request.head_ref,
        "action": request.action,
        "labels": ", ".join(request.labels) or "none",
        "files_changed": "unknown" if request.files_changed is None else request.files_changed,
        "changed_lines": "unknown" if request.changed_lines is None else request.changed_lines,
        "change": change_name(request.forge),  # "pull request", or GitLab's "merge request"
    }
    return template.format_map(values)


# --- loading ----------------------------------------------------------------------------------


def load_policy_book(directory: Path) -> PolicyBook:
    """Read default.yaml and every <owner>__<name>.yaml in a directory; raises PolicyError."""
    default_path = directory / DEFAULT_POLICY_NAME
    if not default_path.is_file():
        raise PolicyError(f"{DEFAULT_POLICY_NAME} not found in {directory}", path=str(directory))
    repos: dict[str, Policy] = {}
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        if path.name == DEFAULT_POLICY_NAME:
            continue
        repo = path.stem.replace(REPO_SEPARATOR, "/").lower()
        if "/" not in repo:
            raise PolicyError(
                f"a repository policy is named <owner>{REPO_SEPARATOR}<name>.yaml, "
                f"not {path.name!r}",
                path=str(path),
            )
        if repo in repos:
            raise PolicyError(f"a second policy file for {repo!r}", path=str(path))
        repos[repo] = load_policy_file(path)
    return PolicyBook(default=load_policy_file(default_path), repos=repos)


def load_policy_file(path: Path) -> Policy:
    """Read and parse one policy file; raises PolicyError naming file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot be read: {exc}", path=str(path)) from exc
    return parse_policy(text, source=str(path))


def parse_policy(text: str, *, source: str = "<policy>") -> Policy:
    """Parse policy YAML; raises PolicyError naming source, line and problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        problem = " ".join(part for part in (exc.context, exc.problem) if part)
        line = yaml_error_line(text, exc)
        raise PolicyError(f"bad YAML: {problem}", path=source, line=line) from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"bad YAML: {exc}", path=source) from exc
    if root is None:
        raise PolicyError("the policy is empty; it needs a `rules` list", path=source, line=1)
    reader = _Reader(source)
    top = reader.mapping(root, "the policy", {"version", "rules", "command_rules"})
    if "version" in top:
        version = reader.scalar(top["version"], "version", int)
        if version != 1:
            reader.fail(top["version"], f"unsupported version {version} (this bot reads 1)")
    if "rules" not in top:
        reader.fail(root, "missing key `rules`")
    rules_node = top["rules"]
    if not isinstance(rules_node, yaml.SequenceNode) or not rules_node.value:
        reader.fail(rules_node, "`rules` must be a non-empty list")
    rules: list[Rule] = []
    names: set[str] = set()
    for node in rules_node.value:
        rule = _parse_rule(reader, node)
        if rule.name in names:
            reader.fail(node, f"rule name {rule.name!r} is used twice")
        names.add(rule.name)
        rules.append(rule)
    command_rules = (
        _parse_command_rules(reader, top["command_rules"])
        if "command_rules" in top
        else CommandRules()
    )
    return Policy(rules=tuple(rules), command_rules=command_rules, source=source)


_RULE_KEYS = {"name", "when", "level", "reason", "review"}
_CONDITION_KEYS = {
    "base", "head", "labels", "without_labels", "bot_author", "draft", "merged", "action",
    "files_min", "lines_min",
}  # fmt: skip
_COMMAND_RULE_KEYS = {
    "raise_requires", "author_may_lower", "author_may_cancel", "raises_per_user_per_day",
}  # fmt: skip


def _parse_rule(reader: _Reader, node: yaml.Node) -> Rule:
    """Parse one entry of `rules`."""
    entry = reader.mapping(node, "a rule", _RULE_KEYS)
    for key in ("name", "reason"):
        if key not in entry:
            reader.fail(node, f"a rule needs `{key}`")
    name = reader.text(entry["name"], "name")
    where = f"rule {name!r}"
    review = reader.scalar(entry["review"], f"{where}: review", bool) if "review" in entry else True
    if "level" in entry:
        level_node = entry["level"]
        raw = reader.scalar(level_node, f"{where}: level", str)
        try:
            level = Level.parse(raw)
        except ValueError:
            reader.fail(level_node, f"{where}: bad level {raw!r} (expected P0, P1, P2 or P3)")
        if raw.strip().upper() != level.name:
            reader.fail(level_node, f"{where}: bad level {raw!r} (write it as {level.name})")
    elif review:
        reader.fail(node, f"{where} needs `level` (only `review: false` rules may omit it)")
    else:
        level = Level.P3
    reason_node = entry["reason"]
    reason = reader.text(reason_node, f"{where}: reason")
    _check_template(reader, reason_node, reason, where)
    when = _parse_conditions(reader, entry["when"], where) if "when" in entry else Conditions()
    return Rule(
        name=name,
        when=when,
        level=level,
        reason=reason,
        review=review,
        line=node.start_mark.line + 1,
    )


def _parse_conditions(reader: _Reader, node: yaml.Node, where: str) -> Conditions:
    """Parse a rule's `when` mapping."""
    entry = reader.mapping(node, f"{where}: when", _CONDITION_KEYS)

    def globs(key: str) -> tuple[re.Pattern[str], ...]:
        if key not in entry:
            return ()
        patterns = []
        for item_node, item in reader.strings(entry[key], f"{where}: when.{key}"):
            try:
                patterns.append(compile_glob(item))
            except ValueError as exc:
                reader.fail(item_node, f"{where}: bad glob {item!r} in when.{key}: {exc}")
        return tuple(patterns)

    def names(key: str, normalize: Callable[[str], str]) -> frozenset[str]:
        if key not in entry:
            return frozenset()
        items = reader.strings(entry[key], f"{where}: when.{key}")
        return frozenset(normalize(item) for _, item in items)

    def flag(key: str) -> bool | None:
        return reader.scalar(entry[key], f"{where}: when.{key}", bool) if key in entry else None

    def minimum(key: str) -> int | None:
        if key not in entry:
            return None
        value: int = reader.scalar(entry[key], f"{where}: when.{key}", int)
        if value < 0:
            reader.fail(entry[key], f"{where}: when.{key} must not be negative")
        return value

    return Conditions(
        base=globs("base"),
        head=globs("head"),
        labels=names("labels", str.casefold),
        without_labels=names("without_labels", str.casefold),
        bot_author=flag("bot_author"),
        draft=flag("draft"),
        merged=flag("merged"),
        action=names("action", str),
        files_min=minimum("files_min"),
        lines_min=minimum("lines_min"),
    )


def _parse_command_rules(reader: _Reader, node: yaml.Node) -> CommandRules:
    """Parse the `command_rules` section."""
    entry = reader.mapping(node, "command_rules", _COMMAND_RULE_KEYS)
    defaults = CommandRules()
    raise_requires = defaults.raise_requires
    if "raise_requires" in entry:
        raise_requires = reader.scalar(entry["raise_requires"], "raise_requires", str)
        if raise_requires not in PERMISSIONS:
            reader.fail(
                entry["raise_requires"],
                f"command_rules.raise_requires must be one of {', '.join(PERMISSIONS)}",
            )
    quota = defaults.raises_per_user_per_day
    if "raises_per_user_per_day" in entry:
        quota = reader.scalar(entry["raises_per_user_per_day"], "raises_per_user_per_day", int)
        if quota < 0:
            reader.fail(entry["raises_per_user_per_day"], "raises_per_user_per_day < 0")
    return CommandRules(
        raise_requires=raise_requires,
        author_may_lower=(
            reader.scalar(entry["author_may_lower"], "author_may_lower", bool)
            if "author_may_lower" in entry
            else defaults.author_may_lower
        ),
        author_may_cancel=(
            reader.scalar(entry["author_may_cancel"], "author_may_cancel", bool)
            if "author_may_cancel" in entry
            else defaults.author_may_cancel
        ),
        raises_per_user_per_day=quota,
    )


def _check_template(reader: _Reader, node: yaml.Node, template: str, where: str) -> None:
    """Refuse reason templates with unknown or malformed {placeholders}."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        reader.fail(node, f"{where}: bad reason template: {exc} (write {{{{ for a brace)")
    for name in fields:
        if name not in REASON_FIELDS:
            known = ", ".join(sorted(REASON_FIELDS))
            reader.fail(node, f"{where}: unknown placeholder {{{name}}} in reason ({known})")


def compile_glob(pattern: str) -> re.Pattern[str]:
    """Compile a branch glob: `*` within a path segment, `**` across, `?`, `[abc]`, `[!abc]`."""
    if not pattern.strip():
        raise ValueError("empty pattern")
    parts: list[str] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("***", index):
            raise ValueError("'***' is not a glob (use ** for any depth)")
        if pattern.startswith("**/", index):
            parts.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            parts.append(".*")
            index += 2
        elif char == "*":
            parts.append("[^/]*")
            index += 1
        elif char == "?":
            parts.append("[^/]")
            index += 1
        elif char == "[":
            end = pattern.find("]", index + 1)
            if end == -1:
                raise ValueError(f"unclosed '[' at position {index + 1}")
            body = pattern[index + 1 : end]
            negate = body.startswith("!")
            body = body.removeprefix("!")
            if not body:
                raise ValueError(f"empty character class at position {index + 1}")
            escaped = "".join("-" if c == "-" else re.escape(c) for c in body)
            parts.append(f"[{'^' if negate else ''}{escaped}]")
            index = end + 1
        elif char == "]":
            raise ValueError(f"unmatched ']' at position {index + 1}")
        else:
            parts.append(re.escape(char))
            index += 1
    try:
        return re.compile("".join(parts))
    except re.error as exc:  # e.g. a reversed range such as [z-a]
        raise ValueError(str(exc)) from exc


class _Reader:
    """Walks composed YAML nodes, turning each problem into a PolicyError with its line."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.constructor = SafeConstructor()

    def fail(self, node: yaml.Node, message: str) -> NoReturn:
        raise PolicyError(message, path=self.source, line=node.start_mark.line + 1)

    def mapping(self, node: yaml.Node, what: str, allowed: set[str]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping")
        entries: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str) or key not in allowed:
                self.fail(
                    key_node, f"unknown key {key!r} in {what} (known: {', '.join(sorted(allowed))})"
                )
            if key in entries:
                self.fail(key_node, f"key {key!r} appears twice in {what}")
            entries[key] = value_node
        return entries

    def scalar(self, node: yaml.Node, what: str, kind: type[Any]) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, f"{what} must be a single value")
        value = self.constructor.construct_object(node)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = {str: "a string", int: "an integer", bool: "true or false"}
            self.fail(node, f"{what} must be {names[kind]}, got {node.value!r}")
        return value

    def text(self, node: yaml.Node, what: str) -> str:
        value: str = self.scalar(node, what, str)
        if not value.strip():
            self.fail(node, f"{what} must not be empty")
        return value

    def strings(self, node: yaml.Node, what: str) -> list[tuple[yaml.Node, str]]:
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        if not items:
            self.fail(node, f"{what} must not be an empty list")
        return [(item, self.text(item, f"{what} (quote values such as yes/no)")) for item in items]
