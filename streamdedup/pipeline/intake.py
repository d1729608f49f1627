"""The worker's first stage: input records -> pages waiting for answers + probe batches.

For a batch of records read from the pages topic: validate each (a bad one becomes a dead
letter with its reason, in its place), extract the visible text, fingerprint the good pages
in one batch, register them as waiting, and make their probes: one per table group, grouped
by the shard partition that owns the group's value (:class:`~streamdedup.pipeline.shard.ShardPlan`),
so a batch costs one Kafka message per shard partition, not one per probe.

A probe carries the page's fetch time, ``fetched_at`` from the record (ISO 8601, in
milliseconds), else the record's Kafka timestamp: stored and answered, but it decides no order
(the first stored wins: :mod:`streamdedup.engine.order`).  No faust here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import numpy as np
import xxhash

from streamdedup.engine.records import Page, page_from_json, page_text
from streamdedup.errors import RecordError
from streamdedup.fingerprinting.cluster import DEFAULT_CLUSTER_N
from streamdedup.fingerprinting.pages import Fingerprints
from streamdedup.fingerprinting.text import Utf8Text
from streamdedup.index.bands import BandScheme
from streamdedup.pipeline.pending import Pending
from streamdedup.pipeline.routing import safe_key
from streamdedup.pipeline.shard import Plan
from streamdedup.pipeline.wire import PROBES, Batch

__all__ = [
    "Record",
    "Parsed",
    "Fingerprinted",
    "Intake",
    "parse",
    "fingerprint_contents",
    "probe_batches",
    "fetched_ms",
    "id_hash",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Record:
    """One input record as read from Kafka."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()
    timestamp_ms: int | None = None


@dataclass
class Parsed:
    """A batch of records after the cheap checks (JSON, fields, size, time), in input order."""

    records: list[Record]
    pages: list[Page | None]
    errors: list[RecordError | RecordError | None]
    fetched: list[int]

    def contents(self) -> list[tuple[str | bytes | Utf8Text, str | None, str | None]]:
        """What :func:`fingerprint_contents` needs of the good pages (small to send to a process)."""
        return [
            (p.content, p.content_type, p.charset)
            for p, e in zip(self.pages, self.errors)
            if e is None and p is not None
        ]


def parse(records: Sequence[Record], max_bytes: int) -> Parsed:
    """Check each record on its own: whatever goes wrong with one (bad input, or a bug it
    triggers) is that record's dead letter, never its neighbours'."""
    out = Parsed([], [], [], [])
    for r in records:
        page, error, fetched = None, None, 0
        try:
            _check_headers(r.headers)
            if r.value is None:
                raise RecordError("empty", "the record has no value (a tombstone)")
            page = page_from_json(r.value, max_bytes)
            fetched = fetched_ms(page.fetched_at, r.timestamp_ms)
        except RecordError as e:
            error = e
        except Exception as e:  # a bug this record triggers: keep it on the dead-letter topic
            page, error = None, RecordError("internal_error", f"{type(e).__name__}: {e}")
        out.records.append(r)
        out.pages.append(page)
        out.errors.append(error)
        out.fetched.append(fetched)
    return out


def _check_headers(headers: Sequence[tuple[str, bytes]]) -> None:
    """A header key that is not UTF-8 (read with ``surrogateescape``:
    :mod:`streamdedup.stream.lenient_records`) makes the record a ``not_utf8`` dead letter."""
    for key, _ in headers:
        if not key.isascii():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                raise RecordError("not_utf8", f"a header key is not UTF-8: {safe_key(key)}") from None


class Fingerprinted(NamedTuple):
    """What :func:`fingerprint_contents` computed, for the pages that have text, in order."""

    fps: np.ndarray  # uint64 simhash
    failed: list[tuple[int, str, str]]  # (position among the contents, reason, message) of the others
    clusters: list[int | None]  # bottom-n cluster keys (None: no words, or cluster_n == 0)
    extra: np.ndarray | None  # the band modes: each page's band keys and sketch (BandScheme.extra)


