"""The Hamming index returns exactly the stored fingerprints within k bits: checked against
brute force, with planted neighbours at distances 0..k+1 and with many fingerprints sharing
blocks (so table keys collide)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdedup.fingerprinting.simhash import hamming_many
from streamdedup.index.hamming import HammingIndex, _Run
from streamdedup.index.tables import DESIGNS, TableDesign

U64 = st.integers(min_value=0, max_value=2**64 - 1)


def brute(stored: list[int], query: int, k: int) -> list[tuple[int, int]]:
    return sorted((i, (f ^ query).bit_count()) for i, f in enumerate(stored) if (f ^ query).bit_count() <= k)


def flip(fp: int, bits: list[int]) -> int:
    for b in bits:
        fp ^= 1 << b
    return fp


@st.composite
def planted(draw, k: int):
    """Stored fingerprints plus queries at every distance 0..k+1 from some of them.

    A fraction share one or two 16-bit blocks with a "hub" fingerprint, so that many keys of a
    table are equal and candidate lists are long.
    """
    hub = draw(U64)
    stored = draw(st.lists(U64, min_size=1, max_size=60))
    shared = draw(st.lists(st.tuples(U64, st.sampled_from([0xFFFF, 0xFFFF << 16, 0xFFFF_FFFF << 32])), max_size=30))
    stored += [(hub & mask) | (x & ~mask & (2**64 - 1)) for x, mask in shared]
    queries = []
    for _ in range(draw(st.integers(1, 12))):
        base = draw(st.sampled_from(stored))
        d = draw(st.integers(0, k + 1))
        bits = draw(st.lists(st.integers(0, 63), min_size=d, max_size=d, unique=True))
        queries.append(flip(base, bits))
    queries += draw(st.lists(U64, max_size=3))
    return stored, queries


@pytest.fixture(params=["binary-search", "directory"])
def lookup_path(request, monkeypatch):
    """Run a test with small runs binary-searched (the default) and with every run
    looked up through a bucket directory (the path big runs take); small runs are not merged
    eagerly, so that the test data makes several runs."""
    monkeypatch.setattr(HammingIndex, "SMALL_RUN", 1)
    if request.param == "directory":
        monkeypatch.setattr(_Run, "DIRECTORY_MIN", 1)
    return request.param


@pytest.mark.parametrize("design", sorted(DESIGNS))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=planted(k=3), batch=st.integers(1, 40))
def test_exact_against_brute_force(design, data, batch, lookup_path):
    stored, queries = data
    idx = HammingIndex(k=3, design=design)
    for s in range(0, len(stored), batch):  # several runs and merges
        idx.add_many(list(range(s, min(s + batch, len(stored)))), stored[s : s + batch])
    got = idx.query_many(queries)
    for q, res in zip(queries, got):
        assert sorted(res) == brute(stored, q, 3)


@pytest.mark.parametrize("k,levels", [(0, (1,)), (1, (2, 2)), (2, (3, 3)), (4, (5, 5)), (5, (6,)), (6, (7, 7))])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_exact_for_other_k(k, levels, data):
    stored, queries = data.draw(planted(k=k))
    idx = HammingIndex(k=k, design=TableDesign(k=k, levels=levels))
    idx.add_many(list(range(len(stored))), stored)
    for q, res in zip(queries, idx.query_many(queries)):
        assert sorted(res) == brute(stored, q, k)


@settings(max_examples=40, deadline=None)
@given(data=planted(k=3), k=st.integers(0, 3))
def test_smaller_k_at_query_time(data, k):
    stored, queries = data
    idx = HammingIndex(k=3)
    idx.add_many(list(range(len(stored))), stored)
    for q, res in zip(queries, idx.query_many(queries, k=k)):
        assert sorted(res) == brute(stored, q, k)


def test_results_are_nearest_first_then_oldest():
    idx = HammingIndex(k=3)
    idx.add_many(["far", "near", "far-too", "exact"], [0b111, 0b1, 0b1011, 0])
    assert idx.query(0) == [("exact", 0), ("near", 1), ("far", 3), ("far-too", 3)]


def test_large_random_batch_matches_brute_force():
    rng = np.random.default_rng(7)
    stored = rng.integers(0, 2**64 - 1, size=20_000, dtype=np.uint64, endpoint=True)
    idx = HammingIndex(k=3)
    for s in range(0, len(stored), 1000):
        idx.add_many(list(range(s, s + 1000)), stored[s : s + 1000])
    assert len(idx._runs) > 1  # several runs, merged and not
    picks = stored[rng.integers(0, len(stored), size=300)]
    noise = np.zeros(300, dtype=np.uint64)
    for i in range(300):
        for b in rng.choice(64, size=rng.integers(0, 5), replace=False):
            noise[i] |= np.uint64(1) << np.uint64(b)
    queries = picks ^ noise
    found = idx.search(queries)
    got = sorted(zip(found.query.tolist(), found.row.tolist(), found.distance.tolist()))
    want = []
    for qi, q in enumerate(queries.tolist()):
        d = hamming_many(np.uint64(q), stored)
        want += [(qi, int(r), int(d[r])) for r in np.flatnonzero(d <= 3)]
    assert got == sorted(want)


def test_remove_and_compaction():
    idx = HammingIndex(k=3)
    idx.add_many([f"p{i}" for i in range(100)], list(range(100)))
    assert idx.remove("p0") and not idx.remove("p0") and not idx.remove("nope")
    assert len(idx) == 99
    assert ("p0", 0) not in idx.query(0)
    for i in range(1, 60):  # past half dead: compaction renumbers rows
        idx.remove(f"p{i}")
    assert len(idx) == 40 and idx._n == 49  # compacted once, at 51 dead of 100
    assert sorted(i for i, _ in idx.query(64, k=0)) == ["p64"]
    idx.add_many(["again"], [64])
    assert sorted(i for i, _ in idx.query(64, k=0)) == ["again", "p64"]


def test_same_id_twice_is_stored_twice():
    idx = HammingIndex(k=3)
    idx.add_many(["a", "a"], [1, 1])
    assert idx.query(1) == [("a", 0), ("a", 0)]
    assert idx.remove("a") and len(idx) == 0


def test_size_and_memory_are_reported():
    idx = HammingIndex(k=3)
    assert len(idx) == 0 and idx.query(5) == []
    idx.add_many(list(range(5000)), np.arange(5000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    assert len(idx) == 5000
    # 16 tables x 8 bytes per entry, plus a fingerprint per row
    assert 16 * 8 * 5000 <= idx.table_nbytes < idx.nbytes


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda i: i.add_many(["a"], [1, 2]), "one id each"),
        (lambda i: i.add_many(["a"], [-1]), "2\\*\\*64"),
        (lambda i: i.add_many(["a"], [2**64]), "2\\*\\*64"),
        (lambda i: i.add_many(["a"], ["ff"]), "an int"),
        (lambda i: i.query(1, k=4), "k in 0..3"),
    ],
)
def test_bad_arguments_say_how_to_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call(HammingIndex(k=3))


@pytest.mark.parametrize("k", range(0, 9))
def test_default_design_for_every_k_is_exact(k):
    rng = np.random.default_rng(k)
    stored = rng.integers(0, 2**64 - 1, size=300, dtype=np.uint64, endpoint=True).tolist()
    queries = [flip(f, rng.choice(64, size=rng.integers(0, k + 2), replace=False).tolist()) for f in stored[:60]]
    idx = HammingIndex(k=k)
    idx.add_many(list(range(len(stored))), stored)
    for q, res in zip(queries, idx.query_many(queries)):
        assert sorted(res) == brute(stored, q, k)


def test_design_must_match_k():
    with pytest.raises(ValueError, match="k=2"):
        HammingIndex(k=3, design=TableDesign(k=2, levels=(3, 3)))
    with pytest.raises(ValueError, match="choose one of"):
        HammingIndex(k=3, design="7")


def test_integer_ids_then_other_ids():
    """Integer ids live in a numpy column; the first non-integer id switches to a list."""
    idx = HammingIndex(k=3)
    idx.add_many(range(3), [0, 1, 2])
    idx.add_many(np.array([3, 4]), [3, 4])
    assert idx._ids._objects is None and idx.query(4, k=0) == [(4, 0)]
    assert idx.remove(1) and not idx.remove("1") and not idx.remove(True)
    idx.add_many(["s", 2**70], [5, 6])
    assert idx._ids._objects is not None
    assert idx.query(5, k=0) == [("s", 0)] and idx.query(6, k=0) == [(2**70, 0)] and idx.query(0, k=0) == [(0, 0)]
    assert idx.remove(2**70) and len(idx) == 5


def test_a_snapshot_keeps_the_lookup_directories_and_answers_the_same():
    """A large run's bucket directory is saved with it: the loaded index answers without a
    counting pass, exactly as the saved one; a directory that does not fit its run is rebuilt."""
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64 - 1, size=40_000, dtype=np.uint64, endpoint=True)
    idx = HammingIndex(k=3)
    idx.add_many(range(len(fps)), fps)
    idx.prepare()
    state = idx.state()
    assert any(k.startswith("dir") for k in state)
    loaded = HammingIndex.from_state(state)
    assert all(r._dir is not None for r in loaded._runs if len(r) >= r.DIRECTORY_MIN)
    queries = fps[:500] ^ np.uint64(0b101)
    a, b = idx.search(queries), loaded.search(queries)
    assert a.query.tolist() == b.query.tolist() and a.row.tolist() == b.row.tolist()
    damaged = {k: (v[:-1] if k.startswith("dir") else v) for k, v in state.items()}
    rebuilt = HammingIndex.from_state(damaged)
    assert all(r._dir is None for r in rebuilt._runs)
    c = rebuilt.search(queries)
    assert c.row.tolist() == a.row.tolist()
