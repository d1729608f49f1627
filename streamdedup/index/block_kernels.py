"""The numba kernels of :class:`streamdedup.index.blocks.BlockIndex` (imported on first use).

Each is a loop version of the numpy path in :mod:`streamdedup.index.blocks` and gives the same
arrays (``tests/test_block_index.py`` checks both): a run is two parallel arrays, ``fps``
(uint64, sorted by their key bits, ties in row order) and ``rows`` (uint32).

``nogil=True``: the merge runs in a background thread while the caller's thread keeps
searching and inserting.  ``cache=True``: compiled once per machine (see numba_kernels.py).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic


@intrinsic
def _prefetch(typingctx, arr, idx):
    """Ask the CPU for the cache line of ``arr[idx]`` (llvm.prefetch: a read, kept in every level)."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())  # named p0 or p0i8 by the LLVM in use
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type], fnty)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


__all__ = ["scan_run", "merge_runs", "bucket_offsets"]

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
#: Buckets are prefetched this many queries ahead: a bucket's first lines are a cache miss
#: each (measured: 1.4x the queries a second at 10M rows, no change at 100M)
AHEAD = 2
#: Entries prefetched at the start of that bucket: the CPU's own stream prefetcher takes the
#: rest of it once the scan reads in order (prefetching all of a 1,500-entry bucket, at 100 M
#: entries, gave 0.8x the queries a second of 64: bench/README.md, "The scan kernel")
PREFETCH = 64
#: Entries a scan step tests without a branch (a constant, so LLVM unrolls and vectorises it:
#: on one 100 M-entry group, 2.5x the queries a second of the step of 8 with a run-time bound
#: that came before, 3.1x with the prefetch above; 32 and 128 gave 0.93x and 0.86x of 64); a
#: step with a hit is tested again one by one
BLOCK = 64


@njit(cache=True, nogil=True, inline="always")
def _popcount(x):
    # the textbook SWAR count: LLVM turns it into one popcnt instruction
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return (x * _H01) >> np.uint64(56)


@njit(cache=True, nogil=True, inline="always")
def _distance(x, kbits):
    """Bits set in ``x`` (a fingerprint XOR the query), plus 64 when its key bits ``kbits`` differ."""
    return _popcount(x) + (np.uint64(64) if x & kbits else np.uint64(0))


@njit(cache=True, nogil=True, inline="always")
def _first_key_at_least(fps, lo, hi, key, shift, kmask):
    """First position in [lo, hi) whose key is >= key (the keys are sorted)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if (fps[mid] >> shift) & kmask < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def scan_run(fps, rows, directory, dir_shift, shift, kmask, queries, alive, k):
    """Every alive entry of the run within ``k`` bits of a query and with its key.

    Returns (query index, position in the run, distance), in query order then position order.
    """
    n_q = len(queries)
    cap = 2 * n_q + 16
    out_q = np.empty(cap, dtype=np.int64)
    out_p = np.empty(cap, dtype=np.int64)
    out_d = np.empty(cap, dtype=np.int64)
    n = 0
    kk = np.uint64(k)
    # a directory whose buckets hold several keys is not narrowed by binary searches (two
    # chains of dependent loads): its few extra entries fail the key check in the scan instead
    kbits = kmask << shift if len(directory) and dir_shift != 0 else np.uint64(0)
    # every query's range first, so that each scan can prefetch the bucket AHEAD queries on
    los = np.empty(n_q, dtype=np.int64)
    his = np.empty(n_q, dtype=np.int64)
    for i in range(n_q):
        key = (queries[i] >> shift) & kmask
        if len(directory):
            b = key >> dir_shift
            los[i] = directory[b]
            his[i] = directory[b + np.uint64(1)]
        else:
            lo = _first_key_at_least(fps, np.int64(0), np.int64(len(fps)), key, shift, kmask)
            los[i] = lo
            his[i] = _first_key_at_least(fps, lo, np.int64(len(fps)), key + np.uint64(1), shift, kmask)
    for i in range(n_q):
        q = queries[i]
        hi = his[i]
        if i + AHEAD < n_q:
            ahead = los[i + AHEAD]
            for t in range(ahead, min(his[i + AHEAD], ahead + PREFETCH), 8):
                _prefetch(fps, t)  # type: ignore[call-arg]  # (an intrinsic: numba passes the typing context)
        j = los[i]
        while j < hi:
            end = min(j + BLOCK, hi)
            # the least distance in the step, with no branch inside (vectorised popcounts): most
            # steps stop here.  A full step indexes a slice by a constant range, so its loop has
            # a constant trip count and no negative-index fix-up (a gather) per entry
            least = np.uint64(128)
            if end - j == BLOCK:
                step = fps[j:end]
                for t in range(BLOCK):
                    least = min(least, _distance(step[t] ^ q, kbits))
            else:
                for t in range(j, end):
                    least = min(least, _distance(fps[t] ^ q, kbits))
            if least > kk:
                j = end
                continue
            for t in range(j, end):
                d = _distance(fps[t] ^ q, kbits)
                if d <= kk:
                    r = rows[t]
                    if (alive[r >> 3] >> (r & 7)) & 1:
                        if n == cap:
                            cap *= 2
                            out_q = _grown(out_q, cap)
                            out_p = _grown(out_p, cap)
                            out_d = _grown(out_d, cap)
                        out_q[n] = i
                        out_p[n] = t
                        out_d[n] = d
                        n += 1
            j = end
    return out_q[:n], out_p[:n], out_d[:n]


@njit(cache=True, nogil=True, inline="always")
def _grown(a, cap):
    out = np.empty(cap, dtype=a.dtype)
    out[: len(a)] = a
    return out


@njit(cache=True, nogil=True)
def merge_runs(fps_a, rows_a, fps_b, rows_b, shift, kmask, out_fps, out_rows):
    """Merge two runs by key into ``out_*`` (preallocated, exact size); on equal keys ``a``'s
    entries come first (its rows are the older, smaller ones)."""
    na = len(fps_a)
    nb = len(fps_b)
    i = 0
    j = 0
    o = 0
    while i < na and j < nb:
        if (fps_b[j] >> shift) & kmask < (fps_a[i] >> shift) & kmask:
            out_fps[o] = fps_b[j]
            out_rows[o] = rows_b[j]
            j += 1
        else:
            out_fps[o] = fps_a[i]
            out_rows[o] = rows_a[i]
            i += 1
        o += 1
    while i < na:
        out_fps[o] = fps_a[i]
        out_rows[o] = rows_a[i]
        i += 1
        o += 1
    while j < nb:
        out_fps[o] = fps_b[j]
        out_rows[o] = rows_b[j]
        j += 1
        o += 1


@njit(cache=True, nogil=True)
def bucket_offsets(fps, shift, kmask, dir_shift, n_buckets):
    """The directory of a sorted run: where each bucket (``key >> dir_shift``) starts, and its end."""
    counts = np.zeros(n_buckets + 1, dtype=np.int64)
    for j in range(len(fps)):
        counts[((fps[j] >> shift) & kmask) >> dir_shift] += 1
    out = np.empty(n_buckets + 1, dtype=np.uint32)
    total = 0
    for b in range(n_buckets):
        out[b] = total
        total += counts[b]
    out[n_buckets] = total
    return out
