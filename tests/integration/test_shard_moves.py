"""Shard partitions that move between two workers with standby copies, on the real broker.

The shard stage stores and answers probes only for the shard partitions its worker owns (active,
in the current assignment; docs/faust-notes.md §12): a standby copy is only replayed from the
changelog, and a batch faust hands over after its partition moved is left to the new owner.
Here two workers with ``--standby-replicas 1`` move the partitions twice (one stops: its standby
copies on the other become active; it starts again: they move back, recovered from its
snapshots and the changelog's tail), and every copy of a page stored before, or while the other
worker held everything, still names its original.  (The late batch itself cannot be provoked
on demand here: tests/test_revoked_shard.py drives it through the store's rebalance calls.)
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_for_group, wait_for_verdicts

pytestmark = pytest.mark.kafka

STANDBY = {"STREAMDEDUP_STANDBY_REPLICAS": "1"}


def pages(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        "<html><body><p>" + " ".join(f"w{i}" for i in rng.integers(0, 5000, 400)) + "</p></body></html>"
        for _ in range(n)
    ]


def records(prefix: str, contents: list[str]) -> list[dict]:
    return [page_record(f"http://{prefix}.test/{i}", c, "2024-01-01T00:00:00Z") for i, c in enumerate(contents)]


def verdicts(out: dict, prefix: str) -> dict[str, tuple]:
    return {
        k: (v[-1]["verdict"], v[-1]["match_id"])
        for k, v in out["verdicts"].items()
        if k.startswith(f"http://{prefix}.")
    }


def test_copies_name_their_originals_while_shards_move_between_workers_with_standbys(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=4)
    first, second = pages(1, 30), pages(2, 30)
    a = WorkerProcess(kafka, topics, tmp_path, name="a", env=STANDBY)
    b = WorkerProcess(kafka, topics, tmp_path, name="b", env=STANDBY)
    try:
        a.start()
        b.start()
        wait_for_group(kafka, topics.app_id, 2)
        produce(kafka, topics.pages, records("first", first))
        out = wait_for_verdicts(kafka, topics, 30, timeout=90)
        assert set(verdicts(out, "first").values()) == {("unique", None)}

        assert b.stop() == 0  # a takes every partition: its standby copies of b's become active
        wait_for_group(kafka, topics.app_id, 1)
        produce(kafka, topics.pages, records("copy1", first) + records("second", second))
        out = wait_for_verdicts(kafka, topics, 90, timeout=120)
        assert verdicts(out, "copy1") == {
            f"http://copy1.test/{i}": ("near_duplicate", f"http://first.test/{i}") for i in range(30)
        }
        assert set(verdicts(out, "second").values()) == {("unique", None)}

        b.start()  # half the partitions move back to b: its snapshots, then the changelog's tail
        wait_for_group(kafka, topics.app_id, 2)
        produce(kafka, topics.pages, records("copy2", first) + records("copy3", second))
        out = wait_for_verdicts(kafka, topics, 150, timeout=120)
    finally:
        a.__exit__(None, None, None)
        b.__exit__(None, None, None)
    assert verdicts(out, "copy2") == {
        f"http://copy2.test/{i}": ("near_duplicate", f"http://first.test/{i}") for i in range(30)
    }
    assert verdicts(out, "copy3") == {
        f"http://copy3.test/{i}": ("near_duplicate", f"http://second.test/{i}") for i in range(30)
    }
    assert sum(map(len, out["verdicts"].values())) == 150  # one verdict each
    for w in (a, b):
        log = w.log_path.read_text("utf-8", "replace")
        assert "shard stage failed" not in log and "not assigned to this worker" not in log, w.log_tail()


def test_a_shard_batch_left_after_a_rebalance_costs_no_stored_page(kafka, tmp_path):
    """A worker busy with a stream when a second one joins: the shard partitions that move to the
    newcomer were probed in batches faust's ``take_events`` had buffered before the revocation
    and hands over after the assignment (``--batch-timeout 4``: a buffer waits up to 2 s).  Such
    a batch used to make an empty shard for a partition that had moved, claiming its write's
    changelog offset; when the newcomer left and the partition came back, recovery replayed only
    the changelog after that offset, and the copies of the pages stored before were judged unique.
    Whether a late batch comes in a given run depends on timing (docs/faust-notes.md §12), so
    on the old code this test fails in some runs, not all."""
    topics = StreamTopics.fresh(kafka, partitions=4)
    pool = records("first", pages(3, 1600))
    env = {"STREAMDEDUP_BATCH_TIMEOUT": "4.0", "STREAMDEDUP_BATCH_SIZE": "40"}
    a = WorkerProcess(kafka, topics, tmp_path, name="a", env=env)
    b = WorkerProcess(kafka, topics, tmp_path, name="b", env=env)
    joined, sent = threading.Event(), []

    def stream() -> None:  # keeps a busy until b has joined, and a little longer
        for i in range(0, len(pool), 40):
            produce(kafka, topics.pages, pool[i : i + 40])
            sent.extend(pool[i : i + 40])
            if joined.wait(0.3):  # b is in: one more batch once the group has both
                wait_for_group(kafka, topics.app_id, 2, timeout=60)
                produce(kafka, topics.pages, pool[i + 40 : i + 80])
                sent.extend(pool[i + 40 : i + 80])
                return

    try:
        a.start()
        feed = threading.Thread(target=stream)
        feed.start()
        wait_for_verdicts(kafka, topics, 40, timeout=60, to_end=False)  # a is judging the stream
        b.start()  # joins while a is busy: half the shard partitions move to b
        joined.set()
        feed.join(timeout=60)
        n = len(sent)
        out = wait_for_verdicts(kafka, topics, n, timeout=120)
        assert set(verdicts(out, "first").values()) == {("unique", None)}
        assert b.stop() == 0  # they come back to a
        wait_for_group(kafka, topics.app_id, 1)
        copies = [dict(r, url=r["url"].replace("first", "copy")) for r in sent]
        produce(kafka, topics.pages, copies)
        out = wait_for_verdicts(kafka, topics, 2 * n, timeout=120)
    finally:
        a.__exit__(None, None, None)
        b.__exit__(None, None, None)
    late = a.log_path.read_text("utf-8", "replace").count("not served here")
    wrong = {k: v for k, v in verdicts(out, "copy").items() if v != ("near_duplicate", k.replace("copy", "first"))}
    assert not wrong, (
        f"{len(wrong)} of {n} copies misjudged ({late} late shard batches left), e.g. {list(wrong.items())[:3]}"
    )
    assert len(verdicts(out, "copy")) == len(verdicts(out, "first")) == n, (len(verdicts(out, "copy")), n)
    # exactly once: 1 run in 15 judged pages twice before the revoking worker waited for its last
    # commits to show in the group (Outbox.settle, docs/faust-notes.md §12)
    twice = {k: len(v) for k, v in out["verdicts"].items() if len(v) != 1}
    assert not twice, f"pages with more than one verdict: {list(twice.items())[:5]}"
