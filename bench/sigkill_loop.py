"""SIGKILL a worker under CPU load, again and again, and check that no input record is lost.

One run: fresh topics (4 partitions), two workers (``--workers``), a first wave of records
(valid pages with a few bad records between them) produced in one go; one worker is SIGKILLed
while the wave is judged, restarted, SIGKILLed again while it joins and recovers, restarted,
and a second wave is produced; the survivor keeps judging through every rebalance this causes.  Then every output topic (verdicts, unique, near-duplicate, dead-letter) is read to its
end offsets with read_committed, and every input (partition, offset) must have exactly one
outcome: one verdict (which names its partition and offset) or one dead letter (found by its
unique key).  A run fails if any record has none or two.

    python bench/sigkill_loop.py --runs 50             # a private broker, 2 busy processes
    python bench/sigkill_loop.py --runs 20 --load 3 --workers 1 --brokers 127.0.0.1:9092
    python bench/sigkill_loop.py --runs 10 --copies 0.3 --standby-replicas 1   # + one unique per copy cluster

Run from the repository root with the project's venv; it starts its own Kafka broker from
deploy/local unless --brokers is given.  Prints one line per run and a summary; exits 1 if any
run lost or doubled a record.  Worker logs of failed runs are kept under --workdir.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's broker and worker harness

from kafka_broker import LocalKafka  # noqa: E402
from stream_harness import StreamTopics, WorkerProcess, page_record, produce  # noqa: E402
from topics import read_topic  # noqa: E402


class Broker:
    """An existing broker given by address (the harness only needs these two)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def client_kwargs(self) -> dict:
        return {"bootstrap_servers": self.bootstrap}

    def create_topic(self, name: str, partitions: int) -> None:
        import asyncio

        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        async def run() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                await admin.create_topics([NewTopic(name, partitions, 1)])
            finally:
                await admin.close()

        asyncio.run(run())


def _busy() -> None:  # pragma: no cover - a CPU hog for the load
    while True:
        pass


def records(run: int, wave: int, n: int, rng: random.Random, copies: float = 0.0, made: list | None = None) -> list:
    """``n`` inputs with unique keys: pages of random words, every 13th a bad record.  ``copies``:
    the share of pages that copy the content of an earlier page of the run (``made``: the
    contents so far, extended here)."""
    out = []
    made = [] if made is None else made
    for i in range(n):
        key = f"r{run}-w{wave}-{i}"
        if i % 13 == 5:
            out.append((key.encode(), b"not json at all " + key.encode()))
            continue
        if made and rng.random() < copies:
            content = rng.choice(made)
        else:
            content = "<p>" + " ".join(f"w{rng.randrange(20000)}" for _ in range(120)) + "</p>"
            made.append(content)
        out.append(page_record(f"http://loop.test/{key}", content, id=key))
    return out


def clusters_with_not_one_unique(kafka, topics: StreamTopics) -> list[tuple[int, int]]:
    """Pages of equal content form a cluster, of which exactly one must be ``unique`` (the order
    rule: every other copy is flagged against one stored before it); the clusters where that
    fails, as (pages, unique verdicts)."""
    content = {}
    for r in read_topic(kafka, topics.pages, timeout=60):
        try:
            content[(r.partition, r.offset)] = json.loads(r.value)["content"]
        except ValueError:
            continue  # a bad record
    unique: dict[str, int] = {}
    size: dict[str, int] = {}
    for r in read_topic(kafka, topics.verdicts, timeout=60):
        v = json.loads(r.value)
        c = content.get((v["partition"], v["offset"]))
        if c is not None:
            size[c] = size.get(c, 0) + 1
            unique[c] = unique.get(c, 0) + (v["verdict"] == "unique")
    return [(size[c], unique[c]) for c in size if unique[c] != 1]


def produced_offsets(kafka, topic: str) -> dict[str, tuple[int, int]]:
    """Every input record's key -> (partition, offset), read back from the pages topic."""
    return {r.key.decode(): (r.partition, r.offset) for r in read_topic(kafka, topic, timeout=60)}


def outcomes(kafka, topics: StreamTopics, where: dict[str, tuple[int, int]]) -> dict[tuple[int, int], list[str]]:
    """(partition, offset) -> the outcomes found for it on the output topics (read to their end)."""
    found: dict[tuple[int, int], list[str]] = {}
    for r in read_topic(kafka, topics.verdicts, timeout=60):
        v = json.loads(r.value)
        found.setdefault((v["partition"], v["offset"]), []).append(v["verdict"])
    for r in read_topic(kafka, topics.dead_letter, timeout=60):
        reason = dict(r.headers).get("streamdedup-reason", b"?").decode()
        found.setdefault(where.get(r.key.decode(), (-1, -1)), []).append(f"dead:{reason}")
    return found


def check(kafka, topics: StreamTopics) -> tuple[list, list, int]:
    """(records with no outcome, records with more than one, inputs) -- read to the end offsets."""
    where = produced_offsets(kafka, topics.pages)
    found = outcomes(kafka, topics, where)
    missing = sorted(po for po in where.values() if po not in found)
    doubled = sorted(po for po, o in found.items() if len(o) > 1)
    return missing, doubled, len(where)


