"""LSH bands sharded by key (``--algorithm minhash`` / ``combined``): the order rule holds per
band as it does per simhash group, so of every candidate pair exactly one page is flagged,
whatever order each shard sees; band keys are pinned (they route stored state)."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from damage import HOW
from damage import damage as damage_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdedup.engine.dedup import Deduplicator
from streamdedup.index.bands import BandScheme, BandTable, tags
from streamdedup.pipeline.bands import BandPlan
from streamdedup.pipeline.shard import Shard
from streamdedup.pipeline.wire import CHANGELOG, Batch, decode, encode

SCHEMES = {v: BandScheme.for_threshold(0.8, 128, verify=v, k=3) for v in ("minhash", "combined")}


def hash_id(x: str) -> int:
    return xxhash.xxh3_64_intdigest(x.encode())


def test_band_keys_and_sketches_are_pinned():
    """Band keys decide which shard holds a page and what a changelog record means: never change them."""
    s = SCHEMES["minhash"]
    sig = np.arange(128, dtype=np.uint32)[None, :] * np.uint32(2654435761)
    keys = s.keys(sig)
    assert (s.bands, s.rows, s.sketch, s.sketch_bytes, s.min_matches) == (10, 5, 78, 39, 64)
    assert [f"{int(k):016x}" for k in keys[0, :3]] == ["fbb1d8406f5b6dc7", "14213ac3dd01521b", "58be0fc5c541bdbf"]
    low4 = [(v * 2654435761 % 2**32) & 0xF for v in range(50, 58)]  # the values after the 50 banded ones
    assert s.sketches(sig)[0, :4].tolist() == [low4[i] | low4[i + 1] << 4 for i in range(0, 8, 2)]
    keys2, sketch2 = s.split(s.extra(sig))
    assert (keys2 == keys).all() and (sketch2 == s.sketches(sig)).all()
    assert BandPlan(s, 8).describe() == [8, -1, 128, 10, 5, 800000, 0, 3, 4]
    assert BandPlan(SCHEMES["combined"], 8).describe() == [8, -1, 128, 10, 5, 800000, 1, 3, 4]


def test_for_threshold_makes_the_threshold_a_candidate_at_least_98_percent_of_the_time():
    from streamdedup.index.lsh import s_curve

    for t in (0.5, 0.7, 0.8, 0.9, 0.95):
        s = BandScheme.for_threshold(t, 128)
        assert s_curve(t, s.bands, s.rows) >= 0.98 and s.bands * s.rows <= 64
        assert s.similarity(s.min_matches) >= t > s.similarity(s.min_matches - 1)
    with pytest.raises(ValueError, match="no banding"):
        BandScheme.for_threshold(0.01, 128)


def twins(rng: np.random.Generator, scheme: BandScheme, n_pairs: int):
    """Isolated candidate pairs: b agrees with a on a random non-empty set of bands (so their
    canonical band can be any band), differs by one value in every other band, and passes the
    verifier (sketch within the threshold; simhash within k)."""
    m, start = scheme.sketch, scheme.bands * scheme.rows
    sigs, fps = [], []
    for _ in range(n_pairs):
        a = rng.integers(0, 2**32, size=scheme.num_perm, dtype=np.uint32)
        b = a.copy()
        same = rng.random(scheme.bands) < 0.3
        same[rng.integers(scheme.bands)] = True
        for j in np.flatnonzero(~same):
            b[j * scheme.rows + rng.integers(scheme.rows)] ^= np.uint32(1 + rng.integers(2**31))
        for i in rng.choice(m, size=int(rng.integers(0, m - scheme.min_matches + 1)), replace=False):
            b[start + i] ^= np.uint32(1 + rng.integers(15))  # a different low nibble
        fa = int(rng.integers(0, 2**63))
        fb = fa
        for bit in rng.choice(64, size=int(rng.integers(0, scheme.k + 1)), replace=False):
            fb ^= 1 << int(bit)
        sigs += [a, b]
        fps += [fa, fb]
    return np.array(sigs), np.array(fps, dtype=np.uint64)


def sharded(plan: BandPlan, sigs, fps, ids, orders, batch: int, files=None):
    """Each shard partition stores and answers its probes in ``orders[s]``, in batches; a page's
    match is the best answer over bands (lowest rank, then lowest band), as Pending keeps it.
    ``files``: a directory for the shards' row files (else in memory)."""
    extra = plan.scheme.extra(sigs)
    dest = plan.probes(fps, extra)
    id_hash = np.array([hash_id(x) for x in ids], dtype=np.uint64)
    shards = [Shard(plan, None if files is None else str(files / f"s{s}")) for s in range(plan.partitions)]
    best: list = [None] * len(fps)
    for s, order in enumerate(orders):
        order = np.array([i for i in order if (dest[i] == s).any()], dtype=np.int64)
        for at in range(0, len(order), batch):
            chunk = order[at : at + batch]
            page, band = np.nonzero(dest[chunk] == s)
            page = chunk[page]
            ans = shards[s].probe_and_insert(
                band, fps[page], np.zeros(len(page), np.int64), id_hash[page], [ids[i] for i in page],
                [f"u/{ids[i]}" for i in page], extra=extra[page],
            )  # fmt: skip
            for j, (i, g) in enumerate(zip(page.tolist(), band.tolist())):
                if ans.distance[j] >= 0:
                    cand = (int(ans.distance[j]), g, ans.ids[j])
                    best[i] = cand if best[i] is None or cand < best[i] else best[i]
    return best, shards


