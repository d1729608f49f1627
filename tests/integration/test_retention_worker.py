"""--retention against the real broker, with real ``streamdedup worker`` processes.

Pages of January expire once the crawl reaches mid-March (30 days): a copy of one comes out
unique and a re-crawl of another is stored again, while a copy of a February page is still a
near-duplicate; the changelog records that held only January pages get tombstones; and after a
restart, from the snapshots or from the changelog alone, the same holds: nothing expired comes
back, nothing live is lost, also once the broker's compaction has removed the expired records.
"""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_for_verdicts

from streamdedup.pipeline.intake import fetched_ms
from streamdedup.pipeline.wire import CHANGELOG, decode

pytestmark = pytest.mark.kafka

JAN, FEB, MAR = "2024-01-01T00:00:00Z", "2024-02-15T00:00:00Z", "2024-03-15T00:00:00Z"
RETENTION_MS = 30 * 86_400_000


def content(topic: str) -> str:
    return (
        "<html><body><p>" + " ".join(f"{topic}{i} w{i % 11} {topic}x{i % 5}" for i in range(200)) + "</p></body></html>"
    )


def judged(kafka, topics: StreamTopics, n: int) -> dict[str, tuple[str, str | None]]:
    """Every page's verdict so far (the last one of each id): (verdict, match id)."""
    out = wait_for_verdicts(kafka, topics, n=n, timeout=120)
    assert sum(len(v) for v in out["verdicts"].values()) == n, out["verdicts"]
    return {k: (v[-1]["verdict"], v[-1]["match_id"]) for k, v in out["verdicts"].items()}


def changelog(kafka, topic: str, partitions: int, timeout: float = 60.0) -> list:
    """Every record of the shard changelog, to its end offsets."""

    async def run() -> list:
        c = AIOKafkaConsumer(**kafka.client_kwargs(), group_id=None, enable_auto_commit=False)
        await c.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            ends = await c.end_offsets(tps)
            out: list = []
            deadline = time.monotonic() + timeout
            while [tp for tp in tps if await c.position(tp) < ends[tp]]:
                assert time.monotonic() < deadline, "could not read the changelog to its end"
                for msgs in (await c.getmany(timeout_ms=200)).values():
                    out += msgs
            return out
        finally:
            await c.stop()

    return asyncio.run(run())


@pytest.mark.parametrize("algorithm", ["simhash", "minhash"])
def test_old_pages_expire_from_the_index_and_the_changelog_and_stay_expired_after_restarts(kafka, tmp_path, algorithm):
    topics = StreamTopics.fresh(kafka, partitions=2)
    env = {"STREAMDEDUP_RETENTION": "30d", "STREAMDEDUP_ALGORITHM": algorithm}
    worker = WorkerProcess(kafka, topics, tmp_path, env=env)
    url = "http://ret.test/"
    n = 0
    with worker:
        # January pages, then a February one, each in its own batch (so its own changelog records)
        produce(
            kafka,
            topics.pages,
            [page_record(url + "a", content("alpha"), JAN), page_record(url + "d", content("delta"), JAN)],
        )
        n += 2
        assert judged(kafka, topics, n) == {url + "a": ("unique", None), url + "d": ("unique", None)}
        produce(kafka, topics.pages, [page_record(url + "l", content("lima"), FEB)])
        n += 1
        assert judged(kafka, topics, n)[url + "l"] == ("unique", None)
        # mid-March: January is more than 30 days old, February is not
        produce(
            kafka,
            topics.pages,
            [
                page_record(url + "a-copy", content("alpha"), MAR),  # a copy of an expired page
                page_record(url + "l-copy", content("lima"), MAR),  # a copy of a live page
                page_record(url + "d", content("delta"), MAR),  # a re-crawl of an expired page
            ]
            + [page_record(url + f"filler{i}", content(f"f{i}q"), MAR) for i in range(6)],  # (every shard's clock)
        )
        n += 9
        got = judged(kafka, topics, n)
        assert got[url + "a-copy"] == ("unique", None)
        assert got[url + "l-copy"] == ("near_duplicate", url + "l")
        assert got[url + "d"] == ("unique", None)
    assert worker.proc is not None and worker.proc.returncode == 0

    # the records that held only January pages are deleted by tombstones, and no other one is
    records = changelog(kafka, f"{topics.app_id}-shards-changelog", topics.partitions)
    tombstones = {(m.partition, m.key) for m in records if m.value is None}
    assert tombstones
    cutoff = fetched_ms(MAR, None) - RETENTION_MS
    for m in records:
        if m.value is not None and (m.partition, m.key) in tombstones:
            assert (decode([m.value], CHANGELOG).fetched < cutoff).all()
    held = [
        decode([m.value], CHANGELOG) for m in records if m.value is not None and (m.partition, m.key) not in tombstones
    ]
    assert any((b.fetched >= cutoff).any() for b in held)

    def check(round: int) -> None:
        """Copies (the same text) of the expired January page, of its March copy and of the February page."""
        nonlocal n
        produce(
            kafka,
            topics.pages,
            [
                page_record(url + f"a-again{round}", content("alpha"), MAR),
                page_record(url + f"l-again{round}", content("lima"), MAR),
                page_record(url + f"d-again{round}", content("delta"), MAR),
            ],
        )
        n += 3
        got = judged(kafka, topics, n)
        # distance 0 to both the January page and its March copy: the March copy is the match, so
        # the January page (stored first, which would win the tie) did not come back
        assert got[url + f"a-again{round}"] == ("near_duplicate", url + "a-copy")
        assert got[url + f"l-again{round}"] == ("near_duplicate", url + "l")
        assert got[url + f"d-again{round}"] == ("near_duplicate", url + "d")

    # Kafka's compaction, made eager: the records that got tombstones leave the changelog once
    # their segment is closed (the next worker's writes roll it) and cleaned
    name = f"{topics.app_id}-shards-changelog"
    compact_eagerly(kafka, name)
    time.sleep(1.5)  # (segment.ms: the next write after this rolls the segment)
    with WorkerProcess(kafka, topics, tmp_path, env=env):  # from the snapshots
        check(1)
    deadline = time.monotonic() + 120
    while any(m.value is not None and (m.partition, m.key) in tombstones for m in changelog(kafka, name, 2)):
        assert time.monotonic() < deadline, "the broker did not compact the expired records away within 120 s"
        time.sleep(1)
    shutil.rmtree(worker.dir / "data")  # no snapshot: the shards come from the compacted changelog alone
    with WorkerProcess(kafka, topics, tmp_path, env=env):
        check(2)


def compact_eagerly(kafka, topic: str) -> None:
    """Topic settings under which the broker's log cleaner compacts within seconds."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    # (AlterConfigs replaces the topic's whole configuration: cleanup.policy is given again)
    settings = {
        "cleanup.policy": "compact",
        "segment.ms": "1000",
        "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0",
    }

    async def run() -> None:
        admin = AIOKafkaAdminClient(**kafka.client_kwargs())
        await admin.start()
        try:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, settings)])
        finally:
            await admin.close()

    asyncio.run(run())
