"""The index sharded across a consumer group: global answers from partitioned state.

A page must be compared with every page stored before it, whichever worker saw it.  Manku's
design gives the sharding: two fingerprints within k bits agree on every bit of at least one
*group* (for 4 x 4: one of the four 16-bit blocks), so a probe for each group, routed by the
value of that group's bits, meets every near neighbour in some shard::

    page fingerprint F --> probe (group 0, F & mask0) --> partition mix64(...) % P --+
                       --> probe (group 1, F & mask1) --> ...                       |
                       --> ...                                                      v
    shard (partition p): for each group, the group's tables only   insert, then search
    answers (one per group) --> best of them --> the page's verdict

A shard keeps an index per group: with the worker's 4-table design one
:class:`~streamdedup.index.blocks.BlockIndex` keyed by the group's block (12 bytes an entry),
with the 16-table design a :class:`~streamdedup.index.hamming.HammingIndex` over the group's
four tables.  What an answer must tell about a stored page besides its fingerprint (its fetch
time, carried, not used for order; a hash of its id; its id and URL) is kept in columns and a
string heap, in files next to the snapshot when ``strings`` is given (read only for the rows a
probe finds; :class:`~streamdedup.index.file_array.FileArray`), else in memory.  A group's rows
are numbered in store order.

The rule (:mod:`streamdedup.engine.order`, the same in ``scan``): a page's answer in group g
is the nearest, then first stored, page that (1) was stored in g's store before the page's
position there, (2) has another id hash, and (3) has g as the pair's *canonical* group (the
lowest group both agree on).  Both pages of a pair reach the canonical group's store, which
stores them one after the other, so exactly one of the two finds the other.  A page's
position is where it was first stored: a replay (same id hash and fingerprint) is not stored
again and is never judged against pages stored after its first insert.  A batch is stored
first and then searched (one search of the stored pages, one of a small index of the batch's
new pages), so a page also finds the pages before it in its own batch, in linear time.

Retention (``--retention``; docs/stream-design.md "Retention"): a shard's clock is
the newest :func:`clock_values` of the rows it stored (their fetch times, never past the wall
clock at store; carried in the changelog rows, so a replay moves it alike).  Rows fetched
before the *cutoff* (the clock minus the retention, rounded down to a 64th of it) are dead:
no match, no position; a group is compacted once a quarter of its rows are dead.  The cutoff
depends on the clock only, so a replay or a snapshot plus tail expires exactly what the live
shard did.  The shard keeps, per changelog record key, its rows' newest fetch time, and hands
out a record's key as a tombstone (:meth:`Shard.take_tombstones`) once that time is expired,
never while the record holds a live row.

This module imports nothing from faust or aiokafka; the stream layer moves its inputs and
outputs through Kafka.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from streamdedup.engine.order import group_masks
from streamdedup.errors import PlanError
from streamdedup.fingerprinting.features import mix64
from streamdedup.index import columns
from streamdedup.index.arrays import GrowingArray, first_occurrences
from streamdedup.index.blocks import BlockIndex
from streamdedup.index.columns import Column, column_from_state, column_state, new_column, stage_keep
from streamdedup.index.file_array import FileArray, call_ahead
from streamdedup.index.hamming import HammingIndex
from streamdedup.index.strings import StringHeap, texts_from_state, texts_state
from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.snapshot_file import read_arrays, write_arrays
from streamdedup.pipeline.wire import ANSWERS, CHECKS, PROBES, Batch, decode, kind_of

__all__ = ["WORKER_DESIGN", "Plan", "Store", "ShardPlan", "Shard", "Answers", "ShardStep", "name_matches", "shard_step"]

#: The worker's table design for k = 3 (``--design``): Manku's 4-table design, one table per
#: shard group keyed by the group's block (a BlockIndex: 12 bytes an entry, no by-row column).
#: It holds a page in ~50 bytes where the 16-table design needs ~185; bench/README.md "Index".
WORKER_DESIGN = "4"

_PARTITION_SEED = np.uint64(0x5EED_5A4D)
_GROUP_SPREAD = np.uint64(0x9E3779B97F4A7C15)


def partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The shard partition that owns each 64-bit routing key (part of the stored format)."""
    return (mix64(np.asarray(keys, dtype=np.uint64) ^ _PARTITION_SEED) % np.uint64(partitions)).astype(np.int64)


class Store(Protocol):
    """One group's stored pages in one shard: the simhash tables of a group (:class:`_GroupStore`)
    or an LSH band (:class:`~streamdedup.pipeline.bands.BandStore`)."""

    texts: StringHeap
    renew: int  # with a retention: ms after which a re-crawl of a stored page is stored anew

    def __len__(self) -> int: ...

    def rows(self) -> int: ...

    def expire(self, cutoff: int, since: int = 0) -> bool: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def file_bytes(self) -> int: ...

    def probe_and_insert(
        self, sel, fps, fetched, id_hash, ids, urls, out: Answers, insert: bool = True, extra=None
    ) -> None: ...

    def state(self) -> dict[str, np.ndarray]: ...

    def load(self, rec: Batch) -> None: ...

    def prepare(self) -> None: ...

    def close(self) -> None: ...


