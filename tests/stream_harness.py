"""Run real ``streamdedup worker`` processes against the test broker, feed them, read what they wrote.

    topics = StreamTopics.fresh(kafka, partitions=4)
    with WorkerProcess(kafka, topics, tmp_path) as w:    # waits for "Worker: Ready"
        produce(kafka, topics.pages, [page_record(...), ...])
        verdicts = wait_for_verdicts(kafka, topics, n=10)   # read_committed, by page id

Each test gets its own topics and consumer group (``StreamTopics.fresh``), so tests do not see
each other's pages.  A worker is a subprocess with its own web port and data dir; ``kill()``
sends SIGKILL, ``stop()`` SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from kafka_broker import free_ports, unique_name

__all__ = [
    "StreamTopics",
    "WorkerProcess",
    "produce",
    "produce_and_kill",
    "read_all",
    "read_to_end",
    "wait_for_verdicts",
    "wait_until_committed",
    "wait_for_group",
    "page_record",
]

READY = "[^Worker]: Ready"


@dataclass(frozen=True)
class StreamTopics:
    app_id: str
    pages: str
    unique: str
    near_duplicate: str
    verdicts: str
    dead_letter: str
    partitions: int

    @classmethod
    def fresh(cls, kafka, partitions: int = 4) -> StreamTopics:
        base = unique_name("sd")
        t = cls(
            base,
            f"{base}.pages",
            f"{base}.unique",
            f"{base}.near-duplicate",
            f"{base}.verdicts",
            f"{base}.dead-letter",
            partitions,
        )
        kafka.create_topic(t.pages, partitions)
        return t

    def env(self) -> dict[str, str]:
        return {
            "STREAMDEDUP_APP_ID": self.app_id,
            "STREAMDEDUP_PAGES_TOPIC": self.pages,
            "STREAMDEDUP_UNIQUE_TOPIC": self.unique,
            "STREAMDEDUP_NEAR_DUPLICATE_TOPIC": self.near_duplicate,
            "STREAMDEDUP_VERDICTS_TOPIC": self.verdicts,
            "STREAMDEDUP_DEAD_LETTER_TOPIC": self.dead_letter,
            "STREAMDEDUP_PARTITIONS": str(self.partitions),
        }


class WorkerProcess:
    def __init__(
        self,
        kafka,
        topics: StreamTopics,
        workdir: Path,
        name: str = "w",
        env: dict | None = None,
        brokers: str | None = None,
    ) -> None:
        self.kafka, self.topics, self.name = kafka, topics, name
        self.dir = Path(workdir) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "worker.log"
        self.web_port = free_ports(1)[0]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDEDUP_")}
        self.env.update(topics.env())
        self.env.update(
            {
                "STREAMDEDUP_BROKERS": brokers or kafka.bootstrap,
                "STREAMDEDUP_WEB_PORT": str(self.web_port),
                "STREAMDEDUP_DATA_DIR": str(self.dir / "data"),
                "STREAMDEDUP_BATCH_TIMEOUT": "0.05",
                # a stop stuck on an offsets request (docs/faust-notes.md §11) ends within stop()'s 60 s
                "STREAMDEDUP_STOP_TIMEOUT": "45",
            }
        )
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self._log = None

    def launch(self) -> int:
        """Start the worker process without waiting for it; returns the log's size before it."""
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "ab")
        start = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamdedup", "worker"],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
        )
        return start

    def start(self, timeout: float = 60.0) -> WorkerProcess:
        start = self.launch()
        try:
            self.wait_for_log(READY, timeout, since=start)
        except BaseException:  # never leave a worker running after a failed start (no __exit__ follows)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            raise
        return self

    def wait_for_log(self, text: str, timeout: float, since: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log_path.read_bytes()[since:].decode("utf-8", "replace"):
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.1)
        raise AssertionError(f"worker {self.name}: no {text!r} within {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text("utf-8", "replace").splitlines()[-lines:])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 60.0) -> int:
        # 60 s: under load, faust's shutdown can wait on an offsets request that a rebalance callback
        # made (aiokafka's request timeout is 40 s); the worker's stop deadline (45 s here) ends it
        # with exit code 75, and a worker that has not stopped by 60 s fails the test.
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"worker {self.name} did not stop on SIGTERM within {timeout}s:\n{self.log_tail()}")

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.stop()
        finally:
            if self._log:
                self._log.close()


