"""The record contract: every kind of bad input is a RecordError with its reason, never a crash;
JSON lines and WARC files are read with numbers for error reports."""

from __future__ import annotations

import gzip
import io
import json
import os
import threading
import time
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from streamdedup.engine.records import (
    Page,
    open_input,
    page_from_json,
    read_jsonl,
    read_pages,
    read_warc,
    records_of,
    sniff_format,
)
from streamdedup.errors import RecordError
from streamdedup.fingerprinting.text import Utf8Text, visible_text


def test_good_record_and_defaults():
    page = page_from_json(
        json.dumps({"url": "http://x/a", "content": "<p>hi</p>", "fetched_at": "2026-01-01T00:00:00Z"})
    )
    assert page == Page("http://x/a", "http://x/a", "<p>hi</p>", None, None, "2026-01-01T00:00:00Z")
    assert page_from_json(b'{"url": "u", "content": "c", "id": "p1", "content_type": "text/plain"}').id == "p1"


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"\xff\xfe not utf-8", "not_utf8"),
        (b"{not json", "not_json"),
        (b"[1, 2]", "not_object"),
        (b'{"content": "x"}', "missing_field"),
        (b'{"url": "u"}', "missing_field"),
        (b'{"url": "u", "content": null}', "missing_field"),
        (b'{"url": "u", "content": 5}', "bad_field"),
        (b'{"url": "u", "content": "x", "id": 7}', "bad_field"),
        (b'{"url": "  ", "content": "x"}', "missing_field"),
        (b'{"url": "u", "content": "   "}', "empty"),
        (b"", "empty"),
        (b"  \n", "empty"),
        (b'{"url": "u", "content": "' + b"x" * 200 + b'"}', "too_large"),
    ],
)
def test_bad_records_have_reasons(raw, reason):
    with pytest.raises(RecordError) as err:
        page_from_json(raw, max_bytes=100)
    assert err.value.reason == reason
    assert str(err.value).startswith(reason + ": ")


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(raw):
    try:
        page_from_json(raw)
    except RecordError:
        pass


def test_jsonl_numbers_lines_and_keeps_going():
    data = b'{"url": "a", "content": "x"}\n\nnot json\n{"url": "b", "content": "y"}\n'
    got = [(n, p.id if isinstance(p, Page) else p.reason) for n, p in read_jsonl(io.BytesIO(data))]
    assert got == [(1, "a"), (3, "not_json"), (4, "b")]


def _warc(records: list[tuple[str, bytes, str]], gz: bool) -> bytes:
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=gz)
    writer.write_record(writer.create_warcinfo_record("test.warc", {"software": "test"}))
    for url, body, ctype in records:
        http = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
        writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=http))
        writer.write_record(writer.create_warc_record(url, "request", payload=io.BytesIO(b"GET / HTTP/1.1\r\n\r\n")))
    return buf.getvalue()


@pytest.mark.parametrize("gz", [False, True])
def test_warc_response_records_with_charset(gz, tmp_path):
    body = "<html><body><p>Café crème</p></body></html>".encode("latin-1")
    data = _warc([("http://x/1", body, "text/html; charset=ISO-8859-1"), ("http://x/2", b"", "text/html")], gz)
    path = tmp_path / ("c.warc.gz" if gz else "c.warc")
    path.write_bytes(data)
    got = list(read_pages(path))
    pages = [p for _, p in got if isinstance(p, Page)]
    assert [(p.url, p.content_type, p.charset) for p in pages] == [("http://x/1", "text/html", "ISO-8859-1")]
    assert pages[0].content == body and pages[0].fetched_at
    assert [p.reason for _, p in got if isinstance(p, RecordError)] == ["empty"]


