"""Talking to the forge emulator as an outside client does, and checking its answers against
the OpenAPI descriptions in ../shared/openapi."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest

from tests.conftest import SHARED_DIR

TOKEN = {"Authorization": "token test-token"}


def load_shared_json(*parts: str) -> Any:
    """A JSON file of ../shared (GitHub's API descriptions); skips the test when it is absent."""
    path = SHARED_DIR.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"../shared is absent: {path} is needed for this test")
    return json.loads(path.read_text())


# -- a small OpenAPI 3.0 checker: required properties, types and nullability, recursively -----


def schema_errors(schema: Mapping[str, Any], value: Any, where: str = "$") -> list[str]:
    """Return where `value` breaks `schema` (required, type, nullable; nested)."""
    if value is None:
        if schema.get("nullable") or not schema.get("type"):
            return []
        return [f"{where}: null where {schema.get('type')} is required"]
    errors: list[str] = []
    for part in schema.get("allOf", []):
        errors += schema_errors(part, value, where)
    for key in ("anyOf", "oneOf"):
        if key in schema and all(schema_errors(part, value, where) for part in schema[key]):
            errors.append(f"{where}: matches none of {key}")
    kind = schema.get("type")
    checks = {
        "object": lambda item: isinstance(item, dict),
        "array": lambda item: isinstance(item, list),
        "string": lambda item: isinstance(item, str),
        "integer": lambda item: isinstance(item, int) and not isinstance(item, bool),
        "number": lambda item: isinstance(item, int | float) and not isinstance(item, bool),
        "boolean": lambda item: isinstance(item, bool),
    }
    if kind in checks and not checks[kind](value):
        return [*errors, f"{where}: {type(value).__name__} is not {kind}"]
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where}: missing required {name!r}")
        for name, subschema in schema.get("properties", {}).items():
            if name in value:
                errors += schema_errors(subschema, value[name], f"{where}.{name}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{where}[{index}]")
    return errors


def response_schema(spec: Mapping[str, Any], method: str, path: str, status: int) -> Any:
    response = spec["paths"][path][method.lower()]["responses"][str(status)]
    return response["content"]["application/json"]["schema"]


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    body: Any = None,
    headers: Mapping[str, str] = TOKEN,
) -> tuple[int, Any, Mapping[str, str]]:
    async with http.request(method, url, json=body, headers=dict(headers)) as response:
        return response.status, await response.json(), response.headers
