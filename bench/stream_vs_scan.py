"""The worker's verdicts against ``scan``'s on the same arrival order, page by page (issue 9).

    python bench/stream_vs_scan.py run --pages 3000 --partitions 1 4 --runs 3   # broker + worker, then compare
    python bench/stream_vs_scan.py run --partitions 4 --workers 2 --kill        # one worker SIGKILLed mid-stream
    python bench/stream_vs_scan.py compare STREAM.jsonl SCAN.jsonl              # two verdict files

``run`` starts a private local broker (tests/kafka_broker.py), judges the first ``--pages``
corpus pages with ``scan_pages`` in corpus order (``bench/out/vs/scan.jsonl``), and for each
partition count and run: fresh topics, ``--workers`` workers, the pages produced keyed by id
(Kafka's default partitioner) as a backlog (the workers are paused while it is produced, as in
stream_bench.py), every verdict read back (``bench/out/vs/stream-p<P>-r<i>.jsonl``, the worker's
verdict records with their input partition and offset); then ``compare`` on each.

``compare`` reads a stream verdict file (JSON lines with ``partition`` and ``offset``) and a
scan verdict file (its line order is the arrival order ``scan`` saw, which must keep every
partition's offset order: a file order produced keyed by id does), and prints:

* every page whose verdict (``verdict``, ``match_id``, ``distance``) differs, classified:

  - ``other_match_tie``: both flagged, another match at the same distance (the worker stored
    another equally near candidate first; allowed with several partitions);
  - ``other_match_reordered``: both flagged, matches at different distances, where the nearer
    one is a page of another partition whose pair with this page the worker decided the other
    way round (allowed with several partitions);
  - ``reversed_to_unique`` / ``reversed_to_near``: unique in one and flagged in the other,
    every pair involved between pages of different partitions and decided the other way round
    by the worker (its other page is flagged in the stream); allowed with several partitions;
  - ``bug_*``: anything else (a match that is not within k, is the page itself or a later page
    of its own partition; a page unique in the stream with an earlier near page in its own
    partition; a nearer candidate of its own partition passed over; a different fingerprint; a
    missing or doubled verdict).  With ONE partition every difference is a bug (``bug_one_partition``):
    the rule says the worker then equals ``scan`` (streamdedup/engine/order.py).

* the pair property, checked directly on every pair of pages within k bits (different ids) in
  the input, with what the verdicts show: no pair both unique; no pair where each names the
  other; in a pair of one partition the later page is flagged at a distance <= the pair's and
  the earlier does not name the later; every flagged page names a page within k bits with
  the right distance.  The same checks on the scan file, with its line order, check the
  checker.

Exit status 1 if any ``bug_*`` count or pair violation is non-zero.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from streamdedup.engine.order import canonical_groups, group_masks  # noqa: E402
from streamdedup.index.hamming import HammingIndex  # noqa: E402

ALLOWED = ("other_match_tie", "other_match_reordered", "reversed_to_unique", "reversed_to_near")


def read_verdicts(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class Pairs:
    """Every pair of pages within k bits (different ids), from their fingerprints."""

    def __init__(self, ids: list[str], fps: np.ndarray, k: int, design: str | None) -> None:
        index = HammingIndex(k=k, design=design)
        index.add_many(range(len(ids)), fps)
        found = index.search(fps)
        keep = found.row > found.query
        a, b, d = found.query[keep], found.row[keep], found.distance[keep]
        groups = canonical_groups(fps[a] ^ fps[b], group_masks(index.design))
        self.ids = ids
        self.list = [
            (ids[i], ids[j], int(x), int(g))
            for i, j, x, g in zip(a.tolist(), b.tolist(), d.tolist(), groups.tolist())
            if ids[i] != ids[j]
        ]
        self.near: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)  # id -> {other: (distance, group)}
        for x, y, dist, g in self.list:
            self.near[x][y] = self.near[y][x] = (dist, g)


def compare(stream: list[dict], scan: list[dict], k: int = 3, design: str | None = None) -> dict:
    """Classification counts, examples and pair-property violations (module doc)."""
    counts: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)

    def note(cls: str, text: str) -> None:
        counts[cls] += 1
        if len(examples[cls]) < 8:
            examples[cls].append(text)

    by_id: dict[str, list[dict]] = defaultdict(list)
    for v in stream:
        by_id[v["id"]].append(v)
    order = {v["id"]: i for i, v in enumerate(scan)}
    for i, vs in by_id.items():
        if len(vs) > 1:
            note("bug_doubled_verdict", i)
    for v in scan:
        if v["id"] not in by_id:
            note("bug_missing_verdict", v["id"])
    for i in by_id:
        if i not in order:
            note("bug_not_in_scan", i)
    st = {i: vs[0] for i, vs in by_id.items()}
    partitions = {v["partition"] for v in st.values()}
    # the partition order must be a sub-order of the scan file's (else it is not "the same arrival order")
    last: dict[int, tuple[int, int]] = {}
    for v in sorted((st[x["id"]] for x in scan if x["id"] in st), key=lambda v: (v["partition"], v["offset"])):
        prev = last.get(v["partition"])
        if prev is not None and order[v["id"]] < prev[1]:
            note("bug_scan_order_not_the_partitions", v["id"])
        last[v["partition"]] = (v["offset"], order[v["id"]])

    fps = np.array([int(v["fingerprint"], 16) for v in scan], dtype=np.uint64)
    pairs = Pairs([v["id"] for v in scan], fps, k, design)
    near = pairs.near
    for v in scan:
        s = st.get(v["id"])
        if s is not None and s["fingerprint"] != v["fingerprint"]:
            note("bug_fingerprint_differs", f"{v['id']}: stream {s['fingerprint']} scan {v['fingerprint']}")

    def same_part(a: str, b: str) -> bool:
        return st[a]["partition"] == st[b]["partition"]

    def surely_before(a: str, b: str) -> bool:
        """a was stored before b in every group store of the worker (same partition, lower offset)."""
        return same_part(a, b) and st[a]["offset"] < st[b]["offset"]

    def flagged(a: str) -> bool:
        return st[a]["verdict"] == "near_duplicate"

    sc = {v["id"]: v for v in scan}
    one_partition = len(partitions) == 1
    for pid, v in sc.items():
        s = st.get(pid)
        if s is None:
            continue
        mine = (s["verdict"], s["match_id"], s["distance"])
        if mine == (v["verdict"], v["match_id"], v["distance"]):
            counts["same"] += 1
            continue
        desc = f"{pid} [p{s['partition']}@{s['offset']}]: stream {mine[:2]} d={mine[2]}, scan ({v['verdict']}, {v['match_id']}) d={v['distance']}"
        if one_partition:
            note("bug_one_partition", desc)
            continue
        cand = near.get(pid, {})
        w, m = s["match_id"], v["match_id"]
        if w is not None and (w not in cand or cand[w][0] != s["distance"] or w == pid or surely_before(pid, w)):
            note("bug_invalid_match", desc)
            continue
        earlier_own = [q for q in cand if surely_before(q, pid)]
        if s["verdict"] == "unique":
            if earlier_own:
                note("bug_missed_own_partition", desc + f"; earlier near pages of its partition: {earlier_own[:3]}")
            elif any(not flagged(q) for q in cand):
                note("bug_pair_both_unique", desc)
            else:
                note("reversed_to_unique", desc)
            continue
        assert w is not None  # flagged
        best_own = min((cand[q][0] for q in earlier_own), default=99)
        if best_own < s["distance"]:
            note("bug_nearer_own_partition_passed_over", desc)
            continue
        if v["verdict"] == "unique":
            # the stream's match comes after the page in scan order: the pair went the other way
            note("reversed_to_near" if order[w] > order[pid] else "bug_unexplained", desc)
            continue
        assert m is not None
        if s["distance"] == v["distance"]:
            if surely_before(m, pid) and surely_before(w, pid):
                note("bug_tie_break", desc)  # both certainly earlier: the rule picks the same one
            else:
                note("other_match_tie", desc)
        elif s["distance"] > v["distance"]:
            # scan's nearer match was not stored before the page in the worker: the page came first
            ok = not surely_before(m, pid) and flagged(m)
            note("other_match_reordered" if ok else "bug_nearer_match_lost", desc)
        else:
            # the worker's nearer match is a later page in scan order, stored first in the worker
            note("other_match_reordered" if order[w] > order[pid] else "bug_unexplained", desc)

    violations = pair_violations(pairs, st, lambda a, b: surely_before(a, b))
    scan_violations = pair_violations(
        pairs, sc, lambda a, b: order[a] < order[b], check_order=True
    )  # the checker on scan's own verdicts
    cross = sum(1 for a, b, _, _ in pairs.list if a in st and b in st and not same_part(a, b))
    return {
        "pages": len(scan),
        "stream_partitions": sorted(partitions),
        "pairs": len(pairs.list),
        "pairs_across_partitions": cross,
        "counts": dict(counts),
        "examples": dict(examples),
        "pair_violations": dict(violations[0]),
        "pair_examples": violations[1],
        "scan_pair_violations": dict(scan_violations[0]),
        "near_duplicates": {
            "stream": sum(v["verdict"] == "near_duplicate" for v in st.values()),
            "scan": sum(v["verdict"] == "near_duplicate" for v in scan),
        },
    }


def read_store_order(path: Path) -> dict[tuple[int, int], list[str]]:
    """(shard partition, group) -> page ids in the order that group's store stored them (the
    changelog's order; a page stored again after a replay keeps its first place)."""
    chains: dict[tuple[int, int], list[str]] = defaultdict(list)
    seen: set[tuple[int, int, str, str]] = set()
    for row in read_verdicts(path):
        key = (row["shard"], row["group"], row["id"], row["fp"])
        if key not in seen:
            seen.add(key)
            chains[row["shard"], row["group"]].append(row["id"])
    return dict(chains)


