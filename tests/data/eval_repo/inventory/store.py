"""Stock kept in SQLite."""

from __future__ import annotations

import sqlite3


class StockError(Exception):
    """The store could not answer."""


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        self.connection = sqlite3.connect(path)

    def quantity(self, sku: str) -> int:
        cursor = self.connection.execute("SELECT quantity FROM stock WHERE sku = ?", (sku,))
        row = cursor.fetchone()
        if row is None:
            return 0
        return int(row[0])

    def set_quantity(self, sku: str, quantity: int) -> None:
        if quantity < 0:
            raise StockError(f"negative quantity for {sku}")
        self.connection.execute(
            "UPDATE stock SET quantity = :quantity WHERE sku = :sku",
            {"sku": sku, "quantity": quantity},
        )
        self.connection.commit()

    def remove(self, sku: str) -> None:
        try:
            self.connection.execute("DELETE FROM stock WHERE sku = ?", (sku,))
        except sqlite3.Error as exc:
            raise StockError(f"cannot remove {sku}") from exc

    def export(self, target: str) -> int:
        count = 0
        with open(target, "w", encoding="utf-8") as handle:
            for sku, quantity in self.connection.execute("SELECT sku, quantity FROM stock"):
                handle.write(f"{sku},{quantity}\n")
                count += 1
        return count
