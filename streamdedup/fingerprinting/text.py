"""Raw crawled page -> normalised visible main text (what the fingerprinting modules consume).

Output: NFKC; controls, invisible format characters (soft hyphen, ZWSP, bidi marks, BOM) and private-use
icon glyphs removed; whitespace runs collapsed to one space; stripped.  Block boundaries become a space
(``<p>a</p><p>b</p>`` -> ``a b``), inline elements never split a word (``<b>wo</b>rd`` -> ``word``);
entities decoded; attributes and comments ignored.  A dropped element vanishes without leaving a space,
as if the page never contained it.

Dropped from HTML: (1) always (``_ALWAYS_DROP``): ``head`` -- so ``<title>`` is NOT part of the text, as
mirrors rewrite titles --, scripts, styles, ``noscript``, ``template``, ``svg``, ``math``, embedded
objects/media, frames, form controls, ``dialog``, ``rp``; (2) ``nav``, ``aside``, ``footer``; ``header``
unless inside ``article``/``main`` (there it holds the title); ``form`` unless it wraps the page (ASP.NET):
one wrapping ``main``, holding ``h1``/``h2``/``main``/``article`` or >= 1000 chars stays; (3) ``hidden``
(not ``until-found``), ``aria-hidden="true"``, inline ``display:none``/``visibility:hidden``, ARIA roles
``_ROLES``; (4) class tokens and ids flagged by ``_boiler_key`` (nav, menu, sidebar, footer, breadcrumb,
cookie/consent/gdpr, ad/ads/advert, sponsor, share/social, pagination, sr-only, comment-count...;
token-based, so ``header-anchor``, ``download``, ``shadow``, ``has-sidebar``, ``nav-open`` stay) and custom
elements so named (``<cookie-banner>``).  Attributes are inspected on block and custom elements and
``span/ins/small/label`` (not on ``a``, ``code``, ``em``...: cost).  Guards: ``html``, ``body``,
``main``/``[role=main]`` (else ``article``) and their ancestors are never dropped by rules (3)-(4); with
no such anchor, a (3)-(4) match holding over half the page text is kept.
"""

from __future__ import annotations

import codecs
import os
import re
import unicodedata
from functools import lru_cache

from selectolax.lexbor import LexborHTMLParser, LexborNode, SelectolaxError

from streamdedup.errors import RecordError

__all__ = [
    "RecordError",
    "Utf8Text",
    "text_mime",
    "sniff_content_type",
    "decode_body",
    "visible_text",
    "normalize_text",
]


