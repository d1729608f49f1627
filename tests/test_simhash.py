"""Simhash: equal to Charikar's definition computed bit by bit, and pinned by golden values.

The golden fingerprints pin the whole chain (text extraction, words, xxh3 word hashes, shingle
mixing, accumulation).  If one changes, every stored fingerprint in every deployment changes
meaning: update them only on purpose, with a note in the changelog.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamdedup import fingerprint, hamming
from streamdedup.fingerprinting.simhash import from_hex, hamming_many, simhash, simhash_many, to_hex


def charikar(features: list[int]) -> int:
    """The textbook definition: +1 for a set bit, -1 for a clear bit, sign of each sum."""
    v = [0] * 64
    for f in features:
        for i in range(64):
            v[i] += 1 if f >> i & 1 else -1
    return sum(1 << i for i in range(64) if v[i] > 0)


@given(st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=40), min_size=1, max_size=8))
def test_batch_equals_textbook_definition(batches):
    got = simhash_many([np.array(b, dtype=np.uint64) for b in batches])
    assert [int(x) for x in got] == [charikar(b) for b in batches]


def test_repeated_feature_weighs_more():
    a, b = 0xFFFF_0000_0000_0000, 0x0000_0000_0000_FFFF
    assert simhash(np.array([a, a, b], dtype=np.uint64)) == a


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


GOLDEN = {
    "ascii": (
        "text/plain",
        "The quick brown fox jumps over the lazy dog while the crawler fetches it again.",
        "5810709d0212fc88",
    ),
    "html": (
        "text/html",
        "<html><head><style>p{}</style></head><body><nav>Home</nav><p>The quick <b>brown</b> "
        "fox&nbsp;jumps over the lazy dog while the crawler fetches it again.</p></body></html>",
        "5810709d0212fc88",
    ),
    "latin": ("text/plain", "Ça coûte cher: l'été à Zürich, naïve façade, São Paulo, Ærøskøbing.", "79897e06142a65ea"),
    "cjk": ("text/plain", "東京タワーは日本の電波塔です。中文网页的近似重复检测。", "16dc01788dd73b43"),
    "arabic": ("text/plain", "مرحبا بالعالم، هذه صفحة ويب مكررة تقريبا", "306c43a129c1c9c8"),
    "emoji": ("text/plain", "Launch day 🚀🚀 party 🎉 with 👩‍💻 developers and ☕ coffee", "b4084eda83c42000"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_fingerprints(name):
    content_type, content, expected = GOLDEN[name]
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
