"""A loopback GitHub and GitLab for tests, the demo and `bot emulator`: real routes, real errors.

state.py holds what the forges know; github.py and gitlab.py answer their REST subsets,
quiet.py and checks.py the routes of quiet reviews and check runs; app.py routes, authenticates
and injects faults; webhooks.py builds and sends the events; control.py runs it on a port.
Its control API (/_emulator/): manage.py holds PRs from outside and lists what was posted,
outside.py pushes, sets files and comments (pushes.py: history kept, so compares are real;
hooks.py: the webhook each change sends), activity.py shows what is on a PR or a commit.
Only the CLI, the demo and the tests import it (an import-linter contract).
"""

from __future__ import annotations

from bot.emulator.control import ForgeEmulator, run_emulator, seed_examples, serve_emulator
from bot.emulator.diffs import generate_file_changes, generate_patch
from bot.emulator.github import seed_issue_comment
from bot.emulator.gitlab import seed_note
from bot.emulator.http import GITHUB_REPO, GITLAB_MR
from bot.emulator.state import (
    SECONDARY_LIMIT_MESSAGE,
    EmulatedPull,
    EmulatorState,
    Fault,
    Record,
    Version,
)
from bot.emulator.webhooks import (
    WebhookDelivery,
    build_github_issue_comment_event,
    build_github_pull_request_event,
    build_gitlab_merge_request_event,
    build_gitlab_note_event,
    github_pull_request_hook,
    gitlab_merge_request_hook,
    send_webhook,
    sign_github_payload,
    webhook_headers,
)

__all__ = [
    "GITHUB_REPO",
    "GITLAB_MR",
    "SECONDARY_LIMIT_MESSAGE",
    "EmulatedPull",
    "EmulatorState",
    "Fault",
    "ForgeEmulator",
    "Record",
    "Version",
    "WebhookDelivery",
    "build_github_issue_comment_event",
    "build_github_pull_request_event",
    "build_gitlab_merge_request_event",
    "build_gitlab_note_event",
    "generate_file_changes",
    "generate_patch",
    "github_pull_request_hook",
    "gitlab_merge_request_hook",
    "run_emulator",
    "seed_examples",
    "seed_issue_comment",
    "seed_note",
    "send_webhook",
    "serve_emulator",
    "sign_github_payload",
    "webhook_headers",
]
