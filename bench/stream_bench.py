"""The stream worker end to end on a private local broker: throughput, latency, recovery, scaling.

    python bench/stream_bench.py --runs 3 [--pages 3000] [--latency-seconds 20] [--recovery-pages 500000]
                                 [--recovery-env STREAMDEDUP_SESSION_TIMEOUT=60 ...] [--worker-env NAME=VALUE ...]

Each run uses fresh topics and app ids and prints one JSON line; then the medians.  See
bench/README.md ("Stream worker") for what every figure means.

1. tput_*: the first --pages corpus pages as a backlog for 1 worker, verdicts/s; the in-process
   ``scan_pages`` rate on the same records; stream/scan (goal >= 0.75).
2. lat_*: pages produced at half the rate of (1), verdict latency p50/p90/p99/max (goal p99 <= 0.5 s).
3. rec_*: a synthetic shard changelog replayed by a new worker (its dirty pages written back first: --no-sync), then a restart from its snapshots
   (goal >= 500,000 fingerprints/s).
4. two_*: the backlog of (1) through 2 workers.  The broker and the workers share the cores.
5. alg_*: (``--only algorithms``) the backlog of (1) for 1 worker of each --algorithm (simhash,
   minhash, combined --k 10), in the same run; alg_minhash_vs_simhash is the issue-12 goal (>= 0.7).

The broker (tests/kafka_broker.py) is started here and stopped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import re
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from kafka_broker import LocalKafka  # noqa: E402
from stream_harness import READY, StreamTopics, WorkerProcess, produce  # noqa: E402

from streamdedup.engine.dedup import Deduplicator  # noqa: E402
from streamdedup.engine.records import read_jsonl  # noqa: E402
from streamdedup.engine.scan import scan_pages  # noqa: E402
from streamdedup.pipeline.shard import ShardPlan  # noqa: E402
from streamdedup.pipeline.wire import CHANGELOG, Batch, encode  # noqa: E402
from streamdedup.settings import Settings  # noqa: E402
from streamdedup.stream.app import internal_topics, table_design  # noqa: E402
from streamdedup.stream.run import ensure_topics  # noqa: E402

SETTLED, ASSIGNED = "[^---Recovery]: Worker ready", "Executing _on_partitions_assigned"
MAX_RECORD = 1_000_000  # the broker's default message.max.bytes is 1 MiB: larger pages are left out
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")
PROBLEM = re.compile(r"\[(WARNING|ERROR|CRITICAL)\]|^Traceback")
BENIGN = re.compile(r"because it is rebalancing|GroupCoordinatorNotAvailableError")  # every join; a new broker
#: faust's check that its consumer thread's loop answers (mode.threads, 3 s): a worker the bench
#: stopped (SIGSTOP) while it produced the backlog fails it once it is resumed
PAUSED = re.compile(r"Thread keepalive is not responding")
WORKERS: list[WorkerProcess] = []  # every worker started, killed at the end if still running


def load_pages(path: Path, n: int) -> tuple[list[dict], int]:
    """The first n corpus pages that fit in a Kafka record, as crawler records; and how many did not."""
    base, out, skipped = datetime(2024, 1, 1, tzinfo=UTC), [], 0
    with path.open("rb") as f:
        for line in f:
            p = json.loads(line)
            rec = {
                "id": p["id"],
                "url": p["url"],
                "content": p["content"],
                "content_type": "text/html",
                "fetched_at": (base + timedelta(seconds=len(out))).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            if len(json.dumps(rec)) > MAX_RECORD:
                skipped += 1
                continue
            out.append(rec)
            if len(out) == n:
                break
    return out, skipped


async def fresh_app(kafka, partitions: int) -> tuple[StreamTopics, Settings]:
    """New topics and app id, every topic created before a worker starts."""
    topics = await asyncio.to_thread(StreamTopics.fresh, kafka, partitions)
    settings = Settings.from_sources({}, {**topics.env(), "STREAMDEDUP_BROKERS": kafka.bootstrap})
    await ensure_topics(settings)
    return topics, settings


def new_worker(kafka, topics: StreamTopics, workdir: Path, name: str = "w", env: dict | None = None) -> WorkerProcess:
    WORKERS.append(WorkerProcess(kafka, topics, workdir / topics.app_id, name=name, env=env))
    return WORKERS[-1]


def worker_env(args) -> dict[str, str]:
    """--worker-env: settings for the workers of the throughput, latency and scaling tests."""
    return dict(e.split("=", 1) for e in args.worker_env)


async def start_workers(
    kafka, topics: StreamTopics, workdir: Path, n: int, env: dict | None = None
) -> list[WorkerProcess]:
    """Start n workers at once; wait until all are Ready and the group has not changed for 2 s."""
    ws = [new_worker(kafka, topics, workdir, f"w{i}", env) for i in range(n)]
    await asyncio.gather(*(asyncio.to_thread(w.start, 120) for w in ws))
    while (
        not all(log_times(w, SETTLED) for w in ws)
        or time.time() - max(t for w in ws for text in (READY, SETTLED) for t in log_times(w, text)) < 2
    ):
        await asyncio.sleep(0.2)
    return ws


def log_times(w: WorkerProcess, text: str, since: int = 0) -> list[float]:
    """Epoch times of the worker's log lines (from byte `since`) that contain text."""
    lines = w.log_path.read_bytes()[since:].decode("utf-8", "replace").splitlines()
    return [
        time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1000
        for line in lines
        if text in line and (m := LOG_TIME.match(line))
    ]


