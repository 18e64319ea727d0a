"""The forge calls quiet reviews need: the one living summary, inline findings, resolving them.

Each adapter goes through its client's one call path (auth, pacing, error translation,
retries), so these calls behave exactly like the client's own.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import quote

import gitlab

from bot.budget.decide import WriteValue
from bot.errors import ForgeError, ForgeNotFound
from bot.forges.base import (
    SUMMARY_MARKER,
    ForgeClient,
    PullChanges,
    ReviewToPost,
    append_marker,
)
from bot.forges.github import GitHubClient, split_repo
from bot.forges.gitlab import GitLabClient, build_position, file_change_from_gitlab, gitlab_body
from bot.increment import Increment, full_review, narrow_by_compare, narrow_by_versions

log = logging.getLogger(__name__)

# GitHub's compare lists at most this many files.
COMPARE_FILE_LIMIT = 300


@dataclass(frozen=True, slots=True)
class SummaryComment:
    """The pull request's living summary as the forge holds it."""

    id: int
    body: str


@dataclass(frozen=True, slots=True)
class SettingsFile:
    """A file on the repository's default branch: its blob sha and text."""

    blob_sha: str
    text: str


@dataclass(frozen=True, slots=True)
class PostedFindings:
    """What posting inline findings did: a forge reference per placed comment, by index."""

    refs: Mapping[int, str | None]
    rejected: tuple[int, ...] = ()
    review_id: int | None = None
    already_posted: bool = False


class QuietForge(Protocol):
    """Summary, inline findings and resolution on one forge."""

    async def find_summary(self, repo: str, number: int) -> SummaryComment | None: ...

    async def create_summary(self, repo: str, number: int, body: str) -> int: ...

    async def edit_summary(self, repo: str, number: int, comment_id: int, body: str) -> None: ...

    async def list_summaries(self, repo: str, number: int) -> list[SummaryComment]:
        """Every summary comment on the pull request, oldest first."""
        ...

    async def delete_summary(self, repo: str, number: int, comment_id: int) -> None: ...

    async def post_findings(
        self, repo: str, number: int, review: ReviewToPost
    ) -> PostedFindings: ...

    async def resolve_finding(self, repo: str, number: int, ref: str) -> bool: ...

    async def increment_since(
        self, repo: str, number: int, *, since: str, changes: PullChanges
    ) -> Increment: ...

    async def read_default_file(self, repo: str, path: str) -> SettingsFile | None: ...


def with_summary_marker(body: str) -> str:
    """The summary body with its hidden marker first (found again after a crash)."""
    return body if SUMMARY_MARKER in body else f"{SUMMARY_MARKER}\n{body}"


