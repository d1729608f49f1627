"""Simhash: equal to Charikar's definition computed bit by bit, and pinned by golden values.

The golden fingerprints pin the whole chain (text extraction, words, xxh3 word hashes, shingle
mixing, feature weights, accumulation) for one fingerprint scheme
(``streamdedup.fingerprinting.SCHEME``).  If one changes, every stored fingerprint in every
deployment changes meaning: that is a new scheme.  Bump SCHEME and re-pin them under its number,
only on purpose.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamdedup import fingerprint, hamming
from streamdedup.fingerprinting import SCHEME, kernels
from streamdedup.fingerprinting.simhash import (
    distinct_features,
    feature_weights,
    from_hex,
    hamming_many,
    simhash,
    simhash_many,
    to_hex,
)


def charikar(features: list[int]) -> int:
    """The textbook definition, with scheme 2's weights: each distinct feature adds its weight
    1 + floor(log2(occurrences)) for a set bit and subtracts it for a clear bit; the fingerprint
    is the sign of each sum."""
    v = [0] * 64
    for f, tf in Counter(features).items():
        w = tf.bit_length()  # 1 + floor(log2(tf))
        for i in range(64):
            v[i] += w if f >> i & 1 else -w
    return sum(1 << i for i in range(64) if v[i] > 0)


# few distinct values, so that features repeat
FEATURES = st.lists(st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**63, 2**64 - 1, 0xF0F0]), max_size=60)


@given(st.lists(FEATURES, min_size=1, max_size=8))
def test_batch_equals_textbook_definition(batches):
    got = simhash_many([np.array(b, dtype=np.uint64) for b in batches])
    assert [int(x) for x in got] == [charikar(b) for b in batches]


# values that differ only in their high bits share a hash-table slot in distinct_features
COLLIDING = st.integers(0, 15).map(lambda x: x << 60 | 0xABC) | st.integers(0, 2**64 - 1)


@given(st.lists(st.lists(COLLIDING, max_size=30), max_size=6))
def test_distinct_features_counts_every_feature_of_every_page(pages):
    f, p, c = distinct_features([np.array(x, dtype=np.uint64) for x in pages])
    got = sorted(zip(p.tolist(), f.tolist(), c.tolist()))
    assert got == sorted((i, v, n) for i, x in enumerate(pages) for v, n in Counter(x).items())


@given(st.lists(st.integers(1, 2**40), max_size=50))
def test_weights_are_one_plus_floor_log2(tfs):
    assert feature_weights(np.array(tfs, dtype=np.int64)).tolist() == [1 + math.floor(math.log2(t)) for t in tfs]


def test_repeated_feature_weighs_more_but_only_logarithmically():
    a, b, c = 0xFFFF_0000_0000_0000, 0x0000_0000_0000_FFFF, 0x0000_FFFF_0000_0000
    assert simhash(np.array([a, a, b], dtype=np.uint64)) == a  # 2 against 1
    # 400 occurrences weigh 9, not 400: ten distinct features outvote them
    page = np.array([a] * 400 + [b] * 1 + [c] * 1 + list(range(3, 11)), dtype=np.uint64)
    assert simhash(page) != a and charikar(page.tolist()) == simhash(page)


def _index_page(names: list[str], rng: random.Random) -> str:
    return " ".join(f"{n} (in module {rng.choice(['os', 'sys', 're', 'json'])})" for n in names)


def test_no_phrase_outvotes_a_page():
    """Two index pages that share one phrase, repeated on every line, and no entry: far apart
    (scheme 1 put them within 3 bits: the phrase outvoted everything else)."""
    rng = random.Random(0)
    names = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) for _ in range(600)]
    s, u = _index_page(names[:300], rng), _index_page(names[300:], rng)
    assert hamming(fingerprint(s, "text/plain"), fingerprint(u, "text/plain")) > 12


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_hamming_scalar_and_array_agree(a, b):
    assert hamming(a, b) == int(hamming_many(np.uint64(a), np.array([b], dtype=np.uint64))[0])
    assert hamming_many(np.uint64(a), np.uint64(b)).shape == ()


@given(st.integers(0, 2**64 - 1))
def test_hex_round_trip(fp):
    assert from_hex(to_hex(fp)) == fp and len(to_hex(fp)) == 16


@pytest.mark.parametrize("bad", ["", "0" * 17, "xyz"])
def test_bad_hex(bad):
    with pytest.raises(ValueError):
        from_hex(bad)


# Golden fingerprints of scheme 2: words hashed by the polynomial of features.py (scheme 1 used
# xxh3 per word), and each distinct bigram weighted 1 + floor(log2 tf).  "listing" and "repeated"
# repeat bigrams, so they pin the weights.  Both the compiled and the numpy path give these bits.
GOLDEN_SCHEME = 2
GOLDEN = {
    "ascii": (
        "text/plain",
        "The quick brown fox jumps over the lazy dog while the crawler fetches it again.",
        "3e4870008c90d080",
    ),
    "html": (
        "text/html",
        "<html><head><style>p{}</style></head><body><nav>Home</nav><p>The quick <b>brown</b> "
        "fox&nbsp;jumps over the lazy dog while the crawler fetches it again.</p></body></html>",
        "3e4870008c90d080",
    ),
    "latin": ("text/plain", "Ça coûte cher: l'été à Zürich, naïve façade, São Paulo, Ærøskøbing.", "b8901f8e3a9faa2a"),
    "cjk": ("text/plain", "東京タワーは日本の電波塔です。中文网页的近似重复检测。", "cd41a82859506c42"),
    "arabic": ("text/plain", "مرحبا بالعالم، هذه صفحة ويب مكررة تقريبا", "80a606844084823f"),
    "emoji": ("text/plain", "Launch day 🚀🚀 party 🎉 with 👩‍💻 developers and ☕ coffee", "1808961a1210404e"),
    "listing": (
        "text/html",
        "<ul><li>abs() (built-in function)</li><li>all() (built-in function)</li><li>any() (built-in function)"
        "</li><li>ascii() (built-in function)</li><li>bin() (built-in function)</li><li>bool (built-in class)"
        "</li><li>breakpoint() (built-in function)</li><li>bytearray (built-in class)</li></ul>",
        "4190c74eab805003",
    ),
    "repeated": (
        "text/plain",
        "Привет, мир! Привет, мир! Привет, мир! Ça va? Ça va? 東京東京東京は日本の首都です。 مرحبا مرحبا 🚀🚀🚀 launch",
        "01a1124a7d0a0d1a",
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_fingerprints(name):
    assert SCHEME == GOLDEN_SCHEME, "a new scheme: re-pin the golden fingerprints under its number"
    content_type, content, expected = GOLDEN[name]
    assert to_hex(fingerprint(content, content_type)) == expected
    with kernels.numpy_only():  # a machine without numba gives the same bits
        assert to_hex(fingerprint(content, content_type)) == expected


def test_html_and_its_text_agree():
    assert fingerprint(GOLDEN["html"][1], "text/html") == fingerprint(GOLDEN["ascii"][1], "text/plain")


def test_same_bits_in_a_fresh_process_with_another_hash_seed():
    code = "import streamdedup as s; print(s.fingerprint('Même page, 同じページ 🚀', 'text/plain'))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("0", "12345")
    }
    assert outs == {f"{fingerprint('Même page, 同じページ 🚀', 'text/plain')}\n"}
