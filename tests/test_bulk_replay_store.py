"""The store's bulk changelog replay (``ShardStore._bulk_replay``, docs/faust-notes.md §14),
driven through a Worker's store with the Kafka reader played by a list of records.

The integration test (tests/integration/test_bulk_replay.py) runs it on the real broker; these
pin the bookkeeping: where faust's recovery starts afterwards, what a failure part-way leaves,
and that a changelog of another scheme stops the worker as faust's path does.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from faust.types import TP
from prometheus_client import CollectorRegistry
from store_rebalance import assign

from streamdedup.index import file_array
from streamdedup.pipeline.wire import CHANGELOG, Batch, decode, encode
from streamdedup.settings import Settings
from streamdedup.stream.app import Worker
from streamdedup.stream.store import BulkReplay, ShardStore

PARTITIONS = 2


def _value(partition: int, n: int, rows: int = 5) -> bytes:
    ids = [f"p{partition}-r{n}-{i}" for i in range(rows)]
    return encode(
        Batch.build(
            group=[i % 4 for i in range(rows)],
            fps=np.arange(rows) + 1000 * n,
            fetched=[0] * rows,
            id_hash=list(range(rows)),
            ids=ids,
            urls=ids,
        ),
        CHANGELOG,
    )


class Changelog:
    """Records per partition at the offsets given (gaps are transaction markers), and a bulk
    reader over them that yields ``per_run`` records at a time."""

    def __init__(self, per_run: int = 3) -> None:
        self.records: dict[int, list[SimpleNamespace]] = {}
        self.ends: dict[int, int] = {}
        self.per_run, self.reads = per_run, []
        self.fail_after: int | None = None  # runs yielded before the reader raises

    def write(self, partition: int, offsets: list[int], end: int, value: Any = _value) -> None:
        self.records[partition] = [
            SimpleNamespace(offset=o, key=f"k{o}".encode(), value=value(partition, o)) for o in offsets
        ]
        self.ends[partition] = end

    async def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: self.ends.get(p, 0) for p in partitions}

    async def read(self, topic: str, ranges: dict[int, tuple[int, int]]) -> AsyncGenerator[tuple[int, list], None]:
        self.reads.append(dict(ranges))
        yielded = 0
        for p, (start, end) in sorted(ranges.items()):
            todo = [r for r in self.records.get(p, []) if start <= r.offset < end]
            for i in range(0, len(todo), self.per_run):
                if self.fail_after is not None and yielded >= self.fail_after:
                    raise ConnectionError("the broker went away")
                yield p, todo[i : i + self.per_run]
                yielded += 1
            yield p, []


@pytest.fixture
def changelog() -> Changelog:
    return Changelog()


@pytest.fixture
def worker(tmp_path, changelog, monkeypatch):
    w = Worker(
        Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=PARTITIONS), registry=CollectorRegistry()
    )
    monkeypatch.setattr(ShardStore, "end_offsets", changelog.end_offsets)
    monkeypatch.setattr(ShardStore, "bulk", BulkReplay(changelog.read, min_records=0, timeout=5.0))
    yield w
    w.close()


def _faust_recovery(store: ShardStore, changelog: Changelog) -> None:
    """What faust's recovery replays after the bulk path: each partition's records after
    persisted_offset, through apply_changelog_batch."""
    topic = store._changelog()
    for p in range(PARTITIONS):
        start = store.persisted_offset(TP(topic, p))
        rest = [r for r in changelog.records.get(p, []) if r.offset > (-1 if start is None else start)]
        events = [SimpleNamespace(message=SimpleNamespace(partition=p, **vars(r))) for r in rest]
        store.apply_changelog_batch(events, None, None)


def test_a_tail_read_to_its_end_leaves_faust_nothing_even_with_markers_after_the_last_record(
    worker, changelog, monkeypatch
):
    changelog.write(0, [0, 1, 2, 4, 5, 6, 8], end=10)  # markers at 3, 7 and 9: the last record is 8
    changelog.write(1, [0, 1, 2], end=4)
    restored: list[tuple[int, int]] = []
    monkeypatch.setattr(ShardStore, "on_restored", staticmethod(lambda p, n: restored.append((p, n))))
    asyncio.run(assign(worker, monkeypatch, {0, 1}))
    store, topic = worker.store, worker.store._changelog()
    assert changelog.reads == [{0: (0, 10), 1: (0, 4)}]
    assert {p: store.persisted_offset(TP(topic, p)) for p in (0, 1)} == {0: 9, 1: 3}  # the ends - 1
    assert {p: len(store.shards[p]) for p in (0, 1)} == {0: 7 * 5, 1: 3 * 5}
    assert sum(n for p, n in restored if p == 0) == 7 and sum(n for p, n in restored if p == 1) == 3
    _faust_recovery(store, changelog)
    assert {p: len(store.shards[p]) for p in (0, 1)} == {0: 35, 1: 15}  # nothing twice


def test_a_bulk_read_that_fails_part_way_leaves_the_rest_to_faust_from_the_offset_it_reached(
    worker, changelog, monkeypatch
):
    changelog.write(0, list(range(10)), end=10)
    changelog.write(1, list(range(4)), end=4)
    changelog.fail_after = 2  # two runs of 3 records of partition 0, then the reader raises
    asyncio.run(assign(worker, monkeypatch, {0, 1}))
    store, topic = worker.store, worker.store._changelog()
    # (the first run stored; the second was in hand, one run behind, and is dropped)
    assert store.persisted_offset(TP(topic, 0)) == 2 and len(store.shards[0]) == 3 * 5
    assert store.persisted_offset(TP(topic, 1)) is None and 1 not in store.shards
    _faust_recovery(store, changelog)
    assert {p: len(store.shards[p]) for p in (0, 1)} == {0: 50, 1: 20}


def test_a_short_tail_is_left_to_faust(worker, changelog, monkeypatch):
    monkeypatch.setattr(ShardStore, "bulk", BulkReplay(changelog.read, min_records=5, timeout=5.0))
    changelog.write(0, list(range(4)), end=4)
    changelog.write(1, list(range(8)), end=8)
    asyncio.run(assign(worker, monkeypatch, {0, 1}))
    assert changelog.reads == [{1: (0, 8)}]
    assert 0 not in worker.store.shards


def test_a_changelog_of_another_scheme_stops_the_worker_in_the_bulk_path_too(worker, changelog, monkeypatch):
    crashes: list[BaseException] = []

    async def crash(e: BaseException) -> None:
        crashes.append(e)

    monkeypatch.setattr(worker.app, "crash", crash)
    old = _value(0, 0)
    changelog.write(0, [0, 1], end=2, value=lambda p, o: b"SDB1" + old[4:5] + old[6:])  # scheme 1's layout

    async def scenario() -> None:
        await assign(worker, monkeypatch, {0})
        await asyncio.sleep(0)  # the crash is scheduled

    asyncio.run(scenario())
    assert len(crashes) == 1 and "holds fingerprints of scheme 1" in str(crashes[0])
    assert worker.store.offsets.get(0) is None  # nothing claimed


def test_the_bulk_read_stops_when_the_group_asks_the_member_to_rejoin(worker, changelog, monkeypatch):
    rejoin = asyncio.Event()

    @asynccontextmanager
    async def keepalive(app: Any) -> AsyncIterator[asyncio.Event]:
        yield rejoin

    async def another_member_joins() -> None:  # (the heartbeats' answer, after the first run)
        rejoin.set()

    bulk = BulkReplay(changelog.read, min_records=0, keepalive=keepalive, check=another_member_joins)
    monkeypatch.setattr(ShardStore, "bulk", bulk)
    changelog.write(0, list(range(10)), end=10)
    asyncio.run(assign(worker, monkeypatch, {0}))
    store, topic = worker.store, worker.store._changelog()
    assert store.persisted_offset(TP(topic, 0)) == 2 and len(store.shards[0]) == 3 * 5  # one run of 3
    _faust_recovery(store, changelog)
    assert len(store.shards[0]) == 50


def test_a_string_write_that_fails_in_its_thread_stops_the_bulk_read_before_the_run_counts(
    worker, changelog, monkeypatch
):
    """A run's strings are written ahead in a thread while the run before it is stored: the
    second run's write fails (a full disk), so the shard holds the first run only, its offset
    says so, and faust's recovery restores the rest from there, each string once."""
    changelog.write(0, list(range(9)), end=9)
    restored: list[tuple[int, int]] = []
    monkeypatch.setattr(ShardStore, "on_restored", staticmethod(lambda p, n: restored.append((p, n))))
    real, threaded = file_array._write_ahead, []

    def full_in_the_thread(fd: int, blob: Any, at: int) -> None:
        assert threading.current_thread().name == "writes-ahead"
        threaded.append(at)
        if len(threaded) == 4 * 4 + 2:  # (4 files a group, 4 groups a run) the second run's, part-way
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, blob, at)

    monkeypatch.setattr(file_array, "_write_ahead", full_in_the_thread)
    asyncio.run(assign(worker, monkeypatch, {0}))
    store, topic = worker.store, worker.store._changelog()
    assert len(threaded) >= 4 * 4 + 2
    assert store.persisted_offset(TP(topic, 0)) == 2 and len(store.shards[0]) == 3 * 5
    assert restored == [(0, 3)]
    _faust_recovery(store, changelog)
    shard = store.shards[0]
    assert len(shard) == 9 * 5
    want = decode([r.value for r in changelog.records[0]], CHANGELOG).by_group()
    for g, rows in want:
        texts = shard._groups[g].texts
        assert len(texts) == 2 * len(rows) and texts.data() == bytes(rows.strings)
        assert [texts[2 * i] or texts[2 * i + 1] for i in range(len(rows))] == rows.ids()


