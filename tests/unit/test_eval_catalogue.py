"""The bug catalogue: each pattern finds its sites in literal code and plants exactly its bug."""

from __future__ import annotations

import textwrap

import pytest

from bot.eval.catalogue import CATALOGUE, PATTERNS, find_sites, python_parser
from bot.eval.plant import apply_edits
from bot.eval.syntax import grammar_of, parser_for


def mutations(pattern: str, code: str) -> list[tuple[str, str]]:
    """Each site's mutated source and the text of its planted line."""
    source = textwrap.dedent(code).encode()
    parser = python_parser()
    root = parser.parse(source).root_node
    found = []
    for site in find_sites(root, source, [pattern])[pattern]:
        mutated = apply_edits(source, site.edits)
        assert not parser.parse(mutated).root_node.has_error, mutated.decode()
        shift = sum(
            len(edit.text) - (edit.end - edit.start)
            for edit in site.edits
            if edit.end <= site.focus and not edit.start == edit.end == site.focus
        )
        row = mutated.count(b"\n", 0, site.focus + shift)
        found.append((mutated.decode(), mutated.decode().split("\n")[row].strip()))
    return found


def test_the_catalogue_has_the_ten_classic_patterns() -> None:
    assert [pattern.name for pattern in CATALOGUE] == [
        "inverted_condition",
        "off_by_one",
        "swapped_arguments",
        "dropped_await",
        "removed_none_check",
        "wrong_variable",
        "early_return",
        "swallowed_exception",
        "resource_not_closed",
        "string_built_sql",
    ]
    assert all(pattern.finding.endswith(".") for pattern in CATALOGUE)


CASES = [
    (
        "inverted_condition",
        """
        def f(a, b):
            if a == b:
                return 1
            while not done(a):
                a += 1
            if ready(a):
                go()
        """,
        ["if a != b:", "while done(a):", "if not (ready(a)):"],
    ),
    (
        "off_by_one",
        """
        def f(items, n):
            for i in range(n):
                if i < len(items):
                    yield items[i]
        """,
        ["for i in range(n + 1):", "if i <= len(items):"],
    ),
    (
        "swapped_arguments",
        """
        def f(a, b):
            return pow(a, b, 7) + g(a, a) + h(x=a, y=b)
        """,
        ["return pow(b, a, 7) + g(a, a) + h(x=a, y=b)"],
    ),
    (
        "dropped_await",
        """
        async def f(client):
            body = await client.get("/")
            return body
        """,
        ['body = client.get("/")'],
    ),
    (
        "removed_none_check",
        """
        def f(row, cache):
            if row is None:
                return 0
            value = row[0]
            if value > 3:
                return 1
            if not cache:
                raise KeyError("empty")
            return cache[value]
        """,
        ["value = row[0]", "return cache[value]"],
    ),
    (
        "wrong_variable",
        """
        def f(self, width, height):
            return width * 2
        """,
        ["return height * 2"],
    ),
    (
        "early_return",
        """
        def f(path):
            data = read(path)
            check(data)
            save(data)
        """,
        ["return"],
    ),
    (
        "swallowed_exception",
        """
        def f(path):
            try:
                return read(path)
            except OSError as exc:
                log(exc)
                raise Broken(path) from exc
            except KeyError:
                return None
        """,
        ["pass"],
    ),
    (
        "resource_not_closed",
        """
        def f(path):
            with open(path) as handle:
                data = handle.read()
                check(data)
            return data
        """,
        ["handle = open(path)"],
    ),
    (
        "string_built_sql",
        """
        def f(db, sku, name):
            db.execute("SELECT * FROM t WHERE sku = ?", (sku,))
            db.execute("UPDATE t SET name = :name", {"name": name})
            db.execute("SELECT {} FROM t")
            log("SELECT ?", sku)
        """,
        [
            'db.execute(f"SELECT * FROM t WHERE sku = {sku}", (sku,))',
            'db.execute(f"UPDATE t SET name = {name}", {"name": name})',
        ],
    ),
]


@pytest.mark.parametrize(("pattern", "code", "planted"), CASES, ids=[case[0] for case in CASES])
def test_each_pattern_plants_its_bug_on_the_line_it_names(
    pattern: str, code: str, planted: list[str]
) -> None:
    assert [line for _, line in mutations(pattern, code)] == planted


def test_a_resource_body_is_dedented_so_the_block_still_parses() -> None:
    ((mutated, _),) = mutations(
        "resource_not_closed",
        """
        def f(path):
            with open(path) as handle:
                data = handle.read()
            return data
        """,
    )
    assert mutated == textwrap.dedent(
        """
        def f(path):
            handle = open(path)
            data = handle.read()
            return data
        """
    )


