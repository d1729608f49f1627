"""The sharded index of the LSH band modes (``--algorithm minhash`` and ``combined``).

The same stages as simhash (:mod:`streamdedup.pipeline.shard`): a page sends one probe per
*band* instead of one per table group, routed by the band's key
(:class:`~streamdedup.index.bands.BandScheme`), so two pages that agree on a band meet in the
shard that owns the key.  The shard stores the page in that band's
:class:`~streamdedup.index.bands.BandTable` and answers with its best earlier match whose
canonical band this is; the answers stage keeps the best of the bands (lowest rank, then
lowest band), as it does for the groups of simhash.  A probe row carries the page's simhash
in ``fp`` and its band keys and sketch as the row's extra bytes (``wire`` layout ``SDB3``);
the changelog stores the same rows.  No faust here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamdedup.index.bands import BandScheme, BandTable, tags
from streamdedup.index.strings import StringHeap, texts_from_state, texts_state
from streamdedup.pipeline.shard import Answers, name_matches, partition_of
from streamdedup.pipeline.wire import Batch

__all__ = ["BandPlan", "BandStore"]

_BAND_PLAN = -1  # marks a band plan in a snapshot's plan (a simhash plan starts with levels > 0)


@dataclass(frozen=True)
class BandPlan:
    """Which shard partition each of a page's band probes goes to.

    >>> plan = BandPlan(BandScheme(), partitions=4)
    >>> sigs = np.arange(2 * 128, dtype=np.uint32).reshape(2, 128)
    >>> plan.n_groups, plan.probes(np.zeros(2, np.uint64), plan.scheme.extra(sigs)).shape
    (10, (2, 10))
    """

    scheme: BandScheme
    partitions: int

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")

    @property
    def n_groups(self) -> int:
        return self.scheme.bands

    @property
    def extra_bytes(self) -> int:
        return self.scheme.extra_bytes

    def describe(self) -> list[int]:
        return [self.partitions, _BAND_PLAN, *self.scheme.describe()]

    def probes(self, fps: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
        """Partition of each (page, band) probe, shape (n, bands): the owner of the band's key."""
        if extra is None:
            raise ValueError("band probes need the pages' band keys (extra bytes)")
        keys, _ = self.scheme.split(extra)
        return partition_of(keys, self.partitions)

    def new_store(self, group: int, strings: str | None) -> BandStore:
        return BandStore(self.scheme, group, strings)

    def store_from_state(self, group: int, state: dict[str, np.ndarray], strings: str | None) -> BandStore:
        store = BandStore.__new__(BandStore)
        store.band = group
        store.texts = texts_from_state(state, strings)
        try:
            store.table = BandTable.from_state(
                self.scheme, group, {k[6:]: v for k, v in state.items() if k.startswith("table.")}, strings
            )
        except BaseException:
            store.texts.close()
            raise
        return store


