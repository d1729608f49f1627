"""The bulk changelog replay against the real broker (docs/faust-notes.md §14).

A worker that takes over shard partitions with a long changelog tail reads it with a consumer of
its own before faust's recovery starts (``ShardStore._bulk_replay``), and faust replays what is
left.  Each test writes a changelog (pages judged by a worker, plus synthetic rows written in
committed transactions, whose markers take offsets of their own), starts a worker with the bulk
path forced (``--bulk-replay-min-records 0``) and checks:

* that the bulk path ran (its log line) and from where;
* that the shards hold exactly the changelog's rows (the worker's ``/metrics`` gauge against the
  rows of every committed changelog record, counted here from their headers);
* that copies of the stored pages are near-duplicates naming their originals, and new pages unique;
* with a snapshot and a tail: the bulk read starts after the snapshot;
* with a bulk read that fails part-way (an injected error, a deadline that runs out): faust's
  recovery finishes, with the same rows and verdicts.
"""

from __future__ import annotations

import asyncio
import random
import re
import struct
import time
import urllib.request

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, read_to_end, wait_for_verdicts

from streamdedup.pipeline.wire import CHANGELOG, Batch, encode, row_counts
from streamdedup.stream.app import FAULT_ENV

pytestmark = pytest.mark.kafka

PARTITIONS = 2
NO_BULK = {"STREAMDEDUP_BULK_REPLAY_MIN_RECORDS": str(10**9)}  # every record through faust's recovery
BULK = {"STREAMDEDUP_BULK_REPLAY_MIN_RECORDS": "0"}


