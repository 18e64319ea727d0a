"""The code around a hunk at the head revision: enclosing definitions per language, fallbacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bot.review.code_context import (
    FALLBACK_LINES,
    MAX_BLOCK_LINES,
    build_file_context,
    changed_spans,
    diff_shown_lines,
    enclosing_blocks,
    language_for,
    split_source,
)

REPO = Path(__file__).resolve().parents[2]


def line_of(source: str, text: str, *, occurrence: int = 1) -> int:
    """The 1-based number of the line holding `text` (its n-th occurrence)."""
    seen = 0
    for number, line in enumerate(split_source(source), start=1):
        if text in line:
            seen += 1
            if seen == occurrence:
                return number
    raise AssertionError(f"{text!r} not in the source")


PYTHON = '''\
import logging

log = logging.getLogger(__name__)


class Cart:
    """A shopping cart."""

    def __init__(self) -> None:
        self.items: list[int] = []

    @property
    def total(self) -> int:
        return sum(self.items)

    def apply_discount(self, percent: int) -> int:
        if percent < 0 or percent > 100:
            raise ValueError(percent)
        discounted = self.total * (100 - percent) // 100
        log.info("discount %s", percent)
        return discounted


def helper() -> None:
    pass
'''

JAVASCRIPT = """\
import { api } from './api.js';

export function loadUser(id) {
  return api.get(`/users/${id}`);
}

export class Store {
  constructor() {
    this.cache = new Map();
  }

  async fetch(id) {
    if (this.cache.has(id)) {
      return this.cache.get(id);
    }
    const user = await loadUser(id);
    this.cache.set(id, user);
    return user;
  }  // fetch
}

const format = (user) => {
  const name = user.name.trim();
  return name.toUpperCase();
};  // format
"""

TYPESCRIPT = """\
export interface User {
  id: number;
  name: string;
}

export async function rename(user: User, name: string): Promise<User> {
  if (!name) {
    throw new Error('empty name');
  }
  return { ...user, name };
}  // rename

export enum Role {
  Admin,
  Member,
}
"""

TSX = """\
import { useState } from 'react';

export function Counter({ start }: { start: number }) {
  const [count, setCount] = useState(start);
  const increment = () => {
    setCount(count + 1);
  };  // increment
  return <button onClick={increment}>{count}</button>;
}
"""

GO = """\
package store

import "errors"

type Store struct {
	items map[string]int
}

func New() *Store {
	return &Store{items: map[string]int{}}
}

func (s *Store) Take(key string, n int) (int, error) {
	have, ok := s.items[key]
	if !ok {
		return 0, errors.New("missing")
	}
	if have < n {
		return have, errors.New("short")
	}
	s.items[key] = have - n
	return n, nil
}  // Take
"""

JAVA = """\
package shop;

import java.util.List;

public class Inventory {
    private final List<Item> items;

    public Inventory(List<Item> items) {
        this.items = items;
    }

    public int count(String sku) {
        int total = 0;
        for (Item item : items) {
            if (item.sku().equals(sku)) {
                total += item.quantity();
            }
        }
        return total;
    }  // count
}
"""

RUST = """\
use std::collections::HashMap;

pub struct Ledger {
    balances: HashMap<String, i64>,
}

impl Ledger {
    pub fn new() -> Self {
        Ledger { balances: HashMap::new() }
    }

    pub fn transfer(&mut self, from: &str, to: &str, amount: i64) -> Result<(), String> {
        let have = *self.balances.get(from).unwrap_or(&0);
        if have < amount {
            return Err(format!("{} has {}", from, have));
        }
        *self.balances.entry(from.to_string()).or_insert(0) -= amount;
        *self.balances.entry(to.to_string()).or_insert(0) += amount;
        Ok(())
    }  // transfer
}
"""

C = """\
#include <stdio.h>
#include <string.h>

struct buffer {
    char data[64];
    size_t used;
};

