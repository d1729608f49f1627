"""The worker's first stage: bad records become dead letters with their reason, good pages wait
in offset order and send one probe per table group to the right shard partition; and the whole
pure pipeline (intake -> shards -> answers -> pending) gives the embedded engine's verdicts."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdedup.engine.dedup import Deduplicator
from streamdedup.errors import RecordError
from streamdedup.fingerprinting.pages import fingerprint
from streamdedup.index.bands import DEFAULT_NUM_PERM, BandScheme
from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.bands import BandPlan
from streamdedup.pipeline.intake import Intake, Record, fetched_ms, id_hash, parse
from streamdedup.pipeline.pending import Pending
from streamdedup.pipeline.routing import verdict_record
from streamdedup.pipeline.shard import Shard, ShardPlan, shard_step
from streamdedup.pipeline.wire import ANSWERS, PROBES, Batch, decode, encode

PLAN = ShardPlan(TableDesign.named("16"), partitions=5)
MAX = 2000


def rec(partition, offset, value, key=b"k", timestamp_ms=None, headers=()) -> Record:
    if isinstance(value, dict):
        value = json.dumps(value).encode()
    return Record(partition, offset, key, value, headers, timestamp_ms)


def read(records, pending=None):
    pending = Pending(PLAN.n_groups) if pending is None else pending
    return Intake.read(records, pending, PLAN, MAX), pending


def answer_every_probe(pending: Pending, intake: Intake) -> None:
    """Answer 'no match' to every probe (as the shards would for a first page)."""
    probes = Batch.concat(list(intake.probes.values()))
    probes.rows["distance"] = -1
    probes.strings, probes.rows["id_len"], probes.rows["url_len"] = b"", 0, 0
    pending.answer(decode([encode(probes, ANSWERS)], ANSWERS))


GOOD = {"url": "http://a/", "content": "<p>some words on a page</p>"}


@pytest.mark.parametrize(
    "value, reason",
    [
        (b"{not json", "not_json"),
        (b'{"url": "http://a/\xff", "content": "x"}', "not_utf8"),
        ({"url": "http://a/"}, "missing_field"),
        ({"content": "text"}, "missing_field"),
        ({"url": "http://a/", "content": 7}, "bad_field"),
        ({**GOOD, "fetched_at": "yesterday"}, "bad_field"),
        ({**GOOD, "fetched_at": 1714564800}, "bad_field"),
        (b"   ", "empty"),
        ({"url": "http://a/", "content": "  "}, "empty"),
        ({"url": "http://a/", "content": "x" * MAX}, "too_large"),
        ({"url": "http://a/", "content": "\x00\x01\x02\x03\x04" * 40}, "binary"),
        ({**GOOD, "content_type": "image/png"}, "not_text"),
        (b"[1, 2]", "not_object"),
        (None, "empty"),  # a tombstone
    ],
)
def test_a_bad_record_is_a_dead_letter_with_its_reason(value, reason):
    headers = [("trace", b"1")]
    intake, pending = read([rec(3, 7, value, key=b"key-7", headers=headers)])
    assert intake.probes == {} and intake.pages == 0 and intake.bad == {reason: 1} and intake.partitions == {3}
    [w] = pending.ready(3)  # done at once
    assert (w.offset, w.reason, w.key, w.headers, w.verdict) == (7, reason, b"key-7", headers, None)
    assert w.value == (value if isinstance(value, bytes) else b"" if value is None else json.dumps(value).encode())
    assert w.error


def test_a_good_page_sends_one_probe_per_group_to_the_shard_that_owns_it():
    pages = [
        rec(
            0,
            10,
            {"url": "http://a/1", "content": "<p>alpha beta gamma delta</p>", "fetched_at": "2024-05-01T12:00:00Z"},
        ),
        rec(2, 4, {"id": "doc-2", "url": "http://a/2", "content": "epsilon zeta eta theta iota"}, timestamp_ms=77),
    ]
    intake, pending = read(pages)
    assert intake.pages == 2 and intake.bad == {} and intake.partitions == {0, 2}
    rows = []
    for s, batch in intake.probes.items():
        assert batch.kind == PROBES and len(batch)
        rows += [
            (s, *r)
            for r in zip(
                batch.group.tolist(),
                batch.fps.tolist(),
                batch.fetched.tolist(),
                batch.id_hash.tolist(),
                batch.rows["request"].tolist(),
                batch.rows["partition"].tolist(),
                batch.ids(),
                batch.urls(),
            )
        ]
    assert len(rows) == 2 * PLAN.n_groups == 8  # 4 groups for the default 16-table design
    expected = [
        ("http://a/1", "http://a/1", 0, 1714564800000, "<p>alpha beta gamma delta</p>"),
        ("doc-2", "http://a/2", 2, 77, "epsilon zeta eta theta iota"),
    ]
    requests = set()
    for page_id, url, partition, fetched, content in expected:
        fp = fingerprint(content, None)
        mine = sorted((r for r in rows if r[7] == page_id), key=lambda r: r[1])
        assert [r[1] for r in mine] == [0, 1, 2, 3]
        dest = PLAN.probes(np.array([fp], dtype=np.uint64))[0]
        assert [r[0] for r in mine] == dest.tolist()  # each group's probe goes to the partition owning it
        assert {r[2:5] + (r[6], r[8]) for r in mine} == {(fp, fetched, id_hash(page_id), partition, url)}
        assert len({r[4] for r in mine}) == 1
        requests.add(mine[0][4])
    assert len(requests) == 2
    answer_every_probe(pending, intake)  # the probes' request ids are the waiting pages' ones
    assert [(w.offset, w.page_id, w.verdict) for w in pending.ready(0)] == [(10, "http://a/1", "unique")]
    assert [(w.offset, w.page_id, w.fingerprint) for w in pending.ready(2)] == [
        (4, "doc-2", fingerprint(expected[1][4], None))
    ]


def test_fetched_at_falls_back_to_the_kafka_timestamp():
    intake, _ = read(
        [
            rec(0, 0, {**GOOD, "fetched_at": "2024-05-01T12:00:00+02:00"}, timestamp_ms=5),
            rec(0, 1, GOOD, timestamp_ms=6),
            rec(0, 2, {**GOOD, "fetched_at": " "}, timestamp_ms=7),
            rec(0, 3, GOOD, timestamp_ms=None),
        ]
    )
    probes = Batch.concat(list(intake.probes.values()))
    by_request = {}
    for req, f in zip(probes.rows["request"].tolist(), probes.fetched.tolist()):
        by_request.setdefault(req, set()).add(f)
    assert sorted(min(v) for v in by_request.values()) == [0, 6, 7, 1714557600000]
    assert all(len(v) == 1 for v in by_request.values())


def test_records_wait_in_offset_order_with_dead_letters_in_their_place():
    records = [rec(1, 0, GOOD), rec(1, 1, b"nope"), rec(1, 2, {**GOOD, "url": "http://b/"}), rec(1, 3, None)]
    intake, pending = read(records)
    assert intake.pages == 2 and intake.bad == {"not_json": 1, "empty": 1}
    assert pending.ready(1) == []  # the dead letter at 1 waits behind the page at 0
    answer_every_probe(pending, intake)
    assert [(w.offset, w.reason) for w in pending.ready(1)] == [(0, None), (1, "not_json"), (2, None), (3, "empty")]


def test_a_record_redelivered_while_it_waits_sends_no_probes():
    pending = Pending(PLAN.n_groups)
    first, _ = read([rec(0, 5, GOOD)], pending)
    again, _ = read([rec(0, 5, GOOD), rec(0, 6, {**GOOD, "url": "http://c/"})], pending)
    assert sum(len(b) for b in first.probes.values()) == 4
    assert set(Batch.concat(list(again.probes.values())).ids()) == {"http://c/"}
    assert len(pending) == 2


@pytest.mark.parametrize(
    "value, ms",
    [
        ("2024-05-01T12:00:00Z", 1714564800000),
        ("2024-05-01T12:00:00.250Z", 1714564800250),
        ("2024-05-01T14:00:00+02:00", 1714564800000),
        ("2024-05-01T07:00:00-05:00", 1714564800000),
        ("2024-05-01T12:00:00", 1714564800000),  # naive: UTC, whatever the machine's zone
        ("2024-05-01", 1714521600000),
        ("  2024-05-01T12:00:00Z ", 1714564800000),
        ("1970-01-01T00:00:00Z", 0),
    ],
)
def test_fetched_ms(value, ms):
    assert fetched_ms(value, fallback_ms=99) == ms


@pytest.mark.parametrize(
    "value, ms", [("2004-02-25T10:23:02.863Z", 1077704582863), ("2039-03-08T19:46:13.411Z", 2183226373411)]
)
def test_fetched_ms_is_exact_to_the_millisecond(value, ms):
    assert fetched_ms(value, None) == ms  # float timestamp() * 1000 gave 1 ms less here


def test_fetched_ms_fallback_and_errors():
    assert fetched_ms(None, 42) == fetched_ms("", 42) == 42
    assert fetched_ms(None, None) == 0
    with pytest.raises(RecordError) as e:
        fetched_ms("01/05/2024", 42)
    assert e.value.reason == "bad_field"


def test_id_hash_is_xxh3_64_of_the_utf8_id_and_stable():
    assert id_hash("") == 0x2D06800538D394C2  # the published XXH3-64 of empty input
    assert id_hash("http://example.com/a") == 0x4A89B0D75B5810FC  # part of the stored format: never change
    assert id_hash("é/ü") == xxhash.xxh3_64_intdigest("é/ü".encode())


# ---------------------------------------------------------------- the pure pipeline


class Pipeline:
    """The worker's stages wired by in-memory queues instead of Kafka: input partitions read by
    ``workers`` workers (each its own Pending), one queue of probe messages per shard partition,
    one queue of answer messages per input partition, and the shards (durable: they survive a
    worker's crash, as the changelog makes them).  Every stage is the production function:
    :meth:`Intake.register`, :func:`shard_step`, :meth:`Pending.answer`.

    ``fps``: fingerprints to use instead of the texts' (None: fingerprint the texts).
    ``algorithm``: simhash (table groups), or minhash / combined (LSH bands, as the worker builds
    them for ``--threshold 0.8 --k 3`` and the default ``--num-perm``)."""

    def __init__(
        self, records: dict[int, list[Record]], workers: int = 1, fps: dict | None = None, algorithm: str = "simhash"
    ) -> None:
        self.records, self.fps = records, fps
        self.bands = None if algorithm == "simhash" else BandScheme.for_threshold(0.8, DEFAULT_NUM_PERM, algorithm)
        self.plan = PLAN if self.bands is None else BandPlan(self.bands, PLAN.partitions)
        self.owner = {p: p % workers for p in records}
        self.pending = [self.new_pending() for _ in range(workers)]
        self.read_at = {p: 0 for p in records}  # next offset to read
        self.committed = {p: 0 for p in records}
        self.shards: dict[int, Shard] = {}
        self.outbox: list[list[tuple[int, bytes]]] = [[] for _ in range(workers)]  # probes not sent yet
        self.probes: dict[int, list[bytes]] = defaultdict(list)
        self.answers: dict[int, list[bytes]] = defaultdict(list)
        self.released: dict[int, list] = defaultdict(list)
        self.stored: dict[int, list[tuple[int, int]]] = defaultdict(list)  # shard -> (id hash, fp) in order

    def intake(self, partitions: list[int], n: int) -> None:
        """One worker reads up to ``n`` records of each of ``partitions`` (all its own)."""
        (w,) = {self.owner[p] for p in partitions}
        batch = []
        for p in partitions:
            batch += self.records[p][self.read_at[p] : self.read_at[p] + n]
            self.read_at[p] = min(len(self.records[p]), self.read_at[p] + n)
        if not batch:
            return
        if self.fps is None:
            intake = Intake.read(batch, self.pending[w], self.plan, MAX, bands=self.bands)
        else:
            parsed = parse(batch, MAX)
            good = [self.fps[r.partition, r.offset] for r, e in zip(batch, parsed.errors) if e is None]
            intake = Intake.register(parsed, np.array(good, dtype=np.uint64), [], self.pending[w], self.plan)
        for s, probes in intake.probes.items():
            self.outbox[w].append((s, encode(probes, PROBES)))
        self.release(intake.partitions)

    def send(self, w: int, s: int) -> None:
        """Worker ``w``'s producer delivers its next probe message for shard partition ``s``:
        in order within a partition, in any order across partitions (and workers)."""
        i = next(i for i, (to, _) in enumerate(self.outbox[w]) if to == s)
        self.probes[s].append(self.outbox[w].pop(i)[1])

    def shard(self, s: int, n: int) -> None:
        """The shard stage takes up to ``n`` messages of shard partition ``s``."""
        values, self.probes[s] = self.probes[s][:n], self.probes[s][n:]
        for v in values:  # the order this shard stores pages in: the rule's order
            b = decode([v], PROBES)
            self.stored[s] += list(zip(b.id_hash.tolist(), b.fps.tolist()))
        step = shard_step(lambda s: self.shards.setdefault(s, Shard(self.plan)), [(s, v) for v in values])
        for q, answers in step.answers.items():
            self.answers[q].append(encode(answers, ANSWERS))

    def answer(self, q: int, n: int) -> None:
        values, self.answers[q] = self.answers[q][:n], self.answers[q][n:]
        pending = self.pending[self.owner[q]]
        touched = set()
        for v in values:
            touched |= pending.answer(decode([v], ANSWERS))
        self.release(touched)

    def release(self, partitions) -> None:
        for p in sorted(partitions):
            pending = self.pending[self.owner[p]]
            ready = pending.ready(p)
            pending.release(p, ready)
            self.released[p] += ready
            if ready:
                self.committed[p] = ready[-1].offset + 1

    def crash(self, w: int) -> None:
        """Worker ``w`` dies: what it held is lost, it reads again from the committed offsets;
        the probes and answers it sent are still in their topics."""
        self.pending[w] = self.new_pending()
        self.outbox[w] = []  # not sent yet: lost
        for p, owner in self.owner.items():
            if owner == w:
                self.read_at[p] = self.committed[p]

    def new_pending(self) -> Pending:
        return Pending(self.plan.n_groups, None if self.bands is None else self.bands.similarity_of_rank)

    def busy(self) -> bool:
        return any(self.outbox) or any(self.probes.values()) or any(self.answers.values())

    def run(self, rng: random.Random, crashes: int = 0, batch: int = 4) -> None:
        """A random interleaving of every stage until every record is released."""
        while any(self.committed[p] < len(r) for p, r in self.records.items()):
            moves = [("intake", p) for p in self.records if self.read_at[p] < len(self.records[p])]
            moves += [("send", (w, s)) for w, out in enumerate(self.outbox) for s in {s for s, _ in out}]
            moves += [("shard", s) for s, q in self.probes.items() if q]
            moves += [("answer", q) for q, a in self.answers.items() if a]
            if crashes and rng.random() < 0.03:
                crashes -= 1
                self.crash(rng.randrange(len(self.pending)))
                continue
            kind, x = rng.choice(moves)
            if kind == "intake":
                mine = [p for p in self.records if self.owner[p] == self.owner[x] and rng.random() < 0.5]
                self.intake(sorted({x, *mine}), rng.randint(1, batch))
            elif kind == "send":
                self.send(*x)
            elif kind == "shard":
                self.shard(x, rng.randint(1, 3))
            else:
                self.answer(x, rng.randint(1, 3))

    def run_in_order(self, batch: int) -> None:
        """Each batch judged before the next is read: the shards store the pages in the order the
        batches take them (worker by worker, partition by partition within a batch)."""
        while self.busy() or any(self.read_at[p] < len(r) for p, r in self.records.items()):
            for w in range(len(self.pending)):
                self.intake(sorted(p for p in self.records if self.owner[p] == w), batch)
            while self.busy():
                for w, out in enumerate(self.outbox):
                    for s, _ in list(out):
                        self.send(w, s)
                for s in list(self.probes):
                    self.shard(s, len(self.probes[s]))
                for q in list(self.answers):
                    self.answer(q, len(self.answers[q]))

    def verdicts(self) -> dict[tuple[int, int], dict]:
        """(partition, offset) -> the released verdict record (without where it was read)."""
        out = {}
        for p, done in self.released.items():
            assert [w.offset for w in done] == list(range(len(self.records[p])))  # each record once, in order
            for w in done:
                if w.reason is None:
                    out[p, w.offset] = {k: v for k, v in verdict_record(w).items() if k not in ("partition", "offset")}
        return out


def rule(pipeline: Pipeline, fps: dict, ids: dict, k: int = 3) -> dict[tuple[int, int], tuple]:
    """The order rule, pair by pair, on the order each shard partition stored the pages in:
    (partition, offset) -> (verdict, match id, distance)."""
    masks = [sum(1 << b for b in bits) for bits, _ in PLAN.design.groups()]
    pos = {}
    for s, order in pipeline.stored.items():
        first: dict = {}
        for n, key in enumerate(order):
            first.setdefault(key, n)
        pos[s] = first
    keys = {r: (id_hash(ids[r]), int(fps[r])) for r in fps}
    out = {}
    for r, (h, f) in keys.items():
        best = None
        for c, (hc, fc) in keys.items():
            x = f ^ fc
            if hc == h or x.bit_count() > k:
                continue
            g = next(g for g, m in enumerate(masks) if x & m == 0)
            s = int(PLAN.probes(np.array([f], dtype=np.uint64))[0, g])
            if pos[s][hc, fc] < pos[s][h, f]:
                cand = (x.bit_count(), g, pos[s][hc, fc], ids[c])
                best = cand if best is None or cand < best else best
        out[r] = ("unique", None, None) if best is None else ("near_duplicate", best[3], best[0])
    return out


def planted(rng: random.Random, n_pairs: int, partitions: int):
    """Isolated near-duplicate pairs (0..3 bits apart, in any blocks), a few triples, unchanged
    re-fetches and changed ones; spread over input partitions at random, with random fetch times."""
    pages: list[tuple[str, int]] = []  # (id, fingerprint)
    pairs = []
    for i in range(n_pairs):
        a = rng.getrandbits(64)
        b = a
        for bit in rng.sample(range(64), rng.randint(0, 3)):
            b ^= 1 << bit
        pairs.append((f"a{i}", f"b{i}"))
        pages += [(f"a{i}", a), (f"b{i}", b)]
    for i in range(3):  # triples: every pair of the three within 3 bits
        c = rng.getrandbits(64)
        pages += [(f"t{i}x", c), (f"t{i}y", c ^ 1 << rng.randrange(64)), (f"t{i}z", c ^ 1 << rng.randrange(64))]
    for i in range(4):  # re-fetches: the same id again, with its content unchanged or changed
        page_id, fp = pages[rng.randrange(2 * n_pairs)]
        pages.append((page_id, fp if i % 2 else fp ^ 1 << rng.randrange(64)))
    rng.shuffle(pages)
    records: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    fps, ids = {}, {}
    for page_id, fp in pages:
        p = rng.randrange(partitions)
        value = {"id": page_id, "url": page_id, "content": "x", "fetched_at": f"2024-05-{rng.randint(1, 28):02d}"}
        records[p].append(rec(p, len(records[p]), value))
        fps[p, len(records[p]) - 1], ids[p, len(records[p]) - 1] = fp, page_id
    return records, fps, ids, pairs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    partitions=st.sampled_from([1, 2, 3, 4]),
    workers=st.sampled_from([1, 2, 3]),
    crashes=st.sampled_from([0, 0, 2]),
)
def test_of_every_near_pair_exactly_one_page_is_flagged_in_any_interleaving(seed, partitions, workers, crashes):
    """Random arrival orders and interleavings of intake, shards and answers across partitions
    and workers, with crashes (a worker's pages read again and replayed into the shards): every
    record gets one verdict, the verdicts follow the rule on the order each shard stored pages
    in, and of every isolated pair exactly one page is flagged, with the other as its match."""
    rng = random.Random(seed)
    records, fps, ids = planted(rng, 12, partitions)[:3]
    pairs = planted(random.Random(seed), 12, partitions)[3]
    pipeline = Pipeline(records, min(workers, partitions), fps)
    pipeline.run(rng, crashes)
    got = pipeline.verdicts()
    assert {r: (v["verdict"], v["match_id"], v["distance"]) for r, v in got.items()} == rule(pipeline, fps, ids)
    flagged: dict[str, list] = defaultdict(list)
    for r, v in got.items():
        flagged[ids[r]].append(v)
    for a, b in pairs:
        if len(flagged[a]) == len(flagged[b]) == 1:  # not re-fetched: an isolated pair
            near = [v for v in flagged[a] + flagged[b] if v["verdict"] == "near_duplicate"]
            assert len(near) == 1 and {near[0]["id"], near[0]["match_id"]} == {a, b}


def test_a_page_replayed_after_its_pair_keeps_its_first_position():
    """A stored, then its worker crashes before A's verdict is committed; B (2 bits from A)
    arrives and is flagged against A; A, read again, is judged where it was first stored."""
    a, b = 0x0123_4567_89AB_CDEF, 0x0123_4567_89AB_CDEF ^ 0b11
    records = {
        0: [rec(0, 0, {"id": "A", "url": "A", "content": "x"})],
        1: [rec(1, 0, {"id": "B", "url": "B", "content": "x"})],
    }
    fps = {(0, 0): a, (1, 0): b}
    pipeline = Pipeline(records, workers=2, fps=fps)
    pipeline.intake([0], 1)
    for s, _ in list(pipeline.outbox[0]):
        pipeline.send(0, s)
    for s in list(pipeline.probes):
        pipeline.shard(s, 9)  # A stored in every shard, its answers wait in the answers queue
    pipeline.crash(0)  # ... for a worker that is gone: never released
    pipeline.intake([1], 1)
    for s, _ in list(pipeline.outbox[1]):
        pipeline.send(1, s)
    for s in list(pipeline.probes):
        pipeline.shard(s, 9)  # B stored after A: it finds A
    pipeline.run_in_order(1)  # A read again and replayed; B's answers in
    got = pipeline.verdicts()
    assert (got[1, 0]["verdict"], got[1, 0]["match_id"]) == ("near_duplicate", "A")
    assert got[0, 0]["verdict"] == "unique"
    assert sum(len(s) for s in pipeline.shards.values()) == 2 * PLAN.n_groups  # the replay stored nothing


def corpus(n: int, seed: int = 7) -> list[tuple[str, str]]:
    """(id, text): originals, exact copies, one-word edits, and a re-fetch of an id."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(400)]
    out: list[tuple[str, str]] = []
    for i in range(n):
        if out and rng.random() < 0.5:
            j = rng.randrange(len(out))
            text = out[j][1].split()
            if rng.random() < 0.6:
                text[rng.randrange(len(text))] = rng.choice(words)
            text = " ".join(text)
            page_id = out[j][0] if rng.random() < 0.1 else f"http://site/{i}"
        else:
            text, page_id = " ".join(rng.choice(words) for _ in range(120)), f"http://site/{i}"
        out.append((page_id, text))
    return out


CORPUS = corpus(60)


@pytest.mark.parametrize("algorithm", ["simhash", "minhash", "combined"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    input_partitions=st.sampled_from([1, 3]),
    batch=st.sampled_from([1, 4, 9, 60]),
    fetch_order=st.sampled_from(["in order", "reversed", "random"]),
)
def test_the_pipeline_gives_the_embedded_engines_verdicts_on_the_same_arrival_order(
    algorithm, seed, input_partitions, batch, fetch_order
):
    """Pages in a random arrival order, with fetch times in order, reversed or shuffled (they
    decide nothing), and bad records now and then: the verdicts are the Deduplicator's on the
    order the pipeline stored them in (one worker, each batch judged before the next), for every
    algorithm."""
    rng = random.Random(seed)
    pages = list(CORPUS)
    rng.shuffle(pages)
    times = list(range(len(pages)))
    if fetch_order == "reversed":
        times.reverse()
    elif fetch_order == "random":
        rng.shuffle(times)
    records: dict[int, list[Record]] = {p: [] for p in range(input_partitions)}
    placed = []
    for i, ((page_id, text), t) in enumerate(zip(pages, times)):
        p = rng.randrange(input_partitions)
        value = {"id": page_id, "url": page_id, "content": text, "content_type": "text/plain"}
        value["fetched_at"] = f"2024-05-01T12:{t // 60:02d}:{t % 60:02d}Z"
        placed.append((p, len(records[p])))
        records[p].append(rec(p, len(records[p]), value))
        if i % 13 == 5:  # a bad record now and then, released in its place
            records[p].append(rec(p, len(records[p]), b"not json"))
    pipeline = Pipeline(records, algorithm=algorithm)
    pipeline.run_in_order(batch)
    got = pipeline.verdicts()
    # the arrival order: batch by batch, each batch partition by partition, in offset order
    arrival = sorted(range(len(pages)), key=lambda i: (placed[i][1] // batch, placed[i][0], placed[i][1]))
    expected = Deduplicator(algorithm).process(
        [pages[i][0] for i in arrival], [pages[i][0] for i in arrival], [pages[i][1] for i in arrival]
    )
    assert {v.verdict for v in expected} == {"unique", "near_duplicate"}
    assert {placed[i]: v.to_dict() for i, v in zip(arrival, expected)} == got
