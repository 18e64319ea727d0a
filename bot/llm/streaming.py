"""Reading a streamed chat completion (`stream: true`): server-sent events in, answer out.

An OpenAI-compatible server streams `data: {json}` lines, each a `chat.completion.chunk`
whose first choice carries a `delta` of the answer, and ends with `data: [DONE]`. With
`stream_options.include_usage` the last chunk carries the usage; vLLM sends one token per
chunk, so until then the chunks with text count the answer's tokens. Pure: lines in, state out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


class StreamError(ValueError):
    """The stream said something that is not a completion chunk, or reported an error."""


@dataclass(slots=True)
class StreamedAnswer:
    """What a stream has said so far."""

    parts: list[str] = field(default_factory=list)
    deltas: int = 0  # chunks that carried answer text (one token each on vLLM)
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    done: bool = False

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def completion_tokens(self) -> int:
        """Answer tokens so far: the server's count when it gave one, else the chunks seen."""
        reported = self.usage.get("completion_tokens")
        if isinstance(reported, int) and reported >= self.deltas:
            return reported
        return self.deltas

    def feed_line(self, raw: bytes | str) -> bool:
        """Take one line of the stream; True when it moved the answer on. Raises StreamError."""
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        line = line.strip()
        if not line.startswith("data:"):
            return False  # blank separators, comments (": ping"), event names
        data = line[len("data:") :].strip()
        if data == DONE:
            self.done = True
            return False
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise StreamError(f"stream event is not JSON: {data[:80]!r}") from exc
        if not isinstance(event, dict):
            raise StreamError(f"stream event is not an object: {data[:80]!r}")
        if "error" in event:
            error = event["error"]
            message = error.get("message", error) if isinstance(error, dict) else error
            raise StreamError(f"the server ended the stream with an error: {message}")
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices:
            return isinstance(usage, dict)  # the usage-only chunk at the end
        choice = choices[0]
        if not isinstance(choice, dict):
            raise StreamError("stream chunk's first choice is not an object")
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str) and content:
            self.parts.append(content)
            self.deltas += 1
            return True
        return False


def is_event_stream(content_type: str | None) -> bool:
    """Whether a response is a stream of server-sent events (else a whole JSON answer)."""
    return (content_type or "").split(";")[0].strip().lower() == "text/event-stream"


__all__ = ["DONE", "StreamError", "StreamedAnswer", "is_event_stream"]
