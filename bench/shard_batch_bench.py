"""Time and peak memory of one shard step on a batch of n probes (issue 9: the in-batch check).

    python bench/shard_batch_bench.py                      # 1k, 10k, 100k probes
    python bench/shard_batch_bench.py --sizes 1000 8000 --rev 53721d2   # an older shard.py, for comparison

A shard of one partition holds every group; it is filled with ``--stored`` pages first, then
one batch of n probes (n / groups pages, every group's probe) is stored and answered.  A
third of the batch's pages are near-duplicates (0..3 bits) of earlier pages of the batch or
of the store, as in a crawl.  Peak memory is what tracemalloc sees during the step (numpy
reports its buffers to it).  Each size runs in a fresh process, so one does not warm the next.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tracemalloc
import types

import numpy as np
import xxhash

from streamdedup.index.tables import TableDesign


def shard_module(rev: str | None) -> types.ModuleType:
    if rev is None:
        from streamdedup.pipeline import shard

        return shard
    source = subprocess.run(
        ["git", "show", f"{rev}:streamdedup/pipeline/shard.py"], capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(f"shard_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:shard.py", "exec"), module.__dict__)
    return module


def pages(rng: np.random.Generator, n: int, base: np.ndarray | None = None) -> np.ndarray:
    """n fingerprints: two thirds random, one third within 3 bits of an earlier one (or of ``base``)."""
    fps = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    pool = fps if base is None or not len(base) else np.concatenate((base, fps))
    offset = 0 if base is None else len(pool) - n
    for i in rng.choice(np.arange(1, n), size=n // 3, replace=False):
        src = pool[int(rng.integers(0, offset + i))]
        flips = rng.choice(64, size=int(rng.integers(0, 4)), replace=False)
        fps[i] = src ^ np.bitwise_or.reduce(np.left_shift(np.uint64(1), flips.astype(np.uint64)), initial=np.uint64(0))
    return fps


def feed(shard, n_groups: int, fps: np.ndarray, start: int) -> object:
    n = len(fps)
    group = np.tile(np.arange(n_groups), n)
    rows = np.repeat(np.arange(n), n_groups)
    ids = [f"http://site.test/{start + i}" for i in rows.tolist()]
    return shard.probe_and_insert(
        group,
        fps[rows],
        np.zeros(len(rows), np.int64),
        np.array([xxhash.xxh3_64_intdigest(x.encode()) for x in ids], dtype=np.uint64),
        ids,
        ids,
    )


def one(probes: int, stored: int, rev: str | None, seed: int = 0) -> dict:
    mod = shard_module(rev)
    plan = mod.ShardPlan(TableDesign.named("16"), 1)
    shard = mod.Shard(plan)
    rng = np.random.default_rng(seed)
    base = pages(rng, stored) if stored else np.zeros(0, np.uint64)
    for s in range(0, stored, 500):  # small batches: an older shard.py is quadratic in the batch
        feed(shard, plan.n_groups, base[s : s + 500], s)
    batch = pages(rng, probes // plan.n_groups, base)
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    ans = feed(shard, plan.n_groups, batch, stored)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    return {
        "probes": len(batch) * plan.n_groups,
        "stored_before": stored,
        "seconds": round(seconds, 3),
        "peak_mib": round(peak / 2**20, 1),
        "matched_probes": int((ans.distance >= 0).sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000], help="probes per batch")
    ap.add_argument("--stored", type=int, default=100_000, help="pages stored in the shard before the batch")
    ap.add_argument("--rev", default=None, help="a git revision whose shard.py to time (default: this tree)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # internal: one size, JSON out
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.stored, args.rev)))
        return
    print(f"{'probes':>8} {'stored':>8} {'seconds':>8} {'peak MiB':>9} {'matched':>8}")
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--one", str(n), "--stored", str(args.stored)]
        if args.rev:
            cmd += ["--rev", args.rev]
        r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        print(f"{r['probes']:>8} {r['stored_before']:>8} {r['seconds']:>8} {r['peak_mib']:>9} {r['matched_probes']:>8}")


if __name__ == "__main__":
    main()
