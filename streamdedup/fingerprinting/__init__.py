"""Page -> visible text -> features -> fingerprints.

:data:`SCHEME` names the fingerprint scheme: everything that decides a fingerprint's bits (text
extraction, words, feature hashes and seed, shingle size, simhash weights).  Fingerprints of
two schemes are not comparable, so every stored record (shard changelog batches, snapshots)
carries the scheme it was computed with, and a worker refuses state of another scheme.

Schemes:

1. word bigrams, each occurrence one vote (raw term frequency);
2. word bigrams, each distinct bigram one vote of weight ``1 + floor(log2(tf))``
   (:func:`streamdedup.fingerprinting.simhash.feature_weights`), so no repeated phrase can
   outvote the rest of a page.
"""

from __future__ import annotations

__all__ = ["SCHEME"]

#: The fingerprint scheme this code computes.  Bump it whenever a fingerprint's bits change.
SCHEME = 2