class BandStore:
    """One band's pages in one shard: the band table, and what an answer tells of each stored
    page (its id and URL, in a string heap, read only for the matches reported).  With a string
    file, the table's columns other than the keys are in files beside it too.  The match's
    fetch time is not reported (no output carries it; the order is the store order): an
    answer's ``fetched`` is 0; the table keeps the rows' fetch times only under a retention."""

    def __init__(self, scheme: BandScheme, band: int, strings: str | None = None) -> None:
        self.band = band
        self.table = BandTable(scheme, band, strings)
        self.texts = StringHeap(strings)  # id of row r at 2r ("" when it is the url), its url at 2r + 1

    # With a retention (:mod:`streamdedup.pipeline.shard`): the table keeps each row's fetch time,
    # a re-crawl is stored anew after ``renew`` ms, and rows before the cutoff are gone.
    _renew = 0
    _dead = 0  # rows fetched before the cutoff last applied, not compacted away yet

    @property
    def renew(self) -> int:
        return self._renew

    @renew.setter
    def renew(self, ms: int) -> None:
        self.table.timed()  # (ValueError for a table of a snapshot written without a retention)
        self._renew = ms

    def rows(self) -> int:
        return len(self.table)

    def expire(self, cutoff: int, since: int = 0) -> bool:
        """Count the rows from ``since`` on fetched before ``cutoff`` as dead (``since`` 0: all of
        them again); once they are a quarter of all, keep only the others (True then)."""
        times = self.table.times
        if times is None:
            return False
        dead = int((times.view()[since:] < cutoff).sum())
        self._dead = dead if since == 0 else self._dead + dead
        if self._dead * 4 <= len(self.table):
            return False
        live = np.flatnonzero(times.view() >= cutoff)
        # both written aside before either is renamed: a failure leaves the strings and the
        # table as they were, both of them
        texts = self.texts.stage_keep(np.stack((2 * live, 2 * live + 1), axis=1).ravel())
        try:
            table = self.table.stage_keep_rows(live)
        except BaseException:
            texts.discard()
            raise
        texts.commit()
        table.commit()
        self._dead = 0
        return True

    def __len__(self) -> int:
        return len(self.table) - self._dead  # (rows expired and not compacted away yet: not counted)

    def prepare(self) -> None:
        self.table.prepare()

    def close(self) -> None:
        self.texts.close()
        self.table.close()

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.texts.nbytes

    @property
    def file_bytes(self) -> int:
        return self.texts.file_bytes + self.table.file_bytes

    def _split(self, extra: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if extra is None:
            raise ValueError("a band probe without its band keys")
        keys, sketch = self.table.scheme.split(extra)
        return keys[:, self.band], tags(keys[:, : self.band]), sketch

    def probe_and_insert(
        self, sel, fps, fetched, id_hash, ids, urls, out: Answers, insert: bool = True, extra=None, cutoff=None
    ) -> None:
        """Store the batch's new pages, then answer every probe (:meth:`BandTable.judge`;
        ``cutoff``: with a retention, rows fetched before it are gone)."""
        key, earlier, sketch = self._split(extra)

        def store_strings(new: np.ndarray) -> None:  # first: the write that can fail (a full disk)
            self.texts.extend([x for i in new.tolist() for x in ("" if ids[i] == urls[i] else ids[i], urls[i])])

        def mark_stored(new: np.ndarray) -> None:  # (in the table: a failure after it leaves them there)
            out.stored[sel[new]] = True

        texts = len(self.texts)
        try:
            found = self.table.judge(
                key,
                fps,
                id_hash,
                sketch,
                earlier,
                insert,
                before_insert=store_strings,
                after_insert=mark_stored,
                fetched=fetched if self.table.times is not None else None,
                cutoff=cutoff,
                renew=self._renew,
            )
        except BaseException:  # the table's columns are cut back by a failed add; the strings here
            if not out.stored[sel].any():
                self.texts.truncate(texts)
            raise
        hit = np.flatnonzero(found.rank >= 0)
        p, r = sel[hit], found.row[hit]
        out.distance[p], out.fingerprint[p] = found.rank[hit], self.table.fps.take(r)
        out.id_hash[p] = self.table.id_hash.take(r)
        name_matches(self.texts, r, p, out)

    def state(self) -> dict[str, np.ndarray]:
        out = {f"table.{k}": v for k, v in self.table.state().items()}
        out.update(texts_state(self.texts))
        return out

    def load(self, rec: Batch) -> None:
        """Store changelog rows as they are (recovery: no probing)."""
        key, earlier, sketch = self._split(rec.extra)
        texts = len(self.texts)
        self.texts.extend_raw(rec.strings, lambda: rec.lengths)
        try:
            self.table.add(key, rec.fps, rec.id_hash, sketch, earlier, rec.fetched)
        except BaseException:  # (all or nothing: a full disk)
            self.texts.truncate(texts)
            raise
