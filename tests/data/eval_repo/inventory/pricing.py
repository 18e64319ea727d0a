"""Prices, discounts and totals."""

from __future__ import annotations

from collections.abc import Sequence


def discount(price: float, percent: float) -> float:
    if percent == 0:
        return price
    if percent > 100:
        raise ValueError("a discount above 100% is not a discount")
    return round(price * (100 - percent) / 100, 2)


def total(prices: Sequence[float], quantities: Sequence[int]) -> float:
    amount = 0.0
    for index in range(len(prices)):
        amount += prices[index] * quantities[index]
    return amount


def cheapest(prices: Sequence[float], budget: float) -> list[int]:
    chosen = []
    spent = 0.0
    for index, price in sorted(enumerate(prices), key=lambda item: item[1]):
        if spent + price > budget:
            break
        chosen.append(index)
        spent += price
    return chosen


def clamp(value: int, low: int, high: int) -> int:
    if value < low:
        return low
    if value >= high:
        return high
    return value


def price_band(price: float, edges: Sequence[float]) -> int:
    band = 0
    while band < len(edges) and price >= edges[band]:
        band += 1
    return band
