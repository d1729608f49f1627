"""streamdedup: near-duplicate detection for web crawls.

The algorithm core (this package minus ``streamdedup.stream``) imports nothing from faust or
aiokafka: use it offline, from a notebook or a batch job.

>>> import streamdedup
>>> a = streamdedup.fingerprint("<html><body><p>The quick brown fox jumps over the lazy dog</p></body></html>")
>>> b = streamdedup.fingerprint("The quick brown fox jumps over the lazy dog", "text/plain")
>>> streamdedup.hamming(a, b)
0
>>> index = streamdedup.HammingIndex(k=3)
>>> index.add_many(["page-1"], [a])
>>> index.query(b)
[('page-1', 0)]
"""

__version__ = "0.1.0"

from streamdedup.engine.dedup import Deduplicator, Verdict
from streamdedup.fingerprinting.minhash import MinHash, minhash_signature
from streamdedup.fingerprinting.pages import cluster_key, fingerprint
from streamdedup.fingerprinting.simhash import hamming
from streamdedup.index.hamming import HammingIndex
from streamdedup.index.lsh import LSHIndex
from streamdedup.index.tables import TableDesign

__all__ = [
    "__version__",
    "fingerprint",
    "cluster_key",
    "hamming",
    "HammingIndex",
    "TableDesign",
    "MinHash",
    "minhash_signature",
    "LSHIndex",
    "Deduplicator",
    "Verdict",
]
