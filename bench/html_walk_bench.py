"""The visible-text walk in C against the walk in Python, on the corpus's raw HTML pages.

Both walks run on every page (same text? every page must agree), then each is timed in CPU
seconds on one core, alternating, ``--runs`` times: lexbor's parse alone, the Python walk and
the C walk (``text._html_text(data, compiled=...)``, parse included).  Prints µs a page
(median and spread over runs).

    .venv/bin/python bench/html_walk_bench.py --pages 3000 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from selectolax.lexbor import LexborHTMLParser

from streamdedup.fingerprinting import text

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, default=ROOT / "bench/data/corpus.jsonl")
    p.add_argument("--pages", type=int, default=3000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    if text._C is None:
        raise SystemExit("the C walk is not built (no C compiler at install, or STREAMDEDUP_HTML_WALK=python)")
    with args.corpus.open() as f:
        pages = [json.loads(line)["content"].encode("utf-8", "replace") for _, line in zip(range(args.pages), f)]
    differ = sum(text._html_text(b, compiled=True) != text._html_text(b, compiled=False) for b in pages)
    print(
        f"# {len(pages)} pages, {sum(map(len, pages)) / len(pages) / 1024:.1f} KiB on average; texts differ: {differ}"
    )

    def parse(b: bytes) -> None:
        LexborHTMLParser(b, scripting=True)

    options = {
        "lexbor parse": parse,
        "Python walk": lambda b: text._html_text(b, compiled=False),
        "C walk": lambda b: text._html_text(b, compiled=True),
    }
    times: dict[str, list[float]] = {k: [] for k in options}
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for _ in range(args.runs):
        for name, fn in options.items():
            t0 = time.process_time()
            for b in pages:
                fn(b)
            times[name].append((time.process_time() - t0) / len(pages) * 1e6)
    for name, ts in times.items():
        print(f"{name:14s} {statistics.median(ts):7.1f} µs a page ({min(ts):.1f}..{max(ts):.1f}, {args.runs} runs)")
    print(f"# load average {os.getloadavg()[0]:.2f}")
    if differ:
        raise SystemExit(f"{differ} pages got another text from the C walk")


if __name__ == "__main__":
    main()
