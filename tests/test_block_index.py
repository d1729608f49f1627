"""BlockIndex returns exactly the alive stored rows within k bits that agree with the query on the
key bits: checked against brute force on random and planted data, across many runs, removes,
keep_rows, snapshots, both kernel paths and background or inline merges."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdedup.index import block_kernels
from streamdedup.index.blocks import BlockIndex, warm_up
from streamdedup.index.hamming import HammingIndex
from streamdedup.pipeline.snapshot_file import read_arrays, write_arrays

M64 = 2**64 - 1
U64 = st.integers(min_value=0, max_value=M64)
MASKS = [0xFFFF, 0xFFFF << 16, 0xFFFF << 32, 0xFFFF << 48, 0xFF, 0xFF << 56, 0xFFFF_FFFF << 20, 0x3FF << 7]
PATHS = [(True, True), (True, False), (False, True), (False, False)]  # (compiled, background)


def small(mask: int, k: int = 3, *, compiled: bool | None = None, background: bool = True) -> BlockIndex:
    """An index whose thresholds are tiny, so a few hundred rows make many runs, directories
    (narrow and exact ones) and background merges."""
    idx = BlockIndex(mask, k, compiled=compiled, background=background)
    idx.SMALL_RUN, idx.DIRECTORY_MIN, idx.BACKGROUND_MIN, idx.PER_BUCKET, idx.LATER_MIN = 4, 16, 48, 2, 8
    return idx


def brute(fps: list[int], alive: list[bool], mask: int, queries: list[int], k: int) -> list[tuple[int, int, int, int]]:
    """(query, distance, row, fingerprint) of every alive row within k bits sharing the key."""
    out = []
    for q, query in enumerate(queries):
        for r, fp in enumerate(fps):
            x = fp ^ query
            if alive[r] and x & mask == 0 and x.bit_count() <= k:
                out.append((q, x.bit_count(), r, fp))
    return sorted(out)


def brute_np(fps: np.ndarray, alive: np.ndarray, mask: int, queries: np.ndarray, k: int) -> list[tuple[int, ...]]:
    """:func:`brute` with numpy, a few queries at a time (for tens of thousands of rows)."""
    out = []
    for at in range(0, len(queries), 50):
        x = queries[at : at + 50, None] ^ fps[None, :]
        dist = np.bitwise_count(x)
        q, r = np.nonzero((dist <= k) & (x & np.uint64(mask) == 0) & alive[None, :])
        out += zip((q + at).tolist(), dist[q, r].tolist(), r.tolist(), fps[r].tolist())
    return sorted(out)


def as_tuples(found) -> list[tuple[int, int, int, int]]:
    return list(
        zip(found.query.tolist(), found.distance.tolist(), found.row.tolist(), found.fingerprint.tolist(), strict=True)
    )


def same(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("query", "row", "distance", "fingerprint"))


@st.composite
def crowded(draw, mask: int, size: int = 120) -> list[int]:
    """Fingerprints around a few hubs (1..5 bits flipped, so many share the key and lie within
    k of each other), some with the key bits of a hub and the rest random, and some random."""
    hubs = draw(st.lists(U64, min_size=1, max_size=4))
    out = []
    for _ in range(draw(st.integers(0, size))):
        kind = draw(st.integers(0, 3))
        hub = draw(st.sampled_from(hubs))
        if kind <= 1:
            for bit in draw(st.lists(st.integers(0, 63), max_size=5)):
                hub ^= 1 << bit
            out.append(hub)
        elif kind == 2:
            out.append((hub & mask) | (draw(U64) & ~mask & M64))
        else:
            out.append(draw(U64))
    return out


@st.composite
def scenario(draw):
    mask = draw(st.sampled_from(MASKS))
    k = draw(st.integers(0, 5))
    fps = draw(crowded(mask))
    cuts = sorted(draw(st.lists(st.integers(0, len(fps)), max_size=12)))
    removes = draw(st.lists(st.integers(0, max(len(fps) - 1, 0)), max_size=40)) if fps else []
    queries = draw(crowded(mask, 40)) + draw(st.lists(st.sampled_from(fps), max_size=10) if fps else st.just([]))
    later = draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    return mask, k, fps, cuts, removes, queries, later


def build(mask, k, fps, cuts, removes, later=None, **kw) -> BlockIndex:
    """The index of ``fps`` added in batches cut at ``cuts`` (batch i ``later=later[i]``: sorted
    into a run with the batches around it, at the latest at the next search)."""
    idx = small(mask, k, **kw)
    bounds = [0, *cuts, len(fps)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        given = np.array(fps[a:b], dtype=np.uint64)
        idx.add_many(range(a, b), given, later=bool(later and later[i]))
        given ^= np.uint64(M64)  # (the caller's array changed afterwards: the index kept its own)
        idx.remove_rows([r for r in removes if r < b])  # removes as the rows come (repeats are no-ops)
    return idx


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario())
def test_search_is_brute_force_on_every_path(case):
    mask, k, fps, cuts, removes, queries, later = case
    alive = [r not in set(removes) for r in range(len(fps))]
    expected = brute(fps, alive, mask, queries, k)
    results = []
    for (compiled, background), sort_later in zip(PATHS * 2, [None] * len(PATHS) + [later] * len(PATHS)):
        idx = build(mask, k, fps, cuts, removes, sort_later, compiled=compiled, background=background)
        assert len(idx) == sum(alive)
        assert idx.alive_rows().tolist() == alive
        found = idx.search(np.array(queries, dtype=np.uint64))
        assert as_tuples(found) == expected
        results.append(found)
        # a smaller k on the same index: the subset
        assert as_tuples(idx.search(queries, k=max(k - 1, 0))) == [t for t in expected if t[1] <= max(k - 1, 0)]
        idx.wait()
        assert same(idx.search(queries), found)  # after the background merges landed too
    assert all(same(r, results[0]) for r in results)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario(), st.booleans())
def test_keep_rows_renumbers_and_answers_the_same(case, compiled):
    mask, k, fps, cuts, removes, queries, later = case
    idx = build(mask, k, fps, cuts, removes, later, compiled=compiled)
    live = np.flatnonzero(idx.alive_rows())
    before = idx.search(queries)
    idx.keep_rows(live)
    assert len(idx) == idx.rows == len(live) and idx.alive_rows().all()
    after = idx.search(queries)
    # the same matches, rows renumbered in order
    assert after.query.tolist() == before.query.tolist()
    assert live[after.row].tolist() == before.row.tolist()
    assert after.fingerprint.tolist() == before.fingerprint.tolist()
    kept = [fps[r] for r in live.tolist()]
    assert as_tuples(after) == brute(kept, [True] * len(kept), mask, queries, k)
    # and it keeps growing from there
    idx.add_many(range(len(live), len(live) + len(fps)), fps)
    both = kept + fps
    assert as_tuples(idx.search(queries)) == brute(both, [True] * len(both), mask, queries, k)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario(), st.booleans())
def test_state_round_trip_answers_exactly_like_the_original(case, compiled):
    mask, k, fps, cuts, removes, queries, later = case
    idx = build(mask, k, fps, cuts, removes, later, compiled=compiled)
    state = idx.state()
    loaded = BlockIndex.from_state(state, compiled=compiled)
    for name, a in loaded.state().items():  # the arrays taken over as they were
        assert np.array_equal(a, state[name]), name
    assert len(loaded) == len(idx) and loaded.rows == idx.rows
    assert same(loaded.search(queries), idx.search(queries))
    # both go on growing alike
    for x in (idx, loaded):
        x.add_many(range(len(fps), 2 * len(fps)), np.array(fps, dtype=np.uint64) ^ np.uint64(1))
    assert same(loaded.search(queries), idx.search(queries))


def planted(n: int, mask: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n random fingerprints, a tenth of them sharing a few keys, and queries of which half are
    stored fingerprints with 0..4 bits flipped."""
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, M64, size=n, dtype=np.uint64, endpoint=True)
    hubs = rng.integers(0, M64, size=8, dtype=np.uint64, endpoint=True)
    crowd = rng.integers(0, n, size=n // 10)
    fps[crowd] = (fps[crowd] & ~np.uint64(mask)) | (hubs[rng.integers(0, 8, size=len(crowd))] & np.uint64(mask))
    near = fps[rng.integers(0, n, size=500)]
    for i in range(len(near)):
        for bit in rng.choice(64, size=i % 5, replace=False):
            near[i] ^= np.uint64(1) << np.uint64(bit)
    return fps, np.concatenate((near, rng.integers(0, M64, size=500, dtype=np.uint64, endpoint=True)))


@pytest.mark.parametrize("mask", [0xFFFF << 16, 0xFF << 8, 0xFFFF_FFFF])
def test_numba_and_numpy_paths_bit_for_bit(mask):
    fps, queries = planted(60_000, mask, seed=mask % 1000)
    built = {}
    for compiled in (True, False):
        idx = BlockIndex(mask, compiled=compiled, background=False)
        idx.DIRECTORY_MIN, idx.SMALL_RUN = 1 << 12, 1 << 10
        for s in range(0, len(fps), 700):
            idx.add_many(range(s, min(s + 700, len(fps))), fps[s : s + 700])
        idx.remove_rows(np.arange(0, len(fps), 11))
        built[compiled] = idx
    fast, slow = built[True], built[False]
    assert fast.runs > 2  # directories and binary-searched runs alike
    # merges and directories give the same arrays
    a, b = fast.state(), slow.state()
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)
    assert any(n.startswith("dir") for n in a)
    found = fast.search(queries)
    assert same(found, slow.search(queries))
    alive = np.ones(len(fps), dtype=bool)
    alive[::11] = False
    assert as_tuples(found) == brute_np(fps, alive, mask, queries, 3)
    assert len(found.query) > 100  # planted neighbours found
    for k in (0, 1, 7):
        assert same(fast.search(queries, k=k), slow.search(queries, k=k))


