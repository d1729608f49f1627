"""aiokafka's consumer, made to survive a record whose header key is not UTF-8.

Kafka's protocol carries a header key as bytes; Java clients write a String, but any other
producer (kcat, librdkafka) can write any bytes, and the broker stores them as they came.
aiokafka decodes header keys strictly while it parses a fetched batch, so one such record raised
``UnicodeDecodeError`` in faust's fetcher: the worker stopped, judged nothing of the batch, and
the record was there again after every restart (a poison pill for the whole worker).

:func:`install` changes two things in ``aiokafka.consumer.fetcher``, for every consumer of the
process (faust's, the worker's own readers):

* the fetch's ``MemoryRecords`` keeps its raw bytes (:class:`_Kept`, a thin wrapper);
* a partition's records are unpacked as before (aiokafka's compiled parser), and only if that
  raises ``UnicodeDecodeError`` is the fetch parsed again by aiokafka's pure-Python parser with
  header keys decoded ``surrogateescape`` (the records already handed out are skipped, as
  aiokafka skips records below its next fetch offset).

The record then reaches the worker with a key that cannot be encoded, which
:func:`streamdedup.pipeline.intake.parse` turns into a ``not_utf8`` dead letter; its headers
are written escaped (:func:`streamdedup.pipeline.routing.safe_key`).  Checked against aiokafka
0.14 (``tests/test_lenient_records.py``; a real broker and kcat: ``tests/integration/test_hostile.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.record.legacy_records import LegacyRecordBatch

__all__ = ["install"]

_real_memory_records = fetcher.MemoryRecords
_BATCH_HEAD = struct.Struct(">qi")  # base offset, batch length (the bytes after these 12)
_MAGIC_AT = 16


class _Kept:
    """``MemoryRecords`` (aiokafka's compiled one) with the raw bytes it was made of."""

    __slots__ = ("_records", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._records = _real_memory_records(raw)

    def size_in_bytes(self) -> int:
        return self._records.size_in_bytes()

    def has_next(self) -> bool:
        return self._records.has_next()

    def next_batch(self) -> Any:
        return self._records.next_batch()


class _LenientSlice(bytes):
    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes.decode(self, encoding, "surrogateescape")


class _LenientBuffer(bytes):
    """A record batch's bytes whose slices decode leniently: aiokafka's pure-Python parser
    decodes a header key with ``buffer[a:b].decode("utf-8")``."""

    def __getitem__(self, key: Any) -> Any:
        got = bytes.__getitem__(self, key)
        return _LenientSlice(got) if isinstance(key, slice) else got


class _LenientBatch(_DefaultRecordBatchPy):
    def __iter__(self) -> _LenientBatch:
        super().__iter__()  # (decompresses the records)
        self._buffer = _LenientBuffer(self._buffer)  # type: ignore[has-type]
        return self


class _LenientRecords:
    """The batches of a fetch's raw bytes, parsed by :class:`_LenientBatch`."""

    def __init__(self, raw: bytes) -> None:
        self._raw, self._pos = memoryview(raw), 0

    def size_in_bytes(self) -> int:
        return len(self._raw)

    def has_next(self) -> bool:
        if len(self._raw) - self._pos < _BATCH_HEAD.size:
            return False
        _, length = _BATCH_HEAD.unpack_from(self._raw, self._pos)
        return self._pos + _BATCH_HEAD.size + length <= len(self._raw)

    def next_batch(self) -> Any:
        if not self.has_next():
            return None
        _, length = _BATCH_HEAD.unpack_from(self._raw, self._pos)
        end = self._pos + _BATCH_HEAD.size + length
        data, self._pos = bytes(self._raw[self._pos : end]), end
        if data[_MAGIC_AT] >= 2:
            return _LenientBatch(data)
        return LegacyRecordBatch(data, data[_MAGIC_AT])


def _unpack_records(self: Any, _unpack: Any = fetcher.PartitionRecords._unpack_records) -> Iterator[Any]:
    records = _unpack(self)
    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except UnicodeDecodeError:
            if not isinstance(self._records, _Kept):
                raise
            # again from the fetch's start, leniently: aiokafka skips what it handed out already
            self._records = _LenientRecords(self._records.raw)
            yield from _unpack(self)
            return
        yield record


def install() -> None:
    """Patch aiokafka's fetcher, once per process (idempotent)."""
    if fetcher.MemoryRecords is _Kept:
        return
    fetcher.MemoryRecords = _Kept
    fetcher.PartitionRecords._unpack_records = _unpack_records
