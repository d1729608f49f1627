"""The worker's pages stage alone: raw HTML pages -> fingerprints through its process pool, by pool size.

    python bench/pool_scaling.py [--corpus bench/data/corpus.jsonl] [--pages 2000] [--runs 3]
                                 [--processes 0 1 2 4] [--batch-size 500]

Issue 10 asks that the pages stage never be the bottleneck on a multi-core machine, with
``--fingerprint-processes`` scaling measured 1 -> 2 -> 4 where the cores allow.  This drives the
production pieces as the worker does, without Kafka: the records' cheap checks
(``pipeline.intake.parse``) on the calling thread, then ``fingerprint_contents`` of each batch in
``stream.pool.fingerprint_pool(N)`` (``N = 0``: on the calling thread, as ``--fingerprint-processes
0``), with at most ``in_flight`` batches in the pool at once: the worker's limit
(``stream.app.batches_in_flight(N)``) and, for comparison, the fixed 2 it had before.

Prints one JSON line a run (pages/s for every setting, measured in turns in the same run) and
the medians.  Rates are wall time: the pool's processes use whatever cores are free.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

from streamdedup.pipeline.intake import Record, fingerprint_contents, parse
from streamdedup.stream.app import batches_in_flight
from streamdedup.stream.pool import fingerprint_pool

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 5 * 2**20


def load(path: Path, n: int) -> list[Record]:
    out = []
    with path.open() as f:
        for i, line in zip(range(n), f):
            page = json.loads(line)
            value = json.dumps({k: page[k] for k in ("id", "url", "content", "content_type")}).encode()
            out.append(Record(0, i, page["id"].encode(), value))
    return out


async def stage(records: list[Record], pool, in_flight: int, batch_size: int) -> float:
    """Seconds to fingerprint every batch, at most in_flight batches in the pool at once."""
    loop, slots = asyncio.get_running_loop(), asyncio.Semaphore(in_flight)

    async def one(batch: list[Record]) -> None:
        try:
            contents = parse(batch, MAX_BYTES).contents()
            if pool is None:
                fingerprint_contents(contents)
            else:
                await loop.run_in_executor(pool, fingerprint_contents, contents)
        finally:
            slots.release()

    t0, tasks = time.perf_counter(), []
    for s in range(0, len(records), batch_size):
        await slots.acquire()
        tasks.append(asyncio.ensure_future(one(records[s : s + batch_size])))
    await asyncio.gather(*tasks)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=ROOT / "bench/data/corpus.jsonl")
    p.add_argument("--pages", type=int, default=2000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--processes", type=int, nargs="+", default=[0, 1, 2, 4])
    p.add_argument("--batch-size", type=int, default=500, help="the worker's --batch-size")
    args = p.parse_args()
    records = load(args.corpus, args.pages)
    settings = []  # (name, processes, batches in flight)
    for n in args.processes:
        settings.append((f"p{n}", n, batches_in_flight(n)))
        if n > 1 and batches_in_flight(n) != 2:
            settings.append((f"p{n}_fixed2", n, 2))
    pools = {n: fingerprint_pool(n) if n else None for n in args.processes}
    print(
        f"# {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}; {len(records)} pages, "
        f"batches of {args.batch_size}; settings (name, processes, batches in flight): {settings}",
        flush=True,
    )
    try:
        for name, n, f in settings:  # not counted: the pools' start (numba's cache), first calls
            asyncio.run(stage(records[: args.batch_size * max(n, 1)], pools[n], f, args.batch_size))
        runs = []
        for _ in range(args.runs):
            r = {}
            for name, n, f in settings:
                r[f"{name}_per_s"] = len(records) / asyncio.run(stage(records, pools[n], f, args.batch_size))
            base = r.get("p1_per_s")
            if base:
                r |= {f"{k[:-6]}_vs_p1": v / base for k, v in r.items() if k.endswith("_per_s") and k != "p1_per_s"}
            r["load_avg"] = os.getloadavg()[0]
            runs.append(r)
            print(json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
        for key in runs[0]:
            values = [r[key] for r in runs]
            print(f"median {key}: {statistics.median(values):,.3f} ({min(values):,.3f}..{max(values):,.3f})")
    finally:
        for pool in pools.values():
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)


if __name__ == "__main__":
    main()
