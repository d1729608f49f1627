"""The faust store that *is* the sharded index: one :class:`~streamdedup.pipeline.shard.Shard` per
changelog partition this worker owns, rebuilt from the changelog before the worker answers.

faust's recovery replays the changelog through :meth:`ShardStore.apply_changelog_batch`
(whole batches, decoded with numpy) starting after :meth:`persisted_offset`: the offset the
in-memory shard already covers, or the one a local snapshot (``data_dir``) covers, so a
restart replays only the changelog's tail.  Snapshots are written by the shard stage between
batches, when the shard and its offset agree, and when the worker stops.

A long tail is not left to faust's per-record path: :meth:`ShardStore.on_rebalance` reads it
first with a consumer of the worker's own and restores whole fetched runs through the two halves
of the same :meth:`ShardStore._restore` (:class:`BulkReplay`, docs/faust-notes.md §14), one run
behind: a run's strings and columns are written by a thread while the run before it is stored;
faust's recovery then starts after what it reached.

A snapshot is used only if it matches the cluster: the same changelog topic and shard plan,
the same fingerprint scheme, and an offset the changelog has reached.  One that does not (the
topics were recreated empty, the snapshot was written by another scheme) is discarded with a
warning and the shard is rebuilt from the changelog.  A changelog record of another fingerprint
scheme stops the worker with a message that says what to do: two schemes never share an index.

With ``--retention`` the store tells each shard which changelog record (key) holds which rows
(:meth:`Shard.track`), and a replayed tombstone (a key with no value) makes it forget the record;
the shard stage writes the tombstones of records whose rows have all expired.  A compaction of
a shard rewrites its string files, so the store takes a snapshot right after one.

A shard's offset is a promise: the shard holds every changelog record up to it.  The store keeps
it by creating and writing shards only where it may (docs/faust-notes.md §12): recovery fills the
shards of the changelog partitions assigned here (active or standby), and the shard stage stores
probes only into the shards :meth:`ShardStore.serves` (active here, no rebalance begun since).  A
shard batch faust hands over late, after its partition moved, is left alone: its pages never got
their answers, so they are read again from the pages topic and their probes go to the new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust.stores
import numpy as np
from faust.stores import base
from faust.types import TP

from streamdedup.errors import PlanError, SchemeError
from streamdedup.fingerprinting import SCHEME as FINGERPRINT_SCHEME
from streamdedup.pipeline.shard import Plan, Shard
from streamdedup.pipeline.snapshot_file import write_arrays
from streamdedup.pipeline.wire import CHANGELOG, Batch, decode, row_counts

__all__ = ["BulkReplay", "ShardStore", "NotAssigned", "SCHEME", "snapshot_meta", "stale_snapshot", "load_snapshot"]

SCHEME = "sdshard"  # the faust store URL scheme (not the fingerprint scheme)
END_OFFSETS_TIMEOUT = 5.0  # seconds a rebalance waits for the changelog's end offsets
#: Seconds a shard that leaves (a rebalance, the worker's stop) waits for its changelog writes
#: under way before its snapshot (still under way then: no snapshot, the one before stands).
WRITES_TIMEOUT = 5.0
#: The niceness of the snapshot writer's thread (its increase over the process's): on a busy
#: machine the write (checksums, copies into the page cache) waits, not the event loop.
WRITER_NICENESS = 10
log = logging.getLogger(__name__)


def _lower_priority() -> None:
    """Run the calling thread below the process's priority (on Linux a thread is a task of its own;
    raising one's niceness needs no rights); elsewhere at the same priority."""
    try:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + WRITER_NICENESS))
    except (AttributeError, OSError):
        pass


#: The interpreter's thread switch interval during a bulk replay (seconds; Python's default is
#: 0.005).  Its reader thread (copying and parsing fetches) holds the GIL most of the time, and
#: a thread that released it (a ``pwrite``, a numba kernel) waits up to a switch interval to take
#: it back (py-spy before this: the event loop's writes, ~37 % of its time, mostly on the
#: ``pwrite`` line).  Not measured apart from the other changes of docs/faust-notes.md §14.
BULK_SWITCH_INTERVAL = 0.0005


@contextlib.contextmanager
def _switch_interval(seconds: float) -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def snapshot_meta(offset: int, changelog: str) -> dict:
    """What a snapshot records about the state it holds."""
    return {"offset": offset, "scheme": FINGERPRINT_SCHEME, "changelog": changelog}