def page_record(url: str, content: str, fetched_at: str | None = None, **extra: Any) -> dict:
    rec = {"url": url, "content": content, "content_type": "text/html"}
    if fetched_at is not None:
        rec["fetched_at"] = fetched_at
    rec.update(extra)
    return rec


def produce(
    kafka, topic: str, records: list, client_kwargs: dict | None = None, partitions: list | None = None
) -> None:
    """Send records in one burst: a dict becomes JSON keyed by its id or url; a (key, value[,
    headers]) tuple is sent as it is (raw bytes, for bad input).  ``partitions``: the partition
    of each record (default: by key)."""

    async def run() -> None:
        p = AIOKafkaProducer(**(client_kwargs or kafka.client_kwargs()), max_request_size=20_000_000)
        await p.start()
        try:
            for i, r in enumerate(records):
                part = partitions[i] if partitions is not None else None
                if isinstance(r, dict):
                    key = (r.get("id") or r["url"]).encode()
                    await p.send(topic, json.dumps(r).encode(), key=key, partition=part)
                else:
                    await p.send(topic, r[1], key=r[0], headers=list(r[2]) if len(r) > 2 else None, partition=part)
            await p.flush()
        finally:
            await p.stop()

    asyncio.run(run())


def committed_reader(kafka, *topics: str) -> AIOKafkaConsumer:
    """A consumer (not started) of ``topics``' committed records from the beginning, in no group."""
    return AIOKafkaConsumer(
        *topics,
        **kafka.client_kwargs(),
        group_id=None,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        enable_auto_commit=False,
        metadata_max_age_ms=1000,
    )


def produce_and_kill(
    kafka,
    topics: StreamTopics,
    worker: WorkerProcess,
    records: list,
    after: int,
    partitions: list | None = None,
    timeout: float = 90.0,
) -> int:
    """Produce ``records`` in one burst and SIGKILL ``worker`` as soon as ``after`` verdicts are
    committed (counting those of earlier pages); returns how many were committed when the kill
    was sent.

    The verdicts are watched by a consumer that is reading before the first page is sent, so the
    kill follows the ``after``-th verdict within one poll (50 ms), not after a consumer's start-up:
    a fast worker would judge a few hundred pages in that time and the kill would land after the
    stream, not in it.  Raises AssertionError if ``after`` verdicts do not come within ``timeout``.
    """

    async def run() -> int:
        c = committed_reader(kafka, topics.verdicts)
        await c.start()
        try:
            deadline = time.monotonic() + timeout
            while not c.assignment():
                assert time.monotonic() < deadline, "the verdicts topic was not assigned"
                await asyncio.sleep(0.05)
            # positions resolved (and what is there already counted) before the first page goes out
            seen = sum(map(len, (await c.getmany(timeout_ms=100)).values()))
            sent = asyncio.ensure_future(asyncio.to_thread(produce, kafka, topics.pages, records, None, partitions))
            try:
                while seen < after:
                    assert time.monotonic() < deadline, f"{seen} verdicts within {timeout}s, waited for {after}"
                    seen += sum(map(len, (await c.getmany(timeout_ms=50)).values()))
                worker.kill()
            finally:
                await sent  # the burst is complete (or its error raised) before anything is asserted
            return seen
        finally:
            await c.stop()

    return asyncio.run(run())


def read_all(kafka, topics: list[str], until: Any, timeout: float = 60.0) -> dict[str, list]:
    """Committed records of ``topics`` from the beginning, until ``until(records_by_topic)`` is
    true or ``timeout`` passes (then returns what there is)."""

    async def run() -> dict[str, list]:
        c = committed_reader(kafka, *topics)
        await c.start()
        out: dict[str, list] = defaultdict(list)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not until(out):
                for tp, msgs in (await c.getmany(timeout_ms=200)).items():
                    out[tp.topic].extend(msgs)
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


