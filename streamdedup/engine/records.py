"""Crawled pages as they arrive: the JSON record contract, JSON-lines files and WARC files.

A record is a JSON object ``{"url", "content", "content_type"?, "fetched_at"?, "id"?}``; the
id defaults to the URL.  Anything else is a :class:`RecordError` with a short ``reason`` that
the stream layer puts on the dead-letter topic and ``scan`` reports with its line number.

>>> page_from_json(b'{"url": "http://a/", "content": "hi"}').id
'http://a/'
>>> page_from_json(b'{"url": "http://a/"}')
Traceback (most recent call last):
...
streamdedup.errors.RecordError: missing_field: the record has no "content" (a string)
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from streamdedup.errors import RecordError
from streamdedup.fingerprinting.text import Utf8Text, utf8_blank, visible_text

try:  # the plain record in one pass, its content left as UTF-8 (setup.py: optional)
    from streamdedup.engine import _records as _C  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - built by pip install; orjson and json read the same pages
    _C = None

try:  # a faster JSON parser (~1.5x on escaped text, more on UTF-8), for the records it reads as json does
    import orjson
except ImportError:  # pragma: no cover - a dependency, but json alone gives the same pages
    orjson = None  # type: ignore[assignment]

__all__ = [
    "Page",
    "RecordError",
    "page_text",
    "page_from_json",
    "read_jsonl",
    "read_warc",
    "DAMAGED_WARC",
    "read_pages",
    "sniff_format",
    "open_input",
    "records_of",
    "bounded_lines",
    "GZIP_MAGIC",
    "buffered",
    "gunzipped",
]

#: Default upper bound on a record's size; pages above it are rejected, not truncated.
DEFAULT_MAX_PAGE_BYTES = 5 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Page:
    """One crawled page.  ``content`` is text: a ``str``, or a :class:`Utf8Text` (as
    :func:`page_from_json` reads a plain record's); or bytes to decode with ``charset``."""

    id: str
    url: str
    content: str | bytes | Utf8Text
    content_type: str | None = None
    charset: str | None = None
    fetched_at: str | None = None


#: Limits on the fields that travel inside the worker's internal messages (probes, answers,
#: the shards' changelog) and in output keys and headers, in UTF-8 bytes.  A record over one is
#: a dead letter (``too_long``), never a message too large for the broker.
MAX_ID_BYTES = 8192
MAX_URL_BYTES = 8192
#: Limits that keep parsing one record cheap and confined to that record: JSON nesting
#: (Python's C parser stops at its recursion limit, ~1000 levels, with a RecursionError that
#: is caught for this record; the rest is refused after parsing) and the digits of an
#: integer (Python's int() refuses more than 4300).  No page record needs anything near them.
MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 100

# a letter or digit: a text holds a word (features.words) if and only if it holds one of these
_A_WORD = re.compile(r"[^\W_]")


def _json_depth(value: object, limit: int) -> int:
    """How deep the arrays and objects of a parsed value nest, counted up to ``limit + 1``."""
    depth, level = 0, [value]
    while level and depth <= limit:
        nested = [v for x in level if isinstance(x, (dict, list)) for v in (x.values() if isinstance(x, dict) else x)]
        depth += 1
        level = [x for x in nested if isinstance(x, (dict, list))]
    return depth


def _has_float(value: object) -> bool:
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, float):
            return True
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


_TO_JSON = object()


def _by_orjson(raw: bytes | str) -> object:
    """The record as ``json.loads`` reads it, where orjson reads it the same; else ``_TO_JSON``.

    orjson refuses what json takes (NaN, Infinity, lone surrogates, a BOM) and reads an integer
    beyond 64 bits as a float (json: the exact int, or our ``bad_field`` past 100 digits); so a
    record it refuses, or one holding a float, is left to json, which decides it (and its error).
    """
    if orjson is None:  # pragma: no cover
        return _TO_JSON
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _TO_JSON
    return _TO_JSON if _has_float(data) else data


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise RecordError(
            "bad_field", f"the record holds an integer of {len(digits)} digits (the limit is {MAX_INT_DIGITS})"
        )
    return int(digits)


