"""``streamdedup scan``: the embedded mode, no Kafka.

Reads pages (JSON lines or WARC), judges each against all earlier pages in input order with
the same fingerprint and index code the stream worker uses, and writes one verdict per page
as a JSON line.  A bad record is reported with its line (or WARC record) number and skipped.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

from streamdedup.engine.dedup import Deduplicator, Verdict
from streamdedup.engine.records import Page, page_text
from streamdedup.errors import RecordError

__all__ = ["ScanSummary", "scan_pages"]


@dataclass
class ScanSummary:
    pages: int = 0
    verdicts: Counter = field(default_factory=Counter)
    bad: Counter = field(default_factory=Counter)  # by reason


def scan_pages(
    records: Iterable[tuple[int, Page | RecordError]],
    dedup: Deduplicator,
    out: TextIO,
    batch_size: int = 256,
    on_bad: Callable[[int, str, str], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> ScanSummary:
    """Judge numbered records in order and write a verdict JSON line per page to ``out``.

    ``on_bad(number, reason, message)`` hears of each skipped record; ``on_progress(n)`` of
    each batch done.
    """
    summary = ScanSummary()
    for batch, bad in _batches(records, batch_size):
        for number, err in bad:
            summary.bad[err.reason] += 1
            if on_bad is not None:
                on_bad(number, err.reason, str(err))
        if batch:
            verdicts = dedup.process([p.id for p, _ in batch], [p.url for p, _ in batch], [text for _, text in batch])
            _write(out, verdicts)
            summary.pages += len(verdicts)
            summary.verdicts.update(v.verdict for v in verdicts)
        if on_progress is not None:
            on_progress(len(batch) + len(bad))
    return summary


def _batches(records: Iterable[tuple[int, Page | RecordError]], size: int) -> Iterator[tuple[list, list]]:
    """Batches of (page, visible text), with the records that failed on the way."""
    batch: list[tuple[Page, str]] = []
    bad: list[tuple[int, RecordError | RecordError]] = []
    for number, item in records:
        if isinstance(item, RecordError):
            bad.append((number, item))
        else:
            try:
                text = page_text(item)
            except RecordError as e:
                bad.append((number, e))
            else:
                batch.append((item, text))
        if len(batch) >= size:
            yield batch, bad
            batch, bad = [], []
    if batch or bad:
        yield batch, bad


def _write(out: TextIO, verdicts: list[Verdict]) -> None:
    out.write("".join(json.dumps(v.to_dict(), ensure_ascii=False) + "\n" for v in verdicts))


def report_bad(number: int, reason: str, message: str) -> None:
    print(f"record {number}: skipped: {message}", file=sys.stderr)
