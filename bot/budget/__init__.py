"""One write budget per forge identity, shared by every process (bot/budget/ledger.py)."""
