"""The answer schema: the JSON object every model is asked for, whatever the backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The output contract as a JSON schema, for servers that can constrain decoding to it.
REVIEW_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "findings": {
            "type": "array",
            "maxItems": 20,
            "items": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "line": {"type": "integer"},
                    "side": {"enum": ["RIGHT", "LEFT"]},
                    "quote": {"type": "string"},
                    "start_line": {"type": "integer"},
                    "suggestion": {"type": "string"},
                    "severity": {"enum": ["info", "minor", "major", "critical"]},
                    "body": {"type": "string"},
                },
                "required": ["path", "line", "side", "severity", "body"],
            },
        },
        "summary": {"type": "string"},
    },
    "required": ["findings", "summary"],
}
