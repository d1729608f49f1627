"""Precision / recall of ``streamdedup scan`` against the exact ground truth.

Per page, with J* = 0.8 (Jaccard of visible-text word 3-shingles, see
``groundtruth.py``):

* precision = #(near_duplicate verdicts whose named match has J >= J* with the
  page) / #(near_duplicate verdicts).  A named match that is not an EARLIER
  page of the input (or not a page at all) counts as wrong.
* recall = #(pages having an earlier page with J >= J* that are flagged
  near_duplicate) / #(pages having an earlier page with J >= J*).

Reported overall, per ``variant_kind`` (``natural`` for real pages, ``listing``
for listing and index pages), per best-J bin, for both inputs.  Every slice also
counts its *false matches* (flagged, but the named match is below J*) and the
pages flagged against a match below Jaccard 0.5 (``below_0.5``: a unique page
dropped for an unrelated one; goal 0).  Inputs: the raw HTML corpus (``corpus.jsonl``) and the
pre-extracted text (``corpus-text.jsonl``).  The scan is run through the CLI
(``.venv/bin/streamdedup scan INPUT --algorithm A --k K --output FILE``).

Usage::

    python bench/quality.py --algorithm simhash --k 3            # both inputs
    python bench/quality.py --algorithm minhash --k 3 --input bench/data/corpus-text.jsonl
    python bench/quality.py --algorithm simhash --sweep-k 0..8   # + bench/out/pr_vs_k.png
    python bench/quality.py --verdicts my-verdicts.jsonl --input bench/data/corpus.jsonl
    python bench/quality.py --self-check                         # validates the evaluator
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import groundtruth as gtm

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DATA = BENCH_DIR / "data"
OUT = BENCH_DIR / "out"
HTML_INPUT = DATA / "corpus.jsonl"
TEXT_INPUT = DATA / "corpus-text.jsonl"
THRESHOLD = 0.8
KINDS = ("natural", "listing", "advert", "counter", "timestamp", "navigation", "markup")
VARIANT_KINDS = KINDS[2:]  # the synthetic edits of a base page (listing pages have no base)
UNRELATED_J = 0.5  # a match below this is not a near-duplicate by any definition
J_BINS = [0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0, 1.01]


# --------------------------------------------------------------------------
# Inputs, ground truth, verdicts
# --------------------------------------------------------------------------


@dataclass
class Corpus:
    path: Path
    ids: list[str]
    kinds: list[str]
    sources: list[str]
    variant_of: list[str | None]
    content_type: str

    @property
    def label(self) -> str:
        return "text" if self.content_type.startswith("text/plain") else "html"


def load_corpus(path: Path) -> Corpus:
    ids, kinds, sources, vof, ctype = [], [], [], [], "text/html"
    for n, r in enumerate(gtm.iter_records(path)):
        ids.append(r["id"])
        kinds.append(r.get("variant_kind") or "natural")
        sources.append(r.get("source") or "")
        vof.append(r.get("variant_of"))
        if n == 0:
            ctype = r.get("content_type") or "text/html"
    return Corpus(path, ids, kinds, sources, vof, ctype)


def ground_truth_for(corpus: Corpus, progress: bool = True) -> gtm.GroundTruth:
    """The HTML corpus' ground truth serves every input with the same ids in
    the same order (corpus-text.jsonl holds exactly the visible text of
    corpus.jsonl, so its shingle sets are identical); otherwise the input
    gets its own cached ground truth."""
    if HTML_INPUT.exists():
        g = gtm.load_or_compute(HTML_INPUT, progress=progress)
        if g.ids == corpus.ids:
            return g
    cache = DATA / f"gt-{corpus.path.stem}"
    return gtm.load_or_compute(corpus.path, cache_dir=cache, progress=progress)


def find_cli() -> list[str] | None:
    """The scan command: the venv's console script; if that cannot start (e.g.
    a stale editable install), ``python -m streamdedup`` from the repo root."""
    cands: list[list[str]] = []
    script = REPO / ".venv" / "bin" / "streamdedup"
    if script.exists():
        cands.append([str(script)])
    elif shutil.which("streamdedup"):
        cands.append([shutil.which("streamdedup")])
    py = REPO / ".venv" / "bin" / "python"
    cands.append([str(py) if py.exists() else sys.executable, "-m", "streamdedup"])
    for n, cmd in enumerate(cands):
        r = subprocess.run(cmd + ["scan", "--help"], capture_output=True, text=True, cwd=REPO)
        if r.returncode == 0:
            if n:
                print(
                    f"warning: {' '.join(cands[0])} does not start "
                    f"({(r.stderr or '').strip().splitlines()[-1:] or ''}); using {' '.join(cmd)} from {REPO}",
                    file=sys.stderr,
                )
            return cmd
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] if (r.stderr or r.stdout) else []
        print(f"note: {' '.join(cmd)} scan --help failed: {last}", file=sys.stderr)
    return None


def run_scan(cli: list[str], inp: Path, algorithm: str, k: int, out: Path, extra: list[str] | None = None) -> float:
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = cli + ["scan", str(inp.resolve()), "--algorithm", algorithm, "--k", str(k), "--output", str(out.resolve())]
    cmd += extra or []
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    dt = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"scan failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return dt


def load_verdicts(path: Path) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append(json.loads(line))
    return out


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------


def main_jaccards(corpus: Corpus, pairs: list[tuple[str, str | None]]) -> dict[tuple[str, str | None], float | None]:
    """Exact main-content Jaccard (``groundtruth.jaccard_main``) of each (page, match) pair,
    reading the two pages from the input; ``None`` for a match that is no page of it."""
    want = {i for pair in pairs for i in pair if i is not None}
    pages: dict[str, tuple[str, str]] = {}
    if want:
        for r in gtm.iter_records(corpus.path):
            if r["id"] in want:
                pages[r["id"]] = (r.get("content") or "", r.get("content_type") or corpus.content_type)
    out: dict[tuple[str, str | None], float | None] = {}
    for a, b in pairs:
        if a in pages and b in pages:
            (ca, ta), (cb, tb) = pages[a], pages[b]
            out[(a, b)] = round(gtm.jaccard_main(ca, cb, ta, tb), 4)
        else:
            out[(a, b)] = None
    return out


def _ratio(a: int, b: int) -> float:
    return a / b if b else float("nan")


def evaluate(
    corpus: Corpus,
    g: gtm.GroundTruth,
    verdicts: list[dict],
    threshold: float = THRESHOLD,
    n_examples: int = 5,
    seed: int = 0,
) -> dict:
    n = len(corpus.ids)
    idx = g.id_to_idx
    problems: Counter = Counter()
    by_id = {}
    for pos, v in enumerate(verdicts):
        vid = v.get("id")
        if vid not in idx:
            problems["unknown_id"] += 1
            continue
        if vid in by_id:
            problems["duplicate_id"] += 1
        if pos < n and corpus.ids[pos] != vid:
            problems["out_of_order"] += 1
        by_id[vid] = v
    problems["missing"] = n - len(by_id)

    flagged = np.zeros(n, dtype=bool)
    match = np.full(n, -1, dtype=np.int64)
    dist = np.full(n, np.nan)
    for vid, v in by_id.items():
        i = idx[vid]
        verdict = v.get("verdict")
        if verdict not in ("unique", "near_duplicate"):
            problems["bad_verdict"] += 1
            continue
        if verdict == "near_duplicate":
            flagged[i] = True
            m = v.get("match_id")
            if m in idx:
                match[i] = idx[m]
            else:
                problems["unknown_match_id"] += 1
            d = v.get("distance")
            if isinstance(d, (int, float)):
                dist[i] = d
    valid_match = flagged & (match >= 0) & (match < np.arange(n))
    problems["match_not_earlier"] = int((flagged & (match >= np.arange(n))).sum())
    jm = np.full(n, np.nan)
    sel = np.flatnonzero(valid_match)
    jm[sel] = g.jaccard_many(sel, match[sel])
    correct = valid_match & (np.nan_to_num(jm, nan=-1) >= threshold)
    unrelated = flagged & (np.nan_to_num(jm, nan=-1) < UNRELATED_J)  # incl. a match that is no earlier page
    positive = g.best_j >= threshold
    kinds = np.array(corpus.kinds)

    def block(mask: np.ndarray) -> dict:
        f, c, p = flagged & mask, correct & mask, positive & mask
        tp_r = int((flagged & positive & mask).sum())
        prec, rec = _ratio(int(c.sum()), int(f.sum())), _ratio(tp_r, int(p.sum()))
        f1 = 2 * prec * rec / (prec + rec) if prec == prec and rec == rec and prec + rec > 0 else float("nan")
        return {
            "pages": int(mask.sum()),
            "positives": int(p.sum()),
            "flagged": int(f.sum()),
            "flagged_correct_match": int(c.sum()),
            "positives_flagged": tp_r,
            "positives_flagged_correct_match": int((c & p).sum()),
            "false_matches": int(f.sum() - c.sum()),
            "below_0.5": int((unrelated & mask).sum()),
            "precision": prec,
            "recall": rec,
            "f1": f1,
        }

    res = {
        "input": str(corpus.path),
        "input_kind": corpus.label,
        "threshold": threshold,
        "overall": block(np.ones(n, dtype=bool)),
        "by_kind": {k: block(kinds == k) for k in KINDS if (kinds == k).any()},
        "by_source": {},
        "by_best_j": {},
        "problems": {k: v for k, v in problems.items() if v},
    }
    srcs = np.array([s.split("==")[0] for s in corpus.sources])
    for s in sorted(set(srcs)):
        res["by_source"][s] = block(srcs == s)
    for lo, hi in zip(J_BINS[:-1], J_BINS[1:]):
        m = (g.best_j >= lo) & (g.best_j < hi)
        label = "=1.00" if lo == 1.0 else f"[{lo:.2f},{hi:.2f})"
        res["by_best_j"][label] = {
            "pages": int(m.sum()),
            "flagged": int((flagged & m).sum()),
            "flag_rate": _ratio(int((flagged & m).sum()), int(m.sum())),
        }

    # distance distributions (helps choosing k)
    def dstats(mask: np.ndarray) -> dict | None:
        d = dist[mask & ~np.isnan(dist)]
        if not len(d):
            return None
        return {"n": len(d), "min": float(d.min()), "median": float(np.median(d)), "max": float(d.max())}

    res["distance"] = {"true_positive": dstats(correct), "false_positive": dstats(flagged & ~correct)}

    # examples
    rng = random.Random(seed)
    fp = np.flatnonzero(flagged & ~correct)
    fn = np.flatnonzero(positive & ~flagged)

    def ex_fp(i: int) -> dict:
        return {
            "id": corpus.ids[i],
            "kind": corpus.kinds[i],
            "match_id": corpus.ids[match[i]] if match[i] >= 0 else by_id[corpus.ids[i]].get("match_id"),
            "J_match": None if math.isnan(jm[i]) else round(float(jm[i]), 4),
            "best_earlier_J": round(float(g.best_j[i]), 4),
            "best_earlier_id": g.best_match_id(i),
            "distance": None if math.isnan(dist[i]) else float(dist[i]),
        }

    def ex_fn(i: int) -> dict:
        return {
            "id": corpus.ids[i],
            "kind": corpus.kinds[i],
            "best_earlier_id": g.best_match_id(i),
            "best_earlier_J": round(float(g.best_j[i]), 4),
        }

    # synthetic (variant, base) pairs: is the later page of each pair flagged?
    # (per-kind recall above also counts e.g. a markup variant whose nearest
    # earlier page is another version of the document; this isolates the edit)
    mt = _markup_transforms()
    pairs: dict[str, dict] = {}
    misses = []
    pv = [(i, idx[b]) for i, b in enumerate(corpus.variant_of) if b is not None and b in idx]
    if pv:
        vi = np.array([a for a, _ in pv])
        bi = np.array([b for _, b in pv])
        jp = g.jaccard_many(vi, bi)
        later = np.maximum(vi, bi)
        for kind in VARIANT_KINDS:
            m = np.array([corpus.kinds[i] == kind for i in vi])
            ge = m & (jp >= threshold)
            pairs[kind] = {
                "pairs": int(m.sum()),
                "pairs_J_ge": int(ge.sum()),
                "later_flagged": int(flagged[later[ge]].sum()),
                "pair_recall": _ratio(int(flagged[later[ge]].sum()), int(ge.sum())),
            }
        for a, b, j, lt in zip(vi, bi, jp, later):
            if corpus.kinds[a] == "markup" and not flagged[lt]:
                misses.append(
                    {
                        "variant": corpus.ids[a],
                        "base": corpus.ids[b],
                        "J": float(j),
                        "later": corpus.ids[lt],
                        "later_verdict": "unique",
                        "transforms": mt.get(corpus.ids[a]),
                    }
                )
    res["variant_pairs"] = pairs
    below = [ex_fp(i) for i in np.flatnonzero(unrelated)]
    jmain = main_jaccards(corpus, [(e["id"], e["match_id"]) for e in below])
    for e in below:
        e["J_main"] = jmain.get((e["id"], e["match_id"]))
    res["flagged_below_0.5"] = below
    # The same pages judged by the main content (landmarks, groundtruth.main_text): a page whose
    # match is below J 0.5 there too is an unrelated page dropped; one above it is the same
    # document in another site's chrome, which the product is meant to join.
    res["overall"]["below_0.5_main"] = sum(1 for e in below if e["J_main"] is None or e["J_main"] < UNRELATED_J)
    res["markup_misses"] = misses

    worst_fp = sorted(fp, key=lambda i: np.nan_to_num(jm[i], nan=-1))[:n_examples]
    worst_fn = sorted(fn, key=lambda i: -g.best_j[i])[:n_examples]
    rnd_fp = rng.sample(list(fp), min(n_examples, len(fp)))
    rnd_fn = rng.sample(list(fn), min(n_examples, len(fn)))
    res["examples"] = {
        "false_positives_lowest_J": [ex_fp(i) for i in worst_fp],
        "false_positives_random": [ex_fp(i) for i in rnd_fp],
        "false_negatives_highest_J": [ex_fn(i) for i in worst_fn],
        "false_negatives_random": [ex_fn(i) for i in rnd_fn],
    }
    return res


_MT_CACHE: dict | None = None


def _markup_transforms() -> dict:
    """variant id -> markup transforms applied (manifest.json of the corpus)."""
    global _MT_CACHE
    if _MT_CACHE is None:
        try:
            _MT_CACHE = json.loads((DATA / "manifest.json").read_text(encoding="utf-8")).get("markup_transforms", {})
        except (OSError, ValueError):
            _MT_CACHE = {}
    return _MT_CACHE


# --------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------


def _f(x: float) -> str:
    return "  n/a" if x != x else f"{x:5.3f}"


def print_report(res: dict, title: str) -> None:
    print(f"\n== {title}  [{res['input_kind']}: {res['input']}]  J* = {res['threshold']}")
    print(f"{'slice':<22}{'pages':>7}{'pos':>7}{'flag':>7}{'prec':>8}{'recall':>8}{'f1':>8}{'false':>7}{'<0.5':>6}")

    def row(name: str, b: dict) -> None:
        print(
            f"{name:<22}{b['pages']:>7}{b['positives']:>7}{b['flagged']:>7}"
            f"{_f(b['precision']):>8}{_f(b['recall']):>8}{_f(b['f1']):>8}"
            f"{b['false_matches']:>7}{b['below_0.5']:>6}"
        )

    row("overall", res["overall"])
    for k, b in res["by_kind"].items():
        row(f"  kind={k}", b)
    print(
        f"pages flagged against a match below J {UNRELATED_J}: {res['overall']['below_0.5']} (goal 0), "
        f"of which below J {UNRELATED_J} in their main content too: {res['overall'].get('below_0.5_main', 'n/a')}; "
        f"false matches of listing pages: {res['by_kind'].get('listing', {}).get('false_matches', 'n/a')}"
    )
    print("recall by best-earlier-J bin (flag rate below J* = false-positive pressure):")
    print("  " + "  ".join(f"{lbl} {_f(b['flag_rate'])} ({b['pages']})" for lbl, b in res["by_best_j"].items()))
    if res.get("variant_pairs"):
        print("synthetic (variant, base) pairs with J >= J*: recall of the later page of the pair:")
        print(
            "  "
            + "  ".join(
                f"{k} {_f(b['pair_recall'])} ({b['later_flagged']}/{b['pairs_J_ge']})"
                for k, b in res["variant_pairs"].items()
            )
        )
    if "markup" in res.get("variant_pairs", {}):
        r = res["variant_pairs"]["markup"]["pair_recall"]
        print(f"markup-only pair recall: {_f(r)}" + ("" if r == 1.0 else "   <-- expected 1.00"))
    for m in res.get("markup_misses", []):
        print(
            f"  markup-only pair missed: {m['variant']} / {m['base']} (later: {m['later']}), "
            f"transforms {m['transforms']}"
        )
    for e in res.get("flagged_below_0.5", []):
        print(
            f"  below {UNRELATED_J}: {e['id']} [{e['kind']}] -> {e['match_id']}  J={e['J_match']} "
            f"J_main={e.get('J_main')} dist={e['distance']}"
        )
    if res["problems"]:
        print(f"verdict file problems: {res['problems']}")
    d = res["distance"]
    if d["true_positive"] or d["false_positive"]:
        print(f"distance: correct matches {d['true_positive']}; wrong matches {d['false_positive']}")
    ex = res["examples"]
    if ex["false_positives_lowest_J"]:
        print("false positives (lowest J of named match):")
        for e in ex["false_positives_lowest_J"] + ex["false_positives_random"]:
            print(
                f"  {e['id']} -> {e['match_id']}  J={e['J_match']} dist={e['distance']}  "
                f"(best earlier J={e['best_earlier_J']} {e['best_earlier_id']})"
            )
    if ex["false_negatives_highest_J"]:
        print("false negatives (highest best-earlier J):")
        for e in ex["false_negatives_highest_J"] + ex["false_negatives_random"]:
            print(f"  {e['id']} [{e['kind']}]  best earlier {e['best_earlier_id']} J={e['best_earlier_J']}")


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(type(o))


def write_json(obj: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=_json_default, allow_nan=True), encoding="utf-8")


# --------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------


def inputs_from(args: argparse.Namespace) -> list[Path]:
    if args.input:
        return [Path(p) for p in args.input]
    if getattr(args, "verdicts", None):
        return [HTML_INPUT]
    return [HTML_INPUT, TEXT_INPUT]


def run_once(args: argparse.Namespace) -> int:
    cli = None if args.verdicts else find_cli()
    if not args.verdicts and cli is None:
        print("streamdedup CLI not found (.venv/bin/streamdedup); use --verdicts FILE or --self-check", file=sys.stderr)
        return 2
    results = {"algorithm": args.algorithm, "k": args.k, "runs": []}
    for inp in inputs_from(args):
        corpus = load_corpus(inp)
        g = ground_truth_for(corpus)
        if args.verdicts:
            vpath, secs = Path(args.verdicts), None
        else:
            vpath = OUT / f"verdicts-{args.algorithm}-k{args.k}-{corpus.label}.jsonl"
            secs = run_scan(cli, inp, args.algorithm, args.k, vpath, args.scan_arg)
        res = evaluate(corpus, g, load_verdicts(vpath), args.threshold, args.examples)
        res["verdicts"] = str(vpath)
        res["scan_seconds"] = secs
        title = f"{args.algorithm} k={args.k}" if not args.verdicts else f"verdicts {vpath.name}"
        if secs is not None:
            title += f"  (scan {secs:.1f}s, {len(corpus.ids) / max(secs, 1e-9):.0f} pages/s)"
        print_report(res, title)
        results["runs"].append(res)
    name = (
        f"quality-{args.algorithm}-k{args.k}.json" if not args.verdicts else f"quality-{Path(args.verdicts).stem}.json"
    )
    write_json(results, OUT / name)
    print(f"\nwrote {OUT / name}")
    return 0


def parse_k_range(s: str) -> list[int]:
    if ".." in s:
        a, b = s.split("..")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in s.split(",")]


def sweep(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cli = find_cli()
    if cli is None:
        print("streamdedup CLI not found (.venv/bin/streamdedup)", file=sys.stderr)
        return 2
    ks = parse_k_range(args.sweep_k)
    table: dict[str, list[dict]] = {}
    failed: list[dict] = []
    for inp in inputs_from(args):
        corpus = load_corpus(inp)
        g = ground_truth_for(corpus)
        rows = []
        for k in ks:
            vpath = OUT / f"verdicts-{args.algorithm}-k{k}-{corpus.label}.jsonl"
            try:
                secs = run_scan(cli, inp, args.algorithm, k, vpath, args.scan_arg)
            except RuntimeError as exc:
                err = str(exc).strip().splitlines()[-1]
                print(f"[{corpus.label}] k={k}: scan failed: {err}", flush=True)
                failed.append({"input": corpus.label, "k": k, "error": err})
                continue
            res = evaluate(corpus, g, load_verdicts(vpath), args.threshold, n_examples=3)
            o = res["overall"]
            mk = res["variant_pairs"].get("markup", {}).get("pair_recall", float("nan"))
            rows.append(
                {
                    "k": k,
                    "precision": o["precision"],
                    "recall": o["recall"],
                    "f1": o["f1"],
                    "flagged": o["flagged"],
                    "markup_recall": mk,
                    "scan_seconds": secs,
                    "recall_by_kind": {kk: b["recall"] for kk, b in res["by_kind"].items()},
                    "precision_by_kind": {kk: b["precision"] for kk, b in res["by_kind"].items()},
                    "pair_recall_by_kind": {kk: b["pair_recall"] for kk, b in res["variant_pairs"].items()},
                }
            )
            print(
                f"[{corpus.label}] k={k}: P={_f(o['precision'])} R={_f(o['recall'])} F1={_f(o['f1'])} "
                f"flagged={o['flagged']} markup-pair R={_f(mk)} ({secs:.1f}s)",
                flush=True,
            )
        table[corpus.label] = rows
    write_json(
        {"algorithm": args.algorithm, "threshold": args.threshold, "sweep": table, "failed": failed},
        OUT / f"sweep-{args.algorithm}.json",
    )

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"html": "-", "text": "--"}
    for label, rows in table.items():
        xs = [r["k"] for r in rows]
        ax.plot(
            xs,
            [r["precision"] for r in rows],
            styles.get(label, ":"),
            marker="o",
            color="tab:blue",
            label=f"precision ({label})",
        )
        ax.plot(
            xs,
            [r["recall"] for r in rows],
            styles.get(label, ":"),
            marker="s",
            color="tab:red",
            label=f"recall ({label})",
        )
    ax.set_xlabel("k")
    ax.set_ylabel("per-page precision / recall")
    ax.set_title(f"streamdedup {args.algorithm}: precision & recall vs k (J* = {args.threshold})")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(ks)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    png = OUT / "pr_vs_k.png"
    fig.savefig(png, dpi=120)
    shutil.copyfile(png, OUT / f"pr_vs_k-{args.algorithm}.png")
    print(f"wrote {png} and {OUT / f'sweep-{args.algorithm}.json'}")
    return 0


# --------------------------------------------------------------------------
# Self-check (validates the evaluator without the product)
# --------------------------------------------------------------------------


def oracle_verdicts(corpus: Corpus, g: gtm.GroundTruth, threshold: float = THRESHOLD) -> list[dict]:
    out = []
    for i, pid in enumerate(corpus.ids):
        if g.best_j[i] >= threshold:
            j = int(g.best_idx[i])
            out.append(
                {
                    "id": pid,
                    "url": None,
                    "verdict": "near_duplicate",
                    "fingerprint": None,
                    "match_id": g.ids[j],
                    "match_url": None,
                    "distance": round(1 - float(g.best_j[i]), 4),
                }
            )
        else:
            out.append(
                {
                    "id": pid,
                    "url": None,
                    "verdict": "unique",
                    "fingerprint": None,
                    "match_id": None,
                    "match_url": None,
                    "distance": None,
                }
            )
    return out


def bad_verdicts(corpus: Corpus, g: gtm.GroundTruth, rng: random.Random) -> list[dict]:
    """Flags a random half of all pages, naming the previous page as match."""
    out = []
    for i, pid in enumerate(corpus.ids):
        if i > 0 and rng.random() < 0.5:
            out.append({"id": pid, "verdict": "near_duplicate", "match_id": corpus.ids[i - 1], "distance": 9})
        else:
            out.append({"id": pid, "verdict": "unique", "match_id": None, "distance": None})
    return out


def _check(cond: bool, msg: str, failures: list[str]) -> None:
    print(("  ok   " if cond else "  FAIL ") + msg)
    if not cond:
        failures.append(msg)


def self_check(args: argparse.Namespace) -> int:
    failures: list[str] = []
    rng = random.Random(7)
    inputs = [p for p in inputs_from(args) if p.exists()]
    if not inputs:
        print("no corpus; run python bench/corpus.py first", file=sys.stderr)
        return 2
    g0 = None
    for inp in inputs:
        corpus = load_corpus(inp)
        g = ground_truth_for(corpus)
        g0 = g0 or g
        print(f"\n-- self-check on {inp} ({len(corpus.ids)} pages, {int((g.best_j >= THRESHOLD).sum())} positives)")
        # 1. oracle: P = R = 1
        p = OUT / f"selfcheck-oracle-{corpus.label}.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(json.dumps(v) + "\n" for v in oracle_verdicts(corpus, g)), encoding="utf-8")
        res = evaluate(corpus, g, load_verdicts(p))
        o = res["overall"]
        _check(
            o["precision"] == 1.0 and o["recall"] == 1.0,
            f"oracle: P={o['precision']:.4f} R={o['recall']:.4f} (want 1, 1)",
            failures,
        )
        _check(
            all(b["recall"] == 1.0 for b in res["by_kind"].values() if b["positives"]),
            "oracle: recall 1.0 in every kind " + str({k: b["recall"] for k, b in res["by_kind"].items()}),
            failures,
        )
        _check(not res["problems"], f"oracle: no verdict-file problems {res['problems']}", failures)
        _check(
            res["overall"]["below_0.5"] == 0, f"oracle: flagged below J 0.5: {res['overall']['below_0.5']}", failures
        )
        # 2. a deliberately bad one
        p = OUT / f"selfcheck-bad-{corpus.label}.jsonl"
        p.write_text("".join(json.dumps(v) + "\n" for v in bad_verdicts(corpus, g, rng)), encoding="utf-8")
        res = evaluate(corpus, g, load_verdicts(p))
        o = res["overall"]
        _check(
            o["precision"] < 0.5 and 0.3 < o["recall"] < 0.7,
            f"bad (random half, previous page): P={o['precision']:.3f} (want << 1) R={o['recall']:.3f} (want ~0.5)",
            failures,
        )
        _check(
            o["below_0.5"] > 0.9 * o["false_matches"] > 0,
            f"bad: below J 0.5 {o['below_0.5']} of {o['false_matches']} false matches (want most)",
            failures,
        )
        # 3. flags nothing / flags all with best match but drops a third
        none = [{"id": i, "verdict": "unique"} for i in corpus.ids]
        o = evaluate(corpus, g, none)["overall"]
        _check(o["recall"] == 0.0 and o["precision"] != o["precision"], f"all unique: R={o['recall']} P=n/a", failures)
        orc = oracle_verdicts(corpus, g)
        drop = [
            dict(v, verdict="unique", match_id=None) if v["verdict"] == "near_duplicate" and rng.random() < 1 / 3 else v
            for v in orc
        ]
        o = evaluate(corpus, g, drop)["overall"]
        _check(
            o["precision"] == 1.0 and abs(o["recall"] - 2 / 3) < 0.05,
            f"oracle minus a third: P={o['precision']:.3f} R={o['recall']:.3f} (want 1, ~0.667)",
            failures,
        )
        # wrong match names lower precision, not recall
        swap = [
            dict(v, match_id=corpus.ids[0]) if v["verdict"] == "near_duplicate" and rng.random() < 0.5 else v
            for v in orc
        ]
        o = evaluate(corpus, g, swap)["overall"]
        _check(
            o["recall"] == 1.0 and o["precision"] < 0.7,
            f"oracle with half the matches renamed to page 0: P={o['precision']:.3f} R={o['recall']:.3f}",
            failures,
        )

    # 4. the ground truth itself: hashed sparse Jaccard == plain-Python set Jaccard
    print("\n-- ground truth spot checks")
    recs = {}
    g = g0
    sample = rng.sample(range(len(g.ids)), 40)
    want = set(sample) | {int(g.best_idx[i]) for i in sample if g.best_idx[i] >= 0}
    for n, r in enumerate(gtm.iter_records(HTML_INPUT)):
        if n in want:
            recs[n] = set(gtm.shingles(gtm.page_words(r["content"], r.get("content_type", "text/html"))))
    worst = 0.0
    for i in sample:
        j = int(g.best_idx[i])
        if j >= 0:
            worst = max(worst, abs(gtm.jaccard_sets(recs[i], recs[j]) - g.best_j[i]))
        k = rng.choice(sample)
        worst = max(worst, abs(gtm.jaccard_sets(recs[i], recs[k]) - g.jaccard_idx(i, k)))
    _check(
        worst < 1e-12,
        f"set Jaccard vs hashed sparse Jaccard on {len(sample)} pages: max |diff| = {worst:.2e}",
        failures,
    )
    # best earlier by pairwise intersect1d for a few pages (independent of the X @ X.T path)
    worst = 0.0
    for i in rng.sample(range(1, len(g.ids)), 15):
        js = [g.jaccard_idx(i, j) for j in range(i)]
        b = int(np.argmax(js))
        worst = max(worst, abs(js[b] - g.best_j[i]))
        if js[b] > 0 and int(g.best_idx[i]) != b and abs(js[int(g.best_idx[i])] - js[b]) > 1e-12:
            worst = 1.0
    _check(worst < 1e-12, f"best earlier via matmul vs pairwise scan on 15 pages: max |diff| = {worst:.2e}", failures)
    # text corpus: same words as the html corpus
    if TEXT_INPUT.exists():
        bad = 0
        ids = set(g.ids[i] for i in sample)
        th = {r["id"]: r for r in gtm.iter_records(TEXT_INPUT) if r["id"] in ids}
        for i in sample:
            if set(gtm.shingles(gtm.page_words(th[g.ids[i]]["content"], "text/plain"))) != recs[i]:
                bad += 1
        _check(bad == 0, f"corpus-text.jsonl has the same shingles as corpus.jsonl on {len(sample)} pages", failures)
    # 5. the main-content truth on hand-made pages: landmarks out, the main landmark kept
    chrome = "<header><a>Home</a> <a>Blog</a></header><nav>one two three four</nav>"
    foot = "<footer>copyright five six</footer>"
    cases = [
        (f"<body>{chrome}<main><p>kept words here</p><nav>inner nav</nav></main>{foot}</body>", "kept words here"),
        (f"<body>{chrome}<div role='main'><p>kept <b>bold</b>er</p></div>{foot}</body>", "kept bolder"),
        (f"<body>{chrome}<article><header>a title</header><p>text</p></article>{foot}</body>", "a title\ntext"),
        ("<body><div role='navigation'><div>menu</div></div><p>body text</p><aside>side</aside></body>", "body text"),
        ("<body><p>no landmarks at all<br>second line</p></body>", "no landmarks at all\nsecond line"),
    ]
    for html, want in cases:
        got = gtm.main_text(html)
        _check(got == want, f"main_text of {html[:60]!r}...: {got!r} (want {want!r})", failures)
    print("\nself-check " + ("PASSED" if not failures else f"FAILED ({len(failures)})"))
    return 0 if not failures else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default="simhash", choices=["simhash", "minhash", "combined"])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--input", action="append", help="JSON-lines input (repeatable); default: both corpus files")
    ap.add_argument("--verdicts", help="evaluate an existing verdict file instead of running scan")
    ap.add_argument("--threshold", type=float, default=THRESHOLD)
    ap.add_argument("--examples", type=int, default=5, help="examples of FP/FN to print")
    ap.add_argument("--sweep-k", metavar="A..B", help="run scan for each k and plot bench/out/pr_vs_k.png")
    ap.add_argument("--scan-arg", action="append", default=[], help="extra argument passed to scan (repeatable)")
    ap.add_argument("--self-check", action="store_true", help="validate the evaluator with oracle/bad verdicts")
    args = ap.parse_args(argv)
    if args.self_check:
        return self_check(args)
    if args.sweep_k:
        return sweep(args)
    return run_once(args)


if __name__ == "__main__":
    raise SystemExit(main())
