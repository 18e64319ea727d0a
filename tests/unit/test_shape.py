"""Shape checks of webhook identifiers and the escaping of echoed payload text (pure)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from bot.errors import WebhookError
from bot.intake.normalize import Closed, Commands
from bot.intake.shape import check_shape
from bot.logsafe import escaped
from bot.model import Level, ReviewRequest
from bot.obs.alerts import WaitingJob, render_alert_message

GOOD = ReviewRequest(
    forge="github",
    repo="acme/api.v2_x-y",
    number=7,
    title="t",
    author="octo-cat",
    author_is_bot=False,
    base_ref="main",
    head_ref="feature/émoji-ok",
    base_sha="b" * 40,
    head_sha="a" * 64,
    event="pull_request",
    action="opened",
)


def test_well_formed_requests_pass() -> None:
    check_shape(GOOD)
    check_shape(dataclasses.replace(GOOD, forge="gitlab", repo="group/sub/project", base_sha=""))
    check_shape(Closed(forge="gitlab", repo="a/b", number=1, reason="closed"))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"head_sha": "a" * 5000}, "pull_request.head.sha"),
        ({"head_sha": "g" * 40}, "pull_request.head.sha"),
        ({"head_sha": "a" * 41}, "pull_request.head.sha"),
        ({"base_sha": ""}, "pull_request.base.sha"),
        ({"repo": "/x"}, "repository.full_name"),
        ({"repo": "x"}, "repository.full_name"),
        ({"repo": "acme/x<script>alert(1)</script>"}, "repository.full_name"),
        ({"repo": "acme/.."}, "repository.full_name"),
        ({"repo": "a" * 40 + "/x"}, "repository.full_name"),
        ({"repo": "acme/" + "x" * 101}, "repository.full_name"),
        ({"repo": "a/b/c"}, "repository.full_name"),
        ({"head_ref": "x" * 256}, "pull_request.head.ref"),
        ({"base_ref": ""}, "pull_request.base.ref"),
        ({"base_ref": "main\nINFO forged"}, "pull_request.base.ref"),
        ({"author": ""}, "pull_request.user.login"),
    ],
)
def test_bad_github_fields_are_400_naming_the_field(change: dict[str, str], field: str) -> None:
    with pytest.raises(WebhookError) as caught:
        check_shape(dataclasses.replace(GOOD, **change))  # type: ignore[arg-type]
    assert caught.value.status == 400
    assert str(caught.value).startswith(f"field {field} ")
    assert "<" not in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("repo", "valid"),
    [
        ("group/project", True),
        ("a/b/c/d", True),
        ("/".join(["g"] * 21), True),
        ("/".join(["g"] * 22), False),
        ("project", False),
        ("group//project", False),
        ("group/-project", False),
        ("group/pro ject", False),
    ],
)
def test_gitlab_paths(repo: str, valid: bool) -> None:
    request = dataclasses.replace(GOOD, forge="gitlab", repo=repo, base_sha="")
    if valid:
        check_shape(request)
    else:
        with pytest.raises(WebhookError, match=r"^field project\.path_with_namespace "):
            check_shape(request)


def test_commands_check_repo_and_commenter() -> None:
    commands = Commands(
        forge="github", repo="acme/api", number=1, author="", comment_id=1, commands=()
    )
    with pytest.raises(WebhookError, match=r"^field comment\.user\.login "):
        check_shape(commands)
    with pytest.raises(WebhookError, match=r"^field repository\.full_name "):
        check_shape(dataclasses.replace(commands, author="x", repo="no-owner"))


def test_escaped_keeps_plain_text_and_escapes_the_rest() -> None:
    assert escaped("acme/api-1.2_x") == "acme/api-1.2_x"
    assert escaped("x<script>\n\x1b[31m") == "x\\x3cscript\\x3e\\x0a\\x1b[31m"
    assert escaped("é\u202e😀") == "\\xe9\\u202e\\U0001f600"
    assert escaped("a\\x41") == "a\\x5cx41"  # a literal backslash cannot fake an escape
    assert escaped("y" * 500, limit=10) == "yyyyyyy..."
    assert escaped(42) == "42"


def test_alert_lines_escape_the_repository_name() -> None:
    job = WaitingJob(
        job_id=3,
        level=Level.P0,
        ready_at=datetime(2026, 1, 5, tzinfo=UTC),
        forge="github",
        repo="acme/x<script>alert(1)</script>\nfake line",
        number=9,
    )
    message = render_alert_message(job, waited_s=400, threshold_s=300)
    assert "<script>" not in message and "\n" not in message
    assert "acme/x\\x3cscript\\x3ealert(1)\\x3c/script\\x3e\\x0afake line#9" in message
