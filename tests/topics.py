"""Read back a whole topic in a test, with a plain aiokafka consumer (not streamdedup's client).

``read_topic`` reads from the beginning up to the end offsets taken when it starts, so it sees
exactly what was written before, and needs no idle timeout to know it is done.
"""

from __future__ import annotations

import asyncio
import json
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

__all__ = ["read_topic", "outcomes_by_offset"]


def read_topic(kafka, topic: str, timeout: float = 20.0) -> list[ConsumerRecord]:
    """Every committed record of ``topic``, in partition then offset order."""
    return asyncio.run(_read(kafka.client_kwargs(), topic, timeout))


def outcomes_by_offset(kafka, topics) -> tuple[dict[tuple[int, int], list], int]:
    """(partition, offset) of every record of the pages topic -> its outcomes (each verdict, and
    ``"dead:<reason>"`` for each dead letter), and the number of inputs.  Records need unique keys
    (a dead letter is found by its key); ``topics``: a StreamTopics."""
    where = {r.key.decode(): (r.partition, r.offset) for r in read_topic(kafka, topics.pages)}
    found: dict[tuple[int, int], list] = {po: [] for po in where.values()}
    for r in read_topic(kafka, topics.verdicts):
        v = json.loads(r.value)
        found.setdefault((v["partition"], v["offset"]), []).append(v["verdict"])
    for r in read_topic(kafka, topics.dead_letter):
        found.setdefault(where.get(r.key.decode(), (-1, -1)), []).append(
            "dead:" + dict(r.headers)["streamdedup-reason"].decode()
        )
    return found, len(where)


async def _read(client_kwargs: dict, topic: str, timeout: float) -> list[ConsumerRecord]:
    consumer = AIOKafkaConsumer(
        topic,
        **client_kwargs,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()  # (no group: every partition is assigned by now, read from its start)
    try:
        tps = list(consumer.assignment())
        end = await consumer.end_offsets(tps)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"{topic}: not read to its end in {timeout} s"
            batches = await consumer.getmany(timeout_ms=200)
            for batch in batches.values():
                records += batch
            # (the position counts records fetched ahead too: done when also nothing more is handed out)
            if not batches and all([await consumer.position(tp) >= end[tp] for tp in tps]):
                break
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()
