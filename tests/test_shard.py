"""The sharded index gives the global answer, whatever the number of partitions and batches."""

from __future__ import annotations

import numpy as np
import pytest
from damage import HOW
from damage import damage as damage_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdedup.index.file_array import FileArray
from streamdedup.index.strings import StringHeap
from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.shard import WORKER_DESIGN, Shard, ShardPlan, ShardStep, shard_step
from streamdedup.pipeline.wire import ANSWERS, CHANGELOG, PROBES, Batch, decode, encode


def pages(seed: int, n: int):
    """Fingerprints in clusters (neighbours at 0..5 bits), fetch times, some re-fetched ids (with
    the same fingerprint: a replay of the same content, or another)."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2**64 - 1, size=max(1, n // 6), dtype=np.uint64, endpoint=True)
    fps = centres[rng.integers(0, len(centres), size=n)]
    for i in range(n):
        for b in rng.choice(64, size=rng.integers(0, 6), replace=False):
            fps[i] ^= np.uint64(1) << np.uint64(b)
    fetched = rng.integers(0, n // 2 + 1, size=n).astype(np.int64)  # not in arrival order: it decides nothing
    ids = [f"p{i}" for i in range(n)]
    for i in rng.choice(np.arange(1, n), size=n // 10, replace=False):  # re-fetches of an earlier id
        j = int(rng.integers(0, i))
        ids[i] = ids[j]
        if rng.random() < 0.5:
            fps[i] = fps[j]  # unchanged content: the same page again
    id_hash = np.array([hash_id(x) for x in ids], dtype=np.uint64)
    return fps, fetched, id_hash, ids


def hash_id(x: str) -> int:
    import xxhash

    return xxhash.xxh3_64_intdigest(x.encode())


def group_bits(plan: ShardPlan) -> list[int]:
    return [sum(1 << b for b in bits) for bits, _ in plan.design.groups()]


def brute(plan: ShardPlan, fps, id_hash, ids, orders: list[list[int]], k: int = 3):
    """The rule, pair by pair: for each page, (distance, match id) of the best page stored before
    it in the store of the pair's canonical group, or None.

    ``orders[s]``: the pages in the order shard partition s stored them; a page stands where its
    (id, fingerprint) was first stored; the best is the nearest, then lowest group, then first stored."""
    masks, dest = group_bits(plan), plan.probes(fps)
    pos = []
    for order in orders:
        first: dict = {}
        pos.append({i: first.setdefault((int(id_hash[i]), int(fps[i])), n) for n, i in enumerate(order)})
    out = []
    for i in range(len(fps)):
        best = None
        for j in range(len(fps)):
            x = int(fps[i]) ^ int(fps[j])
            if x.bit_count() > k or id_hash[i] == id_hash[j]:
                continue
            g = next(g for g, m in enumerate(masks) if x & m == 0)
            s = int(dest[i, g])
            assert s == int(dest[j, g])  # both pages probe the canonical group's shard
            if pos[s][j] < pos[s][i]:
                cand = (x.bit_count(), g, pos[s][j], ids[j])
                best = cand if best is None or cand < best else best
        out.append(None if best is None else (best[0], best[3]))
    return out


def sharded(plan: ShardPlan, fps, fetched, id_hash, ids, batch: int, orders: list[list[int]] | None = None):
    """Feed each shard partition its probes in batches, in ``orders[s]`` (default: page order
    everywhere); combine the groups' answers per page as Pending does (nearest, then lowest group)."""
    shards = [Shard(plan) for _ in range(plan.partitions)]
    dest = plan.probes(fps)
    if orders is None:
        orders = [list(range(len(fps)))] * plan.partitions
    orders = [[i for i in order if (dest[i] == s).any()] for s, order in enumerate(orders)]
    best: list = [None] * len(fps)
    for s, shard in enumerate(shards):
        order = np.array(orders[s], dtype=np.int64)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            page_idx, group = np.nonzero(dest[chunk] == s)
            page_idx = chunk[page_idx]
            ans = shard.probe_and_insert(
                group,
                fps[page_idx],
                fetched[page_idx],
                id_hash[page_idx],
                [ids[i] for i in page_idx],
                [f"u/{ids[i]}" for i in page_idx],
            )
            for j, (i, g) in enumerate(zip(page_idx.tolist(), group.tolist())):
                if ans.distance[j] < 0:
                    continue
                assert ans.urls[j] == f"u/{ans.ids[j]}"
                cand = (int(ans.distance[j]), g, ans.ids[j])
                best[i] = cand if best[i] is None or cand < best[i] else best[i]
    return [None if b is None else (b[0], b[2]) for b in best], shards, orders


