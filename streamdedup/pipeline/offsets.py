"""Which offsets of one pages partition the worker was given, so that its commits never pass a record
it has not judged (docs/faust-notes.md §10).

faust can drop a record it fetched again after a pause/seek/resume or after recovery's seek (its read
offset was raised past it by a stale fetch), so the offsets delivered to the pages agent can have a
hole, the very first record of an assignment included.  An :class:`PartitionOffsets` per owned pages
partition knows the committed offset (the next one expected), the offsets delivered since, and the
offsets a read of the partition showed to hold no record (transaction markers, compacted records).
The outbox commits only over a contiguous run of judged records from the committed offset
(:meth:`PartitionOffsets.committable`); the worker reads a hole again (:meth:`PartitionOffsets.hole`).

>>> t = PartitionOffsets()
>>> t.deliver(11)  # before the committed offset is known: kept, judged later
<Delivery.NEW: 'new'>
>>> t.start(10)
>>> t.hole()  # 10 was never delivered, 11 was
(10, 11)
>>> t.committable([11])  # the outbox holds 11 judged: it may not commit past 10
0
>>> t.deliver(10), t.deliver(11)
(<Delivery.FILLER: 'filler'>, <Delivery.DUPLICATE: 'duplicate'>)
>>> t.committable([10, 11]), t.hole()
(2, None)
"""

from __future__ import annotations

import enum

__all__ = ["Delivery", "PartitionOffsets"]


class Delivery(enum.Enum):
    NEW = "new"  # beyond every offset delivered so far
    FILLER = "filler"  # new, but below an offset delivered already: it fills a hole
    DUPLICATE = "duplicate"  # delivered already in this assignment, or below the committed offset


class PartitionOffsets:
    """One pages partition in one assignment of this worker."""

    def __init__(self) -> None:
        self.committed: int | None = None  # the next offset to commit; None until it is read at assignment
        self.delivered: set[int] = set()  # offsets at or above ``committed`` delivered in this assignment
        self.empty: set[int] = set()  # offsets at or above ``committed`` that hold no record
        self.top = -1  # the highest offset delivered
        self._frontier: int | None = None  # the first offset from ``committed`` neither delivered nor empty

    def start(self, committed: int) -> None:
        """The committed offset, read at assignment (the partition's beginning if none): the
        first offset expected.  Offsets delivered before it was known and below it are forgotten."""
        self.committed = self._frontier = committed
        self.delivered = {o for o in self.delivered if o >= committed}
        self.empty = {o for o in self.empty if o >= committed}
        self._advance()

    @property
    def known(self) -> bool:
        return self.committed is not None

    @property
    def after_delivered(self) -> int | None:
        """The offset after the highest one delivered, or the committed offset if none was:
        where reading goes on (None until the committed offset is known)."""
        return None if self.committed is None else max(self.committed, self.top + 1)

    def deliver(self, offset: int) -> Delivery:
        """Note a record delivered by the consumer (or read again by the worker)."""
        if (self.committed is not None and offset < self.committed) or offset in self.delivered:
            return Delivery.DUPLICATE
        self.empty.discard(offset)  # (a record where a read saw none: judge it, never drop it)
        self.delivered.add(offset)
        filler = offset < self.top
        self.top = max(self.top, offset)
        self._advance()
        return Delivery.FILLER if filler else Delivery.NEW

    def hole(self) -> tuple[int, int] | None:
        """``(first, last)``: ``first`` is the first offset from the committed one that was neither
        delivered nor shown empty, and ``last`` an offset delivered after it; None: no hole (or the
        committed offset is not known yet)."""
        if self._frontier is None or self._frontier > self.top:
            return None
        return self._frontier, self.top

    def missing(self, first: int, last: int) -> list[int]:
        """The offsets in ``[first, last]`` neither delivered nor shown empty."""
        start = max(first, self.committed or 0)
        return [o for o in range(start, last + 1) if o not in self.delivered and o not in self.empty]

    def mark_empty(self, offsets: list[int]) -> None:
        """A read of the partition passed these offsets without a record (markers, compaction),
        or the worker gave up reading them: commits may pass them."""
        self.empty.update(o for o in offsets if o not in self.delivered and (self.committed or 0) <= o)
        self._advance()

    def forget(self, offsets: list[int]) -> None:
        """Delivered records that were dropped before being judged (a batch taken under an earlier
        assignment): they are missing again, so a read fills them."""
        gone = [o for o in offsets if o in self.delivered]
        self.delivered.difference_update(gone)
        if gone and self._frontier is not None:
            self._frontier = min(self._frontier, min(gone))

    def committable(self, offsets: list[int]) -> int:
        """How many of ``offsets`` (the judged records at the head of the partition, in order) may
        be committed: those that follow the committed offset and each other with no gap but empty
        offsets.  0 while the committed offset is not known."""
        if self.committed is None:
            return 0
        expected, n = self.committed, 0
        for o in offsets:
            while expected in self.empty:
                expected += 1
            if o != expected:
                break
            n, expected = n + 1, o + 1
        return n

    def commit(self, offset: int) -> None:
        """The outbox committed ``offset`` (the next one to read)."""
        self.committed = offset
        self.delivered = {o for o in self.delivered if o >= offset}
        self.empty = {o for o in self.empty if o >= offset}
        self._frontier = max(self._frontier or offset, offset)
        self._advance()

    def _advance(self) -> None:
        if self._frontier is None:
            return
        while self._frontier in self.delivered or self._frontier in self.empty:
            self._frontier += 1
