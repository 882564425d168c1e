"""Jobs held in place: due, but kept from promotion by a pause or a rate limit.

A held job stays in its shard's ``due`` set with its due time moved up by a base that
says why: :data:`PAUSED_BASE` (2**50 ms, past the year 37,000) for a pause of its task or
queue, :data:`RATE_BASE` (2**51 ms) while its queue's rate limit has no room. Above every
due time and above the 1e15 from which the claim script treats a score as never due, it is
never claimed; and cancel, reschedule and schedule's keep / replace / error, which only ask
whether a job is in ``due``, treat it as pending as before. A reschedule gives it a plain
due time again (held again when that comes, if still paused or limited). Readers turn a
score back with :func:`split_score`. Every due time of years 1-9999 stays an exact float
at either base (0.25 and 0.5 ms apart there). ``scripts/include/held.lua`` agrees.
"""

from __future__ import annotations

from .reading import MAX_MS, MIN_MS

PAUSED_BASE = 2**50
RATE_BASE = 2**51
#: Why a job is held, by score range (inclusive).
RANGES = {"paused": (PAUSED_BASE + MIN_MS, PAUSED_BASE + MAX_MS),
          "rate limit": (RATE_BASE + MIN_MS, RATE_BASE + MAX_MS)}
_BASES = {"paused": PAUSED_BASE, "rate limit": RATE_BASE}
#: The score ranges (Redis syntax) of ``due`` holding no held job: due times, and damaged
#: scores (``inf``, past the year 9999) between and beyond the held ranges.
NOT_HELD = (("-inf", f"({RANGES['paused'][0]}"),
            (f"({RANGES['paused'][1]}", f"({RANGES['rate limit'][0]}"),
            (f"({RANGES['rate limit'][1]}", "+inf"))


def split_score(score: float | None) -> tuple[float | None, str]:
    """A ``due`` score as (due time in ms, why it is held: "", "paused" or "rate limit")."""
    if score is not None and score >= RANGES["paused"][0]:
        for why, (low, high) in RANGES.items():
            if low <= score <= high:
                return score - _BASES[why], why
    return score, ""
