"""Visible text -> 64-bit feature hashes: the one place where words and shingles are defined.

Both fingerprints (simhash and MinHash) are built from the same features, so a page that
looks identical to one looks identical to the other.

Words
    Maximal runs of Unicode letters and digits of the lower-cased text (``str.lower``;
    ``_`` and punctuation separate words).  Scripts written without spaces (Han, kana, Thai)
    give one word per character, so a Chinese sentence becomes character n-grams instead of
    one giant "word".  (:mod:`streamdedup.fingerprinting.tokens` holds the rule.)

Word hashes
    A polynomial over the word's code points ``c_1 .. c_L`` (of the lower-cased text), then
    the splitmix64 finaliser::

        word_hash = mix64(FEATURE_SEED * W**L + c_1 * W**(L-1) + ... + c_L)   (mod 2**64)

    with ``W = WORD_MUL`` (odd).  It is the same 64 bits on every machine and in every
    process (never Python's ``hash()``), and it is chosen so that it can be computed for a
    whole batch at once: by a compiled loop (Horner's rule, :mod:`streamdedup.fingerprinting.numba_kernels`,
    when numba is installed) or in numpy from prefix sums over all code points
    (``sum c_i W**-i``, ``W**-1`` the inverse of ``W`` mod 2**64), with identical bits.
    (Until scheme 2 the word hash was ``xxh3_64(utf8(word), FEATURE_SEED)``, one Python call
    per distinct word; bench/README.md "Hot path" has the measurements behind the change.)
    Known limit: as for any polynomial hash modulo 2**64, two different words of 2,048 or more
    letters can be built to collide whatever ``W`` is (Thue-Morse strings); a collision only
    merges two features of a page, and natural words are far shorter.  Over 400 seeds the
    simhash distances of a near-duplicate pair had the same distribution as with xxh3.

Shingles
    Every run of ``n`` consecutive words (``n = 3`` by default), hashed by combining the word
    hashes (an order-sensitive polynomial, then the splitmix64 finaliser).  A text with fewer
    than ``n`` words has one shingle made of all its words.  Occurrences are kept (not
    de-duplicated): simhash weighs a shingle by how often it occurs, sublinearly
    (``1 + floor(log2(tf))``, see simhash.py), and MinHash uses the set.

>>> words("Hello, World! Ça va? 東京")
['hello', 'world', 'ça', 'va', '東', '京']
>>> len(shingle_hashes(word_hashes("one two three four")))
2
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from types import ModuleType

import numpy as np

from streamdedup.fingerprinting import kernels
from streamdedup.fingerprinting.tokens import (
    CLASS_SHIFT,
    LOW_MASK,
    NOSPACE_CHAR,
    WORD,
    WORD_RE,
    bmp_table,
    encode_batch,
    table,
)

__all__ = [
    "FEATURE_SEED",
    "WORD_MUL",
    "words",
    "word_hashes",
    "word_hashes_many",
    "shingle_hashes",
    "shingle_hashes_many",
    "split_counts",
    "text_shingles",
    "mix64",
]

#: Seed of every feature hash.  Changing it changes every fingerprint: it is part of the format.
FEATURE_SEED = 0x5EED_D0C5
#: Multiplier of the word polynomial (xxhash's PRIME64_2; odd, so it has an inverse mod 2**64).
WORD_MUL = 0xC2B2AE3D27D4EB4F

_U64 = np.uint64
_MUL = _U64(0x9E3779B97F4A7C15)  # shingle polynomial; odd: multiplication by it is a bijection mod 2**64
_M1, _M2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_WMUL = _U64(WORD_MUL)
_WINV = _U64(pow(WORD_MUL, -1, 1 << 64))
_SEED = _U64(FEATURE_SEED)


def words(text: str) -> list[str]:
    """The words of ``text`` as defined above.

    >>> words("It's 10:30_am")
    ['it', 's', '10', '30', 'am']
    """
    return WORD_RE.findall(text.lower())


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise: every input bit affects every output bit.

    >>> hex(int(mix64(np.array([1], dtype=np.uint64))[0]))
    '0x5692161d100b05e5'
    """
    x = x ^ (x >> _U64(30))
    x = x * _M1
    x = x ^ (x >> _U64(27))
    x = x * _M2
    return x ^ (x >> _U64(31))


