"""Visible text -> 64-bit feature hashes: the one place where words and shingles are defined.

Both fingerprints (simhash and MinHash) are built from the same features, so a page that
looks identical to one looks identical to the other.

Words
    Maximal runs of Unicode letters and digits, lower-cased (``_`` and punctuation separate
    words).  Scripts written without spaces (Han, kana, Thai) give one word per character, so
    a Chinese sentence becomes character n-grams instead of one giant "word".

Word hashes
    ``xxh3_64(utf8(word), seed=FEATURE_SEED)``: the same 64 bits on every machine and in every
    process (never Python's ``hash()``).  A bounded dictionary caches them because a page
    repeats its words and a crawl repeats its vocabulary; the cache never changes a result.

Shingles
    Every run of ``n`` consecutive words (``n = 3`` by default), hashed by combining the word
    hashes in numpy (an order-sensitive polynomial, then the splitmix64 finaliser).  A text
    with fewer than ``n`` words has one shingle made of all its words.  Occurrences are kept
    (not de-duplicated): simhash weighs a shingle by how often it occurs, sublinearly
    (``1 + floor(log2(tf))``, see simhash.py), and MinHash uses the set.

>>> words("Hello, World! Ça va? 東京")
['hello', 'world', 'ça', 'va', '東', '京']
>>> len(shingle_hashes(word_hashes("one two three four")))
2
"""

from __future__ import annotations

import re

import numpy as np
import xxhash

__all__ = ["FEATURE_SEED", "words", "word_hashes", "shingle_hashes", "text_shingles", "mix64"]

#: Seed of every feature hash.  Changing it changes every fingerprint: it is part of the format.
FEATURE_SEED = 0x5EED_D0C5

# ASCII fast path: one C-level pass lower-cases letters and turns everything else into a space.
_ASCII_TABLE = bytes((ord(chr(c).lower()) if chr(c).isalnum() else 0x20) if c < 128 else c for c in range(256))
# Scripts without spaces between words: one token per character.
_NOSPACE = "\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_WORD_RE = re.compile(rf"[{_NOSPACE}]|[^\W_{_NOSPACE}]+")
_HIGH_BYTE = re.compile(rb"[\x80-\xff]")

_CACHE: dict[bytes, int] = {}
_CACHE_LIMIT = 1 << 19  # ~60 MB at most; cleared (not evicted) when full: cheap and simple.

_U64 = np.uint64
_MUL = _U64(0x9E3779B97F4A7C15)  # odd: multiplication by it is a bijection mod 2**64
_M1, _M2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)


def words(text: str) -> list[str]:
    """The words of ``text`` as defined above.

    >>> words("It's 10:30_am")
    ['it', 's', '10', '30', 'am']
    """
    return [w.decode() for w in _word_bytes(text)]


def _word_bytes(text: str) -> list[bytes]:
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_TABLE).split()
    # Split on ASCII separators in C; re-split only the tokens that hold non-ASCII bytes with
    # the full rule.  ASCII separators split words under both rules, so the result equals
    # _WORD_RE over the whole text, at a fraction of the cost on mostly-ASCII pages.
    data = text.lower().encode("utf-8", "surrogatepass").translate(_ASCII_TABLE)
    out: list[bytes] = []
    pos = 0
    while (m := _HIGH_BYTE.search(data, pos)) is not None:
        start = data.rfind(b" ", pos, m.start()) + 1
        end = data.find(b" ", m.end())
        end = len(data) if end < 0 else end
        out += data[pos:start].split()
        token = data[start:end].decode("utf-8", "surrogatepass")
        out += [w.encode("utf-8", "surrogatepass") for w in _WORD_RE.findall(token)]
        pos = end
    out += data[pos:].split()
    return out


def word_hashes(text: str) -> np.ndarray:
    """xxh3-64 hashes of the words of ``text``, in order, as a ``uint64`` array.

    >>> int(word_hashes("Hello")[0]) == int(word_hashes("hello!")[0])
    True
    """
    toks = _word_bytes(text)
    try:
        return np.fromiter(map(_CACHE.__getitem__, toks), dtype=_U64, count=len(toks))
    except KeyError:
        pass
    if len(_CACHE) > _CACHE_LIMIT:
        _CACHE.clear()
    for tok in set(toks).difference(_CACHE):
        _CACHE[tok] = xxhash.xxh3_64_intdigest(tok, FEATURE_SEED)
    return np.fromiter(map(_CACHE.__getitem__, toks), dtype=_U64, count=len(toks))


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


def shingle_hashes(hashes: np.ndarray, n: int = 3) -> np.ndarray:
    """Hashes of every run of ``n`` consecutive words, given the word hashes.

    ``s_i = mix64(h_i * M**(n-1) + h_(i+1) * M**(n-2) + ... + h_(i+n-1))`` (mod 2**64).
    Word order matters: "a b c" and "c b a" give different shingles.

    >>> hs = word_hashes("a b c a b c")
    >>> s = shingle_hashes(hs, 3)
    >>> bool(s[0] == s[3]), bool(s[0] == s[1])
    (True, False)
    """
    if n < 1:
        raise ValueError(f"shingle size n must be >= 1, got {n}")
    m = len(hashes)
    if m == 0:
        return np.empty(0, dtype=_U64)
    if m < n:  # short text: one shingle of all its words
        acc = hashes[0:1].copy()
        for j in range(1, m):
            acc = acc * _MUL + hashes[j : j + 1]
        return mix64(acc)
    count = m - n + 1
    acc = hashes[:count].copy()
    for j in range(1, n):
        acc *= _MUL
        acc += hashes[j : j + count]
    return mix64(acc)


def text_shingles(text: str, n: int = 3) -> np.ndarray:
    """Shingle hashes of a text (with repeats).

    >>> len(text_shingles("")), len(text_shingles("just two")), len(text_shingles("a b c d"))
    (0, 1, 2)
    """
    return shingle_hashes(word_hashes(text), n)
