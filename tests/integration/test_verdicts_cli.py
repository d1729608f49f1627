"""``streamdedup verdicts`` and the consumers behind it, against the real broker: records written
as the worker writes them (in transactions, with its headers) come out as one line or one JSON
object per page; aborted transactions never show; --max / --timeout stop it; --until-end stops
at the end it had when it started."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from asyncio.subprocess import PIPE
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


# ---------------------------------------------------------------------------- --until-end

#: Seconds each run of the command may take (start, connect, read a few hundred records, stop).
DEADLINE = 60


def _verdict(name: str, partition: int = 0) -> dict:
    return {**VERDICT_X, "id": name, "url": f"http://a/{name}", "partition": partition}


async def _send(kafka, topic: str, names: list[tuple[int, str]], *, abort: bool = False) -> None:
    """One transaction of verdicts ``(partition, id)``, each to its partition."""
    producer = AIOKafkaProducer(**kafka.client_kwargs(), transactional_id=unique_name("txn"))
    await producer.start()
    try:
        await producer.begin_transaction()
        for partition, name in names:
            await producer.send(
                topic, json.dumps(_verdict(name, partition)).encode(), key=name.encode(), partition=partition
            )
        await (producer.abort_transaction() if abort else producer.commit_transaction())
    finally:
        await producer.stop()


def _command(kafka, topic: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamdedup",
        "verdicts",
        "--brokers",
        kafka.bootstrap,
        "--verdicts-topic",
        topic,
        *args,
    ]


def _run(kafka, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(kafka, topic, *args), capture_output=True, text=True, timeout=DEADLINE)


def _ids(stdout: str) -> list[str]:
    return [json.loads(line)["id"] for line in stdout.splitlines()]


#: The committed verdicts of ``ended``, in no particular order across partitions.
ENDED = [f"c{i}" for i in range(20)]


@pytest.fixture(scope="module")
def ended(kafka) -> str:
    """A topic of 4 partitions written in transactions: 20 committed verdicts on partitions 0-2
    (each partition's last record followed by its transaction's commit marker), two aborted
    transactions among them (one the last thing on partition 2), partition 3 empty."""
    topic = kafka.create_topic(unique_name("until-end"), partitions=4)

    async def write():
        await _send(kafka, topic, [(i % 3, ENDED[i]) for i in range(10)])
        await _send(kafka, topic, [(i % 3, f"aborted{i}") for i in range(6)], abort=True)
        await _send(kafka, topic, [(i % 3, ENDED[i]) for i in range(10, 20)])
        await _send(kafka, topic, [(2, "aborted-last")], abort=True)

    asyncio.run(write())
    return topic


def test_until_end_prints_every_committed_record_then_exits(kafka, ended):
    proc = _run(kafka, ended, "--from-beginning", "--until-end", "--format", "json")  # (within DEADLINE)
    assert proc.returncode == 0, proc.stderr
    assert sorted(_ids(proc.stdout)) == sorted(ENDED)  # each once; no aborted one
    assert proc.stderr == ""


def test_until_end_with_max_and_from_the_end(kafka, ended):
    """--max and --until-end: whichever comes first.  Without --from-beginning the end is where
    it starts: nothing to print."""
    three = _run(kafka, ended, "--from-beginning", "--until-end", "--max", "3", "--format", "json")
    assert three.returncode == 0, three.stderr
    assert len(set(_ids(three.stdout)) & set(ENDED)) == 3 and three.stderr == ""

    more = _run(kafka, ended, "--from-beginning", "--until-end", "--max", "1000", "--format", "json")
    assert more.returncode == 0, more.stderr
    assert sorted(_ids(more.stdout)) == sorted(ENDED) and more.stderr == ""

    latest = _run(kafka, ended, "--until-end")
    assert (latest.returncode, latest.stdout, latest.stderr) == (0, "", "")


def test_records_written_after_the_start_are_not_waited_for(kafka):
    """The command takes the ends before it prints its first record; it is held there (its
    output, some 300 kB, fills the pipe the test does not read yet) while more records are
    committed: it exits without them."""
    topic = kafka.create_topic(unique_name("until-end-later"), partitions=2)
    before = [(i % 2, f"b{i}") for i in range(1500)]
    asyncio.run(_send(kafka, topic, before))
    proc = subprocess.Popen(
        _command(kafka, topic, "--from-beginning", "--until-end", "--format", "json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert select.select([proc.stdout], [], [], DEADLINE)[0], "no output"
        first = os.read(proc.stdout.fileno(), 1 << 16)  # (the fd, as communicate() reads: no buffer between)
        assert first and proc.poll() is None  # (held by the full pipe)
        asyncio.run(_send(kafka, topic, [(i % 2, f"later{i}") for i in range(10)]))
        rest, err = proc.communicate(timeout=DEADLINE)
    finally:
        proc.kill()
        proc.wait(DEADLINE)
    assert proc.returncode == 0, err
    assert sorted(_ids((first + rest).decode())) == sorted(name for _, name in before)


def test_an_open_transaction_is_where_the_committed_records_end(kafka):
    """read_committed: a partition's end is its last stable offset, the first record of a
    transaction still open on it; records after it, even committed ones, are past the end (a
    read_committed reader cannot have them yet).  So an open transaction does not hold the
    command: it prints what is committed before it and exits 0, also with --timeout (a timeout
    before the end would exit 1)."""
    topic = kafka.create_topic(unique_name("until-end-open"), partitions=2)

    async def run():
        await _send(kafka, topic, [(0, "p0-before"), (1, "p1-before")])
        holder = AIOKafkaProducer(**kafka.client_kwargs(), transactional_id=unique_name("txn"))
        await holder.start()
        try:
            await holder.begin_transaction()
            await holder.send_and_wait(topic, json.dumps(_verdict("open")).encode(), partition=0)
            await _send(kafka, topic, [(0, "p0-after"), (1, "p1-after")])
            cmd = _command(kafka, topic, "--from-beginning", "--until-end", "--timeout", "2", "--format", "json")
            proc = await asyncio.create_subprocess_exec(*cmd, stdout=PIPE, stderr=PIPE)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), DEADLINE)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            await holder.abort_transaction()
        finally:
            await holder.stop()
        return proc.returncode, out.decode(), err.decode()

    code, out, err = asyncio.run(run())
    assert code == 0, err
    assert sorted(_ids(out)) == ["p0-before", "p1-after", "p1-before"] and err == ""


#: The command, with a consumer whose fetches bring nothing (a broker that stopped serving the
#: records after it answered for their ends).
STALLED = """
import asyncio, sys
from aiokafka import AIOKafkaConsumer

