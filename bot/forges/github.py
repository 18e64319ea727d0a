"""GitHub client over gidgethub: App or token auth, PR files, one review per job, permissions."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar, cast
from urllib.parse import quote

import aiohttp
import gidgethub
import jwt
from gidgethub import sansio
from gidgethub.aiohttp import GitHubAPI

from bot.budget.decide import WriteValue
from bot.budget.ledger import (
    GITHUB_LIMITS,
    BudgetKey,
    BudgetSettings,
    LocalWriteBudget,
    WriteBudget,
    token_name,
)
from bot.errors import ConfigError, ForgeError, ForgeNotFound
from bot.forges.base import (
    MAX_FILES,
    PERMISSIONS,
    READ_RETRY,
    Clock,
    DiffLines,
    ForgeAuthRefused,
    ForgeCredentialsExpired,
    ForgePermissionDenied,
    InlineComment,
    Permission,
    PostedReview,
    PullChanges,
    Reaction,
    RetryPolicy,
    ReviewToPost,
    Sleep,
    append_marker,
    check_write_guard,
    find_marker,
    parse_diff_lines,
    render_marker,
    render_summary_only,
    retry_forge_call,
    utc_now,
    with_suggestion,
)
from bot.forges.blobs import BlobCache, decode_text
from bot.forges.github_files import (
    MAX_FILES_PER_QUERY,
    files_answered,
    files_query,
    files_variables,
    graphql_url,
)
from bot.forges.statuses import (
    GITHUB_DESCRIPTION_LIMIT,
    STATUS_NAME,
    StatusUpdate,
    StatusWritten,
    github_commit_state,
    shorten,
    status_value,
)
from bot.model import MAX_DESCRIPTION_CHARS, FileChange
from bot.retry import parse_retry_after

logger = logging.getLogger(__name__)

DEFAULT_API_URL = "https://api.github.com"
# Refresh an installation token this long before GitHub's one-hour expiry.
TOKEN_REFRESH_MARGIN = timedelta(minutes=5)
# GitHub answers a secondary rate limit without Retry-After at times; wait this long then.
SECONDARY_LIMIT_DEFAULT_S = 60.0
# What GitHub's REST documentation asks every request to send today; gidgethub still sends the
# v3 media type and no API version (which GitHub then reads as the oldest version).
GITHUB_ACCEPT = "application/vnd.github+json"
GITHUB_API_VERSION = "2022-11-28"
# An App's JWT: issued a minute before GitHub's now (GitHub refuses one issued in its future),
# expiring within the ten minutes GitHub allows.
JWT_BACKDATE = timedelta(seconds=60)
JWT_LIFETIME = timedelta(minutes=9)
# A clock this far from GitHub's (its `Date` header) explains a JWT GitHub refused: the backdate
# covers less than a minute of drift.
SKEW_EXPLAINS = timedelta(seconds=30)
T = TypeVar("T")


class ReadCache(OrderedDict[str, Any]):
    """gidgethub's cache of GET answers by URL (ETag, Last-Modified, body, next page), the
    least recently used dropped past `size`: a re-read asks If-None-Match, and GitHub's 304
    does not count against the primary rate limit."""

    def __init__(self, size: int = 1024) -> None:
        super().__init__()
        self.size = size

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class CurrentGitHubAPI(GitHubAPI):
    """gidgethub's aiohttp transport sending GitHub's current media type and API version, and
    remembering the `Date` of GitHub's last answer (its clock)."""

    last_date: str | None = None

    async def _request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> tuple[int, Mapping[str, str], bytes]:
        current = dict(headers)
        if current.get("accept") == sansio.accept_format():
            current["accept"] = GITHUB_ACCEPT
        current.setdefault("x-github-api-version", GITHUB_API_VERSION)
        status, answered, data = await super()._request(method, url, current, body)
        self.last_date = answered.get("date") or self.last_date
        return status, answered, data


