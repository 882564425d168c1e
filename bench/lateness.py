"""Lateness and throughput of celery-delayq beside Celery's native countdown (``make bench``).

One redis-server, one ``celery worker`` and one carrier (``celery -A bench.app delayq
carrier``) serve every arm of the run. Per repetition:

* **delayq**: ``apply_delayed`` one call at a time, jobs due evenly over the window;
  publish lateness from the journal's ``promoted`` events, worker start lateness from
  the ``delayq_due`` header.
* **native**: ``apply_async(countdown=...)`` of a plain task with the same load; worker
  start lateness against the due time the producer computed.
* **delayq, hand-off lead**: the delayq arm with the carrier restarted with
  ``--handoff-lead`` (default 1 s): jobs reach the worker ahead, eta = due time, and the
  worker's timer starts them, as native ETA does.
* **native, paced**: the native arm's tasks each sent with ``countdown`` = the hand-off
  lead, that long before it is due, in due order: native ETA at a steady rate, the worker
  receiving while it starts tasks, as it does with a lead.
* **BullMQ** (when Node and npm are there; ``bench.scheduling`` installs it): the same
  load added one ``await queue.add`` at a time by a Node process whose Worker (concurrency
  50) starts the jobs (``bench/bullmq/lateness.mjs``), on the same Redis server; worker
  start lateness against the due time the producer computed.
* **promotion**: jobs all due at one instant (scheduled with ``apply_delayed_many``)
  into a queue no worker reads; jobs/s from due time to the last ``promoted`` event,
  once through kombu and once with the carrier restarted with ``--direct`` (the claim
  script pushes to the broker's list itself).
* **worker drain**: the arm's number of messages (no eta) published at once into the
  worker's queue by Celery and kombu alone: the rate the worker starts tasks at when
  nothing waits on a timer, the ceiling every lateness figure above meets in a burst.
* **Celery alone**: the promotion arm's number of messages built with Celery's
  ``create_task_message`` and published in kombu's ``Producer.batch()`` by this process,
  with no store: what Celery's and kombu's own path costs per message, beside which
  promotion through kombu is compared.

Run ``python -m bench.lateness --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from types import ModuleType

import psutil
from kombu.utils.uuid import uuid

from . import workload
from .harness import Cluster, WorkerSetup
from .output import RESULTS, say, write_result
from .scheduling import bullmq_ready, node_json
from .stats import PERCENTILES, cell, distribution, summarise, table
from .workload import Load

_WARMUP_TASKS = 300
_START_MARGIN = 1.0  # seconds between the expected end of scheduling and the first due job
_DRAIN_TIMEOUT = 300.0
_BULLMQ_CONCURRENCY = 50
_BULLMQ_DB = 15  # BullMQ's keys apart from the bench app's



# -- one arm at a time -------------------------------------------------------------------

class Bench:
    """The arms of one benchmark run against one :class:`Cluster`."""

    def __init__(self, cluster: Cluster, load: Load, promotion_tasks: int,
                 sustained_rate: int = 0, handoff_lead: float = 1.0,
                 fresh_worker: bool = False) -> None:
        self.cluster = cluster
        self.handoff_lead = handoff_lead
        self.fresh_worker = fresh_worker
        self.ctx: ModuleType = cluster.app
        self.load = load
        self.promotion_tasks = promotion_tasks
        self.sustained_rate = sustained_rate
        self.rates = {"delayq": 1000.0, "native": 1000.0}  # schedule calls/s, from warm-up
        self._runs = 0

    def _runs_key(self, arm: str) -> str:
        self._runs += 1
        return f"bench:runs:{arm}:{self._runs}"

    def _start_in(self, tasks: int) -> float:
        """Seconds from an arm's first call to its first due time: the same in every arm
        (so each worker has as long to take its messages in), time for the slower producer
        to make all its calls."""
        return tasks / min(self.rates.values()) * 1.5 + _START_MARGIN

    def warm_up(self) -> None:
        """Start every process's connections; measure the producers' rates (the start)."""
        warm = Load(min(_WARMUP_TASKS, self.load.tasks), window=0.5, seed=1)
        for arm in ("delayq", "native"):
            self.rates[arm] = self._arm(arm, warm, start_in=0.5)["schedule_per_s"]
        say(f"warm-up done: delayq {self.rates['delayq']:,.0f}/s, "
            f"native {self.rates['native']:,.0f}/s scheduling")

    def delayq(self) -> dict:
        return self._arm("delayq", self.load, self._start_in(self.load.tasks))

    def delayq_direct(self) -> dict:
        """The delayq arm with the carrier restarted with ``--direct``."""
        with self._carrier("--direct"):
            return self._arm("delayq", self.load, self._start_in(self.load.tasks),
                             label="delayq, direct")

    def delayq_lead(self) -> dict:
        """The delayq arm with the carrier restarted with ``--handoff-lead``."""
        with self._carrier("--handoff-lead", str(self.handoff_lead)):
            return self._arm("delayq", self.load, self._start_in(self.load.tasks),
                             label=f"delayq, hand-off lead {self.handoff_lead:g} s")

    def native(self) -> dict:
        return self._arm("native", self.load, self._start_in(self.load.tasks))

    def native_paced(self) -> dict:
        """The native arm, each task sent with a countdown of the hand-off lead."""
        return self._arm("native", self.load, self.handoff_lead, paced=True,
                         label=f"native, paced {self.handoff_lead:g} s ahead")

    def bullmq(self) -> dict:
        """BullMQ's delivery of the same load, in one Node process that adds the jobs and
        runs a Worker (``bench/bullmq/lateness.mjs``), on the same Redis server."""
        load, start_in = self.load, self._start_in(self.load.tasks)
        say(f"bullmq: adding {load.tasks:,} jobs due over {load.window:g}s from "
            f"{start_in:.1f}s on (Node, Worker concurrency {_BULLMQ_CONCURRENCY})")
        out = node_json("lateness.mjs", f"{self.cluster.redis.url}/{_BULLMQ_DB}", load.tasks,
                        load.window, start_in, _BULLMQ_CONCURRENCY,
                        timeout=start_in + load.window + _DRAIN_TIMEOUT)
        lateness = distribution(out["lateness_ms"])
        say(f"bullmq: added at {out['schedule_per_s']:,.0f}/s ({out['overran']} overran); "
            f"worker start - due p50 {lateness['p50']:.1f} ms, p99 {lateness['p99']:.1f} ms")
        return {"tasks": load.tasks, "schedule_per_s": out["schedule_per_s"],
                "schedule_overran": out["overran"], "worker_lateness_ms": lateness,
                "worker_start_per_s": workload.worker_rate(
                    [{"start": start} for start in out["start_ms"]])}

    def _arm(self, arm: str, load: Load, start_in: float, label: str = "",
             paced: bool = False) -> dict:
        label = label or arm
        # A fresh worker's RSS growth is the arm's own: the ETA messages it holds.
        worker = psutil.Process(self.cluster.restart_worker()) if self.fresh_worker else None
        rss = [worker.memory_info().rss] * 2 if worker else [0, 0]  # before, most seen since
        runs_key = self._runs_key(arm)
        marks = workload.journal_marks(self.ctx) if arm == "delayq" else None
        send = (workload.send_delayed if arm == "delayq" else workload.send_native)(
            self.ctx, runs_key)
        say(f"{label}: scheduling {load.tasks:,} tasks due over {load.window:g}s "
            f"from {start_in:.1f}s on")

        def poll() -> None:
            self.cluster.check_alive()
            if worker is not None:
                rss[1] = max(rss[1], worker.memory_info().rss)

        scheduled = (workload.schedule_paced(load, start_in, send) if paced
                     else workload.schedule_one_by_one(load, start_in, send))
        say(f"{label}: scheduled at {scheduled.per_s:,.0f}/s ({scheduled.overran} overran)")
        workload.wait_for_runs(self.ctx, runs_key, load.tasks, start_in + load.window
                               + _DRAIN_TIMEOUT, poll, say)
        records = workload.runs(self.ctx, runs_key)
        self.ctx.delayq.store.client.delete(runs_key)
        due_ms = None if arm == "delayq" else scheduled.due_ms
        lateness, duplicates = workload.worker_lateness(records, due_ms)
        result = {"tasks": load.tasks, "schedule_per_s": scheduled.per_s,
                  "schedule_overran": scheduled.overran, "duplicates": duplicates,
                  "worker_lateness_ms": lateness,
                  "worker_start_per_s": workload.worker_rate(records),
                  "worker_gc": workload.worker_gc_pauses(self.ctx, records, due_ms),
                  "worker_rss_growth_mib": (rss[1] - rss[0]) / 2**20 if worker else None}
        if marks is not None:
            events = workload.promoted(self.ctx, marks, scheduled.job_ids)
            result["promotion_lateness_ms"] = workload.promotion_lateness(events)
        say(f"{label}: worker start - due p50 {lateness['p50']:.1f} ms, "
            f"p99 {lateness['p99']:.1f} ms, max {lateness['max']:.1f} ms; worker GC "
            f"longest {result['worker_gc']['max_ms']:.1f} ms")
        return result

    def promotion(self, direct: bool = False) -> dict:
        """Carrier throughput and lateness, into an unread queue: jobs due at one instant,
        then jobs due at ``sustained_rate`` per second for ``window`` seconds. ``direct``
        restarts the carrier with ``--direct`` for the duration."""
        name = "promotion, direct" if direct else "promotion"
        with self._carrier("--direct") if direct else contextlib.nullcontext():
            result = self._promotion(name, self.promotion_tasks, spread_s=0.0)
            if self.sustained_rate:
                tasks = int(self.sustained_rate * self.load.window)
                result["sustained"] = self._promotion(f"{name}, sustained", tasks,
                                                      spread_s=self.load.window)
            return result

    def celery_alone(self) -> dict:
        """Build and publish the promotion arm's messages with Celery and kombu alone."""
        ctx, tasks = self.ctx, self.promotion_tasks
        say(f"celery alone: building and publishing {tasks:,} messages in Producer.batch()")
        per_s = self._publish(ctx.delayed_probe.name, "bench:runs:sink", ctx.SINK_QUEUE, tasks)
        purged = workload.purge(ctx, ctx.SINK_QUEUE)
        say(f"celery alone: {per_s:,.0f}/s; {purged:,} messages purged")
        return {"tasks": tasks, "published": purged, "per_s": per_s}

    def worker_drain(self) -> dict:
        """What the worker allows: it runs the arms' number of messages already queued (no
        eta), published by Celery alone; starts/s from its first start to its last."""
        ctx, tasks, runs_key = self.ctx, self.load.tasks, self._runs_key("drain")
        say(f"worker drain: {tasks:,} messages queued at once for the worker")
        self._publish(ctx.native_probe.name, runs_key, "celery", tasks)
        workload.wait_for_runs(ctx, runs_key, tasks, _DRAIN_TIMEOUT, self.cluster.check_alive,
                               say)
        per_s = workload.worker_rate(workload.runs(ctx, runs_key))
        ctx.delayq.store.client.delete(runs_key)
        say(f"worker drain: {per_s:,.0f} starts/s")
        return {"tasks": tasks, "worker_start_per_s": per_s}

    def _publish(self, name: str, runs_key: str, queue: str, tasks: int) -> float:
        """Build ``tasks`` messages of ``name`` with Celery's ``create_task_message`` and
        publish them in kombu's ``Producer.batch()``; returns messages/s."""
        create, chunk = self.ctx.app.amqp.create_task_message, 4000
        with self.ctx.app.producer_pool.acquire(block=True) as producer:
            started = time.perf_counter()
            for first in range(0, tasks, chunk):
                with producer.batch(max_size=chunk):
                    for _ in range(first, min(tasks, first + chunk)):
                        headers, properties, body, _ = create(uuid(), name, (runs_key,), {})
                        producer.publish(body, exchange="", routing_key=queue,
                                         serializer="json", headers=headers, **properties)
            return tasks / (time.perf_counter() - started)

    @contextlib.contextmanager
    def _carrier(self, *options: str) -> Iterator[None]:
        """The carrier restarted with ``options`` for the duration, then as it was."""
        self._restart_carrier(*options)
        try:
            yield
        finally:
            self._restart_carrier()

    def _restart_carrier(self, *options: str) -> None:
        """A new carrier, back once it serves every shard (the old one hands them over)."""
        self.cluster.stop("carrier")
        self.cluster.start_carrier(*options)
        store = self.ctx.delayq.store
        workload.wait_until(lambda: all(store.owners()[0]), 60, "the carrier to take the shards",
                            self.cluster.check_alive)

    def _promotion(self, arm: str, tasks: int, spread_s: float) -> dict:
        ctx = self.ctx
        marks = workload.journal_marks(ctx)
        eta = workload.eta_after(2.0 + tasks / 10_000)
        say(f"{arm}: {tasks:,} jobs due " + (f"evenly over {spread_s:g} s" if spread_s else
                                             "at one instant") + " (apply_delayed_many)")
        started = time.perf_counter()
        results = ctx.delayed_probe.apply_delayed_many(
            [{"args": ("bench:runs:sink",), "eta": eta + timedelta(seconds=spread_s * n / tasks)}
             for n in range(tasks)], queue=ctx.SINK_QUEUE)
        many_per_s = tasks / (time.perf_counter() - started)
        workload.wait_until(lambda: workload.pending_in_store(ctx) == 0,
                            eta.timestamp() - time.time() + _DRAIN_TIMEOUT,
                            "the carrier to empty the store", self.cluster.check_alive)
        events = workload.promoted(ctx, marks, [r.job_id for r in results])
        purged = workload.purge(ctx, ctx.SINK_QUEUE)
        due_ms = min(due for _, due in events)
        span_s = max(1, max(at for at, _ in events) - due_ms) / 1000
        lateness = workload.promotion_lateness(events)
        say(f"{arm}: {len(events):,} promoted in {span_s * 1000:.0f} ms after the first due "
            f"({len(events) / span_s:,.0f}/s), publish - due p99 {lateness['p99']:.0f} ms; "
            f"{purged:,} messages purged")
        return {"tasks": tasks, "promoted": len(events), "schedule_many_per_s": many_per_s,
                "promotion_per_s": len(events) / span_s, "lateness_ms": lateness}


