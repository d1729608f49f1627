"""Exact ground truth for the near-duplicate quality benchmark.

Ground truth is the exact Jaccard similarity of the sets of word 3-shingles of
the *visible text* of two pages.

Visible text is defined here, independently of the product's extractor (which
is what is under test), with the stdlib ``html.parser``:

* everything a browser renders: all character data except the content of
  ``<script>``, ``<style>``, ``<noscript>``, ``<template>`` and ``<head>``
  (so ``<title>`` does not count) and comments;
* character references / entities decoded;
* block-level elements (``p``, ``div``, ``li``, ``td``, ``br`` ...) separate
  text, inline elements (``a``, ``span``, ``code``, ``em`` ...) do not — so
  ``foo<b>bar</b>`` is the single word ``foobar``, as a browser shows it;
* NFKC normalised, lowercased;
* words are the maximal runs of Unicode letters/digits (regex ``[^\\W_]+``);
* shingles are the runs of 3 consecutive words; a page with fewer than 3 (but
  at least one) words has one shingle made of all its words; a page with no
  words has no shingles and Jaccard 0 with everything.

For every page ``i`` (input order) we compute exactly the best Jaccard with
any EARLIER page ``j < i`` and which ``j`` it is (ties: the earliest ``j``),
with a sparse doc x shingle matrix and chunked ``X @ X.T`` intersection
counts; ``|A u B| = |A| + |B| - |A n B|``.

Usage::

    python bench/groundtruth.py [--corpus bench/data/corpus.jsonl] [--force]
    python bench/groundtruth.py --pair ID_A ID_B

Results are cached in ``bench/data/groundtruth.npz`` (+ ``groundtruth.json``
for the ids and the corpus hash); the shingle matrix itself is cached in
``bench/data/groundtruth-shingles.npz`` so that ``jaccard(a, b)`` for any
pair is a cheap lookup.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import re
import sys
import time
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import xxhash

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_DATA = BENCH_DIR / "data"
DEFAULT_CORPUS = DEFAULT_DATA / "corpus.jsonl"
SHINGLE_K = 3
THRESHOLD = 0.8
CACHE_VERSION = 1

# --------------------------------------------------------------------------
# Visible text (independent of the product's extractor)
# --------------------------------------------------------------------------

#: Elements whose content is never rendered.
SKIP_TAGS = frozenset({"script", "style", "noscript", "template", "head"})

#: Elements that start/end a block (or a line / cell): text on either side
#: of them is rendered separately.  Everything else is treated as inline.
BLOCK_TAGS = frozenset(
    """address article aside blockquote body br caption center col colgroup
    dd details dialog dir div dl dt fieldset figcaption figure footer form
    frame frameset h1 h2 h3 h4 h5 h6 header hgroup hr html iframe img input
    legend li link main menu meta nav object ol optgroup option p pre
    section select summary table tbody td textarea tfoot th thead title tr
    ul video audio canvas button label""".split()
)

_WORD_RE = re.compile(r"[^\W_]+")
_WS_RE = re.compile(r"[ \t\r\f\v\u00a0]+")


class _VisibleTextParser(HTMLParser):
    """Collects rendered character data, with block boundaries as newlines."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = {t: 0 for t in SKIP_TAGS}
        self.skipping = 0

    def _recount(self) -> None:
        self.skipping = sum(self.skip.values())

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "body":
            # </head> is optional in HTML: <body> always ends the head.
            self.skip["head"] = 0
            self._recount()
        if tag in SKIP_TAGS:
            self.skip[tag] += 1
            self._recount()
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_startendtag(self, tag: str, attrs) -> None:
        # <br/>, <img/> ... never open a skipped region.
        if tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIP_TAGS:
            if self.skip[tag] > 0:
                self.skip[tag] -= 1
                self._recount()
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)

    # comments, declarations, processing instructions: ignored (default).


def visible_text(html: str) -> str:
    """Rendered text of an HTML document: blocks on separate lines, runs of
    horizontal whitespace collapsed, original case (not yet normalised)."""
    parser = _VisibleTextParser()
    parser.feed(html)
    parser.close()
    raw = "".join(parser.parts)
    lines = (_WS_RE.sub(" ", ln).strip() for ln in raw.split("\n"))
    return "\n".join(ln for ln in lines if ln)


# --------------------------------------------------------------------------
# Main content (a second truth, for the pairs the product is meant to join)
# --------------------------------------------------------------------------

