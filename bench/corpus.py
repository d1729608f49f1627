"""Build the near-duplicate benchmark corpus from real, pinned, public text.

Sources (all fetched from package registries with their ordinary clients,
pinned by name + version, sha256 recorded in the manifest):

* Debian ``-doc`` packages with real HTML documentation sites (Sphinx,
  DocBook, asciidoc, hand-written ...), fetched with ``apt-get download`` and
  unpacked with ``dpkg-deb -x`` (no install): each page is used as-is, with
  its real navigation / sidebar / footer boilerplate.
* Several versions of the same project's documentation from PyPI sdists
  (``pip download --no-deps --no-binary NAME NAME==VER``): the reST sources
  are rendered to simple HTML (headings, paragraphs, lists, code) wrapped in a
  realistic per-project page template.  Successive versions of a page are
  NATURAL near-duplicates at many similarity levels.
* SYNTHETIC variants of a seeded random subset of the base pages, of the kinds
  Manku et al. name, tagged with ``variant_kind``: ``advert``, ``counter``,
  ``timestamp``, ``navigation``, ``markup`` (markup-only: the visible text is
  identical, which is checked).

Everything random comes from one seeded ``random.Random``; the page order is
shuffled reproducibly so that a variant usually, but not always, comes after
its base page.

Outputs (in ``--out``, default ``bench/data``)::

    corpus.jsonl       {"id","url","content": raw HTML,"content_type":"text/html",
                        "source","variant_of","variant_kind"}
    corpus-text.jsonl  same ids/order, content = ground-truth visible text (text/plain)
    manifest.json      sources, versions, sha256, counts by source and kind

Usage::

    python bench/corpus.py [--out bench/data] [--max-pages N] [--seed 1]
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import html as htmllib
import html.entities
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import groundtruth as gt

BENCH_DIR = Path(__file__).resolve().parent
CORPUS_VERSION = 2  # 2: listing pages

# --------------------------------------------------------------------------
# Pinned sources
# --------------------------------------------------------------------------


@dataclass
class DebSource:
    key: str  # short id prefix
    package: str
    version: str  # pinned Debian version (bookworm)
    root: str  # directory inside the .deb holding the site
    host: str  # URL prefix the pages pretend to live under
    include: tuple[str, ...] = ("**/*.html",)
    exclude: tuple[str, ...] = ()
    dir_cap: int = 0  # max pages per directory (seeded sample), 0 = all


_SPHINX_EXCLUDE = (
    "_static/*",
    "_sources/*",
    "_modules/*",
    "_images/*",
    "genindex*",
    "search.html",
    "py-modindex.html",
    "modindex.html",
    "np-modindex.html",
    "objects.inv",
)

DEB_SOURCES: list[DebSource] = [
    DebSource(
        "py311",
        "python3.11-doc",
        "3.11.2-6+deb12u9",
        "usr/share/doc/python3.11/html",
        "docs.python.org/3.11",
        exclude=_SPHINX_EXCLUDE + ("contents.html",),
    ),
    DebSource(
        "pg15",
        "postgresql-doc-15",
        "15.20-0+deb12u1",
        "usr/share/doc/postgresql-doc-15/html",
        "www.postgresql.org/docs/15",
        exclude=("bookindex.html",),
    ),
    DebSource("git", "git-doc", "1:2.39.5-0+deb12u3", "usr/share/doc/git-doc", "git-scm.com/docs"),
    DebSource(
        "djdoc32",
        "python-django-doc",
        "3:3.2.25-0+deb12u7",
        "usr/share/doc/python-django-doc/html",
        "django.readthedocs.io/en/3.2.x",
        exclude=_SPHINX_EXCLUDE,
    ),
    DebSource(
        "sphinx53",
        "sphinx-doc",
        "5.3.0-4",
        "usr/share/doc/sphinx-doc/html",
        "www.sphinx-doc.org/en/5.3",
        exclude=_SPHINX_EXCLUDE,
    ),
    DebSource(
        "httpd",
        "apache2-doc",
        "2.4.71-1~deb12u1",
        "usr/share/doc/apache2-doc/manual",
        "httpd.apache.org/docs/2.4",
        include=("en/**/*.html", "fr/**/*.html", "de/**/*.html", "ja/**/*.html", "es/**/*.html"),
    ),
    DebSource(
        "sqla14",
        "python-sqlalchemy-doc",
        "1.4.46+ds1-1",
        "usr/share/doc/python-sqlalchemy-doc/html",
        "docs.sqlalchemy.org/en/14",
        exclude=_SPHINX_EXCLUDE,
    ),
    DebSource(
        "debref",
        "debian-reference-en",
        "2.100",
        "usr/share/debian-reference",
        "www.debian.org/doc/manuals/debian-reference",
    ),
    DebSource(
        "flaskdoc",
        "python-flask-doc",
        "2.2.2-3",
        "usr/share/doc/python-flask-doc/html",
        "flask.palletsprojects.com/en/2.2.x",
        exclude=_SPHINX_EXCLUDE,
    ),
    DebSource(
        "sqlite", "sqlite3-doc", "3.40.1-2+deb12u2", "usr/share/doc/sqlite3", "www.sqlite.org", exclude=("syntax/*",)
    ),
    DebSource(
        "cmake",
        "cmake-doc",
        "3.25.1-1",
        "usr/share/doc/cmake-data/html",
        "cmake.org/cmake/help/v3.25",
        exclude=_SPHINX_EXCLUDE,
        dir_cap=120,
    ),
    DebSource("vim", "vim-doc", "2:9.0.1378-2+deb12u2", "usr/share/doc/vim/html", "vimhelp.org"),
    DebSource(
        "node18",
        "nodejs-doc",
        "18.20.4+dfsg-1~deb12u3",
        "usr/share/doc/nodejs/api",
        "nodejs.org/docs/v18.20.4/api",
        exclude=("all.html",),
    ),
]


@dataclass
class PypiFamily:
    key: str
    name: str  # PyPI project name
    versions: tuple[str, ...]  # ascending
    docs: str  # docs directory inside the sdist
    exts: tuple[str, ...]
    site: dict  # template strings
    exclude: tuple[str, ...] = ()


PYPI_FAMILIES: list[PypiFamily] = [
    PypiFamily(
        "django",
        "Django",
        ("3.2", "4.0", "4.1", "4.2", "4.2.16", "5.0", "5.1"),
        "docs",
        (".txt",),
        dict(
            host="docs.djangoproject.com/en/{ver}",
            project="Django",
            org="Django Software Foundation",
            years="2005-2024",
            style="django",
            nav=[
                "Overview",
                "Download",
                "Documentation",
                "News",
                "Code",
                "Issues",
                "Community",
                "Foundation",
                "Fundraising",
            ],
        ),
        exclude=("_ext/*", "_theme/*", "README.rst", "spelling_wordlist", "man/*", "requirements.txt"),
    ),
    PypiFamily(
        "flask",
        "Flask",
        ("2.0.0", "2.2.0", "3.0.0"),
        "docs",
        (".rst",),
        dict(
            host="flask.palletsprojects.com/en/{ver}",
            project="Flask",
            org="Pallets",
            years="2010",
            style="sphinx",
            nav=["Pallets", "Flask", "Werkzeug", "Jinja", "Click", "Donate"],
        ),
    ),
    PypiFamily(
        "sphinx",
        "Sphinx",
        ("5.0.0", "6.0.0", "7.0.0"),
        "doc",
        (".rst",),
        dict(
            host="www.sphinx-doc.org/en/{ver}",
            project="Sphinx",
            org="the Sphinx developers",
            years="2007-2023",
            style="sphinx",
            nav=["Home", "Get it", "Docs", "Extend", "Develop"],
        ),
        exclude=("_templates/*", "_themes/*", "_static/*"),
    ),
    PypiFamily(
        "sqla",
        "SQLAlchemy",
        ("1.4.0", "2.0.0"),
        "doc/build",
        (".rst",),
        dict(
            host="docs.sqlalchemy.org/en/{ver}",
            project="SQLAlchemy",
            org="the SQLAlchemy authors and contributors",
            years="2007-2023",
            style="sphinx",
            nav=["Home", "Features", "Blog", "Library", "Community", "Download"],
        ),
        exclude=("changelog/unreleased_*", "*/README.txt", "README*", "core/tutorial.rst"),
    ),
]

#: Probability of keeping a page of a later version whose reST source is
#: byte-identical to the same page of an earlier version (re-rendered with the
#: new version's banner it is a J ~ 0.97 near-duplicate; keeping them all would
#: swamp the corpus with trivial pairs).
P_KEEP_UNCHANGED = 0.15
#: Probability of keeping a base page whose visible words exactly equal an
#: earlier base page's (real crawls do contain exact duplicates).
P_KEEP_EXACT = 0.15
MIN_WORDS = 50
MAX_HTML_BYTES = 1_500_000

VARIANT_KINDS = ("advert", "counter", "timestamp", "navigation", "markup")
#: Listing and index pages (``variant_kind`` "listing", no ``variant_of``): pages made mostly of
#: one repeated phrase around distinct entries.  Two listings of a site share the phrase and
#: the template, and almost no entries, so they are NOT near-duplicates; a fingerprint that
#: lets repetition outvote the entries takes them for one.  The real ones are the generated
#: index pages of the Sphinx and PostgreSQL packages (otherwise excluded); synthetic ones add
#: other repeated phrases (shop, forum, job, news and API listings).
LISTING_KIND = "listing"
LISTING_PATTERNS = ("genindex-*.html", "genindex.html", "py-modindex.html", "bookindex.html")
LISTING_SITES = (  # (host, entry template); {a} {b} are distinct entry words, {c} one of a few per page
    ("shop.example.com", "{A} {B} Add to cart In stock Free delivery on orders over 50 euros"),
    ("forum.example.org", "Re: {a} {b} posted by {c} Reply Quote Report this post"),
    ("jobs.example.net", "{A} {B} engineer Full time Remote friendly Apply now"),
    ("news.example.com", "{A} {b} Read more 0 comments Share on social media"),
    ("api.example.dev", "{a}_{b}() (method of class {C})"),
    ("wiki.example.org", "{A} {b} (disambiguation) see also {c}"),
)
LISTING_PAGES_PER_SITE = 6
#: fraction of base pages that get synthetic variants
VARIANT_BASE_FRACTION = 0.15
#: probability that a variant is placed BEFORE its base page
P_VARIANT_FIRST = 0.12


def log(msg: str) -> None:
    print(f"[corpus {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------


def _deb_filename_version(v: str) -> str:
    return v.replace(":", "%3a")


def fetch_deb(src: DebSource, dl_dir: Path) -> tuple[Path, str]:
    """apt-get download the pinned version (falls back, loudly, to the
    candidate if the archive no longer carries it). Returns (path, version)."""
    dl_dir.mkdir(parents=True, exist_ok=True)
    want = dl_dir / f"{src.package}_{_deb_filename_version(src.version)}_all.deb"
    if want.exists():
        return want, src.version
    log(f"apt-get download {src.package}={src.version}")
    r = subprocess.run(
        ["apt-get", "download", f"{src.package}={src.version}"], cwd=dl_dir, capture_output=True, text=True
    )
    if r.returncode == 0 and want.exists():
        return want, src.version
    log(
        f"WARNING: {src.package}={src.version} not available ({r.stderr.strip()[-200:]}); "
        f"falling back to the archive's candidate version"
    )
    r = subprocess.run(["apt-get", "download", src.package], cwd=dl_dir, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"apt-get download {src.package} failed: {r.stderr}")
    cands = sorted(dl_dir.glob(f"{src.package}_*_all.deb"), key=lambda p: p.stat().st_mtime)
    path = cands[-1]
    version = path.name[len(src.package) + 1 : -len("_all.deb")].replace("%3a", ":")
    return path, version


def extract_deb(deb: Path, dest: Path) -> Path:
    marker = dest / ".extracted"
    if not marker.exists():
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
        marker.write_text(deb.name)
    return dest


def fetch_sdist(name: str, version: str, dl_dir: Path) -> Path:
    """pip download the sdist (only this project is forced to source; its
    build requirements may come as wheels, which keeps metadata prep fast)."""
    dl_dir.mkdir(parents=True, exist_ok=True)

    def find() -> Path | None:
        for cand in dl_dir.iterdir():
            low = cand.name.lower()
            for stem in (f"{name}-{version}".lower(), f"{name.replace('-', '_')}-{version}".lower()):
                if low in (stem + ".tar.gz", stem + ".zip"):
                    return cand
        return None

    got = find()
    if got:
        return got
    log(f"pip download {name}=={version} (sdist)")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            name,
            f"{name}=={version}",
            "-d",
            str(dl_dir),
        ],
        check=True,
    )
    got = find()
    if not got:
        raise RuntimeError(f"sdist for {name}=={version} not found in {dl_dir}")
    return got


# --------------------------------------------------------------------------
# Reading HTML pages from a Debian doc package
# --------------------------------------------------------------------------

_CHARSET_RE = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_\-]+)""", re.I)


