"""Pages waiting for their shard answers, released per input partition in offset order.

A page's probes go to up to ``n_groups`` shards; each group's shard answers with its best
match among the candidates whose canonical group it is (:mod:`streamdedup.engine.order`), so
the candidates of different groups are different pages.  The verdict's match is the nearest
of the answers, then the one from the lowest group: with the shard's "first stored" within a
group, that is the rule's "nearest, then lowest canonical group, then first stored".  Offsets are committed per input partition, so a page is released
only when it and every page before it in its partition are done: the committed offset never
passes a page without a verdict.  Bad records are done as soon as they are added.

Answers name the page by a request id that includes a random per-process prefix, so answers
to an earlier incarnation's probes (replayed after a crash) are ignored rather than mixed in.

>>> p = Pending(n_groups=2)
>>> r = p.add_page(0, 10, page_id="a", url="u", fingerprint=1, key=b"a", value=b"{}")
>>> p.add_bad(0, 11, "not_json", "the record is not JSON", key=None, value=b"x")
>>> [w.offset for w in p.ready(0)]
[]
>>> p.answer_one(r, group=0, distance=-1), p.answer_one(r, group=1, distance=2, match=(5, 7, 9, "m", "mu"))
(0, 0)
>>> [(w.offset, w.verdict) for w in p.ready(0)]
[(10, 'near_duplicate'), (11, None)]
"""

from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from streamdedup.pipeline.wire import Batch

__all__ = ["Waiting", "Pending"]