@pytest.mark.parametrize("design", ["16", "20", "10", "4"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), partitions=st.sampled_from([1, 2, 3, 8]), batch=st.sampled_from([1, 7, 50]))
def test_sharded_answers_follow_the_rule_whatever_order_each_shard_sees(design, seed, partitions, batch):
    fps, fetched, id_hash, ids = pages(seed, 60)
    plan = ShardPlan(TableDesign.named(design), partitions)
    rng = np.random.default_rng(seed + 1)
    orders = [rng.permutation(len(fps)).tolist() for _ in range(partitions)]  # each shard its own order
    got, _, orders = sharded(plan, fps, fetched, id_hash, ids, batch, orders)
    assert got == brute(plan, fps, id_hash, ids, orders)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), partitions=st.sampled_from([1, 2, 4]), batch=st.sampled_from([1, 5, 64]))
def test_of_every_near_pair_exactly_one_page_finds_the_other(seed, partitions, batch):
    """Isolated pairs (each page's only neighbour is its twin), any order per shard: one of the
    two is flagged, with the other as its match, never both, never neither."""
    rng = np.random.default_rng(seed)
    n_pairs = 30
    a = rng.integers(0, 2**64 - 1, size=n_pairs, dtype=np.uint64, endpoint=True)
    b = a.copy()
    for i in range(n_pairs):  # 0..3 bits apart, anywhere: canonical groups of every index
        for bit in rng.choice(64, size=int(rng.integers(0, 4)), replace=False):
            b[i] ^= np.uint64(1) << np.uint64(bit)
    fps = np.concatenate((a, b))
    ids = [f"a{i}" for i in range(n_pairs)] + [f"b{i}" for i in range(n_pairs)]
    id_hash = np.array([hash_id(x) for x in ids], dtype=np.uint64)
    plan = ShardPlan(TableDesign.named("16"), partitions)
    orders = [rng.permutation(2 * n_pairs).tolist() for _ in range(partitions)]
    got, _, _ = sharded(plan, fps, np.zeros(2 * n_pairs, np.int64), id_hash, ids, batch, orders)
    for i in range(n_pairs):
        flagged = [m for m in (got[i], got[n_pairs + i]) if m is not None]
        assert len(flagged) == 1, (i, got[i], got[n_pairs + i])
        assert flagged[0][1] in (ids[i], ids[n_pairs + i])


def test_answers_do_not_depend_on_the_number_of_partitions():
    fps, fetched, id_hash, ids = pages(3, 400)
    answers = [sharded(ShardPlan(TableDesign.named("16"), p), fps, fetched, id_hash, ids, 64)[0] for p in (1, 2, 4, 16)]
    assert all(a == answers[0] for a in answers)
    assert sum(a is not None for a in answers[0]) > 100  # the test data has plenty of matches


def test_a_replay_keeps_the_position_of_its_first_insert():
    fps, fetched, id_hash, ids = pages(5, 120)
    plan = ShardPlan(TableDesign.named("16"), 4)
    rng = np.random.default_rng(5)
    orders = [rng.permutation(len(fps)).tolist() for _ in range(4)]
    first, shards, orders = sharded(plan, fps, fetched, id_hash, ids, 30, orders)
    size = sum(len(s) for s in shards)
    # replay everything into the same shards (a worker restarted from an older offset), in
    # another order: each page is judged as at its first insert, never against later pages
    parts = plan.probes(fps)
    again: list = [None] * len(fps)
    for p, shard in enumerate(shards):
        page_idx, group = np.nonzero(parts == p)
        back = np.argsort(-page_idx, kind="stable")
        page_idx, group = page_idx[back], group[back]
        ans = shard.probe_and_insert(
            group,
            fps[page_idx],
            fetched[page_idx],
            id_hash[page_idx],
            [ids[i] for i in page_idx],
            [f"u/{ids[i]}" for i in page_idx],
        )
        assert not ans.stored.any()
        for j, (i, g) in enumerate(zip(page_idx.tolist(), group.tolist())):
            assert ans.ids[j] != ids[i]  # never itself
            if ans.distance[j] >= 0:
                cand = (int(ans.distance[j]), g, ans.ids[j])
                again[i] = cand if again[i] is None or cand < again[i] else again[i]
    assert [None if b is None else (b[0], b[2]) for b in again] == first
    assert sum(len(s) for s in shards) == size
    assert first == brute(plan, fps, id_hash, ids, orders)


