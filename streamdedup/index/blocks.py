"""One group's Hamming index: a single table keyed by a block of the fingerprint, scanned by popcount.

Manku's 4-table design for k = 3 cuts a 64-bit fingerprint into 4 blocks of 16 bits: two
fingerprints within 3 bits agree on all 16 bits of at least one block.  A shard stores each page
once per block (a *group*), so the group's store only has to find the neighbours that agree on
its block: one table keyed by the block, and a scan of the query's bucket (XOR + popcount over
every stored fingerprint with the same key) finds them exactly, for any ``k``.

Layout (a fingerprint is rotated right until its key is its top bits, then cut in halves)::

    run:    hi   uint32[n]  the rotated fingerprints' high halves: the key, then 32 - w other bits
            lo   uint32[n]  their low halves (the other 32 bits)
                            both sorted by key (then row: rows ascend within a key)
            rows uint32[n]  their rows (numbered by the caller in insert order)
            dir  uint32[2**d + 1]  where each bucket ``key >> (w - d)`` starts (big runs only)
    alive:  one bit per row (packed, little-endian bit order)

12 bytes per entry, one bit of alive mask per row, and a directory of at most ``4 / PER_BUCKET``
bytes per entry (a 16-bit key caps it at 256 KiB a run): no column by row, since a match
reports the fingerprint it found (``Matches.fingerprint``).  The halves are two arrays so that a
scan reads only ``lo``: 4 bytes an entry, and 16 of them to a vector of popcounts; the few
entries within ``k`` there are tested on ``hi`` (against a scan of whole 64-bit fingerprints:
3.2 x the queries a second on one 100 M-entry group, 1.8 x on an index of 100 M pages in 4
groups: bench/README.md, "Half-width scans").

Inserts are log-structured, as in :mod:`streamdedup.index.hamming`: a batch becomes a small
sorted run and a run is merged into the one before it while it is at least a quarter of its size,
by a linear merge into arrays of the exact size.  A merge that writes at least
``BACKGROUND_MIN`` entries runs in a thread (the numba kernel releases the GIL), one at a time,
at a lower priority than the caller (``MERGE_NICENESS``), while searches and inserts use the
old runs and newer ones; the merged run replaces its two inputs at the next call once it is
done (:meth:`BlockIndex.wait` joins it).  ``remove_rows`` only clears alive bits;
``keep_rows`` compacts.  A changelog replay adds its batches ``later=True``: they wait unsorted
(8 bytes an entry, less than a run's 12) and become one run when they are as many as the runs
hold (at least ``LATER_MIN``) or at the next search, snapshot or :meth:`BlockIndex.prepare`: one
sort and a merge or two instead of a run and its merges per batch.

A search finds each query's bucket in every run: through the run's directory (a bucket that
holds several keys is scanned with a key check), or by binary search in a small run; then it
scans the bucket's low halves 64 at a time, with the next buckets prefetched.

>>> idx = BlockIndex(0xFFFF_0000, k=3)
>>> idx.add_many(range(3), [0x1_0000, 0x1_0007, 0x2_0000])
>>> found = idx.search([0x1_0001])
>>> found.row.tolist(), found.distance.tolist(), [hex(f) for f in found.fingerprint.tolist()]
([0, 1], [1, 2], ['0x10000', '0x10007'])
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from types import ModuleType

import numpy as np

from streamdedup.fingerprinting import kernels
from streamdedup.index.hamming import Matches, _as_fps

__all__ = ["BlockIndex", "warm_up"]

_U64 = np.uint64
_NO_DIR = np.empty(0, dtype=np.uint32)
#: Rows are uint32; the top value is kept free (keep_rows' "dropped" mark).
_MAX_ROWS = 2**32 - 1
#: The niceness of a background merge's thread (its increase over the process's).
MERGE_NICENESS = 10
#: Entries per chunk in the numpy passes over whole runs (bounds their temporaries).
_CHUNK = 1 << 22

log = logging.getLogger(__name__)


#: The kernel module once imported, or None when its import failed (not retried: numba is
#: there or not for the process's life).  Two threads may both append on the first call;
#: the first entry is used, and both are the same module.
_BLOCK_KERNELS: list[ModuleType | None] = []


def _kernel_module(compiled: bool | None) -> ModuleType | None:
    """The block kernels, or None for the numpy path (``compiled``: None = numba when available)."""
    if compiled is False:
        return None
    module = None
    if kernels.compiled() is not None:  # numba imports here and the numpy path is not forced
        if not _BLOCK_KERNELS:  # (imported once: a small shard step asks ~5 times a group)
            try:
                _BLOCK_KERNELS.append(importlib.import_module("streamdedup.index.block_kernels"))
            except ImportError:
                _BLOCK_KERNELS.append(None)
        module = _BLOCK_KERNELS[0]
    if compiled and module is None:
        raise RuntimeError("the compiled block kernels need numba (pip install numba)")
    return module


def warm_up() -> bool:
    """Compile (or load from numba's cache) every block kernel now, not in the first batch that
    needs one; False when the numpy path is in use."""
    if _kernel_module(None) is None:
        return False
    idx = BlockIndex(0xFFFF, background=False)
    idx.DIRECTORY_MIN = 16  # a merge that builds a directory, and a binary-searched run
    fps = np.arange(64, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    idx.add_many(range(64), fps)
    idx.add_many(range(64, 128), fps)
    idx.add_many(range(128, 130), fps[:2])
    idx.search(fps)
    return True


class _Run:
    """One sorted run: the fingerprints' halves ``hi`` and ``lo`` sorted by key (rows ascending
    within a key), ``rows`` parallel, and for a big run a directory of bucket starts
    (``dir_shift``: key bits below the bucket)."""

    __slots__ = ("dir_shift", "directory", "hi", "lo", "rows")

    def __init__(
        self, hi: np.ndarray, lo: np.ndarray, rows: np.ndarray, directory: np.ndarray | None, dir_shift: int
    ) -> None:
        self.hi, self.lo, self.rows = hi, lo, rows
        self.directory, self.dir_shift = directory, dir_shift

    def __len__(self) -> int:
        return len(self.hi)

    @property
    def nbytes(self) -> int:
        directory = 0 if self.directory is None else self.directory.nbytes
        return self.hi.nbytes + self.lo.nbytes + self.rows.nbytes + directory


#: Background merges run one at a time in the process: a shard's groups grow in step (every page
#: goes to each), so their big merges fall due together, and four at once held 2.7 x the index's
#: memory at 100 M pages (each merge holds its inputs and its output).  The others wait their turn,
#: searched as they are meanwhile.
_MERGE_SLOT = threading.Lock()


class _Merge:
    """A merge of two adjacent runs running in a thread; ``result`` is the merged run once done."""

    def __init__(self, old: _Run, new: _Run, work) -> None:
        self.old, self.new = old, new
        self.result: _Run | None = None
        self.error: BaseException | None = None
        self.nbytes = (len(old) + len(new)) * 12
        self.thread = threading.Thread(target=self._run, args=(work,), name="block-merge", daemon=True)
        self.thread.start()

    def _run(self, work) -> None:
        try:
            # below the caller's priority: on a busy machine the merge waits, not the event loop
            # (on Linux a thread is a task of its own; raising one's niceness needs no rights)
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + MERGE_NICENESS))
        except (AttributeError, OSError):  # not Linux/POSIX: the merge runs at the same priority
            pass
        try:
            with _MERGE_SLOT:
                self.result = work(self.old, self.new)
        except BaseException as e:  # re-raised on the caller's thread by BlockIndex._poll
            self.error = e


class BlockIndex:
    """Stored 64-bit fingerprints of one group, searchable by Hamming distance among those that
    agree with the query on the group's key bits ``mask`` (one contiguous block of 8..32 bits).

    ``k``: the default distance of :meth:`search` (any ``k`` is exact within the key's agreement).
    ``background``: big merges in a thread (True) or on the caller's thread (False); the answers
    are the same.  ``compiled``: the numba kernels (True), numpy (False), or numba when it is
    installed (None); the answers are the same.
    """

    #: A run is merged into the one before it while it is at least 1/MERGE_RATIO of its size.
    MERGE_RATIO = 4
    #: Runs below this many entries take the next run in at once (each costs a binary search
    #: per query; merging them is cheap).
    SMALL_RUN = 1 << 14
    #: Merges writing at least this many entries run in a thread (when ``background``).
    BACKGROUND_MIN = 1 << 18
    #: Merges writing at least this many entries are logged at INFO, the others at DEBUG: the
    #: index's biggest single jobs (at 10 M pages a worker's group index is ~2.5 M entries, and
    #: its merge holds its inputs and output at once), for operators to see when they ran.
    LOG_MERGE_MIN = 1 << 20
    #: Runs of at least this many entries get a bucket directory; smaller ones are binary-searched.
    DIRECTORY_MIN = 1 << 12
    #: Entries per directory bucket at least (so a directory costs <= 4/PER_BUCKET bytes an entry).
    PER_BUCKET = 8
    #: Entries added ``later=True`` wait unsorted until they are at least this many and at least as
    #: many as the runs hold (so their sort holds less than the merge that follows it: inputs and
    #: output), or until the next read of the runs.
    LATER_MIN = 1 << 18

    def __init__(self, mask: int, k: int = 3, *, background: bool = True, compiled: bool | None = None) -> None:
        mask = int(mask)
        if not 0 < mask < 2**64:
            raise ValueError(f"the key mask must be a 64-bit block of 8..32 bits, got {mask:#x}")
        shift = (mask & -mask).bit_length() - 1
        width = (mask >> shift).bit_length()
        if (mask >> shift) != (1 << width) - 1 or not 8 <= width <= 32:
            raise ValueError(f"the key mask must be one contiguous block of 8..32 bits, got {mask:#x}")
        if not 0 <= int(k) <= 64:
            raise ValueError(f"k must be in 0..64, got {k}")
        self.mask, self.k = mask, int(k)
        self.background, self.compiled = background, compiled
        self._width = width
        self._rot = (shift + width) % 64  # a right rotation by this puts the key at the top
        self._kshift = 32 - width  # the key of a high half: hi >> _kshift
        self._runs: list[_Run] = []
        self._alive = np.zeros(128, dtype=np.uint8)  # one bit per row
        self._n = 0  # rows numbered so far
        self._dead = 0
        self._pending: _Merge | None = None
        self._later: list[np.ndarray] = []  # fingerprints added later=True, not in a run yet (in row order)
        self._later_n = 0

    # ---------------------------------------------------------------- size
    def __len__(self) -> int:
        return self._n - self._dead

    @property
    def rows(self) -> int:
        """Rows numbered so far, removed ones included (the next ``add_many`` starts here)."""
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes held: the runs (fingerprints, rows, directories), the alive bits, and the output
        of a merge under way."""
        pending = 0 if self._pending is None else self._pending.nbytes
        later = 8 * self._later_n
        return sum(run.nbytes for run in self._runs) + self._alive.nbytes + pending + later

    @property
    def runs(self) -> int:
        """How many sorted runs a search visits (entries added ``later`` are sorted into one first)."""
        return len(self._runs)

    # -------------------------------------------------------------- writes
    def add_many(
        self, rows: range | np.ndarray | Iterable[int], fingerprints: Iterable[int] | np.ndarray, *, later: bool = False
    ) -> None:
        """Store fingerprints under ``rows``, which must be the next row numbers in order
        (``range(idx.rows, idx.rows + len(fingerprints))``).

        ``later``: sort them into a run later, with the entries added ``later`` before and after
        them (a changelog replay: many batches, no search between them), when those are as many
        as the runs hold (at least ``LATER_MIN``) or at the next search, :meth:`state`,
        :meth:`wait` or :meth:`prepare`.  They are stored all the same: numbered, alive,
        found by the next search."""
        self._poll()
        fps = np.ascontiguousarray(_as_fps(fingerprints))
        m = len(fps)
        if isinstance(rows, range):
            ok = len(rows) == m and (m == 0 or (rows.start == self._n and rows.step == 1))
        else:
            r = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows))
            ok = len(r) == m and (
                m == 0 or (r.dtype.kind in "iu" and int(r[0]) == self._n and bool((np.diff(r) == 1).all()))
            )
        if not ok:
            raise ValueError(f"rows must be {self._n}, {self._n + 1}, ... one per fingerprint ({m} fingerprints)")
        if m == 0:
            return
        if self._n + m > _MAX_ROWS:
            raise ValueError(f"a BlockIndex holds at most {_MAX_ROWS} rows; keep_rows to renumber")
        self._reserve(self._n + m)
        _set_bits(self._alive, self._n, self._n + m)
        if later and (fps is fingerprints or fps.base is not None):
            fps = fps.copy()  # (kept: not the caller's array, nor a view of one)
        self._later.append(fps)
        self._later_n += m
        self._n += m
        if not later or self._later_n >= max(self.LATER_MIN, sum(len(run) for run in self._runs)):
            self._sort_later()

    def _sort_later(self) -> None:
        """The entries waiting to be sorted (the last rows, in order) as one run, then merges."""
        if not self._later:
            return
        fps = self._later[0] if len(self._later) == 1 else np.concatenate(self._later)
        start = self._n - self._later_n
        self._later, self._later_n = [], 0
        hi, lo = self._split(fps)
        del fps
        # stable: rows ascend within a key (and a radix sort on 16-bit keys: 4x faster than on 64)
        order = np.argsort(self._keys(hi).astype(np.uint16 if self._width <= 16 else np.uint32), kind="stable")
        rows = (order + start).astype(np.uint32)
        self._runs.append(self._run(hi[order], lo[order], rows, None, build_directory=self._fast()))
        self._merge_due()

    def remove_rows(self, rows: np.ndarray | Iterable[int]) -> int:
        """Mark rows dead (no compaction: :meth:`keep_rows` does it).  Returns how many died."""
        picked = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64)
        if len(picked) and (picked.min() < 0 or picked.max() >= self._n):
            raise ValueError(f"rows must be in 0..{self._n - 1}")
        picked = np.unique(picked)
        picked = picked[_get_bits(self._alive, picked)]
        np.bitwise_and.at(self._alive, picked >> 3, ~(np.uint8(1) << (picked & 7).astype(np.uint8)))
        self._dead += len(picked)
        return len(picked)

    def alive_rows(self) -> np.ndarray:
        """The alive mask by row (bool, a fresh array)."""
        return np.unpackbits(self._alive, count=self._n, bitorder="little").view(bool)

    def fingerprints(self) -> np.ndarray:
        """The fingerprint of every row, by row (a fresh array, built from the runs: O(n); for
        inspection and tests, the index itself keeps no such column)."""
        self.wait()
        out = np.zeros(self._n, dtype=_U64)
        for run in self._runs:
            out[run.rows] = self._join(run.hi, run.lo)
        return out

    def keep_rows(self, rows: np.ndarray | Iterable[int]) -> None:
        """Keep only ``rows`` (ascending), renumbered 0..len-1 in their order, in arrays of their
        size: the memory of the others is returned.  Waits for a merge under way."""
        self.wait()
        rows = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self._n or (np.diff(rows) <= 0).any()):
            raise ValueError(f"keep_rows needs ascending rows in 0..{self._n - 1}")
        # the renumbering is monotone, so each run stays sorted by (key, row): nothing is sorted again
        new_row = np.full(self._n, _MAX_ROWS, dtype=np.uint32)
        new_row[rows] = np.arange(len(rows), dtype=np.uint32)
        runs = []
        fast = self._fast()
        for run in self._runs:
            hi_parts, lo_parts, row_parts = [], [], []
            for at in range(0, len(run), _CHUNK):
                renumbered = new_row[run.rows[at : at + _CHUNK]]
                kept = renumbered != _MAX_ROWS
                hi_parts.append(run.hi[at : at + _CHUNK][kept])
                lo_parts.append(run.lo[at : at + _CHUNK][kept])
                row_parts.append(renumbered[kept])
            if sum(len(part) for part in row_parts):
                hi, lo, kept_rows = (np.concatenate(parts) for parts in (hi_parts, lo_parts, row_parts))
                runs.append(self._run(hi, lo, kept_rows, None, build_directory=fast))
        del new_row
        self._runs = runs
        self._n, self._dead = len(rows), 0
        self._alive = np.zeros(max(128, -(-len(rows) // 8)), dtype=np.uint8)
        _set_bits(self._alive, 0, len(rows))
        self._merge_due()

    # --------------------------------------------------------------- reads
    def search(self, fingerprints: Iterable[int] | np.ndarray, k: int | None = None) -> Matches:
        """Every alive stored row within ``k`` bits (default: the index's k) of a query that
        agrees with it on the key bits, sorted by (query, distance, row), with its fingerprint."""
        self._poll()
        self._sort_later()
        k = self.k if k is None else int(k)
        if not 0 <= k <= 64:
            raise ValueError(f"k must be in 0..64, got {k}")
        q_hi, q_lo = self._split(np.ascontiguousarray(_as_fps(fingerprints)))
        fast = self._fast()
        qs, rs, ds, fs = [], [], [], []
        for run in self._runs if len(q_hi) else []:
            if fast is not None:
                directory = _NO_DIR if run.directory is None else run.directory
                q, pos, d = fast.scan_run(
                    run.lo, run.hi, run.rows, directory, np.int64(run.dir_shift), np.int64(self._kshift),
                    q_lo, q_hi, self._alive, k,
                )  # fmt: skip
            else:
                q, pos, d = self._scan_numpy(run, q_hi, q_lo, k)
            qs.append(q)
            ds.append(d)
            rs.append(run.rows[pos].astype(np.int64))
            fs.append(self._join(run.hi[pos], run.lo[pos]))
        if not qs:
            empty = np.empty(0, np.int64)
            return Matches(empty, empty, empty, np.empty(0, _U64))
        query, row, dist, fp = (np.concatenate(x) for x in (qs, rs, ds, fs))
        order = np.lexsort((row, dist, query))
        return Matches(query[order], row[order], dist[order], fp[order])

    def prepare(self) -> None:
        """Finish a merge under way and build any missing directory now, not at the next call."""
        self.wait()
        fast = self._fast()
        for i, run in enumerate(self._runs):
            if run.directory is None and len(run) >= self.DIRECTORY_MIN:
                self._runs[i] = self._run(run.hi, run.lo, run.rows, None, build_directory=fast)

    def wait(self) -> None:
        """Sort the entries added ``later`` into a run, join the background merge (and any merge
        its result makes due) and swap it in."""
        self._sort_later()
        while self._pending is not None:
            self._pending.thread.join()
            self._poll()

    # ------------------------------------------------------------ snapshots
    def state(self) -> dict[str, np.ndarray]:
        """The index as arrays, the runs as they are in memory (a merge under way is left out:
        its inputs are saved, and they answer the same; entries added ``later`` are sorted first)."""
        self._sort_later()
        out: dict[str, np.ndarray] = {
            "mask": np.array(self.mask, dtype=_U64),
            "k": np.array(self.k, dtype=np.int64),
            "n_rows": np.array(self._n, dtype=np.int64),
            "alive": self._alive[: -(-self._n // 8)].copy(),  # (a copy: later adds set bits in place)
        }
        for i, run in enumerate(self._runs):
            out[f"hi{i}"], out[f"lo{i}"], out[f"rows{i}"] = run.hi, run.lo, run.rows
            if run.directory is not None:
                out[f"dir{i}"] = run.directory
        return out

    @classmethod
    def from_state(
        cls, state: dict[str, np.ndarray], *, background: bool = True, compiled: bool | None = None
    ) -> BlockIndex:
        """The index :meth:`state` saved, its arrays taken over as they are (checked, not
        copied or sorted again).  A state of the layout before the halves (whole fingerprints,
        ``fps0``...) is cut into halves (a copy).  A malformed state raises ValueError."""
        try:
            mask, k, n = int(state["mask"]), int(state["k"]), int(state["n_rows"])
            alive = state["alive"]
        except KeyError as e:
            raise ValueError(f"a BlockIndex state needs {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"a BlockIndex state has a malformed scalar ({e})") from None
        idx = cls(mask, k, background=background, compiled=compiled)
        if not 0 <= n <= _MAX_ROWS:
            raise ValueError(f"a BlockIndex state has n_rows={n}")
        if not isinstance(alive, np.ndarray) or alive.dtype != np.uint8 or alive.shape != (-(-n // 8),):
            raise ValueError(f"a BlockIndex state's alive must be uint8[{-(-n // 8)}] (one bit a row)")
        whole = any(name.startswith("fps") for name in state)  # the layout before the halves
        first = "fps" if whole else "hi"
        names = sorted(name for name in state if name.startswith(first))
        if names != sorted(f"{first}{i}" for i in range(len(names))):
            raise ValueError(f"a BlockIndex state's runs must be {first}0..{first}{len(names) - 1}, got {names}")
        kinds = ("fps", "rows", "dir") if whole else ("hi", "lo", "rows", "dir")
        unknown = set(state) - {"mask", "k", "n_rows", "alive"} - {f"{p}{i}" for p in kinds for i in range(len(names))}
        if unknown:
            raise ValueError(f"a BlockIndex state has unknown arrays {sorted(unknown)}")
        total = 0
        hi: np.ndarray | None
        lo: np.ndarray | None
        for i in range(len(names)):
            if whole:
                fps = state[f"fps{i}"]
                if not isinstance(fps, np.ndarray) or fps.dtype != _U64 or fps.ndim != 1:
                    raise ValueError(f"a BlockIndex state's run {i}: fps must be a 1-d uint64 array")
                hi, lo = idx._split(fps)
            else:
                hi, lo = state[f"hi{i}"], state.get(f"lo{i}")
            rows, directory = state.get(f"rows{i}"), state.get(f"dir{i}")
            idx._runs.append(idx._checked_run(i, hi, lo, rows, directory, n))
            total += len(hi)
        if total != n:
            raise ValueError(f"a BlockIndex state's runs hold {total} entries for {n} rows")
        idx._n = n
        idx._alive = alive if alive.flags.writeable and alive.flags.c_contiguous else alive.copy()
        if len(idx._alive) < 128:
            idx._alive = np.concatenate((idx._alive, np.zeros(128 - len(idx._alive), np.uint8)))
        if n % 8:
            idx._alive[n // 8] &= np.uint8((1 << (n % 8)) - 1)  # (bits past the last row stay clear)
        idx._dead = n - int(np.bitwise_count(idx._alive).sum())
        return idx

    # ------------------------------------------------------------ internals
    def _fast(self) -> ModuleType | None:
        return _kernel_module(self.compiled)

    def _keys(self, hi: np.ndarray) -> np.ndarray:
        """The keys of high halves."""
        return hi >> np.uint32(self._kshift)

    def _split(self, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The high and low halves (uint32) of fingerprints rotated right until the key is on top."""
        rot = self._rot
        r = fps if not rot else (fps >> _U64(rot)) | (fps << _U64(64 - rot))
        return (r >> _U64(32)).astype(np.uint32), r.astype(np.uint32)

    def _join(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """The fingerprints (uint64) of their halves: :meth:`_split` undone."""
        rot = self._rot
        r = (hi.astype(_U64) << _U64(32)) | lo
        return r if not rot else (r << _U64(rot)) | (r >> _U64(64 - rot))

    def _directory_bits(self, n: int) -> int:
        """Bucket bits of a run of ``n`` entries: about PER_BUCKET entries a bucket, at most a key
        a bucket; 0 for a run binary-searched."""
        if n < self.DIRECTORY_MIN:
            return 0
        return min(self._width, max(1, (n // self.PER_BUCKET).bit_length() - 1))

    def _run(
        self, hi: np.ndarray, lo: np.ndarray, rows: np.ndarray, directory: np.ndarray | None, build_directory
    ) -> _Run:
        """A run of sorted arrays, with its directory (built here when it should have one)."""
        bits = self._directory_bits(len(hi))
        if not bits:
            return _Run(hi, lo, rows, None, 0)
        dir_shift = self._width - bits
        if directory is None:
            if build_directory is not None:
                directory = build_directory.bucket_offsets(hi, np.int64(self._kshift + dir_shift), 1 << bits)
            else:
                directory = self._bucket_offsets_numpy(hi, dir_shift, 1 << bits)
        return _Run(hi, lo, rows, directory, dir_shift)

    def _bucket_offsets_numpy(self, hi: np.ndarray, dir_shift: int, n_buckets: int) -> np.ndarray:
        counts = np.zeros(n_buckets + 1, dtype=np.int64)
        for at in range(0, len(hi), _CHUNK):
            buckets = (hi[at : at + _CHUNK] >> np.uint32(self._kshift + dir_shift)).astype(np.intp)
            counts[1:] += np.bincount(buckets, minlength=n_buckets)
        return np.cumsum(counts).astype(np.uint32)

    def _checked_run(self, i: int, hi, lo, rows, directory, n: int) -> _Run:
        """Run ``i`` of a state, after checking what a search relies on (types, sizes, order)."""
        where = f"a BlockIndex state's run {i}"
        for name, a in (("hi", hi), ("lo", lo), ("rows", rows)):
            if not isinstance(a, np.ndarray) or a.dtype != np.uint32 or a.ndim != 1:
                raise ValueError(f"{where}: {name} must be a 1-d uint32 array")
        if not len(hi) == len(lo) == len(rows) or not len(hi):
            raise ValueError(f"{where}: {len(hi)} + {len(lo)} halves for {len(rows)} rows (and none empty)")
        hi, lo, rows = np.ascontiguousarray(hi), np.ascontiguousarray(lo), np.ascontiguousarray(rows)
        last = -1
        for at in range(0, len(hi), _CHUNK):  # sorted by (key, row), rows in range
            r = rows[at : at + _CHUNK]
            if int(r.max()) >= n:
                raise ValueError(f"{where}: a row is >= n_rows={n}")
            order = (self._keys(hi[at : at + _CHUNK]).astype(_U64) << _U64(32)) | r
            if int(order[0]) <= last or (len(order) > 1 and (order[1:] <= order[:-1]).any()):
                raise ValueError(f"{where} is not sorted by (key, row)")
            last = int(order[-1])
        if directory is None:
            return self._run(hi, lo, rows, None, build_directory=self._fast())
        # any directory of 2**d buckets (d <= key bits) that matches the keys: the thresholds
        # that chose d when it was built may differ from this index's
        bits = len(directory) - 2 if isinstance(directory, np.ndarray) else -1
        bits = bits.bit_length() if bits >= 1 and bits & (bits + 1) == 0 else 0
        if not isinstance(directory, np.ndarray) or directory.dtype != np.uint32 or directory.ndim != 1:
            raise ValueError(f"{where}: its directory must be a 1-d uint32 array")
        if not 1 <= bits <= self._width:
            raise ValueError(f"{where}: its directory must have 2**d + 1 entries, d in 1..{self._width}")
        dir_shift = self._width - bits
        starts = directory.astype(np.int64)
        bucket = np.arange(1 << bits)
        # each bucket starts where the first key of the bucket is: exact given the sorted keys
        ok = starts[0] == 0 and starts[-1] == len(hi) and (np.diff(starts) >= 0).all()
        if ok:
            inner = starts[:-1] < len(hi)
            ok = bool((self._keys(hi[starts[:-1][inner]]) >> np.uint32(dir_shift) >= bucket[inner]).all())
            before = starts[:-1] > 0
            ok = ok and bool((self._keys(hi[starts[:-1][before] - 1]) >> np.uint32(dir_shift) < bucket[before]).all())
        if not ok:
            raise ValueError(f"{where}: its directory does not match its keys")
        return _Run(hi, lo, rows, np.ascontiguousarray(directory), dir_shift)

    def _reserve(self, n: int) -> None:
        need = -(-n // 8)
        if need > len(self._alive):
            grown = np.zeros(max(need, len(self._alive) * 3 // 2), dtype=np.uint8)
            grown[: len(self._alive)] = self._alive
            self._alive = grown

    def _scan_numpy(
        self, run: _Run, q_hi: np.ndarray, q_lo: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The numpy path of ``scan_run``: each query's key range in the run, then its entries'
        distances, in chunks of queries so the candidates stay within a few million."""
        qkeys = self._keys(q_hi)
        if run.directory is not None:
            bucket = (qkeys >> np.uint32(run.dir_shift)).astype(np.intp)
            lo, hi = run.directory[bucket].astype(np.int64), run.directory[bucket + 1].astype(np.int64)
        else:
            keys = self._keys(run.hi)
            lo = np.searchsorted(keys, qkeys, side="left").astype(np.int64)
            hi = np.searchsorted(keys, qkeys, side="right").astype(np.int64)
        counts = hi - lo
        ends = np.cumsum(counts)
        out_q, out_p, out_d = [], [], []
        first = 0
        while first < len(q_hi):
            base = int(ends[first - 1]) if first else 0
            last = max(first + 1, int(np.searchsorted(ends, base + _CHUNK, side="right")))
            c, total = counts[first:last], int(ends[last - 1]) - base
            which = np.repeat(np.arange(first, last), c)
            pos = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(c) - c - lo[first:last], c)
            x_hi = run.hi[pos] ^ q_hi[which]
            dist = np.bitwise_count(run.lo[pos] ^ q_lo[which]).astype(np.int64) + np.bitwise_count(x_hi)
            keep = (dist <= k) & (x_hi >> np.uint32(self._kshift) == 0)
            keep[keep] = _get_bits(self._alive, run.rows[pos[keep]].astype(np.int64))
            out_q.append(which[keep])
            out_p.append(pos[keep])
            out_d.append(dist[keep])
            first = last
        return np.concatenate(out_q), np.concatenate(out_p), np.concatenate(out_d)

    # -------------------------------------------------------------- merges
    def _merge_due(self) -> None:
        """Merge adjacent runs while the newer is at least 1/MERGE_RATIO of the older (or the
        older is small), from the newest pair back: big merges in a thread, one at a time."""
        runs = self._runs
        frozen = () if self._pending is None else (self._pending.old, self._pending.new)
        i = len(runs) - 2
        while i >= 0:
            old, new = runs[i], runs[i + 1]
            if (
                old in frozen
                or new in frozen
                or not (self.MERGE_RATIO * len(new) >= len(old) or len(old) < self.SMALL_RUN)
            ):
                i -= 1
                continue
            if self.background and len(old) + len(new) >= self.BACKGROUND_MIN:
                if self._pending is None:
                    self._pending = _Merge(old, new, self._merged)
                    frozen = (old, new)
                i -= 1
                continue
            runs[i : i + 2] = [self._merged(old, new)]
            i = min(i, len(runs) - 2)

    def _merged(self, old: _Run, new: _Run) -> _Run:
        """One run of two adjacent ones (``old``'s rows are the smaller), in exact-size arrays."""
        n, t0 = len(old) + len(new), time.perf_counter()
        hi, lo, rows = (np.empty(n, dtype=np.uint32) for _ in range(3))
        fast = self._fast()
        if fast is not None:
            fast.merge_runs(old.hi, old.lo, old.rows, new.hi, new.lo, new.rows, np.int64(self._kshift), hi, lo, rows)
        else:
            # each new entry goes after the old entries with keys <= its key
            at = np.searchsorted(self._keys(old.hi), self._keys(new.hi), side="right")
            at += np.arange(len(new), dtype=at.dtype)
            from_old = np.ones(n, dtype=bool)
            from_old[at] = False
            hi[at], lo[at], rows[at] = new.hi, new.lo, new.rows
            hi[from_old], lo[from_old], rows[from_old] = old.hi, old.lo, old.rows
        merged = self._run(hi, lo, rows, None, build_directory=fast)
        level = logging.INFO if n >= self.LOG_MERGE_MIN else logging.DEBUG
        if log.isEnabledFor(level):  # (the small merges come with nearly every insert)
            log.log(
                level,
                "index merge of %d entries (%d + %d) in %.3fs, mask %#x, thread %s",
                n,
                len(old),
                len(new),
                time.perf_counter() - t0,
                self.mask,
                threading.current_thread().name,
            )
        return merged

    def _poll(self) -> None:
        """Swap in a finished background merge (and start the merges it makes due)."""
        pending = self._pending
        if pending is None or pending.thread.is_alive():
            return
        pending.thread.join()
        self._pending = None
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        for i in range(len(self._runs) - 1):
            if self._runs[i] is pending.old and self._runs[i + 1] is pending.new:
                self._runs[i : i + 2] = [pending.result]
                break
        else:  # pragma: no cover - the runs of a pending merge are only replaced here
            raise AssertionError("the runs of a background merge were changed under it")
        self._merge_due()


def _set_bits(bits: np.ndarray, start: int, stop: int) -> None:
    """Set bits start..stop-1 of a little-endian packed bit array."""
    while start < stop and start & 7:
        bits[start >> 3] |= np.uint8(1 << (start & 7))
        start += 1
    full = stop & ~7
    if start < full:
        bits[start >> 3 : full >> 3] = 0xFF
        start = full
    while start < stop:
        bits[start >> 3] |= np.uint8(1 << (start & 7))
        start += 1


def _get_bits(bits: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The bits at ``rows`` (int64) as bools."""
    return ((bits[rows >> 3] >> (rows & 7).astype(np.uint8)) & 1).astype(bool)
