"""Time of one shard step on a few pages, as a worker at a low rate takes them (issue 10's p99).

    python bench/small_step_bench.py                        # steps of 1, 4 and 16 pages, 3 runs
    python bench/small_step_bench.py --stored 1000000 --runs 5

A shard of the worker's plan (``WORKER_DESIGN``, every group, ids and URLs in string files as
the worker keeps them) is filled with ``--stored`` pages in batches of 5,000; then each step
stores and answers ``n`` pages (every group's probe), a third of them near-duplicates of stored
pages.  Prints the median milliseconds a step over the runs, for each size, with the load.
Compare two trees by running this file under each's ``PYTHONPATH`` in turn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import xxhash
from shard_batch_bench import pages  # (bench/ is the script's directory: first on sys.path)

from streamdedup.index.hamming import HammingIndex
from streamdedup.pipeline.shard import WORKER_DESIGN, Shard, ShardPlan


def feed(shard: Shard, n_groups: int, fps: np.ndarray, start: int) -> None:
    group = np.tile(np.arange(n_groups), len(fps))
    rows = np.repeat(np.arange(len(fps)), n_groups)
    ids = [f"https://site.test/page/{start + i}" for i in rows.tolist()]
    shard.probe_and_insert(
        group,
        fps[rows],
        np.full(len(rows), 1_700_000_000_000, np.int64),
        np.array([xxhash.xxh3_64_intdigest(x.encode()) for x in ids], dtype=np.uint64),
        ids,
        ids,
    )


def one_run(stored: int, sizes: list[int], steps: int, seed: int) -> dict[int, float]:
    plan = ShardPlan(HammingIndex(k=3, design=WORKER_DESIGN).design, 4)
    with tempfile.TemporaryDirectory() as d:
        shard = Shard(plan, strings=os.path.join(d, "shard"))
        rng = np.random.default_rng(seed)
        base = pages(rng, stored)
        for s in range(0, stored, 5000):
            feed(shard, plan.n_groups, base[s : s + 5000], s)
        shard.prepare()
        at, out = stored, {}
        for n in sizes:
            batches = [pages(rng, n, base) for _ in range(steps)]
            t = time.perf_counter()
            for b in batches:
                feed(shard, plan.n_groups, b, at)
                at += n
            out[n] = (time.perf_counter() - t) / steps * 1e3
        shard.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stored", type=int, default=200_000, help="pages stored before the steps")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16], help="pages a step")
    ap.add_argument("--steps", type=int, default=1000, help="steps timed per size and run")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.stored < 1 or args.steps < 1 or args.runs < 1 or min(args.sizes) < 1:
        ap.error("--stored, --steps, --runs and every --sizes must be at least 1")
    runs = []
    for r in range(args.runs):
        runs.append(one_run(args.stored, args.sizes, args.steps, r))
        print(" ".join(f"{n} pages: {ms:.3f} ms" for n, ms in runs[-1].items()), f"load {os.getloadavg()[0]:.2f}")
    for n in args.sizes:
        print(f"median ms a step of {n} pages: {statistics.median(r[n] for r in runs):.3f}")


if __name__ == "__main__":
    main()
