"""--retention: pages older than the retention leave the shard's index and its changelog.

The shard stage runs as the worker runs it (``shard_step`` on encoded probes), its changelog is
kept as a list of (partition, key, value or None) records, and replays of that list, compacted
or not, from nothing or from a snapshot, must give the live shard's state and answers.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
from dataclasses import dataclass, field

import numpy as np
import pytest
import xxhash

from streamdedup.errors import SettingsError
from streamdedup.index.bands import BandScheme
from streamdedup.index.blocks import BlockIndex
from streamdedup.index.hamming import HammingIndex
from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.bands import BandPlan, BandStore
from streamdedup.pipeline.shard import Plan, Shard, ShardPlan, shard_step
from streamdedup.pipeline.wire import CHANGELOG, CHECKS, PROBES, Batch, decode, encode
from streamdedup.settings import Settings

R = 100_000  # the retention in these tests, ms
STEP = R // 64  # the cutoff's rounding
T0 = 10_000_000
PLAN = ShardPlan(TableDesign.named("4"), partitions=2)  # the worker's design


def hid(page_id: str) -> int:
    return xxhash.xxh3_64_intdigest(page_id.encode())


def near(fp: int, bits: int = 2, seed: int = 0) -> int:
    """``fp`` with ``bits`` bits flipped (a near-duplicate at k = 3)."""
    rng = np.random.default_rng(seed)
    for b in rng.choice(64, size=bits, replace=False).tolist():
        fp ^= 1 << b
    return fp


@dataclass
class Worker:
    """The shard stage of one worker over PLAN's partitions, with its changelog."""

    retention: int = R
    strings: str | None = None
    plan: Plan = PLAN
    shards: dict[int, Shard] = field(default_factory=dict)
    log: list[tuple[int, bytes, bytes | None]] = field(default_factory=list)
    seq: int = 0

    def shard(self, s: int) -> Shard:
        if s not in self.shards:
            prefix = None if self.strings is None else f"{self.strings}-{s}"
            self.shards[s] = Shard(self.plan, prefix, self.retention)
        return self.shards[s]

    def judge(self, pages: list[tuple], now: int | None = None, store: bool = True) -> list:
        """Pages (id, fingerprint, fetched[, MinHash signature: the band plans]) as one batch; for
        each, the id of its match or None."""
        fps = np.array([p[1] for p in pages], dtype=np.uint64)
        extra = None
        if isinstance(self.plan, BandPlan):
            extra = self.plan.scheme.extra(np.stack([p[3] for p in pages]))
        dest = self.plan.probes(fps, extra)
        kind = PROBES if store else CHECKS
        messages = []
        for s in range(self.plan.partitions):
            page, group = np.nonzero(dest == s)
            if len(page):
                batch = Batch.build(
                    group=group,
                    fps=fps[page],
                    fetched=[pages[i][2] for i in page],
                    id_hash=[hid(pages[i][0]) for i in page],
                    ids=[pages[i][0] for i in page],
                    urls=[f"http://site/{pages[i][0]}" for i in page],
                    request=page,
                    kind=kind,
                    extra=None if extra is None else extra[page],
                )
                messages.append((s, encode(batch, kind)))
        step = shard_step(self.shard, messages, now)
        for s, stored in step.changelog:  # as the worker writes them: one record a batch, a unique key
            self.seq += 1
            key = struct.pack("<I", s) + b"writer01" + struct.pack("<Q", self.seq)
            self.log.append((s, key, encode(stored, CHANGELOG)))
            self.shards[s].track(key, int(stored.fetched.max()))
        for s in sorted(step.shards):
            self.log += [(s, key, None) for key in self.shards[s].take_tombstones()]
        best: dict[int, tuple[int, str]] = {}
        for answers in step.answers.values():
            for r, d, i in zip(answers.rows["request"].tolist(), answers.rows["distance"].tolist(), answers.ids()):
                if d >= 0 and (int(r) not in best or (d, i) < best[int(r)]):
                    best[int(r)] = (d, i)
        return [best[i][1] if i in best else None for i in range(len(pages))]