def replay(stream: list[dict], chains: dict[tuple[int, int], list[str]], k: int = 3, design: str | None = None) -> dict:
    """The rule applied to the worker's own store order (from its shard changelog): each page's
    expected verdict is the nearest page stored before it at their canonical group, then the
    lowest such group, then the first stored.  Any page whose verdict differs is a bug, whatever
    the partitions and workers.  Also: whether one global order is consistent with every store
    and with every input partition's offset order (None: no such order), and such an order."""
    st = {v["id"]: v for v in stream}
    ids = list(st)
    fps = np.array([int(st[i]["fingerprint"], 16) for i in ids], dtype=np.uint64)
    pairs = Pairs(ids, fps, k, design)
    place: dict[tuple[int, str], tuple[int, int]] = {}  # (group, id) -> (shard, position)
    for (shard, g), chain in chains.items():
        for n, i in enumerate(chain):
            place.setdefault((g, i), (shard, n))
    counts: Counter = Counter()
    examples: list[str] = []
    for i in ids:
        best = None
        for q, (dist, g) in pairs.near.get(i, {}).items():
            a, b = place.get((g, q)), place.get((g, i))
            if a is None or b is None:
                counts["bug_not_in_changelog"] += 1
                continue
            if a[0] != b[0]:
                counts["bug_pair_in_two_shards"] += 1  # both pages must probe the same shard
                continue
            if a[1] < b[1] and (best is None or (dist, g, a[1]) < best[:3]):
                best = (dist, g, a[1], q)
        want = ("unique", None, None) if best is None else ("near_duplicate", best[3], best[0])
        got = (st[i]["verdict"], st[i]["match_id"], st[i]["distance"])
        if got == want:
            counts["as_the_rule_on_its_store_order"] += 1
        else:
            counts["bug_not_the_rule"] += 1
            if len(examples) < 8:
                examples.append(f"{i}: worker {got}, rule on its store order {want}")
    # one global order consistent with every store's order and every input partition's offset order?
    after: dict[str, set[str]] = defaultdict(set)
    indegree: Counter = Counter({i: 0 for i in ids})
    by_partition: dict[int, list[dict]] = defaultdict(list)
    for v in stream:
        by_partition[v["partition"]].append(v)
    in_partitions = [[v["id"] for v in sorted(vs, key=lambda v: v["offset"])] for vs in by_partition.values()]
    for chain in [*chains.values(), *in_partitions]:
        for x, y in zip(chain, chain[1:]):
            if y not in after[x]:
                after[x].add(y)
                indegree[y] += 1
    ready = [i for i in ids if indegree[i] == 0]
    order: list[str] = []
    while ready:
        x = ready.pop()
        order.append(x)
        for y in after[x]:
            indegree[y] -= 1
            if indegree[y] == 0:
                ready.append(y)
    return {
        "counts": dict(counts),
        "examples": examples,
        "global_order": order if len(order) == len(ids) else None,
        "in_no_global_order": len(ids) - len(order),
    }


