"""Figures across repeats (median, min, max) and the Markdown tables they are printed in."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """The median of a figure over the repeats of a benchmark, with its smallest and largest value."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        return cls(statistics.median(values), min(values), max(values))

    def cell(self, fmt: Callable[[float], str]) -> str:
        if self.low == self.high:
            return fmt(self.median)
        return f"{fmt(self.median)} ({fmt(self.low)}-{fmt(self.high)})"


def micros(ns: float) -> str:
    us = ns / 1000
    return f"{us:.1f}" if us < 100 else f"{us:,.0f}"


def rate(per_second: float) -> str:
    return f"{per_second:,.0f}"


def seconds(value: float) -> str:
    return f"{value:.2f}"


def ratio(ours: float, theirs: float) -> str:
    if theirs == 0:
        return "n/a"
    value = ours / theirs
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """A Markdown table padded to line up in a terminal too; `right` aligns those columns to the right."""
    right = right if right is not None else [i > 0 for i in range(len(headers))]
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2)) for w, r in zip(widths, right, strict=True))
    return "\n".join([line(headers), rule + "|", *(line(row) for row in rows)])
