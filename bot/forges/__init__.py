"""Forge clients: GitHub (gidgethub) and GitLab (python-gitlab) behind one ForgeClient protocol."""
