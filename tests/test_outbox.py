"""The outbox's transactions with a producer that refuses records as a broker does (no Kafka here):
a refused record is isolated and becomes a dead letter, shrunk if need be; its neighbours go out."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import MessageSizeTooLargeError, OutOfOrderSequenceNumber, ProducerFenced

from streamdedup.pipeline.pending import Pending
from streamdedup.pipeline.routing import TRUNCATED_BYTES, Topics
from streamdedup.settings import Settings
from streamdedup.stream.outbox import Outbox


class Txn:
    def is_fatal_error(self) -> bool:
        return False


class RefusingProducer:
    """Refuses a record over its topic's limit, and (as a broker does after a gap in the
    sequence) every later send of the same transaction to that topic."""

    def __init__(self, log: list, limits: dict[str, int]) -> None:
        self.log, self.limits, self._txn_manager = log, limits, Txn()
        self.open: list | None = None
        self.gap: set[str] = set()

    async def begin_transaction(self) -> None:
        self.open, self.gap = [], set()

    async def send(self, topic, value, key=None, headers=None):
        fut = asyncio.get_running_loop().create_future()
        size = len(value) + len(key or b"") + sum(len(k) + len(v) for k, v in headers or [])
        if size > self.limits.get(topic, 1 << 40):
            fut.set_exception(MessageSizeTooLargeError())
            self.gap.add(topic)
        elif topic in self.gap:
            fut.set_exception(OutOfOrderSequenceNumber())
        else:
            fut.set_result(None)
            self.open.append((topic, key, value, dict(headers or [])))
        return fut

    async def send_offsets_to_transaction(self, offsets, group) -> None:
        self.offsets = {tp.partition: o for tp, o in offsets.items()}

    async def commit_transaction(self) -> None:
        self.log.append((self.open, self.offsets))
        self.open = None

    async def abort_transaction(self) -> None:
        self.open = None

    async def stop(self) -> None:
        pass


def run(values: list[tuple[bytes, str | None]], limits: dict[str, int]):
    """Flush partition 0 holding ``values`` (page or dead letter with that reason); returns the
    committed transactions, the outbox and the records as they were released."""
    pending, log, released = Pending(n_groups=1), [], []
    for offset, (value, reason) in enumerate(values):
        if reason is None:
            req = pending.add_page(
                0,
                offset,
                page_id=f"p{offset}",
                url=f"http://a/{offset}",
                fingerprint=1,
                key=f"p{offset}".encode(),
                value=value,
            )
            pending.answer_one(req, 0, -1)
        else:
            pending.add_bad(0, offset, reason, "bad", key=f"p{offset}".encode(), value=value)
    outbox = Outbox(Settings(pages_topic="in"), Topics("u", "n", "v", "d"), pending, on_sent=released.extend)
    outbox.assign({0})
    outbox.start(0, 0)  # the committed offset, as read at assignment
    producers = []

    async def producer(partition):
        if partition not in outbox._producers:
            outbox._producers[partition] = RefusingProducer(log, limits)
            producers.append(outbox._producers[partition])
        return outbox._producers[partition]

    outbox._producer = producer
    sent = asyncio.run(outbox.flush(0))
    return log, sent, released, producers


def outputs_of(log) -> list[tuple[str, bytes]]:
    return [(topic, key) for records, _ in log for topic, key, _, _ in records]


def test_a_page_too_large_for_its_topic_is_a_dead_letter_and_its_neighbours_go_out():
    values = [(b"a" * 10, None), (b"b" * 500, None), (b"c" * 10, None), (b"d" * 10, None)]
    log, sent, released, producers = run(values, {"u": 100, "d": 1000})
    assert sent == 4
    assert outputs_of(log) == [
        ("u", b"p0"), ("v", b"p0"),
        ("d", b"p1"),
        ("u", b"p2"), ("v", b"p2"), ("u", b"p3"), ("v", b"p3"),
    ]  # fmt: skip
    assert log[-1][1] == {0: 4}  # the offset after the last one, committed with its outputs
    dead = next(h for records, _ in log for t, _, _, h in records if t == "d")
    assert dead["streamdedup-reason"] == b"too_large_for_topic" and b"unique" in dead["streamdedup-error"]
    assert [w.reason for w in released] == [None, "too_large_for_topic", None, None]
    assert len(producers) > 1  # a refused transaction's producer is replaced (fresh epoch and sequences)


def test_a_dead_letter_too_large_for_the_dead_letter_topic_is_sent_truncated():
    big = b"x" * (TRUNCATED_BYTES * 3)
    log, sent, released, _ = run([(big, "too_large"), (b"ok", None)], {"d": TRUNCATED_BYTES * 2})
    assert sent == 2
    [(topic, _, value, headers)] = [r for records, _ in log for r in records if r[0] == "d"]
    assert value == big[:TRUNCATED_BYTES]
    assert headers["streamdedup-truncated"] == str(len(big)).encode()
    assert headers["streamdedup-reason"] == b"too_large"


def test_a_dead_letter_refused_even_truncated_goes_without_its_value():
    big = b"x" * (TRUNCATED_BYTES * 3)
    log, sent, _, _ = run([(big, None)], {"u": 1000, "d": 2000})
    assert sent == 1
    [(topic, key, value, headers)] = [r for records, _ in log for r in records]
    assert (topic, value, headers["streamdedup-reason"]) == ("d", b"", b"too_large_for_topic")


def test_a_topic_that_refuses_everything_keeps_the_records_waiting():
    log, sent, released, _ = run([(b"a", None), (b"b", None)], {"u": 0, "d": 0})
    assert (sent, log, released) == (0, [], [])


def holed(offsets: list[int], committed: int | None):
    """An outbox owning partition 0 whose judged records are ``offsets`` (done pages), with its
    committed offset read at assignment (None: not yet)."""
    pending, log, released = Pending(n_groups=1), [], []
    for offset in offsets:
        req = pending.add_page(
            0, offset, page_id=f"p{offset}", url=f"http://a/{offset}", fingerprint=1, key=b"k", value=b"v"
        )
        pending.answer_one(req, 0, -1)
    outbox = Outbox(Settings(pages_topic="in"), Topics("u", "n", "v", "d"), pending, on_sent=released.extend)
    outbox.assign({0})
    for offset in offsets:
        outbox.tracker(0).deliver(offset)
    if committed is not None:
        outbox.start(0, committed)
    producer = RefusingProducer(log, {})

    async def get(partition):
        return producer

    outbox._producer = get
    return outbox, log, released


def test_the_outbox_commits_nothing_before_the_committed_offset_is_known():
    outbox, log, _ = holed([5, 6], None)
    assert asyncio.run(outbox.flush(0)) == 0 and log == []
    outbox.start(0, 5)
    assert asyncio.run(outbox.flush(0)) == 2 and log[-1][1] == {0: 7}


def test_the_outbox_never_commits_past_an_offset_it_has_not_judged():
    outbox, log, released = holed([11, 12], 10)  # the first record after the assignment is 11
    assert asyncio.run(outbox.flush(0)) == 0 and log == []  # (the old outbox committed 13)
    outbox, log, released = holed([10, 11, 13, 14], 10)  # a hole in the middle
    assert asyncio.run(outbox.flush(0)) == 2 and log[-1][1] == {0: 12}
    assert [w.offset for w in released] == [10, 11]
    assert outbox.committed[0] == 12
    # 12 read again and judged: the rest goes out
    req = outbox.pending.add_page(0, 12, page_id="p12", url="u", fingerprint=1, key=b"k", value=b"v")
    outbox.pending.answer_one(req, 0, -1)
    outbox.tracker(0).deliver(12)
    assert asyncio.run(outbox.flush(0)) == 3 and log[-1][1] == {0: 15}


def test_the_outbox_commits_past_an_offset_shown_to_hold_no_record():
    outbox, log, released = holed([10, 12], 10)
    assert asyncio.run(outbox.flush(0)) == 1
    outbox.tracker(0).mark_empty([11])  # a transaction marker
    assert asyncio.run(outbox.flush(0)) == 1 and log[-1][1] == {0: 13}


def test_records_judged_below_the_committed_offset_are_released_not_sent():
    outbox, log, released = holed([8, 9, 10], None)  # taken before the committed offset was known
    outbox.start(0, 10)
    assert asyncio.run(outbox.flush(0)) == 1
    assert [w.offset for w in released] == [10] and log[-1][1] == {0: 11}
    assert outbox.pending.ready(0) == []


def test_a_kept_partition_starts_after_its_own_last_commit_when_the_group_reads_behind():
    """A rebalance right after a commit: the partition is revoked and assigned back, and the
    group's committed offset still reads the older value (the transaction's offsets show once its
    markers are written).  The next assignment starts at this worker's own last commit, so the
    records it committed are not judged a second time."""
    outbox, log, _ = holed([10, 11, 12], 10)
    assert asyncio.run(outbox.flush(0)) == 3 and log[-1][1] == {0: 13}
    asyncio.run(outbox.revoke(0))
    outbox.assign({0})
    assert outbox.start_offset(0, 10) == 13  # read behind: its own commit wins
    assert outbox.start_offset(0, None) == 13  # read as none yet
    assert outbox.start_offset(0, 20) == 20  # another owner committed further since
    assert outbox.start_offset(1, 4) == 4 and outbox.start_offset(1, None) is None  # never committed here


@pytest.mark.parametrize("revoked", [False, True])
def test_a_producer_fenced_while_its_partition_is_still_owned_stops_the_worker(revoked):
    """aiokafka raises ProducerFenced also when the broker timed the transaction out.  No
    revocation follows: the dropped records counted as delivered, so nothing read them again and
    nothing after them could be committed until a rebalance.  The worker is told to stop (a
    restart reads the partition again); not when the partition was being revoked anyway."""
    pending, log, fenced = Pending(n_groups=1), [], []
    outbox = Outbox(Settings(pages_topic="in"), Topics("u", "n", "v", "d"), pending, on_fenced=fenced.append)
    outbox.assign({0})
    outbox.start(0, 0)
    for offset in range(3):
        req = pending.add_page(0, offset, page_id=f"p{offset}", url="http://a/", fingerprint=1, key=b"k", value=b"v")
        pending.answer_one(req, 0, -1)

    class Fenced(RefusingProducer):
        async def commit_transaction(self) -> None:
            if revoked:  # a revocation began meanwhile (it waits for this flush)
                outbox.owned.discard(0)
            raise ProducerFenced()

    async def producer(partition):
        return outbox._producers.setdefault(partition, Fenced(log, {}))

    outbox._producer = producer
    assert asyncio.run(outbox.flush(0)) == 0
    assert not log and not pending.ready(0)
    assert fenced == ([] if revoked else [0])


def _ready(pending: Pending, partition: int, offset: int) -> None:
    req = pending.add_page(
        partition,
        offset,
        page_id=f"p{offset}",
        url=f"http://a/{offset}",
        fingerprint=1,
        key=f"p{offset}".encode(),
        value=b"v",
    )
    pending.answer_one(req, 0, -1)


def _assigned(**settings) -> tuple[Pending, Outbox]:
    """An outbox owning partition 0, its committed offset 0."""
    pending = Pending(n_groups=1)
    outbox = Outbox(Settings(pages_topic="in", **settings), Topics("u", "n", "v", "d"), pending)
    outbox.assign({0})
    outbox.start(0, 0)
    return pending, outbox


def _gated(outbox: Outbox, make) -> tuple[asyncio.Event, list[int]]:
    """The outbox's producers made by ``make()``, each start held until ``gate`` is set (as
    init_transactions waits for the coordinator); ``started``: the partitions whose start began."""
    gate, started = asyncio.Event(), []

    async def producer(partition):
        if partition not in outbox._producers:
            started.append(partition)
            await gate.wait()
            outbox._producers[partition] = make()
        return outbox._producers[partition]

    outbox._producer = producer
    return gate, started


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("interval", [0.0, 0.3])
def test_verdicts_ready_soon_after_a_transaction_wait_for_the_interval_and_go_together(interval):
    """--transaction-interval: a partition's transactions start at least that far apart, so
    verdicts ready in between go out together (fewer transactions, less CPU for the worker and
    the broker); with 0 each flush commits at once."""
    pending, outbox = _assigned(transaction_interval=interval)
    log, times = [], []
    producer = RefusingProducer(log, {})
    real_commit = producer.commit_transaction

    async def commit() -> None:
        times.append(asyncio.get_running_loop().time())
        await real_commit()

    producer.commit_transaction = commit
    gate, _ = _gated(outbox, lambda: producer)
    gate.set()

    async def scenario() -> None:
        _ready(pending, 0, 0)
        outbox.schedule(0)
        await asyncio.wait_for(_until(lambda: len(log) == 1), 5)
        for offset in (1, 2, 3):  # ready one after the other, right after the first transaction
            _ready(pending, 0, offset)
            outbox.schedule(0)
            await asyncio.sleep(0.02)
        await asyncio.wait_for(_until(lambda: outbox.committed.get(0) == 4), 5)

    asyncio.run(scenario())
    if interval:
        assert len(log) == 2 and times[1] - times[0] >= interval * 0.9
        assert {key for _, key, _, _ in log[1][0]} == {b"p1", b"p2", b"p3"}
    else:
        assert len(log) == 4


def test_a_partition_s_producer_is_started_ahead_once_and_its_first_flush_uses_it():
    """Outbox.prepare (called when an assignment's committed offset is known): the producer's
    start no longer waits for the first verdicts; a flush meanwhile waits for it and does not
    start a second producer (two producers of one transactional id fence each other)."""
    pending, outbox = _assigned()
    log: list = []
    gate, started = _gated(outbox, lambda: RefusingProducer(log, {}))

    async def scenario() -> None:
        outbox.prepare(0)
        outbox.prepare(1)  # not this worker's: no producer
        await asyncio.sleep(0.05)
        assert started == [0] and not outbox._producers
        _ready(pending, 0, 0)
        flush = asyncio.ensure_future(outbox.flush(0))
        await asyncio.sleep(0.05)
        assert not flush.done()  # waits for the start under way
        gate.set()
        assert await asyncio.wait_for(flush, 5) == 1
        await asyncio.wait_for(_until(lambda: not outbox._preparing), 5)

    asyncio.run(scenario())
    assert started == [0] and len(log) == 1


def test_a_partition_revoked_while_its_producer_starts_ahead_keeps_no_producer():
    _, outbox = _assigned()
    stopped: list[int] = []

    class Stoppable(RefusingProducer):
        async def stop(self) -> None:
            stopped.append(0)

    gate, started = _gated(outbox, lambda: Stoppable([], {}))

    async def scenario() -> None:
        outbox.prepare(0)
        await asyncio.sleep(0.02)
        revoke = asyncio.ensure_future(outbox.revoke(0))
        await asyncio.sleep(0.02)
        gate.set()
        await asyncio.wait_for(revoke, 5)
        outbox.prepare(0)  # after the revocation: nothing starts
        await asyncio.wait_for(_until(lambda: not outbox._preparing), 5)

    asyncio.run(scenario())
    assert started == [0] and not outbox._producers and stopped == [0]