def clock_skew(date_header: str | None, *, now: datetime) -> timedelta | None:
    """GitHub's clock minus ours, from the `Date` of an answer (None when it has none)."""
    if not date_header:
        return None
    try:
        theirs = parsedate_to_datetime(date_header)
    except (TypeError, ValueError):
        return None
    if theirs.tzinfo is None:
        return None
    return theirs - now


def app_jwt_claims(app_id: str, *, github_now: datetime) -> dict[str, Any]:
    """The claims of an App's JWT at GitHub's time `github_now`."""
    issued = github_now - JWT_BACKDATE
    return {
        "iat": int(issued.timestamp()),
        "exp": int((issued + JWT_LIFETIME).timestamp()),
        "iss": app_id,
    }


def translate_github_error(exc: gidgethub.HTTPException, *, now: datetime) -> ForgeError:
    """Map a gidgethub HTTP error to our error family (the one place this happens)."""
    status = int(exc.status_code)
    message = f"GitHub answered {status}: {exc}"
    retry_after = parse_retry_after(exc.headers, now=now)
    if isinstance(exc, gidgethub.RateLimitExceeded):
        if retry_after is None and exc.rate_limit is not None:
            retry_after = max(0.0, (exc.rate_limit.reset_datetime - now).total_seconds())
        return ForgeError(message, status=status, retry_after=retry_after)
    if status == 429:
        return ForgeError(message, status=429, retry_after=retry_after)
    if status == 403:
        text = str(exc).lower()
        if retry_after is not None or "secondary rate limit" in text or "abuse" in text:
            return ForgeError(
                message, status=403, retry_after=retry_after or SECONDARY_LIMIT_DEFAULT_S
            )
        return ForgePermissionDenied(message, status=403)
    if status == 401:
        return ForgeAuthRefused(message, status=401)
    if status in (404, 410):
        return ForgeNotFound(message, status=status)
    if isinstance(exc, gidgethub.GitHubBroken) or status >= 500:
        return ForgeError(message, status=status)
    return ForgeError(message, status=status)


@dataclass(slots=True)
class _InstallationToken:
    token: str
    expires_at: datetime


