"""What a router in front of the LLM servers needs from each call to keep a review together.

One review's chunks share the front of their prompts (instructions, the review's context), so
they run fastest on the server whose prefix cache already holds it. A router can keep them
there if each call says which review it belongs to:

- vLLM production-stack's router (`--routing-logic session --session-key HEADER`) pins the
  value of a request header to one server: the review's session key goes in that header.
- llm-d's inference scheduler (the session-affinity scorer) answers with a `Set-Cookie` naming
  the pod it chose and prefers that pod for requests that send the cookie back: the cookies a
  review's calls were given are sent with its later calls, and with no other review's.
- The Gateway API inference extension (llm-d's Endpoint Picker) reads a request's priority
  from the InferenceObjective named in `x-gateway-inference-objective`: each level may name
  one.

The level also goes in the body as vLLM's `priority` (bot.llm.openai_compat), which
production-stack's router passes through to the server.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from typing import Any

from bot.config import DEFAULTS

OBJECTIVE_HEADER = "x-gateway-inference-objective"
# Reviews whose cookies are remembered at once; the oldest are forgotten first.
MAX_SESSIONS = 4096


def session_key(metadata: Mapping[str, Any]) -> str | None:
    """The key a router keeps one review's calls together by; None when the call has no job."""
    job_id = metadata.get("job_id")
    if job_id is None:
        return None
    return f"review-{job_id}"


def parse_set_cookies(values: Iterable[str]) -> dict[str, str]:
    """Cookie name -> value from `Set-Cookie` header values; unreadable ones are skipped."""
    cookies: dict[str, str] = {}
    for value in values:
        jar = SimpleCookie()
        try:
            jar.load(value)
        except CookieError:
            continue
        for name, morsel in jar.items():
            cookies[name] = morsel.value
    return cookies


@dataclass(slots=True)
class RouterAffinity:
    """Headers that route one review's calls together, and the cookies each review was given."""

    session_header: str = DEFAULTS.llm.session_header
    objectives: Sequence[str] = ()
    max_sessions: int = MAX_SESSIONS
    cookies: OrderedDict[str, dict[str, str]] = field(default_factory=OrderedDict)

    def headers_for(self, metadata: Mapping[str, Any], priority: int | None) -> dict[str, str]:
        """The routing headers of one call of the review `metadata` names, at `priority`."""
        headers: dict[str, str] = {}
        key = session_key(metadata)
        if key is not None:
            headers[self.session_header] = key
            given = self.cookies.get(key)
            if given:
                self.cookies.move_to_end(key)
                headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in given.items())
        if self.objectives and priority is not None and 0 <= priority < len(self.objectives):
            headers[OBJECTIVE_HEADER] = self.objectives[priority]
        return headers

    def remember(self, metadata: Mapping[str, Any], set_cookies: Iterable[str]) -> None:
        """Keep the cookies a router set on a review's call for that review's later calls."""
        key = session_key(metadata)
        if key is None:
            return
        cookies = parse_set_cookies(set_cookies)
        if not cookies:
            return
        self.cookies.setdefault(key, {}).update(cookies)
        self.cookies.move_to_end(key)
        while len(self.cookies) > self.max_sessions:
            self.cookies.popitem(last=False)


__all__ = [
    "MAX_SESSIONS",
    "OBJECTIVE_HEADER",
    "RouterAffinity",
    "parse_set_cookies",
    "session_key",
]
