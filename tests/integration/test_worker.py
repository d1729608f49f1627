"""The stream worker against the real broker: routing, worker-count independence, SIGKILL,
dead letters, a third-party producer (kcat), and SASL/SCRAM.

Expected verdicts come from the embedded engine (:class:`Deduplicator`, what ``scan`` runs)
on the same pages in the same order, so the stream must agree with it page by page.  Pages
are produced in waves (each wave after the previous one is judged) and no two pages of a wave
are near-duplicates of each other: the order between near-duplicates that race through
different shards at the same moment is the one thing the stream does not promise (see
docs/stream-design.md).
"""

from __future__ import annotations

import http.client
import json
import select
import shutil
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
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

from streamdedup.engine.dedup import Deduplicator
from streamdedup.engine.records import page_from_json, page_text
from streamdedup.fingerprinting.simhash import to_hex
from streamdedup.pipeline.intake import fingerprint_contents
from streamdedup.stream.app import CHECKS_PER_PROCESS, FAULT_ENV

pytestmark = pytest.mark.kafka

VOCAB = [f"w{i}" for i in range(5000)]


def _text(rng, n=400) -> list[str]:
    return [VOCAB[i] for i in rng.integers(0, len(VOCAB), n)]


def _html(words: list[str], title: str, boilerplate: str = "") -> str:
    return f"<html><head><title>{title}</title></head><body>{boilerplate}<p>{' '.join(words)}</p></body></html>"


def make_waves(seed: int, bases: int, waves: int, extra_unique: int = 0, edit: bool = True) -> list[list[dict]]:
    """Wave 0: ``bases`` distinct pages; wave w > 0: a variant of each base (so each wave's pages
    are near-duplicates of earlier waves, not of each other) plus fresh unique pages.

    A variant has one word of its text changed (``edit``; simhash puts most such pairs within
    3 bits, not all) and, always, a different advert, visit counter and timestamp."""
    rng = np.random.default_rng(seed)
    base_words = [_text(rng) for _ in range(bases)]
    out, clock = [], 0
    for w in range(waves):
        wave = []
        for b, words in enumerate(base_words):
            words = list(words)
            if w and edit:
                words[int(rng.integers(0, len(words)))] = f"edit{w}"  # one word changed
            clock += 1
            noise = (
                f"<aside class='advert'>Buy product {rng.integers(10**6)} now</aside>"
                f"<footer>{rng.integers(10**6)} visits, generated 2024-01-01 00:00:{clock % 60:02d}</footer>"
            )
            wave.append(
                page_record(
                    f"http://site{b % 7}.test/p{b}/v{w}",
                    _html(words, f"page {b}", noise),
                    f"2024-01-01T00:{clock // 60:02d}:{clock % 60:02d}Z",
                )
            )
        for u in range(extra_unique):
            clock += 1
            wave.append(
                page_record(
                    f"http://other.test/{w}/{u}",
                    _html(_text(rng), "other"),
                    f"2024-01-01T00:{clock // 60:02d}:{clock % 60:02d}Z",
                )
            )
        out.append(wave)
    return out


def expected_verdicts(records: list[dict]) -> dict[str, tuple]:
    pages = [page_from_json(json.dumps(r).encode()) for r in records]
    d = Deduplicator("simhash", k=3)
    got = d.process([p.id for p in pages], [p.url for p in pages], [page_text(p) for p in pages])
    return {v.id: (v.verdict, v.match_id, v.distance) for v in got}


def run_waves(kafka, topics, waves, timeout=90.0) -> dict:
    sent = 0
    for wave in waves:
        produce(kafka, topics.pages, wave)
        sent += len(wave)
        out = wait_for_verdicts(kafka, topics, sent, timeout)
        assert n_verdicts(out) == sent, f"{n_verdicts(out)} of {sent} verdicts"
    return out


def n_verdicts(out: dict) -> int:
    return sum(map(len, out["verdicts"].values()))


def once_each(out: dict) -> bool:
    """Every input record (partition, offset) has at most one verdict."""
    seen = [(v["partition"], v["offset"]) for vs in out["verdicts"].values() for v in vs]
    return len(seen) == len(set(seen))


