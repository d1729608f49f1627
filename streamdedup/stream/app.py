"""The faust app: three agents around the core, wired as docs/stream-design.md describes.

    pages ──pages agent──> <app>-probes ──shard agent──> <app>-answers ──answers agent──> outputs
      (parse, fingerprint,    (one message per      (probe + insert, changelog,     (best answer per page,
       wait for answers)       shard partition)      answers to the page's           one transaction per
                                                     input partition)                input partition)

Input partition p, probes partition p, answers partition p and the shard changelog partition p
are co-partitioned (same count P), so faust gives them to the same worker: the answers for a
page reach the worker that holds it, and each shard is rebuilt where it is probed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import struct
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

import faust
import numpy as np
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from prometheus_client import REGISTRY, CollectorRegistry

from streamdedup.index.bands import BandScheme
from streamdedup.index.hamming import HammingIndex
from streamdedup.pipeline.bands import BandPlan
from streamdedup.pipeline.intake import (
    Fingerprinted,
    Intake,
    Record,
    content_bytes,
    fingerprint_contents,
    join_fingerprinted,
    parse,
    process_died,
    too_slow,
)
from streamdedup.pipeline.offsets import Delivery
from streamdedup.pipeline.pending import Pending, Waiting
from streamdedup.pipeline.routing import Topics, match_distance
from streamdedup.pipeline.shard import WORKER_DESIGN, Plan, ShardPlan, ShardStep, shard_step
from streamdedup.pipeline.wire import ANSWERS, CHANGELOG, CHECKS, PROBES, Batch, decode, encode, kind_of
from streamdedup.settings import Settings
from streamdedup.stream import lenient_records
from streamdedup.stream.check import Checker
from streamdedup.stream.connection import (
    committed_offsets,
    end_offsets,
    faust_broker_url,
    faust_credentials,
    list_offsets,
    member_heartbeats,
    read_ranges,
)
from streamdedup.stream.direct_delivery import deliver_directly
from streamdedup.stream.gauges import Gauges
from streamdedup.stream.logs import install as rate_limit_client_logs
from streamdedup.stream.metrics import Metrics, setup_faust_sensor
from streamdedup.stream.outbox import Outbox, latency_seconds
from streamdedup.stream.pool import BrokenProcessPool, FingerprintPool, deadline_seconds
from streamdedup.stream.recovery import ShardTables
from streamdedup.stream.store import SCHEME, BulkReplay, ShardStore
from streamdedup.stream.web_limits import bound_connections

__all__ = ["Worker", "batches_in_flight", "internal_topics", "table_design"]

log = logging.getLogger("streamdedup.worker")
RAW: dict[str, Any] = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
MAX_ROWS = 2000  # rows per internal message (a row is 48 bytes plus its extra bytes, id and url)
MAX_MESSAGE_BYTES = 512 * 1024  # bytes of rows per internal message: half the broker's default limit
CHECKS_PER_PROCESS = 4  # POST /check requests in progress per fingerprinting process; 503 beyond
# a failing shard or answers batch is tried this many times, waiting RETRY_FIRST seconds after
# the first failure and twice as long after each next one (at most RETRY_MAX): 0.2+0.4+0.8+1.6 s
RETRY_ATTEMPTS, RETRY_FIRST, RETRY_MAX = 5, 0.2, 5.0
# a page that has waited this long for a shard partition whose standby this worker holds gets
# that standby's answer if it is a match (answer_from_standbys); a "no match" waits for the owner
STANDBY_AFTER = 2.0
# a worker's probes go to a shard it owns straight away (--local-shards) once those it sent there
# through the probes topic (while the shard recovered) are answered; a batch waits at most this long
# for that, then goes through the topic too
LOCAL_HANDOVER = 2.0
# an owned pages partition with records past the last one delivered, none of them delivered for
# this long (and the worker not pausing it), is sought again (reseek_stalled; faust-notes §9)
PARTITION_SILENCE = 10.0
OFFSETS_TIMEOUT = 10.0  # seconds a rebalance callback waits for an offsets request
HOLE_RECHECK_SECONDS = 1.0  # a hole in a pages partition is read after this (see _fill_holes)
#: Input bytes the worker holds (read and not committed yet: buffered, and waiting in Pending) at
#: which it pauses its pages partitions, whatever their count: the
#: count alone (2 x batches in flight x --batch-size records) let a burst of large pages, legal
#: up to --max-page-bytes (5 MiB), hold ~10 GiB.  Typical pages (tens of KiB) never reach it.
MAX_HELD_BYTES = 256 * 1024 * 1024
#: The most input bytes in one batch (at least one record): a batch of --batch-size large
#: pages would hold gigabytes (and their copies in the fingerprinting process)
BATCH_BYTES = 32 * 1024 * 1024
#: The first batch of an idle pipeline (a backlog's first verdicts come after it, not after a
#: whole --batch-size); each next batch doubles, up to --batch-size
FIRST_BATCH = 50
HOLE_READS = 3  # reads of a hole that fail before the worker gives up on it (commits past it, loudly)
#: ... if they failed for an error (the broker away), only once they have failed this long: a
#: blip of a few seconds while a hole was open made the worker commit past its records
HOLE_ERRORS_SECONDS = 300.0
FAILED = -2  # an answer row's distance when its shard gave up on the probe (the id column holds why)
#: test hook, never set in production: ``<stage>:<n>`` makes that stage (shard, answers) raise on
#: its first n batches; ``<stage>:id=<text>`` on every batch holding a page whose id contains text;
#: ``stop`` makes a stop (SIGTERM) hang, for the stop deadline; ``check:id=<text>`` makes a POST
#: /check whose body contains text answer CHECK_FAULT_DELAY seconds late (in progress all along,
#: so it counts against the checks limit); ``skip:<partition>:<offset>[,...]``
#: drops those pages records the first time the consumer delivers them, as faust can (docs/faust-notes.md §10);
#: ``bulk_replay:<n>`` makes the bulk changelog replay fail after each of its first n restored runs, and
#: ``bulk_replay_slow:<s>`` makes it wait s seconds after each; ``changelog:<n>`` makes the first n
#: changelog records of stored rows fail to be written (the broker never gets them); ``handover:<s>``
#: makes the shards here ready (for --local-shards) s seconds after their recovery, logging
#: HANDOVER_READY then, and the shard agent take no probes until HANDOVER_HOLD seconds after that
FAULT_ENV = "TEST_STREAMDEDUP_FAULT"  # (not STREAMDEDUP_*: settings refuse unknown ones)
HANDOVER_READY = "test hook: the shards here are ready now"
HANDOVER_HOLD = 1.5  # (the test hook handover: seconds the shard agent holds its probes after that)
CHECK_FAULT_DELAY = 2.0


# The fetch wait (FETCH_MAX_WAIT_MS below) was tried at 50 ms before --local-shards (commits df634c6,
# 64564a1) and not kept then: recovery's offsets, which it sped up, are read by a client of our own
# since, and at half rate it measured no clear difference while probes and answers kept faust's
# fetches short.  The 0.5 ms GIL switch interval tried with it measured no gain either.


class _Active:
    """faust's live set of active partitions as aiokafka's ``Fetcher.fetched_records`` reads it:
    never false.  aiokafka drains *every* buffered partition when that argument is empty, and faust
    hands it its live set, which it empties (every partition paused) at a rebalance and when the
    changelogs are read, while a ``getmany`` from before still waits in the consumer thread (up to
    1 s).  The records that call then drained for paused partitions were dropped by faust's
    ``getmany`` with aiokafka's position already past them; faust seeks back only partitions with
    a committed offset, so a partition without one lost them (docs/faust-notes.md §9)."""

    __slots__ = ("tps",)

    def __init__(self, tps: Any) -> None:
        self.tps = tps

    def __bool__(self) -> bool:
        return True

    def __contains__(self, tp: object) -> bool:
        return tp in self.tps


def _active_only(fetch: Any) -> Any:
    @functools.wraps(fetch)
    async def fetch_records(self: Any, consumer: Any, active_partitions: Any, *args: Any, **kwargs: Any) -> Any:
        active = None if active_partitions is None else _Active(active_partitions)
        return await fetch(self, consumer, active, *args, **kwargs)

    return fetch_records


#: How long the broker may hold faust's consumer fetch when there is nothing new (faust hard-codes
#: 1.5 s).  A fetch goes out without the partitions that are buffered or paused (back-pressure) at
#: that moment, and records that then arrive for them wait until it returns.  With --local-shards
#: a worker's probes and answers no longer pass through Kafka to wake such a fetch, and the pages
#: topic is often the only one with traffic: at half the backlog rate the pages waited up to 1.5 s
#: to be read (p99 2.3 s; bench/README.md, "Shards here").  An empty fetch every 100 ms costs little.
FETCH_MAX_WAIT_MS = 100


def _bounded_fetch_wait(create: Any) -> Any:
    @functools.wraps(create)
    def create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read by AIOKafkaConsumer.start (its Fetcher)
        return consumer

    return create_worker_consumer


_thread = cast(Any, faust_aiokafka.AIOKafkaConsumerThread)
_thread._fetch_records = _active_only(_thread._fetch_records)
_thread._create_worker_consumer = _bounded_fetch_wait(_thread._create_worker_consumer)


def batches_in_flight(fingerprint_processes: int) -> int:
    """Batches of pages the worker judges at once: one in each fingerprinting process and one
    registering its probes, at least 2 (one fingerprinting, one queued); as many batches of
    pages may wait for their answers.  With a fixed 2, processes beyond the first sat idle.

    >>> [batches_in_flight(n) for n in (0, 1, 2, 4)]
    [2, 2, 3, 5]
    """
    return max(2, fingerprint_processes + 1)


def internal_topics(settings: Settings) -> dict[str, str]:
    a = settings.app_id
    return {"probes": f"{a}-probes", "answers": f"{a}-answers", "changelog": f"{a}-shards-changelog"}


def table_design(settings: Settings):
    """The worker's table design: ``--design``, else :data:`WORKER_DESIGN` for k = 3 (other k:
    the index's two-level default)."""
    design = settings.design or (WORKER_DESIGN if settings.k == 3 else None)
    return HammingIndex(k=settings.k, design=design).design