@dataclass
class Waiting:
    """One input record from its arrival to its verdict (or dead letter)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int | None = None  # the record's Kafka timestamp
    page_id: str | None = None
    url: str | None = None
    fingerprint: int | None = None
    reason: str | None = None  # a dead letter's reason code
    error: str | None = None
    missing: int = 0  # bitmask of groups not answered yet
    best: tuple | None = None  # (distance, fetched, id_hash, fingerprint, id, url) of the match
    best_group: int = -1  # the group whose shard answered with the match (its canonical group)
    request: int | None = None
    on_done: Callable[[Waiting], object] | None = (
        None  # a check's callback, called with the record when its answers are in
    )
    cluster: int | None = None  # the page's bottom-n cluster key (None: no words, or keys off)
    similarity: float | None = None  # the match's estimated resemblance (the minhash mode)
    # wall-clock seconds (time.time()) of its way through a worker, for the phase metrics: its batch
    # taken from the buffer, its probes sent, its last answer in (None: not there yet)
    taken_at: float | None = None
    probed_at: float | None = None
    answered_at: float | None = None

    @property
    def done(self) -> bool:
        return self.missing == 0

    @property
    def verdict(self) -> str | None:
        """'unique' or 'near_duplicate' for a page; None for a dead letter."""
        if self.reason is not None:
            return None
        return "unique" if self.best is None else "near_duplicate"


class Pending:
    """``similarity_of``: the estimated resemblance a match's rank stands for (the minhash mode;
    None: the answers' distances are Hamming distances)."""

    def __init__(self, n_groups: int, similarity_of: Callable[[int], float | None] | None = None) -> None:
        self.n_groups, self.similarity_of = n_groups, similarity_of
        self._parts: dict[int, OrderedDict[int, Waiting]] = {}
        self._requests: dict[int, Waiting] = {}
        self._prefix = int.from_bytes(os.urandom(4), "little") << 32
        self._counter = itertools.count(1)
        self.bytes = 0  # of the values of the records held (the input's bytes: the worker's back-pressure)

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts.values())

    def _add(self, w: Waiting) -> bool:
        part = self._parts.setdefault(w.partition, OrderedDict())
        if w.offset in part:  # redelivered while still waiting: keep the first
            return False
        last = next(reversed(part)) if part else None
        part[w.offset] = w
        self.bytes += len(w.value)
        if last is not None and w.offset < last:  # rare (an internal error's dead letter): keep offset order
            self._parts[w.partition] = OrderedDict(sorted(part.items()))
        return True

    def add_page(
        self,
        partition: int,
        offset: int,
        *,
        page_id: str,
        url: str,
        fingerprint: int,
        key: bytes | None,
        value: bytes,
        headers=(),
        timestamp_ms: int | None = None,
        cluster: int | None = None,
    ) -> int | None:
        """Wait for a page's answers; returns its request id (None: already waiting)."""
        request = self._prefix | (next(self._counter) & 0xFFFF_FFFF)
        w = Waiting(
            partition,
            offset,
            key,
            value,
            list(headers),
            timestamp_ms,
            page_id,
            url,
            fingerprint,
            missing=(1 << self.n_groups) - 1,
            request=request,
            cluster=cluster,
        )
        if not self._add(w):
            return None
        self._requests[request] = w
        return request

    def add_bad(
        self,
        partition: int,
        offset: int,
        reason: str,
        error: str,
        *,
        key: bytes | None,
        value: bytes,
        headers=(),
        timestamp_ms: int | None = None,
        page_id: str | None = None,
    ) -> None:
        """A record for the dead-letter topic: done at once, released in its place."""
        self._add(
            Waiting(partition, offset, key, value, list(headers), timestamp_ms, page_id, reason=reason, error=error)
        )

    def add_check(self, page_id: str, url: str, fingerprint: int, on_done, cluster: int | None = None) -> int:
        """Wait for the answers to a check (not stored, never released); ``on_done(waiting)`` is
        called when they are all in.  Returns the request id; :meth:`cancel` forgets it."""
        request = self._prefix | (next(self._counter) & 0xFFFF_FFFF)
        self._requests[request] = Waiting(
            -1,
            -1,
            None,
            b"",
            page_id=page_id,
            url=url,
            fingerprint=fingerprint,
            missing=(1 << self.n_groups) - 1,
            request=request,
            on_done=on_done,
            cluster=cluster,
        )
        return request

    def cancel(self, request: int) -> None:
        self._requests.pop(request, None)

    def fail(
        self,
        partition: int,
        offset: int,
        reason: str,
        error: str,
        *,
        key: bytes | None,
        value: bytes,
        headers=(),
        timestamp_ms: int | None = None,
    ) -> None:
        """Make a record a dead letter, whether or not it is waiting already (an internal error)."""
        w = self._parts.get(partition, OrderedDict()).get(offset)
        if w is None:
            self.add_bad(
                partition, offset, reason, error, key=key, value=value, headers=headers, timestamp_ms=timestamp_ms
            )
            return
        if w.request is not None:
            self._requests.pop(w.request, None)
        w.reason, w.error, w.missing, w.best, w.best_group = reason, error, 0, None, -1

    def at(self, partition: int, offset: int) -> Waiting | None:
        """The record of ``partition`` at ``offset`` while it waits (None: not waiting)."""
        part = self._parts.get(partition)
        return None if part is None else part.get(offset)

    def waiting(self, request: int) -> Waiting | None:
        """The record waiting for ``request``'s answers (None: unknown or done)."""
        return self._requests.get(request)

    def fail_request(self, request: int, reason: str, error: str) -> int | None:
        """A stage gave up on a waiting page: it becomes a dead letter in its place.  Returns its
        partition (None: unknown request, or a check, which is only forgotten)."""
        w = self._requests.pop(request, None)
        if w is None or w.partition < 0:
            return None
        w.reason, w.error, w.missing, w.best = reason, error, 0, None
        return w.partition

    def answer_one(self, request: int, group: int, distance: int, match: tuple | None = None) -> int | None:
        """Record one group's answer; returns the page's partition (None: unknown request)."""
        w = self._requests.get(request)
        if w is None or not w.missing >> group & 1:
            return None
        w.missing &= ~(1 << group)
        if distance >= 0 and match is not None:
            if w.best is None or (distance, group) < (w.best[0], w.best_group):  # nearest, then lowest group
                w.best, w.best_group = (distance, *match), group
                if self.similarity_of is not None:
                    w.similarity = self.similarity_of(distance)
        if w.done:
            w.answered_at = time.time()
            del self._requests[request]
            if w.on_done is not None:
                w.on_done(w)
                return None
        # (a check, partition -1, has no partition to flush: scheduling one logged "partition -1
        # is not ours (any more)" for every check still missing an answer)
        return w.partition if w.partition >= 0 else None

    def answer(self, batch: Batch) -> set[int]:
        """Record a decoded answers batch; returns the partitions that may have pages ready."""
        rows = batch.rows
        touched: set[int] = set()
        matched = np.flatnonzero(rows["distance"] >= 0)
        ids, urls = (batch.select(matched).ids(), batch.select(matched).urls()) if len(matched) else ([], [])
        match_of = dict(
            zip(
                matched.tolist(),
                zip(
                    rows["fetched"][matched].tolist(),
                    rows["id_hash"][matched].tolist(),
                    rows["fp"][matched].tolist(),
                    ids,
                    urls,
                ),
            )
        )
        for i, (req, group, dist) in enumerate(
            zip(rows["request"].tolist(), rows["group"].tolist(), rows["distance"].tolist())
        ):
            p = self.answer_one(req, group, dist, match_of.get(i))
            if p is not None:
                touched.add(p)
        return touched

    def ready(self, partition: int) -> list[Waiting]:
        """The done records at the head of a partition, in offset order (still held)."""
        out = []
        for w in self._parts.get(partition, {}).values():
            if not w.done:
                break
            out.append(w)
        return out

    def release(self, partition: int, records: list[Waiting]) -> None:
        """Forget records returned by :meth:`ready` once their outputs are committed."""
        part = self._parts.get(partition, OrderedDict())
        for w in records:
            if part.pop(w.offset, None) is not None:
                self.bytes -= len(w.value)

    def drop(self, partition: int) -> int:
        """Forget a partition (revoked: its records will be redelivered to its new owner)."""
        part = self._parts.pop(partition, OrderedDict())
        for w in part.values():
            self.bytes -= len(w.value)
            if w.request is not None:
                self._requests.pop(w.request, None)
        return len(part)

    def partitions(self) -> list[int]:
        return list(self._parts)

    def describe(self) -> str:
        """Where each partition's head is stuck, for a log line."""
        out = []
        for p, part in sorted(self._parts.items()):
            if part:
                head = next(iter(part.values()))
                out.append(
                    f"partition {p}: {len(part)} waiting, head offset {head.offset} missing groups {bin(head.missing)}"
                )
        return "; ".join(out) or "nothing waiting"
