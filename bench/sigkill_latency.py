"""Produce -> verdict latency while a worker is SIGKILLed (issue 15 item 10), run by hand.

Two workers share the partitions; pages are produced at a steady rate; after ``--kill-at``
seconds one worker is SIGKILLed (not restarted).  Every page needs an answer from every shard
group, so until the group coordinator expires the dead member (``broker_session_timeout``, 10 s)
and the survivor has taken over and rebuilt the dead worker's shards, *every* page waits, not
only those of the dead worker's partitions.  The latency of a page is the verdict record's
timestamp (set by the worker's producer when it sends it) minus the page's (set by the producer
here), both read back from the topics.

    python bench/sigkill_latency.py                      # a private broker, 2 workers
    python bench/sigkill_latency.py --standby-replicas 1 --rate 100 --seconds 60
    python bench/sigkill_latency.py --session-timeout 6    # the workers' --session-timeout
    python bench/sigkill_latency.py --standby-replicas 1 --copies 0.3   # copies answered by standbys

Prints p50/p99/max for the pages produced before the kill, in the 20 s after it, and after that,
and how long the stall lasted (first page after the kill to the first verdict after it).
Run from the repository root with the project's venv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's broker and worker harness

from aiokafka import AIOKafkaProducer  # noqa: E402
from kafka_broker import LocalKafka  # noqa: E402
from stream_harness import StreamTopics, WorkerProcess, page_record, produce  # noqa: E402
from topics import read_topic  # noqa: E402


async def produce_steadily(kafka, topic: str, rate: float, seconds: float, on_tick, copies: float = 0.0) -> None:
    """``copies``: the share of pages that copy an earlier page's content (one produced at least
    3 s before), under a URL of their own (``http://lat.test/copy-<i>``)."""
    p = AIOKafkaProducer(**kafka.client_kwargs(), linger_ms=0)
    await p.start()
    try:
        rng = np.random.default_rng(5)
        start, i = time.monotonic(), 0
        made: list[tuple[float, str]] = []  # (when, content) of the pages that are not copies
        while (now := time.monotonic() - start) < seconds:
            on_tick(now)
            older = [c for t, c in made if t <= now - 3.0]
            if older and rng.random() < copies:
                page = {"url": f"http://lat.test/copy-{i}", "content": older[int(rng.integers(0, len(older)))]}
            else:
                words = " ".join(f"w{j}" for j in rng.integers(0, 20000, 150))
                page = {"url": f"http://lat.test/{i}", "content": f"<p>{words}</p>"}
                made.append((now, page["content"]))
            await p.send(topic, json.dumps(page).encode(), key=page["url"].encode())
            i += 1
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        await p.flush()
    finally:
        await p.stop()


def percentiles(lat: list[float]) -> str:
    if not lat:
        return "n=0"
    a = np.array(lat)
    return f"n={len(a)} p50={np.percentile(a, 50):.2f}s p99={np.percentile(a, 99):.2f}s max={a.max():.2f}s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=50.0, help="pages per second")
    ap.add_argument("--seconds", type=float, default=45.0, help="how long to produce")
    ap.add_argument("--kill-at", type=float, default=12.0, help="seconds into the run")
    ap.add_argument("--standby-replicas", type=int, default=0)
    ap.add_argument("--session-timeout", type=int, default=10, help="the workers' --session-timeout (seconds)")
    ap.add_argument("--copies", type=float, default=0.0, help="share of pages that copy an earlier page (0..1)")
    ap.add_argument("--brokers", help="an existing broker (default: a private one from deploy/local)")
    args = ap.parse_args()
    if args.brokers:
        from sigkill_loop import Broker  # (bench/ is on sys.path when run as a script)

        kafka = Broker(args.brokers)
    else:
        kafka = LocalKafka(name=f"bench-latency-{int(time.time())}").start()
    workdir = Path(tempfile.mkdtemp(prefix="sigkill-latency-"))
    ws: list[WorkerProcess] = []
    try:
        topics = StreamTopics.fresh(kafka, partitions=4)
        env = {
            "STREAMDEDUP_STANDBY_REPLICAS": str(args.standby_replicas),
            "STREAMDEDUP_SESSION_TIMEOUT": str(args.session_timeout),
        }
        ws = [WorkerProcess(kafka, topics, workdir, name=f"w{i}", env=env) for i in range(2)]
        for w in ws:
            w.start(timeout=120)
    except BaseException:
        for w in ws:
            w.__exit__(None, None, None)
        raise
    try:
        # warm up: both hold partitions and verdicts flow (the second's join causes a rebalance)
        warm = [page_record(f"http://warm.test/{i}", f"<p>warm up page {i} {'text ' * i}</p>") for i in range(20)]
        produce(kafka, topics.pages, warm)
        deadline = time.monotonic() + 180
        while len(read_topic(kafka, topics.verdicts, timeout=60)) < len(warm):
            if time.monotonic() > deadline:
                raise SystemExit("the workers gave no verdicts for the warm-up pages within 180 s")
            time.sleep(1.0)
        before_run = {(r.partition, r.offset) for r in read_topic(kafka, topics.pages, timeout=60)}
        killed_at: list[float] = []

        def tick(now: float) -> None:
            if now >= args.kill_at and not killed_at:
                ws[1].kill()
                killed_at.append(time.time())

        asyncio.run(produce_steadily(kafka, topics.pages, args.rate, args.seconds, tick, args.copies))
        produced = [r for r in read_topic(kafka, topics.pages, timeout=60) if (r.partition, r.offset) not in before_run]
        sent = {(r.partition, r.offset): r.timestamp / 1000 for r in produced}
        copy = {(r.partition, r.offset) for r in produced if "/copy-" in json.loads(r.value)["url"]}
        deadline = time.monotonic() + 120
        while True:
            verdicts = read_topic(kafka, topics.verdicts, timeout=60)
            if len(verdicts) >= len(sent) + len(before_run) or time.monotonic() > deadline:
                break
            time.sleep(2.0)
    finally:
        for w in ws:
            w.__exit__(None, None, None)
        if isinstance(kafka, LocalKafka):
            kafka.stop()
    kill = killed_at[0]
    before, during, after = [], [], []
    during_copies: list[float] = []
    first_after = None
    verdicts = [r for r in verdicts if (lambda v: (v["partition"], v["offset"]) in sent)(json.loads(r.value))]
    for r in verdicts:
        v = json.loads(r.value)
        t_in = sent[(v["partition"], v["offset"])]
        lat = r.timestamp / 1000 - t_in
        (before if t_in < kill else during if t_in < kill + 20 else after).append(lat)
        if kill <= t_in < kill + 20 and (v["partition"], v["offset"]) in copy:
            during_copies.append(lat)
        if r.timestamp / 1000 > kill and (first_after is None or r.timestamp / 1000 < first_after):
            first_after = r.timestamp / 1000
    # the stall: the longest gap between consecutive verdicts around the kill
    times = sorted(r.timestamp / 1000 for r in verdicts)
    gaps = [(b - a, a) for a, b in zip(times, times[1:]) if b > kill]
    gap, gap_start = max(gaps) if gaps else (0.0, kill)
    print(
        f"rate {args.rate:.0f}/s for {args.seconds:.0f}s, 2 workers, standby replicas {args.standby_replicas}, "
        f"session timeout {args.session_timeout}s, copies {args.copies:.0%}, "
        f"SIGKILL at {args.kill_at:.0f}s"
    )
    print(f"verdicts {len(verdicts)} of {len(sent)} pages")
    print(f"  before the kill:    {percentiles(before)}")
    print(f"  kill .. kill+20s:   {percentiles(during)}")
    if args.copies:
        print(f"    of which copies:  {percentiles(during_copies)}")
    print(f"  after:              {percentiles(after)}")
    print(f"  all:                {percentiles(before + during + after)}")
    print(f"  longest gap between verdicts after the kill: {gap:.1f}s (from {gap_start - kill:+.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