class Utf8Text:
    """A page's text held as its UTF-8 bytes (``data``: a record's content read straight from its
    JSON, never made a ``str``): :func:`visible_text` reads it as the ``str`` it encodes, where
    bytes would be decoded by a charset found for them.  Valid UTF-8, no lone surrogate, no NUL."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def text(self) -> str:
        return self.data.decode("utf-8")

    def __eq__(self, other: object) -> bool:
        return type(other) is Utf8Text and other.data == self.data

    def __hash__(self) -> int:
        return hash((Utf8Text, self.data))

    def __repr__(self) -> str:
        return f"Utf8Text({self.data[:60]!r}{'...' if len(self.data) > 60 else ''})"


_EMPTY = "page has no content"
_SPACES = re.compile("  +")
_ASCII_PRINTABLE = bytes(range(0x20, 0x7F))
# controls, invisible format characters (soft hyphen, ZWSP, bidi marks, BOM), surrogates, private-use icons
_JUNK_RANGES = (
    (0x00, 0x08), (0x0E, 0x1B), (0x7F, 0x84), (0x86, 0x9F), (0xAD, 0xAD), (0x200B, 0x200B), (0x200E, 0x200F),
    (0x202A, 0x202E), (0x2060, 0x2064), (0x2066, 0x2069), (0xD800, 0xDFFF), (0xE000, 0xF8FF), (0xFEFF, 0xFEFF),
)  # fmt: skip
_JUNK = re.compile("[" + "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in _JUNK_RANGES) + "]+")


def _junk_split(text: str, compiled: bool = True) -> str:
    """``" ".join(_JUNK.sub("", text).split())`` (in C where it was built)."""
    return _C.junk_split(text) if compiled and _C is not None else " ".join(_JUNK.sub("", text).split())


def normalize_text(text: str, compiled: bool = True) -> str:
    """NFKC, drop controls/invisible format chars/private-use icons, collapse whitespace, strip.
    ``compiled=False``: no C part (``_html_walk.c``), for comparing; the result is the same.

    >>> normalize_text(" \\uff21\\ufb01\\u00ad x\\n\\t y\\u2026\\u00a0z ")
    'Afi x y... z'
    """
    return _normalize_collapsed(
        _SPACES.sub(" ", text.replace("\n", " ").replace("\t", " ").replace("\r", " ").replace("\xa0", " ")),
        compiled=compiled,
    )


def _normalize_collapsed(text: str, rb: bytes | None = None, compiled: bool = True) -> str:
    """normalize_text after its first step (newlines, tabs, CRs and NBSPs made spaces, space runs one);
    ``rb``: the first line below, where the caller has it already."""
    if text.isascii():
        return (text if text.isprintable() else _junk_split(text, compiled)).strip()
    # Unicode property checks cost ~25 instructions/char: run them on the non-ASCII characters only.
    if rb is None:
        rb = text.encode("utf-8", "surrogatepass").translate(None, _ASCII_PRINTABLE)
    rare = rb.decode("utf-8", "surrogatepass")
    if not rare.isprintable():  # controls, format chars, unusual whitespace, private-use icons
        text = _junk_split(text, compiled)
        rb = text.encode("utf-8").translate(None, _ASCII_PRINTABLE)
        rare = rb.decode("utf-8")
    if b"\xcc" not in rb and b"\xcd" not in rb and unicodedata.is_normalized("NFKC", rare):
        return text.strip()  # (U+0300.. are Latin combining marks that may compose with an ASCII letter)
    fixes = {c: unicodedata.normalize("NFKC", c) for c in set(rare)} if len(rare) < 2000 else {}
    fixes = {c: n for c, n in fixes.items() if c != n}
    if fixes and not any(
        unicodedata.category(c)[0] == "M"
        or "\u1100" <= c <= "\u11ff"
        or "\ua960" <= c <= "\ua97f"
        or "\ud7b0" <= c <= "\ud7ff"
        for c in set(rare).union(*fixes.values())
    ):
        for c, n in fixes.items():  # no combining marks or conjoining jamo: NFKC is context-free here
            text = text.replace(c, n)
        # The text came without two spaces in a row: only a replacement with a space can make them.
        # (Asking `"  " in text` costs ~5 ns a character on a non-Latin-1 text: 76 us on 14 K.)
        spaced = any(" " in n or not n for n in fixes.values())
    else:
        text = unicodedata.normalize("NFKC", text)
        spaced = "  " in text
    return (_SPACES.sub(" ", text) if spaced else text).strip()  # NFKC: U+00A8 -> " \u0308"


# ---------------------------------------------------------------- content types and decoding
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_SNIFF_TYPES = frozenset({"", "unknown/unknown", "application/unknown", "*/*"})
_CT_CHARSET = re.compile(r"charset\s*=\s*[\"']?([^\"';\s]+)", re.I)
_SNIFF = re.compile(
    r"<(?:!doctype\s+html|html|head|body|title|meta|link|base|script|style|div|p|br|hr|table|tr|td|"
    r"h[1-6]|a|span|ul|ol|li|b|i|u|em|strong|font|iframe|frameset|center|img|form|pre|section|article|"
    r"nav|main)(?=[\s/>])|<!--",
    re.I,
)
_MAGIC = (
    b"\x89PNG",
    b"%PDF-",
    b"PK\x03\x04",
    b"PK\x05\x06",
    b"\x1f\x8b",
    b"GIF87a",
    b"GIF89a",
    b"\xff\xd8\xff",
    b"RIFF",
    b"OggS",
    b"ID3",
    b"fLaC",
    b"wOFF",
    b"wOF2",
    b"\x7fELF",
    b"\xfd7zXZ\x00",
    b"7z\xbc\xaf\x27\x1c",
    b"Rar!\x1a\x07",
    b"\x28\xb5\x2f\xfd",
    b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1",
    b"\xca\xfe\xba\xbe",
    b"\x00asm",
    b"II*\x00",
    b"MM\x00*",
    b"\x1a\x45\xdf\xa3",
    b"\x00\x00\x01\x00",
)
_CTRL = bytes(range(0, 9)) + b"\x0b" + bytes(range(0x0E, 0x1B)) + bytes(range(0x1C, 0x20)) + b"\x7f"
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_META = re.compile(
    rb"<meta[^>]*?charset\s*=\s*[\"']?\s*([a-z0-9_.:\-]+)"
    rb"|^\s*<\?xml[^>]*?encoding\s*=\s*[\"']([a-z0-9_.:\-]+)",
    re.I,
)
# WHATWG label -> Python codec where Python lacks the alias or is stricter than browsers.
_LABELS = {
    "iso-8859-1": "cp1252",
    "iso8859-1": "cp1252",
    "latin1": "cp1252",
    "latin-1": "cp1252",
    "ascii": "cp1252",
    "us-ascii": "cp1252",
    "iso-8859-9": "cp1254",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "x-gbk": "gb18030",
    "euc-kr": "cp949",
    "shift_jis": "cp932",
    "sjis": "cp932",
    "x-sjis": "cp932",
    "ms_kanji": "cp932",
    "windows-31j": "cp932",
    "big5": "big5hkscs",
    "tis-620": "cp874",
    "iso-8859-11": "cp874",
    "iso-8859-8-i": "iso8859-8",
    "unicode": "utf-16-le",
    "unicode-1-1-utf-8": "utf-8",
    "x-mac-roman": "mac-roman",
}
_BAD_CODECS = frozenset("utf-7 unicode-escape raw-unicode-escape idna punycode undefined charmap".split())
_UTF16 = frozenset({"utf-16-le", "utf-16-be"})


def _split_ct(content_type: str | None) -> tuple[str, str | None]:
    mime, _, params = (content_type if isinstance(content_type, str) else "").partition(";")
    m = _CT_CHARSET.search(params)
    return mime.strip().lower(), (m.group(1) if m else None)


def text_mime(content_type: str | None) -> str:
    """The MIME type of a content type the extractor takes: HTML, plain text, or unknown ("",
    to sniff); anything else is ``RecordError('not_text')``.

    >>> text_mime("text/HTML; charset=utf-8"), text_mime(None)
    ('text/html', '')
    """
    mime = _split_ct(content_type)[0]
    if mime in _SNIFF_TYPES:
        return ""
    if mime not in _HTML_TYPES and mime != "text/plain":
        raise RecordError("not_text", f"content type {mime!r} is neither HTML nor plain text")
    return mime


def sniff_content_type(content: str | bytes) -> str:
    """Guess ``'text/html'`` or ``'text/plain'`` from the first ~1 KB.

    >>> sniff_content_type(b"<!DOCTYPE html><p>hi"), sniff_content_type("just 1 < 2 text")
    ('text/html', 'text/plain')
    """
    head = content[:4096]
    if not isinstance(head, str):
        head = bytes(head).replace(b"\x00", b"").decode("latin-1")
    return "text/html" if _SNIFF.search(head.lstrip()[:1024]) else "text/plain"


@lru_cache(maxsize=512)
def _codec(label: str | None) -> str | None:
    """Charset label -> usable Python text codec name, or None if unknown/unsafe."""
    if not isinstance(label, str) or not label or len(label) > 40:
        return None
    label = label.strip().strip("\"'").lower()
    try:
        info = codecs.lookup(_LABELS.get(label, label))
    except (LookupError, ValueError):
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name in _BAD_CODECS or info.name.startswith("utf-32"):
        return None
    return {"utf-8-sig": "utf-8", "utf-16": "utf-16-le"}.get(info.name, info.name)


_CTRL_TABLE = bytes(1 if b in _CTRL else 0 for b in range(256))


def _check_utf8_text(data: bytes) -> None:
    """:func:`_check_text` of the text that the UTF-8 ``data`` encodes, without decoding it (in C
    where built)."""
    checks = getattr(_C, "content_checks", None)
    if checks is None:
        _check_text(data.decode("utf-8"))
        return
    n, chars = checks(data, 4096, _CTRL_TABLE)
    if n > 2 and n * 20 > chars:
        raise RecordError("binary", f"{n} control characters in the first {chars} characters")
    if utf8_blank(data):
        raise RecordError("empty", _EMPTY)


#: An ASCII byte that str.isspace() does not take for a space: a text holding one is not blank.
_NOT_SPACE = re.compile(rb"[^ \t\n\x0b\x0c\r\x1c-\x1f\x80-\xff]")


def utf8_blank(data: bytes) -> bool:
    """``not text or text.isspace()`` of the text the valid UTF-8 ``data`` encodes, mostly without
    decoding it (a page's first bytes are seldom all spaces)."""
    return not data or (_NOT_SPACE.search(data) is None and data.decode("utf-8").isspace())


def _check_text(text: str) -> str:
    sample = text[:4096]
    b = sample.encode("utf-8", "surrogatepass")  # (a control is one byte, and no other character has one < 0x80)
    n = len(b) - len(b.translate(None, _CTRL))
    if n > 2 and n * 20 > len(sample):
        raise RecordError("binary", f"{n} control characters in the first {len(sample)} characters")
    if not text or text.isspace():
        raise RecordError("empty", _EMPTY)
    return text


def _decode(raw: bytes, charset: str | None, content_type: str | None) -> tuple[str | None, bytes | None]:
    """-> (text, None), or (None, raw) when raw is plain UTF-8 (lexbor parses it as is)."""
    if not raw or raw.isspace():
        raise RecordError("empty", _EMPTY)
    if raw.startswith(_MAGIC) or raw[4:8] == b"ftyp":
        raise RecordError("binary", f"binary file signature {raw[:8]!r}")
    for bom, enc in _BOMS:
        if raw.startswith(bom):
            return _check_text(raw[len(bom) :].decode(enc, "replace")), None
    mime, ct_charset = _split_ct(content_type)
    declared, sample = _codec(charset) or _codec(ct_charset), raw[:1024]
    if b"\x00" in sample:
        half, odd, even = len(sample) // 2 or 1, sample[1::2].count(0), sample[0::2].count(0)
        if declared in _UTF16 and odd + even > half // 4:
            return _check_text(raw.decode(declared, "replace")), None
        if len(sample) >= 32 and max(odd, even) > half * 0.4 and min(odd, even) < half * 0.05:  # UTF-16, no label
            return _check_text(raw.decode("utf-16-le" if odd > even else "utf-16-be", "replace")), None
    ctrl = len(sample) - len(sample.translate(None, _CTRL))
    if ctrl > 2 and ctrl * 20 > len(sample):
        raise RecordError("binary", f"{ctrl} control bytes in the first {len(sample)} bytes")
    try:  # valid UTF-8 wins over a declared legacy charset (mislabelled servers are common)
        if not raw.isascii():
            raw.decode("utf-8")  # (validation only: CPython's decoder beats any byte scan)
            return None, raw
        if b"\x1b" not in raw:  # (ESC: maybe 7-bit ISO-2022-*)
            return None, raw
    except UnicodeDecodeError:
        pass
    labels: list[str | None] = [declared]
    if mime in _HTML_TYPES or mime in _SNIFF_TYPES:
        m = _META.search(raw[:2048])
        labels.append(_codec(m and (m.group(1) or m.group(2)).decode("ascii")))
    cands = [c for c in labels if c and c != "utf-8" and c not in _UTF16]  # (a <meta> utf-16 means utf-8)
    for enc in cands:
        try:
            return _check_text(raw.decode(enc)), None
        except UnicodeDecodeError:
            pass
    if raw.isascii():
        return None, raw
    for enc in cands:  # declared, with a few bad bytes: keep it if the damage is < 1%
        t = raw.decode(enc, "replace")
        if t.count("\ufffd") * 100 <= len(t):
            return _check_text(t), None
    t = raw.decode("utf-8", "replace")  # UTF-8 with damage, or really cp1252?
    bad = t.count("\ufffd")
    good = len(t) - len(t.encode("ascii", "ignore")) - bad
    return _check_text(t if good >= bad else raw.decode("cp1252", "replace")), None


def decode_body(raw: bytes, charset: str | None = None, content_type: str | None = None) -> str:
    """Decode a body: BOM, valid UTF-8, HTTP ``charset`` (else ``content_type``'s), ``<meta>``, guess.

    Strictly valid UTF-8 wins over a declared legacy charset; unknown or unsafe charset names are ignored;
    undeclared invalid UTF-8 stays UTF-8 or is re-read as cp1252, whichever loses less.  Raises ``RecordError``
    ``empty`` / ``binary``.

    >>> decode_body("<p>café</p>".encode("cp1252"), charset="utf-8")
    '<p>café</p>'
    >>> decode_body(b"\\x89PNG\\r\\n\\x1a\\n...")
    Traceback (most recent call last):
    streamdedup.errors.RecordError: binary: binary file signature b'\\x89PNG\\r\\n\\x1a\\n'
    """
    text, utf8 = _decode(bytes(raw), charset, content_type)
    if utf8 is not None:
        return utf8.decode("utf-8", "replace")
    assert text is not None  # _decode gives the text or the UTF-8 bytes
    return text


# ---------------------------------------------------------------- HTML
_ALWAYS_DROP = (
    "head title script style noscript template svg math iframe frame frameset noframes object embed "
    "applet audio video canvas map button select textarea input datalist dialog rp"
).split()
_SEMANTIC_DROP = ("nav", "aside", "footer", "header", "form")
_BLOCKS = (
    "address article aside blockquote br caption center dd details dir div dl dt fieldset figcaption figure "
    "footer form h1 h2 h3 h4 h5 h6 header hgroup hr legend li listing main menu nav ol p pre section summary "
    "table tbody td tfoot th thead tr ul xmp plaintext search"
).split()
_INLINE_INSPECTED = ("span", "ins", "small", "label")
_WRAPPERS = ("div", "section", "table", "tbody", "tr", "td", "center", "span", "ul")
_ROLES = frozenset("navigation banner contentinfo complementary search menu menubar dialog alertdialog".split())
_BOILER_PARTS = frozenset(
    """nav navbar navigation navlinks navmenu topnav subnav sidenav menu menubar submenu megamenu
    sidebar sidebars breadcrumb breadcrumbs crumbs footer masthead cookie cookies cookiebanner cookieconsent consent
    gdpr ad ads adsbygoogle adslot adunit adsense adbox adzone advert adverts advertisement advertisements advertising
    sponsor sponsors sponsored share shares sharing sharebar sharethis addthis addtoany social socials pagination
    pager noprint newsletter""".split()
)
_BOILER_WHOLE = frozenset(
    """sr-only screen-reader-text visually-hidden visuallyhidden no-print hidden-print
    d-print-none skip-link skip-links skiplinks skip-to-content comment-count comments-count""".split()
)
_HEADER_PREFIXES = ("site", "page", "global", "top", "main")
_HEADER_SUFFIXES = ("wrap", "wrapper", "container", "inner", "bar", "top", "nav", "navigation", "menu", "area", "links")
_HEADER_TOKEN = re.compile(f"(?:(?:{'|'.join(_HEADER_PREFIXES)})[-_])?header(?:[-_](?:{'|'.join(_HEADER_SUFFIXES)}))?")
_STATE = frozenset("has with without no is show hide".split())  # state flags: body.has-sidebar
_STATE_LAST = frozenset("open opened active visible collapsed expanded closed fixed enabled disabled".split())
_SAFE_TOKEN, _SPLIT = re.compile(r"[a-z0-9_-]{1,80}"), re.compile(r"[-_]+")
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)
# lexbor's tree builder is O(depth) per nested block start tag: flatten absurd nesting ("div soup") first.
_NESTING = (
    "address article aside blockquote center details dialog dir div dl fieldset figcaption figure footer "
    "header hgroup main menu nav ol search section summary ul"
).split()
_NESTING_RE = re.compile(rb"</?(?:%s)(?=[\s/>])[^>]*>" % "|".join(_NESTING).encode(), re.I)
_NESTING_KEYS = sorted(
    {
        (ord(t[0]) << 16) | (ord(t[1]) << 8) | (ord(t[2]) if len(t) > 2 else d | 32)
        for t in _NESTING
        for d in (b" >/\t\n\r\f" if len(t) == 2 else b" ")
    }
)


