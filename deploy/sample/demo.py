"""`make demo`: the whole thing on one machine — a local Kafka broker, a worker, and the sample
crawl through them — then what a crawl operator wants to see.

1. starts a private Apache Kafka broker (deploy/local/kafka.sh, KRaft, 127.0.0.1, free ports);
2. starts ``streamdedup worker`` against it;
3. sends deploy/sample/crawl.warc.gz (the Flask documentation across versions, with injected
   adverts, counters, timestamps, navigation and markup-only changes) with ``streamdedup produce``;
4. reads every verdict back, prints the counts by verdict, compares every page's verdict with
   ``streamdedup scan``'s on the same file, shows a few near-duplicates with the page each one
   repeats, and one synchronous ``POST /check``;
5. stops the worker and the broker (``--keep``, or ``make demo KEEP=1``: leaves them running, to
   look at /metrics and read the topics; the metrics URL is printed only then, while it answers).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CRAWL = HERE / "crawl.warc.gz"
KAFKA_SH = ROOT / "deploy" / "local" / "kafka.sh"
RUN = ROOT / "demo-run"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def wait_for(cond, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log and log.exists() else ""
    raise SystemExit(f"demo: {what} did not happen within {timeout:.0f}s\n{tail}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", action="store_true", help="leave the broker and the worker running")
    p.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="input partitions (default 1: the verdicts equal scan's on the file, page for page)",
    )
    args = p.parse_args()
    RUN.mkdir(exist_ok=True)
    kafka_port, controller_port, sasl_port, ssl_port, sasl_ssl_port, expired_port, web_port = free_ports(7)
    bootstrap = f"127.0.0.1:{kafka_port}"
    kafka_env = {
        **os.environ,
        "KAFKA_NAME": "demo",
        "KAFKA_PORT": str(kafka_port),
        "KAFKA_CONTROLLER_PORT": str(controller_port),
        "KAFKA_SASL_PORT": str(sasl_port),
        "KAFKA_SSL_PORT": str(ssl_port),  # the TLS listeners too: nothing on a fixed port
        "KAFKA_SASL_SSL_PORT": str(sasl_ssl_port),
        "KAFKA_SSL_EXPIRED_PORT": str(expired_port),
    }
    sd_env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDEDUP_")}
    sd_env.update(
        STREAMDEDUP_BROKERS=bootstrap,
        # One input partition (the default): the worker then stores the pages in the file's order, and its
        # verdicts equal scan's on the file page for page, every run (streamdedup/engine/order.py).
        # With several partitions the worker interleaves them in an order of Kafka's choosing;
        # each pair is still decided once, but which page of a pair wins, and so the counts, can
        # differ from scan's on the file's order (bench/README.md, "Stream against scan").
        STREAMDEDUP_PARTITIONS=str(args.partitions),
        STREAMDEDUP_WEB_PORT=str(web_port),
        STREAMDEDUP_DATA_DIR=str(RUN / "worker-data"),
    )
    streamdedup = [sys.executable, "-m", "streamdedup"]
    worker = None
    try:
        step(f"starting a local Apache Kafka broker on {bootstrap} (deploy/local/kafka.sh; ~10 s)")
        subprocess.run([str(KAFKA_SH), "stop"], env=kafka_env, capture_output=True)  # a leftover demo broker
        subprocess.run([str(KAFKA_SH), "start"], env=kafka_env, check=True)

        step("starting a worker: streamdedup worker --brokers " + bootstrap)
        log = RUN / "worker.log"
        worker = subprocess.Popen(streamdedup + ["worker"], env=sd_env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        wait_for(lambda: "[^Worker]: Ready" in log.read_text(errors="replace"), 90, "the worker start", log)
        print(f"   ready; log: {log.relative_to(ROOT)}")

        step(f"sending the sample crawl: streamdedup produce {CRAWL.relative_to(ROOT)}")
        subprocess.run(streamdedup + ["produce", str(CRAWL)], env=sd_env, check=True)

        step("reading the verdicts: streamdedup verdicts --from-beginning --format json")
        t0 = time.monotonic()
        verdicts = read_verdicts(streamdedup, sd_env, expected=count_pages(), log=log)
        print(f"   {len(verdicts)} verdicts in {time.monotonic() - t0:.1f} s")
        summarize(verdicts)
        check(web_port, verdicts)
        if args.keep:
            print(
                f"\nStill running (--keep): worker pid {worker.pid}, metrics http://127.0.0.1:{web_port}/metrics,"
                f" broker {bootstrap}.\nStop them with: kill {worker.pid}; "
                f"KAFKA_NAME=demo {KAFKA_SH.relative_to(ROOT)} stop"
            )
            worker = None
            return 0
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        if not args.keep:
            subprocess.run([str(KAFKA_SH), "stop"], env=kafka_env, capture_output=True)
            subprocess.run([str(KAFKA_SH), "clean"], env=kafka_env, capture_output=True)
    print(
        "\nTry it on your own crawl: start a worker against your cluster, then\n"
        "  .venv/bin/streamdedup produce your-crawl.warc.gz --brokers HOST:PORT\n"
        "  .venv/bin/streamdedup verdicts --brokers HOST:PORT --from-beginning --until-end\n"
        "or judge a file without Kafka:  .venv/bin/streamdedup scan your-crawl.warc.gz\n"
        "(make demo KEEP=1 leaves this demo's broker and worker running.)"
    )
    return 0


def count_pages() -> int:
    from streamdedup.engine.records import read_pages

    return sum(1 for _, page in read_pages(CRAWL) if not isinstance(page, Exception))


def read_verdicts(streamdedup: list[str], env: dict, expected: int, log: Path) -> list[dict]:
    out = subprocess.run(
        streamdedup + ["verdicts", "--from-beginning", "--format", "json", "--max", str(expected), "--timeout", "60"],
        env=env,
        capture_output=True,
        text=True,
    )
    verdicts = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    if len(verdicts) < expected:
        raise SystemExit(
            f"demo: only {len(verdicts)} of {expected} verdicts arrived:\n{out.stderr}\n"
            + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        )
    return verdicts


def summarize(verdicts: list[dict]) -> None:
    counts = Counter(v["verdict"] for v in verdicts)
    print(
        f"\n{len(verdicts)} pages: {counts['unique']} unique, {counts['near_duplicate']} near-duplicates "
        f"({counts['near_duplicate'] / len(verdicts):.0%})"
    )
    in_scan = scan_verdicts()
    scan_counts = Counter(v["verdict"] for v in in_scan.values())
    differ = [v["id"] for v in verdicts if v["id"] not in in_scan or judged(v) != judged(in_scan[v["id"]])]
    same = "the same" if scan_counts["unique"] == counts["unique"] else "NOT the same"
    print(
        f"`streamdedup scan` of the same file, in its order: {scan_counts['unique']} unique, "
        f"{scan_counts['near_duplicate']} near-duplicates ({same}); "
        + ("the same verdict and match for every page" if not differ else f"{len(differ)} pages judged otherwise")
    )
    for page in differ[:5]:
        print(f"  differs: {page}")
    dups = [v for v in verdicts if v["verdict"] == "near_duplicate"]
    shown = [v for v in dups if "?variant=" in v["url"]][:4] + [v for v in dups if "?variant=" not in v["url"]][:3]
    apart = [v for v in dups if v["distance"]][:2]  # and a couple that are not exact copies, if any
    shown = [v for v in shown if v not in apart][: len(shown) - len(apart)] + apart
    print("\nSome near-duplicates and the earlier page each one repeats:")
    for v in shown:
        print(f"  {v['url']}\n      = {v['match_url']}  ({bits_apart(v['distance'])})")


def judged(v: dict) -> tuple:
    return v["verdict"], v["match_id"], v["distance"]


def scan_verdicts() -> dict[str, dict]:
    """Verdicts of the embedded engine (``streamdedup scan``) over the sample crawl, in file order, by page id."""
    import io

    from streamdedup.engine.dedup import Deduplicator
    from streamdedup.engine.records import read_pages
    from streamdedup.engine.scan import scan_pages

    out = io.StringIO()
    scan_pages(read_pages(CRAWL), Deduplicator("simhash", k=3), out)
    return {v["id"]: v for v in map(json.loads, out.getvalue().splitlines())}


def bits_apart(distance: int) -> str:
    """
    >>> bits_apart(0), bits_apart(1), bits_apart(3)
    ('identical fingerprints', '1 bit apart', '3 bits apart')
    """
    if distance == 0:
        return "identical fingerprints"
    return f"{distance} bit{'s' if distance != 1 else ''} apart"


def check(web_port: int, verdicts: list[dict]) -> None:
    from streamdedup.engine.records import read_pages
    from streamdedup.fingerprinting.text import decode_body

    first = next(v for v in verdicts if v["verdict"] == "unique" and "?variant=" not in v["url"])
    page = next(p for _, p in read_pages(CRAWL) if getattr(p, "id", None) == first["id"])
    body = json.dumps(
        {
            "url": "http://mirror.example/copy",
            "content_type": "text/html",
            "content": decode_body(page.content, page.charset, page.content_type),
        }
    ).encode()
    t0 = time.perf_counter()
    req = urllib.request.Request(f"http://127.0.0.1:{web_port}/check", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        answer = json.loads(r.read())
    print(
        f"\nPOST /check of a copy of {first['url']} (not stored), {1000 * (time.perf_counter() - t0):.0f} ms:\n"
        f"  {json.dumps(answer)}"
    )


if __name__ == "__main__":
    sys.exit(main())