def decode_html(raw: bytes) -> str:
    m = _CHARSET_RE.search(raw[:4096])
    enc = m.group(1).decode("ascii").lower() if m else "utf-8"
    try:
        return raw.decode(enc, errors="replace")
    except LookupError:
        return raw.decode("utf-8", errors="replace")


def _match_any(rel: str, patterns: tuple[str, ...]) -> bool:
    """fnmatch on the relative path; "dir/*" excludes the whole subtree;
    patterns without "/" also match the basename."""
    for pat in patterns:
        if pat.endswith("/*") and rel.startswith(pat[:-1]):
            return True
        if fnmatch.fnmatchcase(rel, pat):
            return True
        if "/" not in pat and fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pat):
            return True
    return False


def list_deb_pages(src: DebSource, tree: Path, rng: random.Random) -> list[tuple[str, Path]]:
    root = tree / src.root
    files: set[Path] = set()
    for pat in src.include:
        for p in root.glob(pat):
            if p.is_file() and not p.is_symlink() and p.stat().st_size <= MAX_HTML_BYTES:
                files.add(p)
    out = []
    for p in sorted(files):
        rel = p.relative_to(root).as_posix()
        if _match_any(rel, src.exclude):
            continue
        out.append((rel, p))
    if src.dir_cap:
        by_dir: dict[str, list] = defaultdict(list)
        for rel, p in out:
            by_dir[rel.rsplit("/", 1)[0] if "/" in rel else ""].append((rel, p))
        out = []
        for d in sorted(by_dir):
            items = by_dir[d]
            if len(items) > src.dir_cap:
                items = sorted(rng.sample(items, src.dir_cap))
            out.extend(items)
    return out


# --------------------------------------------------------------------------
# Minimal reST -> HTML (fidelity is not the point: real text, plausible markup)
# --------------------------------------------------------------------------

_ADORN_CHARS = set("=-`:'\"~^_*+#<>.")
_DIRECTIVE_RE = re.compile(r"^\.\.\s+([A-Za-z][\w:+-]*)::\s*(.*)$")
_TARGET_RE = re.compile(r"^\.\.\s+_[^:]*:.*$|^\.\.\s+\|[^|]+\|.*$|^__ .*$")
_BULLET_RE = re.compile(r"^([-*+\u2022]|#\.|\d+[.)]|\(?[a-z]\))\s+(.*)$")
_FIELD_RE = re.compile(r"^:[^:]+:(\s.*)?$")

_CODE_DIRECTIVES = {
    "code-block",
    "code",
    "sourcecode",
    "doctest",
    "testcode",
    "testoutput",
    "console-block",
    "parsed-literal",
    "productionlist",
    "highlight-block",
    "prompt",
}
_ADMONITIONS = {
    "note",
    "warning",
    "seealso",
    "tip",
    "important",
    "attention",
    "caution",
    "hint",
    "danger",
    "error",
    "admonition",
    "topic",
    "sidebar",
    "deprecated",
    "versionadded",
    "versionchanged",
    "glossary",
    "rubric",
    "epigraph",
    "impl-detail",
}
_SILENT = {
    "module",
    "currentmodule",
    "highlight",
    "index",
    "include",
    "literalinclude",
    "image",
    "raw",
    "toctree-hidden",
    "default-role",
    "role",
    "py:module",
    "py:currentmodule",
    "automodule",
    "autoclass",
    "autofunction",
    "tabularcolumns",
    "meta",
    "contents",
    "only-latex",
    "figure",
    "sectionauthor",
    "moduleauthor",
    "codeauthor",
    "testsetup",
    "testcleanup",
    "ifconfig",
    "autosummary",
    "changelog_imports",
    "exampleinclude",
    "autodata",
    "automethod",
    "autoattribute",
    "autoexception",
}
_VERSION_LABEL = {
    "versionadded": "New in version {}",
    "versionchanged": "Changed in version {}",
    "deprecated": "Deprecated since version {}",
}


def _is_adornment(line: str) -> bool:
    s = line.rstrip()
    return len(s) >= 3 and s[0] in _ADORN_CHARS and s == s[0] * len(s)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


_ROLE_RE = re.compile(r":[\w:+-]+:`([^`]*)`")
_LINK_RE = re.compile(r"`([^`<]+?)\s*<([^>`]+)>`__?")
_REF_RE = re.compile(r"`([^`]+)`__?")
_LIT_RE = re.compile(r"``(.+?)``")
_STRONG_RE = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
_EM_RE = re.compile(r"(?<![\w*])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")
_SUBST_RE = re.compile(r"\|([^|\s][^|]*)\|")