class Plan(Protocol):
    """Which shard partition each probe of a page goes to, and what a shard stores per group:
    :class:`ShardPlan` (simhash tables) or :class:`~streamdedup.pipeline.bands.BandPlan` (LSH bands)."""

    @property
    def partitions(self) -> int: ...

    @property
    def extra_bytes(self) -> int: ...

    @property
    def n_groups(self) -> int: ...

    def describe(self) -> list[int]: ...

    def new_store(self, group: int, strings: str | None) -> Store: ...

    def store_from_state(self, group: int, state: dict[str, np.ndarray], strings: str | None) -> Store: ...

    def probes(self, fps: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray: ...


@dataclass(frozen=True)
class ShardPlan:
    """Which shard partition each of a page's probes goes to.

    >>> plan = ShardPlan(TableDesign.named("16"), partitions=8)
    >>> plan.n_groups, plan.probes(np.array([0, 1], dtype=np.uint64)).shape
    (4, (2, 4))
    """

    design: TableDesign
    partitions: int
    masks: np.ndarray = field(init=False, repr=False, compare=False)
    tables: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")
        object.__setattr__(self, "masks", group_masks(self.design))
        object.__setattr__(self, "tables", tuple(t for _, t in self.design.groups()))

    @property
    def n_groups(self) -> int:
        return len(self.tables)

    extra_bytes = 0  # probes carry no bytes besides the row (see BandPlan)

    def describe(self) -> list[int]:
        """The plan as integers: a snapshot is only loaded by a worker of the same plan."""
        return [self.partitions, *self.design.levels]

    def new_store(self, group: int, strings: str | None) -> _GroupStore:
        return _GroupStore(self.group_design(group), self.masks[: group + 1], strings)

    def store_from_state(self, group: int, state: dict[str, np.ndarray], strings: str | None) -> _GroupStore:
        return _GroupStore.from_state(state, self.masks[: group + 1], strings)

    def probes(self, fps: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
        """Partition of each (page, group) probe, shape (n, n_groups) (``extra``: unused).

        The partition is a hash of (group, the fingerprint's bits in the group): part of the
        stored format, since a shard's state is only findable through it.
        """
        fps = np.asarray(fps, dtype=np.uint64)
        groups = np.arange(self.n_groups, dtype=np.uint64)
        keys = (fps[:, None] & self.masks[None, :]) ^ ((groups + np.uint64(1)) * _GROUP_SPREAD)[None, :]
        return partition_of(keys, self.partitions)

    def group_design(self, group: int) -> TableDesign:
        return self.design.restricted(self.tables[group])


@dataclass
class Answers:
    """One shard's answers to a batch of probes, aligned with the probes.

    ``distance`` is -1 where the group has no match for the probe (module doc); otherwise the
    match's fields.
    """

    distance: np.ndarray  # int64, -1 when no match
    fingerprint: np.ndarray  # uint64 of the match
    fetched: np.ndarray  # int64 order key of the match
    id_hash: np.ndarray  # uint64 of the match
    ids: list[str | None]
    urls: list[str | None]
    stored: np.ndarray  # bool: the probe's page was stored (write it to the changelog)

    @classmethod
    def empty(cls, n: int) -> Answers:
        """Answers to ``n`` probes before any is answered: no match, nothing stored."""
        return cls(
            np.full(n, -1, np.int64),
            np.zeros(n, np.uint64),
            np.zeros(n, np.int64),
            np.zeros(n, np.uint64),
            [None] * n,
            [None] * n,
            np.zeros(n, dtype=bool),
        )


class Shard:
    """One partition of the sharded index: the tables of every group routed to it.

    ``strings``: a path prefix for the stored pages' ids and URLs, one append-only file per
    group (``<strings>.g<group>.strings``), read only for the matches an answer reports; None
    keeps them in memory."""

    def __init__(self, plan: Plan, strings: str | None = None, retention: int = 0) -> None:
        self.plan, self.strings = plan, strings
        self._groups: dict[int, Store] = {}
        # retention (module doc "Retention"): in ms, 0 keeps every page
        self.retention = int(retention)
        self.clock = 0  # the newest clock value of the rows stored (replays give the same)
        self._applied = _NEVER  # the cutoff every group and the record table were expired to
        self._records = _Records()  # changelog record key -> newest fetch time of its rows
        # keys of expired records, to delete from the changelog (a dict: an ordered set, so that a
        # replay that reads their tombstones removes each in O(1))
        self.tombstones: dict[bytes, None] = {}
        self.compacted = False  # a group was compacted since the last snapshot (its string file was rewritten)

    def close(self) -> None:
        """Close the string files (the shard is no longer used)."""
        for g in self._groups.values():
            g.close()

    def _strings_path(self, g: int) -> str | None:
        return None if self.strings is None else f"{self.strings}.g{g}.strings"

    def __len__(self) -> int:
        """Stored (page, group) entries."""
        return sum(len(g) for g in self._groups.values())

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self._groups.values()) + self._records.nbytes

    @property
    def file_bytes(self) -> int:
        """Bytes of the row files on disk (strings and row columns; 0 with strings in memory)."""
        return sum(g.file_bytes for g in self._groups.values())

    def probe_and_insert(
        self,
        group: np.ndarray,
        fps: np.ndarray,
        fetched: np.ndarray,
        id_hash: np.ndarray,
        ids: list[str],
        urls: list[str],
        store: bool = True,
        extra: np.ndarray | None = None,
        now: int | None = None,
        out: Answers | None = None,
    ) -> Answers:
        """Store a batch of probes' pages in order, then answer each probe (the module's rule).

        ``store=False``: only answer, against the stored pages (a check: its position is after
        every stored page, or its first store if its id and fingerprint are stored).  ``extra``:
        the probes' extra bytes (the band modes).  ``now``: the wall clock in ms, which bounds
        what the stored pages' fetch times move the retention clock by (:func:`clock_values`).
        ``out``: the answers to fill (:meth:`Answers.empty`), so that if a group fails (a full
        disk) after the groups before it stored their pages, the caller still sees which pages
        are stored (``out.stored``: they are in the shard, and the changelog must get them)."""
        out = Answers.empty(len(fps)) if out is None else out
        group, insert = np.asarray(group, dtype=np.int64), store
        starts: dict[int, int] = {}
        # with a retention, the batch is judged as if its own times had moved the clock already: a
        # page older than the retention is no match for it, however little else the shard stored since
        judge = {} if not self.retention else {"cutoff": self._cutoff_at(clock_values(fetched, now))}
        try:
            for g in np.unique(group).tolist():
                sel = np.flatnonzero(group == g)
                gstore = self._groups.get(g)
                if gstore is None:
                    gstore = self._groups[g] = self._new_group(g)
                starts[g] = _rows(gstore)
                gstore.probe_and_insert(
                    sel,
                    fps[sel],
                    fetched[sel],
                    id_hash[sel],
                    [ids[i] for i in sel],
                    [urls[i] for i in sel],
                    out,
                    insert,
                    None if extra is None else extra[sel],
                    **judge,
                )
        except BaseException:
            if insert and out.stored.any():  # (the clock as a replay of the stored rows moves it)
                self.clock = max(self.clock, int(clock_values(np.asarray(fetched)[out.stored], now).max()))
            raise
        if insert:
            self._advance(clock_values(np.asarray(fetched)[out.stored], now), starts)
        return out

    # ------------------------------------------------------------------ retention
    @property
    def cutoff(self) -> int:
        """Rows fetched before this are expired: the clock minus the retention, rounded down to a
        64th of the retention (so the groups are scanned at most 64 times per retention of clock
        time); a function of the clock only, so a replay expires exactly what the live shard did."""
        return self._cutoff_at(np.empty(0, np.int64))

    def _cutoff_at(self, values: np.ndarray) -> int:
        """The cutoff once the clock has moved to the newest of ``values``."""
        if not self.retention:
            return _NEVER
        clock = max(self.clock, int(values.max())) if len(values) else self.clock
        step = max(1, self.retention // 64)
        return (clock - self.retention) // step * step

    def _advance(self, values: np.ndarray, starts: dict[int, int]) -> None:
        """Move the clock to the newest of ``values``, then expire: every group and record if the
        cutoff moved, else only the rows stored since ``starts`` (group -> its row count before)."""
        if len(values):
            self.clock = max(self.clock, int(values.max()))
        if not self.retention:
            return
        cutoff = self.cutoff
        if cutoff > self._applied:
            for gstore in self._groups.values():
                self.compacted |= _expire(gstore, cutoff)
            self.tombstones.update(dict.fromkeys(self._records.expire(cutoff)))
            self._applied = cutoff
        else:
            for g, start in starts.items():
                self.compacted |= _expire(self._groups[g], cutoff, start)

    def track(self, key: bytes, newest: int) -> None:
        """The changelog record ``key`` holds stored rows whose newest fetch time is ``newest``:
        it is deleted (a tombstone in :attr:`tombstones`) once the cutoff passes it, when all its
        rows have expired.  A key of another length than the worker's is never deleted."""
        if not self.retention or len(key) != _Records.KEY_BYTES:
            return
        if newest < self._applied:
            self.tombstones[key] = None
        else:
            self._records.add(key, newest)

    def forget(self, keys: list[bytes]) -> None:
        """Tombstones read from the changelog (a replay): their records are deleted already."""
        if keys and self.retention:
            # mostly records this shard found expired too (waiting here); the others are looked up
            rest = [k for k in keys if k not in self.tombstones]
            for k in keys:
                self.tombstones.pop(k, None)
            if rest:
                self._records.drop(rest)

    def take_tombstones(self) -> list[bytes]:
        """The keys of the expired changelog records not handed out yet (the caller deletes them)."""
        out, self.tombstones = list(self.tombstones), {}
        return out

    def save(self, path: os.PathLike[str] | str, meta: dict | None = None) -> None:
        """Write the shard to ``path`` (the arrays as they are, replaced atomically; see
        :mod:`~streamdedup.pipeline.snapshot_file`), with ``meta`` (JSON-able: e.g. the
        changelog offset the snapshot covers)."""
        write_arrays(path, self.snapshot_arrays(frozen=False), meta or {})

    def snapshot_arrays(self, frozen: bool = True) -> dict[str, np.ndarray]:
        """The arrays :meth:`save` writes, as they are now.  ``frozen``: none of them changes
        afterwards, so they can be written from another thread while the shard goes on storing
        pages: a BlockIndex's runs are kept (merges replace runs, never write into one; its alive
        bits are a copy already), every other array is copied."""
        arrays: dict[str, np.ndarray] = {"plan": np.array(self.plan.describe()), "clock": np.array(self.clock)}
        if self.retention:
            arrays.update({k: v.copy() if frozen else v for k, v in self._records.state().items()})
            arrays["tombstones"] = _Records.as_keys(list(self.tombstones))
        for g, store in self._groups.items():
            state = store.state()
            if frozen:
                keep = _unchanging(store)
                state = {name: value if name in keep else value.copy() for name, value in state.items()}
            for name, value in state.items():
                arrays[f"g{g}.{name}"] = value
        return arrays

    @classmethod
    def load(
        cls, path: os.PathLike[str] | str, plan: Plan, strings: str | None = None, retention: int = 0
    ) -> tuple[Shard, dict]:
        """Read a shard written by :meth:`save` (or, before that format, by ``np.savez``);
        returns it and its ``meta``.  ``strings``: as for the constructor (a snapshot of an
        in-memory shard moves its strings to the files); ``retention``: as for the constructor
        (the loaded shard is expired to it at once, whatever the retention it was saved with).

        Raises ValueError if the file was written for another shard plan or is damaged, or a
        string file it needs is missing, damaged or another shard's.
        """
        arrays, meta = _read_snapshot(path)
        if arrays.get("plan") is None or arrays["plan"].tolist() != plan.describe():
            raise ValueError(f"the shard snapshot {path} was written for another shard plan")
        shard = cls(plan, strings, retention)
        shard.clock = int(arrays.get("clock", 0))
        if retention:
            shard._records = _Records.from_state(arrays)
            shard.tombstones = dict.fromkeys(_Records.from_keys(arrays.get("tombstones")))
        groups: dict[int, dict[str, np.ndarray]] = {}
        for key, value in arrays.items():
            if key.startswith("g"):
                number, name = key[1:].split(".", 1)
                groups.setdefault(int(number), {})[name] = value
        try:
            for g, state in groups.items():
                shard._groups[g] = plan.store_from_state(g, state, shard._strings_path(g))
                if retention:
                    _renew(shard._groups[g], retention)
            shard._advance(np.empty(0, np.int64), {})  # a retention shorter than the snapshot's
        except BaseException:
            shard.close()
            raise
        return shard, meta

    def _new_group(self, g: int) -> Store:
        store = self.plan.new_store(g, self._strings_path(g))
        if self.retention:
            _renew(store, self.retention)
        return store

    def prepare(self) -> None:
        """Build lookup structures now (after recovery), not on the first probe."""
        for store in self._groups.values():
            store.prepare()

    def restore(
        self, inserts: Batch, groups: list[tuple[int, Batch]] | None = None, filled: Future[None] | None = None
    ) -> None:
        """Store decoded changelog rows as they are (recovery: no probing, no checks).
        ``groups``: ``inserts.by_group()``, if taken already (by :meth:`write_ahead`), and
        ``filled``: what :meth:`write_ahead` returned.

        Raises :class:`~streamdedup.errors.PlanError` for rows of another plan (their extra
        bytes or groups do not fit this one's), before storing any; and the error of a string
        write ahead that failed, before storing any."""
        groups = inserts.by_group() if groups is None else groups
        self._check_plan(inserts, groups)
        try:  # (the writes ahead, all done before any group changes)
            if filled is not None:
                filled.result()
            for g, rows in groups:
                for file, values in _written_ahead(self._groups.get(g), rows):
                    file.wait_ahead(values)
        except BaseException:
            for g, rows in groups:  # (every file cut back to its end)
                for file, _ in _written_ahead(self._groups.get(g), rows):
                    file.drop_ahead()
            raise
        starts: dict[int, int] = {}
        for g, rows in groups:
            store = self._groups.get(g)
            if store is None:
                store = self._groups[g] = self._new_group(g)
            starts[g] = _rows(store)
            store.load(rows)
        self._advance(restored_clock_values(inserts), starts)

    def row_count(self) -> int:
        """Rows the groups have numbered (expired ones not compacted away yet included)."""
        return sum(_rows(store) for store in self._groups.values())

    def write_ahead(
        self, inserts: Batch, groups: list[tuple[int, Batch]], fill: Callable[[], None] | None = None
    ) -> Future[None] | None:
        """Start writing the strings and row columns of a coming :meth:`restore` of ``inserts``
        (``groups``, ``fill``: its ``by_group_later()``) in a thread (``pwrite`` and the regrouping
        kernel release the GIL): a replay decodes its next batch meanwhile.  Nothing is stored
        until that restore, which is given what this returns (the fill's job: the groups'
        strings are read only once it is done).  PlanError as for :meth:`restore`."""
        self._check_plan(inserts, groups)
        filled = None if fill is None else call_ahead(fill)
        for g, rows in groups:
            store = self._groups.get(g)
            if store is None:
                store = self._groups[g] = self._new_group(g)
            for file, values in _written_ahead(store, rows):
                if isinstance(file, StringHeap):
                    file.write_ahead(values, rows.lengths, filled)
                else:
                    file.write_ahead(values)
        return filled

    def _check_plan(self, inserts: Batch, groups: list[tuple[int, Batch]]) -> None:
        """PlanError for rows of another plan (``groups``: their ``by_group()``, groups ascending)."""
        width = 0 if inserts.extra is None else inserts.extra.shape[1]
        top = groups[-1][0] if groups else 0
        if width != self.plan.extra_bytes or top >= self.plan.n_groups:
            raise PlanError(
                f"shard rows of another plan ({width} extra bytes a row, groups up to "
                f"{top}); this worker's plan has {self.plan.extra_bytes} "
                f"extra bytes a row and {self.plan.n_groups} groups: another --algorithm, --threshold, "
                "--num-perm or combined --k wrote them"
            )


def _written_ahead(store: Store | None, rows: Batch) -> list[tuple[Any, Any]]:
    """The files of ``store`` that a :meth:`Shard.write_ahead` writes for ``rows``, and what
    each one's append will be given: the strings (any store with a file-backed heap) and, in a
    simhash group, the row columns its ``load`` appends."""
    out: list[tuple[Any, Any]] = []
    texts = getattr(store, "texts", None)
    if isinstance(texts, StringHeap) and texts.path is not None:
        out.append((texts, rows.strings))
    if isinstance(store, _GroupStore):
        out += [
            (c, v)
            for c, v in ((store.fetched, rows.fetched), (store.id_hash, rows.id_hash))
            if isinstance(c, FileArray)
        ]
    return out


@dataclass
class ShardStep:
    """What one step of the shard stage produced (the stream layer sends it through Kafka)."""

    changelog: list[tuple[int, Batch]] = field(default_factory=list)  # (shard partition, pages it stored)
    answers: dict[int, Batch] = field(default_factory=dict)  # input partition -> answers to send there
    skipped: list[tuple[int, int]] = field(default_factory=list)  # (shard partition, messages not probes)
    shards: set[int] = field(default_factory=set)  # shard partitions touched


def shard_step(
    shard_of: Callable[[int], Shard],
    messages: Iterable[tuple[int, bytes]],
    now: int | None = None,
    out: ShardStep | None = None,
) -> ShardStep:
    """The shard stage on a run of probe messages: ``(shard partition, value)`` in arrival order.

    Probes (stored) and checks (only answered) of a partition are handled per kind in arrival
    order; the answers are grouped by the input partition that waits for them, and the stored
    rows come back for the changelog (``partition`` zeroed, ``request`` holding each row's clock
    value, :func:`clock_values` of its fetch time and ``now``, the wall clock in ms).

    ``out``: the step to fill.  If the step raises (a full disk in the middle of it), the pages
    stored before the failure stay stored, and ``out.changelog`` holds them: the caller still
    owes them to the changelog (a retry finds them stored, so it does not store them again).
    """
    by_partition: dict[tuple[int, int | None], list[bytes]] = defaultdict(list)
    for s, value in messages:
        by_partition[s, kind_of(value)].append(value)
    out = ShardStep() if out is None else out
    replies: dict[int, list[Batch]] = defaultdict(list)
    for (s, kind), values in by_partition.items():
        if kind not in (PROBES, CHECKS):
            out.skipped.append((s, len(values)))
            continue
        out.shards.add(s)
        probes = decode(values, kind)
        ans = Answers.empty(len(probes))
        try:
            shard_of(s).probe_and_insert(
                probes.group,
                probes.fps,
                probes.fetched,
                probes.id_hash,
                probes.ids(),
                probes.urls(),
                store=kind == PROBES,
                extra=probes.extra,
                now=now,
                out=ans,
            )
        finally:
            if ans.stored.any():  # (also when a group failed after others stored their pages)
                stored = probes.select(ans.stored)
                stored.rows["request"], stored.rows["partition"] = clock_values(stored.fetched, now), 0
                out.changelog.append((s, stored))
        matched = ans.distance >= 0
        answer = Batch.build(
            group=probes.rows["group"],
            fps=ans.fingerprint,
            fetched=ans.fetched,
            id_hash=ans.id_hash,
            request=probes.rows["request"],
            distance=ans.distance,
            partition=probes.rows["partition"],
            ids=[x if m and x is not None else "" for x, m in zip(ans.ids, matched)],
            urls=[x if m and x is not None else "" for x, m in zip(ans.urls, matched)],
            kind=ANSWERS,
        )
        dest = probes.rows["partition"]
        for q in np.unique(dest).tolist():
            replies[q].append(answer.select(dest == q))
    out.answers = {q: Batch.concat(parts) for q, parts in replies.items()}
    return out


def name_matches(texts: StringHeap, rows: np.ndarray, probes: np.ndarray, out: Answers) -> None:
    """The id and URL of stored row ``rows[k]`` as the match of probe ``probes[k]``: a group's
    strings hold row r's id at 2 r ("" when it is the URL) and its URL at 2 r + 1, read for all
    the matches at once (:meth:`StringHeap.many`)."""
    texts_read = texts.many(np.stack((2 * rows, 2 * rows + 1), axis=1).ravel())
    for k, i in enumerate(probes.tolist()):
        out.ids[i] = texts_read[2 * k] or texts_read[2 * k + 1]
        out.urls[i] = texts_read[2 * k + 1]


class _GroupStore:
    """One group's tables in one shard, and what an answer tells of each stored page.

    Rows are numbered in store order, which is this group's order of the rule (module doc)."""

    #: With a retention: a page stored again (same id and fingerprint) is stored anew, under its
    #: new fetch time, once its newest stored copy is this many ms older (half the retention).
    renew = 0

    def __init__(self, design: TableDesign, masks: np.ndarray, strings: str | None = None) -> None:
        self.index = _group_index(design, int(masks[-1]))
        self.mask, self.earlier = masks[-1], masks[:-1]  # this group's bits, those of the groups before it
        # what an answer tells of a row, beside its fingerprint (the index's): in files next to the
        # string file when there is one (read only for the rows a probe finds; module doc)
        self.fetched: Column = new_column(np.int64, strings, ".fetched")
        self.id_hash: Column = new_column(np.uint64, strings, ".idhash")
        self.texts = StringHeap(strings)  # id of row r at 2r ("" when it is the url), its url at 2r + 1

    def _new_index(self) -> GroupIndex:
        """An empty index of this store's kind (for a batch's own pages: merged inline)."""
        if isinstance(self.index, BlockIndex):
            return BlockIndex(self.index.mask, self.index.k, background=False)
        return HammingIndex(k=self.index.k, design=self.index.design)

    def close(self) -> None:
        self.texts.close()
        columns.close((self.fetched, self.id_hash))

    def _append(self, fetched: np.ndarray, id_hash: np.ndarray, strings: Callable[[], None]) -> None:
        """Append rows' columns and strings (``strings`` appends those): all or, if a write
        fails (a full disk), none of them."""
        rows, texts = len(self.id_hash), len(self.texts)
        try:
            strings()
            self.fetched.extend(fetched)
            self.id_hash.extend(id_hash)
        except BaseException:
            self.texts.truncate(texts)
            self.fetched.truncate(rows)
            self.id_hash.truncate(rows)
            raise

    def __len__(self) -> int:
        return len(self.index)

    def prepare(self) -> None:
        self.index.prepare()

    @property
    def nbytes(self) -> int:
        cols = (self.fetched, self.id_hash)
        return self.index.nbytes + sum(c.nbytes for c in cols) + self.texts.nbytes

    @property
    def file_bytes(self) -> int:
        return columns.file_bytes((self.fetched, self.id_hash)) + self.texts.file_bytes

    def probe_and_insert(
        self, sel, fps, fetched, id_hash, ids, urls, out: Answers, insert: bool = True, extra=None, cutoff=None
    ) -> None:
        """Store the batch's new pages, then answer every probe (linear: no batch x batch matrix).
        (``extra``: unused; a simhash probe carries none.)  ``cutoff``: with a retention, rows
        fetched before it count as gone (neither a match nor the probe's own earlier store)."""
        n, start = len(fps), len(self.id_hash)
        found = self.index.search(fps)  # the pages stored before this batch, within k
        q, row, dist = found.query, found.row, found.distance
        rfp = _matched_fps(self.index, found)
        if cutoff is not None:
            live = self.fetched.take(row) >= cutoff
            q, row, dist, rfp = q[live], row[live], dist[live], rfp[live]
        # Where each probe stands in this group's order: after every stored page, unless its id
        # and fingerprint are stored already (a replay or an unchanged re-fetch), then at its first
        # store (the smallest such row: rows are numbered in store order).
        pos = np.full(n, start, dtype=np.int64)
        same = (dist == 0) & (self.id_hash.take(row) == id_hash[q])
        np.minimum.at(pos, q[same], row[same])
        new = np.zeros(n, dtype=bool)
        if insert:
            # the new pages, once each (a page repeated in the batch stands where its first copy is)
            first, inverse = first_occurrences(id_hash, fps)
            again = pos[first] == start
            if self.renew:  # a re-crawl stored anew (judged where it stands), so it outlives the old copy
                newest = np.full(n, _NEVER, dtype=np.int64)
                np.maximum.at(newest, q[same], self.fetched.take(row[same]))
                held = np.flatnonzero(newest[first] > _NEVER)  # (no subtraction from _NEVER: it would wrap)
                again[held] |= np.asarray(fetched)[first[held]] - newest[first[held]] >= self.renew
            if cutoff is not None:  # a page already older than the cutoff is judged, not stored
                again &= np.asarray(fetched)[first] >= cutoff
            new[first[again]] = True
            new_idx = np.flatnonzero(new)
            rank = np.full(n, -1, dtype=np.int64)
            rank[new_idx] = np.arange(len(new_idx))
            fresh = np.flatnonzero(pos == start)
            ranked = rank[first[inverse[fresh]]]  # (-1: not stored; it stands after every stored page)
            pos[fresh[ranked >= 0]] = start + ranked[ranked >= 0]
            if len(new_idx):
                # the batch against its own new pages: a small index of them, searched once
                mine = self._new_index()
                mine.add_many(range(len(new_idx)), fps[new_idx])
                inner = mine.search(fps)
                q = np.concatenate((q, inner.query))
                row = np.concatenate((row, start + inner.row))
                dist = np.concatenate((dist, inner.distance))
                rfp = np.concatenate((rfp, fps[new_idx][inner.row]))
                # then the store: the writes that can fail (a full disk) first, all or none, and
                # nothing that can fail after the index has the rows but ``out`` does not say so.
                # An id equal to its url (the default) is stored as "" (ids are never empty)
                texts = [x for i in new_idx.tolist() for x in ("" if ids[i] == urls[i] else ids[i], urls[i])]
                self._append(fetched[new_idx], id_hash[new_idx], lambda: self.texts.extend(texts))
                numbered = self.index.rows
                try:
                    self.index.add_many(range(start, start + len(new_idx)), fps[new_idx])
                finally:  # (a merge after the rows are in, e.g. out of memory: stored all the same)
                    if self.index.rows > numbered:
                        out.stored[sel[new]] = True
        row_fp, row_hash = rfp, self.id_hash.take(row)
        # the rule: stored before the probe's position, another id, and this is the pair's canonical group
        keep = (row < pos[q]) & (row_hash != id_hash[q])
        if cutoff is not None:  # (the batch's own new pages too)
            keep &= self.fetched.take(row) >= cutoff
        # (a table key may be cut short, so a hit need not agree on all of this group's bits)
        x = fps[q] ^ row_fp
        keep &= (x & self.mask) == 0
        if len(self.earlier):
            keep &= (x[:, None] & self.earlier[None, :] != 0).all(axis=1)
        q, row, dist, row_fp = q[keep], row[keep], dist[keep], row_fp[keep]
        order = np.lexsort((row, dist, q))  # nearest, then first stored
        q, row, dist, row_fp = q[order], row[order], dist[order], row_fp[order]
        best = np.flatnonzero(np.r_[True, q[1:] != q[:-1]]) if len(q) else q
        p, r = sel[q[best]], row[best]
        out.distance[p], out.fingerprint[p] = dist[best], row_fp[best]
        out.fetched[p], out.id_hash[p] = self.fetched.take(r), self.id_hash.take(r)
        name_matches(self.texts, r, p, out)

    def state(self) -> dict[str, np.ndarray]:
        out = {f"index.{k}": v for k, v in self.index.state().items()}
        out.update({**column_state("fetched", self.fetched), **column_state("id_hash", self.id_hash)})
        out.update(texts_state(self.texts))
        return out

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], masks: np.ndarray, strings: str | None = None) -> _GroupStore:
        store = cls.__new__(cls)
        store.mask, store.earlier = masks[-1], masks[:-1]
        index_state = {k[6:]: v for k, v in state.items() if k.startswith("index.")}
        store.index = (
            BlockIndex.from_state(index_state) if "mask" in index_state else HammingIndex.from_state(index_state)
        )
        # taken over, not copied: a snapshot's arrays are read fresh (snapshot_file)
        rows = store.index.rows
        store.texts = texts_from_state(state, strings)
        try:
            store.fetched = column_from_state("fetched", np.int64, state, rows, strings, ".fetched")
            store.id_hash = column_from_state("id_hash", np.uint64, state, rows, strings, ".idhash")
        except BaseException:
            store.texts.close()
            raise
        return store

    def load(self, rec: Batch) -> None:
        start = len(self.id_hash)
        self._append(rec.fetched, rec.id_hash, lambda: self.texts.extend_raw(rec.strings, lambda: rec.lengths))
        if isinstance(self.index, BlockIndex):  # (a replay: sorted into runs many batches at a time)
            self.index.add_many(range(start, start + len(rec)), rec.fps, later=True)
        else:
            self.index.add_many(range(start, start + len(rec)), rec.fps)

    def rows(self) -> int:
        """Rows numbered so far, expired ones not yet compacted away included."""
        return len(self.id_hash)

    def expire(self, cutoff: int, since: int = 0) -> bool:
        """Rows from ``since`` on fetched before ``cutoff`` leave the index; once the dead rows
        are a quarter of all, every column is compacted (True then), so the rows held stay
        within 4/3 of the live ones.  Live rows keep their order."""
        old = since + np.flatnonzero(self.fetched.view()[since:] < cutoff)
        if len(old):
            self.index.remove_rows(old)
        if len(self.index) * 4 >= 3 * len(self.id_hash) or not len(old):
            return False
        live = np.flatnonzero(self.index.alive_rows())
        # every file written aside first, then the index renumbered (its new arrays are built
        # before it takes them), then the files renamed: a failure (a full disk, no memory)
        # leaves the strings, the columns and the index as they were, all of them
        staged = []
        try:
            staged.append(self.texts.stage_keep(np.stack((2 * live, 2 * live + 1), axis=1).ravel()))
            staged.append(stage_keep(self.fetched, live))
            staged.append(stage_keep(self.id_hash, live))
            self.index.keep_rows(live)
        except BaseException:
            for s in staged:
                s.discard()
            raise
        _, self.fetched, self.id_hash = (s.commit() for s in staged)
        return True


