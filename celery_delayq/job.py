"""``Job``: a stored job as ``DelayQ.get`` and ``DelayQ.pending`` list it (scheduled,
claimed or dead), read from its envelope, or saying why it cannot be read."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .decoding import decode
from .errors import PayloadError
from .reading import datetime_of_ms, printable


@dataclass(frozen=True)
class Job:
    """A stored job as listed by ``DelayQ.get`` / ``DelayQ.pending``.

    ``unreadable`` says why the stored job cannot be read ("" when it can); such a job has
    no task and its stored envelope is in ``options["envelope"]``. ``held`` says what holds a
    due job back ("paused" or "rate limit"); it is still pending.
    """

    job_id: str
    task_id: str
    task: str
    args: list
    kwargs: dict
    key: str | None
    queue: str
    due: datetime | None
    state: str
    shard: int
    options: dict[str, Any] = field(default_factory=dict)
    unreadable: str = ""
    held: str = ""  # due and held back: "paused" or "rate limit" (see held.py)

    @property
    def paused(self) -> bool:
        """Due, and held by a pause of its task or queue."""
        return self.held == "paused"

    @classmethod
    def from_envelope(cls, job_id: str, raw, due_ms: float | None, state: str,
                      shard: int, default_queue: str = "") -> Job:
        """The job stored as ``raw``, due at ``due_ms``; :class:`PayloadError` says why it
        cannot be read."""
        due = None if due_ms is None else datetime_of_ms(due_ms)
        if due_ms is not None and due is None:
            raise PayloadError(f"due time {due_ms!r} ms is not a time between years 1 and 9999")
        env = decode(raw)
        return cls(
            job_id=job_id, task_id=env.get("i", job_id), task=env["t"],
            args=env.get("a", []), kwargs=env.get("k", {}), key=env.get("y"),
            queue=env.get("q") or default_queue, state=state, shard=shard, due=due,
            options={k: env[k] for k in ("o", "h", "p") if k in env},
        )

    @classmethod
    def read(cls, job_id: str, raw, due_ms: float | None, state: str, shard: int,
             default_queue: str = "") -> Job:
        """:meth:`from_envelope`, or a job that says why it is ``unreadable``."""
        try:
            return cls.from_envelope(job_id, raw, due_ms, state, shard, default_queue)
        except PayloadError as exc:
            return cls(job_id=job_id, task_id=job_id, task="", args=[], kwargs={}, key=None,
                       queue="", due=datetime_of_ms(due_ms), state=state, shard=shard,
                       options={"envelope": printable(raw) if isinstance(raw, str) else raw},
                       unreadable=str(exc))

    @classmethod
    def dead(cls, job_id: str, entry: dict[str, Any], shard: int,
             default_queue: str = "") -> Job:
        """A dead-lettered job (``entry`` as :meth:`Store.dead` lists it); its envelope may
        be the unreadable reason it died."""
        job = cls.read(job_id, entry["envelope"] or None, None, "dead", shard, default_queue)
        job.options["dead_reason"] = entry["reason"]
        return job


def shown_arguments(args: Any, kwargs: Any, options: dict[str, Any]) -> tuple[Any, Any]:
    """A call's arguments as the Django admin shows them: its own ``argsrepr`` /
    ``kwargsrepr`` (``options``: its message options, the envelope's ``o``) where it gave
    one, Celery's way to keep secrets out of logs and monitoring; else the arguments."""
    return options.get("argsrepr", args), options.get("kwargsrepr", kwargs)
