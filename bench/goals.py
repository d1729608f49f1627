"""The speed goals of issue 10 in one go: every ratio measured in the same run as its reference.

    python bench/goals.py [--runs 5] [--texts 2000] [--pages 1000] [--stream-runs 3] [--quick]
    python bench/goals.py --skip-stream            # only the one-core figures (no broker)

``make bench`` runs it.  It needs the ``bench`` extra (gaoya, rensa) and the corpus of
``python bench/corpus.py``.  Three parts, each repeated ``--runs`` times; the summary gives
for each figure the median and the spread (min..max over runs), and the load average
(1 min) before and after each part, because the machine may be shared.

Parts 1 and 2 time CPU seconds of the bench process (``time.process_time``), pinned to one
core: the rates are per CPU second, and the time spent waiting for the core while other
processes run on it is not counted (see ``in_turns``).

1. One core (pinned), visible texts of ``corpus-text.jsonl``, batches of 256; the options take
   turns at every batch, so a change of load hits all of them alike:
   ``simhash_texts(batch)`` against gaoya's ``SimHash64StringIntIndex("word", lowercase,
   bigrams).doc2signature(t)`` per text and against ``[t.lower().split() for t in batch]``;
   words + trigram shingles + MinHash-128 signatures against rensa's
   ``RMinHash(128, 1).update(t.split()); digest()`` per text.
2. One core (pinned), raw HTML pages of ``corpus.jsonl`` (the ``content`` strings), batches of
   256, in turns: ``LexborHTMLParser(html)`` per page (lexbor's parse alone, what selectolax
   gives a user); raw HTML -> simhash (``simhash_texts([visible_text(html, "text/html") ...])``);
   ``scan_pages`` end to end on the same records as JSON lines (parse and validate the record,
   extract, fingerprint, query and insert into one ``Deduplicator("simhash")`` kept over the
   run's batches, write the verdicts).
3. ``bench/stream_bench.py --only throughput,latency``: a private broker and a real
   ``streamdedup worker``; the backlog rate against ``scan_pages`` on the same records in the
   bench process, and produce -> verdict latency at half the worker's backlog rate.  The
   broker, the worker, its fingerprinting process and the bench share the machine's cores.

The table and every run go to ``bench/out/goals.json`` (``--json``), the workers' logs to
``bench/out/stream-work/`` (``--workdir``, replaced at each run).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 256


def load(path: Path, limit: int) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for _, line in zip(range(limit), f)]


def batched(items: list, size: int = BATCH) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def in_turns(batches: list, options: dict[str, Callable[[object], object]], setup: Callable[[], None]) -> dict:
    """CPU seconds each option spends on all batches, the options taking turns at every batch.

    CPU time of this process, not wall time: pinned to one core of a shared machine, the bench
    waits for that core whenever another process runs on it, and those waits come in bursts of
    seconds that would land on whichever option runs then (a wall-clock ratio of scan to its own
    first stage came out anywhere between 0.76 and 1.39 at load average 8).
    """
    setup()
    spent = dict.fromkeys(options, 0.0)
    for b in batches:
        for name, fn in options.items():
            t0 = time.process_time()
            fn(b)
            spent[name] += time.process_time() - t0
    return spent


# ---- part 1: visible text -> fingerprints ---------------------------------------------------------


def text_part(texts: list[str], runs: int) -> list[dict]:
    from gaoya.gaoya import simhash as gaoya_simhash
    from rensa import RMinHash

    from streamdedup.fingerprinting.features import shingle_hashes_many, word_hashes_many
    from streamdedup.fingerprinting.minhash import minhash_signatures_flat
    from streamdedup.fingerprinting.pages import MINHASH_WORDS, Fingerprints, simhash_texts

    index = gaoya_simhash.SimHash64StringIntIndex(6, 3, "word", True, (2, 2))

    def split(b: list[str]) -> None:
        for t in b:
            t.lower().split()

    def gaoya(b: list[str]) -> None:
        for t in b:
            index.doc2signature(t)

    def minhash(b: list[str]) -> None:
        minhash_signatures_flat(*shingle_hashes_many(*word_hashes_many(b), MINHASH_WORDS), 128)

    def rensa(b: list[str]) -> None:
        for t in b:
            m = RMinHash(128, 1)
            m.update(t.split())
            m.digest()

    options = {"split": split, "simhash": simhash_texts, "gaoya": gaoya, "minhash": minhash, "rensa": rensa}
    # one pass not counted: kernels loaded from numba's cache (or compiled) for every kind of batch
    # (ASCII, UTF-16, UTF-32), the code-point table built; without it the first run is 4x slower
    Fingerprints(["ascii"]).minhash  # noqa: B018
    in_turns(batched(texts), options, lambda: None)  # type: ignore[arg-type]
    out = []
    for i in range(runs):
        before = load_avg()
        spent = in_turns(batched(texts), options, lambda: None)  # type: ignore[arg-type]
        r = {f"{k}_per_s": len(texts) / s for k, s in spent.items()}
        r |= {
            "simhash_vs_gaoya": r["simhash_per_s"] / r["gaoya_per_s"],
            "simhash_vs_split": r["simhash_per_s"] / r["split_per_s"],
            "minhash_vs_rensa": r["minhash_per_s"] / r["rensa_per_s"],
            "load_before": before,
            "load_after": load_avg(),
        }
        print(f"# text run {i + 1}: " + json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
        out.append(r)
    return out


# ---- part 2: raw HTML -> fingerprints, and scan end to end ----------------------------------------


def html_part(pages: list[dict], runs: int) -> list[dict]:
    from selectolax.lexbor import LexborHTMLParser

    from streamdedup.engine.dedup import Deduplicator
    from streamdedup.engine.records import read_jsonl
    from streamdedup.engine.scan import scan_pages
    from streamdedup.fingerprinting.pages import simhash_texts
    from streamdedup.fingerprinting.text import visible_text

    html = [p["content"] for p in pages]
    records = [
        (json.dumps({"id": p["id"], "url": p["url"], "content": p["content"], "content_type": "text/html"}) + "\n")
        for p in pages
    ]
    # a batch: (html strings, the same pages as JSON lines)
    batches = [(h, "".join(r).encode()) for h, r in zip(batched(html), batched(records))]
    state: dict = {}

    def lexbor(b: tuple) -> None:
        for h in b[0]:
            LexborHTMLParser(h)

    def html_simhash(b: tuple) -> None:
        simhash_texts([visible_text(h, "text/html") for h in b[0]])

    def scan(b: tuple) -> None:
        scan_pages(read_jsonl(io.BytesIO(b[1])), state["dedup"], io.StringIO(), BATCH)

    def fresh() -> None:
        state["dedup"] = Deduplicator("simhash")

    options = {"lexbor": lexbor, "html_simhash": html_simhash, "scan": scan}
    in_turns(batches, options, fresh)  # one pass not counted (first calls, caches)
    out = []
    for i in range(runs):
        before = load_avg()
        spent = in_turns(batches, options, fresh)  # type: ignore[arg-type]
        r = {f"{k}_per_s": len(pages) / s for k, s in spent.items()}
        r |= {
            "html_simhash_vs_lexbor": r["html_simhash_per_s"] / r["lexbor_per_s"],
            "scan_vs_html_simhash": r["scan_per_s"] / r["html_simhash_per_s"],
            "load_before": before,
            "load_after": load_avg(),
        }
        print(f"# html run {i + 1}: " + json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
        out.append(r)
    return out


# ---- part 3: the stream worker --------------------------------------------------------------------


def stream_part(args: argparse.Namespace) -> list[dict]:
    cmd = [
        sys.executable,
        str(ROOT / "bench/stream_bench.py"),
        "--only",
        "throughput,latency",
        "--runs",
        str(args.stream_runs),
        "--pages",
        str(args.stream_pages),
        "--latency-seconds",
        str(args.latency_seconds),
        "--corpus",
        str(args.corpus / "corpus.jsonl"),
        "--workdir",
        str(args.workdir),
    ]
    shutil.rmtree(args.workdir, ignore_errors=True)
    print("# " + " ".join(cmd[1:]), flush=True)
    out = []
    before = load_avg()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print("#   " + line.rstrip(), flush=True)
            if line.startswith("{"):
                r = json.loads(line)
                r |= {"load_before": before, "load_after": load_avg()}
                before = r["load_after"]
                out.append(r)
    if proc.returncode:
        print(f"# stream_bench.py exited with {proc.returncode}", file=sys.stderr)
    return out


# ---- the summary ----------------------------------------------------------------------------------

# (measure, part, ours, reference, ratio, goal, at least?)  ratio None: the goal is on "ours"
ROWS: list[tuple[str, str, str, str, str | None, float, bool]] = [
    (
        "simhash from visible text vs gaoya SimHash",
        "text",
        "simhash_per_s",
        "gaoya_per_s",
        "simhash_vs_gaoya",
        1.5,
        True,
    ),
    (
        "simhash from visible text vs str.lower().split()",
        "text",
        "simhash_per_s",
        "split_per_s",
        "simhash_vs_split",
        0.8,
        True,
    ),
    (
        "MinHash-128 from visible text vs rensa RMinHash",
        "text",
        "minhash_per_s",
        "rensa_per_s",
        "minhash_vs_rensa",
        1.0,
        True,
    ),
    (
        "raw HTML -> simhash vs lexbor parse alone",
        "html",
        "html_simhash_per_s",
        "lexbor_per_s",
        "html_simhash_vs_lexbor",
        0.6,
        True,
    ),
    (
        "scan end to end on raw HTML vs raw HTML -> simhash",
        "html",
        "scan_per_s",
        "html_simhash_per_s",
        "scan_vs_html_simhash",
        0.8,
        True,
    ),
    (
        "worker backlog (broker, 1 worker) vs scan_pages",
        "stream",
        "tput_per_s",
        "tput_scan_per_s",
        "tput_stream_vs_scan",
        0.9,
        True,
    ),
    ("produce -> verdict p99 (s) at half the backlog rate", "stream", "lat_p99_s", "lat_rate_per_s", None, 0.25, False),
    # no goal: scan's CPU per page / the worker's (its pool included), which waiting for a core does not move
    (
        "CPU per page: scan_pages vs the worker (+ its pool)",
        "stream",
        "tput_cpu_ms_per_page",
        "tput_scan_cpu_ms_per_page",
        "tput_cpu_scan_vs_stream",
        0.0,
        True,
    ),
]


def spread(runs: list[dict], key: str) -> tuple[float, float, float]:
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals), min(vals), max(vals)


def summary(parts: dict[str, list[dict]]) -> list[dict]:
    table = []
    for measure, part, ours, ref, ratio, goal, at_least in ROWS:
        runs = parts.get(part) or []
        if not runs or ours not in runs[0]:
            table.append({"measure": measure, "skipped": True})
            continue
        key = ratio or ours
        med, lo, hi = spread(runs, key)
        table.append(
            {
                "measure": measure,
                "ours": spread(runs, ours),
                "reference": spread(runs, ref),
                "value": (med, lo, hi),
                "goal": goal,
                "at_least": at_least,
                "met": med >= goal if at_least else med <= goal,
                "load": (min(r["load_before"] for r in runs), max(r["load_after"] for r in runs)),
                "runs": len(runs),
            }
        )
    return table


def fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}" if x < 1 else f"{x:,.2f}"


def print_table(table: list[dict]) -> None:
    print("\n| measure | ours | reference | ratio (median, min..max) | goal | met? | load avg | runs |")
    print("|---|---|---|---|---|---|---|---|")
    for row in table:
        if row.get("skipped"):
            print(f"| {row['measure']} | not run | | | | | | |")
            continue
        ours, ref, (med, lo, hi) = row["ours"][0], row["reference"][0], row["value"]
        is_latency = not row["at_least"]
        ref_s = f"{fmt(ref)} pages/s produced" if is_latency else f"{fmt(ref)}/s"
        ours_s = f"{med * 1000:.0f} ms" if is_latency else f"{fmt(ours)}/s"
        if "cpu_ms" in ROWS[table.index(row)][2]:
            ours_s, ref_s = f"{ours:.2f} ms", f"{ref:.2f} ms"
        value = (
            f"p99 {med * 1000:.0f} ms ({lo * 1000:.0f}..{hi * 1000:.0f})"
            if is_latency
            else f"**{med:.2f} x** ({lo:.2f}..{hi:.2f})"
        )
        goal = f"<= {row['goal'] * 1000:.0f} ms" if is_latency else f">= {row['goal']} x" if row["goal"] else "(none)"
        load = f"{row['load'][0]:.1f}-{row['load'][1]:.1f}"
        met = ("yes" if row["met"] else "**no**") if row["goal"] else ""
        print(f"| {row['measure']} | {ours_s} | {ref_s} | {value} | {goal} | {met} | {load} | {row['runs']} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=ROOT / "bench/data")
    p.add_argument("--runs", type=int, default=5, help="runs of parts 1 and 2")
    p.add_argument("--texts", type=int, default=2000, help="visible texts for part 1")
    p.add_argument("--pages", type=int, default=1000, help="raw HTML pages for part 2")
    p.add_argument("--stream-runs", type=int, default=3)
    p.add_argument("--stream-pages", type=int, default=3000)
    p.add_argument("--latency-seconds", type=float, default=20.0)
    p.add_argument("--skip-stream", action="store_true", help="no broker: parts 1 and 2 only")
    p.add_argument("--quick", action="store_true", help="3 runs, fewer pages, 1 stream run (a few minutes)")
    p.add_argument("--cpu", type=int, default=None, help="CPU for parts 1 and 2 (default: the first allowed)")
    p.add_argument("--json", type=Path, default=ROOT / "bench/out/goals.json")
    p.add_argument("--workdir", type=Path, default=ROOT / "bench/out/stream-work", help="the workers' logs (kept)")
    args = p.parse_args()
    if args.quick:
        args.runs, args.texts, args.pages = 3, 1000, 512
        args.stream_runs, args.stream_pages, args.latency_seconds = 1, 1500, 10.0
    for name in ("corpus.jsonl", "corpus-text.jsonl"):
        if not (args.corpus / name).exists():
            sys.exit(f"{args.corpus / name} is missing: build the corpus with python bench/corpus.py")

    from streamdedup.fingerprinting import kernels

    allowed = os.sched_getaffinity(0)
    cpu = args.cpu if args.cpu is not None else min(allowed)
    texts = [p["content"] for p in load(args.corpus / "corpus-text.jsonl", args.texts)]
    pages = load(args.corpus / "corpus.jsonl", args.pages)
    html_kib = sum(len(p["content"].encode()) for p in pages) / len(pages) / 1024
    head = (
        f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, numba kernels: "
        f"{kernels.available()}; parts 1-2 pinned to cpu {cpu}; {len(texts)} texts "
        f"({sum(map(len, texts)) / len(texts):,.0f} chars on average), {len(pages)} HTML pages "
        f"({html_kib:.1f} KiB on average); batches of {BATCH}; load average {os.getloadavg()}"
    )
    print("# " + head, flush=True)
    parts: dict[str, list[dict]] = {}
    t0 = time.monotonic()
    os.sched_setaffinity(0, {cpu})
    try:
        parts["text"] = text_part(texts, args.runs)
        parts["html"] = html_part(pages, args.runs)
    finally:
        os.sched_setaffinity(0, allowed)
    if not args.skip_stream:
        parts["stream"] = stream_part(args)
    table = summary(parts)
    print(f"\n# {head}; took {time.monotonic() - t0:.0f} s; load average after {os.getloadavg()}")
    print_table(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"machine": head, "args": vars(args), "summary": table, "runs": parts}, indent=1, default=str)
    )
    print(f"\n# every run: {args.json}")


if __name__ == "__main__":
    main()
