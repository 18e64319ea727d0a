"""GitLab client over python-gitlab (synchronous, so every call runs in a thread)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import quote

import gitlab
import gitlab.exceptions
import requests

from bot.budget.decide import WriteValue
from bot.budget.ledger import BudgetKey, LocalWriteBudget, WriteBudget, token_name
from bot.errors import ForgeError, ForgeNotFound, LeaseLost
from bot.forges.base import (
    MAX_FILES,
    READ_RETRY,
    Clock,
    DiffLines,
    ForgeAuthRefused,
    ForgePermissionDenied,
    InlineComment,
    Permission,
    PostedReview,
    PullChanges,
    Reaction,
    RetryPolicy,
    ReviewToPost,
    Sleep,
    always_held,
    append_marker,
    check_write_guard,
    count_patch_lines,
    find_marker,
    guarded_writes,
    parse_diff_lines,
    render_marker,
    render_summary_only,
    retry_forge_call,
    utc_now,
    with_suggestion,
    write_guard_holds,
)
from bot.forges.blobs import BlobCache, decode_text
from bot.forges.gitlab_files import BLOBS_QUERY, blobs_answered, blobs_variables, graphql_url
from bot.forges.gitlab_files import MAX_FILES_PER_QUERY as GRAPHQL_FILES_PER_QUERY
from bot.forges.statuses import (
    GITLAB_DESCRIPTION_LIMIT,
    STATUS_NAME,
    StatusUpdate,
    StatusWritten,
    gitlab_commit_state,
    shorten,
    status_value,
)
from bot.model import FileChange
from bot.retry import parse_retry_after

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Blob ids remembered by (project, commit, path), the oldest forgotten first.
MAX_BLOB_IDS = 20_000

# GitLab award emoji names for the reactions the bot uses.
AWARD_NAMES: Mapping[str, str] = {
    "eyes": "eyes",
    "+1": "thumbsup",
    "-1": "thumbsdown",
    "confused": "confused",
}


def permission_from_access_level(level: int) -> Permission:
    """Map a GitLab member access level to the GitHub-style role the command rules use."""
    if level >= 50:
        return "admin"
    if level >= 40:
        return "maintain"
    if level >= 30:
        return "write"
    if level >= 20:
        return "triage"
    if level > 0:
        return "read"
    return "none"


def translate_gitlab_error(
    exc: gitlab.exceptions.GitlabError, *, headers: Mapping[str, str], clock: Clock
) -> ForgeError:
    """Map a python-gitlab error to our error family (the one place this happens)."""
    status = exc.response_code
    message = f"GitLab answered {status}: {exc.error_message}"
    if status is None:
        return ForgeError(f"GitLab call failed: {exc}")
    if status == 404:
        return ForgeNotFound(message, status=404)
    if status == 429:
        return ForgeError(message, status=429, retry_after=parse_retry_after(headers, now=clock()))
    if status == 401:
        return ForgeAuthRefused(message, status=401)
    if status == 403:
        return ForgePermissionDenied(message, status=status)
    return ForgeError(message, status=status)


class GitLabClient:
    """The ForgeClient for GitLab, with a personal, project or group access token."""

    def __init__(
        self,
        *,
        url: str = "https://gitlab.com",
        token: str | None = None,
        clock: Clock = utc_now,
        sleep: Sleep = asyncio.sleep,
        retry: RetryPolicy | None = None,
        max_files: int = MAX_FILES,
        per_page: int = 100,
        timeout_s: float = 30.0,
        budget: WriteBudget | None = None,
    ) -> None:
        self._local = threading.local()
        session = requests.Session()
        session.hooks["response"].append(self._remember_headers)
        self._gl = gitlab.Gitlab(url, private_token=token, session=session, timeout=timeout_s)
        self._clock = clock
        self._sleep = sleep
        self._retry = retry or RetryPolicy()
        # Content-creating calls spend from one budget per token, shared when given.
        self._budget: WriteBudget = budget or LocalWriteBudget(now=clock, sleep=sleep)
        self._budget_key = BudgetKey("gitlab", token_name(token, scope=url))
        self._max_files = max_files
        self._per_page = per_page
        self._projects: dict[str, int] = {}
        self._user_ids: dict[str, int] = {}
        self._diffs: dict[tuple[str, int, str], dict[str, DiffLines]] = {}
        # new path -> old path of the renamed files of each MR version seen
        self._old_paths: dict[tuple[str, int, str], dict[str, str]] = {}
        # GitLab before 15.7 has no /merge_requests/:iid/diffs: read /changes there instead
        self._diffs_endpoint = True
        self.blobs = BlobCache()
        # (project, commit, path) -> blob id of the files read at a commit
        self._blob_ids: OrderedDict[tuple[str, str, str], str] = OrderedDict()

    def _remember_headers(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        # GitlabHttpError drops the headers; keep them per thread to read Retry-After.
        self._local.headers = dict(response.headers)

    async def _call(
        self,
        action: str,
        operation: Callable[[gitlab.Gitlab], T],
        *,
        write: WriteValue | None = None,
        recheck: Callable[[], Awaitable[T | None]] | None = None,
        retry: RetryPolicy | None = None,
    ) -> T:
        """Run a synchronous python-gitlab operation in a thread, translating and retrying;
        a content-creating one (`write`: what it is worth) spends from the token's budget.

        `recheck` runs before every retry: what it finds (a POST GitLab stored although its
        answer was lost) is returned instead of posting again.
        """
        attempts = 0

        def run() -> T:
            self._local.headers = {}
            try:
                return operation(self._gl)
            except gitlab.exceptions.GitlabError as exc:
                raise translate_gitlab_error(
                    exc, headers=getattr(self._local, "headers", {}), clock=self._clock
                ) from exc
            except requests.RequestException as exc:
                raise ForgeError(f"GitLab unreachable during {action}: {exc!r}") from exc

        async def attempt() -> T:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and recheck is not None:
                found = await recheck()
                if found is not None:
                    return found
            write_id = None
            if write is not None:
                write_id = await self._budget.spend(self._budget_key, action=action, value=write)
            try:
                await check_write_guard(action)
                return await asyncio.to_thread(run)
            finally:
                if write_id is not None:
                    await self._budget.answered(self._budget_key, write_id)

        async def on_retry(exc: ForgeError) -> None:
            if exc.retry_after is not None and write is not None:
                await self._budget.hold(self._budget_key, exc.retry_after)

        return await retry_forge_call(
            attempt,
            sleep=self._sleep,
            policy=retry or self._retry,
            action=action,
            on_retry=on_retry,
        )

    def use_installation(self, repo: str, installation_id: int | None) -> None:
        """GitLab has no App installations: nothing to remember."""

    def _project(self, repo: str, project_id: int | None = None) -> str:
        if project_id is not None:
            self._projects[repo] = project_id
        known = self._projects.get(repo)
        return str(known) if known is not None else quote(repo, safe="")

    # -- ForgeClient -----------------------------------------------------------------------

    async def fetch_changes(
        self,
        repo: str,
        number: int,
        *,
        project_id: int | None = None,
        installation_id: int | None = None,
    ) -> PullChanges:
        """Read the MR's newest version and its diffs (up to the file cap); raises ForgeNotFound
        only when the MR itself is gone, ForgeError naming the part GitLab would not serve."""
        project = self._project(repo, project_id)
        base = f"/projects/{project}/merge_requests/{number}"
        limit = self._max_files

        def versions(gl: gitlab.Gitlab) -> list[dict[str, Any]]:
            return cast(
                list[dict[str, Any]],
                gl.http_list(f"{base}/versions", get_all=False, obey_rate_limit=False),
            )

        def diffs(gl: gitlab.Gitlab) -> list[dict[str, Any]]:
            pages = gl.http_list(
                f"{base}/diffs",
                iterator=True,
                per_page=self._per_page,
                obey_rate_limit=False,
            )
            return list(itertools.islice(pages, limit + 1))

        overflow = False

        def changes(gl: gitlab.Gitlab) -> list[dict[str, Any]]:
            nonlocal overflow
            answer = cast(dict[str, Any], gl.http_get(f"{base}/changes", obey_rate_limit=False))
            overflow = bool(answer.get("overflow"))  # GitLab listed fewer files than changed
            return list(answer.get("changes") or [])[: limit + 1]

        try:
            found = await self._call("fetch_versions", versions)
        except ForgeNotFound as exc:
            raise await self._explain_not_found(repo, number, exc, what="/versions") from exc
        if not found:
            # GitLab prepares a new MR's diff in the background: not gone, only not ready yet.
            raise ForgeError(f"merge request {repo}!{number} has no diff version yet")
        newest = found[0]
        entries = await self._read_diffs(repo, number, diffs=diffs, changes=changes)
        truncated = len(entries) > limit or overflow
        files = tuple(file_change_from_gitlab(item) for item in entries[:limit])
        head_sha = str(newest["head_commit_sha"])
        self._diffs[(repo, number, head_sha)] = {
            item.path: parse_diff_lines(item.patch) for item in files
        }
        self._old_paths[(repo, number, head_sha)] = {
            item.path: item.previous_path for item in files if item.previous_path
        }
        return PullChanges(
            base_sha=str(newest["base_commit_sha"]),
            head_sha=head_sha,
            start_sha=str(newest["start_commit_sha"]),
            files=files,
            truncated=truncated,
            total_files=None if truncated else len(files),
        )

    async def read_file_at(
        self,
        repo: str,
        path: str,
        *,
        ref: str,
        blob_sha: str | None = None,
        project_id: int | None = None,
        installation_id: int | None = None,
    ) -> str | None:
        """A file's text at commit `ref` (repository files API: content and blob id in one
        answer), cached by blob id; None when it is not there, binary or too large. Raises
        ForgeError."""
        project = self._project(repo, project_id)
        known = self._known_blob(project, ref, path, blob_sha)
        cached = self.blobs.get(known)
        if cached is not None:
            return cached
        encoded = quote(path, safe="")

        def read(gl: gitlab.Gitlab) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                gl.http_get(
                    f"/projects/{project}/repository/files/{encoded}",
                    query_data={"ref": ref},
                    obey_rate_limit=False,
                ),
            )

        try:
            answer = await self._call("read_file", read, retry=READ_RETRY)
        except ForgeNotFound:
            return None
        if answer.get("encoding") != "base64":
            return None
        try:
            data = base64.b64decode(str(answer.get("content") or ""))
        except ValueError:
            return None
        text = decode_text(data)
        blob_id = str(answer.get("blob_id") or "")
        if text is not None and blob_id:
            self._remember_blob(project, ref, path, blob_id, text)
        return text

    async def read_files_at(
        self,
        repo: str,
        paths: Sequence[str],
        *,
        ref: str,
        blob_shas: Mapping[str, str | None],
        installation_id: int | None = None,
    ) -> Mapping[str, str | None]:
        """Each path's text at commit `ref`, in one GraphQL request per hundred files not in
        the blob cache (bot/forges/gitlab_files.py); None for a path that is not there or not
        text. Raises ForgeError when GitLab will not answer the query (an older GitLab, a
        token without the scope): the caller then reads file by file."""
        project = self._project(repo)
        texts, wanted = self.blobs.split(
            paths, lambda path: self._known_blob(project, ref, path, blob_shas.get(path))
        )
        endpoint = graphql_url(self._gl.url)
        for start in range(0, len(wanted), GRAPHQL_FILES_PER_QUERY):
            batch = wanted[start : start + GRAPHQL_FILES_PER_QUERY]
            payload = {"query": BLOBS_QUERY, "variables": blobs_variables(repo, ref, batch)}

            def query(gl: gitlab.Gitlab, payload: dict[str, Any] = payload) -> Any:
                return gl.http_post(endpoint, post_data=payload, obey_rate_limit=False)

            answer = await self._call("read_files", query, retry=READ_RETRY)
            answered = blobs_answered(batch, answer)
            if answered is None:
                errors = answer.get("errors") if isinstance(answer, dict) else answer
                raise ForgeError(
                    f"GitLab's GraphQL API refused the file read: {errors}", status=400
                )
            for path, (text, oid) in answered.items():
                texts[path] = text
                if text is not None and oid:
                    self._remember_blob(project, ref, path, oid, text)
        return texts

    def _known_blob(self, project: str, ref: str, path: str, blob_sha: str | None) -> str | None:
        """The blob at `path` in commit `ref`: as the diff listed it, or as a read found it."""
        return blob_sha or self._blob_ids.get((project, ref, path))

    def _remember_blob(self, project: str, ref: str, path: str, blob_id: str, text: str) -> None:
        """Keep a file's text by its blob id, and which blob the path is at that commit."""
        self._blob_ids[(project, ref, path)] = blob_id
        if len(self._blob_ids) > MAX_BLOB_IDS:
            self._blob_ids.popitem(last=False)
        self.blobs.put(blob_id, text)

    async def _read_diffs(
        self,
        repo: str,
        number: int,
        *,
        diffs: Callable[[gitlab.Gitlab], list[dict[str, Any]]],
        changes: Callable[[gitlab.Gitlab], list[dict[str, Any]]],
    ) -> list[dict[str, Any]]:
        """The MR's file diffs from /diffs (GitLab 15.7+), else from /changes (older)."""
        if self._diffs_endpoint:
            try:
                return await self._call("fetch_diffs", diffs)
            except ForgeNotFound as exc:
                explained = await self._explain_not_found(repo, number, exc, what="/diffs")
                if isinstance(explained, ForgeNotFound):
                    raise explained from exc
                self._diffs_endpoint = False
                logger.warning(
                    "GitLab has no merge request /diffs endpoint (before 15.7): using /changes",
                    extra={"action": "gitlab_changes_fallback"},
                )
        try:
            return await self._call("fetch_changes", changes)
        except ForgeNotFound as exc:
            raise await self._explain_not_found(
                repo, number, exc, what="both /diffs and /changes"
            ) from exc

    async def _explain_not_found(
        self, repo: str, number: int, error: ForgeNotFound, *, what: str
    ) -> ForgeError:
        """What a 404 on a part of a merge request means: ForgeNotFound when the MR itself is
        gone, else a (not retryable) ForgeError naming the part GitLab would not serve."""
        path = f"/projects/{self._project(repo)}/merge_requests/{number}"

        def read(gl: gitlab.Gitlab) -> object:
            return gl.http_get(path, obey_rate_limit=False)

        try:
            await self._call("fetch_merge_request", read)
        except ForgeNotFound as gone:
            return ForgeNotFound(f"merge request {repo}!{number} is gone: {gone}", status=404)
        return ForgeError(
            f"GitLab answered 404 to {what} of merge request {repo}!{number}, which exists: "
            f"{error}",
            status=404,
        )

    async def _list_all(self, action: str, path: str) -> list[dict[str, Any]]:
        """Every page of a listing, 100 items a page."""

        def read(gl: gitlab.Gitlab) -> list[dict[str, Any]]:
            return cast(
                list[dict[str, Any]],
                gl.http_list(path, get_all=True, per_page=100, obey_rate_limit=False),
            )

        return await self._call(action, read)

    async def _list_notes(self, repo: str, number: int) -> list[dict[str, Any]]:
        path = f"/projects/{self._project(repo)}/merge_requests/{number}/notes"
        return await self._list_all("list_notes", path)

    async def find_posted_review(self, repo: str, number: int, marker: str) -> PostedReview | None:
        """Return our summary note carrying `marker`, or None; raises ForgeNotFound only when
        the MR itself is gone."""
        try:
            notes = await self._list_notes(repo, number)
        except ForgeNotFound as exc:
            raise await self._explain_not_found(repo, number, exc, what="/notes") from exc
        for note in notes:
            body = str(note.get("body") or "")
            if marker in body and note.get("type") != "DiffNote":
                return PostedReview(
                    id=int(note["id"]),
                    job_id=find_marker(body),
                    body=body,
                    already_posted=True,
                )
        return None

    async def post_review(self, repo: str, number: int, review: ReviewToPost) -> PostedReview:
        """Post inline discussions then the summary note, skipping what a retry already posted;
        raises ForgeNotFound only when the MR itself is gone."""
        try:
            return await self._post_review(repo, number, review)
        except ForgeNotFound as exc:
            raise await self._explain_not_found(repo, number, exc, what="a review post") from exc

    async def _post_review(self, repo: str, number: int, review: ReviewToPost) -> PostedReview:
        marker = render_marker(review.job_id)
        notes = [] if review.first_attempt else await self._list_notes(repo, number)
        for note in notes:
            body = str(note.get("body") or "")
            if marker in body and note.get("type") != "DiffNote":
                return PostedReview(
                    id=int(note["id"]),
                    job_id=review.job_id,
                    body=body,
                    already_posted=True,
                )
        done = {
            (str(note.get("body") or ""), _note_path(note))
            for note in notes
            if note.get("type") == "DiffNote"
        }
        base_sha, start_sha, head_sha = await self._shas(repo, number, review)
        lines, old_paths = await self._positions_for(repo, number, head_sha, review)
        posted = 0
        rejected: list[InlineComment] = []
        refused: list[int] = []
        for index, comment in enumerate(review.comments):
            body = append_marker(gitlab_body(comment), review.job_id)
            if (body, comment.path) in done:
                posted += 1
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
                await self.open_discussion_once(
                    repo, number, body, position, file_path=comment.path, review=review
                )
                posted += 1
            except ForgeError as exc:
                if exc.status != 400:
                    raise
                logger.warning(
                    "GitLab refused a position on %s:%s for job %s: %s",
                    comment.path,
                    comment.line,
                    review.job_id,
                    exc,
                    extra={"action": "post_review_position_refused", "job_id": review.job_id},
                )
                rejected.append(comment)
                refused.append(index)
        if rejected:
            partial = ReviewToPost(job_id=review.job_id, body=review.body, comments=tuple(rejected))
            summary = render_summary_only(partial, "GitLab did not accept their positions")
        else:
            summary = append_marker(review.body, review.job_id)
        note_id = await self._create_note(repo, number, summary, marker=marker)
        return PostedReview(
            id=note_id,
            job_id=review.job_id,
            body=summary,
            inline_posted=posted,
            inline_rejected=len(rejected),
            summary_only=bool(rejected) and posted == 0,
            rejected=tuple(refused),
        )

    async def _positions_for(
        self, repo: str, number: int, head_sha: str, review: ReviewToPost
    ) -> tuple[dict[str, DiffLines], dict[str, str]]:
        """This process's reading of the MR's lines and renames at `head_sha`, for comments
        that do not carry their own (see InlineComment); read once when needed and missing."""
        lines = self._diffs.get((repo, number, head_sha))
        needed = any(comment.line_pair is None for comment in review.comments)
        if lines is None and needed:
            await self.fetch_changes(repo, number)
            lines = self._diffs.get((repo, number, head_sha))
        return lines or {}, self._old_paths.get((repo, number, head_sha), {})

    async def _shas(self, repo: str, number: int, review: ReviewToPost) -> tuple[str, str, str]:
        if review.base_sha and review.start_sha and review.head_sha:
            return review.base_sha, review.start_sha, review.head_sha
        project = self._project(repo)
        path = f"/projects/{project}/merge_requests/{number}/versions"

        def versions(gl: gitlab.Gitlab) -> list[dict[str, Any]]:
            return cast(
                list[dict[str, Any]], gl.http_list(path, get_all=False, obey_rate_limit=False)
            )

        found = await self._call("fetch_versions", versions)
        if not found:
            raise ForgeNotFound(f"merge request {repo}!{number} has no diff versions", status=404)
        newest = found[0]
        return (
            str(newest["base_commit_sha"]),
            str(newest["start_commit_sha"]),
            review.head_sha or str(newest["head_commit_sha"]),
        )

    async def list_discussions(self, repo: str, number: int) -> list[dict[str, Any]]:
        """Every discussion of the MR, with its notes."""
        path = f"/projects/{self._project(repo)}/merge_requests/{number}/discussions"
        return await self._list_all("list_discussions", path)

    async def open_discussion_once(
        self,
        repo: str,
        number: int,
        body: str,
        position: dict[str, Any],
        *,
        file_path: str,
        review: ReviewToPost,
    ) -> str:
        """Open an inline discussion of a review's finding, once; the id of the discussion that
        holds it (plain reviews and quiet reviews' findings alike).

        A forge has no conditional writes: a process paused between its claim's last check and
        its request sends the request when it resumes, after another attempt took the job over
        and wrote the same finding. So each writer looks once its note is created (a taking-over
        attempt always, a first attempt only when its claim is gone), and the later of the two
        deletes its own note, whichever order they land in, keeping the oldest (as
        bot.review.quiet_post.one_summary does for the summary). A stale writer then stops
        (LeaseLost).
        """
        discussion_id, note_id = await self._create_discussion(
            repo, number, body, position, file_path=file_path
        )
        stale = not await write_guard_holds()
        if not stale and review.first_attempt:
            return discussion_id
        with guarded_writes(always_held):  # taking back its own note is safe, even when stale
            older = [
                found
                for found in await self._same_discussions(repo, number, body, file_path)
                if found[1] < note_id
            ]
            if older:
                await self.delete_note(repo, number, note_id, write=WriteValue.REVIEW)
                logger.warning(
                    "job %s: finding on %s written twice; kept discussion %s",
                    review.job_id,
                    file_path,
                    older[0][0],
                    extra={"action": "discussion_doubled", "job_id": review.job_id},
                )
        if stale:
            raise LeaseLost(
                f"job {review.job_id}: the posting claim was taken over as a finding was written"
            )
        return older[0][0] if older else discussion_id

    async def _create_discussion(
        self, repo: str, number: int, body: str, position: dict[str, Any], *, file_path: str
    ) -> tuple[str, int]:
        """Open an inline discussion; its id and its note's."""
        project = self._project(repo)
        path = f"/projects/{project}/merge_requests/{number}/discussions"

        def create(gl: gitlab.Gitlab) -> tuple[str, int]:
            answer = cast(
                dict[str, Any],
                gl.http_post(
                    path, post_data={"body": body, "position": position}, obey_rate_limit=False
                ),
            )
            return str(answer["id"]), int(answer["notes"][0]["id"])

        async def recheck() -> tuple[str, int] | None:
            # A create whose answer was lost may have been stored: look before posting again.
            found = await self._same_discussions(repo, number, body, file_path)
            return found[0] if found else None

        return await self._call(
            "create_discussion", create, write=WriteValue.REVIEW, recheck=recheck
        )

    async def _same_discussions(
        self, repo: str, number: int, body: str, file_path: str
    ) -> list[tuple[str, int]]:
        """(discussion id, first note id) of the MR's discussions opened with this body on this
        file, oldest first."""
        return sorted(
            (
                (str(discussion["id"]), int(first["id"]))
                for discussion in await self.list_discussions(repo, number)
                for first in (discussion.get("notes") or [])[:1]
                if (str(first.get("body") or ""), _note_path(first)) == (body, file_path)
            ),
            key=lambda found: found[1],
        )

    async def delete_note(self, repo: str, number: int, note_id: int, *, write: WriteValue) -> None:
        """Delete one of the bot's own notes (one written twice); `write`: what it is worth."""
        project = self._project(repo)
        path = f"/projects/{project}/merge_requests/{number}/notes/{note_id}"

        def delete(gl: gitlab.Gitlab) -> None:
            gl.http_delete(path, obey_rate_limit=False)

        await self._call("delete_note", delete, write=write)

    async def _create_note(
        self, repo: str, number: int, body: str, *, marker: str | None = None
    ) -> int:
        project = self._project(repo)
        path = f"/projects/{project}/merge_requests/{number}/notes"

        def create(gl: gitlab.Gitlab) -> int:
            answer = gl.http_post(path, post_data={"body": body}, obey_rate_limit=False)
            return int(cast(dict[str, Any], answer)["id"])

        async def recheck() -> int | None:
            return await self.find_comment(repo, number, marker) if marker else None

        return await self._call(
            "create_note",
            create,
            write=WriteValue.FIRST_SUMMARY,
            recheck=recheck if marker else None,
        )

    async def find_comment(self, repo: str, number: int, marker: str) -> int | None:
        """The id of the MR's first note (not an inline one) carrying `marker`, or None."""
        for note in await self._list_notes(repo, number):
            if marker in str(note.get("body") or "") and note.get("type") != "DiffNote":
                return int(note["id"])
        return None

    async def post_comment(
        self, repo: str, number: int, body: str, *, marker: str | None = None
    ) -> int:
        """Post a note on the MR; returns its id. With the `marker` the body carries, a retried
        POST first looks for the note an earlier try may have left."""
        return await self._create_note(repo, number, body, marker=marker)

    async def add_reaction(
        self, repo: str, comment_id: int, reaction: Reaction, *, number: int | None = None
    ) -> None:
        """Award an emoji to a note; GitLab needs the MR iid, so without it this does nothing."""
        if number is None:
            logger.debug(
                "no MR iid for note %s, reaction skipped",
                comment_id,
                extra={"action": "add_reaction_skipped"},
            )
            return
        project = self._project(repo)
        path = f"/projects/{project}/merge_requests/{number}/notes/{comment_id}/award_emoji"

        def create(gl: gitlab.Gitlab) -> None:
            gl.http_post(path, post_data={"name": AWARD_NAMES[reaction]}, obey_rate_limit=False)

        await self._call("add_reaction", create, write=WriteValue.SUMMARY_EDIT)

    async def get_permission(self, repo: str, user: str) -> Permission:
        """Map the user's (inherited) member access level; "none" if not a member."""
        project = self._project(repo)
        user_id = self._user_ids.get(user)
        if user_id is None:

            def lookup(gl: gitlab.Gitlab) -> list[dict[str, Any]]:
                return cast(
                    list[dict[str, Any]],
                    gl.http_list(
                        "/users", {"username": user}, get_all=False, obey_rate_limit=False
                    ),
                )

            found = await self._call("find_user", lookup)
            if not found:
                return "none"
            user_id = int(found[0]["id"])
            self._user_ids[user] = user_id

        def member(gl: gitlab.Gitlab) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                gl.http_get(f"/projects/{project}/members/all/{user_id}", obey_rate_limit=False),
            )

        try:
            answer = await self._call("get_member", member)
        except ForgeNotFound:
            return "none"
        return permission_from_access_level(int(answer.get("access_level") or 0))

    # -- the review's status on the head commit -----------------------------------------------

    async def publish_status(self, update: StatusUpdate) -> StatusWritten:
        """Set the commit status `review-bot` on the MR's head: pending, running, then success.

        GitLab refuses a write of the state a status already has (400), so callers write on
        state changes only. Raises ForgeError.
        """
        project = self._project(update.repo, update.project_id)
        data: dict[str, Any] = {
            "state": gitlab_commit_state(update),
            "name": STATUS_NAME,
            "description": shorten(update.description, GITLAB_DESCRIPTION_LIMIT),
        }
        if update.details_url:
            data["target_url"] = update.details_url
        path = f"/projects/{project}/statuses/{update.head_sha}"

        def create(gl: gitlab.Gitlab) -> None:
            gl.http_post(path, post_data=data, obey_rate_limit=False)

        await self._call("create_status", create, write=status_value(update))
        return StatusWritten("commit_status")


