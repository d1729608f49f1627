"""The bottom-n cluster key: its definition, both paths, and P(equal key) against Jaccard."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streamdedup
from streamdedup.engine.dedup import Deduplicator
from streamdedup.errors import SettingsError
from streamdedup.fingerprinting import kernels
from streamdedup.fingerprinting.cluster import (
    DEFAULT_CLUSTER_N,
    cluster_key_of,
    cluster_keys_flat,
    cluster_keys_texts,
)
from streamdedup.fingerprinting.features import text_shingles
from streamdedup.settings import Settings
from streamdedup.stream.check import judge_body

M64 = (1 << 64) - 1
FOX = "the quick brown fox jumps over the lazy dog"
CITY = "Ça va? 東京 is a city; it has 14 million people and many trains"


def py_key(shingles: list[int], n: int) -> int | None:
    """The documented rule in plain Python: XOR of the n smallest distinct values."""
    if n == 0 or not shingles:
        return None
    key = 0
    for v in sorted(set(shingles))[:n]:
        key ^= v
    return key


@pytest.mark.parametrize(
    "text, n, key",
    [
        (FOX, 1, "159fffb510f2f560"),
        (FOX, 4, "44082b30002bb952"),
        (FOX, 8, "fa5d22b910b96fbd"),
        (CITY, 1, "0381655427607f6e"),
        (CITY, 4, "2f0a01e346d64160"),
        (CITY, 8, "eb057ccddf6a86de"),
        ("two words", 4, "284ffebbfd860005"),  # one shingle: the key is that shingle's hash
    ],
)
def test_golden_keys(text, n, key):
    """Pinned: a change here changes every key a downstream job has stored."""
    assert f"{streamdedup.cluster_key(text, 'text/plain', n=n):016x}" == key
    assert py_key(text_shingles(text).tolist(), n) == int(key, 16)


def test_the_key_is_the_same_in_another_process():
    import subprocess
    import sys

    code = f"import streamdedup; print(streamdedup.cluster_key({FOX!r}, 'text/plain'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == streamdedup.cluster_key(FOX, "text/plain")


def test_equal_texts_and_markup_only_changes_give_equal_keys():
    html = "<html><body><nav>Home</nav><p>The quick <b>brown</b> fox</p><p>jumps over the lazy dog</p></body></html>"
    restyled = html.replace("<p>", "<p class='big' style='x'>").replace("<b>", "<strong>").replace("</b>", "</strong>")
    assert streamdedup.cluster_key(html) == streamdedup.cluster_key(restyled) is not None
    assert streamdedup.cluster_key(html) == streamdedup.cluster_key(html)
    # word order matters (shingles are ordered): the same words reversed share no shingle
    assert streamdedup.cluster_key(FOX, "text/plain") != streamdedup.cluster_key(
        " ".join(reversed(FOX.split())), "text/plain"
    )


def test_no_words_no_key_and_n_zero_turns_keys_off():
    assert streamdedup.cluster_key("--- !!! ---", "text/plain") is None
    assert streamdedup.cluster_key(FOX, "text/plain", n=0) is None
    keys, has = cluster_keys_flat(np.array([1, 2], np.uint64), np.array([2, 0]), n=0)
    assert has.tolist() == [False, False]
    assert cluster_keys_texts(["", FOX, "..."]) == [None, streamdedup.cluster_key(FOX, "text/plain"), None]


def test_a_page_with_fewer_than_n_shingles_xors_all_of_them():
    shingles = text_shingles("one two three four")  # 2 shingles
    assert cluster_key_of(shingles, 8) == int(shingles[0]) ^ int(shingles[1]) == cluster_key_of(shingles, 2)


def test_repeats_do_not_count():
    shingles = text_shingles("a b c a b c a b c d e f")
    assert cluster_key_of(shingles, 3) == py_key(shingles.tolist(), 3)
    assert cluster_key_of(np.repeat(shingles, 3), 3) == cluster_key_of(shingles, 3)


@pytest.mark.parametrize("bad", [-1, 65, 2.5, True, "4"])
def test_a_bad_n_is_refused_with_what_is_accepted(bad):
    with pytest.raises(ValueError, match=r"cluster n must be a whole number in 0\.\.64, e\.g\. 4"):
        cluster_keys_flat(np.array([1], np.uint64), np.array([1]), n=bad)
    with pytest.raises(ValueError, match="cluster n"):
        Deduplicator(cluster_n=bad)


def test_settings_cluster_n():
    assert Settings().cluster_n == DEFAULT_CLUSTER_N
    assert Settings.from_sources({}, {"STREAMDEDUP_CLUSTER_N": "8"}).cluster_n == 8
    assert Settings.from_sources({"cluster_n": "0"}, {"STREAMDEDUP_CLUSTER_N": "8"}).cluster_n == 0
    with pytest.raises(SettingsError, match=r"--cluster-n / STREAMDEDUP_CLUSTER_N: 65 is out of range; use e\.g\. 4"):
        Settings.from_sources({"cluster_n": "65"}, {})
    with pytest.raises(SettingsError, match="--cluster-n / STREAMDEDUP_CLUSTER_N: 'four' is not a whole number"):
        Settings.from_sources({}, {"STREAMDEDUP_CLUSTER_N": "four"})


values = st.integers(0, M64) | st.sampled_from([0, 1, 2**63, M64])


@given(st.lists(st.lists(values, max_size=30), max_size=6), st.integers(0, 12))
def test_both_paths_follow_the_rule_on_any_integers(pages, n):
    counts = np.array([len(p) for p in pages], dtype=np.int64)
    flat = np.array([v for p in pages for v in p], dtype=np.uint64)
    expected = [py_key(p, n) for p in pages]
    for compiled in (False, True):
        keys, has = cluster_keys_flat(flat, counts, n, compiled=compiled)
        assert [int(k) if h else None for k, h in zip(keys, has)] == expected


def test_the_compiled_path_is_used_here_and_agrees_on_a_big_batch():
    assert kernels.available()  # numba is a dependency: the test above compared two paths
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 2000, size=300)
    flat = rng.integers(0, 5000, size=int(counts.sum())).astype(np.uint64)  # many repeats
    for n in (1, 4, 16):
        a = cluster_keys_flat(flat, counts, n, compiled=False)
        b = cluster_keys_flat(flat, counts, n, compiled=True)
        assert (a[0] == b[0]).all() and (a[1] == b[1]).all()


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("union, inter", [(100, 90), (100, 80), (60, 30)])
def test_p_equal_key_follows_jaccard(n, union, inter):
    """Pairs of random sets with |A ∪ B| = union and |A ∩ B| = inter: P(equal) = C(inter, n) / C(union, n)
    (~ J**n), checked over 3,000 pairs within 5 standard deviations."""
    rng = np.random.default_rng(1000 * n + union + inter)
    trials = 3000
    values = rng.integers(0, M64, size=(trials, union), dtype=np.uint64, endpoint=True)
    only = (union - inter) // 2  # the rest of the union split between A and B
    a = values[:, : inter + only]
    b = np.concatenate([values[:, :inter], values[:, inter + only :]], axis=1)
    keys_a, _ = cluster_keys_flat(a.ravel(), np.full(trials, a.shape[1]), n)
    keys_b, _ = cluster_keys_flat(b.ravel(), np.full(trials, b.shape[1]), n)
    p = math.comb(inter, n) / math.comb(union, n)
    measured = float(np.mean(keys_a == keys_b))
    assert abs(measured - p) <= 5 * math.sqrt(p * (1 - p) / trials) + 1e-9
    j = inter / union
    assert p <= j**n and (n == 1 or p < j**n)  # a little below J**n for small sets, as documented


def test_deduplicator_verdicts_carry_the_key():
    texts = [FOX, FOX, CITY, "?!"]
    verdicts = Deduplicator(cluster_n=4).process(["a", "b", "c", "d"], ["u"] * 4, texts)
    assert [v.cluster for v in verdicts] == cluster_keys_texts(texts, 4)
    assert verdicts[0].cluster == verdicts[1].cluster and verdicts[3].cluster is None
    assert verdicts[0].to_dict()["cluster"] == f"{verdicts[0].cluster:016x}"
    assert [v.cluster for v in Deduplicator(cluster_n=0).process(["a"], ["u"], [FOX])] == [None]
    minhash = Deduplicator("minhash", cluster_n=2).process(["a", "b"], ["u", "v"], [FOX, FOX])
    assert [v.cluster for v in minhash] == cluster_keys_texts([FOX, FOX], 2)


def test_a_check_body_gets_the_key():
    body = b'{"url": "http://a/", "content": "<p>the quick brown fox jumps over the lazy dog</p>"}'
    assert judge_body(body, 1 << 20, 0).cluster == streamdedup.cluster_key(FOX, "text/plain")
    assert judge_body(body, 1 << 20, 0, 8).cluster == streamdedup.cluster_key(FOX, "text/plain", n=8)
    assert judge_body(body, 1 << 20, 0, 0).cluster is None


def test_intake_keeps_the_key_with_the_waiting_page_and_routing_emits_it():
    from streamdedup.index.tables import TableDesign
    from streamdedup.pipeline.intake import Intake, Record
    from streamdedup.pipeline.pending import Pending
    from streamdedup.pipeline.routing import Topics, outputs
    from streamdedup.pipeline.shard import ShardPlan

    plan = ShardPlan(TableDesign.named("16"), partitions=3)
    page = b'{"url": "http://a/", "content": "<p>the quick brown fox jumps over the lazy dog</p>"}'
    copy = b'{"url": "http://b/", "content": "<div>The quick brown fox jumps over the lazy dog!</div>"}'
    empty = b'{"url": "http://c/", "content": "<p>?!</p>"}'  # no words: an "empty" dead letter
    records = [Record(0, i, None, v) for i, v in enumerate([page, b"{bad", copy, empty])]
    for n, expected in ((4, streamdedup.cluster_key(FOX, "text/plain")), (0, None)):
        pending = Pending(plan.n_groups)
        intake = Intake.read(records, pending, plan, 1 << 20, cluster_n=n)
        waiting = [pending.waiting(r) for r in _requests(intake)]
        assert [(w.page_id, w.cluster) for w in waiting if w is not None] == [
            ("http://a/", expected),
            ("http://b/", expected),
        ]  # http://c/ has no words: a dead letter (empty), not a page without a key
        headers = dict(outputs(waiting[0], Topics())[0].headers) if n else {}
        assert headers.get("streamdedup-cluster") == (f"{expected:016x}".encode() if n else None)


def _requests(intake) -> list[int]:
    """The request ids of an intake's probes, in page order."""
    seen: dict[int, None] = {}
    for batch in intake.probes.values():
        for r in batch.rows["request"].tolist():
            seen[r] = None
    return sorted(seen)
