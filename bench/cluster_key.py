"""P(equal cluster key) against exact Jaccard on the benchmark corpus, and the key's cost.

For every pair of pages of the corpus whose exact Jaccard (word 3-shingles of the ground-truth
visible text, ``groundtruth.py``) is at least ``--min-j``, plus ``--random-pairs`` random pairs
(almost all near J = 0), the bottom-n cluster key (``streamdedup.fingerprinting.cluster``) of
both pages is computed for n = 1, 2, 4, 8, and the fraction of pairs with equal keys is
reported per J bin beside the mean of ``J**n`` over the same pairs (the key's design value;
the exact value for random sets is ``C(|A∩B|, n) / C(|A∪B|, n)``, a little lower).

Two inputs, each page keyed from:

* ``text``: the ground-truth visible text (``corpus-text.jsonl``): the key sees the shingles
  the Jaccard is measured on, so this checks the relation P(equal) ~ J**n itself;
* ``html``: the raw HTML (``corpus.jsonl``) through the product's extractor, as the worker
  keys a page.  The extractor drops navigation and other boilerplate that the ground truth
  counts, so pairs look more alike (or less) to the key than their J says.

Cost: the simhash (``Fingerprints(texts)``: word hashes, bigram shingles, simhash) and the key
(``Fingerprints.cluster_keys``: trigram shingles from the same word hashes, the bottom-n
selection) of the same visible texts, in the same run, the median of ``--runs`` runs; the
compiled path (numba) and the numpy path.

Usage::

    python bench/cluster_key.py            # tables + docs/cluster_key.png + bench/out/cluster_key.json
    python bench/cluster_key.py --no-plot --runs 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import groundtruth as gtm

from streamdedup.engine.records import Page, page_text
from streamdedup.errors import RecordError
from streamdedup.fingerprinting import kernels
from streamdedup.fingerprinting.cluster import CLUSTER_WORDS, cluster_keys_flat, key_list
from streamdedup.fingerprinting.features import mix64, shingle_hashes_many, word_hashes_many
from streamdedup.fingerprinting.pages import Fingerprints

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DATA = BENCH_DIR / "data"
OUT = BENCH_DIR / "out"
NS = (1, 2, 4, 8)
EDGES = [0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0]  # the last bin: J == 1 exactly


def texts_of(path: Path, ids: list[str]) -> list[str | None]:
    """Visible text of every page, by the product's extractor, in ground-truth order (None: no text)."""
    by_id: dict[str, str | None] = {}
    for rec in gtm.iter_records(path):
        try:
            by_id[rec["id"]] = page_text(Page(rec["id"], rec["url"], rec["content"], rec.get("content_type")))
        except RecordError:
            by_id[rec["id"]] = None
    return [by_id.get(i) for i in ids]


