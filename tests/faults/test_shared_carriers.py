"""Carriers share the shards through leases, hand them over on death, rebalance on join."""

from __future__ import annotations

import signal
import time

from tests.conftest import wait_for
from tests.faults.test_carrier_faults import PARKED, all_delivered, parked_messages

SHARD_LEASE = 1.0


def owner_pids(delayq) -> list[int | None]:
    """The pid of the carrier holding each shard (carrier ids are host:pid:nonce)."""
    return [int(owner.split(":")[1]) if owner else None for owner in delayq.store.owners()[0]]


def serving(delayq, processes) -> bool:
    """Every shard is held, only by live carriers, and each carrier holds one or more."""
    pids = owner_pids(delayq)
    alive = {p.pid for p in processes if p.poll() is None}
    return None not in pids and set(pids) == alive


def test_carriers_share_shards_take_over_from_the_dead_and_rebalance(
        proj, delayq, redis_client, spawn):
    def start():
        return spawn("delayq", "carrier", "--shard-lease", str(SHARD_LEASE), "--lease", "2")

    carriers = [start() for _ in range(3)]
    wait_for(lambda: serving(delayq, carriers), timeout=20, what="three carriers sharing")
    n = 6000
    items = [{"args": (i,), "delay": 0.2 + 6.0 * i / n, "job_id": f"flow-{i}"} for i in range(n)]
    proj.record.apply_delayed_many(items, queue=PARKED)

    takeovers = []
    for victim in carriers[:2]:
        time.sleep(1.5)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed = time.monotonic()
        wait_for(lambda: serving(delayq, carriers), timeout=10, what="takeover")
        takeovers.append(time.monotonic() - killed)
    survivor = carriers[2].pid
    assert set(owner_pids(delayq)) == {survivor}

    carriers.append(start())  # a carrier joins: the survivor gives up half the shards
    wait_for(lambda: serving(delayq, carriers), timeout=30,  # a new process starts: slow
             what="rebalance on join")  # on a loaded machine (once over 10 s with -n 3)
    wait_for(lambda: all_delivered(redis_client), timeout=30, what="every job delivered")

    delivered = [h["delayq_job"] for h in parked_messages(redis_client)]
    duplicates = len(delivered) - len(set(delivered))
    print(f"\njobs={n} delivered={len(set(delivered))} duplicates={duplicates} "
          f"takeover={', '.join(f'{t:.1f}s' for t in takeovers)}")
    assert set(delivered) == {item["job_id"] for item in items}
    assert all(t <= SHARD_LEASE + 2.0 for t in takeovers), takeovers