GroupIndex = HammingIndex | BlockIndex


def _group_index(design: TableDesign, mask: int) -> GroupIndex:
    """A group's index: one table keyed by the group's whole block (Manku's 4-table design) is
    a :class:`BlockIndex` (12 bytes an entry, buckets scanned by popcount); a group of several
    tables (the 16-table design), or keyed by bits a BlockIndex does not take (the 10- and
    20-table designs: two blocks, 33 bits), a :class:`HammingIndex` over them."""
    bits = tuple(i for i in range(64) if mask >> i & 1)
    contiguous = bool(bits) and bits[-1] - bits[0] + 1 == len(bits) and 8 <= len(bits) <= 32
    if design.n_tables == 1 and tuple(design.keys[0]) == bits and contiguous:
        return BlockIndex(mask, k=design.k)
    return HammingIndex(k=design.k, design=design)


def _matched_fps(index: GroupIndex, found) -> np.ndarray:
    """The stored fingerprints of ``found``'s rows: given with the matches, or read by row."""
    if found.fingerprint is not None:
        return found.fingerprint
    assert isinstance(index, HammingIndex)
    return index.fingerprints()[found.row]


def _read_snapshot(path: os.PathLike[str] | str) -> tuple[dict[str, np.ndarray], dict]:
    try:
        with open(path, "rb") as f:
            zipped = f.read(2) == b"PK"
        if not zipped:
            return read_arrays(path)
        data = np.load(os.fspath(path), allow_pickle=False)  # the format before snapshot_file
        arrays = {k: data[k] for k in data.files}
        return arrays, json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"cannot read the shard snapshot {path}: {e}") from None