class GitHubClient:
    """The ForgeClient for GitHub, as an App installation or with a plain token."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        base_url: str = DEFAULT_API_URL,
        token: str | None = None,
        app_id: str | None = None,
        private_key: str | None = None,
        requester: str = "review-bot",
        clock: Clock = utc_now,
        sleep: Sleep = asyncio.sleep,
        retry: RetryPolicy | None = None,
        post_interval_s: float = 1.0,
        max_files: int = MAX_FILES,
        per_page: int = 100,
        budget: WriteBudget | None = None,
    ) -> None:
        if token is None and (app_id is None or private_key is None):
            raise ConfigError("GitHub needs a token, or an App id and its private key")
        self._api = CurrentGitHubAPI(session, requester, base_url=base_url, cache=ReadCache())
        self._session = session
        self._graphql_url = graphql_url(base_url)
        self._token = token
        self._app_id = app_id
        self._private_key = private_key
        self._clock = clock
        self._sleep = sleep
        self._retry = retry or RetryPolicy()
        # Content-creating calls spend from one budget per installation (or token). Without a
        # shared one (no database), this process keeps its own with GitHub's limits.
        self._budget: WriteBudget = budget or LocalWriteBudget(
            now=clock,
            sleep=sleep,
            settings=BudgetSettings(
                limits={"github": replace(GITHUB_LIMITS, min_interval_s=post_interval_s)}
            ),
        )
        self._token_budget = token_name(token, scope=base_url)
        self._max_files = max_files
        self._per_page = per_page
        self._installation_tokens: dict[int, _InstallationToken] = {}
        self._installations: dict[str, int] = {}
        self.tokens_issued = 0
        self.blobs = BlobCache()
        # GitHub's clock minus ours, learnt from its `Date` when a JWT was refused for it.
        self.clock_offset = timedelta(0)

    # -- auth ------------------------------------------------------------------------------

    def _github_now(self) -> datetime:
        return self._clock() + self.clock_offset

    def _app_jwt(self) -> str:
        assert self._app_id is not None and self._private_key is not None
        claims = app_jwt_claims(self._app_id, github_now=self._github_now())
        return jwt.encode(claims, self._private_key, algorithm="RS256")

    def _correct_clock(self, refused: gidgethub.HTTPException) -> bool:
        """After GitHub refused a JWT: adopt its clock if the skew explains the refusal."""
        if int(refused.status_code) != 401:
            return False
        skew = clock_skew(refused.headers.get("date") or self._api.last_date, now=self._clock())
        if skew is None or abs(skew - self.clock_offset) < SKEW_EXPLAINS:
            return False
        logger.warning(
            "GitHub refused the App's JWT and its clock is %.0f s from ours: using its time",
            skew.total_seconds(),
            extra={"action": "github_clock_skew", "skew_s": skew.total_seconds()},
        )
        self.clock_offset = skew
        return True

    def use_installation(self, repo: str, installation_id: int | None) -> None:
        """Remember the App installation a webhook named for `repo`, so no call has to ask
        GitHub for it (`GET /repos/{owner}/{repo}/installation` stays the fallback)."""
        if installation_id is not None:
            self._installations[repo] = int(installation_id)

    async def _installation_for(self, repo: str, installation_id: int | None) -> int:
        if installation_id is not None:
            self._installations[repo] = installation_id
            return installation_id
        known = self._installations.get(repo)
        if known is not None:
            return known
        owner, name = split_repo(repo)
        logger.info(
            "no installation id known for %s: asking GitHub",
            repo,
            extra={"action": "github_installation_lookup"},
        )
        data = await self._api.getitem(
            "/repos/{owner}/{repo}/installation",
            {"owner": owner, "repo": name},
            jwt=self._app_jwt(),
        )
        found = int(data["id"])
        self._installations[repo] = found
        return found

    async def _access_token(self, repo: str, installation_id: int | None) -> str:
        if self._token is not None:
            return self._token
        assert self._app_id is not None and self._private_key is not None
        installation = await self._installation_for(repo, installation_id)
        cached = self._installation_tokens.get(installation)
        now = self._github_now()  # the token's expiry is GitHub's time
        if cached is not None and now < cached.expires_at - TOKEN_REFRESH_MARGIN:
            return cached.token
        try:
            answer = await self._exchange_token(installation)
        except gidgethub.HTTPException as exc:
            if not self._correct_clock(exc):
                raise
            answer = await self._exchange_token(installation)  # once, at GitHub's time
        expires_at = datetime.fromisoformat(str(answer["expires_at"]).replace("Z", "+00:00"))
        self._installation_tokens[installation] = _InstallationToken(
            str(answer["token"]), expires_at
        )
        self.tokens_issued += 1
        logger.info(
            "installation token issued for %s, expires %s",
            installation,
            expires_at.isoformat(),
            extra={"action": "github_token", "installation_id": installation},
        )
        return str(answer["token"])

    async def _exchange_token(self, installation: int) -> dict[str, Any]:
        """Trade the App's JWT for an installation token (POST .../access_tokens)."""
        answer = await self._api.post(
            "/app/installations/{installation_id}/access_tokens",
            {"installation_id": str(installation)},
            data=b"",
            jwt=self._app_jwt(),
        )
        return cast(dict[str, Any], answer)

    # -- the one call path -----------------------------------------------------------------

    async def _call(
        self,
        action: str,
        operation: Callable[[str], Awaitable[T]],
        *,
        repo: str,
        installation_id: int | None = None,
        write: WriteValue | None = None,
        recheck: Callable[[], Awaitable[T | None]] | None = None,
        retry: RetryPolicy | None = None,
    ) -> T:
        """Run one API operation with auth, the write budget (`write`: what a content-creating
        call is worth), error translation and retries (the client's retry policy unless
        `retry` is given)."""
        attempts = 0
        refreshed = False

        async def attempt() -> T:
            nonlocal attempts, refreshed
            attempts += 1
            if attempts > 1 and recheck is not None:
                found = await recheck()
                if found is not None:
                    return found
            try:
                spent: tuple[BudgetKey, int] | None = None
                if write is not None:
                    if self._token is None:
                        await self._installation_for(repo, installation_id)
                    key = self._budget_key(repo)
                    spent = (key, await self._budget.spend(key, action=action, value=write))
                try:
                    # After the budget's wait (which can outlast an installation token's hour).
                    token = await self._access_token(repo, installation_id)
                    await check_write_guard(action)
                    return await operation(token)
                finally:
                    if spent is not None:
                        await self._budget.answered(*spent)
            except gidgethub.HTTPException as exc:
                error = translate_github_error(exc, now=self._clock())
                if error.status == 401 and self._token is None and not refreshed:
                    # An installation token revoked or rotated before its expiry: forget it
                    # and try once more with a new one.
                    refreshed = True
                    self._forget_installation_token(repo)
                    raise ForgeCredentialsExpired(str(error), status=401) from exc
                raise error from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ForgeError(f"GitHub unreachable during {action}: {exc!r}") from exc

        async def on_retry(exc: ForgeError) -> None:
            if exc.retry_after is not None and write is not None:
                # A secondary limit: every process holds this installation's writes.
                await self._budget.hold(self._budget_key(repo), exc.retry_after)

        return await retry_forge_call(
            attempt,
            sleep=self._sleep,
            policy=retry or self._retry,
            action=action,
            on_retry=on_retry,
        )

    def _forget_installation_token(self, repo: str) -> None:
        installation = self._installations.get(repo)
        if installation is not None:
            self._installation_tokens.pop(installation, None)

    def _budget_key(self, repo: str) -> BudgetKey:
        installation = self._installations.get(repo) if self._token is None else None
        if installation is not None:
            return BudgetKey("github", f"installation:{installation}")
        return BudgetKey("github", self._token_budget)

    # -- ForgeClient -----------------------------------------------------------------------

    async def fetch_changes(
        self,
        repo: str,
        number: int,
        *,
        project_id: int | None = None,
        installation_id: int | None = None,
    ) -> PullChanges:
        """List a PR's files (up to the 3,000-file cap); raises ForgeNotFound if it is gone."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "number": str(number)}

        async def read_pull(token: str) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                await self._api.getitem(
                    "/repos/{owner}/{repo}/pulls/{number}", url_vars, oauth_token=token
                ),
            )

        async def read_files(token: str) -> list[dict[str, Any]]:
            files: list[dict[str, Any]] = []
            async for item in self._api.getiter(
                f"/repos/{{owner}}/{{repo}}/pulls/{{number}}/files?per_page={self._per_page}",
                url_vars,
                oauth_token=token,
            ):
                files.append(item)
                if len(files) >= self._max_files:
                    break
            return files

        pull = await self._call("fetch_pull", read_pull, repo=repo, installation_id=installation_id)
        try:
            items = await self._call(
                "fetch_files", read_files, repo=repo, installation_id=installation_id
            )
        except ForgeNotFound as exc:
            raise await self._explain_not_found(repo, number, exc, what="/files") from exc
        total = int(pull.get("changed_files") or len(items))
        base_sha = str(pull["base"]["sha"])
        return PullChanges(
            base_sha=base_sha,
            head_sha=str(pull["head"]["sha"]),
            start_sha=base_sha,
            files=tuple(file_change_from_github(item) for item in items),
            truncated=total > len(items),
            total_files=total,
            title=str(pull.get("title") or ""),
            description=str(pull.get("body") or "")[:MAX_DESCRIPTION_CHARS],
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
        """A file's text at commit `ref` (contents API), from the cache when `blob_sha` is
        known; None when it is not there, binary or too large. Raises ForgeError."""
        cached = self.blobs.get(blob_sha)
        if cached is not None:
            return cached
        owner, name = split_repo(repo)
        # Quoted here: the template's reserved expansion keeps "/" but would also keep "#"
        # and "?", which a file name may hold.
        url_vars = {"owner": owner, "repo": name, "path": quote(path, safe="/"), "ref": ref}

        async def read(token: str) -> Any:
            return await self._api.getitem(
                "/repos/{owner}/{repo}/contents/{+path}{?ref}", url_vars, oauth_token=token
            )

        try:
            answer = await self._call(
                "read_file", read, repo=repo, installation_id=installation_id, retry=READ_RETRY
            )
        except ForgeNotFound:
            return None
        if not isinstance(answer, dict) or answer.get("type") != "file":
            return None  # a directory, a submodule or a symlink out of the repository
        if answer.get("encoding") != "base64":
            return None  # over 1 MB: GitHub sends no content in this media type
        try:
            data = base64.b64decode(str(answer.get("content") or ""))
        except ValueError:
            return None
        text = decode_text(data)
        if text is not None:
            self.blobs.put(str(answer.get("sha") or blob_sha or ""), text)
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
        the blob cache (bot/forges/github_files.py); None for a path that is not there or not
        text. Raises ForgeError when GitHub will not answer the query."""
        texts, wanted = self.blobs.split(paths, blob_shas.get)
        owner, name = split_repo(repo)
        for start in range(0, len(wanted), MAX_FILES_PER_QUERY):
            batch = wanted[start : start + MAX_FILES_PER_QUERY]
            variables = files_variables(owner, name, ref, batch)

            async def query(
                token: str, batch: Sequence[str] = batch, variables: dict[str, str] = variables
            ) -> Any:
                api = CurrentGitHubAPI(
                    self._session,
                    self._api.requester,
                    oauth_token=token,
                    base_url=self._api.base_url,
                )
                try:
                    return await api.graphql(
                        files_query(len(batch)), endpoint=self._graphql_url, **variables
                    )
                except gidgethub.GraphQLException as exc:
                    # Refused or answered with errors: the same query would be again (a 5xx
                    # comes as gidgethub's HTTPException and is retried as any read).
                    raise ForgeError(
                        f"GitHub's GraphQL API refused the file read: {exc}",
                        status=int(getattr(exc, "status_code", 400)),
                    ) from exc

            data = await self._call(
                "read_files", query, repo=repo, installation_id=installation_id, retry=READ_RETRY
            )
            answered = files_answered(
                batch, data.get("repository") if isinstance(data, dict) else None
            )
            for path, (text, oid) in answered.items():
                texts[path] = text
                if text is not None:
                    self.blobs.put(oid or blob_shas.get(path) or "", text)
        return texts

    async def _explain_not_found(
        self, repo: str, number: int, error: ForgeNotFound, *, what: str
    ) -> ForgeError:
        """What a 404 on a part of a pull request means: ForgeNotFound when the pull request
        itself is gone, else a (not retryable) ForgeError naming the part GitHub refused."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "number": str(number)}

        async def read_pull(token: str) -> object:
            return await self._api.getitem(
                "/repos/{owner}/{repo}/pulls/{number}", url_vars, oauth_token=token
            )

        try:
            await self._call("fetch_pull", read_pull, repo=repo)
        except ForgeNotFound as gone:
            return ForgeNotFound(f"pull request {repo}#{number} is gone: {gone}", status=404)
        return ForgeError(
            f"GitHub answered 404 to {what} of pull request {repo}#{number}, which exists: {error}",
            status=404,
        )

    async def find_posted_review(self, repo: str, number: int, marker: str) -> PostedReview | None:
        """Return our review whose body carries `marker`, or None; raises ForgeNotFound only
        when the pull request itself is gone."""
        try:
            return await self._find_posted_review(repo, number, marker)
        except ForgeNotFound as exc:
            raise await self._explain_not_found(repo, number, exc, what="/reviews") from exc

    async def _find_posted_review(self, repo: str, number: int, marker: str) -> PostedReview | None:
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "number": str(number)}

        async def search(token: str) -> PostedReview | None:
            async for item in self._api.getiter(
                "/repos/{owner}/{repo}/pulls/{number}/reviews?per_page=100",
                url_vars,
                oauth_token=token,
            ):
                body = item.get("body") or ""
                if marker in body:
                    return PostedReview(
                        id=int(item["id"]),
                        job_id=find_marker(body),
                        body=body,
                        url=item.get("html_url"),
                        already_posted=True,
                    )
            return None

        return await self._call("find_review", search, repo=repo)

    async def post_review(self, repo: str, number: int, review: ReviewToPost) -> PostedReview:
        """Post the job's review once; if GitHub refuses the inline comments, post the summary.
        Raises ForgeNotFound only when the pull request itself is gone."""
        try:
            return await self._post_review(repo, number, review)
        except ForgeNotFound as exc:
            raise await self._explain_not_found(repo, number, exc, what="a review post") from exc

    async def _post_review(self, repo: str, number: int, review: ReviewToPost) -> PostedReview:
        marker = render_marker(review.job_id)
        existing = (
            None if review.first_attempt else await self.find_posted_review(repo, number, marker)
        )
        if existing is not None:
            logger.info(
                "review for job %s already posted as %s",
                review.job_id,
                existing.id,
                extra={"action": "post_review_found", "job_id": review.job_id},
            )
            return existing
        comments = [github_comment(item) for item in review.comments]
        try:
            answer = await self._create_review(
                repo, number, review, append_marker(review.body, review.job_id), comments
            )
        except ForgeError as exc:
            if exc.status != 422 or not comments:
                raise
            refused = await self._refused_comments(repo, number, review)
            logger.warning(
                "GitHub refused the review of job %s (%s): %d of %d inline comments are off "
                "its diff; posting the rest",
                review.job_id,
                exc,
                len(refused),
                len(comments),
                extra={"action": "post_review_refused", "job_id": review.job_id},
            )
            accepted = [index for index in range(len(comments)) if index not in refused]
            if refused and accepted:
                listed = replace(review, comments=tuple(review.comments[i] for i in refused))
                body = render_summary_only(listed, "GitHub did not accept them on this diff")
                try:
                    answer = await self._create_review(
                        repo, number, review, body, [comments[i] for i in accepted]
                    )
                except ForgeError as again:
                    if again.status != 422:
                        raise
                else:
                    return PostedReview(
                        id=int(answer["id"]),
                        job_id=review.job_id,
                        body=str(answer.get("body") or body),
                        url=answer.get("html_url"),
                        inline_posted=len(accepted),
                        inline_rejected=len(refused),
                        rejected=tuple(refused),
                    )
            # None refused by the diff, yet refused, or still refused: the summary lists all.
            body = render_summary_only(review, "GitHub did not accept them on this diff")
            answer = await self._create_review(repo, number, review, body, [])
            return PostedReview(
                id=int(answer["id"]),
                job_id=review.job_id,
                body=str(answer.get("body") or body),
                url=answer.get("html_url"),
                inline_rejected=len(comments),
                summary_only=True,
                rejected=tuple(range(len(comments))),
            )
        return PostedReview(
            id=int(answer["id"]),
            job_id=review.job_id,
            body=str(answer.get("body") or ""),
            url=answer.get("html_url"),
            inline_posted=len(comments),
        )

    async def _refused_comments(self, repo: str, number: int, review: ReviewToPost) -> list[int]:
        """Indexes of the review's comments whose lines the pull request's diff does not show
        (as GitHub serves it now); all of them when the diff cannot be read."""
        try:
            changes = await self.fetch_changes(repo, number)
        except ForgeError as exc:
            logger.warning(
                "cannot read the diff of %s#%s to sort out refused comments: %s",
                repo,
                number,
                exc,
                extra={"action": "post_review_refused_unread", "job_id": review.job_id},
            )
            return list(range(len(review.comments)))
        shown = {item.path: parse_diff_lines(item.patch) for item in changes.files}
        return [
            index
            for index, comment in enumerate(review.comments)
            if not comment_fits(comment, shown.get(comment.path))
        ]

    async def _create_review(
        self,
        repo: str,
        number: int,
        review: ReviewToPost,
        body: str,
        comments: list[dict[str, Any]],
    ) -> dict[str, Any]:
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "number": str(number)}
        data: dict[str, Any] = {"body": body, "event": "COMMENT", "comments": comments}
        if review.head_sha:
            data["commit_id"] = review.head_sha
        marker = render_marker(review.job_id)

        async def create(token: str) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                await self._api.post(
                    "/repos/{owner}/{repo}/pulls/{number}/reviews",
                    url_vars,
                    data=data,
                    oauth_token=token,
                ),
            )

        async def recheck() -> dict[str, Any] | None:
            # A retried POST may follow one GitHub did store: look before posting again.
            found = await self.find_posted_review(repo, number, marker)
            if found is None:
                return None
            return {"id": found.id, "body": found.body, "html_url": found.url}

        return await self._call(
            "post_review", create, repo=repo, write=WriteValue.REVIEW, recheck=recheck
        )

    async def find_comment(self, repo: str, number: int, marker: str) -> int | None:
        """The id of the PR's first conversation comment carrying `marker`, or None."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "number": str(number)}

        async def search(token: str) -> int | None:
            async for item in self._api.getiter(
                "/repos/{owner}/{repo}/issues/{number}/comments?per_page=100",
                url_vars,
                oauth_token=token,
            ):
                if marker in str(item.get("body") or ""):
                    return int(item["id"])
            return None

        return await self._call("find_comment", search, repo=repo)

    async def post_comment(
        self, repo: str, number: int, body: str, *, marker: str | None = None
    ) -> int:
        """Post an issue comment on the PR; returns its id. With the `marker` the body carries,
        a retried POST first looks for the comment an earlier try may have left."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "number": str(number)}

        async def create(token: str) -> int:
            answer = await self._api.post(
                "/repos/{owner}/{repo}/issues/{number}/comments",
                url_vars,
                data={"body": body},
                oauth_token=token,
            )
            return int(answer["id"])

        async def recheck() -> int | None:
            return await self.find_comment(repo, number, marker) if marker else None

        return await self._call(
            "post_comment", create, repo=repo, write=WriteValue.FIRST_SUMMARY, recheck=recheck
        )

    async def add_reaction(
        self, repo: str, comment_id: int, reaction: Reaction, *, number: int | None = None
    ) -> None:
        """React to an issue comment (acknowledges a command)."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "comment_id": str(comment_id)}

        async def create(token: str) -> None:
            await self._api.post(
                "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions",
                url_vars,
                data={"content": reaction},
                oauth_token=token,
            )

        await self._call("add_reaction", create, repo=repo, write=WriteValue.SUMMARY_EDIT)

    async def get_permission(self, repo: str, user: str) -> Permission:
        """Return the user's role on the repository; "none" when GitHub knows no such user."""
        owner, name = split_repo(repo)
        url_vars = {"owner": owner, "repo": name, "user": user}

        async def read(token: str) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                await self._api.getitem(
                    "/repos/{owner}/{repo}/collaborators/{user}/permission",
                    url_vars,
                    oauth_token=token,
                ),
            )

        try:
            answer = await self._call("get_permission", read, repo=repo)
        except ForgeNotFound:
            return "none"
        return permission_from_github(answer)

    # -- the review's status on the head commit -----------------------------------------------

    async def publish_status(self, update: StatusUpdate) -> StatusWritten:
        """Write the review's status: a check run as an App, a commit status with a token.

        Spent from the budget like every content-creating call. Raises ForgeError (the caller
        logs it; a status never holds up a review).
        """
        owner, name = split_repo(update.repo)
        url_vars = {"owner": owner, "repo": name}
        if self._token is not None:
            data: dict[str, Any] = {
                "state": github_commit_state(update),
                "context": STATUS_NAME,
                "description": shorten(update.description, GITHUB_DESCRIPTION_LIMIT),
            }
            if update.details_url:
                data["target_url"] = update.details_url

            async def create_status(token: str) -> None:
                await self._api.post(
                    "/repos/{owner}/{repo}/statuses/{sha}",
                    {**url_vars, "sha": update.head_sha},
                    data=data,
                    oauth_token=token,
                )

            await self._call(
                "create_status", create_status, repo=update.repo, write=status_value(update)
            )
            return StatusWritten("commit_status")
        body: dict[str, Any] = {
            "status": update.state,
            "output": {"title": update.title, "summary": update.summary[:65535]},
            "external_id": str(update.job_id),
        }
        if update.conclusion is not None and update.state == "completed":
            body["conclusion"] = update.conclusion
        if update.details_url:
            body["details_url"] = update.details_url
        run_id = update.check_run_id

        async def write_run(token: str) -> dict[str, Any]:
            if run_id is None:
                created = {"name": STATUS_NAME, "head_sha": update.head_sha, **body}
                answer = await self._api.post(
                    "/repos/{owner}/{repo}/check-runs", url_vars, data=created, oauth_token=token
                )
            else:
                answer = await self._api.patch(
                    "/repos/{owner}/{repo}/check-runs/{run_id}",
                    {**url_vars, "run_id": run_id},
                    data=body,
                    oauth_token=token,
                )
            return cast(dict[str, Any], answer)

        answer = await self._call(
            "write_check_run",
            write_run,
            repo=update.repo,
            installation_id=update.installation_id,
            write=status_value(update),
        )
        return StatusWritten("check_run", str(answer["id"]))


