"""The batch format of probes, answers and changelog records: round trips, rejects malformed
values, and a shard rebuilt from its changelog answers the same."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.errors import SchemeError
from streamdedup.fingerprinting import SCHEME, kernels
from streamdedup.index.tables import TableDesign
from streamdedup.pipeline import wire
from streamdedup.pipeline.shard import Shard, ShardPlan
from streamdedup.pipeline.wire import ANSWERS, CHANGELOG, PROBES, Batch, decode, encode, kind_of
from streamdedup.stream.store import load_snapshot, snapshot_meta

TEXT = st.text(max_size=40)
ID = st.text(min_size=1, max_size=40) | st.just("http://same/")  # never empty; sometimes the url itself


@given(
    st.lists(
        st.tuples(
            st.integers(0, 65535),
            st.integers(0, 2**64 - 1),
            st.integers(-(2**63), 2**63 - 1),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
            st.integers(-1, 64),
            st.integers(0, 2**31),
            ID,
            ID,
        ),
        min_size=0,
        max_size=30,
    ),
    st.integers(1, 3),
)
def test_round_trip(rows, parts):
    g, fp, f, h, req, dist, part, ids, urls = (list(c) for c in zip(*rows)) if rows else ([],) * 9
    b = Batch.build(
        group=g, fps=fp, fetched=f, id_hash=h, request=req, distance=dist, partition=part, ids=ids, urls=urls
    )
    # a batch may arrive split over several messages: decoding them together gives the rows in order
    cut = np.array_split(np.arange(len(ids)), parts)
    d = decode([encode(b.select(c), PROBES) for c in cut], PROBES)
    assert d.group.tolist() == g and d.fps.tolist() == fp and d.fetched.tolist() == f and d.id_hash.tolist() == h
    assert d.rows["request"].tolist() == req and d.rows["distance"].tolist() == dist
    assert d.rows["partition"].tolist() == part and d.ids() == ids and d.urls() == urls and d.kind == PROBES
    mask = np.arange(len(ids)) % 2 == 0
    sub = d.select(mask)
    assert sub.ids() == [x for x, m in zip(ids, mask) if m] and sub.urls() == [x for x, m in zip(urls, mask) if m]
    order = np.arange(len(ids))[::-1]
    assert d.select(order).ids() == ids[::-1]


_ONE = encode(Batch.build(group=1, fps=2, fetched=3, id_hash=4, ids=["id"], urls=["url"]), CHANGELOG)


@pytest.mark.parametrize(
    "value, kind, message",
    [
        (b"short", None, "shorter than its header"),
        (b"XXXX" + _ONE[4:], None, "not a streamdedup batch"),
        (_ONE + b"x", None, "do not add up"),
        (_ONE[:-1], None, "do not add up"),
        (_ONE[:20], None, "cut short"),  # rows cut short
        (_ONE, ANSWERS, "expected a batch of kind 2, got kind 3"),
    ],
)
def test_malformed_values_are_rejected(value, kind, message):
    with pytest.raises(ValueError, match=message):
        decode([value], kind)


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
        log.append(
            encode(
                Batch.build(
                    group=groups[s],
                    fps=fps4[s],
                    fetched=fetched[s],
                    id_hash=hashes[s],
                    ids=[i for i, m in zip(ids, s) if m],
                    urls=[f"u/{i}" for i, m in zip(ids, s) if m],
                ),
                CHANGELOG,
            )
        )
    rebuilt = Shard(plan)
    rebuilt.restore(decode(log))
    assert len(rebuilt) == len(live)
    probe = rng.integers(0, 2**20, size=100, dtype=np.uint64)
    args = (
        np.tile(np.arange(4), 100),
        np.repeat(probe, 4),
        np.full(400, 10**9),
        np.full(400, 7, np.uint64),
        ["new"] * 400,
        ["u/new"] * 400,
    )
    a, b = live.probe_and_insert(*args), rebuilt.probe_and_insert(*args)
    assert a.ids == b.ids and (a.distance == b.distance).all() and (a.distance >= 0).any()


def test_a_snapshot_loads_into_a_shard_that_answers_the_same(tmp_path):
    rng = np.random.default_rng(2)
    plan = ShardPlan(TableDesign.named("16"), 1)
    live = Shard(plan)
    for batch in range(4):
        fps = rng.integers(0, 2**20, size=300, dtype=np.uint64)
        ids = [f"p{batch}-{i}" for i in range(300) for _ in range(4)]
        live.probe_and_insert(
            np.tile(np.arange(4), 300),
            np.repeat(fps, 4),
            np.repeat(np.arange(300) + 300 * batch, 4),
            np.array([xxhash.xxh3_64_intdigest(i.encode()) for i in ids], dtype=np.uint64),
            ids,
            [f"ü/{i}" for i in ids],
        )
    path = tmp_path / "shard-0.npz"
    live.save(path, {"changelog_offset": 1234})
    loaded, meta = Shard.load(path, plan)
    assert meta == {"changelog_offset": 1234} and len(loaded) == len(live)
    probe = rng.integers(0, 2**20, size=100, dtype=np.uint64)
    args = (
        np.tile(np.arange(4), 100),
        np.repeat(probe, 4),
        np.full(400, 10**9),
        np.full(400, 7, np.uint64),
        ["new"] * 400,
        ["u/new"] * 400,
    )
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


# ---------------------------------------------------------------- fingerprint schemes


def _old_layout(value: bytes) -> bytes:
    """The same batch in the layout before the scheme byte (b"SDB1" | kind u8 | n u32), as
    streamdedup wrote it with fingerprint scheme 1."""
    kind, n = value[4], int.from_bytes(value[6:10], "little")
    return b"SDB1" + bytes([kind]) + n.to_bytes(4, "little") + value[10:]


def test_a_changelog_record_of_another_scheme_is_refused_with_what_to_do():
    assert SCHEME == 2 and _ONE[:4] == b"SDB2" and _ONE[5] == SCHEME
    old = _old_layout(_ONE)
    assert kind_of(old) == CHANGELOG  # still recognised, so the worker can say what it is
    with pytest.raises(SchemeError, match=r"shard changelog batch holds fingerprints of scheme 1.*--app-id") as e:
        decode([_ONE, old], CHANGELOG)
    assert (e.value.found, e.value.expected) == (1, SCHEME)
    future = _ONE[:5] + bytes([SCHEME + 1]) + _ONE[6:]
    with pytest.raises(SchemeError, match=f"scheme {SCHEME + 1}.*computes fingerprint scheme {SCHEME}"):
        decode([future])
    assert isinstance(e.value, ValueError)  # callers that drop malformed batches drop these too


def _saved(tmp_path, meta: dict) -> tuple:
    plan = ShardPlan(TableDesign.named("16"), 2)
    shard = Shard(plan)
    shard.probe_and_insert(
        np.array([0]), np.array([5], np.uint64), np.array([1]), np.array([9], np.uint64), ["a"], ["u"]
    )
    path = tmp_path / "app-shards-changelog-0.npz"
    shard.save(path, meta)
    return path, plan


def test_a_snapshot_records_its_scheme_and_changelog_and_loads_when_it_matches(tmp_path):
    path, plan = _saved(tmp_path, snapshot_meta(7, "app-shards-changelog"))
    loaded = load_snapshot(path, plan, "app-shards-changelog", end_offset=8)
    assert loaded is not None and loaded[1] == 7 and len(loaded[0]) == 1
    assert Shard.load(path, plan)[1]["scheme"] == SCHEME


@pytest.mark.parametrize(
    "meta, end, problem",
    [
        ({"offset": 7}, 100, "scheme 1, and this worker computes scheme 2"),  # written before schemes were recorded
        ({**snapshot_meta(7, "app-shards-changelog"), "scheme": 3}, 100, "scheme 3"),
        (snapshot_meta(7, "other-shards-changelog"), 100, "taken from the changelog 'other-shards-changelog'"),
        (snapshot_meta(7, "app-shards-changelog"), 0, "recreated or truncated"),  # the topic was recreated empty
        (snapshot_meta(7, "app-shards-changelog"), 7, "ends before offset 7"),
    ],
)
def test_a_snapshot_that_does_not_match_the_cluster_is_discarded_with_a_warning(tmp_path, caplog, meta, end, problem):
    path, plan = _saved(tmp_path, meta)
    with caplog.at_level("WARNING"):
        assert load_snapshot(path, plan, "app-shards-changelog", end_offset=end) is None
    assert problem in caplog.text and "rebuilding the shard from the changelog" in caplog.text
    # set aside, so that it cannot pass for a snapshot of the new changelog once that grows past its offset
    assert not path.exists() and path.with_name(path.name + ".discarded").exists()
    assert load_snapshot(path, plan, "app-shards-changelog", end_offset=10**6) is None


def test_a_snapshot_of_another_plan_is_discarded_not_fatal(tmp_path, caplog):
    path, _ = _saved(tmp_path, snapshot_meta(7, "app-shards-changelog"))
    with caplog.at_level("WARNING"):
        assert load_snapshot(path, ShardPlan(TableDesign.named("16"), 3), "app-shards-changelog", None) is None
    assert "another shard plan" in caplog.text


def test_a_snapshot_of_the_16_table_design_is_rebuilt_by_a_worker_of_the_4_table_design(tmp_path, caplog):
    """An upgrade to the worker's default design: the old snapshot is set aside, and the same
    changelog rows restore a shard of the new design that answers as the old one did."""
    old, new = ShardPlan(TableDesign.named("16"), 2), ShardPlan(TableDesign.named("4"), 2)
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64 - 1, size=300, dtype=np.uint64, endpoint=True)
    ids = [f"http://x.test/{i}" for i in range(300)]
    rows = Batch.build(
        group=np.arange(300) % 4, fps=fps, fetched=np.arange(300), id_hash=fps ^ np.uint64(1), ids=ids, urls=ids
    )
    shards = {}
    for plan in (old, new):
        shard = Shard(plan)
        shard.restore(rows)
        shards[plan.design.n_tables] = shard
    path = tmp_path / "s.shard"
    shards[16].save(path, snapshot_meta(7, "app-shards-changelog"))
    with caplog.at_level("WARNING"):
        assert load_snapshot(path, new, "app-shards-changelog", None) is None
    assert "another shard plan" in caplog.text
    # each stored page's neighbour at 2 bits (in block 0), probed in the stored page's group: found
    # where that group is the pair's canonical one (block 1: the lowest block they agree on)
    probes = fps ^ np.uint64(0b101)
    answers = [
        s.probe_and_insert(np.arange(300) % 4, probes, np.arange(300), probes, ids, ids, store=False)
        for s in (shards[16], shards[4])
    ]
    group = np.arange(300) % 4
    assert answers[0].distance.tolist() == np.where(group == 1, 2, -1).tolist()
    assert answers[0].distance.tolist() == answers[1].distance.tolist() and answers[0].ids == answers[1].ids


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.integers(0, 5), min_size=1, max_size=40),
    texts=st.lists(st.text(max_size=6), min_size=80, max_size=80),
    extra=st.booleans(),
    wide=st.booleans(),
    compiled=st.booleans(),
)
def test_by_group_gives_each_groups_rows_like_select(groups, texts, extra, wide, compiled):
    """Both paths (the numba kernel and numpy's), groups that fit a byte and wider ones."""
    groups = [g * 97 for g in groups] if wide else groups  # (up to 485: labels wider than a byte)
    n = len(groups)
    ids, urls = texts[:n], [t + "/u" for t in texts[40 : 40 + n]]
    batch = Batch.build(
        group=np.array(groups, dtype=np.int64),
        fps=np.arange(n, dtype=np.uint64),
        fetched=np.arange(n),
        id_hash=np.arange(n, dtype=np.uint64),
        ids=ids,
        urls=urls,
        extra=np.arange(3 * n, dtype=np.uint8).reshape(n, 3) if extra else None,
    )
    with contextlib.nullcontext() if compiled else kernels.numpy_only():
        assert (wire._kernel_module() is not None) == (compiled and kernels.available())
        got = batch.by_group()
    assert [g for g, _ in got] == sorted(set(groups))
    for g, part in got:
        want = batch.select(np.array(groups, dtype=np.int64) == g)
        assert part.rows.tobytes() == want.rows.tobytes() and part.strings == want.strings
        assert part.ids() == want.ids() and part.urls() == want.urls()
        assert (part.extra is None) == (not extra) and (part.extra is None or (part.extra == want.extra).all())