def judged(out: dict) -> dict[str, tuple]:
    """Page id -> its last verdict (a re-fetched id has one per fetch)."""
    return {k: (v[-1]["verdict"], v[-1]["match_id"], v[-1]["distance"]) for k, v in out["verdicts"].items()}


def test_planted_near_duplicates_are_routed_with_their_match(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=4)
    waves = make_waves(seed=1, bases=12, waves=2, extra_unique=3, edit=False)  # adverts, counters, times
    # the same URL and content again, of a page with no near-duplicate among the others
    refetch = dict(waves[0][-1], fetched_at="2024-01-02T00:00:00Z")
    waves.append([refetch])
    with WorkerProcess(kafka, topics, tmp_path):
        out = run_waves(kafka, topics, waves)
    records = [r for w in waves for r in w]
    assert once_each(out), "a page got two verdicts"
    near = {m.key.decode(): m for m in out["near"]}
    unique = {m.key.decode(): m for m in out["unique"]}
    for b in range(12):  # every planted edit is flagged, with its original as the match
        m = near[f"http://site{b % 7}.test/p{b}/v1"]
        headers = dict(m.headers)
        assert headers["streamdedup-verdict"] == b"near_duplicate"
        assert headers["streamdedup-match-id"] == f"http://site{b % 7}.test/p{b}/v0".encode()
        assert headers["streamdedup-match-url"] == headers["streamdedup-match-id"]
        assert int(headers["streamdedup-distance"]) == 0 and len(headers["streamdedup-fingerprint"]) == 16
    # outputs carry the crawler's bytes unchanged
    sent = {r["url"]: json.dumps(r).encode() for r in records[:-1]}
    for key, m in {**near, **unique}.items():
        if key in sent and key != refetch["url"]:
            assert m.value == sent[key]
    # a re-fetch of the same URL is never a duplicate of itself
    assert [v["verdict"] for v in out["verdicts"][refetch["url"]]] == ["unique", "unique"]
    assert judged(out) == expected_verdicts(records)


def test_one_and_two_workers_give_the_same_verdicts(kafka, tmp_path):
    waves = make_waves(seed=2, bases=40, waves=3, extra_unique=10)
    records = [r for w in waves for r in w]
    expected = expected_verdicts(records)
    assert sum(v[0] == "near_duplicate" for v in expected.values()) >= 60  # the test means something
    results = []
    for n_workers in (1, 2):
        topics = StreamTopics.fresh(kafka, partitions=4)
        workers = [WorkerProcess(kafka, topics, tmp_path / f"n{n_workers}", name=f"w{i}") for i in range(n_workers)]
        try:
            for w in workers:
                w.start()
            if n_workers == 2:  # both hold partitions before the pages come
                wait_for_group(kafka, topics.app_id, 2)
            out = run_waves(kafka, topics, waves)
        finally:
            for w in workers:
                w.__exit__(None, None, None)
        assert once_each(out) and n_verdicts(out) == len(records)
        results.append(judged(out))
    assert results[0] == results[1] == expected


def test_sigkill_mid_stream_then_restart(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=4)
    # the rest holds no near-duplicate pair of its own (only copies of the first wave's pages),
    # so its verdicts do not depend on the order its pages reach the shards in
    waves = make_waves(seed=3, bases=400, waves=2, extra_unique=150)
    first, rest = waves
    assert len(rest) == 550
    worker = WorkerProcess(kafka, topics, tmp_path, env={"STREAMDEDUP_BATCH_SIZE": "50"})
    worker.start()
    try:
        produce(kafka, topics.pages, first)
        assert n_verdicts(wait_for_verdicts(kafka, topics, len(first))) == len(first)
        # the rest in one go; kill the worker once some, not all, of it is judged
        judged_before = produce_and_kill(kafka, topics, worker, rest, len(first) + 20)
        assert len(first) < judged_before < len(first) + len(rest), "the kill did not land mid-stream"
        worker.start(timeout=90)  # same group, same data dir: recovers the shards, resumes
        total = len(first) + len(rest)
        out = wait_for_verdicts(kafka, topics, total, timeout=120)
    finally:
        worker.__exit__(None, None, None)
    counts = {k: len(v) for k, v in out["verdicts"].items()}
    assert len(counts) == total, f"{total - len(counts)} pages have no verdict"
    assert max(counts.values()) == 1 and once_each(out), (
        f"pages with two verdicts: {[k for k, n in counts.items() if n > 1][:5]}"
    )
    assert len(out["unique"]) + len(out["near"]) == total
    # pages judged before the crash are still found afterwards: the verdicts equal the embedded run's
    assert judged(out) == expected_verdicts(first + rest)