def test_a_page_fetched_later_but_stored_first_is_the_original():
    """Issue 9: B fetched at 20, then A fetched at 10, 2 bits apart: A (stored second) is flagged."""
    plan = ShardPlan(TableDesign.named("16"), 1)
    shard = Shard(plan)
    g = np.arange(4)
    b_fp, a_fp = np.uint64(0xABCD_1234_5678_9EF0), np.uint64(0xABCD_1234_5678_9EF0 ^ 0b101)  # block 0 differs
    late = shard.probe_and_insert(g, np.full(4, b_fp), np.full(4, 20), np.full(4, 2, np.uint64), ["b"] * 4, ["ub"] * 4)
    early = shard.probe_and_insert(g, np.full(4, a_fp), np.full(4, 10), np.full(4, 1, np.uint64), ["a"] * 4, ["ua"] * 4)
    assert (late.distance == -1).all()  # nothing stored before it
    # groups 1..3 agree; group 1 is the pair's canonical group: only it answers
    assert early.distance.tolist() == [-1, 2, -1, -1] and early.ids == [None, "b", None, None]


def test_a_batch_finds_its_own_earlier_pages_and_a_repeated_page_once():
    plan = ShardPlan(TableDesign.named("16"), 1)
    shard = Shard(plan)
    fp = np.uint64(0x1234_5678_9ABC_DEF0)
    rows = [("x", fp), ("y", fp ^ np.uint64(1 << 40)), ("x", fp), ("z", fp)]  # x twice in one batch
    ids = [r[0] for r in rows]
    ans = shard.probe_and_insert(
        np.zeros(4, np.int64),
        np.array([r[1] for r in rows], dtype=np.uint64),
        np.zeros(4, np.int64),
        np.array([hash_id(x) for x in ids], dtype=np.uint64),
        ids,
        ids,
    )
    assert ans.ids == [None, "x", None, "x"]  # the second x stands where the first is: before y
    assert ans.stored.tolist() == [True, True, False, True] and len(shard) == 3


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


def answer_all(shard: Shard, plan: ShardPlan, fps, fetched, id_hash, ids, batch: int = 50) -> list:
    """Every page's probes through one shard (a 1-partition plan), in batches: (distances, ids, urls)."""
    out = []
    for s in range(0, len(fps), batch):
        sl = slice(s, s + batch)
        n = len(fps[sl])
        rep = np.repeat(np.arange(n), plan.n_groups)
        g = np.tile(np.arange(plan.n_groups), n)
        page_ids = [ids[sl][i] for i in rep.tolist()]
        urls = [f"http://x.test/{x}/✓" for x in page_ids]
        a = shard.probe_and_insert(g, fps[sl][rep], fetched[sl][rep], id_hash[sl][rep], page_ids, urls)
        out.append((a.distance.tolist(), a.ids, a.urls))
    return out


