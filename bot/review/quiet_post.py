"""Post a finished review quietly: only new findings inline, resolutions, one living summary.

The decisions are pure (bot.review.quiet_plan, bot.review.living_summary); this module reads
what they need, calls the forge and records what was said. Idempotent like posting: the job's
marker on the inline findings and the summary's marker find what a crash left posted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from bot.budget.intent import WriteIntent, writing
from bot.clock import Clock
from bot.errors import ForgeError, ForgeNotFound, LeaseLost
from bot.forges.base import (
    ForgeClient,
    ReviewToPost,
    always_held,
    append_marker,
    guarded_writes,
)
from bot.forges.quiet import PostedFindings, QuietForge, quiet_forge_for
from bot.model import Chunk, Job, JobState
from bot.queue.findings import FindingStore, FindingToRecord, PullRef, StoredFinding
from bot.queue.records import Fence
from bot.queue.store import QueueStore
from bot.review.assemble import AssembledReview, SkippedFile, assemble_review
from bot.review.comments import inline_comment, review_diff
from bot.review.fingerprint import FingerprintedFinding, fingerprint_findings, patches_of
from bot.review.living_summary import (
    ListedFinding,
    ReviewedCommit,
    SummaryFacts,
    render_living_summary,
)
from bot.review.planned_diffs import PlannedDiffs
from bot.review.poster import (
    PostingOutcome,
    PostingSettings,
    claim_finished_job,
    lease_lost,
    posting_failed,
    posting_guard,
    render_comment,
    review_chunk_of,
)
from bot.review.quiet_plan import QuietDecision, QuietSettings, decide_quiet_review
from bot.review.repo_settings import EXCLUDED
from bot.review.summary_place import LOOK_IT_UP, SummaryPlace, summary_place

log = logging.getLogger(__name__)

REFUSED_NOTE = "summary only: the forge refused its line"
# Every finding goes through the quiet decision; the inline cap applies there.
ALL_FINDINGS = 1_000_000

StillHeld = Callable[[], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class QuietPosting:
    """What quiet posting needs besides the queue: the findings store and the server defaults."""

    findings: FindingStore
    settings: QuietSettings = field(default_factory=QuietSettings)
    # The diffs planning read in this process, so that a post need not read them again.
    planned: PlannedDiffs = field(default_factory=PlannedDiffs)


def settings_for(job: Job, defaults: QuietSettings) -> QuietSettings:
    """The server defaults, with what the repository's settings file set for this job."""
    chosen: Mapping[str, Any] = job.pull_details.get("quiet") or {}
    try:
        return QuietSettings(
            min_inline_severity=str(
                chosen.get("min_inline_severity", defaults.min_inline_severity)
            ),
            inline_cap=int(chosen.get("inline_cap", defaults.inline_cap)),
        )
    except (TypeError, ValueError):
        return defaults


def listed(item: FingerprintedFinding, note: str = "") -> ListedFinding:
    finding = item.finding
    return ListedFinding(finding.path, finding.line, finding.severity, finding.body, note)


def listed_stored(item: StoredFinding) -> ListedFinding:
    return ListedFinding(item.path, item.line, item.severity, item.body)


def inline_review(job: Job, decision: QuietDecision, chunks: Sequence[Chunk] = ()) -> ReviewToPost:
    """The inline comments of the new findings, as one review (GitHub) or discussions."""
    diff: Mapping[str, Any] = job.pull_details.get("diff") or {}
    head_sha = str(diff.get("head_sha") or job.head_sha)
    diff_of = review_diff(file for chunk in chunks for file in chunk.files)
    count = len(decision.inline)
    body = (
        f"review-bot: {count} new finding{'s' if count != 1 else ''} on commit "
        f"`{head_sha[:12]}`; the summary comment is kept up to date."
    )
    return ReviewToPost(
        job_id=job.id,
        body=body,
        comments=tuple(
            inline_comment(
                item.finding,
                diff_of,
                body=render_comment(item.finding.severity, item.finding.body),
            )
            for item in decision.inline
        ),
        head_sha=head_sha,
        base_sha=str(diff["base_sha"]) if diff.get("base_sha") else None,
        start_sha=str(diff["start_sha"]) if diff.get("start_sha") else None,
    )