def _role_text(inner: str) -> str:
    m = re.match(r"^(.*?)\s*<([^>]*)>$", inner, re.S)
    if m and m.group(1):
        return m.group(1)
    inner = m.group(2) if m else inner
    inner = inner.lstrip("!")
    if inner.startswith("~"):
        inner = inner[1:].rsplit(".", 1)[-1]
    return inner


def render_inline(text: str) -> str:
    """reST inline markup -> HTML (escaped)."""
    out: list[str] = []
    pos = 0
    # literals first (their content is verbatim)
    for m in _LIT_RE.finditer(text):
        out.append(_render_inline_plain(text[pos : m.start()]))
        out.append(f'<code class="literal">{htmllib.escape(m.group(1), quote=False)}</code>')
        pos = m.end()
    out.append(_render_inline_plain(text[pos:]))
    return "".join(out)


def _render_inline_plain(text: str) -> str:
    marks: list[str] = []

    def stash(html_: str) -> str:
        marks.append(html_)
        return f"\x00{len(marks) - 1}\x00"

    text = _ROLE_RE.sub(
        lambda m: stash(f'<code class="xref">{htmllib.escape(_role_text(m.group(1)), quote=False)}</code>'), text
    )
    text = _LINK_RE.sub(
        lambda m: stash(
            f'<a class="reference external" href="{htmllib.escape(m.group(2))}">{htmllib.escape(m.group(1), quote=False)}</a>'
        ),
        text,
    )
    text = _REF_RE.sub(
        lambda m: stash(f'<a class="reference internal" href="#">{htmllib.escape(m.group(1), quote=False)}</a>'), text
    )
    text = htmllib.escape(text, quote=False)
    text = _STRONG_RE.sub(r"<strong>\1</strong>", text)
    text = _EM_RE.sub(r"<em>\1</em>", text)
    text = _SUBST_RE.sub(r"\1", text)
    text = text.replace("\\", "")
    return re.sub("\x00(\\d+)\x00", lambda m: marks[int(m.group(1))], text)


class RstRenderer:
    """Block-level reST subset: headings, paragraphs, lists, literal blocks,
    directives (admonitions, code, toctree, object descriptions), tables as
    preformatted text, comments/targets dropped."""

    def __init__(self) -> None:
        self.heading_styles: list[tuple[str, bool]] = []
        self.headings: list[tuple[int, str, str]] = []  # (level, text, anchor)
        self.title: str | None = None

    def _level(self, ch: str, over: bool) -> int:
        key = (ch, over)
        if key not in self.heading_styles:
            self.heading_styles.append(key)
        return min(6, self.heading_styles.index(key) + 1)

    def _heading(self, text: str, ch: str, over: bool) -> str:
        level = self._level(ch, over)
        text = text.strip()
        plain = re.sub(r"<[^>]+>", "", render_inline(text))
        anchor = re.sub(r"[^a-z0-9]+", "-", plain.lower()).strip("-") or "section"
        self.headings.append((level, plain, anchor))
        if self.title is None:
            self.title = htmllib.unescape(plain)
        return (
            f'<h{level} id="{anchor}">{render_inline(text)}'
            f'<a class="headerlink" href="#{anchor}" title="Permalink to this headline">\u00b6</a></h{level}>'
        )

    @staticmethod
    def _block(lines: list[str], i: int, base: int) -> tuple[list[str], int]:
        """Collect the indented block (indent > base) starting at i; dedented."""
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        ind = min((_indent(b) for b in block if b.strip()), default=0)
        return [b[ind:] for b in block], i

    def render(self, lines: list[str]) -> str:
        out: list[str] = []
        para: list[str] = []
        literal_next = False
        i = 0
        n = len(lines)

        def flush() -> None:
            nonlocal literal_next
            if para:
                text = " ".join(p.strip() for p in para)
                if text.endswith("::"):
                    literal_next = True
                    text = text[:-2].rstrip()
                    if text and not text.endswith(":"):
                        text += ":"
                if text:
                    out.append(f"<p>{render_inline(text)}</p>")
                para.clear()

        while i < n:
            line = lines[i]
            s = line.strip()
            if not s:
                flush()
                i += 1
                continue
            ind = _indent(line)
            # literal block after "::"
            if literal_next and ind > 0:
                block, i = self._block(lines, i, 0)
                out.append("<pre>" + htmllib.escape("\n".join(block), quote=False) + "</pre>")
                literal_next = False
                continue
            literal_next = False
            # overlined title
            if _is_adornment(line) and i + 2 < n and lines[i + 1].strip() and _is_adornment(lines[i + 2]) and not para:
                out.append(self._heading(lines[i + 1], s[0], True))
                i += 3
                continue
            # underlined title
            if (
                not para
                and ind == 0
                and i + 1 < n
                and _is_adornment(lines[i + 1])
                and len(lines[i + 1].rstrip()) >= len(s) - 1
                and not _is_adornment(line)
            ):
                out.append(self._heading(line, lines[i + 1].strip()[0], False))
                i += 2
                continue
            if _is_adornment(line):  # stray transition / table border
                flush()
                i += 1
                continue
            # directives / comments / targets
            if s.startswith(".."):
                flush()
                m = _DIRECTIVE_RE.match(s)
                body, j = self._block(lines, i + 1, ind)
                if m:
                    out.append(self._directive(m.group(1).lower(), m.group(2), body))
                elif not _TARGET_RE.match(s) and s != "..":
                    pass  # comment: drop with its block
                i = j
                continue
            # grid tables -> preformatted
            if s.startswith("+-") or s.startswith("+="):
                flush()
                rows = []
                while i < n and lines[i].strip() and lines[i].strip()[0] in "+|":
                    t = lines[i].strip()
                    if not t.startswith("+"):
                        rows.append(" ".join(c.strip() for c in t.strip("|").split("|")))
                    i += 1
                out.append(
                    '<table class="docutils"><tbody>'
                    + "".join(f"<tr><td>{render_inline(r)}</td></tr>" for r in rows if r.strip())
                    + "</tbody></table>"
                )
                continue
            # bullet / enumerated lists
            mb = _BULLET_RE.match(s)
            if mb and not para:
                items = []
                while i < n:
                    s2 = lines[i].strip()
                    mb2 = _BULLET_RE.match(s2) if s2 else None
                    if not mb2 or _indent(lines[i]) != ind:
                        break
                    item = [mb2.group(2)]
                    i += 1
                    cont, i = self._block(lines, i, ind)
                    items.append(self._sub(item + cont))
                    while i < n and not lines[i].strip():
                        i += 1
                tag = "ol" if mb.group(1)[0].isdigit() or mb.group(1) == "#." else "ul"
                out.append(f"<{tag}>" + "".join(f"<li>{it}</li>" for it in items) + f"</{tag}>")
                continue
            # field list line
            if _FIELD_RE.match(s) and not para:
                name, _, rest = s[1:].partition(":")
                body, i = self._block(lines, i + 1, ind)
                out.append(
                    f'<dl class="field-list"><dt>{render_inline(name)}</dt><dd>'
                    f"{self._sub([rest.strip()] + ([''] + body if body else []))}</dd></dl>"
                )
                continue
            # indented block not after '::' -> definition body / block quote
            if ind > 0 and not para:
                block, i = self._block(lines, i, ind - 1)
                out.append(f"<blockquote>{self._sub(block)}</blockquote>")
                continue
            # definition list: a single line directly followed by an indented block
            if not para and i + 1 < n and lines[i + 1].strip() and _indent(lines[i + 1]) > ind:
                body, j = self._block(lines, i + 1, ind)
                out.append(f"<dl><dt>{render_inline(s)}</dt><dd>{self._sub(body)}</dd></dl>")
                i = j
                continue
            para.append(line)
            i += 1
        flush()
        return "\n".join(out)

    def _sub(self, lines: list[str]) -> str:
        return self.render(lines)

    def _directive(self, name: str, args: str, body: list[str]) -> str:
        # options (":maxdepth: 2") lead the body
        opts = 0
        while opts < len(body) and _FIELD_RE.match(body[opts].strip() or "x"):
            opts += 1
        content = body[opts:]
        while content and not content[0].strip():
            content = content[1:]
        short = name.split(":")[-1]
        if short in _CODE_DIRECTIVES:
            return '<div class="highlight"><pre>' + htmllib.escape("\n".join(content), quote=False) + "</pre></div>"
        if short == "toctree":
            items = [c.strip() for c in content if c.strip()]
            lis = []
            for it in items:
                m = re.match(r"^(.*?)\s*<([^>]+)>$", it)
                label = m.group(1) if m else it.rsplit("/", 1)[-1].replace("-", " ").replace("_", " ")
                href = (m.group(2) if m else it) + "/"
                lis.append(
                    f'<li class="toctree-l1"><a class="reference internal" href="{htmllib.escape(href)}">'
                    f"{htmllib.escape(label.capitalize() if not m else label, quote=False)}</a></li>"
                )
            return '<div class="toctree-wrapper compound"><ul>' + "".join(lis) + "</ul></div>"
        if short in _SILENT:
            return ""
        if short in _VERSION_LABEL:
            label = _VERSION_LABEL[short].format(args.strip())
            inner = self._sub(content) if content else ""
            return f'<div class="{short}"><p><span class="versionmodified">{htmllib.escape(label)}:</span></p>{inner}</div>'
        if short in _ADMONITIONS:
            title = args.strip() or short.replace("seealso", "See also").capitalize()
            return (
                f'<div class="admonition {short}"><p class="admonition-title">{render_inline(title)}</p>'
                f"{self._sub(content)}</div>"
            )
        if short in {
            "list-table",
            "table",
            "csv-table",
            "only",
            "container",
            "tab",
            "tabs",
            "code-tab",
            "class",
            "cssclass",
            "centered",
            "hlist",
            "compound",
        }:
            return self._sub(content) if content else ""
        if args:  # object descriptions: function, method, class, setting, django-admin, ...
            return (
                f'<dl class="{htmllib.escape(short)}"><dt class="sig"><code class="descname">'
                f"{htmllib.escape(args, quote=False)}</code></dt><dd>{self._sub(content)}</dd></dl>"
            )
        return self._sub(content) if content else ""


