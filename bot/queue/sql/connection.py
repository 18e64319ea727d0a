"""The SQL any connection runs, whatever it works on: wake-ups, a liveness check, a snapshot."""

from __future__ import annotations

from bot.queue.sql import statement

# Wake the listeners of one channel (delivered when the transaction commits).
NOTIFY = statement("SELECT pg_notify(:channel, :payload)")

# Wake the listeners of each channel in $1, in a transaction that writes nothing else (so its
# commit waits for no WAL flush: bot/queue/wakeups.py). asyncpg's own placeholder: it runs on
# the connector's wake-up connection, outside SQLAlchemy.
WAKE_CHANNELS = "SELECT pg_notify(channel, 'wake') FROM unnest($1::text[]) AS channel"

# Whether the database answers at all.
PING = statement("SELECT 1")

# One consistent, read-only view for a set of reads (`bot check` judges them together).
READ_ONLY_SNAPSHOT = statement("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