def pair_violations(pairs: Pairs, verdicts: dict[str, dict], before, check_order: bool = False):
    """The pair property on what the verdicts show (module doc); ``before(a, b)``: a is known to
    have been stored before b.  Returns (counts, examples)."""
    bad: Counter = Counter()
    examples: list[str] = []

    def note(cls: str, text: str) -> None:
        bad[cls] += 1
        if len(examples) < 12:
            examples.append(f"{cls}: {text}")

    for a, b, dist, _ in pairs.list:
        va, vb = verdicts.get(a), verdicts.get(b)
        if va is None or vb is None:
            continue
        if va["verdict"] == vb["verdict"] == "unique":
            note("pair_both_unique", f"{a} / {b} d={dist}")
        if va["match_id"] == b and vb["match_id"] == a:
            note("pair_each_names_the_other", f"{a} / {b}")
        for x, y in ((a, b), (b, a)):
            if before(x, y):  # y must have found x (or a nearer page), x must not name y
                vx, vy = verdicts[x], verdicts[y]
                if vy["verdict"] != "near_duplicate" or vy["distance"] > dist:
                    note("pair_later_not_flagged_within_its_distance", f"{x} then {y} d={dist}: {vy['verdict']}")
                if vx["match_id"] == y:
                    note("pair_earlier_names_the_later", f"{x} then {y}")
    fps = {i: int(v["fingerprint"], 16) for i, v in verdicts.items()}
    for i, v in verdicts.items():
        m = v["match_id"]
        if v["verdict"] != "near_duplicate":
            continue
        if m is None or m == i or m not in fps or (fps[i] ^ fps[m]).bit_count() != v["distance"]:
            note("flagged_without_a_near_page", f"{i} -> {m}")
        elif m not in pairs.near.get(i, {}):
            note("flagged_without_a_near_page", f"{i} -> {m} (not within k)")
        elif check_order and before(i, m):
            note("flagged_against_a_later_page", f"{i} -> {m}")
    return bad, examples