def stale_snapshot(meta: dict, changelog: str, end_offset: int | None) -> str | None:
    """Why a snapshot with ``meta`` cannot stand for ``changelog`` (None: it can).

    ``end_offset``: the changelog partition's end (the offset of its next record; None if
    unknown).  A snapshot covers changelog records up to ``meta["offset"]``, so that offset must
    be below the end: otherwise the topic was recreated or truncated since, and the snapshot
    holds pages the cluster does not.  Snapshots written before schemes were recorded are
    scheme 1.
    """
    scheme = meta.get("scheme", 1)
    if scheme != FINGERPRINT_SCHEME:
        return f"it holds fingerprints of scheme {scheme}, and this worker computes scheme {FINGERPRINT_SCHEME}"
    if meta.get("changelog", changelog) != changelog:
        return f"it was taken from the changelog {meta['changelog']!r}, not {changelog!r}"
    offset = int(meta["offset"])
    if end_offset is not None and offset >= end_offset:
        return (
            f"it covers the changelog up to offset {offset}, but the changelog ends before offset "
            f"{end_offset}: the topic was recreated or truncated since the snapshot was taken"
        )
    return None


def load_snapshot(
    path: Path, plan: Plan, changelog: str, end_offset: int | None, strings: str | None = None, retention: int = 0
) -> tuple[Shard, int] | None:
    """The shard in the snapshot at ``path`` and the changelog offset it covers, or None (with a
    warning) when the snapshot or a string file it needs is damaged or does not match the
    cluster: the caller then rebuilds the shard from the changelog.  A discarded snapshot is
    renamed ``*.shard.discarded``.  ``strings``: the shard's string file prefix (see Shard);
    ``retention``: the shard's, in ms (the loaded shard is expired to it)."""
    shard = None
    try:
        shard, meta = Shard.load(path, plan, strings, retention)
        problem = stale_snapshot(meta, changelog, end_offset)
        offset = int(meta["offset"])
    except (ValueError, KeyError, TypeError) as e:
        problem = str(e)
    if problem is not None and shard is not None:
        shard.close()
    if problem is not None:
        # Set aside, not left in place: once the new changelog grows past its offset, a stale
        # snapshot would pass the offset check (a crash before the next snapshot would do it).
        target = path.with_name(path.name + ".discarded")
        try:
            os.replace(path, target)
            aside = str(target)
        except OSError as e:
            aside = f"not moved: {e}"
        log.warning(
            "discarding the snapshot %s (%s); rebuilding the shard from the changelog (the file is now %s)",
            path,
            problem,
            aside,
        )
        return None
    assert shard is not None  # (loaded, since there is no problem)
    return shard, offset


@dataclass(frozen=True)
class BulkReplay:
    """How the store replays a long changelog tail itself, before faust's recovery starts
    (docs/faust-notes.md §14): ``read(topic, {partition: (start, end)})`` yields
    ``(partition, records)`` runs in offset order, and ``(partition, [])`` once a partition has
    been read to its end (:func:`~streamdedup.stream.connection.read_ranges`)."""

    read: Callable[[str, dict[int, tuple[int, int]]], AsyncGenerator[tuple[int, list[Any]], None]]
    min_records: int = 1000  # a shorter tail (in offsets) is left to faust's recovery
    timeout: float = 120.0  # seconds for the bulk read of one assignment; the rest is faust's
    #: (faust's app) -> the member's heartbeats while the read runs; the event is set when the group
    #: asks it to rejoin, None if there is no member (:func:`~streamdedup.stream.connection.member_heartbeats`)
    keepalive: Callable[[Any], AbstractAsyncContextManager[asyncio.Event | None]] | None = None
    unkept_timeout: float = 5.0  # the bound without heartbeats: below the session timeout
    check: Callable[[], Awaitable[None]] | None = None  # test hook, awaited after each restored run


class NotAssigned(LookupError):
    """A shard was asked for a partition this worker holds neither active nor standby."""


@dataclass
class _Run:
    """Changelog records of one partition, decoded and regrouped (:meth:`ShardStore._prepare`)."""

    partition: int
    messages: Sequence[Any]
    records: list[Any]  # those with a value
    rows: Batch
    groups: list[tuple[int, Batch]]
    filled: Future[None] | None  # (their strings: filled in the writer thread, Shard.write_ahead)


