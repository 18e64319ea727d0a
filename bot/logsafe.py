"""Payload text made safe to echo in a log line or an alert: escaped and cut short."""

from __future__ import annotations

DEFAULT_LIMIT = 200
# Markup and the escape character itself: a name must not open a tag or fake an escape.
ESCAPED_PRINTABLE = frozenset("<>&\\")


def escaped(value: object, *, limit: int = DEFAULT_LIMIT) -> str:
    """`value` as printable ASCII, control, non-ASCII and markup characters escaped, cut to
    `limit` characters.

    A webhook's strings reach log lines, alert messages and chat webhooks; escaping keeps a
    crafted name from forging log lines, carrying terminal escapes or injecting markup.
    """
    text = value if isinstance(value, str) else str(value)
    shown = "".join(_escape_char(char) for char in text)
    return shown if len(shown) <= limit else shown[: max(0, limit - 3)] + "..."


def _escape_char(char: str) -> str:
    """One character, itself when it is harmless printable ASCII, else a backslash escape."""
    code = ord(char)
    if 0x20 <= code < 0x7F and char not in ESCAPED_PRINTABLE:
        return char
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
