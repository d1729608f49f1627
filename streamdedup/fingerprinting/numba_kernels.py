"""The numba kernels of the feature and MinHash hot paths (imported on first use by :mod:`.kernels`).

Each kernel is a loop version of a numpy reference in :mod:`streamdedup.fingerprinting.features`
or :mod:`streamdedup.fingerprinting.minhash` and gives the same bits (``tests/test_kernels.py``
checks both on a property-based corpus).  Everything is integer arithmetic modulo 2**64 (or, in
the MinHash kernel's 32-bit lanes, the same sums split in halves), which numba and numpy both do
by wrapping, so the two paths cannot drift apart by rounding.

``cache=True``: compiled code is kept next to this file (or in ``NUMBA_CACHE_DIR`` / the
user's cache directory when that is read-only), so only the first process on a machine pays
the compile time (bench/README.md has the figures).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

__all__ = ["word_hashes", "shingle_hashes", "minhash_tops", "simhash_log_tf", "bottom_n_xor"]


@njit(cache=True, nogil=True, inline="always")
def _mix64(x):
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True)
def word_hashes(codes, bounds, table, seed, mul):
    """Word hashes of every text of a batch, and the number of words of each text.

    ``codes``/``bounds``: a :class:`streamdedup.fingerprinting.tokens.Batch` (one unit per code
    point); ``table``: :func:`streamdedup.fingerprinting.tokens.table`.  A word ``c_1 .. c_L``
    (lower-cased code points) hashes to ``mix64(((seed * mul + c_1) * mul + c_2) ... * mul + c_L)``.
    """
    n_docs = len(bounds) - 1
    out = np.empty(len(codes), dtype=np.uint64)  # at most one word per code point (lazily committed)
    counts = np.zeros(n_docs, dtype=np.int64)
    n = 0
    for d in range(n_docs):
        first = n
        h = seed
        length = 0
        for p in range(bounds[d], bounds[d + 1]):
            e = table[codes[p]]
            low = np.uint64(e & 0x1FFFFF)
            k = e >> 21
            if k == 1:  # word character: one more digit of the polynomial
                h = h * mul + low
                length += 1
            else:
                if length:
                    out[n] = _mix64(h)
                    n += 1
                    h = seed
                    length = 0
                if k == 2:  # a script without spaces: the character is a word
                    out[n] = _mix64(seed * mul + low)
                    n += 1
        if length:
            out[n] = _mix64(h)
            n += 1
        counts[d] = n - first
    return out[:n].copy(), counts


@njit(cache=True, nogil=True)
def shingle_hashes(hashes, counts, n, mul):
    """Shingle hashes of every text (the rule of ``features.shingle_hashes``), and their counts."""
    n_docs = len(counts)
    total = 0
    for d in range(n_docs):
        m = counts[d]
        total += m - n + 1 if m >= n else (1 if m > 0 else 0)
    out = np.empty(total, dtype=np.uint64)
    out_counts = np.empty(n_docs, dtype=np.int64)
    pos = 0
    q = 0
    for d in range(n_docs):
        m = counts[d]
        if m >= n:
            for i in range(pos, pos + m - n + 1):
                acc = hashes[i]
                for j in range(1, n):
                    acc = acc * mul + hashes[i + j]
                out[q] = _mix64(acc)
                q += 1
            out_counts[d] = m - n + 1
        elif m > 0:
            acc = hashes[pos]
            for j in range(1, m):
                acc = acc * mul + hashes[pos + j]
            out[q] = _mix64(acc)
            q += 1
            out_counts[d] = 1
        else:
            out_counts[d] = 0
        pos += m
    return out, out_counts


@intrinsic
def _top32(typingctx, a_lo, a_hi, c_lo, c_hi, u_lo, u_hi):
    """The top 32 bits of ``(a * u + c) mod 2**64``, from the 32-bit halves of ``a``, ``c``, ``u``.

    ``a * u + c = a_lo*u_lo + c_lo + 2**32 * (a_hi*u_lo + a_lo*u_hi + c_hi)  (mod 2**64)``, so the
    top half is ``hi32(a_lo*u_lo + c_lo) + a_hi*u_lo + a_lo*u_hi + c_hi (mod 2**32)``: one 32x32->64
    multiply and two 32-bit ones.  Written in LLVM so that it stays in 32 bits (numba widens integer
    arithmetic to 64): a loop over the permutations then runs in 32-bit vector lanes, twice the
    lanes of 64-bit ones, and needs no 64-bit multiply or unsigned 64-bit minimum, which AVX2 does
    not have (bench/README.md, "MinHash in 32-bit lanes")."""
    if not all(t == types.uint32 for t in (a_lo, a_hi, c_lo, c_hi, u_lo, u_hi)):
        return None
    sig = types.uint32(a_lo, a_hi, c_lo, c_hi, u_lo, u_hi)

    def codegen(context, builder, signature, args):
        al, ah, cl, ch, ul, uh = args
        i64 = ir.IntType(64)
        low = builder.add(builder.mul(builder.zext(al, i64), builder.zext(ul, i64)), builder.zext(cl, i64))
        top = builder.trunc(builder.lshr(low, ir.Constant(i64, 32)), ir.IntType(32))
        top = builder.add(top, builder.mul(ah, ul))
        top = builder.add(top, builder.mul(al, uh))
        return builder.add(top, ch)

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _halves(u):
    return np.uint32(u & np.uint64(0xFFFFFFFF)), np.uint32(u >> np.uint64(32))


@njit(cache=True, nogil=True)
def minhash_tops(flat, counts, key, a_lo, a_hi, c_lo, c_hi):
    """``(n_docs, num_perm)`` uint32 minima of the top 32 bits of ``a_j * mix64(x ^ key) + c_j``
    over each text's shingles (the top half of the minimum is the minimum of the top halves).
    ``a_*``, ``c_*``: the uint32 halves of the multipliers and increments."""
    n_docs = len(counts)
    num_perm = len(a_lo)
    out = np.empty((n_docs, num_perm), dtype=np.uint32)
    mins = np.empty(num_perm, dtype=np.uint32)  # a local row: no aliasing, so LLVM vectorises
    pos = 0
    for d in range(n_docs):
        mins[:] = np.uint32(0xFFFFFFFF)
        end = pos + counts[d]
        i = pos
        # four shingles per pass over the permutations: a_j and c_j are loaded once for four
        # (2.5x faster than one at a time here; eight was no better)
        while i + 4 <= end:
            l0, h0 = _halves(_mix64(flat[i] ^ key))
            l1, h1 = _halves(_mix64(flat[i + 1] ^ key))
            l2, h2 = _halves(_mix64(flat[i + 2] ^ key))
            l3, h3 = _halves(_mix64(flat[i + 3] ^ key))
            for j in range(num_perm):
                al = a_lo[j]
                ah = a_hi[j]
                cl = c_lo[j]
                ch = c_hi[j]
                t0: int = _top32(al, ah, cl, ch, l0, h0)  # type: ignore[call-arg]  # (intrinsics: numba passes the typing context)
                t1: int = _top32(al, ah, cl, ch, l1, h1)
                t2: int = _top32(al, ah, cl, ch, l2, h2)
                t3: int = _top32(al, ah, cl, ch, l3, h3)
                mins[j] = min(mins[j], min(min(t0, t1), min(t2, t3)))
            i += 4
        while i < end:
            lo, hi = _halves(_mix64(flat[i] ^ key))
            for j in range(num_perm):
                mins[j] = min(mins[j], _top32(a_lo[j], a_hi[j], c_lo[j], c_hi[j], lo, hi))  # type: ignore[call-arg]
            i += 1
        out[d] = mins
        pos = end
    return out


@njit(cache=True, nogil=True)
def simhash_log_tf(flat, counts):
    """Simhash of every page under scheme 2's weights, one ``uint64`` per page.

    Each *distinct* feature of a page votes with weight ``1 + floor(log2(tf))`` (the bit length
    of ``tf``, its number of occurrences in the page); bit ``i`` is 1 when more than half the
    page's total weight has bit ``i`` set.  Integer sums: exact, the same bits as any exact
    implementation.

    Occurrences are counted in an open-addressing table per page (the features are mixed
    hashes, so their low bits index it; 8x faster here than sorting the page), each slot a
    feature and its count side by side (one cache line a probe), and the slots taken are listed
    so that only they are read back.  The weights go into 8 x 256 byte-value sums; each byte's
    8 bit sums come from halving its 256 sums 8 times (bit 7's sum is the upper half's total,
    then the halves are added and the same is done for bit 6, and so on).
    """
    n_pages = len(counts)
    out = np.zeros(n_pages, dtype=np.uint64)
    biggest = 16
    for d in range(n_pages):
        while biggest < 2 * counts[d]:
            biggest *= 2
    slots = np.zeros(2 * biggest, dtype=np.uint64)  # feature, count; count 0 = empty
    taken = np.empty(biggest, dtype=np.int64)
    sums = np.zeros(2048, dtype=np.int64)
    half_sums = np.empty(256, dtype=np.int64)
    pos = 0
    for d in range(n_pages):
        m = counts[d]
        if m == 0:
            continue
        size = 16
        while size < 2 * m:
            size *= 2
        mask = np.uint64(size - 1)
        n_taken = 0
        for i in range(pos, pos + m):
            x = flat[i]
            h = x & mask
            while True:
                s = np.int64(h) * 2
                tf = slots[s + 1]
                if tf == 0:
                    slots[s] = x
                    slots[s + 1] = 1
                    taken[n_taken] = s
                    n_taken += 1
                    break
                if slots[s] == x:
                    slots[s + 1] = tf + np.uint64(1)
                    break
                h = (h + np.uint64(1)) & mask
        pos += m
        sums[:] = 0
        total = 0
        for t in range(n_taken):
            s = taken[t]
            tf = slots[s + 1]
            slots[s + 1] = 0
            w = 0
            while tf:
                w += 1
                tf >>= np.uint64(1)
            total += w
            x = slots[s]
            for j in range(8):
                sums[j * 256 + np.int64((x >> np.uint64(8 * j)) & np.uint64(255))] += w
        fp = np.uint64(0)
        for j in range(8):
            for v in range(256):
                half_sums[v] = sums[j * 256 + v]
            half = 128
            for i in range(7, -1, -1):
                ones = 0
                for v in range(half):
                    ones += half_sums[half + v]
                    half_sums[v] += half_sums[half + v]
                if 2 * ones > total:
                    fp |= np.uint64(1) << np.uint64(8 * j + i)
                half >>= 1
        out[d] = fp
    return out


@njit(cache=True, nogil=True)
def bottom_n_xor(flat, counts, n):
    """XOR of the ``n`` smallest distinct values of each page (all of them if it has fewer; 0 if
    none): the rule of ``cluster._keys_numpy``.

    A sorted buffer of the ``n`` smallest so far per page: a value not below the buffer's
    largest (once full) is rejected with one comparison, which is almost every value.
    """
    n_docs = len(counts)
    out = np.zeros(n_docs, dtype=np.uint64)
    low = np.empty(n, dtype=np.uint64)
    pos = 0
    for d in range(n_docs):
        size = 0
        for i in range(pos, pos + counts[d]):
            x = flat[i]
            if size == n and x >= low[n - 1]:
                continue
            j = size  # insertion point: the first slot holding a value > x
            while j > 0 and low[j - 1] > x:
                j -= 1
            if j > 0 and low[j - 1] == x:
                continue  # a repeat
            last = size if size < n else n - 1
            for t in range(last, j, -1):
                low[t] = low[t - 1]
            low[j] = x
            if size < n:
                size += 1
        key = np.uint64(0)
        for t in range(size):
            key ^= low[t]
        out[d] = key
        pos += counts[d]
    return out
