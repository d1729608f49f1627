"""Which path computes features and signatures: the compiled numba kernels, or numpy.

The kernels (:mod:`streamdedup.fingerprinting.numba_kernels`) are used when numba can be
imported; both paths give the same bits.  Word hashes have a third path, in C
(``_words.c``, built at install where a C compiler is found): it reads each text where Python
keeps it instead of a copy as code units, with the same bits again; :func:`c_words` gives it.

numba is imported on first use, not when the package is imported, so commands that never
fingerprint do not pay for it (about 0.3 s, more on a busy machine), and a numba that fails to
import (for example one built for an older numpy) means the numpy path, not an error.  ``STREAMDEDUP_KERNELS=numpy`` in the environment,
or :func:`numpy_only`, forces the numpy path; ``STREAMDEDUP_KERNELS=numba`` leaves the C word
hashes out (for comparing).

``python -m streamdedup.fingerprinting.warmup`` compiles every kernel into numba's on-disk
cache (``make install`` runs it), so that the first ``scan`` or worker batch on a fresh
machine does not wait for the compiler.

>>> with numpy_only():
...     available()
False
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = ["available", "c_words", "compiled", "numpy_only", "warm_up"]

_loaded: list[ModuleType | None] = []  # empty until the first attempt
_c_loaded: list[ModuleType | None] = []
_forced_off = 0


def compiled() -> ModuleType | None:
    """The kernel module, or None when the numpy path is to be used."""
    if _forced_off:
        return None
    if not _loaded:
        module = None
        if os.environ.get("STREAMDEDUP_KERNELS", "").lower() != "numpy":
            try:
                module = importlib.import_module("streamdedup.fingerprinting.numba_kernels")
            except ImportError:  # no numba, or one that does not work with this numpy
                module = None
        _loaded.append(module)
    return _loaded[0]


def c_words() -> ModuleType | None:
    """The C word hashes (``_words.c``), or None: not built, or turned off as :func:`compiled` is,
    or by ``STREAMDEDUP_KERNELS=numba``."""
    if _forced_off:
        return None
    if not _c_loaded:
        module = None
        if os.environ.get("STREAMDEDUP_KERNELS", "").lower() not in ("numpy", "numba"):
            try:
                module = importlib.import_module("streamdedup.fingerprinting._words")
            except ImportError:  # built without a C compiler
                module = None
        _c_loaded.append(module)
    return _c_loaded[0]


def available() -> bool:
    """True when the compiled kernels are used."""
    return compiled() is not None


@contextmanager
def numpy_only() -> Iterator[None]:
    """Use the numpy path inside the block (for comparisons and benchmarks)."""
    global _forced_off
    _forced_off += 1
    try:
        yield
    finally:
        _forced_off -= 1


def warm_up() -> bool:
    """Compile (or load from the cache) every kernel, for ASCII, BMP and astral texts alike."""
    if not available():
        return False
    from streamdedup.fingerprinting.features import word_hashes_many
    from streamdedup.fingerprinting.pages import Fingerprints  # here: pages imports this module

    for texts in (["ascii words"], ["Wörter, 東京"], ["emoji 😀 words"]):
        word_hashes_many(texts, compiled=True)  # (the numba word kernel, where the C one is used)
        fingerprints = Fingerprints(texts)
        fingerprints.minhash  # noqa: B018
        fingerprints.cluster_keys()
    return True