def repetition(bench: Bench, n: int, bullmq: bool = False) -> dict:
    """One repetition; the arms alternate order so drift over time favours none."""
    order = ("delayq", "native", "delayq_lead", "native_paced", *(("bullmq",) if bullmq else ()))
    order = order if n % 2 == 0 else order[::-1]
    result: dict = {"loadavg_1m_before": os.getloadavg()[0]}
    result.update({arm: getattr(bench, arm)() for arm in order})
    result["promotion"] = bench.promotion()
    result["promotion_direct"] = bench.promotion(direct=True)
    result["celery_alone"] = bench.celery_alone()
    result["worker_drain"] = bench.worker_drain()
    result["ratios"] = ratios(result)
    result["loadavg_1m_after"] = os.getloadavg()[0]
    say(f"load average (1 min) {result['loadavg_1m_before']:.2f} before, "
        f"{result['loadavg_1m_after']:.2f} after: other processes share these CPUs")
    return result


def ratios(rep: dict) -> dict:
    """delayq ÷ native within one repetition (lateness below 1 and rates above 1 favour delayq)."""
    ours, theirs = rep["delayq"], rep["native"]
    out = {name: ours[name] / theirs[name]
           for name in ("schedule_per_s", "worker_start_per_s")}
    out["promotion_vs_celery_alone"] = (rep["promotion"]["promotion_per_s"]
                                        / rep["celery_alone"]["per_s"])
    for arm, name, native in (("delayq", "worker_lateness", "native"),
                              ("delayq_lead", "lead_worker_lateness", "native"),
                              ("delayq_lead", "lead_vs_paced_worker_lateness", "native_paced"),
                              ("delayq", "bullmq_worker_lateness", "bullmq")):
        if native not in rep:  # no BullMQ arm
            continue
        out[name] = {p: rep[arm]["worker_lateness_ms"][p]
                     / max(rep[native]["worker_lateness_ms"][p], 1e-3)
                     for p in ("p50", "p95", "p99", "max")}
    return out


