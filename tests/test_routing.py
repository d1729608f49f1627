"""The worker's output contract: topics, keys, unchanged values, headers, the verdict JSON."""

from __future__ import annotations

import json

from streamdedup.pipeline.pending import Waiting
from streamdedup.pipeline.routing import Topics, outputs, verdict_record

VALUE = '{"url": "http://a/é", "content": "<p>hi</p>"}'.encode()
UPSTREAM = [
    ("trace-id", b"t-1"),
    ("streamdedup-verdict", b"unique"),
    ("source", b"crawler-7"),
    ("streamdedup-distance", b"0"),
]


def judged(best=None, headers=UPSTREAM, page_id="a/é") -> Waiting:
    return Waiting(
        partition=2,
        offset=41,
        key=b"the-input-key",
        value=VALUE,
        headers=list(headers),
        timestamp_ms=1000,
        page_id=page_id,
        url="http://a/é",
        fingerprint=0xFF,
        best=best,
        cluster=0xC1,
    )


def test_a_unique_page():
    page, verdict = outputs(judged(), Topics())
    ours = [
        ("streamdedup-verdict", b"unique"),
        ("streamdedup-fingerprint", b"00000000000000ff"),
        ("streamdedup-cluster", b"00000000000000c1"),
    ]
    assert page.topic == "pages.unique"
    assert page.key == "a/é".encode()  # keyed by page id, not by the input key
    assert page.value == VALUE  # the input bytes, unchanged
    assert page.headers == [("trace-id", b"t-1"), ("source", b"crawler-7")] + ours
    assert (verdict.topic, verdict.key, verdict.headers) == ("pages.verdicts", "a/é".encode(), ours)
    assert json.loads(verdict.value) == {
        "id": "a/é",
        "url": "http://a/é",
        "verdict": "unique",
        "fingerprint": "00000000000000ff",
        "cluster": "00000000000000c1",
        "match_id": None,
        "match_url": None,
        "distance": None,
        "partition": 2,
        "offset": 41,
    }
    assert "é".encode() in verdict.value  # compact UTF-8, not \u escapes
    assert b" " not in verdict.value


def test_a_near_duplicate():
    best = (2, 500, 77, 0xFC, "orig/ü", "http://orig/ü")  # (distance, fetched, id hash, fingerprint, id, url)
    page, verdict = outputs(judged(best), Topics())
    ours = [
        ("streamdedup-verdict", b"near_duplicate"),
        ("streamdedup-fingerprint", b"00000000000000ff"),
        ("streamdedup-cluster", b"00000000000000c1"),
        ("streamdedup-match-id", "orig/ü".encode()),
        ("streamdedup-match-url", "http://orig/ü".encode()),
        ("streamdedup-distance", b"2"),
    ]
    assert page.topic == "pages.near-duplicate" and page.value == VALUE and page.key == "a/é".encode()
    assert page.headers == [("trace-id", b"t-1"), ("source", b"crawler-7")] + ours
    assert verdict.headers == ours
    assert (
        json.loads(verdict.value)
        == verdict_record(judged(best))
        == {
            "id": "a/é",
            "url": "http://a/é",
            "verdict": "near_duplicate",
            "fingerprint": "00000000000000ff",
            "cluster": "00000000000000c1",
            "match_id": "orig/ü",
            "match_url": "http://orig/ü",
            "distance": 2,
            "partition": 2,
            "offset": 41,
        }
    )


def test_upstream_verdict_headers_never_pass_through():
    spoofed = [("streamdedup-verdict", b"near_duplicate"), ("streamdedup-match-id", b"x")]
    page, verdict = outputs(judged(headers=spoofed), Topics())
    assert [k for k, _ in page.headers] == ["streamdedup-verdict", "streamdedup-fingerprint", "streamdedup-cluster"]
    assert dict(page.headers)["streamdedup-verdict"] == b"unique"


def test_no_input_headers():
    page, _ = outputs(judged(headers=()), Topics())
    assert [k for k, _ in page.headers] == ["streamdedup-verdict", "streamdedup-fingerprint", "streamdedup-cluster"]


def test_a_page_without_a_cluster_key_has_no_cluster_header_and_a_null_field():
    w = judged()
    w.cluster = None
    page, verdict = outputs(w, Topics())
    assert "streamdedup-cluster" not in dict(page.headers) and "streamdedup-cluster" not in dict(verdict.headers)
    assert json.loads(verdict.value)["cluster"] is None