def test_damaged_warc_is_reported_not_raised():
    data = _warc([("http://x/1", b"<p>ok</p>", "text/html")], gz=True)
    got = list(read_warc(io.BytesIO(data[: len(data) // 2] + b"garbage" * 50)))
    assert any(isinstance(p, RecordError) and p.reason == "bad_warc" for _, p in got)


class _Pipe(io.RawIOBase):
    """Bytes as stdin gives them: readable, not seekable."""

    def __init__(self, data: bytes) -> None:
        self.data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


@pytest.mark.parametrize("pipe", [False, True], ids=["file", "pipe"])
@pytest.mark.parametrize("gz", [True, False], ids=["warc.gz", "warc"])
def test_a_warc_cut_anywhere_is_never_a_silent_loss_nor_a_crash(gz, pipe):
    """Cut at every few bytes: the pages before the cut come out, and a bad_warc error says the
    file is damaged -- unless the cut falls where a record ends (a gzip member's end; a plain
    record's end or its closing CRLFs), where the file is a shorter WARC that nothing can tell
    from a whole one.  (warcio raised AttributeError for some cuts of a .warc.gz, a traceback in produce and
    scan; on a pipe its quiet stop at a truncated gzip member lost the tail without a word; a
    plain WARC cut inside a record that is not a response was read as whole.)"""
    from warcio.archiveiterator import ArchiveIterator

    pages = [(f"http://x/{i}", f"<p>page {i} {'word ' * (50 + 40 * i)}</p>".encode(), "text/html") for i in range(3)]
    data = _warc(pages, gz)
    whole = ArchiveIterator(io.BytesIO(data))
    ends = []
    for _ in whole:
        whole.read_to_end()
        ends.append(sum(whole.member_info))
    quiet = {c for e in ends for c in ([e] if gz else range(e, e + 5))}
    for cut in [*range(0, len(data), 5 if gz else 13), *sorted(quiet)]:
        stream = io.BufferedReader(_Pipe(data[:cut])) if pipe else io.BytesIO(data[:cut])
        got = [p for _, p in read_warc(stream)]
        urls = [p.url for p in got if isinstance(p, Page)]
        assert urls == [u for u, _, _ in pages[: len(urls)]], cut
        errors = [p.reason for p in got if isinstance(p, RecordError)]
        if cut in quiet or cut == 0:
            assert errors == [], (cut, got)
        else:
            assert errors == ["bad_warc"], (cut, got)
    stream = io.BufferedReader(_Pipe(data)) if pipe else io.BytesIO(data)
    assert [p.url for _, p in read_warc(stream)] == [u for u, _, _ in pages]


def test_gzipped_jsonl(tmp_path):
    path = tmp_path / "pages.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"url": "a", "content": "x"}\n'))
    assert [p.id for _, p in read_pages(path)] == ["a"]


# ---------------------------------------------------------------- hostile records (issue 15)


def _record(**fields) -> bytes:
    return json.dumps({"url": "http://a/", "content": "<p>some words</p>", **fields}).encode()


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"[" * 200_000 + b"]" * 200_000, "not_json"),  # was RecursionError -> internal_error
        (b'{"url": "http://a/", "content": "x", "d": ' + b"[" * 65 + b"]" * 65 + b"}", "not_json"),
        (b'{"url": "http://a/", "content": "x", "n": ' + b"9" * 5000 + b"}", "bad_field"),  # int digit limit
        (b'{"url": "http://a/", "content": "x", "n": -' + b"9" * 101 + b"}", "bad_field"),
        (b'{"id": "sur\\ud800", "url": "http://a/", "content": "x"}', "bad_field"),
        (b'{"url": "http://a/\\udfff", "content": "x"}', "bad_field"),
        (b'{"url": "http://a/", "content": "x", "fetched_at": "\\ud800"}', "bad_field"),
        (_record(url="http://long.example/" + "u" * 700_000), "too_long"),
        (_record(id="i" * 8193), "too_long"),
    ],
)
def test_hostile_records_are_this_records_error(raw, reason):
    with pytest.raises(RecordError) as err:
        page_from_json(raw, max_bytes=10_000_000)
    assert err.value.reason == reason, err.value


def test_limits_are_inclusive_and_nesting_within_them_is_fine():
    from streamdedup.engine.records import MAX_ID_BYTES, MAX_INT_DIGITS, MAX_JSON_DEPTH, MAX_URL_BYTES

    url = "http://a/" + "u" * (MAX_URL_BYTES - len("http://a/"))
    nested = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)  # inside the record's object
    raw = (
        '{"url": "%s", "id": "%s", "content": "x", "d": %s, "n": %s}'
        % (url, "é" * (MAX_ID_BYTES // 2), nested, "9" * MAX_INT_DIGITS)
    ).encode()
    page = page_from_json(raw)
    assert (page.url, len(page.id.encode())) == (url, MAX_ID_BYTES)


def test_content_with_lone_surrogates_is_judged_not_refused():
    # the content is only fingerprinted (the extractor drops surrogates); the value is passed on as it came
    assert page_from_json(b'{"url": "http://a/", "content": "<p>a \\ud800 b</p>"}').content == "<p>a \ud800 b</p>"


@pytest.mark.parametrize(
    "content",
    [
        "<div id='app'></div><script src='/static/app.js'></script>",
        "<nav>Home</nav><script>start()</script>",
        "<p> . , ! -- </p>",
        "<html><head><title>Title only</title></head><body><style>p{}</style></body></html>",
    ],
)
def test_pages_without_visible_words_are_empty(content):
    from streamdedup.engine.records import page_text

    with pytest.raises(RecordError) as err:
        page_text(Page("a", "a", content, "text/html"))
    assert (err.value.reason, err.value.message) == ("empty", "no visible text to fingerprint")


def test_one_visible_word_is_enough():
    from streamdedup.engine.records import page_text

    assert page_text(Page("a", "a", "<nav>Home</nav><p>Hello</p>", "text/html")) == "Hello"


def test_a_hostile_record_in_a_batch_fails_alone():
    from streamdedup.fingerprinting.cluster import cluster_keys_texts
    from streamdedup.pipeline.intake import Record, fingerprint_contents, parse

    valid = _record(url="http://ok/1", content="<p>alpha beta gamma</p>")
    batch = [
        Record(0, 0, None, b"[" * 200_000 + b"]" * 200_000),
        Record(0, 1, None, valid),
        Record(0, 2, None, b'{"url": "http://a/", "content": "x", "n": ' + b"9" * 5000 + b"}"),
        Record(0, 3, None, _record(url="http://ok/2", content="<div id='app'></div><script src=a.js></script>")),
        Record(0, 4, None, _record(url="http://ok/3", content="<nav>Home</nav><script>go()</script>")),
        Record(0, 5, None, _record(url="http://ok/4", content="<p>delta epsilon</p>")),
    ]
    parsed = parse(batch, 10_000_000)
    assert [e.reason if e else None for e in parsed.errors] == ["not_json", None, "bad_field", None, None, None]
    fps, failed, clusters, _ = fingerprint_contents(parsed.contents())
    assert [(i, reason) for i, reason, _ in failed] == [(1, "empty"), (2, "empty")]  # positions among the good
    assert len(fps) == 2 and len(set(fps.tolist())) == 2 and 0 not in fps.tolist()
    assert clusters == cluster_keys_texts(["alpha beta gamma", "delta epsilon"])  # aligned with fps


# ---------------------------------------------------------------- orjson first, json where it differs
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
    ),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=5), kids, max_size=4)),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {
        "url": st.one_of(st.just("http://a/"), st.text(max_size=10)),
        "content": st.one_of(st.just("<p>hi</p>"), st.text(max_size=30)),
    },
    optional={"id": JSON_VALUES, "content_type": st.one_of(st.none(), st.text(max_size=10)), "extra": JSON_VALUES},
)


