"""MinHash and bottom-k: estimates against exact answers on real text, the format, the edges.

Real text: the licence texts Debian ships in /usr/share/common-licenses (GPL-1/2/3, LGPL-2/2.1/3,
GFDL-1.2/1.3, ... give natural overlaps from 0.01 to 0.86) and copies edited with a seeded RNG.
Tolerances are 4 standard errors, sqrt(J(1-J)/k), plus 1/k for the estimate's granularity.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.fingerprinting.features import text_shingles
from streamdedup.fingerprinting.minhash import (
    EMPTY,
    MinHash,
    bottom_k_containment,
    bottom_k_resemblance,
    bottom_k_sketch,
    containment,
    containment_exact,
    jaccard_exact,
    minhash_signature,
    minhash_signatures,
    resemblance,
)

LICENSES = Path("/usr/share/common-licenses")
NAMES = ["Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1", "GPL-2",
         "GPL-3", "LGPL-2", "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0"]  # fmt: skip


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return {n: (LICENSES / n).read_text(encoding="utf-8") for n in NAMES}


def edit(text: str, frac: float, seed: int) -> str:
    """Replace, delete or insert (a third each) at ``frac`` of the word positions."""
    rng = np.random.default_rng(seed)
    words = text.split()
    vocab = sorted(set(words))
    out = []
    for w in words:
        if rng.random() < frac:
            op = rng.integers(3)
            if op == 0:
                out.append(vocab[rng.integers(len(vocab))])
            elif op == 2:
                out += [w, vocab[rng.integers(len(vocab))]]
        else:
            out.append(w)
    return " ".join(out)


def tolerance(j: float, k: int) -> float:
    return 4 * math.sqrt(j * (1 - j) / k) + 1 / k


@pytest.fixture(scope="module")
def pairs(texts) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Natural pairs (all licence pairs) and edited copies at many levels."""
    out = [(f"{a}~{b}", text_shingles(texts[a]), text_shingles(texts[b])) for a, b in itertools.combinations(NAMES, 2)]
    for i, frac in enumerate([0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8]):
        for name in ("GPL-3", "Apache-2.0"):
            out.append(
                (
                    f"{name}+{frac}",
                    text_shingles(texts[name]),
                    text_shingles(edit(texts[name], frac, i)),
                )
            )
    return out


# ---- estimates vs exact --------------------------------------------------------------------


@pytest.mark.parametrize("num_perm", [64, 128, 256])
def test_resemblance_matches_exact_jaccard(pairs, num_perm):
    sigs = minhash_signatures([s for _, a, b in pairs for s in (a, b)], num_perm=num_perm)
    levels = []
    for i, (name, a, b) in enumerate(pairs):
        j = jaccard_exact(a, b)
        est = resemblance(sigs[2 * i], sigs[2 * i + 1])
        assert abs(est - j) <= tolerance(j, num_perm), (name, j, est)
        levels.append(j)
    assert min(levels) < 0.02 and max(levels) == 1.0 and sum(0.3 < j < 0.9 for j in levels) >= 8


def test_estimates_are_unbiased_with_the_variance_of_independent_permutations(pairs):
    """Across seeds (fresh hash functions) the error, in standard errors, has mean 0 and variance 1.

    Correlated hash functions would show as variance > 1; a biased family as a mean away from 0.
    180 z-scores: the mean's standard error is 0.075 and the variance's about 0.105.
    """
    chosen = [p for p in pairs if 0.1 < jaccard_exact(p[1], p[2]) < 0.95][:6]
    assert len(chosen) == 6
    exact = np.array([jaccard_exact(a, b) for _, a, b in chosen])
    z = []
    for seed in range(30):
        sigs = minhash_signatures([s for _, a, b in chosen for s in (a, b)], num_perm=128, seed=seed)
        est = resemblance(sigs[0::2], sigs[1::2])
        z.extend((est - exact) / np.sqrt(exact * (1 - exact) / 128))
    z = np.array(z)
    assert abs(z.mean()) < 4 * 0.075
    assert 1 - 4 * 0.105 < z.var() < 1 + 4 * 0.105


def test_bottom_k_resemblance_matches_exact(pairs):
    k = 128
    errors = []
    for name, a, b in pairs:
        j = jaccard_exact(a, b)
        est = bottom_k_resemblance(bottom_k_sketch(a, k), bottom_k_sketch(b, k), k)
        assert abs(est - j) <= tolerance(j, k), (name, j, est)
        errors.append(est - j)
    assert abs(np.mean(errors)) < 0.01


def test_bottom_k_is_exact_for_small_sets():
    a, b = np.arange(50, dtype=np.uint64), np.arange(30, 90, dtype=np.uint64)
    ska, skb = bottom_k_sketch(a, 128), bottom_k_sketch(b, 128)
    assert bottom_k_resemblance(ska, skb, 128) == jaccard_exact(a, b) == 20 / 90
    assert bottom_k_containment(ska, skb, 128) == containment_exact(a, b) == 20 / 50


