"""A shard's simhash index per group: BlockIndex (one table a group) against HammingIndex "16"
restricted to the group's 4 tables (what the shard holds today), at N pages.

    python bench/block_bench.py --pages 10000000 --runs 3                 # both designs
    python bench/block_bench.py --pages 100000000 --runs 1 --design block  # BlockIndex alone

Every page is stored in each of the 4 groups (as a worker owning every partition does), so a
group holds N rows.  Inserts go in batches of ``--batch`` pages, each batch into the 4 groups;
every ``--probe-every`` batches a batch of queries is searched in each group, so that the worst
single call while growing is seen for searches too (the merges happen while growing).  Then,
with every merge finished, batches of ``--query-batch`` queries (half stored pages with 1..3
bits flipped, half random) are each searched in all 4 groups, after one untimed pass of
other queries (the first pass over a freshly built index is slower).

Prints one JSON line per run and the medians; run it by hand, on an otherwise quiet machine
(the load average is printed with each run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from streamdedup.index.blocks import BlockIndex, warm_up
from streamdedup.index.hamming import HammingIndex
from streamdedup.index.tables import TableDesign

MASKS = [0xFFFF << (16 * g) for g in range(4)]  # the 4 groups of design "16": its 16-bit blocks


def make_groups(design: str, background: bool) -> list:
    if design == "block":
        return [BlockIndex(mask, k=3, background=background) for mask in MASKS]
    whole = TableDesign.named("16")
    return [HammingIndex(k=3, design=whole.restricted(tables)) for _, tables in whole.groups()]


def read_bound(groups: list, queries: np.ndarray, qbatch: int) -> dict:
    """The memory bound of a search: the time to merely read (XOR together) the buckets the
    queries land in, in every run of every group, with no popcount and no output.  A search
    cannot be faster than this; ``query_per_s`` against ``read_bound_query_per_s`` says how much
    of a search is the kernel's own work."""
    from numba import njit  # (bench only: numba is a dependency of the package)

    @njit(nogil=True, cache=True)
    def read_buckets(lo, directory, bucket_shift, q_hi):
        acc = np.uint32(0)
        total = 0
        for q in q_hi:
            b = np.int64(q >> bucket_shift)
            for j in range(directory[b], directory[b + 1]):
                acc ^= lo[j]
            total += directory[b + 1] - directory[b]
        return acc, total

    # a scan reads a run's low halves only (hi for the few entries within k there)
    runs = [(g, run) for g in groups for run in g._runs if run.directory is not None]
    g0, run0 = runs[0]
    read_buckets(run0.lo, run0.directory, np.int64(g0._kshift + run0.dir_shift), g0._split(queries[:2])[0])
    entries = 0
    t = time.perf_counter()
    for s in range(0, len(queries), qbatch):
        for g, run in runs:
            q_hi = g._split(queries[s : s + qbatch])[0]
            entries += read_buckets(run.lo, run.directory, np.int64(g._kshift + run.dir_shift), q_hi)[1]
    dt = time.perf_counter() - t
    return {
        "read_bound_query_per_s": len(queries) / dt,
        "read_bound_gb_per_s": entries * 4 / dt / 1e9,
        "entries_read_per_query": entries / len(queries),
    }


def query_rate(groups: list, queries: np.ndarray, qbatch: int, threads: int) -> tuple[float, int]:
    """Queries a second over all groups, ``qbatch`` at a time, and the matches found; with
    ``threads`` > 1 the groups of a batch are searched at once (the block kernel releases the GIL)."""
    found = 0
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    t = time.perf_counter()
    for s in range(0, len(queries), qbatch):
        batch_q = queries[s : s + qbatch]
        if pool is None:
            found += sum(len(g.search(batch_q).query) for g in groups)
        else:
            found += sum(len(m.query) for m in pool.map(lambda g: g.search(batch_q), groups))  # noqa: B023
    rate = len(queries) / (time.perf_counter() - t)
    if pool is not None:
        pool.shutdown()
    return rate, found