def test_the_block_kernels_are_compiled_here():
    assert BlockIndex(0xFFFF)._fast() is block_kernels  # numba is a dependency here
    assert warm_up()
    assert BlockIndex(0xFFFF, compiled=False)._fast() is None


_NO_NUMBA = """
import json, sys
sys.modules["numba"] = None  # as if numba were not installed
import numpy as np
from streamdedup.index.blocks import BlockIndex, warm_up
fps, queries = (np.array(x, dtype=np.uint64) for x in json.loads(sys.stdin.read()))
from streamdedup.index.blocks import warm_up
assert not warm_up()
idx = BlockIndex(0xFFFF << 48)
assert idx._fast() is None
idx.DIRECTORY_MIN, idx.SMALL_RUN, idx.BACKGROUND_MIN = 64, 16, 256
for s in range(0, len(fps), 100):
    idx.add_many(range(s, min(s + 100, len(fps))), fps[s : s + 100])
f = idx.search(queries)
print(json.dumps([f.query.tolist(), f.row.tolist(), f.distance.tolist(), f.fingerprint.tolist()]))
"""


def test_without_numba_the_same_answers():
    fps, queries = planted(3000, 0xFFFF << 48, seed=3)
    env = {"PATH": "", "PYTHONPATH": ":".join(sys.path)}
    got = subprocess.run(
        [sys.executable, "-c", _NO_NUMBA],
        input=json.dumps([fps.tolist(), queries.tolist()]),
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=300,
    )
    idx = BlockIndex(0xFFFF << 48, compiled=True)
    idx.add_many(range(len(fps)), fps)
    f = idx.search(queries)
    assert json.loads(got.stdout) == [f.query.tolist(), f.row.tolist(), f.distance.tolist(), f.fingerprint.tolist()]