def _strict(name: str, value: str, limit: int | None = None) -> None:
    """``value`` must be valid UTF-8 (no lone surrogates from ``\\ud800`` escapes) and, with
    ``limit``, at most that many bytes."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise RecordError(
            "bad_field",
            f'"{name}" holds a lone surrogate ({value[e.start]!r} at character {e.start}), which is not valid UTF-8',
        ) from None
    if limit is not None and size > limit:
        raise RecordError("too_long", f'"{name}" is {size} bytes, over the limit of {limit}')


def page_from_json(raw: bytes | str, max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Page:
    r"""Validate one JSON record (bytes as they came off the wire) and make it a :class:`Page`.

    Every failure is a :class:`RecordError` about this record alone: nesting and integers are
    bounded (``not_json`` / ``bad_field``), ids and URLs must be valid UTF-8 (``bad_field``)
    and short enough to travel (``too_long``).

    >>> page_from_json('{"url": "http://a/", "content": "hi", "n": ' + "9" * 200 + "}")
    Traceback (most recent call last):
    ...
    streamdedup.errors.RecordError: bad_field: the record holds an integer of 200 digits (the limit is 100)
    >>> page_from_json(b'{"url": "http://a/", "id": "sur\\ud800", "content": "hi"}')
    Traceback (most recent call last):
    ...
    streamdedup.errors.RecordError: bad_field: "id" holds a lone surrogate ('\ud800' at character 3), which is not valid UTF-8
    """
    if len(raw) > max_bytes:
        raise RecordError("too_large", f"the record is {len(raw)} bytes, over the limit of {max_bytes}")
    plain = _C.flat_record(raw) if _C is not None and type(raw) is bytes else None
    if plain is not None:  # a flat object of strings: its values as json gives them, the content as UTF-8
        url, data, id_, content_type, fetched_at = plain
        return _checked(url, Utf8Text(data), utf8_blank(data), id_, content_type, fetched_at)
    data = _by_orjson(raw)
    if data is _TO_JSON:
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RecordError("not_utf8", f"the record is not UTF-8 ({e.reason} at byte {e.start})") from None
        if not raw or raw.isspace():
            raise RecordError("empty", "the record is empty")
        try:
            data = json.loads(raw, parse_int=_bounded_int)
        except json.JSONDecodeError as e:
            raise RecordError(
                "not_json", f"the record is not JSON ({e.msg} at line {e.lineno} column {e.colno})"
            ) from None
        except RecursionError:  # the C parser counts its nesting against the recursion limit: this record only
            raise RecordError("not_json", f"the record nests deeper than {MAX_JSON_DEPTH} levels") from None
    if _json_depth(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise RecordError("not_json", f"the record nests deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(data, dict):
        raise RecordError("not_object", f"the record is a JSON {type(data).__name__}, not an object")
    for name in ("url", "content"):
        if name not in data or data[name] is None:
            raise RecordError("missing_field", f'the record has no "{name}" (a string)')
        if not isinstance(data[name], str):
            raise RecordError("bad_field", f'"{name}" must be a string, got {type(data[name]).__name__}')
    for name in ("id", "content_type", "fetched_at"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise RecordError("bad_field", f'"{name}" must be a string, got {type(data[name]).__name__}')
    content = data["content"]
    blank = not content or content.isspace()  # (not .strip(): no copy of the page)
    return _checked(data["url"], content, blank, data.get("id"), data.get("content_type"), data.get("fetched_at"))


def _checked(
    url: str, content: str | Utf8Text, blank: bool, id_: str | None, content_type: str | None, fetched_at: str | None
) -> Page:
    """The checks of a record's values, once they are known to be strings (``blank``: the content
    is empty or only spaces)."""
    if not url.strip():
        raise RecordError("missing_field", '"url" is empty')
    if blank:
        raise RecordError("empty", "the page content is empty")
    _strict("url", url, MAX_URL_BYTES)
    for name, value, limit in (
        ("id", id_, MAX_ID_BYTES),
        ("content_type", content_type, 1024),
        ("fetched_at", fetched_at, 1024),
    ):
        if value:
            _strict(name, value, limit)
    return Page(id=id_ or url, url=url, content=content, content_type=content_type, fetched_at=fetched_at)


Numbered = Iterator[tuple[int, "Page | RecordError"]]


def read_jsonl(stream: BinaryIO, max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Numbered:
    """(line number, page or error) for each non-blank line of a JSON-lines stream."""
    for number, line in enumerate(bounded_lines(stream, max_bytes), start=1):
        if isinstance(line, RecordError):
            yield number, line
            continue
        if not line or line.isspace():  # (not .strip(): no copy of the line)
            continue
        try:
            yield number, page_from_json(line.rstrip(b"\r\n"), max_bytes)
        except RecordError as e:
            yield number, e


def bounded_lines(stream: BinaryIO, max_bytes: int) -> Iterator[bytes | RecordError]:
    """The lines of ``stream``, each with its line end; a line over ``max_bytes`` (its end not
    counted) is a ``too_large`` error instead, read past in pieces and never held whole (a file
    with no line end, a .tar given by mistake, would otherwise be read into memory at once).

    >>> [x if isinstance(x, bytes) else x.reason for x in bounded_lines(io.BytesIO(b"ab\\nabcdef\\r\\nabc"), 4)]
    [b'ab\\n', 'too_large', b'abc']
    """
    while line := stream.readline(max_bytes + 3):  # (the line and a "\r\n", and one byte to tell)
        if len(line) <= max_bytes or len(line.rstrip(b"\r\n")) <= max_bytes:
            yield line
            continue
        size = len(line.rstrip(b"\r\n"))
        while not line.endswith(b"\n") and (line := stream.readline(1 << 20)):
            size += len(line.rstrip(b"\r\n"))
        yield RecordError("too_large", f"the record is {size} bytes, over the limit of {max_bytes}")


#: What ``produce`` and ``scan`` exit with after a ``bad_warc`` record (what followed was not read)
DAMAGED_WARC = (
    "a WARC file is damaged or cut short (its bad_warc line above says where): what follows the damage "
    "was not read; repair or fetch the file again, then run again"
)


def read_warc(stream: BinaryIO, max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Numbered:
    """(record number, page or error) for each HTTP response record with a 2xx status of a
    WARC / WARC.gz (what a crawl fetched as a page, as the Scrapy pipeline sends).

    The charset comes from the HTTP ``Content-Type`` header; the id is the target URI.  Other
    records are skipped: request, metadata, warcinfo, revisit, responses that are not HTTP
    (Heritrix's ``dns:`` records) and 3xx/4xx/5xx responses.  A record cut short (its bytes end
    before its ``Content-Length``) is a ``bad_warc`` error, not a page; so is damage warcio
    trips over (it raises what it meets, not only ``ArchiveLoadFailed``), after which nothing
    more is read, and bytes left after the last record it could read (warcio stops quietly at
    a truncated gzip member), also on a stream that cannot seek (a pipe on stdin).
    """
    from warcio.archiveiterator import ArchiveIterator

    class Records(ArchiveIterator):
        cut_member = False  # the last gzip member ended before its end (warcio closes it quietly)

        def close(self) -> None:
            decompressor = getattr(self.reader, "decompressor", None)
            self.cut_member = decompressor is not None and not getattr(decompressor, "eof", True)
            super().close()

    counted = stream if stream.seekable() else _Counted(stream)
    number, cut_at = 0, -1
    records = Records(counted)
    iterator = iter(records)
    while True:
        try:
            record = next(iterator, None)
        except Exception as e:  # damaged bytes: warcio raises ArchiveLoadFailed, AttributeError, ValueError...
            if number == 0:  # (nothing read yet: the wrong --input-format, more often than damage)
                yield 1, _damaged("at its start, or it is not a WARC (JSON lines? then --input-format jsonl)", e)
            else:
                yield number + 1, _damaged(f"after record {number}", e)
            return
        if record is None:
            break
        number += 1
        try:
            page = record.rec_type == "response" and _fetched_page(record.http_headers)
            if page:
                url = record.rec_headers.get_header("WARC-Target-URI") or ""
                fetched = record.rec_headers.get_header("WARC-Date")
                mime, charset = _split_content_type(record.http_headers.get_header("Content-Type"))
                body = record.content_stream().read(max_bytes + 1)
            while record.raw_stream.read(1 << 16):  # the rest (as warcio would): is it all there?
                pass
            # A record without a length, which WARC and ARC require, or with a part of one:
            # a header block cut short (warcio reads headers up to the end), or bytes that are
            # no WARC at all (warcio takes a JSON line with spaces for an ARC header)
            length = record.rec_headers.get_header("Content-Length" if record.format == "warc" else "length")
            headless = not (length or "").strip().isdigit()
            cut = not headless and getattr(record.raw_stream, "limit", 0) > 0
        except Exception as e:  # (as above: a header or body warcio cannot read)
            yield number, _damaged(f"in record {number}", e)
            return
        if headless:
            yield (
                number,
                RecordError(
                    "bad_warc",
                    f"record {number} has no valid length in its header: the file is damaged or cut short, or it is "
                    "not a WARC (JSON lines? then --input-format jsonl)",
                ),
            )
            return
        if cut:
            what = f"the record of {url[:200]}" if page else f"record {number}"
            yield number, RecordError("bad_warc", f"{what} ends before its Content-Length")
            cut_at = number  # (the damage the end check below would find again, if it is the last)
            continue
        if not page:
            continue
        if not url:
            yield number, RecordError("missing_field", "the response record has no WARC-Target-URI")
        elif len(body) > max_bytes:
            yield number, RecordError("too_large", f"the body is over the limit of {max_bytes} bytes")
        elif not body.strip():
            yield number, RecordError("empty", "the response body is empty")
        else:
            yield number, Page(url, url, body, mime, charset, fetched)
    # warcio stops quietly at a truncated gzip member: say so rather than lose the tail.
    if isinstance(counted, _Counted):
        more, size, empty = counted.beyond(records.offset), "?", counted.count == 0  # (a pipe's size: unknown)
    else:
        end = counted.seek(0, 2)
        more, size, empty = records.offset < end, str(end), end == 0
    if (more or (records.cut_member and not empty)) and cut_at != number:
        yield (
            number + 1,
            RecordError(
                "bad_warc",
                f"the WARC file ends in a damaged or truncated record at byte {records.offset} of {size}",
            ),
        )


def _damaged(where: str, error: Exception) -> RecordError:
    why = f"{type(error).__name__}: {error}".encode("unicode_escape").decode("ascii")[:300]  # (it may quote raw bytes)
    return RecordError("bad_warc", f"the WARC file is damaged {where} ({why})")


class _Counted(io.RawIOBase):
    """A stream that cannot seek (a pipe), counting the bytes read from it: where it ends is
    known only by reading to there."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.count = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)

    def beyond(self, offset: int) -> bool:
        """Whether the stream holds a byte after ``offset`` (reads on to find out, no further)."""
        while self.count <= offset:
            data = self.raw.read(1 << 16)
            if not data:
                return False
            self.count += len(data)
        return True


