"""Words, word hashes and shingles: deterministic, script-aware, cache-independent."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.fingerprinting.features import (
    FEATURE_SEED,
    WORD_MUL,
    mix64,
    shingle_hashes,
    text_shingles,
    word_hashes,
    words,
)

M64 = (1 << 64) - 1


def test_words_lowercase_and_split_on_punctuation():
    assert words("Hello, WORLD! it's_ok 3.14") == ["hello", "world", "it", "s", "ok", "3", "14"]


def test_scripts_without_spaces_give_one_word_per_character():
    assert words("東京タワー") == ["東", "京", "タ", "ワ", "ー"]
    assert words("สวัสดี")[0] == "ส"
    assert words("Ελληνικά κείμενα") == ["ελληνικά", "κείμενα"]
    assert words("مرحبا بالعالم") == ["مرحبا", "بالعالم"]


def py_word_hash(word: str) -> int:
    """The documented word hash, in plain Python integers."""
    h = FEATURE_SEED
    for ch in word:
        h = (h * WORD_MUL + ord(ch)) & M64
    return int(mix64(np.array([h], dtype=np.uint64))[0])


def test_word_hash_is_the_documented_polynomial():
    assert word_hashes("Word, ÇA 東").tolist() == [py_word_hash(w) for w in ("word", "ça", "東")]


@settings(deadline=None)  # the first text beyond U+FFFF builds the full code-point table
@given(st.text(max_size=200))
def test_word_hashes_are_the_hashes_of_the_words(text):
    assert word_hashes(text).tolist() == [py_word_hash(w) for w in words(text)]


def test_word_hash_golden_values():
    """Pinned: a change here changes every fingerprint (a new scheme)."""
    assert [f"{h:016x}" for h in word_hashes("hello world 東").tolist()] == [
        "d73fa3cd2b3b1f6a",
        "274e91fefdf216f0",
        "eacfeb5ff79e6c81",
    ]


def test_shingles_are_order_sensitive_and_positional():
    a, b = text_shingles("a b c d"), text_shingles("d c b a")
    assert len(a) == 2 and not set(a.tolist()) & set(b.tolist())
    assert len(text_shingles("x y c d e", n=1)) == 5


def test_short_texts_give_one_shingle():
    assert len(text_shingles("just two")) == 1
    assert text_shingles("just two")[0] != text_shingles("two just")[0]
    assert len(text_shingles("")) == 0


def test_shingles_of_hashes_need_positive_n():
    import pytest

    with pytest.raises(ValueError, match="n must be >= 1"):
        shingle_hashes(np.zeros(3, dtype=np.uint64), 0)


def test_same_hashes_in_another_process():
    """Fresh interpreter, different PYTHONHASHSEED: the same 64 bits."""
    code = "from streamdedup.fingerprinting.features import text_shingles; print(text_shingles('Même texte, 同じ').tolist())"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1] == f"{text_shingles('Même texte, 同じ').tolist()}\n"


def test_mostly_ascii_text_with_unicode_punctuation():
    assert words("modules¶ — “quoted” café") == ["modules", "quoted", "café"]