def github_comment(comment: InlineComment) -> dict[str, Any]:
    """A review comment as GitHub's create-a-review takes it (a range names its first line)."""
    data: dict[str, Any] = {
        "path": comment.path,
        "line": comment.line,
        "side": comment.side,
        "body": with_suggestion(comment.body, comment.suggestion),
    }
    if comment.start_line is not None:
        data["start_line"] = comment.start_line
        data["start_side"] = comment.side
    return data


def comment_fits(comment: InlineComment, lines: DiffLines | None) -> bool:
    """Whether every line a comment covers shows in a file's diff."""
    if lines is None:
        return False
    first = comment.start_line if comment.start_line is not None else comment.line
    return all(lines.has_line(number, comment.side) for number in range(first, comment.line + 1))


def split_repo(repo: str) -> tuple[str, str]:
    """Split "owner/name"; raises ForgeError on anything else."""
    owner, _, name = repo.partition("/")
    if not owner or not name or "/" in name:
        raise ForgeError(f"not a GitHub repository name: {repo!r}", status=400)
    return owner, name


def file_change_from_github(item: dict[str, Any]) -> FileChange:
    """Turn one `pulls/{n}/files` entry into a FileChange (patch None when GitHub omits it)."""
    patch = item.get("patch")
    return FileChange(
        path=str(item["filename"]),
        additions=int(item.get("additions") or 0),
        deletions=int(item.get("deletions") or 0),
        patch=str(patch) if patch else None,
        status=str(item.get("status") or "modified"),
        previous_path=item.get("previous_filename"),
        blob_sha=str(item["sha"]) if item.get("sha") else None,
    )


def permission_from_github(answer: dict[str, Any]) -> Permission:
    """Read the finest role GitHub gives (role_name), else the legacy permission field."""
    for key in ("role_name", "permission"):
        value = str(answer.get(key) or "").lower()
        for permission in PERMISSIONS:
            if value == permission:
                return permission
    return "none"