def replay(log, start: dict[int, Shard] | None = None, compacted: bool = False, plan: Plan = PLAN) -> dict[int, Shard]:
    """Shards rebuilt from changelog records as the store's recovery does (``start``: the shards a
    snapshot gave); ``compacted``: as Kafka's compaction leaves the log (no record whose key has a
    tombstone, and no tombstone)."""
    gone = {key for _, key, value in log if value is None}
    shards = start if start is not None else {}
    for s, key, value in log:
        if compacted and key in gone:
            continue
        shard = shards.setdefault(s, Shard(plan, None, R))
        if value is None:
            shard.forget([key])
            continue
        rows = decode([value], CHANGELOG)
        shard.restore(rows)
        shard.track(key, int(rows.fetched.max()))
    return shards


def live_rows(shard: Shard) -> dict[int, list[tuple]]:
    """Per group, the live rows in store order: (fingerprint, fetched, id hash, id, url)."""
    out = {}
    for g, store in sorted(shard._groups.items()):
        if isinstance(store, BandStore):  # (no alive mask: rows before the cutoff are the dead ones)
            t = store.table
            assert t.times is not None
            keys = t.keys()
            out[g] = [
                (
                    int(keys[r]),
                    int(t.times.view()[r]),
                    int(t.id_hash.view()[r]),
                    store.texts[2 * r],
                    store.texts[2 * r + 1],
                )
                for r in np.flatnonzero(t.times.view() >= shard.cutoff).tolist()
            ]
            continue
        alive = store.index.alive_rows()
        fps, fetched, ids = store.index.fingerprints(), store.fetched.view(), store.id_hash.view()
        out[g] = [
            (int(fps[r]), int(fetched[r]), int(ids[r]), store.texts[2 * r], store.texts[2 * r + 1])
            for r in np.flatnonzero(alive).tolist()
        ]
    return {g: rows for g, rows in out.items() if rows}


def state(shards: dict[int, Shard]) -> dict:
    return {s: (live_rows(sh), sh.clock) for s, sh in sorted(shards.items()) if live_rows(sh)}


