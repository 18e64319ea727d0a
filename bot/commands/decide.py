"""What a slash command does: permission, quota and P0 rules as a pure decision, and its reply."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from bot.forges.base import PERMISSIONS, Permission
from bot.model import TERMINAL_JOB_STATES, Command, Job, JobState, Level
from bot.policy import CommandRules, Policy, compile_glob
from bot.status.render import about, ordinal

Action = Literal["set_level", "requeue", "republish", "cancel", "status", "help", "refuse"]
Outcome = Literal["accepted", "refused", "unchanged"]

# Our replies carry this marker, so the parser (parse.BOT_MARKER) never reads them back.
REPLY_MARKER = "<!-- review-bot:command -->"
MAX_ECHO_CHARS = 120
DEFAULT_P0_TRIGGER = "a policy trigger (a change into a hotfix branch)"

HELP_TEXT = "\n".join(
    [
        "Commands, one per line in a PR comment:",
        "- `/review`: review the newest commit now: what changed since the last review",
        "- `/review full`: review the whole pull request again, not only what changed",
        "- `/review priority p1|p2|p3`: move this PR's queued review to that level",
        "- `/review cancel`: cancel this PR's queued review",
        "- `/review status`: level, why, place in queue, estimated start, wait so far",
        "- `/review help`: this text",
        "Raising a level needs write access and is limited per day; the author (or anyone with "
        "write access) may lower or cancel their own PR's review. P0 comes only from policy "
        "triggers, never from a command.",
    ]
)

_PERMISSION_RANK: dict[str, int] = {
    permission: rank for rank, permission in enumerate(reversed(PERMISSIONS))
}  # none=0, read=1, triage=2, write=3, maintain=4, admin=5
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\u2028\u2029`<>]")


@dataclass(frozen=True, slots=True)
class SlashRules:
    """The policy's command rules plus the P0 triggers a refusal names."""

    raise_requires: str = "write"
    author_may_lower: bool = True
    author_may_cancel: bool = True
    raises_per_user_per_day: int = 5
    p0_triggers: tuple[str, ...] = (DEFAULT_P0_TRIGGER,)

    @classmethod
    def from_policy(cls, policy: Policy) -> SlashRules:
        """Rules of one repository's policy, with its P0 rules described."""
        command_rules: CommandRules = policy.command_rules
        return cls(
            raise_requires=command_rules.raise_requires,
            author_may_lower=command_rules.author_may_lower,
            author_may_cancel=command_rules.author_may_cancel,
            raises_per_user_per_day=command_rules.raises_per_user_per_day,
            p0_triggers=describe_p0_triggers(policy) or (DEFAULT_P0_TRIGGER,),
        )


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a job stands in the queue: the place and ETA its check run or commit status
    gives (bot.status.standing, one function for both), and why its level last changed."""

    place: int | None = None  # 1 = next to start, among reviews not started yet
    start_in_s: float | None = None
    finish_in_s: float | None = None  # the review posted
    level_reason: str | None = None


@dataclass(frozen=True, slots=True)
class CommandDecision:
    """What to do about one command, what to answer, and what the history says."""

    action: Action
    level: Level | None
    reply_text: str
    history_reason: str
    outcome: Outcome = "accepted"
    is_raise: bool = False


def has_permission(permission: Permission | str | None, required: str) -> bool:
    """Tell whether a role is at least `required` (none < read < triage < write < ...)."""
    if permission is None:
        return False
    return _PERMISSION_RANK.get(permission, 0) >= _PERMISSION_RANK.get(required, 99)


def decide(
    command: Command,
    *,
    job: Job | None,
    actor_permission: Permission | None,
    actor_is_author: bool,
    raises_today: int,
    rules: SlashRules,
    now: datetime,
    standing: Standing | None = None,
) -> CommandDecision:
    """Decide one command; `actor_permission` None means the forge could not be asked."""
    who = code(command.author)
    permission_text = code(actor_permission) if actor_permission is not None else "unknown access"
    live = job is not None and job.state not in TERMINAL_JOB_STATES
    verb = command.verb
    if verb == "help":
        return CommandDecision("help", None, HELP_TEXT, f"{command.raw}: help shown")
    if verb == "status":
        return _status(command, job=job, now=now, standing=standing or Standing())
    if verb == "priority":
        return _priority(
            command,
            job=job if live else None,
            actor_permission=actor_permission,
            actor_is_author=actor_is_author,
            raises_today=raises_today,
            rules=rules,
            who=who,
            permission_text=permission_text,
        )
    may_own = actor_is_author or has_permission(actor_permission, "write")
    if verb == "cancel":
        if job is None or not live:
            return _refuse(
                command,
                "there is no queued or running review of this PR to cancel.",
                "nothing to cancel",
            )
        may_cancel = (actor_is_author and rules.author_may_cancel) or has_permission(
            actor_permission, "write"
        )
        if not may_cancel:
            return _refuse(
                command,
                f"cancelling needs authorship of this PR or write access; {who} has "
                f"{permission_text}.",
                f"no right to cancel ({actor_permission or 'unknown'})",
            )
        return CommandDecision(
            "cancel",
            None,
            f"Cancelled the {job.state.value} review of this PR (job {job.id}, {job.level}).",
            f"{command.raw}: cancelled by {command.author}",
        )
    if verb == "rerun":
        return _rerun(
            command, job=job, may_own=may_own, who=who, permission_text=permission_text,
            actor_permission=actor_permission,
        )  # fmt: skip
    if verb == "review":
        if job is not None and live:
            return CommandDecision(
                "status",
                job.level,
                f"A review of the newest commit is already {job.state.value} at {job.level} "
                f"(job {job.id}); nothing new was queued. `/review status` tells where it stands.",
                f"{command.raw}: already {job.state.value}",
                outcome="unchanged",
            )
        if job is None:
            return _refuse(
                command,
                "no webhook for this PR has reached me yet, so I do not know its commits; "
                "push a commit or reopen it and it is queued by policy.",
                "PR unknown",
            )
        if not may_own:
            return _refuse(
                command,
                f"a new review costs GPU time, so it needs authorship of this PR or write "
                f"access; {who} has {permission_text}.",
                f"no right to re-review ({actor_permission or 'unknown'})",
            )
        return CommandDecision(
            "requeue",
            None,
            f"Queued a new review of the newest commit (the last one ended {job.state.value}); "
            "its level comes from the policy.",
            f"{command.raw}: re-review requested by {command.author}",
        )
    return _refuse(command, f"{code(command.raw)} is not a command I know.", "unknown command")


def _rerun(
    command: Command,
    *,
    job: Job | None,
    may_own: bool,
    who: str,
    permission_text: str,
    actor_permission: Permission | None,
) -> CommandDecision:
    """The check run's Re-run button: the head's state written again, without a comment.

    A head whose review was posted (or is underway) gets its status again, concluded from the
    findings open on it: no LLM review of an unchanged head, and no green over open findings.
    A head whose last review did not end in a posted one (failed, cancelled) is reviewed again,
    as `/review` would; either way the pull request gets no reply comment.
    """
    if job is None:
        return _refuse(
            command,
            "no webhook for this PR has reached me yet, so I do not know its commits; "
            "push a commit or reopen it and it is queued by policy.",
            "PR unknown",
        )
    if not may_own:
        return _refuse(
            command,
            f"a re-run needs authorship of this PR or write access; {who} has {permission_text}.",
            f"no right to re-run ({actor_permission or 'unknown'})",
        )
    if job.state is JobState.DONE or job.state not in TERMINAL_JOB_STATES:
        return CommandDecision(
            "republish",
            job.level,
            "",
            f"{command.raw}: status of {job.head_sha[:12]} written again ({job.state.value})",
        )
    return CommandDecision(
        "requeue",
        None,
        "",
        f"{command.raw}: re-review requested by {command.author} (the last one ended "
        f"{job.state.value})",
    )


def _priority(
    command: Command,
    *,
    job: Job | None,
    actor_permission: Permission | None,
    actor_is_author: bool,
    raises_today: int,
    rules: SlashRules,
    who: str,
    permission_text: str,
) -> CommandDecision:
    """`/review priority pN`: P0 never; raises need write access and quota; lowers need more."""
    try:
        target = Level.parse(command.argument or "")
    except ValueError:
        return _refuse(command, "`/review priority` takes one of p1, p2, p3.", "bad level")
    if target is Level.P0:
        triggers = "; ".join(rules.p0_triggers)
        return _refuse(
            command,
            f"P0 cannot be set by a command. It comes only from policy triggers: {triggers}.",
            "P0 is reserved for policy triggers",
        )
    if job is None:
        return _refuse(
            command,
            "there is no queued review of this PR to move; `/review` queues one.",
            "nothing to move",
        )
    if target == job.level:
        return CommandDecision(
            "status",
            target,
            f"This review is already at {target} (job {job.id}); nothing changed.",
            f"{command.raw}: already {target}",
            outcome="unchanged",
        )
    move = f"{job.level} -> {target}"
    if target < job.level:
        if not has_permission(actor_permission, rules.raise_requires):
            return _refuse(
                command,
                f"raising a review to {target} needs {code(rules.raise_requires)} access to the "
                f"repository; {who} has {permission_text}.",
                f"raise {move} refused: {actor_permission or 'unknown'} access",
                level=target,
            )
        quota = rules.raises_per_user_per_day
        if raises_today >= quota:
            return _refuse(
                command,
                f"{who} has used all {quota} raises allowed per day; the count starts again at "
                "midnight UTC.",
                f"raise {move} refused: daily quota of {quota} used",
                level=target,
            )
        left = quota - raises_today - 1
        return CommandDecision(
            "set_level",
            target,
            f"Moved this review from {job.level} to {target} (job {job.id}). It keeps its place "
            f"in time and the chunks already reviewed. Raises left today for {who}: {left} of "
            f"{quota}.",
            f"{command.raw}: raise {move} by {command.author} ({actor_permission})",
            is_raise=True,
        )
    may_lower = (actor_is_author and rules.author_may_lower) or has_permission(
        actor_permission, "write"
    )
    if not may_lower:
        return _refuse(
            command,
            f"lowering a review needs authorship of this PR or write access; {who} has "
            f"{permission_text}.",
            f"lower {move} refused: {actor_permission or 'unknown'} access",
            level=target,
        )
    return CommandDecision(
        "set_level",
        target,
        f"Moved this review from {job.level} to {target} (job {job.id}). It keeps its place in "
        "time and the chunks already reviewed.",
        f"{command.raw}: lower {move} by {command.author}",
    )


def _status(
    command: Command, *, job: Job | None, now: datetime, standing: Standing
) -> CommandDecision:
    """`/review status`: level, why, place in queue, estimated start, wait so far."""
    if job is None:
        return CommandDecision(
            "status",
            None,
            "No review of this PR is known. `/review` queues one once a webhook for it arrived.",
            f"{command.raw}: no job",
        )
    lines = [f"Review job {job.id}: **{job.state.value}** at **{job.level}**"]
    if job.base_level != job.level:
        lines[0] += f" (policy level {job.base_level})"
    reasons = "; ".join(job.reasons) or "no reason recorded"
    lines.append(f"- why: {code(reasons)}")
    if standing.level_reason and job.base_level != job.level:
        lines.append(f"- level last changed: {code(standing.level_reason)}")
    if job.chunks_total:
        lines.append(f"- progress: {job.chunks_done} of {job.chunks_total} chunks reviewed")
    if job.state in (JobState.QUEUED, JobState.WAITING):
        if job.state is JobState.WAITING:
            lines.append("- waiting for the reviews it depends on")
        if standing.place is not None:
            lines.append(
                f"- place in queue: {ordinal(standing.place)} in line ({standing.place - 1} ahead)"
            )
        if standing.start_in_s is not None:
            lines.append(f"- estimated start: in about {about(standing.start_in_s)}")
        if standing.finish_in_s is not None:
            lines.append(f"- review in about {about(standing.finish_in_s)}")
        lines.append(f"- waiting so far: {format_duration(_seconds(now - job.enqueued_at))}")
    elif job.state is JobState.RUNNING:
        started = job.first_started_at or job.enqueued_at
        lines.append(f"- waited {format_duration(_seconds(started - job.enqueued_at))} to start")
        if standing.finish_in_s is not None:
            lines.append(f"- review in about {about(standing.finish_in_s)}")
    else:
        ended = job.finished_at or now
        lines.append(f"- ended after {format_duration(_seconds(ended - job.enqueued_at))}")
    return CommandDecision("status", job.level, "\n".join(lines), f"{command.raw}: status shown")


def _refuse(
    command: Command, why: str, history: str, *, level: Level | None = None
) -> CommandDecision:
    return CommandDecision(
        "refuse",
        level,
        f"Refused {code(command.raw or '/review')}: {why}",
        f"{command.raw}: {history}",
        outcome="refused",
    )


def _seconds(delta: timedelta) -> float:
    return max(0.0, delta.total_seconds())


def format_duration(seconds: float) -> str:
    """Render a duration for people: 45 s, 3 min, 2 h 5 min."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{total} s"
    minutes = total // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def code(text: str) -> str:
    """Quote untrusted text as inline code: no backtick break-out, no HTML, no mention, bounded."""
    cleaned = _UNSAFE.sub(lambda match: _REPLACEMENTS.get(match.group(), " "), text)
    if len(cleaned) > MAX_ECHO_CHARS:
        cleaned = cleaned[: MAX_ECHO_CHARS - 3] + "..."
    return f"`{cleaned or ' '}`"


