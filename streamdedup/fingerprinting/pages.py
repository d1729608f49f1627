"""Page -> visible text -> features -> fingerprints: the stages that scan and the worker share.

>>> f"{fingerprint('<p>Hello <b>world</b></p>'):016x}" == f"{fingerprint('Hello world', 'text/plain'):016x}"
True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamdedup.fingerprinting.cluster import CLUSTER_WORDS, DEFAULT_CLUSTER_N, cluster_keys_flat, key_list
from streamdedup.fingerprinting.features import shingle_hashes_many, word_hashes_many
from streamdedup.fingerprinting.minhash import minhash_signatures_flat
from streamdedup.fingerprinting.simhash import simhash_flat
from streamdedup.fingerprinting.text import visible_text

__all__ = ["SIMHASH_WORDS", "MINHASH_WORDS", "fingerprint", "cluster_key", "simhash_texts", "Fingerprints"]

#: Words per simhash feature.  Bigrams, each distinct one weighted 1 + floor(log2(its count in
#: the page)) (simhash.feature_weights): on the benchmark corpus (bench/README.md) bigrams gave
#: the best precision/recall balance at k = 3; trigrams are stricter (fewer false matches, more
#: misses), single words the reverse.
SIMHASH_WORDS = 2
#: Words per MinHash shingle: trigrams, so that resemblance estimates the Jaccard similarity
#: of word 3-shingles, the usual definition of a near-duplicate.
MINHASH_WORDS = 3


def fingerprint(content: str | bytes, content_type: str | None = "text/html") -> int:
    """The 64-bit simhash of a page's visible text, as an ``int``.

    ``content_type=None`` sniffs HTML versus plain text.  The same content gives the same
    bits on every machine and in every process.
    """
    return int(simhash_texts([visible_text(content, content_type)])[0])


def cluster_key(
    content: str | bytes, content_type: str | None = "text/html", *, n: int = DEFAULT_CLUSTER_N
) -> int | None:
    """The bottom-``n`` cluster key of a page's visible text (:mod:`streamdedup.fingerprinting.cluster`),
    as an ``int``; None for a page without words (or ``n=0``).

    Two pages of word 3-shingle Jaccard similarity ``J`` get the same key with probability
    about ``J**n``.

    >>> cluster_key("<p>one two <b>three</b> four</p>") == cluster_key("one two three four", "text/plain")
    True
    """
    return Fingerprints([visible_text(content, content_type)]).cluster_keys(n)[0]


def simhash_texts(texts: Sequence[str]) -> np.ndarray:
    """Simhash fingerprints (``uint64``) of visible texts, computed as one batch."""
    return Fingerprints(texts).simhash


class Fingerprints:
    """Everything an algorithm needs about a batch of texts, each part computed once."""

    __slots__ = ("_counts", "_minhash", "_num_perm", "_shingles", "_words", "simhash")

    def __init__(self, texts: Sequence[str], num_perm: int = 128) -> None:
        self._words, self._counts = word_hashes_many(texts)  # the whole batch in one pass
        shingles, counts = shingle_hashes_many(self._words, self._counts, SIMHASH_WORDS)
        self.simhash = simhash_flat(shingles, counts)
        self._minhash: np.ndarray | None = None
        self._num_perm = num_perm
        self._shingles: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _shingles_of(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Word ``size``-shingle hashes and their count per text, computed once (MinHash and the
        cluster key both use trigrams)."""
        if size not in self._shingles:
            self._shingles[size] = shingle_hashes_many(self._words, self._counts, size)
        return self._shingles[size]

    @property
    def minhash(self) -> np.ndarray:
        """MinHash signatures, shape (n, num_perm), computed on first use."""
        if self._minhash is None:
            shingles, counts = self._shingles_of(MINHASH_WORDS)
            self._minhash = minhash_signatures_flat(shingles, counts, num_perm=self._num_perm)
        return self._minhash

    def cluster_keys(self, n: int = DEFAULT_CLUSTER_N) -> list[int | None]:
        """The bottom-``n`` cluster key of each text (None: no words, or ``n == 0``)."""
        if n == 0:
            return [None] * len(self._counts)
        return key_list(*cluster_keys_flat(*self._shingles_of(CLUSTER_WORDS), n))
