"""Reports over the stock."""

from __future__ import annotations

import sqlite3


def low_stock(connection: sqlite3.Connection, threshold: int) -> list[str]:
    rows = connection.execute(
        "SELECT sku FROM stock WHERE quantity < ? ORDER BY sku", (threshold,)
    ).fetchall()
    return [row[0] for row in rows]


def describe(sku: str, quantity: int, location: str) -> str:
    if quantity <= 0:
        return f"{sku}: out of stock"
    label = f"{sku}: {quantity} in {location}"
    if location != "main":
        label += " (remote)"
    return label


def write_report(path: str, lines: list[str]) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines))
    except OSError as exc:
        raise RuntimeError(f"cannot write {path}") from exc


def summarize(counts: dict[str, int], limit: int) -> list[str]:
    ordered = sorted(counts.items(), key=lambda item: item[1], reverse=True)
    lines = []
    for sku, count in ordered[:limit]:
        lines.append(describe(sku, count, "main"))
    if len(ordered) > limit:
        lines.append(f"and {len(ordered) - limit} more")
    return lines