def print_report(name: str, r: dict) -> None:
    print(
        f"== {name}: {r['pages']} pages, stream partitions {r['stream_partitions']}, {r['pairs']} pairs within k "
        f"({r['pairs_across_partitions']} across partitions); near-duplicates stream {r['near_duplicates']['stream']}, "
        f"scan {r['near_duplicates']['scan']}"
    )
    counts = r["counts"]
    differ = sum(v for c, v in counts.items() if c != "same")
    bugs = sum(v for c, v in counts.items() if c.startswith("bug_"))
    print(f"   differ from scan: {differ} ({', '.join(f'{c} {counts.get(c, 0)}' for c in ALLOWED)}; bugs {bugs})")
    for c, v in sorted(counts.items()):
        if c.startswith("bug_"):
            print(f"   {c}: {v}")
            for e in r["examples"].get(c, [])[:4]:
                print(f"      {e}")
    pv = r["pair_violations"]
    print(f"   pair property, stream: {sum(pv.values())} violations {pv or ''}")
    for e in r["pair_examples"][:6]:
        print(f"      {e}")
    print(f"   pair property, scan (checks the checker): {sum(r['scan_pair_violations'].values())} violations")


def print_replay(rr: dict, same_order: dict | None) -> None:
    c = rr["counts"]
    bugs = {k: v for k, v in c.items() if k.startswith("bug_")}
    print(
        f"   the rule on the worker's own store order (its shard changelog): "
        f"{c.get('as_the_rule_on_its_store_order', 0)} pages as the rule says, bugs {bugs or 0}"
    )
    for e in rr["examples"][:6]:
        print(f"      {e}")
    if rr["global_order"] is None:
        print(f"   no single order fits every store ({rr['in_no_global_order']} pages in or after cycles)")
    elif same_order is None:
        print("   one order fits every store")
    else:
        differ = sum(v for k, v in same_order["counts"].items() if k != "same")
        print(f"   one order fits every store; scan on it differs from the worker on {differ} pages")