def band_scheme(settings: Settings) -> BandScheme | None:
    """The LSH bands of ``--algorithm minhash`` / ``combined`` (None: simhash)."""
    if settings.algorithm == "simhash":
        return None
    return BandScheme.for_threshold(settings.threshold, settings.num_perm, verify=settings.algorithm, k=settings.k)


@dataclass
class Worker:
    """The app and the state its agents share (one per process)."""

    settings: Settings
    registry: CollectorRegistry = REGISTRY
    app: faust.App = field(init=False)
    plan: Plan = field(init=False)
    pending: Pending = field(init=False)
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        lenient_records.install()  # a record whose header key is not UTF-8 stopped the worker
        self.bands = band_scheme(s)
        self.plan = (
            ShardPlan(table_design(s), s.partitions) if self.bands is None else BandPlan(self.bands, s.partitions)
        )
        self.pending = Pending(self.plan.n_groups, None if self.bands is None else self.bands.similarity_of_rank)
        self.metrics = Metrics.create(self.registry)
        self.gauges = Gauges(self.metrics)
        tables = len(table_design(s).keys) if self.bands is None else self.bands.bands
        self.metrics.configure(s, tables, self.plan.n_groups)
        self.topics = Topics(s.unique_topic, s.near_duplicate_topic, s.verdicts_topic, s.dead_letter_topic)
        self.outbox = Outbox(
            s,
            self.topics,
            self.pending,
            on_sent=self._on_sent,
            on_error=lambda: self.metrics.errors.labels("answers").inc(),
            on_fenced=self._fenced,
        )
        self._crashing: asyncio.Future | None = None
        self._buffer: list[Any] = []
        self._buffered_bytes = 0  # of the values of the events in _buffer and _fillers
        self._taken: dict[int, set[int]] = {}  # input partition -> offsets taken and not yet committed
        # bumped at every revocation: work started under an earlier assignment is dropped, never
        # mixed into the next one (its records are read again from the committed offset)
        self._generation = 0
        # records that fill a hole (delivered below an offset delivered before): judged first,
        # whatever the back-pressure, since the records after them cannot be committed until they are
        self._fillers: list[Any] = []
        self._hole_tasks: dict[int, tuple[int, asyncio.Task]] = {}  # partition -> (generation, _fill_holes)
        self._seen: dict[int, int] = {}  # input partition -> the next offset not buffered yet
        self._heard_pages: dict[int, float] = {}  # pages partition -> its last delivery (or assignment)
        # the same for the probes and answers partitions owned ((topic, partition) -> when), the next
        # offset after the last one their stage took, and the stages in a batch now (reseek_stalled)
        self._heard_internal: dict[tuple[str, int], float] = {}
        self._next_offset: dict[tuple[str, int], int] = {}
        self._internal_start: dict[tuple[str, int], int] = {}  # where the assignment's reading began
        self._busy: set[str] = set()
        # pages read but not yet judged, at most: bounds memory and latency, and lets the shard and
        # answers stages run instead of the pages stage reading a whole backlog first
        self._max_in_flight = batches_in_flight(s.fingerprint_processes)
        self._max_waiting = self._max_in_flight * s.batch_size
        self._in_flight = 0  # batches being judged: at most _max_in_flight
        self._ramp = s.batch_size
        self._paused = False
        self._assigned: set = set()
        self._seek_task: asyncio.Future | None = None  # the seek of uncommitted pages partitions (on_assigned)
        self._turn = asyncio.Condition()
        self._tickets = self._next_ticket = 0
        # with standbys: the probes sent, while their pages wait ((sent at, shard partition, rows))
        self._sent: list[tuple[float, int, Batch]] = []
        self._heard: dict[int, float] = {}  # shard partition -> when a probe sent there was last seen answered
        # shard partition (active here) -> the probes this worker sent there through the topic, while
        # they may wait: its own probes go to a shard here (--local-shards) only once none waits
        self._via_topic: dict[int, list[Batch]] = {}
        self._pool = FingerprintPool(s.fingerprint_processes) if s.fingerprint_processes else None
        self._writer = struct.pack("<Q", int(time.time() * 1e6))  # changelog keys: unique per incarnation
        self._seq = 0
        self._ready_at: float | None = None  # (the test hook handover: when the shards here became ready)
        self._recovery_started: float | None = None
        self._last_sent = time.monotonic()
        self.faults = _Faults.from_env(os.environ.get(FAULT_ENV, ""))
        self.app = self._build_app()
        # after faust and aiokafka are imported: a broker outage must not flood the log
        rate_limit_client_logs()

    # ------------------------------------------------------------------ app and agents
    def _build_app(self) -> faust.App:
        s, names = self.settings, internal_topics(self.settings)
        ShardStore.configure(
            self.plan,
            s.data_dir / "snapshots",
            self._on_restored,
            self._on_recovered,
            end_offsets=functools.partial(end_offsets, s),
            retention=1000 * s.retention,
            bulk=BulkReplay(
                functools.partial(read_ranges, s),
                s.bulk_replay_min_records,
                s.bulk_replay_timeout,
                functools.partial(member_heartbeats, s, interval=min(3.0, s.session_timeout / 3)),
                unkept_timeout=s.session_timeout / 2,
                check=self._bulk_fault if self.faults else None,
            ),
        )
        app = faust.App(
            s.app_id,
            broker=faust_broker_url(s),
            broker_credentials=faust_credentials(s),
            env={},
            autodiscover=False,
            datadir=str(s.data_dir / "faust"),
            store="memory://",
            web_enabled=True,
            # /metrics and /check only: faust's own pages (its tables' contents, every worker's
            # address and partitions, statistics) are for debugging, and /table failed on ours
            web_router_enabled=False,
            web_tables_enabled=False,
            web_stats_enabled=False,
            web_graph_enabled=False,
            web_metrics_enabled=False,
            web_port=s.web_port,
            web_bind=s.web_host,
            web_host=s.web_host,
            topic_partitions=s.partitions,
            topic_replication_factor=s.replication_factor,
            table_standby_replicas=s.standby_replicas,
            broker_session_timeout=float(s.session_timeout),  # a dead worker's partitions move after it
            broker_heartbeat_interval=min(3.0, s.session_timeout / 3),  # Kafka's advice: at most a third
            stream_wait_empty=False,  # pages are never acked (the outbox commits them): do not wait at stop
            broker_commit_interval=0.5,
            consumer_auto_offset_reset="earliest",
            broker_commit_livelock_soft_timeout=10**9,  # the pages topic is committed by the outbox
            producer_max_request_size=max(1_048_576, 2 * s.max_page_bytes),
            consumer_max_fetch_size=max(1_048_576, 2 * s.max_page_bytes),
            # (faust's, without its 1 s sleep before the tables start, its recovery's offsets read
            # by a client of our own: not behind faust's fetch, stream/recovery.py)
            TableManager=ShardTables.using(functools.partial(list_offsets, s)),
        )
        # the web port closes idle and slow connections and caps open ones (faust's aiohttp runner)
        bound_connections(cast(Any, app.web)._runner)
        setup_faust_sensor(app, self.registry)
        pages = app.topic(s.pages_topic, partitions=s.partitions, **RAW)
        self.probes_topic = app.topic(names["probes"], partitions=s.partitions, internal=True, **RAW)
        self.answers_topic = app.topic(names["answers"], partitions=s.partitions, internal=True, **RAW)
        self.table = app.Table(
            "shards",
            partitions=s.partitions,
            key_type=bytes,
            value_type=bytes,
            store=f"{SCHEME}://local",
            recovery_buffer_size=200,
            # a standby applies each changelog record as it comes: faust applies a standby's buffer
            # only when it is full or at a rebalance, and a stale standby answers stalled pages
            # (answer_from_standbys) with less and takes over with more to replay
            standby_buffer_size=1,
            help="the sharded index",
        )

        @app.agent(pages, name="pages")
        async def pages_agent(stream):  # what the direct delivery below leaves to faust's way (rebalances)
            async for event in stream.noack().events():
                self._deliver(event)

        # the records faust's stream would take, straight from faust's drain loop (docs/faust-notes.md §15)
        deliver_directly(app, s.pages_topic, lambda message: self._deliver(_Reread(message)))

        @app.task
        async def batch_timer():  # a partial batch waits at most batch_timeout
            while not app.should_stop:
                await asyncio.sleep(s.batch_timeout)
                if self._buffer:
                    self._kick(partial=True)

        # faust acks a take_events batch once the body is done, even if it raised: a failing
        # batch is retried here, and if it keeps failing its pages get dead letters (give_up_*)
        @app.agent(self.probes_topic, name="shards")
        async def shard_agent(stream):
            async for events in stream.take_events(256, within=s.batch_timeout / 2):
                if self.faults.stage == "handover":  # the test hook: probes held (HANDOVER_HOLD)
                    while self._ready_at is None or time.monotonic() < self._ready_at + HANDOVER_HOLD:
                        await asyncio.sleep(0.05)
                t0 = time.perf_counter()
                self._heard_from(self.probes_topic.get_topic_name(), events)
                self._busy.add("shard")
                try:
                    error = await self._retrying("shard", self.on_probes, events)
                    if error is not None:
                        await self._give_up_probes(events, error)
                finally:
                    self._busy.discard("shard")
                self.metrics.batch_seconds.labels("shard").observe(time.perf_counter() - t0)

        @app.agent(self.answers_topic, name="answers")
        async def answers_agent(stream):
            async for events in stream.take_events(1024, within=s.batch_timeout / 2):
                t0 = time.perf_counter()
                self._heard_from(self.answers_topic.get_topic_name(), events)
                self._busy.add("answers")
                try:
                    error = await self._retrying("answers", self.on_answers, events)
                    if error is not None:
                        self._give_up_answers(events, error)
                finally:
                    self._busy.discard("answers")
                self.metrics.batch_seconds.labels("answers").observe(time.perf_counter() - t0)

        answers_name = self.answers_topic.get_topic_name()
        checker = self.checker = Checker(
            self.pending,
            self.plan,
            send_probes=lambda shard, value: self.probes_topic.send(value=value, partition=shard),
            owned=lambda: sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == answers_name),
            max_bytes=s.max_page_bytes,
            pool=self._pool,
            max_concurrent=CHECKS_PER_PROCESS * max(1, s.fingerprint_processes),
            cluster_n=s.cluster_n,
            bands=self.bands,
        )
        metrics, faults = self.metrics, self.faults

        @app.page("/check")
        class CheckView(faust.web.View):
            """POST a page record (the pages topic's JSON): its verdict against every stored page,
            without storing it.  400/413 JSON for bad input, 503 + Retry-After while the worker is
            busy with checks or holds no partition; HEAD answers what the endpoint takes."""

            async def post(self, request):
                t0 = time.perf_counter()
                unread = True  # the body is not read: answer and close rather than read it to discard it
                encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):  # (aiohttp would inflate it on the event loop)
                    status, payload, headers = 415, UNCOMPRESSED, {"Accept-Encoding": "identity"}
                elif (busy := checker.reserve()) is not None:  # before reading a body it would not judge
                    status, payload, headers = busy
                else:
                    try:
                        body, too_large = await checker.read_body(request.content_length, request.content)
                        if too_large is not None:
                            status, payload, headers = 413 if too_large["reason"] == "too_large" else 400, too_large, {}
                        else:
                            unread = False
                            assert body is not None  # read within the limit
                            slow = (
                                faults.stage == "check" and faults.match is not None and faults.match.encode() in body
                            )
                            delay = CHECK_FAULT_DELAY if slow else 0.0
                            status, payload, headers = await checker.check(body, delay, reserved=True)
                    finally:
                        checker.release()
                metrics.check_seconds.labels(str(status)).observe(time.perf_counter() - t0)
                response = self.json(payload, status=status, headers=headers or None)
                if unread:
                    cast(Any, response).force_close()  # aiohttp's Response under faust's type
                return response

            async def head(self, request):
                return self.bytes(b"", content_type="application/json", headers={"Allow": "HEAD, POST"})

        if s.standby_replicas:

            @app.timer(interval=0.5, name="standby_answers")
            async def standby_answers():
                self.answer_from_standbys()

        @app.timer(interval=5.0, name="stalled_partitions")
        async def stalled_partitions():
            await self.reseek_stalled()

        @app.timer(interval=5.0, name="gauges")
        async def gauges():
            self.gauges.update_shards(dict(self.store.shards))
            self.metrics.changelog_owed.set(self.store.owed_rows())
            self.gauges.update_lag(
                self.app.consumer,
                {s.pages_topic, self.probes_topic.get_topic_name(), self.answers_topic.get_topic_name()},
                s.pages_topic,
                self.outbox.committed,
            )
            self.gauges.update_recovery(cast(Any, self.app.tables).recovery)
            if (len(self.pending) or self._buffer) and time.monotonic() - self._last_sent > 30:
                log.warning(
                    "no verdict committed for %.0fs: %s; %d records buffered, %d batches in flight; outbox: %s",
                    time.monotonic() - self._last_sent,
                    self.pending.describe(),
                    len(self._buffer),
                    self._in_flight,
                    self.outbox.describe(),
                )

        @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # (faust's stub wants a signal= kwarg)
        async def on_revoked(sender, revoked, **kwargs):
            self._generation += 1  # first, before any await: batches in flight now are stale
            self.metrics.rebalances.inc()
            gone = {tp.partition for tp in revoked if tp.topic == s.pages_topic}
            self._buffer = [e for e in self._buffer if e.message.partition not in gone]
            self._fillers = [e for e in self._fillers if e.message.partition not in gone]
            self._buffered_bytes = sum(_size(e) for e in self._buffer) + sum(_size(e) for e in self._fillers)
            commits = {}
            for p in gone:
                self._taken.pop(p, None)  # a new assignment starts again from the committed offset
                self._seen.pop(p, None)
                if (committed := await self.outbox.revoke(p)) is not None:
                    commits[p] = committed
            # the next owner reads where to start: let this worker's last commits show first
            await self.outbox.settle(commits)
            self._paused = False  # a new assignment starts unpaused

        @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # (as above)
        async def on_assigned(sender, assigned, **kwargs):
            self.outbox.assign({tp.partition for tp in assigned if tp.topic == s.pages_topic})
            self._assigned = set(assigned)
            now = time.monotonic()
            self._heard_pages = {tp.partition: now for tp in assigned if tp.topic == s.pages_topic}
            internal = {tp for tp in assigned if tp.topic in self._internal_topics()}
            self._heard_internal = {(tp.topic, tp.partition): now for tp in internal}
            self._next_offset, self._internal_start = {}, {}
            self._recovery_started = time.monotonic()
            self.metrics.recovery_restored.set(0)
            # Not awaited here: an offsets request made inside the rebalance callback waits on the
            # consumer that is running the rebalance (a SIGTERM then hung past 30 s).  The partitions
            # stay paused until recovery ends, so the seek still lands before they are read.
            self._seek_task = asyncio.ensure_future(
                self._seek_uncommitted({tp for tp in assigned if tp.topic == s.pages_topic}, self._generation, internal)
            )

        @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # (as above)
        async def hold_flow(sender, **kwargs):
            # faust's recovery sends this first as it ends, then resumes the stream partitions,
            # awaits its seek of them to the committed offsets, and only then resumes the flow
            # control, which clears every agent's queue.  A record handed out meanwhile went into
            # a queue and was cleared, with faust's read offset past it: a probes or answers
            # record lost for good (faust-notes §9).  Suspended, the flow control holds the first
            # record handed out in faust's on_message (acquire_flow_control) until that clear, as
            # faust does at a rebalance.  (Not consumer.stop_flow: a fetch returning while the
            # flow is stopped is dropped, the standby changelog records in it too, and only the
            # stream partitions are sought back.)
            app.flow_control.suspend()
            # And the assignment's own seek (_seek_uncommitted) lands before faust resumes the
            # stream partitions, however fast the recovery was (its offsets are read by clients
            # of our own, so it can end within ~0.1 s of the assignment).
            if (seek := self._seek_task) is not None and not seek.done():
                done, _ = await asyncio.wait({seek}, timeout=2 * OFFSETS_TIMEOUT)
                if not done:
                    log.warning("recovery goes on before the seek of the uncommitted partitions ended")

        if self.faults.stage == "stop":  # the test hook: a stop that never ends (see arm_stop_deadline)

            @app.on_before_shutdown.connect  # type: ignore[arg-type]  # (as above)
            async def hang(sender, **kwargs):
                log.warning("stop hangs (test hook %s)", FAULT_ENV)
                await asyncio.Event().wait()

        return app

    async def _seek_uncommitted(self, tps: set, generation: int, internal: frozenset | set = frozenset()) -> None:
        """Seek the pages partitions that have no committed offset yet to their first record, and
        tell the outbox where each partition's commits start (its committed offset, else its
        beginning): nothing before it is judged again, and nothing after it is committed past
        until judged (docs/faust-notes.md §10).  The probes and answers partitions (``internal``)
        with no committed offset are sought to their first record too.
        faust seeks back only partitions with a committed offset: records its consumer had
        drained and dropped for a partition without one were never read (docs/faust-notes.md §9).
        The partitions are paused until recovery ends, so the position holds until then."""
        if not tps and not internal:
            return
        starts: dict[int, int] = {}
        try:
            committed = await asyncio.wait_for(cast(Any, self.app.consumer).seek_to_committed(), OFFSETS_TIMEOUT)
            for tp in tps:  # never before this worker's own last commit (Outbox.start_offset)
                read = committed.get(tp)
                start = self.outbox.start_offset(tp.partition, None if read is None or read < 0 else read)
                if start is not None and start != read:
                    committed[tp] = start
                    await self._seek(tp, start)
            missing = sorted(tp for tp in set(tps) | set(internal) if committed.get(tp) is None or committed[tp] < 0)
            starts = {tp.partition: committed[tp] for tp in tps if tp not in missing}
            internal_start = {(tp.topic, tp.partition): committed[tp] for tp in internal if tp not in missing}
            if missing:
                # (by a client of our own: faust's consumer would send it behind its fetch, §14)
                firsts = await asyncio.wait_for(
                    list_offsets(self.settings, [(tp.topic, tp.partition) for tp in missing], latest=False),
                    OFFSETS_TIMEOUT,
                )
                for tp in missing:
                    first = firsts.get((tp.topic, tp.partition)) or 0
                    if tp in tps:
                        starts[tp.partition] = first
                    else:
                        internal_start[(tp.topic, tp.partition)] = first
                    await self._seek(tp, first)
            if generation == self._generation:
                self._internal_start = internal_start
            if missing:
                log.info(
                    "no committed offset yet for partitions %s: reading them from the start",
                    ", ".join(f"{tp.topic} {tp.partition}" for tp in missing),
                )
        except Exception:
            log.exception("cannot seek the uncommitted pages partitions %s", sorted(tp.partition for tp in tps))
            starts = await self._read_starts(sorted(tp.partition for tp in tps), generation)
        if generation != self._generation:
            return
        for p, offset in starts.items():
            if p in self.outbox.owned:
                self.outbox.start(p, offset)
                self.outbox.prepare(p)  # its producer, before its first verdicts need it
                self.outbox.schedule(p)  # records judged before it was known may be ready
                self._watch_holes(p)
        self._kick(partial=True)  # the records that waited for it

    def _internal_topics(self) -> tuple[str, str]:
        return self.probes_topic.get_topic_name(), self.answers_topic.get_topic_name()

    def _heard_from(self, topic: str, events: list) -> None:
        """A probes or answers batch reached its stage: note when, and the next offset of each partition."""
        now = time.monotonic()
        for e in events:
            key = (topic, e.message.partition)
            self._heard_internal[key] = now
            self._next_offset[key] = max(self._next_offset.get(key, 0), e.message.offset + 1)

    async def reseek_stalled(self, now: float | None = None) -> list[tuple[str, int]]:
        """Seek again the owned partitions (pages, probes, answers) that hold records past the last
        one delivered but have delivered none for ``PARTITION_SILENCE`` seconds, while the worker
        is not pausing them (pages) or its stage is not in a batch (probes, answers), and logs a
        WARNING: faust's consumer can leave a partition's records behind after an assignment
        (docs/faust-notes.md §9), and nothing else would ever read them.  Returns the (topic,
        partition) sought."""
        now = time.monotonic() if now is None else now
        recovery = getattr(getattr(self.app, "tables", None), "recovery", None)
        if recovery is None or not recovery.completed.is_set() or getattr(self.app, "rebalancing", False):
            return []
        sought = [] if self._paused else await self._reseek_pages(now)
        for topic in self._internal_topics():
            sought += await self._reseek_internal(topic, now)
        return sought

    async def _reseek_internal(self, topic: str, now: float) -> list[tuple[str, int]]:
        stage = "shard" if topic == self.probes_topic.get_topic_name() else "answers"
        if stage in self._busy:  # records wait for the stage, not for the consumer
            return []
        quiet = sorted(
            tp.partition
            for tp in self._assigned
            if tp.topic == topic and now - self._heard_internal.get((topic, tp.partition), now) >= PARTITION_SILENCE
        )
        if not quiet:
            return []
        generation = self._generation
        try:
            ends = await asyncio.wait_for(self._highwaters(topic, quiet), OFFSETS_TIMEOUT)
            # the next offset to take: after the last one taken, else where the assignment began
            first = {p: self._next_offset.get((topic, p), self._internal_start.get((topic, p))) for p in quiet}
            if unknown := [p for p, o in first.items() if o is None and ends.get(p, 0) > 0]:
                first.update(await asyncio.wait_for(self._starts(topic, unknown), OFFSETS_TIMEOUT))
        except Exception as e:  # the next tick tries again
            log.warning("cannot read the offsets of %s partitions %s: %s", topic, quiet, e)
            return []
        sought = []
        for p in quiet:
            tp = TP(topic, p)
            if generation != self._generation or tp not in self._assigned or (o := first.get(p)) is None:
                continue
            # o + 1, not o: these topics are written in transactions, so the partition's last
            # record is followed by its commit marker, which is never delivered (an idle worker
            # would otherwise be warned about every 10 s); a lost record always has one after it
            if ends.get(p, 0) > o + 1:
                log.warning(
                    "%s partition %d: no record delivered for %.0fs while offsets %d..%d wait; seeking it again",
                    topic,
                    p,
                    now - self._heard_internal.get((topic, p), now),
                    o,
                    ends[p] - 1,
                )
                self._heard_internal[(topic, p)] = now
                await self._seek(tp, o)
                sought.append((topic, p))
        return sought

    async def _reseek_pages(self, now: float) -> list[tuple[str, int]]:
        quiet = [
            p
            for p in sorted(self.outbox.owned)
            if (o := self.outbox.offsets.get(p)) is not None
            and o.known
            and now - self._heard_pages.get(p, now) >= PARTITION_SILENCE
        ]
        if not quiet:
            return []
        generation = self._generation
        try:
            ends = await asyncio.wait_for(self._highwaters(self.settings.pages_topic, quiet), OFFSETS_TIMEOUT)
        except Exception as e:  # the next tick tries again
            log.warning("cannot read the end offsets of pages partitions %s: %s", quiet, e)
            return []
        sought = []
        for p in quiet:
            o = self.outbox.offsets.get(p)
            if generation != self._generation or o is None or p not in self.outbox.owned:
                continue
            if (first := o.after_delivered) is None:
                continue
            if ends.get(p, 0) > first:
                log.warning(
                    "pages partition %d: no record delivered for %.0fs while offsets %d..%d wait; seeking it again",
                    p,
                    now - self._heard_pages.get(p, now),
                    first,
                    ends[p] - 1,
                )
                self._heard_pages[p] = now
                await self._seek(TP(self.settings.pages_topic, p), first)
                sought.append((self.settings.pages_topic, p))
        return sought

    async def _highwaters(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """Each partition's end offset as faust's consumer saw it in its last fetch (no request:
        the backstop looks at quiet partitions every 5 s); read by a client of our own for those
        it has not fetched."""
        out: dict[int, int] = {}
        consumer = cast(Any, self.app.consumer)
        for p in partitions:
            try:
                if (end := consumer.highwater(TP(topic, p))) is not None:
                    out[p] = end
            except Exception:  # the consumer not started, or the partition no longer assigned
                pass
        if missing := [p for p in partitions if p not in out]:
            out.update(await self._ends(topic, missing))
        return out

    async def _ends(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return await end_offsets(self.settings, topic, partitions)

    async def _starts(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return await committed_offsets(self.settings, topic, partitions)

    async def _seek(self, tp: Any, offset: int) -> None:
        """Seek a pages partition in faust's consumer thread.  faust's ``Consumer.seek`` calls
        aiokafka's from this thread while the consumer thread's fetcher drains its records: the
        fetcher then crashed with a KeyError in ``fetched_records`` (seen in CI, right after the
        seek of partitions with no committed offset), and the worker with it."""
        await asyncio.wait_for(cast(Any, self.app.consumer).seek_wait({tp: offset}), OFFSETS_TIMEOUT)

    async def _read_starts(self, partitions: list[int], generation: int) -> dict[int, int]:
        """The committed offsets, read again until it works (the outbox commits nothing of a
        partition before it knows where its commits start)."""
        while generation == self._generation:
            try:
                read = await asyncio.wait_for(self.outbox.read_committed(partitions), OFFSETS_TIMEOUT)
                return {p: max(offset, self.outbox.start_offset(p, offset) or 0) for p, offset in read.items()}
            except Exception as e:
                log.warning("cannot read the committed offsets of pages partitions %s (%r); retrying", partitions, e)
                await asyncio.sleep(HOLE_RECHECK_SECONDS)
        return {}

    @property
    def store(self) -> ShardStore:
        return self.table.data  # type: ignore[return-value]

    # ------------------------------------------------------------------ stage 1: pages
    async def drain(self, events: list, generation: int | None = None) -> None:
        """Judge a batch of events: parse here, fingerprint in the pool (or here), then register
        and send the probes.  Batches register in the order they were taken from the buffer.

        A batch taken under an earlier assignment (``generation``) is dropped, at the start and
        again before it registers: its partitions were revoked, the new assignment reads them
        again from the committed offset, and mixing the two loses records (docs/faust-notes.md §8)."""
        generation = self._generation if generation is None else generation
        if generation != self._generation:
            return
        events = [e for e in events if self._take(e.message.partition, e.message.offset)]
        if not events:
            return
        trackers = {p: self.outbox.offsets.get(p) for p in {e.message.partition for e in events}}
        records = [
            Record(
                e.message.partition,
                e.message.offset,
                e.message.key,
                e.message.value,
                _headers(e.message.headers),
                int(e.message.timestamp * 1000),
            )
            for e in events
        ]
        self.metrics.pages.inc(len(records))
        t0, taken_at = time.perf_counter(), time.time()
        ticket = self._tickets
        self._tickets += 1
        error: Exception | None
        here: _Here | None = None
        try:
            parsed = parse(records, self.settings.max_page_bytes)
            contents = parsed.contents()
            result = asyncio.ensure_future(self._fingerprint(contents)) if self._pool is not None else None
        except Exception as e:
            parsed, result, error = None, None, e
        else:
            error = None
        async with self._turn:  # wait for the batches taken before this one
            await self._turn.wait_for(lambda: self._next_ticket == ticket)
        try:
            if error is None:
                done = (
                    await result
                    if result is not None
                    else fingerprint_contents(contents, self.settings.cluster_n, self.bands)
                )
                if generation != self._generation:
                    raise _Stale()
                assert parsed is not None  # no error: parsed
                intake = Intake.register(
                    parsed, done.fps, done.failed, self.pending, self.plan, done.clusters, done.extra
                )
        except _Stale:
            error = _Stale()
        except Exception as e:
            error = e
        try:
            if isinstance(error, _Stale) or generation != self._generation:
                log.info("dropping a batch of %d records taken before a rebalance", len(records))
                for p, offsets in trackers.items():  # a partition kept across the rebalance reads them again
                    if offsets is not None and self.outbox.offsets.get(p) is offsets:
                        offsets.forget([r.offset for r in records if r.partition == p])
                        self._watch_holes(p)
                partitions = set()
            elif error is not None:  # a bug, not bad input: never lose the records
                self.metrics.errors.labels("pages").inc()
                log.error(
                    "intake failed on %d records; sending them to the dead-letter topic", len(records), exc_info=error
                )
                for r in records:
                    self.pending.fail(
                        r.partition,
                        r.offset,
                        "internal_error",
                        f"{type(error).__name__}: {error}",
                        key=r.key,
                        value=r.value or b"",
                        headers=r.headers,
                        timestamp_ms=r.timestamp_ms,
                    )
                partitions = {r.partition for r in records}
            else:
                sent_at, probes = time.monotonic(), dict(intake.probes)
                if self.settings.local_shards:
                    await self._hold_for_topic([s for s in probes if self.store.ready(s)])
                    here = self._probe_here(probes)  # (removes the probes it takes)
                    if here is not None and here.error is not None:
                        # (no changelog record sent) retried now, in the turn: later batches wait,
                        # as they wait behind a failing batch in the shard agent, and keep their order
                        await self._recover_here(here.messages, here.error)
                        here = None
                for shard_partition, batch in probes.items():
                    self.metrics.probes.labels("topic").inc(len(batch))
                    for chunk in _chunks(batch):
                        await self.probes_topic.send(value=encode(chunk, PROBES), partition=shard_partition)
                    if self.settings.standby_replicas:
                        self._sent.append((sent_at, shard_partition, batch))
                    if self.settings.local_shards and shard_partition in self.store.active:  # (not ready yet)
                        self._via_topic.setdefault(shard_partition, []).append(batch)
                partitions = intake.partitions
                self._stamp(records, taken_at)
        finally:
            async with self._turn:
                self._next_ticket += 1
                self._turn.notify_all()
        self.metrics.batch_seconds.labels("pages").observe(time.perf_counter() - t0)
        for p in sorted(partitions):
            self.outbox.schedule(p)  # dead letters at the head go out now
        if here is not None:
            await self._finish_here(here)

    def _stamp(self, records: list[Record], taken_at: float) -> None:
        """When the batch of ``records`` was taken and its probes sent (the phase metrics)."""
        probed_at = time.time()
        for r in records:
            if (w := self.pending.at(r.partition, r.offset)) is not None and w.request is not None:
                w.taken_at, w.probed_at = taken_at, probed_at

    def _take(self, partition: int, offset: int) -> bool:
        """False for a record this assignment has taken already.  faust may deliver a partition's
        records before its recovery completes and then seek back to the committed offset it read
        at the start: without this, records committed in between would be judged twice.

        Exactly the offsets taken, not a high-water mark: a record this assignment never took
        is taken whenever it comes, so a hole in what faust delivered is filled on re-reading,
        never skipped."""
        if offset < self.outbox.committed.get(partition, -1):
            return False
        taken = self._taken.setdefault(partition, set())
        if offset in taken:
            return False
        taken.add(offset)
        return True

    def _kick(self, partial: bool = False) -> None:
        """Start judging buffered events: whole batches (``partial``: whatever is buffered), with
        at most ``batches_in_flight`` batches in flight and as many batches of pages waiting for
        answers.  Beyond that the pages partitions are paused until the backlog halves (bounded
        memory, and the shard and answers stages get the event loop).  Never blocks."""
        size = self.settings.batch_size
        # a record after a hole waits for the hole's records: pages are stored in offset order (the
        # order rule; with one partition the verdicts are scan's), also when faust skipped one.  An
        # owned partition's records wait until its committed offset is known (a hole shows only then)
        holes: dict[int, int] = {}  # partition -> the first offset not to take yet
        for p, o in self.outbox.offsets.items():
            if not o.known:
                if p in self.outbox.owned:
                    holes[p] = -1
            elif (h := o.hole()) is not None:
                holes[p] = h[0]
        if self._fillers and self._in_flight < self._max_in_flight:
            self._fillers = self._with_fillers()
        while self._fillers and self._in_flight < self._max_in_flight:  # they hold back the commits
            events, self._fillers = _before_holes(self._fillers, self._fitting(self._fillers, size), holes)
            if not events:
                break
            self._buffered_bytes -= sum(_size(e) for e in events)
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self.drain(events, self._generation))
            task.add_done_callback(self._drained)
        while self._buffer and self._in_flight < self._max_in_flight and len(self.pending) < self._max_waiting:
            if self._in_flight == 0 and not self.pending:  # an idle pipeline: a small batch first
                self._ramp = FIRST_BATCH
            fits = self._fitting(self._buffer, min(size, self._ramp))
            events, rest = _before_holes(self._buffer, fits, holes)
            if not events or not (partial or len(events) >= fits):
                break
            self._buffer = rest
            self._ramp = min(size, 2 * self._ramp)
            self._buffered_bytes -= sum(_size(e) for e in events)
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self.drain(events, self._generation))
            task.add_done_callback(self._drained)
        backlog = len(self.pending) + len(self._buffer) + len(self._fillers)
        held = self.pending.bytes + self._buffered_bytes
        tps = {tp for tp in self._assigned if tp.topic == self.settings.pages_topic}
        if not self._paused and (backlog >= 2 * self._max_waiting or held >= MAX_HELD_BYTES) and tps:
            self.app.consumer.pause_partitions(tps)
            self._paused = True
        elif (
            self._paused
            and backlog < self._max_waiting
            and held < MAX_HELD_BYTES // 2
            and cast(Any, self.app.tables).recovery.completed.is_set()
        ):
            self._paused = False
            asyncio.get_running_loop().create_task(self._resume(tps, self._generation))

    def _fitting(self, events: list, size: int) -> int:
        """How many of the first ``size`` events a batch takes: all, unless their values pass
        :data:`BATCH_BYTES` (then those within it, at least one).  (Summed only when everything
        buffered passes it: never for pages of tens of KiB.)"""
        if self._buffered_bytes <= BATCH_BYTES:
            return size
        total = 0
        for n, e in enumerate(events[:size]):
            total += _size(e)
            if total > BATCH_BYTES:
                return max(1, n)
        return size

    def _with_fillers(self) -> list:
        """The fillers (records read into a hole) in offset order, with the buffered records of
        their partitions before them: the fillers are judged whatever the back-pressure, and
        records held in the buffer by it must not be judged after them (offset order)."""
        last: dict[int, int] = {}
        for e in self._fillers:
            last[e.message.partition] = max(last.get(e.message.partition, -1), e.message.offset)
        before = [e for e in self._buffer if e.message.offset < last.get(e.message.partition, -1)]
        if before:
            self._buffer = [e for e in self._buffer if e.message.offset >= last.get(e.message.partition, -1)]
        return sorted(self._fillers + before, key=lambda e: (e.message.partition, e.message.offset))

    async def _resume(self, tps: set, generation: int) -> None:
        # faust drops the records of a paused partition that were fetched already: read them
        # again from the first one this worker has not seen (_take drops any seen twice).  Not
        # across a rebalance (recovery's `completed` stays set): the new assignment seeks and
        # resumes its partitions itself, and an old seek or resume would cut into its recovery
        for tp in tps:
            if generation != self._generation:
                return
            # the first offset not delivered; also for a partition that delivered nothing yet (its
            # records fetched before the pause were dropped too, and no later one shows a hole)
            o = self.outbox.offsets.get(tp.partition)
            first = None if o is None else o.after_delivered
            if (first := self._seen.get(tp.partition, first)) is not None:
                try:
                    await self._seek(tp, first)
                except Exception as e:  # resume anyway: a record skipped shows as a hole, read again
                    log.warning("cannot seek pages partition %d before resuming it: %r", tp.partition, e)
        if generation == self._generation:
            self.app.consumer.resume_partitions(tps)

    def _deliver(self, event: Any) -> None:
        """The pages agent's body: buffer a record the consumer delivered.  Never awaits: faust
        drops events when an agent's body blocks (docs/faust-notes.md §7)."""
        m = event.message
        if (m.partition, m.offset) in self.faults.skip:  # the test hook: lost as faust can lose it
            log.warning("test hook %s: dropping pages offset %d of partition %d", FAULT_ENV, m.offset, m.partition)
            self.faults.skip.discard((m.partition, m.offset))
            return
        self._heard_pages[m.partition] = time.monotonic()
        delivery = self.outbox.tracker(m.partition).deliver(m.offset)
        if delivery is Delivery.DUPLICATE:  # read again (a seek back): buffered or judged already
            return
        (self._fillers if delivery is Delivery.FILLER else self._buffer).append(event)
        self._buffered_bytes += _size(event)
        self._seen[m.partition] = max(self._seen.get(m.partition, 0), m.offset + 1)
        self._watch_holes(m.partition)
        if len(self._buffer) >= self.settings.batch_size or self._fillers or self._buffered_bytes > BATCH_BYTES:
            self._kick()

    def _watch_holes(self, partition: int) -> None:
        """Start filling the partition's holes if it has one and no filler runs for it now."""
        offsets = self.outbox.offsets.get(partition)
        if offsets is None or offsets.hole() is None:
            return
        running = self._hole_tasks.get(partition)
        if running is not None and running[0] == self._generation and not running[1].done():
            return
        task = asyncio.get_running_loop().create_task(self._fill_holes(partition, self._generation))
        self._hole_tasks[partition] = (self._generation, task)

    async def _fill_holes(self, partition: int, generation: int) -> None:
        """Read the records the consumer did not deliver, and judge them.

        faust can drop a record it fetched again after a pause/seek/resume or after recovery's
        seek, its read offset raised past it by a stale fetch, the first record of an assignment
        included (docs/faust-notes.md §10).  The outbox does not commit past such a hole, so
        the hole is read here, by a consumer of the outbox's own, and its records are judged
        like the others.  Not at once: a hole is also what recovery leaves for a moment when it
        hands out records fetched before its seek back to the committed offset.  An offset the
        read passes without a record (a transaction marker, or compacted) is let be; one that
        HOLE_READS reads in a row cannot reach is given up with a warning, so a partition is
        never stuck for good (reads that fail for an error give up only after
        HOLE_ERRORS_SECONDS of them)."""
        failures, erring_since = 0, None
        while True:
            await asyncio.sleep(HOLE_RECHECK_SECONDS)
            offsets = self.outbox.offsets.get(partition)
            if generation != self._generation or offsets is None or (hole := offsets.hole()) is None:
                return
            missing = offsets.missing(*hole)
            first, last = missing[0], missing[-1]  # (reading to the last one missing tells about each)
            log.info(
                "partition %d: %d offsets from %d to %d were not delivered (%s); reading them",
                partition,
                len(missing),
                first,
                last,
                _spans(missing),
            )
            try:
                records, reached = await self.outbox.read_range(partition, first, last)
                erring_since = None
            except Exception as e:
                log.warning("partition %d: cannot read offsets %d to %d (%r)", partition, first, last, e)
                records, reached = [], False
                erring_since = time.monotonic() if erring_since is None else erring_since
            if generation != self._generation or self.outbox.offsets.get(partition) is not offsets:
                return
            found = [r for r in records if offsets.deliver(r.offset) is not Delivery.DUPLICATE]
            read = [_Reread(_ReadMessage.of(r)) for r in found]
            self._fillers += read
            self._buffered_bytes += sum(_size(e) for e in read)
            if found:
                failures = 0  # progress: only reads that bring nothing count towards giving up
            if gone := offsets.missing(first, last):
                if reached:
                    log.info(
                        "partition %d: offsets %s hold no record (transaction markers or compaction); skipped",
                        partition,
                        _spans(gone),
                    )
                    self.metrics.offsets_skipped.labels("empty").inc(len(gone))
                    offsets.mark_empty(gone)
                elif (failures := failures + 1) >= HOLE_READS and (
                    erring_since is None or time.monotonic() - erring_since >= HOLE_ERRORS_SECONDS
                ):
                    log.warning(
                        "partition %d: offsets %s were not delivered and could not be read %d times; "
                        "committing past them without an outcome",
                        partition,
                        _spans(gone),
                        failures,
                    )
                    self.metrics.offsets_skipped.labels("unread").inc(len(gone))
                    offsets.mark_empty(gone)
                    failures = 0
            if found:
                log.info(
                    "partition %d: %d records read again (%s)", partition, len(found), _spans([r.offset for r in found])
                )
            self._kick(partial=True)  # the records read, and those held behind the hole if it is closed now
            self.outbox.schedule(partition)

    def _fenced(self, partition: int) -> None:
        """The output producer of an input partition this worker still owns was fenced: its
        transaction ran past the broker's timeout (the worker stalled), or another worker took the
        partition over without this one seeing it.  Either way the records it dropped would be
        read again only at a rebalance, and none after them committed: stop, so that a restart
        rejoins the group and reads the partition again from its committed offset."""
        message = (
            f"the output producer of pages partition {partition} was fenced while this worker still owns the "
            "partition (a transaction ran past the broker's timeout, or another worker took it over): stopping, "
            "so that a restart rejoins the group and reads the partition again from its committed offset"
        )
        log.critical("%s", message)
        self._crashing = asyncio.ensure_future(self.app.crash(RuntimeError(message)))

    async def _fingerprint(self, contents: list) -> Fingerprinted:
        """:func:`fingerprint_contents` in the pool.  A batch whose process died is run again in
        new processes (:class:`~streamdedup.stream.pool.FingerprintPool`); one that kills those
        too is run page by page, so the page that kills a process becomes a dead letter
        (``internal_error``) and the others are judged.  A batch that runs past its deadline
        (:func:`~streamdedup.stream.pool.deadline_seconds`) has its processes killed and is run
        page by page at once: a page past its own deadline is ``unparsable``."""
        assert self._pool is not None
        args = (self.settings.cluster_n, self.bands)
        for _ in range(2):
            try:
                return await self._in_pool(contents, args)
            except BrokenProcessPool:
                self.metrics.errors.labels("pool").inc()
            except TimeoutError as e:
                self.metrics.errors.labels("pool").inc()
                log.error("%s; running its %d pages one by one", e, len(contents))
                break
        else:
            log.error(
                "the fingerprinting processes died twice on a batch of %d pages; running it page by page",
                len(contents),
            )
        parts: list[tuple[int, Fingerprinted]] = []
        for i, content in enumerate(contents):
            try:
                parts.append((i, await self._in_pool([content], args)))
            except BrokenProcessPool:
                self.metrics.errors.labels("pool").inc()
                parts.append((i, process_died(self.bands)))
            except TimeoutError as e:
                self.metrics.errors.labels("pool").inc()
                parts.append((i, too_slow(str(e), self.bands)))
        return join_fingerprinted(parts, self.bands)

    async def _in_pool(self, contents: list, args: tuple) -> Fingerprinted:
        """:func:`fingerprint_contents` of ``contents`` in the pool, within its deadline
        (TimeoutError past it, after the pool's processes are killed)."""
        assert self._pool is not None
        seconds = deadline_seconds(sum(content_bytes(c) for c in contents))
        future = self._pool.submit(fingerprint_contents, contents, *args)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), seconds)
        except TimeoutError:
            self._pool.kill()
            raise TimeoutError(
                f"fingerprinting {len(contents)} page(s) took over {seconds:.0f}s: their processes were killed"
            ) from None

    def _drained(self, task: asyncio.Task) -> None:
        self._in_flight -= 1
        if not task.cancelled() and task.exception() is not None:
            log.error("a pages batch failed", exc_info=task.exception())
        self._kick()

    def close(self) -> None:
        if self._pool is not None:
            # waits for the pool's manager thread, which closes its wake-up pipe as it ends: with
            # wait=False, Python's exit hook (concurrent.futures' _python_exit) raced that close and
            # wrote to the closed pipe ("OSError: [Errno 9] Bad file descriptor" at 3 of ~31 exits)
            self._pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ failures
    async def _retrying(self, stage: str, attempt, events: Any, failed: Exception | None = None) -> Exception | None:
        """Run ``attempt(events)`` until it succeeds, at most RETRY_ATTEMPTS times with exponential
        backoff; returns the last error if it never did.  Every failure counts in the errors
        metric.  (The shard stage is idempotent: a page stored by a failed attempt is not stored
        twice, and a group answered twice counts once.)  ``failed``: the first attempt, made
        already, failed with it."""
        delay = RETRY_FIRST
        for n in range(1, RETRY_ATTEMPTS + 1):
            try:
                if n == 1 and failed is not None:
                    raise failed
                await attempt(events)
                return None
            except Exception as e:
                self.metrics.errors.labels(stage).inc()
                if n == RETRY_ATTEMPTS:
                    log.error("%s stage failed %d times; giving up on the batch", stage, n, exc_info=e)
                    return e
                log.warning(
                    "%s stage failed (attempt %d of %d): %r; retrying in %.1fs", stage, n, RETRY_ATTEMPTS, e, delay
                )
                await asyncio.sleep(delay)
                delay = min(2 * delay, RETRY_MAX)
        return None  # (not reached)

    async def _give_up_probes(self, events: list, error: Exception) -> None:
        """Answer every probe of a batch the shard stage gave up on with FAILED, so the pages'
        owners (this worker or another) send them to the dead-letter topic as internal_error."""
        replies = _failure_answers([(e.message.partition, e.value) for e in events], _describe(error, "shard stage"))
        try:
            for q, failed in replies.items():
                for chunk in _chunks(failed):
                    await self.answers_topic.send(value=encode(chunk, ANSWERS), partition=q)
        except Exception:
            log.exception("shard stage: cannot send the failure answers; their pages wait for a restart")

    def _give_up_answers(self, events: list, error: Exception) -> None:
        """The answers stage gave up on a batch: every page it names becomes a dead letter."""
        batches = []
        for e in events:
            try:
                batches.append(decode([e.value], ANSWERS))
            except Exception:
                log.exception("answers stage: an undecodable answers message (partition %d)", e.message.partition)
        self._give_up_answer_batches(batches, error)

    def _give_up_answer_batches(self, batches: list[Batch], error: Exception) -> None:
        why = _describe(error, "answers stage")
        touched: set[int] = set()
        for batch in batches:
            for request in batch.rows["request"].tolist():
                if (p := self.pending.fail_request(request, "internal_error", why)) is not None:
                    touched.add(p)
        for p in sorted(touched):
            self.outbox.schedule(p)

    # ------------------------------------------------------------------ stage 3: answers
    async def on_answers(self, events: list) -> None:
        await self._answer_batch(decode([e.value for e in events], ANSWERS))

    async def _answer_batch(self, batch: Batch) -> None:
        """The answers stage on one decoded batch (from the answers topic, or from a shard here)."""
        if self.faults:
            waiting = [self.pending.waiting(r) for r in batch.rows["request"].tolist()]
            self.faults.check("answers", [w.page_id or "" for w in waiting if w is not None])
        self._record_answers(batch)

    def _record_answers(self, batch: Batch) -> None:
        failed = batch.rows["distance"] == FAILED
        touched: set[int] = set()
        if failed.any():  # a shard gave up on these probes: their pages are dead letters
            gave_up = batch.select(failed)
            for request, why in zip(gave_up.rows["request"].tolist(), gave_up.ids()):
                if (p := self.pending.fail_request(request, "internal_error", why)) is not None:
                    touched.add(p)
            batch = batch.select(~failed)
        touched |= self.pending.answer(batch)
        for p in sorted(touched):
            self.outbox.schedule(p)

    # ------------------------------------------------------------------ stage 2: shards
    async def on_probes(self, events: list) -> None:
        if late := sorted({e.message.partition for e in events if not self.store.serves(e.message.partition)}):
            # taken before a rebalance moved them: left to the owner (their pages are read again)
            log.info("shard stage: probes for shard partitions %s not served here since a rebalance; left", late)
            events = [e for e in events if e.message.partition not in late]
        step, writes = self._store_probes([(e.message.partition, e.value) for e in events])
        await self._durable(writes)
        sent = []
        for q, answers in step.answers.items():
            for chunk in _chunks(answers):
                sent.append(await self.answers_topic.send(value=encode(chunk, ANSWERS), partition=q))
        await asyncio.gather(*sent)
        self._after_step(step)

    def _store_probes(self, messages: list[tuple[int, bytes]]) -> tuple[ShardStep, list[asyncio.Future]]:
        """The shard stage up to the changelog, with no await: probe and store ``messages``
        ((shard partition, value)) and hand their changelog records to the producer, so the
        changelog holds each shard's rows in the order it stored them.  Returns the step and the
        changelog sends (:meth:`_durable` awaits them).

        Rows a failed step stored without a changelog record are owed (``ShardStore.owed``): a
        retry finds them stored and does not store them again, so they are sent first with that
        shard's next rows (and a shard never answers before they are written)."""
        if self.faults:
            probes = [v for _, v in messages if kind_of(v) == PROBES]
            self.faults.check("shard", decode(probes, PROBES).ids() if probes else [])
        step = ShardStep()
        try:
            shard_step(self.store.shard, messages, now=int(time.time() * 1000), out=step)
        except Exception:
            for s, stored in step.changelog:  # stored before the failure
                self.store.owe(s, stored)
            raise
        for s, n in step.skipped:
            log.error("shard %d: skipping %d messages that are not probes", s, n)
        # the shards' writes still under way from steps before (the local path runs beside the
        # shard agent): awaited too, so no answer names a row whose write may yet fail
        writes = self.store.under_way(step.shards)
        owed = [(s, rows) for s in sorted(step.shards) for rows in self.store.take_owed(s)]
        records = owed + step.changelog
        for i, (s, stored) in enumerate(records):
            try:
                for chunk in _chunks(stored):
                    self._seq += 1
                    key = struct.pack("<I", s) + self._writer + struct.pack("<Q", self._seq)
                    self.store.shard(s).track(key, int(chunk.fetched.max()))  # (--retention: deleted once all expired)
                    sent = self._send_changelog(s, key, encode(chunk, CHANGELOG))
                    writes.append(self.store.sending(s, sent, rows=chunk))  # (owed if it fails)
            except Exception:  # (a bug, out of memory) the rows not handed to the producer stay owed
                for rest in records[i:]:  # (this one's chunks sent already are written twice: harmless)
                    self.store.owe(*rest)
                raise
        for s in sorted(step.shards):  # --retention: changelog records whose pages have all expired
            for key in self.store.shard(s).take_tombstones():
                writes.append(self.store.sending(s, self._send_changelog(s, key, None), tombstone=key))
        return step, writes

    def _send_changelog(self, partition: int, key: bytes, value: bytes | None) -> Any:
        """The producer's future of a changelog record (``value`` None: a tombstone).  A record the
        producer refuses at once is a failed future too, so :meth:`_durable` owes it again."""
        try:
            if self.faults.stage == "changelog" and value is not None and self.faults.times > 0:
                self.faults.times -= 1  # the test hook: a write the broker never gets
                raise RuntimeError(f"injected changelog failure (test hook {FAULT_ENV})")
            return self.table.send_changelog(partition, key, value, key_serializer="raw", value_serializer="raw")
        except Exception as e:
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(e)
            return failed

    async def _durable(self, writes: list[asyncio.Future]) -> None:
        """Await every changelog write of a step (and those under way before it): the shard's
        inserts are durable before anyone hears of them.  The first failure is raised once all
        are awaited.  (The store records each write's outcome as it lands: the offset covered,
        or what a failed one carried owed again.)"""
        error: BaseException | None = None
        for result in await asyncio.gather(*writes, return_exceptions=True):
            if isinstance(result, BaseException) and error is None:
                error = result
        if error is not None:
            raise error

    def _after_step(self, step: ShardStep) -> None:
        for s in step.shards:
            if (shard := self.store.shards.get(s)) is None:
                continue  # (it moved away while the step awaited its changelog writes)
            # (a compaction rewrote the shard's string files: the last snapshot no longer matches them)
            if compacted := shard.compacted:
                log.info("shard %d: expired pages compacted away, %d entries live", s, len(shard))
            if self.store.snapshot_due(s, self.settings.snapshot_interval) or compacted:
                self.store.snapshot(s, background=True)  # (queued for the store's writer thread; staggered)

    # ------------------------------------------------------------------ stage 2 here: shards this worker owns
    def _topic_waits(self, partition: int) -> bool:
        """Whether probes this worker sent to shard ``partition`` through the probes topic still wait
        for an answer (forgetting those answered)."""
        sent = self._via_topic.get(partition)
        if sent:
            sent[:] = [batch for batch in sent if self._still_waiting(batch).any()]
        return bool(sent)

    def _still_waiting(self, batch: Batch) -> np.ndarray:
        """For each probe row of ``batch``: whether its page still waits for that group's answer."""
        return np.array(
            [
                (w := self.pending.waiting(r)) is not None and bool(w.missing >> g & 1)
                for r, g in zip(batch.rows["request"].tolist(), batch.rows["group"].tolist())
            ],
            dtype=bool,
        )

    async def _hold_for_topic(self, partitions: list[int]) -> None:
        """Before a batch's probes go to a shard here for the first time: wait (at most
        LOCAL_HANDOVER seconds) for the probes sent there through the topic before (while the
        shard recovered), so the shard stores this worker's pages in the order it took them."""
        for gone in [p for p in self._via_topic if p not in self.store.active]:  # (moved away: forget them)
            del self._via_topic[gone]
        deadline = time.monotonic() + LOCAL_HANDOVER
        while any(self._topic_waits(s) for s in partitions) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def _local(self, partition: int) -> bool:
        """Whether this worker's probes for shard ``partition`` skip the probes and answers topics
        (with ``--local-shards``): the partition is active here and recovered, and none of this worker's
        probes sent there through the topic still waits."""
        return self.store.ready(partition) and not self._topic_waits(partition)

    def _probe_here(self, probes: dict[int, Batch]) -> _Here | None:
        """The shard stage, here and now (no await: inside the batch's turn, so the shards store
        this worker's pages in the order it took them), on the probes whose shard partition is
        :meth:`_local`; they are removed from ``probes``.  None if there are none."""
        local = [s for s in probes if self._local(s)]
        if not local:
            return None
        t0, batches = time.perf_counter(), [probes.pop(s) for s in local]
        self.metrics.probes.labels("local").inc(sum(len(b) for b in batches))
        messages = [(s, encode(chunk, PROBES)) for s, b in zip(local, batches) for chunk in _chunks(b)]
        try:
            step, writes = self._store_probes(messages)
        except Exception as e:
            return _Here(messages, None, [], e, t0)
        return _Here(messages, step, writes, None, t0)

    async def _finish_here(self, here: _Here) -> None:
        """The rest of :meth:`_probe_here` (which stored the pages): await the changelog, then
        answer the pages here.  A failure is retried (:meth:`_recover_here`)."""
        assert here.step is not None
        try:
            await self._durable(here.writes)
            self._after_step(here.step)
        except Exception as e:
            await self._recover_here(here.messages, e)
            return
        self.metrics.batch_seconds.labels("shard").observe(time.perf_counter() - here.t0)
        await self._answer_here(here.step)

    async def _recover_here(self, messages: list[tuple[int, bytes]], error: Exception) -> None:
        """Probes of shards here whose first attempt failed with ``error``: retried as the shard
        agent retries a batch; if they keep failing, their pages become dead letters."""
        if (last := await self._retrying("shard", self._retry_here, messages, failed=error)) is not None:
            for failed in _failure_answers(messages, _describe(last, "shard stage")).values():
                self._record_answers(failed)

    async def _retry_here(self, messages: list[tuple[int, bytes]]) -> None:
        """The shard stage on probes of shards here that failed: those of a shard no longer served
        here go through the probes topic to its owner now."""
        gone = {s for s, _ in messages if not self.store.serves(s)}
        for s, value in messages:
            if s in gone:
                await self.probes_topic.send(value=value, partition=s)
        step, writes = self._store_probes([(s, v) for s, v in messages if s not in gone])
        await self._durable(writes)
        self._after_step(step)
        await self._answer_here(step)

    async def _answer_here(self, step: ShardStep) -> None:
        """The answers stage on a step of shards here, its answers by input partition."""
        for answers in step.answers.values():
            if (error := await self._retrying("answers", self._answer_batch, answers)) is not None:
                self._give_up_answer_batches([answers], error)

    def answer_from_standbys(self, now: float | None = None) -> int:
        """Matches for pages stalled on a shard partition whose standby this worker holds.

        When a worker dies, its shard partitions answer nothing until the group expires it
        (``--session-timeout``), and every page waits.  A standby here can still *look*: a probe
        that has waited ``STANDBY_AFTER`` seconds on a partition silent for as long is checked
        against it (not stored), and a match
        is that group's answer.  A match is safe to use: the standby holds only pages in the
        changelog (a standby that owes rows, or has writes under way, does not answer), which the
        partition's next owner will also have before this page, so the rule
        (docs/stream-design.md) flags the page either way.  "No match" is not used: two copies
        checked during the stall would both find nothing, and the owner must store one before
        the other to flag the second.  A page with a match that waits only for stalled groups
        checked here is released as a near-duplicate (the page's probes still reach the owner,
        which stores it in its place).  Returns the matches taken."""
        now = time.monotonic() if now is None else now
        store = self.store
        # (a standby whose shard holds a row the changelog may lack does not answer for its owner)
        standby = {p for p in store.shards if p in store.assigned and p not in store.active and store.settled(p)}
        keep: list[tuple[float, int, Batch, np.ndarray]] = []
        for sent_at, shard_partition, batch in self._sent:
            waiting = self._still_waiting(batch)
            if waiting.any():
                keep.append((sent_at, shard_partition, batch, waiting))
            else:  # answered: forget it, and note that its shard partition is alive
                self._heard[shard_partition] = now
        self._sent = [entry[:3] for entry in keep]
        # silent: a standby here, and no probe sent there was answered for STANDBY_AFTER (a slow
        # but live owner keeps answering, and names the nearest match itself)
        silent = {p for p in standby if now - self._heard.get(p, -math.inf) >= STANDBY_AFTER}
        due: list[tuple[int, bytes]] = []
        stalled: dict[int, int] = defaultdict(int)  # request -> its groups checked here (a bitmask)
        for sent_at, shard_partition, batch, waiting in keep:
            if shard_partition in silent and now - sent_at >= STANDBY_AFTER:
                checked = batch.select(waiting)
                due.extend((shard_partition, encode(c, CHECKS)) for c in _chunks(checked))
                for r, g in zip(checked.rows["request"].tolist(), checked.rows["group"].tolist()):
                    stalled[r] |= 1 << g
        if not due:
            return 0
        step = shard_step(store.shard, due)
        touched: set[int] = set()
        taken = 0
        for answers in step.answers.values():
            matches = answers.select(answers.rows["distance"] >= 0)
            taken += len(matches)
            touched |= self.pending.answer(matches)
        # A page with a match is a near-duplicate whatever its other groups say: if all it still
        # waits for are stalled groups checked here, it goes now with the match it has (which may
        # not be the nearest one that the owners would have named)
        for r, groups in stalled.items():
            w = self.pending.waiting(r)
            if w is not None and w.best is not None and w.missing & ~groups == 0:
                for g in range(self.plan.n_groups):
                    if w.missing >> g & 1 and (p := self.pending.answer_one(r, g, -1)) is not None:
                        touched.add(p)
        for p in sorted(touched):
            self.outbox.schedule(p)
        if taken:
            log.info("answered %d stalled probes from standby shards %s", taken, sorted({p for p, _ in due}))
        return taken

    # ------------------------------------------------------------------ metrics
    def _on_sent(self, done: list[Waiting]) -> None:
        for w in done:  # committed: below outbox.committed from now on
            self._taken.get(w.partition, set()).discard(w.offset)
        self._kick()  # room for more
        self._last_sent = time.monotonic()
        m, now = self.metrics, time.time()
        for w in done:
            if w.reason is not None:
                m.dead_letters.labels(w.reason).inc()
                continue
            m.verdicts.labels(w.verdict).inc()
            if w.best is not None:
                m.match_distance.observe(match_distance(w) or 0)
                if w.similarity is not None:
                    m.match_similarity.observe(w.similarity)
            if (lat := latency_seconds(w, now)) is not None:
                m.latency.observe(lat)
            if w.taken_at is not None and w.probed_at is not None and w.answered_at is not None:
                if w.timestamp_ms is not None and w.timestamp_ms > 0:
                    m.phase.labels("read").observe(max(0.0, w.taken_at - w.timestamp_ms / 1000))
                m.phase.labels("fingerprint").observe(w.probed_at - w.taken_at)
                m.phase.labels("answers").observe(max(0.0, w.answered_at - w.probed_at))
                m.phase.labels("commit").observe(max(0.0, now - w.answered_at))

    async def _bulk_fault(self) -> None:
        """The test hook (FAULT_ENV) after each run the bulk replay restores."""
        if self.faults.stage == "bulk_replay_slow":
            await asyncio.sleep(self.faults.times)
        self.faults.check("bulk_replay", [])

    def _on_restored(self, partition: int, records: int) -> None:
        self.metrics.recovery_restored.inc(records)

    def _on_recovered(self) -> None:
        if self._recovery_started is not None:
            self.metrics.recovery_seconds.set(time.monotonic() - self._recovery_started)
        if self.faults.stage == "handover":  # the test hook: ready only s seconds later
            recovered, self.store._recovered = self.store._recovered, None
            asyncio.get_running_loop().call_later(self.faults.times, self._ready_now, recovered)

    def _ready_now(self, recovered: tuple[int | None] | None) -> None:
        """(The test hook ``handover``.)"""
        if recovered == (self.store._rebalance,):  # (the same assignment still)
            self.store._recovered, self._ready_at = recovered, time.monotonic()
            log.warning(HANDOVER_READY)


