"""Replay: a trace of review requests run through the real queue and scheduler, virtual clock."""