def _note_path(note: Mapping[str, Any]) -> str | None:
    position = note.get("position") or {}
    return cast(str | None, position.get("new_path") or position.get("old_path"))


def build_position(
    comment: InlineComment,
    *,
    base_sha: str,
    start_sha: str,
    head_sha: str,
    lines: DiffLines | None,
    old_path: str | None = None,
) -> dict[str, Any]:
    """Build a text position; an unchanged line needs both old_line and new_line, and a renamed
    file its path before the rename as `old_path` (GitLab finds no line code otherwise).

    What the comment carries from the review's own diff wins over `lines`/`old_path` (this
    process's reading of the merge request, which a push may have moved on).
    """
    position: dict[str, Any] = {
        "position_type": "text",
        "base_sha": base_sha,
        "start_sha": start_sha,
        "head_sha": head_sha,
        "new_path": comment.path,
        "old_path": comment.old_path or old_path or comment.path,
    }
    old_line: int | None
    new_line: int | None
    if comment.line_pair is not None:
        old_line, new_line = comment.line_pair
    elif lines is not None and lines.has_line(comment.line, comment.side):
        old_line, new_line = lines.line_pair(comment.line, comment.side)
    elif comment.side == "LEFT":
        old_line, new_line = comment.line, None
    else:
        old_line, new_line = None, comment.line
    if old_line is not None:
        position["old_line"] = old_line
    if new_line is not None:
        position["new_line"] = new_line
    return position


def gitlab_body(comment: InlineComment) -> str:
    """A discussion's text: the comment, and its suggestion block for the lines above it."""
    above = comment.line - comment.start_line if comment.start_line is not None else 0
    return with_suggestion(comment.body, comment.suggestion, info=f"suggestion:-{above}+0")


def file_change_from_gitlab(item: Mapping[str, Any]) -> FileChange:
    """Turn one MR diff entry into a FileChange (patch None for binary, collapsed or too large)."""
    diff = str(item.get("diff") or "")
    too_big = bool(item.get("too_large")) or bool(item.get("collapsed"))
    patch = diff if diff.startswith("@@") and not too_big else None
    additions, deletions = count_patch_lines(patch)
    if item.get("new_file"):
        status = "added"
    elif item.get("deleted_file"):
        status = "removed"
    elif item.get("renamed_file"):
        status = "renamed"
    else:
        status = "modified"
    new_path = str(item.get("new_path") or item.get("old_path"))
    old_path = item.get("old_path")
    return FileChange(
        path=new_path,
        additions=additions,
        deletions=deletions,
        patch=patch,
        status=status,
        previous_path=str(old_path) if status == "renamed" and old_path else None,
    )