@dataclass
class _Here:
    """Probes given to shards this worker owns (Worker._probe_here): their messages, the step and
    its changelog sends, or the error of that first attempt."""

    messages: list[tuple[int, bytes]]
    step: ShardStep | None
    writes: list[asyncio.Future]
    error: Exception | None
    t0: float  # (perf_counter) when the step began


class _Stale(Exception):
    """A batch taken under an assignment that has been revoked since."""


@dataclass
class _ReadMessage:
    """A pages record read by the outbox's own consumer (:meth:`Outbox.read_range`), shaped as
    the part of faust's message the pages stage reads."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any
    timestamp: float  # seconds, as faust's

    @classmethod
    def of(cls, r: Any) -> _ReadMessage:
        return cls(r.partition, r.offset, r.key, r.value, list(r.headers or []), r.timestamp / 1000.0)


@dataclass
class _Reread:
    message: _ReadMessage


def _size(event: Any) -> int:
    """Bytes of an event's value (what holding it costs)."""
    return len(event.message.value or b"")


def _before_holes(events: list, size: int, holes: dict[int, int]) -> tuple[list, list]:
    """Up to ``size`` events, in order, that are not behind a hole of their partition (``holes``:
    partition -> its first offset not delivered), sorted by offset; and the others, in order.
    (Each partition's events come in offset order: the buffer's as delivered, the fillers'
    sorted by :meth:`Worker._with_fillers`.)"""
    if not holes:
        return events[:size], events[size:]
    take: list = []
    keep: list = []
    for e in events:
        m = e.message
        (take if len(take) < size and m.offset < holes.get(m.partition, m.offset + 1) else keep).append(e)
    take.sort(key=lambda e: (e.message.partition, e.message.offset))  # (fillers come in as read)
    return take, keep


