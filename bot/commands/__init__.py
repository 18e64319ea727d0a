"""Slash commands on a pull request: parsed at intake, decided by policy, run by a worker."""
