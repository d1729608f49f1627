"""Bottom-n cluster keys: one 64-bit key per page, equal for near-duplicates with probability ~ J**n.

The key ("simple simhashing", Manasse's bottom-n scheme) needs no index: two pages whose keys
are equal are put in one cluster, so a downstream job can key a topic (or a GROUP BY) by it.

Definition (the format; changing any of it changes every key)
    The page's set of word 3-shingle hashes (:func:`streamdedup.fingerprinting.features.shingle_hashes_many`
    with ``n = 3``, the MinHash shingles: ``mix64`` of the word-hash polynomial, 64 bits, the
    same on every machine and in every process).  Of its *distinct* values, take the ``n``
    smallest as unsigned 64-bit integers, and XOR them::

        key = s_1 ^ s_2 ^ ... ^ s_n        s_1 < s_2 < ... < s_n  the n smallest distinct shingle hashes

    * A page with fewer than ``n`` distinct shingles: the XOR of all of them (so it can only
      share its key with a page that has exactly its shingle set, or by a 2**-64 accident).
    * A page with no shingles (no words): no key (``None`` / JSON null).
    * ``n = 0``: keys are off (every page has none).

Why P(equal) ~ J**n
    The n smallest values of ``A`` and of ``B`` are the same exactly when the n smallest values
    of ``A ∪ B`` all lie in ``A ∩ B``.  The shingle hash orders the union at random, so that has
    probability ``C(|A ∩ B|, n) / C(|A ∪ B|, n)``, which is ``J**n`` for large sets and a little
    less for small ones (``J = |A ∩ B| / |A ∪ B|``); two different n-sets give the same XOR
    with probability 2**-64.  Larger ``n``: fewer pages of low similarity joined, but fewer of
    the near-duplicates joined too (J = 0.9: 0.81 at n = 2, 0.66 at n = 4, 0.43 at n = 8);
    bench/cluster_key.py measures it on the benchmark corpus.

The numpy path takes the page minima ``n`` times (each pass the minimum of the values above
the previous one, so repeats are skipped), a few vectorised passes over the batch; the numba
kernel keeps the ``n`` smallest in a small sorted buffer per page.  Both give the same bits
(tests/test_cluster.py).

>>> from streamdedup.fingerprinting.features import text_shingles
>>> key = cluster_key_of(text_shingles("the quick brown fox jumps over the lazy dog"), 4)
>>> key == cluster_key_of(text_shingles("The quick brown fox -- jumps over the lazy dog!"), 4)
True
>>> cluster_key_of(text_shingles(""), 4) is None
True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamdedup.fingerprinting import kernels
from streamdedup.fingerprinting.features import shingle_hashes_many, word_hashes_many

__all__ = [
    "CLUSTER_WORDS",
    "DEFAULT_CLUSTER_N",
    "MAX_CLUSTER_N",
    "check_cluster_n",
    "cluster_keys_flat",
    "cluster_key_of",
    "cluster_keys_texts",
    "key_list",
]

#: Words per shingle of the key: word 3-shingles, the shingles whose Jaccard the key tracks.
CLUSTER_WORDS = 3
#: Shingle hashes XOR-ed into a key by default (bench/README.md "Cluster key" has the measurement:
#: keyed from the HTML, n = 4 joins 97% of the corpus' pairs at J >= 0.95 and 88% at 0.9..0.95,
#: 3% of those at J 0.5..0.6 and 0.2% at 0.3..0.5; n = 2 joins twice as many of the latter).
DEFAULT_CLUSTER_N = 4
#: The largest n accepted: beyond it only exact copies would still share a key.
MAX_CLUSTER_N = 64

_U64 = np.uint64
_MAX = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def check_cluster_n(n: int) -> int:
    """``n`` as an int, or ValueError saying what is accepted."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_CLUSTER_N:
        raise ValueError(f"cluster n must be a whole number in 0..{MAX_CLUSTER_N}, e.g. {DEFAULT_CLUSTER_N}; got {n!r}")
    return int(n)


def cluster_keys_flat(
    flat: np.ndarray, counts: np.ndarray, n: int = DEFAULT_CLUSTER_N, *, compiled: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Keys of many pages given as one array of shingle hashes (page ``i``: the next ``counts[i]``).

    Returns ``(keys, has_key)``: ``uint64`` keys and a bool mask, False for a page without
    shingles (its ``keys`` entry is 0) and for every page when ``n == 0``.  ``compiled`` picks
    the path (default: the numba kernel when numba is installed); both give the same bits.

    >>> keys, has = cluster_keys_flat(np.array([5, 3, 9, 3, 7], np.uint64), np.array([4, 0, 1]), n=2)
    >>> keys.tolist(), has.tolist()
    ([6, 0, 7], [True, False, True])
    """
    n = check_cluster_n(n)
    flat = np.ascontiguousarray(flat, dtype=_U64)
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or (counts < 0).any() or int(counts.sum()) != len(flat):
        raise ValueError(f"counts must be non-negative and sum to len(flat) = {len(flat)}; got {counts.sum()}")
    if n == 0:
        return np.zeros(len(counts), dtype=_U64), np.zeros(len(counts), dtype=bool)
    fast = None if compiled is False else kernels.compiled()
    if compiled and fast is None:
        raise RuntimeError("the compiled kernels need numba (pip install numba)")
    keys = fast.bottom_n_xor(flat, counts, n) if fast is not None else _keys_numpy(flat, counts, n)
    return keys, counts > 0


def _keys_numpy(flat: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    """``n`` passes, each the per-page minimum of the values above the previous pass's minimum."""
    keys = np.zeros(len(counts), dtype=_U64)
    docs = np.flatnonzero(counts)  # reduceat needs non-empty segments
    if not len(docs):
        return keys
    starts = (np.cumsum(counts) - counts)[docs]
    page = np.repeat(np.arange(len(docs)), counts[docs])
    acc = np.zeros(len(docs), dtype=_U64)
    low = np.minimum.reduceat(flat, starts)  # the smallest: every page has one
    acc ^= low
    for _ in range(n - 1):
        above = flat > low[page]
        more = np.logical_or.reduceat(above, starts)  # a page whose values are exhausted keeps its key
        low = np.where(more, np.minimum.reduceat(np.where(above, flat, _MAX), starts), low)
        acc[more] ^= low[more]
    keys[docs] = acc
    return keys


def cluster_key_of(shingles: np.ndarray, n: int = DEFAULT_CLUSTER_N) -> int | None:
    """The key of one page's shingle hashes, as an ``int`` (None: no shingles, or ``n == 0``)."""
    shingles = np.asarray(shingles, dtype=_U64)
    keys, has = cluster_keys_flat(shingles, np.array([len(shingles)], dtype=np.int64), n)
    return int(keys[0]) if has[0] else None


def key_list(keys: np.ndarray, has_key: np.ndarray) -> list[int | None]:
    """``cluster_keys_flat``'s output as Python values, None where a page has no key."""
    return [k if h else None for k, h in zip(keys.tolist(), has_key.tolist())]


def cluster_keys_texts(texts: Sequence[str], n: int = DEFAULT_CLUSTER_N) -> list[int | None]:
    """Keys of visible texts, computed as one batch.

    >>> a, b, c = cluster_keys_texts(["one two three four", "One, two; three four.", "four three two one"])
    >>> a == b, a == c
    (True, False)
    """
    words, counts = word_hashes_many(texts)
    shingles, per_page = shingle_hashes_many(words, counts, CLUSTER_WORDS)
    return key_list(*cluster_keys_flat(shingles, per_page, n))
