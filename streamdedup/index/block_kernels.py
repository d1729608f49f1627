"""The numba kernels of :class:`streamdedup.index.blocks.BlockIndex` (imported on first use).

Each is a loop version of the numpy path in :mod:`streamdedup.index.blocks` and gives the same
arrays (``tests/test_block_index.py`` checks both): a run is three parallel uint32 arrays, ``hi``
and ``lo`` (the two halves of each fingerprint rotated so that its key is ``hi``'s top bits,
sorted by key, ties in row order) and ``rows``.

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

#: Buckets are prefetched this many queries ahead: a bucket's first lines are a cache miss
#: each (measured: 1.4x the queries a second at 10M rows, no change at 100M)
AHEAD = 2
#: Entries (low halves) prefetched at the start of that bucket: the CPU's own stream prefetcher
#: takes the rest of it once the scan reads in order (prefetching all of a 1,500-entry bucket of
#: whole fingerprints, at 100 M entries, gave 0.8x the queries a second of 64: bench/README.md,
#: "The scan kernel"; on the halves, 32 and 128 gave the same as 64)
PREFETCH = 64
#: Entries a scan step tests without a branch (a constant, so LLVM unrolls and vectorises it:
#: on one 100 M-entry group of whole fingerprints, 2.5x the queries a second of the step of 8
#: with a run-time bound that came before; on the halves, 32 gave 0.5x and 128 the same as 64);
#: a step with a hit is tested again one by one
BLOCK = 64


@intrinsic
def _xor_popcount(typingctx, a, b):
    """popcount(a ^ b) of two uint32s, computed in 32 bits: numba widens integer arithmetic to
    64 bits, which halves the lanes of the vector loop (and made LLVM give up vpopcnt)."""
    if a != types.uint32 or b != types.uint32:
        return None
    sig = types.uint32(a, b)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.ctpop", [i32], ir.FunctionType(i32, [i32]))
        return builder.call(fn, [builder.xor(args[0], args[1])])

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _first_key_at_least(hi, lo, end, key, kshift):
    """First position in [lo, end) whose key (``hi >> kshift``) is >= key (the keys are sorted)."""
    while lo < end:
        mid = (lo + end) >> 1
        if hi[mid] >> kshift < key:
            lo = mid + 1
        else:
            end = mid
    return lo


@njit(cache=True, nogil=True)
def scan_run(lo, hi, rows, directory, dir_shift, kshift, q_lo, q_hi, alive, k):
    """Every alive entry of the run within ``k`` bits of a query and with its key.

    A run's entries are two uint32 halves of the rotated fingerprint (``hi`` holds the key in
    its top bits): the scan reads only ``lo`` (4 bytes an entry, 16 to a vector), and an entry
    within ``k`` there is tested on ``hi`` (its key and the rest of its distance).
    Returns (query index, position in the run, distance), in query order then position order.
    """
    n_q = len(q_lo)
    cap = 2 * n_q + 16
    out_q = np.empty(cap, dtype=np.int64)
    out_p = np.empty(cap, dtype=np.int64)
    out_d = np.empty(cap, dtype=np.int64)
    n = 0
    kk = np.uint32(k)
    # every query's range first, so that each scan can prefetch the bucket AHEAD queries on
    los = np.empty(n_q, dtype=np.int64)
    his = np.empty(n_q, dtype=np.int64)
    for i in range(n_q):
        key = np.int64(q_hi[i] >> kshift)  # (shifts are int64: uint64 with int64 is float64 in numba)
        if len(directory):
            b = key >> dir_shift
            los[i] = directory[b]
            his[i] = directory[b + 1]
        else:
            # (a directory whose buckets hold several keys is not narrowed by binary searches,
            # two chains of dependent loads: its few extra entries fail the key check below)
            first = _first_key_at_least(hi, np.int64(0), np.int64(len(hi)), key, kshift)
            los[i] = first
            his[i] = _first_key_at_least(hi, first, np.int64(len(hi)), key + 1, kshift)
    for i in range(n_q):
        ql = q_lo[i]
        qh = q_hi[i]
        end_i = his[i]
        if i + AHEAD < n_q:
            ahead = los[i + AHEAD]
            for t in range(ahead, min(his[i + AHEAD], ahead + PREFETCH), 16):
                _prefetch(lo, t)  # type: ignore[call-arg]  # (an intrinsic: numba passes the typing context)
        j = los[i]
        while True:
            j = _next_step(lo, j, end_i, ql, kk)
            if j >= end_i:
                break
            end = min(j + BLOCK, end_i)
            for t in range(j, end):
                d: int = _xor_popcount(lo[t], ql)  # type: ignore[call-arg]  # (intrinsics: numba passes the typing context)
                if d > kk or (hi[t] ^ qh) >> kshift:  # too far already, or another key
                    continue
                d = d + _xor_popcount(hi[t], qh)
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


@njit(cache=True, nogil=True, inline="never")
def _next_step(lo, j, end, ql, kk):
    """The first step of ``lo[j:end]`` (BLOCK entries, the last one maybe fewer) with an entry
    within ``kk`` bits of ``ql``, or ``end``.

    Each step is its least distance, with no branch inside (vectorised popcounts): most steps
    stop there.  A full step indexes a slice by a constant range, so its loop has a constant
    trip count and no negative-index fix-up (a gather).  Not inlined: compiled apart from the
    rest of the scan, this loop ran at 1.35-1.45x the queries a second of the same loop inside
    ``scan_run`` (bench/README.md, "Half-width scans").
    """
    while j + BLOCK <= end:
        least = np.uint32(64)
        step = lo[j : j + BLOCK]
        for t in range(BLOCK):
            least = min(least, _xor_popcount(step[t], ql))  # type: ignore[call-arg]
        if least <= kk:
            return j
        j += BLOCK
    if j < end:
        least = np.uint32(64)
        for t in range(j, end):
            least = min(least, _xor_popcount(lo[t], ql))  # type: ignore[call-arg]
        if least <= kk:
            return j
    return end


@njit(cache=True, nogil=True, inline="always")
def _grown(a, cap):
    out = np.empty(cap, dtype=a.dtype)
    out[: len(a)] = a
    return out


@njit(cache=True, nogil=True)
def merge_runs(hi_a, lo_a, rows_a, hi_b, lo_b, rows_b, kshift, out_hi, out_lo, out_rows):
    """Merge two runs by key (``hi >> kshift``) into ``out_*`` (preallocated, exact size); on
    equal keys ``a``'s entries come first (its rows are the older, smaller ones)."""
    na = len(hi_a)
    nb = len(hi_b)
    i = 0
    j = 0
    o = 0
    while i < na and j < nb:
        if hi_b[j] >> kshift < hi_a[i] >> kshift:
            out_hi[o] = hi_b[j]
            out_lo[o] = lo_b[j]
            out_rows[o] = rows_b[j]
            j += 1
        else:
            out_hi[o] = hi_a[i]
            out_lo[o] = lo_a[i]
            out_rows[o] = rows_a[i]
            i += 1
        o += 1
    while i < na:
        out_hi[o] = hi_a[i]
        out_lo[o] = lo_a[i]
        out_rows[o] = rows_a[i]
        i += 1
        o += 1
    while j < nb:
        out_hi[o] = hi_b[j]
        out_lo[o] = lo_b[j]
        out_rows[o] = rows_b[j]
        j += 1
        o += 1


@njit(cache=True, nogil=True)
def bucket_offsets(hi, bucket_shift, n_buckets):
    """The directory of a sorted run: where each bucket (``hi >> bucket_shift``) starts, and its end."""
    counts = np.zeros(n_buckets + 1, dtype=np.int64)
    for j in range(len(hi)):
        counts[hi[j] >> bucket_shift] += 1
    out = np.empty(n_buckets + 1, dtype=np.uint32)
    total = 0
    for b in range(n_buckets):
        out[b] = total
        total += counts[b]
    out[n_buckets] = total
    return out