class HeldMerges:
    """Background merges that wait for a signal before they start (a merge under way, held)."""

    def __init__(self, idx: BlockIndex) -> None:
        self.go, self.started = threading.Event(), 0
        real = idx._merged

        def held(old, new):
            if threading.current_thread() is not threading.main_thread():
                self.started += 1
                assert self.go.wait(60), "the test never released the merge"
            return real(old, new)

        idx._merged = held  # type: ignore[method-assign]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_held_background_merge_changes_no_answer(compiled, tmp_path):
    mask = 0xFFFF << 32
    fps, queries = planted(4000, mask, seed=7)
    idx = small(mask, compiled=compiled)
    idx.BACKGROUND_MIN = 400
    held = HeldMerges(idx)
    ref = small(mask, compiled=compiled, background=False)
    for s in range(0, 3000, 50):
        for x in (idx, ref):
            x.add_many(range(s, s + 50), fps[s : s + 50])
    assert idx._pending is not None and held.started  # a merge is under way, held
    runs_held = idx.runs
    assert runs_held > ref.runs  # newer runs piled up behind it
    assert same(idx.search(queries), ref.search(queries))
    for x in (idx, ref):
        x.remove_rows(np.arange(0, 3000, 5))
    # a snapshot now is consistent: the merge's inputs are saved, not its output
    write_arrays(tmp_path / "s", idx.state(), {})
    arrays, _ = read_arrays(tmp_path / "s")
    loaded = BlockIndex.from_state(arrays, compiled=compiled)
    assert loaded._pending is None
    assert same(loaded.search(queries), ref.search(queries))
    assert idx._pending is not None  # state() did not wait for it
    held.go.set()
    for x in (idx, ref, loaded):
        x.add_many(range(3000, 4000), fps[3000:])
    idx.wait()
    assert idx._pending is None and idx.runs < runs_held
    assert same(idx.search(queries), ref.search(queries))
    assert same(loaded.search(queries), ref.search(queries))
    expected = brute(fps.tolist(), [r % 5 != 0 or r >= 3000 for r in range(4000)], mask, queries.tolist(), 3)
    assert as_tuples(idx.search(queries)) == expected