def render_rst(src: str) -> tuple[str, str, list[tuple[int, str, str]]]:
    r = RstRenderer()
    body = r.render(src.expandtabs(4).splitlines())
    return r.title or "Untitled", body, r.headings


# --------------------------------------------------------------------------
# Page templates for rendered sdist docs
# --------------------------------------------------------------------------


def _e(s: str) -> str:
    return htmllib.escape(s, quote=True)


def _slug_url(rel: str) -> str:
    stem = rel.rsplit(".", 1)[0]
    if stem.endswith("/index") or stem == "index":
        stem = stem[: -len("index")]
        return stem
    return stem + "/"


def page_template(
    site: dict,
    version: str,
    rel: str,
    title: str,
    body: str,
    headings: list[tuple[int, str, str]],
    prev: tuple[str, str] | None,
    nxt: tuple[str, str] | None,
) -> str:
    proj = site["project"]
    root = "/en/" + version + "/"
    toc = "".join(
        f'<li class="toc-l{lv}"><a href="#{a}">{htmllib.escape(t, quote=False)}</a></li>'
        for lv, t, a in headings[1:40]
        if lv <= 3
    )
    crumbs = [p for p in rel.rsplit(".", 1)[0].split("/")[:-1] if p]
    prev_html = (
        f'<a rel="prev" href="{root}{_slug_url(prev[0])}">{htmllib.escape(prev[1], quote=False)}</a>' if prev else ""
    )
    next_html = (
        f'<a rel="next" href="{root}{_slug_url(nxt[0])}">{htmllib.escape(nxt[1], quote=False)}</a>' if nxt else ""
    )
    head = (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)} | {_e(proj)} {version} documentation</title>\n"
        f'<link rel="stylesheet" href="/static/css/output.css">\n'
        f'<link rel="canonical" href="https://{site["host"].format(ver=version)}/{_slug_url(rel)}">\n'
        f"<script>window.DOCUMENTATION_OPTIONS = {{VERSION: '{version}', LANGUAGE: 'en'}};</script>\n"
        f'<script src="/static/js/main.js" defer></script>\n</head>\n'
    )
    nav = "".join(f'<li><a href="/{n.lower().replace(" ", "-")}/">{n}</a></li>' for n in site["nav"])
    if site["style"] == "django":
        return head + (
            f'<body id="generic" class="">\n'
            f'<a class="skip-link" href="#main-content">Skip to main content</a>\n'
            f'<div role="banner" id="top"><div class="container">\n'
            f'<a class="logo" href="/">Django</a>\n<p class="meta">The web framework for perfectionists with deadlines.</p>\n'
            f'<nav id="global-nav" class="global-nav" aria-label="Main"><ul>{nav}</ul></nav>\n</div></div>\n'
            f'<div class="copy-banner"><div class="container"><h1><a href="{root}">Documentation</a></h1></div></div>\n'
            f'<div id="billboard"></div>\n'
            f'<div class="container sidebar-right"><main id="main-content">\n'
            f'<div id="version-switcher"><ul id="doc-versions" class="version-switcher">'
            f'<li class="current"><span>Documentation version: <strong>{version}</strong></span></li></ul></div>\n'
            f'<article id="docs-content">\n<div class="section">\n{body}\n</div>\n</article>\n'
            f'<nav class="browse-horizontal" aria-labelledby="browse-horizontal-header">'
            f'<div class="left">{prev_html}</div><div class="right">{next_html}</div></nav>\n</main>\n'
            f'<div role="complementary"><h2 class="visuallyhidden">Additional Information</h2>\n'
            f'<div class="fundraising-sidebar"><h3>Support Django!</h3>'
            f"<p>Support the Django Software Foundation and help keep the web framework going.</p></div>\n"
            f'<h3>Contents</h3><ul class="toc">{toc}</ul>\n'
            f"<h3>Browse</h3><ul><li>Prev: {prev_html}</li><li>Next: {next_html}</li>"
            f'<li><a href="{root}contents/">Table of contents</a></li><li><a href="{root}genindex/">General Index</a></li>'
            f'<li><a href="{root}py-modindex/">Python Module Index</a></li></ul>\n'
            f'<h3>You are here:</h3><ul><li><a href="{root}">Django {version} documentation</a><ul>'
            + "".join(f'<li><a href="{root}{c}/">{c.replace("_", " ").capitalize()}</a></li>' for c in crumbs)
            + f"<li>{htmllib.escape(title, quote=False)}</li></ul></li></ul>\n"
            f'<h3>Getting help</h3><dl><dt><a href="https://docs.djangoproject.com/en/{version}/faq/">FAQ</a></dt>'
            f"<dd>Try the FAQ — it's got answers to many common questions.</dd>"
            f'<dt><a href="/en/stable/genindex/">Index</a>, <a href="/en/stable/py-modindex/">Module Index</a></dt>'
            f"<dd>Handy when looking for specific information.</dd>"
            f'<dt><a href="https://forum.djangoproject.com/">Django Discord Server</a></dt>'
            f"<dd>Join the Django Discord Community.</dd></dl>\n"
            f'<h3>Download:</h3><p>Offline (Django {version}): <a href="#">HTML</a> | <a href="#">PDF</a> | '
            f'<a href="#">ePub</a><br>Provided by <a href="https://readthedocs.org/">Read the Docs</a>.</p>\n'
            f"</div></div>\n"
            f'<footer><div class="subfooter"><div class="container"><p class="footer">'
            f'\u00a9 {site["years"]} <a href="https://djangoproject.com/foundation/">{site["org"]}</a> and individual '
            f'contributors. Django is a <a href="https://djangoproject.com/trademarks/">registered trademark</a> of the '
            f"Django Software Foundation.</p></div></div></footer>\n</body>\n</html>\n"
        )
    # generic Sphinx-like layout
    return head + (
        f'<body>\n<div class="related" role="navigation" aria-label="related navigation">\n<h3>Navigation</h3>\n<ul>\n'
        f'<li class="right"><a href="{root}genindex/" title="General Index" accesskey="I">index</a></li>\n'
        + (f'<li class="right"><a href="{root}{_slug_url(nxt[0])}" accesskey="N">next</a> |</li>\n' if nxt else "")
        + (
            f'<li class="right"><a href="{root}{_slug_url(prev[0])}" accesskey="P">previous</a> |</li>\n'
            if prev
            else ""
        )
        + f'<li class="nav-item nav-item-0"><a href="{root}">{proj} Documentation ({version})</a> \u00bb</li>\n'
        f'<li class="nav-item nav-item-this"><a href="">{htmllib.escape(title, quote=False)}</a></li>\n</ul>\n</div>\n'
        f'<div class="document"><div class="documentwrapper"><div class="bodywrapper">'
        f'<div class="body" role="main">\n<section id="content">\n{body}\n</section>\n</div></div></div>\n'
        f'<div class="sphinxsidebar" role="navigation" aria-label="main navigation"><div class="sphinxsidebarwrapper">\n'
        f'<p class="logo"><a href="{root}"><img class="logo" src="/_static/logo.png" alt="Logo"></a></p>\n'
        f'<nav class="project-links"><ul>{nav}</ul></nav>\n'
        f'<h3><a href="{root}">Table of Contents</a></h3><ul>{toc}</ul>\n'
        + (f'<h4>Previous topic</h4><p class="topless">{prev_html}</p>\n' if prev else "")
        + (f'<h4>Next topic</h4><p class="topless">{next_html}</p>\n' if nxt else "")
        + f'<div role="note" aria-label="source link"><h3>This Page</h3><ul class="this-page-menu">'
        f'<li><a href="/_sources/{rel}.txt" rel="nofollow">Show Source</a></li></ul></div>\n'
        f'<div id="searchbox" role="search"><h3 id="searchlabel">Quick search</h3>'
        f'<form class="search" action="{root}search/" method="get"><input type="text" name="q" '
        f'aria-labelledby="searchlabel"><input type="submit" value="Go"></form></div>\n'
        f'</div></div>\n<div class="clearer"></div></div>\n'
        f'<div class="footer" role="contentinfo">\u00a9 Copyright {site["years"]}, {site["org"]}. '
        f'Created using <a href="https://www.sphinx-doc.org/">Sphinx</a>. {proj} {version} documentation.</div>\n'
        f"</body>\n</html>\n"
    )


