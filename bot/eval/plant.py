"""Plant bugs from the catalogue into a repository's files (Python, JavaScript, TypeScript),
each as a pull request's diff.

Pure and deterministic for a seed: the files come in as text, the mutants go out as unified
diffs (GitHub's `patch` shape, hunks only) with the line each bug is on and a benign change
beside it, so a reviewer that comments on every changed line is not rewarded.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tree_sitter import Node, Parser

from bot.diff import unified_patch as diff_of_lines
from bot.eval.catalogue import CATALOGUE, PATTERNS, find_sites
from bot.eval.syntax import FAMILIES, LINE_COMMENT, Edit, Site, grammar_of, parser_for, walk

# The scan for sites stops once every pattern has sites in this many more files than it needs
# mutants (each mutant goes to another file while files last); scanning every file of a large
# repository costs seconds for nothing.
SITE_MARGIN = 4
MAX_SCANNED_FILES = 400
MAX_FILE_BYTES = 200_000
# The benign change goes this many lines from the bug (nearer when the file has no such line).
DISTRACTOR_NEAR = (4, 15)
DISTRACTOR_COMMENTS = (
    "Kept in this order so the output stays stable between runs.",
    "See the module docstring for the format.",
    "Cheap enough to do on every call.",
    "Mirrors the behaviour of the previous release.",
    "Callers rely on this running before the return below.",
    "Named for readability; the value is used once.",
)
# Nodes whose children are statements, in the grammars planted in.
STATEMENT_LISTS = ("block", "module", "statement_block", "program")

Accept = Callable[[str, str], bool]


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A repository file as text, by its path relative to the repository root."""

    path: str
    text: str


@dataclass(frozen=True, slots=True)
class Mutant:
    """One planted bug as a pull request's diff: where it is, and what a reviewer would say."""

    id: int
    pattern: str
    path: str
    patch: str
    additions: int
    deletions: int
    first_line: int  # the planted lines, in the new file
    last_line: int
    quote: str  # the text of the first planted line
    finding: str
    distractor_line: int | None = None  # the benign change's line in the new file
    head_text: str = ""  # the whole file after the change (what the forge serves at the head)

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "pattern": self.pattern,
            "path": self.path,
            "lines": [self.first_line, self.last_line],
            "distractor_line": self.distractor_line,
        }


@dataclass(slots=True)
class _Scanned:
    file: SourceFile
    grammar: str
    source: bytes
    root: Node
    sites: dict[str, list[Site]] = field(default_factory=dict)


def unified_patch(old: str, new: str) -> tuple[str, int, int]:
    """The hunks of a unified diff from `old` to `new` (3 lines of context), with the counts of
    added and deleted lines. Lines are split on "\\n" only, as git does."""
    return diff_of_lines(old.split("\n"), new.split("\n"))


def apply_edits(source: bytes, edits: Iterable[Edit]) -> bytes:
    """The source with non-overlapping edits applied; raises ValueError when two overlap."""
    ordered = sorted(edits, key=lambda edit: (edit.start, edit.end))
    for before, after in itertools.pairwise(ordered):
        if after.start < before.end:
            raise ValueError("edits overlap")
    result = source
    for edit in reversed(ordered):
        result = result[: edit.start] + edit.text + result[edit.end :]
    return result


def row_of(source: bytes, offset: int) -> int:
    """The 0-based row of a byte offset."""
    return source.count(b"\n", 0, offset)


def statement_rows(root: Node, source: bytes) -> list[int]:
    """Rows where a statement of a block or of the module begins its line."""
    rows: set[int] = set()
    for node in walk(root):
        if node.type not in STATEMENT_LISTS:
            continue
        for child in node.named_children:
            start = source.rfind(b"\n", 0, child.start_byte) + 1
            if child.type != "comment" and not source[start : child.start_byte].strip():
                rows.add(child.start_point[0])
    return sorted(rows)


def distractor_edit(
    scanned: _Scanned, site: Site, rng: random.Random
) -> tuple[Edit, int] | tuple[None, None]:
    """A comment line inserted before a statement a few lines from the site, and its row."""
    source = scanned.source
    touched = {row_of(source, site.focus)}
    for edit in site.edits:
        touched.update(range(row_of(source, edit.start), row_of(source, edit.end) + 1))
    low, high = min(touched) - 2, max(touched) + 2
    focus_row = row_of(source, site.focus)
    candidates = [row for row in statement_rows(scanned.root, source) if not low <= row <= high]
    if not candidates:
        return None, None
    near = [
        row
        for row in candidates
        if DISTRACTOR_NEAR[0] <= abs(row - focus_row) <= DISTRACTOR_NEAR[1]
    ]
    row = rng.choice(near) if near else min(candidates, key=lambda row: (abs(row - focus_row), row))
    start = 0
    for _ in range(row):
        start = source.index(b"\n", start) + 1
    end = source.find(b"\n", start)
    line = source[start : len(source) if end == -1 else end]
    indent = line[: len(line) - len(line.lstrip(b" \t"))]
    marker = LINE_COMMENT[FAMILIES[scanned.grammar]]
    comment = marker + b" " + rng.choice(DISTRACTOR_COMMENTS).encode()
    return Edit(start, start, indent + comment + b"\n"), row