@pytest.mark.parametrize("path", ["bulk", "faust"])
def test_a_changelog_record_that_is_not_a_shard_batch_is_skipped_and_the_others_are_restored(
    worker, changelog, monkeypatch, path
):
    """(It failed its whole run at every attempt: faust keeps a failed buffer and applies it
    again, so recovery never ended and the worker neither served nor stopped.)"""
    if path == "faust":
        monkeypatch.setattr(ShardStore, "bulk", None)
    changelog.write(0, [0, 1, 2], end=3, value=lambda p, o: b"\x00garbage" if o == 1 else _value(p, o))
    asyncio.run(assign(worker, monkeypatch, {0}))
    store = worker.store
    _faust_recovery(store, changelog)
    assert len(store.shards[0]) == 2 * 5
    assert store.persisted_offset(TP(store._changelog(), 0)) == 2


def test_a_restore_that_fails_after_some_groups_stored_the_rows_drops_the_shard_and_stops(
    worker, changelog, monkeypatch
):
    """A full disk in the third group of a changelog batch: the first two hold its rows.  faust
    applies a failed buffer again, so they would hold them twice (and a snapshot would keep
    that).  The shard is dropped instead, nothing more is restored into it, no snapshot is
    written, and the worker stops: a restart rebuilds it."""
    from streamdedup.index import strings

    monkeypatch.setattr(ShardStore, "bulk", None)
    crashes: list[BaseException] = []

    async def crash(e: BaseException) -> None:
        crashes.append(e)

    monkeypatch.setattr(worker.app, "crash", crash)
    changelog.write(0, [0, 1, 2], end=3)
    real, calls = strings.pwrite_all, []

    def pwrite_all(fd: int, blob: Any, at: int) -> None:
        calls.append(at)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, blob, at)

    monkeypatch.setattr(strings, "pwrite_all", pwrite_all)
    events = [SimpleNamespace(message=SimpleNamespace(partition=0, **vars(r))) for r in changelog.records[0]]

    async def scenario() -> None:
        await assign(worker, monkeypatch, {0})
        with pytest.raises(OSError, match="No space"):
            worker.store.apply_changelog_batch(events, None, None)
        with pytest.raises(RuntimeError, match="dropped"):  # faust's second attempt
            worker.store.apply_changelog_batch(events, None, None)
        await asyncio.sleep(0)  # the crash is scheduled

    asyncio.run(scenario())
    assert len(crashes) == 1 and "failed midway" in str(crashes[0])
    assert 0 not in worker.store.shards and not worker.store.snapshot(0)
    assert not list(worker.settings.data_dir.glob("*.shard"))