def test_bad_input_goes_to_the_dead_letter_topic_and_good_pages_keep_flowing(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=2)
    good = [
        page_record(f"http://good.test/{i}", f"<p>good page number {i} " + "filler words here " * 20 + "</p>")
        for i in range(6)
    ]
    big = json.dumps(page_record("http://big.test/", "<p>" + "x" * 3000 + "</p>")).encode()
    bad = [
        (b"k1", b"this is not json", "not_json"),
        (b"k2", b"\xff\xfe\xfa not utf-8", "not_utf8"),
        (b"k3", json.dumps({"content": "<p>no url</p>"}).encode(), "missing_field"),
        (b"k4", json.dumps({"url": "http://no-content.test/"}).encode(), "missing_field"),
        (b"k5", big, "too_large"),
        (b"k6", b"", "empty"),
        (b"k7", b"[1, 2]", "not_object"),
        (b"k8", json.dumps({"url": "http://e.test/", "content": "   "}).encode(), "empty"),
        (b"k9", json.dumps({"url": "http://b.test/", "content": "\x00\x01\x02\x03" * 50}).encode(), "binary"),
        (
            b"k10",
            json.dumps({"url": "http://t.test/", "content": "x", "fetched_at": "yesterday"}).encode(),
            "bad_field",
        ),
        (b"k11", None, "empty"),  # a tombstone
    ]
    stream = []
    for i, b in enumerate(bad):  # interleaved with good pages
        stream.append((b[0], b[1], [("crawler-run", b"42")]))
        if i < len(good):
            stream.append(good[i])
    with WorkerProcess(kafka, topics, tmp_path, env={"STREAMDEDUP_MAX_PAGE_BYTES": "2048"}) as w:
        produce(kafka, topics.pages, stream)
        out = wait_for_verdicts(kafka, topics, len(good), dead_letters=len(bad))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{w.web_port}/metrics", timeout=10).read().decode()
        assert w.proc.poll() is None  # still running
    dead = {m.key: m for m in out["dead"]}
    assert len(out["dead"]) == len(bad)
    for key, value, reason in bad:
        m = dead[key]
        headers = dict(m.headers)
        assert headers["streamdedup-reason"] == reason.encode(), (key, headers)
        assert headers["streamdedup-error"] and headers["crawler-run"] == b"42"
        assert m.value == (value or b"")  # the input bytes, for a replay after a fix
    assert n_verdicts(out) == len(good)
    assert 'streamdedup_dead_letters_total{reason="missing_field"} 2.0' in metrics


def test_a_backlog_of_small_pages_shares_produce_batches_within_the_output_topics_limit(kafka, tmp_path):
    """Copies of many pages go in shared produce batches (one request a page cost the worker
    and the broker most of their CPU), but a batch is one message to the broker: with a small
    --max-page-bytes the output topics take little more than one page, and a batch over that
    would be refused and its pages sent again one by one."""
    topics = StreamTopics.fresh(kafka, partitions=1)
    rng = np.random.default_rng(11)
    pages = [
        page_record(f"http://batch.test/{i}", "<p>" + " ".join(rng.choice(VOCAB, 500)) + "</p>") for i in range(300)
    ]
    assert all(2500 < len(json.dumps(p)) < 4096 for p in pages)
    produce(kafka, topics.pages, pages)  # a backlog: the worker's first transactions take many pages
    with WorkerProcess(kafka, topics, tmp_path, env={"STREAMDEDUP_MAX_PAGE_BYTES": "4096"}) as w:
        out = wait_for_verdicts(kafka, topics, len(pages), timeout=120)
        log = w.log_path.read_text("utf-8", "replace")
    copies = [m.key for m in out["unique"] + out["near"]]
    assert sorted(copies) == sorted(p["url"].encode() for p in pages)
    assert n_verdicts(out) == len(pages) and once_each(out) and not out["dead"]
    assert "refused by the broker" not in log