def _kernels(compiled: bool | None) -> ModuleType | None:
    """The kernel module to use, or None for numpy (``compiled``: None = whichever is available)."""
    if compiled is False:
        return None
    module = kernels.compiled()
    if compiled and module is None:
        raise RuntimeError("the compiled kernels need numba (pip install numba)")
    return module


def word_hashes_many(texts: Sequence[str], *, compiled: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Word hashes of many texts in one pass: ``(hashes, counts)``.

    ``hashes`` holds the word hashes of every text, in order, one after the other; text ``i``
    has ``counts[i]`` of them.  ``compiled`` picks the path: None (default) the C loop where it
    was built, else the numba kernel where numba is installed, else numpy; True the numba
    kernel; False numpy.  All give the same bits.

    >>> hashes, counts = word_hashes_many(["a b", "", "Ça va"])
    >>> counts.tolist(), bool(hashes[0] == word_hashes("A")[0])
    ([2, 0, 2], True)
    """
    if compiled is None and (c := kernels.c_words()) is not None:
        got = c.word_hashes(texts, bmp_table(), None, FEATURE_SEED, WORD_MUL)
        if got is None:  # a text beyond U+FFFF: the whole table
            got = c.word_hashes(texts, bmp_table(), table(), FEATURE_SEED, WORD_MUL)
        return np.frombuffer(got[0], dtype=_U64), np.frombuffer(got[1], dtype=np.int64)
    if (fast := _kernels(compiled)) is not None:
        batch = encode_batch(texts)
        return fast.word_hashes(batch.codes, batch.bounds, table(batch.codes), _SEED, _WMUL)
    return _word_hashes_numpy(texts)


def word_hashes(text: str) -> np.ndarray:
    """Hashes of the words of ``text``, in order, as a ``uint64`` array.

    >>> int(word_hashes("Hello")[0]) == int(word_hashes("hello!")[0])
    True
    """
    return word_hashes_many([text])[0]


@lru_cache(maxsize=1)
def _powers_cache() -> list[np.ndarray]:
    return [np.ones(1, dtype=_U64), np.ones(1, dtype=_U64)]


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``W**k`` and ``W**-k`` for ``k = 0 .. n`` (mod 2**64), grown and kept between calls."""
    cache = _powers_cache()
    if len(cache[0]) <= n:
        size = max(n + 1, 2 * len(cache[0]))
        for i, base in enumerate((_WMUL, _WINV)):
            p = np.full(size, base, dtype=_U64)
            p[0] = 1
            cache[i] = np.cumprod(p)  # wraps mod 2**64, exactly as the kernel's products
    return cache[0], cache[1]


def _word_hashes_numpy(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The numpy path: word boundaries from the code-point table, the polynomial from prefix sums."""
    batch = encode_batch(texts)
    entry = table(batch.codes)[batch.codes]
    cls = entry >> np.uint32(CLASS_SHIFT)
    codes = (entry & np.uint32(LOW_MASK)).astype(_U64)
    n = len(codes)
    inword = cls == WORD
    single = cls == NOSPACE_CHAR
    before = np.zeros(n, dtype=bool)  # the previous code point is a word character of the same text
    before[1:] = inword[:-1]
    after = np.zeros(n, dtype=bool)  # the next one is
    after[:-1] = inword[1:]
    edges = batch.bounds[1:-1]
    before[edges[edges < n]] = False
    after[edges[edges > 0] - 1] = False
    starts = np.flatnonzero(single | (inword & ~before))
    ends = np.flatnonzero(single | (inword & ~after)) + 1
    pw, inv = _powers(n)
    prefix = np.zeros(n + 1, dtype=_U64)
    np.cumsum(codes * inv[:n], out=prefix[1:])  # prefix[k] = sum_{i<k} c_i W**-i
    # sum_{s<=i<e} c_i W**(e-1-i) = (prefix[e] - prefix[s]) * W**(e-1); the seed is one more digit
    h = (prefix[ends] - prefix[starts]) * pw[ends - 1]
    h += _SEED * pw[ends - starts]
    doc = np.searchsorted(batch.bounds, starts, side="right") - 1
    counts = np.bincount(doc, minlength=len(texts)).astype(np.int64)
    return mix64(h), counts


def shingle_hashes(hashes: np.ndarray, n: int = 3) -> np.ndarray:
    """Hashes of every run of ``n`` consecutive words, given the word hashes.

    ``s_i = mix64(h_i * M**(n-1) + h_(i+1) * M**(n-2) + ... + h_(i+n-1))`` (mod 2**64).
    Word order matters: "a b c" and "c b a" give different shingles.

    >>> hs = word_hashes("a b c a b c")
    >>> s = shingle_hashes(hs, 3)
    >>> bool(s[0] == s[3]), bool(s[0] == s[1])
    (True, False)
    """
    hashes = np.asarray(hashes, dtype=_U64)
    return shingle_hashes_many(hashes, np.array([len(hashes)], dtype=np.int64), n)[0]


def shingle_hashes_many(
    hashes: np.ndarray, counts: np.ndarray, n: int = 3, *, compiled: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of many texts from :func:`word_hashes_many`'s output: ``(shingles, counts)``.

    >>> h, c = word_hashes_many(["a b c d", "", "x y"])
    >>> shingle_hashes_many(h, c, 3)[1].tolist()
    [2, 0, 1]
    """
    if n < 1:
        raise ValueError(f"shingle size n must be >= 1, got {n}")
    counts = np.asarray(counts, dtype=np.int64)
    if (fast := _kernels(compiled)) is not None:
        return fast.shingle_hashes(hashes, counts, n, _MUL)
    return _shingle_hashes_numpy(hashes, counts, n)


def _shingle_hashes_numpy(hashes: np.ndarray, m: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    out_counts = np.where(m >= n, m - n + 1, (m > 0).astype(np.int64))
    out = np.empty(int(out_counts.sum()), dtype=_U64)
    first = np.cumsum(m) - m  # first word of each text
    short = np.flatnonzero((m > 0) & (m < n))  # texts with one shingle of all their words
    slot = np.zeros(len(out), dtype=bool)
    slot[(np.cumsum(out_counts) - out_counts)[short]] = True
    total = len(hashes)
    if total >= n:
        count = total - n + 1
        acc = hashes[:count].copy()
        for j in range(1, n):
            acc *= _MUL
            acc += hashes[j : j + count]
        # keep the windows that end inside their own text
        pos = np.arange(total, dtype=np.int64) - np.repeat(first, m)
        room = np.repeat(m, m) - n
        out[~slot] = mix64(acc[pos[:count] <= room[:count]])
    if len(short):
        acc = hashes[first[short]].copy()
        for j in range(1, n - 1):
            more = m[short] > j
            acc[more] = acc[more] * _MUL + hashes[first[short][more] + j]
        out[slot] = mix64(acc)
    return out, out_counts


def split_counts(flat: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """Cut a flat array into one array per text (views, no copy).

    >>> [a.tolist() for a in split_counts(np.arange(3), np.array([2, 0, 1]))]
    [[0, 1], [], [2]]
    """
    if len(counts) == 0:
        return []
    return np.split(flat, np.cumsum(counts)[:-1])


def text_shingles(text: str, n: int = 3) -> np.ndarray:
    """Shingle hashes of a text (with repeats).

    >>> len(text_shingles("")), len(text_shingles("just two")), len(text_shingles("a b c d"))
    (0, 1, 2)
    """
    return shingle_hashes(word_hashes(text), n)