def build_mutant(
    mutant_id: int,
    scanned: _Scanned,
    site: Site,
    rng: random.Random,
    parser: Parser,
) -> Mutant | None:
    """The mutant a site plants (with its distractor), or None when the result does not parse."""
    distractor, distractor_row = distractor_edit(scanned, site, rng)
    edits = [*site.edits, *([distractor] if distractor is not None else [])]
    try:
        mutated = apply_edits(scanned.source, edits)
    except ValueError:
        return None
    if parser.parse(mutated).root_node.has_error:
        return None
    shift = sum(
        len(edit.text) - (edit.end - edit.start)
        for edit in site.edits
        if edit.end <= site.focus and not edit.start == edit.end == site.focus
    )
    if distractor is not None and distractor.start <= site.focus:
        shift += len(distractor.text)
    focus = site.focus + shift
    try:
        old_text = scanned.source.decode()
        new_text = mutated.decode()
    except UnicodeDecodeError:
        return None
    first_line = mutated.count(b"\n", 0, focus) + 1
    quote = new_text.split("\n")[first_line - 1]
    patch, additions, deletions = unified_patch(old_text, new_text)
    if not patch:
        return None
    distractor_line: int | None = None
    if distractor is not None and distractor_row is not None:
        moved = sum(
            len(edit.text) - (edit.end - edit.start)
            for edit in site.edits
            if edit.end <= distractor.start
        )
        distractor_line = mutated.count(b"\n", 0, distractor.start + moved) + 1
    return Mutant(
        id=mutant_id,
        pattern=site.pattern,
        path=scanned.file.path,
        patch=patch,
        additions=additions,
        deletions=deletions,
        first_line=first_line,
        last_line=first_line,
        quote=quote,
        finding=PATTERNS[site.pattern].finding,
        distractor_line=distractor_line,
        head_text=new_text,
    )


def plant_mutants(
    files: Sequence[SourceFile],
    *,
    count: int,
    seed: int,
    patterns: Sequence[str] | None = None,
    accept: Accept | None = None,
) -> list[Mutant]:
    """Up to `count` mutants, the patterns taken in turn (a pattern with no site in these files
    gives its turn to the next), each in a different file while files last. Deterministic for
    the files and the seed; raises ValueError for an unknown pattern or a count below 1."""
    if count < 1:
        raise ValueError("the number of mutants must be at least 1")
    names = list(patterns) if patterns is not None else [pattern.name for pattern in CATALOGUE]
    unknown = [name for name in names if name not in PATTERNS]
    if unknown:
        raise ValueError(f"unknown pattern(s): {', '.join(unknown)}")
    rng = random.Random(seed)
    parsers: dict[str, Parser] = {}
    order = sorted(
        (
            file
            for file in files
            if len(file.text.encode()) <= MAX_FILE_BYTES and grammar_of(file.path) is not None
        ),
        key=lambda file: file.path,
    )
    rng.shuffle(order)
    needed = -(-count // max(1, len(names))) + SITE_MARGIN
    scanned: list[_Scanned] = []
    totals = dict.fromkeys(names, 0)
    for file in order[:MAX_SCANNED_FILES]:
        grammar = grammar_of(file.path) or "python"
        parser = parsers.setdefault(grammar, parser_for(grammar))
        source = file.text.encode()
        tree = parser.parse(source)
        if tree.root_node.has_error:
            continue
        sites = find_sites(tree.root_node, source, names, family=FAMILIES[grammar])
        item = _Scanned(file, grammar, source, tree.root_node, sites)
        scanned.append(item)
        for name in names:
            totals[name] += bool(item.sites[name])
        if all(total >= needed for total in totals.values()):
            break
    pools: dict[str, list[tuple[int, int]]] = {
        name: [
            (index, position)
            for index, item in enumerate(scanned)
            for position in range(len(item.sites[name]))
        ]
        for name in names
    }
    available = [name for name in names if pools[name]]
    used_files: set[int] = set()
    mutants: list[Mutant] = []
    turn = 0
    while len(mutants) < count and available:
        turn %= len(available)
        name = available[turn]
        pool = pools[name]
        fresh = [entry for entry in pool if entry[0] not in used_files]
        entry = rng.choice(fresh or pool)
        pool.remove(entry)
        index, position = entry
        item = scanned[index]
        site = item.sites[name][position]
        mutant = build_mutant(len(mutants) + 1, item, site, rng, parsers[item.grammar])
        planted = mutant is not None and (accept is None or accept(mutant.path, mutant.patch))
        if planted and mutant is not None:
            mutants.append(mutant)
            used_files.add(index)
        if not pool:
            available.remove(name)  # the next pattern moves into this turn
        elif planted:
            turn += 1
    return mutants
