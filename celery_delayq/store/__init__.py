"""The Redis delay store: every read and write of the keys named in :mod:`keys`.

Writes go through the Lua scripts in ``scripts/``, one atomic call per shard; reads are
plain commands, pipelined across shards. ``Store`` is one object made of seven parts:

``base.py``       the client, Redis errors turned into ours, the store's memory
``producing.py``  producers' writes: schedule, cancel, reschedule
``releasing.py``  pauses and rate limits, and the releases of the jobs they held
``dead_letters.py`` an operator's: replay or drop dead letters, one or all
``claims.py``     from the claim on: claim, ack, recover, release, dead letters, shard
                  leases
``listing.py``    reads: jobs, dead letters, stats, counts, pauses, damage
``streams.py``    the journal streams: worker-side events, entries, the export's positions
"""

from __future__ import annotations

from .claims import ClaimAhead, Claimed, Claims, DirectRoutes, Promoted, ShardClaim
from .dead_letters import DeadLetters, Replayed
from .listing import Listing
from .producing import (
    OUTCOME_MS,
    TASK_INDEX_GRACE_MS,
    CancelOutcome,
    Producing,
    RunRows,
    ScheduleCode,
    Scheduled,
)
from .releasing import Releasing
from .streams import Streams

__all__ = [
    "OUTCOME_MS",
    "TASK_INDEX_GRACE_MS",
    "CancelOutcome",
    "ClaimAhead",
    "Claimed",
    "DirectRoutes",
    "Promoted",
    "Replayed",
    "RunRows",
    "ScheduleCode",
    "Scheduled",
    "ShardClaim",
    "Store",
]


class Store(Producing, Releasing, DeadLetters, Claims, Listing, Streams):
    """The delay store of one app (see :mod:`keys` for the data layout)."""