@pytest.mark.parametrize("verify", ["minhash", "combined"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), partitions=st.sampled_from([1, 2, 5]), batch=st.sampled_from([1, 6, 64]))
def test_of_every_candidate_pair_exactly_one_page_finds_the_other(verify, seed, partitions, batch):
    """Any order per shard, any batch size: one page of each pair is flagged, with its twin as
    the match, never both and never neither; and it is the page stored second in the pair's
    canonical band (the lowest band on which their keys agree)."""
    rng = np.random.default_rng(seed)
    scheme = SCHEMES[verify]
    plan = BandPlan(scheme, partitions)
    n = 20
    sigs, fps = twins(rng, scheme, n)
    ids = [f"{'ab'[i % 2]}{i // 2}" for i in range(2 * n)]
    orders = [rng.permutation(2 * n).tolist() for _ in range(partitions)]
    best, _ = sharded(plan, sigs, fps, ids, orders, batch)
    keys = scheme.keys(sigs)
    dest = plan.probes(fps, scheme.extra(sigs))
    for p in range(n):
        a, b = 2 * p, 2 * p + 1
        flagged = [i for i in (a, b) if best[i] is not None]
        assert len(flagged) == 1, (p, best[a], best[b])
        assert best[flagged[0]][2] == ids[a ^ b ^ flagged[0]]
        canonical = int(np.flatnonzero(keys[a] == keys[b])[0])
        assert best[flagged[0]][1] == canonical
        order = orders[int(dest[a, canonical])]
        assert order.index(flagged[0]) > order.index(a ^ b ^ flagged[0])  # stored second there


def test_a_replay_is_judged_at_its_first_position_and_stored_once():
    scheme = SCHEMES["minhash"]
    plan = BandPlan(scheme, 1)
    sigs, fps = twins(np.random.default_rng(3), scheme, 1)
    ids = ["a", "b"]
    # a, then b (flagged against a), then a again (a replay: judged where it was first stored)
    best, shards = sharded(plan, sigs[[0, 1, 0]], fps[[0, 1, 0]], ["a", "b", "a"], [[0, 1, 2]], batch=1)
    assert best[0] is None and best[1] is not None and best[1][2] == ids[0] and best[2] is None
    assert len(shards[0]) == 2 * scheme.bands  # the replay stored nothing


def test_checks_answer_without_storing():
    scheme = SCHEMES["minhash"]
    sigs, fps = twins(np.random.default_rng(4), scheme, 1)
    keys, sketch = scheme.split(scheme.extra(sigs))
    table = BandTable(scheme, 0)
    h = np.array([hash_id("a"), hash_id("b")], dtype=np.uint64)
    table.judge(keys[:1, 0], fps[:1], h[:1], sketch[:1], tags(keys[:1, :0]))
    looked = table.judge(keys[1:, 0], fps[1:], h[1:], sketch[1:], tags(keys[1:, :0]), insert=False)
    assert len(table) == 1 and not looked.new.any()
    assert (looked.rank[0] >= 0) == bool(keys[0, 0] == keys[1, 0])


