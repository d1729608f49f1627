"""aiokafka's consumer parsing a fetch that holds a record whose header key is not UTF-8 (any
producer but Java's can write one; kcat does in tests/integration/test_hostile.py): the records
of the fetch all come out, that key read ``surrogateescape``, instead of a UnicodeDecodeError
that stopped the worker at that record every time it started."""

from __future__ import annotations

import struct

import pytest
from aiokafka.consumer.fetcher import READ_UNCOMMITTED, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from streamdedup.pipeline.intake import Record, parse
from streamdedup.stream import lenient_records

CRC_AT = 17  # a v2 batch's CRC, over the bytes from its attributes (21) on
BAD = b"\xff\xfe"


def batch(base: int, bad_at: int | None, compression: int = 0, n: int = 3) -> bytes:
    """A v2 record batch of ``n`` records from offset ``base``; record ``bad_at``'s header key
    is ``BAD`` (written as "QQ", then its bytes replaced, and the CRC fixed)."""
    b = DefaultRecordBatchBuilder(2, compression, 0, -1, -1, -1, 1 << 20)
    for i in range(n):
        headers = [("QQ" if i == bad_at else "ok", b"v")]
        b.append(
            i, timestamp=None, key=b"k%d" % i, value=b'{"url": "http://a/%d", "content": "x"}' % i, headers=headers
        )
    raw = bytearray(b.build())
    struct.pack_into(">q", raw, 0, base)
    if bad_at is not None and compression == 0:
        at = raw.index(b"QQ")
        raw[at : at + 2] = BAD
        struct.pack_into(">I", raw, CRC_AT, calc_crc32c(bytes(raw[CRC_AT + 4 :])))
    return bytes(raw)


def consume(raw: bytes) -> list:
    tp = TopicPartition("pages", 0)
    records = PartitionRecords(tp, lenient_records._Kept(raw), [], 0, None, None, True, READ_UNCOMMITTED)
    return list(records)


@pytest.fixture(autouse=True)
def installed():
    lenient_records.install()


def test_every_record_of_the_fetch_comes_out_and_the_bad_key_reads_surrogateescape():
    got = consume(batch(0, bad_at=1) + batch(3, bad_at=None))
    assert [r.offset for r in got] == [0, 1, 2, 3, 4, 5]
    assert [r.headers[0][0] for r in got] == ["ok", BAD.decode("utf-8", "surrogateescape"), "ok", "ok", "ok", "ok"]
    assert [r.value for r in got] == [b'{"url": "http://a/%d", "content": "x"}' % (i % 3) for i in range(6)]


def test_a_fetch_without_such_a_key_is_parsed_as_before():
    got = consume(batch(0, bad_at=None) + batch(3, bad_at=None, compression=1))  # (gzip)
    assert [r.offset for r in got] == list(range(6)) and all(list(r.headers) == [("ok", b"v")] for r in got)


def test_the_worker_makes_that_record_a_not_utf8_dead_letter_and_judges_its_neighbours():
    got = consume(batch(0, bad_at=1))
    parsed = parse([Record(0, r.offset, r.key, r.value, r.headers) for r in got], 1 << 20)
    reasons = [None if e is None else e.reason for e in parsed.errors]
    assert reasons == [None, "not_utf8", None]
    assert "\\xff\\xfe" in str(parsed.errors[1])