# --------------------------------------------------------------------------
# Page records
# --------------------------------------------------------------------------


@dataclass
class Page:
    id: str
    url: str
    content: str
    source: str
    variant_of: str | None = None
    variant_kind: str | None = None
    text: str = ""  # ground-truth visible text (filled later)
    nwords: int = 0
    meta: dict = field(default_factory=dict)

    def record(self) -> dict:
        return {
            "id": self.id,
            "url": self.url,
            "content": self.content,
            "content_type": "text/html",
            "source": self.source,
            "variant_of": self.variant_of,
            "variant_kind": self.variant_kind,
        }

    def text_record(self) -> dict:
        return {
            "id": self.id,
            "url": self.url,
            "content": self.text,
            "content_type": "text/plain",
            "source": self.source,
            "variant_of": self.variant_of,
            "variant_kind": self.variant_kind,
        }


def _visible(html_: str) -> tuple[str, int, str]:
    text = gt.visible_text(html_)
    ws = gt.words(text)
    return text, len(ws), hashlib.blake2b(" ".join(ws).encode(), digest_size=16).hexdigest()


def annotate(pages: list[Page], processes: int) -> list[str]:
    """Fill .text and .nwords; returns a words-digest per page."""
    contents = [p.content for p in pages]
    if processes > 1 and len(pages) > 200:
        with mp.get_context("fork").Pool(processes) as pool:
            res = pool.map(_visible, contents, chunksize=32)
    else:
        res = [_visible(c) for c in contents]
    digests = []
    for p, (text, nw, dg) in zip(pages, res):
        p.text, p.nwords = text, nw
        digests.append(dg)
    return digests


def list_listing_pages(src: DebSource, tree: Path) -> list[tuple[str, Path]]:
    """The package's generated index pages (``LISTING_PATTERNS``, at the site's top level)."""
    root = tree / src.root
    out = []
    for pat in LISTING_PATTERNS:
        for p in sorted(root.glob(pat)):
            if p.is_file() and not p.is_symlink() and p.stat().st_size <= MAX_HTML_BYTES:
                out.append((p.relative_to(root).as_posix(), p))
    return out


def deb_pages(src: DebSource, data: Path, rng: random.Random, manifest: dict) -> list[Page]:
    deb, version = fetch_deb(src, data / "downloads" / "deb")
    tree = extract_deb(deb, data / "extract" / deb.stem)
    files = list_deb_pages(src, tree, rng)
    listings = [f for f in list_listing_pages(src, tree) if f[0] not in {rel for rel, _ in files}]
    pages = [
        Page(
            id=f"{src.key}/{rel}",
            url=f"https://{src.host}/{rel}",
            content=decode_html(p.read_bytes()),
            source=f"deb:{src.package}",
            variant_kind=kind,
        )
        for (rel, p), kind in [(f, None) for f in files] + [(f, LISTING_KIND) for f in listings]
    ]
    manifest["sources"].append(
        {
            "kind": "debian",
            "key": src.key,
            "package": src.package,
            "version": version,
            "pinned_version": src.version,
            "file": deb.name,
            "sha256": gt.file_sha256(deb),
            "candidates": len(pages),
        }
    )
    return pages


def _sdist_docs(archive: Path, docs: str, exts: tuple[str, ...], exclude: tuple[str, ...]) -> dict[str, str]:
    out = {}
    with tarfile.open(archive) as tf:
        for m in tf.getmembers():
            if not m.isfile():
                continue
            parts = m.name.split("/", 1)
            if len(parts) < 2 or not parts[1].startswith(docs + "/"):
                continue
            rel = parts[1][len(docs) + 1 :]
            if not rel.endswith(exts) or _match_any(rel, exclude):
                continue
            f = tf.extractfile(m)
            if f is not None:
                out[rel] = f.read().decode("utf-8", errors="replace")
    return out


def family_pages(fam: PypiFamily, data: Path, rng: random.Random, manifest: dict) -> list[Page]:
    pages: list[Page] = []
    seen_src: dict[str, set[str]] = defaultdict(set)  # rel -> hashes of sources already used
    for ver in fam.versions:
        archive = fetch_sdist(fam.name, ver, data / "downloads" / "pypi")
        docs = _sdist_docs(archive, fam.docs, fam.exts, fam.exclude)
        rendered = {}
        for rel in sorted(docs):
            title, body, heads = render_rst(docs[rel])
            rendered[rel] = (title, body, heads)
        order = sorted(rendered)
        kept = unchanged_dropped = 0
        for k, rel in enumerate(order):
            h = hashlib.sha256(docs[rel].encode()).hexdigest()
            if h in seen_src[rel] and rng.random() >= P_KEEP_UNCHANGED:
                unchanged_dropped += 1
                continue
            seen_src[rel].add(h)
            title, body, heads = rendered[rel]
            prev = (order[k - 1], rendered[order[k - 1]][0]) if k > 0 else None
            nxt = (order[k + 1], rendered[order[k + 1]][0]) if k + 1 < len(order) else None
            html_ = page_template(fam.site, ver, rel, title, body, heads, prev, nxt)
            host = fam.site["host"].format(ver=ver)
            pages.append(
                Page(
                    id=f"{fam.key}-{ver}/{rel.rsplit('.', 1)[0]}",
                    url=f"https://{host}/{_slug_url(rel)}",
                    content=html_,
                    source=f"pypi:{fam.name}=={ver}",
                )
            )
            kept += 1
        manifest["sources"].append(
            {
                "kind": "pypi-sdist",
                "key": f"{fam.key}-{ver}",
                "package": fam.name,
                "version": ver,
                "file": archive.name,
                "sha256": gt.file_sha256(archive),
                "candidates": kept,
                "unchanged_dropped": unchanged_dropped,
            }
        )
        log(f"  {fam.name} {ver}: {len(docs)} doc sources, {kept} pages kept, {unchanged_dropped} unchanged dropped")
    return pages


# --------------------------------------------------------------------------
# Synthetic variants (Manku et al.: adverts, counters, timestamps, navigation, markup)
# --------------------------------------------------------------------------

_BLOCK_CLOSE_RE = re.compile(r"</(p|div|ul|ol|dl|table|section|pre|blockquote|h[1-6])\s*>", re.I)
_PROTECT_RE = re.compile(r"<(script|style|pre|textarea|title)\b.*?</\1\s*>|<!--.*?-->", re.I | re.S)
_BODY_OPEN_RE = re.compile(r"<body\b[^>]*>", re.I)
_BODY_CLOSE_RE = re.compile(r"</body\s*>", re.I)
_FOOTER_RE = re.compile(r"<(footer|div)\b[^>]*(?:class|id)=[\"'][^\"']*footer[^\"']*[\"'][^>]*>|<footer\b[^>]*>", re.I)
_NAV_RE = re.compile(
    r"<nav\b[^>]*>|<(?:div|ul)\b[^>]*(?:role=[\"']navigation[\"']|class=[\"'][^\"']*"
    r"(?:related|navbar|menu|navheader|nav-bar|navigation)[^\"']*[\"'])[^>]*>",
    re.I,
)

_BRANDS = [
    "CloudNimbus",
    "Hostwise",
    "DataForge",
    "ByteBarn",
    "Quillpad",
    "Stackwell",
    "Pixelmoor",
    "NordLedger",
    "Brightwire",
    "Tessel",
    "Lumenstack",
    "Orbitly",
    "Kestrel Labs",
    "Ferrous",
    "Gridlock Security",
]
_PRODUCTS = [
    "managed PostgreSQL",
    "VPS hosting",
    "online Python courses",
    "code review tool",
    "observability platform",
    "VPN",
    "noise-cancelling headphones",
    "standing desks",
    "password manager",
    "CI/CD pipelines",
    "mechanical keyboards",
    "cloud backup",
    "error tracking",
    "headless CMS",
    "email delivery API",
]
_OFFERS = [
    "50% off your first month",
    "free shipping on all orders",
    "a free trial, no credit card required",
    "a free 30-day trial",
    "$100 in free credits",
    "two months free on annual plans",
    "20% off this week only",
    "free setup and migration",
]
_CTAS = [
    "Sign up today",
    "Learn more",
    "Shop now",
    "Start your free trial",
    "Get started",
    "Claim your offer",
    "Book a demo",
    "Try it free",
]
_NAV_LABELS = [
    "Home",
    "Blog",
    "Downloads",
    "Community",
    "Support",
    "News",
    "Events",
    "Careers",
    "Donate",
    "Search",
    "Contact us",
    "About",
    "Release notes",
    "Security",
    "Forum",
    "Partners",
    "Status",
    "Shop",
    "Training",
    "Newsletter",
    "Jobs",
    "Sponsors",
    "Roadmap",
    "Changelog",
]
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def _unprotected_positions(html_: str, rx: re.Pattern) -> list[re.Match]:
    prot = [(m.start(), m.end()) for m in _PROTECT_RE.finditer(html_)]
    out = []
    k = 0
    body = _BODY_OPEN_RE.search(html_)
    start = body.end() if body else 0
    for m in rx.finditer(html_, start):
        while k < len(prot) and prot[k][1] <= m.start():
            k += 1
        if k < len(prot) and prot[k][0] <= m.start() < prot[k][1]:
            continue
        out.append(m)
    return out


