"""Percentiles of one run, medians over repeated runs, and the tables they print as."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

PERCENTILES = (("p50", 50), ("p95", 95), ("p99", 99))


def percentile(ordered: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty sequence."""
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def distribution(values: Iterable[float]) -> dict[str, float]:
    """min, p50, p95, p99 and max of ``values`` (milliseconds), and how many there were."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    summary = {"n": len(ordered), "min": ordered[0]}
    for name, pct in PERCENTILES:
        summary[name] = percentile(ordered, pct)
    summary["max"] = ordered[-1]
    return summary


def spread(values: Iterable[float]) -> dict[str, float]:
    """Median with min and max of one figure over repetitions."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def flatten(record: Mapping, prefix: str = "") -> dict[str, float]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (numbers only)."""
    flat: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = value
    return flat


def summarise(repetitions: Sequence[Mapping]) -> dict[str, dict[str, float]]:
    """Every numeric figure of the repetitions as median / min / max."""
    flats = [flatten(rep) for rep in repetitions]
    names = [name for name in flats[0] if all(name in flat for flat in flats)]
    return {name: spread(flat[name] for flat in flats) for name in names}


def cell(figure: Mapping[str, float] | None, digits: int = 1, repeated: bool = True) -> str:
    """``"12.3 [10.1..15.0]"``, or just the value when there was one repetition."""
    if figure is None:
        return "-"
    median = f"{figure['median']:,.{digits}f}"
    if not repeated:
        return median
    return f"{median} [{figure['min']:,.{digits}f}..{figure['max']:,.{digits}f}]"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table padded to line up in a terminal too."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in rows)])
