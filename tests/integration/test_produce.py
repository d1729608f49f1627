"""``streamdedup produce`` against the real broker: JSON lines (plain, gzipped, stdin) and WARC
arrive as the worker's records, keyed by page id; bad records are reported with their place and
not sent; a broker that cannot be reached is a one-line error."""

from __future__ import annotations

import gzip
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka_broker import unique_name  # tests/ is on sys.path (conftest.py)
from topics import read_topic
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from streamdedup.cli import main

pytestmark = pytest.mark.kafka

STREAMDEDUP = str(Path(sys.executable).parent / "streamdedup")
GOOD = [
    {"url": "http://a/1", "content": "<p>one</p>"},
    {
        "url": "http://a/2",
        "content": "<p>zwei – ü</p>",
        "id": "page-2",
        "content_type": "text/html",
        "fetched_at": "2026-03-01T10:00:00Z",
    },
    {"url": "http://a/3", "content": "plain three", "content_type": "text/plain", "crawl_depth": 3},
]
BAD_LINES = {  # line -> reason
    b"{not json": "not_json",
    b'{"url": "http://a/4"}': "missing_field",
    b'{"url": "http://a/5", "content": "x", "content_type": "image/png"}': "not_text",
    b'{"url": "http://a/6", "content": "x", "fetched_at": "yesterday"}': "bad_field",
    json.dumps({"url": "http://a/7", "content": "x" * 3000}).encode(): "too_large",  # --max-page-bytes 2048
}


def _produce(kafka, topic: str, *args: str):
    return CliRunner().invoke(
        main,
        ["produce", *args, "--brokers", kafka.bootstrap, "--pages-topic", topic, "--max-page-bytes", "2048"],
        catch_exceptions=False,
    )


def _expected(record: dict) -> tuple[bytes, dict]:
    return (record.get("id") or record["url"]).encode(), record  # (JSON lines go as they are, extra fields too)


def test_jsonl_plain_and_gzipped(kafka, tmp_path):
    topic = kafka.create_topic(unique_name("produce-jsonl"), partitions=3)
    plain = tmp_path / "a.jsonl"
    lines = [json.dumps(GOOD[0]).encode(), b"", *BAD_LINES, json.dumps(GOOD[1], ensure_ascii=False).encode()]
    plain.write_bytes(b"\n".join(lines) + b"\n")
    zipped = tmp_path / "b.jsonl.gz"
    zipped.write_bytes(gzip.compress(json.dumps(GOOD[2]).encode() + b"\n"))

    result = _produce(kafka, topic, str(plain), str(zipped), "--progress")
    assert result.exit_code == 0, result.stderr

    records = read_topic(kafka, topic)
    assert {r.key: r.value for r in records} == {key: lines[i] for i, key in ((0, b"http://a/1"), (-1, b"page-2"))} | {
        b"http://a/3": json.dumps(GOOD[2]).encode()
    }  # byte for byte
    assert len({r.partition for r in records}) > 1 or len(records) < 3  # keyed, so spread over partitions
    # each bad record reported with its line number and reason; the blank line 2 is not a record
    for number, (raw, reason) in enumerate(BAD_LINES.items(), start=3):
        assert f"{plain}: line {number}: skipped: {reason}: " in result.stderr, (raw, result.stderr)
    size = sum(len(r.value) for r in records)
    assert re.search(
        rf"^sent 3 pages \({size:,} bytes\) to '{topic}' in \d+\.\d s; skipped 5 bad records "
        r"\(1 not_json, 1 missing_field, 1 not_text, 1 bad_field, 1 too_large\)$",
        result.stderr,
        re.M,
    ), result.stderr
    assert " pages [" in result.stderr  # the progress bar