def crawl(seed: int, batches: int = 30, per_batch: int = 40) -> tuple[Worker, list]:
    """A crawl whose clock moves about R / 8 a batch, with near-duplicates of earlier pages
    (some old enough to have expired), re-crawls of earlier ids, late pages and one page from a
    crawler whose clock is a century ahead."""
    rng = np.random.default_rng(seed)
    w = Worker()
    seen: list[tuple[str, int, int]] = []
    verdicts = []
    for b in range(batches):
        now = T0 + b * (R // 8)
        pages = []
        for i in range(per_batch):
            fetched = now - int(rng.integers(0, R // 4))
            roll = rng.random()
            if seen and roll < 0.3:  # a near-duplicate of an earlier page, under a new id
                _, fp, _ = seen[int(rng.integers(0, len(seen)))]
                pages.append((f"b{b}-{i}", near(fp, int(rng.integers(0, 4)), b * 1000 + i), fetched))
            elif seen and roll < 0.45:  # a re-crawl of an earlier id, same content
                pid, fp, _ = seen[int(rng.integers(0, len(seen)))]
                pages.append((pid, fp, fetched))
            else:
                pages.append((f"b{b}-{i}", int(rng.integers(0, 2**63)) * 2 + 1, fetched))
        if b == batches // 2:
            pages.append((f"future-{b}", int(rng.integers(0, 2**63)), T0 + 100 * 365 * 86_400_000))
        verdicts.append(w.judge(pages, now=now))
        seen += pages
    return w, verdicts


# ---------------------------------------------------------------------------- the index


def test_an_expired_page_no_longer_matches_and_a_copy_of_a_live_one_does():
    w = Worker()
    a, live = 0x0123_4567_89AB_CDEF, 0x7EDC_BA98_7654_3210
    assert w.judge([("a", a, T0), ("live", live, T0 + R // 2)]) == [None, None]
    later = T0 + R + 2 * STEP  # a is older than the retention by then, "live" is not
    assert w.judge([("a-copy", near(a), later), ("live-copy", near(live), later)]) == [None, "live"]
    # the copy of the expired page was stored anew: a copy of it matches it, not the expired page
    assert w.judge([("a-copy-2", near(a, 1, 9), later + 1)]) == ["a-copy"]
    assert all(fp != a for rows in state(w.shards).values() for group in rows[0].values() for fp, *_ in group)


def test_a_recrawl_of_an_expired_page_is_stored_again_under_its_new_time():
    w = Worker()
    fp = 0x1111_2222_3333_4444
    w.judge([("p", fp, T0)])
    stored = len(w.log)
    assert w.judge([("p", fp, T0 + R // 4)]) == [None]  # an unchanged re-fetch: not stored again
    assert len(w.log) == stored
    w.judge([("p", fp, T0 + R // 2)])  # its copy is half the retention old: stored again, so it lives on
    assert len(w.log) > stored
    rng = np.random.default_rng(0)  # other pages move every partition's clock past the first copy
    w.judge([(f"other{i}", int(x), T0 + R + 2 * STEP) for i, x in enumerate(rng.integers(0, 2**63, size=20))])
    assert w.judge([("p-copy", near(fp), T0 + R + 3 * STEP)]) == ["p"]  # the renewed copy still matches
    times = {
        fetched for _, (rows, _) in state(w.shards).items() for g in rows.values() for f, fetched, *_ in g if f == fp
    }
    assert times == {T0 + R // 2}


def test_a_batch_delivered_again_stores_nothing_and_gets_the_same_answers():
    w, _ = crawl(6, batches=12)
    rng = np.random.default_rng(2)
    t = max(sh.clock for sh in w.shards.values())
    pages = [(f"again{i}", int(x), t - int(rng.integers(0, R))) for i, x in enumerate(rng.integers(0, 2**63, 30))]
    pages += [(f"again-n{i}", near(p[1]), p[2]) for i, p in enumerate(pages[:10])]
    first = w.judge(pages, now=t)
    records = len(w.log)
    assert w.judge(pages, now=t) == first  # (after a SIGKILL: the same pages, the same fetch times)
    assert len(w.log) == records


def test_a_page_from_a_clock_in_the_future_does_not_expire_the_index():
    w = Worker()
    fp = 0x0F0F_0F0F_0F0F_0F0F
    w.judge([("p", fp, T0)], now=T0)
    w.judge([("wrong-clock", 0x1234, T0 + 10 * R)], now=T0 + 1)  # the clock moves to now at most
    assert w.judge([("p-copy", near(fp), T0 + 2)], now=T0 + 2) == ["p"]
    assert all(sh.clock <= T0 + 2 for sh in w.shards.values())


def test_compaction_returns_the_memory_of_expired_pages():
    w = Worker()
    rng = np.random.default_rng(5)
    peak, sizes = 0, []
    for b in range(80):  # the clock moves R / 8 a batch: about 8 batches are live at any time
        t = T0 + b * (R // 8)
        w.judge([(f"{b}-{i}", int(x), t) for i, x in enumerate(rng.integers(0, 2**63, size=200))], now=t)
        nbytes = sum(sh.nbytes for sh in w.shards.values())
        peak = max(peak, nbytes)
        sizes.append(nbytes)
        rows = sum(store.rows() for sh in w.shards.values() for store in sh._groups.values())
        live = sum(len(sh) for sh in w.shards.values())
        assert 3 * rows <= 4 * (live + 4 * 200)  # compacted once a quarter are dead (plus the batch just stored)
    assert sum(len(sh) for sh in w.shards.values()) <= 4 * 200 * 10
    assert max(sizes[40:]) <= max(sizes[:20]) * 1.5  # bounded: no growth with the crawl's length


def test_compaction_cuts_the_row_files_of_expired_pages(tmp_path):
    """With the rows in files, compaction rewrites them: the bytes on disk (the
    streamdedup_shard_file_bytes gauge, equal to the files' sizes) stay bounded too."""
    w = Worker(strings=str(tmp_path / "s"))
    rng = np.random.default_rng(6)
    sizes = []
    for b in range(60):
        t = T0 + b * (R // 8)
        w.judge([(f"{b}-{i}", int(x), t) for i, x in enumerate(rng.integers(0, 2**63, size=200))], now=t)
        on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
        assert sum(sh.file_bytes for sh in w.shards.values()) == on_disk
        sizes.append(on_disk)
    assert max(sizes[40:]) <= max(sizes[:20]) * 1.5 and sizes[-1] > 0


def test_an_index_that_keeps_some_rows_answers_as_one_built_from_them():
    rng = np.random.default_rng(11)
    fps = rng.integers(0, 2**64 - 1, 3000, dtype=np.uint64, endpoint=True)
    fps[1000:1200] = fps[:200] ^ np.uint64(0b101)  # neighbours
    index = HammingIndex(k=3, design="16")
    for at in range(0, 3000, 300):  # several runs
        index.add_many(range(at, at + 300), fps[at : at + 300])
    keep = np.sort(rng.choice(3000, 1700, replace=False))
    index.remove_rows(np.setdiff1d(np.arange(3000), keep))
    index.keep_rows(keep)
    fresh = HammingIndex(k=3, design="16")
    fresh.add_many(range(len(keep)), fps[keep])
    queries = np.concatenate((fps[:300], fps[1000:1100] ^ np.uint64(1)))
    got, want = index.search(queries), fresh.search(queries)
    assert len(want.row) > 300
    assert (got.query == want.query).all() and (got.row == want.row).all() and (got.distance == want.distance).all()
    assert len(index) == len(keep) and index.fingerprints().tolist() == fps[keep].tolist()
    index.add_many(range(len(keep), len(keep) + 10), fps[:10])  # ids are still the row numbers
    assert (len(keep), 0) in index.query(int(fps[0]))


def _fail_once(monkeypatch, target: str) -> list[str]:
    """The next compaction write into a file named ``*<target>.compacting`` finds the disk full
    (``target`` "index": the index runs out of memory renumbering its rows instead); returns the
    failures seen."""
    seen: list[str] = []
    if target == "index":

        def keep_rows(self, rows):
            seen.append("index")
            raise MemoryError("the test's")

        monkeypatch.setattr(BlockIndex, "keep_rows", keep_rows)
        return seen
    real = os.pwrite

    def pwrite(fd: int, data, at: int) -> int:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith(target + ".compacting"):
            seen.append(name)
            raise OSError(errno.ENOSPC, "No space left on device (the test's)")
        return real(fd, data, at)

    monkeypatch.setattr(os, "pwrite", pwrite)
    return seen


COMPACTION_FAULTS = [("simhash", t) for t in (".strings", ".ends", ".fetched", ".idhash", "index")] + [
    ("minhash", t) for t in (".strings", ".fps", ".sketch", ".id_hash", ".fetched")
]


@pytest.mark.parametrize(("mode", "target"), COMPACTION_FAULTS)
def test_a_compaction_that_fails_midway_leaves_the_shard_as_it_was_and_is_done_on_the_retry(
    tmp_path, monkeypatch, mode, target
):
    """A compaction rewrites several files (the strings, their ends, the row columns) and renumbers
    the index.  One that fails after some were rewritten left the others behind: ids and URLs
    no longer matched their fingerprints (answers named other pages, or raised).  Now the
    shard is as it was, answers with the right pages, and the step's retry compacts it."""
    plan = PLAN if mode == "simhash" else BAND_PLANS["minhash"]
    ref, w = Worker(strings=str(tmp_path / "ref"), plan=plan), Worker(strings=str(tmp_path / "w"), plan=plan)
    rng = np.random.default_rng(21)
    failures: list[str] = []
    prev: list[tuple] = []
    for b in range(24):
        t = T0 + b * (R // 8)
        pages: list[tuple] = [
            (f"{b}-{i}", int(x), t, signature(b * 1000 + i)) for i, x in enumerate(rng.integers(0, 2**63, size=60))
        ]
        pages += [(f"{b}-copy-{i}", near(p[1], 2, i), t, band_near(p[3], i)) for i, p in enumerate(prev[:10])]
        prev = pages
        want = ref.judge(pages, now=t)
        if not failures:
            with monkeypatch.context() as m:
                seen = _fail_once(m, target)
                try:
                    got = w.judge(pages, now=t)
                except (OSError, MemoryError):
                    failures = seen
            if failures:
                # each live page of the batches before still answers as itself (the failed step's
                # own pages may not all be stored: the shards after the failing one were not reached)
                earlier = [r for rows in live_rows(ref.shards[0]).values() for r in rows if r[1] < t]
                for fp, _, _, page_id, _ in earlier[:: max(1, len(earlier) // 40)]:
                    if mode == "simhash":  # (the band modes are checked by the retry's answers)
                        assert w.judge([(f"check-{page_id}", fp, t)], now=t, store=False) == [page_id]
                assert not list(tmp_path.glob("w*.compacting"))
                got = w.judge(pages, now=t)  # the step again (the worker retries it)
        else:
            got = w.judge(pages, now=t)
        assert got == want, b
    assert failures, "no compaction ran into the fault"
    assert any(sh.compacted for sh in w.shards.values())
    assert state(w.shards) == state(ref.shards)
    assert not list(tmp_path.glob("*.compacting"))


# ---------------------------------------------------------------------------- the changelog


def test_the_live_pages_answer_as_a_shard_that_only_ever_stored_them_in_their_order():
    """The order rule among live rows survives expiry and compaction: a shard without retention
    that stored just the live rows, in their order, gives every answer the same."""
    w, _ = crawl(4)
    assert any(sh.compacted for sh in w.shards.values())
    only_live = Worker(retention=0)
    for s, (groups, _) in state(w.shards).items():
        for g, rows in groups.items():
            only_live.shard(s).restore(
                Batch.build(
                    group=g,
                    fps=[r[0] for r in rows],
                    fetched=[r[1] for r in rows],
                    id_hash=[r[2] for r in rows],
                    ids=[r[3] or r[4] for r in rows],
                    urls=[r[4] for r in rows],
                )
            )
    t = min(sh.clock for sh in w.shards.values())  # (no probe moves a shard's cutoff)
    rng = np.random.default_rng(12)
    probes = []
    for _, (groups, _) in state(w.shards).items():
        for rows in groups.values():
            for fp, _, _, id_text, url in rows[:: max(1, len(rows) // 15)]:
                probes.append((f"q{len(probes)}", near(fp, int(rng.integers(0, 4)), len(probes)), t))
                probes.append((id_text or url.rsplit("/", 1)[1], fp, t))  # a stored page itself, again
    answers = w.judge(probes, now=t, store=False)
    assert sum(a is not None for a in answers) > len(probes) // 4
    assert answers == only_live.judge(probes, now=t, store=False)


def test_tombstones_delete_only_records_whose_rows_have_all_expired():
    w, _ = crawl(1)
    tombstoned = {key for _, key, value in w.log if value is None}
    assert tombstoned  # the crawl is long enough for records to expire
    live = {(s, row[0], row[1], row[2]) for s, (rows, _) in state(w.shards).items() for g in rows.values() for row in g}
    for s, key, value in w.log:
        if value is not None and key in tombstoned:
            rows = decode([value], CHANGELOG)
            assert all(int(f) < w.shards[s].cutoff for f in rows.fetched)
            assert not any(
                (s, int(fp), int(f), int(h)) in live for fp, f, h in zip(rows.fps, rows.fetched, rows.id_hash)
            )
    kept = [(s, key) for s, key, value in w.log if value is not None and key not in tombstoned]
    assert len(kept) < len([1 for _, _, value in w.log if value is not None])


@pytest.mark.parametrize("compacted", [False, True])
def test_a_replay_of_the_changelog_gives_the_live_state_and_answers(compacted):
    w, _ = crawl(2)
    rebuilt = replay(w.log, compacted=compacted)
    assert state(rebuilt) == state(w.shards)
    again = Worker(shards=rebuilt)
    rng = np.random.default_rng(7)
    t = max(sh.clock for sh in w.shards.values())
    probes = []
    for s, (rows, _) in state(w.shards).items():  # copies of live pages, and checks of random ones
        for g in rows.values():
            for fp, *_ in g[:: max(1, len(g) // 10)]:
                probes.append((f"q{len(probes)}", near(fp, 2, len(probes)), t))
    probes += [(f"r{i}", int(x), t) for i, x in enumerate(rng.integers(0, 2**63, size=20))]
    assert any(w.judge(probes, now=t, store=False))
    assert w.judge(probes, now=t, store=False) == again.judge(probes, now=t, store=False)
    assert w.judge(probes, now=t) == again.judge(probes, now=t)


def test_a_snapshot_and_the_changelog_after_it_give_the_live_state(tmp_path):
    w = Worker(strings=str(tmp_path / "live"))
    rng = np.random.default_rng(3)
    snaps, offset = {}, 0
    for b in range(40):
        t = T0 + b * (R // 8)
        fps = rng.integers(0, 2**63, size=60)
        pages = [(f"{b}-{i}", int(x), t) for i, x in enumerate(fps)]
        pages += [(f"{b}-c{i}", near(int(x)), t) for i, x in enumerate(fps[:10])]
        w.judge(pages, now=t)
        if b == 25:  # the snapshots, and a copy of the string files as they are then
            for s, sh in w.shards.items():
                sh.save(tmp_path / f"{s}.shard", {"offset": len(w.log)})
            for f in tmp_path.glob("live-*.strings*"):
                shutil.copy(f, tmp_path / f.name.replace("live", "snap"))
            offset = len(w.log)
    assert any(value is None for _, _, value in w.log[:offset])  # records expired before the snapshot
    assert any(sh.compacted for sh in w.shards.values())  # string files were rewritten
    for s in w.shards:
        snaps[s], meta = Shard.load(tmp_path / f"{s}.shard", PLAN, str(tmp_path / f"snap-{s}"), R)
        assert meta["offset"] == offset
    assert state(replay(w.log[offset:], start=snaps)) == state(w.shards)


def test_a_snapshot_loaded_with_a_shorter_retention_expires_at_once(tmp_path):
    w = Worker()
    new = [(f"new{i}", int(x), T0 + R // 2) for i, x in enumerate(np.random.default_rng(1).integers(0, 2**63, 20))]
    w.judge([("old", 0xAAAA_0000_0000_0001, T0), *new], now=T0 + R // 2)  # (the new pages reach every partition)
    for s, sh in w.shards.items():
        sh.save(tmp_path / f"{s}.shard")
    same = [Shard.load(tmp_path / f"{s}.shard", PLAN, None, R)[0] for s in w.shards]
    shorter = [Shard.load(tmp_path / f"{s}.shard", PLAN, None, R // 4)[0] for s in w.shards]
    ids = {row[2] for sh in same for rows in live_rows(sh).values() for row in rows}
    assert ids == {hid(p[0]) for p in new} | {hid("old")}
    ids = {row[2] for sh in shorter for rows in live_rows(sh).values() for row in rows}
    assert ids == {hid(p[0]) for p in new}


def test_a_retention_longer_than_the_crawl_changes_no_verdict():
    rng = np.random.default_rng(4)
    forever, long = Worker(retention=0), Worker(retention=1000 * R)
    seen: list[tuple[str, int, int]] = []
    for b in range(20):
        t = T0 + b * R
        pages = [(f"{b}-{i}", int(x), t) for i, x in enumerate(rng.integers(0, 2**63, 20))]
        pages += [(f"{b}-n{i}", near(p[1], 2, i), t) for i, p in enumerate(seen[-10:])]
        pages += [(p[0], p[1], t) for p in seen[:3]]  # re-crawls
        assert forever.judge(pages, now=t) == long.judge(pages, now=t)
        seen += pages
    assert state(forever.shards) == state(long.shards)
    assert [v for _, _, v in long.log if v is None] == []


def test_without_a_retention_nothing_expires_and_nothing_is_tracked():
    w = Worker(retention=0)
    w.judge([("a", 0x42, T0)])
    w.judge([("b", near(0x42), T0 + 100 * R)])
    assert [v for _, _, v in w.log if v is None] == []
    assert w.judge([("c", near(0x42, 1, 3), T0 + 200 * R)]) == ["a"]


# ---------------------------------------------------------------------------- the setting


@pytest.mark.parametrize(
    "text, seconds",
    [("90d", 90 * 86400), ("12h", 43200), ("3600s", 3600), ("3600", 3600), ("30m", 1800), ("2w", 1209600)]
    + [("0", 0), ("none", 0), (" None ", 0), ("1.5h", 5400)],
)
def test_retention_takes_a_duration(text, seconds):
    assert Settings.from_sources({"retention": text}, {}).retention == seconds
    assert Settings.from_sources({}, {"STREAMDEDUP_RETENTION": text}).retention == seconds


@pytest.mark.parametrize("text", ["90x", "d", "-3d", "ninety days", "0.1s"])
def test_a_bad_retention_says_how_to_write_one(text):
    with pytest.raises(SettingsError, match=r"--retention / STREAMDEDUP_RETENTION: .*such as 90d"):
        Settings.from_sources({"retention": text}, {})


def test_retention_is_taken_by_every_algorithm():
    for algorithm in ("simhash", "minhash", "combined"):
        assert Settings.from_sources({"retention": "90d", "algorithm": algorithm}, {}).retention == 90 * 86400


def test_the_worker_command_refuses_a_bad_retention_with_a_fix():
    from click.testing import CliRunner

    from streamdedup.cli import main

    result = CliRunner().invoke(main, ["worker", "--retention", "3 months"])
    assert result.exit_code == 2, result.output
    assert "--retention / STREAMDEDUP_RETENTION: '3 months' is not a duration" in " ".join(result.output.split())
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------------- the band modes

BAND_PLANS = {
    verify: BandPlan(BandScheme.for_threshold(0.8, 64, verify=verify, k=10), partitions=2)
    for verify in ("minhash", "combined")
}


def signature(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, 64, dtype=np.uint32)


def band_near(sig: np.ndarray, seed: int, changed: int = 3) -> np.ndarray:
    """A signature of a near-duplicate: a few values changed (the simhash is kept)."""
    out = sig.copy()
    rng = np.random.default_rng(seed)
    out[rng.choice(len(sig), changed, replace=False)] = rng.integers(0, 2**32, changed, dtype=np.uint32)
    return out


@pytest.mark.parametrize("verify", BAND_PLANS)
def test_band_modes_expire_pages_too(verify):
    w = Worker(plan=BAND_PLANS[verify])
    a, live = signature(1), signature(2)
    assert w.judge([("a", 0xA, T0, a), ("live", 0xB, T0 + R // 2, live)]) == [None, None]
    later = T0 + R + 2 * STEP
    got = w.judge([("a-copy", 0xA, later, band_near(a, 3)), ("live-copy", 0xB, later, band_near(live, 4))])
    assert got == [None, "live"]
    assert w.judge([("a-copy-2", 0xA, later + 1, band_near(a, 5))]) == ["a-copy"]
    w.judge([("a", 0xA, T0 + R // 2 + 1, a)])  # a re-crawl of a (its first copy is gone): stored anew
    times = {row[1] for rows, _ in state(w.shards).values() for g in rows.values() for row in g if row[2] == hid("a")}
    assert times == {T0 + R // 2 + 1}


def band_crawl(plan: BandPlan, seed: int, batches: int = 24, per_batch: int = 30) -> Worker:
    rng = np.random.default_rng(seed)
    w = Worker(plan=plan)
    seen: list[tuple] = []
    for b in range(batches):
        now = T0 + b * (R // 8)
        pages: list[tuple] = []
        for i in range(per_batch):
            fetched, roll = now - int(rng.integers(0, R // 4)), rng.random()
            if seen and roll < 0.35:
                pid, fp, _, sig = seen[int(rng.integers(0, len(seen)))]
                pages.append((f"b{b}-{i}", fp, fetched, band_near(sig, b * 100 + i, int(rng.integers(0, 4)))))
            elif seen and roll < 0.5:
                pages.append((*seen[int(rng.integers(0, len(seen)))][:2], fetched, seen[-1][3]))
            else:
                pages.append((f"b{b}-{i}", int(rng.integers(0, 2**63)), fetched, signature(b * 1000 + i)))
        w.judge(pages, now=now)
        seen += pages
    return w


@pytest.mark.parametrize("verify", BAND_PLANS)
@pytest.mark.parametrize("compacted", [False, True])
def test_band_modes_replay_the_changelog_to_the_live_state(verify, compacted):
    plan = BAND_PLANS[verify]
    w = band_crawl(plan, 8)
    assert any(v is None for _, _, v in w.log)
    assert any(sh.compacted for sh in w.shards.values())
    assert state(replay(w.log, compacted=compacted, plan=plan)) == state(w.shards)


def test_a_band_snapshot_without_fetch_times_is_refused_under_a_retention(tmp_path):
    plan = BAND_PLANS["minhash"]
    w = Worker(plan=plan, retention=0)
    w.judge([("a", 0xA, T0, signature(1))])
    for s, sh in w.shards.items():
        sh.save(tmp_path / f"{s}.shard")
        assert len(Shard.load(tmp_path / f"{s}.shard", plan, None, 0)[0]) > 0  # (fine without one)
        with pytest.raises(ValueError, match="without their fetch times"):
            Shard.load(tmp_path / f"{s}.shard", plan, None, R)


@pytest.mark.parametrize("plan", [PLAN, BAND_PLANS["minhash"]], ids=["simhash", "minhash"])
def test_a_page_older_than_the_cutoff_is_judged_but_not_stored(plan):
    w = Worker(plan=plan)
    sig = signature(3)
    rng = np.random.default_rng(9)  # (other pages move every partition's clock)
    w.judge(
        [("live", 0xC0FFEE, T0 + R, sig)]
        + [(f"o{i}", int(rng.integers(0, 2**63)), T0 + R, signature(50 + i)) for i in range(20)]
    )
    records = len(w.log)
    late = T0 - 2 * STEP  # behind the cutoff the live page's time gives the clock
    assert w.judge([("late", 0xC0FFEE ^ 1, late, band_near(sig, 1))]) == ["live"]
    assert w.judge([("late", 0xC0FFEE ^ 1, late, band_near(sig, 1))]) == ["live"]  # delivered again
    assert len(w.log) == records  # nothing stored, nothing written
    assert w.judge([("late-copy", 0xC0FFEE ^ 1, late + 1, band_near(sig, 1))]) == ["live"]  # "late" is not there
