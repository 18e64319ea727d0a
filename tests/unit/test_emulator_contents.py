"""Files at a commit: the emulator serves them for both forges, the clients read them once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.clock import VirtualClock
from bot.emulator import Fault, ForgeEmulator
from bot.emulator.quiet import open_pull_from_trees
from bot.emulator.repository import text_from_patch
from bot.errors import ForgeError
from bot.forges.base import ReadsManyFiles
from bot.forges.registry import ForgeRegistry
from bot.model import FileChange, Forge
from tests.support.pipeline_helpers import emulator_forges

PATCH = "\n".join(
    [
        "@@ -3,4 +3,5 @@ def handle(event):",
        "     first = 1",
        "-    second = 2",
        "+    second = 22",
        "+    third = 3",
        "     fourth = 4",
        "     return first",
        "@@ -20,2 +21,2 @@",
        "-old = 1",
        "+new = 1",
        " end = 2",
    ]
)


@pytest.fixture
async def forges(emulator: ForgeEmulator, clock: VirtualClock) -> AsyncIterator[ForgeRegistry]:
    registry = emulator_forges(emulator, clock)
    async with registry:
        yield registry


def test_a_patch_gives_its_new_side_at_its_line_numbers() -> None:
    lines = text_from_patch(PATCH).split("\n")
    assert lines[2:7] == [
        "    first = 1",
        "    second = 22",
        "    third = 3",
        "    fourth = 4",
        "    return first",
    ]
    assert lines[20:22] == ["new = 1", "end = 2"]
    assert lines[0] == lines[10] == ""  # what no hunk shows is blank
    assert len(lines) == 23 and lines[-1] == ""  # 22 lines, newline-terminated


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_a_seeded_pull_serves_its_files_at_its_head_and_nothing_at_other_shas(
    emulator: ForgeEmulator, forges: ForgeRegistry, forge: Forge
) -> None:
    change = FileChange("src/app/handler.py", additions=3, deletions=2, patch=PATCH)
    gone = FileChange("src/old.py", deletions=1, patch="@@ -1 +0,0 @@\n-x = 1", status="removed")
    pull = emulator.state.add_pull(forge, "acme/shop", 3, files=[change, gone])
    client = forges[forge]
    head = pull.newest.head_sha
    project = pull.project_id

    text = await client.read_file_at("acme/shop", change.path, ref=head, project_id=project)
    assert text == text_from_patch(PATCH)
    assert await client.read_file_at("acme/shop", gone.path, ref=head, project_id=project) is None
    assert await client.read_file_at("acme/shop", change.path, ref="f" * 40) is None
    route = "github.contents" if forge == "github" else "gitlab.file"
    assert emulator.state.count_requests(route, status=200) == 1
    assert emulator.state.count_requests(route, status=404) == 2


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_a_file_is_read_once_and_then_comes_from_the_blob_cache(
    emulator: ForgeEmulator, forges: ForgeRegistry, forge: Forge
) -> None:
    path = "lib/C#/a b?.py"  # "#" and "?" must reach the forge as part of the path
    base = {path: "x = 1\n"}
    head = {path: "x = 2\ny = 3\n"}
    pull = open_pull_from_trees(emulator.state, forge, "acme/shop", 4, base=base, head=head)
    client = forges[forge]
    sha = pull.newest.head_sha
    first = await client.read_file_at("acme/shop", path, ref=sha, project_id=pull.project_id)
    assert first == head[path]
    # GitHub lists each file's blob sha with the diff; GitLab remembers it from the first read.
    listed = (await client.fetch_changes("acme/shop", 4, project_id=pull.project_id)).files[0]
    again = await client.read_file_at(
        "acme/shop", path, ref=sha, blob_sha=listed.blob_sha, project_id=pull.project_id
    )
    assert again == first
    route = "github.contents" if forge == "github" else "gitlab.file"
    assert emulator.state.count_requests(route) == 1
    # The default branch is still what a settings file is read from.
    assert await client.read_file_at("acme/shop", path, ref="main") == base[path]


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_many_files_at_a_commit_are_read_in_one_request(
    emulator: ForgeEmulator, forges: ForgeRegistry, forge: str
) -> None:
    paths = ["lib/C#/a b?.py", "src/app.py", "docs/readme.md"]
    base = {path: f"# {path}\nx = 1\n" for path in paths}
    head = {path: f"# {path}\nx = 2\n" for path in paths}
    pull = open_pull_from_trees(emulator.state, forge, "acme/shop", 5, base=base, head=head)  # type: ignore[arg-type]
    client = forges[forge]
    assert isinstance(client, ReadsManyFiles)
    sha = pull.newest.head_sha
    listed = {
        item.path: item.blob_sha for item in (await client.fetch_changes("acme/shop", 5)).files
    }

    texts = await client.read_files_at(
        "acme/shop", [*paths, "not/there.py"], ref=sha, blob_shas=listed
    )
    assert texts == {**head, "not/there.py": None}
    assert emulator.state.count_requests(f"{forge}.graphql", status=200) == 1
    # Read once: the blob cache answers the next time, with no request.
    assert await client.read_files_at("acme/shop", paths, ref=sha, blob_shas=listed) == head
    assert emulator.state.count_requests(f"{forge}.graphql") == 1
    per_file = "github.contents" if forge == "github" else "gitlab.file"
    assert emulator.state.count_requests(per_file) == 0


@pytest.mark.parametrize(
    ("forge", "refusal", "said"),
    [
        ("github", Fault(status=400, message="Problems parsing JSON"), "GraphQL"),
        ("gitlab", Fault(status=403, message="403 Forbidden"), "403"),
    ],
)
async def test_refusing_the_files_query_is_a_forge_error(
    emulator: ForgeEmulator, forges: ForgeRegistry, forge: Forge, refusal: Fault, said: str
) -> None:
    pull = open_pull_from_trees(
        emulator.state, forge, "acme/shop", 6, base={"a.py": "1\n"}, head={"a.py": "2\n"}
    )
    client = forges[forge]
    assert isinstance(client, ReadsManyFiles)
    sha = pull.newest.head_sha
    emulator.state.add_fault(f"{forge}.graphql", refusal)
    with pytest.raises(ForgeError, match=said):
        await client.read_files_at("acme/shop", ["a.py"], ref=sha, blob_shas={})
    assert emulator.state.count_requests(f"{forge}.graphql") == 1  # not repeated
    assert await client.read_files_at("acme/shop", ["a.py"], ref=sha, blob_shas={}) == {
        "a.py": "2\n"
    }