def changelog_path(stream_path: Path) -> Path:
    return stream_path.with_name(stream_path.name.replace("stream-", "changelog-"))


def failed(r: dict) -> bool:
    return (
        any(c.startswith("bug_") for c in r["counts"]) or bool(r["pair_violations"]) or bool(r["scan_pair_violations"])
    )


# ---------------------------------------------------------------------------- run
def scan_file(records: list[dict], path: Path) -> None:
    from streamdedup.engine.dedup import Deduplicator
    from streamdedup.engine.records import read_jsonl
    from streamdedup.engine.scan import scan_pages

    data, out = "".join(json.dumps(r) + "\n" for r in records).encode(), io.StringIO()
    scan_pages(read_jsonl(io.BytesIO(data)), Deduplicator("simhash"), out, 256)
    path.write_text(out.getvalue(), encoding="utf-8")


def stream_file(
    kafka, records: list[dict], partitions: int, workers: int, workdir: Path, path: Path, timeout: float, kill: bool
):
    from stream_harness import StreamTopics, WorkerProcess, produce, read_to_end, wait_for_group, wait_for_verdicts

    from streamdedup.pipeline.wire import CHANGELOG, decode

    topics = StreamTopics.fresh(kafka, partitions)
    ws = [WorkerProcess(kafka, topics, workdir / topics.app_id, name=f"w{i}") for i in range(workers)]
    try:
        for w in ws:
            w.start(timeout=120)
        wait_for_group(kafka, topics.app_id, workers, timeout=120)
        time.sleep(2)  # (stream_bench.py: let the group settle before the pause)
        for w in ws:  # a backlog, as in stream_bench.py: the pages are all there when the workers resume
            w.proc.send_signal(signal.SIGSTOP)
        try:
            produce(kafka, topics.pages, records)
        finally:
            for w in ws:
                w.proc.send_signal(signal.SIGCONT)
        if kill:  # SIGKILL the first worker once a tenth of the verdicts are in, and start it again
            wait_for_verdicts(kafka, topics, len(records) // 10, timeout=timeout, to_end=False)
            ws[0].kill()
            ws[0].start(timeout=120)
        out = wait_for_verdicts(kafka, topics, len(records), timeout=timeout)
    finally:
        for w in ws:
            w.__exit__(None, None, None)
    # pages judged out of offset order: records faust did not deliver, read again later (app.py _fill_holes)
    holes = sum(w.log_path.read_text("utf-8", "replace").count("were not delivered") for w in ws)
    rebalances = sum(w.log_path.read_text("utf-8", "replace").count("[^---Recovery]: Worker ready") for w in ws)
    changelog = read_to_end(kafka, [f"{topics.app_id}-shards-changelog"])
    with changelog_path(path).open("w", encoding="utf-8") as f:
        for m in sorted((m for ms in changelog.values() for m in ms), key=lambda m: (m.partition, m.offset)):
            rows = decode([m.value], CHANGELOG)
            for g, fp, i in zip(rows.group.tolist(), rows.fps.tolist(), rows.ids()):
                f.write(json.dumps({"shard": m.partition, "group": g, "id": i, "fp": f"{fp:016x}"}) + "\n")
    got = [v for vs in out["verdicts"].values() for v in vs]
    got.sort(key=lambda v: (v["partition"], v["offset"]))
    path.write_text("".join(json.dumps(v, ensure_ascii=False) + "\n" for v in got), encoding="utf-8")
    if out["dead"]:
        print(f"# {len(out['dead'])} dead letters", file=sys.stderr)
    return holes, rebalances


def load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(args) -> int:
    from kafka_broker import LocalKafka
    from stream_bench import load_pages

    args.out.mkdir(parents=True, exist_ok=True)
    records, skipped = load_pages(args.corpus, args.pages)
    scan_path = args.out / "scan.jsonl"
    scan_file(records, scan_path)
    print(f"# {len(records)} pages ({skipped} over 1 MB left out); scan verdicts in {scan_path}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="stream-vs-scan-"))
    kafka = LocalKafka(name=f"vs-{os.getpid()}").start()
    bad = False
    summary = []
    try:
        for p in args.partitions:
            for i in range(args.runs):
                path = args.out / f"stream-p{p}-r{i}.jsonl"
                before = load_avg()
                t0 = time.monotonic()
                holes, rebalances = stream_file(kafka, records, p, args.workers, workdir, path, args.timeout, args.kill)
                took = time.monotonic() - t0
                r = compare(read_verdicts(path), read_verdicts(scan_path), args.k, args.design)
                print_report(
                    f"{p} partition(s), run {i + 1}, {args.workers} worker(s){' (one SIGKILLed)' if args.kill else ''} ({took:.0f} s, load {before} -> {load_avg()}; "
                    f"holes read again: {holes}, assignments: {rebalances})",
                    r,
                )
                rr = replay(read_verdicts(path), read_store_order(changelog_path(path)), args.k, args.design)
                same_order = None  # scan on an order consistent with every store of the worker
                if rr["global_order"] is not None:
                    by_id = {r["id"]: r for r in records}
                    ordered = args.out / f"scan-as-p{p}-r{i}.jsonl"
                    scan_file([by_id[x] for x in rr["global_order"]], ordered)
                    same_order = compare(read_verdicts(path), read_verdicts(ordered), args.k, args.design)
                print_replay(rr, same_order)
                rule_bugs = sum(v for c, v in rr["counts"].items() if c.startswith("bug_"))
                as_scan = "n/a" if same_order is None else same_order["counts"].get("same", 0)
                summary.append(
                    (p, i, r["counts"], sum(r["pair_violations"].values()), holes, before, rule_bugs, as_scan)
                )
                bad |= failed(r) or rule_bugs > 0 or (same_order is not None and failed(same_order))
                sys.stdout.flush()
    finally:
        kafka.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.workers} worker(s){', one SIGKILLed mid-stream' if args.kill else ''}, {len(records)} pages")
    print(
        "| partitions | run | differ | "
        + " | ".join(ALLOWED)
        + " | bugs | pair violations | not the rule on its store order | = scan on its store order | holes"
        + " | load (1/5/15 min) |"
    )
    print("|---|---|---|" + "---|" * len(ALLOWED) + "---|---|---|---|---|---|")
    for p, i, c, pv, holes, load, rule_bugs, as_scan in summary:
        differ = sum(v for k, v in c.items() if k != "same")
        bugs = sum(v for k, v in c.items() if k.startswith("bug_"))
        print(
            f"| {p} | {i + 1} | {differ} | "
            + " | ".join(str(c.get(a, 0)) for a in ALLOWED)
            + f" | {bugs} | {pv} | {rule_bugs} | {as_scan} of {len(records)} | {holes} | {load} |"
        )
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="classify the differences between two verdict files")
    c.add_argument("stream", type=Path, help="the worker's verdict records (with partition and offset)")
    c.add_argument("scan", type=Path, help="scan's verdicts; line order = the arrival order")
    c.add_argument("--changelog", type=Path, help="the worker's store order (run writes changelog-*.jsonl)")
    r = sub.add_parser("run", help="broker + worker on corpus pages, then compare")
    r.add_argument("--corpus", type=Path, default=ROOT / "bench/data/corpus.jsonl")
    r.add_argument("--pages", type=int, default=3000)
    r.add_argument("--partitions", type=int, nargs="+", default=[1, 4])
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--kill", action="store_true", help="SIGKILL the first worker mid-stream and restart it")
    r.add_argument("--timeout", type=float, default=900.0)
    r.add_argument("--out", type=Path, default=ROOT / "bench/out/vs")
    for q in (c, r):
        q.add_argument("--k", type=int, default=3)
        q.add_argument("--design", default=None, help="the worker's --design (default 16)")
    args = p.parse_args()
    if args.cmd == "compare":
        res = compare(read_verdicts(args.stream), read_verdicts(args.scan), args.k, args.design)
        print_report(str(args.stream), res)
        bad = failed(res)
        if args.changelog is not None:
            rr = replay(read_verdicts(args.stream), read_store_order(args.changelog), args.k, args.design)
            print_replay(rr, None)
            bad |= any(c.startswith("bug_") for c in rr["counts"])
        return 1 if bad else 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
