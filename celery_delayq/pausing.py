"""Pausing a task or a queue: its due jobs are held where they are instead of promoted.

A held job stays in its shard's ``due`` set, its score moved up by :data:`HELD_BASE`
(2**50 ms, past the year 37,000): the claim script never finds it due, while cancel,
reschedule and schedule, which only ask whether a job is in ``due``, treat it as pending
as before. Readers turn the score back with :func:`split_score`. A reschedule gives a held
job a plain due time again; if its task is still paused when that comes, it is held again.

What is paused lives on every shard (the ``paused`` hash, fields ``task:<name>`` and
``queue:<name>``), so each claim script reads it in its own call and every carrier obeys a
pause from its next claim round, on Redis Cluster too. Resume (``pause-4.lua``) puts the
jobs of what is no longer paused back at their due times: already due, the carrier
promotes them oldest first.
"""

from __future__ import annotations

from .errors import InvalidOption
from .reading import MAX_MS, MIN_MS

#: Added to a held job's due time (ms) in ``due``: an exact float for every due time of
#: years 1-9999 (0.25 ms apart at this size), above every due time and above the 1e15
#: from which the claim script treats a score as never due. ``include/held.lua`` agrees.
HELD_BASE = 2**50
HELD_MIN, HELD_MAX = HELD_BASE + MIN_MS, HELD_BASE + MAX_MS
KINDS = ("task", "queue")


def split_score(score: float | None) -> tuple[float | None, bool]:
    """A ``due`` score as (due time in ms, held): held scores come back to their due time."""
    if score is not None and HELD_MIN <= score <= HELD_MAX:
        return score - HELD_BASE, True
    return score, False


def field(task: str | None, queue: str | None) -> str:
    """The ``paused`` hash field of a pause of ``task`` or ``queue`` (exactly one)."""
    given = [(kind, name) for kind, name in zip(KINDS, (task, queue), strict=True)
             if name is not None]
    if len(given) != 1:
        raise InvalidOption("pass exactly one of task= (a task name, e.g. "
                            "'shop.tasks.check_refund_status') or queue= (e.g. 'refunds')")
    kind, name = given[0]
    if not isinstance(name, str) or not name or not name.isprintable():
        raise InvalidOption(f"{kind}= must be a non-empty name of printable characters, "
                            f"got {name!r}")
    return f"{kind}:{name}"


def listing(fields: set[str]) -> dict[str, list[str]]:
    """``paused`` hash fields as ``DelayQ.paused()`` lists them."""
    found: dict[str, list[str]] = {f"{kind}s": [] for kind in KINDS}
    for name in sorted(fields):
        kind, _, value = name.partition(":")
        if kind in KINDS and value:
            found[f"{kind}s"].append(value)
    return found