def test_strings_in_files_answer_like_strings_in_memory_and_are_not_resident(tmp_path):
    plan = ShardPlan(TableDesign.named("16"), 1)
    fps, fetched, id_hash, ids = pages(11, 600)
    ram, disk = Shard(plan), Shard(plan, str(tmp_path / "s"))
    assert answer_all(disk, plan, fps, fetched, id_hash, ids) == answer_all(ram, plan, fps, fetched, id_hash, ids)
    files = [f"s.g{g}.strings{suffix}" for g in range(4) for suffix in ("", ".ends", ".fetched", ".idhash")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    # resident: only the index (the strings, their ends, fetch times and id hashes are in the files)
    assert disk.nbytes == sum(g.index.nbytes for g in disk._groups.values()) + disk._records.nbytes
    saved = sum(g.texts.size + 8 * 4 * len(g.id_hash) for g in ram._groups.values())
    assert ram.nbytes - disk.nbytes >= saved > 0
    # the gauge of the files (streamdedup_shard_file_bytes) is what they hold on disk
    assert disk.file_bytes == sum(p.stat().st_size for p in tmp_path.iterdir()) > 0
    assert ram.file_bytes == 0


def test_a_snapshot_with_string_files_answers_like_the_shard_it_was_taken_from(tmp_path):
    """Saved, then more pages stored (their bytes reach the files), then loaded: the files are cut
    back to the snapshot, and the loaded shard answers the later pages exactly as the live one did."""
    plan = ShardPlan(TableDesign.named("16"), 1)
    fps, fetched, id_hash, ids = pages(12, 400)
    live = Shard(plan, str(tmp_path / "s"))
    answer_all(live, plan, fps[:250], fetched[:250], id_hash[:250], ids[:250])
    live.save(tmp_path / "s.npz", {"offset": 1})
    expected = answer_all(live, plan, fps[250:], fetched[250:], id_hash[250:], ids[250:])
    live.close()
    loaded, meta = Shard.load(tmp_path / "s.npz", plan, str(tmp_path / "s"))
    assert meta == {"offset": 1} and len(loaded) == 4 * len(
        {(int(h), int(f)) for h, f in zip(id_hash[:250], fps[:250])}
    )
    assert answer_all(loaded, plan, fps[250:], fetched[250:], id_hash[250:], ids[250:]) == expected


def test_a_snapshot_of_strings_in_memory_loads_into_string_files(tmp_path):
    plan = ShardPlan(TableDesign.named("16"), 1)
    fps, fetched, id_hash, ids = pages(13, 300)
    ram = Shard(plan)
    answer_all(ram, plan, fps[:200], fetched[:200], id_hash[:200], ids[:200])
    ram.save(tmp_path / "s.npz")
    expected = answer_all(ram, plan, fps[200:], fetched[200:], id_hash[200:], ids[200:])
    loaded, _ = Shard.load(tmp_path / "s.npz", plan, str(tmp_path / "s"))
    assert answer_all(loaded, plan, fps[200:], fetched[200:], id_hash[200:], ids[200:]) == expected
    assert all(g.texts.path is not None for g in loaded._groups.values())


def saved_with_string_files(tmp_path) -> ShardPlan:
    """A shard of 200 pages with its string files under ``tmp_path / "s"``, saved to ``s.npz``."""
    plan = ShardPlan(TableDesign.named("16"), 1)
    fps, fetched, id_hash, ids = pages(14, 200)
    live = Shard(plan, str(tmp_path / "s"))
    answer_all(live, plan, fps, fetched, id_hash, ids)
    live.save(tmp_path / "s.npz")
    live.close()
    return plan


@pytest.mark.parametrize("suffix", ["", ".ends", ".fetched", ".idhash"])
@pytest.mark.parametrize("damage", HOW)
def test_a_missing_damaged_or_foreign_string_file_is_refused(tmp_path, damage, suffix):
    plan = saved_with_string_files(tmp_path)
    damage_file(tmp_path / f"s.g2.strings{suffix}", damage)
    why = {"missing": "cannot open the (string|column) file", "short": "is shorter", "foreign": "does not hold"}[damage]
    if suffix == ".ends" and damage == "foreign":  # (other ends can also name a size the data file lacks)
        why = "does not hold|is shorter"
    with pytest.raises(ValueError, match=why):
        Shard.load(tmp_path / "s.npz", plan, str(tmp_path / "s"))


def test_a_string_ends_file_whose_last_end_is_negative_is_refused(tmp_path):
    """(The size it gives was handed to ftruncate, whose OSError a snapshot load did not take
    for damage: the worker failed at every assignment instead of rebuilding the shard.)"""
    plan = saved_with_string_files(tmp_path)
    ends = tmp_path / "s.g2.strings.ends"
    raw = bytearray(ends.read_bytes())
    raw[-8:] = b"\xff" * 8
    ends.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="is damaged"):
        Shard.load(tmp_path / "s.npz", plan, str(tmp_path / "s"))