# -- report ------------------------------------------------------------------------------

def report(summary: dict, repeats: int, promotion_tasks: int, sustained_rate: int,
           handoff_lead: float) -> str:
    many = repeats > 1
    pcts = [name for name, _ in PERCENTILES] + ["max"]

    def lat_row(label: str, prefix: str) -> list[str]:
        digits = 2 if prefix.startswith("ratios.") else 1
        return [label, *(cell(summary.get(f"{prefix}.{p}"), digits, many) for p in pcts)]

    lateness = table(["lateness, ms", *pcts], [
        lat_row("delayq publish - due (journal)", "delayq.promotion_lateness_ms"),
        lat_row("delayq worker start - due", "delayq.worker_lateness_ms"),
        lat_row("native worker start - due", "native.worker_lateness_ms"),
        lat_row("ratio delayq ÷ native (worker start)", "ratios.worker_lateness"),
        lat_row(f"delayq, lead {handoff_lead:g} s, worker start - due",
                "delayq_lead.worker_lateness_ms"),
        lat_row(f"ratio delayq lead {handoff_lead:g} s ÷ native", "ratios.lead_worker_lateness"),
        lat_row(f"native, paced {handoff_lead:g} s ahead, worker start - due",
                "native_paced.worker_lateness_ms"),
        lat_row(f"ratio delayq lead {handoff_lead:g} s ÷ native paced",
                "ratios.lead_vs_paced_worker_lateness"),
        lat_row(f"BullMQ worker start - due (Node, concurrency {_BULLMQ_CONCURRENCY})",
                "bullmq.worker_lateness_ms"),
        lat_row("ratio delayq ÷ BullMQ (worker start)", "ratios.bullmq_worker_lateness"),
        lat_row(f"publish - due at {sustained_rate:,} due/s, kombu",
                "promotion.sustained.lateness_ms"),
        lat_row(f"publish - due at {sustained_rate:,} due/s, direct",
                "promotion_direct.sustained.lateness_ms"),
    ])
    rows = [
        ["schedule, one call at a time", cell(summary.get("delayq.schedule_per_s"), 0, many),
         cell(summary.get("native.schedule_per_s"), 0, many),
         cell(summary.get("ratios.schedule_per_s"), 2, many)],
        ["worker starts (first to last start)",
         cell(summary.get("delayq.worker_start_per_s"), 0, many),
         cell(summary.get("native.worker_start_per_s"), 0, many),
         cell(summary.get("ratios.worker_start_per_s"), 2, many)],
        ["schedule, batched (apply_delayed_many)",
         cell(summary.get("promotion.schedule_many_per_s"), 0, many), "-", ""],
        [f"promotion through kombu, {promotion_tasks:,} due at once", cell(
            summary.get("promotion.promotion_per_s"), 0, many), "-", ""],
        [f"promotion, direct (--direct), {promotion_tasks:,} due at once", cell(
            summary.get("promotion_direct.promotion_per_s"), 0, many), "-", ""],
        ["Celery alone: the worker drains the arm's tasks, queued at once", "-",
         cell(summary.get("worker_drain.worker_start_per_s"), 0, many), ""],
        [f"Celery alone: build + publish {promotion_tasks:,} (Producer.batch)", "-",
         cell(summary.get("celery_alone.per_s"), 0, many), ""],
        ["ratio promotion through kombu ÷ Celery alone", "", "",
         cell(summary.get("ratios.promotion_vs_celery_alone"), 2, many)],
    ]
    throughput = table(["jobs/s", "delayq", "native", "ratio"], rows)
    pauses = table(["worker main process", "GC >= 1 ms, first due to last start",
                    "longest GC, ms", "sum, ms", "RSS growth, MiB"], [
        [label, *(cell(summary.get(f"{arm}.{name}"), digits, many)
                  for name, digits in (("worker_gc.count", 0), ("worker_gc.max_ms", 1),
                                       ("worker_gc.total_ms", 1),
                                       ("worker_rss_growth_mib", 1)))]
        for arm, label in (("native", "native"), ("delayq", "delayq"),
                           ("delayq_lead", f"delayq, lead {handoff_lead:g} s"),
                           ("native_paced", f"native, paced {handoff_lead:g} s ahead"))])
    return f"{lateness}\n\n{pauses}\n\n{throughput}"


