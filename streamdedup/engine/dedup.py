"""In-order near-duplicate detection: each page against every earlier page, one batch at a time.

This is the embedded engine behind ``streamdedup scan``.  Pages are stored in arrival
order; a page is a near-duplicate when a page stored *before* it with a *different id* is
close enough ("first stored wins", :mod:`streamdedup.engine.order`, the stream worker's rule).
The same id arriving again is a re-fetch: it is compared with other pages only, never with
its own fetches (a page is never a duplicate of itself), and a re-fetch with the same
fingerprint keeps the position of the first fetch with it, so it is judged against the pages
stored before that one (as a replay in the worker).  Every page is stored, near-duplicates
too, so chains of copies keep resolving to the first.

Algorithms:

``simhash``   a stored fingerprint within ``k`` bits (Manku's tables); the match is the
              nearest, then the one whose canonical group with the page is lowest, then the
              first stored (the worker's tie-break).
``minhash``   LSH bands find candidates (:mod:`streamdedup.index.bands`: one table per band,
              as the worker shards them); the match is the one with the highest estimated
              resemblance (8-bit sketches of the permutations outside the bands), if it
              reaches ``threshold``; then the lowest canonical band, then the first stored.
``combined``  the same LSH candidates, kept only when their simhash is within ``k`` bits
              (Henzinger 2006: Broder's shingles find the candidate pairs, Charikar's simhash
              filters them); the match is the nearest, then the lowest band, then the first.

The band modes give the worker's verdicts (:mod:`streamdedup.pipeline.bands`) on the same
arrival order: the same tables and rule, in one process.

>>> d = Deduplicator()
>>> [v.verdict for v in d.process(["a", "b"], ["u1", "u2"], ["one two three four"] * 2)]
['unique', 'near_duplicate']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import xxhash

from streamdedup.engine.order import canonical_groups, group_masks
from streamdedup.fingerprinting.cluster import DEFAULT_CLUSTER_N, check_cluster_n
from streamdedup.fingerprinting.pages import Fingerprints
from streamdedup.fingerprinting.simhash import to_hex
from streamdedup.index.arrays import GrowingArray
from streamdedup.index.bands import DEFAULT_NUM_PERM, BandScheme, BandTable, tags
from streamdedup.index.hamming import HammingIndex
from streamdedup.index.tables import TableDesign

__all__ = ["ALGORITHMS", "Verdict", "Deduplicator"]

ALGORITHMS = ("simhash", "minhash", "combined")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one page.  Match fields are None for a unique page."""

    id: str
    url: str
    verdict: str  # "unique" | "near_duplicate"
    fingerprint: int
    match_id: str | None = None
    match_url: str | None = None
    distance: int | None = None  # Hamming distance of the two simhash fingerprints
    similarity: float | None = None  # estimated resemblance (minhash and combined)
    cluster: int | None = None  # the bottom-n cluster key (None: no words, or keys off)

    def to_dict(self) -> dict:
        out: dict[str, object] = {
            "id": self.id,
            "url": self.url,
            "verdict": self.verdict,
            "fingerprint": to_hex(self.fingerprint),
            "cluster": None if self.cluster is None else to_hex(self.cluster),
            "match_id": self.match_id,
            "match_url": self.match_url,
            "distance": self.distance,
        }
        if self.similarity is not None:
            out["similarity"] = round(self.similarity, 4)
        return out


