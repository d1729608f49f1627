"""MinHash signatures and bottom-k sketches of shingle sets (Broder 1997), with their estimators.

A document is the SET of its shingle hashes (:func:`streamdedup.fingerprinting.features.text_shingles`;
repeats do not matter: a minimum over a multiset is the minimum over its set).

Resemblance (Jaccard)   ``r(A, B) = |A ∩ B| / |A ∪ B|``
Containment of A in B   ``c(A, B) = |A ∩ B| / |A|``

MinHash signature (the format; changing any of it changes every stored signature)
    ``num_perm`` hash functions, each applied to every shingle, minimum kept per function::

        u      = mix64(x ^ k)                         # x: a 64-bit shingle hash
        h_i(x) = (a_i * u + c_i) mod 2**64            # i = 0 .. num_perm-1
        sig[i] = min over x in A of h_i(x) >> 32      # a uint32

    ``mix64`` is splitmix64's finaliser (:func:`streamdedup.fingerprinting.features.mix64`).  ``k, a_0, c_0,
    a_1, c_1, ...`` are the outputs of the splitmix64 generator started at state
    ``seed ^ MINHASH_DOMAIN`` (``a_i`` with its low bit set, so ``h_i`` is a bijection):
    the same numbers on every machine, in every process and in any language, and the first
    ``m`` functions do not depend on ``num_perm`` (a 64-permutation signature is the prefix of
    the 128-permutation one).  The pre-mix ``u`` makes structured inputs (small integers)
    look random; ``a_i * u + c_i`` keeping the top bits is Dietzfelbinger's multiply-add-shift
    family: one multiply and one add per (function, shingle) keep a 1,000-shingle, 128-function
    signature near 0.1 ms; ``tests/test_minhash.py`` checks that estimates are unbiased and have
    the variance of independent permutations.

    Values are uint32 (the top 32 bits): half the memory of uint64 in the LSH index, and two
    different shingles share a minimum's top 32 bits with probability about ``|A ∪ B| / 2**32``
    (< 3e-5 for 100,000 shingles), far below the estimator's own noise ``sqrt(r(1-r)/num_perm)``.

    Empty set: every position is ``0xFFFFFFFF`` (:data:`EMPTY`).  Two empty signatures have
    resemblance 1; an empty and a non-empty one almost surely 0.

Bottom-k sketch
    One hash ``g(x) = mix64(x ^ k')`` (``k'`` the first splitmix64 output from state
    ``seed ^ BOTTOM_K_DOMAIN``); the sketch is the sorted uint64 array of the ``k`` smallest
    distinct values (all of them if the set has fewer than ``k``).  Better than MinHash for
    containment of a small set in a large one, and for set sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from streamdedup.fingerprinting import kernels
from streamdedup.fingerprinting.features import mix64

__all__ = [
    "EMPTY",
    "MINHASH_DOMAIN",
    "BOTTOM_K_DOMAIN",
    "MinHash",
    "minhash_signature",
    "minhash_signatures",
    "minhash_signatures_flat",
    "resemblance",
    "containment",
    "bottom_k_sketch",
    "bottom_k_resemblance",
    "bottom_k_containment",
    "jaccard_exact",
    "containment_exact",
]

_U64 = np.uint64
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment
#: Domain constants xor-ed into the seed, so MinHash and bottom-k never share hash functions.
MINHASH_DOMAIN = 0x4D494E48415348  # "MINHASH"
BOTTOM_K_DOMAIN = 0x424F54544F4D4B  # "BOTTOMK"
#: Value of every position of the signature of the empty set.
EMPTY = np.uint32(0xFFFFFFFF)
_MASK64 = (1 << 64) - 1
_CHUNK = 1 << 17  # elements of the (num_perm x shingles) scratch array: 1 MiB, stays in cache


def _splitmix64(state: int, count: int) -> np.ndarray:
    """The first ``count`` outputs of splitmix64 started at ``state``."""
    steps = np.arange(1, count + 1, dtype=_U64) * _U64(_GOLDEN)  # wraps mod 2**64
    return mix64(steps + _U64(state & _MASK64))


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= _MASK64:
        raise ValueError(f"seed must be an integer in [0, 2**64), e.g. 1; got {seed!r}")
    return int(seed)


def _check_positive(name: str, value: int, example: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, e.g. {example}; got {value!r}")
    return int(value)


def _as_u64(shingles) -> np.ndarray:
    x = shingles
    if not isinstance(x, np.ndarray):  # a list: numpy would turn ints >= 2**63 into floats
        x = list(x)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in x):
            try:
                x = np.array(x, dtype=_U64)
            except OverflowError:  # negative: take the 64 bits, as for an int64 array
                x = np.array(x, dtype=np.int64)
        else:
            x = np.asarray(x)
    if x.size == 0:
        return np.empty(0, dtype=_U64)
    if x.ndim != 1 or x.dtype.kind not in "iu":
        raise ValueError(
            "shingles must be a 1-D integer array such as text_shingles(text); "
            f"got dtype {x.dtype} with shape {x.shape}"
        )
    return x.astype(_U64, copy=False)  # int64 -> uint64 keeps the 64 bits


@lru_cache(maxsize=16)
def _params(num_perm: int, seed: int) -> tuple[np.uint64, np.ndarray, np.ndarray]:
    """``k`` and the columns ``a``, ``c`` of the hash functions (cached, read-only)."""
    out = _splitmix64(seed ^ MINHASH_DOMAIN, 1 + 2 * num_perm)
    a, c = (out[1::2] | _U64(1))[:, None], out[2::2].copy()[:, None]
    a.flags.writeable = c.flags.writeable = False
    return out[0], a, c


def minhash_signatures(
    shingle_arrays: Sequence, num_perm: int = 128, seed: int = 1, *, compiled: bool | None = None
) -> np.ndarray:
    """Signatures of many documents at once: a ``(n_docs, num_perm)`` uint32 array.

    All shingles are hashed in one pass over their concatenation, so a batch costs little
    more than its shingles.  ``compiled`` picks the path (default: the numba kernel when numba
    is installed, else numpy); both give the same bits.

    >>> from streamdedup.fingerprinting.features import text_shingles
    >>> docs = ["the quick brown fox jumps", "", "the quick brown fox sleeps"]
    >>> sigs = minhash_signatures([text_shingles(d) for d in docs], num_perm=64)
    >>> sigs.shape, sigs.dtype.name, bool((sigs[1] == EMPTY).all())
    ((3, 64), 'uint32', True)
    """
    arrays = [_as_u64(s) for s in shingle_arrays]
    lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=_U64)
    return minhash_signatures_flat(flat, lengths, num_perm, seed, compiled=compiled)


def minhash_signatures_flat(
    flat: np.ndarray, counts: np.ndarray, num_perm: int = 128, seed: int = 1, *, compiled: bool | None = None
) -> np.ndarray:
    """:func:`minhash_signatures` of documents given as one array: document ``i`` is the next
    ``counts[i]`` values of ``flat`` (the layout of ``features.shingle_hashes_many``).

    >>> import numpy as np
    >>> minhash_signatures_flat(np.array([1, 2, 3], np.uint64), np.array([2, 1]), num_perm=4).shape
    (2, 4)
    """
    num_perm = _check_positive("num_perm", num_perm, 128)
    seed = _check_seed(seed)
    flat = _as_u64(flat)
    lengths = np.asarray(counts, dtype=np.int64)
    if lengths.ndim != 1 or lengths.sum() != len(flat) or (lengths < 0).any():
        raise ValueError(f"counts must be non-negative and sum to len(flat) = {len(flat)}; got {lengths.sum()}")
    k, a, c = _params(num_perm, seed)
    fast = None if compiled is False else kernels.compiled()
    if compiled and fast is None:
        raise RuntimeError("the compiled kernels need numba (pip install numba)")
    if fast is not None:
        return fast.minhash_tops(flat, lengths, k, *_halves(a.ravel()), *_halves(c.ravel()))
    return (_mins_numpy(flat, lengths, k, a, c) >> _U64(32)).astype(np.uint32)


def _halves(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low and the high uint32 halves of uint64s."""
    return (x & _U64(0xFFFFFFFF)).astype(np.uint32), (x >> _U64(32)).astype(np.uint32)


