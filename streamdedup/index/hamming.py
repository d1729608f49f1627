"""The Hamming-distance index: every stored fingerprint within ``k`` bits of a query, exactly.

Layout (Manku et al. 2007, with the tables kept as sorted numpy runs)::

    row r:   fps[r] (uint64)   alive[r] (bool)   ids[r]          one row per added fingerprint
    run:     entries uint64[T*n] sorted: key << 32 | row, where key is the uint32
                     table << (32-t) | table key (see tables.py)
             dir     bucket offsets, bucket = key * n_buckets >> 32 (~3 keys a bucket)

A query packs its T table keys, looks each up in every run through the bucket directory
(no binary search over hundreds of millions of keys), keeps the exact key matches, and checks
those candidates' real distance against ``fps``: the result is exactly the stored
fingerprints within ``k`` bits.  The T tables of one run share one array because the table
number sits in the top bits of the key.

Inserts are log-structured: a batch becomes a small sorted run, and the newest run is merged
into the one before it while it is at least a quarter of its size (or that run is small), so
there are O(log n) runs and each entry is copied O(log n) times, by linear merges (numpy's stable sort is
timsort, which merges two sorted runs in linear time).  Small runs are
binary-searched; big ones get their directory on first use.
``remove`` marks a row dead; dead rows are dropped when they are half of all rows.

>>> idx = HammingIndex(k=3)
>>> idx.add_many(["a", "b", "c"], [0b0000, 0b0111, 0b1111_0000])
>>> idx.query(0b0001)
[('a', 1), ('b', 2)]
>>> idx.remove("a"), len(idx)
(True, 2)
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from streamdedup.fingerprinting.simhash import hamming_many
from streamdedup.index.arrays import GrowingArray
from streamdedup.index.tables import TableDesign

__all__ = ["HammingIndex", "Matches"]


@dataclass(frozen=True)
class Matches:
    """Flat query results, sorted by (query, distance, row): ``query[i]`` matched ``row[i]``."""

    query: np.ndarray  # int64 index into the queried batch
    row: np.ndarray  # int64 row in the index
    distance: np.ndarray  # int64
    #: the matched stored fingerprints (uint64), when the index keeps them with its entries
    fingerprint: np.ndarray | None = None


class _Run:
    """One sorted run of entries ``key << 32 | row`` (uint64), with a bucket directory."""

    __slots__ = ("_buckets", "_dir", "entries")

    #: Runs smaller than this are binary-searched: they sit in cache anyway.
    DIRECTORY_MIN = 1 << 16
    #: Entries per directory bucket on average: 1.33 bytes of directory per entry.
    PER_BUCKET = 3

    def __init__(self, entries: np.ndarray, directory: np.ndarray | None = None) -> None:
        self.entries = entries
        self._dir: np.ndarray | None = None
        self._buckets = np.uint64(1)
        # a saved directory is used if it is the one _directory() would build (else rebuilt)
        if directory is not None and len(directory) == max(1, len(entries) // self.PER_BUCKET) + 1:
            if int(directory[-1]) == len(entries) and int(directory[0]) == 0:
                self._dir, self._buckets = directory, np.uint64(len(directory) - 1)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        return self.entries.nbytes + (0 if self._dir is None else self._dir.nbytes)

    def _bucket(self, keys: np.ndarray) -> np.ndarray:
        """Bucket of uint64 keys (< 2**32): ``key * buckets >> 32``, monotone in the key, so
        any number of buckets works and the directory costs the same at every size."""
        return (keys * self._buckets) >> np.uint64(32)

    def _directory(self) -> np.ndarray:
        """Offsets of the keys' buckets, built on first use by one counting pass over the
        sorted entries (no binary search per bucket)."""
        if self._dir is None:
            n = len(self.entries)
            nb = max(1, n // self.PER_BUCKET)
            self._buckets = np.uint64(nb)
            offsets = np.zeros(nb + 1, dtype=np.int64)
            chunk = 1 << 22
            for start in range(0, n, chunk):
                buckets = self._bucket(self.entries[start : start + chunk] >> np.uint64(32)).astype(np.intp)
                offsets[1:] += np.bincount(buckets, minlength=nb)
            np.cumsum(offsets, out=offsets)
            self._dir = offsets.astype(np.uint32) if n < 2**32 else offsets
        return self._dir

    def prepare(self) -> None:
        """Build the bucket directory now rather than on the first lookup."""
        if len(self.entries) >= self.DIRECTORY_MIN:
            self._directory()

    def lookup(self, needles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(needle index, row) for every entry whose key equals a needle (uint32 keys)."""
        wide = needles.astype(np.uint64) << np.uint64(32)
        if len(self.entries) < self.DIRECTORY_MIN:
            lo = np.searchsorted(self.entries, wide, side="left")
            counts = np.searchsorted(self.entries, wide | np.uint64(0xFFFFFFFF), side="right") - lo
        else:
            directory = self._directory()
            bucket = self._bucket(needles.astype(np.uint64))
            lo = directory[bucket].astype(np.int64)
            counts = directory[bucket + np.uint64(1)].astype(np.int64) - lo
        total = int(counts.sum())
        if total == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        which = np.repeat(np.arange(len(needles)), counts)
        # position = lo of its needle + rank within that needle's range
        pos = np.arange(total) - np.repeat(np.cumsum(counts) - counts - lo, counts)
        found = self.entries[pos]
        hit = (found >> np.uint64(32)) == needles[which]
        return which[hit], (found[hit] & np.uint64(0xFFFFFFFF)).astype(np.int64)

    @staticmethod
    def merge(old: _Run, new: _Run) -> _Run:
        """Two sorted runs into one: numpy's stable sort is timsort, linear on two runs."""
        entries = np.concatenate((old.entries, new.entries))
        entries.sort(kind="stable")
        return _Run(entries)


