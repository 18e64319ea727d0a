"""The real GitLab client (python-gitlab in a thread) against the forge emulator."""

from __future__ import annotations

import pytest

from bot.clock import VirtualClock
from bot.emulator import Fault, ForgeEmulator, generate_file_changes, seed_note
from bot.errors import ForgeError, ForgeNotFound, LeaseLost
from bot.forges.base import (
    InlineComment,
    RetryPolicy,
    ReviewToPost,
    WriteGuard,
    always_held,
    find_marker,
    guarded_writes,
    parse_diff_lines,
    render_marker,
)
from bot.forges.gitlab import GitLabClient, permission_from_access_level
from bot.forges.quiet import GitLabQuiet
from bot.model import FileChange

pytestmark = pytest.mark.emulator(github_tokens=set(), gitlab_tokens={"glpat-test"})

SMALL = generate_file_changes(changed_lines=8, files=1, seed=99)
REPO = "acme/platform/api"


def make_client(emulator: ForgeEmulator, clock: VirtualClock, **options: object) -> GitLabClient:
    return GitLabClient(
        url=emulator.gitlab_url,
        token=options.pop("token", "glpat-test"),  # type: ignore[arg-type]
        clock=clock.now,
        sleep=clock.sleep,
        timeout_s=5.0,
        **options,  # type: ignore[arg-type]
    )


def context_line(change: FileChange) -> tuple[int, int]:
    lines = parse_diff_lines(change.patch)
    new_line = min(lines.context)
    return new_line, lines.context[new_line]


