"""Make deploy/sample/crawl.warc.gz, the sample crawl of `make demo`, from the benchmark corpus.

    python bench/corpus.py            # once: builds bench/data/corpus.jsonl
    python deploy/sample/make_sample.py

The sample is every page of the Flask documentation in the corpus (Debian's python-flask-doc
2.2.2 HTML and Flask 2.0.0, 2.2.0 and 3.0.0 rendered from their sdists, BSD-3-Clause), in
corpus order, with the corpus's synthetic variants of them (adverts, counters, timestamps,
navigation, markup-only changes), written as WARC response records with fixed dates so the
file is the same on every run.  One empty response is added on purpose: scan reports and
skips it.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "bench" / "data" / "corpus.jsonl"
OUT = Path(__file__).resolve().parent / "crawl.warc.gz"
START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def main() -> None:
    pages = [p for p in map(json.loads, CORPUS.open()) if "flask" in p["source"].lower()]
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    for n, page in enumerate(pages):
        body = page["content"].encode("utf-8")
        if n == len(pages) // 2:
            body = b""  # a failed fetch with an empty body
        http = StatusAndHeaders(
            "200 OK",
            [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))],
            protocol="HTTP/1.1",
        )
        date = (START + timedelta(seconds=7 * n)).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = writer.create_warc_record(
            page["url"],
            "response",
            payload=io.BytesIO(body),
            http_headers=http,
            warc_headers_dict={"WARC-Date": date, "WARC-Record-ID": f"<urn:uuid:sample-{n:05d}>"},
        )
        writer.write_record(record)
    OUT.write_bytes(buf.getvalue())
    print(f"{OUT.relative_to(ROOT)}: {len(pages)} records, {OUT.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
