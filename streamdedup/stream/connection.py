"""How the worker reaches the cluster: the settings' brokers and credentials in faust's terms,
and the reads it makes with a client of its own.

Kept out of :mod:`streamdedup.settings` so that the settings (and every layer below the stream
shell) import nothing from faust.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, SupportsIndex

import faust
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka import errors as Errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.protocol.group import HeartbeatRequest
from faust.types.auth import SASLMechanism

from streamdedup.settings import Settings

__all__ = [
    "faust_broker_url",
    "faust_credentials",
    "end_offsets",
    "list_offsets",
    "committed_offsets",
    "read_ranges",
    "Member",
    "faust_member",
    "heartbeats",
    "member_heartbeats",
]

log = logging.getLogger(__name__)


def faust_broker_url(settings: Settings) -> str:
    """For ``faust.App(broker=...)``: ``kafka://h1:p1;h2:p2``."""
    return "kafka://" + ";".join(settings.brokers)


def faust_credentials(settings: Settings) -> Any:
    """For ``faust.App(broker_credentials=...)``: SASLCredentials, SSLCredentials or None.

    faust (``credentials_to_aiokafka_auth``) turns them back into aiokafka's security_protocol,
    sasl_* and ssl_context kwargs.  SASLCredentials means SASL_SSL only when it has an
    ssl_context, so SASL_SSL always passes one; SSLCredentials needs its context explicitly.
    Also pass ``env={}`` to faust.App: faust reads BROKER_URL etc. from os.environ and lets
    them override the App's arguments.
    """
    if settings.security_protocol == "PLAINTEXT":
        return None
    if settings.security_protocol == "SSL":
        return faust.SSLCredentials(settings.ssl_context())
    return faust.SASLCredentials(
        username=settings.sasl_username,
        password=settings.sasl_password,
        mechanism=SASLMechanism(settings.sasl_mechanism),
        ssl_context=settings.ssl_context(),
    )


async def end_offsets(settings: Settings, topic: str, partitions: list[int]) -> dict[int, int]:
    """The end offsets (high watermarks) of ``topic``'s ``partitions``, read by a consumer of our
    own.  faust serves its consumer's offsets requests from the consumer thread, and inside a
    rebalance callback that thread is busy running the rebalance: such a request waits until
    aiokafka's request timeout or a stop cancels it (docs/faust-notes.md §11)."""
    ends = await list_offsets(settings, [(topic, p) for p in partitions], latest=True)
    return {p: end for (_, p), end in ends.items()}


async def list_offsets(
    settings: Settings, tps: Iterable[tuple[str, int]], *, latest: bool
) -> dict[tuple[str, int], int]:
    """The end (``latest``) or first offsets of the partitions ``tps`` ((topic, partition) pairs),
    read by a consumer of our own, keyed as given.  Outside faust's consumer thread, so never
    queued behind its fetch either: a broker answers a connection's requests in order, and faust's
    fetch waits up to 1.5 s for records (docs/faust-notes.md §14, "Recovery's own waits")."""
    wanted = {TopicPartition(t, p): (t, p) for t, p in tps}
    if not wanted:
        return {}
    consumer = AIOKafkaConsumer(
        **settings.aiokafka_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        client_id=f"{settings.app_id}-{'end' if latest else 'first'}-offsets",
    )
    await consumer.start()
    try:
        read = consumer.end_offsets if latest else consumer.beginning_offsets
        got = await read(list(wanted))
        return {wanted[tp]: int(offset) for tp, offset in got.items()}
    finally:
        await consumer.stop()


