"""Resident bytes per page in a worker's shards, with the stored ids and URLs in memory or in
string files (issue 11: everything that grows with pages).

    python bench/shard_memory.py                 # 1M pages, 60-character URLs
    python bench/shard_memory.py --pages 10000000 --url-length 90
    python bench/shard_memory.py --algorithm minhash --algorithm combined   # the LSH band modes (issue 12)

One shard partition holds every group (as a one-worker, one-partition cluster would), so the
figure is per page across the whole table group.  Each mode runs in a fresh process.  Reported:
``Shard.nbytes`` (the arrays the shard holds: index tables, per-page columns, string offsets, and
in-memory string bytes) and the process's peak RSS above the interpreter at start, both per
page.  File-backed string bytes sit in the OS page cache, not in the process.  The band modes
store a page once per LSH band (10 bands for --threshold 0.8, --num-perm 128), with its band
key, simhash, id hash, the tags of its earlier bands' keys and (minhash) its 78-byte sketch.
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


def rss_anon() -> int:
    """The process's resident anonymous memory now (RssAnon: its heap and arrays, not mapped files)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def run(
    mode: str,
    pages: int,
    url_length: int,
    batch: int,
    algorithm: str = "simhash",
    num_perm: int = 128,
    design: str = "4",
) -> dict:
    from streamdedup.index.bands import BandScheme
    from streamdedup.index.tables import TableDesign
    from streamdedup.pipeline.bands import BandPlan
    from streamdedup.pipeline.shard import Plan, Shard, ShardPlan

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    base_anon = rss_anon()
    plan: Plan = ShardPlan(TableDesign.named(design), partitions=1)
    scheme = None
    if algorithm != "simhash":
        scheme = BandScheme.for_threshold(0.8, num_perm, verify=algorithm)
        plan = BandPlan(scheme, partitions=1)
    with tempfile.TemporaryDirectory() as tmp:
        shard = Shard(plan, None if mode == "memory" else f"{tmp}/s")
        rng = np.random.default_rng(1)
        t0 = time.perf_counter()
        pad = "x" * max(0, url_length - 30)
        groups = np.tile(np.arange(plan.n_groups), batch)
        for start in range(0, pages, batch):
            fps = rng.integers(0, 2**64 - 1, batch, dtype=np.uint64, endpoint=True)
            urls = [f"http://example.com/{pad}/{i:010d}" for i in range(start, start + batch)]
            rep = np.repeat(np.arange(batch), plan.n_groups)
            probe_urls = [urls[i] for i in rep.tolist()]
            extra = None
            if scheme is not None:
                sigs = rng.integers(0, 2**32, (batch, scheme.num_perm), dtype=np.uint32)
                extra = scheme.extra(sigs)[rep]
            shard.probe_and_insert(
                groups,
                fps[rep],
                np.zeros(len(rep), np.int64),
                fps[rep] ^ np.uint64(7),
                probe_urls,
                probe_urls,
                extra=extra,
            )
        shard.prepare()  # (merges under way finished: what the shard holds, not a merge's output too)
        seconds = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        rss = rss_anon()
        out = {
            "design": design if algorithm == "simhash" else "-",
            "pages_per_s": pages / seconds,
            "mode": mode,
            "pages": pages,
            "url_length": len(urls[0]),
            "nbytes_per_page": shard.nbytes / pages,
            "file_bytes_per_page": shard.file_bytes / pages,  # on disk: the row files
        }
        out["algorithm"] = algorithm
        out["peak_rss_per_page"] = (peak - base) / pages
        out["anon_rss_per_page"] = (rss - base_anon) / pages  # at the end: the process's own memory, no page cache
        shard.close()
    return out


def main() -> None:
    from streamdedup.index.bands import DEFAULT_NUM_PERM

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=1_000_000)
    ap.add_argument("--url-length", type=int, default=60)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--algorithm", action="append", choices=["simhash", "minhash", "combined"])
    ap.add_argument(
        "--num-perm", type=int, default=DEFAULT_NUM_PERM, help="the band modes' permutations (default: the worker's)"
    )
    ap.add_argument(
        "--design",
        action="append",
        choices=["16", "20", "10", "4"],
        help="simhash table designs (default: the worker's)",
    )
    ap.add_argument(
        "--strings", action="append", choices=["memory", "files"], help="where ids and URLs live (default: both)"
    )
    ap.add_argument("--mode", choices=["memory", "files"], help=argparse.SUPPRESS)  # (one run, in a child)
    a = ap.parse_args()
    from streamdedup.pipeline.shard import WORKER_DESIGN

    algorithms = a.algorithm or ["simhash"]
    designs = a.design or [WORKER_DESIGN]
    if a.mode:
        print(json.dumps(run(a.mode, a.pages, a.url_length, a.batch, algorithms[0], a.num_perm, designs[0])))
        return
    print(
        f"{'algorithm':9} {'design':6} {'strings':8} {'pages':>11} {'url':>4} {'Shard.nbytes/page':>18} "
        f"{'peak RSS/page':>14} {'RssAnon/page at end':>20} {'files/page':>11} {'pages/s':>9}"
    )
    runs = [(al, d) for al in algorithms for d in (designs if al == "simhash" else [designs[0]])]
    for algorithm, design in runs:
        for mode in a.strings or ["memory", "files"]:
            args = [sys.executable, __file__, "--mode", mode, "--pages", str(a.pages)]
            args += ["--url-length", str(a.url_length), "--algorithm", algorithm, "--batch", str(a.batch)]
            args += ["--num-perm", str(a.num_perm), "--design", design]
            r = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
            print(
                f"{algorithm:9} {r['design']:6} {mode:8} {r['pages']:>11,} {r['url_length']:>4} "
                f"{r['nbytes_per_page']:>16.0f} B {r['peak_rss_per_page']:>12.0f} B {r['anon_rss_per_page']:>18.0f} B "
                f"{r['file_bytes_per_page']:>9,.0f} B {r['pages_per_s']:>9,.0f}"
            )


if __name__ == "__main__":
    main()
