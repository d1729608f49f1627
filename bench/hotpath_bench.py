"""The fingerprint hot path on one core: visible text -> simhash, and -> MinHash-128, against Rust libraries.

    python bench/hotpath_bench.py [--corpus bench/data] [--runs 7] [--limit 2000] [--cpu 0]
    python bench/hotpath_bench.py --jit          # numba import, compile and cache-load times (subprocesses)
    python bench/hotpath_bench.py --profile      # time per stage of the two paths

Every rate is measured in the same run as the others, on the same texts, pinned to one CPU,
so that the ratios mean something on a shared, loaded machine: the options take turns at
every batch.  The script prints one JSON line per run (texts per second and ratios), then for
each figure its median and its spread (min..max over runs).  Needs ``pip install -e '.[bench]'`` (gaoya, rensa, numba)
and the corpus of ``python bench/corpus.py``.

What is timed (texts in batches of 256, as ``scan`` and the worker do):

``split``            ``[t.lower().split() for t in texts]``
``simhash``          ``simhash_texts(batch)``: words, bigram shingles, simhash (the product path;
                     compiled kernels when numba is installed)
``simhash_numpy``    the same with the kernels switched off (the pure-numpy path, same bits)
``simhash_xxh3``     the previous scheme's path: xxh3-64 per distinct word through a dict cache
                     (bytes.translate + split for ASCII, a regex for non-ASCII tokens), numpy shingles
``simhash_kernels``  words, bigram shingles and the scheme-2 accumulation kernel
                     (``numba_kernels.simhash_log_tf``), called directly; since the merge of
                     scheme 2 this is what ``simhash`` does too (simhash.py calls the kernel)
``gaoya``            gaoya's ``SimHash64StringIntIndex(analyzer="word", lowercase=True,
                     ngram_range=(2, 2)).doc2signature(t)`` per text (Rust)
``minhash``          words, trigram shingles and 128-permutation signatures of a batch
                     (``word_hashes_many``, ``shingle_hashes_many``, ``minhash_signatures_flat``)
``minhash_numpy``    the same with the kernels switched off
``rensa``            ``m = RMinHash(128, seed=1); m.update(t.split()); m.digest()`` per text (Rust)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from streamdedup.fingerprinting import kernels
from streamdedup.fingerprinting.features import (
    FEATURE_SEED,
    WORD_MUL,
    shingle_hashes,
    shingle_hashes_many,
    split_counts,
    word_hashes_many,
)
from streamdedup.fingerprinting.minhash import minhash_signatures_flat
from streamdedup.fingerprinting.pages import MINHASH_WORDS, SIMHASH_WORDS, Fingerprints, simhash_texts
from streamdedup.fingerprinting.simhash import simhash_many
from streamdedup.fingerprinting.tokens import NOSPACE, encode_batch
from streamdedup.fingerprinting.tokens import table as _table

BATCH = 256
_SEED, _WMUL = np.uint64(FEATURE_SEED), np.uint64(WORD_MUL)


def load(path: Path, limit: int) -> list[str]:
    with path.open() as f:
        return [json.loads(line)["content"] for _, line in zip(range(limit), f)]


def batched(items: list, size: int = BATCH) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# ---- the previous scheme's word path (xxh3 per word), kept here only to measure it ----------
_ASCII = bytes((ord(chr(c).lower()) if chr(c).isalnum() else 0x20) if c < 128 else c for c in range(256))
_WORD_RE = re.compile(rf"[{NOSPACE}]|[^\W_{NOSPACE}]+")
_HIGH = re.compile(rb"[\x80-\xff]")
_CACHE: dict[bytes, int] = {}


def _xxh3_word_bytes(text: str) -> list[bytes]:
    if text.isascii():
        return text.encode("ascii").translate(_ASCII).split()
    data = text.lower().encode("utf-8", "surrogatepass").translate(_ASCII)
    out: list[bytes] = []
    pos = 0
    while (m := _HIGH.search(data, pos)) is not None:
        start = data.rfind(b" ", pos, m.start()) + 1
        end = data.find(b" ", m.end())
        end = len(data) if end < 0 else end
        out += data[pos:start].split()
        out += [
            w.encode("utf-8", "surrogatepass")
            for w in _WORD_RE.findall(data[start:end].decode("utf-8", "surrogatepass"))
        ]
        pos = end
    out += data[pos:].split()
    return out


def xxh3_word_hashes(text: str) -> np.ndarray:
    toks = _xxh3_word_bytes(text)
    for tok in set(toks).difference(_CACHE):
        _CACHE[tok] = xxhash.xxh3_64_intdigest(tok, FEATURE_SEED)
    return np.fromiter(map(_CACHE.__getitem__, toks), dtype=np.uint64, count=len(toks))


def simhash_xxh3(texts: list[str]) -> np.ndarray:
    return simhash_many([shingle_hashes(xxh3_word_hashes(t), SIMHASH_WORDS) for t in texts])


# ---- one run -------------------------------------------------------------------------------


def minhash_texts(texts: list[str]) -> np.ndarray:
    """Text -> MinHash-128 signatures of a batch, and nothing else."""
    return minhash_signatures_flat(*shingle_hashes_many(*word_hashes_many(texts), MINHASH_WORDS), 128)


def simhash_kernels(texts: list[str]) -> np.ndarray:
    """Text -> simhash with every stage compiled (the scheme-2 accumulation kernel)."""
    fast = kernels.compiled()
    assert fast is not None
    return fast.simhash_log_tf(*shingle_hashes_many(*word_hashes_many(texts), SIMHASH_WORDS))


def one_run(texts: list[str], gaoya_index, rensa_cls) -> dict[str, float]:
    """Texts per second of every option, measured batch by batch in turn.

    Options alternate at every batch of 256 texts (a fraction of a second each), so a change
    of load on the shared machine hits all of them alike and the ratios stay meaningful.
    """

    def split(b: list[str]) -> None:
        for t in b:
            t.lower().split()

    def sim_numpy(b: list[str]) -> None:
        with kernels.numpy_only():
            simhash_texts(b)

    def min_numpy(b: list[str]) -> None:
        with kernels.numpy_only():
            minhash_texts(b)

    def gaoya(b: list[str]) -> None:
        for t in b:
            gaoya_index.doc2signature(t)

    def rensa(b: list[str]) -> None:
        for t in b:
            m = rensa_cls(128, 1)
            m.update(t.split())
            m.digest()

    options: dict[str, Callable[[list[str]], object]] = {
        "split": split,
        "simhash": simhash_texts,
        "simhash_numpy": sim_numpy,
        "simhash_xxh3": simhash_xxh3,
        "simhash_kernels": simhash_kernels,
        "gaoya": gaoya,
        "minhash": minhash_texts,
        "minhash_numpy": min_numpy,
        "rensa": rensa,
    }
    spent = dict.fromkeys(options, 0.0)
    for b in batched(texts):
        for name, fn in options.items():
            t0 = time.perf_counter()
            fn(b)
            spent[name] += time.perf_counter() - t0
    out = {name: len(texts) / t for name, t in spent.items()}
    for key in ("simhash", "simhash_numpy", "simhash_xxh3", "simhash_kernels"):
        out[f"{key}_vs_gaoya"] = out[key] / out["gaoya"]
        out[f"{key}_vs_split"] = out[key] / out["split"]
    for key in ("minhash", "minhash_numpy"):
        out[f"{key}_vs_rensa"] = out[key] / out["rensa"]
    return out


def profile(texts: list[str], runs: int) -> None:
    """Where the time of text -> simhash and text -> MinHash goes, stage by stage (best of runs)."""
    batches = batched(texts)
    enc = [encode_batch(b) for b in batches]
    words = [word_hashes_many(b) for b in batches]
    sh2 = [shingle_hashes_many(*w, SIMHASH_WORDS) for w in words]
    sh3 = [shingle_hashes_many(*w, MINHASH_WORDS) for w in words]
    parts = [split_counts(*s) for s in sh2]
    fast = kernels.compiled()
    assert fast is not None, "the profile times the compiled kernels: pip install numba"
    stages: dict[str, Callable[[], object]] = {
        "split (str.lower().split())": lambda: [t.lower().split() for t in texts],
        "encode (code points, tokens.encode_batch)": lambda: [encode_batch(b) for b in batches],
        "word kernel (after encode)": lambda: [
            fast.word_hashes(e.codes, e.bounds, _table(e.codes), _SEED, _WMUL) for e in enc
        ],
        "bigram shingles": lambda: [shingle_hashes_many(*w, SIMHASH_WORDS) for w in words],
        "split_counts (per-page views)": lambda: [split_counts(*s) for s in sh2],
        "simhash_many (accumulation, simhash.py)": lambda: [simhash_many(p) for p in parts],
        "accumulation kernel (scheme 2)": lambda: [fast.simhash_log_tf(*s) for s in sh2],
        "trigram shingles": lambda: [shingle_hashes_many(*w, MINHASH_WORDS) for w in words],
        "minhash signatures (after shingles)": lambda: [minhash_signatures_flat(*s, 128) for s in sh3],
    }
    best = {}
    for name, fn in stages.items():
        fn()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    base = best["split (str.lower().split())"]
    for name, t in best.items():
        print(f"{name:45s} {1e6 * t / len(texts):8.1f} us/text  {t / base:6.3f} x split's time")


# ---- JIT costs -----------------------------------------------------------------------------

_JIT_PROBE = """
import time
t0 = time.perf_counter()
import numba  # noqa: F401
t1 = time.perf_counter()
from streamdedup.fingerprinting.pages import Fingerprints
import numpy as np
from streamdedup.fingerprinting.tokens import table
table(np.zeros(1, np.uint16))
t2 = time.perf_counter()
f = Fingerprints(["a first text, with words", "ein zweiter Text, mit Wörtern"])
f.minhash
t3 = time.perf_counter()
Fingerprints(["ascii only"]).minhash
t4 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f} {t4 - t3:.3f}")
"""


def jit_times() -> None:
    """import numba; the code-point table; first batch (compile or cache load) in fresh processes."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(sys.path))
        for label in ("cold (empty cache: compiles)", "warm (cache written by the run before)", "warm again"):
            got = subprocess.run(
                [sys.executable, "-c", _JIT_PROBE], env=env, capture_output=True, text=True, check=True
            )
            imp, tab, first, second = got.stdout.split()
            print(
                f"{label}: import numba {imp} s, code-point table (BMP) {tab} s, "
                f"first batch (UTF-16 kernels) {first} s, first ASCII batch {second} s"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path("bench/data"))
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--limit", type=int, default=2000, help="pages to use")
    p.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the first allowed)")
    p.add_argument("--jit", action="store_true", help="measure numba's import/compile/cache-load times instead")
    p.add_argument("--profile", action="store_true", help="time each stage instead (best of --runs)")
    args = p.parse_args()
    if args.jit:
        jit_times()
        return
    from gaoya.gaoya import simhash as gaoya_simhash
    from rensa import RMinHash

    cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    texts = load(args.corpus / "corpus-text.jsonl", args.limit)
    gaoya_index = gaoya_simhash.SimHash64StringIntIndex(6, 3, "word", True, (2, 2))
    # warm up: compile (or load) the kernels, build the tables, outside the timed runs
    Fingerprints(texts[:BATCH]).minhash  # noqa: B018
    Fingerprints(["ascii"]).minhash  # noqa: B018
    chars = sum(map(len, texts)) / len(texts)
    words = sum(len(t.split()) for t in texts) / len(texts)
    ascii_share = sum(map(str.isascii, texts)) / len(texts)
    print(
        f"# {platform.machine()} pinned to cpu {cpu} of {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}, "
        f"Python {platform.python_version()}, numba kernels: {kernels.available()}; {len(texts)} texts, "
        f"{chars:,.0f} chars and {words:,.0f} words on average, {ascii_share:.0%} all-ASCII; batches of {BATCH}"
    )
    if args.profile:
        profile(texts, args.runs)
        return
    runs = []
    for _ in range(args.runs):
        r = one_run(texts, gaoya_index, RMinHash)
        print(json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
        runs.append(r)
    print(f"# load average after: {os.getloadavg()[0]:.1f}")
    for key in runs[0]:
        vals = [r[key] for r in runs]
        print(f"median {key}: {statistics.median(vals):,.3f}  (min {min(vals):,.3f}, max {max(vals):,.3f})")


if __name__ == "__main__":
    main()
