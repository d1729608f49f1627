"""How the worker reaches the cluster: the settings' brokers and credentials in faust's terms,
and the reads it makes with a client of its own.

Kept out of :mod:`streamdedup.settings` so that the settings (and every layer below the stream
shell) import nothing from faust.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from faust.types.auth import SASLMechanism

from streamdedup.settings import Settings

__all__ = ["faust_broker_url", "faust_credentials", "end_offsets", "read_ranges"]


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
    consumer = AIOKafkaConsumer(
        **settings.aiokafka_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        client_id=f"{settings.app_id}-end-offsets",
    )
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: int(end) for tp, end in ends.items()}
    finally:
        await consumer.stop()


#: The bulk changelog reader's fetch sizes: whole runs of records per request (the broker's
#: default record limit is 1 MiB, so a partition fetch holds many records).
BULK_FETCH_MAX_BYTES = 64 * 2**20
BULK_PARTITION_FETCH_BYTES = 32 * 2**20


async def read_ranges(
    settings: Settings, topic: str, ranges: dict[int, tuple[int, int]]
) -> AsyncGenerator[tuple[int, list[ConsumerRecord]], None]:
    """The committed records of ``topic`` in each partition's ``[start, end)`` of ``ranges``, as
    fetched: ``(partition, records)`` runs in offset order, then ``(partition, [])`` once the
    partition is read to its end.  Read by a consumer of our own (no group; read_committed, so
    aborted transactions are skipped) with large fetches, not through faust's consumer thread
    (busy with the rebalance this runs in, faust-notes §11) and its per-record events.

    A partition is done when the consumer's position reaches its end, not after a number of
    records: transaction markers take offsets too, so its last record can lie below ``end - 1``.
    It is also done at the last stable offset (an open transaction's records cannot be read
    committed yet; the caller's deadline would otherwise run out waiting for it).  The caller
    bounds the whole read (a timeout); closing the generator stops the consumer."""
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
