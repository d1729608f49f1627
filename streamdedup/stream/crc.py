"""Record batch CRCs checked at the speed of the CPU's CRC32C instruction, in the bulk changelog
reader's thread.

aiokafka checks each record batch's CRC-32C (``check_crcs``, on by default) with a table-driven
loop in its Cython extension: ~1.9 GB/s on this machine, so ~3.3 s of CPU for the 6.3 GB
changelog of 10 M pages, ~15 % of the bulk reader thread's samples in a profile of that replay.
The ``crc32c`` package computes the same checksum with SSE 4.2 / ARMv8 instructions (~13 GB/s
here; a software fallback elsewhere).

Inside :func:`hardware_crcs` (one thread's scope), the record sets aiokafka's fetcher builds are
:class:`_CheckedRecords`: aiokafka's own ``MemoryRecords`` over the same bytes, whose batches'
``validate_crc`` gives crc32c's verdict on the bytes the CRC covers.  Everything else is
aiokafka's: the check stays where it calls it (``PartitionRecords._unpack_records``, a
``CorruptRecordException`` on a mismatch), and batches of the old formats (magic 0 and 1, CRC-32
over other bytes) are checked by aiokafka itself.  Other threads (faust's consumer) are not
touched.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import aiokafka.consumer.fetcher as _fetcher
from aiokafka.record.memory_records import MemoryRecords

_crc32c: Callable[[Any], int] | None
try:
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - a platform without a crc32c wheel: aiokafka checks them
    _crc32c = None

__all__ = ["hardware_crcs", "checked_records"]

_HEADER = 12  # base offset (8) and batch length (4): the length counts the bytes after it
_CRC_FROM = 21  # magic 2: ... magic (offset 16), crc (17..20), then the bytes it covers
_local = threading.local()


class _CheckedBatch:
    """One of aiokafka's record batches, its CRC verdict given."""

    __slots__ = ("_batch", "_crc_ok")

    def __init__(self, batch: Any, crc_ok: bool) -> None:
        self._batch, self._crc_ok = batch, crc_ok

    def validate_crc(self) -> bool:
        return self._crc_ok

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._batch)

    def __next__(self) -> Any:
        return next(self._batch)


class _CheckedRecords:
    """aiokafka's ``MemoryRecords`` of ``buffer``, its magic-2 batches' CRCs checked by crc32c."""

    def __init__(self, buffer: bytes) -> None:
        self._records, self._view, self._at = MemoryRecords(buffer), memoryview(buffer), 0

    def size_in_bytes(self) -> int:
        return self._records.size_in_bytes()

    def has_next(self) -> bool:
        return self._records.has_next()

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is None:
            return None
        view, start = self._view, self._at
        end = start + _HEADER + int.from_bytes(view[start + 8 : start + _HEADER], "big")
        self._at = end
        if batch.magic != 2 or _crc32c is None:
            return batch
        return _CheckedBatch(batch, _crc32c(view[start + _CRC_FROM : end]) == batch.crc)


def checked_records(buffer: bytes) -> Any:
    """What aiokafka's fetcher takes for ``MemoryRecords(buffer)``: in a :func:`hardware_crcs`
    scope, records whose CRCs crc32c checks; elsewhere aiokafka's own."""
    if getattr(_local, "on", False) and _crc32c is not None:
        return _CheckedRecords(buffer)
    return MemoryRecords(buffer)


@contextlib.contextmanager
def hardware_crcs() -> Iterator[None]:
    """In this thread, the record batches aiokafka's consumers fetch have their CRCs checked by
    crc32c (for the bulk changelog reader, whose thread and consumer are its own)."""
    before = getattr(_local, "on", False)
    _local.on = True
    try:
        yield
    finally:
        _local.on = before


_fetcher.MemoryRecords = checked_records  # (aiokafka 0.14: its one use, _proc_fetch_request)
