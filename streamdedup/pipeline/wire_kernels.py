"""The numba kernel of :meth:`streamdedup.pipeline.wire.Batch.by_group` (imported on first use).

A loop version of its numpy path, giving the same bytes (``tests/test_wire.py`` checks both):
a replay's batches interleave their table groups row by row, and regrouping their strings one
row's bytes at a time is one pass over the blob, where the numpy path makes one per group.

``cache=True``: compiled once per machine (``python -m streamdedup.pipeline.wire_kernels``, and
the worker at its start).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["regroup_strings_into", "warm_up"]


@njit(cache=True, nogil=True)
def regroup_strings_into(
    out: np.ndarray, blob: np.ndarray, sizes: np.ndarray, slot: np.ndarray, group_starts: np.ndarray
) -> None:
    """``blob`` (uint8) holds each row's ``sizes[i]`` bytes in row order; ``out`` (as long as
    ``blob``) gets them by ``slot`` (each row's group rank), rows in order within one: group k's
    bytes start at ``group_starts[k]``.  Releases the GIL: a thread fills it while the caller
    goes on."""
    at = group_starts.copy()
    src = 0
    for i in range(len(sizes)):
        n, k = sizes[i], slot[i]
        dst = at[k]
        out[dst : dst + n] = blob[src : src + n]
        at[k] = dst + n
        src += n


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel now, for the read-only blob of a batch's
    bytes (numba compiles read-only and writable arrays apart)."""
    args = (
        np.frombuffer(b"abc", dtype=np.uint8),
        np.array([1, 2], dtype=np.int64),
        np.array([1, 0], dtype=np.int64),
        np.array([0, 2], dtype=np.int64),
    )
    regroup_strings_into(np.empty(3, dtype=np.uint8), *args)


if __name__ == "__main__":
    warm_up()
    print("the batch regrouping kernel is compiled and cached")
