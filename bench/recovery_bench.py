"""Recovery: how fast a shard is rebuilt from its changelog records (decode + restore).

    python bench/recovery_bench.py --pages 2000000 --runs 3

Makes the changelog of N pages (one row per page and group: 4 per page for the 4 x 4 design,
URLs of realistic length; a changelog record holds the rows one shard stored from one probe
batch, --rows-per-record of them), then times decoding it in batches of --batch records and
restoring one shard from it, as a restarted worker would (ids and URLs to string files, as
the worker keeps them; ``--strings memory`` for in-memory strings); then saves the shard as a snapshot
and times loading it until it can answer (lookup directories built).  Kafka's fetch is not
included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.shard import WORKER_DESIGN, Shard, ShardPlan
from streamdedup.pipeline.wire import CHANGELOG, Batch, decode, encode


def make_log(pages: int, seed: int, per_record: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 2**64 - 1, size=pages, dtype=np.uint64, endpoint=True)
    hashes = rng.integers(0, 2**64 - 1, size=pages, dtype=np.uint64, endpoint=True)
    fetched = np.arange(pages, dtype=np.int64) + 1_700_000_000_000
    log: list[bytes] = []
    for g in range(4):
        ids = [f"https://www.example.org/section-{i % 997}/page-{i}.html" for i in range(pages)]
        for s in range(0, pages, per_record):
            e = min(s + per_record, pages)
            log.append(
                encode(
                    Batch.build(
                        group=g, fps=fps[s:e], fetched=fetched[s:e], id_hash=hashes[s:e], ids=ids[s:e], urls=ids[s:e]
                    ),
                    CHANGELOG,
                )
            )
    return log


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=2_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch", type=int, default=100, help="changelog records decoded at once")
    p.add_argument("--rows-per-record", type=int, default=250)
    p.add_argument(
        "--strings", choices=["files", "memory"], default="files", help="ids and URLs in string files (the worker's)"
    )
    p.add_argument("--design", default=WORKER_DESIGN, choices=["16", "20", "10", "4"], help="the table design")
    args = p.parse_args()
    log = make_log(args.pages, 0, args.rows_per_record)
    plan = ShardPlan(TableDesign.named(args.design), 1)
    rates = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            strings = None if args.strings == "memory" else f"{tmp}/s"
            shard = Shard(plan, strings)
            t0 = time.perf_counter()
            for s in range(0, len(log), args.batch):
                shard.restore(decode(log[s : s + args.batch]))
            elapsed = time.perf_counter() - t0
            path = Path(tmp) / "shard.npz"
            for store in shard._groups.values():
                store.index.prepare()  # as in a worker: answering built the directories before a snapshot
            t0 = time.perf_counter()
            shard.save(path)
            save_s = time.perf_counter() - t0
            shard.close()
            t0 = time.perf_counter()
            loaded, _ = Shard.load(path, plan, strings)
            for store in loaded._groups.values():
                store.index.prepare()  # ready to answer: lookup directories built
            load_s = time.perf_counter() - t0
            loaded.close()
            size = path.stat().st_size
        res = {
            "records": len(log),
            "rows": 4 * args.pages,
            "pages": args.pages,
            "seconds": round(elapsed, 2),
            "records_per_s": round(len(log) / elapsed),
            "fingerprints_per_s": round(args.pages / elapsed),
            "shard_entries": len(shard),
            "snapshot_mb": round(size / 2**20),
            "snapshot_save_s": round(save_s, 2),
            "snapshot_load_records_per_s": round(len(log) / load_s),
            "snapshot_load_fingerprints_per_s": round(args.pages / load_s),
        }
        print(json.dumps(res))
        rates.append(res)
    for key in (
        "records_per_s",
        "fingerprints_per_s",
        "snapshot_load_records_per_s",
        "snapshot_load_fingerprints_per_s",
    ):
        print(f"median {key}: {statistics.median(r[key] for r in rates):,.0f}")


if __name__ == "__main__":
    main()