def test_a_failed_background_merge_is_raised_on_the_callers_thread():
    idx = small(0xFFFF)

    def broken(old, new):
        raise MemoryError("no room for the merged run")

    idx._merged = broken  # type: ignore[method-assign]
    fps = np.arange(1000, dtype=np.uint64)
    with pytest.raises(MemoryError, match="no room"):
        for s in range(0, 1000, 10):
            idx.add_many(range(s, s + 10), fps[s : s + 10])
        idx.wait()


def test_merges_make_exact_size_arrays_and_the_budget_holds():
    mask = 0xFFFF << 16
    fps, _ = planted(300_000, mask, seed=11)
    idx = BlockIndex(mask)
    for s in range(0, len(fps), 1000):
        idx.add_many(range(s, s + 1000), fps[s : s + 1000])
    idx.prepare()
    for i in range(idx.runs):
        run = idx._runs[i]
        assert run.hi.base is None and run.lo.base is None and run.rows.base is None  # their own arrays, of their size
    assert idx.runs <= 8
    assert idx.nbytes / len(idx) <= 14
    idx.remove_rows(np.arange(0, len(fps), 2))
    before = idx.nbytes
    idx.keep_rows(np.flatnonzero(idx.alive_rows()))
    assert idx.nbytes < 0.6 * before


