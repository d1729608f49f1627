"""LSH banding: the choice of (b, r), the S-curve, and LSHIndex on real and synthetic signatures."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from fractions import Fraction
from math import comb
from pathlib import Path

import numpy as np
import pytest

import streamdedup.index.lsh as lsh
from streamdedup.fingerprinting.features import text_shingles
from streamdedup.fingerprinting.minhash import jaccard_exact, minhash_signatures
from streamdedup.index.lsh import Candidates, LSHIndex, choose_bands, s_curve, threshold_of

LICENSES = Path("/usr/share/common-licenses")
NAMES = ["Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1", "GPL-2",
         "GPL-3", "LGPL-2", "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0"]  # fmt: skip


# ---- choosing b and r ----------------------------------------------------------------------


def test_bands_for_threshold_08_and_128_permutations():
    b, r = choose_bands(0.8, 128)
    assert (b, r) == (9, 13) and b * r <= 128
    assert s_curve(0.5, b, r) < 0.002  # unrelated-ish pairs almost never collide
    assert s_curve(0.7, b, r) < 0.1
    assert s_curve(0.9, b, r) > 0.92  # near-duplicates almost always do
    # Equal weights on the two error *areas* put the curve's steep part above the threshold
    # (the false-positive interval [0, t] is four times longer than [t, 1]): a pair at exactly
    # s = 0.8 collides 40% of the time.  Recall at the threshold is bought with fn_weight:
    assert 0.35 < s_curve(0.8, b, r) < 0.45
    b2, r2 = choose_bands(0.8, 128, fp_weight=0.1, fn_weight=0.9)
    assert s_curve(0.8, b2, r2) > 0.85 and s_curve(0.5, b2, r2) < 0.05


@pytest.mark.parametrize(
    "threshold, num_perm, fp_weight, fn_weight",
    [
        (0.8, 128, 0.5, 0.5),
        (0.5, 128, 0.5, 0.5),
        (0.9, 128, 0.5, 0.5),
        (0.7, 64, 0.5, 0.5),
        (0.8, 128, 0.2, 0.8),
        (0.3, 16, 0.9, 0.1),
    ],
)
def test_choose_bands_is_the_exact_optimum(threshold, num_perm, fp_weight, fn_weight):
    """Brute force over every (b, r) with the areas integrated exactly, in rational numbers.

    int_0^x (1 - s**r)**b ds = sum_k C(b, k) (-1)**k x**(r*k + 1) / (r*k + 1)
    """
    t = Fraction(threshold)
    best = None
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            below_t = sum(Fraction(comb(b, k) * (-1) ** k, r * k + 1) * t ** (r * k + 1) for k in range(b + 1))
            below_1 = sum(Fraction(comb(b, k) * (-1) ** k, r * k + 1) for k in range(b + 1))
            fp, fn = (
                t - below_t,
                below_1 - below_t,
            )  # FP = int_0^t P(s) ds, FN = int_t^1 (1 - P(s)) ds
            err = Fraction(fp_weight) * fp + Fraction(fn_weight) * fn
            if best is None or err < best[0]:
                best = (err, (b, r))
    assert choose_bands(threshold, num_perm, fp_weight, fn_weight) == best[1]


def test_s_curve_and_threshold_of():
    s = np.linspace(0, 1, 101)
    p = s_curve(s, 9, 13)
    assert p[0] == 0.0 and p[-1] == 1.0 and (np.diff(p) >= 0).all()
    t = threshold_of(9, 13)
    assert abs(t - (1 / 9) ** (1 / 13)) < 1e-15
    # at (1/b)**(1/r) one band agrees with probability 1/b: P = 1 - (1 - 1/b)**b
    assert abs(s_curve(t, 9, 13) - (1 - (8 / 9) ** 9)) < 1e-12
    assert isinstance(s_curve(0.5, 9, 13), float)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: choose_bands(0.0, 128),
            r"threshold must be a resemblance strictly between 0 and 1, e.g. 0.8; got 0.0",
        ),
        (lambda: choose_bands(1.0, 128), r"strictly between 0 and 1"),
        (lambda: choose_bands(80, 128), r"strictly between 0 and 1, e.g. 0.8; got 80"),
        (lambda: choose_bands(0.8, 1), r"num_perm must be an integer >= 2 \(e.g. 128"),
        (lambda: choose_bands(0.8, 128.0), r"num_perm must be an integer >= 2"),
        (lambda: choose_bands(0.8, 128, fp_weight=-1), r"fp_weight must be a number >= 0"),
        (lambda: choose_bands(0.8, 128, 0, 0), r"must not both be 0"),
        (
            lambda: threshold_of(0, 5),
            r"b \(bands\) and r \(rows per band\) must be positive integers",
        ),
        (lambda: LSHIndex(b=10), r"give both b and r, or neither"),
        (
            lambda: LSHIndex(num_perm=128, b=20, r=7),
            r"b \* r must be <= num_perm: b=20, r=7 need 140 .* lower b or r",
        ),
        (lambda: LSHIndex(threshold=1.2), r"strictly between 0 and 1"),
    ],
)
def test_bad_arguments_say_how_to_fix_the_call(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---- the index on real text ----------------------------------------------------------------


def edit(words: list[str], n: int, rng: np.random.Generator) -> str:
    """Replace ``n`` random words by other words of the same text (each changes <= 3 shingles)."""
    out = list(words)
    for i in rng.choice(len(out), n, replace=False):
        out[i] = words[rng.integers(len(words))]
    return " ".join(out)


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    """~1,000 real documents: 150-word windows of the licence texts and of stdlib modules."""
    texts = [(LICENSES / n).read_text(encoding="utf-8") for n in NAMES]
    stdlib = Path(os.__file__).parent
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:120]]
    docs = []
    for t in texts:
        words = t.split()
        docs += [" ".join(words[i : i + 150]) for i in range(0, len(words) - 149, 150)]
    return docs[:1000]


def test_planted_near_duplicates_are_found_and_unrelated_documents_are_not(corpus):
    assert len(corpus) == 1000
    rng = np.random.default_rng(2024)
    shingles = [text_shingles(d) for d in corpus]
    index = LSHIndex(threshold=0.8, num_perm=128)
    index.add_many([f"doc{i}" for i in range(len(corpus))], minhash_signatures(shingles))

    planted = rng.choice(len(corpus), 300, replace=False)
    copies = [text_shingles(edit(corpus[i].split(), int(rng.integers(1, 3)), rng)) for i in planted]
    exact = np.array([jaccard_exact(shingles[i], c) for i, c in zip(planted, copies)])
    keep = exact >= 0.9  # planted pairs at J >= 0.9 (one or two words replaced in 150)
    planted, copies, exact = planted[keep], [c for c, k in zip(copies, keep) if k], exact[keep]
    assert len(planted) >= 250 and (exact < 0.95).sum() >= 30
    found = index.query_many(minhash_signatures(copies))
    hit = np.array([f"doc{i}" in dict(cands) for i, cands in zip(planted, found)])
    # each planted pair collides with probability s_curve(J): at least 4 sigma above expectation
    p = s_curve(exact, index.b, index.r)
    assert hit.sum() >= p.sum() - 4 * np.sqrt((p * (1 - p)).sum())
    assert hit[exact >= 0.95].all()  # P >= 0.998 each
    for i, j, cands in zip(planted, exact, found):  # the estimate attached to the original is close
        est = dict(cands).get(f"doc{i}")
        assert est is None or abs(est - j) <= 4 * np.sqrt(j * (1 - j) / 128) + 1 / 128

    # every candidate of a stored document is a real neighbour: nothing below J = 0.3 collides
    # (P(0.3) = 1.4e-6 per pair, 5e5 pairs); a document always finds itself
    for i, cands in enumerate(index.query_many(minhash_signatures(shingles))):
        assert f"doc{i}" in dict(cands)
        for id_, _ in cands:
            assert jaccard_exact(shingles[i], shingles[int(id_[3:])]) > 0.3


def test_random_documents_do_not_collide():
    rng = np.random.default_rng(5)
    sets = [rng.integers(0, 2**63, 300, dtype=np.uint64) for _ in range(4000)]
    sigs = minhash_signatures(sets)
    index = LSHIndex()
    index.add_many(range(2000), sigs[:2000])
    assert len(index.search(sigs[2000:]).row) == 0
    assert all(index.query(sigs[i]) == [(i, 1.0)] for i in range(0, 2000, 97))


# ---- the index's mechanics (synthetic signatures, fast) ------------------------------------


def clustered_signatures(n: int, seed: int, change: float = 0.1, num_perm: int = 128) -> np.ndarray:
    """Signatures in clusters of 5: copies of a centre with ``change`` of the positions redrawn."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2**32, (n // 5 + 1, num_perm), dtype=np.uint32)
    sigs = np.repeat(centres, 5, axis=0)[:n]
    redraw = rng.random(sigs.shape) < change
    sigs[redraw] = rng.integers(0, 2**32, redraw.sum(), dtype=np.uint32)
    return sigs