async def committed_offsets(settings: Settings, topic: str, partitions: list[int]) -> dict[int, int]:
    """The worker group's committed offset of each of ``topic``'s ``partitions``, its beginning
    where it has none, read with clients of our own (see end_offsets)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    admin = AIOKafkaAdminClient(**settings.aiokafka_kwargs())
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(settings.app_id, partitions=tps)
    finally:
        await admin.close()
    out = {tp.partition: meta.offset for tp, meta in committed.items() if meta is not None and meta.offset >= 0}
    if missing := [(topic, p) for p in partitions if p not in out]:
        out.update({p: first for (_, p), first in (await list_offsets(settings, missing, latest=False)).items()})
    return out


#: The bulk changelog reader's fetch sizes: whole runs of records per request (the broker's
#: default record limit is 1 MiB, so a partition fetch holds many records).  Not larger: glibc
#: serves an allocation of 32 MiB or more from fresh pages (mmap) every time, and a response is
#: copied whole several times (asyncio's stream buffer, aiokafka's parsing), each copy into new
#: pages then costing a page fault per 4 KiB with the GIL held; a 16 MiB buffer is reused.  In a
#: thread, ``bytes()`` of 16 MiB took 1.5 ms, of 32 MiB 22 ms, of 64 MiB 36 ms.
BULK_FETCH_MAX_BYTES = 16 * 2**20
BULK_PARTITION_FETCH_BYTES = 8 * 2**20
#: Runs the bulk reader fetches ahead of the caller (each up to BULK_FETCH_MAX_BYTES).
BULK_READ_AHEAD = 1
#: Bytes the bulk reader's sockets ask for at a time.  asyncio's default (256 KiB) reads a 16 MiB
#: fetch response in hundreds of turns of the reader's event loop, each taking the GIL back from
#: the restore (with asyncio's own StreamReader each also paused and resumed the socket, past
#: aiokafka's 64 KiB buffer limit; the bulk reader's :class:`_FrameReader` never pauses it).
BULK_RECV_BYTES = 4 * 2**20


class _BulkReadLoop(asyncio.SelectorEventLoop):
    """The bulk reader thread's event loop: its sockets read up to BULK_RECV_BYTES at a time, into
    a :class:`_FrameReader`."""

    def _make_socket_transport(
        self, sock: Any, protocol: Any, waiter: Any = None, *, extra: Any = None, server: Any = None
    ) -> Any:
        transport = super()._make_socket_transport(sock, protocol, waiter, extra=extra, server=server)  # type: ignore[misc]
        transport.max_size = BULK_RECV_BYTES  # (asyncio's class attribute, per transport)
        reader = getattr(protocol, "_stream_reader", None)  # (aiokafka's connection: a StreamReaderProtocol)
        if type(reader) is asyncio.StreamReader:
            _FrameReader.take_over(reader)
        return transport


class _FrameReader(asyncio.StreamReader):
    """The stream of a bulk reader's connection: aiokafka's own StreamReader, its class swapped
    (aiokafka reads a connection only by ``readexactly``: a frame's size, then the frame).  What
    the socket gives is kept as those bytes objects, and a frame is joined from them once, where
    asyncio appends them to a bytearray and copies the frame out of it (two copies of every byte,
    with the GIL held, into a buffer grown to the response's size).  Nor is the socket paused
    after every read (asyncio pauses it past twice the 64 KiB limit aiokafka gives): the bulk
    consumer has one fetch in flight a connection, so what is held is bounded by a response."""

    _parts: deque[bytes]
    _held: int  # bytes in _parts, less the _skip taken from the first
    _skip: int

    @classmethod
    def take_over(cls, reader: asyncio.StreamReader) -> None:
        held = bytes(reader._buffer)  # type: ignore[attr-defined]
        reader._buffer.clear()  # type: ignore[attr-defined]
        reader.__class__ = cls
        assert isinstance(reader, cls)
        reader._parts, reader._held, reader._skip = deque([held] if held else []), len(held), 0

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        assert not self._eof, "feed_data after feed_eof"  # type: ignore[attr-defined]
        chunk = data if type(data) is bytes else bytes(data)
        if chunk:
            self._parts.append(chunk)
            self._held += len(chunk)
            self._wakeup_waiter()  # type: ignore[attr-defined]

    def at_eof(self) -> bool:
        return self._eof and not self._held  # type: ignore[attr-defined]

    async def readexactly(self, n: int) -> bytes:
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        if self._exception is not None:  # type: ignore[attr-defined]
            raise self._exception  # type: ignore[attr-defined]
        while self._held < n:
            if self._eof:  # type: ignore[attr-defined]
                raise asyncio.IncompleteReadError(self._take(self._held), n)
            await self._wait_for_data("readexactly")  # type: ignore[attr-defined]
        return self._take(n)

    def _take(self, n: int) -> bytes:
        parts, out, need = self._parts, [], n
        while need:
            part, skip = parts[0], self._skip
            if len(part) - skip <= need:
                out.append(memoryview(part)[skip:] if skip else part)
                parts.popleft()
                self._skip, need = 0, need - (len(part) - skip)
            else:
                out.append(memoryview(part)[skip : skip + need])
                self._skip, need = skip + need, 0
        self._held -= n
        return out[0] if len(out) == 1 and type(out[0]) is bytes else b"".join(out)


async def read_ranges(
    settings: Settings, topic: str, ranges: dict[int, tuple[int, int]], ahead: int = BULK_READ_AHEAD
) -> AsyncGenerator[tuple[int, list[ConsumerRecord]], None]:
    """The committed records of ``topic`` in each partition's ``[start, end)`` of ``ranges``, as
    fetched: ``(partition, records)`` runs in offset order, then ``(partition, [])`` once the
    partition is read to its end.  Read by a consumer of our own (no group; read_committed, so
    aborted transactions are skipped) with large fetches, not through faust's consumer thread
    (busy with the rebalance this runs in, faust-notes §11) and its per-record events.

    The consumer runs in a thread of its own, with its own event loop, up to ``ahead`` runs ahead
    of the caller: the next fetch is read from the socket and parsed while the caller restores
    the last one (on this loop, a restore would hold up the socket).  The runs come in the order
    they were fetched; what was read ahead when the caller stops is dropped.  ``ahead`` 0 reads
    on the caller's loop, one run at a time.

    A partition is done when the consumer's position reaches its end, not after a number of
    records: transaction markers take offsets too, so its last record can lie below ``end - 1``.
    It is also done at the last stable offset (an open transaction's records cannot be read
    committed yet; the caller's deadline would otherwise run out waiting for it).  The caller
    bounds the whole read (a timeout); closing the generator stops the consumer (and its thread)."""
    if not any(start < end for start, end in ranges.values()):
        return
    if ahead <= 0:
        async for fetched in _read_ranges(settings, topic, ranges):
            yield fetched
        return
    loop = asyncio.get_running_loop()
    runs: asyncio.Queue[tuple[int, list[ConsumerRecord]] | BaseException | None] = asyncio.Queue(ahead)
    finished = loop.create_future()
    control = _ReaderControl()

    async def read() -> None:  # in the thread: each run into the caller's queue, waiting while it is full
        if not control.started(asyncio.current_task()):
            return

        async def hand(item: tuple[int, list[ConsumerRecord]] | BaseException | None) -> None:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(runs.put(item), loop))

        try:
            async for item in _read_ranges(settings, topic, ranges):
                await hand(item)
        except Exception as e:  # the caller raises it (a cancellation is the caller's own stop)
            await hand(e)
            return
        await hand(None)

    def finish() -> None:
        if not finished.done():
            finished.set_result(None)

    def run() -> None:
        try:
            with asyncio.Runner(loop_factory=_BulkReadLoop) as runner:
                runner.run(read())
        except BaseException as e:  # (a cancelled read ends here too)
            if not isinstance(e, asyncio.CancelledError):
                log.warning("the bulk reader of %s failed: %r", topic, e)
        finally:
            with contextlib.suppress(RuntimeError):  # (the caller's loop is closed: nobody waits)
                loop.call_soon_threadsafe(finish)

    threading.Thread(target=run, name=f"bulk-replay-{topic}", daemon=True).start()
    try:
        while True:
            item = await runs.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        control.stop()
        await finished  # (its consumer stopped; the caller bounds this wait)


class _ReaderControl:
    """Stops :func:`read_ranges`'s thread: cancels its read, or keeps it from starting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task: asyncio.Task | None = None
        self._stopped = False

    def started(self, task: asyncio.Task | None) -> bool:
        """The read ``task`` began in the thread; False: it was stopped before, return at once."""
        with self._lock:
            self._task = task
            return not self._stopped

    def stop(self) -> None:
        with self._lock:
            self._stopped, task = True, self._task
        if task is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: the read is over
                task.get_loop().call_soon_threadsafe(task.cancel)


async def _read_ranges(
    settings: Settings, topic: str, ranges: dict[int, tuple[int, int]]
) -> AsyncGenerator[tuple[int, list[ConsumerRecord]], None]:
    """:func:`read_ranges` on the running loop."""
    consumer = AIOKafkaConsumer(
        **settings.aiokafka_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        fetch_max_bytes=BULK_FETCH_MAX_BYTES,
        max_partition_fetch_bytes=BULK_PARTITION_FETCH_BYTES,
        auto_offset_reset="earliest",  # (a start below the log's start: compacted or deleted away)
        client_id=f"{settings.app_id}-bulk-replay",
    )
    todo = {TopicPartition(topic, p): end for p, (start, end) in ranges.items() if start < end}
    if not todo:
        return
    await consumer.start()
    try:
        consumer.assign(list(todo))
        for tp in todo:
            consumer.seek(tp, ranges[tp.partition][0])
        while todo:
            fetched = await consumer.getmany(*todo, timeout_ms=500)
            for tp, records in fetched.items():
                end = todo.get(tp)
                if end is None:
                    continue
                records = [r for r in records if r.offset < end] if records[-1].offset >= end else records
                if records:
                    yield tp.partition, records
            for tp in list(todo):
                position = await consumer.position(tp)
                stable = consumer.last_stable_offset(tp)
                if position >= todo[tp]:
                    del todo[tp]
                    yield tp.partition, []  # read to its end
                elif tp not in fetched and stable is not None and position >= stable:
                    del todo[tp]  # an open transaction: what follows is faust's recovery's
            consumer.pause(*[tp for tp in consumer.assignment() if tp not in todo])
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class Member:
    """A consumer group member: what a heartbeat names."""

    group: str
    coordinator: int  # the group coordinator's broker node id
    generation: int
    member_id: str


def faust_member(app: Any) -> Member | None:
    """The group membership of faust's consumer (None if it has none yet).

    Read from faust's aiokafka consumer in its thread (private attributes of faust 0.15 and
    aiokafka 0.14), from the event loop's thread while that consumer waits for a rebalance
    callback to return: nothing changes them meanwhile."""
    try:
        coordinator = app.consumer._thread._consumer._coordinator
        group, node, generation, member_id = (
            coordinator.group_id,
            coordinator.coordinator_id,
            coordinator.generation,
            coordinator.member_id,
        )
    except AttributeError:
        return None
    if node is None or generation < 0 or not member_id:
        return None
    return Member(group, int(node), int(generation), str(member_id))


@asynccontextmanager
async def heartbeats(settings: Settings, member: Member, interval: float) -> AsyncIterator[asyncio.Event]:
    """Send the group heartbeats for ``member`` from a client of our own while the block runs.

    aiokafka sends none while a rebalance callback runs (it restarts its heartbeat task after the
    callback returns), so a callback longer than the session timeout gets the member dropped
    from the group (docs/faust-notes.md §14).  The event is set once the coordinator answers
    anything but "fine" (a rebalance began: the others wait for this member to rejoin; or the
    member is gone): the block should end soon."""
    client = AIOKafkaClient(**settings.aiokafka_kwargs(), client_id=f"{settings.app_id}-heartbeats")
    await client.bootstrap()
    rejoin = asyncio.Event()

    async def beat() -> None:
        while True:
            try:
                request = HeartbeatRequest(member.group, member.generation, member.member_id)
                response = await client.send(member.coordinator, request, group=ConnectionGroup.COORDINATION)
                if response.error_code:
                    log.info("heartbeat for %s: %s", member.member_id, Errors.for_code(response.error_code).__name__)
                    rejoin.set()
                    return
            except Exception as e:  # a lost connection: try again at the next beat
                log.warning("heartbeat for %s failed: %r", member.member_id, e)
            await asyncio.sleep(interval)

    task = asyncio.ensure_future(beat())
    try:
        yield rejoin
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()


@asynccontextmanager
async def member_heartbeats(settings: Settings, app: Any, interval: float) -> AsyncIterator[asyncio.Event | None]:
    """:func:`heartbeats` for faust's consumer's membership (None inside: it has none)."""
    member = faust_member(app)
    if member is None:
        yield None
        return
    async with heartbeats(settings, member, interval) as rejoin:
        yield rejoin
