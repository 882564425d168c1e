"""The measured steps: schedule a load one call at a time, wait for it, read what happened.

Every step takes the ``bench.app`` module (``ctx``) of a running :class:`~bench.harness.Cluster`
and returns plain dicts of numbers, so new scenarios (issue 5) combine them freely.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from types import ModuleType

from .harness import wait_until
from .stats import distribution

_JOURNAL_CHUNK = 10_000


@dataclass(frozen=True)
class Load:
    """``tasks`` jobs due evenly over ``window`` seconds, scheduled in a shuffled order."""

    tasks: int
    window: float
    seed: int = 0

    def offsets(self) -> list[float]:
        step = self.window / self.tasks
        offsets = [i * step for i in range(self.tasks)]
        random.Random(self.seed).shuffle(offsets)
        return offsets


@dataclass
class Scheduled:
    """What the producer side of one run did."""

    per_s: float  # schedule calls per second, one call at a time
    overran: int  # calls made after their due time (scheduled with delay 0)
    due_ms: dict[str, float]  # task id -> due time as the producer computed it
    job_ids: list[str]


def schedule_one_by_one(load: Load, start_in: float,
                        send: Callable[[float], tuple[str, str]]) -> Scheduled:
    """Call ``send(delay_seconds) -> (task id, job id)`` once per job of ``load``.

    Job ``i`` is due at ``start + start_in + offsets[i]``; a call that comes after its due
    time is sent with delay 0 and counted as overran.
    """
    base = time.time() + start_in
    due_ms: dict[str, float] = {}
    job_ids, overran = [], 0
    started = time.perf_counter()
    for offset in load.offsets():
        now = time.time()
        delay = base + offset - now
        if delay < 0:
            overran, delay = overran + 1, 0.0
        task_id, job_id = send(delay)
        due_ms[task_id] = (now + delay) * 1000
        job_ids.append(job_id)
    elapsed = time.perf_counter() - started
    return Scheduled(load.tasks / elapsed, overran, due_ms, job_ids)


def schedule_paced(load: Load, ahead: float, send: Callable[[float], tuple[str, str]]
                   ) -> Scheduled:
    """Call ``send(ahead)`` for each job of ``load`` ``ahead`` seconds before it is due, in
    due order, the first at once: a producer that keeps sending countdowns of ``ahead``,
    as a carrier with that hand-off lead does."""
    base = time.time() + ahead
    due_ms: dict[str, float] = {}
    job_ids = []
    started = time.perf_counter()
    for offset in sorted(load.offsets()):
        wait = base + offset - ahead - time.time()
        if wait > 0:
            time.sleep(wait)
        now = time.time()
        task_id, job_id = send(ahead)
        due_ms[task_id] = (now + ahead) * 1000
        job_ids.append(job_id)
    elapsed = time.perf_counter() - started
    return Scheduled(load.tasks / elapsed, 0, due_ms, job_ids)


def send_delayed(ctx: ModuleType, runs_key: str) -> Callable[[float], tuple[str, str]]:
    def send(delay: float) -> tuple[str, str]:
        result = ctx.delayed_probe.apply_delayed(args=(runs_key,), delay=delay)
        return result.id, result.job_id
    return send


def send_native(ctx: ModuleType, runs_key: str) -> Callable[[float], tuple[str, str]]:
    def send(delay: float) -> tuple[str, str]:
        result = ctx.native_probe.apply_async((runs_key,), countdown=delay)
        return result.id, result.id
    return send


def wait_for_runs(ctx: ModuleType, runs_key: str, expected: int, timeout: float,
                  on_poll: Callable[[], None], say: Callable[[str], None]) -> None:
    """Wait until ``expected`` runs were recorded, reporting progress every 2 s."""
    client = ctx.delayq.store.client
    last_report = [time.monotonic()]

    def done() -> bool:
        count = client.llen(runs_key)
        if time.monotonic() - last_report[0] >= 2.0:
            say(f"  {count:,}/{expected:,} tasks ran")
            last_report[0] = time.monotonic()
        return count >= expected

    wait_until(done, timeout, f"{expected} runs in {runs_key}", on_poll)


def runs(ctx: ModuleType, runs_key: str) -> list[dict]:
    """Every run recorded under ``runs_key``: ``{"id", "due", "start"}`` (ms)."""
    return [json.loads(raw) for raw in ctx.delayq.store.client.lrange(runs_key, 0, -1)]


def worker_lateness(records: list[dict], due_ms: dict[str, float] | None = None
                    ) -> tuple[dict[str, float], int]:
    """Distribution of worker start minus due (ms), and how many tasks ran more than once.

    The due time is the carrier's ``delayq_due`` header, or ``due_ms[task id]`` when given.
    """
    lateness, seen, duplicates = [], set(), 0
    for record in records:
        if record["id"] in seen:
            duplicates += 1
            continue
        seen.add(record["id"])
        due = due_ms[record["id"]] if due_ms is not None else record["due"]
        lateness.append(record["start"] - due)
    return distribution(lateness), duplicates


def worker_gc_pauses(ctx: ModuleType, records: list[dict],
                     due_ms: dict[str, float] | None = None) -> dict[str, float]:
    """The worker main process's collections (``bench.app.GC_PAUSES``) that overlapped the
    span from the first due time to the last start of ``records``: how many, the longest
    and their sum (ms). Due times as in :func:`worker_lateness`."""
    dues = due_ms.values() if due_ms is not None else (record["due"] for record in records)
    first, last = min(dues), max(record["start"] for record in records)
    pauses = [pause["ms"] for pause in map(json.loads, ctx.delayq.store.client.lrange(
        ctx.GC_PAUSES, 0, -1)) if first <= pause["end"] <= last + pause["ms"]]
    return {"count": len(pauses), "max_ms": max(pauses, default=0.0),
            "total_ms": sum(pauses)}


def worker_rate(records: list[dict]) -> float:
    """Tasks started per second between the first and the last start."""
    starts = [record["start"] for record in records]
    return len(starts) / max(1e-3, (max(starts) - min(starts)) / 1000)


def journal_marks(ctx: ModuleType) -> dict[int, str]:
    """The newest entry id of every shard's journal; read after it with :func:`promoted`."""
    client, marks = ctx.delayq.store.client, {}
    for shard in ctx.delayq.store.keys:
        newest = client.xrevrange(shard.journal, count=1)
        marks[shard.shard] = newest[0][0] if newest else "0-0"
    return marks