def brute_force(stored: np.ndarray, live: np.ndarray, queries: np.ndarray, b: int, r: int) -> list[set[int]]:
    """Rows sharing all r values of at least one band with each query, from the definition."""
    out = []
    for q in queries:
        same = (stored[:, : b * r] == q[: b * r]).reshape(len(stored), b, r).all(axis=2).any(axis=1)
        out.append(set(np.flatnonzero(same & live).tolist()))
    return out


@pytest.mark.parametrize("small_levels", [False, True])
def test_answers_equal_the_definition_whatever_the_layout(monkeypatch, small_levels):
    """Tail, mid, base, their merges, directories and compaction never change an answer."""
    if small_levels:
        monkeypatch.setattr(lsh, "_TAIL_MAX", 7)
        monkeypatch.setattr(lsh, "_MID_MIN", 20)
        monkeypatch.setattr(lsh, "_SCAN_BUDGET", 50)
        monkeypatch.setattr(lsh._Run, "DIRECTORY_MIN", 64)  # bucket directories on small runs
    sigs = clustered_signatures(3000, seed=1)
    queries = clustered_signatures(300, seed=1, change=0.15)  # same centres, new noise
    index = LSHIndex()
    live = np.zeros(len(sigs), dtype=bool)
    for start in range(0, len(sigs), 137):  # uneven batches, queries in between
        end = min(start + 137, len(sigs))
        index.add_many(range(start, end), sigs[start:end])
        live[start:end] = True
        if start % 3 == 0:
            got = [{i for i, _ in c} for c in index.query_many(queries[:40])]
            assert got == brute_force(sigs[:end], live[:end], queries[:40], index.b, index.r)
    for i in range(0, 3000, 7):
        assert index.remove(i)
        live[i] = False
    expect = brute_force(sigs, live, queries, index.b, index.r)
    assert sum(map(len, expect)) > 200
    assert [{i for i, _ in c} for c in index.query_many(queries)] == expect
    for i in range(0, 3000, 2):  # past half removed: compaction renumbers rows
        index.remove(i)
        live[i] = False
    assert len(index) == live.sum()
    assert [{i for i, _ in c} for c in index.query_many(queries)] == brute_force(sigs, live, queries, index.b, index.r)


