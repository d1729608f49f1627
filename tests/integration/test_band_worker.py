"""``streamdedup worker --algorithm minhash`` and ``combined`` on the real broker (issue 12): LSH
bands sharded by key, with the simhash worker's guarantees.  One partition: the verdicts equal
``scan``'s on the arrival order.  Several partitions and workers, pairs split across partitions
in one burst, a SIGKILL: every page exactly one verdict, every pair exactly one flag.  A
restart recovers the bands (changelog and snapshot) so later copies find earlier pages.

Every check reads every output topic to its end offsets (``wait_for_verdicts``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pairs import exactly_one_of_each_pair, judged_once, scan_verdicts, split
from stream_harness import (
    StreamTopics,
    WorkerProcess,
    page_record,
    post_check,
    produce,
    produce_and_kill,
    wait_for_group,
    wait_for_verdicts,
)

pytestmark = pytest.mark.kafka

VOCAB = [f"w{i}" for i in range(5000)]


def planted(seed: int, n_pairs: int, n_alone: int, prefix: str = "") -> tuple[list[dict], list[tuple[str, str]]]:
    """Pages newest first: ``n_pairs`` originals each with a variant under another URL (an exact
    copy, or one word of 300 changed: word-trigram resemblance ~0.98, a candidate in some band
    and verified, in both band modes), and ``n_alone`` unrelated pages (random words from 5,000:
    no shared trigram).  Returns the records and the pairs (url, url)."""
    rng = np.random.default_rng(seed)
    pages, pairs = [], []
    for i in range(n_pairs + n_alone):
        words = [VOCAB[j] for j in rng.integers(0, len(VOCAB), 300)]
        pages.append((f"http://site.test/{prefix}p{i}", words))
        if i < n_pairs:
            variant = list(words)
            if i % 2:
                variant[int(rng.integers(5, len(variant) - 5))] = "changed"
            pages.append((f"http://mirror.test/{prefix}p{i}", variant))
            pairs.append((f"http://site.test/{prefix}p{i}", f"http://mirror.test/{prefix}p{i}"))
    records = [
        page_record(
            url, f"<html><body><p>{' '.join(w)}</p></body></html>", f"2024-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
        )
        for i, (url, w) in enumerate(pages)
    ]
    records.reverse()
    return records, pairs


@pytest.mark.parametrize("algorithm, k", [("minhash", 3), ("combined", 10)])
def test_one_partition_gives_scans_verdicts(kafka, tmp_path, algorithm, k):
    """(combined at k = 10, as the README advises: the simhash filter at 3 bits would drop some
    one-word edits, and the test's pairs would not all be near-duplicates.)"""
    records, pairs = planted(seed=31, n_pairs=20, n_alone=10)
    topics = StreamTopics.fresh(kafka, partitions=1)
    with WorkerProcess(kafka, topics, tmp_path, env={"STREAMDEDUP_ALGORITHM": algorithm, "STREAMDEDUP_K": str(k)}):
        produce(kafka, topics.pages, records)
        out = wait_for_verdicts(kafka, topics, len(records), timeout=120)
    judged = judged_once(out, records)
    exactly_one_of_each_pair(judged, pairs)
    assert judged == scan_verdicts(records, algorithm, k)
    assert len(out["near"]) == len(pairs)
    for m in out["near"]:  # the minhash mode says how similar; both say how far apart the simhashes are
        headers = dict(m.headers)
        v = judged[m.key.decode()]
        assert headers["streamdedup-verdict"] == b"near_duplicate"
        assert int(headers["streamdedup-distance"]) == v[2]
        if algorithm == "minhash":
            assert float(headers["streamdedup-similarity"]) == v[3] and v[3] >= 0.8
        else:
            assert "streamdedup-similarity" not in headers and v[3] is None


def test_two_workers_pairs_split_in_one_burst_then_a_sigkill(kafka, tmp_path):
    """minhash, 4 partitions, 2 workers; every pair's pages in different partitions, produced in
    one burst; one worker SIGKILLed mid-stream and restarted: exactly one verdict per page, one
    flag per pair."""
    records, pairs = planted(seed=32, n_pairs=120, n_alone=60)
    topics = StreamTopics.fresh(kafka, partitions=4)
    env = {"STREAMDEDUP_ALGORITHM": "minhash", "STREAMDEDUP_BATCH_SIZE": "20"}  # many transactions
    procs = [WorkerProcess(kafka, topics, tmp_path, name=f"w{i}", env=env) for i in range(2)]
    try:
        for w in procs:
            w.start(timeout=90)
        wait_for_group(kafka, topics.app_id, 2, timeout=90)
        judged_before = produce_and_kill(kafka, topics, procs[0], records, 30, partitions=split(records, pairs))
        assert judged_before < len(records), "the kill did not land mid-stream"
        procs[0].start(timeout=90)
        out = wait_for_verdicts(kafka, topics, len(records), timeout=240)
    finally:
        for w in procs:
            w.__exit__(None, None, None)
    exactly_one_of_each_pair(judged_once(out, records), pairs)


def test_a_restarted_worker_still_finds_pages_stored_before_it_stopped(kafka, tmp_path):
    """minhash, one worker: a wave, a clean stop (it snapshots), a restart that recovers its band
    tables from the snapshot and the changelog; copies of the first wave are then flagged
    against it."""
    first, _ = planted(seed=33, n_pairs=0, n_alone=30, prefix="a")
    copies = [dict(r, url=r["url"].replace("site.test", "copy.test")) for r in first]
    topics = StreamTopics.fresh(kafka, partitions=2)
    env = {"STREAMDEDUP_ALGORITHM": "minhash", "STREAMDEDUP_SNAPSHOT_INTERVAL": "1"}
    with WorkerProcess(kafka, topics, tmp_path, env=env):
        produce(kafka, topics.pages, first)
        wait_for_verdicts(kafka, topics, len(first), timeout=120)
    with WorkerProcess(kafka, topics, tmp_path, env=env) as w:
        produce(kafka, topics.pages, copies)
        out = wait_for_verdicts(kafka, topics, len(first) + len(copies), timeout=120)
        # POST /check judges by the bands too, without storing the page
        probe = dict(first[0], url="http://check.test/p0")
        for _ in range(2):
            status, answer = post_check(w.web_port, json.dumps(probe).encode())
            assert status == 200 and answer["verdict"] == "near_duplicate"
            assert (answer["match_id"], answer["similarity"]) == (first[0]["url"], 1.0)
        fresh = planted(seed=34, n_pairs=0, n_alone=1, prefix="z")[0][0]
        assert post_check(w.web_port, json.dumps(fresh).encode())[1]["verdict"] == "unique"
        assert post_check(w.web_port, json.dumps(dict(fresh, url="http://z2/")).encode())[1]["verdict"] == "unique"
    judged = judged_once(out, first + copies)
    for r in copies:
        verdict, match, distance, similarity = judged[r["url"]]
        assert (verdict, match, distance, similarity) == (
            "near_duplicate",
            r["url"].replace("copy.test", "site.test"),
            0,
            1.0,
        )
