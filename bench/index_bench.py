"""Index benchmark: insert rate, query rate and bytes per fingerprint at N stored fingerprints.

    python bench/index_bench.py --n 10000000 --runs 3

Inserts N random fingerprints in batches, builds the lookup directories, then queries batches
of 1,000 (half of them planted neighbours of stored fingerprints at distance 1..3, half
random), then runs the stream's pattern (query a batch, insert it) for another n/10 pages.  Prints
one JSON line per run and the medians; run it by hand, on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import time

import numpy as np

from streamdedup.index.hamming import HammingIndex


def one_run(n: int, batch: int, qbatch: int, design: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    ids = np.arange(n)  # ints: the index stores them as given
    idx = HammingIndex(k=3, design=design)
    t0 = time.perf_counter()
    for s in range(0, n, batch):
        idx.add_many(ids[s : s + batch].tolist(), fps[s : s + batch])
    insert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    idx.prepare()  # the lookup directories that the first queries would build
    prepare_s = time.perf_counter() - t0
    table_bytes, index_bytes = idx.table_nbytes / len(idx), idx.nbytes / len(idx)  # at exactly n

    n_queries = min(200 * qbatch, n)
    near = fps[rng.integers(0, n, size=n_queries // 2)]
    for bit_count in (1, 2, 3):  # flip 1..3 random bits in thirds of the planted queries
        part = slice((bit_count - 1) * len(near) // 3, bit_count * len(near) // 3)
        for _ in range(bit_count):
            near[part] ^= np.uint64(1) << rng.integers(0, 64, size=len(near[part])).astype(np.uint64)
    queries = np.concatenate([near, rng.integers(0, 2**64 - 1, size=n_queries - len(near), dtype=np.uint64)])
    rng.shuffle(queries)
    found = 0
    t0 = time.perf_counter()
    for s in range(0, len(queries), qbatch):
        found += len(idx.search(queries[s : s + qbatch]).query)
    query_s = time.perf_counter() - t0

    # The stream's pattern at this size: query a batch, then insert it, for another tenth of
    # n (long enough to amortise the merges, which at 10M stall a batch for seconds).
    extra = rng.integers(0, 2**64 - 1, size=max(n // 10, qbatch), dtype=np.uint64, endpoint=True)
    t0 = time.perf_counter()
    for s in range(0, len(extra), qbatch):
        idx.search(extra[s : s + qbatch])
        idx.add_many(list(range(n + s, n + s + qbatch)), extra[s : s + qbatch])
    mixed_s = time.perf_counter() - t0
    return {
        "n": n,
        "design": design,
        "insert_per_s": n / insert_s,
        "insert_with_directories_per_s": n / (insert_s + prepare_s),
        "query_per_s": len(queries) / query_s,
        "query_then_insert_pages_per_s": len(extra) / mixed_s,
        "matches": found,
        "table_bytes_per_fp": table_bytes,
        "index_bytes_per_fp": index_bytes,
        "table_bytes_per_fp_at_end": idx.table_nbytes / len(idx),
        "runs": len(idx._runs),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--batch", type=int, default=1000, help="insert batch size")
    p.add_argument("--query-batch", type=int, default=1000)
    p.add_argument("--design", default="16", choices=["20", "16", "10", "4"])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {platform.python_version()}, numpy {np.__version__}")
    results = []
    for r in range(args.runs):
        res = one_run(args.n, args.batch, args.query_batch, args.design, seed=r)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}))
        results.append(res)
    for key in (
        "insert_per_s",
        "insert_with_directories_per_s",
        "query_per_s",
        "query_then_insert_pages_per_s",
        "table_bytes_per_fp",
        "index_bytes_per_fp",
    ):
        print(f"median {key}: {statistics.median(r[key] for r in results):,.1f}")


if __name__ == "__main__":
    main()
