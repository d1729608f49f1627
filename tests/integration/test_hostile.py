"""Hostile input on a real broker: every record gets exactly one outcome and no partition stalls.

Each hostile record of issue 15 is produced between valid pages on the same partitions:

* pages whose copy is too large for the output topics (their input headers push them over
  ``max.message.bytes``): dead letters ``too_large_for_topic``, sent truncated since the
  dead-letter topic refuses them too;
* a page over ``--max-page-bytes`` (``too_large``, its dead letter truncated as well), and a
  2 MB page that the topics allow (a verdict and its copy);
* a 700 kB URL (``too_long``), deeply nested JSON (``not_json``), a 5,000-digit integer and
  lone surrogates in the id and the URL (``bad_field``), pages without visible text (``empty``).

The test waits until the worker has committed the pages topic up to its end offsets, then
reads every output topic to its end offsets (read_committed) and counts: each valid page
one verdict and one copy, each hostile record one dead letter with its reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections import Counter, defaultdict

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from stream_harness import StreamTopics, WorkerProcess, page_record, wait_for_verdicts

from streamdedup.pipeline.routing import OUTPUT_OVERHEAD_BYTES, TRUNCATED_BYTES

pytestmark = pytest.mark.kafka

MAX_PAGE = 3_000_000  # --max-page-bytes: the output topics the worker creates take this plus the overhead
PAGES_TOPIC_BYTES = 8_000_000  # the pages topic takes more than the worker judges


def _words(seed: int, n: int = 300) -> str:
    return " ".join(f"w{(seed * 7919 + i * 104729) % 100003}" for i in range(n))


def _valid(i: int) -> dict:
    return page_record(f"http://valid.example/{i}", f"<html><body><p>{_words(i)}</p></body></html>")


def _padded(url: str, size: int) -> bytes:
    """A valid page record of exactly ``size`` bytes."""
    head = json.dumps({"url": url, "content_type": "text/html", "content": "<p>" + _words(zlib.crc32(url.encode()))})
    filler = " pad" * ((size - len(head) - len('</p>"}')) // 4)
    raw = (head[:-2] + filler + '</p>"}').encode()
    return raw + b" " * (size - len(raw))


def _hostile() -> list[tuple[str, bytes, list[tuple[str, bytes]], str | None]]:
    """(name, value, headers, expected dead-letter reason or None for a valid page)."""
    big_header = [("x-crawl-trace", b"t" * 60_000)]  # pushes a page near the limit over the topic's
    near = MAX_PAGE - 20_000
    return [
        ("2mb-page", _padded("http://big.example/2mb", 2_000_000), [], None),
        ("overflow-1", _padded("http://big.example/o1", near), big_header, "too_large_for_topic"),
        ("overflow-2", _padded("http://big.example/o2", near + 5_000), big_header, "too_large_for_topic"),
        ("over-max-page", _padded("http://big.example/huge", MAX_PAGE + 500_000), [], "too_large"),
        (
            "long-url",
            json.dumps({"url": "http://long.example/" + "u" * 700_000, "content": "<p>a long url</p>"}).encode(),
            [],
            "too_long",
        ),
        ("deep-json", b"[" * 200_000 + b"]" * 200_000, [], "not_json"),
        (
            "big-int",
            b'{"url": "http://int.example/", "content": "<p>digits</p>", "n": ' + b"9" * 5000 + b"}",
            [],
            "bad_field",
        ),
        ("surrogate-id", b'{"id": "sur\\ud800", "url": "http://s.example/", "content": "<p>s</p>"}', [], "bad_field"),
        ("surrogate-url", b'{"url": "http://s.example/\\udfff", "content": "<p>s</p>"}', [], "bad_field"),
        (
            "app-shell",
            json.dumps(
                {"url": "http://shell.example/a", "content": "<div id='app'></div><script src='/app.js'></script>"}
            ).encode(),
            [],
            "empty",
        ),
        (
            "nav-only",
            json.dumps(
                {"url": "http://shell.example/b", "content": "<nav>Home</nav><script>start()</script>"}
            ).encode(),
            [],
            "empty",
        ),
    ]


async def _produce(kafka, topic: str, records: list[tuple[int, bytes | None, bytes, list]]) -> None:
    p = AIOKafkaProducer(**kafka.client_kwargs(), max_request_size=20_000_000, linger_ms=0)
    await p.start()
    try:
        for partition, key, value, headers in records:
            await (await p.send(topic, value, key=key, partition=partition, headers=headers or None))
    finally:
        await p.stop()


async def _committed_to_end(kafka, topics: StreamTopics, deadline: float) -> dict[int, int]:
    """Wait until the worker's group has committed every pages partition to its end offset."""
    c = AIOKafkaConsumer(**kafka.client_kwargs(), group_id=None, enable_auto_commit=False)
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await c.start()
    await admin.start()
    try:
        tps = [TopicPartition(topics.pages, p) for p in range(topics.partitions)]
        ends = {tp.partition: off for tp, off in (await c.end_offsets(tps)).items()}
        committed: dict[int, int] = {}
        while time.monotonic() < deadline:
            offsets = await admin.list_consumer_group_offsets(topics.app_id)
            committed = {tp.partition: m.offset for tp, m in offsets.items() if tp.topic == topics.pages}
            if all(committed.get(p, -1) >= e for p, e in ends.items()):
                return committed
            await asyncio.sleep(0.5)
        raise AssertionError(f"pages committed {committed}, end offsets {ends}: a partition stalled")
    finally:
        await admin.close()
        await c.stop()


