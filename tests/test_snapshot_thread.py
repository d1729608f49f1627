"""A periodic snapshot is written in a thread (``ShardStore.snapshot(background=True)``): the
event loop goes on storing pages while it is written, and the file holds the shard as it was
when the snapshot was taken (bench/README.md, "p99 while the index grows past 10 M pages").
The store has one writer thread: a worker's shards write one at a time, in order, and their
periodic snapshots come due at staggered times."""

from __future__ import annotations

import asyncio
import threading
import time

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


def _until(condition, what: str, seconds: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


async def _no_changelog(topic: str, partitions: list[int]) -> dict[int, int]:
    return dict.fromkeys(partitions, 0)


def _loaded_meta(store: ShardStore, partition: int) -> tuple[int, dict]:
    """The entries and meta of the partition's snapshot file."""
    loaded, meta = Shard.load(store._snapshot_path(partition), store.plan, store._strings_prefix(partition))
    try:
        return len(loaded), meta
    finally:
        loaded.close()


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
        _until(lambda: store._writing[0][0].running(), "the background write never started")
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


class _HeldWrites:
    """write_arrays that records each write (partition, changelog offset) when it starts, counts the
    writes under way at once, and holds the first one until ``release`` is set."""

    def __init__(self, store: ShardStore, write) -> None:
        self.store, self.write = store, write
        self.started: list[tuple[int, int]] = []
        self.release, self.lock = threading.Event(), threading.Lock()
        self.now = self.most = 0

    def __call__(self, path, arrays, meta) -> None:
        partition = next(p for p in (0, 1, 2, 3) if self.store._snapshot_path(p) == path)
        with self.lock:
            self.started.append((partition, meta["offset"]))
            first = len(self.started) == 1
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            if first:
                assert self.release.wait(30), "the first snapshot write was never released"
            self.write(path, arrays, meta)
        finally:
            with self.lock:
                self.now -= 1


def _held_worker(tmp_path, monkeypatch) -> tuple[Worker, _HeldWrites]:
    """A worker of 2 partitions whose snapshot writes go through a :class:`_HeldWrites`."""
    monkeypatch.setattr(ShardStore, "end_offsets", _no_changelog)
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    held = _HeldWrites(w.store, store_module.write_arrays)
    monkeypatch.setattr(store_module, "write_arrays", held)
    return w, held


def _two_shards(w: Worker, monkeypatch, pages: tuple[int, int], offsets: tuple[int, int]) -> ShardStore:
    """Partitions 0 and 1 assigned to ``w``, ``pages[s]`` pages stored in shard s (partition 1's
    numbered after partition 0's) and its changelog covered to ``offsets[s]``."""
    asyncio.run(assign(w, monkeypatch, {0, 1}))
    store = w.store
    _store(store.shard(0), 0, pages[0])
    _store(store.shard(1), pages[0], pages[1])
    store.covered(0, offsets[0])
    store.covered(1, offsets[1])
    return store


def _never(condition, what: str, seconds: float) -> None:
    """Fail with ``what`` as soon as ``condition`` holds within ``seconds`` (a chance for a
    violation to show: no timing is asserted)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not condition(), what
        time.sleep(0.01)


def test_the_background_snapshots_of_two_partitions_are_written_one_at_a_time(tmp_path, monkeypatch):
    w, held = _held_worker(tmp_path, monkeypatch)
    try:
        store = _two_shards(w, monkeypatch, (1000, 500), (4, 6))
        assert store.snapshot(0, background=True) and store.snapshot(1, background=True)
        _until(lambda: held.started, "the first write never started")
        # Room for a second writer to start while the first is held (it would within
        # milliseconds); the one writer thread cannot.
        _never(lambda: len(held.started) > 1, "the second write started while the first was under way", 1.0)
        assert held.started == [(0, 4)]
        held.release.set()
        store.finish_snapshots()
        assert held.started == [(0, 4), (1, 6)] and held.most == 1
        store.reset_state()
        assert _loaded_meta(store, 0)[0] == 4 * 1000 and _loaded_meta(store, 0)[1]["offset"] == 4
        assert _loaded_meta(store, 1)[0] == 4 * 500 and _loaded_meta(store, 1)[1]["offset"] == 6
    finally:
        held.release.set()
        w.close()


def test_the_first_periodic_snapshots_of_a_workers_shards_come_due_at_staggered_times(tmp_path, monkeypatch):
    monkeypatch.setattr(ShardStore, "end_offsets", _no_changelog)
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=4), registry=CollectorRegistry())
    try:
        asyncio.run(assign(w, monkeypatch, {0, 1, 2, 3}))
        store, interval = w.store, 300.0
        clock = [1000.0]
        with monkeypatch.context() as m:  # (the store's clock only: no event loop runs meanwhile)
            m.setattr(store_module.time, "monotonic", lambda: clock[0])
            for p in range(4):
                store.shard(p)  # all four come at the same moment, as at an assignment

            def first_due() -> dict[int, float]:
                due: dict[int, float] = {}
                start = clock[0]
                for step in range(int(interval) + 1):
                    clock[0] = start + step
                    due.update({p: step for p in range(4) if p not in due and store.snapshot_due(p, interval)})
                clock[0] = start
                return due

            due = first_due()
            # the k-th of the 4 early by k/4 of the interval, so a write every interval/4
            assert sorted(due.values()) == [75, 150, 225, 300]
            assert due[0] == 300 and len(set(due.values())) == 4
            # after its first snapshot a shard is due a whole interval later: the spacing stays
            clock[0] += due[3]
            store.snapshot(3)  # (nothing to save: no offset covered; the clock starts again)
            clock[0] += interval - 1
            assert not store.snapshot_due(3, interval)
            clock[0] += 1
            assert store.snapshot_due(3, interval)
    finally:
        w.close()


def test_a_revocation_snapshot_supersedes_its_partitions_queued_write_and_does_not_wait_behind_the_queue(
    tmp_path, monkeypatch
):
    w, held = _held_worker(tmp_path, monkeypatch)
    monkeypatch.setattr(Shard, "save", lambda self, path, meta=None: held(path, self.snapshot_arrays(), meta))
    try:
        store = _two_shards(w, monkeypatch, (500, 500), (4, 5))
        assert store.snapshot(0, background=True)  # under way, held
        _until(lambda: held.started, "the first write never started")
        assert store.snapshot(1, background=True)  # queued behind it
        _store(store.shard(1), 1000, 500)
        store.covered(1, 7)
        # Partition 1 is revoked: its snapshot is written in place, on a thread of its own here
        # so that a deadlock fails the test instead of hanging it.
        revoked = threading.Thread(target=lambda: asyncio.run(assign(w, monkeypatch, {0})), daemon=True)
        revoked.start()
        revoked.join(30)
        assert not revoked.is_alive(), "the revocation waited behind the queue"
        assert 1 not in store.shards and held.started == [(0, 4), (1, 7)]
        held.release.set()
        store.finish_snapshots()
        # the queued write (offset 5) never ran, so it never overwrote the newer file
        assert held.started == [(0, 4), (1, 7)]
        entries, meta = _loaded_meta(store, 1)
        assert entries == 4 * 1000 and meta["offset"] == 7
        assert _loaded_meta(store, 0)[1]["offset"] == 4
    finally:
        held.release.set()
        w.close()
