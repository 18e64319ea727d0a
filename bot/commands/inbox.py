"""A command delivery's commands, as the worker runs them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from bot.model import Command, Forge
from bot.queue.commands import ClaimedDelivery

# The parser turns `/review priority p0` into an error text; the worker makes it a command again
# so the refusal names this repository's P0 triggers and lands in the job history.
_P0_ERROR = re.compile(r"Line \d+: P0 cannot be set by a command")


def commands_of(delivery: ClaimedDelivery, *, forge: Forge) -> tuple[list[Command], list[str]]:
    """The delivery's commands (P0 errors made commands again) and its other parse errors."""
    detail = delivery.detail
    common: dict[str, Any] = {
        "forge": forge,
        "repo": str(detail.get("repo") or ""),
        "number": int(detail.get("number") or 0),
        "author": str(detail.get("author") or ""),
        "comment_id": int(detail.get("comment_id") or 0),
        "project_id": detail.get("project_id"),
        "installation_id": detail.get("installation_id"),
        "delivery_id": delivery.delivery_id,
    }
    commands = [
        Command(
            verb=str(item.get("verb") or ""),
            argument=item.get("argument"),
            raw=str(item.get("raw") or ""),
            **common,
        )
        for item in detail.get("commands") or ()
        if isinstance(item, Mapping)
    ]
    errors: list[str] = []
    for error in detail.get("errors") or ():
        if _P0_ERROR.match(str(error)):
            commands.append(
                Command(verb="priority", argument="P0", raw="/review priority p0", **common)
            )
        else:
            errors.append(str(error))
    return commands, errors
