"""Charikar's simhash (STOC 2002) over 64-bit feature hashes, accumulated in numpy.

For each bit position add a feature's weight when its hash has the bit set and subtract it
when not; the signs of the 64 sums are the fingerprint.

Weights (fingerprint scheme 2)
    A page's *distinct* features each vote, with weight ``1 + floor(log2(tf))`` where ``tf``
    is how often the feature occurs in the page: 1 for once, 2 for 2-3 times, 3 for 4-7, ...
    9 for 256-511.  Repetition counts, but only logarithmically, so no phrase can outvote a
    page: scheme 1 weighted by raw frequency, and an index page whose "(in module" occurred
    400 times took the fingerprint of every other index page of its site.  The weight is an
    integer, computed exactly (the bit length of ``tf``), so the sums are exact and the bits
    the same on every machine (a floating ``log`` could differ in its last bit between libms
    and flip a tied bit).  bench/README.md ("Feature weights") has the measurements behind the choice.

The accumulation is batched: the distinct features of many pages (:func:`distinct_features`)
are counted in ``np.bincount`` over (page, byte position, byte value), each once, plus the
extra weight of the repeated ones, and a small table turns byte-value weights into bit
weights::

    feature hash (little-endian bytes)  b0 b1 ... b7
    bincount index   page * 2048  +  j * 256  +  b_j     (j = 0..7), weight w(feature)
    sums[page, j, v] @ BITS[v, i]  ->  ones[page, 8j + i]

Bit ``i`` of the fingerprint is 1 when more than half the page's feature weight has bit ``i``
set.

>>> from streamdedup.fingerprinting.features import text_shingles
>>> a = simhash(text_shingles("the quick brown fox jumps over the lazy dog"))
>>> b = simhash(text_shingles("the quick brown fox jumped over the lazy dog"))
>>> f"{a:016x}", hamming(a, b) < hamming(a, simhash(text_shingles("lorem ipsum dolor sit")))
('25bbbbf468229182', True)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamdedup.fingerprinting import kernels

__all__ = [
    "simhash",
    "simhash_many",
    "distinct_features",
    "feature_weights",
    "hamming",
    "hamming_many",
    "to_hex",
    "from_hex",
]

# BITS[v, i] = bit i of byte value v
_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(np.float64)
_LANE = (np.arange(8, dtype=np.int64) * 256)[None, :]


def feature_weights(tf: np.ndarray) -> np.ndarray:
    """The vote of a feature that occurs ``tf`` (>= 1) times in a page: ``1 + floor(log2(tf))``.

    Computed exactly on integers (the bit length of ``tf``).

    >>> feature_weights(np.array([1, 2, 3, 4, 400])).tolist()
    [1, 2, 2, 3, 9]
    """
    tf = np.asarray(tf, dtype=np.int64)
    # frexp is exact for integers below 2**53: tf = m * 2**e with 0.5 <= m < 1, so e = bit length
    return np.frexp(tf.astype(np.float64))[1].astype(np.int64)


def distinct_features(features: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct features of each page of a batch and how often each occurs in its page.

    Returns ``(features, pages, counts)``, one entry per distinct (page, feature), in no
    particular order.

    Sorting is the cost, so only features that may repeat are sorted: each page's features are
    first counted in a hash table of their low bits (a ``bincount``, 4 slots per feature), and a
    feature alone in its slot occurs once.  The rest are sorted page by page.  The table only
    decides which features are sorted, never a result.

    >>> f, p, c = distinct_features([np.array([5, 3, 5], dtype=np.uint64), np.array([5], dtype=np.uint64)])
    >>> sorted(zip(p.tolist(), f.tolist(), c.tolist()))
    [(0, 3, 1), (0, 5, 2), (1, 5, 1)]
    """
    n_pages = len(features)
    lengths = np.fromiter((len(f) for f in features), dtype=np.int64, count=n_pages)
    flat = np.concatenate(features).astype("<u8", copy=False) if n_pages else np.zeros(0, "<u8")
    page = np.repeat(np.arange(n_pages, dtype=np.int64), lengths)
    # per page a table of 2**b >= 4 * length slots, at offset[page]
    slots = np.left_shift(1, np.frexp(np.maximum(lengths, 1) * 4 - 1)[1].astype(np.int64))
    offset = np.cumsum(slots) - slots
    slot = (flat & (slots - 1).astype(np.uint64)[page]).astype(np.int64) + offset[page]
    alone = np.bincount(slot, minlength=int(slots.sum()))[slot] == 1
    once = np.flatnonzero(alone)
    rest = np.flatnonzero(~alone)  # in page order
    rest_flat, rest_page = flat[rest], page[rest]
    per_page = np.bincount(rest_page, minlength=n_pages)
    pos = 0
    for n in per_page.tolist():
        if n > 1:
            rest_flat[pos : pos + n].sort()
        pos += n
    start = np.ones(len(rest_flat), dtype=bool)
    np.not_equal(rest_flat[1:], rest_flat[:-1], out=start[1:])
    start[1:] |= rest_page[1:] != rest_page[:-1]
    first = np.flatnonzero(start)
    counts = np.diff(np.append(first, len(rest_flat)))
    return (
        np.concatenate((flat[once], rest_flat[first])),
        np.concatenate((page[once], rest_page[first])),
        np.concatenate((np.ones(len(once), dtype=np.int64), counts)),
    )


