"""A dead worker stalls every page until the group expires it; with ``--standby-replicas 1`` the
survivor's standby copies of the dead worker's shards answer the pages that have a match.

The survivor holds a standby of each shard partition the dead worker owned.  A copy of a stored
page finds the original there, and once it waits for nothing but those stalled partitions it
is released as a near-duplicate, long before the session timeout lets the group move the dead
worker's partitions.  Pages without a match still wait for the owner (docs/stream-design.md,
"Faults").  After the takeover every page has exactly one verdict.
"""

from __future__ import annotations

import re
import time
import urllib.request

import numpy as np
import pytest
from pairs import exactly_one_of_each_pair, judged_once
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_for_group, wait_for_verdicts

pytestmark = pytest.mark.kafka

SESSION_TIMEOUT = 30  # seconds until the group expires the dead worker: the stall without standbys
N = 40


def shard_fingerprints(port: int) -> int:
    """What the worker's shards hold, actives and standbys (its /metrics, updated every 5 s)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return int(sum(float(v) for v in re.findall(r"^streamdedup_shard_fingerprints\{[^}]*\} (\S+)$", text, re.M)))


def test_copies_take_their_verdict_from_a_standby_while_a_dead_worker_stalls_the_group(kafka, tmp_path):
    rng = np.random.default_rng(3)
    words = [" ".join(f"w{j}" for j in rng.integers(0, 5000, 300)) for _ in range(N)]
    originals = [
        page_record(f"http://site.test/p{i}", f"<html><body><p>{w}</p></body></html>") for i, w in enumerate(words)
    ]
    copies = [page_record(f"http://mirror.test/p{i}", r["content"]) for i, r in enumerate(originals)]
    topics = StreamTopics.fresh(kafka, partitions=4)
    env = {"STREAMDEDUP_STANDBY_REPLICAS": "1", "STREAMDEDUP_SESSION_TIMEOUT": str(SESSION_TIMEOUT)}
    procs = [WorkerProcess(kafka, topics, tmp_path, name=f"w{i}", env=env) for i in range(2)]
    try:
        for w in procs:
            w.start(timeout=90)
        wait_for_group(kafka, topics.app_id, 2, timeout=90)
        produce(kafka, topics.pages, originals, partitions=[i % 4 for i in range(N)])
        wait_for_verdicts(kafka, topics, N, timeout=120)
        survivor, dead = procs
        deadline = time.monotonic() + 60  # its standbys have caught up with the dead one's shards
        while shard_fingerprints(survivor.web_port) < N * 4:  # (4 table groups a page)
            assert time.monotonic() < deadline, f"the survivor's shards hold {shard_fingerprints(survivor.web_port)}"
            time.sleep(0.5)

        dead.kill()
        killed = time.monotonic()
        produce(kafka, topics.pages, copies, partitions=[i % 4 for i in range(N)])
        # well inside the stall: the group cannot move the dead worker's partitions before SESSION_TIMEOUT
        early = wait_for_verdicts(kafka, topics, 2 * N, timeout=SESSION_TIMEOUT - 12, to_end=False)
        assert time.monotonic() - killed < SESSION_TIMEOUT - 5
        judged = {i: v for i, v in early["verdicts"].items() if i.startswith("http://mirror.test/")}
        # the survivor reads about half the pages partitions; without the standby answers a copy
        # there is judged only if all 4 of its groups are the survivor's own shards (1 in 16)
        assert len(judged) >= 10, f"{len(judged)} copies judged during the stall"
        for i, [v] in judged.items():
            assert (v["verdict"], v["match_id"]) == ("near_duplicate", i.replace("mirror", "site"))

        out = wait_for_verdicts(kafka, topics, 2 * N, timeout=SESSION_TIMEOUT + 150)
    finally:
        for w in procs:
            w.__exit__(None, None, None)
    pairs = [(o["url"], c["url"]) for o, c in zip(originals, copies)]
    exactly_one_of_each_pair(judged_once(out, originals + copies), pairs)
    assert all(out["verdicts"][c["url"]][0]["verdict"] == "near_duplicate" for c in copies)