def outcome(raw):
    try:
        return page_from_json(raw)
    except RecordError as e:
        return (e.reason, str(e))


@given(
    st.one_of(
        FIELDS.map(lambda d: json.dumps(d, ensure_ascii=False).encode("utf-8", "surrogatepass")),
        FIELDS.map(lambda d: json.dumps(d).encode()),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=60),
        st.sampled_from(
            [
                b'{"url": "u", "content": "c", "n": ' + b"9" * 30 + b"}",
                b'\xef\xbb\xbf{"url": "u", "content": "c"}',
                b'{"url": "u", "content": "c\\ud800"}',
                b'{"url": "u", "content": "c", "x": NaN}',
                b"  \n",
                b'{"url": "u", "content": "c", "id": ' + b"1" * 25 + b"}",
                b'{"url": "u", "content": "c", "n": -' + b"9" * 150 + b"}",
            ]
        ),
    )
)
def test_records_read_by_orjson_are_read_as_by_json(raw):
    import streamdedup.engine.records as records

    assert records.orjson is not None  # (the test compares two ways of reading only while orjson is installed)
    with patch.object(records, "_C", None):  # (the plain record's reader in C: the test below)
        with_orjson = outcome(raw)
        with patch.object(records, "orjson", None):
            assert outcome(raw) == with_orjson


# ---------------------------------------------------------------- the plain record's reader in C
def test_the_plain_record_reader_is_built():
    import streamdedup.engine.records as records

    assert records._C is not None, "streamdedup/engine/_records.c was not built: pip install -e . again"


