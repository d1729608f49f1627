"""The cluster key through a real worker: every verdict carries ``cluster``, every routed page the
``streamdedup-cluster`` header, equal for a page and its exact copy; ``--cluster-n 0`` turns it off."""

from __future__ import annotations

import numpy as np
import pytest
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_for_verdicts

from streamdedup.fingerprinting.simhash import to_hex
from streamdedup.pipeline.intake import fingerprint_contents

pytestmark = pytest.mark.kafka

VOCAB = [f"w{i}" for i in range(5000)]


def _page(url: str, seed: int) -> dict:
    words = " ".join(VOCAB[i] for i in np.random.default_rng(seed).integers(0, len(VOCAB), 300))
    return page_record(url, f"<html><body><nav>Home</nav><p>{words}</p></body></html>")


def _expected_key(record: dict, n: int) -> str | None:
    """The key the worker's pages stage computes (its production function), as hex."""
    _, _, keys, _ = fingerprint_contents([(record["content"], record["content_type"], None)], n)
    return None if keys[0] is None else to_hex(keys[0])


def _routed(out: dict) -> dict[str, dict[str, bytes]]:
    """Page id -> the headers of its copy on the unique or near-duplicate topic."""
    return {m.key.decode(): dict(m.headers) for m in out["unique"] + out["near"]}


def test_verdicts_and_routed_pages_carry_the_cluster_key(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=2)
    originals = [_page(f"http://site.test/{i}", seed=i) for i in range(6)]
    copies = [dict(originals[i], url=f"http://mirror.test/{i}") for i in (1, 4)]  # exact copies, other ids
    with WorkerProcess(kafka, topics, tmp_path):
        produce(kafka, topics.pages, originals)
        wait_for_verdicts(kafka, topics, len(originals))
        produce(kafka, topics.pages, copies)
        out = wait_for_verdicts(kafka, topics, len(originals) + len(copies))
    verdicts = {k: v[-1] for k, v in out["verdicts"].items()}
    routed = _routed(out)
    assert len(verdicts) == len(routed) == len(originals) + len(copies)
    for record in originals + copies:
        key = _expected_key(record, 4)  # the default --cluster-n
        assert key is not None and len(key) == 16
        assert verdicts[record["url"]]["cluster"] == key
        assert routed[record["url"]]["streamdedup-cluster"] == key.encode()
    for i in (1, 4):  # a copy: a near-duplicate with its original's key
        copy = verdicts[f"http://mirror.test/{i}"]
        assert copy["verdict"] == "near_duplicate" and copy["match_id"] == f"http://site.test/{i}"
        assert copy["cluster"] == verdicts[f"http://site.test/{i}"]["cluster"]
    assert len({verdicts[r["url"]]["cluster"] for r in originals}) == len(originals)  # unrelated pages: own keys


def test_cluster_n_from_the_environment_and_zero_turns_it_off(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=1)
    pages = [_page(f"http://site.test/{i}", seed=100 + i) for i in range(3)]
    with WorkerProcess(kafka, topics, tmp_path, "n8", env={"STREAMDEDUP_CLUSTER_N": "8"}):
        produce(kafka, topics.pages, pages[:2])
        out = wait_for_verdicts(kafka, topics, 2)
    assert [out["verdicts"][p["url"]][-1]["cluster"] for p in pages[:2]] == [_expected_key(p, 8) for p in pages[:2]]
    assert _expected_key(pages[0], 8) != _expected_key(pages[0], 4)
    with WorkerProcess(kafka, topics, tmp_path, "n0", env={"STREAMDEDUP_CLUSTER_N": "0"}):
        produce(kafka, topics.pages, pages[2:])
        out = wait_for_verdicts(kafka, topics, 3)
    assert out["verdicts"][pages[2]["url"]][-1]["cluster"] is None
    assert "streamdedup-cluster" not in _routed(out)[pages[2]["url"]]
    assert out["verdicts"][pages[2]["url"]][-1]["verdict"] == "unique"