def _insert(html_: str, pos: int, snippet: str) -> str:
    return html_[:pos] + snippet + html_[pos:]


def _ad_html(rng: random.Random) -> str:
    brand, prod, offer, cta = rng.choice(_BRANDS), rng.choice(_PRODUCTS), rng.choice(_OFFERS), rng.choice(_CTAS)
    n = rng.randint(1000, 99999)
    style = rng.randrange(4)
    script = (
        f"<script>(adsbygoogle = window.adsbygoogle || []).push({{slot: '{n}'}});</script>"
        if rng.random() < 0.5
        else ""
    )
    if style == 0:
        return (
            f'<div class="ad ad-banner" id="ad-{n}"><span class="ad-label">Advertisement</span>'
            f'<a href="https://ads.example.net/click?cid={n}" rel="sponsored nofollow">'
            f"<strong>{brand}</strong>: {prod} with {offer}.</a> {cta}!{script}</div>"
        )
    if style == 1:
        return (
            f'<aside class="advertisement sidebar-ad" data-ad-slot="{n}"><h4>Sponsored</h4>'
            f"<p>Looking for {prod}? {brand} gives you {offer}. {cta} at "
            f'<a href="https://{brand.lower().replace(" ", "")}.example.com/?ref=docs">{brand.lower().replace(" ", "")}.example.com</a>.</p>{script}</aside>'
        )
    if style == 2:
        return (
            f'<div class="sponsored" role="complementary"><p><em>Sponsored by {brand}</em> \u2014 '
            f'the {prod} teams love. Get {offer}. <a href="https://ads.example.net/c/{n}">{cta} \u2192</a></p>{script}</div>'
        )
    return (
        f'<div class="ad-container"><ins class="adsbygoogle" data-ad-client="ca-pub-{n}"></ins>'
        f'<div class="ad-text">Ads by {brand}: {prod}. {offer.capitalize()}. {cta}.</div>{script}</div>'
    )


def _ad_slot(html_: str, rng: random.Random) -> int:
    cands = _unprotected_positions(html_, _BLOCK_CLOSE_RE)
    if not cands:
        m = _BODY_CLOSE_RE.search(html_)
        return m.start() if m else len(html_)
    # prefer the top half of the page (banners, in-content ads)
    m = cands[int(len(cands) * rng.random() ** 1.5)]
    return m.end()


def _footer_slot(html_: str) -> int:
    ms = _unprotected_positions(html_, _FOOTER_RE)
    if ms:
        return ms[-1].end()
    m = _BODY_CLOSE_RE.search(html_)
    return m.start() if m else len(html_)


def _counter_html(fmt: int, n: int) -> str:
    return [
        f'<div class="counter">This page has been viewed {n:,} times.</div>',
        f'<p class="hits">Visitors: <span class="hitcount">{n:07d}</span></p>',
        f'<div id="visits">You are visitor number {n}</div>',
        f'<span class="pageviews"> | {n:,} page views</span>',
    ][fmt]


def _timestamp_html(fmt: int, t: float) -> str:
    lt = time.gmtime(t)
    hms = f"{lt.tm_hour:02d}:{lt.tm_min:02d}:{lt.tm_sec:02d}"
    return [
        f'<p class="last-updated">Last updated on {lt.tm_year}-{lt.tm_mon:02d}-{lt.tm_mday:02d} {hms} UTC.</p>',
        f'<div class="generated">Page generated {_DAYS[lt.tm_wday]}, {lt.tm_mday:02d} '
        f"{_MONTHS[lt.tm_mon - 1][:3]} {lt.tm_year} {hms} GMT</div>",
        f'<div class="timestamp">Generated at {hms} on {_MONTHS[lt.tm_mon - 1]} {lt.tm_mday}, {lt.tm_year}.</div>',
        f"<p><small>Built {lt.tm_year}/{lt.tm_mon:02d}/{lt.tm_mday:02d} {hms[:5]} from revision "
        f"<code>{(int(t) * 2654435761) % 16**7:07x}</code></small></p>",
    ][fmt]


def _nav_region(html_: str) -> tuple[int, int] | None:
    """(start, end-of-first-</ul>) of the first nav-like block that has a list."""
    for m in _unprotected_positions(html_, _NAV_RE):
        close = html_.find("</ul>", m.end(), m.end() + 6000)
        if close == -1:
            close = html_.lower().find("</ul>", m.end(), m.end() + 6000)
        if close != -1 and "<li" in html_[m.end() : close].lower():
            return m.start(), close
    return None


def _nav_bar(labels: list[str]) -> str:
    return (
        '<nav class="site-nav" aria-label="Site"><ul>'
        + "".join(f'<li><a href="/{lb.lower().replace(" ", "-")}/">{lb}</a></li>' for lb in labels)
        + "</ul></nav>"
    )


def _nav_change(html_: str, rng: random.Random) -> str:
    reg = _nav_region(html_)
    if reg is None:
        raise ValueError("no nav")
    start, close = reg
    region = html_[start:close]
    # rename an existing link's text (p=.5)
    fresh = [lb for lb in _NAV_LABELS if lb not in region]
    if rng.random() < 0.5:
        links = list(re.finditer(r"(<a\b[^>]*>)([^<]{3,40})(</a>)", region))
        if links:
            m = rng.choice(links)
            label = rng.choice(fresh)
            fresh.remove(label)
            region = region[: m.start(2)] + label + region[m.end(2) :]
    # drop an existing item (p=.3)
    if rng.random() < 0.3:
        items = list(re.finditer(r"<li\b[^>]*>(?:(?!<li\b|</ul>).){0,300}?</li>\s*", region, re.S))
        if len(items) > 2:
            m = rng.choice(items)
            region = region[: m.start()] + region[m.end() :]
    # add 1-3 links (always)
    new = rng.sample(fresh, rng.randint(1, 3))
    add = "".join(f'<li class="nav-item"><a href="/{lb.lower().replace(" ", "-")}/">{lb}</a></li>' for lb in new)
    return html_[:start] + region + add + html_[close:]


# markup-only transformations -------------------------------------------------

_START_TAG_RE = re.compile(r"<(p|div|a|li|span|td|h[1-6]|ul|section|code|em|strong|dl|dt|dd)(?=[\s>])", re.I)
_CLASS_RE = re.compile(r"class=\"([^\"]*)\"")
_NAMED_ENT = {
    "&quot;": '"',
    "&#39;": "'",
    "&#x27;": "'",
    "&#34;": '"',
    "&nbsp;": "\u00a0",
    "&#160;": "\u00a0",
    "&copy;": "\u00a9",
    "&mdash;": "\u2014",
    "&ndash;": "\u2013",
    "&raquo;": "\u00bb",
    "&para;": "\u00b6",
    "&#182;": "\u00b6",
    "&#187;": "\u00bb",
    "&#8217;": "\u2019",
}