@lru_cache(maxsize=16384)
def _boiler_key(tok: str) -> str | None:
    """The boilerplate marker in a class token / id / custom tag name (case-insensitive), or None.

    >>> [_boiler_key(t) for t in ("site-header", "header-anchor", "main-nav", "download", "shadow",
    ...                           "ad-slot", "has-sidebar", "nav-open", "menu-item-42", "Breadcrumbs")]
    ['site-header', None, 'nav', None, None, 'ad', None, None, 'menu', 'breadcrumbs']
    """
    tok = tok.lower()
    if not _SAFE_TOKEN.fullmatch(tok):
        return None
    if tok in _BOILER_WHOLE or _HEADER_TOKEN.fullmatch(tok):
        return tok
    parts = [p for p in _SPLIT.split(tok) if p]
    if not parts or parts[-1] in _STATE_LAST or not _STATE.isdisjoint(parts):
        return None
    return next((p for p in parts if p in _BOILER_PARTS), None)


@lru_cache(maxsize=16384)
def _class_is_boiler(value: str) -> bool:
    return any(_boiler_key(t) for t in value.split())


def _attr_verdict(attrs: dict) -> int:
    """0 keep, 1 boilerplate/hidden, 2 main-content anchor (role=main)."""
    if "role" in attrs:
        role = (attrs["role"] or "").lower().split()
        if "main" in role:
            return 2
        if not _ROLES.isdisjoint(role):
            return 1
    c, i = attrs.get("class"), attrs.get("id")
    if (c and _class_is_boiler(c)) or (i and _boiler_key(i)):
        return 1
    if len(attrs) > (c is not None) + (i is not None):  # anything besides class/id?
        if (
            ("hidden" in attrs and (attrs["hidden"] or "").lower() != "until-found")
            or (attrs.get("aria-hidden") or "").strip().lower() == "true"
            or ("style" in attrs and _HIDDEN_STYLE.search(attrs["style"] or ""))
        ):
            return 1
    return 0