def findings_to_record(
    decision: QuietDecision, posted: PostedFindings | None
) -> list[FindingToRecord]:
    """The new findings as the store keeps them; refused inline ones count as summary-only."""
    rejected = set(posted.rejected) if posted is not None else set()
    refs = posted.refs if posted is not None else {}
    records: list[FindingToRecord] = []
    for index, item in enumerate(decision.inline):
        ref = refs.get(index)
        records.append(_record(item, inline=index not in rejected, ref=ref))
    records.extend(_record(item, inline=False, ref=None) for item in decision.summary_only)
    return records


def _record(item: FingerprintedFinding, *, inline: bool, ref: str | None) -> FindingToRecord:
    finding = item.finding
    return FindingToRecord(
        fingerprint=item.fingerprint,
        path=finding.path,
        line=finding.line,
        side=finding.side,
        severity=finding.severity,
        body=finding.body,
        anchor_text=item.anchor_text,
        inline=inline,
        forge_ref=ref,
    )


def summary_facts(
    job: Job,
    assembled: AssembledReview,
    decision: QuietDecision,
    *,
    commits: Sequence[ReviewedCommit],
    rejected: int,
    settings: QuietSettings,
    level_reasons: Sequence[str] = (),
    refused: Collection[int] = (),
) -> SummaryFacts:
    """What the living summary says after this review (pure)."""
    increment: Mapping[str, Any] = job.pull_details.get("increment") or {}
    mode = str(increment.get("mode") or "full")
    reason = str(increment.get("reason") or "the whole pull request")
    floor_note = f"summary only: below {settings.min_inline_severity}"
    new = [
        listed(item, REFUSED_NOTE if index in refused else "")
        for index, item in enumerate(decision.inline)
    ]
    over_cap = {item.fingerprint for item in decision.summary_only[: decision.over_cap]}
    for item in decision.summary_only:
        note = "summary only: over the inline cap" if item.fingerprint in over_cap else floor_note
        new.append(listed(item, note))
    open_findings = [*new, *(listed_stored(item) for item in decision.still_open)]
    notes: list[str] = []
    if not assembled.complete:
        names = ", ".join(assembled.incomplete_paths) or "some files"
        notes.append(f"**Partial review:** {names} could not be reviewed (a part failed).")
    if rejected:
        notes.append(f"{rejected} finding(s) could not be placed on the diff; listed below.")
    if assembled.dropped:
        notes.append(f"{assembled.dropped} suggested comment(s) were dropped as invalid.")
    notes.extend(str(note) for note in job.pull_details.get("settings_notes") or ())
    skipped = [*assembled.skipped]
    skipped.extend(
        SkippedFile(str(item["path"]), str(item["reason"]))
        for item in increment.get("unchanged", ())
    )
    skipped.extend(
        SkippedFile(str(path), EXCLUDED) for path in job.pull_details.get("excluded") or ()
    )
    not_anchored = [
        ListedFinding(item.path, item.line, item.severity, item.body)
        for item in assembled.unanchored
    ]
    return SummaryFacts(
        not_anchored=not_anchored,
        head_sha=str((job.pull_details.get("diff") or {}).get("head_sha") or job.head_sha),
        mode=mode,
        mode_reason=reason,
        level=str(job.level),
        level_reasons=_with_note(list(level_reasons or job.reasons), increment.get("level_note")),
        new=new,
        resolved=[listed_stored(item) for item in decision.resolved],
        open_findings=open_findings,
        repeated=len(decision.repeated),
        skipped=skipped,
        commits=commits,
        notes=notes,
        job_id=job.id,
        forge=job.forge,
    )


def _with_note(reasons: list[str], note: Any) -> list[str]:
    if note and not any(str(note) in reason for reason in reasons):
        reasons.append(str(note))
    return reasons


async def upsert_summary(
    quiet: QuietForge,
    job: Job,
    body: str,
    *,
    still_held: StillHeld | None = None,
    place: SummaryPlace = LOOK_IT_UP,
    attempt: int = 1,
) -> int:
    """Edit the pull request's summary in place, or create it the first time.

    The body carries the job's marker, so a later attempt at the same job finds it written.
    `still_held` is asked right before the forge write; LeaseLost when it says no. Where
    `place` is known the forge's comments are not searched; a known summary that is gone
    (deleted by hand) is looked for, then written anew. A summary created twice (see
    `one_summary`) is taken back to one.
    """
    body = append_marker(body, job.id)
    look = not place.known
    if place.comment_id is not None:
        await _still_held(still_held, job)
        try:
            await quiet.edit_summary(job.repo, job.number, place.comment_id, body)
        except ForgeNotFound:
            log.info(
                "job %s: summary comment %s is gone; looking for it",
                job.id,
                place.comment_id,
                extra={"action": "summary_gone", "job_id": job.id},
            )
            look = True
        else:
            return place.comment_id
    existing = await quiet.find_summary(job.repo, job.number) if look else None
    if existing is not None and existing.body.strip() == body.strip():
        return existing.id
    await _still_held(still_held, job)
    if existing is None:
        created = await quiet.create_summary(job.repo, job.number, body)
        return await one_summary(quiet, job, created, body, still_held, attempt=attempt)
    await quiet.edit_summary(job.repo, job.number, existing.id, body)
    return existing.id


