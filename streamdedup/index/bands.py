"""MinHash LSH bands stored one band per table, so a sharded index can route each band by value.

The stream worker shards simhash tables by block value (:mod:`streamdedup.pipeline.shard`);
LSH bands shard the same way.  A page's MinHash signature (``num_perm`` values) is cut into
``bands`` bands of ``rows`` values; each band's *key* (64 bits) routes one probe to the shard
that owns that key, where a :class:`BandTable` holds the band's stored pages.  Two pages are
candidates in band ``j`` when their band-``j`` keys are equal::

    signature  [ band 0 | band 1 | ... | band b-1 |  sketch (the other num_perm - b*r values) ]
                  key 0    key 1          key b-1     low 4 bits of each: the verifier

**The order rule** (as for simhash, :mod:`streamdedup.engine.order`): a pair's *canonical band*
is the lowest band on which their keys agree; a page is a near-duplicate of a candidate only
if the candidate was stored before it in the canonical band's table.  A row of band ``j``
keeps 32-bit tags (the low bits of its keys) of bands ``0..j-1``, so the table can tell that
no earlier band agrees: then, for every candidate pair, exactly one of the two is flagged,
whatever the arrival order and the partitions (up to a 32-bit tag collision on a band whose
keys differ, about 2**-32 per earlier band).  A table keeps the same 32-bit tag of its own band's
key, not all 64 bits, and finds candidates by it: "agree on a band" means "equal tags" in both
places, so the rule stays consistent, at 4 bytes a row and band instead of 8.  (The full key
still routes the probe.  A tag shared by two of a table's keys only adds a candidate, which the
sketch then checks: about one a probe in 400 at 10 M rows a table.)

**Verification.**  The candidate's *sketch*, the low 4 bits of the signature values outside
the bands, two to a byte (b-bit minwise hashing, Li & Koenig 2010), is compared with the
page's; ``c`` equal values of ``m`` estimate the resemblance as ``(c/m - 1/16) / (1 - 1/16)``,
which must reach the threshold.  (At J = 0.8 four bits give about 8% more variance than eight,
for half the bytes.)  The band positions are left out of the sketch: candidates agree on a whole
band by construction, which would bias the estimate up.  ``verify="combined"`` (Henzinger
2006: shingle candidates filtered by simhash) also needs the two 64-bit simhashes within ``k``
bits.  A candidate's *rank* is what the match minimises: ``m - c`` (minhash) or the Hamming
distance (combined), an integer in both cases, so ``scan`` and the worker order candidates
identically.

>>> s = BandScheme.for_threshold(0.8, num_perm=128)
>>> (s.bands, s.rows, s.sketch), s.min_matches, round(s.similarity(s.min_matches), 3)
((10, 5, 78), 64, 0.809)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from streamdedup.fingerprinting.features import mix64
from streamdedup.fingerprinting.simhash import hamming_many
from streamdedup.index import columns
from streamdedup.index.arrays import GrowingArray, first_occurrences
from streamdedup.index.columns import Column, column_from_state, column_state, new_column, stage_keep
from streamdedup.index.file_array import Staged
from streamdedup.index.lsh import _Run, s_curve

__all__ = ["DEFAULT_NUM_PERM", "VERIFIERS", "BandScheme", "BandTable", "BandMatches"]

VERIFIERS = ("minhash", "combined")
#: The band modes' signature length (``--num-perm``): at threshold 0.8 the bands take 50 values
#: (10 x 5) and the other 462 are the sketch that verifies a candidate.  A longer sketch costs
#: hashing and disk, not memory (a table keeps only its keys' tags in memory); with 128 the
#: estimate's noise at the threshold kept precision at 0.98 (docs/bands.md "Measured").
DEFAULT_NUM_PERM = 512
_U64 = np.uint64
_KEY = np.uint32  # a table keeps the low 32 bits of its band's keys: their tags
_BAND_SALT = np.uint64(0xBA9D_5A17_0F15_EED5)
_MUL = np.uint64(0x9E3779B97F4A7C15)
_SKETCH_BITS = 4
_TAIL_MAX = 4096  # unsorted rows scanned directly before they are sorted into mid
_MID_MIN = 16384  # rows mid may hold before it is merged into base, at least
#: Recall a pair of resemblance exactly ``threshold`` must have of becoming a candidate.
_MIN_CANDIDATE_RECALL = 0.98


@dataclass(frozen=True)
class BandScheme:
    """How signatures become band keys and sketches, and how candidates are verified.

    Part of the stored format: band keys route probes and fill the tables, so a changed scheme
    needs a new index (the worker keeps it in every shard snapshot's plan).
    """

    num_perm: int = 128
    bands: int = 10
    rows: int = 5
    threshold: float = 0.8
    verify: str = "minhash"  # or "combined": the simhash filter too
    k: int = 3  # verify="combined": the largest Hamming distance kept
    sketch: int = field(init=False)

    def __post_init__(self) -> None:
        if self.verify not in VERIFIERS:
            raise ValueError(f"verify must be one of {', '.join(VERIFIERS)}, got {self.verify!r}")
        if not 1 <= self.bands <= 48 or self.rows < 1:
            raise ValueError(f"bands must be 1..48 and rows >= 1, got {self.bands} x {self.rows}")
        if self.bands * self.rows >= self.num_perm:
            raise ValueError(f"{self.bands} bands of {self.rows} leave no sketch in {self.num_perm} permutations")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1 (exclusive), got {self.threshold}")
        object.__setattr__(self, "sketch", self.num_perm - self.bands * self.rows)

    @classmethod
    def for_threshold(cls, threshold: float, num_perm: int = 128, verify: str = "minhash", k: int = 3) -> BandScheme:
        """The narrowest S-curve (most rows per band) whose bands fit in half the permutations
        and make a pair of resemblance ``threshold`` a candidate with probability >= 0.98;
        the other permutations are the sketch.

        >>> s = BandScheme.for_threshold(0.9); s.bands, s.rows
        (7, 8)
        """
        budget = max(2, min(64, num_perm // 2))
        best: tuple[int, int] | None = None
        for r in range(1, budget + 1):
            p = threshold**r
            if p < 1e-9:  # (more rows only need more bands)
                break
            b = math.ceil(math.log(1.0 - _MIN_CANDIDATE_RECALL) / math.log(1.0 - p))
            if b * r <= budget and b <= 48 and s_curve(threshold, b, r) >= _MIN_CANDIDATE_RECALL:
                best = (b, r)
        if best is None:
            raise ValueError(f"no banding of {num_perm} permutations reaches threshold {threshold}; use more")
        return cls(num_perm, best[0], best[1], threshold, verify, k)

    @property
    def min_matches(self) -> int:
        """The fewest equal sketch values whose estimate reaches the threshold."""
        return next(c for c in range(self.sketch + 1) if self.similarity(c) >= self.threshold)

    def similarity(self, matches: int | np.ndarray):
        """Estimated resemblance from the count of equal sketch values (b-bit minwise, b = _SKETCH_BITS = 4)."""
        chance = 2.0**-_SKETCH_BITS
        est = (np.asarray(matches, dtype=np.float64) / self.sketch - chance) / (1.0 - chance)
        est = np.clip(est, 0.0, 1.0)
        return float(est) if est.ndim == 0 else est

    def similarity_of_rank(self, rank: int) -> float | None:
        """The estimated resemblance a match's rank stands for (None when the rank is a distance)."""
        return None if self.verify != "minhash" else round(float(self.similarity(self.sketch - rank)), 4)

    def keys(self, signatures: np.ndarray) -> np.ndarray:
        """(n, num_perm) uint32 signatures -> (n, bands) uint64 band keys (band-salted, mixed)."""
        sigs = np.asarray(signatures, dtype=np.uint32)
        if sigs.ndim != 2 or sigs.shape[1] != self.num_perm:
            raise ValueError(f"signatures must have shape (n, {self.num_perm}), got {sigs.shape}")
        bands = sigs[:, : self.bands * self.rows].reshape(len(sigs), self.bands, self.rows).astype(_U64)
        acc = (np.arange(self.bands, dtype=_U64) + _U64(1)) * _BAND_SALT
        acc = np.broadcast_to(acc, (len(sigs), self.bands)).copy()
        for t in range(self.rows):  # acc = mix(acc * M + v): order-sensitive, every bit mixed
            acc = mix64(acc * _MUL + bands[:, :, t])
        return acc

    @property
    def sketch_bytes(self) -> int:
        return (self.sketch + 1) // 2

    def sketches(self, signatures: np.ndarray) -> np.ndarray:
        """(n, num_perm) signatures -> (n, sketch_bytes) uint8: the low 4 bits of the values after
        the bands, two to a byte (value 2i in the low nibble of byte i; an odd count pads with 0)."""
        sigs = np.asarray(signatures, dtype=np.uint32)
        nib = (sigs[:, self.bands * self.rows :] & np.uint32(0xF)).astype(np.uint8)
        if nib.shape[1] % 2:
            nib = np.concatenate((nib, np.zeros((len(nib), 1), np.uint8)), axis=1)
        return np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4)))

    def matches(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Equal sketch values of each pair of rows of packed sketches ``a`` and ``b``."""
        x = np.bitwise_xor(a, b)
        equal = np.count_nonzero((x & np.uint8(0x0F)) == 0, axis=1) + np.count_nonzero(
            (x & np.uint8(0xF0)) == 0, axis=1
        )
        return equal - (self.sketch % 2)  # (the padding nibble is always equal)

    def extra(self, signatures: np.ndarray) -> np.ndarray:
        """What a probe carries besides the simhash: the band keys, then the sketch, as
        (n, extra_bytes) uint8 rows (see :meth:`split`)."""
        keys = self.keys(signatures)
        parts = [keys.astype("<u8").view(np.uint8).reshape(len(keys), -1), self.sketches(signatures)]
        return np.ascontiguousarray(np.concatenate(parts, axis=1))

    @property
    def extra_bytes(self) -> int:
        return 8 * self.bands + self.sketch_bytes

    def split(self, extra: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The band keys (n, bands) and the packed sketches (n, sketch_bytes), from :meth:`extra` rows."""
        extra = np.asarray(extra, dtype=np.uint8)
        if extra.ndim != 2 or extra.shape[1] != self.extra_bytes:
            raise ValueError(f"band rows must carry {self.extra_bytes} extra bytes, got shape {extra.shape}")
        keys = np.ascontiguousarray(extra[:, : 8 * self.bands]).view("<u8").astype(_U64)
        sketch = np.ascontiguousarray(extra[:, 8 * self.bands :])
        return keys.reshape(len(extra), self.bands), sketch

    def describe(self) -> list[int]:
        """The parameters as integers (a snapshot's plan)."""
        return [
            self.num_perm,
            self.bands,
            self.rows,
            round(self.threshold * 10**6),
            VERIFIERS.index(self.verify),
            self.k,
            _SKETCH_BITS,
        ]


def _equal_pairs(haystack: np.ndarray, needles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(needle index, haystack index) for every equal pair of an unsorted ``haystack``."""
    if not len(haystack) or not len(needles):
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    order = np.argsort(haystack, kind="stable")
    lo = np.searchsorted(haystack[order], needles, "left")
    cnt = np.searchsorted(haystack[order], needles, "right") - lo
    pos = np.arange(int(cnt.sum())) + np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
    return np.repeat(np.arange(len(needles)), cnt), order[pos].astype(np.int64)


def tags(keys: np.ndarray) -> np.ndarray:
    """32-bit tags of band keys: what a row keeps of the earlier bands' keys."""
    return (np.asarray(keys, dtype=_U64) & _U64(0xFFFF_FFFF)).astype(np.uint32)


@dataclass
class BandMatches:
    """One table's answers to a batch of probes, aligned with the probes."""

    rank: np.ndarray  # int64, -1 when the band has no match for the probe
    row: np.ndarray  # int64, the match's row in the table
    new: np.ndarray  # bool: the probe's page was stored (a new row)


class BandTable:
    """The pages stored in one band (of one shard): their band keys' tags, simhash, id hash, the
    tags of their earlier bands' keys and their sketch.  Rows are numbered in store order.

    Keys are found as in :class:`~streamdedup.index.lsh.LSHIndex`: sorted runs (``base``, and
    ``mid`` for recent rows, merged into base past 16 * sqrt(base) rows: O(sqrt n) key moves per
    insert, amortised) plus an unsorted tail of the newest keys.  The runs are the only copy of
    the keys' tags (32 bits, module doc), 12 bytes a row with the row number: with a ``path``,
    the only part of a row held in memory.
    """

    def __init__(self, scheme: BandScheme, band: int, path: str | None = None) -> None:
        if not 0 <= band < scheme.bands:
            raise ValueError(f"band {band} is not one of the scheme's {scheme.bands}")
        self.scheme, self.band, self.path = scheme, band, path
        self.fps, self.id_hash = self._new("fps"), self._new("id_hash")
        self.tags, self.sketch = self._new("tags"), self._new("sketch")
        self._base, self._mid = _Run.empty(_KEY), _Run.empty(_KEY)
        self._tail = GrowingArray(_KEY)  # the keys of the newest rows, unsorted
        self.times: Column | None = None  # fetch times, kept only under a retention (timed())

    # Only the keys (in the runs) are read for every probe; the other columns only for the rows
    # whose key equals a probe's.  With a ``path`` they live in files beside it (``path.fps``,
    # ``.id_hash``, ``.tags``, ``.sketch``, ``.fetched``), not in memory (:mod:`.columns`).
    def _spec(self, name: str) -> tuple[str, str, type, tuple[int, ...]]:
        """A column's name in snapshots, its file's suffix, its dtype and its rows' shape."""
        return {
            "fps": ("fps", ".fps", _U64, ()),
            "id_hash": ("id_hash", ".id_hash", _U64, ()),
            "tags": ("tags", ".tags", np.uint32, (self.band,)),  # (band 0's: no bytes, in memory)
            "sketch": ("sketch", ".sketch", np.uint8, (self.scheme.sketch_bytes,)),
            "times": ("fetched", ".fetched", np.int64, ()),
        }[name]

    def _new(self, name: str) -> Column:
        _, suffix, dtype, shape = self._spec(name)
        return new_column(dtype, self.path, suffix, shape)

    def _columns(self) -> dict[str, Column]:
        out = {"fps": self.fps, "id_hash": self.id_hash, "tags": self.tags, "sketch": self.sketch}
        if self.times is not None:
            out["times"] = self.times
        return out

    @property
    def file_bytes(self) -> int:
        """Bytes of the column files (0 in memory)."""
        return columns.file_bytes(self._columns().values())

    def close(self) -> None:
        columns.close(self._columns().values())

    def timed(self) -> None:
        """Keep each row's fetch time from now on (a retention expires rows by it).  ValueError if
        rows are stored already without theirs."""
        if self.times is None:
            if len(self):
                raise ValueError("the band table holds rows without their fetch times (written without a retention)")
            self.times = self._new("times")

    def keep_rows(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (ascending), renumbered in their order (the runs are sorted again;
        a column file is rewritten and replaced whole)."""
        self.stage_keep_rows(rows).commit()

    def stage_keep_rows(self, rows: np.ndarray) -> Staged:
        """:meth:`keep_rows`, staged: every column file is written aside now, and they replace
        the old ones at ``commit()``, so a failure leaves all of them as they were."""
        rows = np.asarray(rows, dtype=np.int64)
        keys = self.keys()[rows]
        staged: dict[str, Staged] = {}
        try:
            for name, col in self._columns().items():
                staged[name] = stage_keep(col, rows)
        except BaseException:
            for st in staged.values():
                st.discard()
            raise

        def commit() -> None:
            for name, st in staged.items():
                setattr(self, name, st.commit())
            self._base, self._mid, self._tail = _Run.empty(_KEY), _Run.empty(_KEY), GrowingArray(_KEY)
            self._tail.extend(keys)
            self.prepare()

        def discard() -> None:
            for st in staged.values():
                st.discard()

        return Staged(commit, discard)

    def __len__(self) -> int:
        return len(self.fps)

    @property
    def nbytes(self) -> int:
        cols = [
            self.fps,
            self.id_hash,
            self.tags,
            self.sketch,
            self._tail,
            *([] if self.times is None else [self.times]),
        ]
        return sum(c.nbytes for c in cols) + self._base.nbytes + self._mid.nbytes

    def keys(self) -> np.ndarray:
        """Every row's key as stored (its tag: the low 32 bits), in row order (a new array)."""
        out = np.empty(len(self), dtype=_KEY)
        for run in (self._base, self._mid):
            out[run.rows] = run.keys
        out[len(self) - len(self._tail) :] = self._tail.view()
        return out

    def state(self) -> dict[str, np.ndarray]:
        """The keys, and each column's values or (a column in a file) the file's checksum
        ``<name>_check``: the file itself is kept beside the snapshot."""
        out = {"keys": self.keys()}
        for name, col in self._columns().items():
            out.update(column_state(self._spec(name)[0], col))
        return out

    @classmethod
    def from_state(
        cls, scheme: BandScheme, band: int, state: dict[str, np.ndarray], path: str | None = None
    ) -> BandTable:
        """The table :meth:`state` describes, its columns in memory or (``path``) in files: a
        snapshot's values are written to new files; files a snapshot describes are reopened, cut
        to its rows and checked (ValueError if one is missing, short or holds other values)."""
        keys = tags(state["keys"])  # (snapshots before 32-bit keys kept all 64 bits)
        table = cls(scheme, band)  # (empty, in memory: its columns are replaced below)
        table.path = path
        names = ["fps", "id_hash", "tags", "sketch"]
        if "fetched" in state or "fetched_check" in state:
            names.append("times")
        loaded: list[Column] = []
        try:
            for name in names:
                key, suffix, dtype, shape = table._spec(name)
                loaded.append(column_from_state(key, dtype, state, len(keys), path, suffix, shape))
                setattr(table, name, loaded[-1])
        except BaseException:
            columns.close(loaded)
            raise
        table._tail.extend(keys)
        table.prepare()
        return table

    def add(
        self,
        keys: np.ndarray,
        fps: np.ndarray,
        id_hash: np.ndarray,
        sketch: np.ndarray,
        earlier: np.ndarray,
        fetched: np.ndarray | None = None,
    ) -> None:
        """Append rows: this band's keys, and ``earlier`` (n, band) tags of the bands before it;
        ``fetched``: their fetch times (kept if the table is :meth:`timed`)."""
        if len(self) + len(keys) >= 2**31:
            raise ValueError("a band table holds fewer than 2**31 rows; use more shard partitions")
        start = len(self)
        try:  # all or, if a write fails (a full disk), none of the columns
            self.fps.extend(np.asarray(fps, dtype=_U64))
            self.id_hash.extend(np.asarray(id_hash, dtype=_U64))
            self.tags.extend(np.asarray(earlier, dtype=np.uint32).reshape(len(keys), self.band))
            self.sketch.extend(np.asarray(sketch, dtype=np.uint8).reshape(len(keys), self.scheme.sketch_bytes))
            if self.times is not None:
                self.times.extend(np.zeros(len(keys), np.int64) if fetched is None else np.asarray(fetched, np.int64))
            self._tail.extend(tags(keys))  # (last: it changes nothing if it fails)
        except BaseException:
            for col in self._columns().values():
                col.truncate(start)
            raise
        if len(self._tail) > _TAIL_MAX:  # (the rows are stored: a fold that fails leaves them in the tail)
            self._fold()

    def prepare(self) -> None:
        """Sort every row into the runs (after recovery: the first probes need not sort the tail)."""
        if len(self._tail):
            self._fold()

    def _fold(self) -> None:
        tail = self._tail.view()
        order = np.argsort(tail, kind="stable")
        start = len(self) - len(tail)
        self._mid = self._mid.merged(tail[order], (start + order).astype(np.int32))
        self._tail = GrowingArray(_KEY)
        if len(self._mid) > max(_MID_MIN, 16 * math.isqrt(len(self._base))):
            self._base, self._mid = self._base.merged(self._mid.keys, self._mid.rows), _Run.empty(_KEY)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(probe, row) for every stored row whose key equals a probe's (on the low 32 bits, as
        the tags of earlier bands compare: module doc)."""
        keys = tags(keys)
        qs, rows = [], []
        for run in (self._base, self._mid):
            q, row = run.lookup(keys)
            qs.append(q)
            rows.append(row)
        q, i = _equal_pairs(self._tail.view(), keys)
        qs.append(q)
        rows.append(len(self) - len(self._tail) + i)
        return np.concatenate(qs).astype(np.int64), np.concatenate(rows).astype(np.int64)

    def judge(
        self,
        keys: np.ndarray,
        fps: np.ndarray,
        id_hash: np.ndarray,
        sketch: np.ndarray,
        earlier: np.ndarray,
        insert: bool = True,
        before_insert: Callable[[np.ndarray], object] | None = None,
        after_insert: Callable[[np.ndarray], object] | None = None,
        fetched: np.ndarray | None = None,
        cutoff: int | None = None,
        renew: int = 0,
    ) -> BandMatches:
        """Store a batch's new pages in order, then give each probe its best match under the rule.

        ``keys``: each probe's key in this band; ``earlier``: (n, band) tags of its keys in the
        bands before.  A probe stands after every stored row, unless its (id hash, simhash,
        key) is stored already (a replay or an unchanged re-fetch): then at its first store.
        ``insert=False`` only answers (a check).  ``before_insert(positions)`` is called with the
        batch positions of the new pages before they are stored, ``after_insert(positions)`` once
        they are (also if a later step raises).  Linear in the batch.

        A :meth:`timed` table under a retention: ``fetched``, the probes' fetch times; rows fetched
        before ``cutoff`` count as gone; a page stored again (same id, simhash and key) is stored
        anew once its newest copy is ``renew`` older (judged where its first copy stands).
        """
        times = self.times.view() if self.times is not None else None
        if times is None or fetched is None:
            cutoff, renew = None, 0
        keys, fps, id_hash = (np.asarray(a, dtype=_U64) for a in (keys, fps, id_hash))
        earlier = np.asarray(earlier, dtype=np.uint32).reshape(len(keys), self.band)
        n, start = len(keys), len(self)
        q, row = self.lookup(keys)
        if cutoff is not None:
            assert times is not None
            live = times[row] >= cutoff
            q, row = q[live], row[live]
        pos = np.full(n, start, dtype=np.int64)
        same = (self.id_hash.take(row) == id_hash[q]) & (self.fps.take(row) == fps[q])
        np.minimum.at(pos, q[same], row[same])
        new = np.zeros(n, dtype=bool)
        if insert:
            fresh = pos == start
            again = fresh.copy()
            if renew:
                assert times is not None and fetched is not None
                newest = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
                np.maximum.at(newest, q[same], times[row[same]])
                held = np.flatnonzero(newest > np.iinfo(np.int64).min)
                again[held] |= np.asarray(fetched, dtype=np.int64)[held] - newest[held] >= renew
            if cutoff is not None:  # a page already older than the cutoff is judged, not stored
                again &= np.asarray(fetched, dtype=np.int64) >= cutoff
            # the first probe of each (id hash, simhash, key) not stored yet is stored, in order
            first, inverse = first_occurrences(id_hash, fps, keys)
            new[first[again[first]]] = True
            new_idx = np.flatnonzero(new)
            if len(new_idx):
                if before_insert is not None:
                    before_insert(new_idx)
                rank_of = np.full(n, -1, dtype=np.int64)
                rank_of[new_idx] = np.arange(len(new_idx))
                stands = np.flatnonzero(fresh)
                ranked = rank_of[first[inverse[stands]]]  # (-1: not stored; it stands after every stored page)
                pos[stands[ranked >= 0]] = start + ranked[ranked >= 0]
                try:
                    self.add(
                        keys[new_idx],
                        fps[new_idx],
                        id_hash[new_idx],
                        np.asarray(sketch)[new_idx],
                        earlier[new_idx],
                        None if fetched is None else np.asarray(fetched)[new_idx],
                    )
                finally:  # (a fold after the rows are in, e.g. out of memory: stored all the same)
                    if after_insert is not None and len(self) > start:
                        after_insert(new_idx)
                # and the batch against its own new pages (rows start.., in order): no second
                # lookup of the stored ones
                q2, i2 = _equal_pairs(tags(keys[new_idx]), tags(keys))
                q, row = np.concatenate((q, q2)), np.concatenate((row, start + i2))
        # the rule: stored before the probe, another id, and this band is the pair's canonical one
        # (take, not view: the columns were appended to; a view would map each file anew)
        keep = (row < pos[q]) & (self.id_hash.take(row) != id_hash[q])
        if cutoff is not None:  # (the batch's own new pages too)
            assert self.times is not None
            keep &= self.times.take(row) >= cutoff
        if self.band:
            keep &= (self.tags.take(row) != earlier[q]).all(axis=1)
        q, row = q[keep], row[keep]
        matches = self.scheme.matches(self.sketch.take(row), np.asarray(sketch)[q])
        keep = matches >= self.scheme.min_matches
        if self.scheme.verify == "minhash":
            rank = self.scheme.sketch - matches
        else:  # combined: the simhash filter too, and the nearest simhash is the match
            rank = hamming_many(self.fps.take(row), fps[q])
            keep &= rank <= self.scheme.k
        q, row, rank = q[keep], row[keep], np.asarray(rank, dtype=np.int64)[keep]
        out = BandMatches(np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64), new)
        if len(q):
            order = np.lexsort((row, rank, q))  # the best: lowest rank, then first stored
            q, row, rank = q[order], row[order], rank[order]
            first = np.r_[True, q[1:] != q[:-1]]
            out.rank[q[first]], out.row[q[first]] = rank[first], row[first]
        return out