class ShardStore(base.Store):
    """Configure with :meth:`configure` before the worker starts (faust builds the store)."""

    plan: Plan
    data_dir: Path | None = None
    on_restored: Callable[[int, int], None] | None = None  # (partition, records) for metrics
    on_recovered: Callable[[], None] | None = None
    #: (topic, partitions) -> their end offsets, read outside faust's consumer thread (the worker's
    #: own client, :func:`~streamdedup.stream.connection.end_offsets`); None: faust's highwaters.
    end_offsets: Callable[[str, list[int]], Awaitable[dict[int, int]]] | None = None
    retention: int = 0  # ms; 0 keeps every page (Shard)
    bulk: BulkReplay | None = None  # None: every record comes through faust's recovery

    def __post_init__(self) -> None:
        self.shards: dict[int, Shard] = {}
        self.offsets: dict[int, int] = {}  # partition -> last changelog offset the shard covers
        self.snapshot_at: dict[int, float] = {}
        # The periodic snapshots are written by one thread, in the order taken (so a partition's
        # land in order): the worker's shards write one at a time, not all at once beside the
        # event loop on a few cores (bench/README.md, "p99 while the index grows").
        self._writer: ThreadPoolExecutor | None = None  # made at the first background snapshot
        self._writing: dict[int, list[Future]] = {}  # partition -> its writes queued or under way
        self._first: set[int] = set()  # partitions not snapshotted since they came here (staggered)
        self.ends: dict[int, int] = {}  # partition -> changelog end offset when it was assigned
        self.assigned: set[int] = set()  # changelog partitions of the current assignment (active or standby)
        self.active: set[int] = set()  # those this worker owns: their probes come here
        self._rebalance: int | None = None  # faust's rebalance count when the assignment came
        self._recovered: tuple[int | None] | None = None  # (_rebalance,) once its recovery completed
        self._crashing: asyncio.Future | None = None
        self._broken: set[int] = set()  # shards whose restore failed midway (_stop_partial)
        # The changelog writes of rows the shards here stored (:meth:`sending`).  A snapshot file
        # never holds a row whose write was not acknowledged: else a retry of its page, finding
        # it stored, wrote nothing, and the changelog lacked the page for good.
        # partition -> rows its shard in memory stored whose write failed or was never sent (a
        # step failed midway), sent again before its next rows; no snapshot while any is owed
        self.owed: dict[int, list[Batch]] = {}
        self._in_flight: dict[int, set[asyncio.Future]] = {}  # partition -> its writes under way
        # partition -> a periodic snapshot taken while writes were under way, written once they
        # all land (dropped if one fails): (the write's arguments, the writes it waits for)
        self._held: dict[int, tuple[tuple, set[asyncio.Future]]] = {}

    @classmethod
    def configure(
        cls,
        plan: Plan,
        data_dir: Path | None,
        on_restored: Callable[[int, int], None] | None = None,
        on_recovered: Callable[[], None] | None = None,
        end_offsets: Callable[[str, list[int]], Awaitable[dict[int, int]]] | None = None,
        retention: int = 0,
        bulk: BulkReplay | None = None,
    ) -> None:
        cls.plan, cls.data_dir, cls.on_restored, cls.on_recovered = plan, data_dir, on_restored, on_recovered
        cls.end_offsets, cls.retention, cls.bulk = end_offsets, retention, bulk

    # -------------------------------------------------------------- the index
    def serves(self, partition: int) -> bool:
        """Whether the shard stage may store and answer probes of ``partition`` here: it is active
        in this worker's assignment, and no rebalance has begun since that assignment (faust
        counts one at each revocation, before any callback).  A probes batch taken before a
        rebalance and handed over after it is not served (docs/faust-notes.md §12)."""
        return partition in self.active and self._rebalance == getattr(self.app, "rebalancing_count", None)

    def ready(self, partition: int) -> bool:
        """:meth:`serves`, and the recovery of this assignment is over: the shard holds its whole
        changelog, so the worker may store its own pages' probes there without the probes topic."""
        return self.serves(partition) and self._recovered == (self._rebalance,)

    def shard(self, partition: int) -> Shard:
        """The shard of ``partition``, created empty if it has none yet: only for a partition of
        the current assignment, where recovery fills it from the changelog or it is served."""
        s = self.shards.get(partition)
        if s is None:
            if partition not in self.assigned:
                raise NotAssigned(f"shard partition {partition} is not assigned to this worker")
            s = self.shards[partition] = Shard(self.plan, self._strings_prefix(partition), self.retention)
            self.snapshot_at[partition] = time.monotonic()
            self._first.add(partition)
        return s

    def covered(self, partition: int, offset: int) -> None:
        """The shard now holds everything up to changelog ``offset`` (after its own write was acked).

        Only for a partition still served: a write acked after a rebalance began is not recorded
        (its partition may have moved, and other owners' records may lie below it).  Recording
        less than the shard holds costs a replay of records it has (stored twice, harmless);
        recording more would skip records it lacks."""
        if self.serves(partition) and partition in self.shards:
            self.offsets[partition] = max(offset, self.offsets.get(partition, -1))

    # -------------------------------------------------------------- rows owed to the changelog
    def sending(
        self, partition: int, sent: Any, rows: Batch | None = None, tombstone: bytes | None = None
    ) -> asyncio.Future:
        """A changelog write of ``rows`` that the shard of ``partition`` stored, or of the
        ``tombstone`` of a record whose rows expired (``sent``: the producer's future, or a
        coroutine).  Returns it as a future; its outcome is recorded here when it lands: the
        offset covered (if the shard and the assignment are still the ones it was sent in: a
        write that lands later covers nothing, since other owners' records may lie below it), or,
        if it failed, the rows owed or the tombstone queued again (while that shard is the one
        here)."""
        future = asyncio.ensure_future(sent)
        # what the caller awaits: done once the outcome is recorded here (awaiting ``future``
        # itself, a step could go on, and its retry look, before this store heard of it)
        recorded = asyncio.get_running_loop().create_future()
        recorded.add_done_callback(lambda f: f.cancelled() or f.exception())  # (no "never retrieved")
        sender = (self.shards.get(partition), self._rebalance)
        self._in_flight.setdefault(partition, set()).add(recorded)
        if future.done():  # (refused at once: owed now, before the step's retry can look)
            self._landed(partition, sender, (rows, tombstone), future, recorded)
        else:
            future.add_done_callback(lambda f: self._landed(partition, sender, (rows, tombstone), f, recorded))
        return recorded

    def settled(self, partition: int) -> bool:
        """Whether the shard of ``partition`` holds only rows its changelog acknowledged: none
        owed, no write under way (a standby that may answer for a silent owner)."""
        return not self.owed.get(partition) and not self._in_flight.get(partition)

    def under_way(self, partitions: set[int]) -> list[asyncio.Future]:
        """The changelog writes under way of those partitions' shards (a step answers only once
        they landed, so no answer names a row whose write may fail)."""
        return [f for p in sorted(partitions) for f in self._in_flight.get(p, ())]

    def owe(self, partition: int, rows: Batch) -> None:
        """Rows the shard of ``partition`` stored and no changelog write was sent for (the step
        failed before): sent with its next rows."""
        if partition in self.shards:
            self.owed.setdefault(partition, []).append(rows)

    def take_owed(self, partition: int) -> list[Batch]:
        """The rows owed by the shard of ``partition``, to send now (in the order stored)."""
        return self.owed.pop(partition, [])

    def owed_rows(self, partition: int | None = None) -> int:
        """Rows owed by the shard of ``partition``, or by every shard here."""
        owed = self.owed.values() if partition is None else [self.owed.get(partition, [])]
        return sum(len(rows) for batches in owed for rows in batches)

    def _landed(
        self,
        partition: int,
        sender: tuple[Shard | None, int | None],
        carried: tuple[Batch | None, bytes | None],
        future: asyncio.Future,
        recorded: asyncio.Future,
    ) -> None:
        flying = self._in_flight.get(partition, set())
        flying.discard(recorded)
        if not flying:
            self._in_flight.pop(partition, None)
        ok = not future.cancelled() and future.exception() is None
        (shard, rebalance), (rows, tombstone) = sender, carried
        same = shard is not None and self.shards.get(partition) is shard
        if ok:
            if same and rebalance == self._rebalance:
                self.covered(partition, future.result().offset)
        elif same and rows is not None:
            self.owed.setdefault(partition, []).append(rows)
        elif same and shard is not None and tombstone is not None:
            shard.tombstones[tombstone] = None  # (sent again with the shard's next step)
        if (held := self._held.get(partition)) is not None and recorded in held[1]:
            held[1].discard(recorded)
            if not ok:  # it holds rows the changelog lacks
                del self._held[partition]
                log.info("shard %d: snapshot dropped: a changelog write of rows it holds failed", partition)
            else:  # it holds the write's rows, so it covers the write's offset (a restart replays after it)
                meta = held[0][2]
                meta["offset"] = max(int(meta["offset"]), future.result().offset)
                if not held[1]:
                    del self._held[partition]
                    self._submit(partition, *held[0])
        self._settle(recorded, future)

    @staticmethod
    def _settle(recorded: asyncio.Future, future: asyncio.Future) -> None:
        """Complete ``recorded`` (what :meth:`sending` handed out) as the producer's ``future`` did."""
        if recorded.done():  # (cancelled by a step that awaited it and was cancelled itself)
            pass
        elif future.cancelled():
            recorded.cancel()
        elif (error := future.exception()) is not None:
            recorded.set_exception(error)
        else:
            recorded.set_result(future.result())

    async def _settle_writes(self, partitions: list[int]) -> None:
        """Before the snapshots of shards that leave: their changelog writes under way, landed (at
        most WRITES_TIMEOUT seconds in all; a shard with one still under way then is not
        snapshotted)."""
        if flying := {f for p in partitions for f in self._in_flight.get(p, ())}:
            await asyncio.wait(flying, timeout=WRITES_TIMEOUT)

    # -------------------------------------------------------------- snapshots
    def _snapshot_path(self, partition: int) -> Path | None:
        if self.data_dir is None:
            return None
        return self.data_dir / f"{self.table.changelog_topic.get_topic_name()}-{partition}.shard"

    def _strings_prefix(self, partition: int) -> str | None:
        """Where a shard keeps its ids and URLs (files next to its snapshot; None: in memory)."""
        if self.data_dir is None:
            return None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return str(self.data_dir / f"{self.table.changelog_topic.get_topic_name()}-{partition}")

    def snapshot(self, partition: int, background: bool = False) -> bool:
        """Save a shard with the changelog offset it covers (atomic; False if nothing to save).

        ``background``: take the shard's arrays now and queue their write for the store's one
        writer thread, so the event loop goes on (at 10 M pages a shard's snapshot held it for
        0.2-0.4 s).  Else written here, after the partition's write under way, if any.  Either way
        a write of the partition still queued is dropped: this snapshot holds all it would.  So a
        partition's snapshots land in order, and one written here never waits behind the queue
        (only behind its own partition's write under way)."""
        path, shard = self._snapshot_path(partition), self.shards.get(partition)
        self.snapshot_at[partition] = time.monotonic()
        if partition in self._broken:
            return False
        self._first.discard(partition)
        if path is None or shard is None or partition not in self.offsets:
            return False
        if owed := self.owed_rows(partition):
            log.warning(
                "shard %d: no snapshot while %d rows it stored are not in the changelog (a write failed; "
                "they go with its next rows)",
                partition,
                owed,
            )
            return False
        flying = self._in_flight.get(partition)
        if flying and not background:
            log.warning("shard %d: no snapshot while changelog writes of rows it stored are under way", partition)
            return False
        self._held.pop(partition, None)  # (superseded)
        self._drop_queued(partition)
        if not background:
            self.finish_snapshots(partition)
        path.parent.mkdir(parents=True, exist_ok=True)
        t0, entries, meta = time.perf_counter(), len(shard), snapshot_meta(self.offsets[partition], self._changelog())
        if background:
            arrays = shard.snapshot_arrays()
            shard.compacted = False
            if flying:  # written once they land (dropped if one fails)
                self._held[partition] = ((path, arrays, meta, entries, t0), set(flying))
            else:
                self._submit(partition, path, arrays, meta, entries, t0)
            return True
        shard.save(path, meta)
        shard.compacted = False
        self._saved(partition, entries, meta, t0, t0)
        return True

    def _submit(self, partition: int, path: Path, arrays: dict, meta: dict, entries: int, t0: float) -> None:
        """Queue a snapshot's write for the store's writer thread."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="snapshot", initializer=_lower_priority)
        write = self._writer.submit(self._write_snapshot, partition, path, arrays, meta, entries, t0)
        self._writing.setdefault(partition, []).append(write)

    def finish_snapshots(self, partition: int | None = None) -> None:
        """Wait for the background writes (of ``partition``, or of every partition), queued or under way."""
        for p in list(self._writing) if partition is None else [partition]:
            for write in self._writing.pop(p, []):
                if not write.cancelled():
                    write.result()  # (a failed write was logged by _write_snapshot: never raises)

    def _drop_queued(self, partition: int) -> None:
        """Cancel the partition's background writes not started yet (a newer snapshot supersedes them)."""
        writes = [w for w in self._writing.get(partition, []) if not w.done() and not w.cancel()]
        if writes:
            self._writing[partition] = writes  # (the one under way: at most one, the writer is one thread)
        else:
            self._writing.pop(partition, None)

    def _write_snapshot(self, partition: int, path: Path, arrays: dict, meta: dict, entries: int, t0: float) -> None:
        started = time.perf_counter()
        try:
            write_arrays(path, arrays, meta)
        except Exception:  # (a full disk) nothing is lost: the changelog holds it, the next snapshot retries
            log.exception("snapshot of shard %d failed; the last one and the changelog stand", partition)
            return
        self._saved(partition, entries, meta, t0, started)

    def _saved(self, partition: int, entries: int, meta: dict, t0: float, started: float) -> None:
        log.info(
            "snapshot of shard %d: %d entries to changelog offset %d in %.2fs (taken %.2fs before)",
            partition,
            entries,
            meta["offset"],
            time.perf_counter() - started,
            started - t0,
        )

    def snapshot_due(self, partition: int, interval: float) -> bool:
        """Whether the partition's periodic snapshot is due: ``interval`` seconds after its last.

        Staggered: the shards a worker gets at once would all come due together, so each one's
        first periodic snapshot after it came here is early by its share of the interval (the
        k-th of the worker's n active partitions, in partition order, by k/n of it); later ones
        keep that spacing."""
        wait = interval
        if partition in self._first and partition in self.active:
            mine = sorted(self.active)
            wait -= interval * mine.index(partition) / len(mine)
        return time.monotonic() - self.snapshot_at.get(partition, 0.0) >= wait

    def _changelog(self) -> str:
        return self.table.changelog_topic.get_topic_name()

    def _load_snapshot(self, partition: int) -> None:
        path = self._snapshot_path(partition)
        self.finish_snapshots(partition)  # (the newest file: a write of it may be queued or under way)
        if path is None or not path.exists():
            return
        loaded = load_snapshot(
            path,
            self.plan,
            self._changelog(),
            self._end_offset(partition),
            self._strings_prefix(partition),
            self.retention,
        )
        if loaded is None:
            return
        shard, offset = loaded
        self.shards[partition], self.offsets[partition] = shard, offset
        self.snapshot_at[partition] = time.monotonic()
        self._first.add(partition)
        log.info("loaded snapshot of shard %d: %d entries, changelog offset %d", partition, len(shard), offset)

    def _end_offset(self, partition: int) -> int | None:
        end = self.ends.get(partition)
        if end is None:  # the end offsets faust's recovery read for its own check (last offset)
            recovery = getattr(getattr(self.app, "tables", None), "recovery", None)
            last = getattr(recovery, "active_highwaters", {}).get(TP(self._changelog(), partition))
            end = None if last is None else last + 1
        return end

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
            if partition not in self.assigned:  # (not seen; a shard here would claim their offsets)
                log.info("changelog records of partition %d, not assigned here now, not restored", partition)
                continue
            self._restore(partition, messages)

    def _restore(self, partition: int, messages: Sequence[Any]) -> None:
        """Store changelog ``messages`` (in offset order; anything with ``key``, ``value`` and
        ``offset``: faust's messages or the bulk reader's records) into the shard of ``partition``.
        The one path of both faust's recovery and the bulk replay.  Raises SchemeError / PlanError
        (after stopping the worker) for records the shard cannot hold."""
        self._apply(self._prepare(partition, messages))

    def _prepare(self, partition: int, messages: Sequence[Any], ahead: bool = False) -> _Run:
        """The first half of :meth:`_restore`: decode ``messages`` and regroup their rows; with
        ``ahead``, start writing their strings in a thread (:meth:`Shard.write_ahead`) while the
        caller goes on, e.g. applies the run before (the shard holds none of them yet)."""
        if partition in self._broken:  # (stopping: restored by the restart)
            raise RuntimeError(f"shard {partition} is dropped: its restore failed midway, the worker is stopping")
        records = [m for m in messages if m.value]
        try:
            try:
                rows = decode([m.value for m in records], CHANGELOG)
            except SchemeError:
                raise
            except ValueError:  # a record that is not one of ours: skipped, the others restored
                records = self._readable(partition, records)
                rows = decode([m.value for m in records], CHANGELOG)
        except SchemeError as e:
            self._refuse(partition, e)
            raise
        shard = self.shard(partition)
        groups, fill = rows.by_group_later()
        filled = None
        if ahead:
            try:
                filled = shard.write_ahead(rows, groups, fill)  # (fills the groups' strings too)
            except PlanError as e:
                self._refuse_plan(partition, e)
                raise
        elif fill is not None:
            fill()
        return _Run(partition, messages, records, rows, groups, filled)

    def _readable(self, partition: int, records: list) -> list:
        """``records`` without those that are not shard changelog batches (damaged, or written
        by something else), each logged: left in, they failed their whole run at every attempt
        (faust keeps a failed buffer and applies it again), so recovery never ended."""
        good = []
        for m in records:
            try:
                decode([m.value], CHANGELOG)
            except SchemeError:
                raise
            except ValueError as e:
                log.error(
                    "shard changelog %s partition %d offset %d is not a streamdedup record (%s): skipped; "
                    "the pages it held, if any, are not restored",
                    self._changelog(),
                    partition,
                    m.offset,
                    e,
                )
            else:
                good.append(m)
        return good

    def _apply(self, run: _Run) -> None:
        """The second half of :meth:`_restore`: store a prepared run (raising the error of a
        string write ahead that failed before the shard holds any of it), then its offset."""
        partition, messages, records, rows = run.partition, run.messages, run.records, run.rows
        if partition in self._broken:
            raise RuntimeError(f"shard {partition} is dropped: its restore failed midway, the worker is stopping")
        shard = self.shard(partition)
        before = shard.row_count()
        try:
            shard.restore(rows, run.groups, run.filled)
        except PlanError as e:
            self._refuse_plan(partition, e)
            raise
        except BaseException as e:
            if shard.row_count() != before:
                self._stop_partial(partition, e)
            raise
        if shard.retention:  # the records that hold its rows, and the tombstones of expired ones
            counts = row_counts([m.value for m in records])
            held = counts > 0
            if held.any():
                starts = np.cumsum(counts) - counts
                newest = np.maximum.reduceat(rows.fetched, starts[held]).tolist()
                for m, n in zip((m for m, h in zip(records, held.tolist()) if h), newest):
                    shard.track(bytes(m.key or b""), n)
            shard.forget([bytes(m.key) for m in messages if not m.value and m.key])
        self.offsets[partition] = max(messages[-1].offset, self.offsets.get(partition, -1))
        if shard.compacted:  # its string files were rewritten: the snapshot must say so
            self.snapshot(partition)
        if self.on_restored is not None:
            self.on_restored(partition, len(messages))

    def _refuse(self, partition: int, error: SchemeError) -> None:
        """Stop the worker: its changelog holds another scheme's fingerprints (never mix them)."""
        message = (
            f"the shard changelog {self._changelog()} (partition {partition}) holds fingerprints of scheme "
            f"{error.found}, and this worker computes scheme {error.expected}: they cannot share an index. "
            f"Run this version with a new --app-id (or delete the topic {self._changelog()} and the app's other "
            f"internal topics, and the snapshots in --data-dir), or go on with the streamdedup version that wrote it"
        )
        log.critical("%s", message)
        crash = SchemeError(message, error.found, error.expected)
        self._crashing = asyncio.ensure_future(self.app.crash(crash))  # keep a reference until it runs

    def _stop_partial(self, partition: int, error: BaseException) -> None:
        """Stop the worker: a changelog run failed (a full disk) after some of the shard's groups
        stored its rows.  Applied again (faust does, and the bulk replay hands the run to faust),
        those groups would hold the rows twice; snapshotted, the next start too.  So the shard
        is dropped, without a snapshot, and a restart rebuilds it (its last snapshot and the
        changelog)."""
        message = (
            f"shard {partition}: restoring its changelog failed midway ({type(error).__name__}: {error}); "
            "stopping, so that a restart rebuilds the shard (free disk space first if it is full)"
        )
        log.critical("%s", message)
        self._broken.add(partition)  # (no more restores, no snapshot)
        shard = self.shards.pop(partition, None)
        if shard is not None:
            shard.close()
        self.offsets.pop(partition, None)
        self._crashing = asyncio.ensure_future(self.app.crash(RuntimeError(message)))

    def _refuse_plan(self, partition: int, error: PlanError) -> None:
        """Stop the worker: its changelog was written by workers of another plan."""
        message = (
            f"the shard changelog {self._changelog()} (partition {partition}) holds {error}. Start this worker "
            "with the settings the app id was created with, or use a new --app-id for the new ones"
        )
        log.critical("%s", message)
        self._crashing = asyncio.ensure_future(self.app.crash(PlanError(message)))

    def reset_state(self) -> None:
        for shard in self.shards.values():
            shard.close()
        self.shards.clear()
        self.offsets.clear()

    async def on_rebalance(
        self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP], generation_id: int = 0
    ) -> None:
        topic = self._changelog()
        mine = {tp for tp in assigned if tp.topic == topic}
        keep = {tp.partition for tp in mine}
        # Before anything else: from here on only this assignment's partitions get shards, and
        # only its active ones serve probes (faust's recovery reads the same assignor afterwards).
        self.assigned = keep
        self.active = {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic}
        self._rebalance = getattr(self.app, "rebalancing_count", None)
        leaving = [p for p in self.shards if p not in keep]
        await self._settle_writes(leaving)
        for partition in leaving:
            self.snapshot(partition)  # it may come back: a later recovery replays only the tail
            self.shards.pop(partition).close()
            self.offsets.pop(partition, None)
            self.owed.pop(partition, None)  # (not in the snapshot: the pages' retry stores them)
            self._held.pop(partition, None)
        # The changelog's end offsets, to tell a snapshot of this cluster from a stale one before
        # recovery seeks past it (faust's own check would stop the worker with ConsistencyError),
        # and, for the bulk replay, how long each partition's tail is.
        self.ends.clear()
        wanted = [tp for tp in mine if self.bulk is not None or tp.partition not in self.shards]
        if wanted and (self.data_dir is not None or self.bulk is not None):
            try:
                # By a client of our own: faust's consumer thread is busy with this very rebalance
                # (faust-notes §11).  Bounded all the same: a rebalance must not wait on a slow broker.
                self.ends.update(await asyncio.wait_for(self._read_ends(topic, wanted), END_OFFSETS_TIMEOUT))
            except (TimeoutError, Exception) as e:  # recovery reads them again; _end_offset falls back
                log.warning("cannot read the end offsets of %s: %s", topic, e)
        if self.bulk is not None and self.ends:
            await self._bulk_replay(self.bulk, topic, keep)

    async def _bulk_replay(self, bulk: BulkReplay, topic: str, partitions: set[int]) -> None:
        with _switch_interval(BULK_SWITCH_INTERVAL):
            await self._bulk_replay_runs(bulk, topic, partitions)

    async def _bulk_replay_runs(self, bulk: BulkReplay, topic: str, partitions: set[int]) -> None:
        """Replay the long changelog tails of ``partitions`` with the bulk reader, before faust's
        recovery reads :meth:`persisted_offset` (right after this callback): faust then replays
        only what is left.  Bounded by ``bulk.timeout``; a timeout or an error leaves the rest to
        faust's recovery (each shard's offset is what it holds, whatever the bulk read reached).

        It runs inside the rebalance callback, where aiokafka sends the group no heartbeats: the
        member's heartbeats are sent from a client of our own meanwhile (``bulk.keepalive``), and
        the read stops as soon as the group asks the member to rejoin (another one joined or
        left).  Without them it is bounded by ``bulk.unkept_timeout``, below the session
        timeout, or the group would drop this worker (docs/faust-notes.md §14)."""
        ranges: dict[int, tuple[int, int]] = {}
        for partition in sorted(partitions):
            if partition not in self.shards:
                self._load_snapshot(partition)  # (persisted_offset finds it loaded)
            end, start = self.ends.get(partition), self.offsets.get(partition, -1) + 1
            if end is not None and end > start and end - start >= bulk.min_records:
                ranges[partition] = (start, end)
        if not ranges:
            return
        t0, records, rows, done = time.perf_counter(), 0, 0, set()
        rebalance, stopped = self._rebalance, ""
        async with contextlib.AsyncExitStack() as stack:
            rejoin: asyncio.Event | None = None
            if bulk.keepalive is not None:
                try:
                    rejoin = await stack.enter_async_context(bulk.keepalive(self.app))
                except Exception as e:
                    log.warning("cannot send the group heartbeats during the bulk replay: %r", e)
            timeout = bulk.timeout if rejoin is not None else min(bulk.timeout, bulk.unkept_timeout)
            reader = bulk.read(topic, ranges)
            # One run behind: a run is decoded, and its strings regrouped and written ahead in a
            # thread (_prepare), while the run before it is stored (_apply).  A run counts as
            # restored (its offset, the check after it) only once it is stored, its writes done.
            # A stop (the group or the worker asks for one, an error, the deadline) drops the run
            # in hand: faust's recovery replays it, and its writes ahead are dropped at the next
            # append to those files.
            prepared: _Run | None = None

            def apply_prepared() -> bool:
                nonlocal prepared, records, rows
                if prepared is None:
                    return False
                run, prepared = prepared, None
                self._apply(run)
                records += len(run.messages)
                rows += len(run.rows)
                return True

            try:
                async with asyncio.timeout(timeout):
                    async for partition, run in reader:
                        if rejoin is not None and rejoin.is_set():
                            stopped = "the group asked this worker to rejoin (a rebalance)"
                            break
                        if getattr(self.app, "should_stop", False) or self._rebalance != rebalance:
                            stopped = "the worker is stopping or rebalancing"
                            break  # (what it restored stays: each shard holds what its offset says)
                        if partition not in self.assigned:  # (cannot happen within one callback)
                            continue
                        if not run:  # read to its end: control records up to it hold no rows
                            # (first the run in hand: the offset below claims its records)
                            if apply_prepared() and bulk.check is not None:
                                await bulk.check()
                            self.shard(partition)
                            self.offsets[partition] = max(ranges[partition][1] - 1, self.offsets.get(partition, -1))
                            done.add(partition)
                            continue
                        following = self._prepare(partition, run, ahead=True)
                        applied = apply_prepared()
                        prepared = following
                        if applied and bulk.check is not None:
                            await bulk.check()
                        await asyncio.sleep(0)  # the web server and the other tasks go on meanwhile
                    else:  # (read to the end: the last run; not after a break)
                        if apply_prepared() and bulk.check is not None:
                            await bulk.check()
            except (SchemeError, PlanError):
                return  # _restore stopped the worker: faust's recovery would refuse the same records
            except (TimeoutError, Exception) as e:
                stopped = f"{type(e).__name__}: {str(e) or f'not done within {timeout:g}s'}"
            finally:
                try:  # (stops its consumer) an error here must not fail the rebalance: faust would crash
                    await asyncio.wait_for(reader.aclose(), END_OFFSETS_TIMEOUT)
                except (TimeoutError, Exception) as e:
                    log.warning("the bulk replay's consumer of %s did not stop cleanly: %r", topic, e)
        if stopped:
            log.warning(
                "bulk replay of %s stopped (%s); faust's recovery replays the rest from offsets %s",
                topic,
                stopped,
                {p: self.offsets.get(p, -1) for p in sorted(ranges)},
            )
        seconds = time.perf_counter() - t0
        log.info(
            "bulk replay of %s from offsets %s: %d records, %d rows in %.2fs (%.0f rows/s); partitions read to "
            "their end %s, offsets now %s",
            topic,
            {p: start for p, (start, _) in sorted(ranges.items())},
            records,
            rows,
            seconds,
            rows / seconds if seconds > 0 else 0.0,
            sorted(done),
            {p: self.offsets.get(p, -1) for p in sorted(ranges)},
        )

    async def _read_ends(self, topic: str, tps: list[TP]) -> dict[int, int]:
        if self.end_offsets is not None:
            return await self.end_offsets(topic, sorted(tp.partition for tp in tps))
        ends = await self.app.consumer.highwaters(*tps)
        return {tp.partition: int(end) for tp, end in ends.items() if end is not None}

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        self._recovered = (self._rebalance,)  # (ready: the same assignment)
        for shard in self.shards.values():
            shard.prepare()  # build lookup directories now, not on the first probe
        if self.on_recovered is not None:
            self.on_recovered()

    async def on_stop(self) -> None:
        await self._settle_writes(list(self.shards))
        for partition in list(self.shards):
            self.snapshot(partition)
        self._held.clear()  # (waiting for writes still under way: not written after the stop)
        self.finish_snapshots()  # (those of partitions given away meanwhile: written, then the writer ends)
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None

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