#: ARIA landmark roles that are not a page's main content (WAI-ARIA 1.2, landmark roles).
LANDMARK_ROLES_OUTSIDE_MAIN = frozenset({"banner", "navigation", "complementary", "contentinfo", "search"})
#: Elements whose implicit role is such a landmark (HTML-AAM): ``nav`` and ``aside`` always,
#: ``header`` / ``footer`` only when not scoped to a sectioning element.
_ALWAYS_OUTSIDE = frozenset({"nav", "aside"})
_SCOPED = frozenset({"header", "footer"})
_SECTIONING = frozenset({"article", "aside", "main", "nav", "section"})
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())


class _MainTextParser(_VisibleTextParser):
    """Visible text split by ARIA landmarks, from the markup's declared structure only.

    A crawler's copies of one document often differ only in their site chrome: the
    navigation, the sidebars, the banner and the footer.  The *main content* of a page is
    defined here the way assistive technology finds it, by the landmarks of WAI-ARIA and
    HTML-AAM, with no guess from class names or text density (which is what a product
    extractor does, so this stays independent of it):

    * if the page has a main landmark (``<main>`` or ``role="main"``), its text, minus the
      landmarks nested in it that are not main content;
    * else the whole visible text minus those landmarks (``nav``, ``aside``, an unscoped
      ``header`` / ``footer``, ``role`` banner / navigation / complementary / contentinfo /
      search).

    Open elements are kept on a stack; an end tag closes up to its nearest open match, and a
    stray end tag is ignored (how lenient HTML parsers recover).
    """

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, opens main, opens a non-main landmark)
        self.in_main = 0
        self.outside = 0
        self.seen_main = False
        self.main_parts: list[str] = []
        self.rest_parts: list[str] = []

    def _push(self, tag: str, attrs) -> None:
        role = (dict(attrs).get("role") or "").strip().lower()
        roles = set(role.split())
        opens_main = tag == "main" or "main" in roles
        scoped = any(t in _SECTIONING for t, _, _ in self.stack)
        opens_out = not opens_main and (
            tag in _ALWAYS_OUTSIDE or (tag in _SCOPED and not scoped) or bool(roles & LANDMARK_ROLES_OUTSIDE_MAIN)
        )
        self.seen_main |= opens_main
        self.in_main += opens_main
        self.outside += opens_out
        self.stack.append((tag, opens_main, opens_out))

    def _pop_to(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for _, m, o in self.stack[i:]:
                    self.in_main -= m
                    self.outside -= o
                del self.stack[i:]
                return

    def handle_starttag(self, tag: str, attrs) -> None:
        n = len(self.parts)
        super().handle_starttag(tag, attrs)
        if tag not in _VOID and tag not in SKIP_TAGS:
            self._push(tag, attrs)
        self._route(n)

    def handle_startendtag(self, tag: str, attrs) -> None:
        n = len(self.parts)
        super().handle_startendtag(tag, attrs)
        self._route(n)

    def handle_endtag(self, tag: str) -> None:
        n = len(self.parts)
        super().handle_endtag(tag)
        self._route(n)
        if tag not in _VOID and tag not in SKIP_TAGS:
            self._pop_to(tag)

    def handle_data(self, data: str) -> None:
        n = len(self.parts)
        super().handle_data(data)
        self._route(n)

    def _route(self, n: int) -> None:
        """Files what the visible-text parser just appended under the current landmarks."""
        new = self.parts[n:]
        if not new or self.outside:
            if new and self.in_main:
                self.main_parts.append("\n")  # a landmark inside main still ends a block
            return
        if self.in_main:
            self.main_parts.extend(new)
        self.rest_parts.extend(new)


def _lines(raw: str) -> str:
    lines = (_WS_RE.sub(" ", ln).strip() for ln in raw.split("\n"))
    return "\n".join(ln for ln in lines if ln)


def main_text(html: str) -> str:
    """The main content's visible text (see :class:`_MainTextParser`), lines as in
    :func:`visible_text`."""
    parser = _MainTextParser()
    parser.feed(html)
    parser.close()
    return _lines("".join(parser.main_parts if parser.seen_main else parser.rest_parts))


def page_main_words(content: str, content_type: str = "text/html") -> list[str]:
    """Words of a page's main content; plain text has no landmarks, so all of it."""
    if content_type.split(";")[0].strip().lower() in ("text/plain",):
        return words(content)
    return words(main_text(content))


def normalize(text: str) -> str:
    """NFKC then lowercase."""
    return unicodedata.normalize("NFKC", text).lower()


def words(text: str) -> list[str]:
    """Words of already-extracted text: NFKC, lowercase, ``[^\\W_]+`` runs."""
    return _WORD_RE.findall(normalize(text))


def page_words(content: str, content_type: str = "text/html") -> list[str]:
    """Words of a page given its raw content and content type."""
    if content_type.split(";")[0].strip().lower() in ("text/plain",):
        return words(content)
    return words(visible_text(content))


def shingles(ws: Sequence[str], k: int = SHINGLE_K) -> list[str]:
    """Word k-shingles (as space-joined strings; words never contain spaces)."""
    if not ws:
        return []
    if len(ws) < k:
        return [" ".join(ws)]
    return [" ".join(ws[i : i + k]) for i in range(len(ws) - k + 1)]


def shingle_hashes(ws: Sequence[str], k: int = SHINGLE_K) -> np.ndarray:
    """Sorted unique 64-bit xxh3 hashes of the k-shingles of ``ws``."""
    h = xxhash.xxh3_64_intdigest
    arr = np.fromiter((h(s.encode("utf-8")) for s in shingles(ws, k)), dtype=np.uint64)
    return np.unique(arr)


def jaccard_sets(a: Iterable, b: Iterable) -> float:
    """Plain-Python Jaccard of two collections (reference implementation)."""
    sa, sb = set(a), set(b)
    if not sa and not sb:
        return 0.0
    return len(sa & sb) / len(sa | sb)


def jaccard_text(a: str, b: str, a_type: str = "text/html", b_type: str = "text/html") -> float:
    """Exact Jaccard of two raw pages (no cache involved)."""
    return jaccard_sets(shingles(page_words(a, a_type)), shingles(page_words(b, b_type)))


def jaccard_main(a: str, b: str, a_type: str = "text/html", b_type: str = "text/html") -> float:
    """Exact Jaccard of two raw pages' main content (:func:`main_text`)."""
    return jaccard_sets(shingles(page_main_words(a, a_type)), shingles(page_main_words(b, b_type)))


# --------------------------------------------------------------------------
# Corpus reading
# --------------------------------------------------------------------------


def iter_records(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _hash_line(line: str) -> tuple[str, np.ndarray]:
    rec = json.loads(line)
    ws = page_words(rec["content"], rec.get("content_type") or "text/html")
    return rec["id"], shingle_hashes(ws)


def _iter_lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield line


def hash_corpus(path: Path, processes: int | None = None, progress: bool = True) -> tuple[list[str], list[np.ndarray]]:
    """Shingle-hash every page of a JSON-lines corpus (in input order)."""
    processes = processes or os.cpu_count() or 1
    ids: list[str] = []
    hashes: list[np.ndarray] = []
    t0 = time.time()
    if processes > 1:
        with mp.get_context("fork").Pool(processes) as pool:
            it = pool.imap(_hash_line, _iter_lines(path), chunksize=16)
            for n, (i, hs) in enumerate(it, 1):
                ids.append(i)
                hashes.append(hs)
                if progress and n % 2000 == 0:
                    print(f"  shingled {n} pages ({time.time() - t0:.1f}s)", file=sys.stderr)
    else:
        for n, line in enumerate(_iter_lines(path), 1):
            i, hs = _hash_line(line)
            ids.append(i)
            hashes.append(hs)
            if progress and n % 2000 == 0:
                print(f"  shingled {n} pages ({time.time() - t0:.1f}s)", file=sys.stderr)
    return ids, hashes


def build_matrix(hashes: list[np.ndarray]) -> sp.csr_matrix:
    """Binary CSR doc x shingle matrix; shingle hashes factorised by np.unique."""
    lengths = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
    indptr = np.zeros(len(hashes) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    allh = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    _, cols = np.unique(allh, return_inverse=True)
    ncols = int(cols.max()) + 1 if len(cols) else 0
    data = np.ones(len(cols), dtype=np.int32)
    indptr = indptr.astype(np.int64)
    cols = cols.astype(np.int32 if ncols < 2**31 else np.int64)
    X = sp.csr_matrix((data, cols, indptr), shape=(len(hashes), ncols))
    X.sort_indices()
    return X


# --------------------------------------------------------------------------
# Best earlier match, exactly
# --------------------------------------------------------------------------


def best_earlier(X: sp.csr_matrix, chunk: int = 512, threshold: float = THRESHOLD, progress: bool = True):
    """For each row i: max_j<i J(i, j), its argmax (earliest on ties; -1 if
    none shares a shingle), and the number of j < i with J >= threshold."""
    n = X.shape[0]
    sizes = np.diff(X.indptr).astype(np.float64)
    best_j = np.zeros(n, dtype=np.float64)
    best_idx = np.full(n, -1, dtype=np.int64)
    n_ge = np.zeros(n, dtype=np.int64)
    XT = X.T.tocsc()  # columns = docs; slicing columns of a CSC is cheap
    t0 = time.time()
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        inter = (X[a:b] @ XT[:, :b]).tocoo()
        rows = inter.row.astype(np.int64) + a
        cols = inter.col.astype(np.int64)
        keep = cols < rows
        rows, cols, vals = rows[keep], cols[keep], inter.data[keep].astype(np.float64)
        if len(vals):
            union = sizes[rows] + sizes[cols] - vals
            J = np.divide(vals, union, out=np.zeros_like(vals), where=union > 0)
            # per row: max J, earliest col on ties -> sort by (row, -J, col)
            order = np.lexsort((cols, -J, rows))
            rows_s, cols_s, J_s = rows[order], cols[order], J[order]
            first = np.ones(len(rows_s), dtype=bool)
            first[1:] = rows_s[1:] != rows_s[:-1]
            best_j[rows_s[first]] = J_s[first]
            best_idx[rows_s[first]] = cols_s[first]
            ge = J >= threshold
            np.add.at(n_ge, rows[ge], 1)
        if progress and (a // chunk) % 4 == 0:
            print(f"  products: rows {b}/{n} ({time.time() - t0:.1f}s)", file=sys.stderr)
    return best_j, best_idx, n_ge


# --------------------------------------------------------------------------
# Cached ground truth object
# --------------------------------------------------------------------------


@dataclass
class GroundTruth:
    ids: list[str]
    best_j: np.ndarray
    best_idx: np.ndarray
    n_earlier_ge: np.ndarray
    X: sp.csr_matrix
    corpus_sha256: str = ""
    threshold: float = THRESHOLD
    id_to_idx: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id_to_idx:
            self.id_to_idx = {i: n for n, i in enumerate(self.ids)}
        self.sizes = np.diff(self.X.indptr)

    def __len__(self) -> int:
        return len(self.ids)

    def best_match_id(self, i: int) -> str | None:
        j = int(self.best_idx[i])
        return self.ids[j] if j >= 0 else None

    def jaccard_idx(self, a: int, b: int) -> float:
        ia = self.X.indices[self.X.indptr[a] : self.X.indptr[a + 1]]
        ib = self.X.indices[self.X.indptr[b] : self.X.indptr[b + 1]]
        inter = len(np.intersect1d(ia, ib, assume_unique=True))
        union = len(ia) + len(ib) - inter
        return inter / union if union else 0.0

    def jaccard(self, id_a: str, id_b: str) -> float:
        """Exact Jaccard of the visible-text 3-shingle sets of two pages."""
        return self.jaccard_idx(self.id_to_idx[id_a], self.id_to_idx[id_b])

    def jaccard_many(self, a: Sequence[int], b: Sequence[int]) -> np.ndarray:
        """Vectorised exact Jaccard for index pairs (a[k], b[k])."""
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        if len(a) == 0:
            return np.zeros(0)
        inter = np.asarray(self.X[a].multiply(self.X[b]).sum(axis=1)).ravel().astype(np.float64)
        union = self.sizes[a] + self.sizes[b] - inter
        return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)

    def has_near_dup(self, threshold: float | None = None) -> np.ndarray:
        t = self.threshold if threshold is None else threshold
        return self.best_j >= t


def _cache_paths(cache_dir: Path) -> tuple[Path, Path, Path]:
    return (cache_dir / "groundtruth.npz", cache_dir / "groundtruth.json", cache_dir / "groundtruth-shingles.npz")


def compute(corpus: Path, processes: int | None = None, progress: bool = True) -> GroundTruth:
    t0 = time.time()
    digest = file_sha256(corpus)
    ids, hashes = hash_corpus(corpus, processes=processes, progress=progress)
    t1 = time.time()
    X = build_matrix(hashes)
    del hashes
    t2 = time.time()
    if progress:
        print(
            f"ground truth: {len(ids)} pages, {X.nnz} shingle occurrences, {X.shape[1]} distinct shingles; "
            f"shingling {t1 - t0:.1f}s, matrix {t2 - t1:.1f}s",
            file=sys.stderr,
        )
    best_j, best_idx, n_ge = best_earlier(X, progress=progress)
    if progress:
        print(f"ground truth: products {time.time() - t2:.1f}s, total {time.time() - t0:.1f}s", file=sys.stderr)
    return GroundTruth(ids, best_j, best_idx, n_ge, X, corpus_sha256=digest)


def save(gt: GroundTruth, cache_dir: Path, corpus: Path) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    p_npz, p_json, p_x = _cache_paths(cache_dir)
    np.savez_compressed(p_npz, best_j=gt.best_j, best_idx=gt.best_idx, n_earlier_ge=gt.n_earlier_ge)
    sp.save_npz(p_x, gt.X, compressed=False)
    meta = {
        "version": CACHE_VERSION,
        "corpus": str(corpus),
        "corpus_sha256": gt.corpus_sha256,
        "shingle_k": SHINGLE_K,
        "threshold": gt.threshold,
        "n_pages": len(gt.ids),
        "ids": gt.ids,
    }
    p_json.write_text(json.dumps(meta), encoding="utf-8")


def load(cache_dir: Path) -> GroundTruth:
    p_npz, p_json, p_x = _cache_paths(cache_dir)
    meta = json.loads(p_json.read_text(encoding="utf-8"))
    z = np.load(p_npz)
    X = sp.load_npz(p_x).tocsr()
    return GroundTruth(
        meta["ids"], z["best_j"], z["best_idx"], z["n_earlier_ge"], X, corpus_sha256=meta["corpus_sha256"]
    )


def load_or_compute(
    corpus: Path = DEFAULT_CORPUS, cache_dir: Path | None = None, force: bool = False, progress: bool = True
) -> GroundTruth:
    """Ground truth for ``corpus``, recomputed if the cache is for another file."""
    corpus = Path(corpus)
    cache_dir = Path(cache_dir) if cache_dir else corpus.parent
    p_npz, p_json, p_x = _cache_paths(cache_dir)
    if not force and p_npz.exists() and p_json.exists() and p_x.exists():
        meta = json.loads(p_json.read_text(encoding="utf-8"))
        if meta.get("version") == CACHE_VERSION and meta.get("corpus_sha256") == file_sha256(corpus):
            return load(cache_dir)
        if progress:
            print("ground truth: cache is stale, recomputing", file=sys.stderr)
    gt = compute(corpus, progress=progress)
    save(gt, cache_dir, corpus)
    return gt


_DEFAULT_GT: GroundTruth | None = None


def jaccard(id_a: str, id_b: str, gt: GroundTruth | None = None) -> float:
    """Exact Jaccard of two pages of the default corpus (cached ground truth)."""
    global _DEFAULT_GT
    if gt is None:
        if _DEFAULT_GT is None:
            _DEFAULT_GT = load_or_compute(DEFAULT_CORPUS, progress=False)
        gt = _DEFAULT_GT
    return gt.jaccard(id_a, id_b)


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

HIST_EDGES = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0]


def histogram(best_j: np.ndarray) -> list[tuple[str, int]]:
    """Counts of best-earlier-J per bin; the last bin is exactly 1.0."""
    out = []
    for lo, hi in zip(HIST_EDGES[:-1], HIST_EDGES[1:]):
        if hi < 1.0:
            n = int(((best_j >= lo) & (best_j < hi)).sum())
        else:
            n = int(((best_j >= lo) & (best_j < 1.0)).sum())
        out.append((f"[{lo:.2f},{hi:.2f})", n))
    out.append(("=1.00", int((best_j >= 1.0).sum())))
    return out


def summary(gt: GroundTruth) -> dict:
    return {
        "n_pages": len(gt),
        "n_empty": int((gt.sizes == 0).sum()),
        "n_with_earlier_ge_0.8": int((gt.best_j >= THRESHOLD).sum()),
        "n_exact_earlier": int((gt.best_j >= 1.0).sum()),
        "best_j_histogram": histogram(gt.best_j),
    }


def print_summary(gt: GroundTruth) -> None:
    s = summary(gt)
    print(f"pages: {s['n_pages']}  (empty: {s['n_empty']})")
    print(
        f"pages with an earlier page at J >= {THRESHOLD}: {s['n_with_earlier_ge_0.8']} "
        f"({s['n_with_earlier_ge_0.8'] / max(1, s['n_pages']):.1%}); exact (J = 1): {s['n_exact_earlier']}"
    )
    print("best Jaccard with any earlier page:")
    for label, n in s["best_j_histogram"]:
        print(f"  {label:>13} {n:6d}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: the corpus' directory")
    ap.add_argument("--force", action="store_true", help="recompute even if the cache is fresh")
    ap.add_argument("--pair", nargs=2, metavar=("ID_A", "ID_B"), help="print the Jaccard of two pages")
    args = ap.parse_args(argv)
    t0 = time.time()
    gt = load_or_compute(args.corpus, args.cache_dir, force=args.force)
    print(f"ground truth ready in {time.time() - t0:.1f}s", file=sys.stderr)
    if args.pair:
        print(f"J({args.pair[0]}, {args.pair[1]}) = {gt.jaccard(*args.pair):.4f}")
        return 0
    print_summary(gt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
