"""The SQL any connection runs, whatever it works on: wake-ups, a liveness check, a snapshot."""

from __future__ import annotations

from bot.queue.sql import statement

# Wake the listeners of one channel (delivered when the transaction commits).
NOTIFY = statement("SELECT pg_notify(:channel, :payload)")

# Whether the database answers at all.
PING = statement("SELECT 1")

# One consistent, read-only view for a set of reads (`bot check` judges them together).
READ_ONLY_SNAPSHOT = statement("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
