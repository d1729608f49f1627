"""The index sharded across a consumer group: global answers from partitioned state.

A page must be compared with every earlier page, whichever worker saw it.  Manku's design
gives the sharding: two fingerprints within k bits agree on every bit of at least one
*group* (for 4 x 4: one of the four 16-bit blocks), so a probe for each group, routed by the
value of that group's bits, meets every near neighbour in some shard::

    page fingerprint F --> probe (group 0, F & mask0) --> partition mix64(...) % P --+
                       --> probe (group 1, F & mask1) --> ...                       |
                       --> ...                                                      v
    shard (partition p): for each group, the group's tables only   probe, then insert
    answers (one per group) --> best of them --> the page's verdict

A shard keeps one :class:`~streamdedup.index.hamming.HammingIndex` per group, over the group's tables,
plus what an answer must tell about a stored page: its fingerprint, its order key, a hash of
its id, and its id and URL (in a byte heap, not one Python object per page).

Rules, the same in every shard so verdicts do not depend on the number of workers:

* **Earlier** means a smaller order key ``(fetched_at, id hash)``: a page never matches a
  later page, so of two near-duplicates only the later is flagged, whichever arrives first.
* **Never itself**: a stored page with the same id hash is not a match (a re-fetch, or a
  replay after a crash, does not find its own earlier insert).
* **Idempotent inserts**: a page whose id and fingerprint are already stored in the shard is
  not stored again, so replays do not grow the index.
* The best match is the nearest, then the earliest.

This module imports nothing from faust or aiokafka; the stream layer moves its inputs and
outputs through Kafka.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field

import numpy as np

from streamdedup.fingerprinting.features import mix64
from streamdedup.fingerprinting.simhash import hamming_many
from streamdedup.index.arrays import GrowingArray
from streamdedup.index.hamming import HammingIndex
from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.wire import Batch

__all__ = ["ShardPlan", "Shard", "Answers", "StringHeap"]

_PARTITION_SEED = np.uint64(0x5EED_5A4D)
_GROUP_SPREAD = np.uint64(0x9E3779B97F4A7C15)


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
        groups = self.design.groups()
        masks = np.array([sum(1 << b for b in bits) for bits, _ in groups], dtype=np.uint64)
        object.__setattr__(self, "masks", masks)
        object.__setattr__(self, "tables", tuple(t for _, t in groups))

    @property
    def n_groups(self) -> int:
        return len(self.tables)

    def probes(self, fps: np.ndarray) -> np.ndarray:
        """Partition of each (page, group) probe, shape (n, n_groups).

        The partition is a hash of (group, the fingerprint's bits in the group): part of the
        stored format, since a shard's state is only findable through it.
        """
        fps = np.asarray(fps, dtype=np.uint64)
        groups = np.arange(self.n_groups, dtype=np.uint64)
        keys = (fps[:, None] & self.masks[None, :]) ^ ((groups + np.uint64(1)) * _GROUP_SPREAD)[None, :]
        return (mix64(keys ^ _PARTITION_SEED) % np.uint64(self.partitions)).astype(np.int64)

    def group_design(self, group: int) -> TableDesign:
        return self.design.restricted(self.tables[group])


class StringHeap:
    """Append-only strings in one bytearray with numpy offsets: no object per string.

    >>> h = StringHeap(); h.extend(["a", "Ωb"]); h[1], len(h)
    ('Ωb', 2)
    """

    def __init__(self) -> None:
        self._data = bytearray()
        self._ends = np.zeros(1024, dtype=np.int64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        return len(self._data) + self._ends.nbytes

    def extend(self, values: list[str]) -> None:
        if self._n + len(values) > len(self._ends):
            self._ends = np.resize(self._ends, max(self._n + len(values), 2 * len(self._ends)))
        for v in values:
            self._data += v.encode("utf-8", "surrogatepass")
            self._ends[self._n] = len(self._data)
            self._n += 1

    def extend_raw(self, blob: bytes, lengths: np.ndarray) -> None:
        """Append strings given as one UTF-8 blob and their byte lengths (no decoding)."""
        ends = len(self._data) + np.cumsum(lengths)
        if self._n + len(ends) > len(self._ends):
            self._ends = np.resize(self._ends, max(self._n + len(ends), 2 * len(self._ends)))
        self._data += blob
        self._ends[self._n : self._n + len(ends)] = ends
        self._n += len(ends)

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < self._n:
            raise IndexError(i)
        start = int(self._ends[i - 1]) if i else 0
        return self._data[start : int(self._ends[i])].decode("utf-8", "surrogatepass")


@dataclass
class Answers:
    """One shard's answers to a batch of probes, aligned with the probes.

    ``row`` is -1 where nothing earlier is within k bits; otherwise the match's fields.
    """

    distance: np.ndarray  # int64, -1 when no match
    fingerprint: np.ndarray  # uint64 of the match
    fetched: np.ndarray  # int64 order key of the match
    id_hash: np.ndarray  # uint64 of the match
    ids: list[str | None]
    urls: list[str | None]
    stored: np.ndarray  # bool: the probe's page was stored (write it to the changelog)


class Shard:
    """One partition of the sharded index: the tables of every group routed to it."""

    def __init__(self, plan: ShardPlan) -> None:
        self.plan = plan
        self._groups: dict[int, _GroupStore] = {}

    def __len__(self) -> int:
        """Stored (page, group) entries."""
        return sum(len(g.index) for g in self._groups.values())

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self._groups.values())

    def probe_and_insert(
        self,
        group: np.ndarray,
        fps: np.ndarray,
        fetched: np.ndarray,
        id_hash: np.ndarray,
        ids: list[str],
        urls: list[str],
        store: bool = True,
    ) -> Answers:
        """Answer a batch of probes in order, then store the pages (see the module's rules).

        ``store=False``: only answer, against the stored pages (a synchronous check)."""
        n = len(fps)
        out = Answers(
            np.full(n, -1, np.int64),
            np.zeros(n, np.uint64),
            np.zeros(n, np.int64),
            np.zeros(n, np.uint64),
            [None] * n,
            [None] * n,
            np.zeros(n, dtype=bool),
        )
        group, insert = np.asarray(group, dtype=np.int64), store
        for g in np.unique(group).tolist():
            sel = np.flatnonzero(group == g)
            store = self._groups.get(g)
            if store is None:
                store = self._groups[g] = _GroupStore(self.plan.group_design(g))
            store.probe_and_insert(
                sel, fps[sel], fetched[sel], id_hash[sel], [ids[i] for i in sel], [urls[i] for i in sel], out, insert
            )
        return out

    def save(self, path: os.PathLike[str] | str, meta: dict | None = None) -> None:
        """Write the shard to ``path`` (an uncompressed .npz, replaced atomically), with
        ``meta`` (JSON-able: e.g. the changelog offset the snapshot covers)."""
        arrays: dict[str, np.ndarray] = {
            "meta": np.array(json.dumps(meta or {})),
            "plan": np.array([self.plan.partitions, *self.plan.design.levels]),
        }
        for g, store in self._groups.items():
            for name, value in store.state().items():
                arrays[f"g{g}.{name}"] = value
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: os.PathLike[str] | str, plan: ShardPlan) -> tuple[Shard, dict]:
        """Read a shard written by :meth:`save`; returns it and its ``meta``.

        Raises ValueError if the file was written for another shard plan or is damaged.
        """
        try:
            data = np.load(os.fspath(path), allow_pickle=False)
            arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise ValueError(f"cannot read the shard snapshot {path}: {e}") from None
        if arrays.get("plan") is None or arrays["plan"].tolist() != [plan.partitions, *plan.design.levels]:
            raise ValueError(f"the shard snapshot {path} was written for another shard plan")
        shard = cls(plan)
        groups: dict[int, dict[str, np.ndarray]] = {}
        for key, value in arrays.items():
            if key.startswith("g"):
                g, name = key[1:].split(".", 1)
                groups.setdefault(int(g), {})[name] = value
        for g, state in groups.items():
            shard._groups[g] = _GroupStore.from_state(state)
        return shard, json.loads(str(arrays["meta"]))

    def restore(self, inserts: Batch) -> None:
        """Store decoded changelog rows as they are (recovery: no probing, no checks)."""
        for g in np.unique(inserts.group).tolist():
            store = self._groups.get(g)
            if store is None:
                store = self._groups[g] = _GroupStore(self.plan.group_design(g))
            store.load(inserts.select(inserts.group == g))


class _GroupStore:
    def __init__(self, design: TableDesign) -> None:
        self.index = HammingIndex(k=design.k, design=design)
        self.fps, self.fetched, self.id_hash = GrowingArray(np.uint64), GrowingArray(np.int64), GrowingArray(np.uint64)
        self.texts = StringHeap()  # id of row r at 2r ("" when it is the url), its url at 2r + 1

    @property
    def nbytes(self) -> int:
        cols = (self.fps, self.fetched, self.id_hash)
        return self.index.nbytes + sum(c.nbytes for c in cols) + self.texts.nbytes

    def probe_and_insert(self, sel, fps, fetched, id_hash, ids, urls, out: Answers, insert: bool = True) -> None:
        found = self.index.search(fps)  # rows stored before this batch
        q, row, dist = found.query, found.row, found.distance
        # pages of this batch count too (when they are stored): compare the batch with itself
        bq, br = np.nonzero(_pairwise_within(fps, self.index.k)) if insert else (q[:0], q[:0])
        q = np.concatenate((q, bq))
        dist = np.concatenate((dist, _popcount(fps[bq] ^ fps[br])))
        row_fetched = np.concatenate((self.fetched.view()[row], fetched[br]))
        row_hash = np.concatenate((self.id_hash.view()[row], id_hash[br]))
        row_fp = np.concatenate((self.fps.view()[row], fps[br]))
        ref = np.concatenate((row, -1 - br))  # >= 0 stored row, < 0 batch position
        # already stored: same id and same fingerprint (a replay) -> do not store again
        dup = np.zeros(len(fps), dtype=bool)
        dup[q[(ref >= 0) & (dist == 0) & (row_hash == id_hash[q])]] = True
        earlier = (row_fetched < fetched[q]) | ((row_fetched == fetched[q]) & (row_hash < id_hash[q]))
        keep = earlier & (row_hash != id_hash[q])
        q, dist, row_fetched, row_hash, row_fp, ref = (a[keep] for a in (q, dist, row_fetched, row_hash, row_fp, ref))
        order = np.lexsort((row_hash, row_fetched, dist, q))  # nearest, then earliest
        first = order[np.r_[True, q[order][1:] != q[order][:-1]]] if len(order) else order
        for i in first.tolist():
            p = int(sel[q[i]])
            out.distance[p], out.fingerprint[p] = dist[i], row_fp[i]
            out.fetched[p], out.id_hash[p] = row_fetched[i], row_hash[i]
            r = int(ref[i])
            local = -1 - r
            out.ids[p] = (self.texts[2 * r] or self.texts[2 * r + 1]) if r >= 0 else ids[local]
            out.urls[p] = self.texts[2 * r + 1] if r >= 0 else urls[local]
        if not insert:
            return
        # store the new pages once each (a page repeated inside the batch too)
        first_in_batch = _first_occurrence(id_hash, fps)
        new = np.flatnonzero(~dup & first_in_batch)
        out.stored[sel[new]] = True
        if len(new):
            start = len(self.fps)
            self.index.add_many(list(range(start, start + len(new))), fps[new])
            self.fps.extend(fps[new])
            self.fetched.extend(fetched[new])
            self.id_hash.extend(id_hash[new])
            # an id equal to its url (the default) is stored as "" (ids are never empty)
            self.texts.extend([x for i in new.tolist() for x in ("" if ids[i] == urls[i] else ids[i], urls[i])])

    def state(self) -> dict[str, np.ndarray]:
        out = {f"index.{k}": v for k, v in self.index.state().items()}
        out.update(
            {
                "fps": self.fps.view(),
                "fetched": self.fetched.view(),
                "id_hash": self.id_hash.view(),
                "texts": np.frombuffer(bytes(self.texts._data), dtype=np.uint8),
                "text_ends": self.texts._ends[: len(self.texts)],
            }
        )
        return out

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> _GroupStore:
        store = cls.__new__(cls)
        store.index = HammingIndex.from_state({k[6:]: v for k, v in state.items() if k.startswith("index.")})
        store.fps, store.fetched, store.id_hash = (
            GrowingArray(np.uint64),
            GrowingArray(np.int64),
            GrowingArray(np.uint64),
        )
        store.fps.extend(state["fps"])
        store.fetched.extend(state["fetched"])
        store.id_hash.extend(state["id_hash"])
        store.texts = StringHeap()
        ends = state["text_ends"]
        store.texts.extend_raw(state["texts"].tobytes(), np.diff(ends, prepend=0))
        return store

    def load(self, rec: Batch) -> None:
        start = len(self.fps)
        self.index.add_many(range(start, start + len(rec)), rec.fps)
        self.fps.extend(rec.fps)
        self.fetched.extend(rec.fetched)
        self.id_hash.extend(rec.id_hash)
        self.texts.extend_raw(rec.strings, rec.lengths)


def _popcount(x: np.ndarray) -> np.ndarray:
    return hamming_many(np.uint64(0), x)


def _pairwise_within(fps: np.ndarray, k: int) -> np.ndarray:
    """Boolean (n, n) matrix: batch pages i, j within k bits, i != j."""
    d = _popcount(fps[:, None] ^ fps[None, :])
    np.fill_diagonal(d, k + 1)
    return d <= k


def _first_occurrence(id_hash: np.ndarray, fps: np.ndarray) -> np.ndarray:
    """True for the first of the batch's probes with each (id hash, fingerprint)."""
    pairs = np.stack((id_hash, fps), axis=1)
    _, first = np.unique(pairs, axis=0, return_index=True)
    mask = np.zeros(len(fps), dtype=bool)
    mask[first] = True
    return mask