def promoted(ctx: ModuleType, marks: dict[int, str], job_ids: Iterable[str]
             ) -> list[tuple[int, int]]:
    """``(event ms, due ms)`` of the ``promoted`` journal events of ``job_ids``.

    The event time is the stream entry id, stamped by Redis when the carrier's ``ack``
    script ran: after the job's publish, so it bounds publish time from above.
    """
    wanted = set(job_ids)
    return [(int(entry_id.split("-")[0]), int(fields["due"]))
            for entry_id, fields in journal_after(ctx, marks)
            if fields.get("event") == "promoted" and fields.get("job") in wanted]


def journal_after(ctx: ModuleType, marks: dict[int, str]) -> Iterator[tuple[str, dict]]:
    """Every journal entry after ``marks`` (:func:`journal_marks`), shard by shard."""
    store = ctx.delayq.store
    for shard in store.keys:
        after = marks[shard.shard]
        while True:
            entries = store.read_journal(shard, after, count=_JOURNAL_CHUNK)
            yield from entries
            if len(entries) < _JOURNAL_CHUNK:
                break
            after = entries[-1][0]


def promotion_lateness(events: list[tuple[int, int]]) -> dict[str, float]:
    return distribution(at - due for at, due in events)


def pending_in_store(ctx: ModuleType) -> int:
    """Jobs still due or in flight, over all shards."""
    return sum(row["pending"] + row["inflight"] for row in ctx.delayq.store.stats())


def eta_after(seconds: float) -> datetime:
    return datetime.fromtimestamp(time.time() + seconds, timezone.utc)


def purge(ctx: ModuleType, queue: str) -> int:
    """Drop every message of ``queue`` from the broker; how many there were."""
    with ctx.app.connection_for_write() as connection:
        return connection.default_channel.queue_purge(queue) or 0


# -- in-process apps on a bare Redis (memory, flat cost) ---------------------------------

def standalone_app(url: str, db: int, *, journal_maxlen: int = 100_000, delayed: bool = True):
    """A Celery app on ``{url}/{db}`` with one task, ``shop.close_unpaid_order(order_id)``.

    ``delayed``: the task is a :class:`~celery_delayq.DelayedTask` (``apply_delayed``);
    otherwise a plain task for Celery's native ``apply_async(countdown=...)``.
    Returns ``(app, task)``; nothing runs the task, so everything scheduled stays pending.
    """
    from celery import Celery

    from celery_delayq import DelayedTask, DelayQ

    app = Celery(f"bench{db}{'d' if delayed else 'n'}", broker=f"{url}/{db}",
                 set_as_current=False)
    app.conf.update(delayq_journal_maxlen=journal_maxlen, task_ignore_result=True,
                    broker_connection_retry_on_startup=True)
    options = {"base": DelayedTask} if delayed else {}

    @app.task(name="shop.close_unpaid_order", **options)
    def close_unpaid_order(order_id):
        return order_id

    if delayed:
        DelayQ(app).store.stats()  # the store's meta key exists before any baseline
    return app, close_unpaid_order


def native_fill(app, task, count: int, countdown: float = 3600,
                progress: Callable[[int], None] | None = None) -> float:
    """``count`` ``apply_async(countdown=...)`` calls through one producer; calls/s."""
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for n in range(count):
            task.apply_async((n,), countdown=countdown, producer=producer)
            if progress is not None and n % 10_000 == 0:
                progress(n)
    return count / (time.perf_counter() - started)


def used_memory(client) -> int:
    return int(client.info("memory")["used_memory"])