def test_a_table_finds_candidates_by_the_tag_its_later_bands_compare():
    """Two keys with equal low 32 bits are one key to a table, as to the earlier-band tags of the
    rows of later bands (module doc): the rule's "agree on this band" is the same in both places."""
    scheme = SCHEMES["minhash"]
    sigs, fps = twins(np.random.default_rng(9), scheme, 1)
    _, sketch = scheme.split(scheme.extra(sigs))
    low = np.uint64(0x1234_5678)
    keys = np.array([(np.uint64(7) << np.uint64(32)) | low, (np.uint64(9) << np.uint64(32)) | low], np.uint64)
    h = np.array([hash_id("a"), hash_id("b")], dtype=np.uint64)
    table = BandTable(scheme, 1)
    earlier = np.array([[1], [2]], np.uint32)  # band 0 differs: band 1 is canonical
    found = table.judge(keys, fps, h, sketch, earlier)
    assert found.row.tolist() == [-1, 0] and tags(keys)[0] == tags(keys)[1]
    assert table.keys().dtype == np.uint32


@pytest.mark.parametrize("verify", ["minhash", "combined"])
def test_band_columns_in_files_answer_like_columns_in_memory_and_are_not_resident(tmp_path, verify):
    """With row files (the worker's way), only the band keys stay in memory; the simhash, id
    hash, earlier tags, sketch, id and URL of a row are read from files for the candidates."""
    rng = np.random.default_rng(21)
    scheme = SCHEMES[verify]
    plan = BandPlan(scheme, 2)
    sigs, fps = twins(rng, scheme, 150)
    ids = [f"{'ab'[i % 2]}{i // 2}" for i in range(300)]
    orders = [rng.permutation(300).tolist() for _ in range(2)]
    ram, ram_shards = sharded(plan, sigs, fps, ids, orders, 7)
    disk, disk_shards = sharded(plan, sigs, fps, ids, orders, 7, files=tmp_path)
    assert disk == ram and sum(b is not None for b in disk) == 150
    suffixes = {"", ".ends", ".fps", ".id_hash", ".sketch", ".tags"}
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {f"s{s}.g{g}.strings{x}" for s in range(2) for g in range(scheme.bands) for x in suffixes} - {
        f"s{s}.g0.strings.tags"
        for s in range(2)  # (band 0 has no earlier bands)
    }
    assert sum(sh.file_bytes for sh in disk_shards) == sum(p.stat().st_size for p in tmp_path.iterdir())
    rows = sum(len(sh) for sh in disk_shards)
    assert rows == sum(len(sh) for sh in ram_shards) > 0
    resident = sum(sh.nbytes for sh in disk_shards)
    # the keys' tags (4 bytes) and row numbers (4 bytes) of the sorted runs, and the unsorted tail's
    # tags (its buffer: up to 2 x 4096 of them a band)
    assert resident <= 8 * rows + sum(4 * 8192 * scheme.bands for _ in disk_shards)
    assert resident < sum(sh.nbytes for sh in ram_shards) / 4


@pytest.mark.parametrize("damage", HOW)
@pytest.mark.parametrize("suffix", [".fps", ".sketch", ".tags"])
def test_a_missing_damaged_or_foreign_band_file_is_refused(tmp_path, damage, suffix):
    scheme = SCHEMES["minhash"]
    plan = BandPlan(scheme, 1)
    sigs, fps = twins(np.random.default_rng(22), scheme, 40)
    ids = [f"p{i}" for i in range(80)]
    _, (shard,) = sharded(plan, sigs, fps, ids, [list(range(80))], 10, files=tmp_path)
    shard.save(tmp_path / "s.shard")
    shard.close()
    damage_file(tmp_path / f"s0.g3.strings{suffix}", damage)
    why = {"missing": "cannot open the column file", "short": "is shorter", "foreign": "does not hold"}[damage]
    with pytest.raises(ValueError, match=why):
        Shard.load(tmp_path / "s.shard", plan, str(tmp_path / "s0"))