TEXTS = st.text(
    st.one_of(
        st.characters(codec="utf-8"),  # (no lone surrogate: they come from SURROGATE_TEXTS)
        st.sampled_from(
            ['"', "\\", "/", "\n", "\r", "\t", "\b", "\f", "\x00", "\x01", "\x1c", "\x1f", "\x7f"]
            + ["\u2028", "\xa0", "\u3000", "\ufeff", "😀", "é", "<", ">", " "]
        ),
    ),
    max_size=40,
)
SURROGATE_TEXTS = st.builds(
    lambda a, s, b: a + s + b, TEXTS, st.sampled_from(["\ud800", "\udfff", "\udbff\udc00"]), TEXTS
)
PLAIN = st.fixed_dictionaries(
    {"url": st.one_of(st.just("http://a/"), TEXTS), "content": st.one_of(st.just("<p>hi there</p>"), TEXTS)},
    optional={
        "id": st.one_of(st.none(), TEXTS, st.integers()),
        "content_type": st.one_of(st.none(), st.just("text/html"), st.just("text/plain"), TEXTS),
        "fetched_at": st.one_of(st.none(), st.just("2026-01-01T00:00:00Z"), TEXTS),
        "extra": JSON_VALUES,
    },
)


def _dumps(d: dict, ascii_only: bool, spaced: bool) -> bytes:
    seps = (" ,\n ", " : ") if spaced else (",", ":")
    return json.dumps(d, ensure_ascii=ascii_only, separators=seps).encode("utf-8", "surrogatepass")


def _mutate(raw: bytes, at: int, how: int, byte: int) -> bytes:
    at %= len(raw) + 1
    return [raw[:at], raw[:at] + bytes([byte]) + raw[at:], raw[:at] + raw[at + 1 :], raw + b" \t\r\n"][how]


RAW_RECORDS = st.one_of(
    st.builds(_dumps, PLAIN, st.booleans(), st.booleans()),
    st.builds(_dumps, PLAIN.map(lambda d: {**d, "content": d["content"] + "x"}), st.booleans(), st.booleans()),
    st.builds(lambda d, t: _dumps({**d, "content": t}, True, False), PLAIN, SURROGATE_TEXTS),
    st.builds(
        _mutate,
        st.builds(_dumps, PLAIN, st.booleans(), st.booleans()),
        st.integers(0, 10**6),
        st.integers(0, 3),
        st.integers(0, 255),
    ),
    st.sampled_from(
        [
            b'{"url": "a", "url": "b", "content": "x"}',  # a key twice: the last wins in json
            b'{"url": "a", "content": "x", "content": "y"}',
            b'{"u\\u0072l": "a", "content": "x"}',  # an escape in a key
            b'{"url": "a", "content": "x\\u0000y"}',
            b'{"url": "a", "content": "\\u00a0\\u2003 "}',  # only spaces, by str.isspace
            b'{"url": "a", "content": "\\u001c\\u001d"}',
            b'{"url": "a", "content": "\xc2\xa0\xe2\x80\x83"}',
            b'{"url": "a", "content": "\xed\xa0\x80"}',  # a surrogate in UTF-8: not UTF-8
            b'{"url": "a", "content": "\xc0\xaf"}',  # an overlong form
            b'{"url": "a", "content": "\xf4\x90\x80\x80"}',  # above U+10FFFF
            b'{"url": "a", "content": "x\\q"}',
            b'{"url": "a\\/b", "content": "<p>\\"\\\\\\/\\b\\f\\n\\r\\t\\u00E9\\uD83D\\uDE00</p>"}',  # every escape
            b'{"url": "a", "content": "x\\u12G4"}',
            b'{"url": "a", "content": "x"} {}',
            b'{"url": "a", "content": "x",}',
            b'{"url": "a" "content": "x"}',
            b'{"url": null, "content": "x"}',
            b'{"url": "a", "content": "x", "id": null, "content_type": null, "fetched_at": null}',
            b'{"url": "a", "content": "x", "id": true}',
            b'\xef\xbb\xbf{"url": "a", "content": "x"}',
            b"{}",
            b" { } ",
            b'{"url": "a", "content": "' + b"\\u0001" * 30 + b'<p>x</p>"}',  # binary by its controls
        ]
    ),
)


def _reading(raw: bytes):
    try:
        page = page_from_json(raw)
    except RecordError as e:
        return ("error", e.reason, str(e))
    content = page.content.text() if isinstance(page.content, Utf8Text) else page.content
    try:
        text = visible_text(page.content, page.content_type)
    except RecordError as e:
        text = ("error", e.reason, str(e))
    return (page.id, page.url, content, page.content_type, page.fetched_at, text)


@settings(max_examples=600, deadline=None)
@given(RAW_RECORDS)
def test_the_c_reader_reads_a_record_as_orjson_and_json_do(raw):
    # The same page (its content as the same text) and the same visible text, or the same error,
    # whether the record is plain (read in C) or not (read by orjson and json as before).
    import streamdedup.engine.records as records

    fast = _reading(raw)
    with patch.object(records, "_C", None):
        assert _reading(raw) == fast


