"""The faust store that *is* the sharded index: one :class:`~streamdedup.pipeline.shard.Shard` per
changelog partition this worker owns, rebuilt from the changelog before the worker answers.

faust's recovery replays the changelog through :meth:`ShardStore.apply_changelog_batch`
(whole batches, decoded with numpy) starting after :meth:`persisted_offset`: the offset the
in-memory shard already covers, or the one a local snapshot (``data_dir``) covers, so a
restart replays only the changelog's tail.  Snapshots are written by the shard stage between
batches, when the shard and its offset agree, and when the worker stops.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust.stores
from faust.stores import base
from faust.types import TP

from streamdedup.pipeline.shard import Shard, ShardPlan
from streamdedup.pipeline.wire import CHANGELOG, decode

__all__ = ["ShardStore", "SCHEME"]

SCHEME = "sdshard"
log = logging.getLogger(__name__)


class ShardStore(base.Store):
    """Configure with :meth:`configure` before the worker starts (faust builds the store)."""

    plan: ShardPlan
    data_dir: Path | None = None
    on_restored: Callable[[int, int], None] | None = None  # (partition, records) for metrics
    on_recovered: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.shards: dict[int, Shard] = {}
        self.offsets: dict[int, int] = {}  # partition -> last changelog offset the shard covers
        self.snapshot_at: dict[int, float] = {}

    @classmethod
    def configure(
        cls,
        plan: ShardPlan,
        data_dir: Path | None,
        on_restored: Callable[[int, int], None] | None = None,
        on_recovered: Callable[[], None] | None = None,
    ) -> None:
        cls.plan, cls.data_dir, cls.on_restored, cls.on_recovered = plan, data_dir, on_restored, on_recovered

    # -------------------------------------------------------------- the index
    def shard(self, partition: int) -> Shard:
        s = self.shards.get(partition)
        if s is None:
            s = self.shards[partition] = Shard(self.plan)
            self.snapshot_at[partition] = time.monotonic()
        return s

    def covered(self, partition: int, offset: int) -> None:
        """The shard now holds everything up to changelog ``offset`` (after a write was acked)."""
        self.offsets[partition] = max(offset, self.offsets.get(partition, -1))

    # -------------------------------------------------------------- snapshots
    def _snapshot_path(self, partition: int) -> Path | None:
        if self.data_dir is None:
            return None
        return self.data_dir / f"{self.table.changelog_topic.get_topic_name()}-{partition}.npz"

    def snapshot(self, partition: int) -> bool:
        """Save a shard with the changelog offset it covers (atomic; False if nothing to save)."""
        path, shard = self._snapshot_path(partition), self.shards.get(partition)
        self.snapshot_at[partition] = time.monotonic()
        if path is None or shard is None or partition not in self.offsets:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        shard.save(path, {"offset": self.offsets[partition]})
        log.info(
            "snapshot of shard %d: %d entries to changelog offset %d in %.2fs",
            partition,
            len(shard),
            self.offsets[partition],
            time.perf_counter() - t0,
        )
        return True

    def snapshot_due(self, partition: int, interval: float) -> bool:
        return time.monotonic() - self.snapshot_at.get(partition, 0.0) >= interval

    def _load_snapshot(self, partition: int) -> None:
        path = self._snapshot_path(partition)
        if path is None or not path.exists():
            return
        try:
            shard, meta = Shard.load(path, self.plan)
            offset = int(meta["offset"])
        except (ValueError, KeyError, TypeError) as e:
            log.warning("ignoring snapshot %s (%s); replaying the whole changelog", path, e)
            return
        self.shards[partition], self.offsets[partition] = shard, offset
        self.snapshot_at[partition] = time.monotonic()
        log.info("loaded snapshot of shard %d: %d entries, changelog offset %d", partition, len(shard), offset)

    # -------------------------------------------------------------- faust's recovery protocol
    def persisted_offset(self, tp: TP) -> int | None:
        if tp.partition not in self.shards:
            self._load_snapshot(tp.partition)
        return self.offsets.get(tp.partition)

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        # called by faust when a changelog write is acked; the shard stage records the same
        # offsets itself (covered()) at the point where the shard matches them
        pass

    def apply_changelog_batch(self, batch: Any, to_key: Any, to_value: Any) -> None:
        by_partition: dict[int, list] = defaultdict(list)
        for event in batch:
            by_partition[event.message.partition].append(event.message)
        for partition, messages in by_partition.items():
            rows = decode([m.value for m in messages if m.value], CHANGELOG)
            self.shard(partition).restore(rows)
            self.covered(partition, messages[-1].offset)
            if self.on_restored is not None:
                self.on_restored(partition, len(messages))

    def reset_state(self) -> None:
        self.shards.clear()
        self.offsets.clear()

    async def on_rebalance(
        self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP], generation_id: int = 0
    ) -> None:
        topic = self.table.changelog_topic.get_topic_name()
        keep = {tp.partition for tp in assigned if tp.topic == topic}
        for partition in [p for p in self.shards if p not in keep]:
            self.snapshot(partition)  # it may come back: a later recovery replays only the tail
            del self.shards[partition]
            self.offsets.pop(partition, None)

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        for shard in self.shards.values():
            for group in shard._groups.values():
                group.index.prepare()  # build lookup directories now, not on the first probe
        if self.on_recovered is not None:
            self.on_recovered()

    async def on_stop(self) -> None:
        for partition in list(self.shards):
            self.snapshot(partition)

    async def backup_partition(self, tp: Any, flush: bool = True, purge: bool = False, keep: int = 1) -> None:
        pass  # snapshots are written by snapshot(); nothing else to back up

    def restore_backup(self, tp: Any, latest: bool = True, backup_id: int = 0) -> None:
        pass

    # -------------------------------------------------------------- the key/value API (unused)
    # The index is not a key/value map; faust's Table API on this store holds nothing.
    def _get(self, key: bytes) -> None:
        return None

    def _set(self, key: bytes, value: bytes) -> None:
        raise NotImplementedError("the shard store is written through ShardStore.shard(), not table[key]")

    def _del(self, key: bytes) -> None:
        pass

    def _iterkeys(self):
        return iter(())

    def _itervalues(self):
        return iter(())

    def _iteritems(self):
        return iter(())

    def _size(self) -> int:
        return 0

    def _contains(self, key: bytes) -> bool:
        return False

    def _clear(self) -> None:
        self.reset_state()


faust.stores.STORES[SCHEME] = f"{__name__}:ShardStore"  # faust resolves "module:Class" strings