@pytest.mark.parametrize("compiled", [True, False])
def test_entries_added_later_wait_unsorted_within_their_bound_and_every_read_sees_them(compiled):
    mask = 0xFFFF << 16
    fps, queries = planted(6000, mask, seed=5)
    idx, ref = BlockIndex(mask, compiled=compiled), BlockIndex(mask, compiled=compiled, background=False)
    idx.LATER_MIN = 1000
    for s in range(0, 700, 70):  # below LATER_MIN: no run yet, but numbered, alive and counted
        idx.add_many(range(s, s + 70), fps[s : s + 70], later=True)
        ref.add_many(range(s, s + 70), fps[s : s + 70])
    assert idx.runs == 0 and len(idx) == idx.rows == 700 and idx.alive_rows().all()
    assert idx.nbytes >= 8 * 700
    idx.remove_rows([3, 650])  # (a row still waiting)
    ref.remove_rows([3, 650])
    assert same(idx.search(queries), ref.search(queries))  # a search sorts them first: one run
    assert idx.runs == 1
    for s in range(700, 1900, 100):  # 1200 more: sorted once they are as many as the runs hold (700)
        idx.add_many(range(s, s + 100), fps[s : s + 100], later=True)
        ref.add_many(range(s, s + 100), fps[s : s + 100])
        assert sum(len(b) for b in idx._later) < max(idx.LATER_MIN, sum(len(r) for r in idx._runs))
    assert idx.runs == 1 and idx._later  # 1000 sorted at 1700 (and merged: 4 x 1000 >= 700), 200 waiting
    idx.add_many(range(1900, 2000), fps[1900:2000])  # a batch not later: sorted now, with those waiting
    ref.add_many(range(1900, 2000), fps[1900:2000])
    assert not idx._later
    # every read of the runs sorts the waiting entries first
    idx.add_many(range(2000, 2500), fps[2000:2500], later=True)
    assert np.array_equal(idx.fingerprints(), fps[:2500]) and not idx._later
    for read in (idx.state, idx.prepare, idx.wait):
        idx.add_many(range(idx.rows, idx.rows + 50), fps[idx.rows : idx.rows + 50], later=True)
        read()
        assert not idx._later
    ref.add_many(range(2000, idx.rows), fps[2000 : idx.rows])
    n = idx.rows
    idx.add_many(range(n, n + 500), fps[n : n + 500], later=True)
    ref.add_many(range(n, n + 500), fps[n : n + 500])
    live = np.flatnonzero(ref.alive_rows())
    for x in (idx, ref):
        x.keep_rows(live)
    assert same(idx.search(queries), ref.search(queries))
    assert as_tuples(idx.search(queries)) == brute_np(fps[live], np.ones(len(live), bool), mask, queries, 3)


def test_bad_arguments_are_refused():
    for mask in (0, 0xF, 0xFF00FF, 2**64, 0x1_FFFF_FFFF):
        with pytest.raises(ValueError, match="contiguous block|64-bit block"):
            BlockIndex(mask)
    idx = BlockIndex(0xFFFF)
    with pytest.raises(ValueError, match="rows must be 0"):
        idx.add_many(range(1, 3), [1, 2])
    idx.add_many(np.arange(2), [1, 2])
    with pytest.raises(ValueError, match="rows must be 2"):
        idx.add_many([2, 4], [1, 2])
    with pytest.raises(ValueError, match="rows must be 2"):
        idx.add_many(range(2, 4), [1])
    with pytest.raises(ValueError, match="rows must be in"):
        idx.remove_rows([5])
    with pytest.raises(ValueError, match="k must be"):
        idx.search([1], k=65)
    with pytest.raises(ValueError, match="ascending"):
        idx.keep_rows([1, 0])


def good_state() -> dict[str, np.ndarray]:
    fps, _ = planted(2000, 0xFFFF, seed=5)
    idx = BlockIndex(0xFFFF, background=False)
    idx.DIRECTORY_MIN, idx.SMALL_RUN = 512, 4
    for s in range(0, 2000, 300):
        idx.add_many(range(s, min(s + 300, 2000)), fps[s : s + 300])
    idx.add_many(range(2000, 2010), fps[:10])
    state = idx.state()
    assert "dir0" in state and "hi1" in state and "lo1" in state
    return state


def whole_state(state: dict[str, np.ndarray], mask: int = 0xFFFF) -> dict[str, np.ndarray]:
    """``state`` in the layout before the halves: each run's whole fingerprints as ``fps<i>``."""
    idx = BlockIndex(mask)
    out = {name: a for name, a in state.items() if not name.startswith(("hi", "lo"))}
    for name in [n for n in state if n.startswith("hi")]:
        out["fps" + name[2:]] = idx._join(state[name], state["lo" + name[2:]])
    return out


def _unsorted(s):
    s["hi0"] = s["hi0"][::-1].copy()


def _swapped_rows(s):
    s["rows0"] = s["rows0"][::-1].copy()