_TAG = {
    t: LexborHTMLParser("").create_node(t).tag_id for t in {"html", "body", *_ALWAYS_DROP, *_BLOCKS, *_INLINE_INSPECTED}
}
# kind: 1 block, 2 always dropped, 3 semantic drop, 4 article/main, 5 inline but attributes inspected
_KIND = {
    **{_TAG[t]: 1 for t in _BLOCKS},
    **{_TAG[t]: 2 for t in _ALWAYS_DROP},
    **{_TAG[t]: 3 for t in _SEMANTIC_DROP},
    _TAG["main"]: 4,
    _TAG["article"]: 4,
    **{_TAG[t]: 5 for t in _INLINE_INSPECTED},
}
_WRAPPER_IDS = frozenset(_TAG[t] for t in _WRAPPERS)
_STOP = (_TAG["html"], _TAG["body"], _TAG["main"], _TAG["article"])
try:  # bypass Cython's fused-type dispatch, which is half the cost of an insert
    _INS_BEFORE, _INS_AFTER = LexborNode.insert_before["bytes"], LexborNode.insert_after["bytes"]  # type: ignore[index]  # (selectolax fused-type specialisation)
except (TypeError, KeyError, AttributeError):  # pragma: no cover - other selectolax builds
    _INS_BEFORE, _INS_AFTER = LexborNode.insert_before, LexborNode.insert_after