def machine(ctx: ModuleType, setup: WorkerSetup) -> dict:
    info = ctx.delayq.store.client.info("server")
    return {
        "nproc": os.cpu_count(), "cpu": _cpu_model(), "platform": platform.platform(),
        "python": platform.python_version(), "redis_server": info["redis_version"],
        **{name: metadata.version(name) for name in ("celery", "kombu", "redis")},
        "worker": f"celery worker -P {setup.pool} -c {setup.concurrency}",
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# -- entry point -------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.lateness",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="jobs per arm")
    parser.add_argument("--window", type=float, default=5.0, help="seconds the due times span")
    parser.add_argument("--promotion-tasks", type=int, default=50_000,
                        help="jobs due at one instant in each promotion arm")
    parser.add_argument("--sustained-rate", type=int, default=20_000,
                        help="due jobs/s over --window in each promotion arm (0: skip)")
    parser.add_argument("--handoff-lead", type=float, default=1.0,
                        help="seconds of hand-off lead in the lead arm")
    parser.add_argument("--fresh-worker", action="store_true",
                        help="a fresh worker for each lateness arm, so each arm's worker RSS "
                             "growth is its own (a worker keeps the heap an arm grew)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2,000 tasks, 1 repetition")
    parser.add_argument("--pool", default="prefork", choices=("prefork", "threads", "solo"))
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--no-worker-events", action="store_true",
                        help="delayq_worker_events=False in the worker (no journal XADDs)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default bench/results/lateness[-quick].json)")
    parser.add_argument("--profile-carrier", type=Path, default=None, metavar="TXT",
                        help="run the carrier under pyinstrument, text report to TXT")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.tasks, opts.repeat, opts.promotion_tasks, opts.sustained_rate = 2_000, 1, 5_000, 2_000
    if opts.no_worker_events:
        os.environ["DELAYQ_BENCH_WORKER_EVENTS"] = "0"
    if opts.out is None:
        opts.out = RESULTS / ("lateness-quick.json" if opts.quick else "lateness.json")
    return opts


