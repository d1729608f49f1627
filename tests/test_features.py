"""Words, word hashes and shingles: deterministic, script-aware, cache-independent."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from streamdedup.fingerprinting import features
from streamdedup.fingerprinting.features import FEATURE_SEED, shingle_hashes, text_shingles, word_hashes, words


def test_words_lowercase_and_split_on_punctuation():
    assert words("Hello, WORLD! it's_ok 3.14") == ["hello", "world", "it", "s", "ok", "3", "14"]


def test_scripts_without_spaces_give_one_word_per_character():
    assert words("東京タワー") == ["東", "京", "タ", "ワ", "ー"]
    assert words("สวัสดี")[0] == "ส"
    assert words("Ελληνικά κείμενα") == ["ελληνικά", "κείμενα"]
    assert words("مرحبا بالعالم") == ["مرحبا", "بالعالم"]


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=200))
def test_ascii_fast_path_agrees_with_unicode_path(text):
    """The byte-translate fast path and the regex path are two routes to the same words."""
    assert words(text) == [w.decode() for w in [x.encode() for x in features._WORD_RE.findall(text.lower())]]


def test_word_hash_is_seeded_xxh3():
    assert int(word_hashes("Word")[0]) == xxhash.xxh3_64_intdigest(b"word", FEATURE_SEED)


def test_cache_never_changes_results():
    text = "the cache must not matter the cache"
    first = word_hashes(text).copy()
    features._CACHE.clear()
    assert (word_hashes(text) == first).all()


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


@given(st.text(max_size=300))
def test_fast_split_equals_the_word_rule_on_any_text(text):
    """The mixed fast path (bytes split, regex on non-ASCII tokens) is the regex rule itself."""
    assert words(text) == features._WORD_RE.findall(text.lower())


def test_mostly_ascii_text_with_unicode_punctuation():
    assert words("modules¶ — “quoted” café") == ["modules", "quoted", "café"]