async def _read_to_end(kafka, names: list[str], partitions: int) -> dict[str, list]:
    """Every committed record of ``names``, read up to their end offsets (read_committed)."""
    c = AIOKafkaConsumer(
        **kafka.client_kwargs(),
        group_id=None,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        enable_auto_commit=False,
        fetch_max_bytes=50_000_000,
        max_partition_fetch_bytes=20_000_000,
    )
    await c.start()
    try:
        tps = [TopicPartition(n, p) for n in names for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        out: dict[str, list] = defaultdict(list)
        deadline = time.monotonic() + 60
        while [tp for tp in tps if await c.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, "could not read the output topics to their end offsets"
            for tp, msgs in (await c.getmany(timeout_ms=500)).items():
                out[tp.topic].extend(msgs)
        return out
    finally:
        await c.stop()


def _http(method: str, url: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_hostile_records_each_get_one_outcome_and_valid_pages_theirs(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=2)
    asyncio.run(_alter_pages_topic(kafka, topics.pages, PAGES_TOPIC_BYTES))
    valid = [_valid(i) for i in range(24)]
    valid.append({**_valid(3), "url": "http://valid.example/3-copy"})  # a near-duplicate of page 3
    hostile = _hostile()
    records: list[tuple[int, bytes | None, bytes, list]] = []
    expected_pages: set[str] = set()
    expected_dead: dict[str, str] = {}
    queue = list(valid)
    for i, (name, value, headers, reason) in enumerate(hostile):
        for partition in (0, 1):  # valid pages between the hostile records, on both partitions
            if queue:
                page = queue.pop(0)
                records.append((partition, page["url"].encode(), json.dumps(page).encode(), []))
                expected_pages.add(page["url"])
        records.append((i % 2, name.encode(), value, headers))
        if reason is None:
            expected_pages.add(json.loads(value)["url"])
        else:
            expected_dead[name] = reason
    for j, page in enumerate(queue):
        records.append((j % 2, page["url"].encode(), json.dumps(page).encode(), []))
        expected_pages.add(page["url"])

    env = {"STREAMDEDUP_MAX_PAGE_BYTES": str(MAX_PAGE), "STREAMDEDUP_FINGERPRINT_PROCESSES": "1"}
    with WorkerProcess(kafka, topics, tmp_path, env=env) as w:
        asyncio.run(_produce(kafka, topics.pages, records))
        asyncio.run(_committed_to_end(kafka, topics, time.monotonic() + 180))
        out = asyncio.run(
            _read_to_end(
                kafka, [topics.verdicts, topics.unique, topics.near_duplicate, topics.dead_letter], topics.partitions
            )
        )
        check_url = f"http://127.0.0.1:{w.web_port}/check"
        checks = {name: _http("POST", check_url, value) for name, value, _, _ in hostile}
        head = _http("HEAD", check_url)
        web = _hostile_web(w.web_port, hostile[0][1])
        log = w.log_path.read_text("utf-8", "replace")

    # every valid page: one verdict and one copy on unique / near-duplicate
    verdicts = Counter(json.loads(m.value)["url"] for m in out[topics.verdicts])
    copies = Counter(json.loads(m.value)["url"] for m in out[topics.unique] + out[topics.near_duplicate])
    assert set(verdicts) == expected_pages, set(verdicts) ^ expected_pages
    assert all(n == 1 for n in verdicts.values()), verdicts
    assert copies == Counter(dict.fromkeys(expected_pages, 1)), copies
    by_url = {json.loads(m.value)["url"]: json.loads(m.value) for m in out[topics.verdicts]}
    assert by_url["http://valid.example/3-copy"]["verdict"] == "near_duplicate"
    assert by_url["http://big.example/2mb"]["verdict"] == "unique"
    big = [m for m in out[topics.unique] if m.key == b"http://big.example/2mb"]
    assert len(big) == 1 and len(big[0].value) == 2_000_000

    # every hostile record: exactly one dead letter with its reason
    dead = Counter()
    for m in out[topics.dead_letter]:
        h = dict(m.headers)
        dead[m.key.decode(), h["streamdedup-reason"].decode()] += 1
        if "streamdedup-truncated" in h:  # the dead-letter topic refused it whole: its head is kept
            assert int(h["streamdedup-truncated"]) > len(m.value)
            assert len(m.value) <= TRUNCATED_BYTES
        for _, v in m.headers:
            v.decode("utf-8")  # strict: never invalid UTF-8 in what the worker writes
    assert dead == Counter({(name, reason): 1 for name, reason in expected_dead.items()}), dead
    for topic in (topics.verdicts, topics.unique, topics.near_duplicate):
        for m in out[topic]:
            (m.key or b"").decode("utf-8")
            for _, v in m.headers:
                v.decode("utf-8")
    assert "Future exception was never retrieved" not in log

    # POST /check: JSON answers for the same bodies, 413 JSON over --max-page-bytes; HEAD answered
    for name, (status, headers, body) in checks.items():
        assert headers.get("Content-Type", "").startswith("application/json"), (name, status, headers)
        payload = json.loads(body)
        reason = expected_dead.get(name)
        if reason in (None, "too_large_for_topic"):  # /check does not send the page anywhere
            assert status == 200 and payload["verdict"] in ("unique", "near_duplicate"), (name, status, payload)
        elif reason == "too_large":
            assert status == 413 and payload["reason"] == "too_large", (name, status, payload)
        else:
            assert status == 400 and payload["reason"] == reason, (name, status, payload)
    assert head[0] == 200 and "POST" in head[1].get("Allow", ""), head

    # the web server's hostile requests (_hostile_web)
    status, headers, body = web["gzip"]
    assert status == 415 and json.loads(body)["reason"] == "unsupported_encoding", web["gzip"]
    assert web["router"][0] == 404 and web["table"][0] == 404, (web["router"][:2], web["table"][:2])
    assert set(web["faust"].values()) == {404}, web["faust"]
    assert web["root"][0] == 200 and json.loads(web["root"][2]) == {"status": "OK"}, web[
        "root"
    ]  # (faust's health answer)
    assert web["stalled"].startswith(b"HTTP/1.1 400") and b'"reason":"bad_request"' in web["stalled"], web["stalled"]
    assert 9 <= web["stalled_seconds"] < 30 and web["all_stalled_answered"], web["stalled_seconds"]
    assert web["busy"][0] == 503 and json.loads(web["busy"][2])["reason"] == "busy", web["busy"]
    assert "partition -1 is not ours" not in log


def _hostile_web(port: int, page: bytes) -> dict:
    """A gzip-compressed check (aiohttp inflated such bodies on the event loop: a 4 MB one, 4 GB);
    faust's debugging pages (/router listed every worker's address and partitions, /table failed
    with a traceback); checks whose bodies stop coming (their connections and buffers were held
    for good, and they did not count against the checks in progress), answered while the
    requests above are made."""
    import gzip
    import socket

    base = f"http://127.0.0.1:{port}"
    out: dict = {}
    stalled = []
    for _ in range(4):  # (the checks one fingerprinting process takes at once: a fifth is busy)
        stalled.append(socket.create_connection(("127.0.0.1", port), timeout=60))
        stalled[-1].sendall(b"POST /check HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + page[:10])
    t0 = time.monotonic()
    while (busy := _http("POST", f"{base}/check", page))[0] != 503 and time.monotonic() - t0 < 5:
        time.sleep(0.05)  # (until the server has taken the four requests in)
    out["busy"] = busy
    request = urllib.request.Request(f"{base}/check", data=gzip.compress(page), method="POST")
    request.add_header("Content-Encoding", "gzip")
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            out["gzip"] = (r.status, dict(r.headers), r.read())
    except urllib.error.HTTPError as e:
        out["gzip"] = (e.code, dict(e.headers), e.read())
    out["router"] = _http("GET", f"{base}/router/")
    out["table"] = _http("GET", f"{base}/table/shards/anything/")
    out["faust"] = {path: _http("GET", f"{base}{path}")[0] for path in ("/assignment/", "/graph/", "/performance/")}
    out["root"] = _http("GET", f"{base}/")
    answers = [c.recv(65536) for c in stalled]
    out["stalled"], out["stalled_seconds"] = answers[0], time.monotonic() - t0
    out["all_stalled_answered"] = all(a.startswith(b"HTTP/1.1 400") for a in answers)
    for c in stalled:
        c.close()
    return out


async def _alter_pages_topic(kafka, topic: str, max_bytes: int) -> None:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": str(max_bytes)})]
        )
    finally:
        await admin.close()


def test_worker_refuses_a_max_page_bytes_its_output_topics_cannot_carry(kafka, tmp_path):
    topics = StreamTopics.fresh(kafka, partitions=1)
    for name in (topics.unique, topics.near_duplicate, topics.dead_letter):
        kafka.create_topic(name, 1, config={"max.message.bytes": "1048588"})  # the broker's default
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDEDUP_")}
    env.update(topics.env())
    env.update(
        {
            "STREAMDEDUP_BROKERS": kafka.bootstrap,
            "STREAMDEDUP_DATA_DIR": str(tmp_path / "data"),
            "STREAMDEDUP_MAX_PAGE_BYTES": str(5 * 1024 * 1024),
        }
    )
    r = subprocess.run(
        [sys.executable, "-m", "streamdedup", "worker"], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0
    assert "max.message.bytes" in r.stderr and "--max-page-bytes" in r.stderr, r.stderr[-2000:]
    assert topics.unique in r.stderr
    assert str(1048588 - OUTPUT_OVERHEAD_BYTES) in r.stderr  # the largest --max-page-bytes that fits


@pytest.mark.parametrize(
    "setting, why",
    [
        ({"STREAMDEDUP_REPLICATION_FACTOR": "3"}, "set --replication-factor / STREAMDEDUP_REPLICATION_FACTOR"),
        ({"STREAMDEDUP_MAX_PAGE_BYTES": "3000000000"}, "use a smaller one"),
    ],
    ids=["replication-factor", "max-page-bytes"],
)
def test_a_topic_the_broker_refuses_to_create_is_named_with_the_broker_s_reason(kafka, tmp_path, setting, why):
    """(The refusal in the broker's answer went unread: the worker failed ~15 s later with "cannot
    read the configuration of topic ...: error 3".)"""
    topics = StreamTopics.fresh(kafka, partitions=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDEDUP_")}
    env.update(topics.env())
    env.update({"STREAMDEDUP_BROKERS": kafka.bootstrap, "STREAMDEDUP_DATA_DIR": str(tmp_path / "data"), **setting})
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "streamdedup", "worker"], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "the broker refused to create topic" in r.stderr and why in r.stderr, r.stderr[-2000:]
    assert time.monotonic() - t0 < 12


def _slow_markup() -> str:
    """One tag with 250,000 attributes (2.2 MB): lexbor parses an element's attributes in time
    quadratic in their count, ~2 minutes here (32,000 of them: 1.7 s)."""
    return "<p " + " ".join(f"a{i}=1" for i in range(250_000)) + ">hello</p>"


def test_a_page_that_takes_minutes_to_parse_is_unparsable_and_holds_nothing_up(kafka, tmp_path):
    """Fingerprinting had no deadline: such a page held its partition, and every page behind it
    in the one pool process, for minutes; and so did a POST /check of it."""
    topics = StreamTopics.fresh(kafka, partitions=1)
    asyncio.run(_alter_pages_topic(kafka, topics.pages, PAGES_TOPIC_BYTES))
    before, after = _valid(11), _valid(12)
    slow = json.dumps(page_record("http://slow.example/", _slow_markup())).encode()
    records = [
        (0, b"before", json.dumps(before).encode(), []),
        (0, b"slow", slow, []),
        (0, b"after", json.dumps(after).encode(), []),
    ]
    with WorkerProcess(kafka, topics, tmp_path) as w:
        t0 = time.monotonic()
        asyncio.run(_produce(kafka, topics.pages, records))
        out = wait_for_verdicts(kafka, topics, 2, timeout=90, dead_letters=1)
        judged = time.monotonic() - t0
        request = urllib.request.Request(f"http://127.0.0.1:{w.web_port}/check", data=slow, method="POST")
        t1 = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        checked = time.monotonic() - t1
        assert w.proc.poll() is None
    assert sorted(out["verdicts"]) == [before["url"], after["url"]]
    (dead,) = out["dead"]
    assert dead.key == b"slow" and dict(dead.headers)["streamdedup-reason"] == b"unparsable"
    assert b"took over" in dict(dead.headers)["streamdedup-error"]
    assert judged < 60, judged  # (the batch's deadline, then the page's own: ~15 s each)
    assert refused.value.code == 400 and json.loads(refused.value.read())["reason"] == "unparsable"
    assert checked < 30, checked


def test_a_header_key_that_is_not_utf8_is_a_dead_letter_not_a_stopped_worker(kafka, tmp_path):
    """Java producers write header keys as Strings; kcat (librdkafka) writes any bytes, and the
    broker keeps them.  aiokafka's parser raised on such a key in faust's fetcher: the worker
    stopped, judged nothing of the fetch, and stopped again at every start."""
    kcat = shutil.which("kcat")
    assert kcat, "kcat is missing: run deploy/local/install-debian-packages.sh (make install does)"
    topics = StreamTopics.fresh(kafka, partitions=1)
    before, after = _valid(1), _valid(2)
    hostile = json.dumps(page_record("http://hostile.example/header", f"<p>{_words(3)}</p>")).encode()

    def kcat_send(key: bytes, value: bytes, header: bytes) -> None:
        argv = [kcat.encode(), b"-b", kafka.bootstrap.encode(), b"-P", b"-t", topics.pages.encode(), b"-p", b"0"]
        subprocess.run([*argv, b"-k", key, b"-H", header], input=value, check=True, timeout=60)

    kcat_send(b"before", json.dumps(before).encode(), b"crawler-run=42")
    kcat_send(b"hostile", hostile, b"\xff\xfe-run=42")
    kcat_send(b"after", json.dumps(after).encode(), b"crawler-run=42")
    with WorkerProcess(kafka, topics, tmp_path) as w:
        out = wait_for_verdicts(kafka, topics, 2, timeout=90, dead_letters=1)
        assert w.proc.poll() is None  # still running
    assert sorted(out["verdicts"]) == [before["url"], after["url"]]
    (dead,) = out["dead"]
    headers = dict(dead.headers)
    assert dead.key == b"hostile" and dead.value == hostile
    assert headers["streamdedup-reason"] == b"not_utf8" and headers["\\xff\\xfe-run"] == b"42"