def fingerprint_contents(
    contents: Sequence[tuple[str | bytes | Utf8Text, str | None, str | None]],
    cluster_n: int = DEFAULT_CLUSTER_N,
    bands: BandScheme | None = None,
) -> Fingerprinted:
    """The heavy part: visible text, simhash, cluster key and (``bands``: the LSH band modes)
    band keys and sketch of each (content, content type, charset).

    A plain function of plain data, so the worker can run it in another process while its
    event loop goes on with Kafka.
    """
    texts, failed = [], []
    for i, (content, content_type, charset) in enumerate(contents):
        try:
            texts.append(page_text(Page("", "", content, content_type, charset)))
        except RecordError as e:
            failed.append((i, e.reason, e.message))
        except Exception as e:  # a bug this page triggers: its dead letter, not the batch's
            failed.append((i, "internal_error", f"{type(e).__name__}: {e}"))
    if not texts:
        empty = None if bands is None else np.zeros((0, bands.extra_bytes), dtype=np.uint8)
        return Fingerprinted(np.zeros(0, dtype=np.uint64), failed, [], empty)
    fingerprints = Fingerprints(texts, bands.num_perm if bands is not None else 128)
    extra = None if bands is None else bands.extra(fingerprints.minhash)
    return Fingerprinted(fingerprints.simhash, failed, fingerprints.cluster_keys(cluster_n), extra)


#: The dead letter's message for a page whose fingerprinting process died on it twice
PROCESS_DIED = "the fingerprinting process died while it read this page (twice): out of memory, or a crash"


def process_died(bands: BandScheme | None = None) -> Fingerprinted:
    """What :func:`fingerprint_contents` of one page gives when the page killed its process: an
    ``internal_error`` for it."""
    empty = None if bands is None else np.zeros((0, bands.extra_bytes), dtype=np.uint8)
    return Fingerprinted(np.zeros(0, dtype=np.uint64), [(0, "internal_error", PROCESS_DIED)], [], empty)


def too_slow(why: str, bands: BandScheme | None = None) -> Fingerprinted:
    """What :func:`fingerprint_contents` of one page gives when it ran past its deadline (its
    process was killed): ``unparsable``, since what takes that long is hostile markup."""
    empty = None if bands is None else np.zeros((0, bands.extra_bytes), dtype=np.uint8)
    return Fingerprinted(np.zeros(0, dtype=np.uint64), [(0, "unparsable", f"{why} (hostile markup?)")], [], empty)


def content_bytes(content: tuple) -> int:
    """The size of a :meth:`Parsed.contents` item's text (characters of a str), for its deadline."""
    text = content[0]
    return len(text.data) if isinstance(text, Utf8Text) else len(text)


def join_fingerprinted(parts: Sequence[tuple[int, Fingerprinted]], bands: BandScheme | None = None) -> Fingerprinted:
    """:func:`fingerprint_contents` of consecutive parts of one batch, each given with the
    position of its first content, as one result for the batch."""
    fps = [p.fps for _, p in parts]
    failed = [(at + i, reason, message) for at, p in parts for i, reason, message in p.failed]
    clusters = [c for _, p in parts for c in p.clusters]
    extra = None
    if bands is not None:
        none = np.zeros((0, bands.extra_bytes), dtype=np.uint8)
        extra = np.concatenate([p.extra for _, p in parts if p.extra is not None] or [none])
    return Fingerprinted(
        np.concatenate(fps or [np.zeros(0, dtype=np.uint64)]).astype(np.uint64), failed, clusters, extra
    )