async def _still_held(still_held: StillHeld | None, job: Job) -> None:
    """LeaseLost unless the posting claim still holds (asked right before a forge write)."""
    if still_held is not None and not await still_held():
        raise LeaseLost(f"job {job.id}: the posting claim was taken over")


async def one_summary(
    quiet: QuietForge,
    job: Job,
    created: int,
    body: str,
    still_held: StillHeld | None,
    *,
    attempt: int,
) -> int:
    """After creating the summary: if another attempt at the job created one too, keep the
    oldest; the summary's id.

    A forge has no conditional writes: a process paused between its claim's last check and
    its request sends the request when it resumes, after another attempt took the job over.
    Each creator looks once it is done (a taking-over attempt always, a first attempt only
    when it finds its claim gone), and the later of two creators takes its own back, so one
    summary is left whichever order they land in. The one taking over writes its text into
    the oldest; a stale one takes its own back and stops (LeaseLost).
    """
    stale = still_held is not None and not await still_held()
    if not stale and attempt <= 1:
        return created
    with guarded_writes(always_held):  # taking back its own comment is safe, even when stale
        older = [
            item for item in await quiet.list_summaries(job.repo, job.number) if item.id < created
        ]
        if older:
            await quiet.delete_summary(job.repo, job.number, created)
            log.warning(
                "job %s: summary %s written twice (by attempt %s); kept %s",
                job.id,
                created,
                attempt,
                older[0].id,
                extra={"action": "summary_doubled", "job_id": job.id},
            )
    if stale:
        raise LeaseLost(
            f"job {job.id}: the posting claim was taken over as the summary was written"
        )
    if not older:
        return created
    await quiet.edit_summary(job.repo, job.number, older[0].id, body)
    return older[0].id


async def post_quiet_review(
    store: QueueStore,
    posting: QuietPosting,
    forges: Mapping[str, ForgeClient],
    job_id: int,
    *,
    now: datetime,
    settings: PostingSettings | None = None,
    clock: Clock | None = None,
) -> PostingOutcome:
    """Post a finished job's review quietly, then end the job; forge errors as posting does.

    With `clock`, a forge write goes out only while the posting claim has not run out on it.
    """
    settings = settings or PostingSettings()
    claim = await claim_finished_job(
        store,
        forges,
        job_id,
        now=now,
        settings=settings,
        can_post=lambda client: quiet_forge_for(client) is not None,
    )
    if isinstance(claim, PostingOutcome):
        return claim
    job, client, fence = claim.job, claim.client, claim.fence
    quiet = quiet_forge_for(client)
    assert quiet is not None  # can_post said so
    held = posting_guard(store, job.id, fence, settings=settings, clock=clock)
    context = {"job_id": job.id, "forge": job.forge}
    try:
        # Every forge call of the post asks right before it goes out whether the claim holds,
        # and spends from the forge's budget at the job's level.
        with (
            guarded_writes(held),
            writing(WriteIntent(level=int(job.level), job_id=job.id)),
        ):
            record = await _post(
                store, posting, client, quiet, job, now=now, fence=fence, held=held
            )
    except (LeaseLost, ForgeError) as exc:
        return await posting_failed(store, claim, exc, now=now, settings=settings)
    if not await store.finish_job(job.id, now=now, state=JobState.DONE, review=record, fence=fence):
        return lease_lost(job.id, fence, forge=job.forge)
    log.info(
        "job %s: %d new inline, %d summary only, %d said before, %d resolved",
        job.id,
        record["inline_posted"],
        record["summary_only_findings"],
        record["repeated"],
        record["resolved"],
        extra={"action": "quiet_review_posted", **context},
    )
    return PostingOutcome(job_id, "posted", review_id=record.get("forge_review_id"))


