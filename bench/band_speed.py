"""CPU per page of the band modes against simhash, stage by stage, in one process (issue 12).

    python bench/band_speed.py [--pages 2000] [--runs 5] [--with-128]

The worker's two heavy stages, run on the same corpus pages for each --algorithm, alternating,
``--runs`` times; medians of CPU seconds (``time.process_time``), so a busy machine slows every
mode alike rather than one:

* fingerprinting (the pages stage, in the process pool): ``fingerprint_contents`` - raw HTML to
  visible text, simhash, cluster key and, for the band modes, the MinHash signature, band keys
  and sketch;
* the shard stage: every page's probes through ``Shard.probe_and_insert`` (one shard partition
  holding every group or band, as a one-worker cluster has), stored then searched.

The ratio simhash / band mode of their sum is the throughput a CPU-bound worker keeps (the
issue-12 goal for minhash: >= 0.7).  ``bench/stream_bench.py --only algorithms`` measures the
same end to end through a broker, with more noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from streamdedup.index.bands import DEFAULT_NUM_PERM, BandScheme
from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.bands import BandPlan
from streamdedup.pipeline.intake import fingerprint_contents, id_hash
from streamdedup.pipeline.shard import WORKER_DESIGN, Plan, Shard, ShardPlan

ROOT = Path(__file__).resolve().parent.parent
# (name, --algorithm, --k, --num-perm)
MODES = (
    ("simhash", "simhash", 3, DEFAULT_NUM_PERM),
    ("minhash", "minhash", 3, DEFAULT_NUM_PERM),
    ("combined", "combined", 10, DEFAULT_NUM_PERM),
)
MODES_128 = (("minhash/128", "minhash", 3, 128), ("combined/128", "combined", 10, 128))


def load(path: Path, n: int) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line))
            if len(out) == n:
                break
    return out


def one(records: list[dict], algorithm: str, k: int, num_perm: int, batch: int) -> tuple[float, float]:
    scheme = None if algorithm == "simhash" else BandScheme.for_threshold(0.8, num_perm, verify=algorithm, k=k)
    plan: Plan = ShardPlan(TableDesign.named(WORKER_DESIGN), 1) if scheme is None else BandPlan(scheme, 1)
    shard = Shard(plan)
    fp_cpu = shard_cpu = 0.0
    for at in range(0, len(records), batch):
        chunk = records[at : at + batch]
        contents = [(r["content"], r.get("content_type"), None) for r in chunk]
        t0 = time.process_time()
        done = fingerprint_contents(contents, 4, scheme)
        t1 = time.process_time()
        ids = [r["id"] for r in chunk]
        g = plan.n_groups
        rep = np.repeat(np.arange(len(done.fps)), g)
        hashes = np.array([id_hash(i) for i in ids[: len(done.fps)]], dtype=np.uint64)
        probe_ids = [ids[i] for i in rep.tolist()]
        shard.probe_and_insert(
            np.tile(np.arange(g), len(done.fps)),
            done.fps[rep],
            np.zeros(len(rep), np.int64),
            hashes[rep],
            probe_ids,
            probe_ids,
            extra=None if done.extra is None else done.extra[rep],
        )
        fp_cpu, shard_cpu = fp_cpu + (t1 - t0), shard_cpu + (time.process_time() - t1)
    return fp_cpu, shard_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=ROOT / "bench/data/corpus.jsonl")
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--with-128", action="store_true", help="also the band modes at --num-perm 128")
    a = ap.parse_args()
    records = load(a.corpus, a.pages)
    modes = MODES + (MODES_128 if a.with_128 else ())
    for _, algorithm, k, num_perm in modes:  # compile every mode's kernels first
        one(records[:50], algorithm, k, num_perm, a.batch)
    got: dict[str, list[tuple[float, float]]] = {m[0]: [] for m in modes}
    for run in range(a.runs):
        turn = run % len(modes)
        for name, algorithm, k, num_perm in modes[turn:] + modes[:turn]:
            got[name].append(one(records, algorithm, k, num_perm, a.batch))
    med = {m: (statistics.median(f for f, _ in v), statistics.median(s for _, s in v)) for m, v in got.items()}
    base = sum(med["simhash"])
    print(f"{len(records)} pages, {a.runs} runs, medians of CPU ms per page")
    print(f"{'mode':12} {'fingerprint':>12} {'shard':>8} {'total':>8} {'simhash/mode':>13}")
    for m, (f, s) in med.items():
        n = len(records)
        print(f"{m:12} {1000 * f / n:12.2f} {1000 * s / n:8.2f} {1000 * (f + s) / n:8.2f} {base / (f + s):13.2f}")


if __name__ == "__main__":
    main()
