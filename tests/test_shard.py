"""The sharded index gives the global answer, whatever the number of partitions and batches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.shard import Shard, ShardPlan, StringHeap


def pages(seed: int, n: int):
    """Fingerprints in clusters (neighbours at 0..5 bits), fetch times with ties, some re-fetched ids."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2**64 - 1, size=max(1, n // 6), dtype=np.uint64, endpoint=True)
    fps = centres[rng.integers(0, len(centres), size=n)]
    for i in range(n):
        for b in rng.choice(64, size=rng.integers(0, 6), replace=False):
            fps[i] ^= np.uint64(1) << np.uint64(b)
    fetched = np.sort(rng.integers(0, n // 2 + 1, size=n)).astype(np.int64)  # arrival in fetch order
    ids = [f"p{i}" for i in range(n)]
    for i in rng.choice(n, size=n // 10, replace=False):  # re-fetches of an earlier id
        if i:
            ids[i] = ids[rng.integers(0, i)]
    id_hash = np.array([hash_id(x) for x in ids], dtype=np.uint64)
    arrival = np.lexsort((id_hash, fetched))  # pages arrive in order of (fetched, id hash)
    return fps[arrival], fetched[arrival], id_hash[arrival], [ids[i] for i in arrival]


def hash_id(x: str) -> int:
    import xxhash

    return xxhash.xxh3_64_intdigest(x.encode())


def brute(fps, fetched, id_hash, ids, k):
    """For each page: (distance, match id) of the nearest, then earliest, strictly earlier other page."""
    out = []
    for i in range(len(fps)):
        best = None
        for j in range(len(fps)):
            d = (int(fps[i]) ^ int(fps[j])).bit_count()
            earlier = (fetched[j], id_hash[j]) < (fetched[i], id_hash[i])
            if d <= k and earlier and id_hash[j] != id_hash[i]:
                cand = (d, int(fetched[j]), int(id_hash[j]), ids[j])
                best = cand if best is None or cand[:3] < best[:3] else best
        out.append(None if best is None else (best[0], best[3]))
    return out


def sharded(plan: ShardPlan, fps, fetched, id_hash, ids, batch: int):
    """Feed the probes partition by partition, in arrival order, in batches; combine per page."""
    shards = [Shard(plan) for _ in range(plan.partitions)]
    parts = plan.probes(fps)
    best: list = [None] * len(fps)
    for s in range(0, len(fps), batch):
        pages_ = np.arange(s, min(s + batch, len(fps)))
        for p, shard in enumerate(shards):
            page_idx, group = np.nonzero(parts[pages_] == p)
            page_idx = pages_[page_idx]
            if not len(page_idx):
                continue
            ans = shard.probe_and_insert(
                group,
                fps[page_idx],
                fetched[page_idx],
                id_hash[page_idx],
                [ids[i] for i in page_idx],
                [f"u/{ids[i]}" for i in page_idx],
            )
            for j, i in enumerate(page_idx.tolist()):
                if ans.distance[j] < 0:
                    continue
                assert ans.urls[j] == f"u/{ans.ids[j]}"
                cand = (int(ans.distance[j]), int(ans.fetched[j]), int(ans.id_hash[j]), ans.ids[j])
                best[i] = cand if best[i] is None or cand[:3] < best[i][:3] else best[i]
    return [None if b is None else (b[0], b[3]) for b in best], shards


@pytest.mark.parametrize("design", ["16", "20", "10", "4"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), partitions=st.sampled_from([1, 2, 3, 8]), batch=st.sampled_from([1, 7, 50]))
def test_sharded_answers_equal_the_global_answer(design, seed, partitions, batch):
    fps, fetched, id_hash, ids = pages(seed, 60)
    plan = ShardPlan(TableDesign.named(design), partitions)
    got, _ = sharded(plan, fps, fetched, id_hash, ids, batch)
    assert got == brute(fps, fetched, id_hash, ids, 3)


def test_answers_do_not_depend_on_the_number_of_partitions():
    fps, fetched, id_hash, ids = pages(3, 400)
    answers = [sharded(ShardPlan(TableDesign.named("16"), p), fps, fetched, id_hash, ids, 64)[0] for p in (1, 2, 4, 16)]
    assert all(a == answers[0] for a in answers)
    assert sum(a is not None for a in answers[0]) > 100  # the test data has plenty of matches


def test_replays_are_idempotent_and_never_match_themselves():
    fps, fetched, id_hash, ids = pages(5, 120)
    plan = ShardPlan(TableDesign.named("16"), 4)
    first, shards = sharded(plan, fps, fetched, id_hash, ids, 30)
    size = sum(len(s) for s in shards)
    # replay everything into the same shards (a worker restarted from an older offset)
    parts = plan.probes(fps)
    for p, shard in enumerate(shards):
        page_idx, group = np.nonzero(parts == p)
        ans = shard.probe_and_insert(
            group,
            fps[page_idx],
            fetched[page_idx],
            id_hash[page_idx],
            [ids[i] for i in page_idx],
            [f"u/{ids[i]}" for i in page_idx],
        )
        assert all(m is None or m != ids[i] for m, i in zip(ans.ids, page_idx.tolist()))
    assert sum(len(s) for s in shards) == size


def test_a_later_page_arriving_first_is_not_matched_to_an_earlier_one():
    plan = ShardPlan(TableDesign.named("16"), 1)
    shard = Shard(plan)
    fp = np.array([12345], dtype=np.uint64)
    g = np.arange(4)
    late = shard.probe_and_insert(g, np.repeat(fp, 4), np.full(4, 20), np.full(4, 2, np.uint64), ["b"] * 4, ["ub"] * 4)
    early = shard.probe_and_insert(g, np.repeat(fp, 4), np.full(4, 10), np.full(4, 1, np.uint64), ["a"] * 4, ["ua"] * 4)
    assert (late.distance == -1).all()  # nothing stored yet
    assert (early.distance == -1).all()  # "b" is later than "a": never a's original


def test_plan_spreads_probes_and_rejects_bad_partitions():
    plan = ShardPlan(TableDesign.named("16"), 8)
    rng = np.random.default_rng(0)
    counts = np.bincount(plan.probes(rng.integers(0, 2**63, size=4000, dtype=np.uint64)).ravel(), minlength=8)
    assert counts.min() > 0.8 * counts.mean()
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        ShardPlan(TableDesign.named("16"), 0)


def test_string_heap_round_trip():
    h = StringHeap()
    values = ["http://a/", "", "ünïcode ✓", "x" * 5000] * 300
    h.extend(values)
    assert [h[i] for i in range(len(values))] == values
    with pytest.raises(IndexError):
        h[len(values)]
