"""Time of one shard step on the small batches a worker makes when it is not busy (issue 10).

    python bench/shard_small_batches.py                  # 1, 3, 10, 30, 100 pages a step
    python bench/shard_small_batches.py --stored 100000 --steps 500

One shard partition of the default plan (4 groups) holds ``--stored`` pages; then ``--steps``
probe messages of b pages each (every group's probe of each page, a third of the pages within
3 bits of the page before) go through :func:`shard_step` one at a time, as the shard agent
takes them.  Prints the median time per step and per page over 5 rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.shard import Shard, ShardPlan, shard_step
from streamdedup.pipeline.wire import PROBES, Batch, encode


def probes(rng: np.random.Generator, n: int, first: int, groups: int) -> bytes:
    fps = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64)
    fps[1::3] = fps[0::3][: len(fps[1::3])] ^ np.uint64(3)
    ids = [f"https://example.com/page/{first + i}" for i in range(n)] * groups
    hashes = np.arange(first, first + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    batch = Batch.build(
        group=np.repeat(np.arange(groups), n),
        fps=np.tile(fps, groups),
        fetched=np.arange(groups * n),
        id_hash=np.tile(hashes, groups),
        request=np.arange(groups * n),
        distance=0,
        partition=0,
        ids=ids,
        urls=ids,
        kind=PROBES,
    )
    return encode(batch, PROBES)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 3, 10, 30, 100], help="pages per step")
    ap.add_argument("--stored", type=int, default=3000, help="pages stored in the shard first")
    ap.add_argument("--steps", type=int, default=200, help="steps timed per size and round")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    plan = ShardPlan(TableDesign.named("16"), 1)
    shard = Shard(plan)
    shard_step(lambda s: shard, [(0, probes(rng, args.stored, 0, plan.n_groups))])
    first = args.stored
    print(f"{'pages':>6} {'us/step':>9} {'us/page':>9}")
    for b in args.sizes:
        times = []
        for _ in range(5):
            msgs = []
            for _ in range(args.steps):
                msgs.append(probes(rng, b, first, plan.n_groups))
                first += b
            t = time.perf_counter()
            for m in msgs:
                shard_step(lambda s: shard, [(0, m)])
            times.append((time.perf_counter() - t) / len(msgs))
        step = statistics.median(times)
        print(f"{b:>6} {step * 1e6:>9.0f} {step / b * 1e6:>9.0f}")


if __name__ == "__main__":
    main()