@pytest.mark.parametrize("algorithm", ["minhash", "combined"])
@pytest.mark.parametrize("files", ["memory", "files", "memory snapshot into files"])
def test_a_snapshot_and_a_changelog_replay_rebuild_the_same_shard(tmp_path, algorithm, files):
    """What recovery does: a shard restored from its changelog rows, or loaded from its
    snapshot, answers a later probe exactly as the shard that stored the pages; with row files,
    and a snapshot of a shard in memory (as before row files) loaded into files."""
    scheme = SCHEMES[algorithm]
    plan = BandPlan(scheme, 1)
    rng = np.random.default_rng(5)
    sigs, fps = twins(rng, scheme, 30)
    extra = scheme.extra(sigs)
    ids = [f"p{i}" for i in range(60)]
    h = np.array([hash_id(x) for x in ids], dtype=np.uint64)
    band = np.tile(np.arange(scheme.bands), 30)
    first = np.repeat(np.arange(0, 60, 2), scheme.bands)  # the a pages, every band
    live = None if files == "memory" else str(tmp_path / "live")
    shard = Shard(plan, None if files != "files" else live)
    ans = shard.probe_and_insert(
        band, fps[first], np.zeros(len(first), np.int64), h[first], [ids[i] for i in first], [ids[i] for i in first],
        extra=extra[first],
    )  # fmt: skip
    stored = Batch.build(
        group=band, fps=fps[first], fetched=0, id_hash=h[first], ids=[ids[i] for i in first],
        urls=[ids[i] for i in first], extra=extra[first],
    ).select(ans.stored)  # fmt: skip
    replayed = Shard(plan, None if files == "memory" else str(tmp_path / "replayed"))
    replayed.restore(decode([encode(stored, CHANGELOG)], CHANGELOG))
    shard.save(tmp_path / "s.shard", {"offset": 1})
    loaded, meta = Shard.load(tmp_path / "s.shard", plan, live)
    assert meta == {"offset": 1}
    second = first + 1  # the b pages: each finds its a in its canonical band
    want = None
    for s in (shard, replayed, loaded):
        got = s.probe_and_insert(
            band, fps[second], np.zeros(len(second), np.int64), h[second], [ids[i] for i in second],
            [ids[i] for i in second], store=False, extra=extra[second],
        )  # fmt: skip
        summary = (got.distance.tolist(), got.ids)
        assert want is None or summary == want
        want = summary
    assert want is not None and sum(d >= 0 for d in want[0]) == 30  # one answer per pair
    with pytest.raises(ValueError, match="another shard plan"):
        Shard.load(tmp_path / "s.shard", BandPlan(BandScheme.for_threshold(0.9, 128), 1))


def test_scan_finds_a_near_duplicate_in_every_band_mode_and_reports_what_it_measured():
    words = [f"w{i}" for i in range(300)]
    rng = np.random.default_rng(1)
    a = [words[i] for i in rng.integers(0, 300, 400)]
    b = list(a)
    b[7] = "changed"  # one word of 400: resemblance of trigrams ~0.985
    texts = [" ".join(a), " ".join(b), " ".join(words[i] for i in rng.integers(0, 300, 400))]
    for algorithm in ("minhash", "combined"):
        v = Deduplicator(algorithm).process(["a", "b", "c"], ["a", "b", "c"], texts)
        assert [x.verdict for x in v] == ["unique", "near_duplicate", "unique"]
        assert v[1].match_id == "a"
        if algorithm == "minhash":
            assert v[1].similarity is not None and 0.9 <= v[1].similarity <= 1.0
        else:
            assert v[1].similarity is None and v[1].distance is not None and v[1].distance <= 3


