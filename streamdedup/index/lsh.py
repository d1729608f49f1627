"""Locality-sensitive hashing of MinHash signatures: b bands of r rows (Broder 1997; Indyk &
Motwani 1998; Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets*, ch. 3).

A signature's first ``b * r`` positions are cut into ``b`` bands of ``r`` rows.  Two documents
with resemblance ``s`` agree on one band with probability ``s**r`` and become candidates when
they agree on at least one band::

    P(s) = 1 - (1 - s**r)**b          the S-curve, steepest near threshold_of(b, r) = (1/b)**(1/r)

Index layout (numpy arrays; the only Python object per document is its external id)::

    row i   ids[i]          external id (a list slot; None once removed)
            signatures[i]   uint32[num_perm]  scores candidates by estimated resemblance
            dead[i]         tombstone set by remove()
            id_hash[i]      int64 hash(id): lets remove() scan numpy, not Python objects
    runs    base            band keys sorted (uint64) + parallel row numbers (int32),
                            + a bucket directory on the keys' top bits when large
            mid             the same for recent rows (merged into base past 16 * sqrt(rows))
            tail            band keys of the newest rows, unsorted, scanned directly

A band key is ``mix64(salt_j * M**r + v_1 * M**(r-1) + ... + v_r)`` (mod 2**64) over the
``r`` uint32 values of band ``j``, with a per-band salt: keys of different bands differ, so
one sorted array holds all bands (a false match needs a 64-bit collision, and every candidate
is scored by its estimated resemblance anyway).  Like an LSM tree, inserts only append to the
tail; the tail is sorted into ``mid`` when it passes 2,048 rows or a large query batch comes,
and ``mid`` is merged into ``base``, dropping removed rows, when it passes ``16 * sqrt(base)``
rows (an insert costs O(sqrt n) key moves amortised, a query batch at most one merge of
``mid``).  A lookup reads a directory bucket (about four keys) or binary-searches a small
run.  Band keys are internal, rebuilt from signatures: they are not a format.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from streamdedup.fingerprinting.features import mix64
from streamdedup.fingerprinting.minhash import _splitmix64

__all__ = ["s_curve", "threshold_of", "choose_bands", "Candidates", "LSHIndex"]

_U64 = np.uint64
_MUL = _U64(0x9E3779B97F4A7C15)
_LSH_DOMAIN = 0x4C53485F42414E44  # "LSH_BAND"
_TAIL_MAX = 2048  # tail rows before they are sorted into mid
_SCAN_BUDGET = 1 << 16  # (queries x tail rows x b) comparisons a query may spend scanning the tail
_MID_MIN = 16384  # rows mid may hold before it is merged into base, at least
_PAIR_CHUNK = 8192  # candidate pairs scored at once (bounds a num_perm-wide gather)


def s_curve(s, b: int, r: int):
    """Probability that two documents of resemblance ``s`` share at least one band.

    >>> round(s_curve(0.8, 20, 5), 4)
    0.9996
    """
    p = 1.0 - (1.0 - np.asarray(s, dtype=float) ** r) ** b
    return float(p) if p.ndim == 0 else p


def threshold_of(b: int, r: int) -> float:
    """Approximate resemblance where the S-curve rises, ``(1/b)**(1/r)``.

    >>> round(threshold_of(20, 5), 3)
    0.549
    """
    _check_bands(b, r, None)
    return (1.0 / b) ** (1.0 / r)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_num_perm(num_perm: int) -> int:
    if not _is_int(num_perm) or num_perm < 2:
        raise ValueError(
            f"num_perm must be an integer >= 2 (e.g. 128, as given to minhash_signature); got {num_perm!r}"
        )
    return int(num_perm)


def _check_threshold(threshold: float) -> float:
    if not isinstance(threshold, (int, float, np.floating)) or not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be a resemblance strictly between 0 and 1, e.g. 0.8; got {threshold!r}")
    return float(threshold)


def _check_bands(b: int, r: int, num_perm: int | None) -> tuple[int, int]:
    if not (_is_int(b) and _is_int(r) and b >= 1 and r >= 1):
        raise ValueError(
            f"b (bands) and r (rows per band) must be positive integers, e.g. b=9, r=13; got b={b!r}, r={r!r}"
        )
    if num_perm is not None and b * r > num_perm:
        raise ValueError(
            f"b * r must be <= num_perm: b={b}, r={r} need {b * r} signature positions "
            f"but num_perm={num_perm}; "
            "lower b or r, or raise num_perm"
        )
    return int(b), int(r)


def choose_bands(threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5) -> tuple[int, int]:
    """The ``(b, r)`` with ``b * r <= num_perm`` that best separates resemblance ``threshold``.

    For every admissible ``(b, r)`` the false-positive area is the integral of the S-curve
    below the threshold, ``FP = ∫_0^t P(s) ds`` (pairs that are not near-duplicates but
    collide), and the false-negative area ``FN = ∫_t^1 (1 - P(s)) ds`` (near-duplicates that
    never collide); the pair minimising ``fp_weight * FP + fn_weight * FN`` wins (datasketch's
    ``_optimal_param``; the first in (b, r) order on ties).  ``P`` is a polynomial of degree
    ``b * r``, so Gauss-Legendre quadrature with ``num_perm // 2 + 1`` nodes integrates it
    exactly (capped at 128 nodes, still far below 1e-9 error).  Raise ``fn_weight`` to
    miss fewer near-duplicates at the price of more candidates to score.

    >>> choose_bands(0.8, 128)
    (9, 13)
    """
    threshold = _check_threshold(threshold)
    num_perm = _check_num_perm(num_perm)
    for name, w in (("fp_weight", fp_weight), ("fn_weight", fn_weight)):
        if not isinstance(w, (int, float, np.floating)) or not w >= 0:
            raise ValueError(f"{name} must be a number >= 0 (e.g. 0.5); got {w!r}")
    if fp_weight + fn_weight <= 0:
        raise ValueError("fp_weight and fn_weight must not both be 0; e.g. fp_weight=0.5, fn_weight=0.5")
    return _choose_bands(threshold, num_perm, float(fp_weight), float(fn_weight))


@lru_cache(maxsize=64)  # arguments already validated and normalised (an lru_cache treats 128.0 as 128)
def _choose_bands(threshold: float, num_perm: int, fp_weight: float, fn_weight: float) -> tuple[int, int]:
    x, w = np.polynomial.legendre.leggauss(min(num_perm // 2 + 1, 128))
    lo_s, lo_w = threshold * (x + 1) / 2, w * threshold / 2
    hi_s, hi_w = threshold + (1 - threshold) * (x + 1) / 2, w * (1 - threshold) / 2
    b = np.repeat(np.arange(1, num_perm + 1), num_perm // np.arange(1, num_perm + 1))
    r = np.concatenate([np.arange(1, num_perm // bb + 1) for bb in range(1, num_perm + 1)])
    bc, rc = b[:, None].astype(float), r[:, None].astype(float)
    fp = (1.0 - (1.0 - lo_s**rc) ** bc) @ lo_w
    fn = (1.0 - (1.0 - hi_s**rc) ** bc) @ hi_w
    err = fp_weight * fp + fn_weight * ((1 - threshold) - fn)
    best = int(np.argmin(err))
    return int(b[best]), int(r[best])


class _Run:
    """Band keys sorted ascending with their row numbers, and (when large) a bucket directory.
    Keys of one unsigned dtype (64-bit here; :class:`~streamdedup.index.bands.BandTable` keeps 32).

    ``dir[v]`` is the first position whose key's top ``bits`` bits are >= v, with about four
    keys per bucket: a lookup reads two directory entries and a few keys instead of the
    ~20 cache misses of a binary search over millions of keys.
    """

    __slots__ = ("_dir", "_shift", "keys", "rows")
    DIRECTORY_MIN = 1 << 15  # smaller runs are binary-searched: they sit in cache anyway

    def __init__(self, keys: np.ndarray, rows: np.ndarray) -> None:
        self.keys, self.rows = keys, rows
        self._dir: np.ndarray | None = None
        self._shift = 64

    @classmethod
    def empty(cls, dtype: type = _U64) -> _Run:
        return cls(np.empty(0, dtype=dtype), np.empty(0, dtype=np.int32))

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.rows.nbytes + (0 if self._dir is None else self._dir.nbytes)

    def lookup(self, needles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(needle index, row) for every stored key equal to a needle."""
        if len(self.keys) >= self.DIRECTORY_MIN:
            if self._dir is None:
                bits = max(1, (len(self.keys) // 4).bit_length())
                self._shift = 8 * self.keys.dtype.itemsize - bits
                counts = np.bincount(
                    (self.keys >> self.keys.dtype.type(self._shift)).astype(np.intp), minlength=1 << bits
                )
                self._dir = np.concatenate([[0], np.cumsum(counts)])
            bucket = (needles >> self.keys.dtype.type(self._shift)).astype(np.intp)
            which = np.arange(len(needles))
            lo, cnt = self._dir[bucket], self._dir[bucket + 1] - self._dir[bucket]
        else:
            if not len(self.keys):
                return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
            lo = np.searchsorted(self.keys, needles, "left")
            which = np.flatnonzero(self.keys[np.minimum(lo, len(self.keys) - 1)] == needles)
            lo = lo[which]  # only needles present need their range's end
            cnt = np.searchsorted(self.keys, needles[which], "right") - lo
        # expand each range [lo, lo + cnt) into its positions
        total = int(cnt.sum())
        pos = np.arange(total) + np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
        which = np.repeat(which, cnt)
        same = self.keys[pos] == needles[which]
        return which[same], self.rows[pos[same]].astype(np.int64)

    def merged(self, keys: np.ndarray, rows: np.ndarray) -> _Run:
        """A new run holding this one and the sorted ``keys`` (O(n + m log n))."""
        pos = np.searchsorted(self.keys, keys, "right") + np.arange(len(keys))
        new = np.zeros(len(self.keys) + len(keys), dtype=bool)
        new[pos] = True
        out_k, out_r = np.empty(len(new), dtype=self.keys.dtype), np.empty(len(new), dtype=np.int32)
        out_k[pos], out_r[pos] = keys, rows
        out_k[~new], out_r[~new] = self.keys, self.rows
        return _Run(out_k, out_r)

    def without(self, dead: np.ndarray) -> _Run:
        """This run minus the rows marked dead."""
        keep = ~dead[self.rows]
        return self if keep.all() else _Run(self.keys[keep], self.rows[keep])


@dataclass(frozen=True)
class Candidates:
    """Flat query results, sorted by (query, resemblance descending, row): ``query[i]`` shares a
    band with ``row[i]``, whose estimated resemblance to it is ``resemblance[i]``."""

    query: np.ndarray  # int64 index into the queried batch
    row: np.ndarray  # int64 row in the index (see LSHIndex.id_of)
    resemblance: np.ndarray  # float64, a multiple of 1 / num_perm


class LSHIndex:
    """MinHash LSH index: signatures stored under ids, queried for those sharing a band.

    ``threshold`` picks ``(b, r)`` with :func:`choose_bands` unless both are given (then it is
    only recorded; the S-curve's midpoint is ``threshold_of(b, r)``).  Same shape as
    :class:`streamdedup.index.hamming.HammingIndex`: ids may be any hashable values, an id added twice
    is stored twice, ``remove`` forgets all of an id's rows, and results are ``(id, score)``
    best first, then oldest.  Not thread-safe.

    >>> from streamdedup.fingerprinting.features import text_shingles
    >>> from streamdedup.fingerprinting.minhash import minhash_signatures
    >>> a = "It was the best of times, it was the worst of times, it was the age of wisdom, "
    >>> texts = [a + "it was the epoch of belief", a + "it was the epoch of incredulity",
    ...          "Call me Ishmael. Some years ago, never mind how long precisely"]
    >>> sigs = minhash_signatures([text_shingles(t) for t in texts])  # exact resemblance 0.889
    >>> index = LSHIndex(threshold=0.8, num_perm=128)
    >>> index.add_many(["dickens", "melville"], sigs[[0, 2]])
    >>> index.query(sigs[1])
    [('dickens', 0.8671875)]
    >>> index.remove("dickens"), len(index), index.query(sigs[1])
    (True, 1, [])
    """

    def __init__(
        self,
        threshold: float = 0.8,
        num_perm: int = 128,
        b: int | None = None,
        r: int | None = None,
    ):
        self.num_perm = _check_num_perm(num_perm)
        self.threshold = _check_threshold(threshold)
        if b is None and r is None:
            b, r = choose_bands(self.threshold, self.num_perm)
        elif b is None or r is None:
            raise ValueError("give both b and r, or neither (then they are chosen from threshold)")
        self.b, self.r = _check_bands(b, r, self.num_perm)
        m = int(_MUL)
        self._powers = np.array([pow(m, self.r - 1 - t, 1 << 64) for t in range(self.r)], dtype=_U64)
        self._salt_top = _splitmix64(_LSH_DOMAIN, self.b) * _U64(pow(m, self.r, 1 << 64))
        self._n = 0  # rows used (removed rows included)
        self._dead_count = 0
        self._sigs = np.empty((0, self.num_perm), dtype=np.uint32)
        self._dead = np.empty(0, dtype=bool)
        # hash(id) per row: an in-process filter that lets remove() scan numpy instead of
        # Python objects; never stored or compared across processes, so its per-process
        # randomisation cannot change a result (rows are confirmed with ==).
        self._id_hash = np.empty(0, dtype=np.int64)
        self._ids: list = []
        self._base = self._mid = _Run.empty()
        self._tail_start = 0  # rows >= this are in the tail
        self._tail_keys = np.empty((0, self.b), dtype=_U64)

    def __repr__(self) -> str:
        return (
            f"LSHIndex(threshold={self.threshold}, num_perm={self.num_perm}, b={self.b}, r={self.r}, len={len(self)})"
        )

    def __len__(self) -> int:
        return self._n - self._dead_count

    @property
    def nbytes(self) -> int:
        """Bytes held in numpy arrays (by capacity) plus the id list's pointers.

        The ids themselves are the caller's Python objects and are not counted.
        """
        arrays = (self._sigs, self._dead, self._id_hash, self._tail_keys, self._base, self._mid)
        return sum(a.nbytes for a in arrays) + 8 * len(self._ids)

    def id_of(self, row: int) -> Hashable:
        """The id stored at a row returned by :meth:`search`."""
        return self._ids[row]

    def signature_of(self, row: int) -> np.ndarray:
        """The signature stored at a row (a read-only view)."""
        view = self._sigs[row]
        view.flags.writeable = False
        return view

    # -------------------------------------------------------------- writes
    def _check_sigs(self, signatures, ndim: int) -> np.ndarray:
        x = np.asarray(signatures)
        if x.dtype != np.uint32 or x.ndim != ndim or x.shape[-1] != self.num_perm:
            want = "(num_perm,)" if ndim == 1 else "(n, num_perm)"
            raise ValueError(
                f"signatures must be a uint32 array of shape {want} with "
                f"num_perm={self.num_perm}, as made by "
                f"minhash_signatures(..., num_perm={self.num_perm}); got {x.dtype} {x.shape}"
            )
        return x

    def _band_keys(self, sigs: np.ndarray) -> np.ndarray:
        """(m, num_perm) uint32 -> (m, b) uint64 band keys.

        ``acc = salt; acc = acc * M + v`` over the band's r values, written out as the
        polynomial ``salt * M**r + sum(v_t * M**(r-1-t))`` (mod 2**64) to use one multiply
        and one sum instead of r passes; then mix64.
        """
        bands = sigs[:, : self.b * self.r].reshape(len(sigs), self.b, self.r)
        acc = (bands * self._powers).sum(axis=2, dtype=_U64)  # uint64 arithmetic wraps mod 2**64
        acc += self._salt_top
        return mix64(acc)

    def add(self, id: Hashable, signature: np.ndarray) -> None:
        """Store one signature (see :meth:`add_many`)."""
        self.add_many([id], self._check_sigs(signature, 1)[None, :])

    def add_many(self, ids: Sequence[Hashable], signatures: np.ndarray) -> None:
        """Store ``signatures[i]`` (uint32, shape ``(n, num_perm)``) under ``ids[i]``."""
        sigs = self._check_sigs(signatures, 2)
        ids = list(ids)
        if len(ids) != len(sigs):
            raise ValueError(f"got {len(ids)} ids for {len(sigs)} signatures; pass one id each")
        id_hash = np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids))  # TypeError if unhashable
        m, n = len(ids), self._n
        if m == 0:
            return
        if n + m >= 2**31:
            raise ValueError("an LSHIndex holds fewer than 2**31 rows (removed ones included); shard the index")
        if n + m > len(self._sigs):
            cap = max(n + m, 2 * len(self._sigs), 1024)
            self._sigs = _grown(self._sigs, n, cap)
            self._id_hash = _grown(self._id_hash, n, cap)
            self._dead = np.concatenate([self._dead[:n], np.zeros(cap - n, dtype=bool)])
        self._sigs[n : n + m] = sigs
        self._id_hash[n : n + m] = id_hash
        t = n - self._tail_start
        if t + m > len(self._tail_keys):
            self._tail_keys = _grown(self._tail_keys, t, max(t + m, 2 * len(self._tail_keys), 256))
        self._tail_keys[t : t + m] = self._band_keys(sigs)
        self._ids.extend(ids)
        self._n += m
        if t + m > _TAIL_MAX:
            self._fold_tail()

    def remove(self, id: Hashable) -> bool:
        """Forget every signature stored under ``id``; True if there was one.

        Scans a numpy array of id hashes (O(n), about a millisecond per million rows).
        Removed rows leave the band tables at the next merge; everything is rebuilt when
        half of all rows are removed, which renumbers rows (rows from an earlier
        :meth:`search` are then stale, as in HammingIndex).
        """
        candidates = np.flatnonzero(self._id_hash[: self._n] == hash(id))
        rows = [r for r in candidates.tolist() if not self._dead[r] and self._ids[r] == id]
        if not rows:
            return False
        self._dead[rows] = True
        for r in rows:
            self._ids[r] = None
        self._dead_count += len(rows)
        if 2 * self._dead_count > self._n:
            self._compact()
        return True

    def _fold_tail(self) -> None:
        """Sort the tail into mid; merge mid into base when mid has grown."""
        t = self._n - self._tail_start
        if t:
            keys = self._tail_keys[:t].ravel()  # row-major: row i, band j at i * b + j
            rows = np.repeat(np.arange(self._tail_start, self._n, dtype=np.int32), self.b)
            order = np.argsort(keys, kind="stable")
            self._mid = self._mid.merged(keys[order], rows[order])
            self._tail_start = self._n
        if len(self._mid) // self.b > max(_MID_MIN, 16 * math.isqrt(len(self._base) // self.b)):
            mid = self._mid.without(self._dead)
            self._base = self._base.without(self._dead).merged(mid.keys, mid.rows)
            self._mid = _Run.empty()

    def _compact(self) -> None:
        """Renumber the live rows and rebuild the band tables from their signatures."""
        live = np.flatnonzero(~self._dead[: self._n])
        n = len(live)
        self._sigs[:n] = self._sigs[live]
        self._id_hash[:n] = self._id_hash[live]
        self._ids = [self._ids[r] for r in live.tolist()]
        self._dead[:] = False
        self._n, self._dead_count = n, 0
        keys = self._band_keys(self._sigs[:n]).ravel()
        rows = np.repeat(np.arange(n, dtype=np.int32), self.b)
        order = np.argsort(keys, kind="stable")
        self._base, self._mid = _Run(keys[order], rows[order]), _Run.empty()
        self._tail_start = n

    # --------------------------------------------------------------- reads
    def search(self, signatures: np.ndarray, min_resemblance: float | None = None) -> Candidates:
        """Every (query, row) sharing at least one band, with its estimated resemblance.

        ``min_resemblance`` drops candidates estimated below it; ``None`` keeps every band
        collision.  ``signatures`` is a uint32 array of shape ``(m, num_perm)``.
        """
        sigs = self._check_sigs(signatures, 2)
        if min_resemblance is not None and not (
            isinstance(min_resemblance, (int, float, np.floating)) and 0 <= min_resemblance <= 1
        ):
            raise ValueError(f"min_resemblance must be None or a number in [0, 1], e.g. 0.8; got {min_resemblance!r}")
        m = len(sigs)
        qk = self._band_keys(sigs)
        if (self._n - self._tail_start) * m * self.b > _SCAN_BUDGET:
            self._fold_tail()
        qi, rows = self._collisions(qk)
        live = ~self._dead[rows]
        width = max(self._n, 1)
        pair = np.unique(qi[live] * width + rows[live])  # a row found in several bands counts once
        qi, rows = pair // width, pair % width
        res = np.empty(len(pair))
        for s in range(0, len(pair), _PAIR_CHUNK):
            e = s + _PAIR_CHUNK
            res[s:e] = np.count_nonzero(self._sigs[rows[s:e]] == sigs[qi[s:e]], axis=1)
        res /= self.num_perm
        if min_resemblance is not None:
            keep = res >= min_resemblance
            qi, rows, res = qi[keep], rows[keep], res[keep]
        order = np.lexsort((rows, -res, qi))
        return Candidates(qi[order], rows[order], res[order])

    def query_many(
        self, signatures: np.ndarray, min_resemblance: float | None = None
    ) -> list[list[tuple[Hashable, float]]]:
        """Each signature's ``(id, estimated resemblance)`` candidates, best first, then oldest."""
        found = self.search(signatures, min_resemblance)
        out: list[list[tuple[Hashable, float]]] = [[] for _ in range(len(signatures))]
        ids = self._ids
        for q, r, s in zip(found.query.tolist(), found.row.tolist(), found.resemblance.tolist()):
            out[q].append((ids[r], s))
        return out

    def query(self, signature: np.ndarray, min_resemblance: float | None = None) -> list[tuple[Hashable, float]]:
        """The ``(id, estimated resemblance)`` of every signature sharing a band, best first."""
        return self.query_many(self._check_sigs(signature, 1)[None, :], min_resemblance)[0]

    def _collisions(self, qk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query, row) for every band-key match, repeats and removed rows included."""
        flat = qk.ravel()  # query i, band j at i * b + j
        qis, rowss = [], []
        for run in (self._base, self._mid):
            which, rows = run.lookup(flat)
            qis.append(which // self.b)
            rowss.append(rows)
        t = self._n - self._tail_start
        if t:
            hit = (self._tail_keys[None, :t, :] == qk[:, None, :]).any(axis=2)  # (m, t)
            q, j = np.nonzero(hit)
            qis.append(q)
            rowss.append(j + self._tail_start)
        return np.concatenate(qis).astype(np.int64), np.concatenate(rowss).astype(np.int64)


def _grown(a: np.ndarray, used: int, cap: int) -> np.ndarray:
    out = np.empty((cap, *a.shape[1:]), dtype=a.dtype)
    out[:used] = a[:used]
    return out