def test_a_file_backed_string_heap_round_trip(tmp_path):
    h = StringHeap(tmp_path / "h")
    values = ["http://a/", "", "ünïcode ✓", "x" * 5000] * 300
    h.extend(values[:600])
    h.extend_raw("".join(values[600:]).encode(), np.array([len(v.encode()) for v in values[600:]]))
    assert [h[i] for i in range(len(values))] == values
    assert h.nbytes == 0 and (tmp_path / "h").stat().st_size == h.size
    assert (tmp_path / "h.ends").stat().st_size == 8 * len(values)
    reopened = StringHeap.open(tmp_path / "h", len(h), h.checksum())
    assert [reopened[i] for i in range(len(values))] == values


def test_a_failed_string_write_leaves_the_shard_as_it_was(tmp_path, monkeypatch):
    """A full disk fails the batch (the stage retries it); nothing of it is half stored."""
    import errno
    import os

    plan = ShardPlan(TableDesign.named("16"), 1)
    fps, fetched, id_hash, ids = pages(15, 200)
    shard, twin = Shard(plan, str(tmp_path / "s")), Shard(plan)
    answer_all(shard, plan, fps[:100], fetched[:100], id_hash[:100], ids[:100])
    answer_all(twin, plan, fps[:100], fetched[:100], id_hash[:100], ids[:100])
    real = os.pwrite

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError):
        answer_all(shard, plan, fps[100:], fetched[100:], id_hash[100:], ids[100:])
    monkeypatch.setattr(os, "pwrite", real)
    assert len(shard) == len(twin)
    later = (fps[100:], fetched[100:], id_hash[100:], ids[100:])
    assert answer_all(shard, plan, *later) == answer_all(twin, plan, *later)


@pytest.mark.parametrize("failing", [".ends", ".fetched", ".idhash"])
def test_a_write_that_fails_after_the_strings_leaves_the_shard_as_it_was(tmp_path, monkeypatch, failing):
    """The strings reach their file, then a later column's write fails: every file of the
    batch is cut back, so the rows stay aligned with their strings."""
    import errno

    from streamdedup.index import file_array

    plan = ShardPlan(TableDesign.named("16"), 1)
    fps, fetched, id_hash, ids = pages(16, 200)
    shard, twin = Shard(plan, str(tmp_path / "s")), Shard(plan)
    answer_all(shard, plan, fps[:100], fetched[:100], id_hash[:100], ids[:100])
    answer_all(twin, plan, fps[:100], fetched[:100], id_hash[:100], ids[:100])
    real_write = file_array.FileArray._write

    def full(self, fd, data, at):
        if self.path.endswith(failing):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, fd, data, at)

    monkeypatch.setattr(file_array.FileArray, "_write", full)
    with pytest.raises(OSError):
        answer_all(shard, plan, fps[100:], fetched[100:], id_hash[100:], ids[100:])
    monkeypatch.setattr(file_array.FileArray, "_write", real_write)
    assert len(shard) == len(twin)
    later = (fps[100:], fetched[100:], id_hash[100:], ids[100:])
    assert answer_all(shard, plan, *later) == answer_all(twin, plan, *later)


def _probes_message(plan: ShardPlan, fps, fetched, id_hash, ids) -> bytes:
    """Every page's probes (one a group) as one probes message of a 1-partition plan; ``request``
    is the page's number."""
    rep = np.repeat(np.arange(len(fps)), plan.n_groups)
    page_ids = [ids[i] for i in rep.tolist()]
    return encode(
        Batch.build(
            group=np.tile(np.arange(plan.n_groups), len(fps)),
            fps=fps[rep],
            fetched=fetched[rep],
            id_hash=id_hash[rep],
            ids=page_ids,
            urls=[f"http://x.test/{x}" for x in page_ids],
            request=rep,
            kind=PROBES,
        ),
        PROBES,
    )


def _answers(step: ShardStep) -> list[tuple]:
    """A step's answers, one (page, group, distance, match id) a probe, sorted."""
    out = []
    for batch in step.answers.values():
        b = decode([encode(batch, ANSWERS)], ANSWERS)
        r, g, d = (b.rows[c].tolist() for c in ("request", "group", "distance"))
        out += zip(r, g, d, b.ids())
    return sorted(out)


