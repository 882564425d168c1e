"""Every error celery-delayq raises, rooted at :class:`DelayQError`.

Messages say what was wrong and how to fix it; nothing is written to Redis when one
of the input errors is raised.
"""

from __future__ import annotations

from celery.exceptions import QueueNotFound

from .reading import counted


class DelayQError(Exception):
    """Base class of every celery-delayq error."""


class ConfigurationError(DelayQError):
    """A ``delayq_*`` setting is missing or invalid."""


class UnsupportedMessage(ConfigurationError):
    """The app sends messages the store cannot keep (``task_protocol`` other than 2)."""


class InvalidDelay(DelayQError, ValueError):
    """The delay or eta given to ``apply_delayed`` cannot be used."""


class InvalidJobId(DelayQError, ValueError):
    """A job id or business key is empty, too long or contains forbidden characters."""


class PayloadError(DelayQError, ValueError):
    """The task call cannot be stored: not JSON-serialisable, too large, or not JSON."""


class InvalidOption(DelayQError, ValueError):
    """An option of ``apply_delayed`` has a value it does not accept."""


class UnknownQueue(DelayQError, QueueNotFound, ValueError):
    """The call routes to a queue the app does not define (task_create_missing_queues off),
    or (stored before calls refused it) one whose broker list would be a key of the store.
    Celery's ``QueueNotFound`` (a ``KeyError``), as a native call raises."""

    def __str__(self) -> str:
        return Exception.__str__(self)  # the message, not quoted as KeyError's is


class JobExists(DelayQError):
    """``if_exists="error"`` and a job with this id is already stored."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)  # args: rebuilt as JobExists(*args) by result backends
        self.job_id = job_id

    def __str__(self) -> str:
        return (f"a delayed job with id {self.job_id!r} already exists; pass "
                "if_exists='keep' to return it or if_exists='replace' to overwrite it")


class StoreUnavailable(DelayQError):
    """Redis could not be reached after the configured retries, or refused a write.

    ``stored`` lists the ids of the jobs of a call that Redis refused in part (for memory,
    on a cluster slot being moved: each script call, one per shard chunk, is atomic) that
    its other script calls wrote; every other job was not. After a connection error the
    call's outcome is not known: ``stored`` is empty and some jobs may have been written
    (with ids of your own, sending it again with ``if_exists="keep"`` writes each once).
    """

    def __init__(self, detail: str, stored: list[str] | None = None, advice: str = "") -> None:
        self.stored = stored or []
        written = (f"; {counted(len(self.stored), 'job')} of this call stored (their ids "
                   "are in the exception's .stored), the others not") if self.stored else ""
        super().__init__(_once(f"{detail}{written}", advice))


class DamagedShard(DelayQError):
    """A key of one shard holds the wrong type of value; nothing was written to it."""

    def __init__(self, detail: str) -> None:
        super().__init__(_once(detail, (
            "; the shard's other jobs wait, the other shards are served. See what it holds "
            "with `redis-cli TYPE <key>`, move it away (RENAME), then run "
            "`celery -A proj delayq check --repair`")))


class StoreFull(StoreUnavailable):
    """Redis is (nearly) full: new jobs are refused until promotion frees memory."""

    def __init__(self, detail: str, stored: list[str] | None = None) -> None:
        super().__init__(detail, stored, advice=(
            ". New delayed jobs are refused until the carriers promote due jobs and free "
            "memory: retry later; make room with a larger maxmemory, or start carriers and "
            "workers if none run"))


def _once(detail: str, advice: str) -> str:
    """``detail``, then ``advice`` unless it ends so already: a result backend keeps an
    error's message as its args and rebuilds it by calling its class with them."""
    return detail if detail.endswith(advice) else f"{detail}{advice}"
