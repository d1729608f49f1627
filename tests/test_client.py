"""The pure parts of the Kafka clients: pages -> pages-topic records (checked as the worker checks
them), output records and headers parsed, and the ``verdicts`` command's lines."""

from __future__ import annotations

import io
import json

import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from streamdedup.cli.crawler import as_json, human_line
from streamdedup.crawler.client import OutputRecord, VerdictRecord, encode_page
from streamdedup.engine.records import Page, page_from_json, read_warc
from streamdedup.errors import RecordError

LIMIT = 4096


def warc(*responses: tuple, gzip: bool = True) -> io.BytesIO:
    """An in-memory WARC(.gz) of (url, Content-Type header, body[, HTTP status line, or None for a
    response that is not HTTP]) responses."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=gzip)
    for url, ctype, body, *status in responses:
        line = status[0] if status else "200 OK"
        http = None if line is None else StatusAndHeaders(line, [("Content-Type", ctype)], protocol="HTTP/1.1")
        headers = {"WARC-Date": "2026-03-01T10:00:00Z"}
        if http is None:
            headers["Content-Type"] = ctype
        writer.write_record(
            writer.create_warc_record(
                url, "response", payload=io.BytesIO(body), http_headers=http, warc_headers_dict=headers
            )
        )
    out.seek(0)
    return out


def test_warc_responses_that_are_not_2xx_http_pages_are_skipped():
    """(A Heritrix dns: record, a 404 page and a redirect went to the worker as pages; the Scrapy
    pipeline sends 2xx HTML only.)"""
    html = "text/html; charset=utf-8"
    got = read_warc(
        warc(
            ("dns:a.example", "text/dns", b"20260301100000\na.example. 300 IN A 10.0.0.1\n", None),
            ("http://a/missing", html, b"<p>not found</p>", "404 Not Found"),
            ("http://a/moved", html, b"<p>moved</p>", "301 Moved Permanently"),
            ("http://a/page", html, b"<p>the page</p>"),
        )
    )
    assert [(n, p.url) for n, p in got] == [(4, "http://a/page")]


def test_a_warc_record_cut_short_is_a_bad_warc_error_not_a_shorter_page():
    full = warc(
        ("http://a/1", "text/html", b"<p>one</p>"),
        ("http://a/2", "text/html", b"<p>" + b"two " * 500 + b"</p>"),
        gzip=False,
    )
    cut = io.BytesIO(full.getvalue()[: len(full.getvalue()) - 1000])
    got = list(read_warc(cut))
    assert [p.url for _, p in got[:1]] == ["http://a/1"]
    assert [(n, e.reason) for n, e in got[1:]] == [(2, "bad_warc")] and "ends before its Content-Length" in str(
        got[1][1]
    )


def test_warc_response_becomes_the_worker_record():
    # The <meta> lies; the HTTP header's charset wins, as in the worker.
    body = '<meta charset="windows-1251"><p>café crème</p>'.encode("latin-1")
    [(number, page)] = list(read_warc(warc(("http://a/cafe", "text/html; charset=ISO-8859-1", body))))
    key, value = encode_page(page, LIMIT)
    assert key == b"http://a/cafe"
    assert json.loads(value) == {
        "url": "http://a/cafe",
        "content": '<meta charset="windows-1251"><p>café crème</p>',
        "content_type": "text/html",
        "fetched_at": "2026-03-01T10:00:00Z",
        "id": "http://a/cafe",
    }
    assert page_from_json(value, LIMIT).content.text().endswith("café crème</p>")


def test_charset_from_the_content_type_when_the_page_has_none():
    page = Page("u", "u", "<p>привет мир</p>".encode("koi8-r"), "text/html; charset=KOI8-R")
    content = json.loads(encode_page(page, LIMIT)[1])
    assert (content["content"], content["content_type"]) == ("<p>привет мир</p>", "text/html")


def test_mapping_sent_as_given_and_keyed_by_id():
    record = {"url": "http://a/x", "content": "<p>x</p>", "id": "page-7", "crawl": {"depth": 2}}
    key, value = encode_page(record, LIMIT)
    assert (key, json.loads(value)) == (b"page-7", record)
    assert encode_page({"url": "http://a/y", "content": "y"}, LIMIT)[0] == b"http://a/y"


def test_lone_surrogate_is_kept_as_an_escape():
    key, value = encode_page({"url": "http://a/s", "content": "a\ud800b"}, LIMIT)
    assert value.isascii() and page_from_json(value, LIMIT).content == "a\ud800b"


@pytest.mark.parametrize(
    "page, reason",
    [
        (Page("u", "u", b"\x89PNG\r\n\x1a\n....", "image/png"), "not_text"),
        ({"url": "u", "content": "body { color: red }", "content_type": "text/css; charset=utf-8"}, "not_text"),
        (Page("u", "u", b"\x89PNG\r\n\x1a\n....", "text/html"), "binary"),
        (Page("u", "u", b" \r\n ", "text/html"), "empty"),
        ({"url": "u", "content": '"' * 2100}, "too_large"),  # 2100 characters, over 4096 bytes once escaped
        ({"url": "u"}, "missing_field"),
        ({"url": "u", "content": b"<p>bytes</p>"}, "bad_field"),
        ({"url": "u", "content": "x", "fetched_at": "yesterday"}, "bad_field"),
    ],
)
def test_pages_the_worker_would_refuse(page, reason):
    with pytest.raises(RecordError) as e:
        encode_page(page, LIMIT)
    assert e.value.reason == reason


def test_output_record_headers_parsed():
    r = OutputRecord.from_kafka(
        "pages.near-duplicate",
        1,
        5,
        b"http://a/y",
        b'{"url": "http://a/y", "content": "c"}',
        [
            ("crawler-run", b"7"),
            ("streamdedup-verdict", b"near_duplicate"),
            ("streamdedup-fingerprint", b"00000000000000ff"),
            ("streamdedup-cluster", b"00000000000000c1"),
            ("streamdedup-match-id", b"http://a/x"),
            ("streamdedup-match-url", b"http://a/x"),
            ("streamdedup-distance", b"2"),
        ],
    )
    assert (r.verdict, r.fingerprint, r.cluster, r.match_id, r.match_url, r.distance, r.reason) == (
        "near_duplicate",
        "00000000000000ff",
        "00000000000000c1",
        "http://a/x",
        "http://a/x",
        2,
        None,
    )
    assert human_line(r) == "near_duplicate  d=2  http://a/y  ~ http://a/x  fp=00000000000000ff"
    out = as_json(r)
    assert out["headers"]["crawler-run"] == "7" and out["url"] == "http://a/y" and out["value_bytes"] == 37
    assert "value" not in out


def test_dead_letter_parsed():
    r = OutputRecord.from_kafka(
        "pages.dead-letter",
        0,
        0,
        b"k1",
        b"{oops",
        [("streamdedup-reason", b"not_json"), ("streamdedup-error", b"the record is not JSON")],
    )
    assert (r.reason, r.error, r.verdict, r.url) == ("not_json", "the record is not JSON", None, None)
    assert human_line(r) == "not_json        k1  the record is not JSON"


def test_verdict_lines():
    unique = VerdictRecord("x", "http://a/x", "unique", "00000000000000ff", None, None, None, 0, 1, "00000000000000c1")
    assert human_line(unique) == "unique          http://a/x"
    assert as_json(unique) == {
        "id": "x",
        "url": "http://a/x",
        "verdict": "unique",
        "fingerprint": "00000000000000ff",
        "match_id": None,
        "match_url": None,
        "distance": None,
        "partition": 0,
        "offset": 1,
        "cluster": "00000000000000c1",
    }


def test_a_scrapy_setting_of_none_is_one_not_given():
    """(``STREAMDEDUP_BROKERS = os.environ.get("X")`` with X unset raised a TypeError; a topic of
    None was taken as the topic.)"""
    from types import SimpleNamespace

    from scrapy.settings import Settings as ScrapySettings

    from streamdedup.crawler.scrapy_pipeline import StreamdedupPipeline

    settings = ScrapySettings({"STREAMDEDUP_BROKERS": None, "STREAMDEDUP_PAGES_TOPIC": None})
    crawler = SimpleNamespace(settings=settings, stats=None, signals=SimpleNamespace(connect=lambda *a, **k: None))
    pipeline = StreamdedupPipeline.from_crawler(crawler)
    assert pipeline.settings.pages_topic == "pages" and pipeline._producer.topic == "pages"