def _bad_dir(s):
    s["dir0"] = s["dir0"].copy()
    s["dir0"][5] += 1


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda s: s.pop("mask"), "needs 'mask'"),
        (lambda s: s.update(mask=np.array(0xF0F0, dtype=np.uint64)), "contiguous"),
        (lambda s: s.pop("rows1"), "run 1: rows must be"),
        (lambda s: s.update(hi1=s["hi1"].astype(np.int64)), "run 1: hi must be"),
        (lambda s: s.update(lo1=s["lo1"].astype(np.uint64)), "run 1: lo must be"),
        (lambda s: s.pop("lo1"), "run 1: lo must be"),
        (lambda s: s.update(hi1=s["hi1"][:-1]), "halves for"),
        (lambda s: s.update(lo1=s["lo1"][:-1]), "halves for"),
        (lambda s: s.update(alive=s["alive"][:-1]), "alive must be"),
        (lambda s: s.update(n_rows=np.array(2011)), "alive must be|entries for"),
        (lambda s: s.update(n_rows=np.array(2016)), "entries for"),
        (lambda s: s.update(hi7=s["hi1"]), "must be hi0"),
        (lambda s: s.update(extra=s["hi1"]), "unknown arrays"),
        (lambda s: s.update(fps0=whole_state(s)["fps0"]), "unknown arrays"),  # both layouts at once
        (_unsorted, "not sorted"),
        (_swapped_rows, "not sorted"),
        (_bad_dir, "directory does not match"),
        (lambda s: s.update(dir0=s["dir0"][:-1]), "directory must have"),
        (lambda s: s.update(dir0=s["dir0"].astype(np.int64)), "directory must be"),
        (lambda s: s.update(dir1=s["dir0"]), "directory does not match"),
        (lambda s: s.update(rows1=s["rows1"] + np.uint32(5000)), "row is >= n_rows"),
    ],
)
def test_a_malformed_state_is_refused(damage, message):
    state = good_state()
    BlockIndex.from_state(dict(state))  # the undamaged one loads
    damage(state)
    with pytest.raises(ValueError, match=message):
        BlockIndex.from_state(state)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda s: s.update(fps1=s["fps1"].astype(np.int64)), "run 1: fps must be"),
        (lambda s: s.update(fps1=s["fps1"][:-1]), "halves for"),
        (lambda s: s.update(fps7=s["fps1"]), "must be fps0"),
        (lambda s: s.update(fps0=s["fps0"][::-1].copy()), "not sorted"),
    ],
)
def test_a_malformed_state_of_whole_fingerprints_is_refused(damage, message):
    state = whole_state(good_state())
    BlockIndex.from_state(dict(state))
    damage(state)
    with pytest.raises(ValueError, match=message):
        BlockIndex.from_state(state)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("mask", [0xFFFF, 0xFFFF << 16, 0xFFFF << 48, 0xFF << 20, 0xFFFFFFFF << 8, 0xFFFFFFFF << 32])
def test_a_state_of_whole_fingerprints_answers_like_the_halves(mask, compiled):
    """Snapshots written before the halves (runs of whole 64-bit fingerprints) still load, cut
    into halves: the same runs, the same answers, the same fingerprints back."""
    fps, queries = planted(5000, mask, seed=mask % 997)
    idx = BlockIndex(mask, background=False, compiled=compiled)
    idx.DIRECTORY_MIN = 512
    for s in range(0, 5000, 700):
        idx.add_many(range(s, min(s + 700, 5000)), fps[s : s + 700])
    idx.remove_rows(np.arange(0, 5000, 7))
    state = idx.state()
    whole = whole_state(state, mask)
    assert not any(name.startswith(("hi", "lo")) for name in whole)
    loaded = BlockIndex.from_state(whole, compiled=compiled)
    for name, a in loaded.state().items():
        assert np.array_equal(a, state[name]), name
    assert same(loaded.search(queries), idx.search(queries))
    assert np.array_equal(loaded.fingerprints(), fps)
    alive = np.ones(5000, bool)
    alive[::7] = False
    assert as_tuples(loaded.search(queries)) == brute_np(fps, alive, mask, queries, 3)


def test_hamming_index_matches_leave_the_fingerprint_none():
    idx = HammingIndex(k=3)
    idx.add_many(range(2), [0, 1])
    found = idx.search([0])
    assert found.fingerprint is None and found.row.tolist() == [0, 1]


