"""The offsets of one pages partition: a record the consumer never delivered holds the commits back
(docs/faust-notes.md §10).  Each test fails on the old behaviour, where the outbox committed the
offset after its last judged record whatever lay before it."""

from __future__ import annotations

from streamdedup.pipeline.offsets import Delivery, PartitionOffsets


def started(committed: int) -> PartitionOffsets:
    t = PartitionOffsets()
    t.start(committed)
    return t


def test_the_first_record_after_an_assignment_beyond_the_committed_offset_is_a_hole():
    t = started(100)
    assert t.deliver(101) is Delivery.NEW
    assert t.hole() == (100, 101)
    assert t.missing(100, 101) == [100]
    assert t.committable([101]) == 0  # the old outbox committed 102 here: 100 was lost
    assert t.deliver(100) is Delivery.FILLER
    assert t.hole() is None
    assert t.committable([100, 101]) == 2


def test_nothing_is_committable_before_the_committed_offset_is_known():
    t = PartitionOffsets()
    assert t.deliver(5) is Delivery.NEW and t.deliver(6) is Delivery.NEW
    assert t.hole() is None and t.committable([5, 6]) == 0
    t.start(3)
    assert t.hole() == (3, 6) and t.missing(3, 6) == [3, 4]


def test_records_delivered_before_the_committed_offset_was_known_and_below_it_are_forgotten():
    t = PartitionOffsets()
    t.deliver(7)
    t.deliver(12)
    t.start(10)
    assert t.delivered == {12}
    assert t.deliver(7) is Delivery.DUPLICATE  # below the committed offset
    assert t.hole() == (10, 12)


def test_a_hole_in_the_middle_holds_back_the_records_after_it():
    t = started(10)
    for o in (10, 11, 13, 14):
        t.deliver(o)
    assert t.hole() == (12, 14)
    assert t.missing(*t.hole()) == [12]
    assert t.committable([10, 11, 13, 14]) == 2
    t.commit(12)
    assert t.hole() == (12, 14) and t.committable([13, 14]) == 0
    assert t.deliver(12) is Delivery.FILLER
    assert t.committable([12, 13, 14]) == 3


def test_a_hole_a_read_showed_empty_is_committed_past():
    t = started(10)
    for o in (10, 11, 13, 16):
        t.deliver(o)
    assert t.missing(12, 16) == [12, 14, 15]
    t.mark_empty([12])  # a transaction marker
    assert t.committable([10, 11, 13, 16]) == 3  # 14 and 15 are not known empty
    assert t.hole() == (14, 16)
    t.mark_empty([14, 15])
    assert t.hole() is None and t.committable([10, 11, 13, 16]) == 4


def test_a_record_found_where_a_read_saw_none_is_judged_not_skipped():
    t = started(0)
    t.deliver(1)
    t.mark_empty([0])
    assert t.deliver(0) is Delivery.FILLER
    assert t.committable([1]) == 0  # 0 is a record after all: it must be judged first
    assert t.committable([0, 1]) == 2


def test_records_delivered_twice_are_duplicates():
    t = started(10)
    assert [t.deliver(o) for o in (10, 11, 10, 11, 12)] == [
        Delivery.NEW,
        Delivery.NEW,
        Delivery.DUPLICATE,
        Delivery.DUPLICATE,
        Delivery.NEW,
    ]
    t.commit(12)
    assert t.deliver(11) is Delivery.DUPLICATE and t.deliver(12) is Delivery.DUPLICATE
    assert t.delivered == {12}  # below the committed offset: forgotten


def test_records_forgotten_unjudged_are_missing_again():
    t = started(0)
    for o in range(6):
        t.deliver(o)
    t.forget([2, 3])  # a batch dropped before it was judged
    assert t.hole() == (2, 5) and t.missing(2, 5) == [2, 3]
    assert t.committable([0, 1, 4, 5]) == 2
    assert t.deliver(2) is Delivery.FILLER and t.deliver(3) is Delivery.FILLER


def test_a_committed_offset_beyond_the_delivered_ones_moves_the_hole_check_on():
    t = started(0)
    t.deliver(0)
    t.deliver(5)
    t.commit(5)  # (another path committed up to 5: offsets below it are not missing)
    assert t.hole() is None and t.missing(0, 5) == []


def test_reading_goes_on_after_the_highest_offset_delivered_or_from_the_committed_one():
    o = PartitionOffsets()
    assert o.after_delivered is None  # the committed offset not read yet
    o.start(10)
    assert o.after_delivered == 10  # nothing delivered: from the committed offset
    o.deliver(12)
    assert o.after_delivered == 13  # past a hole (10, 11): the hole is read, not sought
    o.deliver(10)
    assert o.after_delivered == 13