def _flatten_deep(data: bytes, compiled: bool = True) -> bytes:
    if len(data) < 60_000:
        return data
    if compiled and _C is not None:  # (the same count and depth as below, in C, in one pass)
        count, deepest = _C.nesting(data, _NESTING_KEYS, 8000)  # (no depth below 8000 '<')
        return _NESTING_RE.sub(b" ", data) if count >= 8000 and deepest > 4000 else data
    if data.count(b"<") < 8000:  # depth < 12000 costs lexbor < 0.2 s
        return data
    import numpy as np

    a = np.frombuffer(data, np.uint8)
    lt = np.flatnonzero(a[:-4] == 60)
    close = a[lt + 1] == 47
    s = lt + 1 + close
    key = (a[s] | 32).astype(np.int64) << 16 | (a[s + 1] | 32).astype(np.int64) << 8 | (a[s + 2] | 32)
    steps = 1 - 2 * close[np.isin(key, _NESTING_KEYS)].astype(np.int64)
    return _NESTING_RE.sub(b" ", data) if steps.size and steps.cumsum().max() > 4000 else data


def _ancestor(n: LexborNode, stop: tuple[int, ...]) -> LexborNode | None:
    p = n.parent
    while p is not None and p.tag_id not in stop:
        p = p.parent
    return p