def _warc(path: Path) -> None:
    with path.open("wb") as out:
        writer = WARCWriter(out, gzip=True)

        def response(url: str, ctype: str, body: bytes) -> None:
            http = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            writer.write_record(
                writer.create_warc_record(
                    url,
                    "response",
                    payload=io.BytesIO(body),
                    http_headers=http,
                    warc_headers_dict={"WARC-Date": "2026-03-01T10:00:00Z"},
                )
            )

        # Latin-1 whose <meta> lies: only the HTTP header's charset gives "café crème".
        response(
            "http://a/cafe",
            "text/html; charset=ISO-8859-1",
            '<meta charset="windows-1251"><p>café crème</p>'.encode("latin-1"),
        )
        writer.write_record(
            writer.create_warc_record("http://a/cafe", "request", payload=io.BytesIO(b"GET / HTTP/1.1\r\n\r\n"))
        )
        response("http://a/ru", "text/html; charset=KOI8-R", "<p>привет мир</p>".encode("koi8-r"))
        response("http://a/logo.png", "image/png", b"\x89PNG\r\n\x1a\n" + bytes(32))
        response("http://a/empty", "text/html", b"")
        response("http://a/fake", "text/html; charset=utf-8", b"\x89PNG\r\n\x1a\n" + bytes(32))


def test_warc(kafka, tmp_path):
    topic = kafka.create_topic(unique_name("produce-warc"))
    path = tmp_path / "crawl.warc.gz"
    _warc(path)

    result = _produce(kafka, topic, str(path), "--no-progress")
    assert result.exit_code == 0, result.stderr
    got = {r.key: json.loads(r.value) for r in read_topic(kafka, topic)}
    assert got == {
        b"http://a/cafe": {
            "url": "http://a/cafe",
            "content": '<meta charset="windows-1251"><p>café crème</p>',
            "content_type": "text/html",
            "fetched_at": "2026-03-01T10:00:00Z",
            "id": "http://a/cafe",
        },
        b"http://a/ru": {
            "url": "http://a/ru",
            "content": "<p>привет мир</p>",
            "content_type": "text/html",
            "fetched_at": "2026-03-01T10:00:00Z",
            "id": "http://a/ru",
        },
    }
    # WARC records are numbered from 1 (warcinfo-less file: the request record is number 2)
    for number, reason in ((4, "not_text"), (5, "empty"), (6, "binary")):
        assert f"{path}: record {number}: skipped: {reason}: " in result.stderr, result.stderr
    assert "sent 2 pages" in result.stderr and "skipped 3 bad records" in result.stderr
    assert " pages [" not in result.stderr  # --no-progress


