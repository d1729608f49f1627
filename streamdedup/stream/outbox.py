"""The last stage: send judged records and commit their input offsets in one Kafka transaction.

One transactional producer per input partition this worker owns, with the transactional id
``<app>-out-<partition>``: a worker that takes the partition over (or a restarted one)
fences the previous owner and aborts whatever it left open.  Each flush sends the outputs of
the done records at the head of the partition, in offset order, and commits the offset after
the last of them *in the same transaction*.  A consumer reading with
``isolation_level=read_committed`` sees every page's outputs exactly once, even across a
SIGKILL; the pages themselves are never acked to faust, whose commits would race these.

Every send of a transaction is awaited before it commits.  A send the broker refuses for the
record itself (too large for the topic's ``max.message.bytes``, invalid) aborts the
transaction; the records whose sends failed become *suspects*.  The next transaction commits
the records before the first suspect, then the suspect alone: refused again, it is convicted
(a record refused next to others may only have shared their produce batch).  A convicted
page becomes a dead letter with reason ``too_large_for_topic``; a convicted dead letter is
sent shrunk (:func:`~streamdedup.pipeline.routing.outputs`, ``shrink``), never dropped.

A flush commits only over judged records that follow the committed offset and each other with no
gap (:class:`~streamdedup.pipeline.offsets.PartitionOffsets`, one per owned partition): a record the
consumer dropped (docs/faust-notes.md §10) holds the partition's commits back until the worker has
read it again and judged it, or a read showed its offset holds no record.  Nothing is committed
for a partition before its committed offset has been read at assignment (:meth:`Outbox.start`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    CorruptRecordException,
    KafkaError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from streamdedup.pipeline.offsets import PartitionOffsets
from streamdedup.pipeline.pending import Pending, Waiting
from streamdedup.pipeline.routing import OUTPUT_OVERHEAD_BYTES, Topics, outputs
from streamdedup.settings import Settings
from streamdedup.stream.connection import committed_offsets

__all__ = ["Outbox", "output_batch_bytes"]

log = logging.getLogger(__name__)
SETTLE_SECONDS = 5.0  # how long a revocation waits for its commits to show in the group (Outbox.settle)
FLUSH_ATTEMPTS = 5  # a flush that fails this often in a row (not a Kafka error) dead-letters its head

#: Errors that are about the record sent, not the connection or the transaction: retrying the
#: same record cannot help.
RECORD_ERRORS = (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError, CorruptRecordException)
MAX_SHRINK = 2  # routing.outputs' last shrink level
#: The most bytes of records one producer batch gathers for an output partition.  aiokafka puts
#: at most one batch per partition in a produce request and has one request in flight per
#: broker, so with its default (16 KiB) every page of a few KiB or more went out in a request of
#: its own: ~1 request a page, the worker's and the broker's main cost on a backlog (bench/README.md,
#: "Produce batches").  A batch is one message to the broker, so it also stays under the output
#: topics' ``max.message.bytes`` (see :func:`output_batch_bytes`).
OUTPUT_BATCH_BYTES = 256 * 1024


def output_batch_bytes(settings: Settings) -> int:
    """The producers' ``max_batch_size``: :data:`OUTPUT_BATCH_BYTES`, or less if the output topics
    need only take a page of ``--max-page-bytes`` (the worker checks at start that they take
    that much, :func:`streamdedup.stream.run.check_message_bytes`).  A single record larger than
    this still goes, in a batch of its own."""
    return min(OUTPUT_BATCH_BYTES, settings.max_page_bytes + OUTPUT_OVERHEAD_BYTES)


class RecordsRefused(Exception):
    """Sends the broker refused for the records themselves (the transaction was aborted)."""

    def __init__(self, refused: dict[int, str]) -> None:
        super().__init__(f"{len(refused)} records refused")
        self.refused = refused  # offset -> why


class Outbox:
    def __init__(
        self,
        settings: Settings,
        topics: Topics,
        pending: Pending,
        on_sent: Callable[[list[Waiting]], None] | None = None,
        on_error: Callable[[], None] | None = None,
        on_fenced: Callable[[int], None] | None = None,
    ) -> None:
        self.settings, self.topics, self.pending, self.on_sent = settings, topics, pending, on_sent
        self.on_error = on_error
        # a partition's producer fenced while the partition is still ours (no revocation came):
        # its transaction timed out, or another worker took it over unseen (the worker stops)
        self.on_fenced = on_fenced
        self._producers: dict[int, AIOKafkaProducer] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._retry: dict[int, asyncio.TimerHandle] = {}
        self.committed: dict[int, int] = {}  # partition -> next offset, as committed by this worker
        # the same, kept across revocations: the group's committed offset can read behind it for a
        # moment after a rebalance (a transaction's offsets show once its markers are written)
        self.own_commits: dict[int, int] = {}
        self._flushed: dict[int, int] = {}  # partition -> next offset committed in this assignment
        self._dirty: set[int] = set()
        self.owned: set[int] = set()  # input partitions assigned to this worker now
        self.offsets: dict[int, PartitionOffsets] = {}  # owned partition -> offsets delivered, judged, empty
        self._tasks: dict[int, asyncio.Task] = {}
        self._suspects: dict[int, dict[int, str]] = {}  # partition -> offset -> why its send failed
        self._shrink: dict[tuple[int, int], int] = {}  # (partition, offset) -> dead letter shrink level
        self._failures: dict[int, int] = {}  # partition -> flushes failed in a row (not Kafka errors)
        self._preparing: set[asyncio.Task] = set()  # producers started ahead (prepare)
        self._began: dict[int, float] = {}  # partition -> when its last transaction began (monotonic)

    def _lock(self, partition: int) -> asyncio.Lock:
        return self._locks.setdefault(partition, asyncio.Lock())

    async def _producer(self, partition: int) -> AIOKafkaProducer:
        p = self._producers.get(partition)
        if p is None:
            p = AIOKafkaProducer(
                **self.settings.aiokafka_kwargs(),
                transactional_id=f"{self.settings.app_id}-out-{partition}",
                linger_ms=2,
                max_batch_size=output_batch_bytes(self.settings),
                max_request_size=max(1_048_576, 2 * self.settings.max_page_bytes),
                # Kafka >= 3.6 answers a send racing the transaction's start with a
                # retriable NOT_ENOUGH_REPLICAS; aiokafka's default 100 ms back-off
                # would land on the latency of every such batch
                retry_backoff_ms=10,
                client_id=f"{self.settings.app_id}-out-{partition}",
            )
            await p.start()  # init_transactions: fences an earlier owner of this partition
            self._producers[partition] = p
        return p

    def prepare(self, partition: int) -> None:
        """Start the partition's transactional producer now, in the background: its start
        (``init_transactions``, a round trip to the transaction coordinator that fences an earlier
        owner) no longer delays the first verdicts of an assignment.  A start that fails is left
        to the first flush, which tries again."""
        task = asyncio.get_running_loop().create_task(self._prepare(partition))
        self._preparing.add(task)
        task.add_done_callback(self._preparing.discard)

    async def _prepare(self, partition: int) -> None:
        try:
            async with self._lock(partition):  # (a flush or a revocation of the partition waits)
                if partition in self.owned and partition not in self._producers:
                    await self._producer(partition)
        except Exception as e:
            log.info("partition %d: its producer did not start ahead (%r); its first flush starts it", partition, e)

    def assign(self, partitions: set[int]) -> None:
        """The input partitions assigned now; each one not kept from before waits for its
        committed offset (:meth:`start`) before anything of it is committed."""
        self.owned = set(partitions)
        for p in [p for p in self.offsets if p not in partitions]:
            del self.offsets[p]
        for p in partitions:
            self.offsets.setdefault(p, PartitionOffsets())

    def tracker(self, partition: int) -> PartitionOffsets:
        """The partition's offsets (created on first use: a record delivered before its assignment
        was seen is noted too)."""
        return self.offsets.setdefault(partition, PartitionOffsets())

    def start(self, partition: int, committed: int) -> None:
        """The committed offset of an assigned partition, read at assignment (its beginning if
        none): commits start from there, and records below it are not taken again.  (The caller
        schedules a flush: records judged before it was known may be ready.)"""
        self.tracker(partition).start(committed)
        self.committed[partition] = committed

    def start_offset(self, partition: int, read: int | None) -> int | None:
        """Where a partition's commits start at an assignment, given the committed offset ``read``
        from the group (None: none): never before what this worker committed itself.

        A transaction's offset commit shows in the group only once its markers are written,
        after the commit returns; read in that moment (a rebalance right after a commit, a
        partition kept), the group still says the older offset, or none, and the records
        between would be judged a second time."""
        own = self.own_commits.get(partition)
        if own is not None and (read is None or read < own):
            log.warning(
                "pages partition %d: the group's committed offset (%s) is behind this worker's last commit "
                "(%d); starting from %d",
                partition,
                read,
                own,
                own,
            )
            return own
        return read

    def schedule(self, partition: int) -> None:
        """Flush ``partition`` in the background (the partitions' transactions run concurrently,
        and the caller goes on reading while they are in flight)."""
        self._dirty.add(partition)
        task = self._tasks.get(partition)
        if task is None or task.done():
            self._tasks[partition] = asyncio.get_running_loop().create_task(self._run(partition))

    async def _run(self, partition: int) -> None:
        while partition in self._dirty:
            await self._spaced(partition)
            self._dirty.discard(partition)
            try:
                await self.flush(partition)
                self._failures.pop(partition, None)
            except Exception as e:  # a bug: retry with backoff; a head that keeps failing is dead-lettered
                log.exception("partition %d: flush failed", partition)
                if self.on_error is not None:
                    self.on_error()
                n = self._failures[partition] = self._failures.get(partition, 0) + 1
                if n % FLUSH_ATTEMPTS == 0:
                    self._give_up(partition, e)
                self._schedule_retry(partition, min(0.2 * 2 ** (n - 1), 5.0))
                return

    async def _spaced(self, partition: int) -> None:
        """Wait until --transaction-interval has passed since the partition's last transaction
        began: verdicts ready in between then share one transaction.  Under a steady stream of
        small batches a transaction a batch and partition cost the worker and the broker more CPU
        than the pages (bench/README.md, "The pages straight from faust's drain loop; transactions
        spaced"); an idle partition's first verdicts go out at once."""
        wait = self._began.get(partition, -math.inf) + self.settings.transaction_interval - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def flush(self, partition: int) -> int:
        """Send and commit every done record at the head of ``partition``; returns how many."""
        sent = 0
        async with self._lock(partition):
            if partition not in self.owned:  # revoked while its last batch was being judged
                n = self.pending.drop(partition)
                log.info("partition %d is not ours (any more): %d records left to its owner", partition, n)
                return 0
            offsets = self.tracker(partition)
            while ready := self._contiguous(partition, offsets):
                ready = self._next_transaction(partition, ready)
                self._began[partition] = time.monotonic()
                try:
                    await self._commit(partition, ready)
                except RecordsRefused as e:
                    await self._close(partition)  # a fresh producer: new epoch, sequences start over
                    if self._refused(partition, ready, e.refused):
                        continue
                    self._schedule_retry(partition)
                    break
                except ProducerFenced:
                    log.warning("partition %d: fenced by a newer owner; dropping its waiting pages", partition)
                    self.pending.drop(partition)
                    await self._close(partition)
                    # still ours: nothing would read the dropped records again (they count as
                    # delivered) and nothing after them could be committed, until a rebalance
                    if partition in self.owned and self.on_fenced is not None:
                        self.on_fenced(partition)
                    break
                except KafkaError as e:
                    log.warning("partition %d: transaction failed (%r); retrying in 1s", partition, e)
                    await self._close(partition)  # a fresh producer aborts the open transaction
                    self._schedule_retry(partition)
                    break
                self.pending.release(partition, ready)
                suspects = self._suspects.get(partition)
                for w in ready:
                    self._shrink.pop((partition, w.offset), None)
                    if suspects:
                        suspects.pop(w.offset, None)
                self.committed[partition] = self.own_commits[partition] = ready[-1].offset + 1
                self._flushed[partition] = ready[-1].offset + 1
                offsets.commit(ready[-1].offset + 1)
                sent += len(ready)
                if self.on_sent is not None:
                    self.on_sent(ready)
        return sent

    def _contiguous(self, partition: int, offsets: PartitionOffsets) -> list[Waiting]:
        """The done records at the head of ``partition`` that follow the committed offset with no
        gap but offsets known to hold no record: a record not judged yet (one the consumer
        dropped, waiting to be read again) holds back everything after it."""
        ready = self.pending.ready(partition)
        if offsets.committed is not None and ready and ready[0].offset < offsets.committed:
            # taken before the committed offset was known (recovery hands out records fetched
            # before its seek): committed already, by this partition's earlier owner
            below = [w for w in ready if w.offset < offsets.committed]
            self.pending.release(partition, below)
            ready = ready[len(below) :]
        return ready[: offsets.committable([w.offset for w in ready])]

    def _next_transaction(self, partition: int, ready: list[Waiting]) -> list[Waiting]:
        """``ready`` up to the first suspect, or that suspect alone if it is the head."""
        suspects = self._suspects.get(partition)
        if not suspects:
            return ready
        for i, w in enumerate(ready):
            if w.offset in suspects:
                return ready[:i] or ready[:1]
        return ready

    def _refused(self, partition: int, ready: list[Waiting], refused: dict[int, str]) -> bool:
        """Suspect the refused records of a transaction, or convict the one sent alone.
        False: nothing more can be done for it here (the partition waits, loudly)."""
        if len(ready) > 1:
            self._suspects.setdefault(partition, {}).update(refused)
            log.info("partition %d: %d records refused by the broker; sending them alone", partition, len(refused))
            return True
        w, why = ready[0], refused[ready[0].offset]
        if w.reason is None:  # a page: its copy does not fit the output topic
            log.warning(
                "partition %d offset %d: the broker refused the outputs of page %r (%s); "
                "sending it to the dead-letter topic as too_large_for_topic",
                partition,
                w.offset,
                (w.page_id or "")[:200],
                why,
            )
            w.error = (
                f"the broker refused this page's outputs ({why}; the page is {len(w.value)} bytes); its verdict "
                f"was {w.verdict}: raise the output topics' max.message.bytes or lower --max-page-bytes"
            )
            w.reason, w.best = "too_large_for_topic", None
            return True
        level = self._shrink.get((partition, w.offset), 0) + 1
        if level > MAX_SHRINK:  # not even a bare dead letter fits: a configuration error
            log.error(
                "partition %d offset %d: the dead-letter topic %r refuses even a dead letter without its value "
                "(%s); raise its max.message.bytes. Retrying in 1s",
                partition,
                w.offset,
                self.topics.dead_letter,
                why,
            )
            if self.on_error is not None:
                self.on_error()
            return False
        log.warning(
            "partition %d offset %d: the dead-letter topic refused the %s dead letter (%s); sending it truncated",
            partition,
            w.offset,
            w.reason,
            why,
        )
        self._shrink[partition, w.offset] = level
        return True

    async def _commit(self, partition: int, ready: list[Waiting]) -> None:
        """One transaction: every output of ``ready`` and the offset after it.  Raises
        :class:`RecordsRefused` (after aborting) when sends failed for their records."""
        producer = await self._producer(partition)
        await producer.begin_transaction()
        try:
            sends: list[tuple[int, str, asyncio.Future]] = []
            refused: dict[int, str] = {}
            for w in ready:
                for o in outputs(w, self.topics, self._shrink.get((partition, w.offset), 0)):
                    try:
                        fut = await producer.send(o.topic, o.value, key=o.key, headers=o.headers)
                        sends.append((w.offset, o.topic, fut))
                    except RECORD_ERRORS as e:  # refused before it left (over max_request_size)
                        refused[w.offset] = f"{type(e).__name__} on {o.topic}"
            results = await asyncio.gather(*(f for _, _, f in sends), return_exceptions=True)
            other: BaseException | None = None
            for (offset, topic, _), result in zip(sends, results):
                if isinstance(result, RECORD_ERRORS):
                    refused.setdefault(offset, f"{type(result).__name__} on {topic}")
                elif isinstance(result, BaseException) and other is None:
                    other = result
            if refused:  # first: the sends after a refused one fail too (OutOfOrderSequenceNumber)
                raise RecordsRefused(refused)
            if other is not None:
                raise other
            await producer.send_offsets_to_transaction(
                {TopicPartition(self.settings.pages_topic, partition): ready[-1].offset + 1}, self.settings.app_id
            )
        except BaseException:
            # abort when it can; the caller closes this producer in any case, and the next
            # one's init_transactions aborts whatever is still open
            if not producer._txn_manager.is_fatal_error():
                try:
                    await asyncio.wait_for(producer.abort_transaction(), 10.0)
                except (KafkaError, TimeoutError) as e:
                    log.debug("partition %d: abort failed (%r)", partition, e)
            raise
        await producer.commit_transaction()

    def _schedule_retry(self, partition: int, delay: float = 1.0) -> None:
        if partition in self._retry:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._retry.pop(partition, None)
            self.schedule(partition)

        self._retry[partition] = loop.call_later(delay, fire)

    def _give_up(self, partition: int, error: Exception) -> None:
        """The head of ``partition`` failed to flush FLUSH_ATTEMPTS times: its records go to the
        dead-letter topic as internal_error, so the partition moves on."""
        why = f"flush failed {FLUSH_ATTEMPTS} times: {type(error).__name__}: {error}"[:1000]
        for w in self.pending.ready(partition):
            if w.reason is None:
                self.pending.fail(
                    partition, w.offset, "internal_error", why, key=w.key, value=w.value, headers=w.headers
                )

    async def _close(self, partition: int) -> None:
        p = self._producers.pop(partition, None)
        if p is not None:
            try:
                await p.stop()
            except KafkaError as e:  # the connection may be gone already
                log.debug("closing the producer of partition %d: %r", partition, e)

    async def revoke(self, partition: int) -> int | None:
        """The partition moved away: finish an in-flight flush, forget its records, close.
        Returns the next offset committed for it in this assignment (None: nothing committed)."""
        self._dirty.discard(partition)
        self.owned.discard(partition)
        async with self._lock(partition):
            handle = self._retry.pop(partition, None)
            if handle is not None:
                handle.cancel()
            self.pending.drop(partition)
            self.committed.pop(partition, None)
            self.offsets.pop(partition, None)
            self._suspects.pop(partition, None)
            for key in [k for k in self._shrink if k[0] == partition]:
                del self._shrink[key]
            await self._close(partition)
            return self._flushed.pop(partition, None)

    async def settle(self, commits: dict[int, int], timeout: float = SETTLE_SECONDS) -> bool:
        """Wait until the group's committed offsets show ``commits`` (partition -> next offset this
        worker committed), or ``timeout``; True if they do.

        Called as partitions are revoked: a transaction's offsets show in the group only once its
        markers are written, after the commit returns, and aiokafka's OffsetFetch cannot ask for
        stable offsets (KIP-447).  A new owner that read them before would start behind them and
        judge those records a second time (docs/faust-notes.md §12).  The read uses a client of its
        own, not faust's consumer thread (§11)."""
        if not commits:
            return True
        tps = {p: TopicPartition(self.settings.pages_topic, p) for p in commits}
        deadline = time.monotonic() + timeout
        admin = AIOKafkaAdminClient(**self.settings.aiokafka_kwargs())
        try:
            await asyncio.wait_for(admin.start(), timeout)
            while True:
                read = await asyncio.wait_for(
                    admin.list_consumer_group_offsets(self.settings.app_id, partitions=list(tps.values())),
                    max(0.1, deadline - time.monotonic()),
                )
                behind = {p: c for p, c in commits.items() if (m := read.get(tps[p])) is None or m.offset < c}
                if not behind:
                    return True
                if time.monotonic() >= deadline:
                    log.warning("the group's committed offsets still read behind this worker's commits: %s", behind)
                    return False
                await asyncio.sleep(0.05)
        except Exception as e:  # (a timeout, the cluster gone): the new owner's own guard is all there is
            log.warning("cannot check that the committed offsets show (%r)", e)
            return False
        finally:
            await admin.close()

    async def read_range(self, partition: int, first: int, last: int, timeout: float = 10.0) -> tuple[list, bool]:
        """The records of pages partition ``partition`` from offset ``first`` to ``last``, read by
        a consumer of its own (outside faust's, whose read offset can drop a re-fetched record,
        docs/faust-notes.md §10).  The flag is True when the read reached ``last``: an offset in
        the range it did not return holds no record (a transaction marker, or compacted)."""
        consumer = AIOKafkaConsumer(
            **self.settings.aiokafka_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_uncommitted",  # as faust's consumer reads the pages (no exactly_once there)
            max_partition_fetch_bytes=max(1_048_576, 2 * self.settings.max_page_bytes),
            client_id=f"{self.settings.app_id}-reread-{partition}",
        )
        tp = TopicPartition(self.settings.pages_topic, partition)
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, first)
            records: list = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                batches = await consumer.getmany(tp, timeout_ms=500)
                for r in batches.get(tp, []):
                    if r.offset > last:
                        return records, True
                    records.append(r)
                if (records and records[-1].offset >= last) or await consumer.position(tp) > last:
                    return records, True
            return records, False
        finally:
            await consumer.stop()

    async def read_committed(self, partitions: list[int]) -> dict[int, int]:
        """The committed offset of each pages partition (its beginning when it has none), read
        with clients of their own: the fallback when faust's consumer could not say at assignment."""
        return await committed_offsets(self.settings, self.settings.pages_topic, partitions)

    def describe(self) -> str:
        return ", ".join(f"{p}: {'busy' if lock.locked() else 'idle'}" for p, lock in sorted(self._locks.items()))

    async def close(self) -> None:
        for task in list(self._preparing):
            task.cancel()
        for partition in list(self._producers):
            await self.revoke(partition)


def latency_seconds(w: Waiting, now: float | None = None) -> float | None:
    """From the record's Kafka timestamp to now (None without a timestamp)."""
    if w.timestamp_ms is None or w.timestamp_ms <= 0:
        return None
    return max(0.0, (now if now is not None else time.time()) - w.timestamp_ms / 1000.0)