def _html_text(data: bytes, compiled: bool = True) -> str:
    """The page's visible text: the walk in C (``_html_walk.c``) where it was built, else in Python."""
    try:
        tree = LexborHTMLParser(_flatten_deep(data, compiled), scripting=True)
    except SelectolaxError as e:  # pragma: no cover - lexbor only fails on allocation
        raise RecordError("unparsable", f"HTML parser failed: {e}") from None
    root = tree.root
    if root is None:  # pragma: no cover
        return ""
    head = tree.head
    if compiled and _C is not None:
        text, done, rare = _C.walk(root.mem_id, 0 if head is None else head.mem_id)
        return text if done else _normalize_collapsed(text, rare)
    if head is not None:
        head.decompose(recursive=False)
    return normalize_text(_walk(tree, root), compiled)


def _walk(tree: LexborHTMLParser, root: LexborNode) -> str:
    """The reference walk: drops what is not visible main text from the tree, spaces blocks, gives
    ``root.text()``.  ``_html_walk.c`` makes the same changes to the tree in the same order."""
    kinds, cands, mains, articles, verdict = _KIND, [], [], [], _attr_verdict
    ins_before, ins_after, main_id = _INS_BEFORE, _INS_AFTER, _TAG["main"]
    for n in tree.css("*"):  # one C walk; per element a dict lookup on its static tag id
        t = n.tag_id
        k = kinds.get(t)
        if k is None:
            if t < 0x10000:  # known inline element: no boundary, attributes not inspected
                continue
            k = 1 if _boiler_key(n.tag or "") is None else 3  # custom element: a block
        elif k == 2:
            n.decompose(False)
            continue
        if k != 5:  # block boundary -> space
            ins_before(n, b" ")
            ins_after(n, b" ")
            if k == 3:
                cands.append((n, False))
                continue
        attrs = n.attributes
        if attrs:
            v = verdict(attrs)
            if v == 2 or t == main_id:
                mains.append(n)
            elif k == 4:
                articles.append(n)
            elif v:
                cands.append((n, True))
        elif k == 4:
            (mains if t == main_id else articles).append(n)
    anchors = mains or articles
    protected = {a.mem_id for a in anchors}
    for a in anchors if cands else ():  # never drop main content or anything wrapping it
        p = a.parent
        while p is not None and p.mem_id not in protected:
            protected.add(p.mem_id)
            p = p.parent
    total: int | None = None
    forms = []
    for n, by_attr in cands:
        t = n.tag_id
        if by_attr:
            if n.mem_id in protected or t in _STOP:
                continue
            if not anchors and t in _WRAPPER_IDS:  # no main/article: never take half the page
                size = len(n.text())
                total = len(root.text()) if total is None and size > 500 else total
                if size > 500 and total is not None and size * 2 > total:
                    continue
        elif t == _TAG["form"]:
            forms.append(n)
            continue
        elif t == _TAG["header"] and (_ancestor(n, _STOP) or root).tag_id in _STOP[2:]:
            continue  # an article's header holds its title
        n.decompose(recursive=False)
    for f in forms:  # search/login/comment forms go; a form wrapping the page (ASP.NET) stays
        if (
            f.mem_id not in protected
            and _ancestor(f, _STOP[:1]) is not None
            and len(f.text()) < 1000
            and f.css_first("h1,h2,main,article") is None
        ):  # (no html ancestor: inside a dropped element)
            f.decompose(recursive=False)
    return root.text()