async def getmany(self, *partitions, timeout_ms=0, max_records=None):
    await asyncio.sleep(timeout_ms / 1000)
    return {}

AIOKafkaConsumer.getmany = getmany
from streamdedup.cli import main
main(sys.argv[1:], prog_name="streamdedup")
"""


def test_a_timeout_before_the_end_is_an_error(kafka, ended):
    """--timeout with --until-end: SECONDS without a record before the end exit 1, saying how
    many partitions were not read to their end (3 of 4 here: the fourth is empty, so at its end).
    An open transaction cannot hold the end back (above), so the fetches are made to bring nothing."""
    t0 = time.monotonic()
    flags = ["--from-beginning", "--until-end", "--timeout", "2"]
    proc = subprocess.run(
        [sys.executable, "-c", STALLED, *_command(kafka, ended, *flags)[3:]],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("Error: stopped before the end: 3 of 4 partitions not read to their end after 2 s ")
    assert f"{ended}[0] at offset 0 of " in line and line.endswith("; 0 shown")
    assert 2 <= time.monotonic() - t0 < DEADLINE


def test_records_written_to_a_partition_read_to_its_end_are_left_out(kafka):
    """A fetch returns what a partition holds when it is made: partition 0 (one record) is read
    to its end at once while partition 1 (~6 MB, many fetches) is still being read; records
    committed to partition 0 then are past its end and are not yielded (the library's
    ``read(until_end=True)``, which the command runs)."""
    topic = kafka.create_topic(unique_name("until-end-past"), partitions=2)
    pad = "x" * 600  # (each record ~1 KB: partition 1 takes several fetches of 1 MB)
    asyncio.run(_send(kafka, topic, [(0, "p0-first")] + [(1, f"p1-{i}-{pad}") for i in range(6000)]))

    async def read() -> list[str]:
        got: list[str] = []
        settings = Settings.from_sources({"brokers": kafka.bootstrap, "verdicts_topic": topic}, {})
        async with VerdictConsumer(settings, from_beginning=True) as verdicts:
            async for v in verdicts.read(until_end=True):
                if not got:  # partition 0 is read to its end with the first fetch
                    await _send(kafka, topic, [(0, f"late-{i}") for i in range(20)])
                got.append(v.id)
        return got

    got = asyncio.run(asyncio.wait_for(read(), DEADLINE))
    assert not [g for g in got if g.startswith("late-")], "records written after the start were printed"
    assert sorted(got) == sorted(["p0-first"] + [f"p1-{i}-{pad}" for i in range(6000)])


def test_a_partition_added_mid_read_makes_no_record_read_twice(kafka):
    """A reader without a group holds every partition it found at its start, assigned by hand: a
    subscription without a group got a new assignment when the topic's partitions changed (at
    the next metadata refresh, up to 5 minutes later; forced here), which reset every position,
    and every record was read again."""
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

    topic = kafka.create_topic(unique_name("grown"), partitions=2)
    asyncio.run(_send(kafka, topic, [(i % 2, f"r{i}") for i in range(20)]))

    async def read() -> list[str]:
        settings = Settings.from_sources({"brokers": kafka.bootstrap, "verdicts_topic": topic}, {})
        got: list[str] = []
        async with VerdictConsumer(settings, from_beginning=True) as verdicts:
            async for v in verdicts.read(idle_timeout=3):
                got.append(v.id)
                if len(got) == 20:
                    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
                    await admin.start()
                    try:
                        await admin.create_partitions({topic: NewPartitions(total_count=3)})
                    finally:
                        await admin.close()
                    await verdicts._consumer._client.force_metadata_update()  # (what a refresh does)
                    await _send(kafka, topic, [(0, "after0"), (1, "after1")])
        return got

    got = asyncio.run(asyncio.wait_for(read(), DEADLINE))
    assert sorted(got) == sorted([f"r{i}" for i in range(20)] + ["after0", "after1"]), got
