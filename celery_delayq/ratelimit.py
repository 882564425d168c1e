"""Promotion rate limits per queue, in Celery's rate strings, shared by every carrier.

A limit of N jobs per window (``N/s``, ``N/m``, ``N/h``; a bare number is per second) is
split evenly over the shards: each shard's claim script keeps a token bucket for the
queue in its ``limits`` hash, on Redis's clock. A bucket holds at most 1/21 of the
shard's share (at least one job) and refills the other 20/21 over each window, so no
window of that length claims more than N, and a backlog drains at 20/21 of N. A kombu
round publishes what it claimed a moment later, so a window of messages may also hold the
round claimed just before it (one bucket per shard). A share
below 21 jobs per window (N below 21 x shards) keeps its average but may promote one job
per shard at once after a quiet spell.
"""

from __future__ import annotations

import math
import re

from .errors import InvalidOption

_WINDOWS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}
_BUCKET = re.compile(r"^(\S+) (\S+)")
_RATE = re.compile(r"^\s*(?P<jobs>\d+(?:\.\d*)?)\s*(?:/\s*(?P<unit>[smh]))?\s*$")
#: The ``limits`` hash value of a queue whose limit was removed: the
#: ``delayq_rate_limits`` setting does not bring it back when a carrier starts.
OFF = "off"


def parse(spec: object, where: str = "rate limit") -> tuple[float, int]:
    """(jobs, window in ms) of a rate string such as ``"200/s"``, ``"30/m"`` or ``5``."""
    match = _RATE.match(str(spec)) if isinstance(spec, (str, int, float)) else None
    jobs = float(match["jobs"]) if match else 0.0
    if not match or not math.isfinite(jobs) or jobs <= 0 or isinstance(spec, bool):
        raise InvalidOption(f"{where} {spec!r} is not a rate: write jobs per second, minute "
                            "or hour, e.g. '200/s', '30/m', '1000/h' (more than 0)")
    return jobs, _WINDOWS_MS[match["unit"] or "s"]


def text(spec: object) -> str:
    """A rate string in its plain form: ``"200/s"``."""
    jobs, window_ms = parse(spec)
    unit = next(u for u, ms in _WINDOWS_MS.items() if ms == window_ms)
    return f"{jobs:g}/{unit}"


def bucket(spec: object, shards: int) -> str:
    """The ``limits`` hash value of a queue limited to ``spec`` on each of ``shards``:
    "<capacity> <refill per ms> <spec>", what the claim script reads."""
    jobs, window_ms = parse(spec)
    share = jobs / shards
    capacity = max(1.0, share / 21)
    return f"{capacity!r} {share * 20 / 21 / window_ms!r} {text(spec)}"


def in_force(value: str) -> bool:
    """Whether a ``limits`` hash value limits its queue as the claim script reads it: a
    capacity of 1 to 1e12 and a refill above 0 and below 1e9 per ms (a damaged value
    limits nothing, as ``off``)."""
    match = _BUCKET.match(value)
    try:
        capacity, refill = (float(match[1]), float(match[2])) if match else (0.0, 0.0)
    except ValueError:
        return False
    return 1 <= capacity < 1e12 and 0 < refill < 1e9