def test_a_removed_guard_takes_its_whole_lines() -> None:
    ((mutated, _),) = mutations(
        "removed_none_check",
        """
        def f(row):
            if row is None:  # nothing yet
                return 0
            return row[0]
        """,
    )
    assert mutated == "\ndef f(row):\n    return row[0]\n"


def test_patterns_ignore_what_they_must_not_touch() -> None:
    code = """
    def f(a):
        g(a, b=1)
        value = a.size
        return value
    """
    assert mutations("swapped_arguments", code) == []
    assert mutations("wrong_variable", code) == []  # one parameter: nothing to confuse it with
    assert mutations("dropped_await", code) == []
    assert set(PATTERNS) == {pattern.name for pattern in CATALOGUE}


def test_files_are_planted_in_by_their_suffix() -> None:
    assert [grammar_of(name) for name in ("a.py", "b.ts", "c.tsx", "d.mjs", "e.JS", "f.go")] == [
        "python",
        "typescript",
        "tsx",
        "javascript",
        "javascript",
        None,
    ]


def js_mutations(pattern: str, code: str, grammar: str = "typescript") -> list[str]:
    """The planted line of each site of a pattern in JavaScript or TypeScript code."""
    source = textwrap.dedent(code).encode()
    parser = parser_for(grammar)
    root = parser.parse(source).root_node
    planted = []
    for site in find_sites(root, source, [pattern], family="javascript")[pattern]:
        mutated = apply_edits(source, site.edits)
        assert not parser.parse(mutated).root_node.has_error, mutated.decode()
        shift = sum(
            len(edit.text) - (edit.end - edit.start)
            for edit in site.edits
            if edit.end <= site.focus and not edit.start == edit.end == site.focus
        )
        row = mutated.count(b"\n", 0, site.focus + shift)
        planted.append(mutated.decode().split("\n")[row].strip())
    return planted


JS_CASES = [
    (
        "inverted_condition",
        """
        function f(a: number, b: number) {
          if (a === b) return 1;
          while (!done(a)) a++;
          if (ready(a)) go();
        }
        """,
        ["if (a !== b) return 1;", "while (done(a)) a++;", "if (!(ready(a))) go();"],
    ),
    ("off_by_one", "for (let i = 0; i < n; i++) {}\n", ["for (let i = 0; i <= n; i++) {}"]),
    (
        "swapped_arguments",
        "const x = pow(a, b) + g(a, a) + h(...rest, a);\n",
        ["const x = pow(b, a) + g(a, a) + h(...rest, a);"],
    ),
    (
        "dropped_await",
        "async function f(c) {\n  const body = await c.get('/');\n}\n",
        ["const body = c.get('/');"],
    ),
    (
        "removed_none_check",
        """
        function f(row, cache) {
          if (row === null) {
            return 0;
          }
          const value = row[0];
          if (value > 3) return 1;
          if (!cache) throw new Error("empty");
          return cache[value];
        }
        """,
        ["const value = row[0];", "return cache[value];"],
    ),
    (
        "wrong_variable",
        "const area = (width, height) => { return width * 2; };\n",
        ["const area = (width, height) => { return height * 2; };"],
    ),
    (
        "early_return",
        "function f(path) {\n  const data = read(path);\n  check(data);\n  save(data);\n}\n",
        ["return;"],
    ),
    (
        "swallowed_exception",
        """
        function f(path) {
          try {
            return read(path);
          } catch (err) {
            log(err);
            throw new Broken(path);
          }
        }
        """,
        ["} catch (err) {}"],
    ),
    (
        "string_built_sql",
        """
        async function f(db, sku) {
          await db.query("SELECT * FROM t WHERE sku = $1", [sku]);
          await db.query("SELECT * FROM t WHERE name = :name", { name });
          log("SELECT ?", sku);
        }
        """,
        [
            "await db.query(`SELECT * FROM t WHERE sku = ${sku}`, [sku]);",
            "await db.query(`SELECT * FROM t WHERE name = ${name}`, { name });",
        ],
    ),
]


@pytest.mark.parametrize(("pattern", "code", "planted"), JS_CASES, ids=[c[0] for c in JS_CASES])
def test_javascript_and_typescript_sites(pattern: str, code: str, planted: list[str]) -> None:
    assert js_mutations(pattern, code) == planted
    if ": number" not in code:
        assert js_mutations(pattern, code, "javascript") == planted


def test_a_pattern_without_a_finder_for_a_language_has_no_sites() -> None:
    code = "const f = async (p) => { const h = await open(p); };\n"
    assert js_mutations("resource_not_closed", code) == []