def test_results_are_ranked_and_batch_equals_single():
    sigs = clustered_signatures(500, seed=3, change=0.2)
    index = LSHIndex()
    index.add_many([f"p{i}" for i in range(500)], sigs)
    batch = index.query_many(sigs[:60])
    assert batch == [index.query(s) for s in sigs[:60]]
    for i, cands in enumerate(batch):
        scores = [s for _, s in cands]
        assert scores == sorted(scores, reverse=True) and cands[0] == (f"p{i}", 1.0)
        for id_, s in cands:
            assert s == np.count_nonzero(sigs[int(id_[1:])] == sigs[i]) / 128
    filtered = index.query_many(sigs[:60], min_resemblance=0.7)
    assert filtered == [[c for c in cands if c[1] >= 0.7] for cands in batch]
    found = index.search(sigs[:60])
    assert isinstance(found, Candidates)
    assert [index.id_of(r) for r in found.row[found.query == 5].tolist()] == [i for i, _ in batch[5]]
    assert (index.signature_of(int(found.row[0])) == sigs[0]).all()


def test_remove_and_repeated_ids():
    sigs = clustered_signatures(20, seed=4, change=0.0)  # 4 clusters of identical signatures
    index = LSHIndex()
    index.add_many(["a", "b", "a", "c", "d"], sigs[:5])  # "a" twice: stored twice (a re-fetch)
    assert len(index) == 5
    assert [i for i, _ in index.query(sigs[0])] == ["a", "b", "a", "c", "d"]  # ties: oldest first
    assert index.remove("a") is True and len(index) == 3
    assert index.remove("a") is False and index.remove("nobody") is False
    assert [i for i, _ in index.query(sigs[0])] == ["b", "c", "d"]
    index.add("a", sigs[0])  # back again
    assert [i for i, _ in index.query(sigs[0])] == ["b", "c", "d", "a"]
    assert index.remove(1) is False  # ids compare with ==, not by hash alone
    index.add_many([1, 1.0], sigs[5:7])
    assert index.remove(1) is True and len(index) == 4  # 1 == 1.0: both forgotten