def run(opts: argparse.Namespace) -> dict:
    load = Load(opts.tasks, opts.window)
    setup = WorkerSetup(opts.pool, opts.concurrency)
    with Cluster(setup, profile_carrier=opts.profile_carrier) as cluster:
        say(f"redis-server at {cluster.redis.url}; worker ({setup.pool}, "
            f"{setup.concurrency}) and carrier started")
        bench = Bench(cluster, load, opts.promotion_tasks, opts.sustained_rate,
                      opts.handoff_lead, opts.fresh_worker)
        bench.warm_up()
        skipped = bullmq_ready()
        if skipped is not None:
            say(f"BullMQ arm skipped: {skipped}")
        reps = []
        for n in range(opts.repeat):
            say(f"-- repetition {n + 1}/{opts.repeat} --")
            reps.append(repetition(bench, n, bullmq=skipped is None))
        facts = machine(cluster.app, setup)
    summary = summarise(reps)
    return {
        "benchmark": "lateness", "machine": facts,
        "parameters": {"tasks": load.tasks, "window_s": load.window, "repeat": opts.repeat,
                       "promotion_tasks": opts.promotion_tasks,
                       "sustained_rate": opts.sustained_rate,
                       "handoff_lead_s": opts.handoff_lead,
                       "fresh_worker": opts.fresh_worker,
                       "pool": setup.pool, "concurrency": setup.concurrency,
                       "worker_events": not opts.no_worker_events,
                       "bullmq_skipped": skipped},
        "command": " ".join(["python -m bench.lateness", *sys.argv[1:]]),
        "summary": summary, "repetitions": reps,
    }


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    try:
        result = run(opts)
    except KeyboardInterrupt:
        say("interrupted; every process stopped")
        return 130
    print()
    print(report(result["summary"], opts.repeat, opts.promotion_tasks, opts.sustained_rate,
                 opts.handoff_lead))
    facts = result["machine"]
    print(f"\n{facts['nproc']} CPUs ({facts['cpu']}), Redis {facts['redis_server']}, "
          f"Python {facts['python']}, Celery {facts['celery']}, {facts['worker']}; "
          f"medians of {opts.repeat} [min..max]")
    write_result(opts.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
