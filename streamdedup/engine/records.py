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
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from streamdedup.errors import RecordError
from streamdedup.fingerprinting.text import visible_text

__all__ = [
    "Page",
    "RecordError",
    "page_text",
    "page_from_json",
    "read_jsonl",
    "read_warc",
    "read_pages",
    "sniff_format",
]

#: Default upper bound on a record's size; pages above it are rejected, not truncated.
DEFAULT_MAX_PAGE_BYTES = 5 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Page:
    """One crawled page.  ``content`` is text, or bytes to decode with ``charset``."""

    id: str
    url: str
    content: str | bytes
    content_type: str | None = None
    charset: str | None = None
    fetched_at: str | None = None


def page_from_json(raw: bytes | str, max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Page:
    """Validate one JSON record (bytes as they came off the wire) and make it a :class:`Page`."""
    if len(raw) > max_bytes:
        raise RecordError("too_large", f"the record is {len(raw)} bytes, over the limit of {max_bytes}")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecordError("not_utf8", f"the record is not UTF-8 ({e.reason} at byte {e.start})") from None
    if not raw.strip():
        raise RecordError("empty", "the record is empty")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RecordError("not_json", f"the record is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
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
    if not data["url"].strip():
        raise RecordError("missing_field", '"url" is empty')
    if not data["content"].strip():
        raise RecordError("empty", "the page content is empty")
    return Page(
        id=data.get("id") or data["url"],
        url=data["url"],
        content=data["content"],
        content_type=data.get("content_type"),
        fetched_at=data.get("fetched_at"),
    )


Numbered = Iterator[tuple[int, "Page | RecordError"]]


def read_jsonl(stream: BinaryIO, max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Numbered:
    """(line number, page or error) for each non-blank line of a JSON-lines stream."""
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            yield number, page_from_json(line.rstrip(b"\r\n"), max_bytes)
        except RecordError as e:
            yield number, e


def read_warc(stream: BinaryIO, max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Numbered:
    """(record number, page or error) for each HTTP response record of a WARC / WARC.gz.

    The charset comes from the HTTP ``Content-Type`` header; the id is the target URI.
    Non-response records (request, metadata, warcinfo, revisit) are skipped.
    """
    from warcio.archiveiterator import ArchiveIterator
    from warcio.exceptions import ArchiveLoadFailed

    number = 0
    records = ArchiveIterator(stream)
    try:
        for record in records:
            number += 1
            if record.rec_type != "response":
                continue
            url = record.rec_headers.get_header("WARC-Target-URI") or ""
            fetched = record.rec_headers.get_header("WARC-Date")
            ctype_header = record.http_headers.get_header("Content-Type") if record.http_headers else None
            mime, charset = _split_content_type(ctype_header)
            body = record.content_stream().read(max_bytes + 1)
            if not url:
                yield number, RecordError("missing_field", "the response record has no WARC-Target-URI")
            elif len(body) > max_bytes:
                yield number, RecordError("too_large", f"the body is over the limit of {max_bytes} bytes")
            elif not body.strip():
                yield number, RecordError("empty", "the response body is empty")
            else:
                yield number, Page(url, url, body, mime, charset, fetched)
    except ArchiveLoadFailed as e:
        yield number + 1, RecordError("bad_warc", f"the WARC file is damaged after record {number}: {e}")
        return
    # warcio stops quietly at a truncated gzip member: say so rather than lose the tail.
    if stream.seekable():
        size = stream.seek(0, 2)
        if records.offset < size:
            yield (
                number + 1,
                RecordError(
                    "bad_warc",
                    f"the WARC file ends in a damaged or truncated record at byte {records.offset} of {size}",
                ),
            )


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


def sniff_format(path: Path) -> str:
    """'warc' or 'jsonl', from the name and then the first bytes."""
    name = path.name.lower()
    if name.endswith((".warc", ".warc.gz", ".arc.gz")):
        return "warc"
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json")):
        return "jsonl"
    head = _open(path).read(4)
    return "warc" if head.startswith(b"WARC") else "jsonl"


def _open(path: Path) -> BinaryIO:
    raw = path.open("rb")
    if raw.read(2) == b"\x1f\x8b" and not path.name.lower().endswith((".warc.gz", ".arc.gz")):
        raw.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    raw.seek(0)
    return raw


def read_pages(path: Path, fmt: str = "auto", max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> Numbered:
    """Records of a JSON-lines (optionally gzipped) or WARC file, numbered for error reports."""
    fmt = sniff_format(path) if fmt == "auto" else fmt
    with _open(path) as stream:
        reader = read_warc if fmt == "warc" else read_jsonl
        yield from reader(stream, max_bytes)


def page_text(page: Page) -> str:
    """The visible main text of a page (raises :class:`streamdedup.errors.RecordError`)."""
    return visible_text(page.content, page.content_type, page.charset)