def _map_unprotected(html_: str, fn, text_only: bool = False) -> str:
    """Apply fn to the stretches outside <script>/<style>/<pre>/<textarea>/<title>/comments
    (and, with text_only, only to character data between tags)."""
    out = []
    pos = 0
    for m in _PROTECT_RE.finditer(html_):
        out.append(_map_text(html_[pos : m.start()], fn) if text_only else fn(html_[pos : m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_map_text(html_[pos:], fn) if text_only else fn(html_[pos:]))
    return "".join(out)


def _map_text(chunk: str, fn) -> str:
    parts = re.split(r"(<[^>]*>)", chunk)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def mk_attrs(html_: str, rng: random.Random) -> str:
    tok = f"{rng.getrandbits(24):06x}"
    p = rng.uniform(0.1, 0.5)

    def fn(chunk: str) -> str:
        return _START_TAG_RE.sub(lambda m: m.group(0) + (f" data-v-{tok}" if rng.random() < p else ""), chunk)

    return _map_unprotected(html_, fn)


def mk_classes(html_: str, rng: random.Random) -> str:
    extra = rng.choice(["js-enabled", "is-visible", "theme-dark", "v2", "u-pad", "compact", "new-layout"])
    p = rng.uniform(0.3, 1.0)
    rename = {}

    def sub(m: re.Match) -> str:
        if rng.random() >= p:
            return m.group(0)
        cls = m.group(1).split()
        if cls and rng.random() < 0.3:
            c = cls[0]
            rename.setdefault(c, f"{c}-{rng.getrandbits(16):04x}")
            cls[0] = rename[c]
        return f'class="{" ".join(cls + [extra])}"'

    return _map_unprotected(html_, lambda c: _CLASS_RE.sub(sub, c))


def mk_comments(html_: str, rng: random.Random) -> str:
    p = rng.uniform(0.05, 0.3)
    texts = [
        "<!-- cached -->",
        "<!-- end .section -->",
        "<!-- /block -->",
        f"<!-- rendered in {rng.randint(3, 900)} ms -->",
        "<!-- google_ad_section_end -->",
        f"<!-- node {rng.getrandbits(20):x} -->",
        "<!-- TODO: remove -->",
    ]

    def fn(chunk: str) -> str:
        return _BLOCK_CLOSE_RE.sub(lambda m: m.group(0) + (rng.choice(texts) if rng.random() < p else ""), chunk)

    return _map_unprotected(html_, fn)


def mk_whitespace(html_: str, rng: random.Random) -> str:
    mode = rng.randrange(3)

    def fn(chunk: str) -> str:
        if mode == 0:  # re-indent: any non-empty whitespace run before a tag at line start
            return re.sub(r"\n[ \t]*(?=<)", lambda m: "\n" + " " * rng.choice([0, 2, 4, 8]), chunk)
        if mode == 1:  # blank lines after block ends
            return _BLOCK_CLOSE_RE.sub(lambda m: m.group(0) + ("\n\n" if rng.random() < 0.5 else ""), chunk)
        # tabs for indentation
        return re.sub(r"\n( {2,})(?=<)", lambda m: "\n" + "\t" * (len(m.group(1)) // 2), chunk)

    return _map_unprotected(html_, fn)


def mk_wrapper(html_: str, rng: random.Random) -> str:
    mo, mc = _BODY_OPEN_RE.search(html_), None
    for mc in _BODY_CLOSE_RE.finditer(html_):
        pass
    if not mo or not mc:
        raise ValueError("no body")
    depth = rng.randint(1, 3)
    names = ["page-wrapper", "container", "main-outer", "layout", "site", "content-wrap"]
    opens = "".join(f'<div class="{rng.choice(names)}">' for _ in range(depth))
    return html_[: mo.end()] + opens + html_[mo.end() : mc.start()] + "</div>" * depth + html_[mc.start() :]


def mk_entities(html_: str, rng: random.Random) -> str:
    p = rng.uniform(0.2, 0.9)
    mode = rng.randrange(2)

    def enc(ch: str) -> str:
        if rng.random() >= p:
            return ch
        name = html.entities.codepoint2name.get(ord(ch)) if mode == 0 else None
        return f"&{name};" if name else (f"&#{ord(ch)};" if rng.random() < 0.5 else f"&#x{ord(ch):x};")

    def fn(text: str) -> str:
        for ent, lit in _NAMED_ENT.items():  # entity -> literal
            if ent in text and rng.random() < 0.7:
                text = text.replace(ent, lit)
        # literal -> entity for quotes, non-ASCII, and a sprinkle of letters
        return re.sub(r"[\"'\u00a0-\uffff]|(?<=\w)e(?=\w)", lambda m: enc(m.group(0)), text)

    return _map_unprotected(html_, fn, text_only=True)


def mk_tagcase(html_: str, rng: random.Random) -> str:
    tags = rng.sample(["p", "div", "li", "ul", "a", "span", "table", "td", "tr", "h1", "h2", "h3", "code"], 4)
    rx = re.compile(r"<(/?)(" + "|".join(tags) + r")(?=[\s>])")
    return _map_unprotected(html_, lambda c: rx.sub(lambda m: f"<{m.group(1)}{m.group(2).upper()}", c))


MARKUP_TRANSFORMS = {
    "attrs": mk_attrs,
    "classes": mk_classes,
    "comments": mk_comments,
    "whitespace": mk_whitespace,
    "wrapper": mk_wrapper,
    "entities": mk_entities,
    "tagcase": mk_tagcase,
}


def _words(html_: str) -> list[str]:
    return gt.words(gt.visible_text(html_))


def make_markup_variant(html_: str, rng: random.Random, base_words: list[str]) -> tuple[str, list[str]]:
    names = rng.sample(sorted(MARKUP_TRANSFORMS), rng.randint(2, 4))
    applied = []
    out = html_
    for name in names:
        try:
            cand = MARKUP_TRANSFORMS[name](out, rng)
        except ValueError:
            continue
        if _words(cand) == base_words:  # visible text must stay IDENTICAL
            out = cand
            applied.append(name)
    if not applied or out == html_:
        raise ValueError("no markup transform applicable")
    return out, applied


# --------------------------------------------------------------------------
# Variant generation
# --------------------------------------------------------------------------


def make_variants(bases: list[Page], rng: random.Random, fraction: float) -> tuple[list[Page], Counter]:
    """Pick a seeded random subset of base pages, split among the kinds;
    instrument the base where the kind needs it (counter/timestamp, 'changed'
    adverts, missing nav bars) and emit 1-3 variants per chosen base."""
    n_pick = int(round(len(bases) * fraction))
    chosen = rng.sample(range(len(bases)), n_pick)
    variants: list[Page] = []
    failures: Counter = Counter()
    for k, bi in enumerate(chosen):
        base = bases[bi]
        kind = VARIANT_KINDS[k % len(VARIANT_KINDS)]
        n_var = 1 + (rng.random() < 0.35) + (rng.random() < 0.15)
        html0 = orig = base.content
        try:
            if kind == "advert":
                changed = rng.random() < 0.5
                pos = _ad_slot(html0, rng)
                if changed:  # the base already carries an ad; variants carry other ads in the same slot
                    base.content = _insert(html0, pos, _ad_html(rng))
                    base.meta["instrumented"] = "advert"
                    outs = [_insert(html0, pos, _ad_html(rng)) for _ in range(n_var)]
                else:
                    outs = [_insert(html0, _ad_slot(html0, rng), _ad_html(rng)) for _ in range(n_var)]
            elif kind == "counter":
                fmt, pos = rng.randrange(4), _footer_slot(html0)
                n0 = rng.randint(50, 2_000_000)
                base.content = _insert(html0, pos, _counter_html(fmt, n0))
                base.meta["instrumented"] = "counter"
                outs, n = [], n0
                for _ in range(n_var):
                    n += rng.randint(1, max(2, n0 // 20))
                    outs.append(_insert(html0, pos, _counter_html(fmt, n)))
            elif kind == "timestamp":
                fmt, pos = rng.randrange(4), _footer_slot(html0)
                t0 = 1_600_000_000 + rng.randint(0, 120_000_000)
                base.content = _insert(html0, pos, _timestamp_html(fmt, t0))
                base.meta["instrumented"] = "timestamp"
                outs, t = [], t0
                for _ in range(n_var):
                    t += rng.choice(
                        [rng.randint(60, 3600), rng.randint(3600, 86400 * 3), rng.randint(86400, 86400 * 120)]
                    )
                    outs.append(_insert(html0, pos, _timestamp_html(fmt, t)))
            elif kind == "navigation":
                if _nav_region(html0) is None:  # the site has a nav bar; a later crawl sees it changed
                    body = _BODY_OPEN_RE.search(html0)
                    if not body:
                        raise ValueError("no body")
                    html0 = _insert(html0, body.end(), _nav_bar(rng.sample(_NAV_LABELS, rng.randint(4, 7))))
                    base.content = html0
                    base.meta["instrumented"] = "navigation"
                outs = [_nav_change(html0, rng) for _ in range(n_var)]
            else:  # markup
                bw = _words(html0)
                outs, applied = [], []
                for _ in range(n_var):
                    o, a = make_markup_variant(html0, rng, bw)
                    outs.append(o)
                    applied.append(a)
                base.meta["markup_transforms"] = applied
        except ValueError as exc:
            base.content = orig
            base.meta.pop("instrumented", None)
            failures[f"{kind}: {exc}"] += 1
            continue
        for v, o in enumerate(outs, 1):
            page = Page(
                id=f"{base.id}~{kind}{v}",
                url=f"{base.url}?variant={kind}-{v}",
                content=o,
                source=base.source,
                variant_of=base.id,
                variant_kind=kind,
            )
            if kind == "markup":
                page.meta["markup_transforms"] = base.meta["markup_transforms"][v - 1]
            variants.append(page)
    return variants, failures


def synthetic_listings(bases: list[Page], rng: random.Random) -> list[Page]:
    """``LISTING_PAGES_PER_SITE`` listing pages for each of ``LISTING_SITES``: a site template, a
    heading, and 120-400 entries, each the site's repeated phrase around words of its own (drawn
    from the corpus' vocabulary, never reused on another page)."""
    vocab = sorted({w for p in bases for w in gt.words(p.text) if w.isalpha() and 4 <= len(w) <= 12})
    rng.shuffle(vocab)
    pos = 0
    out = []
    for host, template in LISTING_SITES:
        nav = "".join(f'<li><a href="/{w}/">{w.title()}</a></li>' for w in ("home", "browse", "new", "about", "help"))
        for k in range(LISTING_PAGES_PER_SITE):
            n = rng.randint(120, 400)
            if pos + 2 * n + 5 > len(vocab):
                return out
            a, b = vocab[pos : pos + n], vocab[pos + n : pos + 2 * n]
            few = vocab[pos + 2 * n : pos + 2 * n + 5]
            pos += 2 * n + 5
            items = []
            for x, y in zip(a, b):
                c = rng.choice(few)
                text = template.format(a=x, b=y, c=c, A=x.title(), B=y.title(), C=c.title())
                items.append(f'<li><a href="/item/{x}-{y}">{htmllib.escape(text)}</a></li>')
            letter = chr(ord("A") + k)
            content = (
                f"<!DOCTYPE html><html><head><title>{host}: {letter}</title></head><body>"
                f'<header><a class="logo" href="/">{host}</a><nav><ul>{nav}</ul></nav></header>'
                f"<main><h1>Index: {letter}</h1><p>Page {k + 1} of {LISTING_PAGES_PER_SITE}, {n} entries.</p>"
                f'<ul class="listing">{"".join(items)}</ul></main>'
                f"<footer><p>Copyright {host}. Terms of use. Privacy policy. Contact us.</p></footer></body></html>"
            )
            out.append(
                Page(
                    id=f"listing/{host}/{letter}",
                    url=f"https://{host}/index/{letter}",
                    content=content,
                    source=f"synthetic:{host}",
                    variant_kind=LISTING_KIND,
                )
            )
    return out


def order_pages(bases: list[Page], variants: list[Page], rng: random.Random) -> list[Page]:
    """Shuffle the bases; put each variant after its base (mostly soon after,
    sometimes much later) except with probability P_VARIANT_FIRST before it."""
    perm = list(range(len(bases)))
    rng.shuffle(perm)
    pos = {bases[b].id: float(r) for r, b in enumerate(perm)}
    nb = float(len(bases))
    keyed = [(pos[bases[b].id], 0, r, bases[b]) for r, b in enumerate(perm)]
    for k, v in enumerate(variants):
        p = pos[v.variant_of]
        u = rng.random()
        if u < P_VARIANT_FIRST:
            key = rng.uniform(0, p)
        elif u < 0.6:
            key = rng.uniform(p, min(nb, p + 300))
        else:
            key = rng.uniform(p, nb)
        keyed.append((key, 1, k, v))
    keyed.sort(key=lambda t: (t[0], t[1], t[2]))
    return [t[3] for t in keyed]


# --------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------


def build(out: Path, seed: int = 1, max_pages: int | None = None, processes: int | None = None) -> dict:
    t0 = time.time()
    processes = processes or os.cpu_count() or 1
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict = {
        "corpus_version": CORPUS_VERSION,
        "seed": seed,
        "max_pages": max_pages,
        "sources": [],
        "parameters": {
            "P_KEEP_UNCHANGED": P_KEEP_UNCHANGED,
            "P_KEEP_EXACT": P_KEEP_EXACT,
            "MIN_WORDS": MIN_WORDS,
            "MAX_HTML_BYTES": MAX_HTML_BYTES,
            "VARIANT_BASE_FRACTION": VARIANT_BASE_FRACTION,
            "P_VARIANT_FIRST": P_VARIANT_FIRST,
        },
    }

    # 1. natural pages -----------------------------------------------------
    cands: list[Page] = []
    for src in DEB_SOURCES:
        pages = deb_pages(src, out, random.Random(f"{seed}:{src.key}"), manifest)
        log(f"{src.package}: {len(pages)} candidate pages")
        cands.extend(pages)
    for fam in PYPI_FAMILIES:
        cands.extend(family_pages(fam, out, random.Random(f"{seed}:{fam.key}"), manifest))
    log(f"{len(cands)} candidate pages; extracting visible text ({processes} processes)")
    digests = annotate(cands, processes)

    # 2. filter: too short, exact duplicates (mostly) -----------------------
    bases: list[Page] = []
    seen: set[str] = set()
    dropped = Counter()
    for p, dg in zip(cands, digests):
        if p.nwords < MIN_WORDS:
            dropped["too_short"] += 1
            continue
        if dg in seen and rng.random() >= P_KEEP_EXACT:
            dropped["exact_duplicate"] += 1
            continue
        seen.add(dg)
        bases.append(p)
    log(f"{len(bases)} base pages after filtering ({dict(dropped)})")

    # 3. cap ------------------------------------------------------------------
    # listing pages are few and the point of their kind: all are kept, none gets variants
    listings = [b for b in bases if b.variant_kind == LISTING_KIND]
    bases = [b for b in bases if b.variant_kind != LISTING_KIND]
    expected_variants_per_base = VARIANT_BASE_FRACTION * 1.5
    if max_pages and len(bases) * (1 + expected_variants_per_base) > max_pages:
        keep = int(max_pages / (1 + expected_variants_per_base))
        idx = sorted(rng.sample(range(len(bases)), keep))
        bases = [bases[i] for i in idx]
        log(f"capped to {len(bases)} base pages (--max-pages {max_pages})")

    # 4. synthetic variants -------------------------------------------------
    variants, failures = make_variants(bases, rng, VARIANT_BASE_FRACTION)
    synthetic = synthetic_listings(bases, random.Random(f"{seed}:listing"))
    annotate(synthetic, processes)
    listings += synthetic
    log(f"{len(listings)} listing pages ({len(synthetic)} synthetic)")
    bases = bases + listings
    if failures:
        log(f"variant failures: {dict(failures)}")
    changed = [b for b in bases if b.meta.get("instrumented")]
    annotate(changed + variants, processes)
    log(f"{len(variants)} synthetic variants")

    # 5. order + write --------------------------------------------------------
    pages = order_pages(bases, variants, rng)
    if max_pages and len(pages) > max_pages:  # final hard cap, keeping bases of kept variants and listings
        drop: set[int] = set()
        for p in reversed(pages):
            if len(drop) == len(pages) - max_pages:
                break
            if p.variant_kind != LISTING_KIND:
                drop.add(id(p))
        pages = [p for p in pages if id(p) not in drop]
    ids = [p.id for p in pages]
    assert len(set(ids)) == len(ids), "duplicate ids"
    with (
        open(out / "corpus.jsonl", "w", encoding="utf-8") as fh,
        open(out / "corpus-text.jsonl", "w", encoding="utf-8") as ft,
    ):
        for p in pages:
            fh.write(json.dumps(p.record(), ensure_ascii=False) + "\n")
            ft.write(json.dumps(p.text_record(), ensure_ascii=False) + "\n")

    by_source = Counter(p.source for p in pages)
    by_kind = Counter(p.variant_kind or "natural" for p in pages)
    where = {i: k for k, i in enumerate(ids)}
    first = sum(1 for k, p in enumerate(pages) if p.variant_of and where.get(p.variant_of, -1) > k)
    manifest.update(
        {
            "counts": {
                "pages": len(pages),
                "base_pages": sum(1 for p in pages if not p.variant_of),
                "variants": sum(1 for p in pages if p.variant_of),
                "by_kind": dict(sorted(by_kind.items())),
                "by_source": dict(sorted(by_source.items())),
                "variants_before_base": first,
                "dropped": dict(dropped),
                "variant_failures": dict(failures),
            },
            "files": {
                name: {"sha256": gt.file_sha256(out / name), "bytes": (out / name).stat().st_size}
                for name in ("corpus.jsonl", "corpus-text.jsonl")
            },
            "build_seconds": round(time.time() - t0, 1),
            "markup_transforms": {
                p.id: p.meta["markup_transforms"] for p in pages if "markup_transforms" in p.meta and p.variant_of
            },
        }
    )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=BENCH_DIR / "data")
    ap.add_argument("--max-pages", type=int, default=None, help="cap on total pages (bases subsampled)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--processes", type=int, default=None)
    args = ap.parse_args(argv)
    m = build(args.out, seed=args.seed, max_pages=args.max_pages, processes=args.processes)
    c = m["counts"]
    print(
        f"wrote {c['pages']} pages ({c['base_pages']} base, {c['variants']} synthetic variants, "
        f"{c['variants_before_base']} variants before their base) to {args.out} in {m['build_seconds']}s"
    )
    print("by kind:  " + ", ".join(f"{k}={v}" for k, v in c["by_kind"].items()))
    print("by source:")
    for k, v in c["by_source"].items():
        print(f"  {k:40s} {v:6d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
