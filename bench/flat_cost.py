"""Flat cost: store operations with 10,000 pending jobs vs with N pending, on one Redis.

One redis-server, two databases: a *small* store (10,000 pending) and a *large* one
(``--pending`` N, default 1,000,000; ``make bench-full`` uses 10,000,000). Both are filled
with ``apply_delayed_many`` in batches of 10,000, due at random times over the next day
(fill app with ``delayq_journal_maxlen=0``: the fill is setup, not measured). The measured
operations run with the default journal and alternate small/large within each repetition:

* **schedule, one call at a time**: ``apply_delayed(args=(n,), delay=3600..90000)``;
* **schedule, batched**: ``apply_delayed_many`` in batches of 1,000;
* **cancel**: ``DelayQ.cancel(job_id)`` of random jobs of the fill, one call at a time;
* **claim + ack**: jobs due now (written beforehand) claimed over all shards with
  ``store.claim(shards, batch, lease_ms)`` and acked with ``store.ack``, as a carrier does,
  without publishing.

Beside each rate, the time Redis itself spent in the store's scripts per job (``INFO
commandstats`` after a ``CONFIG RESETSTAT``): the server's share, which the round trip and
the client side's noise on a shared machine do not blur.

After each repetition the small store is emptied and refilled to 10,000, so it stays small.
Also reported: Redis ``used_memory`` per job at N. Run ``python -m bench.flat_cost --help``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import redis

from celery_delayq import DelayQ
from celery_delayq.store import Promoted
from celery_delayq.testing.redis_server import RedisServer

from . import workload
from .harness import machine_facts
from .output import RESULTS, say, write_result
from .stats import cell, summarise, table

SMALL = 10_000
_FILL_CHUNK = 10_000
_BATCH = 1_000
_LEASE_MS = 300_000
OPS = ("schedule_one", "schedule_batched", "cancel", "claim_ack")
LABELS = {"schedule_one": "schedule, one call at a time",
          "schedule_batched": "schedule, batched (1,000 per call)",
          "cancel": "cancel(job_id), one call at a time",
          "claim_ack": "claim + ack (carrier path, no publish)"}



class Store:
    """One database: the fill and the measured operations on it."""

    def __init__(self, url: str, db: int, name: str, seed: int) -> None:
        self.url, self.db, self.name = url, db, name
        self.client = redis.Redis.from_url(f"{url}/{db}")
        self.app, self.task = workload.standalone_app(url, db)
        self.fill_app, self.fill_task = workload.standalone_app(url, db, journal_maxlen=0)
        self.delayq = DelayQ.of(self.app)
        self.filled = 0
        self.cancelable: list[int] = []
        self.rng = random.Random(seed)
        self._serial = 0

    def fill(self, target: int) -> dict:
        """Add jobs ``fill:<n>`` until ``target`` were written; returns memory figures."""
        before = workload.used_memory(self.client)
        started = time.perf_counter()
        report_every = max(target // 10, _FILL_CHUNK)
        next_report = self.filled + report_every
        while self.filled < target:
            first, last = self.filled, min(self.filled + _FILL_CHUNK, target)
            self.fill_task.apply_delayed_many([
                {"args": (n,), "delay": 3600 + self.rng.random() * 86_400,
                 "job_id": f"fill:{n}"} for n in range(first, last)])
            self.filled = last
            if self.filled >= next_report or self.filled == target:
                elapsed = time.perf_counter() - started
                say(f"  {self.name}: {self.filled:,}/{target:,} pending "
                    f"({(self.filled - first) and self.filled / max(elapsed, 1e-9):,.0f} jobs/s "
                    f"overall, {workload.used_memory(self.client) / 2**20:,.0f} MiB used)")
                next_report += report_every
        self.cancelable = list(range(target))
        self.rng.shuffle(self.cancelable)
        after = workload.used_memory(self.client)
        return {"pending": target, "fill_per_s": target / (time.perf_counter() - started),
                "used_memory_mib": after / 2**20,
                "bytes_per_job": (after - before) / max(target, 1)}

    def reset(self) -> None:
        self.client.flushdb()
        self.delayq.store.stats()
        self.filled = 0

    def _next_ids(self, count: int) -> range:
        self._serial += count
        return range(self._serial - count, self._serial)

    def schedule_one(self, count: int) -> float:
        delays = [3600 + self.rng.random() * 86_400 for _ in range(count)]
        started = time.perf_counter()
        for n, delay in zip(self._next_ids(count), delays, strict=True):
            self.task.apply_delayed(args=(n,), delay=delay)
        return count / (time.perf_counter() - started)

    def schedule_batched(self, count: int) -> float:
        batches = [[{"args": (n,), "delay": 3600 + self.rng.random() * 86_400}
                    for n in chunk] for chunk in _chunks(self._next_ids(count), _BATCH)]
        started = time.perf_counter()
        for batch in batches:
            self.task.apply_delayed_many(batch)
        return count / (time.perf_counter() - started)

    def cancel(self, count: int) -> float:
        ids = [f"fill:{self.cancelable.pop()}" for _ in range(count)]
        started = time.perf_counter()
        cancelled = sum(self.delayq.cancel(job_id) for job_id in ids)
        per_s = count / (time.perf_counter() - started)
        if cancelled != count:
            raise RuntimeError(f"{self.name}: cancelled {cancelled} of {count} pending jobs")
        return per_s

    def claim_ack(self, count: int) -> dict:
        """Claim ``count`` jobs due now over all shards and ack them, as the carrier does."""
        for chunk in _chunks(self._next_ids(count), _FILL_CHUNK):
            self.fill_task.apply_delayed_many([{"args": (n,), "delay": 0} for n in chunk])
        shards = list(self.delayq.store.keys)
        batch = self.delayq.config.claim_batch
        task = self.task.name
        claimed = 0
        claim_s = ack_s = 0.0
        while claimed < count:
            started = time.perf_counter()
            claims = self.delayq.store.claim(shards, batch, _LEASE_MS)
            claim_s += time.perf_counter() - started
            acks = {c.shard: [Promoted(j.job_id, task, None, j.due_ms) for j in c.jobs]
                    for c in claims if c.jobs}
            got = sum(len(jobs) for jobs in acks.values())
            if not got:
                raise RuntimeError(f"{self.name}: claimed {claimed} of {count} due jobs")
            started = time.perf_counter()
            self.delayq.store.ack(acks)
            ack_s += time.perf_counter() - started
            claimed += got
        return {"per_s": claimed / (claim_s + ack_s), "claim_per_s": claimed / claim_s,
                "ack_per_s": claimed / ack_s}

    def measure(self, counts: dict[str, int]) -> dict:
        result: dict = {"pending_before": sum(r["pending"] for r in self.delayq.store.stats())}
        for op in OPS:
            self.client.config_resetstat()
            figures = getattr(self, op)(counts[op])
            result[op] = figures if isinstance(figures, dict) else {"per_s": figures}
            result[op]["redis_us_per_job"] = _redis_usec(self.client) / counts[op]
        say(f"  {self.name} ({result['pending_before']:,} pending): " + ", ".join(
            f"{op} {result[op]['per_s']:,.0f}/s ({result[op]['redis_us_per_job']:.1f} us "
            "in Redis)" for op in OPS))
        return result

    def close(self) -> None:
        self.client.close()
        self.app.close()
        self.fill_app.close()


def _redis_usec(client: redis.Redis) -> int:
    """Microseconds Redis spent in scripts since CONFIG RESETSTAT: every measured operation
    is script calls (the commands a script runs are counted in both, so only scripts)."""
    stats = client.info("commandstats")
    return sum(stats.get(name, {}).get("usec", 0) for name in ("cmdstat_evalsha", "cmdstat_eval"))


def _chunks(items, size: int):
    items = list(items)
    for start in range(0, len(items), size):
        yield items[start:start + size]


def report(summary: dict, repeats: int, pending: int, at_n: dict) -> str:
    many = repeats > 1
    rows = []
    for op in OPS:
        rows.append([LABELS[op], cell(summary.get(f"small.{op}.per_s"), 0, many),
                     cell(summary.get(f"large.{op}.per_s"), 0, many),
                     cell(summary.get(f"ratio.{op}"), 2, many)])
    text = table(["jobs/s", f"{SMALL:,} pending", f"{pending:,} pending", "large ÷ small"], rows)
    server = table(
        ["Redis CPU per job, µs", f"{SMALL:,} pending", f"{pending:,} pending", "large ÷ small"],
        [[LABELS[op], *(cell(summary.get(f"{size}.{op}.redis_us_per_job"), 1, many)
                        for size in ("small", "large")),
          cell(summary.get(f"redis_ratio.{op}"), 2, many)] for op in OPS])
    return (f"{text}\n\n{server}\n\nRedis at {pending:,} pending (fill, journal off): "
            f"{at_n['used_memory_mib']:,.0f} MiB used_memory, "
            f"{at_n['bytes_per_job']:,.0f} bytes/job; filled at {at_n['fill_per_s']:,.0f} jobs/s")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.flat_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=1_000_000,
                        help="jobs pending in the large store (make bench-full: 10,000,000)")
    parser.add_argument("--ops", type=int, default=5_000,
                        help="one-at-a-time calls per operation and repetition "
                             "(batched schedule and claim use 10x)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--quick", action="store_true",
                        help="100,000 pending, 2,000 ops, 1 repetition")
    parser.add_argument("--out", type=Path, default=None)
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.pending, opts.ops, opts.repeat = 100_000, 2_000, 1
    if opts.out is None:
        opts.out = RESULTS / ("flat_cost-quick.json" if opts.quick
                              else f"flat_cost-{opts.pending // 1_000_000 or 0}M.json"
                              if opts.pending >= 1_000_000 else "flat_cost.json")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    counts = {"schedule_one": opts.ops, "schedule_batched": opts.ops * 10,
              "cancel": opts.ops, "claim_ack": opts.ops * 10}
    with RedisServer() as server:
        facts = machine_facts(redis.Redis.from_url(server.url))
        say(f"redis-server {facts['redis_server']} at {server.url}; load average "
            f"{facts['loadavg_1m_3m_15m'][0]:.2f} (shared machine)")
        small, large = Store(server.url, 1, "small", 1), Store(server.url, 2, "large", 2)
        try:
            say(f"filling the large store to {opts.pending:,} pending")
            at_n = large.fill(opts.pending)
            reps = []
            for n in range(opts.repeat):
                say(f"-- repetition {n + 1}/{opts.repeat} --")
                small.reset()
                small.fill(SMALL)
                rep: dict = {"loadavg_1m_before": os.getloadavg()[0]}
                for store in ((small, large) if n % 2 == 0 else (large, small)):
                    rep[store.name] = store.measure(counts)
                rep["ratio"] = {op: rep["large"][op]["per_s"] / rep["small"][op]["per_s"]
                                for op in OPS}
                rep["redis_ratio"] = {op: rep["large"][op]["redis_us_per_job"]
                                      / rep["small"][op]["redis_us_per_job"] for op in OPS}
                rep["loadavg_1m_after"] = os.getloadavg()[0]
                reps.append(rep)
            at_n["used_memory_mib_end"] = workload.used_memory(large.client) / 2**20
        except KeyboardInterrupt:
            say("interrupted; redis-server stopped")
            return 130
        finally:
            small.close()
            large.close()
    facts["loadavg_1m_after"] = os.getloadavg()[0]
    summary = summarise(reps)
    print()
    print(report(summary, opts.repeat, opts.pending, at_n))
    result = {"benchmark": "flat_cost", "machine": facts,
              "parameters": {"pending": opts.pending, "small": SMALL, "ops": counts,
                             "repeat": opts.repeat, "fill_journal_maxlen": 0,
                             "measured_journal_maxlen": 100_000},
              "at_pending": at_n,
              "command": " ".join(["python -m bench.flat_cost", *sys.argv[1:]]),
              "summary": summary, "repetitions": reps}
    write_result(opts.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