def _pages(prefix: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = " ".join(f"w{rng.randrange(50000)}" for _ in range(150))
        out.append(page_record(f"http://bulk.test/{prefix}-{i}", f"<p>{words}</p>", id=f"{prefix}-{i}"))
    return out


def _copies(originals: list[dict]) -> list[dict]:
    return [{**p, "url": p["url"] + "/copy", "id": p["id"] + "-copy"} for p in originals]


def _changelog(topics: StreamTopics) -> str:
    return f"{topics.app_id}-shards-changelog"


def _changelog_rows(kafka, topics: StreamTopics) -> int:
    """Rows in the committed changelog records (what the shards must hold after recovery)."""
    records = read_to_end(kafka, [_changelog(topics)])[_changelog(topics)]
    return int(row_counts([m.value for m in records if m.value]).sum())


def _write_synthetic(kafka, topics: StreamTopics, records: int, rows: int, per_transaction: int | None = None) -> None:
    """``records`` changelog records of ``rows`` random rows per partition: as the worker writes
    them (no transaction), or in committed transactions of ``per_transaction`` records, whose
    markers take offsets of their own (the bulk reader must stop at the end offset, not after a
    number of records).  faust's recovery never finishes a changelog that ends in a marker (it
    waits for a record at the last offset), so only the bulk path that reads to the end is given one."""
    rng = np.random.default_rng(7)

    def value(p: int, r: int) -> bytes:
        fps, id_hash = rng.integers(0, 2**64, size=(2, rows), dtype=np.uint64)
        batch = Batch.build(
            group=rng.integers(0, 4, size=rows),  # the default design's 4 table groups
            fps=fps,
            fetched=np.full(rows, 1_700_000_000_000, dtype=np.int64),
            id_hash=id_hash,
            ids=[f"synthetic-{p}-{r}-{i}" for i in range(rows)],
            urls=[f"http://synthetic.test/{p}/{r}/{i}" for i in range(rows)],
        )
        return encode(batch, CHANGELOG)

    def key(p: int, r: int) -> bytes:
        return struct.pack("<I", p) + b"synthetc" + struct.pack("<Q", r)

    async def run() -> None:
        txn = {} if per_transaction is None else {"transactional_id": f"{topics.app_id}-synthetic"}
        producer = AIOKafkaProducer(**kafka.client_kwargs(), **txn)
        await producer.start()
        try:
            for p in range(PARTITIONS):
                if per_transaction is None:
                    for r in range(records):
                        await producer.send_and_wait(_changelog(topics), value(p, r), key=key(p, r), partition=p)
                    continue
                for first in range(0, records, per_transaction):
                    async with producer.transaction():
                        for r in range(first, min(records, first + per_transaction)):
                            await producer.send(_changelog(topics), value(p, r), key=key(p, r), partition=p)
        finally:
            await producer.stop()

    asyncio.run(run())


def _stored_rows(worker: WorkerProcess, expected: int, timeout: float = 60.0) -> int:
    """The worker's /metrics sum of stored fingerprints, once it equals ``expected`` or at the
    deadline (the gauge is refreshed every few seconds)."""
    deadline, total = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
        found = re.findall(r"^streamdedup_shard_fingerprints\{.*\} (\S+)$", text, re.M)
        total = sum(int(float(v)) for v in found)
        if total == expected:
            break
        time.sleep(0.5)
    return total


def _judge(kafka, topics: StreamTopics, worker: WorkerProcess, pages: list[dict], judged_before: int) -> dict:
    produce(kafka, topics.pages, pages)
    return wait_for_verdicts(kafka, topics, n=judged_before + len(pages), timeout=120)["verdicts"]


def _check_verdicts(verdicts: dict, originals: list[dict], new: list[dict]) -> None:
    for p in originals:
        [v] = verdicts[p["id"] + "-copy"]
        assert (v["verdict"], v["match_id"]) == ("near_duplicate", p["id"]), v
    for p in new:
        [v] = verdicts[p["id"]]
        assert v["verdict"] == "unique", v


def _bulk_line(log: str, changelog: str) -> re.Match:
    m = re.search(
        rf"bulk replay of {re.escape(changelog)} from offsets (\{{.*?\}}): (\d+) records, (\d+) rows in .*?"
        r"partitions read to their end (\[.*?\]), offsets now (\{.*?\})",
        log,
    )
    assert m is not None, f"no bulk replay line in the log:\n{log[-4000:]}"
    return m


@pytest.mark.parametrize("failure", ["none", "injected error", "deadline"])
def test_a_changelog_replayed_in_bulk_holds_exactly_its_rows_and_judges_as_before(kafka, tmp_path, failure):
    topics = StreamTopics.fresh(kafka, partitions=PARTITIONS)
    originals = _pages("original", 40, seed=1)
    with WorkerProcess(kafka, topics, tmp_path, "writer", env=NO_BULK) as writer:
        verdicts = _judge(kafka, topics, writer, originals, 0)
        assert {v[0]["verdict"] for v in verdicts.values()} == {"unique"}
    # transactions only where the bulk path reads to the end (see _write_synthetic)
    _write_synthetic(kafka, topics, records=12, rows=40, per_transaction=3 if failure == "none" else None)
    expected = _changelog_rows(kafka, topics)
    assert expected >= 40 + PARTITIONS * 12 * 40

    env = dict(BULK)
    if failure == "injected error":
        env[FAULT_ENV] = "bulk_replay:1"  # fails right after its first restored run
    elif failure == "deadline":
        env["STREAMDEDUP_BULK_REPLAY_TIMEOUT"] = "0.001"
    reader = WorkerProcess(kafka, topics, tmp_path, "reader", env=env)  # no snapshot: the whole changelog
    with reader:
        log = reader.log_path.read_text("utf-8", "replace")
        line = _bulk_line(log, _changelog(topics))
        assert line.group(1) == "{0: 0, 1: 0}"
        if failure == "none":
            assert int(line.group(3)) == expected, line.group(0)  # every row came through the bulk path
            assert line.group(4) == "[0, 1]"
            assert f"bulk replay of {_changelog(topics)} stopped" not in log
        else:
            assert re.search(rf"bulk replay of {re.escape(_changelog(topics))} stopped \(", log), log[-4000:]
            assert int(line.group(3)) < expected, line.group(0)  # faust's recovery restored the rest
            if failure == "injected error":
                assert int(line.group(3)) > 0, line.group(0)  # one run came through the bulk path
        assert _stored_rows(reader, expected) == expected  # no row lost, none restored twice
        new = _pages("new", 10, seed=2)
        verdicts = _judge(kafka, topics, reader, _copies(originals[:15]) + new, len(originals))
        _check_verdicts(verdicts, originals[:15], new)


def test_a_snapshot_and_a_tail_replayed_in_bulk(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=PARTITIONS)
    first, second = _pages("first", 30, seed=3), _pages("second", 30, seed=4)
    worker = WorkerProcess(kafka, topics, tmp_path, "w", env=NO_BULK)
    with worker:
        _judge(kafka, topics, worker, first, 0)
    assert sorted((worker.dir / "data").rglob("*.shard")), "the clean stop wrote no snapshot"
    covered = _changelog_rows(kafka, topics)
    worker.start()  # the tail: pages judged after the snapshot, and no snapshot of them (SIGKILL)
    try:
        _judge(kafka, topics, worker, second, len(first))
    finally:
        worker.kill()
    _write_synthetic(kafka, topics, records=9, rows=30, per_transaction=4)
    expected = _changelog_rows(kafka, topics)

    worker.env.update(BULK)
    since = worker.log_path.stat().st_size
    with worker:
        log = worker.log_path.read_bytes()[since:].decode("utf-8", "replace")
        assert log.count("loaded snapshot of shard") == PARTITIONS, log[-4000:]
        line = _bulk_line(log, _changelog(topics))
        starts = {int(p): int(o) for p, o in re.findall(r"(\d+): (\d+)", line.group(1))}
        assert sorted(starts) == [0, 1] and min(starts.values()) > 0, line.group(0)  # after the snapshots
        assert int(line.group(3)) == expected - covered, line.group(0)  # exactly the tail's rows
        assert line.group(4) == "[0, 1]"
        assert _stored_rows(worker, expected) == expected
        new = _pages("new", 10, seed=5)
        judged = len(first) + len(second)
        verdicts = _judge(kafka, topics, worker, _copies(first[:10] + second[:10]) + new, judged)
        _check_verdicts(verdicts, first[:10] + second[:10], new)


def test_a_bulk_read_longer_than_the_session_timeout_keeps_the_worker_in_the_group(kafka, tmp_path):
    """aiokafka sends no heartbeats while the assignment callback runs (the bulk read is in it):
    the store sends them from a client of its own.  Each restored run waits 4 s (test hook), so
    the read lasts well over the 6 s session timeout; without the heartbeats the group drops the
    worker (UnknownMemberIdError, a second assignment: docs/faust-notes.md §14)."""
    topics = StreamTopics.fresh(kafka, partitions=PARTITIONS)
    originals = _pages("original", 20, seed=6)
    with WorkerProcess(kafka, topics, tmp_path, "writer", env=NO_BULK) as writer:
        _judge(kafka, topics, writer, originals, 0)
    _write_synthetic(kafka, topics, records=6, rows=20)
    expected = _changelog_rows(kafka, topics)
    env = {**BULK, "STREAMDEDUP_SESSION_TIMEOUT": "6", FAULT_ENV: "bulk_replay_slow:4"}
    reader = WorkerProcess(kafka, topics, tmp_path, "reader", env=env)
    with reader:
        log = reader.log_path.read_text("utf-8", "replace")
        line = _bulk_line(log, _changelog(topics))
        assert line.group(4) == "[0, 1]" and int(line.group(3)) == expected, line.group(0)
        seconds = float(re.search(r"rows in ([\d.]+)s", line.group(0)).group(1))
        assert seconds > 6, line.group(0)  # longer than the session timeout
        assert log.count("Executing _on_partitions_assigned") == 1, log[-4000:]  # never dropped
        assert "UnknownMemberId" not in log and "stopped (" not in log
        assert _stored_rows(reader, expected) == expected
        new = _pages("new", 5, seed=7)
        verdicts = _judge(kafka, topics, reader, _copies(originals[:10]) + new, len(originals))
        _check_verdicts(verdicts, originals[:10], new)