def test_lookups_through_the_sorted_runs_equal_a_scan_of_every_key():
    """40,000 rows added in uneven batches (the tail sorted into mid, mid merged into base):
    every lookup finds exactly the rows with the probe's key, and the keys come back in row order."""
    scheme = SCHEMES["combined"]
    rng = np.random.default_rng(9)
    table = BandTable(scheme, 2)
    keys = rng.integers(0, 3000, 40_000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    at = 0
    while at < len(keys):
        n = int(rng.integers(1, 7000))
        chunk = keys[at : at + n]
        table.add(
            chunk,
            chunk,
            chunk,
            np.zeros((len(chunk), scheme.sketch_bytes), np.uint8),
            np.zeros((len(chunk), 2), np.uint32),
        )
        at += len(chunk)
        probes = keys[rng.integers(0, at, 50)]
        q, row = table.lookup(probes)
        got = sorted(zip(q.tolist(), row.tolist()))
        stored = tags(keys[:at])  # a table compares the keys' tags (their low 32 bits)
        want = sorted((i, r) for i, k in enumerate(tags(probes).tolist()) for r in np.flatnonzero(stored == k).tolist())
        assert got == want
    assert (table.keys() == tags(keys)).all()
    assert len(table) == len(keys)


def test_changelog_rows_of_another_plan_are_refused_before_any_is_stored():
    """A worker restarted with another --algorithm (or --threshold, --num-perm) under the same
    app id must not read the old shard rows into its index."""
    from streamdedup.errors import PlanError
    from streamdedup.index.tables import TableDesign
    from streamdedup.pipeline.shard import ShardPlan

    scheme = SCHEMES["minhash"]
    sigs, fps = twins(np.random.default_rng(6), scheme, 2)
    band_rows = Batch.build(
        group=np.arange(4),
        fps=fps,
        fetched=0,
        id_hash=fps,
        ids=list("abcd"),
        urls=list("abcd"),
        extra=scheme.extra(sigs),
    )
    simhash_rows = Batch.build(group=[3], fps=[1], fetched=0, id_hash=[1], ids=["a"], urls=["a"])
    simhash = Shard(ShardPlan(TableDesign.named("16"), 1))
    with pytest.raises(PlanError, match="another plan"):
        simhash.restore(band_rows)
    with pytest.raises(PlanError, match="another plan"):
        Shard(BandPlan(scheme, 1)).restore(simhash_rows)
    other = BandScheme.for_threshold(0.9, 128)
    with pytest.raises(PlanError, match="another plan"):
        Shard(BandPlan(other, 1)).restore(band_rows)
    assert len(simhash) == 0


def test_a_band_step_that_fails_after_the_table_took_its_rows_reports_them_stored(tmp_path, monkeypatch):
    """Out of memory in the verifier, after the band table took the batch's rows: the rows stay
    stored (a retry finds them) with their ids and urls, and the step reports them stored (so the
    worker owes them to the changelog); before, the strings were cut back under the table's rows
    and the rows were never written to the changelog."""
    from streamdedup.pipeline.shard import Answers

    scheme = SCHEMES["minhash"]
    plan = BandPlan(scheme, 1)
    sigs, fps = twins(np.random.default_rng(3), scheme, 1)
    extra = scheme.extra(sigs)
    page, band = np.nonzero(plan.probes(fps, extra)[[0]] == 0)
    n = len(page)
    args = (band, fps[page], np.zeros(n, np.int64), np.full(n, hash_id("a"), np.uint64), ["a"] * n, ["u/a"] * n)
    shard = Shard(plan, str(tmp_path / "s"))
    verify = BandScheme.matches
    failures = [MemoryError("verifier")]

    def out_of_memory(self, *a, **k):
        if failures:
            raise failures.pop()
        return verify(self, *a, **k)

    monkeypatch.setattr(BandScheme, "matches", out_of_memory)
    failed = Answers.empty(n)
    with pytest.raises(MemoryError):  # in the first band's group, after its table took the row
        shard.probe_and_insert(*args, extra=extra[page], out=failed)
    assert failed.stored.tolist() == [True] + [False] * (n - 1) and len(shard) == 1
    retry = shard.probe_and_insert(*args, extra=extra[page])
    assert retry.stored.tolist() == [False] + [True] * (n - 1)  # the first found stored
    for group in shard._groups.values():
        assert len(group.texts) == 2 * len(group.table)  # an id and a url for every row
    copy = shard.probe_and_insert(
        band,
        fps[page],
        np.zeros(n, np.int64),
        np.full(n, hash_id("b"), np.uint64),
        ["b"] * n,
        ["u/b"] * n,
        extra=extra[page],
    )
    matched = copy.distance >= 0  # (the pair's canonical band answers)
    assert matched.any() and {copy.ids[i] for i in np.flatnonzero(matched)} == {"a"}
    assert {copy.urls[i] for i in np.flatnonzero(matched)} == {"u/a"}