def test_a_page_sent_with_kcat_is_judged_and_read_back_with_kcat(kafka, tmp_path):
    kcat = shutil.which("kcat")
    assert kcat, "kcat is missing: run deploy/local/install-debian-packages.sh (make install does)"
    topics = StreamTopics.fresh(kafka, partitions=1)
    page = json.dumps(page_record("http://kcat.test/a", "<p>" + "sent by kcat " * 30 + "</p>"))
    with WorkerProcess(kafka, topics, tmp_path):
        subprocess.run(
            [kcat, "-P", "-b", kafka.bootstrap, "-t", topics.pages, "-K", "\t", "-H", "via=kcat"],
            input=f"http://kcat.test/a\t{page}\n".encode(),
            check=True,
            timeout=30,
        )
        out = wait_for_verdicts(kafka, topics, 1)
        read = subprocess.run(
            [
                kcat,
                "-C",
                "-b",
                kafka.bootstrap,
                "-t",
                topics.unique,
                "-e",
                "-o",
                "beginning",
                "-X",
                "isolation.level=read_committed",
                "-f",
                "%k\t%h\t%s\n",
            ],
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout.decode()
    assert out["verdicts"]["http://kcat.test/a"][0]["verdict"] == "unique"
    key, headers, value = read.rstrip("\n").split("\t", 2)
    assert key == "http://kcat.test/a" and value == page
    assert "via=kcat" in headers and "streamdedup-verdict=unique" in headers


def test_the_worker_connects_over_sasl_scram(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=2)
    env = {
        "STREAMDEDUP_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "STREAMDEDUP_SASL_MECHANISM": "SCRAM-SHA-512",
        "STREAMDEDUP_SASL_USERNAME": kafka.sasl_user,
        "STREAMDEDUP_SASL_PASSWORD": kafka.sasl_password,
    }
    a = page_record("http://sasl.test/a", "<p>" + " ".join(f"word{i}" for i in range(300)) + "</p>")
    b = page_record("http://sasl.test/b", "<div>" + a["content"] + "</div>")  # a markup-only copy
    with WorkerProcess(kafka, topics, tmp_path, env=env, brokers=kafka.sasl_bootstrap):
        produce(kafka, topics.pages, [a], kafka.client_kwargs("SCRAM-SHA-512"))
        wait_for_verdicts(kafka, topics, 1)
        produce(kafka, topics.pages, [b], kafka.client_kwargs("SCRAM-SHA-512"))
        out = wait_for_verdicts(kafka, topics, 2)
    assert out["verdicts"]["http://sasl.test/b"][0]["match_id"] == "http://sasl.test/a"


def test_a_clean_stop_snapshots_the_shards_and_a_restart_answers_from_them(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=2)
    waves = make_waves(seed=4, bases=20, waves=2, extra_unique=5)
    worker = WorkerProcess(kafka, topics, tmp_path)
    worker.start()
    try:
        produce(kafka, topics.pages, waves[0])
        wait_for_verdicts(kafka, topics, len(waves[0]))
        assert worker.stop() == 0  # SIGTERM: exits cleanly, writing a snapshot of each shard
        snapshots = sorted((worker.dir / "data" / "snapshots").glob("*.shard"))
        assert [p.name for p in snapshots] == [f"{topics.app_id}-shards-changelog-{i}.shard" for i in range(2)]
        worker.start()
        assert worker.log_path.read_text().count("loaded snapshot of shard") == 2
        produce(kafka, topics.pages, waves[1])
        out = wait_for_verdicts(kafka, topics, len(waves[0]) + len(waves[1]))
    finally:
        worker.__exit__(None, None, None)
    assert once_each(out) and judged(out) == expected_verdicts(waves[0] + waves[1])


def _post_head_only(port: int, content_length: int) -> tuple[int, str]:
    """POST /check's head announcing ``content_length`` bytes, and none of them: the answer's
    status and reason (a worker that waits for the body fails this with the client's timeout)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("POST", "/check")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(content_length))
        conn.endheaders()
        r = conn.getresponse()
        return r.status, json.loads(r.read())["reason"]
    finally:
        conn.close()


def test_post_check_answers_against_stored_pages_without_storing(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=2)
    (wave,) = make_waves(seed=5, bases=10, waves=1)
    fresh = page_record("http://check.test/new", _html(_text(np.random.default_rng(9)), "new"))
    with WorkerProcess(kafka, topics, tmp_path, env={"STREAMDEDUP_MAX_PAGE_BYTES": "8192"}) as w:
        produce(kafka, topics.pages, wave)
        wait_for_verdicts(kafka, topics, len(wave))
        copy = dict(wave[3], url="http://mirror.test/copy")
        copy.pop("fetched_at")  # a check without a time is judged as of now
        assert post_check(w.web_port, json.dumps(copy).encode()) == (
            200,
            {
                "id": "http://mirror.test/copy",
                "url": "http://mirror.test/copy",
                "verdict": "near_duplicate",
                "fingerprint": to_hex(int(fingerprint_contents([(copy["content"], copy["content_type"], None)])[0][0])),
                "cluster": to_hex(fingerprint_contents([(copy["content"], copy["content_type"], None)])[2][0]),
                "match_id": wave[3]["url"],
                "match_url": wave[3]["url"],
                "distance": 0,
            },
        )
        status, body = post_check(w.web_port, json.dumps(fresh).encode())
        assert status == 200 and body["verdict"] == "unique" and body["match_id"] is None
        # the check stored nothing: the same page checked again, or sent, is still unique
        assert (
            post_check(w.web_port, json.dumps(dict(fresh, url="http://check.test/again")).encode())[1]["verdict"]
            == "unique"
        )
        produce(kafka, topics.pages, [dict(fresh, url="http://check.test/sent")])
        out = wait_for_verdicts(kafka, topics, len(wave) + 1)
        assert out["verdicts"]["http://check.test/sent"][0]["verdict"] == "unique"
        # bad input: a 4xx with the reason
        assert post_check(w.web_port, b"{not json") == (
            400,
            {"error": post_check(w.web_port, b"{not json")[1]["error"], "reason": "not_json"},
        )
        assert post_check(w.web_port, json.dumps({"url": "http://x/"}).encode())[1]["reason"] == "missing_field"
        status, body = post_check(w.web_port, json.dumps(page_record("http://big/", "x" * 9000)).encode())
        assert (status, body["reason"]) == (413, "too_large")
        # a Content-Length over the limit is answered before the body: here none is ever sent
        assert _post_head_only(w.web_port, 10_000_000) == (413, "too_large")


def _answered_before_the_body(port: int, body: bytes, wait: float) -> tuple[int, str | None, dict] | None:
    """POST /check's head; the answer (status, Retry-After, JSON) if it comes within ``wait``
    seconds, before the body is sent; else the body is sent, its answer read, and None returned."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /check HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        early = bool(select.select([sock], [], [], wait)[0])
        if not early:
            sock.sendall(body)
        r = http.client.HTTPResponse(sock)
        r.begin()
        answer = (r.status, r.getheader("Retry-After"), json.loads(r.read()))
        return answer if early else None


def test_post_check_beyond_the_limit_is_503_before_the_body(kafka, tmp_path):
    """Checks in progress up to the limit (held by the test hook, CHECK_FAULT_DELAY each): one
    more is answered 503 busy with Retry-After from its head alone, before a body byte is sent."""
    topics = StreamTopics.fresh(kafka, partitions=1)
    env = {"STREAMDEDUP_FINGERPRINT_PROCESSES": "1", FAULT_ENV: "check:id=slow-check"}
    held = json.dumps(page_record("http://slow-check.test/", "<p>a check held in progress</p>")).encode()
    probe = json.dumps(page_record("http://probe.test/", "<p>one check more</p>" * 1000)).encode()
    early: list[tuple[int, str | None, dict]] = []
    with WorkerProcess(kafka, topics, tmp_path, env=env) as w, ThreadPoolExecutor(CHECKS_PER_PROCESS) as pool:
        deadline = time.monotonic() + 120
        while not early and time.monotonic() < deadline:  # a round: the limit held, probes until it ends
            round_ = [pool.submit(post_check, w.web_port, held) for _ in range(CHECKS_PER_PROCESS)]
            while not early and not all(f.done() for f in round_):
                if (answer := _answered_before_the_body(w.web_port, probe, wait=0.5)) is not None:
                    early.append(answer)
            assert all(f.result()[0] in (200, 503) for f in round_)
    assert early, "no check was answered before its body while the limit was held"
    status, retry_after, payload = early[0]
    assert (status, retry_after, payload["reason"]) == (503, "1", "busy")
