"""Which line a YAML syntax error is on, for people: PyYAML marks where its parser noticed the
problem, which for a missing `:`, `]`, `}` or closing quote is the line after the mistake (pure)."""

from __future__ import annotations

import yaml

# Errors whose mark is where the parser ran into the next token: the mistake (a missing
# separator or closing bracket) is at the token before it.
_NOTICED_LATE = ("mapping values are not allowed here", "expected ',' or")
# Errors about something left open: the mistake is where it was opened (the context mark).
_LEFT_OPEN = ("while scanning a quoted scalar", "while scanning a simple key")


def _token_before(text: str, index: int) -> yaml.Token | None:
    """The last token that starts before character `index` (scanning stops at any error)."""
    last: yaml.Token | None = None
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if token.start_mark.index >= index:
                break
            if not isinstance(token, yaml.StreamStartToken):
                last = token
    except yaml.YAMLError:
        pass
    return last


def yaml_error_line(text: str, error: yaml.MarkedYAMLError) -> int | None:
    """The 1-based line a person should look at for `error` in `text`."""
    problem, context = error.problem_mark, error.context_mark
    if context is not None and (error.context or "").startswith(_LEFT_OPEN):
        return int(context.line) + 1
    if problem is None:
        return int(context.line) + 1 if context is not None else None
    if any((error.problem or "").startswith(start) for start in _NOTICED_LATE):
        before = _token_before(text, problem.index)
        if before is not None and before.start_mark.line < problem.line:
            return int(before.start_mark.line) + 1
    if problem.line >= len(text.splitlines()) and text.strip():
        # Noticed at the end of the stream: the last line with content.
        lines = text.splitlines()
        return max(number for number, line in enumerate(lines, start=1) if line.strip())
    return int(problem.line) + 1


__all__ = ["yaml_error_line"]
