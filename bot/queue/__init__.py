"""The queue in PostgreSQL, the one source of truth: jobs, chunks, leases, history, findings."""