async def stop_all(ws: list[WorkerProcess], paused: bool = False) -> int:
    """SIGTERM the workers; the number of warnings, errors and tracebacks in their logs (shown on
    stderr).  ``paused``: the bench stopped them for a while (the lines that causes are left out)."""
    await asyncio.gather(*(asyncio.to_thread(w.__exit__, None, None, None) for w in ws))
    bad = [
        f"{w.log_path}: {line}"
        for w in ws
        for line in w.log_path.read_text("utf-8", "replace").splitlines()
        if PROBLEM.search(line) and not BENIGN.search(line) and not (paused and PAUSED.search(line))
    ]
    for line in bad[:20]:
        print("#   " + line[:300], file=sys.stderr)
    return len(bad)


class Verdicts:
    """A read_committed consumer of a verdicts topic: when each page's first verdict arrived, and what it was.
    ``dead_letter``: that topic's records count too, by their key (verdict ``dead_letter``): a page
    the worker cannot judge (no text) gets one instead of a verdict."""

    def __init__(self, kafka, topic: str, dead_letter: str | None = None) -> None:
        self.dead_letter = dead_letter
        self.consumer = AIOKafkaConsumer(
            topic,
            *([dead_letter] if dead_letter else []),
            bootstrap_servers=kafka.bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            enable_auto_commit=False,
            fetch_max_wait_ms=50,
        )
        self.at: dict[str, float] = {}
        self.verdict: dict[str, str] = {}
        self.received = 0

    async def __aenter__(self) -> Verdicts:
        await self.consumer.start()
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=20)
            now = time.time()
            for tp, msgs in batches.items():
                for m in msgs:
                    if tp.topic == self.dead_letter:
                        page, verdict = m.key.decode(), "dead_letter"
                    else:
                        v = json.loads(m.value)
                        page, verdict = v["id"], v["verdict"]
                    self.received += 1
                    self.at.setdefault(page, now)
                    self.verdict.setdefault(page, verdict)

    async def wait(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.at) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self.at)} of {n} verdicts within {timeout}s")
            await asyncio.sleep(0.05)

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        await self.consumer.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants so far (Linux /proc)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
    return total