async def test_fetch_changes_reads_the_newest_version_and_pages_the_diffs(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    first = generate_file_changes(changed_lines=100, files=10, seed=5)
    emulator.state.add_pull("gitlab", REPO, 3, files=first)
    second = generate_file_changes(changed_lines=300, files=45, seed=6, binary_files=1)
    pushed = emulator.state.push("gitlab", REPO, 3, files=second)
    client = make_client(emulator, clock, per_page=20)

    changes = await client.fetch_changes(REPO, 3)

    assert changes.head_sha == pushed.head_sha
    assert changes.base_sha == pushed.base_sha and changes.start_sha == pushed.start_sha
    assert [item.path for item in changes.files] == [item.path for item in second]
    assert [(item.additions, item.deletions) for item in changes.files] == [
        (item.additions, item.deletions) for item in second
    ]
    assert changes.files[-1].patch is None  # the binary file
    assert not changes.truncated
    assert emulator.state.count_requests("gitlab.diffs") == 3  # 46 entries at 20 a page


async def test_fetch_changes_by_numeric_project_id_and_file_cap(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=60, files=30, seed=7)
    emulator.state.add_pull("gitlab", REPO, 4, files=files, project_id=7001)
    client = make_client(emulator, clock, max_files=25)

    changes = await client.fetch_changes(REPO, 4, project_id=7001)

    assert len(changes.files) == 25
    assert changes.truncated


async def test_missing_merge_request_is_forge_not_found(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    emulator.state.add_pull("gitlab", REPO, 5, files=SMALL)
    client = make_client(emulator, clock)
    with pytest.raises(ForgeNotFound):
        await client.fetch_changes(REPO, 404)
    with pytest.raises(ForgeNotFound):
        await client.fetch_changes("no/such/project", 1)


async def test_post_review_places_positions_and_posts_the_summary_once(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=40, files=2, seed=8)
    pull = emulator.state.add_pull("gitlab", REPO, 6, files=files)
    client = make_client(emulator, clock)
    changes = await client.fetch_changes(REPO, 6)
    added = min(parse_diff_lines(files[0].patch).added)
    context_new, context_old = context_line(files[1])
    review = ReviewToPost(
        job_id=61,
        body="Review summary.",
        comments=(
            InlineComment(files[0].path, added, "Check this."),
            InlineComment(files[1].path, context_new, "Unchanged but suspicious."),
        ),
        base_sha=changes.base_sha,
        start_sha=changes.start_sha,
        head_sha=changes.head_sha,
    )

    posted = await client.post_review(REPO, 6, review)
    again = await client.post_review(REPO, 6, review)

    discussions = emulator.state.posted(kind="discussion", number=6)
    positions = [item.data["position"] for item in discussions]
    assert [(p["new_path"], p.get("old_line"), p.get("new_line")) for p in positions] == [
        (files[0].path, None, added),
        (files[1].path, context_old, context_new),
    ]
    assert all(p["head_sha"] == pull.newest.head_sha for p in positions)
    notes = emulator.state.posted(kind="note", number=6)
    assert len(notes) == 1 and find_marker(notes[0].body) == 61
    assert posted.inline_posted == 2 and posted.inline_rejected == 0
    assert again.already_posted and again.id == posted.id
    found = await client.find_posted_review(REPO, 6, render_marker(61))
    assert found is not None and found.id == posted.id


async def test_bad_position_is_listed_in_the_summary(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=9)
    emulator.state.add_pull("gitlab", REPO, 7, files=files)
    client = make_client(emulator, clock)
    outside = max(parse_diff_lines(files[0].patch).added) + 300
    review = ReviewToPost(
        job_id=71,
        body="Summary.",
        comments=(InlineComment(files[0].path, outside, "Not on the diff."),),
    )

    posted = await client.post_review(REPO, 7, review)

    assert emulator.state.count_requests("gitlab.discussions.create", status=400) == 1
    assert emulator.state.posted(kind="discussion", number=7) == []
    notes = emulator.state.posted(kind="note", number=7)
    assert len(notes) == 1
    assert f"`{files[0].path}` line {outside}" in (notes[0].body or "")
    assert posted.summary_only and posted.inline_rejected == 1


async def test_crash_before_the_summary_resumes_without_duplicate_discussions(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=10)
    emulator.state.add_pull("gitlab", REPO, 8, files=files)
    emulator.state.add_fault("gitlab.notes.create", Fault.server_error(500), times=2)
    client = make_client(emulator, clock, retry=RetryPolicy(attempts=2, base_delay_s=1.0))
    added = min(parse_diff_lines(files[0].patch).added)
    review = ReviewToPost(
        job_id=81, body="Summary.", comments=(InlineComment(files[0].path, added, "Hmm."),)
    )

    with pytest.raises(ForgeError) as caught:
        await client.post_review(REPO, 8, review)
    assert caught.value.status == 500
    posted = await client.post_review(REPO, 8, review)

    assert len(emulator.state.posted(kind="discussion", number=8)) == 1
    assert len(emulator.state.posted(kind="note", number=8)) == 1
    assert posted.inline_posted == 1


async def test_server_errors_retry_and_429_obeys_retry_after(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    emulator.state.add_pull("gitlab", REPO, 9, files=SMALL)
    emulator.state.add_fault("gitlab.versions", Fault.server_error(502))
    emulator.state.add_fault("gitlab.diffs", Fault.too_many_requests(retry_after=9))
    client = make_client(emulator, clock, retry=RetryPolicy(attempts=3, base_delay_s=2.0))

    changes = await client.fetch_changes(REPO, 9)

    assert len(changes.files) == 1
    assert clock.sleeps == [2.0, 9.0]


async def test_permission_maps_access_levels(emulator: ForgeEmulator, clock: VirtualClock) -> None:
    emulator.state.add_pull("gitlab", REPO, 10, files=SMALL)
    emulator.state.set_access_level(REPO, "dev", 30)
    emulator.state.set_access_level(REPO, "reporter", 20)
    emulator.state.set_access_level(REPO, "owner", 50)
    emulator.state.user_id("outsider")
    client = make_client(emulator, clock)

    assert await client.get_permission(REPO, "dev") == "write"
    assert await client.get_permission(REPO, "reporter") == "triage"
    assert await client.get_permission(REPO, "owner") == "admin"
    assert await client.get_permission(REPO, "outsider") == "none"
    assert await client.get_permission(REPO, "ghost") == "none"
    assert [permission_from_access_level(level) for level in (0, 10, 40)] == [
        "none",
        "read",
        "maintain",
    ]


async def test_reaction_awards_an_emoji_on_the_note(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    emulator.state.add_pull("gitlab", REPO, 11, files=SMALL)
    note_id = seed_note(emulator.state, REPO, 11, user="dev", body="/review status")
    client = make_client(emulator, clock)

    await client.add_reaction(REPO, note_id, "+1", number=11)
    await client.add_reaction(REPO, note_id, "eyes")  # no MR iid: nothing to do

    awards = emulator.state.posted(kind="award_emoji")
    assert [(item.body, item.data["note_id"]) for item in awards] == [("thumbsup", note_id)]
    comment_id = await client.post_comment(REPO, 11, "Status: queued at P2.")
    assert emulator.state.posted(kind="note", number=11)[0].data["id"] == comment_id


async def test_bad_token_is_not_retried(emulator: ForgeEmulator, clock: VirtualClock) -> None:
    emulator.state.add_pull("gitlab", REPO, 12, files=SMALL)
    client = make_client(emulator, clock, token="wrong")
    with pytest.raises(ForgeError) as caught:
        await client.fetch_changes(REPO, 12)
    assert caught.value.status == 401 and not caught.value.retryable
    assert clock.sleeps == []


def claim_lost_once_written(emulator: ForgeEmulator, number: int, discussions: int) -> WriteGuard:
    """A posting claim that holds until the MR has `discussions` inline discussions: lost while
    the request was on the wire (a process paused after its last check, resumed after a
    takeover)."""

    async def held() -> bool:
        return len(emulator.state.posted(kind="discussion", number=number)) < discussions

    return held


def one_finding(files: list[FileChange], *, first_attempt: bool) -> ReviewToPost:
    added = min(parse_diff_lines(files[0].patch).added)
    return ReviewToPost(
        job_id=81,
        body="Review summary.",
        comments=(InlineComment(files[0].path, added, "Check this."),),
        first_attempt=first_attempt,
    )


def diff_notes(emulator: ForgeEmulator, number: int) -> list[dict[str, object]]:
    pull = emulator.state.pulls[("gitlab", REPO, number)]
    return [note for note in pull.notes if note.get("type") == "DiffNote"]


async def test_a_stale_attempt_whose_finding_lands_second_takes_it_back(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=11)
    emulator.state.add_pull("gitlab", REPO, 21, files=files)
    client = make_client(emulator, clock)
    # The attempt that took the job over posted the review first.
    await client.post_review(REPO, 21, one_finding(files, first_attempt=False))
    [kept] = diff_notes(emulator, 21)
    # The paused first attempt resumes and sends the finding it had checked its claim for.
    with guarded_writes(claim_lost_once_written(emulator, 21, 2)), pytest.raises(LeaseLost):
        await client.post_review(REPO, 21, one_finding(files, first_attempt=True))
    assert diff_notes(emulator, 21) == [kept]
    assert len(emulator.state.posted(kind="discussion", number=21)) == 2
    pull = emulator.state.pulls[("gitlab", REPO, 21)]
    assert [[note["id"] for note in item["notes"]] for item in pull.discussions] == [[kept["id"]]]


async def test_a_takeover_whose_finding_lands_after_a_stale_one_takes_its_own_back(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=12)
    emulator.state.add_pull("gitlab", REPO, 22, files=files)
    client, stale_client = make_client(emulator, clock), make_client(emulator, clock)
    landed: list[int] = []

    async def stale_lands_in_between() -> bool:
        # The takeover looked for earlier findings and found none; the stale request lands now.
        looked = any(
            item.method == "GET" and item.path.endswith("/notes")
            for item in emulator.state.requests
        )
        if looked and not landed:
            with guarded_writes(always_held):
                await stale_client.post_review(REPO, 22, one_finding(files, first_attempt=True))
            landed.extend(int(str(note["id"])) for note in diff_notes(emulator, 22))
        return True

    with guarded_writes(stale_lands_in_between):
        posted = await client.post_review(REPO, 22, one_finding(files, first_attempt=False))
    assert posted.inline_posted == 1
    assert [note["id"] for note in diff_notes(emulator, 22)] == landed and len(landed) == 1
    assert len(emulator.state.posted(kind="discussion", number=22)) == 2
    assert len(emulator.state.posted(kind="note_delete", number=22)) == 1


async def test_a_first_attempt_holding_its_claim_lists_nothing_after_a_finding(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=13)
    emulator.state.add_pull("gitlab", REPO, 23, files=files)
    client = make_client(emulator, clock)
    with guarded_writes(always_held):
        await client.post_review(REPO, 23, one_finding(files, first_attempt=True))
    # Its writes only: the discussion, then the review's note; no listing of either.
    listed = [
        (item.method, item.path.rsplit("/", 1)[-1])
        for item in emulator.state.requests
        if item.path.endswith(("/notes", "/discussions"))
    ]
    assert listed == [("POST", "discussions"), ("POST", "notes")]


# -- the same through quiet reviews (one discussion per finding, by bot.forges.quiet) ---------


async def test_a_stale_quiet_finding_landing_second_is_taken_back(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=14)
    emulator.state.add_pull("gitlab", REPO, 24, files=files)
    quiet = GitLabQuiet(make_client(emulator, clock))
    # The attempt that took the job over posted the finding first.
    kept = await quiet.post_findings(REPO, 24, one_finding(files, first_attempt=False))
    # The paused first attempt resumes and sends the finding it had checked its claim for.
    with guarded_writes(claim_lost_once_written(emulator, 24, 2)), pytest.raises(LeaseLost):
        await quiet.post_findings(REPO, 24, one_finding(files, first_attempt=True))
    pull = emulator.state.pulls[("gitlab", REPO, 24)]
    assert [item["id"] for item in pull.discussions] == [kept.refs[0]]
    assert len(diff_notes(emulator, 24)) == 1


async def test_a_quiet_takeover_landing_after_a_stale_finding_keeps_the_stale_one(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=15)
    emulator.state.add_pull("gitlab", REPO, 25, files=files)
    quiet = GitLabQuiet(make_client(emulator, clock))
    stale = GitLabQuiet(make_client(emulator, clock))
    landed: list[str] = []

    async def stale_lands_in_between() -> bool:
        # The takeover listed the discussions and found none; the stale request lands now.
        looked = any(
            item.method == "GET" and item.path.endswith("/discussions")
            for item in emulator.state.requests
        )
        if looked and not landed:
            with guarded_writes(always_held):
                posted = await stale.post_findings(REPO, 25, one_finding(files, first_attempt=True))
            landed.append(posted.refs[0] or "")
        return True

    with guarded_writes(stale_lands_in_between):
        posted = await quiet.post_findings(REPO, 25, one_finding(files, first_attempt=False))
    pull = emulator.state.pulls[("gitlab", REPO, 25)]
    # The finding is held by the stale attempt's discussion, and the store keeps that as its ref.
    assert [item["id"] for item in pull.discussions] == landed == [posted.refs[0]]
    assert len(emulator.state.posted(kind="note_delete", number=25)) == 1


async def test_a_quiet_finding_whose_answer_was_lost_is_not_posted_again(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=16)
    emulator.state.add_pull("gitlab", REPO, 26, files=files)
    emulator.state.add_fault("gitlab.discussions.create", Fault.lost_response(), times=1)
    quiet = GitLabQuiet(make_client(emulator, clock, retry=RetryPolicy(attempts=3)))
    posted = await quiet.post_findings(REPO, 26, one_finding(files, first_attempt=True))
    pull = emulator.state.pulls[("gitlab", REPO, 26)]
    assert [item["id"] for item in pull.discussions] == [posted.refs[0]]
