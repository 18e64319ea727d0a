"""The README's "Try it by hand", as a user runs it: `bot emulator --bot-url` and `bot serve`
as real processes, driven only over HTTP: a pull request opened, pushed to (an incremental
review, the living summary edited), force-pushed (a full review that says why), settings set on
the default branch and a person's `/review full` comment; the same push on a GitLab merge
request."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.support.serving import REPO_ROOT, free_port, start_serve, wait_until

pytestmark = pytest.mark.slow

SECRET = "try-by-hand-secret"
BASE = {"shop/orders.py": "def load(path):\n    return open(path).read()\n"}
HEAD = {
    "shop/orders.py": "def load(path):\n    with open(path) as f:\n        return f.read()\n",
    "shop/report.py": "def report(total):\n    print(total)\n",
}


async def listening(port: int, process: asyncio.subprocess.Process) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        assert process.returncode is None, f"the process on port {port} exited early"
        return False
    writer.close()
    await writer.wait_closed()
    return True


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[str]:
    """`bot emulator` and `bot serve` as subprocesses; yields the emulator's base URL."""
    emulator_port, bot_port = free_port(), free_port()
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "GITHUB_WEBHOOK_SECRET": SECRET,
        "GITLAB_WEBHOOK_TOKEN": SECRET,
        "GITHUB_TOKEN": "ghp-by-hand",
        "GITLAB_TOKEN": "glpat-by-hand",
        "GITHUB_API_URL": f"http://127.0.0.1:{emulator_port}",
        "GITLAB_URL": f"http://127.0.0.1:{emulator_port}",
        "REVIEW_BOT_LLM": "simulated",
        "REVIEW_BOT_WORKERS": "2",
        "PYTHONPATH": str(REPO_ROOT),
    }
    emulator = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "emulator",
        "--port",
        str(emulator_port),
        "--bot-url",
        f"http://127.0.0.1:{bot_port}",
        env=env,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    serve = await start_serve("all", port=bot_port, env=env)
    try:
        await wait_until(
            lambda: listening(emulator_port, emulator), timeout_s=60, what="bot emulator"
        )
        await wait_until(lambda: listening(bot_port, serve), timeout_s=60, what="bot serve")
        yield f"http://127.0.0.1:{emulator_port}"
    finally:
        for process in (serve, emulator):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        outputs = [await asyncio.wait_for(p.communicate(), timeout=60) for p in (serve, emulator)]
    assert serve.returncode == 0, outputs[0][1].decode()
    banner = outputs[1][0].decode()
    assert f"webhooks of those changes go to http://127.0.0.1:{bot_port}" in banner


async def control(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> dict[str, Any]:
    async with http.request(method, url, json=body) as answer:
        data = await answer.json()
        assert answer.status in (200, 201), data
        return dict(data)


async def summary_saying(http: aiohttp.ClientSession, view_url: str, text: str) -> dict[str, Any]:
    """Wait until the bot's summary comment says `text`; returns the pull request's activity."""
    seen: dict[str, Any] = {}

    async def said() -> bool:
        seen.update(await control(http, "GET", view_url))
        return any(
            comment["author"].startswith("review-bot") and text in comment["body"]
            for comment in seen["comments"]
        )

    await wait_until(said, timeout_s=60, what=f"a summary saying {text!r}")
    return seen


def summaries(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in view["comments"] if "review-bot:summary" in c["body"]]


async def test_try_it_by_hand_on_github_and_gitlab(running: str) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        where = {"repo": "acme/shop", "number": 7}
        view_url = f"{running}/_emulator/activity?repo=acme/shop&number=7"
        opened = await control(
            http, "POST", f"{running}/_emulator/prs", {**where, "base": BASE, "head": HEAD}
        )
        [sent] = opened["webhooks"]
        assert sent["delivered"]["status"] == 202, sent
        assert sent["delivered"]["answer"]["level"] == "P1"
        first_head = opened["prs"][0]["head_sha"]
        view = await summary_saying(http, view_url, "full review: the first review")
        [first_review] = view["reviews"]
        assert first_review["commit_id"] == first_head
        # The commit status follows the review to its end, listed per commit.
        on_head = f"{view_url}&sha={first_head}"

        async def status_done() -> bool:
            statuses = (await control(http, "GET", on_head))["statuses"]
            return bool(statuses) and statuses[-1]["state"] == "success"

        await wait_until(status_done, timeout_s=60, what="the commit status to say success")

        # A push: reviewed incrementally, the one summary edited in place.
        edited = HEAD["shop/orders.py"].replace("f.read()", "f.read().strip()")
        pushed = await control(
            http,
            "POST",
            f"{running}/_emulator/push",
            {**where, "files": {"shop/orders.py": edited}},
        )
        assert pushed["delivered"]["status"] == 202
        view = await summary_saying(http, view_url, f"incremental, since `{first_head[:12]}`")
        [summary] = summaries(view)
        assert summary["edited"] and "1 file unchanged since the last review" in summary["body"]

        # A force-push: the old head is gone from the history, so the review is a full one.
        forced = await control(http, "POST", f"{running}/_emulator/push", {**where, "force": True})
        assert forced["kind"] == "force-push"
        await summary_saying(
            http, view_url, f"history was rewritten: `{pushed['after'][:12]}` is no longer"
        )

        # Settings on the default branch, then a person asks for a full review.
        settings = 'version: 1\npaths:\n  exclude: ["shop/report.py"]\n'
        await control(
            http,
            "PUT",
            f"{running}/_emulator/files",
            {"repo": "acme/shop", "files": {".review-bot.yaml": settings}},
        )
        asked = await control(
            http,
            "POST",
            f"{running}/_emulator/comments",
            {**where, "author": "octocat", "body": "/review full"},
        )
        assert asked["delivered"]["status"] == 200
        assert asked["delivered"]["answer"]["commands"][0]["argument"] == "full"
        view = await summary_saying(http, view_url, "excluded by .review-bot.yaml")
        assert "a full review was asked for" in summaries(view)[0]["body"]
        replies = [c for c in view["comments"] if "Queued a new review" in c["body"]]
        assert len(replies) == 1
        # The bot reacted to the comment (before, the comment did not exist on the forge: 404).
        posted = await control(http, "GET", f"{running}/_emulator/posted?kind=reaction")
        assert [item["data"]["comment_id"] for item in posted["posted"]] == [asked["id"]]

        # GitLab: the same push on a merge request.
        mr = {"forge": "gitlab", "repo": "acme/platform/api", "number": 7}
        mr_view = f"{running}/_emulator/activity?forge=gitlab&repo=acme/platform/api&number=7"
        opened = await control(
            http, "POST", f"{running}/_emulator/prs", {**mr, "base": BASE, "head": HEAD}
        )
        mr_head = opened["prs"][0]["head_sha"]
        await summary_saying(http, mr_view, "full review: the first review")
        await control(
            http, "POST", f"{running}/_emulator/push", {**mr, "files": {"shop/orders.py": edited}}
        )
        view = await summary_saying(http, mr_view, f"incremental, since `{mr_head[:12]}`")
        assert len(summaries(view)) == 1
