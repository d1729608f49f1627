"""A failing stage in a real worker on the real broker: retried with backoff, and if a batch
keeps failing its pages go to the dead-letter topic as internal_error while later pages are
still judged.  Failures are injected with the worker's test hook ``TEST_STREAMDEDUP_FAULT``
(``streamdedup/stream/app.py``: ``shard:2`` fails the shard stage's first 2 batches,
``shard:id=poison`` every shard batch holding a page whose id contains "poison"), both with the
worker's probes given to its own shards (``--local-shards``, the default) and sent through the
probes and answers topics.

Every check reads every output topic to its end offsets: each input record has exactly one
outcome (one verdict or one dead letter).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request

import numpy as np
import pytest
from stream_harness import StreamTopics, WorkerProcess, page_record, produce
from topics import read_topic

from streamdedup.stream.app import FAULT_ENV

pytestmark = pytest.mark.kafka

VOCAB = [f"w{i}" for i in range(5000)]


def pages(rng, prefix: str, n: int) -> list[dict]:
    return [
        page_record(
            f"http://faults.test/{prefix}/{i}",
            "<p>" + " ".join(VOCAB[j] for j in rng.integers(0, len(VOCAB), 300)) + "</p>",
            id=f"{prefix}-{i}",
        )
        for i in range(n)
    ]


def copies(records: list[dict], prefix: str) -> list[dict]:
    """The same content under new ids: each is a near-duplicate (distance 0) of its original."""
    return [dict(r, id=f"{prefix}-{i}", url=f"http://faults.test/{prefix}/{i}") for i, r in enumerate(records)]


def outcomes(kafka, topics: StreamTopics) -> dict[str, list]:
    """Page id (the record key) -> its outcomes: ("verdict", verdict, match id) or ("dead", reason, error)."""
    out: dict[str, list] = {}
    for r in read_topic(kafka, topics.verdicts):
        v = json.loads(r.value)
        out.setdefault(v["id"], []).append(("verdict", v["verdict"], v["match_id"]))
    for r in read_topic(kafka, topics.dead_letter):
        h = dict(r.headers)
        out.setdefault(r.key.decode(), []).append(
            ("dead", h["streamdedup-reason"].decode(), h["streamdedup-error"].decode())
        )
    return out


def wait_for_outcomes(kafka, topics: StreamTopics, ids: list[str], timeout: float = 90.0) -> dict[str, list]:
    deadline = time.monotonic() + timeout
    while True:
        out = outcomes(kafka, topics)
        if all(i in out for i in ids) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def errors_metric(worker: WorkerProcess, stage: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    m = re.search(rf'^streamdedup_errors_total\{{stage="{stage}"\}} (\S+)$', body, re.M)
    assert m, f"no errors metric for {stage}"
    return float(m.group(1))


@pytest.mark.parametrize("local", [True, False], ids=["local-shards", "through-topics"])
@pytest.mark.parametrize("stage", ["shard", "answers"])
def test_a_transient_failure_is_retried_and_every_page_gets_its_verdict(kafka, tmp_path, stage, local):
    topics = StreamTopics.fresh(kafka, partitions=2)
    rng = np.random.default_rng(7)
    first = pages(rng, "a", 20)
    second = copies(first[:10], "b") + pages(rng, "c", 10)
    env = {FAULT_ENV: f"{stage}:2", "STREAMDEDUP_LOCAL_SHARDS": str(local).lower()}
    with WorkerProcess(kafka, topics, tmp_path, env=env) as worker:
        produce(kafka, topics.pages, first)
        out = wait_for_outcomes(kafka, topics, [r["id"] for r in first])
        produce(kafka, topics.pages, second)
        out = wait_for_outcomes(kafka, topics, [r["id"] for r in first + second])
        assert errors_metric(worker, stage) == 2  # both injected failures counted, then it went on
        log = worker.log_path.read_text()
    assert f"{stage} stage failed (attempt 1 of 5)" in log
    assert "giving up" not in log
    expected = {r["id"]: [("verdict", "unique", None)] for r in first + second[10:]}
    expected |= {f"b-{i}": [("verdict", "near_duplicate", f"a-{i}")] for i in range(10)}
    assert out == expected  # one outcome each, and the right one


@pytest.mark.parametrize("local", [True, False], ids=["local-shards", "through-topics"])
@pytest.mark.parametrize("stage", ["shard", "answers"])
def test_a_batch_that_keeps_failing_goes_to_the_dead_letter_topic_and_later_pages_are_judged(
    kafka, tmp_path, stage, local
):
    topics = StreamTopics.fresh(kafka, partitions=2)
    rng = np.random.default_rng(8)
    first = pages(rng, "a", 10)
    poison = pages(rng, "poison", 1)
    later = copies(first[:5], "b") + pages(rng, "c", 5)
    env = {FAULT_ENV: f"{stage}:id=poison", "STREAMDEDUP_LOCAL_SHARDS": str(local).lower()}
    with WorkerProcess(kafka, topics, tmp_path, env=env) as worker:
        produce(kafka, topics.pages, first)
        wait_for_outcomes(kafka, topics, [r["id"] for r in first])
        produce(kafka, topics.pages, poison)  # alone, so its batches hold no other page
        wait_for_outcomes(kafka, topics, ["poison-0"])
        produce(kafka, topics.pages, later)
        out = wait_for_outcomes(kafka, topics, [r["id"] for r in first + poison + later])
        assert errors_metric(worker, stage) >= 5  # every failed attempt counts
    [(kind, reason, error)] = out.pop("poison-0")
    assert (kind, reason) == ("dead", "internal_error")
    assert f"{stage} stage failed 5 times" in error and "injected" in error
    expected = {r["id"]: [("verdict", "unique", None)] for r in first + later[5:]}
    expected |= {f"b-{i}": [("verdict", "near_duplicate", f"a-{i}")] for i in range(5)}
    assert out == expected


@pytest.mark.parametrize("local", [True, False], ids=["local-shards", "through-topics"])
def test_stored_pages_whose_changelog_write_failed_are_written_with_the_retry(kafka, tmp_path, local):
    """The broker never got the changelog records of the first pages a shard stored (the test hook
    fails the writes; the stage retries, and the retry finds those pages stored already).  They
    are written all the same before any of them is answered: a worker that rebuilds the shards
    from the changelog alone (a fresh data directory) finds every one, so each copy of them is
    a near-duplicate of its original."""
    topics = StreamTopics.fresh(kafka, partitions=2)
    rng = np.random.default_rng(10)
    first = pages(rng, "a", 20)
    second = copies(first, "b")
    env = {FAULT_ENV: "changelog:2", "STREAMDEDUP_LOCAL_SHARDS": str(local).lower()}
    with WorkerProcess(kafka, topics, tmp_path, env=env) as worker:
        produce(kafka, topics.pages, first)
        out = wait_for_outcomes(kafka, topics, [r["id"] for r in first])
        assert errors_metric(worker, "shard") >= 1
        assert "injected changelog failure" in worker.log_path.read_text()
    assert out == {r["id"]: [("verdict", "unique", None)] for r in first}
    produce(kafka, topics.pages, second)
    with WorkerProcess(kafka, topics, tmp_path, name="w2"):  # its shards from the changelog alone
        out = wait_for_outcomes(kafka, topics, [r["id"] for r in first + second])
    expected = {r["id"]: [("verdict", "unique", None)] for r in first}
    expected |= {f"b-{i}": [("verdict", "near_duplicate", f"a-{i}")] for i in range(len(first))}
    assert out == expected


def test_a_broker_outage_logs_a_few_lines_per_node_not_a_flood(tmp_path):
    """A private broker, a worker with pages in flight, then the broker stops for good: the
    worker's connection errors are rate-limited (streamdedup/stream/logs.py) to about one line
    per kind and node per 10 s, each later one with the count it stands for."""
    from kafka_broker import LocalKafka

    broker = LocalKafka(name=f"pytest-{os.getpid()}-outage")
    broker.start()
    worker = None
    try:
        topics = StreamTopics.fresh(broker, partitions=2)
        worker = WorkerProcess(broker, topics, tmp_path)
        worker.start(timeout=90)
        produce(broker, topics.pages, pages(np.random.default_rng(9), "a", 20))
        wait_for_outcomes(broker, topics, [f"a-{i}" for i in range(20)])
        mark = worker.log_path.stat().st_size
        broker.stop()
        # the outage: wait until the worker has noticed it, then for 15 s more of it
        worker.wait_for_log("Unable connect to node with id", 60, since=mark)
        noticed = worker.log_path.stat().st_size
        time.sleep(15)  # (a window to count lines in, not a wait for a condition)
        assert worker.proc.poll() is None, "the worker died in the outage"
        lines = worker.log_path.read_bytes()[noticed:].decode("utf-8", "replace").splitlines()
    finally:
        if worker is not None and worker.proc is not None and worker.proc.poll() is None:
            worker.kill()
        if broker.started:
            broker.stop()
    errors = [line for line in lines if "[ERROR]" in line or "[WARNING]" in line]
    # one node, a handful of kinds (connect, metadata, fetch, heartbeat, ...), each at most twice
    # in 15 s; without the limit this was thousands of lines (72,454 in 16 s in issue 15)
    assert len(errors) < 100, f"{len(errors)} error lines in 15 s of outage:\n" + "\n".join(errors[:30])


def test_a_stop_that_hangs_ends_at_the_stop_deadline_and_a_restart_judges_the_rest(kafka, tmp_path):
    """An orchestrator sends SIGTERM and kills after its grace period; the worker exits by itself at
    --stop-timeout (exit code 75, a line that says why) and loses nothing: every page produced
    before and after has exactly one outcome once a worker runs again."""
    from streamdedup.stream.run import EXIT_STOP_TIMEOUT

    topics = StreamTopics.fresh(kafka, partitions=2)
    rng = np.random.default_rng(9)
    first, later = pages(rng, "a", 10), pages(rng, "c", 5)
    env = {FAULT_ENV: "stop", "STREAMDEDUP_STOP_TIMEOUT": "3"}
    with WorkerProcess(kafka, topics, tmp_path, env=env) as worker:
        produce(kafka, topics.pages, first)
        wait_for_outcomes(kafka, topics, [r["id"] for r in first])
        began = time.monotonic()
        assert worker.stop(timeout=60) == EXIT_STOP_TIMEOUT
        took = time.monotonic() - began
        assert took < 30, f"the stop took {took:.0f} s with --stop-timeout 3"
        assert "did not stop within 3 s (--stop-timeout)" in worker.log_tail(80)
    produce(kafka, topics.pages, later)
    with WorkerProcess(kafka, topics, tmp_path, name="w2"):
        out = wait_for_outcomes(kafka, topics, [r["id"] for r in first + later])
    assert out == {r["id"]: [("verdict", "unique", None)] for r in first + later}
