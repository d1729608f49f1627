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

from streamdedup.engine.dedup import Deduplicator
from streamdedup.errors import RecordError
from streamdedup.fingerprinting.pages import fingerprint
from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.intake import Intake, Record, fetched_ms, id_hash
from streamdedup.pipeline.pending import Pending
from streamdedup.pipeline.routing import verdict_record
from streamdedup.pipeline.shard import Shard, ShardPlan
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


def shard_step(shards: dict[int, Shard], probe_messages: dict[int, bytes]) -> dict[int, bytes]:
    """What the shard agent does (streamdedup/stream/app.py: Worker.on_probes), without Kafka."""
    replies: dict[int, list[Batch]] = defaultdict(list)
    for s, value in probe_messages.items():
        probes = decode([value], PROBES)
        shard = shards.setdefault(s, Shard(PLAN))
        ans = shard.probe_and_insert(
            probes.group, probes.fps, probes.fetched, probes.id_hash, probes.ids(), probes.urls()
        )
        matched = ans.distance >= 0
        answer = Batch.build(
            group=probes.rows["group"],
            fps=ans.fingerprint,
            fetched=ans.fetched,
            id_hash=ans.id_hash,
            request=probes.rows["request"],
            distance=ans.distance,
            partition=probes.rows["partition"],
            ids=[x if m else "" for x, m in zip(ans.ids, matched)],
            urls=[x if m else "" for x, m in zip(ans.urls, matched)],
            kind=ANSWERS,
        )
        dest = probes.rows["partition"]
        for q in np.unique(dest).tolist():
            replies[q].append(answer.select(dest == q))
    return {q: encode(Batch.concat(parts), ANSWERS) for q, parts in replies.items()}


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


def test_the_pipeline_gives_the_embedded_engines_verdicts():
    pages = corpus(60)
    input_partitions, batch = 3, 9
    records, offsets = [], defaultdict(int)
    for i, (page_id, text) in enumerate(pages):
        p = i % input_partitions
        value = {
            "id": page_id,
            "url": page_id,
            "content": text,
            "content_type": "text/plain",
            "fetched_at": f"2024-05-01T12:{i // 60:02d}:{i % 60:02d}Z",
        }
        records.append(rec(p, offsets[p], value))
        offsets[p] += 1
        if i % 13 == 5:  # a bad record now and then, released in its place
            records.append(rec(p, offsets[p], b"not json"))
            offsets[p] += 1

    pending, shards = Pending(PLAN.n_groups), {}
    released: dict[int, list] = defaultdict(list)
    for start in range(0, len(records), batch):
        intake = Intake.read(records[start : start + batch], pending, PLAN, MAX)
        answers = shard_step(shards, {s: encode(b, PROBES) for s, b in intake.probes.items()})
        touched = set(intake.partitions)
        for value in answers.values():
            touched |= pending.answer(decode([value], ANSWERS))
        for p in sorted(touched):
            ready = pending.ready(p)
            pending.release(p, ready)
            released[p] += ready
    assert len(pending) == 0

    expected = [
        v.to_dict()
        for v in Deduplicator("simhash").process([i for i, _ in pages], [i for i, _ in pages], [t for _, t in pages])
    ]
    assert {v["verdict"] for v in expected} == {"unique", "near_duplicate"}
    assert any(v["distance"] for v in expected)  # not only exact copies
    for p, done in released.items():
        assert [w.offset for w in done] == list(range(offsets[p]))  # every record, in offset order
        got = [
            {k: v for k, v in verdict_record(w).items() if k not in ("partition", "offset")}
            for w in done
            if w.reason is None
        ]
        assert got == expected[p::input_partitions]