def test_a_step_that_fails_midway_hands_back_the_rows_it_stored(tmp_path, monkeypatch):
    """A full disk in the middle of a shard step: the groups before the failing one stored their
    pages, and a retry finds them stored (so it does not store, or log, them again).  The step
    still hands those rows back in its changelog (the worker owes them to the changelog), so a
    replay of every changelog row gives a shard that answers like the live one, and the retry
    answers like a shard that never failed."""
    import errno

    plan = ShardPlan(TableDesign.named(WORKER_DESIGN), 1)
    fps, fetched, id_hash, ids = pages(17, 450)
    batches = [slice(0, 150), slice(150, 300), slice(300, 450)]
    live, twin = Shard(plan, str(tmp_path / "s")), Shard(plan)
    msgs = [_probes_message(plan, fps[b], fetched[b], id_hash[b], ids[b]) for b in batches]
    log = shard_step(lambda s: live, [(0, msgs[0])], now=0).changelog
    shard_step(lambda s: twin, [(0, msgs[0])], now=0)

    def full(values):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(live._groups[2].texts, "extend", full)  # group 2's string file is full
    failed = ShardStep()
    with pytest.raises(OSError):
        shard_step(lambda s: live, [(0, msgs[1])], now=0, out=failed)
    monkeypatch.undo()
    new_pages = len({(int(h), int(f)) for h, f in zip(id_hash[:300], fps[:300])}) - len(
        {(int(h), int(f)) for h, f in zip(id_hash[:150], fps[:150])}
    )
    [(at, handed_back)] = failed.changelog
    assert at == 0 and sorted(set(handed_back.group.tolist())) == [0, 1] and len(handed_back) == 2 * new_pages
    retry = shard_step(lambda s: live, [(0, msgs[1])], now=0)
    [(at, rest)] = retry.changelog
    assert at == 0 and sorted(set(rest.group.tolist())) == [2, 3] and len(rest) == 2 * new_pages
    assert _answers(retry) == _answers(shard_step(lambda s: twin, [(0, msgs[1])], now=0))
    log += failed.changelog + retry.changelog
    replayed = Shard(plan)
    for _, rows in log:
        replayed.restore(decode([encode(rows, CHANGELOG)], CHANGELOG))
    assert len(replayed) == len(live) == len(twin)
    later = [shard_step(lambda s, x=x: x, [(0, msgs[2])], now=0) for x in (live, replayed, twin)]
    assert _answers(later[0]) == _answers(later[1]) == _answers(later[2])


def test_a_step_whose_index_fails_after_taking_the_rows_hands_them_back(tmp_path, monkeypatch):
    """Out of memory in the index's sort after it numbered a batch's rows (group 2): the rows
    are stored (a retry finds them), so the step hands them back too, and a replay of every
    changelog row answers like the live shard."""
    plan = ShardPlan(TableDesign.named(WORKER_DESIGN), 1)
    fps, fetched, id_hash, ids = pages(19, 450)
    batches = [slice(0, 150), slice(150, 300), slice(300, 450)]
    live = Shard(plan, str(tmp_path / "s"))
    msgs = [_probes_message(plan, fps[b], fetched[b], id_hash[b], ids[b]) for b in batches]
    log = shard_step(lambda s: live, [(0, msgs[0])], now=0).changelog
    index = live._groups[2].index
    sort_later = index._sort_later

    def out_of_memory():
        if index._later:  # (the rows just numbered: add_many's call, not the search's before it)
            raise MemoryError
        sort_later()

    monkeypatch.setattr(index, "_sort_later", out_of_memory)
    failed = ShardStep()
    with pytest.raises(MemoryError):
        shard_step(lambda s: live, [(0, msgs[1])], now=0, out=failed)
    monkeypatch.undo()
    new_pages = len({(int(h), int(f)) for h, f in zip(id_hash[:300], fps[:300])}) - len(
        {(int(h), int(f)) for h, f in zip(id_hash[:150], fps[:150])}
    )
    [(_, handed_back)] = failed.changelog
    assert sorted(set(handed_back.group.tolist())) == [0, 1, 2] and len(handed_back) == 3 * new_pages
    retry = shard_step(lambda s: live, [(0, msgs[1])], now=0)
    [(_, rest)] = retry.changelog
    assert sorted(set(rest.group.tolist())) == [3] and len(rest) == new_pages
    replayed = Shard(plan)
    for _, rows in log + failed.changelog + retry.changelog:
        replayed.restore(decode([encode(rows, CHANGELOG)], CHANGELOG))
    assert len(replayed) == len(live)
    later = [shard_step(lambda s, x=x: x, [(0, msgs[2])], now=0) for x in (live, replayed)]
    assert _answers(later[0]) == _answers(later[1])