def _fetched_page(http_headers: Any) -> bool:
    """An HTTP response with a 2xx status."""
    if http_headers is None:
        return False
    code = http_headers.get_statuscode() or ""
    return code.isdigit() and 200 <= int(code) < 300


def _split_content_type(value: str | None) -> tuple[str | None, str | None]:
    """``"text/html; charset=ISO-8859-1"`` -> ``("text/html", "ISO-8859-1")``.

    >>> _split_content_type('text/html; Charset="utf-8"')
    ('text/html', 'utf-8')
    """
    if not value:
        return None, None
    mime, _, params = value.partition(";")
    charset = None
    for param in params.split(";"):
        name, _, val = param.partition("=")
        if name.strip().lower() == "charset":
            charset = val.strip().strip("\"'") or None
    return mime.strip().lower() or None, charset


def sniff_format(path: Path, raw: io.BufferedReader | None = None) -> str:
    """'warc' or 'jsonl', from the name and then the first bytes: peeked from ``raw`` (``path``
    opened, as :func:`open_input` does) when given, which leaves them to be read.  Without
    ``raw`` the path is opened to look: never so for a pipe (``<(zcat x)``, ``/dev/stdin``),
    whose bytes read here would be gone."""
    name = path.name.lower()
    if name.endswith((".warc", ".warc.gz", ".arc.gz")):
        return "warc"
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json")):
        return "jsonl"
    if raw is None:
        with path.open("rb") as f:
            return sniff_format(path, f)
    head = raw.peek(4)[:4]
    if head[:2] == GZIP_MAGIC:
        with gzip.GzipFile(fileobj=io.BytesIO(raw.peek(1 << 16))) as unzipped:
            try:
                head = unzipped.read(4)
            except (EOFError, OSError, zlib.error):
                return "jsonl"
    return "warc" if head.startswith(b"WARC") else "jsonl"


