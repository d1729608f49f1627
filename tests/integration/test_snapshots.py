"""Snapshots and the changelog against the real broker: state that does not match the cluster.

* A snapshot of a cluster that was recreated empty is discarded with a warning, the shard is
  rebuilt from the (empty) changelog, and the worker judges pages against the new cluster only.
* String files (the stored ids and URLs) that do not match their snapshot: the same.
* A shard changelog written with another fingerprint scheme stops the worker with a message
  that says what to do: two schemes never share an index.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_for_verdicts

from streamdedup.pipeline.wire import CHANGELOG, Batch, encode

pytestmark = pytest.mark.kafka

PAGE = "<html><body><p>" + " ".join(f"word{i} alpha{i % 7}" for i in range(300)) + "</p></body></html>"


def _topics_of(kafka, topics: StreamTopics) -> list[str]:
    async def run() -> list[str]:
        admin = AIOKafkaAdminClient(**kafka.client_kwargs())
        await admin.start()
        try:
            return sorted(t for t in await admin.list_topics() if t.startswith(topics.app_id))
        finally:
            await admin.close()

    return asyncio.run(run())


def _delete_topics(kafka, names: list[str], timeout: float = 60.0) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(**kafka.client_kwargs())
        await admin.start()
        try:
            await admin.delete_topics(names)
            deadline = time.monotonic() + timeout
            while set(names) & set(await admin.list_topics()):
                assert time.monotonic() < deadline, f"topics not deleted within {timeout}s"
                await asyncio.sleep(0.2)
        finally:
            await admin.close()

    asyncio.run(run())


def _recreate_pages_topic(kafka, topics: StreamTopics, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:  # the broker may still be finishing the deletion
        try:
            kafka.create_topic(topics.pages, topics.partitions)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_snapshot_of_a_recreated_cluster_is_discarded_and_the_worker_judges_pages(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=4)
    worker = WorkerProcess(kafka, topics, tmp_path)
    worker.start()
    try:
        produce(kafka, topics.pages, [page_record("http://a.test/first", PAGE, "2024-01-01T00:00:00Z")])
        first = wait_for_verdicts(kafka, topics, n=1)
        assert [v[0]["verdict"] for v in first["verdicts"].values()] == ["unique"]
    finally:
        assert worker.stop() == 0  # SIGTERM: a snapshot of each shard goes to the data dir
    snapshots = sorted((worker.dir / "data").rglob("*.shard"))
    assert snapshots, "the worker wrote no snapshot"

    # the cluster loses everything: every topic of the app, internal ones included, recreated empty
    _delete_topics(kafka, _topics_of(kafka, topics))
    _recreate_pages_topic(kafka, topics)

    since = worker.log_path.stat().st_size
    worker.start()  # the same data dir: its snapshots cover changelog offsets the new topics never had
    try:
        log = worker.log_path.read_bytes()[since:].decode("utf-8", "replace")
        assert "ConsistencyError" not in log and "crash" not in log.lower()
        assert "discarding the snapshot" in log and "recreated or truncated" in log, worker.log_tail()
        assert not any(p.exists() for p in snapshots)  # set aside (*.discarded), never used again
        # the same page again, under another URL: with the stale snapshot it would be a
        # near-duplicate of a page the new cluster never saw
        produce(kafka, topics.pages, [page_record("http://a.test/again", PAGE, "2024-01-02T00:00:00Z")])
        again = wait_for_verdicts(kafka, topics, n=1)
        assert {i: [v["verdict"] for v in vs] for i, vs in again["verdicts"].items()} == {
            "http://a.test/again": ["unique"]
        }
        # and the rebuilt shard stores new pages as usual
        produce(kafka, topics.pages, [page_record("http://a.test/third", PAGE, "2024-01-03T00:00:00Z")])
        third = wait_for_verdicts(kafka, topics, n=2)
        assert third["verdicts"]["http://a.test/third"][0]["verdict"] == "near_duplicate"
        assert third["verdicts"]["http://a.test/third"][0]["match_id"] == "http://a.test/again"
    finally:
        assert worker.stop() == 0


def test_damaged_string_files_are_refused_and_the_shard_is_rebuilt_from_the_changelog(kafka, tmp_path):
    """The ids and URLs of stored pages live in string files next to the snapshots: with them cut
    short, the snapshot is discarded with a message, the shard is rebuilt from the changelog, and
    a copy of a page stored before is still a near-duplicate that names the original."""
    topics = StreamTopics.fresh(kafka, partitions=2)
    worker = WorkerProcess(kafka, topics, tmp_path)
    worker.start()
    try:
        produce(kafka, topics.pages, [page_record("http://a.test/original", PAGE, "2024-01-01T00:00:00Z")])
        wait_for_verdicts(kafka, topics, n=1)
    finally:
        assert worker.stop() == 0
    files = sorted((worker.dir / "data").rglob("*.strings"))
    assert any(f.stat().st_size for f in files), "no string file holds the page's id and URL"
    for f in files:
        f.write_bytes(f.read_bytes()[:-3])
    since = worker.log_path.stat().st_size
    worker.start()
    try:
        log = worker.log_path.read_bytes()[since:].decode("utf-8", "replace")
        assert "discarding the snapshot" in log and "string file" in log, worker.log_tail()
        produce(kafka, topics.pages, [page_record("http://a.test/copy", PAGE, "2024-01-02T00:00:00Z")])
        out = wait_for_verdicts(kafka, topics, n=2)
        [copy] = out["verdicts"]["http://a.test/copy"]
        assert (copy["verdict"], copy["match_id"], copy["match_url"]) == (
            "near_duplicate",
            "http://a.test/original",
            "http://a.test/original",
        )
    finally:
        assert worker.stop() == 0


def _old_scheme_changelog_record() -> bytes:
    """A shard changelog batch as streamdedup wrote it before fingerprint schemes were recorded
    (layout b"SDB1" | kind u8 | n u32: scheme 1)."""
    new = encode(Batch.build(group=0, fps=5, fetched=1, id_hash=9, ids=["old"], urls=["http://old.test/"]), CHANGELOG)
    return b"SDB1" + new[4:5] + new[6:]


def test_a_changelog_of_another_scheme_stops_the_worker_with_what_to_do(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=2)
    worker = WorkerProcess(kafka, topics, tmp_path)
    worker.start()  # creates the internal topics
    assert worker.stop() == 0
    changelog = f"{topics.app_id}-shards-changelog"
    assert changelog in _topics_of(kafka, topics)

    async def write_old_records() -> None:
        p = AIOKafkaProducer(**kafka.client_kwargs())
        await p.start()
        try:
            for partition in range(topics.partitions):
                await p.send_and_wait(changelog, _old_scheme_changelog_record(), key=b"old", partition=partition)
        finally:
            await p.stop()

    asyncio.run(write_old_records())
    since = worker.log_path.stat().st_size
    with pytest.raises(AssertionError, match="exited with"):
        worker.start(timeout=90)  # refuses to become ready
    log = worker.log_path.read_bytes()[since:].decode("utf-8", "replace")
    assert f"the shard changelog {changelog}" in log and "holds fingerprints of scheme 1" in log, worker.log_tail()
    assert "this worker computes scheme 2" in log and "--app-id" in log
    assert worker.proc is not None and worker.proc.returncode != 0
