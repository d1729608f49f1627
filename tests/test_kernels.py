"""The compiled kernels and the numpy path give the same bits, and both follow the documented rules.

Corpus: the golden page, the licence texts Debian ships, and hypothesis batches of texts made of
non-ASCII words, scripts without spaces, the two characters ``str.lower`` treats specially
("İ", "Σ"), emoji and other characters beyond U+FFFF, lone surrogates, digits, underscores,
long words and empty texts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.fingerprinting import kernels
from streamdedup.fingerprinting.features import (
    FEATURE_SEED,
    WORD_MUL,
    mix64,
    shingle_hashes_many,
    split_counts,
    word_hashes_many,
    words,
)
from streamdedup.fingerprinting.minhash import minhash_signatures, minhash_signatures_flat
from streamdedup.fingerprinting.pages import Fingerprints
from streamdedup.fingerprinting.simhash import simhash_flat, simhash_many
from streamdedup.fingerprinting.text import visible_text
from streamdedup.fingerprinting.tokens import CLASS_SHIFT, LOW_MASK, NOSPACE_CHAR, SEPARATOR, WORD, WORD_RE, table

M64 = (1 << 64) - 1
DATA = Path(__file__).parent / "data" / "html"
LICENSES = Path("/usr/share/common-licenses")


def golden_texts() -> list[str]:
    texts = [visible_text((DATA / "blog_post.html").read_bytes(), "text/html")]
    texts += [(LICENSES / n).read_text(encoding="utf-8") for n in ("GPL-3", "Apache-2.0", "BSD", "MPL-2.0")]
    texts += ["The quick brown fox jumps over the lazy dog. Ça va? 東京は晴れ", "", "Même page, 同じページ 🚀"]
    return texts


PIECES = [
    "ΟΔΟΣ", "Σίσυφος", "İstanbul", "ıi", "東京タワー", "สวัสดีครับ", "😀", "👩‍👩‍👧", "𠀀𠀁", "𝐀𝐁𝐂",
    "x_y", "__", "123", "3.14", "ǅungla", "ß", "ﬁne", "\ud800", "\udcff", "\ud83d\ude00", "Ünïcödé",
    "a" * 300, "Ж" * 70, "\u0307", "\u00a0", "\t\n", "¶", "—", "中文字", "ﾃｽﾄ", "٣٤", "Ⅻ", "½",
]  # fmt: skip
piece_texts = st.lists(st.sampled_from(PIECES) | st.text(max_size=12), max_size=12).map(
    lambda parts: " ".join(parts) if len(parts) % 2 else "".join(parts)
)
any_text = piece_texts | st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=60)
batches = st.lists(any_text, max_size=6)


def py_word_hash(word: str) -> int:
    h = FEATURE_SEED
    for ch in word:
        h = (h * WORD_MUL + ord(ch)) & M64
    return int(mix64(np.array([h], dtype=np.uint64))[0])


def py_shingles(hashes: list[int], n: int) -> list[int]:
    """features.shingle_hashes' documented rule, in plain Python integers."""
    mul = 0x9E3779B97F4A7C15

    def combine(part: list[int]) -> int:
        acc = 0
        for h in part:
            acc = (acc * mul + h) & M64
        return int(mix64(np.array([acc], dtype=np.uint64))[0])

    if not hashes:
        return []
    if len(hashes) < n:
        return [combine(hashes)]
    return [combine(hashes[i : i + n]) for i in range(len(hashes) - n + 1)]