def pairs_above(
    gt: gtm.GroundTruth, min_j: float, chunk: int = 256
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every pair (a < b) with exact Jaccard >= min_j: (a, b, inter, union)."""
    X = gt.X.astype(np.int32)
    sizes = gt.sizes
    XT = X.T.tocsc()
    out_a, out_b, out_i = [], [], []
    for s in range(0, X.shape[0], chunk):
        prod = (X[s : s + chunk] @ XT).tocoo()
        a, b, inter = prod.row + s, prod.col, prod.data.astype(np.int64)
        keep = a < b
        a, b, inter = a[keep], b[keep], inter[keep]
        union = sizes[a] + sizes[b] - inter
        keep = inter >= min_j * union
        out_a.append(a[keep])
        out_b.append(b[keep])
        out_i.append(inter[keep])
    a, b, inter = (np.concatenate(x) for x in (out_a, out_b, out_i))
    return a, b, inter, sizes[a] + sizes[b] - inter


def keys_for(
    texts: list[str | None], n: int, remix: int | None = None, shingles: tuple | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """uint64 keys and a has-key mask for every page (pages without text have none).

    ``remix``: the key of another hash function, ``mix64(shingle ^ remix)`` in place of the
    shingle hash (the same selection code), to see how much one hash function's draw moves
    the measurement (the corpus' pairs are not independent: pages of one site share template
    text, so one draw decides many pairs); ``shingles``: :func:`trigrams` of the texts, computed once for those."""
    present = [i for i, t in enumerate(texts) if t is not None]
    if remix is None:
        keys = Fingerprints([texts[i] for i in present]).cluster_keys(n)  # the production path
    else:
        flat, counts = shingles if shingles is not None else trigrams(texts)
        keys = key_list(*cluster_keys_flat(mix64(flat ^ np.uint64(remix)), counts, n))
    out = np.zeros(len(texts), dtype=np.uint64)
    has = np.zeros(len(texts), dtype=bool)
    for i, k in zip(present, keys):
        if k is not None:
            out[i], has[i] = k, True
    return out, has


def trigrams(texts: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
    """The key's shingle hashes of the texts that are not None, and their counts."""
    return shingle_hashes_many(*word_hashes_many([t for t in texts if t is not None]), CLUSTER_WORDS)


def measure(
    gt: gtm.GroundTruth, texts: list[str | None], min_j: float, random_pairs: int, seed: int, others: int
) -> dict:
    a, b, inter, union = pairs_above(gt, min_j)
    rng = np.random.default_rng(seed)
    ra = rng.integers(0, len(texts), size=random_pairs)
    rb = rng.integers(0, len(texts), size=random_pairs)
    keep = ra != rb
    ra, rb = np.minimum(ra, rb)[keep], np.maximum(ra, rb)[keep]
    r_inter = np.asarray(gt.X[ra].multiply(gt.X[rb]).sum(axis=1)).ravel().astype(np.int64)
    r_union = gt.sizes[ra] + gt.sizes[rb] - r_inter
    j_pairs = np.divide(inter, union, out=np.zeros(len(a)), where=union > 0)
    j_random = np.divide(r_inter, r_union, out=np.zeros(len(ra)), where=r_union > 0)
    keys = {n: keys_for(texts, n) for n in NS}
    remixes = [int(x) for x in rng.integers(1, 2**63, size=others)]
    shingles = trigrams(texts)
    other_keys = {n: [keys_for(texts, n, r, shingles) for r in remixes] for n in NS}
    rows = []
    bins = [(lo, hi) for lo, hi in zip(EDGES[:-1], EDGES[1:]) if hi > min_j] + [(1.0, 1.0)]
    for lo, hi in bins:
        sel = (j_pairs == 1.0) if lo == hi else (j_pairs >= lo) & (j_pairs < hi)
        pa, pb, pj = a[sel], b[sel], j_pairs[sel]
        row = {"bin": "1.0" if lo == hi else f"{lo:.2f}-{hi:.2f}", "pairs": int(sel.sum()), "mean_j": float(pj.mean())}
        for n in NS:
            k, has = keys[n]
            ok = has[pa] & has[pb]
            row[f"p_equal_{n}"] = float(np.mean((k[pa] == k[pb]) & ok)) if len(pa) else float("nan")
            row[f"j_pow_{n}"] = float(np.mean(pj**n)) if len(pa) else float("nan")
            other = [float(np.mean((k[pa] == k[pb]) & h[pa] & h[pb])) if len(pa) else 0.0 for k, h in other_keys[n]]
            row[f"other_{n}"] = other
        rows.append(row)
    rand = {"pairs": len(ra), "mean_j": float(j_random.mean())}
    for n in NS:
        k, has = keys[n]
        equal = (k[ra] == k[rb]) & has[ra] & has[rb]
        rand[f"p_equal_{n}"] = float(equal.mean())
        rand[f"equal_{n}"] = int(equal.sum())
        rand[f"equal_below_0.5_{n}"] = int((equal & (j_random < 0.5)).sum())
    return {"bins": rows, "random": rand, "pairs_above": int(len(a)), "min_j": min_j}


def timing(texts: list[str], runs: int) -> dict:
    """Median seconds of the simhash and of the key (n = 4) of the same texts, per path."""
    out = {}
    for path in ("compiled", "numpy"):
        simhash, key = [], []
        for _ in range(runs + 1):  # the first run warms caches (and numba's), not counted
            with kernels.numpy_only() if path == "numpy" else _nothing():
                t0 = time.perf_counter()
                f = Fingerprints(texts)
                t1 = time.perf_counter()
                f.cluster_keys(4)
                t2 = time.perf_counter()
            simhash.append(t1 - t0)
            key.append(t2 - t1)
        simhash, key = simhash[1:], key[1:]
        ratios = [k / s for k, s in zip(key, simhash)]
        out[path] = {
            "simhash_ms": 1e3 * statistics.median(simhash),
            "key_ms": 1e3 * statistics.median(key),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    return out


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    grid = np.linspace(0, 1, 101)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    titles = {"text": "keyed from the ground-truth text", "html": "keyed from the HTML (the worker's extractor)"}
    for ax, (name, result) in zip(axes, results.items()):
        rows = [r for r in result["bins"] if r["pairs"]]
        for c, n in zip(colors, NS):
            ax.plot(grid, grid**n, color=c, lw=1, ls="--")
            xs = [r["mean_j"] for r in rows]
            ax.plot(xs, [r[f"p_equal_{n}"] for r in rows], "o-", color=c, label=f"n = {n} (dashed: J^n)")
            if rows[0][f"other_{n}"]:
                mean = [float(np.mean(r[f"other_{n}"])) for r in rows]
                ax.plot(xs, mean, "x:", color=c, ms=5, lw=0.8)
        ax.set_xlabel("exact Jaccard of word 3-shingles (bin mean)")
        ax.set_xlim(0.25, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.set_title(f"{titles[name]}: {result['pairs_above']} pairs, J >= {result['min_j']}", fontsize=9)
    axes[0].set_ylabel("P(equal cluster key)")
    axes[0].legend(loc="upper left", fontsize=8, title="o: the key; x: mean of other hash functions", title_fontsize=7)
    fig.suptitle("bottom-n cluster key on the benchmark corpus", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def table(result: dict) -> str:
    head = "| J bin | pairs | " + " | ".join(f"n={n}: P(equal) (others: mean; min..max) / J^n" for n in NS) + " |"
    lines = [head, "|" + "---|" * (2 + len(NS))]

    def cell(r: dict, n: int) -> str:
        other = r[f"other_{n}"]
        spread = f" ({np.mean(other):.2f}; {min(other):.2f}..{max(other):.2f})" if other else ""
        return f"{r[f'p_equal_{n}']:.3f}{spread} / {r[f'j_pow_{n}']:.3f}"

    for r in result["bins"]:
        cells = " | ".join(cell(r, n) for n in NS) if r["pairs"] else ""
        lines.append(f"| {r['bin']} | {r['pairs']} | {cells} |")
    rnd = result["random"]
    cells = " | ".join(f"{rnd[f'p_equal_{n}']:.5f} ({rnd[f'equal_below_0.5_{n}']} below J 0.5)" for n in NS)
    lines.append(f"| random pairs (mean J {rnd['mean_j']:.4f}) | {rnd['pairs']} | {cells} |")
    return "\n".join(lines)


def costs(cost: dict, pages: int) -> str:
    lines = [f"| path ({pages} pages) | simhash | key, n = 4 | key / simhash: median (min..max) |", "|---|---|---|---|"]
    for path, c in cost.items():
        lines.append(
            f"| {path} | {c['simhash_ms']:.1f} ms | {c['key_ms']:.1f} ms | "
            f"{c['ratio']:.3f} ({c['ratio_min']:.3f}..{c['ratio_max']:.3f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="corpus.jsonl, corpus-text.jsonl and the ground truth")
    ap.add_argument("--min-j", type=float, default=0.3)
    ap.add_argument("--random-pairs", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--other-hashes", type=int, default=8, help="other hash functions measured for the spread")
    ap.add_argument("--timing-pages", type=int, default=2000)
    ap.add_argument("--plot", type=Path, default=REPO / "docs" / "cluster_key.png")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    gt = gtm.load_or_compute(args.data / "corpus.jsonl")
    results = {}
    for name, file in (("text", "corpus-text.jsonl"), ("html", "corpus.jsonl")):
        t0 = time.time()
        texts = texts_of(args.data / file, gt.ids)
        print(f"{name}: {sum(t is not None for t in texts)} texts in {time.time() - t0:.0f}s", file=sys.stderr)
        results[name] = measure(gt, texts, args.min_j, args.random_pairs, args.seed, args.other_hashes)
    sample = [t for t in texts if t is not None][: args.timing_pages]  # the worker's texts (html)
    cost = timing(sample, args.runs)
    summary = {**results, "cost": cost, "timing_pages": len(sample), "compiled": kernels.available()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cluster_key.json").write_text(json.dumps(summary, indent=1))
    for name, result in results.items():
        print(f"\n{name} input:\n\n" + table(result))
    print("\ncost of the key against the simhash of the same texts:\n\n" + costs(cost, len(sample)))
    if not args.no_plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
