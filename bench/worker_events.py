"""What the worker's journal events cost it: one worker draining a burst of promoted
delayed tasks with ``delayq_worker_events`` on and off.

Per repetition and arm (the order alternates): with the worker stopped, ``--tasks`` jobs of
``bench.delayed_probe`` due at once are scheduled and promoted by the carrier into the
worker's queue; then a fresh ``celery worker -P prefork -c 2`` starts with worker events on
(the journal's ``started`` and ``succeeded``, written by a thread of each pool process) or
off, and drains them. Figure: its starts per second, first start to last (so its own
start-up does not count), and the ratio on ÷ off. The "on" arm checks that every task left
both events in the journal. Run ``python -m bench.worker_events --help``.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

from . import workload
from .harness import Cluster, WorkerSetup, machine_facts, wait_until
from .output import options, say, write_result
from .stats import cell, summarise, table

_CHUNK = 10_000
ARMS = {"events on": "1", "events off": "0"}  # DELAYQ_BENCH_WORKER_EVENTS (bench.app)


def arm(cluster: Cluster, tasks: int, name: str, runs_key: str) -> dict:
    ctx = cluster.app
    cluster.stop("worker")
    marks = workload.journal_marks(ctx)
    for first in range(0, tasks, _CHUNK):
        ctx.delayed_probe.apply_delayed_many(
            [{"args": (runs_key,), "delay": 0}] * min(_CHUNK, tasks - first))
    client = ctx.delayq.store.client
    wait_until(lambda: workload.pending_in_store(ctx) == 0 and client.llen("celery") >= tasks,
               120, "the carrier to promote the burst", cluster.check_alive)
    os.environ["DELAYQ_BENCH_WORKER_EVENTS"] = ARMS[name]
    cluster.start_worker()
    workload.wait_for_runs(ctx, runs_key, tasks, 600, cluster.check_alive, say)
    records = workload.runs(ctx, runs_key)
    _, duplicates = workload.worker_lateness(records)
    expected = tasks if ARMS[name] == "1" else 0
    events: Counter = Counter()

    def journaled() -> bool:
        events.clear()
        events.update(fields.get("event") for _, fields in workload.journal_after(ctx, marks))
        return events["succeeded"] >= expected

    wait_until(journaled, 30, "every task's succeeded event")
    time.sleep(0.5)  # a worker's journal thread writes within 50 ms: none may come late
    journaled()
    if events["started"] != expected or events["succeeded"] != expected:
        raise RuntimeError(f"{name}: expected {expected:,} started and succeeded events, "
                           f"found {dict(events)}")
    client.delete(runs_key)
    return {"worker_start_per_s": workload.worker_rate(records), "duplicates": duplicates,
            "started_events": events["started"], "succeeded_events": events["succeeded"]}


def repetition(cluster: Cluster, tasks: int, n: int) -> dict:
    names = list(ARMS) if n % 2 == 0 else list(ARMS)[::-1]
    result = {}
    for name in names:
        result[name] = arm(cluster, tasks, name, f"bench:events:{n}:{name}")
        say(f"  {name}: {result[name]['worker_start_per_s']:,.0f} tasks/s")
    result["on_over_off"] = (result["events on"]["worker_start_per_s"]
                             / result["events off"]["worker_start_per_s"])
    return result


def report(summary: dict, repeats: int, tasks: int) -> str:
    many = repeats > 1
    rows = [[f"worker events {name.split()[1]}", cell(summary[f"{name}.worker_start_per_s"],
                                                      0, many)] for name in ARMS]
    text = table([f"{tasks:,} promoted tasks drained by prefork -c 2", "worker starts/s"], rows)
    return f"{text}\n\non ÷ off: {cell(summary['on_over_off'], 3, many)}"


def main(argv: list[str] | None = None) -> int:
    opts = options(argv, "worker_events", __doc__, ("--tasks", 10_000, "tasks per burst"),
                   {"tasks": 1_000, "repeat": 1}, "1,000 tasks, 1 repetition")
    setup = WorkerSetup()
    try:
        with Cluster(setup) as cluster:
            facts = machine_facts(cluster.app.delayq.store.client)
            say(f"redis-server {facts['redis_server']} at {cluster.redis.url}; load average "
                f"{facts['loadavg_1m_3m_15m'][0]:.2f} (shared machine)")
            reps = []
            for n in range(opts.repeat):
                say(f"-- repetition {n + 1}/{opts.repeat}: {opts.tasks:,} tasks per arm --")
                reps.append(repetition(cluster, opts.tasks, n))
            facts["loadavg_1m_after"] = os.getloadavg()[0]
    except KeyboardInterrupt:
        say("interrupted; every process stopped")
        return 130
    summary = summarise(reps)
    print()
    print(report(summary, opts.repeat, opts.tasks))
    write_result(opts.out, {
        "benchmark": "worker_events", "machine": facts,
        "parameters": {"tasks": opts.tasks, "repeat": opts.repeat,
                       "worker": f"celery worker -P {setup.pool} -c {setup.concurrency}"},
        "command": " ".join(["python -m bench.worker_events", *sys.argv[1:]]),
        "summary": summary, "repetitions": reps})
    return 0


if __name__ == "__main__":
    sys.exit(main())