class HammingIndex:
    """Stored 64-bit fingerprints, searchable by Hamming distance <= ``k``.

    ``design`` picks the tables: a :class:`TableDesign`, a name ("16", "20", "10", "4") for
    k = 3, or ``None`` for the default (4 x 4 = 16 tables for k = 3, one table for k = 0,
    (k+1, k+1) blocks otherwise).
    Ids may be any hashable values; an id added twice is stored twice.
    """

    #: A new run is merged into the one before it while it is at least 1/MERGE_RATIO of its
    #: size: 1 is a binary counter; 4 measured best at 10M fingerprints (bench/index_bench.py).
    MERGE_RATIO = 4
    #: Runs below this many entries are merged into the next run at once: each costs a
    #: binary search per query, and merging them is cheap.
    SMALL_RUN = 1 << 18

    def __init__(self, k: int = 3, design: TableDesign | str | None = None) -> None:
        if isinstance(design, str):
            design = TableDesign.named(design, k=k)
        elif design is None:
            design = TableDesign(k=k, levels=_default_levels(k))
        if design.k != k:
            raise ValueError(f"design is for k={design.k} but the index was asked for k={k}")
        self.k, self.design = k, design
        self._fps = np.empty(1024, dtype=np.uint64)
        self._alive = np.zeros(1024, dtype=bool)
        self._ids = _Ids()
        self._n = 0  # rows used
        self._dead = 0
        self._runs: list[_Run] = []

    # ---------------------------------------------------------------- size
    def __len__(self) -> int:
        return self._n - self._dead

    @property
    def rows(self) -> int:
        """Rows numbered so far, removed ones included (as :attr:`BlockIndex.rows`)."""
        return self._n

    @property
    def table_nbytes(self) -> int:
        """Bytes held by the permuted tables (keys, rows and bucket directories)."""
        return sum(run.nbytes for run in self._runs)

    @property
    def nbytes(self) -> int:
        """Bytes held: tables, fingerprints, the alive mask and the ids.

        Integer ids are kept in a numpy column (8 bytes each); other ids (strings...) are the
        caller's Python objects, counted here as an 8-byte reference each.
        """
        return self.table_nbytes + self._fps.nbytes + self._alive.nbytes + self._ids.nbytes

    # -------------------------------------------------------------- writes
    def add(self, id: Hashable, fingerprint: int) -> None:
        """Store one fingerprint."""
        self.add_many([id], [fingerprint])

    def add_many(self, ids: Sequence[Hashable], fingerprints: Iterable[int] | np.ndarray) -> None:
        """Store a batch of fingerprints under the given ids."""
        fps = _as_fps(fingerprints)
        if len(ids) != len(fps):
            raise ValueError(f"got {len(ids)} ids for {len(fps)} fingerprints; pass one id each")
        m = len(fps)
        if m == 0:
            return
        self._reserve(self._n + m)
        start = self._n
        self._fps[start : start + m] = fps
        self._alive[start : start + m] = True
        self._ids.extend(ids)
        self._n += m
        self._runs.append(self._build_run(fps, np.arange(start, start + m, dtype=np.uint32)))
        while len(self._runs) >= 2 and (
            self.MERGE_RATIO * len(self._runs[-1]) >= len(self._runs[-2]) or len(self._runs[-2]) < self.SMALL_RUN
        ):
            new = self._runs.pop()
            self._runs[-1] = _Run.merge(self._runs[-1], new)

    def remove(self, id: Hashable) -> bool:
        """Forget every fingerprint stored under ``id``; True if there was one.

        Costs a scan of the ids (O(n), vectorised for integer ids); dead rows are dropped once
        they are half of all rows.
        """
        rows = self._ids.rows_of(id)
        rows = rows[self._alive[rows]]
        if not len(rows):
            return False
        self._alive[rows] = False
        self._dead += len(rows)
        if self._dead * 2 > self._n:
            self._compact()
        return True

    def remove_rows(self, rows: np.ndarray) -> int:
        """Mark rows (from :meth:`search`) dead, with no compaction: the caller that keeps columns
        parallel to the rows compacts them together (:meth:`keep_rows`).  Returns how many died."""
        rows = np.asarray(rows, dtype=np.int64)
        rows = np.unique(rows[self._alive[rows]])
        self._alive[rows] = False
        self._dead += len(rows)
        return len(rows)

    def alive_rows(self) -> np.ndarray:
        """The alive mask by row (a view: valid until the next add)."""
        return self._alive[: self._n]

    def keep_rows(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (ascending), renumbered 0..len-1 in their order, in fresh arrays of
        their size: the memory of the others is returned.  Ids that were the row numbers stay so."""
        rows = np.asarray(rows, dtype=np.int64)
        # each run filtered and its rows renumbered: the order of key << 32 | row is kept (the
        # renumbering is monotone), so nothing is sorted again; done in chunks to bound the copies
        new_row = np.full(self._n, -1, dtype=np.int64)
        new_row[rows] = np.arange(len(rows))
        runs, chunk, high = [], 1 << 22, np.uint64(0xFFFFFFFF_00000000)
        for run in self._runs:
            parts = []
            for at in range(0, len(run.entries), chunk):
                entries = run.entries[at : at + chunk]
                renumbered = new_row[(entries & np.uint64(0xFFFFFFFF)).astype(np.int64)]
                kept = renumbered >= 0
                parts.append((entries[kept] & high) | renumbered[kept].astype(np.uint64))
            entries = np.concatenate(parts) if parts else np.empty(0, np.uint64)
            if len(entries):
                runs.append(_Run(entries))
        fps = self._fps[rows].copy()
        self._ids = _Ids(rows=len(rows)) if self._ids.identity else self._ids.keep(rows)
        self._n, self._dead = len(rows), 0
        self._fps = fps if len(fps) else np.empty(1024, dtype=np.uint64)
        self._alive = np.ones(max(len(rows), len(self._fps)), dtype=bool)
        self._alive[self._n :] = False
        self._runs = runs

    # --------------------------------------------------------------- reads
    def prepare(self) -> None:
        """Build every run's lookup directory now (queries build them lazily otherwise)."""
        for run in self._runs:
            run.prepare()

    def search(self, fingerprints: Iterable[int] | np.ndarray, k: int | None = None) -> Matches:
        """All (query, row, distance) with distance <= ``k`` (default: the index's k).

        A smaller ``k`` than the index's is allowed; a larger one would not be exact.
        """
        k = self.k if k is None else k
        if not 0 <= k <= self.k:
            raise ValueError(f"this index answers k in 0..{self.k}, got k={k}")
        fps = _as_fps(fingerprints)
        empty = np.empty(0, np.int64)
        if len(fps) == 0 or not self._runs:
            return Matches(empty, empty, empty)
        needles = self.design.packed_keys(fps).ravel()  # table-major: needle i -> query i % q
        # Sorted needles walk every run's directory and entries in address order.
        order = np.argsort(needles)
        needles = needles[order]
        found_q, found_r = [], []
        for run in self._runs:
            which, rows = run.lookup(needles)
            found_q.append(order[which] % len(fps))
            found_r.append(rows)
        pair = np.unique((np.concatenate(found_q) << 32) | np.concatenate(found_r))
        query, row = pair >> 32, pair & 0xFFFFFFFF
        dist = hamming_many(fps[query], self._fps[row])
        keep = (dist <= k) & self._alive[row]
        query, row, dist = query[keep], row[keep], dist[keep]
        order = np.lexsort((row, dist, query))
        return Matches(query[order], row[order], dist[order])

    def query_many(
        self, fingerprints: Iterable[int] | np.ndarray, k: int | None = None
    ) -> list[list[tuple[Hashable, int]]]:
        """For each fingerprint, its (id, distance) matches, nearest first (then oldest)."""
        fps = _as_fps(fingerprints)
        found = self.search(fps, k)
        out: list[list[tuple[Hashable, int]]] = [[] for _ in range(len(fps))]
        for q, i, d in zip(found.query.tolist(), self._ids.lookup(found.row), found.distance.tolist()):
            out[q].append((i, d))
        return out

    def query(self, fingerprint: int, k: int | None = None) -> list[tuple[Hashable, int]]:
        """The (id, distance) of every stored fingerprint within ``k`` bits, nearest first."""
        return self.query_many([fingerprint], k)[0]

    def fingerprints(self) -> np.ndarray:
        """The stored fingerprints by row, removed rows included (a view: valid until the next add)."""
        return self._fps[: self._n]

    def id_of(self, row: int) -> Hashable:
        """The id stored at a row returned by :meth:`search`."""
        return self._ids[row]

    # ------------------------------------------------------------ snapshots
    def state(self) -> dict[str, np.ndarray]:
        """The index as arrays, for a snapshot (integer ids only; runs kept as they are)."""
        if self._ids._objects is not None:
            raise ValueError("only an index with integer ids can be snapshotted")
        out = {
            "fps": self._fps[: self._n],
            "alive": self._alive[: self._n],
            # ids that are the row numbers (a shard's) are not written: the array would say nothing
            "ids": np.empty(0, np.int64) if self._ids.identity else self._ids.ints(),
            "ids_are_rows": np.array(self._ids.identity),
            "k": np.array(self.k),
            "levels": np.array(self.design.levels),
            "only": np.array(self.design.only if self.design.only is not None else [], dtype=np.int64),
        }
        for i, run in enumerate(self._runs):
            out[f"run{i}"] = run.entries
            if run._dir is not None:  # saved, so that a loaded index answers without a counting pass
                out[f"dir{i}"] = run._dir
        return out

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> HammingIndex:
        """Rebuild an index from :meth:`state` without sorting anything again."""
        only = tuple(state["only"].tolist()) or None
        design = TableDesign(k=int(state["k"]), levels=tuple(state["levels"].tolist()), only=only)
        idx = cls(k=design.k, design=design)
        n = len(state["fps"])
        # taken over when they can be (a snapshot's arrays are read fresh), else copied
        idx._fps, idx._alive = _owned(state["fps"], np.uint64), _owned(state["alive"], bool)
        rows = "ids_are_rows" in state and bool(state["ids_are_rows"])
        idx._ids = _Ids(rows=n) if rows else _Ids(ints=state["ids"])
        idx._n, idx._dead = n, int(n - state["alive"].sum())
        runs = sorted((k for k in state if k.startswith("run")), key=lambda k: int(k[3:]))
        idx._runs = [_Run(np.asarray(state[k]), state.get(f"dir{k[3:]}")) for k in runs]
        return idx

    # ------------------------------------------------------------ internals
    def _build_run(self, fps: np.ndarray, rows: np.ndarray) -> _Run:
        entries = self.design.packed_keys(fps).ravel().astype(np.uint64) << np.uint64(32)
        entries |= np.tile(rows.astype(np.uint64), self.design.n_tables)
        entries.sort()
        return _Run(entries)

    def _reserve(self, n: int) -> None:
        if n <= len(self._fps):
            return
        cap = max(n, len(self._fps) * 3 // 2)
        self._fps = np.resize(self._fps, cap)
        alive = np.zeros(cap, dtype=bool)
        alive[: self._n] = self._alive[: self._n]
        self._alive = alive

    def _compact(self) -> None:
        live = np.flatnonzero(self._alive[: self._n])
        fps = self._fps[live].copy()
        self._ids = self._ids.keep(live)
        self._n, self._dead = len(live), 0
        self._fps[: self._n] = fps
        self._alive[:] = False
        self._alive[: self._n] = True
        self._runs = [self._build_run(fps, np.arange(self._n, dtype=np.uint32))] if self._n else []


class _Ids:
    """Ids by row: nothing while every id is its own row number (``add_many(range(n, n + m), ...)``,
    as the shards do), a numpy int64 column while every id is an int, a list once one is not."""

    def __init__(self, ints: np.ndarray | None = None, objects: list | None = None, rows: int | None = None) -> None:
        self._rows = rows if ints is None and objects is None else None  # identity: row r has id r
        if self._rows is None and ints is None and objects is None:
            self._rows = 0
        self._ints = GrowingArray(np.int64)
        if ints is not None:
            self._ints.extend(ints)
        self._objects = objects

    def __len__(self) -> int:
        if self._rows is not None:
            return self._rows
        return len(self._objects) if self._objects is not None else len(self._ints)

    @property
    def identity(self) -> bool:
        return self._rows is not None

    @property
    def nbytes(self) -> int:
        if self._rows is not None:
            return 0
        return 8 * len(self._objects) if self._objects is not None else self._ints.nbytes

    def extend(self, ids: Sequence[Hashable]) -> None:
        if self._rows is not None:
            if isinstance(ids, range) and ids.start == self._rows and ids.step == 1:
                self._rows += len(ids)
                return
            self._ints.extend(np.arange(self._rows, dtype=np.int64))  # no longer the row numbers
            self._rows = None
        if self._objects is None:
            as_ints = _int_ids(ids)
            if as_ints is not None:
                self._ints.extend(as_ints)
                return
            self._objects = self._ints.view().tolist()
        self._objects.extend(ids)

    def __getitem__(self, row: int) -> Hashable:
        if self._rows is not None:
            if not 0 <= row < self._rows:
                raise IndexError(row)
            return row
        return self._objects[row] if self._objects is not None else int(self._ints.view()[row])

    def lookup(self, rows: np.ndarray) -> list[Hashable]:
        if self._rows is not None:
            return np.asarray(rows, dtype=np.int64).tolist()
        if self._objects is not None:
            return [self._objects[r] for r in rows.tolist()]
        return self._ints.view()[rows].tolist()

    def rows_of(self, id: Hashable) -> np.ndarray:
        if self._objects is not None:
            return np.array([r for r, x in enumerate(self._objects) if x == id], dtype=np.int64)
        if _int_ids([id]) is None:
            return np.empty(0, dtype=np.int64)
        if self._rows is not None:
            return np.array([id] if 0 <= int(id) < self._rows else [], dtype=np.int64)  # type: ignore[call-overload]
        return np.flatnonzero(self._ints.view() == id)

    def ints(self) -> np.ndarray:
        return np.arange(self._rows, dtype=np.int64) if self._rows is not None else self._ints.view()

    def keep(self, rows: np.ndarray) -> _Ids:
        if self._objects is not None:
            return _Ids(objects=[self._objects[r] for r in rows.tolist()])
        return _Ids(ints=self.ints()[rows])


def _owned(a: np.ndarray, dtype: type) -> np.ndarray:
    a = np.asarray(a, dtype=dtype)
    return a if a.flags.writeable and a.flags.c_contiguous else a.copy()


def _int_ids(ids: Sequence[Hashable]) -> np.ndarray | None:
    """The ids as int64, or None if any is not an int in range (bools are not ids here)."""
    if isinstance(ids, range):
        return np.arange(ids.start, ids.stop, ids.step, dtype=np.int64)
    if isinstance(ids, np.ndarray):
        return (
            ids.astype(np.int64)
            if ids.dtype.kind in "iu" and (ids.dtype.kind == "i" or ids.max(initial=0) < 2**63)
            else None
        )
    if all(type(i) is int and -(2**63) <= i < 2**63 for i in ids):
        return np.array(ids, dtype=np.int64)
    return None


def _default_levels(k: int) -> tuple[int, ...]:
    """Manku's 4 x 4 for k = 3; one exact-match table for k = 0; (k+1, k+1) otherwise."""
    return (4, 4) if k == 3 else (1,) if k == 0 else (k + 1, k + 1)


def _as_fps(fingerprints: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(fingerprints, np.ndarray):
        if fingerprints.dtype == np.uint64:
            return fingerprints.ravel()
        if fingerprints.dtype.kind not in "iu" or (fingerprints < 0).any():
            raise ValueError("fingerprints must be integers in [0, 2**64)")
        return fingerprints.astype(np.uint64).ravel()
    values = list(fingerprints)
    for v in values:
        if not isinstance(v, (int, np.integer)) or not 0 <= v < 2**64:
            raise ValueError(f"a fingerprint is an int in [0, 2**64), got {v!r}")
    return np.array(values, dtype=np.uint64)
