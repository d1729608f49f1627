"""Speed of the core on one core: fingerprints from text and from raw HTML, and scan end to end.

    python bench/speed.py [--corpus bench/data] [--runs 5] [--limit 5000]

Every rate is measured in the same run as ``str.lower().split()`` over the same texts, so the
ratio to it means something on a shared, noisy machine.  Prints one JSON line per run and the
medians.  The corpus comes from ``python bench/corpus.py``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from pathlib import Path

from streamdedup.engine.dedup import Deduplicator
from streamdedup.engine.records import read_jsonl
from streamdedup.engine.scan import scan_pages
from streamdedup.fingerprinting.pages import SIMHASH_WORDS, simhash_texts
from streamdedup.fingerprinting.text import visible_text

BATCH = 256


def load(path: Path, limit: int) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for _, line in zip(range(limit), f)]


def rate(n: int, fn) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def batched(items: list, size: int = BATCH):
    return [items[i : i + size] for i in range(0, len(items), size)]


def one_run(html_pages: list[dict], texts: list[str], jsonl_text: bytes) -> dict:
    n = len(texts)
    out = {"docs": n}
    out["split_per_s"] = rate(n, lambda: [t.lower().split() for t in texts])
    out["fingerprint_text_per_s"] = rate(n, lambda: [simhash_texts(b) for b in batched(texts)])
    out["extract_html_per_s"] = rate(n, lambda: [visible_text(p["content"], "text/html") for p in html_pages])
    out["fingerprint_html_per_s"] = rate(
        n, lambda: [simhash_texts([visible_text(p["content"], "text/html") for p in b]) for b in batched(html_pages)]
    )
    out["scan_text_per_s"] = rate(
        n, lambda: scan_pages(read_jsonl(io.BytesIO(jsonl_text)), Deduplicator("simhash"), io.StringIO(), BATCH)
    )
    for key in ("fingerprint_text_per_s", "fingerprint_html_per_s", "scan_text_per_s"):
        out[key.replace("_per_s", "_vs_split")] = out[key] / out["split_per_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path("bench/data"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--limit", type=int, default=5000, help="pages to use")
    args = p.parse_args()
    html_pages = load(args.corpus / "corpus.jsonl", args.limit)
    text_pages = load(args.corpus / "corpus-text.jsonl", args.limit)
    texts = [t["content"] for t in text_pages]
    jsonl_text = "".join(
        json.dumps({"id": t["id"], "url": t["url"], "content": t["content"], "content_type": "text/plain"}) + "\n"
        for t in text_pages
    ).encode()
    words = sum(len(t.split()) for t in texts) / len(texts)
    html_kb = sum(len(p["content"]) for p in html_pages) / len(html_pages) / 1024
    print(
        f"# {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}; "
        f"{len(texts)} pages, {words:.0f} words of text and {html_kb:.1f} KiB of HTML on average; "
        f"{SIMHASH_WORDS}-word simhash shingles, batches of {BATCH}"
    )
    runs = []
    for _ in range(args.runs):
        r = one_run(html_pages, texts, jsonl_text)
        print(json.dumps({k: round(v, 3) for k, v in r.items()}))
        runs.append(r)
    for key in runs[0]:
        if key != "docs":
            print(f"median {key}: {statistics.median(r[key] for r in runs):,.3f}")


if __name__ == "__main__":
    main()
