"""Worker memory with 100,000 pending delayed tasks: celery-delayq vs Celery's native ETA.

One redis-server (broker and store), one ``celery -A bench.app worker -P prefork -c 1``,
restarted fresh for each arm, and one idle carrier. Per arm, after the fresh worker ran one
probe task (so its pool child exists):

* **delayq**: ``--jobs`` ``apply_delayed_many`` calls due in an hour, parked in the store;
* **native**: ``--jobs`` ``apply_async(countdown=3600)`` calls; the bench waits until the
  broker queue is empty and the worker has reserved every message (Redis transport's
  ``unacked`` hash), then until the worker's RSS stops growing.

Figure: RSS (and PSS, which counts pages shared by the parent and its pool child once)
summed over the worker's whole process tree, before and after; plus the broker's
``used_memory`` growth. Run ``python -m bench.worker_rss --help``.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType

import psutil

from . import workload
from .harness import Cluster, WorkerSetup, machine_facts, wait_until
from .output import options, say, write_result
from .stats import cell, summarise, table

_CHUNK = 10_000
_SETTLE_TIMEOUT = 60.0



def tree_memory(pid: int) -> dict[str, float]:
    """RSS and PSS (MiB) summed over ``pid`` and all its descendants."""
    root = psutil.Process(pid)
    rss = pss = 0
    processes = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            info = process.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
        processes += 1
    return {"rss_mib": rss / 2**20, "pss_mib": pss / 2**20, "processes": processes}


def settled(pid: int, timeout: float = _SETTLE_TIMEOUT) -> dict[str, float]:
    """The tree's memory once two readings 1 s apart differ by less than 0.5%."""
    deadline = time.monotonic() + timeout
    last = tree_memory(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = tree_memory(pid)
        if abs(now["rss_mib"] - last["rss_mib"]) < 0.005 * last["rss_mib"]:
            return now
        last = now
    return last


class Arms:
    def __init__(self, cluster: Cluster, jobs: int) -> None:
        self.cluster = cluster
        self.ctx: ModuleType = cluster.app
        self.client = self.ctx.delayq.store.client
        self.jobs = jobs

    def fresh_worker(self) -> int:
        """Stop the worker, empty Redis, start a worker and wait until it ran a probe."""
        self.cluster.stop("worker")
        self.client.flushdb()
        pid = self.cluster.start_worker()
        self.cluster.wait_for_worker()
        return pid

    def run(self, arm: str) -> dict:
        pid = self.fresh_worker()
        before = settled(pid)
        broker_before = workload.used_memory(self.client)
        started = time.perf_counter()
        if arm == "delayq":
            for first in range(0, self.jobs, _CHUNK):
                self.ctx.delayed_probe.apply_delayed_many(
                    [{"args": ("bench:rss:never",), "delay": 3600}
                     for _ in range(first, min(first + _CHUNK, self.jobs))])
            fill_s = time.perf_counter() - started
            self.cluster.wait_for_worker()  # alive, and it served one task meanwhile
        else:
            workload.native_fill(self.ctx.app, self.ctx.native_probe, self.jobs,
                                 progress=lambda n: n and say(f"  native: {n:,} sent"))
            fill_s = time.perf_counter() - started
            wait_until(lambda: self.client.llen("celery") == 0
                       and self.client.hlen("unacked") >= self.jobs,
                       600, "the worker to reserve every ETA message",
                       self.cluster.check_alive, interval=0.5)
        drained_s = time.perf_counter() - started
        after = settled(pid)
        broker_after = workload.used_memory(self.client)
        carrier = tree_memory(self.cluster.pid("carrier"))
        result = {
            "before": before, "after": after,
            "growth_mib": after["rss_mib"] - before["rss_mib"],
            "growth_bytes_per_task": (after["rss_mib"] - before["rss_mib"]) * 2**20 / self.jobs,
            "broker_growth_bytes_per_task": (broker_after - broker_before) / self.jobs,
            "fill_s": fill_s, "reserved_after_s": drained_s, "carrier_rss_mib": carrier["rss_mib"],
        }
        say(f"  {arm}: worker tree RSS {before['rss_mib']:.1f} -> {after['rss_mib']:.1f} MiB "
            f"(PSS {before['pss_mib']:.1f} -> {after['pss_mib']:.1f}), "
            f"broker +{result['broker_growth_bytes_per_task']:,.0f} bytes/task")
        return result


def repetition(arms: Arms, n: int) -> dict:
    order = ("delayq", "native") if n % 2 == 0 else ("native", "delayq")
    result: dict = {"loadavg_1m_before": os.getloadavg()[0]}
    result.update({arm: arms.run(arm) for arm in order})
    result["ratio_native_over_delayq_rss"] = (
        result["native"]["after"]["rss_mib"] / result["delayq"]["after"]["rss_mib"])
    result["ratio_native_over_delayq_pss"] = (
        result["native"]["after"]["pss_mib"] / result["delayq"]["after"]["pss_mib"])
    result["loadavg_1m_after"] = os.getloadavg()[0]
    arms.cluster.stop("worker")  # lets go of the reserved ETA messages before the next flush
    return result


def report(summary: dict, repeats: int, jobs: int) -> str:
    many = repeats > 1

    def row(label: str, name: str, digits: int = 1) -> list[str]:
        return [label, cell(summary.get(f"delayq.{name}"), digits, many),
                cell(summary.get(f"native.{name}"), digits, many)]

    text = table([f"worker -P prefork -c 1, {jobs:,} pending", "delayq (store)",
                  "native ETA (reserved)"], [
        row("worker tree RSS before, MiB", "before.rss_mib"),
        row("worker tree RSS after, MiB", "after.rss_mib"),
        row("worker tree PSS after, MiB", "after.pss_mib"),
        row("RSS growth, bytes per pending task", "growth_bytes_per_task", 0),
        row("broker used_memory growth, bytes/task", "broker_growth_bytes_per_task", 0),
        row("carrier RSS, MiB", "carrier_rss_mib"),
        row("fill until measured, s", "reserved_after_s"),
    ])
    return (f"{text}\n\nratio native ÷ delayq, worker tree RSS after: "
            f"{cell(summary.get('ratio_native_over_delayq_rss'), 2, many)}; PSS: "
            f"{cell(summary.get('ratio_native_over_delayq_pss'), 2, many)}")


def main(argv: list[str] | None = None) -> int:
    opts = options(argv, "worker_rss", __doc__, ("--jobs", 100_000, "pending tasks per arm"),
                   {"jobs": 10_000, "repeat": 1}, "10,000 tasks, 1 repetition")
    setup = WorkerSetup("prefork", 1)
    try:
        with Cluster(setup) as cluster:
            facts = machine_facts(cluster.app.delayq.store.client)
            facts["worker"] = f"celery worker -P {setup.pool} -c {setup.concurrency}"
            say(f"redis-server {facts['redis_server']} at {cluster.redis.url}; load average "
                f"{facts['loadavg_1m_3m_15m'][0]:.2f} (shared machine)")
            arms = Arms(cluster, opts.jobs)
            reps = []
            for n in range(opts.repeat):
                say(f"-- repetition {n + 1}/{opts.repeat}: {opts.jobs:,} tasks per arm --")
                reps.append(repetition(arms, n))
    except KeyboardInterrupt:
        say("interrupted; every process stopped")
        return 130
    summary = summarise(reps)
    print()
    print(report(summary, opts.repeat, opts.jobs))
    result = {"benchmark": "worker_rss", "machine": facts,
              "parameters": {"jobs": opts.jobs, "repeat": opts.repeat,
                             "worker": facts["worker"]},
              "command": " ".join(["python -m bench.worker_rss", *sys.argv[1:]]),
              "summary": summary, "repetitions": reps}
    write_result(opts.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