def _load_c_walk():
    """The ``_html_walk`` module, set up on this selectolax's lexbor; None where it was not built (no C compiler
    at install), where ``STREAMDEDUP_HTML_WALK=python``, or where this lexbor does not fit it.  (The one
    variable read here, not through settings: every process imports this, the pool's too; settings'
    ENV_ALLOWLIST lets a worker start with it.)"""
    if os.environ.get("STREAMDEDUP_HTML_WALK", "").lower() == "python":
        return None
    try:
        from streamdedup.fingerprinting import _html_walk  # type: ignore[attr-defined]
    except ImportError:
        return None
    import selectolax.lexbor

    probe1, probe2 = b"streamdedup probe " * 61, b"another probe " * 37  # (odd lengths: 1098, 518)
    texts = []
    for probe in (probe1, probe2):  # (a node keeps its parser, and so its document, alive)
        p = LexborHTMLParser(b"<p>" + probe + b"</p>").css_first("p")
        text = None if p is None else p.first_child
        if text is None or text.text() != probe.decode():  # pragma: no cover - another lexbor
            return None
        texts.append(text)
    sample = LexborHTMLParser(  # (where lexbor keeps a node's links: found on this tree, checked on all of it)
        b"<!doctype html><title>t</title><body><!-- c --><div id=a><p>x<b>y</b>z</p><p>w</p>t<br></div>"
        b"<ul><li>1<li>2<!-- d --><li><span>3</span></ul><svg><g><rect/></g></svg><table><tr><td>c</table>"
    ).root
    if sample is None:  # pragma: no cover
        return None
    kinds, wrappers = bytearray(max(_KIND) + 1), bytearray(max(_KIND) + 1)
    for t, k in _KIND.items():
        kinds[t] = k
    for t in _WRAPPER_IDS:
        wrappers[t] = 1
    ids = (texts[0].tag_id, *(_TAG[t] for t in ("html", "body", "main", "article", "form", "header", "h1", "h2")))
    words = (_ROLES, _BOILER_PARTS, _BOILER_WHOLE, _STATE, _STATE_LAST, _HEADER_PREFIXES, _HEADER_SUFFIXES)
    spaces = [c for c in range(0x3001) if chr(c).isspace()]  # (str.split()'s: none is above U+3000)
    try:
        _html_walk.init(
            selectolax.lexbor.__file__,
            *(texts[0].mem_id, probe1, texts[1].mem_id, probe2),
            sample.mem_id,
            bytes(kinds),
            bytes(wrappers),
            ids,
            tuple(tuple(w) for w in words),
            _attr_verdict,
            _boiler_key,
            _JUNK_RANGES,
            spaces,
        )
    except ImportError:  # (this selectolax's lexbor does not export what the walk needs)
        return None
    except Exception as e:  # pragma: no cover - a bug in the C walk's set-up: the Python walk still works
        import logging

        logging.getLogger(__name__).warning("the C text walk could not start (%r): the Python walk is used", e)
        return None
    return _html_walk