def test_len_and_nbytes():
    index = LSHIndex()
    assert (
        len(index) == 0
        and index.query(np.zeros(128, np.uint32)) == []
        and index.query_many(np.zeros((0, 128), np.uint32)) == []
    )
    empty = index.nbytes
    sigs = clustered_signatures(5000, seed=6)
    index.add_many(range(5000), sigs)
    assert len(index) == 5000
    index.query(sigs[0])
    # signatures (512 B) + band keys and rows (12 B x b) + tombstone and id hash + id pointer
    per_doc = 128 * 4 + 12 * index.b + 1 + 8 + 8
    assert 5000 * per_doc <= index.nbytes - empty <= 2.5 * 5000 * per_doc
    index.add_many([], np.zeros((0, 128), np.uint32))
    assert len(index) == 5000


def test_bad_calls_say_how_to_fix_them():
    index = LSHIndex(num_perm=64)
    good = np.zeros((2, 64), np.uint32)
    with pytest.raises(ValueError, match=r"uint32 array of shape \(n, num_perm\) with num_perm=64"):
        index.add_many([1, 2], good.astype(np.uint64))
    with pytest.raises(ValueError, match=r"num_perm=64"):
        index.add_many([1, 2], np.zeros((2, 128), np.uint32))
    with pytest.raises(ValueError, match=r"got 3 ids for 2 signatures; pass one id each"):
        index.add_many([1, 2, 3], good)
    with pytest.raises(ValueError, match=r"shape \(num_perm,\)"):
        index.query(good)
    with pytest.raises(ValueError, match=r"min_resemblance must be None or a number in \[0, 1\]"):
        index.query(good[0], min_resemblance=2)
    with pytest.raises(TypeError):
        index.add_many([[1]], good[:1])  # an unhashable id
    assert len(index) == 0


def test_same_answers_in_every_process():
    """Signatures and answers do not depend on the process (PYTHONHASHSEED included)."""
    code = (
        "import json, numpy as np\n"
        "from streamdedup.fingerprinting.features import text_shingles\n"
        "from streamdedup.fingerprinting.minhash import minhash_signatures\n"
        "from streamdedup.index.lsh import LSHIndex\n"
        "texts = ['a b c d e f g h i j k', 'a b c d e f g h i j x', 'zz yy xx ww vv uu',\n"
        "         'a b c d e f g h i j k l']\n"
        "sigs = minhash_signatures([text_shingles(t) for t in texts], num_perm=64)\n"
        "ix = LSHIndex(threshold=0.5, num_perm=64)\n"
        "ix.add_many(['t0', 't1', 't2', 't3'], sigs)\n"
        "print(json.dumps([int(sigs.astype(np.uint64).sum()), ix.query_many(sigs)]))\n"
    )
    outs = []
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        run = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(__file__).parents[1],
            check=True,
        )
        outs.append(json.loads(run.stdout))
    here = io.StringIO()
    with contextlib.redirect_stdout(here):
        exec(code, {})
    assert outs[0] == outs[1] == json.loads(here.getvalue())
    answers = outs[0][1]
    assert answers[0][0] == ["t0", 1.0] and "t2" not in [i for i, _ in answers[0]]
