"""The bot's own words for each forge: GitLab says merge request (MR) where GitHub says pull
request (PR). Pure; applied to sentences the bot writes. Code spans (`...`: paths, echoed
commands) are left as they are."""

from __future__ import annotations

import re

_LONG = re.compile(r"\b([Pp])ull request")
_SHORT = re.compile(r"\bPR(s?)\b")
_CODE_SPAN = re.compile(r"(`[^`]*`)")


def change_name(forge: str) -> str:
    """What the forge calls a proposed change: "merge request" on GitLab, else "pull request"."""
    return "merge request" if forge == "gitlab" else "pull request"


def _gitlab_words(text: str) -> str:
    text = _LONG.sub(lambda match: ("M" if match.group(1) == "P" else "m") + "erge request", text)
    return _SHORT.sub(lambda match: "MR" + match.group(1), text)


def for_forge(text: str, forge: str) -> str:
    """The bot's text in the forge's words (GitLab: merge request, MR), code spans untouched."""
    if forge != "gitlab":
        return text
    parts = _CODE_SPAN.split(text)
    return "".join(part if index % 2 else _gitlab_words(part) for index, part in enumerate(parts))


__all__ = ["change_name", "for_forge"]
