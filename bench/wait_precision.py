"""How precisely ``Carrier._wait`` sleeps: overshoot of a requested wait, on an idle Redis.

The carrier sleeps until the next due time through pub/sub ``get_message`` timeouts;
this measures the overshoot of that sleep alone (no jobs, no worker), to tell timer
imprecision apart from promotion cost in the lateness figures.
Run ``python -m bench.wait_precision``.
"""

from __future__ import annotations

import os
import sys
import time

from celery_delayq.testing.redis_server import RedisServer

from .stats import distribution, table

WAITS_MS = (1, 5, 20, 100, 250)
SAMPLES = 40


def measure(carrier, wait_ms: float, samples: int) -> dict[str, float]:
    overshoot = []
    for _ in range(samples):
        started = time.monotonic()
        carrier._wait(wait_ms / 1000)
        overshoot.append((time.monotonic() - started) * 1000 - wait_ms)
    return distribution(overshoot)


def main() -> int:
    with RedisServer() as server:
        os.environ["DELAYQ_BENCH_REDIS_URL"] = server.url
        from celery_delayq.carrier import Carrier

        from . import app

        carrier = Carrier(app.app)
        try:
            carrier._wait(0.001)  # subscribe first
            rows = []
            for wait_ms in WAITS_MS:
                d = measure(carrier, wait_ms, SAMPLES)
                rows.append([f"{wait_ms}", *(f"{d[p]:.3f}" for p in ("p50", "p99", "max"))])
        finally:
            carrier.close()
    print(table(["requested wait, ms", "overshoot p50", "p99", "max"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
