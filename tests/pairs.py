"""What the pair-property tests on the real broker share (tests/integration/test_order.py and
test_band_worker.py): reading the verdicts back once each, the exactly-one-flag check, `scan`'s
verdicts on the same order, and the split of pairs across partitions."""

from __future__ import annotations

import json

from streamdedup.engine.dedup import Deduplicator
from streamdedup.engine.records import page_from_json, page_text

__all__ = ["scan_verdicts", "judged_once", "exactly_one_of_each_pair", "split"]


def scan_verdicts(records: list[dict], algorithm: str = "simhash", k: int = 3) -> dict[str, tuple]:
    """Page id -> (verdict, match id, distance, similarity) of ``scan`` on the records' order."""
    pages = [page_from_json(json.dumps(r).encode()) for r in records]
    got = Deduplicator(algorithm, k=k).process(
        [p.id for p in pages], [p.url for p in pages], [page_text(p) for p in pages]
    )
    return {v.id: (v.verdict, v.match_id, v.distance, v.to_dict().get("similarity")) for v in got}


def judged_once(out: dict, records: list[dict]) -> dict[str, tuple]:
    """Page id -> (verdict, match id, distance, similarity), checking one verdict per page and one
    output each (``out``: what ``stream_harness.wait_for_verdicts`` read)."""
    assert sorted(out["verdicts"]) == sorted(r["url"] for r in records), "a page has no verdict"
    assert all(len(v) == 1 for v in out["verdicts"].values()), "a page got two verdicts"
    assert len(out["unique"]) + len(out["near"]) == len(records)
    return {
        k: (v[0]["verdict"], v[0]["match_id"], v[0]["distance"], v[0].get("similarity"))
        for k, v in out["verdicts"].items()
    }


def exactly_one_of_each_pair(judged: dict[str, tuple], pairs: list[tuple[str, str]]) -> None:
    """Of every pair exactly one page is flagged, against its twin; every other page is unique."""
    paired = {u for pair in pairs for u in pair}
    for a, b in pairs:
        flagged = [(x, judged[x][1]) for x in (a, b) if judged[x][0] == "near_duplicate"]
        assert len(flagged) == 1, f"pair {a} / {b}: {judged[a]} and {judged[b]}"
        assert flagged[0] in ((a, b), (b, a))  # flagged against its twin
    assert all(v[0] == "unique" for k, v in judged.items() if k not in paired)


def split(records: list[dict], pairs: list[tuple[str, str]], n: int = 4) -> list[int]:
    """A partition for each record: a pair's second page goes to the partition after its first's."""
    other = {a: b for a, b in pairs} | {b: a for a, b in pairs}
    slot = {r["url"]: i for i, r in enumerate(records)}
    partitions: list[int] = []
    for i, r in enumerate(records):
        twin = other.get(r["url"])
        partitions.append((partitions[slot[twin]] + 1) % n if twin is not None and slot[twin] < i else i % n)
    return partitions