def _containment_cases(texts):
    gpl = texts["GPL-3"]
    words = gpl.split()
    half = " ".join(words[: len(words) // 2])
    return [
        ("first half in whole", half, gpl),
        ("edited first half in whole", edit(half, 0.1, 7), gpl),
        ("edited 60% in whole", edit(" ".join(words[: 6 * len(words) // 10]), 0.3, 8), gpl),
        ("LGPL-3 in GPL-3", texts["LGPL-3"], gpl),
        ("LGPL-2 in LGPL-2.1", texts["LGPL-2"], texts["LGPL-2.1"]),
        ("whole in first half", gpl, half),
    ]


def test_minhash_containment_matches_exact(texts):
    k = 128
    for name, ta, tb in _containment_cases(texts):
        a, b = text_shingles(ta), text_shingles(tb)
        ma, mb = MinHash.of(a, k), MinHash.of(b, k)
        c, j = containment_exact(a, b), jaccard_exact(a, b)
        # delta method: c = r (|A| + |B|) / ((1 + r) |A|), dc/dr = (|A| + |B|) / (|A| (1 + r)**2)
        slope = (ma.size + mb.size) / (ma.size * (1 + j) ** 2)
        est = ma.containment(mb)
        assert est == containment(ma.signature, mb.signature, ma.size, mb.size)
        assert abs(est - c) <= slope * tolerance(j, k), (name, c, est)


def test_bottom_k_containment_matches_exact(texts):
    k = 256
    for name, ta, tb in _containment_cases(texts):
        a, b = text_shingles(ta), text_shingles(tb)
        ska, skb = bottom_k_sketch(a, k), bottom_k_sketch(b, k)
        c = containment_exact(a, b)
        sample = np.count_nonzero(ska <= min(ska[-1], skb[-1]))  # the estimator's sample size
        est = bottom_k_containment(ska, skb, k)
        assert abs(est - c) <= tolerance(c, sample), (name, c, est, sample)
        assert bottom_k_containment(ska, skb) == est  # both sketches full: k changes nothing


def test_first_half_is_contained_in_whole(texts):
    words = texts["GPL-3"].split()
    half, whole = text_shingles(" ".join(words[: len(words) // 2])), text_shingles(texts["GPL-3"])
    assert containment_exact(half, whole) == 1.0
    assert MinHash.of(half).containment(MinHash.of(whole)) > 0.75
    assert bottom_k_containment(bottom_k_sketch(half), bottom_k_sketch(whole), 128) > 0.9


# ---- the format ----------------------------------------------------------------------------

M64 = (1 << 64) - 1


def py_mix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def py_splitmix64(state: int, n: int) -> list[int]:
    return [py_mix64((state + i * 0x9E3779B97F4A7C15) & M64) for i in range(1, n + 1)]


def py_signature(shingles, num_perm: int, seed: int) -> list[int]:
    """The module docstring's definition, in plain Python integers."""
    out = py_splitmix64(seed ^ 0x4D494E48415348, 1 + 2 * num_perm)
    k, a, c = out[0], [x | 1 for x in out[1::2]], out[2::2]
    u = [py_mix64(int(x) ^ k) for x in set(shingles)]
    return [min(((ai * v + ci) & M64) >> 32 for v in u) if u else 0xFFFFFFFF for ai, ci in zip(a, c)]


def test_signature_follows_the_documented_format(texts):
    shingles = text_shingles(texts["BSD"])
    assert minhash_signature(shingles, 16, seed=3).tolist() == py_signature(shingles.tolist(), 16, 3)
    assert minhash_signature([], 4).tolist() == py_signature([], 4, 1) == [0xFFFFFFFF] * 4


def test_bottom_k_follows_the_documented_format(texts):
    shingles = text_shingles(texts["BSD"])
    key = py_splitmix64(5 ^ 0x424F54544F4D4B, 1)[0]
    expect = sorted({py_mix64(int(x) ^ key) for x in shingles.tolist()})[:20]
    assert bottom_k_sketch(shingles, 20, seed=5).tolist() == expect


GOLDEN_TEXT = "The quick brown fox jumps over the lazy dog. Ça va? 東京は晴れ"


def test_golden_values():
    """Pinned outputs: a change here changes every stored signature (bump the format).

    Re-pinned when the word hash became the polynomial of features.py (the fingerprint scheme
    after xxh3 words): the signature of given shingles is unchanged
    (test_signature_follows_the_documented_format), the shingles of the text are not.
    """
    s = text_shingles(GOLDEN_TEXT)
    assert minhash_signature(s)[:12].tolist() == [
        778749345, 199965160, 209957308, 13866180, 124775511, 1569894,
        207447286, 49603388, 76349453, 78714927, 470632751, 51309450,
    ]  # fmt: skip
    assert minhash_signature(s, num_perm=16, seed=7).tolist() == [
        817325240, 101251239, 82974591, 616437289, 364788246, 405755361, 881921797, 300801117,
        908611295, 313159769, 48444229, 5441853, 596965011, 4401374, 87053607, 457258302,
    ]  # fmt: skip
    assert bottom_k_sketch(s, k=4).tolist() == [
        0x0DD9A5B60BE1CC0A, 0x5E052491E384D723, 0x6E4036ED75B0DAED, 0x739F5E1DA4DD7E40,
    ]  # fmt: skip


def test_smaller_num_perm_is_a_prefix(texts):
    s = text_shingles(texts["MPL-2.0"])
    assert (minhash_signature(s, 64) == minhash_signature(s, 128)[:64]).all()


def test_batch_equals_single_and_chunking_is_invisible(texts, monkeypatch):
    docs = [text_shingles(texts[n]) for n in NAMES] + [np.empty(0, np.uint64), text_shingles("one")]
    docs.insert(3, np.empty(0, np.uint64))
    single = np.stack([minhash_signature(d) for d in docs])
    assert (minhash_signatures(docs) == single).all()
    import streamdedup.fingerprinting.minhash as mh

    monkeypatch.setattr(mh, "_CHUNK", 1000)  # ~8 columns per chunk: documents straddle chunks
    assert (minhash_signatures(docs) == single).all()
    assert minhash_signatures([]).shape == (0, 128)


def test_repeats_order_and_integer_dtype_do_not_matter(texts):
    s = text_shingles(texts["Artistic"])
    shuffled = np.random.default_rng(0).permutation(np.concatenate([s, s[:100]]))
    assert (minhash_signature(s) == minhash_signature(shuffled)).all()
    assert (minhash_signature(s) == minhash_signature(s.view(np.int64))).all()
    assert (minhash_signature(s) == minhash_signature(np.unique(s))).all()


def test_empty_set_sentinel():
    e = minhash_signature(np.empty(0, np.uint64))
    assert e.dtype == np.uint32 and (e == EMPTY).all()
    assert resemblance(e, e) == 1.0
    assert resemblance(e, minhash_signature(text_shingles("some words here"))) == 0.0
    assert jaccard_exact([], []) == 1.0 and containment_exact([], [1]) == 1.0
    assert bottom_k_sketch([]).size == 0 and bottom_k_resemblance(bottom_k_sketch([]), bottom_k_sketch([])) == 1.0


def test_bad_arguments_say_how_to_fix_the_call():
    with pytest.raises(ValueError, match=r"num_perm must be a positive integer, e.g. 128; got 0"):
        minhash_signature([1, 2], num_perm=0)
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
        minhash_signature([1, 2], seed=-1)
    with pytest.raises(ValueError, match=r"1-D integer array such as text_shingles\(text\)"):
        minhash_signature(np.array([1.5, 2.5]))
    with pytest.raises(ValueError, match=r"k must be a positive integer"):
        bottom_k_sketch([1], k=0)
    with pytest.raises(ValueError, match=r"same, non-zero num_perm"):
        resemblance(np.zeros(4, np.uint32), np.zeros(8, np.uint32))
    with pytest.raises(ValueError, match=r"share num_perm and seed"):
        MinHash.of([1, 2, 3], seed=1).resemblance(MinHash.of([1, 2, 3], seed=2))
    with pytest.raises(ValueError, match=r"bottom-k sketch is a 1-D uint64 array"):
        bottom_k_resemblance(np.zeros(4, np.uint32), np.zeros(4, np.uint32))


# ---- properties ----------------------------------------------------------------------------

sets = st.lists(st.integers(0, M64), max_size=60)


@settings(max_examples=60, deadline=None)
@given(sets, sets)
def test_resemblance_properties(a, b):
    sa, sb = minhash_signature(a, 32), minhash_signature(b, 32)
    assert resemblance(sa, sa) == 1.0
    assert resemblance(sa, sb) == resemblance(sb, sa)
    assert 0.0 <= resemblance(sa, sb) <= 1.0
    # MinHash is mergeable: the signature of a union is the element-wise minimum
    assert (minhash_signature(a + b, 32) == np.minimum(sa, sb)).all()


@settings(max_examples=60, deadline=None)
@given(sets, sets, st.integers(1, 40))
def test_bottom_k_properties(a, b, k):
    ska, skb = bottom_k_sketch(a, k), bottom_k_sketch(b, k)
    assert bottom_k_resemblance(ska, ska, k) == 1.0
    assert bottom_k_resemblance(ska, skb, k) == bottom_k_resemblance(skb, ska, k)
    assert (bottom_k_sketch(a + b, k) == np.union1d(ska, skb)[:k]).all()  # mergeable too
    if a:
        assert bottom_k_containment(ska, ska, k) == 1.0
    if len(set(a) | set(b)) <= k:
        assert bottom_k_resemblance(ska, skb, k) == jaccard_exact(a, b)
        assert bottom_k_containment(ska, skb, k) == containment_exact(a, b)
