"""``streamdedup verdicts`` and the consumers behind it, against the real broker: records written
as the worker writes them (in transactions, with its headers) come out as one line or one JSON
object per page; aborted transactions never show; --max / --timeout stop it."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaProducer
from click.testing import CliRunner
from kafka_broker import unique_name  # tests/ is on sys.path (conftest.py)

from streamdedup.cli import main
from streamdedup.crawler.client import VerdictConsumer
from streamdedup.settings import Settings

pytestmark = pytest.mark.kafka

FP_X, FP_Y = "0123456789abcdef", "0123456789abcdee"
CLUSTER = "00000000000000c1"
PAGE_X = json.dumps({"url": "http://a/x", "content": "<p>x</p>"}).encode()
PAGE_Y = json.dumps({"url": "http://a/y", "content": "<p>x!</p>"}).encode()
VERDICT_X = {
    "id": "http://a/x",
    "url": "http://a/x",
    "verdict": "unique",
    "fingerprint": FP_X,
    "match_id": None,
    "match_url": None,
    "distance": None,
    "partition": 0,
    "offset": 0,
    "cluster": CLUSTER,
}
VERDICT_Y = {
    "id": "http://a/y",
    "url": "http://a/y",
    "verdict": "near_duplicate",
    "fingerprint": FP_Y,
    "match_id": "http://a/x",
    "match_url": "http://a/x",
    "distance": 1,
    "partition": 0,
    "offset": 1,
    "cluster": CLUSTER,
}


@dataclass
class Topics:
    verdicts: str
    unique: str
    near: str
    dead: str

    def flags(self, kafka) -> list[str]:
        return [
            "--brokers",
            kafka.bootstrap,
            "--verdicts-topic",
            self.verdicts,
            "--unique-topic",
            self.unique,
            "--near-duplicate-topic",
            self.near,
            "--dead-letter-topic",
            self.dead,
        ]


async def _transaction(kafka, messages: list[tuple[str, bytes, bytes, list]], *, abort: bool = False) -> None:
    producer = AIOKafkaProducer(**kafka.client_kwargs(), transactional_id=unique_name("txn"))
    await producer.start()
    try:
        await producer.begin_transaction()
        for topic, key, value, headers in messages:
            await producer.send(topic, value, key=key, headers=headers)
        await (producer.abort_transaction() if abort else producer.commit_transaction())
    finally:
        await producer.stop()


def _write(kafka, messages, *, abort: bool = False) -> None:
    asyncio.run(_transaction(kafka, messages, abort=abort))


@pytest.fixture(scope="module")
def topics(kafka) -> Topics:
    """Two pages judged as the worker would: x unique, y its near-duplicate; one dead letter;
    and an aborted transaction that no reader may show."""
    t = Topics(*(kafka.create_topic(unique_name(n)) for n in ("verdicts", "unique", "near", "dead")))
    upstream = ("crawler-run", b"run-7")  # an input header, passed through by the worker
    _write(
        kafka,
        [
            (t.verdicts, b"http://a/x", json.dumps(VERDICT_X).encode(), []),
            (
                t.unique,
                b"http://a/x",
                PAGE_X,
                [
                    upstream,
                    ("streamdedup-verdict", b"unique"),
                    ("streamdedup-fingerprint", FP_X.encode()),
                    ("streamdedup-cluster", CLUSTER.encode()),
                ],
            ),
            (t.verdicts, b"http://a/y", json.dumps(VERDICT_Y).encode(), []),
            (
                t.near,
                b"http://a/y",
                PAGE_Y,
                [
                    upstream,
                    ("streamdedup-verdict", b"near_duplicate"),
                    ("streamdedup-fingerprint", FP_Y.encode()),
                    ("streamdedup-match-id", b"http://a/x"),
                    ("streamdedup-match-url", b"http://a/x"),
                    ("streamdedup-distance", b"1"),
                ],
            ),
            (
                t.dead,
                b"k1",
                b"{oops",
                [
                    ("streamdedup-reason", b"not_json"),
                    ("streamdedup-error", b"the record is not JSON (Expecting value)"),
                ],
            ),
        ],
    )
    _write(
        kafka,
        [(t.verdicts, b"http://a/z", json.dumps({**VERDICT_X, "id": "z", "url": "http://a/z"}).encode(), [])],
        abort=True,
    )
    return t


def _verdicts(kafka, topics: Topics, *args: str):
    result = CliRunner().invoke(
        main, ["verdicts", *topics.flags(kafka), "--from-beginning", *args], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    return result


def test_human_lines_and_aborted_transactions_never_show(kafka, topics):
    t0 = time.monotonic()
    result = _verdicts(kafka, topics, "--timeout", "1.5")
    assert result.stdout.splitlines() == ["unique          http://a/x", "near_duplicate  d=1  http://a/y  ~ http://a/x"]
    assert result.stderr == "stopped after 1.5 s without a new record (2 shown)\n"
    assert 1.5 <= time.monotonic() - t0 < 15


def test_json_and_max(kafka, topics):
    result = _verdicts(kafka, topics, "--format", "json", "--max", "1")
    assert [json.loads(line) for line in result.stdout.splitlines()] == [VERDICT_X]
    assert result.stderr == ""  # --max reached: nothing to say


def test_output_topics_show_the_headers(kafka, topics):
    near = _verdicts(kafka, topics, "--topic", "near-duplicate", "--max", "1")
    assert near.stdout == f"near_duplicate  d=1  http://a/y  ~ http://a/x  fp={FP_Y}\n"

    unique = _verdicts(kafka, topics, "--topic", "unique", "--format", "json", "--max", "1")
    [record] = [json.loads(line) for line in unique.stdout.splitlines()]
    assert record == {
        "topic": topics.unique,
        "partition": 0,
        "offset": 0,
        "key": "http://a/x",
        "url": "http://a/x",
        "verdict": "unique",
        "fingerprint": FP_X,
        "match_id": None,
        "match_url": None,
        "distance": None,
        "cluster": CLUSTER,
        "reason": None,
        "error": None,
        "value_bytes": len(PAGE_X),
        "headers": {
            "crawler-run": "run-7",
            "streamdedup-verdict": "unique",
            "streamdedup-fingerprint": FP_X,
            "streamdedup-cluster": CLUSTER,
        },
    }

    dead = _verdicts(kafka, topics, "--topic", "dead-letter", "--max", "1")
    assert dead.stdout == "not_json        k1  the record is not JSON (Expecting value)\n"


def test_missing_topic_is_a_one_line_error(kafka, topics):
    result = CliRunner().invoke(
        main,
        ["verdicts", "--brokers", kafka.bootstrap, "--verdicts-topic", unique_name("no-such-topic"), "--timeout", "1"],
    )
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: topic 'no-such-topic-") and "does not exist" in line


def test_consumer_from_latest_and_as_a_group(kafka):
    topic = kafka.create_topic(unique_name("verdicts"))
    _write(kafka, [(topic, v["id"].encode(), json.dumps(v).encode(), []) for v in (VERDICT_X, VERDICT_Y)])
    settings = Settings.from_sources({"brokers": kafka.bootstrap, "verdicts_topic": topic}, {})
    later = {**VERDICT_X, "id": "w", "url": "http://a/w", "offset": 5}
    group = unique_name("verdict-readers")

    async def run():
        async with VerdictConsumer(settings, group_id=group, from_beginning=True) as first:
            old = [v.url async for v in first.read(max_records=2, idle_timeout=15)]  # commits at stop
        async with VerdictConsumer(settings) as latest:  # new records only
            await _transaction(kafka, [(topic, b"w", json.dumps(later).encode(), [])])
            new = [v.url async for v in latest.read(max_records=1, idle_timeout=15)]
        async with VerdictConsumer(settings, group_id=group, from_beginning=True) as again:  # resumes
            resumed = [v.offset async for v in again.read(max_records=1, idle_timeout=15)]
        return old, new, resumed

    assert asyncio.run(run()) == (["http://a/x", "http://a/y"], ["http://a/w"], [5])


def test_records_other_producers_may_write_are_shown_not_a_traceback(kafka):
    """A header without a value (Kafka allows it; the worker copies the input's headers onto its
    outputs), a record without a value, a distance that is no number, a verdicts record nested
    past the parser's limit: each raised out of ``verdicts`` (AttributeError, TypeError,
    ValueError, RecursionError)."""
    unique, verdicts = kafka.create_topic(unique_name("odd-unique")), kafka.create_topic(unique_name("odd-verdicts"))
    _write(
        kafka,
        [
            (unique, b"a", PAGE_X, [("crawler-run", None), ("streamdedup-verdict", b"unique")]),
            (unique, b"b", None, [("streamdedup-verdict", b"unique")]),
            (unique, b"c", PAGE_Y, [("streamdedup-verdict", b"near_duplicate"), ("streamdedup-distance", b"two")]),
            (verdicts, b"d", b"[" * 100_000 + b"]" * 100_000, []),
        ],
    )
    flags = ["verdicts", "--brokers", kafka.bootstrap, "--unique-topic", unique, "--from-beginning", "--timeout", "2"]
    human = CliRunner().invoke(main, [*flags, "--topic", "unique"])
    assert human.exit_code == 0, human.stderr
    assert human.stdout.splitlines() == [
        "unique          http://a/x  fp=None",
        "unique          b  fp=None",
        "near_duplicate  http://a/y  fp=None",
    ]
    as_json = CliRunner().invoke(main, [*flags, "--topic", "unique", "--format", "json"])
    assert as_json.exit_code == 0, as_json.stderr
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert records[0]["headers"] == {"crawler-run": "", "streamdedup-verdict": "unique"}
    assert [(r["value_bytes"], r["distance"]) for r in records] == [(len(PAGE_X), None), (0, None), (len(PAGE_Y), None)]
    deep = CliRunner().invoke(
        main,
        ["verdicts", "--brokers", kafka.bootstrap, "--verdicts-topic", verdicts, "--from-beginning", "--timeout", "2"],
    )
    assert deep.exit_code == 1 and "Traceback" not in deep.stderr
    [line] = deep.stderr.splitlines()
    assert "offset 0 is not a verdict (JSON nested too deeply)" in line


@pytest.mark.parametrize("seconds", ["nan", "inf"])
def test_a_timeout_that_is_no_number_of_seconds_is_refused(seconds):
    """(click's FloatRange took them: a wait that never ends.)"""
    result = CliRunner().invoke(main, ["verdicts", "--brokers", "127.0.0.1:1", "--timeout", seconds])
    assert result.exit_code == 2 and "is not a number of seconds; use e.g. 10" in result.stderr


def test_every_page_is_one_line_and_a_full_disk_is_one_error(kafka, tmp_path):
    """A URL with a line end (the worker takes any string) printed two lines for one page, or a
    forged one; a dead letter nested past the JSON parser's limit (the worker dead-letters such
    records) stopped ``--format json`` with a RecursionError; a full disk was a traceback."""
    import subprocess
    import sys

    verdicts, dead = kafka.create_topic(unique_name("lines-verdicts")), kafka.create_topic(unique_name("lines-dead"))
    forged = {**VERDICT_X, "url": "http://a/x\nnear_duplicate  d=0  http://evil/\x1b[2J"}
    _write(
        kafka,
        [
            (verdicts, b"x", json.dumps(forged).encode(), []),
            (dead, b"deep", b"[" * 100_000 + b"]" * 100_000, [("streamdedup-reason", b"not_json")]),
        ],
    )
    flags = [
        "--brokers",
        kafka.bootstrap,
        "--verdicts-topic",
        verdicts,
        "--dead-letter-topic",
        dead,
        "--from-beginning",
    ]
    human = CliRunner().invoke(main, ["verdicts", *flags, "--max", "1"])
    assert human.exit_code == 0, human.stderr
    assert human.stdout.splitlines() == ["unique          http://a/x\\nnear_duplicate  d=0  http://evil/\\x1b[2J"]
    deep = CliRunner().invoke(main, ["verdicts", *flags, "--topic", "dead-letter", "--format", "json", "--max", "1"])
    assert deep.exit_code == 0, deep.stderr
    assert json.loads(deep.stdout)["reason"] == "not_json" and json.loads(deep.stdout)["url"] is None
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "streamdedup", "verdicts", *flags, "--max", "1"],
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"cannot write to standard output (No space left on device)" in proc.stderr
