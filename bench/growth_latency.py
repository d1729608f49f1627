"""p99 produce -> verdict while a worker's index grows past 10 M pages (issue 11), on a real broker.

    python bench/growth_latency.py [--pages 10000000] [--runs 1] [--rate PAGES_S] [--seconds 300]
                                   [--fill-rate 0] [--lead 0.3] [--big ENTRIES] [--snapshot-interval 300]
                                   [--out bench/out/growth]

One run:

1. A fresh app; its shard changelog is filled with --pages synthetic pages
   (``stream_bench.write_changelog``, 4 rows a page); one worker replays it and is Ready.
2. The worker's runs are read (bench/growth_probe: every BlockIndex logs its sorted runs on
   request) and, from the merge rule (``BlockIndex.MERGE_RATIO``, ``SMALL_RUN``), the bench
   computes for each of the shard's group indexes how many more pages it takes until a merge of
   at least --big entries starts (a replay leaves runs shaped by its batches: the next merge of
   the biggest runs may be millions of pages away).  If the nearest is further than the window
   brings, the worker is stopped (it writes its snapshots), the changelog is topped up with
   synthetic pages to bring it --lead of the window's pages before that merge, and the worker is
   started again (snapshots + the changelog tail); then the runs are read again (at most 3 times).
3. The set-up's dirty pages are written back (``sync``; --no-sync: not).
   The window (--seconds): corpus pages produced at --rate (default: half the rate of one worker
   on a corpus backlog, measured first), each under a new id, and at the same time synthetic
   small pages at --fill-rate if given (more growth, more load; their latency is reported apart).
   The top-up of step 2 alone brings the big merges into the window.
   Every timed page's verdict latency is recorded: p50/p90/p99/max, and the worst per second.
4. From the worker's log: the merges that started in the window (BlockIndex logs those of at
   least ``LOG_MERGE_MIN`` entries at INFO: size, seconds, thread), and the snapshots written
   (when each write started, its seconds, how long it waited for the writer thread).  The worker snapshots every --snapshot-interval
   (default 300 s, the worker's own), its shards staggered over the interval: a window of 300 s
   holds one round of them, as a worker's steady state does.

Worker logs are copied to --out; the worker's data (row files, snapshots) are removed after
each run.  Prints one JSON line a run, then the medians.  See bench/README.md ("p99 while the
index grows past 10 M pages").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_bench import (
    LOG_TIME,
    MAX_RECORD,
    ROOT,
    WORKERS,
    LocalKafka,
    Paced,
    Verdicts,
    backlog,
    fresh_app,
    load_pages,
    new_worker,
    stop_all,
    timed_start,
    write_changelog,
)

from streamdedup.index.blocks import BlockIndex

PROBE = Path(__file__).resolve().parent / "growth_probe"  # its sitecustomize instruments the worker
RUNS = re.compile(r"growth-probe: runs of mask (0x[0-9a-f]+): \[([\d, ]*)\] pending \[([\d, ]*)\]")
# BlockIndex's own log line (INFO from BlockIndex.LOG_MERGE_MIN entries); it is logged when the merge ends
MERGE = re.compile(r"index merge of (\d+) entries \((\d+) \+ (\d+)\) in ([\d.]+)s, mask 0x[0-9a-f]+, thread (\S+)")
SNAPSHOT = re.compile(
    r"snapshot of shard (\d+): (\d+) entries to changelog offset \d+ in ([\d.]+)s(?: \(taken ([\d.]+)s before\))?"
)
WORDS = np.array(
    "page index shard merge stream worker broker verdict table group block run entry latency window crawl fetch "
    "near duplicate simhash fingerprint bucket directory offset partition record batch replay snapshot commit "
    "thread loop queue produce consume answer probe store order rule nearest first stored canonical".split()
)


def next_big_merge(runs: list[int], big: int, add: int = 8, limit: int = 1 << 22) -> int | None:
    """Entries added (``add`` at a time, as a live worker adds them) until a merge of at least
    ``big`` entries starts, by BlockIndex's rule (a run is merged into the one before it while it
    is at least 1/MERGE_RATIO of it, or the one before is small); None if not within ``limit``."""
    runs, added = list(runs), 0
    while added <= limit:
        i = len(runs) - 2
        while i >= 0:
            old, new = runs[i], runs[i + 1]
            if BlockIndex.MERGE_RATIO * new >= old or old < BlockIndex.SMALL_RUN:
                if old + new >= big:
                    return added
                runs[i : i + 2] = [old + new]
                i = min(i, len(runs) - 2)
            else:
                i -= 1
        runs.append(add)
        added += add
    return None


async def read_runs(w, trigger: Path) -> list[tuple[int, list[int]]]:
    """Every big BlockIndex of the worker: (its key mask, its run lengths), from its log."""
    since = w.log_path.stat().st_size
    trigger.touch()
    await asyncio.to_thread(w.wait_for_log, "growth-probe: runs done", 60, since)
    text = w.log_path.read_bytes()[since:].decode("utf-8", "replace")
    return [(int(m[1], 16), [int(x) for x in m[2].split(",") if x.strip()]) for m in RUNS.finditer(text)]


def pages_to_merge(indexes: list[tuple[int, list[int]]], big: int, partitions: int) -> list[int]:
    """For each index, pages until its next merge of >= big entries (an index gets 1/partitions of
    the pages: each page's probe for its group goes to one partition)."""
    out = []
    for _, runs in indexes:
        n = next_big_merge(runs, big)
        out.append(-1 if n is None else n * partitions)
    return sorted(out)


def synthetic_pages(n: int, seed: int) -> list[dict]:
    """Small pages of random words, all different: they grow the index at little fingerprinting cost."""
    rng = np.random.default_rng(seed)
    words = WORDS[rng.integers(0, len(WORDS), size=(n, 80))]
    return [
        {
            "id": f"fill-{seed}-{i}",
            "url": f"https://fill.example.org/{seed}/{i}.html",
            "content": "<html><body><p>" + " ".join(row) + "</p></body></html>",
            "content_type": "text/html",
            "fetched_at": "2024-01-01T00:00:00Z",
        }
        for i, row in enumerate(words.tolist())
    ]


def in_window(w, pattern: re.Pattern, t0: float, t1: float) -> list[tuple[float, re.Match]]:
    """Log lines matching pattern, logged between t0 and t1 (epoch seconds)."""
    out = []
    for line in w.log_path.read_text("utf-8", "replace").splitlines():
        if (m := pattern.search(line)) and (t := LOG_TIME.match(line)):
            at = time.mktime(time.strptime(t[1], "%Y-%m-%d %H:%M:%S")) + int(t[2]) / 1000
            if t0 <= at <= t1:
                out.append((at, m))
    return out


async def one_run(kafka, args, records: list[dict], rate: float, number: int) -> dict:
    topics, settings = await fresh_app(kafka, args.partitions)
    out: dict = {"pages_seeded": args.pages, "rate_per_s": rate, "fill_rate_per_s": args.fill_rate}
    t0 = time.monotonic()
    rows, nbytes = await write_changelog(kafka, settings, args.pages, args.rows_per_record)
    out["seed_write_s"] = time.monotonic() - t0
    trigger = args.workdir / f"trigger-{topics.app_id}"
    env = {
        "PYTHONPATH": os.pathsep.join([str(PROBE), str(ROOT)]),
        "GROWTH_PROBE_TRIGGER": str(trigger),
        "STREAMDEDUP_SNAPSHOT_INTERVAL": str(args.snapshot_interval),
    }
    w = new_worker(kafka, topics, args.workdir, env=env)
    ready, _, (bulk_rows, bulk_s) = await timed_start(w)
    out.update({"replay_ready_s": ready, "replay_bulk_rows": bulk_rows})
    window_pages = int((rate + args.fill_rate) * args.seconds)
    seeded, topups = args.pages, []
    for attempt in range(args.top_ups + 1):
        indexes = await read_runs(w, trigger)
        due = pages_to_merge(indexes, args.big, args.partitions)
        print(f"# {seeded:,} pages: next merge >= {args.big:,} entries in pages {due}", file=sys.stderr, flush=True)
        nearest = min((d for d in due if d >= 0), default=-1)
        # (a merge due sooner than --lead is in the window too: only one beyond it calls for a
        # top-up; none found within the simulation's limit, none)
        if attempt == args.top_ups or nearest <= window_pages * (1 - args.lead / 2):
            break
        top_up = nearest - int(window_pages * args.lead)
        await asyncio.to_thread(w.stop, 300)
        await write_changelog(kafka, settings, top_up, args.rows_per_record, first=seeded)
        seeded += top_up
        topups.append(top_up)
        await timed_start(w)
    out.update({"pages_before_window": seeded, "top_ups": topups, "pages_to_big_merges": due})
    if not args.no_sync:
        # The set-up leaves GBs in the page cache (the changelog fill in the broker's logs, the
        # replay's row files, the snapshots of each restart): the kernel writes them back in
        # bursts of up to 1 GB a second within ~30 s, and a window's first seconds stalled with
        # them (bench/README.md).  Written back now: the window measures the steady state.
        t0 = time.monotonic()
        await asyncio.to_thread(os.sync)
        out["sync_s"] = time.monotonic() - t0
    out["entries_per_index_before"] = sorted(sum(runs) for _, runs in indexes)
    out["runs_of_an_index_before"] = indexes[0][1] if indexes else []
    fill = synthetic_pages(int(args.fill_rate * args.seconds) + 1, number)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, max_request_size=2 * MAX_RECORD)
    timed, filler = (
        Paced(producer, topics.pages, records, "lat"),
        Paced(producer, topics.pages, fill, "fill"),
    )
    warmup = 10 * args.partitions  # not counted: the first transaction on a partition starts its producer
    await producer.start()
    try:
        async with Verdicts(kafka, topics.verdicts) as got:
            await asyncio.gather(*[await timed.send() for _ in range(warmup)])
            await got.wait(warmup, args.timeout)
            load0, w0 = os.getloadavg(), time.time()
            spy = None
            if args.profile:  # py-spy on the worker (its threads apart) for the whole window
                spy = subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(w.proc.pid), "--threads",
                     "--rate", "50", "--duration", str(int(args.seconds)), "--format", "raw", "--nonblocking",
                     "--output", str(args.out / f"run{number}-{topics.app_id}-pyspy.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            jobs = [timed.run(rate, args.seconds)]
            if args.fill_rate:
                jobs.append(filler.run(args.fill_rate, args.seconds))
            await asyncio.gather(*jobs)
            await got.wait(timed.count + filler.count, args.timeout)
            w1, load1 = time.time(), os.getloadavg()
            if spy is not None:
                await asyncio.to_thread(spy.wait, 120)
    finally:
        await producer.stop()
    sent = list(timed.sent.items())[warmup:]
    lat = np.array([got.at[k] - t for k, t in sent])
    at = np.array([t - w0 for _, t in sent])
    p50, p90, p99 = np.percentile(lat, [50, 90, 99])
    worst = np.zeros(int(at.max()) + 1)
    np.maximum.at(worst, at.astype(int), lat)
    fill_lat = np.array([got.at[k] - t for k, t in filler.sent.items()]) if filler.sent else np.zeros(1)
    merges = [
        {
            "entries": int(m[1]),
            "runs": [int(m[2]), int(m[3])],
            "thread": m[5],
            "start_s": round(at_ - float(m[4]) - w0, 2),
            "seconds": float(m[4]),
        }
        for at_, m in in_window(w, MERGE, w0 - 60, w1 + 1)
        if at_ - float(m[4]) >= w0  # (started in the window)
    ]
    snapshots = [  # at_s: when its write started (after waiting its turn for the writer thread)
        {
            "shard": int(m[1]),
            "entries": int(m[2]),
            "at_s": round(at_ - float(m[3]) - w0, 2),
            "seconds": float(m[3]),
            "queued_s": float(m[4] or 0),
        }
        for at_, m in in_window(w, SNAPSHOT, w0, w1 + 1)
    ]
    out.update(
        {
            "window_s": w1 - w0,
            "pages": len(lat),
            "fill_pages": filler.count,
            "p50_s": p50,
            "p90_s": p90,
            "p99_s": p99,
            "max_s": float(lat.max()),
            "over_500ms": int((lat > 0.5).sum()),
            "fill_p99_s": float(np.percentile(fill_lat, 99)),
            "worst_by_second": [round(float(x), 3) for x in worst],
            "merges": merges,
            "big_merges": [m for m in merges if m["entries"] >= args.big],
            "snapshots": snapshots,
            "load_before": [round(x, 2) for x in load0],
            "load_after": [round(x, 2) for x in load1],
        }
    )
    out["log_problems"] = await stop_all([w])
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copy(w.log_path, args.out / f"run{number}-{topics.app_id}-worker.log")
    shutil.rmtree(w.dir, ignore_errors=True)  # the row files and snapshots (GBs at 10 M pages)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=ROOT / "bench/data/corpus.jsonl")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--pages", type=int, default=10_000_000, help="synthetic pages in the changelog at the start")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--rate", type=float, help="timed pages/s (default: half one worker's rate on a backlog)")
    p.add_argument("--rate-pages", type=int, default=2000, help="corpus pages of the backlog that measures it")
    p.add_argument("--seconds", type=float, default=300.0, help="the window (300: one round of snapshots in it)")
    p.add_argument("--fill-rate", type=float, default=0.0, help="synthetic pages/s besides, during the window")
    p.add_argument("--lead", type=float, default=0.3, help="the first big merge after this part of the window")
    p.add_argument("--big", type=int, help="entries of a big merge (default: 40%% of an index: 0.4 pages/partitions)")
    p.add_argument(
        "--snapshot-interval",
        type=float,
        default=300.0,
        help="the worker's --snapshot-interval (its default; a window of as many seconds holds one round)",
    )
    p.add_argument(
        "--top-ups", type=int, default=3, help="at most this many top-ups (0: the window right after the replay)"
    )
    p.add_argument(
        "--no-sync", action="store_true", help="start the window without writing the set-up's dirty pages back first"
    )
    p.add_argument("--profile", action="store_true", help="py-spy the worker during the window (raw stacks to --out)")
    p.add_argument("--rows-per-record", type=int, default=250, help="changelog rows per Kafka record")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the verdicts")
    p.add_argument("--out", type=Path, default=ROOT / "bench/out/growth", help="where the worker logs are kept")
    p.add_argument("--workdir", type=Path, help="the workers' data (default: a temporary dir, removed)")
    args = p.parse_args()
    args.big = args.big or max(BlockIndex.BACKGROUND_MIN, int(0.4 * args.pages / args.partitions))
    keep, args.workdir = args.workdir is not None, args.workdir or Path(tempfile.mkdtemp(prefix="growth-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    records, _ = load_pages(args.corpus, max(args.rate_pages, 1000))
    kafka = LocalKafka(name=f"growth-{os.getpid()}").start()
    try:
        print(
            f"# {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, Kafka "
            f"{kafka.version}; load {os.getloadavg()}; {args.pages:,} pages seeded, {args.partitions} partitions",
            flush=True,
        )
        asyncio.run(backlog(kafka, args, records[:20], 1))  # a new broker's first group and transaction
        rate = args.rate
        if not rate:
            r, _ = asyncio.run(backlog(kafka, args, records[: args.rate_pages], 1))
            rate = r["per_s"] / 2
            print(f"# one worker on a backlog of {args.rate_pages} corpus pages: {r['per_s']:.1f} pages/s", flush=True)
        runs = []
        for i in range(args.runs):
            runs.append(asyncio.run(one_run(kafka, args, records, rate, i)))
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in runs[-1].items()}), flush=True)
        for key in ("p50_s", "p90_s", "p99_s", "max_s", "over_500ms"):
            print(f"median {key}: {statistics.median(r[key] for r in runs):,.3f}")
    finally:
        for w in WORKERS:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
        kafka.stop()
        if not keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