def simhash_many(features: Sequence[np.ndarray]) -> np.ndarray:
    """Fingerprints of many pages at once, one ``uint64`` per feature array.

    A page without features gets fingerprint 0.

    >>> fps = simhash_many([np.array([1, 2, 3], dtype=np.uint64), np.array([], dtype=np.uint64)])
    >>> [f"{int(f):016x}" for f in fps]
    ['0000000000000003', '0000000000000000']
    """
    n_pages = len(features)
    if n_pages == 0:
        return np.empty(0, dtype=np.uint64)
    flat, page, tf = distinct_features(features)
    weight = feature_weights(tf)
    total = np.bincount(page, weights=weight, minlength=n_pages)
    # (n_distinct, 8) byte values, offset into the page's 2048-bin slice.
    index = flat.view(np.uint8).reshape(-1, 8).astype(np.int64)
    index += _LANE
    index += (page * 2048)[:, None]
    # Most features occur once (weight 1): count every feature once without weights (fast), then
    # add the extra weight of the repeated ones in a weighted bincount of those few.
    sums = np.bincount(index.ravel(), minlength=n_pages * 2048).astype(np.float64)
    heavy = np.flatnonzero(weight > 1)
    if len(heavy):
        extra = np.repeat((weight[heavy] - 1).astype(np.float64), 8)
        sums += np.bincount(index[heavy].ravel(), weights=extra, minlength=n_pages * 2048)
    ones = (sums.reshape(n_pages, 8, 256) @ _BITS).reshape(n_pages, 64)  # weight with bit 8j+i set
    # integer weights: every sum is exact in float64, so the comparison is the same everywhere
    bits = (2 * ones > total[:, None]).astype(np.uint8)
    return np.packbits(bits, axis=1, bitorder="little").view("<u8").ravel().astype(np.uint64)


def simhash_flat(flat: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """:func:`simhash_many` of pages whose features are given as one flat array and a count per page.

    The compiled kernel (``numba_kernels.simhash_log_tf``) does it when numba is there; the numpy
    path above otherwise.  Both give the same bits (tests/test_kernels.py).

    >>> simhash_flat(np.array([1, 2, 3], dtype=np.uint64), np.array([3, 0])).tolist()
    [3, 0]
    """
    fast = kernels.compiled()
    if fast is not None:
        return fast.simhash_log_tf(np.ascontiguousarray(flat, dtype=np.uint64), np.asarray(counts, dtype=np.int64))
    return simhash_many(np.split(flat, np.cumsum(counts)[:-1]) if len(counts) else [])


def simhash(features: np.ndarray) -> int:
    """Fingerprint of one page's feature hashes, as an ``int`` in [0, 2**64).

    >>> simhash(np.array([0xFF, 0x0F, 0x01], dtype=np.uint64))
    15
    """
    return int(simhash_many([features])[0])


def hamming(a: int, b: int) -> int:
    """Number of differing bits.

    >>> hamming(0b1011, 0b0001)
    2
    """
    return (a ^ b).bit_count()


# popcount of every byte value, for distances over arrays
_POP8 = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).sum(axis=1).astype(np.uint8)


def hamming_many(a: np.ndarray | int, b: np.ndarray) -> np.ndarray:
    """Element-wise Hamming distances of ``uint64`` arrays (or a scalar against an array).

    >>> hamming_many(np.uint64(7), np.array([0, 1, 7], dtype=np.uint64)).tolist()
    [3, 2, 0]
    """
    x = np.bitwise_xor(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64))
    flat = np.ascontiguousarray(x.reshape(-1), dtype="<u8")
    return _POP8[flat.view(np.uint8)].reshape(-1, 8).sum(axis=1, dtype=np.int64).reshape(x.shape)


def to_hex(fp: int) -> str:
    """The wire format of a fingerprint: 16 lower-case hex digits.

    >>> to_hex(255)
    '00000000000000ff'
    """
    return f"{fp:016x}"


def from_hex(text: str) -> int:
    """Parse :func:`to_hex` output; rejects anything that is not 1-16 hex digits.

    >>> from_hex("00000000000000ff")
    255
    """
    if not 0 < len(text) <= 16:
        raise ValueError(f"a fingerprint is 16 hex digits, got {text!r}")
    return int(text, 16)