def _changelog_rows(seed: int, n: int, plan: ShardPlan) -> Batch:
    """n pages as a shard's changelog holds them: a row per page and group, groups interleaved."""
    fps, fetched, id_hash, ids = pages(seed, n)
    rep = np.repeat(np.arange(n), plan.n_groups)
    page_ids = [ids[i] for i in rep.tolist()]
    return Batch.build(
        group=np.tile(np.arange(plan.n_groups), n),
        fps=fps[rep],
        fetched=fetched[rep],
        id_hash=id_hash[rep],
        ids=page_ids,
        urls=[f"http://x.test/{x}/✓" for x in page_ids],
    )


def _shard_files(tmp_path) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in sorted(tmp_path.glob("s.g*"))}


def _probe(shard: Shard, rows: Batch) -> tuple:
    a = shard.probe_and_insert(rows.group, rows.fps, rows.fetched, rows.id_hash, rows.ids(), rows.urls(), store=False)
    return a.distance.tolist(), a.ids, a.urls


def test_strings_and_columns_written_ahead_read_back_as_appended(tmp_path):
    """Writes ahead (in the writer thread) of several appends in a row, one append that was not
    written ahead (the ones ahead of it are dropped and written again), and a close with writes
    still ahead: the heap and the column read back as if every append had been made at once."""
    h, col = StringHeap(tmp_path / "h"), FileArray(np.int64, tmp_path / "c")
    words = [f"wörd-{i}" * (i % 5) for i in range(300)]
    blobs = [("".join(words[i : i + 100]).encode(), words[i : i + 100]) for i in range(0, 300, 100)]
    lengths = [np.array([len(w.encode()) for w in part]) for _, part in blobs]
    values = [np.arange(i, i + 100) for i in range(0, 300, 100)]
    for (blob, _), n, v in zip(blobs, lengths, values):
        h.write_ahead(blob, n)
        col.write_ahead(v)
    for (blob, _), n, v in zip(blobs[:2], lengths, values):
        h.extend_raw(blob, n)
        col.extend(v)
    assert [h[i] for i in range(len(h))] == words[:200] and col.view().tolist() == list(range(200))
    h.extend(["another"])  # (not written ahead: the third blob's write is dropped)
    col.extend(np.array([-1]))
    h.extend_raw(*((blobs[2][0], lengths[2])))
    col.extend(values[2])
    assert [h[i] for i in range(len(h))] == words[:200] + ["another"] + words[200:]
    assert col.view().tolist() == list(range(200)) + [-1] + list(range(200, 300))
    h.write_ahead(b"never numbered", np.array([5, 9]))
    col.write_ahead(np.arange(7))
    size, n = h.size, len(col)
    h.close()
    col.close()
    assert (tmp_path / "h").stat().st_size == size and (tmp_path / "c").stat().st_size == 8 * n


