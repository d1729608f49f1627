"""One BlockIndex group's scan kernel against the bare read of the same buckets (issue 11).

    python bench/scan_kernel_bench.py                      # 100 M entries (~1.3 GB), 200,000 queries
    python bench/scan_kernel_bench.py --entries 10000000

One sorted run of random fingerprints keyed by their top 16 bits, with its directory of 65,536
buckets, as a group of ``BlockIndex`` holds it at that size; queries in batches of 1,000, half
stored fingerprints with 1-3 of their other 48 bits flipped, half random.  Prints queries a
second of ``scan_run`` (the kernel the index runs) and of a loop that merely reads (XORs) the
same buckets, on one thread and on two (each searching half of a batch), and the matches found.
``scan / read`` is the share of the memory bound the kernel reaches.  The index keeps each
fingerprint as two uint32 halves and a scan reads the low halves only, so "read" reads those.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from streamdedup.index import block_kernels as bk
from streamdedup.index.blocks import BlockIndex

SHIFT, KMASK = np.uint64(48), np.uint64(0xFFFF)


@njit(nogil=True, cache=True)
def read_buckets(lo, directory, q_hi):
    acc = np.uint32(0)
    for q in q_hi:
        b = np.int64(q >> 16)
        for j in range(directory[b], directory[b + 1]):
            acc ^= lo[j]
    return acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000_000)
    ap.add_argument("--queries", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2, help="every measure this many times, in turn")
    args = ap.parse_args()
    if args.entries < 1000 or args.queries < 2000 or args.rounds < 1:
        ap.error("--entries >= 1000, --queries >= 2000 and --rounds >= 1, please")
    rng = np.random.default_rng(1)
    fps = np.sort(rng.integers(0, 2**64 - 1, size=args.entries, dtype=np.uint64, endpoint=True))
    rows = np.arange(args.entries, dtype=np.uint32)
    group = BlockIndex(int(KMASK << SHIFT))  # (its halves: the key is the top 16 bits already)
    hi, lo = group._split(fps)
    directory = bk.bucket_offsets(hi, np.int64(16), 1 << 16)
    alive = np.full(args.entries // 8 + 1, 255, np.uint8)
    near = fps[rng.integers(0, args.entries, size=args.queries // 2)]
    for bits in (1, 2, 3):
        part = slice((bits - 1) * len(near) // 3, bits * len(near) // 3)
        for _ in range(bits):
            near[part] ^= np.uint64(1) << rng.integers(0, 48, size=len(near[part])).astype(np.uint64)
    queries = np.concatenate([near, rng.integers(0, 2**64 - 1, size=args.queries - len(near), dtype=np.uint64)])
    rng.shuffle(queries)

    def scan(q: np.ndarray) -> int:
        q_hi, q_lo = group._split(q)
        return len(bk.scan_run(lo, hi, rows, directory, np.int64(0), np.int64(16), q_lo, q_hi, alive, 3)[0])

    def read(q: np.ndarray) -> int:
        read_buckets(lo, directory, group._split(q)[0])
        return 0

    scan(queries[:1000]), read(queries[:1000])  # compiled (or loaded from numba's cache) first
    pool = ThreadPoolExecutor(2)
    print(f"# {args.entries:,} entries, {args.queries:,} queries, {os.cpu_count()} cpus")
    for _ in range(args.rounds):
        for threads in (1, 2):
            for name, f in (("read", read), ("scan", scan)):
                found, t = 0, time.perf_counter()
                for s in range(0, len(queries), 2000):
                    b = queries[s : s + 2000]
                    found += f(b) if threads == 1 else sum(pool.map(f, (b[:1000], b[1000:])))
                rate = len(queries) / (time.perf_counter() - t)
                print(
                    f"{name} threads {threads}: {rate:,.0f} queries/s, {found} matches, load {os.getloadavg()[0]:.2f}"
                )
    pool.shutdown()


if __name__ == "__main__":
    main()