@given(st.one_of(TEXTS, st.text(st.sampled_from(" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u2003\u3000x\x01"))))
def test_the_checks_of_a_utf8_text_are_those_of_its_str(text):
    from streamdedup.fingerprinting.text import _check_text, _check_utf8_text

    def check(f, arg):
        try:
            f(arg)
        except RecordError as e:
            return (e.reason, str(e))

    assert check(_check_utf8_text, text.encode()) == check(_check_text, text)


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_plain_record_is_read_in_c_and_its_content_stays_utf8(ascii_only):
    import streamdedup.engine.records as records

    content = '<p class="a">Café — “quoted”\n\ttabs \\ slash/ 😀 \u2028</p>'
    raw = json.dumps(
        {"url": "http://a/é", "content": content, "id": "i", "content_type": None}, ensure_ascii=ascii_only
    )
    assert records._C.flat_record(raw.encode()) is not None  # (so the test above compares two readers)
    page = page_from_json(raw.encode())
    assert isinstance(page.content, Utf8Text) and page.content.data == content.encode()
    assert (page.url, page.id, page.content_type, page.content.text()) == ("http://a/é", "i", None, content)
    assert visible_text(page.content) == visible_text(content)


def test_a_page_read_in_c_goes_to_a_process_pool_and_back():
    import pickle

    page = page_from_json(b'{"url": "http://a/", "content": "<p>alpha \\u00e9</p>"}')
    assert pickle.loads(pickle.dumps(page)) == page and isinstance(page.content, Utf8Text)


def test_a_line_over_the_limit_is_too_large_and_never_held_whole():
    """A file without a line end (a .tar given by mistake) was read into memory at once, whatever
    --max-page-bytes said; ``scan`` and ``produce`` read their lines through the same reader."""
    import tracemalloc

    from streamdedup.cli.crawler import _read

    huge = b"x" * 40_000_000
    good = json.dumps({"url": "http://a/", "content": "<p>fine</p>"}).encode()
    data = good + b"\n" + huge + b"\n" + good + b"\n"
    tracemalloc.start()
    try:
        got = [(n, p.reason if isinstance(p, RecordError) else p.url) for n, p in read_jsonl(io.BytesIO(data), 1024)]
        sent = [
            (n, x.reason if isinstance(x, RecordError) else len(x)) for n, x in _read(io.BytesIO(data), "jsonl", 1024)
        ]
        peak = tracemalloc.get_traced_memory()[1] - len(data)  # (the test's own copy of the data aside)
    finally:
        tracemalloc.stop()
    assert got == [(1, "http://a/"), (2, "too_large"), (3, "http://a/")]
    assert sent == [(1, len(good)), (2, "too_large"), (3, len(good))]
    assert peak < 8_000_000, peak


@pytest.mark.parametrize("kind", ["jsonl.gz", "warc", "warc.gz"])
def test_a_pipe_whose_first_write_is_one_byte_is_still_recognised(kind):
    """A pipe given as a path (``<(zcat ...)``, /dev/stdin) is opened once and its first bytes are
    peeked to tell gzip and WARC apart; a writer whose first write is 1 byte made the peek see 1
    byte: a .jsonl.gz was read as 3 lines of binary, a WARC as JSON lines."""
    pages = [(f"http://x/{i}", f"<p>page {i} words words</p>".encode(), "text/html") for i in range(3)]
    if kind == "jsonl.gz":
        lines = b"".join(json.dumps({"url": u, "content": c.decode()}).encode() + b"\n" for u, c, _ in pages)
        data = gzip.compress(lines)
    else:
        data = _warc(pages, kind == "warc.gz")
    read_end, write_end = os.pipe()

    def write() -> None:
        with os.fdopen(write_end, "wb", buffering=0) as w:
            w.write(data[:1])
            time.sleep(0.3)  # (the reader's first read returns the 1 byte alone)
            w.write(data[1:])

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    path = Path(f"/dev/fd/{read_end}")
    try:
        with open_input(path) as raw:
            fmt = sniff_format(path, raw)
            got = [p for _, p in records_of(raw, fmt)]
    finally:
        os.close(read_end)
        writer.join(10)
    assert fmt == ("jsonl" if kind == "jsonl.gz" else "warc")
    assert [p.url for p in got] == [u for u, _, _ in pages], got