#: The first bytes of a gzip stream (and of each member of a WARC.gz).
GZIP_MAGIC = b"\x1f\x8b"


def open_input(path: Path) -> io.BufferedReader:
    """``path`` opened once for reading, buffered: its first bytes can be peeked, also when it
    is a pipe (opening it a second time would find what the first read took gone)."""
    return buffered(path.open("rb"))


def records_of(stream: BinaryIO, fmt: str, max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Numbered:
    """The numbered records of an opened input (a file from :func:`open_input`, or stdin):
    WARC / WARC.gz responses, or JSON lines, gunzipped when they start as gzip does."""
    raw = buffered(stream)
    if fmt == "warc":
        yield from read_warc(raw, max_bytes)
    else:
        with gunzipped(raw) as lines:
            yield from read_jsonl(lines, max_bytes)


#: Bytes a reader from :func:`buffered` can peek at (the gzip and WARC magic), and at the start
#: of a gzip stream (enough of it to gunzip the first bytes: :func:`sniff_format`).
HEAD_BYTES = 4
GZIP_HEAD_BYTES = 512


def buffered(stream: BinaryIO) -> io.BufferedReader:
    """``stream`` as a reader whose first bytes can be peeked without being consumed: at least
    :data:`HEAD_BYTES`, or :data:`GZIP_HEAD_BYTES` of a gzip stream (fewer only at its end).  A
    pipe's first read may give fewer (a writer's first write of 1 byte), and a ``peek`` makes
    one read: those are read here and put back in front."""
    raw = stream if isinstance(stream, io.BufferedReader) else io.BufferedReader(cast(Any, stream))
    head = raw.peek(GZIP_HEAD_BYTES)
    if not head or len(head) >= (GZIP_HEAD_BYTES if head[:2] == GZIP_MAGIC else HEAD_BYTES):
        return raw  # (nothing: at its end)
    got = raw.read(HEAD_BYTES)
    if got[:2] == GZIP_MAGIC:
        got += raw.read(GZIP_HEAD_BYTES - len(got))
    return io.BufferedReader(_Prefixed(got, raw))


class _Prefixed(io.RawIOBase):
    """``head``, then the rest of ``rest`` (closed with it)."""

    def __init__(self, head: bytes, rest: io.BufferedReader) -> None:
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = self._rest.read1(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._rest.close()
        super().close()


@contextmanager
def gunzipped(raw: io.BufferedReader) -> Iterator[BinaryIO]:
    """``raw``'s bytes, gunzipped when they start as gzip does (JSON lines may come either way)."""
    if raw.peek(2)[:2] == GZIP_MAGIC:
        with gzip.GzipFile(fileobj=raw) as unzipped:
            yield cast(BinaryIO, unzipped)
    else:
        yield cast(BinaryIO, raw)


def read_pages(path: Path, fmt: str = "auto", max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Numbered:
    """Records of a JSON-lines (optionally gzipped) or WARC file, numbered for error reports."""
    with open_input(path) as raw:
        yield from records_of(raw, sniff_format(path, raw) if fmt == "auto" else fmt, max_bytes)


def page_text(page: Page) -> str:
    """The visible main text of a page (raises :class:`streamdedup.errors.RecordError`).

    A page without a word of visible text (an app shell, a page of scripts and menus) is
    ``empty``: its fingerprint would be the same for all of them (0), so every such page
    would be a near-duplicate of every other.  ``scan``, the worker and ``POST /check`` all
    come through here.

    >>> page_text(Page("a", "a", "<div id='app'></div><script src='app.js'></script>"))
    Traceback (most recent call last):
    ...
    streamdedup.errors.RecordError: empty: no visible text to fingerprint
    """
    text = visible_text(page.content, page.content_type, page.charset)
    if _A_WORD.search(text) is None:
        raise RecordError("empty", "no visible text to fingerprint")
    return text