@dataclass
class Intake:
    """What a batch of records became."""

    probes: dict[int, Batch] = field(default_factory=dict)  # shard partition -> probes
    pages: int = 0
    bad: dict[str, int] = field(default_factory=dict)  # reason -> count
    partitions: set[int] = field(default_factory=set)  # input partitions touched

    @classmethod
    def read(
        cls,
        records: Sequence[Record],
        pending: Pending,
        plan: Plan,
        max_bytes: int,
        cluster_n: int = DEFAULT_CLUSTER_N,
        bands: BandScheme | None = None,
    ) -> Intake:
        """Parse, fingerprint and register a batch, all here."""
        parsed = parse(records, max_bytes)
        done = fingerprint_contents(parsed.contents(), cluster_n, bands)
        return cls.register(parsed, done.fps, done.failed, pending, plan, done.clusters, done.extra)

    @classmethod
    def register(
        cls,
        parsed: Parsed,
        fps: np.ndarray,
        failed: list[tuple[int, str, str]],
        pending: Pending,
        plan: Plan,
        clusters: Sequence[int | None] | None = None,
        extra: np.ndarray | None = None,
    ) -> Intake:
        """Register a parsed and fingerprinted batch in ``pending`` (in offset order) and make its probes.

        ``clusters``: the cluster keys from :func:`fingerprint_contents`, aligned with ``fps``
        (None: no keys).  They stay with the waiting page in this worker; probes do not carry them.
        ``extra``: the band modes' band keys and sketches, aligned with ``fps``."""
        out = cls()
        errors = list(parsed.errors)
        good = [i for i, e in enumerate(errors) if e is None]
        for j, reason, message in failed:  # positions among the good pages
            errors[good[j]] = RecordError(reason, message)
        fp_of, cluster_of, row_of = {}, {}, {}
        keys = clusters if clusters is not None else [None] * len(fps)
        for j, (i, fp, key) in enumerate(zip((i for i in good if errors[i] is None), fps.tolist(), keys)):
            fp_of[i], cluster_of[i], row_of[i] = fp, key, j
        rows: list[tuple[int, int, int, int, str, str]] = []  # (request, fetched, id hash, partition, id, url)
        row_fps: list[int] = []
        row_extra: list[int] = []  # the page's row in ``extra``
        for i, (r, page, error, fetched) in enumerate(zip(parsed.records, parsed.pages, errors, parsed.fetched)):
            out.partitions.add(r.partition)
            if error is not None:  # registered in offset order, dead letters in their place
                out.bad[error.reason] = out.bad.get(error.reason, 0) + 1
                pending.add_bad(
                    r.partition,
                    r.offset,
                    error.reason,
                    error.message,
                    key=r.key,
                    value=r.value or b"",
                    headers=r.headers,
                    timestamp_ms=r.timestamp_ms,
                    page_id=page.id if page is not None else None,
                )
                continue
            out.pages += 1
            assert page is not None and r.value is not None  # parsed without error
            req = pending.add_page(
                r.partition,
                r.offset,
                page_id=page.id,
                url=page.url,
                fingerprint=fp_of[i],
                key=r.key,
                value=r.value,
                headers=r.headers,
                timestamp_ms=r.timestamp_ms,
                cluster=cluster_of[i],
            )
            if req is not None:  # None: redelivered while its first delivery still waits
                rows.append((req, fetched, id_hash(page.id), r.partition, page.id, page.url))
                row_fps.append(fp_of[i])
                row_extra.append(row_of[i])
        if rows:
            requests, fetched_ms_, id_hashes, partitions, ids, urls = (list(c) for c in zip(*rows))
            fps_ = np.array(row_fps, dtype=np.uint64)
            extra_ = None if extra is None else extra[np.array(row_extra, dtype=np.int64)]
            out.probes = probe_batches(
                plan, fps_, requests, fetched_ms_, id_hashes, partitions, ids, urls, extra=extra_
            )
        return out


def probe_batches(
    plan: Plan,
    fps: np.ndarray,
    requests,
    fetched,
    id_hashes,
    partitions,
    ids,
    urls,
    kind: int = PROBES,
    extra: np.ndarray | None = None,
) -> dict[int, Batch]:
    """One probe per (page, table group or band), grouped by the shard partition that owns it.
    ``extra``: each page's band keys and sketch (the band modes; every probe of the page carries them)."""
    dest = plan.probes(fps, extra)  # (n, groups)
    n, g = dest.shape
    page_of = np.repeat(np.arange(n), g)
    flat = Batch.build(
        group=np.tile(np.arange(g), n),
        fps=fps[page_of],
        fetched=np.asarray(fetched, dtype=np.int64)[page_of],
        id_hash=np.asarray(id_hashes, dtype=np.uint64)[page_of],
        request=np.asarray(requests, dtype=np.uint64)[page_of],
        partition=np.asarray(partitions)[page_of],
        ids=[ids[i] for i in page_of.tolist()],
        urls=[urls[i] for i in page_of.tolist()],
        kind=kind,
        extra=None if extra is None else extra[page_of],
    )
    dest = dest.ravel()
    return {s: flat.select(dest == s) for s in np.unique(dest).tolist()}


def fetched_ms(value: str | None, fallback_ms: int | None) -> int:
    """Milliseconds since the epoch of an ISO 8601 time (UTC if no zone given), else ``fallback_ms``.

    >>> fetched_ms("2024-05-01T12:00:00Z", None), fetched_ms(None, 42)
    (1714564800000, 42)
    """
    if value is None or not value.strip():
        return int(fallback_ms or 0)
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        raise RecordError("bad_field", f'"fetched_at" is not an ISO 8601 time: {value[:40]!r}') from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return (t - _EPOCH) // timedelta(milliseconds=1)  # integer arithmetic: exact to the millisecond


def id_hash(page_id: str) -> int:
    """The 64-bit hash of a page id: the "never itself" test and a replay's identity (with the fingerprint)."""
    return xxhash.xxh3_64_intdigest(page_id.encode("utf-8", "surrogatepass"))
