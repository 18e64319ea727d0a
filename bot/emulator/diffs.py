"""Generated diffs: plausible code changes of a given size, from a seed."""

from __future__ import annotations

import random

from bot.model import FileChange

_WORDS = (
    "order",
    "invoice",
    "session",
    "token",
    "cache",
    "queue",
    "user",
    "report",
    "payment",
    "config",
    "schema",
    "limit",
    "retry",
    "buffer",
    "record",
    "account",
    "index",
    "event",
)


def _code_line(rng: random.Random) -> str:
    first, second = rng.choice(_WORDS), rng.choice(_WORDS)
    templates = (
        f"    {first}_{second} = load_{first}({second}_id, timeout={rng.randint(1, 90)})",
        f"    if {first}.{second} is None:",
        f'        raise {first.title()}Error(f"missing {second}: {{{first}!r}}")',
        f"    return [{first} for {first} in {second}s if {first}.active]",
        f'    logger.info("{first} %s updated", {second}.id)',
        f"    {first}.{second}_count += {rng.randint(1, 9)}",
        f"def {first}_{second}({second}: {second.title()}) -> {first.title()}:",
        f"    await self.{first}_store.save({second}, now=now)",
    )
    return rng.choice(templates)


def generate_patch(rng: random.Random, changed_lines: int) -> tuple[str, int, int]:
    """Build a plausible unified diff with about `changed_lines` +/- lines; (patch, adds, dels)."""
    hunks: list[str] = []
    additions = deletions = 0
    old_line = new_line = rng.randint(1, 40)
    remaining = max(1, changed_lines)
    while remaining > 0:
        size = min(remaining, rng.randint(1, 12))
        removed = rng.randint(0, size // 2) if size > 1 else 0
        added = size - removed
        before = [f" {_code_line(rng)}" for _ in range(3)]
        after = [f" {_code_line(rng)}" for _ in range(3)]
        body = before + [f"-{_code_line(rng)}" for _ in range(removed)]
        body += [f"+{_code_line(rng)}" for _ in range(added)] + after
        old_count, new_count = 6 + removed, 6 + added
        hunks.append(f"@@ -{old_line},{old_count} +{new_line},{new_count} @@")
        hunks.extend(body)
        additions += added
        deletions += removed
        remaining -= size
        gap = rng.randint(5, 60)
        old_line += old_count + gap
        new_line += new_count + gap
    return "\n".join(hunks), additions, deletions


def generate_file_changes(
    *,
    changed_lines: int,
    files: int,
    seed: int = 0,
    binary_files: int = 0,
    prefix: str = "src",
) -> list[FileChange]:
    """Plausible changed files: `changed_lines` +/- lines over `files` text files, plus binaries."""
    rng = random.Random(seed)
    result: list[FileChange] = []
    per_file = (
        [
            changed_lines // files + (1 if index < changed_lines % files else 0)
            for index in range(files)
        ]
        if files
        else []
    )
    for index, lines in enumerate(per_file):
        package, module = rng.choice(_WORDS), rng.choice(_WORDS)
        path = f"{prefix}/{package}/{module}_{index}.py"
        patch, additions, deletions = generate_patch(rng, max(1, lines))
        status = "added" if deletions == 0 and rng.random() < 0.2 else "modified"
        result.append(
            FileChange(
                path=path, additions=additions, deletions=deletions, patch=patch, status=status
            )
        )
    for index in range(binary_files):
        result.append(FileChange(path=f"assets/image_{index}.png", patch=None, status="added"))
    return result
