"""Record batch CRCs checked by crc32c in the bulk reader's thread (stream/crc.py): aiokafka's own
record parsing must give the same records, and refuse the same damaged batch at the same place."""

from __future__ import annotations

import threading

import pytest
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition
from crc32c import crc32c

from streamdedup.stream import crc

TP0 = TopicPartition("changelog", 0)


def batch(base: int, n: int, *, producer_id: int = -1, control: bool = False) -> bytes:
    """A magic-2 record batch of ``n`` records from offset ``base``, as a broker stores it (a
    control batch: one abort marker)."""
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=int(producer_id >= 0), producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(n):
        key, value = (
            (b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00") if control else (b"k%d" % i, b"v%d" % (base + i))
        )
        b.append(i, timestamp=1_700_000_000_000, key=key, value=value, headers=[])
    raw = bytearray(b.build())
    raw[0:8] = base.to_bytes(8, "big")  # (a broker assigns the base offset; outside the CRC)
    if control:  # the attributes' control bit, then the CRC over the attributes onwards again
        raw[22] |= 0x20
        raw[17:21] = crc32c(bytes(raw[21:])).to_bytes(4, "big")
    return bytes(raw)


def read(buffer: bytes, *, hardware: bool, isolation: int = 0, aborted=None) -> list[tuple[int, bytes]]:
    """What aiokafka's fetcher hands out of a fetched record set (``check_crcs`` on)."""
    if hardware:
        with crc.hardware_crcs():
            records = crc.checked_records(buffer)
        assert isinstance(records, crc._CheckedRecords)
    else:
        records = MemoryRecords(buffer)
    part = PartitionRecords(TP0, records, aborted, 0, None, None, True, isolation)
    out = []
    try:
        for r in part:
            out.append((r.offset, r.value))
    except CorruptRecordException:
        out.append((-1, b"corrupt"))
    return out


def test_the_same_records_as_aiokafkas_own_check():
    buffer = batch(0, 3) + batch(3, 250) + batch(253, 1)
    want = [(i, b"v%d" % i) for i in range(254)]
    assert read(buffer, hardware=False) == want
    assert read(buffer, hardware=True) == want


@pytest.mark.parametrize("where", [30, 61, -1])  # a record's bytes, the attributes, the last byte
def test_a_damaged_batch_is_refused_where_aiokafka_refuses_it(where):
    second = bytearray(batch(3, 5))
    second[where] ^= 0x01
    buffer = batch(0, 3) + bytes(second) + batch(8, 2)
    theirs = read(buffer, hardware=False)
    assert theirs == [(0, b"v0"), (1, b"v1"), (2, b"v2"), (-1, b"corrupt")]
    assert read(buffer, hardware=True) == theirs


def test_a_truncated_last_batch_and_aborted_transactions_as_aiokafka():
    """A fetch ends in a partial batch (the broker cuts at the size asked); read_committed skips
    an aborted transaction's batch up to its abort marker (a control batch: aiokafka reads its
    record through the batch's own iterator)."""
    committed, aborted, marker, after = (
        batch(0, 2),
        batch(2, 2, producer_id=7),
        batch(4, 1, producer_id=7, control=True),
        batch(5, 2),
    )
    buffer = committed + aborted + marker + after + batch(7, 3)[:40]
    for isolation, want in ((0, [0, 1, 2, 3, 5, 6]), (1, [0, 1, 5, 6])):  # read_uncommitted, read_committed
        theirs = read(buffer, hardware=False, isolation=isolation, aborted=[(7, 2)])
        assert [o for o, _ in theirs] == want
        assert read(buffer, hardware=True, isolation=isolation, aborted=[(7, 2)]) == theirs


def test_only_the_threads_that_ask_get_the_hardware_check():
    assert type(crc.checked_records(batch(0, 1))) is MemoryRecords
    seen: list[type] = []

    def other() -> None:
        seen.append(type(crc.checked_records(batch(0, 1))))

    with crc.hardware_crcs():
        assert isinstance(crc.checked_records(batch(0, 1)), crc._CheckedRecords)
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [MemoryRecords]  # (faust's consumer thread keeps aiokafka's own)
    assert type(crc.checked_records(batch(0, 1))) is MemoryRecords
