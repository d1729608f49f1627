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
