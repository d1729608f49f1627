"""A worker's shards at web scale: N pages in one process, with the worker's design and files.

    python bench/shard_scale.py --pages 100000000          # about 5 GB of RAM, ~35 GB of disk
    python bench/shard_scale.py --pages 10000000 --queries 200000

One shard partition holds every group of N random pages (as a one-worker, one-partition
cluster would: the figure per page is the whole group's), built as a restarted worker builds
it from the changelog (``Shard.restore`` of decoded rows, in batches of ``--batch`` pages), with
URLs of ``--url-length`` bytes in the string files.  Then, at N:

* memory: ``Shard.nbytes`` and the process's RssAnon (its own memory, not the page cache) per page;
* checks (``probe_and_insert(store=False)``: the stream's probes without the store) in batches
  of 1,000 pages, half of them planted neighbours of stored pages at 1..3 bits, half random:
  pages/s and probes/s (a page is one probe per group), and how many planted ones were found;
* inserts (``probe_and_insert``, the stream's path) of ``--inserts`` more pages in batches of
  1,000: pages/s, and the slowest batch (a merge in the background must not stall it);
* a snapshot (``Shard.save``) and a restart from it (``Shard.load`` + ``prepare``: the moment
  the shard answers), then a check that the loaded shard answers a batch as the live one did.

Run it by hand on a quiet machine; it prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time

import numpy as np
from shard_memory import rss_anon as _rss_anon  # (bench/, the script's directory)

from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.shard import WORKER_DESIGN, Shard, ShardPlan
from streamdedup.pipeline.wire import ROW, Batch


def _urls(start: int, n: int, length: int) -> bytes:
    """n URLs of ``length`` bytes, ``https://example.org/xxx…/<12 digits>``, as one blob (no
    Python object per URL)."""
    prefix = np.frombuffer(b"https://example.org/" + b"p" * max(0, length - 32), np.uint8)
    numbers = np.arange(start, start + n, dtype=np.int64)
    digits = (numbers[:, None] // (10 ** np.arange(11, -1, -1, dtype=np.int64))[None, :]) % 10 + ord("0")
    out = np.empty((n, len(prefix) + 12), np.uint8)
    out[:, : len(prefix)] = prefix
    out[:, len(prefix) :] = digits
    return out.tobytes()


def _rows(fps: np.ndarray, start: int, group: int, url_length: int) -> Batch:
    """The changelog rows of pages ``start..`` in ``group`` (id = URL, stored as the URL only)."""
    n = len(fps)
    rows = np.zeros(n, dtype=ROW)
    rows["fp"], rows["group"] = fps, group
    rows["fetched"] = 1_700_000_000_000 + np.arange(start, start + n)
    rows["id_hash"] = fps ^ np.uint64(0x9E3779B97F4A7C15)
    blob = _urls(start, n, url_length)
    rows["id_len"], rows["url_len"] = 0, len(blob) // n
    return Batch(rows, blob, 0, None)


def _probes(shard: Shard, fps: np.ndarray, start: int, store: bool):
    n, groups = len(fps), shard.plan.n_groups
    rep = np.repeat(np.arange(n), groups)
    urls = [f"https://example.org/q/{start + i}" for i in range(n)]
    probe_urls = [urls[i] for i in rep.tolist()]
    t0 = time.perf_counter()
    out = shard.probe_and_insert(
        np.tile(np.arange(groups), n),
        fps[rep],
        np.full(len(rep), 1_800_000_000_000, np.int64),
        fps[rep] ^ np.uint64(0x5555),
        probe_urls,
        probe_urls,
        store=store,
    )
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=1_000_000, help="pages restored at once")
    ap.add_argument("--url-length", type=int, default=60)
    ap.add_argument("--queries", type=int, default=100_000, help="pages checked at N")
    ap.add_argument("--inserts", type=int, default=100_000, help="pages stored at N, by the stream's path")
    ap.add_argument("--design", default=WORKER_DESIGN, choices=["16", "20", "10", "4"])
    ap.add_argument("--dir", help="where the files go (default: a temporary directory)")
    a = ap.parse_args()
    out: dict = {"pages": a.pages, "design": a.design, "machine": f"{platform.machine()}, {os.cpu_count()} cpus"}
    out["load_avg_start"] = os.getloadavg()[0]
    plan = ShardPlan(TableDesign.named(a.design), partitions=1)
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        base = _rss_anon()
        shard = Shard(plan, f"{tmp}/s")
        kept = np.empty(0, np.uint64)  # a sample of stored fingerprints, for planted queries
        t0 = time.perf_counter()
        for start in range(0, a.pages, a.batch):
            fps = rng.integers(0, 2**64 - 1, size=min(a.batch, a.pages - start), dtype=np.uint64, endpoint=True)
            kept = np.concatenate((kept, fps[:: max(1, a.pages // 200_000)]))
            for g in range(plan.n_groups):
                shard.restore(_rows(fps, start, g, a.url_length))
        shard.prepare()  # (background merges finished, directories built)
        build = time.perf_counter() - t0
        out["restore_s"] = round(build, 1)
        out["restore_rows_per_s"] = round(a.pages * plan.n_groups / build)
        out["peak_rss_mb_built"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        out["nbytes_per_page"] = round(shard.nbytes / a.pages, 1)
        out["rss_anon_per_page"] = round((_rss_anon() - base) / a.pages, 1)

        # checks at N: half planted neighbours (1..3 bits), half random
        q = a.queries
        near = kept[rng.integers(0, len(kept), size=q // 2)].copy()
        for bits in (1, 2, 3):
            part = slice((bits - 1) * len(near) // 3, bits * len(near) // 3)
            for _ in range(bits):
                near[part] ^= np.uint64(1) << rng.integers(0, 64, size=len(near[part])).astype(np.uint64)
        queries = np.concatenate((near, rng.integers(0, 2**64 - 1, size=q - len(near), dtype=np.uint64)))
        seconds, found = 0.0, 0
        for s in range(0, q, 1000):
            took, ans = _probes(shard, queries[s : s + 1000], a.pages + s, store=False)
            seconds += took
            found += (
                int((ans.distance.reshape(-1, plan.n_groups) >= 0).any(axis=1)[: min(1000, len(near) - s)].sum())
                if s < len(near)
                else 0
            )
        out["check_pages_per_s"] = round(q / seconds)
        out["check_probes_per_s"] = round(q * plan.n_groups / seconds)
        out["planted_found"] = f"{found}/{len(near)}"

        # inserts at N, by the stream's path
        extra = rng.integers(0, 2**64 - 1, size=a.inserts, dtype=np.uint64, endpoint=True)
        seconds, worst = 0.0, 0.0
        for s in range(0, a.inserts, 1000):
            took, _ = _probes(shard, extra[s : s + 1000], a.pages + q + s, store=True)
            seconds, worst = seconds + took, max(worst, took)
        out["insert_pages_per_s"] = round(a.inserts / seconds)
        out["insert_worst_batch_s"] = round(worst, 3)
        out["peak_rss_mb_inserts"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

        # snapshot, restart, same answers
        probe = queries[:1000]
        _, live = _probes(shard, probe, 0, store=False)
        t0 = time.perf_counter()
        shard.save(f"{tmp}/s.shard", {"offset": 1})
        out["snapshot_save_s"] = round(time.perf_counter() - t0, 1)
        out["snapshot_gb"] = round(os.path.getsize(f"{tmp}/s.shard") / 1e9, 2)
        out["peak_rss_mb_saved"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        shard.close()
        del shard
        t0 = time.perf_counter()
        loaded, _ = Shard.load(f"{tmp}/s.shard", plan, f"{tmp}/s")
        loaded.prepare()
        out["restart_from_snapshot_s"] = round(time.perf_counter() - t0, 1)
        out["peak_rss_mb_loaded"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        out["rss_anon_mb_loaded"] = _rss_anon() // 2**20
        _, again = _probes(loaded, probe, 0, store=False)
        out["loaded_answers_like_live"] = bool(
            np.array_equal(again.distance, live.distance) and again.urls == live.urls
        )
        loaded.close()
        out["disk_gb"] = round(sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)) / 1e9, 1)
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