async def _post(
    store: QueueStore,
    posting: QuietPosting,
    client: ForgeClient,
    quiet: QuietForge,
    job: Job,
    *,
    now: datetime,
    fence: Fence,
    held: Callable[[], Awaitable[bool]],
) -> dict[str, Any]:
    """Write the review on the forge and record its findings; every write (forge or database)
    only while `held` says `fence` holds the job's posting claim, else LeaseLost."""
    still_held = held
    chunks = await store.chunk_results(job.id)
    assembled = assemble_review(
        [review_chunk_of(chunk) for chunk in chunks],
        skipped=list(job.pull_details.get("skipped") or ()),
        max_comments=ALL_FINDINGS,
    )
    patches = patches_of(file for chunk in chunks for file in chunk.files)
    fingerprinted = fingerprint_findings(assembled.findings, patches)
    pull = PullRef(job.forge, job.repo, job.number)
    stored = await posting.findings.findings_of(pull)
    reviewed_head = str((job.pull_details.get("diff") or {}).get("head_sha") or job.head_sha)
    current = posting.planned.take(job.id, head_sha=reviewed_head)
    if current is None:  # planned in another process, or forgotten here
        current = await client.fetch_changes(
            job.repo,
            job.number,
            project_id=job.pull_details.get("project_id"),
            installation_id=job.pull_details.get("installation_id"),
        )
    quiet_settings = settings_for(job, posting.settings)
    decision = decide_quiet_review(
        fingerprinted,
        stored,
        {item.path: item.patch for item in current.files},
        settings=quiet_settings,
        job_id=job.id,
    )
    posted: PostedFindings | None = None
    if decision.inline:
        await _still_held(still_held, job)
        # A first attempt cannot have posted the findings already: no search for them.
        review = replace(inline_review(job, decision, chunks), first_attempt=fence.attempt == 1)
        posted = await quiet.post_findings(job.repo, job.number, review)
    await posting.findings.record(
        pull, findings_to_record(decision, posted), job_id=job.id, now=now, fence=fence
    )
    resolved = await posting.findings.resolve(
        pull, [item.fingerprint for item in decision.resolved], job_id=job.id, now=now, fence=fence
    )
    threads_resolved = 0
    for item in decision.resolved:
        if item.forge_ref and item.fingerprint in resolved:
            await _still_held(still_held, job)
            threads_resolved += await quiet.resolve_finding(job.repo, job.number, item.forge_ref)
    heads = await posting.findings.reviewed_heads(pull)
    commits = [
        ReviewedCommit(head.head_sha, str((head.increment or {}).get("mode") or "full"))
        for head in heads
        if head.job_id != job.id
    ]
    increment: Mapping[str, Any] = job.pull_details.get("increment") or {}
    commits.append(ReviewedCommit(job.head_sha, str(increment.get("mode") or "full")))
    rejected = len(posted.rejected) if posted is not None else 0
    # A level moved after intake (the policy's look at the increment) says why in the history.
    moves = [entry for entry in await store.job_history(job.id) if entry.kind == "level"]
    level_reasons = [moves[-1].reason] if moves and moves[-1].reason else []
    body = render_living_summary(
        summary_facts(
            job,
            assembled,
            decision,
            commits=commits,
            rejected=rejected,
            settings=quiet_settings,
            level_reasons=level_reasons,
            refused=posted.rejected if posted is not None else (),
        )
    )
    # Only a first attempt can know the summary's place without looking (summary_place).
    prior = await posting.findings.prior_postings(pull, job_id=job.id) if fence.attempt == 1 else ()
    place = summary_place(fence.attempt, prior)
    summary_id = await upsert_summary(
        quiet, job, body, still_held=still_held, place=place, attempt=fence.attempt
    )
    return {
        "forge_review_id": posted.review_id if posted is not None else None,
        "summary_comment_id": summary_id,
        "inline_posted": len(decision.inline) - rejected,
        "inline_rejected": rejected,
        "summary_only_findings": len(decision.summary_only),
        "repeated": len(decision.repeated),
        "resolved": len(decision.resolved),
        "threads_resolved": threads_resolved,
        "open": decision.open_count,
        "findings": len(fingerprinted),
        "counts": dict(assembled.counts),
        "open_counts": decision.open_counts,
        "complete": assembled.complete,
        "skipped": len(assembled.skipped),
        "summary": body,
        "anchoring": dict(assembled.anchoring),
    }


__all__ = [
    "QuietPosting",
    "findings_to_record",
    "inline_review",
    "post_quiet_review",
    "settings_for",
    "summary_facts",
    "upsert_summary",
]
