"""Memory of a shard on a crawl that never ends, with and without --retention (issue 11).

    python bench/retention_memory.py                        # 4M pages, retention = the last 1M pages' time
    python bench/retention_memory.py --pages 10000000 --window 2000000
    python bench/retention_memory.py --algorithm minhash --pages 1000000 --window 250000

A one-partition shard (every group, as in bench/shard_memory.py) with its strings in a file
stores ``--pages`` random pages in batches whose fetch times grow by one second a page; with
the retention, pages older than ``--window`` seconds leave it.  Printed every quarter of the
crawl: the pages stored so far, the live (page, group) rows, ``Shard.nbytes`` and the process's
peak RSS above the interpreter at start, and the slowest batch of the quarter (a batch
that compacts the shard; --batch pages a batch).  Each mode runs in a fresh process.  Without a
retention both grow with the crawl; with it they stay at about the window's pages (up to twice
them between compactions, which run once half of a group's rows have expired).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np


def run(pages: int, window: int, batch: int, retention: bool, algorithm: str = "simhash") -> list[dict]:
    from streamdedup.index.bands import BandScheme
    from streamdedup.index.tables import TableDesign
    from streamdedup.pipeline.bands import BandPlan
    from streamdedup.pipeline.shard import Plan, Shard, ShardPlan

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    plan: Plan = ShardPlan(TableDesign.named("16"), partitions=1)
    scheme = None
    if algorithm != "simhash":
        scheme = BandScheme.for_threshold(0.8, 128, verify=algorithm)
        plan = BandPlan(scheme, partitions=1)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        shard = Shard(plan, f"{tmp}/s", window * 1000 if retention else 0)
        rng = np.random.default_rng(1)
        groups = np.tile(np.arange(plan.n_groups), batch)
        rep = np.repeat(np.arange(batch), plan.n_groups)
        slowest = 0.0
        for start in range(0, pages, batch):
            fps = rng.integers(0, 2**64 - 1, batch, dtype=np.uint64, endpoint=True)
            urls = [f"http://example.com/{'x' * 40}/{i:010d}" for i in range(start, start + batch)]
            fetched = (np.arange(start, start + batch, dtype=np.int64) * 1000)[rep]  # one second a page
            probe_urls = [urls[i] for i in rep.tolist()]
            extra = None
            if scheme is not None:
                extra = scheme.extra(rng.integers(0, 2**32, (batch, scheme.num_perm), dtype=np.uint32))[rep]
            t0 = time.perf_counter()
            shard.probe_and_insert(
                groups, fps[rep], fetched, fps[rep] ^ np.uint64(7), probe_urls, probe_urls, extra=extra
            )
            slowest = max(slowest, time.perf_counter() - t0)
            done = start + batch
            if done % max(batch, pages // 4) < batch or done >= pages:
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                out.append(
                    {
                        "pages": done,
                        "rows": len(shard),
                        "nbytes": shard.nbytes,
                        "peak_rss": peak - base,
                        "slowest": slowest,
                    }
                )
                slowest = 0.0
        shard.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=4_000_000)
    ap.add_argument("--window", type=int, default=1_000_000, help="the retention, in pages (seconds) of the crawl")
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--algorithm", default="simhash", choices=["simhash", "minhash", "combined"])
    ap.add_argument("--run", choices=["on", "off"], help=argparse.SUPPRESS)  # (one run, in a child)
    a = ap.parse_args()
    if a.run:
        print(json.dumps(run(a.pages, a.window, a.batch, a.run == "on", a.algorithm)))
        return
    print(
        f"{'retention':>11} {'pages':>11} {'live rows':>11} {'Shard.nbytes':>13} {'peak RSS':>10} {'slowest batch':>14}"
    )
    for mode in ("off", "on"):
        args = [sys.executable, __file__, "--run", mode, "--pages", str(a.pages), "--window", str(a.window)]
        args += ["--batch", str(a.batch), "--algorithm", a.algorithm]
        for r in json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout):
            label = f"{a.window:,} s" if mode == "on" else "none"
            print(
                f"{label:>11} {r['pages']:>11,} {r['rows']:>11,} {r['nbytes'] / 2**20:>9.0f} MiB "
                f"{r['peak_rss'] / 2**20:>6.0f} MiB {r['slowest']:>12.2f} s"
            )


if __name__ == "__main__":
    main()