_REPLACEMENTS = {"`": "'", "<": "‹", ">": "›"}


_UNSAFE_ERROR_TEXT = re.compile(r"[\x00-\x1f\x7f\u2028\u2029<>@]")
MAX_ERROR_CHARS = 300


def clean_error(error: str) -> str:
    """A parser error as safe reply text: no HTML, no mentions, no control characters."""
    replacements = {"<": "‹", ">": "›", "@": "@\u200b"}
    cleaned = _UNSAFE_ERROR_TEXT.sub(lambda match: replacements.get(match.group(), " "), error)
    if len(cleaned) > MAX_ERROR_CHARS:
        cleaned = cleaned[: MAX_ERROR_CHARS - 3] + "..."
    return "Refused: " + cleaned


def render_reply(lines: Sequence[str], *, author: str, marker: str = "") -> str:
    """One reply comment for all commands of a comment, marked as the bot's own (and with
    `marker`, which a retry finds it by)."""
    body = "\n\n".join(lines)
    marked = f"{marker}\n" if marker else ""
    return f"{body}\n\n_Commands of {code(author)}._\n{marked}{REPLY_MARKER}"


def describe_p0_triggers(policy: Policy) -> tuple[str, ...]:
    """Describe each policy rule that gives P0, e.g. `rule 'hotfix': a change into hotfix/**`."""
    described = []
    for rule in policy.rules:
        if rule.level is not Level.P0 or not rule.review:
            continue
        parts = []
        bases = [_glob_text(pattern) for pattern in rule.when.base]
        heads = [_glob_text(pattern) for pattern in rule.when.head]
        if bases:
            parts.append("a change into " + " or ".join(code(base) for base in bases))
        if heads:
            parts.append("from " + " or ".join(code(head) for head in heads))
        if rule.when.labels:
            parts.append(
                "labelled " + " or ".join(code(label) for label in sorted(rule.when.labels))
            )
        if rule.when.merged:
            parts.append("once merged")
        description = ", ".join(parts) or "its conditions hold"
        described.append(f"rule {code(rule.name)}: {description}")
    return tuple(described)


_GLOB_TOKENS = (("(?:.*/)?", "**/"), (".*", "**"), ("[^/]*", "*"), ("[^/]", "?"))


def _glob_text(pattern: re.Pattern[str]) -> str:
    """Recover the glob a compiled branch pattern came from (the policy keeps only the regex)."""
    source = pattern.pattern
    out: list[str] = []
    index = 0
    while index < len(source):
        for token, glob in _GLOB_TOKENS:
            if source.startswith(token, index):
                out.append(glob)
                index += len(token)
                break
        else:
            if source[index] == "\\" and index + 1 < len(source):
                out.append(source[index + 1])
                index += 2
            else:
                out.append(source[index])
                index += 1
    text = "".join(out)
    try:
        round_trip = compile_glob(text).pattern
    except ValueError:
        return source
    return text if round_trip == source else source