def _spawn(w: WorkerProcess) -> None:
    """Start a worker process without waiting for it to be ready (to kill it while it recovers)."""
    w._log = open(w.log_path, "ab")
    w.proc = subprocess.Popen(
        [sys.executable, "-m", "streamdedup", "worker"], env=w.env, stdout=w._log, stderr=subprocess.STDOUT, cwd=w.dir
    )


def one_run(
    kafka,
    run: int,
    workdir: Path,
    n: int,
    seed: int,
    workers: int,
    deadline_s: float = 300.0,
    copies: float = 0.0,
    standby_replicas: int = 0,
):
    """One run; returns (ok, detail).  With 2 workers the survivor keeps judging through every
    rebalance the victim's deaths and restarts cause (batches in flight while partitions move)."""
    rng = random.Random(seed)
    made: list[str] = []
    topics = StreamTopics.fresh(kafka, partitions=4)
    env = {"STREAMDEDUP_BATCH_SIZE": "40", "STREAMDEDUP_STANDBY_REPLICAS": str(standby_replicas)}
    ws = [WorkerProcess(kafka, topics, workdir / f"run{run}", name=f"w{i}", env=env) for i in range(workers)]
    victim = ws[-1]
    total = n + n // 2
    try:
        for w in ws:
            w.start(timeout=120)
        produce(kafka, topics.pages, records(run, 0, n, rng, copies, made))
        time.sleep(rng.uniform(0.5, 3.0))
        victim.kill()  # during the stream
        victim._log.close()
        _spawn(victim)  # restart, and kill again while it joins and recovers
        time.sleep(rng.uniform(4.0, 16.0))
        victim.kill()
        victim._log.close()
        victim.start(timeout=120)
        produce(kafka, topics.pages, records(run, 1, n // 2, rng, copies, made))
        end = time.monotonic() + deadline_s
        while True:
            missing, doubled, inputs = check(kafka, topics)
            if (inputs == total and not missing) or time.monotonic() > end:
                break
            time.sleep(2.0)
        time.sleep(2.0)  # a last read after a pause: anything judged twice shows up now
        missing, doubled, inputs = check(kafka, topics)
        bad_clusters = clusters_with_not_one_unique(kafka, topics) if copies else []
    finally:
        for w in ws:
            w.__exit__(None, None, None)
    ok = not missing and not doubled and inputs == total and not bad_clusters
    detail = f"inputs {inputs}/{total}, no outcome {len(missing)}, two outcomes {len(doubled)}"
    if copies:
        detail += f", copy clusters without exactly one unique page {len(bad_clusters)} {bad_clusters[:4]}"
    if missing:
        detail += f"; missing {missing[:6]}{'...' if len(missing) > 6 else ''}"
    if doubled:
        detail += f"; doubled {doubled[:6]}"
    if ok:
        shutil.rmtree(workdir / f"run{run}", ignore_errors=True)
    else:
        detail += f"; logs in {workdir / f'run{run}'}"
    return ok, detail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--records", type=int, default=600, help="records in the first wave (the second has half)")
    ap.add_argument("--load", type=int, default=2, help="busy processes running during the loop")
    ap.add_argument("--workers", type=int, default=2, help="workers; the last one is killed (default 2)")
    ap.add_argument("--brokers", help="an existing broker (default: start a private one from deploy/local)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--copies", type=float, default=0.0, help="share of pages that copy an earlier page (0..1)")
    ap.add_argument("--standby-replicas", type=int, default=0, help="the workers' --standby-replicas")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stop-on-failure", action="store_true")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sigkill-loop-"))
    kafka = Broker(args.brokers) if args.brokers else LocalKafka(name=f"bench-sigkill-{int(time.time())}").start()
    hogs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    failures = errors = 0
    try:
        for run in range(args.runs):
            t0 = time.monotonic()
            try:
                ok, detail = one_run(
                    kafka,
                    run,
                    workdir,
                    args.records,
                    args.seed * 1000 + run,
                    args.workers,
                    copies=args.copies,
                    standby_replicas=args.standby_replicas,
                )
            except (AssertionError, OSError) as e:  # the harness, not the worker (a web port taken...)
                errors += 1
                print(f"run {run + 1}/{args.runs}: not counted, the harness failed: {str(e)[-300:]}", flush=True)
                continue
            failures += not ok
            print(
                f"run {run + 1}/{args.runs}: {'ok' if ok else 'FAILED'} ({time.monotonic() - t0:.0f}s) {detail}",
                flush=True,
            )
            if not ok and args.stop_on_failure:
                break
    finally:
        for h in hogs:
            h.terminate()
        if isinstance(kafka, LocalKafka):
            kafka.stop()
    print(
        f"{failures} failed of {run + 1 - errors} runs ({errors} not counted; load: {args.load} busy processes; "
        f"workdir {workdir})",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