def queries_for(fps: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Half stored pages with 1..3 random bits flipped (thirds), half random, shuffled."""
    near = fps[rng.integers(0, len(fps), size=count // 2)]
    for bits in (1, 2, 3):
        part = slice((bits - 1) * len(near) // 3, bits * len(near) // 3)
        for _ in range(bits):
            near[part] ^= np.uint64(1) << rng.integers(0, 64, size=len(near[part])).astype(np.uint64)
    out = np.concatenate([near, rng.integers(0, 2**64 - 1, size=count - len(near), dtype=np.uint64, endpoint=True)])
    rng.shuffle(out)
    return out


def one_run(
    design: str,
    pages: int,
    batch: int,
    qbatch: int,
    probe_every: int,
    background: bool,
    seed: int,
    threads: tuple[int, ...] = (1,),
) -> dict:
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 2**64 - 1, size=pages, dtype=np.uint64, endpoint=True)
    groups = make_groups(design, background)
    probe = queries_for(fps[: max(batch, 1)], qbatch, rng)
    add_s, worst_add, worst_search, probes = 0.0, 0.0, 0.0, 0
    for b, start in enumerate(range(0, pages, batch)):
        chunk, rows = fps[start : start + batch], range(start, min(start + batch, pages))
        for g in groups:
            t = time.perf_counter()
            g.add_many(rows, chunk)
            dt = time.perf_counter() - t
            add_s += dt
            worst_add = max(worst_add, dt)
        if b % probe_every == probe_every - 1:
            for g in groups:
                t = time.perf_counter()
                g.search(probe)
                worst_search = max(worst_search, time.perf_counter() - t)
            probes += 1
    t = time.perf_counter()
    for g in groups:  # every merge finished and every directory built
        if isinstance(g, BlockIndex):
            g.wait()
        g.prepare()
    settle_s = time.perf_counter() - t
    nbytes = sum(g.nbytes for g in groups)

    queries = queries_for(fps, 100 * qbatch, rng)
    # an untimed pass first: the first search of an index just built ran at 0.4-0.7 x the next
    # ones at 100 M pages (2026-11-29), whichever thread count came first
    query_rate(groups, queries_for(fps, 100 * qbatch, rng), qbatch, 1)
    rates = {n: query_rate(groups, queries, qbatch, n) for n in threads}
    found = rates[threads[0]][1]
    bound = read_bound(groups, queries, qbatch) if design == "block" else {}
    return {
        "design": design,
        "pages": pages,
        "background": background if design == "block" else None,
        "bytes_per_row": nbytes / (4 * pages),
        "bytes_per_page": nbytes / pages,
        "insert_pages_per_s": pages / add_s,
        "settle_s": settle_s,
        "query_per_s": rates[threads[0]][0],
        "query_threads": threads[0],
        "query_per_s_by_threads": {n: round(rate, 1) for n, (rate, _) in rates.items()},
        "matches_per_query": found / len(queries),
        **bound,
        "worst_add_ms": worst_add * 1e3,
        "worst_search_ms": worst_search * 1e3,
        "probe_batches": probes,
        "runs_per_group": [len(g._runs) for g in groups],
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=10_000_000)
    p.add_argument("--batch", type=int, default=1000, help="insert batch size (pages)")
    p.add_argument("--query-batch", type=int, default=1000)
    p.add_argument("--probe-every", type=int, default=100, help="a query batch every this many insert batches")
    p.add_argument("--design", default="both", choices=["block", "hamming16", "both"])
    p.add_argument("--inline", action="store_true", help="BlockIndex merges on the caller's thread")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1],
        help="threads searching the 4 groups of a query batch; several (e.g. 1 2) are measured in turn on the same index",
    )
    args = p.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, numpy {np.__version__}")
    warm_up()
    designs = ["block", "hamming16"] if args.design == "both" else [args.design]
    results: dict[str, list[dict]] = {d: [] for d in designs}
    for r in range(args.runs):
        for design in designs:  # interleaved, so a change in the machine's load hits both
            res = one_run(
                design,
                args.pages,
                args.batch,
                args.query_batch,
                args.probe_every,
                not args.inline,
                r,
                tuple(args.threads),
            )
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}), flush=True)
            results[design].append(res)
    for design, runs in results.items():
        for key in (
            "bytes_per_row",
            "bytes_per_page",
            "insert_pages_per_s",
            "query_per_s",
            "worst_add_ms",
            "worst_search_ms",
        ):
            print(f"median {design} {key}: {statistics.median(r[key] for r in runs):,.2f}")


if __name__ == "__main__":
    main()