def wait_for_verdicts(
    kafka, topics: StreamTopics, n: int, timeout: float = 60.0, dead_letters: int = 0, to_end: bool = True
) -> dict:
    """Every output record, once ``n`` verdict records and ``dead_letters`` dead letters are in.

    ``to_end`` (the default, for exactly-once checks): also wait until the worker has committed
    every page produced so far (its group's committed offsets reach the pages topic's end; the
    outputs are committed in the same transactions), then read every output topic to its end
    offsets, so a late duplicate is seen.  ``to_end=False``: return as soon as the counts are in
    (e.g. to kill a worker mid-stream).  On timeout, returns what there is.

    Returns ``{"verdicts": {id: [verdict dicts]}, "unique": [...], "near": [...], "dead": [...]}``.
    """
    names = [topics.verdicts, topics.unique, topics.near_duplicate, topics.dead_letter]
    deadline = time.monotonic() + timeout

    def done(out: dict) -> bool:
        return (
            len(out[topics.verdicts]) >= n
            and len(out[topics.dead_letter]) >= dead_letters
            and len(out[topics.unique]) + len(out[topics.near_duplicate]) >= n
        )

    out = read_all(kafka, names, done, timeout)
    if to_end:
        wait_until_committed(kafka, topics, max(0.0, deadline - time.monotonic()))
        out = read_to_end(kafka, names)
    verdicts: dict[str, list] = defaultdict(list)
    for m in out[topics.verdicts]:
        v = json.loads(m.value)
        verdicts[v["id"]].append(v)
    return {
        "verdicts": dict(verdicts),
        "unique": out[topics.unique],
        "near": out[topics.near_duplicate],
        "dead": out[topics.dead_letter],
    }


def wait_until_committed(kafka, topics: StreamTopics, timeout: float) -> bool:
    """Poll until the app's consumer group has committed every record of the pages topic
    (True), or ``timeout`` passes (False)."""

    async def run() -> bool:
        admin = AIOKafkaAdminClient(**kafka.client_kwargs())
        c = AIOKafkaConsumer(**kafka.client_kwargs(), group_id=None, enable_auto_commit=False)
        await admin.start()
        await c.start()
        try:
            tps = [TopicPartition(topics.pages, p) for p in range(topics.partitions)]
            deadline = time.monotonic() + timeout
            while True:
                ends = await c.end_offsets(tps)
                committed = await admin.list_consumer_group_offsets(topics.app_id)
                if all(ends[tp] == 0 or (tp in committed and committed[tp].offset >= ends[tp]) for tp in tps):
                    return True
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.2)
        finally:
            await c.stop()
            await admin.close()

    return asyncio.run(run())


def read_to_end(kafka, topics: list[str], timeout: float = 60.0) -> dict[str, list]:
    """Committed records of ``topics`` from the beginning to their end offsets as of now (the
    last stable offsets: read_committed)."""

    async def run() -> dict[str, list]:
        c = AIOKafkaConsumer(
            **kafka.client_kwargs(),
            group_id=None,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        admin = AIOKafkaAdminClient(**kafka.client_kwargs())
        await admin.start()
        try:  # every topic's partitions (a topic not created yet has none to read)
            known = {t.get("topic", t.get("name")): t["partitions"] for t in await admin.describe_topics()}
        finally:
            await admin.close()
        await c.start()
        out: dict[str, list] = defaultdict(list)
        try:
            tps = [TopicPartition(t, p["partition"]) for t in topics for p in known.get(t, [])]
            if not tps:
                return out
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            ends = await c.end_offsets(tps)
            deadline = time.monotonic() + timeout
            while [tp for tp in tps if await c.position(tp) < ends[tp]]:
                if time.monotonic() > deadline:
                    raise AssertionError(f"could not read {topics} to their end offsets within {timeout}s")
                for tp, msgs in (await c.getmany(timeout_ms=200)).items():
                    out[tp.topic].extend(m for m in msgs if m.offset < ends[tp])
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


def wait_for_group(kafka, group: str, members: int, timeout: float = 60.0) -> None:
    """Poll until consumer group ``group`` is stable with ``members`` members (every one of
    them holds its assignment), or fail after ``timeout``."""

    async def run() -> tuple:
        admin = AIOKafkaAdminClient(**kafka.client_kwargs())
        await admin.start()
        try:
            deadline, state = time.monotonic() + timeout, None
            while time.monotonic() < deadline:
                [desc] = await admin.describe_consumer_groups([group])
                _, _, state, _, _, found, *_ = desc.groups[0]
                if state == "Stable" and len(found) == members:
                    return True, state
                await asyncio.sleep(0.2)
            return False, state
        finally:
            await admin.close()

    ok, state = asyncio.run(run())
    assert ok, f"consumer group {group} not stable with {members} members within {timeout}s (state {state})"


def post_check(port: int, body: bytes) -> tuple[int, dict]:
    """POST ``body`` to a worker's /check: (status, the JSON answer)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/check", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