def broker_cpu_seconds(kafka) -> float:
    """CPU seconds of the broker so far (its pid file), 0.0 if it cannot be read."""
    try:
        return cpu_seconds(int((kafka.run_dir / "kafka.pid").read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return 0.0


def broker_jit_seconds(kafka) -> float:
    """CPU seconds of the broker's JIT compiler threads so far (HotSpot's ``C1/C2 CompilerThread``s),
    0.0 if they cannot be read.  A new broker compiles Kafka's hot paths during its first minutes of
    load, with up to half a core of the 2 here (bench/README.md, "A warm broker")."""
    total = 0.0
    try:
        pid = int((kafka.run_dir / "kafka.pid").read_text().split()[0])
        for task in Path(f"/proc/{pid}/task").iterdir():
            stat = (task / "stat").read_text()
            if stat[stat.index("(") + 1 : stat.rindex(")")].startswith(("C1 CompilerThre", "C2 CompilerThre")):
                fields = stat.rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return total


def scan_rate(records: list[dict]) -> tuple[float, float, dict]:
    """Pages/s of the embedded engine on the same records, its CPU ms per page; its verdicts."""
    data, out = "".join(json.dumps(r) + "\n" for r in records).encode(), io.StringIO()
    t0, c0 = time.perf_counter(), time.process_time()
    scan_pages(read_jsonl(io.BytesIO(data)), Deduplicator("simhash"), out, 256)
    rate, cpu = len(records) / (time.perf_counter() - t0), (time.process_time() - c0) * 1000 / len(records)
    return rate, cpu, {v["id"]: v["verdict"] for v in map(json.loads, out.getvalue().splitlines())}


async def backlog(kafka, args, records: list[dict], n_workers: int, env: dict | None = None) -> tuple[dict, dict]:
    """n workers on a backlog of records.  They are paused (SIGSTOP) once the group has settled, the
    records are produced, and they are resumed: the backlog is there at once, as if produced before
    they started, and no worker starts alone (the broker's first generation does not wait for a second
    member, which joins ~3 s later, at the first one's next heartbeat)."""
    topics, _ = await fresh_app(kafka, args.partitions)
    async with Verdicts(kafka, topics.verdicts) as got:
        ws = await start_workers(kafka, topics, args.workdir, n_workers, env)
        for w in ws:
            w.proc.send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            await asyncio.to_thread(produce, kafka, topics.pages, records)
            if time.monotonic() - t0 > 6:  # the group's session timeout is 10 s
                print(f"# producing took {time.monotonic() - t0:.1f}s: a rebalance may follow", file=sys.stderr)
        finally:
            for w in ws:
                w.proc.send_signal(signal.SIGCONT)
        t0, cpu0, broker0 = time.time(), sum(cpu_seconds(w.proc.pid) for w in ws), broker_cpu_seconds(kafka)
        jit0 = broker_jit_seconds(kafka)
        await got.wait(len(records), args.timeout)
        cpu = sum(cpu_seconds(w.proc.pid) for w in ws) - cpu0  # the workers and their pool processes
        broker_cpu, jit = broker_cpu_seconds(kafka) - broker0, broker_jit_seconds(kafka) - jit0
        seconds = time.time() - t0
    t = sorted(got.at.values())
    lo, hi = int(0.1 * len(t)), int(0.9 * len(t)) - 1
    steady = (hi - lo) / (t[hi] - t[lo]) if t[hi] > t[lo] else float("nan")  # nan: all in one commit
    return {
        "per_s": len(t) / (t[-1] - t0),
        "steady_per_s": steady,
        "first_verdict_s": t[0] - t0,
        "cpu_ms_per_page": cpu * 1000 / len(t),
        "broker_cpu_ms_per_page": broker_cpu * 1000 / len(t),
        "broker_jit_cores": jit / seconds,
        "load_avg": os.getloadavg()[0],
        "duplicates": got.received - len(t),
        "rebalances": sum(x > t0 for w in ws for x in log_times(w, SETTLED)),
        "log_problems": await stop_all(ws, paused=True),
    }, got.verdict


async def throughput(kafka, args, records: list[dict]) -> dict:
    scan_per_s, scan_cpu, scan = scan_rate(records)
    # a record scan refuses (a page without text) goes to the worker's dead-letter topic, not to verdicts:
    # the backlog waits for a verdict per record, so it gets only the records that have one
    judged = [r for r in records if r["id"] in scan]
    if len(judged) < len(records):
        print(f"# {len(records) - len(judged)} record(s) refused by scan left out of the backlog", file=sys.stderr)
    r, stream = await backlog(kafka, args, judged, 1, worker_env(args))
    return {
        "scan_per_s": scan_per_s,
        "scan_cpu_ms_per_page": scan_cpu,
        "cpu_scan_vs_stream": scan_cpu / r["cpu_ms_per_page"],
        "per_s": r.pop("per_s"),
        "steady_per_s": r.pop("steady_per_s"),
        "near_duplicates": sum(v == "near_duplicate" for v in stream.values()),
        "near_duplicates_scan": sum(v == "near_duplicate" for v in scan.values()),
        "verdicts_differ_from_scan": sum(stream.get(k) != v for k, v in scan.items()),
        **r,
    }


class Paced:
    """Pages sent at a fixed rate (what is due every ~15 ms), each under a new id ``<prefix><i>-<id>``,
    with its produce time (``sent``: id -> the ``time.time()`` just before ``send``)."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, records: list[dict], prefix: str = "lat") -> None:
        self.producer, self.topic, self.records, self.prefix = producer, topic, records, prefix
        self.sent: dict[str, float] = {}
        self.count = 0

    async def send(self) -> asyncio.Future:
        i, self.count = self.count, self.count + 1
        r = self.records[i % len(self.records)]
        r = dict(r, id=f"{self.prefix}{i}-{r['id']}", fetched_at=datetime.now(UTC).isoformat())
        self.sent[r["id"]] = time.time()
        return await self.producer.send(self.topic, json.dumps(r).encode(), key=r["id"].encode())

    async def run(self, rate: float, seconds: float, stop: asyncio.Event | None = None) -> None:
        """Send ``rate * seconds`` pages at ``rate`` (sooner done if ``stop`` is set); wait for their acks.
        Acked sends are dropped as it goes, so the end waits only for the rest: a gather over every
        send future (~88,000 in growth_latency.py's window) scheduled all their callbacks at once,
        and the verdicts read meanwhile were stamped late (bench/README.md, growth)."""
        total, pending, t0 = int(rate * seconds), [], time.monotonic()
        for i in range(total):
            while time.monotonic() - t0 < i / rate:
                await asyncio.sleep(0.015)
            if stop is not None and stop.is_set():
                break
            pending.append(await self.send())
            if len(pending) >= 1024:
                pending = [f for f in pending if not f.done()]
        await asyncio.gather(*pending)


async def latency(kafka, args, records: list[dict], rate: float, seconds: float | None = None) -> dict:
    """Pages produced at `rate` (what is due every ~15 ms) to an idle worker for `seconds` (default:
    --latency-seconds); verdict time - produce time."""
    topics, _ = await fresh_app(kafka, args.partitions)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, max_request_size=2 * MAX_RECORD)
    paced = Paced(producer, topics.pages, records)
    warmup = 10 * args.partitions  # not counted: the first transaction on a partition starts its producer
    await producer.start()
    try:
        # (with --pages over ~9,000, the pages include one that scan refuses: a dead letter)
        async with Verdicts(kafka, topics.verdicts, topics.dead_letter) as got:
            ws = await start_workers(kafka, topics, args.workdir, 1, worker_env(args))
            await asyncio.gather(*[await paced.send() for _ in range(warmup)])
            await got.wait(warmup, args.timeout)
            cpu0, broker0 = cpu_seconds(ws[0].proc.pid), broker_cpu_seconds(kafka)
            jit0, t0 = broker_jit_seconds(kafka), time.monotonic()
            phases0 = phase_histograms(ws[0])
            await paced.run(rate, args.latency_seconds if seconds is None else seconds)
            await got.wait(paced.count, args.timeout)
            cpu = cpu_seconds(ws[0].proc.pid) - cpu0  # the worker and its pool processes
            broker_cpu = broker_cpu_seconds(kafka) - broker0
            jit_cores = (broker_jit_seconds(kafka) - jit0) / (time.monotonic() - t0)
            load = os.getloadavg()[0]
            await asyncio.sleep(0.5)  # (the worker observes a page's phases just after its commit)
            phases = phase_figures(phases0, phase_histograms(ws[0]))
    finally:
        await producer.stop()
    lat = np.array([got.at[k] - t for k, t in paced.sent.items()])
    p50, p90, p99 = np.percentile(lat[warmup:], [50, 90, 99])
    return {
        "rate_per_s": rate,
        "pages": paced.count - warmup,
        "p50_s": p50,
        "p90_s": p90,
        "p99_s": p99,
        "max_s": lat[warmup:].max(),
        "warmup_max_s": lat[:warmup].max(),
        "cpu_ms_per_page": cpu * 1000 / max(1, paced.count - warmup),
        "broker_cpu_ms_per_page": broker_cpu * 1000 / max(1, paced.count - warmup),
        "broker_jit_cores": jit_cores,
        "load_avg": load,
        "dead_letters": sum(v == "dead_letter" for v in got.verdict.values()),
        **phases,
        "log_problems": await stop_all(ws),
    }


async def write_changelog(kafka, settings: Settings, pages: int, per_record: int, first: int = 0) -> tuple[int, int]:
    """The shard changelog of `pages` random pages as workers write it: each (page, group) row in the
    partition ShardPlan.probes gives it, per_record rows to a record; returns (rows, bytes).  `first`:
    the number of the first page (another first gives other pages: more of them, appended)."""
    plan = ShardPlan(table_design(settings), settings.partitions)
    rng = np.random.default_rng(first)
    fps, id_hash = rng.integers(0, 2**64, size=(2, pages), dtype=np.uint64)
    numbers = range(first, first + pages)
    fetched = 1_700_000_000_000 + 100 * np.arange(first, first + pages, dtype=np.int64)
    urls = [f"https://docs.example.org/section-{i % 997}/chapter-{i % 31}/page-{i:08d}.html" for i in numbers]
    ids = [f"example-docs/v{i % 7}/section-{i % 997}/chapter-{i % 31}/page-{i:08d}" for i in numbers]
    dest = plan.probes(fps).ravel()  # row j is (page j // n_groups, group j % n_groups)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5, max_batch_size=1 << 20)
    futures, nbytes, writer = [], 0, struct.pack("<Q", time.time_ns())
    await producer.start()
    try:
        for p in range(settings.partitions):
            rows = np.flatnonzero(dest == p)
            for s in range(0, len(rows), per_record):
                page, group = np.divmod(rows[s : s + per_record], plan.n_groups)
                value = encode(
                    Batch.build(
                        group=group,
                        fps=fps[page],
                        fetched=fetched[page],
                        id_hash=id_hash[page],
                        ids=[ids[i] for i in page],
                        urls=[urls[i] for i in page],
                    ),
                    CHANGELOG,
                )
                key = struct.pack("<I", p) + writer + struct.pack("<Q", len(futures))  # unique, as the worker's
                futures.append(await producer.send(internal_topics(settings)["changelog"], value, key=key, partition=p))
                nbytes += len(value)
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(dest), nbytes


def shard_rows(w: WorkerProcess) -> int:
    """Fingerprints in the worker's shards, from its /metrics (a gauge updated every 5 s)."""
    for _ in range(15):
        text = urllib.request.urlopen(f"http://127.0.0.1:{w.web_port}/metrics", timeout=5).read().decode()
        if total := sum(int(float(v)) for v in re.findall(r"^streamdedup_shard_fingerprints\{.*\} (\S+)$", text, re.M)):
            return total
        time.sleep(1)
    return 0


def phase_histograms(w: WorkerProcess) -> dict[str, dict[str, float]]:
    """The worker's streamdedup_page_phase_seconds: phase -> {"sum", "count", le: cumulative count}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{w.web_port}/metrics", timeout=5).read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "streamdedup_page_phase_seconds":
            for sample in family.samples:
                kind = sample.name.rsplit("_", 1)[1]  # bucket, sum or count
                out.setdefault(sample.labels["phase"], {})[sample.labels["le"] if kind == "bucket" else kind] = (
                    sample.value
                )
    return out


def phase_figures(before: dict, after: dict) -> dict[str, float]:
    """Per phase over a window (two scrapes): the mean and the p99 (the bucket bound it falls in)."""
    out = {}
    for phase, h in after.items():
        b = before.get(phase, {})
        n = h["count"] - b.get("count", 0.0)
        if n <= 0:
            continue
        out[f"phase_{phase}_mean_s"] = (h["sum"] - b.get("sum", 0.0)) / n
        bounds = sorted((float(le), c - b.get(le, 0.0)) for le, c in h.items() if le not in ("sum", "count"))
        out[f"phase_{phase}_p99_le_s"] = next(le for le, c in bounds if c >= 0.99 * n)
    return out


BULK = re.compile(r"bulk replay of \S+ from offsets .*?: (\d+) records, (\d+) rows in ([\d.]+)s")


async def timed_start(w: WorkerProcess) -> tuple[float, float, tuple[int, float]]:
    """Seconds from process start to Ready, and from partitions assigned to recovery done (from its
    log); the rows the bulk changelog replay restored, and its seconds (0, 0.0 if it did not run)."""
    since = w.log_path.stat().st_size if w.log_path.exists() else 0
    t0 = time.time()
    await asyncio.to_thread(w.start, 900)
    ready, settled, assigned = (log_times(w, text, since)[0] for text in (READY, SETTLED, ASSIGNED))
    bulk = BULK.findall(w.log_path.read_bytes()[since:].decode("utf-8", "replace"))
    return ready - t0, settled - assigned, (sum(int(b[1]) for b in bulk), sum(float(b[2]) for b in bulk))


async def recovery(kafka, args) -> dict:
    topics, _ = await fresh_app(kafka, args.partitions)
    env = dict(e.split("=", 1) for e in args.recovery_env)
    empty = new_worker(kafka, topics, args.workdir, env=env)
    startup, assign, _ = await timed_start(empty)  # the same start with an empty changelog
    problems = await stop_all([empty])
    topics, settings = await fresh_app(kafka, args.partitions)
    rows, nbytes = await write_changelog(kafka, settings, args.recovery_pages, args.rows_per_record)
    groups = rows // args.recovery_pages
    out = {"rows": rows, "groups": groups, "changelog_mb": nbytes / 2**20, "startup_empty_s": startup}
    if not args.no_sync:  # the set-up's dirty pages (the changelog just written) written back first, as
        t0 = time.monotonic()  # on a real restart (the kernel would throttle the replay's own writes behind them)
        await asyncio.to_thread(os.sync)
        out["setup_sync_s"] = time.monotonic() - t0
    w = new_worker(kafka, topics, args.workdir, env=env)
    for kind in ("replay", "snapshot"):  # the second start loads the snapshots the first wrote on SIGTERM
        total, span, (bulk_rows, bulk_s) = await timed_start(w)
        out.update(
            {
                f"{kind}_ready_s": total,  # from the process start to Ready, measured (the goal's figure)
                f"{kind}_s": total - startup,
                f"{kind}_rows_per_s": rows / (total - startup),
                f"{kind}_pages_per_s": rows / groups / (total - startup),
                f"{kind}_log_s": span - assign,
                f"{kind}_log_rows_per_s": rows / (span - assign),
                f"{kind}_restored_rows": await asyncio.to_thread(shard_rows, w),
                f"{kind}_bulk_rows": bulk_rows,  # of them, restored by the bulk replay (the rest by faust's)
                f"{kind}_bulk_rows_per_s": bulk_rows / bulk_s if bulk_s else 0.0,
            }
        )
        t0 = time.monotonic()
        await asyncio.to_thread(w.stop, 300)
        out[f"{kind}_stop_s"] = time.monotonic() - t0  # includes writing a snapshot of every shard
    for kind in ("replay", "snapshot"):  # a 10M-page restart, linearly, plus the fixed startup
        out[f"{kind}_10M_pages_s"] = startup + 10_000_000 * groups / out[f"{kind}_log_rows_per_s"]
    out["log_problems"] = problems + await stop_all([w])
    return out


async def warm_up(kafka, args, records: list[dict]) -> None:
    """Load the new broker as the runs will (a backlog, then pages at half its rate) for at least
    --warmup-seconds, unmeasured: a long-running broker has compiled Kafka's hot paths, a new one
    spends its first minutes of load compiling them (up to half a core here) and answers slower
    meanwhile.  Each pass prints its figures as a comment line."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.warmup_seconds:
        tput = await throughput(kafka, args, records)
        seconds = min(30.0, max(5.0, args.warmup_seconds - (time.monotonic() - t0)))
        lat = await latency(kafka, args, records, tput["per_s"] / 2, seconds)
        print(
            f"# warm-up (not measured): backlog {tput['per_s']:,.0f} pages/s with the broker's JIT at "
            f"{tput['broker_jit_cores']:.2f} cores; p99 {lat['p99_s']:.3f} s at {lat['rate_per_s']:,.0f} pages/s "
            f"with it at {lat['broker_jit_cores']:.2f} cores",
            flush=True,
        )


async def one_run(kafka, args, records: list[dict]) -> dict:
    out: dict = {}

    def add(prefix: str, figures: dict) -> None:
        out.update({f"{prefix}_{k}": v for k, v in figures.items()})

    if args.only & {"throughput", "scaling"} or ("latency" in args.only and not args.latency_rate):
        add("tput", await throughput(kafka, args, records))
        out["tput_stream_vs_scan"] = out["tput_per_s"] / out["tput_scan_per_s"]
        out["tput_steady_vs_scan"] = out["tput_steady_per_s"] / out["tput_scan_per_s"]
    if "latency" in args.only:
        add("lat", await latency(kafka, args, records, args.latency_rate or out["tput_per_s"] / 2))
    if "recovery" in args.only:
        add("rec", await recovery(kafka, args))
    if "algorithms" in args.only:
        modes = [("simhash", 3), ("minhash", 3), ("combined", 10)]
        args.rotation = getattr(args, "rotation", -1) + 1  # each run starts with another mode: load drifts
        for algorithm, k in modes[args.rotation % 3 :] + modes[: args.rotation % 3]:
            env = {"STREAMDEDUP_ALGORITHM": algorithm, "STREAMDEDUP_K": str(k)}
            r, verdicts = await backlog(kafka, args, records, 1, env)
            out[f"alg_{algorithm}_per_s"], out[f"alg_{algorithm}_steady_per_s"] = r["per_s"], r["steady_per_s"]
            out[f"alg_{algorithm}_cpu_ms_per_page"] = r["cpu_ms_per_page"]
            out[f"alg_{algorithm}_near_duplicates"] = sum(v == "near_duplicate" for v in verdicts.values())
        for algorithm in ("minhash", "combined"):
            out[f"alg_{algorithm}_vs_simhash"] = out[f"alg_{algorithm}_per_s"] / out["alg_simhash_per_s"]
            cpu = out["alg_simhash_cpu_ms_per_page"] / out[f"alg_{algorithm}_cpu_ms_per_page"]
            out[f"alg_{algorithm}_cpu_vs_simhash"] = cpu
    if "scaling" in args.only:
        add("two", (await backlog(kafka, args, records, 2, worker_env(args)))[0])
        out["two_vs_one"] = out["two_per_s"] / out["tput_per_s"]
        out["two_steady_vs_one"] = out["two_steady_per_s"] / out["tput_steady_per_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=ROOT / "bench/data/corpus.jsonl")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--pages", type=int, default=3000, help="pages of the backlog (throughput, scaling)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--latency-seconds", type=float, default=20.0)
    p.add_argument(
        "--warmup-seconds",
        type=float,
        default=60.0,
        help="load the new broker this long before the runs, unmeasured (its JIT compiler's warm-up; 0: none)",
    )
    p.add_argument("--latency-rate", type=float, help="pages/s for the latency test (default: half of tput_per_s)")
    p.add_argument("--recovery-pages", type=int, default=500_000)
    p.add_argument("--rows-per-record", type=int, default=250, help="changelog rows per Kafka record")
    p.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the throughput, latency and scaling workers, e.g. STREAMDEDUP_BATCH_TIMEOUT=0.02",
    )
    p.add_argument(
        "--recovery-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the recovery test's workers, e.g. STREAMDEDUP_BULK_REPLAY_TIMEOUT=30 (repeatable)",
    )
    p.add_argument(
        "--only", default="throughput,latency,recovery,scaling", help="comma-separated tests (also: algorithms)"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the verdicts of a test")
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="recovery: start the replay without writing the changelog's dirty pages back first",
    )
    p.add_argument("--workdir", type=Path, help="worker logs and data, kept (default: a temporary dir, removed)")
    args = p.parse_args()
    args.only = set(args.only.split(","))
    keep, args.workdir = args.workdir is not None, args.workdir or Path(tempfile.mkdtemp(prefix="stream-bench-"))
    records, skipped = load_pages(args.corpus, args.pages)
    kib = sum(len(r["content"]) for r in records) / len(records) / 1024
    kafka = LocalKafka(name=f"bench-{os.getpid()}").start()
    try:
        cpus = os.cpu_count()
        print(
            f"# {platform.machine()}, {cpus} cpus, Python {platform.python_version()}, Kafka {kafka.version} (the "
            f"broker, the workers and this script share the {cpus} cpus); {len(records)} pages, {kib:.1f} KiB of "
            f"HTML on average ({skipped} over {MAX_RECORD:,} bytes left out); {args.partitions} partitions",
            flush=True,
        )
        asyncio.run(backlog(kafka, args, records[:20], 1))  # not measured: a new broker's first group and
        runs = []  # first transaction create its internal topics
        if args.only & {"throughput", "latency", "scaling", "algorithms"} and args.warmup_seconds > 0:
            asyncio.run(warm_up(kafka, args, records))
        for _ in range(args.runs):
            runs.append(asyncio.run(one_run(kafka, args, records)))
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in runs[-1].items()}), flush=True)
        for key in runs[0]:
            print(f"median {key}: {statistics.median(r[key] for r in runs):,.3f}")
    finally:
        for w in WORKERS:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()  # only after an error or Ctrl-C: every test stops its workers
        kafka.stop()
        if not keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