_NEVER = np.iinfo(np.int64).min  # a cutoff that expires nothing


def clock_values(fetched: np.ndarray, now: int | None) -> np.ndarray:
    """What stored rows move a shard's retention clock to: their fetch times (ms), but never past
    ``now`` (the wall clock when they were stored; None: no bound), so one page from a crawler
    with a wrong clock ("fetched" in 2100) cannot expire the whole index; never below 0.  Written
    in the changelog rows' ``request`` field, so that a replay moves the clock the same way."""
    values = np.asarray(fetched, dtype=np.int64)
    if now is not None:
        values = np.minimum(values, now)
    return np.maximum(values, 0)


def restored_clock_values(rows: Batch) -> np.ndarray:
    """The clock values of changelog rows: their ``request`` field, or for rows written before it
    held one (0), their fetch time."""
    written = rows.rows["request"].astype(np.int64)
    return np.where(written > 0, written, np.maximum(rows.fetched, 0))


def _unchanging(store: Store) -> set[str]:
    """The names in ``store.state()`` of arrays that are never written in place afterwards: a
    BlockIndex's runs (fingerprints' halves, rows, directories), the bulk of a shard's snapshot."""
    if not isinstance(store, _GroupStore) or not isinstance(store.index, BlockIndex):
        return set()
    runs = store.index.runs
    return {f"index.{kind}{i}" for kind in ("hi", "lo", "rows", "dir") for i in range(runs)}


