"""The shard changelog format: round trips, rejects malformed records, and rebuilds a shard."""

from __future__ import annotations

import numpy as np
import xxhash
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamdedup.changelog import decode, encode
from streamdedup.shard import Shard, ShardPlan
from streamdedup.tables import TableDesign

TEXT = st.text(max_size=40)


@given(st.lists(st.tuples(st.integers(0, 65535), st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1),
                          st.integers(0, 2**64 - 1), TEXT, TEXT), min_size=1, max_size=30))
def test_round_trip(rows):
    g, fp, f, h, ids, urls = (list(c) for c in zip(*rows))
    recs = encode(g, np.array(fp, dtype=np.uint64), np.array(f, dtype=np.int64), np.array(h, dtype=np.uint64), ids, urls)
    d = decode([v for _, v in recs])
    assert d.group.tolist() == g and d.fps.tolist() == fp and d.fetched.tolist() == f and d.id_hash.tolist() == h
    assert d.ids() == ids and d.urls() == urls
    assert len({k for k, _ in recs}) == len({(a, b, c) for a, b, c in zip(g, h, fp)})  # key = (group, page, fp)
    mask = np.arange(len(ids)) % 2 == 0
    sub = d.select(mask)
    assert sub.ids() == [x for x, m in zip(ids, mask) if m] and sub.urls() == [x for x, m in zip(urls, mask) if m]


@pytest.mark.parametrize("value, message", [(b"short", "shorter than its 34-byte header"),
                                            (encode(1, 2, 3, 4, "id", "url")[0][1] + b"x", "do not add up")])
def test_malformed_records_are_rejected(value, message):
    with pytest.raises(ValueError, match=message):
        decode([value])


def test_a_shard_rebuilt_from_its_changelog_answers_the_same():
    rng = np.random.default_rng(1)
    plan = ShardPlan(TableDesign.named("16"), 1)
    live, log = Shard(plan), []
    for batch in range(5):
        fps = rng.integers(0, 2**20, size=200, dtype=np.uint64)  # many near neighbours
        n = len(fps)
        groups = np.tile(np.arange(4), n)
        fps4, fetched = np.repeat(fps, 4), np.repeat(np.arange(batch * n, (batch + 1) * n), 4)
        ids = [f"p{batch}-{i}" for i in range(n) for _ in range(4)]
        hashes = np.array([xxhash.xxh3_64_intdigest(i.encode()) for i in ids], dtype=np.uint64)
        ans = live.probe_and_insert(groups, fps4, fetched, hashes, ids, [f"u/{i}" for i in ids])
        s = ans.stored
        log += [v for _, v in encode(groups[s], fps4[s], fetched[s], hashes[s], [i for i, m in zip(ids, s) if m],
                                     [f"u/{i}" for i, m in zip(ids, s) if m])]
    rebuilt = Shard(plan)
    rebuilt.restore(decode(log))
    assert len(rebuilt) == len(live)
    probe = rng.integers(0, 2**20, size=100, dtype=np.uint64)
    args = (np.tile(np.arange(4), 100), np.repeat(probe, 4), np.full(400, 10**9), np.full(400, 7, np.uint64),
            ["new"] * 400, ["u/new"] * 400)
    a, b = live.probe_and_insert(*args), rebuilt.probe_and_insert(*args)
    assert a.ids == b.ids and (a.distance == b.distance).all() and (a.distance >= 0).any()


def test_a_snapshot_loads_into_a_shard_that_answers_the_same(tmp_path):
    rng = np.random.default_rng(2)
    plan = ShardPlan(TableDesign.named("16"), 1)
    live = Shard(plan)
    for batch in range(4):
        fps = rng.integers(0, 2**20, size=300, dtype=np.uint64)
        ids = [f"p{batch}-{i}" for i in range(300) for _ in range(4)]
        live.probe_and_insert(np.tile(np.arange(4), 300), np.repeat(fps, 4), np.repeat(np.arange(300) + 300 * batch, 4),
                              np.array([xxhash.xxh3_64_intdigest(i.encode()) for i in ids], dtype=np.uint64),
                              ids, [f"ü/{i}" for i in ids])
    path = tmp_path / "shard-0.npz"
    live.save(path, {"changelog_offset": 1234})
    loaded, meta = Shard.load(path, plan)
    assert meta == {"changelog_offset": 1234} and len(loaded) == len(live)
    probe = rng.integers(0, 2**20, size=100, dtype=np.uint64)
    args = (np.tile(np.arange(4), 100), np.repeat(probe, 4), np.full(400, 10**9), np.full(400, 7, np.uint64),
            ["new"] * 400, ["u/new"] * 400)
    a, b = live.probe_and_insert(*args), loaded.probe_and_insert(*args)
    assert a.ids == b.ids and a.urls == b.urls and (a.distance == b.distance).all() and (a.distance >= 0).any()


def test_a_damaged_or_foreign_snapshot_is_refused(tmp_path):
    plan = ShardPlan(TableDesign.named("16"), 2)
    Shard(plan).save(tmp_path / "s.npz")
    with pytest.raises(ValueError, match="another shard plan"):
        Shard.load(tmp_path / "s.npz", ShardPlan(TableDesign.named("16"), 3))
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="cannot read the shard snapshot"):
        Shard.load(tmp_path / "bad.npz", plan)
