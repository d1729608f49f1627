"""``--local-shards`` (the default) against the real broker: a worker gives its own pages' probes
to the shard partitions it owns itself, with no message through the probes and answers topics,
and the verdicts are those of the topic path and of ``scan``.

One input partition, pairs produced newer page first, and a backlog that is already there when
the worker starts (batches taken while its shards recover go through the topic, but with an
empty changelog that window is short and is often missed: the switch to the shards here, which
must keep the partition's order, is forced by the test hook in the last test).  Every check reads
every output topic to its end offsets once the worker has committed every page.
"""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest
from pairs import judged_once, scan_verdicts
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_for_verdicts
from topics import read_topic

from streamdedup.settings import Settings
from streamdedup.stream.app import FAULT_ENV, HANDOVER_READY, internal_topics

pytestmark = pytest.mark.kafka

VOCAB = [f"w{i}" for i in range(5000)]


def records(seed: int, n: int) -> list[dict]:
    """``n`` pages, every third one a copy or a one-word variant of an earlier one, newest first."""
    rng = np.random.default_rng(seed)
    texts: list[list[str]] = []
    for i in range(n):
        if i % 3 == 2:
            words = list(texts[int(rng.integers(0, len(texts)))])
            if i % 2:
                words[int(rng.integers(0, len(words)))] = "changed"
        else:
            words = [VOCAB[j] for j in rng.integers(0, len(VOCAB), 300)]
        texts.append(words)
    out = [
        page_record(
            f"http://local.test/p{i}",
            f"<p>{' '.join(w)}</p>",
            f"2024-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
        )
        for i, w in enumerate(texts)
    ]
    out.reverse()
    return out


def probes_metric(worker: WorkerProcess) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    return {m[0]: float(m[1]) for m in re.findall(r'^streamdedup_probes_total\{path="(\w+)"\} (\S+)$', body, re.M)}


def internal_records(kafka, topics: StreamTopics) -> dict[str, int]:
    names = internal_topics(Settings(app_id=topics.app_id))
    return {kind: len(read_topic(kafka, names[kind])) for kind in ("probes", "answers")}


@pytest.mark.parametrize("local", [True, False])
def test_a_worker_judges_its_own_pages_in_its_shards_with_the_verdicts_of_the_topics(kafka, tmp_path, local):
    pages = records(seed=41, n=300)
    expected = scan_verdicts(pages)
    assert sum(v[0] == "near_duplicate" for v in expected.values()) >= 80  # the test means something
    topics = StreamTopics.fresh(kafka, partitions=1)
    produce(kafka, topics.pages, pages[:200])  # a backlog before the start
    env = {"STREAMDEDUP_LOCAL_SHARDS": str(local).lower(), "STREAMDEDUP_BATCH_SIZE": "20"}
    with WorkerProcess(kafka, topics, tmp_path, env=env) as worker:
        out = wait_for_verdicts(kafka, topics, 200, timeout=120)
        before = internal_records(kafka, topics)
        produce(kafka, topics.pages, pages[200:])  # and pages that come while it runs
        out = wait_for_verdicts(kafka, topics, len(pages), timeout=120)
        after = internal_records(kafka, topics)
        probes = probes_metric(worker)
        log = worker.log_path.read_text()
    assert judged_once(out, pages) == expected
    assert "Traceback" not in log
    assert sum(probes.values()) >= 4 * len(pages)  # a probe per page and table group (more if one was sent again)
    if local:  # the pages that came after the start went to the shards here, not through Kafka
        assert after == before, (before, after)
        assert probes["local"] >= 4 * 100
    else:
        assert after["probes"] > before["probes"] and after["answers"] > before["answers"]
        assert probes["local"] == 0


def test_a_failed_local_batch_is_retried_in_its_place(kafka, tmp_path):
    """One partition, batches of 5, the shard step's first batch fails once (the test hook): it is
    retried before the batches taken after it are stored, so the originals in it are still the
    ones stored first and their copies in later batches are the near-duplicates, as in ``scan``."""
    rng = np.random.default_rng(43)
    originals = [
        page_record(f"http://local.test/o{i}", "<p>" + " ".join(VOCAB[j] for j in rng.integers(0, 5000, 300)) + "</p>")
        for i in range(5)
    ]
    pages = originals + [
        dict(r, url=f"http://local.test/copy{n}-{i}") for n in range(4) for i, r in enumerate(originals)
    ]
    expected = scan_verdicts(pages)
    assert sum(v[0] == "near_duplicate" for v in expected.values()) == len(pages) - 5
    topics = StreamTopics.fresh(kafka, partitions=1)
    env = {"STREAMDEDUP_BATCH_SIZE": "5", FAULT_ENV: "shard:1"}
    with WorkerProcess(kafka, topics, tmp_path, env=env) as worker:
        produce(kafka, topics.pages, pages)  # after the start: the shard here is ready
        out = wait_for_verdicts(kafka, topics, len(pages), timeout=120)
        probes = probes_metric(worker)
        log = worker.log_path.read_text()
    assert "shard stage failed (attempt 1 of 5)" in log
    assert probes["local"] > 0 and probes["topic"] == 0
    assert judged_once(out, pages) == expected


def test_the_switch_to_the_shards_here_waits_for_the_probes_sent_through_the_topic(kafka, tmp_path):
    """Pages taken while the worker's shard partition is not ready send their probes through the
    probes topic (the test hook makes the shard ready 5 s after its recovery, and holds the shard
    agent's probes until HANDOVER_HOLD, 1.5 s, after that).  Copies of those pages taken once the shard is ready must
    not be stored here before them: the switch to the shard here waits for those probes' answers
    (at most LOCAL_HANDOVER), so the originals are stored first and the copies are the
    near-duplicates, as in ``scan``."""
    rng = np.random.default_rng(44)
    originals = [
        page_record(f"http://local.test/o{i}", "<p>" + " ".join(VOCAB[j] for j in rng.integers(0, 5000, 300)) + "</p>")
        for i in range(40)
    ]
    copies = [dict(r, url=f"http://local.test/copy-{i}") for i, r in enumerate(originals)]
    expected = scan_verdicts(originals + copies)
    assert sum(v[0] == "near_duplicate" for v in expected.values()) == len(copies)
    topics = StreamTopics.fresh(kafka, partitions=1)
    env = {"STREAMDEDUP_BATCH_SIZE": "50", FAULT_ENV: "handover:5"}  # (every page may wait at once)
    with WorkerProcess(kafka, topics, tmp_path, env=env) as worker:
        produce(kafka, topics.pages, originals)  # taken before the shard here is ready
        worker.wait_for_log(HANDOVER_READY, 60)
        produce(kafka, topics.pages, copies)  # taken after
        out = wait_for_verdicts(kafka, topics, len(originals) + len(copies), timeout=120)
        probes = probes_metric(worker)
    # both paths were taken: the first originals, at least, before the shard was ready, and pages
    # after the switch (on a busy machine a batch may give up waiting and go through the topic too)
    assert probes["topic"] > 0 and probes["local"] > 0, probes
    assert judged_once(out, originals + copies) == expected