def both_paths(texts: list[str]) -> None:
    """C == numba == numpy at every stage, and all == the documented rules in plain Python."""
    fast = word_hashes_many(texts, compiled=True)
    ref = word_hashes_many(texts, compiled=False)
    c = word_hashes_many(texts)  # the C loop (test_the_c_word_hashes_are_built_here)
    assert fast[0].dtype == ref[0].dtype == c[0].dtype == np.uint64 and c[1].dtype == np.int64
    assert fast[0].tolist() == ref[0].tolist() and fast[1].tolist() == ref[1].tolist()
    assert c[0].tolist() == ref[0].tolist() and c[1].tolist() == ref[1].tolist()
    assert c[0].flags.writeable and c[1].flags.writeable  # as the other paths' arrays
    expected = [[py_word_hash(w) for w in words(t)] for t in texts]
    assert [a.tolist() for a in split_counts(*ref)] == expected
    for n in (1, 2, 3, 4):
        s_fast = shingle_hashes_many(*fast, n, compiled=True)
        s_ref = shingle_hashes_many(*ref, n, compiled=False)
        assert s_fast[0].tolist() == s_ref[0].tolist() and s_fast[1].tolist() == s_ref[1].tolist()
        assert [a.tolist() for a in split_counts(*s_ref)] == [py_shingles(e, n) for e in expected]
    s = shingle_hashes_many(*ref, 3)
    for num_perm, seed in ((128, 1), (5, 7)):  # 5: the kernel's four-at-a-time loop and its tail
        sig_fast = minhash_signatures_flat(*s, num_perm, seed, compiled=True)
        sig_ref = minhash_signatures_flat(*s, num_perm, seed, compiled=False)
        assert sig_fast.tolist() == sig_ref.tolist()


def test_the_kernels_are_compiled_here():
    assert kernels.available()  # numba is a dependency; the fallback is tested in a subprocess below


def test_the_c_word_hashes_are_built_here():
    # `make install` installs gcc first; without a compiler the numba kernel does the same (below)
    assert kernels.c_words() is not None, "streamdedup/fingerprinting/_words.c was not built: pip install -e . again"


@pytest.mark.parametrize("value, c, numba", [("numba", False, True), ("numpy", False, False), ("", True, True)])
def test_the_kernels_switch(value, c, numba):
    # README: STREAMDEDUP_KERNELS=numba picks the numba word kernel where the C one is built too;
    # kernels.py: =numpy the numpy path for everything.  The same fingerprints either way.
    code = (
        "import json; from streamdedup.fingerprinting import kernels; "
        "from streamdedup.fingerprinting.pages import simhash_texts; "
        "print(json.dumps([kernels.c_words() is not None, kernels.available(), "
        "simhash_texts(['Ünïcödé words and more words', 'ascii text here']).tolist()]))"
    )
    env = {"PATH": "", "PYTHONPATH": ":".join(sys.path), "STREAMDEDUP_KERNELS": value}
    got = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    )
    want = Fingerprints(["Ünïcödé words and more words", "ascii text here"]).simhash.tolist()
    assert got == [c, numba, want]


def test_c_word_hashes_refuse_what_is_not_a_text():
    c = kernels.c_words()
    with pytest.raises(TypeError, match="texts must be str, not bytes"):
        c.word_hashes(["a", b"b"], table()[:0x10000], None, FEATURE_SEED, WORD_MUL)
    with pytest.raises(ValueError, match="at least 65536"):
        c.word_hashes(["a"], table()[:100], None, FEATURE_SEED, WORD_MUL)
    with pytest.raises(ValueError, match="at least 1114112"):
        c.word_hashes(["😀"], table()[:0x10000], table()[:0x10000], FEATURE_SEED, WORD_MUL)
    assert c.word_hashes(["😀"], table()[:0x10000], None, FEATURE_SEED, WORD_MUL) is None  # asks for the table


def test_golden_texts_agree_bit_for_bit():
    texts = golden_texts()
    both_paths(texts)
    both_paths([t for t in texts if t.isascii()])  # the uint8 batch
    both_paths([t for t in texts if t.isascii() or max(t) <= "\uffff"])  # the uint16 batch


@settings(max_examples=300, deadline=None)
@given(batches)
def test_any_batch_agrees_bit_for_bit(texts):
    both_paths(texts)


@settings(max_examples=100, deadline=None)
@given(batches)
def test_a_batch_is_its_texts_one_by_one(texts):
    hashes, counts = word_hashes_many(texts)
    assert [a.tolist() for a in split_counts(hashes, counts)] == [word_hashes_many([t])[0].tolist() for t in texts]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, M64), max_size=40), max_size=5), st.integers(1, 20))