def _spans(offsets: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9`` (for a log line)."""
    out: list[str] = []
    for o in sorted(offsets):
        if out and out[-1].split("-")[-1] == str(o - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{o}"
        else:
            out.append(str(o))
    return ", ".join(out[:20]) + (f", ... ({len(out)} spans)" if len(out) > 20 else "")


class _Faults:
    """The test hook behind FAULT_ENV (documented there); empty and falsy unless it is set."""

    def __init__(
        self, stage: str = "", times: int = 0, match: str | None = None, skip: set[tuple[int, int]] | None = None
    ) -> None:
        self.stage, self.times, self.match, self.skip = stage, times, match, skip or set()

    @classmethod
    def from_env(cls, spec: str) -> _Faults:
        if not spec:
            return cls()
        stage, _, what = spec.partition(":")
        if stage == "skip":
            pairs = [item.split(":") for item in what.split(",")]
            return cls(stage, skip={(int(p), int(o)) for p, o in pairs})
        if what.startswith("id="):
            return cls(stage, 0, what[3:])
        return cls(stage, int(what or "1"))

    def __bool__(self) -> bool:
        return bool(self.stage)

    def check(self, stage: str, ids: list[str]) -> None:
        if stage != self.stage:
            return
        if self.match is not None and any(self.match in i for i in ids):
            raise RuntimeError(f"injected {stage} failure (test hook {FAULT_ENV}, id contains {self.match!r})")
        if self.match is None and self.times > 0:
            self.times -= 1
            raise RuntimeError(f"injected {stage} failure (test hook {FAULT_ENV}, {self.times} more to come)")


def _describe(error: Exception, stage: str) -> str:
    return f"{stage} failed {RETRY_ATTEMPTS} times: {type(error).__name__}: {error}"[:1000]


def _failure_answers(messages: list[tuple[int, bytes]], why: str) -> dict[int, Batch]:
    """FAILED answers (``why`` in the id column) to every probe of ``messages`` ((shard partition,
    value)), by the input partition that waits for them: a shard stage gave up on them."""
    replies: dict[int, list[Batch]] = defaultdict(list)
    for s, value in messages:
        try:
            if kind_of(value) != PROBES:  # a check's request times out on its own
                continue
            probes = decode([value], PROBES)
        except Exception:
            log.exception("shard stage: an undecodable probes message (partition %d)", s)
            continue
        dest = probes.rows["partition"]
        failed = Batch.build(
            group=probes.rows["group"],
            fps=0,
            fetched=0,
            id_hash=0,
            request=probes.rows["request"],
            distance=FAILED,
            partition=dest,
            ids=[why] * len(probes),
            urls=[""] * len(probes),
            kind=ANSWERS,
        )
        for q in np.unique(dest).tolist():
            replies[q].append(failed.select(dest == q))
    return {q: Batch.concat(parts) for q, parts in replies.items()}


def _chunks(batch: Batch):
    """``batch`` in pieces of at most MAX_ROWS rows and MAX_MESSAGE_BYTES bytes (a row is 48
    bytes, plus its extra bytes in the band modes (at most ~1.5 KiB), plus its id and url, which
    intake bounds), so no internal message can exceed the broker's default limit of 1 MiB."""
    width = 0 if batch.extra is None else batch.extra.shape[1]
    sizes = 48 + width + batch.rows["id_len"].astype(np.int64) + batch.rows["url_len"]
    if len(batch) <= MAX_ROWS and int(sizes.sum()) <= MAX_MESSAGE_BYTES:
        yield batch
        return
    start, ends = 0, np.cumsum(sizes)
    while start < len(batch):
        base = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, base + MAX_MESSAGE_BYTES, side="right"))
        stop = min(max(stop, start + 1), start + MAX_ROWS, len(batch))
        yield batch.select(np.arange(start, stop))
        start = stop


#: POST /check's answer to a compressed body (``Content-Encoding``).
UNCOMPRESSED = {
    "error": "send the page record uncompressed (no Content-Encoding): a compressed body is refused",
    "reason": "unsupported_encoding",
}


def _headers(headers: Any) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, dict) else headers
    return [(k if isinstance(k, str) else k.decode("utf-8", "replace"), v if v is not None else b"") for k, v in items]