def _rows(store: Store) -> int:
    return store.rows()


def _expire(store: Store, cutoff: int, since: int = 0) -> bool:
    return store.expire(cutoff, since)


def _renew(store: Store, retention: int) -> None:
    """Put a store under a retention: a re-crawl is stored anew once its copy is half of it old."""
    store.renew = max(1, retention // 2)


class _Records:
    """The changelog records that hold a shard's live rows: each record's key (the worker's keys
    are 20 bytes: partition, writer, sequence) and the newest fetch time of its rows, in numpy
    arrays (28 bytes a record).  A record is deleted only when that newest time has expired, so
    never while it holds a live row."""

    KEY_BYTES = 20
    KEY = np.dtype(f"V{KEY_BYTES}")

    def __init__(self) -> None:
        self.keys, self.newest = GrowingArray(np.uint8, (self.KEY_BYTES,)), GrowingArray(np.int64)

    def __len__(self) -> int:
        return len(self.newest)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.newest.nbytes

    def add(self, key: bytes, newest: int) -> None:
        self.keys.extend(np.frombuffer(key, dtype=np.uint8).reshape(1, -1))
        self.newest.extend(np.array([newest], dtype=np.int64))

    def expire(self, cutoff: int) -> list[bytes]:
        """Drop the records whose rows are all older than ``cutoff``; their keys."""
        old = self.newest.view() < cutoff
        if not old.any():
            return []
        out = [k.tobytes() for k in self.keys.view()[old]]
        self._keep(~old)
        return out

    def drop(self, keys: list[bytes]) -> None:
        wanted = np.frombuffer(b"".join(k for k in keys if len(k) == self.KEY_BYTES), self.KEY)
        gone = np.isin(np.ascontiguousarray(self.keys.view()).view(self.KEY).ravel(), wanted)
        if gone.any():
            self._keep(~gone)

    def _keep(self, mask: np.ndarray) -> None:
        self.keys = GrowingArray.of(self.keys.view()[mask])
        self.newest = GrowingArray.of(self.newest.view()[mask])

    def state(self) -> dict[str, np.ndarray]:
        return {"records.keys": self.keys.view(), "records.newest": self.newest.view()}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray]) -> _Records:
        out = cls()
        if "records.keys" in arrays:
            out.keys.extend(np.asarray(arrays["records.keys"], dtype=np.uint8).reshape(-1, cls.KEY_BYTES))
            out.newest.extend(np.asarray(arrays["records.newest"], dtype=np.int64))
        return out

    @classmethod
    def as_keys(cls, keys: list[bytes]) -> np.ndarray:
        return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, cls.KEY_BYTES).copy()

    @classmethod
    def from_keys(cls, array: np.ndarray | None) -> list[bytes]:
        return (
            [] if array is None else [k.tobytes() for k in np.asarray(array, dtype=np.uint8).reshape(-1, cls.KEY_BYTES)]
        )
