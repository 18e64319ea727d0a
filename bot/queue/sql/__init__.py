"""Every SQL statement review-bot runs, named, one module per concern, each with its intent.

jobs (intake, planning, levels, ending), posting (finished jobs' claims and retries), chunks
(the dequeue and leases), history, findings, commands (the command inbox), status (the status
publisher), budget (the forge write budget), monitoring (metrics, alerts, presence, dashboard),
reports (`bot report`), guarantees (`bot check`) and connection (what every connection runs).

Statements take every value as a bound parameter (`now` too: the clock is the caller's); where
a column must vary, each variant is its own named statement. Nothing here runs SQL: the
connector (bot/queue/connector.py) does.
"""

from __future__ import annotations

from sqlalchemy import TextClause, text


def statement(sql: str) -> TextClause:
    """One named statement (the only place a SQL string becomes something to execute)."""
    return text(sql)
