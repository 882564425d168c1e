"""Pausing a task or a queue: its due jobs are held in place (:mod:`.held`) instead of
promoted: pending, listed, cancellable and reschedulable, never claimed.

What is paused lives on every shard (the ``paused`` hash, fields ``task:<name>`` and
``queue:<name>``), so each claim script reads it in its own call and every carrier obeys a
pause from its next claim round, on Redis Cluster too. Resume (``pause-3.lua``) unmarks it, and
the store puts the jobs nothing holds any more back at their due times, a chunk per
script call (``release-6.lua``, ``store/releasing.py``): already due, the carrier promotes
them oldest first.
"""

from __future__ import annotations

from .errors import InvalidOption
from .reading import forbidden

KINDS = ("task", "queue")


def field(task: str | None, queue: str | None,
          named: tuple[str, str] = ("task=", "queue=")) -> str:
    """The ``paused`` hash field of a pause of ``task`` or ``queue`` (exactly one);
    ``named``: how the caller's errors spell the two (the CLI's options)."""
    given = [(kind, label, name) for kind, label, name in zip(KINDS, named, (task, queue),
                                                              strict=True) if name is not None]
    if len(given) != 1:
        raise InvalidOption(f"give exactly one of {named[0]} (a task name, e.g. "
                            f"shop.tasks.check_refund_status) or {named[1]} (e.g. refunds)")
    kind, label, name = given[0]
    if not isinstance(name, str) or not name:
        raise InvalidOption(f"{label} needs a non-empty name, got {name!r}")
    problem = forbidden(name, label)  # the rule names are scheduled under
    if problem is not None:
        raise InvalidOption(problem)
    return f"{kind}:{name}"


def listing(fields: set[str]) -> dict[str, list[str]]:
    """``paused`` hash fields as ``DelayQ.paused()`` lists them."""
    found: dict[str, list[str]] = {f"{kind}s": [] for kind in KINDS}
    for name in sorted(fields):
        kind, _, value = name.partition(":")
        if kind in KINDS and value:
            found[f"{kind}s"].append(value)
    return found