def test_stdin(kafka):
    topic = kafka.create_topic(unique_name("produce-stdin"))
    lines = b"".join(json.dumps(r).encode() + b"\n" for r in GOOD) + b"[1, 2]\n"
    proc = subprocess.run(
        [STREAMDEDUP, "produce", "-", "--brokers", kafka.bootstrap, "--pages-topic", topic],
        input=lines,
        capture_output=True,
        timeout=60,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert sorted((r.key, json.loads(r.value)) for r in read_topic(kafka, topic)) == sorted(map(_expected, GOOD))
    assert "stdin: line 4: skipped: not_object: " in stderr
    assert "sent 3 pages" in stderr and "skipped 1 bad records (1 not_object)" in stderr
    assert " pages [" not in stderr  # stderr is not a terminal: no progress bar


@pytest.mark.parametrize("command", [["produce", "{file}"], ["verdicts", "--from-beginning", "--timeout", "1"]])
def test_unreachable_broker_is_a_one_line_error(command, tmp_path):
    pages = tmp_path / "pages.jsonl"
    pages.write_text(json.dumps(GOOD[0]) + "\n")
    t0 = time.monotonic()
    proc = subprocess.run(
        [STREAMDEDUP, *(a.format(file=pages) for a in command), "--brokers", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - t0 < 20
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("Error: cannot connect to Kafka at 127.0.0.1:1 (") and "Connect call failed" in line
    assert line.endswith("check --brokers / STREAMDEDUP_BROKERS, that the broker is running, and the security settings")
    assert proc.stdout == ""


def test_bad_arguments(tmp_path):
    missing = CliRunner().invoke(main, ["produce", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    bad_broker = CliRunner().invoke(main, ["produce", "-", "--brokers", "nohost"])
    assert bad_broker.exit_code == 2
    assert "--brokers / STREAMDEDUP_BROKERS: 'nohost' is not host:port" in bad_broker.stderr


def test_sasl_settings_from_flags_and_environment(kafka, tmp_path):
    pages = tmp_path / "pages.jsonl"
    pages.write_text(json.dumps(GOOD[0]) + "\n")
    topic = kafka.create_topic(unique_name("produce-sasl"))
    command = [
        STREAMDEDUP,
        "produce",
        str(pages),
        "--brokers",
        kafka.sasl_bootstrap,
        "--pages-topic",
        topic,
        "--security-protocol",
        "SASL_PLAINTEXT",
        "--sasl-mechanism",
        "SCRAM-SHA-512",
    ]
    env = {"PATH": "/usr/bin:/bin", "STREAMDEDUP_SASL_USERNAME": kafka.sasl_user}

    wrong = subprocess.run(
        command, env={**env, "STREAMDEDUP_SASL_PASSWORD": "wrong"}, capture_output=True, text=True, timeout=60
    )
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1, wrong.stderr
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in wrong.stderr

    right = subprocess.run(
        command,
        env={**env, "STREAMDEDUP_SASL_PASSWORD": kafka.sasl_password},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert right.returncode == 0, right.stderr
    assert [r.key for r in read_topic(kafka, topic)] == [b"http://a/1"]


def test_the_client_raises_when_a_page_it_queued_could_not_be_delivered(kafka):
    """The documented pattern awaits ``send`` (queued) but not the delivery: a delivery the broker
    refused left ``async with`` quietly, and the page was lost without a sign."""
    import asyncio

    from streamdedup.client import PageProducer
    from streamdedup.errors import ClientError
    from streamdedup.settings import Settings

    topic = kafka.create_topic(unique_name("small"), partitions=1, config={"max.message.bytes": "2000"})
    settings = Settings.from_sources({}, {"STREAMDEDUP_BROKERS": kafka.bootstrap, "STREAMDEDUP_PAGES_TOPIC": topic})
    page = {"url": "http://big.test/", "content": "<p>" + "words " * 2000 + "</p>"}

    async def send() -> PageProducer:
        async with PageProducer(settings) as producer:
            await producer.send(page)
        return producer

    with pytest.raises(ClientError, match="1 pages could not be delivered"):
        asyncio.run(send())
    assert read_topic(kafka, topic) == []


def test_a_corrupt_gzip_is_a_one_line_error(kafka, tmp_path):
    """(zlib's error was not caught: a traceback.)"""
    from test_scan import _damaged_gzip

    topic = kafka.create_topic(unique_name("corrupt"), partitions=1)
    src = tmp_path / "pages.jsonl.gz"
    _damaged_gzip(src, "corrupt")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamdedup",
            "produce",
            str(src),
            "--brokers",
            kafka.bootstrap,
            "--pages-topic",
            topic,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"{src}: cannot be read after line" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_warc_cut_short_is_reported_and_exits_with_an_error(kafka, tmp_path):
    from test_client import warc

    topic = kafka.create_topic(unique_name("cut-warc"), partitions=1)
    full = warc(
        ("http://a/1", "text/html", b"<p>" + b"one page of words " * 20 + b"</p>"),
        ("http://a/2", "text/html", b"<p>" + b"two " * 500 + b"</p>"),
        gzip=False,
    ).getvalue()
    src = tmp_path / "crawl.warc"
    src.write_bytes(full[: len(full) - 1000])
    result = CliRunner().invoke(main, ["produce", str(src), "--brokers", kafka.bootstrap, "--pages-topic", topic])
    assert result.exit_code == 1
    assert "ends before its Content-Length" in result.output and "damaged or cut short" in result.output
    assert [r.key for r in read_topic(kafka, topic)] == [b"http://a/1"]


def test_a_warc_gz_cut_short_on_stdin_is_reported_and_exits_with_an_error(kafka):
    """A pipe cannot be measured: the tail a truncated gzip member hid was lost without a word
    (exit 0), and some cuts made warcio raise (a traceback)."""
    from test_client import warc

    topic = kafka.create_topic(unique_name("cut-warc-stdin"), partitions=1)
    full = warc(
        ("http://a/1", "text/html", b"<p>" + b"one page of words " * 20 + b"</p>"),
        ("http://a/2", "text/html", b"<p>" + b"two " * 500 + b"</p>"),
        ("http://a/3", "text/html", b"<p>" + b"three and more " * 300 + b"</p>"),
    ).getvalue()
    third = full.index(b"\x1f\x8b", 1 + full.index(b"\x1f\x8b", 1))  # where the third record's gzip member starts
    result = subprocess.run(
        [STREAMDEDUP, "produce", "-", "--input-format", "warc", "--brokers", kafka.bootstrap, "--pages-topic", topic],
        input=full[: third + 12],  # its gzip header and the first bytes of its data
        capture_output=True,
        timeout=60,
    )
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert "bad_warc" in stderr and "damaged or cut short" in stderr and "Traceback" not in stderr, stderr
    assert [r.key for r in read_topic(kafka, topic)] == [b"http://a/1", b"http://a/2"]


@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "jsonl.gz"])
def test_a_pipe_given_as_a_path_is_sent_whole(kafka, tmp_path, gz):
    """``produce <(zcat pages.jsonl.gz)``: the path was opened once to look at two bytes (8 KiB
    read and thrown away) and again to read it: pages lost with exit 0."""
    import os
    import threading

    topic = kafka.create_topic(unique_name("produce-fifo"), partitions=1)
    pages = [{"url": f"http://fifo.example/{i}", "content": f"<p>page {i} {'word ' * 40}</p>"} for i in range(300)]
    data = b"".join(json.dumps(p).encode() + b"\n" for p in pages)
    fifo = tmp_path / "pages"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(gzip.compress(data) if gz else data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    proc = subprocess.run(
        [STREAMDEDUP, "produce", str(fifo), "--brokers", kafka.bootstrap, "--pages-topic", topic],
        capture_output=True,
        timeout=120,
    )
    writer.join(10)
    assert proc.returncode == 0, proc.stderr.decode()
    assert [r.key for r in read_topic(kafka, topic)] == [p["url"].encode() for p in pages]


def test_json_lines_sent_as_a_warc_are_an_error_not_zero_pages(kafka, tmp_path):
    """(``--input-format warc`` on JSON lines: "sent 0 pages", exit 0.)"""
    topic = kafka.create_topic(unique_name("produce-not-warc"), partitions=1)
    src = tmp_path / "pages.jsonl"
    src.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in GOOD))
    proc = subprocess.run(
        [
            STREAMDEDUP,
            "produce",
            str(src),
            "--input-format",
            "warc",
            "--brokers",
            kafka.bootstrap,
            "--pages-topic",
            topic,
        ],
        capture_output=True,
        timeout=60,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    assert "bad_warc" in stderr and "not a WARC (JSON lines? then --input-format jsonl)" in stderr


def test_a_pages_topic_that_does_not_exist_is_an_error_and_is_not_created(kafka, tmp_path):
    """(Asking for its partitions made the broker create it with its own default partition count,
    and the worker then refused to start on it: "has 1 partitions but --partitions is 8".)"""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    topic = unique_name("never-created")
    src = tmp_path / "pages.jsonl"
    src.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in GOOD))
    proc = subprocess.run(
        [STREAMDEDUP, "produce", str(src), "--brokers", kafka.bootstrap, "--pages-topic", topic],
        capture_output=True,
        timeout=60,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    assert f"topic {topic!r} does not exist; start the worker, which creates its topics" in stderr

    async def topics() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            return await admin.list_topics()
        finally:
            await admin.close()

    # (the old check waited for the topic's partitions: an auto-created topic showed before it returned)
    assert topic not in asyncio.run(topics())