static int append(struct buffer *buf, const char *text) {
    size_t length = strlen(text);
    if (buf->used + length >= sizeof buf->data) {
        return -1;
    }
    memcpy(buf->data + buf->used, text, length);
    buf->used += length;
    return 0;
}  // append

int main(void) {
    struct buffer buf = {0};
    return append(&buf, "hello");
}
"""

CPP = """\
#include <vector>

namespace geometry {

template <typename T>
T sum(const std::vector<T>& values) {
    T total{};
    for (const auto& value : values) {
        total += value;
    }
    return total;
}  // sum

class Polygon {
public:
    double area() const {
        double result = 0;
        for (size_t i = 0; i < xs.size(); ++i) {
            result += xs[i] * ys[(i + 1) % xs.size()];
        }
        return result / 2;
    }  // area
private:
    std::vector<double> xs, ys;
};

}  // namespace geometry
"""

RUBY = """\
require 'json'

module Billing
  class Invoice
    attr_reader :lines

    def initialize(lines)
      @lines = lines
    end

    def total
      lines.sum do |line|
        line.price * line.quantity
      end # sum
    end

    def to_json(*args)
      { total: total }.to_json(*args)
    end
  end
end
"""

# (path, source, the changed line's text, the definition's first line, its last line, headers)
CASES = [
    (
        "shop/cart.py",
        PYTHON,
        "discounted = self.total",
        "def apply_discount",
        "return discounted",
        ["class Cart"],
    ),
    (
        "shop/cart.py",
        PYTHON,
        "return sum(self.items)",
        "@property",
        "return sum(self.items)",
        ["class Cart"],
    ),
    (
        "web/store.js",
        JAVASCRIPT,
        "const user = await",
        "async fetch(id)",
        "// fetch",
        ["export class Store"],
    ),
    ("web/store.js", JAVASCRIPT, "const name = user.name", "const format", "// format", []),
    ("web/user.ts", TYPESCRIPT, "throw new Error", "export async function rename", "// rename", []),
    (
        "web/Counter.tsx",
        TSX,
        "setCount(count + 1)",
        "const increment",
        "// increment",
        ["export function Counter"],
    ),
    ("store/store.go", GO, "if have < n", "func (s *Store) Take", "// Take", []),
    (
        "shop/Inventory.java",
        JAVA,
        "total += item.quantity",
        "public int count",
        "// count",
        ["public class Inventory"],
    ),
    ("src/ledger.rs", RUST, "if have < amount", "pub fn transfer", "// transfer", ["impl Ledger"]),
    ("src/buffer.c", C, "memcpy(buf->data", "static int append", "// append", []),
    (
        "src/geometry.cpp",
        CPP,
        "result += xs[i]",
        "double area() const",
        "// area",
        ["namespace geometry", "class Polygon"],
    ),
    (
        "src/geometry.hpp",
        CPP,
        "total += value",
        "template <typename T>",
        "// sum",
        ["namespace geometry"],
    ),
    (
        "lib/billing.rb",
        RUBY,
        "line.price * line.quantity",
        "lines.sum do",
        "# sum",
        ["module Billing", "class Invoice", "def total"],
    ),
]


@pytest.mark.parametrize(("path", "source", "changed", "first", "last", "headers"), CASES)
def test_the_block_is_the_innermost_definition_around_the_change(
    path: str, source: str, changed: str, first: str, last: str, headers: list[str]
) -> None:
    line = line_of(source, changed)
    (block,) = enclosing_blocks(source, language_for(path), [(line, line)])
    start = line_of(source, first)
    end = line_of(source, last)
    assert block.kind == "definition"
    assert (block.start, block.end) == (start, end)
    assert block.focus == (line, line)
    assert block.headers == tuple(line_of(source, text) for text in headers)


def test_every_listed_language_parses_with_the_bundled_grammars_and_no_network() -> None:
    # A fresh interpreter with sockets refused: the grammars load from the installed wheel.
    program = (
        "import socket\n"
        "def refuse(*a, **k):\n    raise OSError('network used')\n"
        "socket.socket.connect = refuse\nsocket.create_connection = refuse\n"
        "from bot.review.code_context import enclosing_blocks\n"
        "for language in ['python','javascript','typescript','tsx','go','java','rust','c',"
        "'cpp','ruby']:\n"
        "    (block,) = enclosing_blocks('x = 1\\n', language, [(1, 1)])\n"
        "print('ok')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "ok"


def test_a_change_spanning_two_functions_gets_what_holds_both() -> None:
    first = line_of(PYTHON, "return sum(self.items)")
    last = line_of(PYTHON, "raise ValueError")
    (block,) = enclosing_blocks(PYTHON, "python", [(first, last)])
    assert block.node_type == "class_definition"
    assert block.start == line_of(PYTHON, "class Cart")


def test_an_unknown_language_or_top_level_code_gets_the_lines_around_it() -> None:
    text = "".join(f"line {n}\n" for n in range(1, 101))
    (block,) = enclosing_blocks(text, language_for("notes/readme.txt"), [(50, 52)])
    assert (block.kind, block.start, block.end) == (
        "lines",
        50 - FALLBACK_LINES,
        52 + FALLBACK_LINES,
    )
    (top,) = enclosing_blocks(PYTHON, "python", [(3, 3)])
    assert (top.kind, top.start, top.end) == ("lines", 1, 3 + FALLBACK_LINES)


def test_source_that_does_not_parse_still_gets_a_block() -> None:
    broken = "def f(:\n    return ((\n" + "x = 1\n" * 30
    (block,) = enclosing_blocks(broken, "python", [(2, 2)])
    assert block.start <= 2 <= block.end
    assert block.end - block.start <= 2 * FALLBACK_LINES + 1


def test_a_long_definition_is_cut_to_the_lines_near_the_change_with_its_first_line() -> None:
    body = "".join(f"    x{n} = {n}\n" for n in range(MAX_BLOCK_LINES + 50))
    source = f"def long():\n{body}    return x0\n"
    (block,) = enclosing_blocks(source, "python", [(150, 150)])
    assert (block.start, block.end) == (150 - FALLBACK_LINES, 150 + FALLBACK_LINES)
    assert block.headers == (1,)


def test_lines_split_on_newline_only_as_the_diff_counts_them() -> None:
    source = "def f():\n    a = '\x0c'\r\n    return a\x1c\n\ndef g():\n    pass\n"
    assert split_source(source)[1] == "    a = '\x0c'"
    (block,) = enclosing_blocks(source, "python", [(6, 6)])
    assert (block.start, block.end) == (5, 6)


def test_spans_and_shown_lines_come_from_the_hunks() -> None:
    patch = (
        "@@ -10,6 +10,7 @@ def f():\n"
        "     a = 1\n"
        "     b = 2\n"
        "-    c = 3\n"
        "+    c = 4\n"
        "+    d = 5\n"
        "     e = 6\n"
        "     return a\n"
        "@@ -40,4 +41,3 @@\n"
        "     x = 1\n"
        "-    y = 2\n"
        "     z = 3\n"
        "     w = 4\n"
    )
    assert changed_spans(patch) == [(12, 13), (42, 42)]
    assert diff_shown_lines(patch) == frozenset({10, 11, 12, 13, 14, 15, 41, 42, 43})


def test_the_stored_context_leaves_out_what_the_diff_shows() -> None:
    line = line_of(PYTHON, "discounted = self.total")
    lines = split_source(PYTHON)
    patch = (
        f"@@ -{line - 1},3 +{line - 1},3 @@\n {lines[line - 2]}\n-        discounted = 0\n"
        f"+{lines[line - 1]}\n {lines[line]}"
    )
    context = build_file_context("shop/cart.py", PYTHON, patch)
    assert context is not None
    start = line_of(PYTHON, "def apply_discount")
    assert context.lines[start] == lines[start - 1]
    assert line not in context.lines and line - 1 not in context.lines
    assert context.lines[line_of(PYTHON, "class Cart")] == "class Cart:"
    assert line_of(PYTHON, "def helper") not in context.lines
