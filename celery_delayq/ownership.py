"""Which shards a carrier serves: leases in Redis, shared fairly among live carriers.

Every carrier heartbeats into the ``carriers`` set and holds its share of the shard
leases (shares differ by at most one); it releases extras when others join and takes
free shards when others leave or die (their leases expire). Two carriers may both
claim from a shard during a handover; that is harmless, ``claim_due`` is atomic.

This bookkeeping never blocks promotion: while a full Redis refuses its writes, a carrier
serves every shard (promotion is what frees memory), as it does while the ``carriers`` set
is damaged (it cannot count the live carriers). A shard whose lease key is damaged is
neither served nor free (``failed``), as a shard with any other damaged key.
"""

from __future__ import annotations

import logging
from zlib import crc32

from .errors import DamagedShard, DelayQError, StoreFull
from .keys import ShardKeys
from .reading import counted
from .store import Store

logger = logging.getLogger("celery_delayq.carrier")


class ShardOwnership:
    """The shard leases of one carrier."""

    def __init__(self, store: Store, carrier_id: str, lease_ms: int) -> None:
        self.store = store
        self.carrier_id = carrier_id
        self.lease_ms = lease_ms
        shards = list(store.keys)
        start = crc32(carrier_id.encode()) % len(shards)
        self._preference = shards[start:] + shards[:start]  # spreads first picks
        self.owned: list[ShardKeys] = []
        self.failed: dict[ShardKeys, DelayQError] = {}  # shards whose lease key is damaged
        self._refused = False  # the last balance met a full Redis
        self._uncounted = False  # the last balance could not read the live carriers

    def balance(self) -> list[ShardKeys]:
        """Renew, release or take shard leases; returns the shards to serve now: all of them
        while Redis refuses these writes for memory."""
        try:
            with self.store.unavailable():
                owned = self._balance()
        except StoreFull:
            if not self._refused:
                logger.warning("Redis is full: the heartbeat and shard leases cannot be "
                               "written; serving every shard until it has room again "
                               "(claims are atomic, so sharing shards is harmless)")
            self._refused = True
            return list(self.store.keys)
        except DamagedShard as exc:  # the carriers set (shard lease keys: self.failed)
            if not self._uncounted:
                logger.error("the live carriers cannot be counted (%s); serving every shard "
                             "until the key is moved away (claims are atomic, so sharing "
                             "shards is harmless)", exc)
            self._uncounted = True
            return list(self.store.keys)
        if self._uncounted:
            logger.info("the live carriers are counted again: shards are shared out")
        self._refused = self._uncounted = False
        return owned

    def _balance(self) -> list[ShardKeys]:
        live = sorted(self.store.heartbeat(self.carrier_id, self.lease_ms))
        shards = len(self._preference)
        rank = live.index(self.carrier_id) if self.carrier_id in live else 0
        fair = shards // len(live) + (1 if rank < shards % len(live) else 0)
        owners, self.failed = self.store.owners()
        mine = [s for s in self._preference if owners[s.shard] == self.carrier_id
                and s not in self.failed]
        keep, extra = mine[:fair], mine[fair:]
        kept = [s for s, ok in zip(keep, self.store.hold(keep, self.carrier_id, self.lease_ms,
                                                         keep=True), strict=True) if ok]
        self.store.hold(extra, self.carrier_id, self.lease_ms, keep=False)
        free = [s for s in self._preference if owners[s.shard] is None
                and s not in self.failed][:fair - len(kept)]
        taken = [s for s, ok in zip(free, self.store.hold(free, self.carrier_id,
                                                          self.lease_ms, keep=True),
                                    strict=True) if ok]
        owned = sorted(kept + taken, key=lambda s: s.shard)
        if owned != self.owned:
            logger.info("serving shards %s of %d (%s alive)",
                        ",".join(str(s.shard) for s in owned) or "none",
                        shards, counted(len(live), "carrier"))
        self.owned = owned
        return owned

    def release(self) -> None:
        self.store.leave(self.carrier_id, self.owned)
        self.owned = []