_C = _load_c_walk()


def visible_text(content: str | bytes | Utf8Text, content_type: str | None = None, charset: str | None = None) -> str:
    """Visible main text of a page, normalised (see the module docstring).

    ``content_type`` None/empty/unknown is sniffed; ``text/html`` and ``application/xhtml+xml`` are extracted,
    ``text/plain`` only normalised, anything else is ``RecordError('not_text')``.  Bytes are decoded as by
    :func:`decode_body` (``charset``: the HTTP header's).

    >>> visible_text(b"<p>a</p><p>b<b>c</b>d &amp; e</p><nav>menu</nav><script>x()</script>")
    'a bcd & e'
    >>> visible_text("  ", "text/plain")
    Traceback (most recent call last):
    streamdedup.errors.RecordError: empty: page has no content
    """
    if content is None:
        raise RecordError("empty", _EMPTY)
    if isinstance(content, Utf8Text):  # the str it encodes, as UTF-8: what lexbor parses
        # (the order of the str branch below: the sniff, the checks, then the page)
        mime = text_mime(content_type) or sniff_content_type(content.data[: 4 * 4096].decode("utf-8", "ignore"))
        _check_utf8_text(content.data)
        return normalize_text(content.text()) if mime == "text/plain" else _html_text(content.data)
    mime = text_mime(content_type) or sniff_content_type(content)
    text: str | None
    data: bytes | None
    if isinstance(content, str) and mime != "text/plain" and _C is not None:
        # the page's UTF-8 for lexbor first, and _check_text's checks on it (the same answers: a
        # lone surrogate, "?" here, is neither a control nor a space)
        data = _utf8(content)
        _check_utf8_text(data)
        return _html_text(data)
    if isinstance(content, str):
        text, data = _check_text(content), None
    elif isinstance(content, (bytes, bytearray, memoryview)):
        text, data = _decode(bytes(content), charset, content_type)
    else:
        raise TypeError(f"content must be str or bytes, not {type(content).__name__}")
    if data is None:
        assert text is not None  # _decode gives the text or the UTF-8 bytes
        data_or_text: str | bytes = text
    else:
        data_or_text = data
    if mime == "text/plain":
        return normalize_text(
            data_or_text if isinstance(data_or_text, str) else data_or_text.decode("utf-8", "replace")
        )
    return _html_text(data_or_text if isinstance(data_or_text, bytes) else _utf8(data_or_text))


def _utf8(text: str, compiled: bool = True) -> bytes:
    """``text.encode("utf-8", "replace")`` (a lone surrogate becomes "?"), in C where it was built."""
    return _C.to_utf8(text) if compiled and _C is not None else text.encode("utf-8", "replace")
