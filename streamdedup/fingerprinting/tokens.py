"""Texts -> code points, and the table that says what each code point is: the input of both word-hash paths.

A batch of texts becomes ONE array of code points (``uint8`` when every text is ASCII, else
``uint16`` when no character is beyond U+FFFF, else ``uint32``) with the offset of each text, so that
finding words is a pass over an array, in numpy (:mod:`streamdedup.fingerprinting.features`) or
in a compiled kernel (:mod:`streamdedup.fingerprinting.kernels`), instead of Python calls per word.

The word rule (``WORD_RE`` over ``text.lower()``) looks at one character at a time, and
``str.lower`` maps one character at a time too, with two exceptions: ``"İ"`` (U+0130) becomes
two characters and ``"Σ"`` (U+03A3) becomes ``"σ"`` or ``"ς"`` depending on its neighbours.
So one table entry per code point reproduces both exactly: ``TABLE[c] = lower(c) | class << 21``
with the class of the lower-cased character:

====  ==================================================================================
  0   separator (``_``, punctuation, spaces, marks, ...)
  1   word character: ``[^\\W_]`` (letters and digits), outside the scripts without spaces
  2   a character of a script without spaces (Han, kana, Thai): a word on its own
====  ==================================================================================

A text holding one of the two exceptions is lower-cased by ``str.lower`` before it is encoded
(the table maps lower-case characters to themselves).  A lone surrogate (from a badly decoded
page) is encoded as ``"?"``: both are separators, so the words do not change.

The table is built from ``str.lower`` and the regular expression themselves (so it follows
Python's Unicode database), once per process, in about 0.1 s, on first use.

>>> batch = encode_batch(["Hi, Bob", "東京"])
>>> batch.codes.dtype.name, batch.bounds.tolist()
('uint16', [0, 7, 9])
>>> [(chr(int(e) & LOW_MASK), int(e) >> CLASS_SHIFT) for e in table()[[ord("A"), ord("_"), ord("東")]]]
[('a', 1), ('_', 0), ('東', 2)]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = [
    "NOSPACE",
    "WORD_RE",
    "SEPARATOR",
    "WORD",
    "NOSPACE_CHAR",
    "CLASS_SHIFT",
    "LOW_MASK",
    "table",
    "bmp_table",
    "Batch",
    "encode_batch",
]

#: Scripts without spaces between words: one token per character.
NOSPACE = "\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
#: The word rule, applied to lower-cased text.
WORD_RE = re.compile(rf"[{NOSPACE}]|[^\W_{NOSPACE}]+")

SEPARATOR, WORD, NOSPACE_CHAR = 0, 1, 2
CLASS_SHIFT = 21  # code points take 21 bits
LOW_MASK = (1 << CLASS_SHIFT) - 1
_UNICODE = 0x110000
_CONTEXTUAL = ("\u0130", "\u03a3")  # İ, Σ: str.lower of these is not one table entry


def table(codes: np.ndarray | None = None) -> np.ndarray:
    """``uint32``: lower-case code point | class << 21 of every code point (read-only).

    With ``codes`` of at most 16 bits, only the Basic Multilingual Plane (65,536 entries, built
    17 times faster: most batches never need the rest); else all 0x110000 code points.
    """
    if codes is not None and codes.dtype.itemsize <= 2:
        return _table(0x10000)
    return _table(_UNICODE)


def bmp_table() -> np.ndarray:
    """:func:`table`'s first 65,536 entries (the Basic Multilingual Plane), built on their own."""
    return _table(0x10000)


@lru_cache(maxsize=2)
def _table(size: int) -> np.ndarray:
    # (Lower-casing never leaves the BMP: a BMP table is a prefix of the full one.)
    every = "".join(map(chr, range(size)))
    # İ out first, so that lower() keeps every character at its position; Σ's entry is overridden.
    low_text = every.replace("\u0130", "\0").lower()
    low = np.frombuffer(low_text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).copy()
    low[0x130], low[0x3A3] = 0x130, 0x3C3  # never looked up: texts holding them are pre-lowered
    # Classes of every code point in three C-level passes over one string, then looked up by lower(c).
    marked = re.sub(rf"[^\W_{NOSPACE}]", "\x01", every)
    marked = re.sub(rf"[{NOSPACE}]", "\x02", marked)
    marked = re.sub(r"[^\x01\x02]", "\x00", marked)
    cls = np.frombuffer(marked.encode("latin-1"), dtype=np.uint8).astype(np.uint32)
    cls[1] = cls[2] = SEPARATOR  # U+0001 and U+0002 were left as they are: the marks themselves
    out = low | (cls[low] << np.uint32(CLASS_SHIFT))
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class Batch:
    """The code points of a batch of texts: text ``i`` is ``codes[bounds[i]:bounds[i + 1]]``.

    ``codes`` is uint8, uint16 or uint32, one unit per code point, not yet lower-cased (except
    texts holding "İ" or "Σ", see above).
    """

    codes: np.ndarray
    bounds: np.ndarray  # int64, len(texts) + 1


def encode_batch(texts: Sequence[str], utf32: bool = False) -> Batch:
    """One array of code units for all ``texts``: uint8 if all are ASCII, uint16 (UTF-16) if no
    text has a character beyond U+FFFF, else (or if ``utf32``) uint32: one unit per code point."""
    n = len(texts)
    if not utf32 and all(map(str.isascii, texts)):  # isascii is O(1) in CPython
        codes = np.frombuffer("".join(texts).encode("ascii"), dtype=np.uint8)
        return Batch(codes, _bounds(np.fromiter(map(len, texts), dtype=np.int64, count=n)))
    sources = [t.lower() if _contextual(t) else t for t in texts]
    lengths = np.fromiter(map(len, sources), dtype=np.int64, count=n)
    if not utf32:
        # "replace": a lone surrogate becomes "?"; both are separators
        parts = [t.encode("utf-16-le", "replace") for t in sources]
        units = np.fromiter(map(len, parts), dtype=np.int64, count=n) // 2
        if (units == lengths).all():  # no surrogate pairs: one unit per code point
            return Batch(np.frombuffer(b"".join(parts), dtype=np.uint16), _bounds(lengths))
    parts = [t.encode("utf-32-le", "replace") for t in sources]
    return Batch(np.frombuffer(b"".join(parts), dtype=np.uint32), _bounds(lengths))


def _contextual(text: str) -> bool:
    return _CONTEXTUAL[0] in text or _CONTEXTUAL[1] in text


def _bounds(lengths: np.ndarray) -> np.ndarray:
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return bounds