class Deduplicator:
    """Holds every page seen so far and judges new batches against them, in order."""

    def __init__(
        self,
        algorithm: str = "simhash",
        k: int = 3,
        design: TableDesign | str | None = None,
        threshold: float = 0.8,
        num_perm: int = DEFAULT_NUM_PERM,
        cluster_n: int = DEFAULT_CLUSTER_N,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1 (exclusive), got {threshold}")
        self.algorithm, self.k, self.threshold, self.num_perm = algorithm, k, threshold, num_perm
        self.cluster_n = check_cluster_n(cluster_n)
        self._index = HammingIndex(k=k, design=design) if algorithm == "simhash" else None
        self._masks = group_masks(self._index.design) if self._index is not None else None
        self.bands: BandScheme | None = None
        if algorithm != "simhash":
            verify = algorithm
            self.bands = BandScheme.for_threshold(threshold, num_perm, verify=verify, k=k)
        n_bands = 0 if self.bands is None else self.bands.bands
        self._tables = [BandTable(self.bands, j) for j in range(n_bands)] if self.bands is not None else []
        self._refs = [GrowingArray(np.int64) for _ in range(n_bands)]  # a band table's row -> our row
        self._fps = GrowingArray(np.uint64)
        self._id_hash = GrowingArray(np.uint64)
        self._ids: list[str] = []
        self._urls: list[str] = []

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def nbytes(self) -> int:
        """Bytes in numpy arrays (index or band tables, fingerprints); ids and urls not counted."""
        structure = self._index.nbytes if self._index is not None else 0
        structure += sum(t.nbytes for t in self._tables) + sum(r.nbytes for r in self._refs)
        return structure + self._fps.nbytes + self._id_hash.nbytes

    def process(self, ids: Sequence[str], urls: Sequence[str], texts: Sequence[str]) -> list[Verdict]:
        """Verdicts for a batch of pages given by id, url and visible text, in order."""
        n = len(ids)
        if not n == len(urls) == len(texts):
            raise ValueError("ids, urls and texts must have the same length")
        if n == 0:
            return []
        fp = Fingerprints(texts, self.num_perm)
        base = len(self._ids)
        rows = np.arange(base, base + n)
        self._ids.extend(ids)
        self._urls.extend(urls)
        self._fps.extend(fp.simhash)
        self._id_hash.extend(_id_hashes(ids))
        if self.bands is not None:
            verdicts = self._band_verdicts(base, fp)
        else:
            # Store the batch first, then keep only matches on earlier rows: pages of one batch
            # are compared with the pages before them in the same batch too.
            assert self._index is not None  # built for simhash
            self._index.add_many(rows.tolist(), fp.simhash)
            found = self._index.search(fp.simhash)
            query, row = found.query, found.row
            score = -found.distance.astype(np.float64)
            pos = self._positions(base, n, query, row)
            verdicts = self._verdicts(base, query, row, score, fp.simhash, pos)
        if self.cluster_n:
            verdicts = [replace(v, cluster=key) for v, key in zip(verdicts, fp.cluster_keys(self.cluster_n))]
        return verdicts

    # ------------------------------------------------------------------ internals
    def _positions(self, base: int, n: int, query: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Each page's position in the order: its own row, or the first row stored with its id
        and fingerprint (an unchanged re-fetch keeps the first fetch's place)."""
        pos = np.arange(base, base + n, dtype=np.int64)
        own = base + query
        fps, id_hash = self._fps.view(), self._id_hash.view()
        same = (id_hash[row] == id_hash[own]) & (fps[row] == fps[own])
        np.minimum.at(pos, query[same], row[same])
        return pos

    def _band_verdicts(self, base: int, fp: Fingerprints) -> list[Verdict]:
        """The band modes: every band's table judges the batch (store, then search, as a shard
        does); a page's match is the best of the bands' answers: lowest rank, then lowest band."""
        assert self.bands is not None  # a band mode
        n = len(fp.simhash)
        keys, sketch = self.bands.split(self.bands.extra(fp.minhash))
        id_hash = self._id_hash.view()[base:]
        rank, match = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        for j, (table, refs) in enumerate(zip(self._tables, self._refs)):
            found = table.judge(keys[:, j], fp.simhash, id_hash, sketch, tags(keys[:, :j]))
            refs.extend(base + np.flatnonzero(found.new))
            better = (found.rank >= 0) & ((rank < 0) | (found.rank < rank))  # ties: the lower band
            rank[better], match[better] = found.rank[better], refs.view()[found.row[better]]
        out = []
        for q, (fp_q, r, m) in enumerate(zip(fp.simhash.tolist(), rank.tolist(), match.tolist())):
            i = base + q
            if r < 0:
                out.append(Verdict(self._ids[i], self._urls[i], "unique", fp_q))
                continue
            distance = (fp_q ^ int(self._fps.view()[m])).bit_count()
            similarity = self.bands.similarity_of_rank(r)
            out.append(
                Verdict(
                    self._ids[i],
                    self._urls[i],
                    "near_duplicate",
                    fp_q,
                    self._ids[m],
                    self._urls[m],
                    distance,
                    similarity,
                )
            )
        return out

    def _verdicts(
        self, base: int, query: np.ndarray, row: np.ndarray, score: np.ndarray, fps: np.ndarray, pos: np.ndarray
    ) -> list[Verdict]:
        own = base + query
        id_hash = self._id_hash.view()
        keep = (row < pos[query]) & (id_hash[row] != id_hash[own])
        query, row, score = query[keep], row[keep], score[keep]
        # best = highest score (smallest distance / highest resemblance), then (simhash) the
        # lowest canonical group, then the first stored row: the stream worker's tie-break
        if self._masks is not None:
            group = canonical_groups(self._fps.view()[own[keep]] ^ self._fps.view()[row], self._masks)
            order = np.lexsort((row, group, -score, query))
        else:
            order = np.lexsort((row, -score, query))
        query, row, score = query[order], row[order], score[order]
        first = np.ones(len(query), dtype=bool)
        first[1:] = query[1:] != query[:-1]
        best = dict(zip(query[first].tolist(), zip(row[first].tolist(), score[first].tolist())))
        out = []
        for q in range(len(fps)):
            r = base + q
            fp = int(fps[q])
            if q not in best:
                out.append(Verdict(self._ids[r], self._urls[r], "unique", fp))
                continue
            m, s = best[q]
            distance = (fp ^ int(self._fps.view()[m])).bit_count()
            similarity = None if self.algorithm == "simhash" else float(s)
            out.append(
                Verdict(
                    self._ids[r], self._urls[r], "near_duplicate", fp, self._ids[m], self._urls[m], distance, similarity
                )
            )
        return out


def _id_hashes(ids: Sequence[str]) -> np.ndarray:
    return np.fromiter(
        (xxhash.xxh3_64_intdigest(i.encode("utf-8", "surrogatepass")) for i in ids), dtype=np.uint64, count=len(ids)
    )
