"""The admin reports' queries: each named report is one read-only statement over the
report views (bot/queue/sql/reports.py); bot.obs.reports shapes and judges the rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import TextClause

from bot.queue.connector import Connector
from bot.queue.sql import reports as sql

STATEMENTS: Mapping[str, TextClause] = {
    "waits": sql.WAITS,
    "durations": sql.DURATIONS,
    "workers": sql.WORKERS,
    "engines": sql.ENGINES,
    "repos": sql.REPOS,
    "largest": sql.LARGEST,
    "commands": sql.COMMANDS,
    "failures": sql.FAILURES,
    "alerts": sql.ALERTS,
}


class ReportQueries:
    """The store's part for reports: runs a named report's statement read-only."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector

    async def run(self, name: str, parameters: Mapping[str, Any]) -> list[Any]:
        """The rows of report `name` (one of STATEMENTS); `parameters` may hold more than the
        statement binds. Raises KeyError for an unknown name, StoreError when refused."""
        statement = STATEMENTS[name]
        used = {key: value for key, value in parameters.items() if f":{key}" in str(statement)}
        return await self.connector.fetch_read_only(statement, used)