def test_background_merges_of_several_indexes_run_one_at_a_time():
    """A shard's groups grow in step: their big merges must not all hold their inputs and
    outputs at once. While one index's merge is held, another's due merge does not start."""
    mask = 0xFFFF << 16
    fps, queries = planted(3000, mask, seed=9)
    first, second = small(mask), small(mask)
    for idx in (first, second):
        idx.BACKGROUND_MIN = 400
    held_first, held_second = HeldMerges(first), HeldMerges(second)
    for s in range(0, 3000, 50):
        first.add_many(range(s, s + 50), fps[s : s + 50])
    assert first._pending is not None and held_first.started == 1
    for s in range(0, 3000, 50):
        second.add_many(range(s, s + 50), fps[s : s + 50])
    assert second._pending is not None
    second._pending.thread.join(0.5)
    assert held_second.started == 0  # waiting for the slot the first merge holds
    held_second.go.set()
    second._pending.thread.join(0.5)
    assert held_second.started == 0 and second._pending.thread.is_alive()
    held_first.go.set()  # the first finishes; then the second runs
    first.wait()
    second.wait()
    assert held_second.started >= 1
    ref = small(mask, background=False)
    ref.add_many(range(3000), fps)
    assert same(first.search(queries), ref.search(queries)) and same(second.search(queries), ref.search(queries))