def test_a_dead_letter_keeps_its_key_value_and_headers_and_says_why():
    w = Waiting(1, 3, b"k1", b"\xff not json", list(UPSTREAM), reason="not_utf8", error="the record is not UTF-8 ‽")
    [out] = outputs(w, Topics())
    assert (out.topic, out.key, out.value) == ("pages.dead-letter", b"k1", b"\xff not json")
    assert out.headers == [
        ("trace-id", b"t-1"),
        ("source", b"crawler-7"),
        ("streamdedup-reason", b"not_utf8"),
        ("streamdedup-error", "the record is not UTF-8 ‽".encode()),
    ]


def test_a_dead_letter_without_key_or_error():
    [out] = outputs(Waiting(0, 0, None, b"", reason="empty"), Topics())
    assert (out.key, out.value) == (None, b"")
    assert out.headers == [("streamdedup-reason", b"empty"), ("streamdedup-error", b"")]


def test_topic_names_come_from_the_settings():
    topics = Topics("u", "n", "v", "d")
    assert [o.topic for o in outputs(judged(), topics)] == ["u", "v"]
    assert [o.topic for o in outputs(judged((1, 0, 0, 0, "m", "mu")), topics)] == ["n", "v"]
    assert [o.topic for o in outputs(Waiting(0, 0, None, b"", reason="empty"), topics)] == ["d"]


def test_a_refused_dead_letter_is_sent_shrunk_not_dropped():
    from streamdedup.pipeline.routing import TRUNCATED_BYTES

    value = b"v" * (TRUNCATED_BYTES + 10)
    w = Waiting(1, 3, b"k" * 5000, value, list(UPSTREAM), reason="too_large_for_topic", error="refused")
    [whole] = outputs(w, Topics())
    [head] = outputs(w, Topics(), shrink=1)
    [bare] = outputs(w, Topics(), shrink=2)
    assert whole.value == value and ("streamdedup-truncated", str(len(value)).encode()) not in whole.headers
    assert head.value == value[:TRUNCATED_BYTES] and head.key == w.key
    assert head.headers[:2] == [("trace-id", b"t-1"), ("source", b"crawler-7")]
    assert (bare.value, bare.key) == (b"", b"k" * 1024)
    assert [k for k, _ in bare.headers] == ["streamdedup-reason", "streamdedup-error", "streamdedup-truncated"]
    for out in (head, bare):
        assert dict(out.headers)["streamdedup-truncated"] == str(len(value)).encode()
        assert dict(out.headers)["streamdedup-reason"] == b"too_large_for_topic"


def test_a_long_error_is_cut_on_a_character_boundary():
    [out] = outputs(Waiting(0, 0, None, b"", reason="bad_field", error="é" * 5000), Topics())
    assert dict(out.headers)["streamdedup-error"].decode("utf-8") == "é" * 2000


def test_what_the_worker_writes_is_valid_utf8_even_from_a_stored_surrogate():
    # a match stored before ids were checked (an old changelog) must not make invalid bytes
    [page, verdict] = outputs(judged((1, 0, 0, 0, "old\ud800", "http://old/\udfff")), Topics())
    for _, v in page.headers:
        v.decode("utf-8")
    json.loads(verdict.value.decode("utf-8"))


def test_output_overhead_covers_the_largest_key_and_match_headers():
    from streamdedup.engine.records import MAX_ID_BYTES, MAX_URL_BYTES
    from streamdedup.pipeline.routing import OUTPUT_OVERHEAD_BYTES

    w = judged((1, 0, 0, 0, "m" * MAX_ID_BYTES, "u" * MAX_URL_BYTES), headers=(), page_id="p" * MAX_ID_BYTES)
    page, _ = outputs(w, Topics())
    added = len(page.key) + sum(len(k) + len(v) for k, v in page.headers)
    assert added + 200 < OUTPUT_OVERHEAD_BYTES  # 200: Kafka's record and batch framing


def test_compose_creates_the_page_topics_with_the_overhead_the_worker_checks():
    from pathlib import Path

    from streamdedup.pipeline.routing import OUTPUT_OVERHEAD_BYTES

    compose = (Path(__file__).resolve().parents[1] / "deploy" / "docker-compose.yml").read_text()
    assert f"STREAMDEDUP_MAX_PAGE_BYTES:-5242880}} + {OUTPUT_OVERHEAD_BYTES} ))" in compose
