"""A periodic snapshot is written in a thread (``ShardStore.snapshot(background=True)``): the
event loop goes on storing pages while it is written, and the file holds the shard as it was
when the snapshot was taken (bench/README.md, "p99 while the index grows past 10 M pages")."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from prometheus_client import CollectorRegistry
from store_rebalance import assign

from streamdedup.pipeline.shard import Shard
from streamdedup.settings import Settings
from streamdedup.stream import store as store_module
from streamdedup.stream.app import Worker
from streamdedup.stream.store import ShardStore


def _store(shard: Shard, first: int, n: int) -> None:
    """n pages numbered from ``first``, each in every group, in batches of 500."""
    for at in range(first, first + n, 500):
        fps = (np.arange(at, at + 500, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        group = np.repeat(np.arange(4), 500)
        ids = [f"page-{i}" for i in range(at, at + 500)] * 4
        shard.probe_and_insert(
            group, np.tile(fps, 4), np.zeros(2000, np.int64), np.tile(fps ^ np.uint64(1), 4), ids, ids
        )


def _found(shard: Shard, first: int, n: int) -> int:
    """How many of pages first.. (asked under other ids) the shard has stored."""
    fps = (np.arange(first, first + n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    ids = [f"probe-{i}" for i in range(n)]
    ans = shard.probe_and_insert(
        np.zeros(n, np.int64), fps, np.zeros(n, np.int64), fps ^ np.uint64(2), ids, ids, store=False
    )
    return int((ans.distance == 0).sum())


def test_a_background_snapshot_returns_at_once_and_holds_the_shard_as_it_was_then(tmp_path, monkeypatch):
    async def no_changelog(topic: str, partitions: list[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, 0)

    monkeypatch.setattr(ShardStore, "end_offsets", no_changelog)
    released, writing = threading.Event(), threading.Event()
    write = store_module.write_arrays

    def held_write(path, arrays, meta) -> None:  # the write waits for the test to let it go on
        writing.set()
        assert released.wait(30), "the snapshot write was never released"
        write(path, arrays, meta)

    monkeypatch.setattr(store_module, "write_arrays", held_write)
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    try:
        asyncio.run(assign(w, monkeypatch, {0}))
        store = w.store
        shard = store.shard(0)
        _store(shard, 0, 3000)
        store.covered(0, 4)
        taken = len(shard)
        # returns while its write waits (written on this thread, the held write would never end)
        assert store.snapshot(0, background=True)
        assert writing.wait(30)
        _store(shard, 3000, 3000)  # the shard goes on meanwhile (its runs are merged anew)
        store.covered(0, 9)
        released.set()
        store.finish_snapshots()
        assert _found(shard, 3000, 3000) == 3000
        store.reset_state()  # (closes the shard: the loaded one takes over its row files)
        loaded, meta = Shard.load(store._snapshot_path(0), store.plan, store._strings_prefix(0))
        try:
            assert meta["offset"] == 4 and len(loaded) == taken == 4 * 3000
            assert _found(loaded, 0, 3000) == 3000 and _found(loaded, 3000, 3000) == 0
        finally:
            loaded.close()
    finally:
        released.set()
        w.close()


def test_a_snapshot_written_here_waits_for_the_partitions_write_under_way(tmp_path, monkeypatch):
    async def no_changelog(topic: str, partitions: list[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, 0)

    monkeypatch.setattr(ShardStore, "end_offsets", no_changelog)
    order: list[int] = []
    released = threading.Event()
    write = store_module.write_arrays

    def logged_write(path, arrays, meta) -> None:
        if not order:  # the first (background) write waits
            assert released.wait(30), "the snapshot write was never released"
        order.append(meta["offset"])
        write(path, arrays, meta)

    monkeypatch.setattr(store_module, "write_arrays", logged_write)
    monkeypatch.setattr(Shard, "save", lambda self, path, meta=None: logged_write(path, self.snapshot_arrays(), meta))
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    try:
        asyncio.run(assign(w, monkeypatch, {0}))
        store = w.store
        _store(store.shard(0), 0, 500)
        store.covered(0, 1)
        assert store.snapshot(0, background=True)
        store.covered(0, 2)
        threading.Timer(0.2, released.set).start()  # (no timing asserted: only the order of the writes)
        assert store.snapshot(0)  # here: after the background one, never before it
        assert order == [1, 2]
        store.reset_state()
        loaded, meta = Shard.load(store._snapshot_path(0), store.plan, store._strings_prefix(0))
        loaded.close()
        assert meta["offset"] == 2
    finally:
        released.set()
        w.close()