def _flipped(rng: np.random.Generator, fps: np.ndarray, most: int) -> np.ndarray:
    """``fps`` with 0..most random bits flipped each (some bits may repeat: fewer flips)."""
    out = fps.copy()
    for i in range(len(out)):
        for bit in rng.integers(0, 64, size=int(rng.integers(0, most + 1))):
            out[i] ^= np.uint64(1) << np.uint64(bit)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_search_is_brute_force_for_any_k_key_and_bucket_size(seed):
    """Exact for any k (0..64: far past what a key of w bits guarantees), any key block (8..32
    bits, anywhere), buckets of 1 to ~1000 entries with duplicates and dead rows, runs with and
    without directories (a directory bucket of one key or of many): the numba scan, which skips
    a step of 64 entries on its low halves alone, and the numpy path give brute force's answer."""
    rng = np.random.default_rng(1000 + seed)
    for trial in range(4):
        width = int(rng.integers(8, 33))
        shift = int(rng.choice([0, 64 - width, int(rng.integers(0, 64 - width + 1))]))
        mask = ((1 << width) - 1) << shift
        n = int(rng.integers(200, 2500))
        fps = rng.integers(0, M64, size=n, dtype=np.uint64, endpoint=True)
        keys = rng.integers(0, 1 << width, size=int(rng.integers(1, 4)), dtype=np.uint64) << np.uint64(shift)
        crowd = rng.random(n) < 0.85  # a few big buckets; the rest of the keys random (buckets of 1)
        hubs = rng.integers(0, M64, size=6, dtype=np.uint64, endpoint=True)
        fps[crowd] = (_flipped(rng, hubs[rng.integers(0, 6, crowd.sum())], 24) & ~np.uint64(mask)) | keys[
            rng.integers(0, len(keys), crowd.sum())
        ]
        twins = rng.integers(0, n, size=n // 10)
        fps[rng.integers(0, n, size=len(twins))] = fps[twins]  # duplicates
        queries = np.concatenate(
            (
                _flipped(rng, fps[rng.integers(0, n, 30)], 22),
                (hubs & ~np.uint64(mask)) | keys[0],
                rng.integers(0, M64, size=4, dtype=np.uint64, endpoint=True),
            )
        )
        dead = rng.integers(0, n, size=n // 6)
        alive = np.ones(n, dtype=bool)
        alive[dead] = False
        cuts = [0, *sorted(rng.integers(0, n, size=int(rng.integers(0, 6))).tolist()), n]
        thresholds = (int(rng.choice([4, 1 << 14])), int(rng.choice([16, 1 << 12])), int(rng.choice([1, 2, 64, 400])))
        found = []
        for compiled in (True, False):
            idx = BlockIndex(mask, compiled=compiled, background=bool(trial % 2))
            idx.SMALL_RUN, idx.DIRECTORY_MIN, idx.PER_BUCKET = thresholds
            idx.BACKGROUND_MIN = 64
            for a, b in zip(cuts, cuts[1:]):
                idx.add_many(range(a, b), fps[a:b])
            idx.remove_rows(dead)
            for k in (0, 1, 3, 7, 12, 20, 31, 32, 33, 64):
                got = idx.search(queries, k=k)
                assert as_tuples(got) == brute_np(fps, alive, mask, queries, k), (hex(mask), compiled, k)
                found.append(got)
            idx.wait()
        assert all(same(a, b) for a, b in zip(found[:10], found[10:]))  # the two paths alike


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("mask", [0xFFFF << 48, 0xFF << 8, 0xFFFF_FFFF, 0x3FF << 27])
def test_the_scan_of_a_bucket_stops_at_its_edges(mask, compiled):
    """Buckets of 1, 63, 64, 65, 127, 128, 129 and 1000 entries (the last one at the end of the
    run) between empty keys, every entry's low half near the query's whatever its key: fillers
    far away in the other bits, and at each step edge of a bucket an entry 0..4 bits from its
    query.  Exactly those within k of the query's bucket are found, on both paths, through a
    directory of a key a bucket or of several keys a bucket, or by binary search."""
    shift = (mask & -mask).bit_length() - 1
    width = (mask >> shift).bit_length()
    rng = np.random.default_rng(width)
    other_bits = [i for i in range(64) if not mask >> i & 1]
    base = int(rng.integers(0, M64, dtype=np.uint64, endpoint=True)) & ~mask
    sizes = [1, 63, 64, 65, 127, 128, 129, 1000]
    keys = [(5 + 2 * b) << shift for b in range(len(sizes))]  # keys 5, 7, ..., 19; 4, 6, ..., 20 empty
    halves = BlockIndex(mask)
    fps: list[int] = []
    near: dict[int, list[tuple[int, int]]] = {}  # bucket -> (distance, row)
    for b, size in enumerate(sizes):
        edges = {0, 1, 62, 63, 64, 65, 127, 128, size // 2, size - 2, size - 1} & set(range(size))
        for pos in range(size):
            if pos in edges:
                d = pos % 5
                fp = base
                for bit in rng.choice(other_bits, size=d, replace=False):
                    fp ^= 1 << int(bit)
                near.setdefault(b, []).append((d, len(fps)))
            else:  # the low half within 0..1 bit of the query's (no step skipped), far in the high half
                q_hi, q_lo = halves._split(np.array([base | keys[b]], dtype=np.uint64))
                if width < 32:  # (a key of 32 bits is the whole high half: far in the low half then)
                    f_hi, f_lo = q_hi ^ np.uint32((1 << (32 - width)) - 1), q_lo ^ np.uint32(pos % 2)
                else:
                    f_hi, f_lo = q_hi, ~q_lo
                fp = int(halves._join(f_hi, f_lo)[0])
            fps.append((fp & ~mask) | keys[b])
    queries = [base | key for key in keys]
    queries += [base | (key - (1 << shift)) for key in keys] + [base | (keys[-1] + (1 << shift))]  # empty keys
    queries += [base, base | mask]  # key 0 (before the first bucket), the last key (after the last)
    fps_arr, q_arr = np.array(fps, dtype=np.uint64), np.array(queries, dtype=np.uint64)
    for directory_min, per_bucket in ((1 << 20, 8), (16, 1), (16, 64)):
        idx = BlockIndex(mask, k=3, compiled=compiled, background=False)
        idx.DIRECTORY_MIN, idx.PER_BUCKET = directory_min, per_bucket
        idx.add_many(range(len(fps_arr)), fps_arr)
        assert idx.runs == 1 and (idx._runs[0].directory is not None) == (directory_min == 16)
        for k in (0, 3, 4, 20):
            found = idx.search(q_arr, k=k)
            want = sorted((q, d, r) for q in range(len(sizes)) for d, r in near[q] if d <= k)
            if k < 16:  # (the fillers are 32 - w or 33 - w bits away: 16 for a 16-bit key)
                assert [(q, d, r) for q, d, r, _ in as_tuples(found)] == want, (k, directory_min, per_bucket)
            assert as_tuples(found) == brute_np(fps_arr, np.ones(len(fps_arr), bool), mask, q_arr, k)