class GitHubQuiet:
    """GitHub: the summary is an issue comment; findings go out as one review."""

    def __init__(self, client: GitHubClient) -> None:
        self.client = client

    async def find_summary(self, repo: str, number: int) -> SummaryComment | None:
        """Our summary comment on the PR (by its marker), or None."""
        found = await self._summaries(repo, number, first_only=True)
        return found[0] if found else None

    async def _summaries(self, repo: str, number: int, *, first_only: bool) -> list[SummaryComment]:
        """The PR's summary comments (by their marker) in the order GitHub lists them; the
        first one only (no further pages read) with `first_only`."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "number": str(number)}
        api = self.client._api

        async def search(token: str) -> list[SummaryComment]:
            found: list[SummaryComment] = []
            async for item in api.getiter(
                "/repos/{owner}/{repo}/issues/{number}/comments?per_page=100",
                url_vars,
                oauth_token=token,
            ):
                body = str(item.get("body") or "")
                if SUMMARY_MARKER in body:
                    found.append(SummaryComment(int(item["id"]), body))
                    if first_only:
                        break
            return found

        action = "find_summary" if first_only else "list_summaries"
        return await self.client._call(action, search, repo=repo)

    async def create_summary(self, repo: str, number: int, body: str) -> int:
        """Post the summary comment; a retried POST looks for it first."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "number": str(number)}
        api = self.client._api

        async def create(token: str) -> int:
            answer = await api.post(
                "/repos/{owner}/{repo}/issues/{number}/comments",
                url_vars,
                data={"body": with_summary_marker(body)},
                oauth_token=token,
            )
            return int(answer["id"])

        async def recheck() -> int | None:
            found = await self.find_summary(repo, number)
            return found.id if found is not None else None

        return await self.client._call(
            "create_summary", create, repo=repo, write=WriteValue.FIRST_SUMMARY, recheck=recheck
        )

    async def edit_summary(self, repo: str, number: int, comment_id: int, body: str) -> None:
        """Edit the summary comment in place (no notification for an edit)."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "comment_id": str(comment_id)}
        api = self.client._api

        async def edit(token: str) -> None:
            await api.patch(
                "/repos/{owner}/{repo}/issues/comments/{comment_id}",
                url_vars,
                data={"body": with_summary_marker(body)},
                oauth_token=token,
            )

        await self.client._call("edit_summary", edit, repo=repo, write=WriteValue.SUMMARY_EDIT)

    async def list_summaries(self, repo: str, number: int) -> list[SummaryComment]:
        """Every summary comment on the PR (by its marker), oldest first."""
        found = await self._summaries(repo, number, first_only=False)
        return sorted(found, key=lambda item: item.id)

    async def delete_summary(self, repo: str, number: int, comment_id: int) -> None:
        """Delete a summary comment (one written twice)."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "comment_id": str(comment_id)}
        api = self.client._api

        async def delete(token: str) -> None:
            await api.delete(
                "/repos/{owner}/{repo}/issues/comments/{comment_id}", url_vars, oauth_token=token
            )

        await self.client._call("delete_summary", delete, repo=repo, write=WriteValue.SUMMARY_EDIT)

    async def post_findings(self, repo: str, number: int, review: ReviewToPost) -> PostedFindings:
        """One review with the inline comments (the client's idempotent post)."""
        posted = await self.client.post_review(repo, number, review)
        rejected = posted.rejected
        if posted.summary_only and not rejected:
            rejected = tuple(range(len(review.comments)))
        refs = {index: None for index in range(len(review.comments)) if index not in rejected}
        return PostedFindings(
            refs=refs,
            rejected=rejected,
            review_id=posted.id,
            already_posted=posted.already_posted,
        )

    async def resolve_finding(self, repo: str, number: int, ref: str) -> bool:
        """GitHub has no resolving by REST: the summary says it is resolved."""
        return False

    async def increment_since(
        self, repo: str, number: int, *, since: str, changes: PullChanges
    ) -> Increment:
        """The PR's hunks the compare of `since` with the head touches (its files only)."""
        owner, name = split_repo(repo)
        url_vars = {
            "owner": owner,
            "repo": name,
            "basehead": f"{since}...{changes.head_sha}",
        }
        api = self.client._api

        async def compare(token: str) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                await api.getitem(
                    "/repos/{owner}/{repo}/compare/{basehead}", url_vars, oauth_token=token
                ),
            )

        try:
            answer = await self.client._call("compare", compare, repo=repo)
        except ForgeNotFound:
            return full_review(changes.files, f"`{since[:12]}` is gone from the repository")
        files = answer.get("files") or ()
        if len(files) >= COMPARE_FILE_LIMIT:
            # Files past GitHub's limit are not listed: they would look unchanged.
            reason = f"the change since `{since[:12]}` is over GitHub's compare file limit"
            return full_review(changes.files, reason)
        compared = {
            str(item["filename"]): (str(item["patch"]) if item.get("patch") else None)
            for item in files
        }
        return narrow_by_compare(
            changes.files, since=since, status=str(answer.get("status")), compared=compared
        )

    async def read_default_file(self, repo: str, path: str) -> SettingsFile | None:
        """A file of the default branch (contents API), or None when there is none."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "path": path}
        api = self.client._api

        async def read(token: str) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                await api.getitem(
                    "/repos/{owner}/{repo}/contents/{path}", url_vars, oauth_token=token
                ),
            )

        try:
            answer = await self.client._call("read_contents", read, repo=repo)
        except ForgeNotFound:
            return None
        if answer.get("type") != "file":
            return None
        return SettingsFile(str(answer["sha"]), _decoded(str(answer.get("content") or ""), path))


def _decoded(content: str, path: str) -> str:
    try:
        return base64.b64decode(content).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise ForgeError(f"{path} on the default branch is not UTF-8 text: {exc}") from exc


class GitLabQuiet:
    """GitLab: the summary is a note; each finding is a discussion the bot resolves itself."""

    def __init__(self, client: GitLabClient) -> None:
        self.client = client

    def _base(self, repo: str, number: int) -> str:
        return f"/projects/{self.client._project(repo)}/merge_requests/{number}"

    async def find_summary(self, repo: str, number: int) -> SummaryComment | None:
        """Our summary note on the MR (by its marker), or None."""
        found = await self._summaries(repo, number)
        return found[0] if found else None

    async def _summaries(self, repo: str, number: int) -> list[SummaryComment]:
        """The MR's summary notes (by their marker), in the order GitLab lists them."""
        return [
            SummaryComment(int(note["id"]), str(note.get("body") or ""))
            for note in await self.client._list_notes(repo, number)
            if SUMMARY_MARKER in str(note.get("body") or "") and note.get("type") != "DiffNote"
        ]

    async def create_summary(self, repo: str, number: int, body: str) -> int:
        """Post the summary note; a retried POST looks for it first."""
        path = f"{self._base(repo, number)}/notes"
        marked = with_summary_marker(body)

        def create(gl: gitlab.Gitlab) -> int:
            answer = gl.http_post(path, post_data={"body": marked}, obey_rate_limit=False)
            return int(cast(dict[str, Any], answer)["id"])

        async def recheck() -> int | None:
            found = await self.find_summary(repo, number)
            return found.id if found is not None else None

        return await self.client._call(
            "create_summary", create, write=WriteValue.FIRST_SUMMARY, recheck=recheck
        )

    async def edit_summary(self, repo: str, number: int, comment_id: int, body: str) -> None:
        """Edit the summary note in place."""
        path = f"{self._base(repo, number)}/notes/{comment_id}"
        marked = with_summary_marker(body)

        def edit(gl: gitlab.Gitlab) -> None:
            gl.http_put(path, post_data={"body": marked}, obey_rate_limit=False)

        await self.client._call("edit_summary", edit, write=WriteValue.SUMMARY_EDIT)

    async def list_summaries(self, repo: str, number: int) -> list[SummaryComment]:
        """Every summary note on the MR (by its marker), oldest first."""
        return sorted(await self._summaries(repo, number), key=lambda item: item.id)

    async def delete_summary(self, repo: str, number: int, comment_id: int) -> None:
        """Delete a summary note (one written twice)."""
        await self.client.delete_note(repo, number, comment_id, write=WriteValue.SUMMARY_EDIT)

    async def post_findings(self, repo: str, number: int, review: ReviewToPost) -> PostedFindings:
        """One discussion per finding on its diff line; what a retry finds posted is kept."""
        existing: dict[tuple[str, str | None], str] = {}
        found = [] if review.first_attempt else await self.client.list_discussions(repo, number)
        for discussion in found:
            notes = discussion.get("notes") or []
            if notes:
                first = notes[0]
                position = first.get("position") or {}
                key = (str(first.get("body") or ""), position.get("new_path"))
                existing[key] = str(discussion["id"])
        base_sha, start_sha, head_sha = await self.client._shas(repo, number, review)
        lines, old_paths = await self.client._positions_for(repo, number, head_sha, review)
        refs: dict[int, str | None] = {}
        rejected: list[int] = []
        for index, comment in enumerate(review.comments):
            body = append_marker(gitlab_body(comment), review.job_id)
            known = existing.get((body, comment.path))
            if known is not None:
                refs[index] = known
                continue
            position = build_position(
                comment,
                base_sha=base_sha,
                start_sha=start_sha,
                head_sha=head_sha,
                lines=lines.get(comment.path),
                old_path=old_paths.get(comment.path),
            )

            try:
                refs[index] = await self.client.open_discussion_once(
                    repo, number, body, position, file_path=comment.path, review=review
                )
            except ForgeError as exc:
                if exc.status != 400:
                    raise
                log.warning(
                    "GitLab refused a position on %s:%s for job %s: %s",
                    comment.path,
                    comment.line,
                    review.job_id,
                    exc,
                    extra={"action": "finding_position_refused", "job_id": review.job_id},
                )
                rejected.append(index)
        return PostedFindings(refs=refs, rejected=tuple(rejected))

    async def resolve_finding(self, repo: str, number: int, ref: str) -> bool:
        """Resolve the bot's own discussion of a finding whose code is gone."""
        path = f"{self._base(repo, number)}/discussions/{ref}"

        def resolve(gl: gitlab.Gitlab) -> None:
            gl.http_put(path, post_data={"resolved": True}, obey_rate_limit=False)

        await self.client._call("resolve_discussion", resolve, write=WriteValue.SUMMARY_EDIT)
        return True

    async def increment_since(
        self, repo: str, number: int, *, since: str, changes: PullChanges
    ) -> Increment:
        """The MR's hunks its diff version of `since` did not show; full if history changed."""
        project = self.client._project(repo)
        base = self._base(repo, number)

        def merge_base(gl: gitlab.Gitlab) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                gl.http_get(
                    f"/projects/{project}/repository/merge_base",
                    query_data={"refs[]": [since, changes.head_sha]},
                    obey_rate_limit=False,
                ),
            )

        def versions(gl: gitlab.Gitlab) -> list[dict[str, Any]]:
            return cast(
                list[dict[str, Any]],
                gl.http_list(f"{base}/versions", get_all=True, obey_rate_limit=False),
            )

        try:
            found = await self.client._call("merge_base", merge_base)
        except ForgeNotFound:
            return full_review(changes.files, f"`{since[:12]}` is gone from the repository")
        except ForgeError as exc:
            if exc.status != 400:
                raise
            return full_review(changes.files, f"`{since[:12]}` is gone from the repository")
        ancestor = str(found.get("id") or "") == since
        if not ancestor:
            return narrow_by_versions(changes.files, since=since, ancestor=False, previous={})
        version = next(
            (
                item
                for item in await self.client._call("fetch_versions", versions)
                if item.get("head_commit_sha") == since
            ),
            None,
        )
        if version is None:
            return full_review(
                changes.files, f"`{since[:12]}` is not among the merge request's diff versions"
            )

        def version_diffs(gl: gitlab.Gitlab) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                gl.http_get(f"{base}/versions/{version['id']}", obey_rate_limit=False),
            )

        detail = await self.client._call("fetch_version", version_diffs)
        previous = {
            change.path: change.patch
            for change in (file_change_from_gitlab(item) for item in detail.get("diffs") or ())
        }
        return narrow_by_versions(changes.files, since=since, ancestor=True, previous=previous)

    async def read_default_file(self, repo: str, path: str) -> SettingsFile | None:
        """A file of the default branch (repository files API), or None when there is none."""
        project = self.client._project(repo)
        encoded = quote(path, safe="")

        def read(gl: gitlab.Gitlab) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                gl.http_get(
                    f"/projects/{project}/repository/files/{encoded}",
                    query_data={"ref": "HEAD"},
                    obey_rate_limit=False,
                ),
            )

        try:
            answer = await self.client._call("read_file", read)
        except ForgeNotFound:
            return None
        return SettingsFile(
            str(answer["blob_id"]), _decoded(str(answer.get("content") or ""), path)
        )


def quiet_forge_for(client: ForgeClient) -> QuietForge | None:
    """The quiet-review adapter of a configured forge client, or None for another kind."""
    if isinstance(client, GitHubClient):
        return GitHubQuiet(client)
    if isinstance(client, GitLabClient):
        return GitLabQuiet(client)
    return None


__all__ = [
    "SUMMARY_MARKER",
    "GitHubQuiet",
    "GitLabQuiet",
    "PostedFindings",
    "QuietForge",
    "SettingsFile",
    "SummaryComment",
    "quiet_forge_for",
    "with_summary_marker",
]