def _mins_numpy(flat: np.ndarray, lengths: np.ndarray, k: np.uint64, a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The numpy path: ``(num_perm, chunk)`` products, minima split by document with ``reduceat``."""
    num_perm = len(a)
    out = np.full((len(lengths), num_perm), _MASK64, dtype=_U64)
    total = len(flat)
    if total:
        flat = mix64(flat ^ k)
        docs = np.flatnonzero(lengths)  # non-empty documents, in order
        starts = (np.cumsum(lengths) - lengths)[docs]  # strictly increasing
        step = max(1, _CHUNK // num_perm)
        for s in range(0, total, step):
            e = min(s + step, total)
            first = int(np.searchsorted(starts, s, "right")) - 1  # the document holding column s
            last = int(np.searchsorted(starts, e, "left"))
            seg = starts[first:last] - s
            seg[0] = 0
            t = a * flat[s:e]  # (num_perm, e - s)
            t += c
            mins = np.minimum.reduceat(t, seg, axis=1).T
            rows = docs[first:last]
            out[rows] = np.minimum(out[rows], mins)
    return out


def minhash_signature(shingles: np.ndarray, num_perm: int = 128, seed: int = 1) -> np.ndarray:
    """MinHash signature of the shingle set: a uint32 array of ``num_perm`` minima.

    >>> from streamdedup.fingerprinting.features import text_shingles
    >>> a = minhash_signature(text_shingles("a rose is a rose is a rose"))
    >>> b = minhash_signature(text_shingles("a rose is a rose is a rose is a rose"))
    >>> a.shape, resemblance(a, b)
    ((128,), 1.0)
    >>> bool((minhash_signature([]) == EMPTY).all())
    True
    """
    return minhash_signatures([shingles], num_perm, seed)[0]


def _check_pair(sig_a: np.ndarray, sig_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(sig_a), np.asarray(sig_b)
    if a.shape[-1:] != b.shape[-1:] or a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError(
            "signatures must have the same, non-zero num_perm (compare signatures made with "
            f"the same num_perm and seed); got shapes {a.shape} and {b.shape}"
        )
    return a, b


def resemblance(sig_a: np.ndarray, sig_b: np.ndarray):
    """Estimated Jaccard resemblance: the fraction of positions where the signatures agree.

    Unbiased; standard error ``sqrt(r (1 - r) / num_perm)``.  Broadcasts over leading axes
    (a float for two 1-D signatures, an array otherwise).

    >>> import numpy as np
    >>> resemblance(np.array([1, 2, 3, 4], np.uint32), np.array([1, 2, 0, 0], np.uint32))
    0.5
    """
    a, b = _check_pair(sig_a, sig_b)
    r = np.count_nonzero(a == b, axis=-1) / a.shape[-1]
    return float(r) if np.ndim(r) == 0 else r


def _containment_from(r, size_a: int, size_b: int) -> float:
    if size_a < 0 or size_b < 0:
        raise ValueError(f"set sizes must be >= 0 (len(np.unique(shingles))); got {size_a}, {size_b}")
    if size_a == 0:
        return 1.0  # the empty set is contained in every set
    inter = r * (size_a + size_b) / (1.0 + r)  # from r = i / (|A| + |B| - i)
    return float(min(1.0, inter / size_a))


def containment(sig_a: np.ndarray, sig_b: np.ndarray, size_a: int, size_b: int) -> float:
    """Estimated containment of A in B, ``|A ∩ B| / |A|``, from MinHash signatures and set sizes.

    With ``r`` the estimated resemblance, ``|A ∩ B| = r (|A| + |B|) / (1 + r)``.  Noisy when
    ``|A| << |B|`` (then ``r`` is small); :func:`bottom_k_containment` does better there.

    >>> import numpy as np
    >>> s = np.array([7, 7, 1, 2], np.uint32)  # r = 0.5
    >>> containment(s, np.array([7, 7, 3, 4], np.uint32), size_a=10, size_b=20)
    1.0
    """
    return _containment_from(resemblance(sig_a, sig_b), int(size_a), int(size_b))


@dataclass(frozen=True, eq=False)
class MinHash:
    """A signature with the size of its set and the seed it was made with.

    >>> from streamdedup.fingerprinting.features import text_shingles
    >>> whole = MinHash.of(text_shingles("one two three four five six seven eight nine ten"))
    >>> half = MinHash.of(text_shingles("one two three four five six"))
    >>> whole.size, half.size, half.containment(whole)
    (8, 4, 1.0)
    """

    signature: np.ndarray
    size: int
    seed: int = 1

    @classmethod
    def of(cls, shingles, num_perm: int = 128, seed: int = 1) -> MinHash:
        """Signature and set size of a shingle array."""
        x = _as_u64(shingles)
        return cls(minhash_signature(x, num_perm, seed), len(np.unique(x)), seed)

    def _check(self, other: MinHash) -> None:
        if self.seed != other.seed or self.signature.shape != other.signature.shape:
            raise ValueError(
                "MinHash objects must share num_perm and seed to be compared; got "
                f"(num_perm={self.signature.shape[-1]}, seed={self.seed}) and "
                f"(num_perm={other.signature.shape[-1]}, seed={other.seed})"
            )

    def resemblance(self, other: MinHash) -> float:
        """Estimated ``|A ∩ B| / |A ∪ B|``."""
        self._check(other)
        return resemblance(self.signature, other.signature)

    def containment(self, other: MinHash) -> float:
        """Estimated containment of this set in ``other``, ``|A ∩ B| / |A|``."""
        self._check(other)
        return _containment_from(self.resemblance(other), self.size, other.size)


def bottom_k_sketch(shingles: np.ndarray, k: int = 128, seed: int = 1) -> np.ndarray:
    """The ``k`` smallest distinct values of ``g(x) = mix64(x ^ k')``, sorted (uint64).

    >>> from streamdedup.fingerprinting.features import text_shingles
    >>> s = bottom_k_sketch(text_shingles("a b c d e f"), k=3)
    >>> len(s), s.dtype.name, bool((s[:-1] < s[1:]).all())
    (3, 'uint64', True)
    """
    k = _check_positive("k", k, 128)
    key = _splitmix64(_check_seed(seed) ^ BOTTOM_K_DOMAIN, 1)[0]
    g = np.unique(mix64(_as_u64(shingles) ^ key))  # sorted, distinct
    return g[:k]


def _sketch(s) -> np.ndarray:
    x = np.asarray(s)
    if x.ndim != 1 or (x.size and x.dtype != _U64):
        raise ValueError(f"a bottom-k sketch is a 1-D uint64 array from bottom_k_sketch(); got {x.dtype}{x.shape}")
    return x.astype(_U64, copy=False)


def bottom_k_resemblance(sketch_a: np.ndarray, sketch_b: np.ndarray, k: int | None = None) -> float:
    """Broder's estimate of ``|A ∩ B| / |A ∪ B|`` from two bottom-k sketches.

    ``S`` = the ``k`` smallest values of ``sketch_a ∪ sketch_b`` is the bottom-k sketch of
    ``A ∪ B``: a uniform random sample of ``k`` elements of the union, and an element of ``S``
    is in A exactly when it is in ``sketch_a``.  The estimate
    ``|S ∩ sketch_a ∩ sketch_b| / |S|`` is unbiased (hypergeometric), with standard error
    about ``sqrt(r (1 - r) / k)``, and exact when ``|A ∪ B| <= k``.  ``k`` defaults to the
    longer sketch's length, which is right for sketches made with the same ``k``; a smaller
    ``k`` also gives a valid, noisier estimate.

    >>> import numpy as np
    >>> a, b = np.array([1, 2, 3, 5], np.uint64), np.array([1, 3, 4, 6], np.uint64)
    >>> bottom_k_resemblance(a, b)  # S = {1, 2, 3, 4}: 1 and 3 are in both
    0.5
    """
    a, b = _sketch(sketch_a), _sketch(sketch_b)
    k = max(len(a), len(b)) if k is None else _check_positive("k", k, 128)
    union = np.union1d(a, b)[:k]
    if len(union) == 0:
        return 1.0  # both sets empty
    both = np.intersect1d(a, b, assume_unique=True)
    return float(np.count_nonzero(both <= union[-1]) / len(union))


def _vouches_up_to(sketch: np.ndarray, k: int | None) -> int:
    """Largest value v such that every element of the set with g <= v is in the sketch."""
    if len(sketch) == 0 or (k is not None and len(sketch) < k):
        return _MASK64  # the sketch holds its whole set (an empty sketch: the empty set)
    return int(sketch[-1])


def bottom_k_containment(sketch_a: np.ndarray, sketch_b: np.ndarray, k: int | None = None) -> float:
    """Estimated containment of A in B, ``|A ∩ B| / |A|``, from two bottom-k sketches.

    Let ``t`` be the smaller of the two sketches' largest values (a sketch shorter than ``k``
    holds its whole set and sets no limit).  The values of ``sketch_a`` up to ``t`` are a
    uniform random sample of A, and for each of them membership in B is known exactly (a
    value of B below ``t`` is in ``sketch_b``): the estimate is the fraction of that sample
    found in ``sketch_b``.  Without ``k`` every sketch is treated as full, which is always
    valid, only noisier.  When B is much larger than A the sample is small; with no sample
    at all the result is ``nan``.

    >>> import numpy as np
    >>> a, b = np.array([1, 2, 3], np.uint64), np.array([1, 2, 4, 5, 9], np.uint64)
    >>> round(bottom_k_containment(a, b, k=8), 3)  # both sketches complete: exact 2/3
    0.667
    """
    a, b = _sketch(sketch_a), _sketch(sketch_b)
    if len(a) == 0:
        return 1.0  # the empty set is contained in every set
    k = None if k is None else _check_positive("k", k, 128)
    t = min(_vouches_up_to(a, k), _vouches_up_to(b, k))
    sample = a[a <= t]
    if len(sample) == 0:
        return float("nan")
    return float(np.count_nonzero(np.isin(sample, b, assume_unique=True)) / len(sample))


def jaccard_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Exact ``|A ∩ B| / |A ∪ B|`` of two shingle arrays (repeats ignored; two empty sets: 1).

    >>> import numpy as np
    >>> jaccard_exact(np.array([1, 2, 2, 3]), np.array([2, 3, 4]))
    0.5
    """
    sa, sb = np.unique(_as_u64(a)), np.unique(_as_u64(b))
    union = len(np.union1d(sa, sb))
    return 1.0 if union == 0 else len(np.intersect1d(sa, sb, assume_unique=True)) / union


def containment_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Exact ``|A ∩ B| / |A|`` of two shingle arrays (repeats ignored; empty A: 1).

    >>> import numpy as np
    >>> containment_exact(np.array([1, 2]), np.array([2, 3, 4]))
    0.5
    """
    sa, sb = np.unique(_as_u64(a)), np.unique(_as_u64(b))
    if len(sa) == 0:
        return 1.0
    return len(np.intersect1d(sa, sb, assume_unique=True)) / len(sa)