# the first group's strings, its ends, the second group's id hashes; the regrouping of the strings
@pytest.mark.parametrize("failing", [0, 2, 5, "fill"])
def test_a_write_ahead_that_fails_in_its_thread_leaves_the_shard_as_it_was(tmp_path, monkeypatch, failing):
    """A replay regroups a batch's strings and writes them and its columns ahead in a thread
    while it decodes the next: one of those writes fails (a full disk), or the regrouping does,
    so the batch's restore raises before any group stores a row of it, every file is cut back,
    and the batch restored again (as faust's recovery would) gives the shard a twin in memory has."""
    import errno
    import threading

    from streamdedup.index import file_array
    from streamdedup.pipeline import wire_kernels

    plan = ShardPlan(TableDesign.named("4"), 1)
    first, second = _changelog_rows(21, 300, plan), _changelog_rows(22, 300, plan)
    shard, twin = Shard(plan, str(tmp_path / "s")), Shard(plan)
    for s in (shard, twin):
        s.restore(first)
    before = (len(shard), _shard_files(tmp_path), _probe(shard, second))
    real, writes = file_array._write_ahead, []

    def full(fd: int, blob, at: int) -> None:
        assert threading.current_thread().name == "writes-ahead"
        writes.append(at)
        if len(writes) == failing + 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, blob, at)

    def broken(*args) -> None:
        assert threading.current_thread().name == "writes-ahead"
        raise OSError(errno.ENOMEM, "No space left for the kernel")

    if failing == "fill":
        monkeypatch.setattr(wire_kernels, "regroup_strings_into", broken)
    else:
        monkeypatch.setattr(file_array, "_write_ahead", full)
    groups, fill = second.by_group_later()
    assert fill is not None  # (the batch interleaves its groups: regrouped by the kernel)
    filled = shard.write_ahead(second, groups, fill)
    with pytest.raises(OSError, match="No space left"):
        shard.restore(second, groups, filled)
    assert (len(shard), _shard_files(tmp_path), _probe(shard, second)) == before
    monkeypatch.undo()
    for s in (shard, twin):
        s.restore(second)
    later = _changelog_rows(23, 200, plan)
    assert len(shard) == len(twin) and _probe(shard, later) == _probe(twin, later)
    assert _probe(shard, second) == _probe(twin, second)
    shard.close()


def test_a_snapshot_of_the_format_before_the_row_files_still_loads(tmp_path):
    """Snapshots written before the row columns moved to files kept them, and the strings' ends,
    in the snapshot (the string file's checksum covered its data alone): such a snapshot loads,
    its columns are written to the new files, and it answers as the shard it was taken from."""
    import xxhash

    from streamdedup.pipeline.snapshot_file import read_arrays, write_arrays

    plan = ShardPlan(TableDesign.named("16"), 1)
    fps, fetched, id_hash, ids = pages(17, 300)
    live = Shard(plan, str(tmp_path / "s"))
    answer_all(live, plan, fps[:200], fetched[:200], id_hash[:200], ids[:200])
    live.save(tmp_path / "new.shard", {"offset": 3})
    arrays, meta = read_arrays(tmp_path / "new.shard")
    for g, store in live._groups.items():  # the same state, as the earlier format wrote it
        heap = store.texts
        arrays[f"g{g}.text_ends"] = np.asarray(heap.ends()).copy()
        arrays[f"g{g}.text_check"] = np.array(xxhash.xxh64_intdigest(heap._digest()), dtype=np.uint64)
        del arrays[f"g{g}.text_count"]
        for name in ("fetched", "id_hash"):
            arrays[f"g{g}.{name}"] = np.asarray(getattr(store, name).view()).copy()
            del arrays[f"g{g}.{name}_check"]
    write_arrays(tmp_path / "old.shard", arrays, meta)
    expected = answer_all(live, plan, fps[200:], fetched[200:], id_hash[200:], ids[200:])
    live.close()
    for f in tmp_path.glob("s.g*.strings.*"):  # the earlier format had the string files only
        f.unlink()
    loaded, got_meta = Shard.load(tmp_path / "old.shard", plan, str(tmp_path / "s"))
    assert got_meta == {"offset": 3}
    assert answer_all(loaded, plan, fps[200:], fetched[200:], id_hash[200:], ids[200:]) == expected


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2)), max_size=150))
def test_first_occurrences_are_the_same_for_few_rows_and_many(rows):
    """A step of few probes pairs first occurrences in a dict, a big one with numpy: both give
    every row the position of the first row with its values (the shard's (id hash, fingerprint)
    pairs, the band table's (id hash, simhash, key) triples)."""
    from streamdedup.index import arrays

    for width in (2, 3):
        keys = [r[:width] for r in rows]
        cols = [np.array([k[c] for k in keys], dtype=np.uint64) for c in range(width)]
        expected = [keys.index(k) for k in keys]
        for few in (0, 1000):  # the numpy path, then the dict path
            old = arrays.FEW_ROWS
            arrays.FEW_ROWS = few
            try:
                first, inverse = arrays.first_occurrences(*cols)
            finally:
                arrays.FEW_ROWS = old
            assert first[inverse].tolist() == expected
            assert sorted(first.tolist()) == sorted(set(expected))