def test_minhash_paths_agree_on_any_integers(sets, num_perm):
    arrays = [np.array(s, dtype=np.uint64) for s in sets]
    fast = minhash_signatures(arrays, num_perm, compiled=True)
    assert fast.tolist() == minhash_signatures(arrays, num_perm, compiled=False).tolist()


def test_table_follows_str_lower_and_the_word_rule_on_every_code_point():
    t = table()
    low = (t & LOW_MASK).tolist()
    cls = (t >> CLASS_SHIFT).tolist()
    for c in range(0x110000):
        if c in (0x130, 0x3A3):  # the two contextual ones: their texts are lower-cased by str.lower
            continue
        lower = chr(c).lower()
        assert chr(low[c]) == lower, hex(c)
        # one character of the rule: a word character also makes a word of two; a no-space one does not
        want = SEPARATOR if not WORD_RE.fullmatch(lower) else WORD if WORD_RE.fullmatch(lower * 2) else NOSPACE_CHAR
        assert cls[c] == want, hex(c)


def test_the_bmp_table_is_a_prefix_of_the_full_one():
    bmp = table(np.zeros(1, np.uint16))
    assert len(bmp) == 0x10000 and (bmp == table()[: len(bmp)]).all()
    assert table(np.zeros(1, np.uint8)) is bmp and len(table(np.zeros(1, np.uint32))) == 0x110000


def test_contextual_lower_case_is_exact():
    # final sigma and the dotted capital I: the words are those of str.lower
    for text in ("ΟΔΟΣ ΟΔΟΣ.", "ΣΑΣ", "İSTANBUL İ", "aİb"):
        both_paths([text, "plain"])


_NO_NUMBA = """
import json, sys
sys.modules["numba"] = None  # as if numba were not installed
from streamdedup.fingerprinting import kernels
from streamdedup.fingerprinting.pages import Fingerprints
texts = json.loads(sys.stdin.read())
f = Fingerprints(texts)
print(json.dumps({"available": kernels.available(), "simhash": f.simhash.tolist(), "minhash": f.minhash.tolist()}))
"""


@pytest.mark.parametrize("how", ["import-blocked", "environment"])
def test_without_numba_the_same_bits(how):
    texts = golden_texts()
    code = _NO_NUMBA if how == "import-blocked" else _NO_NUMBA.replace('sys.modules["numba"] = None', "")
    env = {"PATH": "", "PYTHONPATH": ":".join(sys.path)}
    if how == "environment":
        env["STREAMDEDUP_KERNELS"] = "numpy"
    got = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True, check=True, env=env
    )
    out = json.loads(got.stdout)
    f = Fingerprints(texts)
    assert out["available"] is False
    assert out["simhash"] == f.simhash.tolist() and out["minhash"] == f.minhash.tolist()


def py_simhash_log_tf(features: list[int]) -> int:
    """Scheme 2's simhash rule in plain Python: distinct features weighted 1 + floor(log2 tf)."""
    tf = Counter(features)
    total = sum(c.bit_length() for c in tf.values())
    ones = [sum(c.bit_length() for f, c in tf.items() if f >> b & 1) for b in range(64)]
    return sum(1 << b for b in range(64) if 2 * ones[b] > total)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, M64) | st.sampled_from([0, 1, 2**63, M64]), max_size=40), max_size=5))
def test_simhash_kernel_follows_the_scheme_2_rule(pages):
    fast = kernels.compiled()
    assert fast is not None
    flat = np.array([f for p in pages for f in p], dtype=np.uint64)
    counts = np.array([len(p) for p in pages], dtype=np.int64)
    expected = [py_simhash_log_tf(p) for p in pages]
    assert fast.simhash_log_tf(flat, counts).tolist() == expected
    # the numpy path (simhash_many) and the dispatcher the product calls give the same bits
    assert simhash_many([np.array(p, dtype=np.uint64) for p in pages]).tolist() == expected
    assert simhash_flat(flat, counts).tolist() == expected
    with kernels.numpy_only():
        assert simhash_flat(flat, counts).tolist() == expected
