"""The visible-text walk in C (streamdedup/fingerprinting/_html_walk.c) against the walk in Python.

text.py's Python walk is the reference, and the one ``pip install`` gives where no C compiler is found;
the C walk must give the same text bit for bit (the fingerprints of every stored page depend on it), on
real pages, on a grid of every kind of element and attribute in every context the rules look at, and on
hypothesis soups of the same parts, whitespace, entities, controls and non-ASCII text.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdedup.engine.records import Page
from streamdedup.fingerprinting import text as T

DATA = Path(__file__).parent / "data" / "html"


def test_the_c_walk_is_built():
    # `make install` builds it (setup.py); a test run without it would test the Python walk twice.
    assert T._C is not None, (
        "streamdedup/fingerprinting/_html_walk.c was not built: install a C compiler (gcc) and run "
        "`pip install -e .` again (STREAMDEDUP_HTML_WALK=python also turns it off)"
    )


def both(html: str | bytes) -> tuple[str, str]:
    data = html.encode("utf-8", "surrogatepass") if isinstance(html, str) else html
    return T._html_text(data, compiled=True), T._html_text(data, compiled=False)


def same(html: str | bytes) -> str:
    c, py = both(html)
    assert c == py, f"C and Python walks differ on {html[:300]!r}"
    return c


# ---------------------------------------------------------------- the parts the rules look at
BLOCK = ["div", "p", "section", "li", "td", "table", "center", "ul", "h1", "h2", "pre", "br", "hr", "search"]
DROPPED = ["script", "style", "noscript", "template", "svg", "math", "iframe", "object", "button", "select",
           "textarea", "dialog", "rp", "title", "head"]  # fmt: skip
SEMANTIC = ["nav", "aside", "footer", "header", "form"]
ANCHOR = ["main", "article"]
INSPECTED_INLINE = ["span", "ins", "small", "label"]
INLINE = ["a", "b", "em", "code", "abbr", "font"]
CUSTOM = ["x-widget", "cookie-banner", "my-nav", "site-header", "nav-open", "x-\u212a", "x-na\u0131v", "a"]
TAGS = BLOCK + DROPPED + SEMANTIC + ANCHOR + INSPECTED_INLINE + INLINE + CUSTOM

CLASS = ["", "nav", "NAV", "main-nav", "sidebar", "has-sidebar", "nav-open", "menu-item-42", "site-header",
         "header-anchor", "page_header_wrap", "top-header", "header-top", "headerx", "ad", "ad-slot", "ads",
         "download", "shadow", "sr-only", "Breadcrumbs", "cookie consent", "content", "x" * 81, "---", "is-nav",
         "na\u212av", "nav\u00a0menu", "\u0130nav", "foot\u212ar", "menu\x1cmain", "a\x0bnav"]  # fmt: skip
ROLE = [None, "", "main", "MAIN", "navigation", "banner search", " contentinfo ", "presentation", "m\u0430in",
        "\u212aain", "menu\x1f"]  # fmt: skip
HIDDEN = [None, "", "until-found", "UNTIL-FOUND", "until-found ", "hidden"]
ARIA = [None, "true", " TRUE\x1c", "false", "tru\u0435", "\u00a0true"]
STYLE = [None, "display:none", "DISPLAY : NONE", "visibility:\thidden", "display:\u00a0none",
         "color:red;display:\x1cnone", "display: block", "visibility: hiddenx", "displaynone", "display:\u017fnone"]  # fmt: skip


def attrs(cls=None, role=None, hidden=None, aria=None, style=None, id_=None) -> str:
    out = []
    for name, value in (("class", cls), ("role", role), ("hidden", hidden), ("aria-hidden", aria),
                        ("style", style), ("id", id_)):  # fmt: skip
        if value is None:
            continue
        out.append(f' {name}="{value}"' if value != "" or name != "hidden" else f" {name}")
    return "".join(out)


def test_real_pages():
    for path in sorted(DATA.glob("*.html")):
        assert same(path.read_bytes())


def test_golden_like_snippets():
    for html in [
        "<p>a</p><p>b<b>c</b>d &amp; e</p><nav>menu</nav><script>x()</script>",
        "<article><header><h1>Title</h1></header><p>body</p></article><header>site</header>",
        "<form><main><h1>wrapped</h1>" + "<p>text</p>" * 50 + "</main></form>",
        "<form>search <input></form><p>after</p>",
        "<div class=sidebar>" + "word " * 200 + "</div><p>short</p>",
        "<div class=nav>" + "word " * 200 + "</div>" + "<p>" + "long " * 400 + "</p>",
        "<object><main>hidden anchor</main></object><div class=nav>n</div><p>t</p>",
        "<svg><article>in svg</article></svg><aside>x</aside>",
        "<nav><main>main in nav</main></nav><p>p</p>",
        "<div role=main><div class=ad>ad</div>text</div>",
        "<ul><li>one<li>two</ul>\t\r\n\u00a0\u00a0end\x0b\x1c",
        "<p>\u2026 \ufb01 e\u0301 \u200b \ue000 \u00ad x</p>",
        "<p>&nbsp;&#xA0;&#128;&#0;&#xD800;&lt;b&gt;</p>",
        "",
        "<html><head><title>t</title></head></html>",
        "<cookie-banner>c</cookie-banner><x-widget>w</x-widget>",
    ]:
        same(html)


CONTEXTS = ["{}", "<main>{}</main>", "<article>{}</article>", "<nav>{}</nav>", "<form>{}</form>",
            "<div class=content>{}</div><p>" + "filler " * 120 + "</p>"]  # fmt: skip


def test_grid_of_elements_attributes_and_contexts():
    # every element kind x every value of each attribute the rules read, in every context
    inner = "<p>inner text</p> tail"
    cases = []
    for tag, ctx in itertools.product(TAGS, CONTEXTS):
        for kw in (
            *({"cls": c} for c in CLASS),
            *({"role": r} for r in ROLE),
            *({"hidden": h} for h in HIDDEN),
            *({"aria": a} for a in ARIA),
            *({"style": s} for s in STYLE),
            {"id_": "main-nav"},
            {"id_": "menu item"},
            {"id_": "N\u212aV"},
        ):
            cases.append(ctx.format(f"<{tag}{attrs(**kw)}>{inner}</{tag}>"))
    for html in cases:
        same(html)
    assert len(cases) > 5000


def test_node_fields_read_directly_or_by_lexbors_functions():
    # init finds where lexbor keeps a node's links, tag id and type (checked against lexbor's own
    # accessor functions on a sample tree); either way of reading them gives the same text
    assert T._C.direct_fields(), "lexbor's node layout was not found: the walk reads fields by function calls"
    pages = [p.read_bytes() for p in sorted(DATA.glob("*.html"))]
    pages += [ctx.format(f"<{t} class=nav>x</{t}><p>y</p>") for t in TAGS for ctx in CONTEXTS]
    direct = [T._html_text(p if isinstance(p, bytes) else p.encode()) for p in pages]
    try:
        assert not T._C.direct_fields(False)
        by_calls = [T._html_text(p if isinstance(p, bytes) else p.encode()) for p in pages]
    finally:
        assert T._C.direct_fields(True)
    assert direct == by_calls


def test_the_half_page_rule_and_form_sizes():
    for n in (0, 100, 499, 501, 999, 1001, 2000):
        word = "w" * n
        same(f"<div class=nav>{word}</div><p>{'x' * 700}</p>")
        same(f"<table class=sidebar><tr><td>{word}</td></tr></table>{'y' * 600}")
        same(f"<form>{word}</form><form><h2>t</h2>{word}</form><form><article>a</article></form>")
    for rest in (596, 597, 598, 599, 600):  # the wrapper at, under and over half the page's text
        same(f"<div class=nav>{'a' * 600}</div>{'b' * rest}")
    assert "a" * 600 in same(f"<div class=nav>{'a' * 600}</div>{'b' * 597}")  # 600 * 2 > 1199: kept
    assert "a" * 600 not in same(f"<div class=nav>{'a' * 600}</div>{'b' * 598}")  # 600 * 2 = 1200: dropped


# ---------------------------------------------------------------- hypothesis soups
WORDS = st.sampled_from(["word", "Text", "caf\u00e9", "\u2026", "\ufb01", "e\u0301", "\u200b", "\ue000", "\u00ad",
                         "\u4e2d\u6587", "&amp;", "&nbsp;", "&#xA0;", "&#128;", "&lt;", "1 < 2", "x" * 600])  # fmt: skip
SPACE = st.sampled_from([" ", "", "\n", "\t", "\r\n", "\u00a0", "\x0b", "\x0c", "\x1c", "\x01", "\x7f", "  "])
ATTRS = st.builds(
    attrs,
    cls=st.sampled_from([None, *CLASS]),
    role=st.sampled_from(ROLE),
    hidden=st.sampled_from(HIDDEN),
    aria=st.sampled_from(ARIA),
    style=st.sampled_from(STYLE),
    id_=st.sampled_from([None, "nav", "content", "Sidebar", "x\u212a"]),
)
TEXT = st.lists(st.tuples(WORDS, SPACE), max_size=6).map(lambda ws: "".join(w + s for w, s in ws))


def element(children):
    return st.builds(
        lambda tag, a, kids, close: f"<{tag}{a}>{''.join(kids)}" + (f"</{tag}>" if close else ""),
        st.sampled_from(TAGS + ["html", "body", "tr", "table", "frameset"]),
        ATTRS,
        st.lists(children, max_size=4),
        st.booleans(),
    )


SOUP = st.recursive(TEXT, element, max_leaves=40)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(SOUP, min_size=1, max_size=5).map("".join))
def test_soups_give_the_same_text(html):
    same(html)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(SOUP.map(lambda s: s.encode("utf-8", "surrogatepass")), st.binary(max_size=40)), max_size=6))
def test_soups_with_bytes_that_are_not_utf8(parts):
    same(b"".join(parts))


def _visible(text: str) -> str | tuple[str, str]:
    try:
        return T.visible_text(text, "text/html")
    except T.RecordError as e:
        return (e.reason, str(e))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            SOUP, st.text(st.sampled_from(" \t\n\x00\x01\x08\x0b\x1c\x7f\x85\xa0\u3000\ud800\udc00x"), max_size=30)
        ),
        max_size=5,
    ).map("".join)
)
def test_a_str_page_is_checked_and_walked_alike_with_and_without_c(text):
    # With C the str is made UTF-8 first and checked as such (controls, spaces), without C checked
    # as a str: the same text, or the same error ("binary", "empty").
    with_c = _visible(text)
    with patch.object(T, "_C", None):
        assert _visible(text) == with_c


# ---------------------------------------------------------------- the word rules and the nesting check
TOKEN = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzNAVHEDR0123456789-_ \u212a\u0130"), max_size=30)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(TOKEN, st.sampled_from(sorted(T._BOILER_PARTS | T._BOILER_WHOLE)), st.sampled_from(CLASS)))
def test_boiler_key_in_c(token):
    if not token.isascii():
        return  # (the C walk hands non-ASCII tokens to text.py's own _boiler_key)
    assert T._C.boiler_key(token.encode()) == (T._boiler_key(token) is not None)


NESTINGS = [
    b"<div>" * 5000 + b"</div>" * 5000 + b"<p>" * 4000,
    b"<div>" * 4001 + b"x" * 60_000,
    b"<div>" * 4000 + b"<span>" * 5000,
    b"<DIV\t>" * 4500 + b"<dl>" * 4000,
    b"</div>" * 9000 + b"<div>" * 100,
    b"<ul>" * 3999 + b"<p>" * 5000,
    b"<ul>" * 3999 + b"<ol>" * 2 + b"<p>" * 5000,
    b"<" * 70_000,
    b"<section id=a>" * 8000,
    b"<di>" * 9000,
    b"<main><p>" * 4500,
]


def test_the_nesting_check_in_c():
    flattened = []
    for html in NESTINGS:
        html = html + b" " * max(0, 60_000 - len(html))
        c = T._flatten_deep(html, compiled=True)
        assert c == T._flatten_deep(html, compiled=False)
        flattened.append(c is not html)
    assert any(flattened) and not all(flattened)  # (the cases straddle the limits)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.lists(st.sampled_from([b"<", b"<<", b"\xbc", b"=", b"|", b"a"])).map(b"".join))
def test_the_nesting_count_is_every_lt(data):
    # (the count is read eight bytes at a time: '<' next to bytes that differ from it by one bit)
    for min_count in (0, 1, len(data) + 1):
        count, deepest = T._C.nesting(data, T._NESTING_KEYS, min_count)
        assert count == data.count(b"<")
        if count < min_count:
            assert deepest == 0


_UTF8_PIECES = ["a" * 9, "abcdefg", "é", "\u00ff", "\u0100", "\u07ff", "\u0800", "\uffff", "\ud800", "\udfff",
                 "\ud83d", "\ude00", "😀", "\U0010ffff", "<p>", "\x7f", "\x80", "東京"]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    st.text(max_size=80)
    | st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, codec=None), max_size=80)
    | st.lists(st.sampled_from(_UTF8_PIECES), max_size=30).map("".join)
)
def test_the_utf8_of_a_page_is_pythons(text):
    # the page's bytes for lexbor: encode("utf-8", "replace"), lone surrogates "?", in 1-, 2- and
    # 4-byte texts, across the blocks copied at once and their tails
    assert T._C.to_utf8(text) == text.encode("utf-8", "replace") == T._utf8(text, compiled=False)
    for cut in (1, 3, 5, 9):
        assert T._C.to_utf8(text[cut:]) == text[cut:].encode("utf-8", "replace")


def test_utf8_refuses_what_is_not_a_text():
    with pytest.raises(TypeError, match="text must be str, not bytes"):
        T._C.to_utf8(b"abc")


def test_walks_in_threads_at_once():
    # A walk calls into text.py for non-ASCII attributes, and another thread may walk meanwhile:
    # each must keep its own text.
    import sys
    from concurrent.futures import ThreadPoolExecutor

    pages = [
        (f"<div class='na\u212av{i}'>{'x' * i}</div>" + f"<p class='c\u0130{i}'>text {i}</p>" * 20 + "é" * i).encode()
        for i in range(200)
    ]
    want = [T._html_text(p, compiled=False) for p in pages]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(T._html_text, pages * 3))
    finally:
        sys.setswitchinterval(interval)
    assert got == want * 3


def test_str_split_whitespace_lies_where_the_c_table_looks():
    # init hands the C walk str.split()'s whitespace below U+3001 (its table covers the BMP)
    assert [c for c in range(0x110000) if chr(c).isspace()] == [c for c in range(0x3001) if chr(c).isspace()]


JUNKY = st.text(
    st.one_of(
        st.sampled_from(
            [
                "a",
                "Z",
                " ",
                "\t",
                "\n",
                "\x0b",
                "\x1c",
                "\x85",
                "\xa0",
                "\u2003",
                "\u3000",
                "\u200b",
                "\u00ad",
                "\x01",
                "\x7f",
                "\x90",
                "\ue000",
                "\ufeff",
                "\u2066",
                "\ud800",
                "\udfff",
                "\U0001f600",
                "\u202f",
                "\u2028",
                "é",
            ]
        ),
        st.characters(),
    ),
    max_size=60,
)


@settings(max_examples=3000, deadline=None)
@given(JUNKY)
def test_junk_removal_in_c(text):
    assert T._C.junk_split(text) == " ".join(T._JUNK.sub("", text).split())


@settings(max_examples=1000, deadline=None)
@given(JUNKY)
def test_normalize_text_with_and_without_c(text):
    assert T.normalize_text(text) == T.normalize_text(text, compiled=False)


def test_install_without_a_c_compiler_keeps_the_python_walk(tmp_path):
    # The README's promise: `pip install` on a machine without a compiler works, and gives the same text
    # and the same fingerprints.
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    src = tmp_path / "src"
    shutil.copytree(root / "streamdedup", src / "streamdedup", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(root / name, src / name)
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(tmp_path / "t"), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list((tmp_path / "t" / "streamdedup").rglob("*.so"))  # (nothing built)
    html = b"<p>a</p><nav>x</nav><div class=sidebar>y</div><p>b\xc2\xa0c \xc2\xad</p>"
    texts = ["Ünïcödé words, ΟΔΟΣ and İstanbul", "ascii words here", "東京タワー 😀 emoji"]
    record = json.dumps({"url": "http://a/", "content": html.decode()}).encode()
    check = (
        "import streamdedup.fingerprinting.text as T; "
        "import streamdedup.engine.records as R; "
        "from streamdedup.fingerprinting import kernels; "
        "from streamdedup.fingerprinting.pages import simhash_texts; "
        f"print(T.__file__.startswith({str(tmp_path)!r}), T._C is None, kernels.c_words() is None, R._C is None, "
        f"repr(T._html_text({html!r})), simhash_texts({texts!r}).tolist(), repr(R.page_from_json({record!r})), "
        "sep='|')"
    )
    out = subprocess.run(
        [sys.executable, "-c", check],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "t")},
        cwd=tmp_path,  # (not the checkout, which holds the built walk)
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    from streamdedup.fingerprinting.pages import simhash_texts

    # the Python walk, the numba word hashes, records read by orjson: the same text, fingerprints, page
    assert out.stdout.strip().split("|") == [
        "True",
        "True",
        "True",
        "True",
        repr(T._html_text(html)),
        str(simhash_texts(texts).tolist()),
        repr(Page("http://a/", "http://a/", html.decode())),
    ]


def test_the_switch_to_the_python_walk():
    # README: STREAMDEDUP_HTML_WALK=python picks the Python walk where both are there
    import os
    import subprocess
    import sys

    check = "import streamdedup.fingerprinting.text as T; print(T._C is None)"
    for value, python_walk in (("python", "True"), ("", "False")):
        out = subprocess.run(
            [sys.executable, "-c", check],
            env={**os.environ, "STREAMDEDUP_HTML_WALK": value},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.stdout.strip() == python_walk, out.stderr[-2000:]
