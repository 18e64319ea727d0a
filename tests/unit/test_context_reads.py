"""Which files planning reads for code context: only those whose context can reach a prompt,
and the prompts are the same as if every file had been read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.model import ChunkPlan
from bot.review.context_fetch import files_to_read, next_reads
from bot.review.prompt_context import Block, FileContext, file_contexts, fit_shared_context

TITLE = "Rework the cart"
DESCRIPTION = "Moves the discount rules out of the cart. " * 30


def context_lines(path: str) -> int:
    """A file's context size, read off its name (f<n>-<lines>.py)."""
    return int(path.split("-")[1].split(".")[0])


def context_of(path: str, source: str, patch: str) -> FileContext | None:
    lines = context_lines(path)
    if lines == 0:
        return None  # a patch that changes nothing: no context
    block = Block("definition", "function_definition", 1, lines, (lines // 2, lines // 2 + 1))
    return FileContext(
        path=path,
        language="python",
        blocks=(block,),
        lines={number: f"    value_{number} = compute({number})" for number in range(1, lines + 1)},
    )


def entry(path: str) -> dict[str, object]:
    return {"path": path, "patch": "@@ -1 +1 @@\n-a\n+b\n", "status": "modified"}


def read_lazily(
    chunks: Sequence[ChunkPlan], sources: Mapping[str, str | None], budget: int
) -> tuple[dict[str, str | None], list[tuple[str, ...]]]:
    """What planning reads, wave by wave, when the forge answers `sources`."""
    known: dict[str, str | None] = {}
    waves: list[tuple[str, ...]] = []
    while wanted := next_reads(
        chunks,
        known,
        title=TITLE,
        description=DESCRIPTION,
        budget_tokens=budget,
        context_of=context_of,
    ):
        assert not set(wanted) & set(known), "a file is read once"
        waves.append(wanted)
        known.update({path: sources[path] for path in wanted})
    return known, waves


def prompts(chunks: Sequence[ChunkPlan], known: Mapping[str, str | None], budget: int) -> list[str]:
    """Each chunk's shared part as the prompt renders it, from the contexts kept at planning."""
    rendered = []
    for chunk in chunks:
        files = [
            {**file, "context": found.to_json()}
            if (source := known.get(str(file["path"]))) is not None
            and (found := context_of(str(file["path"]), source, str(file["patch"]))) is not None
            else file
            for file in chunk.files
        ]
        shared = fit_shared_context(TITLE, DESCRIPTION, file_contexts(files), budget_tokens=budget)
        rendered.append(shared.render_pull_request() + "\n" + shared.render_context())
    return rendered


paths = st.builds(
    lambda number, lines: f"f{number}-{lines}.py",
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=0, max_value=60),
)


@settings(max_examples=200, deadline=None)
@given(
    chunk_paths=st.lists(
        st.lists(paths, min_size=1, max_size=8, unique=True), min_size=1, max_size=4
    ),
    unreadable=st.sets(paths, max_size=4),
    budget=st.integers(min_value=0, max_value=3000),
)
def test_the_prompts_are_the_same_as_with_every_file_read(
    chunk_paths: list[list[str]], unreadable: set[str], budget: int
) -> None:
    chunks = [
        ChunkPlan(files=tuple(entry(path) for path in group), lines=10) for group in chunk_paths
    ]
    everything = {
        path: (None if path in unreadable else f"text of {path}") for path in files_to_read(chunks)
    }
    known, _ = read_lazily(chunks, everything, budget)
    assert set(known) <= set(everything)
    assert prompts(chunks, known, budget) == prompts(chunks, everything, budget)


def test_files_past_a_full_allowance_are_not_read() -> None:
    # Ten files of 40 context lines: the allowance holds about three of them.
    chunk = ChunkPlan(files=tuple(entry(f"f{n}-40.py") for n in range(10)), lines=100)
    everything = {path: "text" for path in files_to_read([chunk])}
    known, waves = read_lazily([chunk], everything, 1536)
    shown = prompts([chunk], everything, 1536)[0].count("Context: ")
    assert 1 <= shown < 10
    # What the prompt shows, and the one file that showed the allowance was full.
    assert len(known) == shown + 1
    assert all(len(wave) == 1 for wave in waves)


def test_chunks_read_side_by_side_and_share_what_was_read() -> None:
    first = ChunkPlan(files=(entry("f1-5.py"), entry("f2-5.py")), lines=10)
    second = ChunkPlan(files=(entry("f2-5.py"), entry("f3-5.py")), lines=10)
    everything = {path: "text" for path in files_to_read([first, second])}
    known, waves = read_lazily([first, second], everything, 1536)
    assert waves == [("f1-5.py", "f2-5.py"), ("f3-5.py",)]
    assert set(known) == set(everything)


def test_a_file_that_could_not_be_read_does_not_stop_its_chunk() -> None:
    chunk = ChunkPlan(files=(entry("f1-5.py"), entry("f2-5.py"), entry("f3-5.py")), lines=10)
    known, waves = read_lazily([chunk], {"f1-5.py": "a", "f2-5.py": None, "f3-5.py": "c"}, 1536)
    assert waves == [("f1-5.py",), ("f2-5.py",), ("f3-5.py",)]
    assert known["f2-5.py"] is None


def test_no_allowance_reads_nothing_past_the_first_file() -> None:
    chunk = ChunkPlan(files=(entry("f1-5.py"), entry("f2-5.py")), lines=10)
    known, _ = read_lazily([chunk], {"f1-5.py": "a", "f2-5.py": "b"}, 0)
    assert list(known) == ["f1-5.py"]
