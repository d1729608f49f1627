"""``python -m streamdedup.index.warmup``: compile the shard index's numba kernels into their
on-disk cache (the fingerprint kernels: ``python -m streamdedup.fingerprinting.warmup``).

Run once after installing (``make install`` does), so that a worker's first start does not
compile them; a worker also loads them as it starts, before its first probe.
"""

from __future__ import annotations

from streamdedup.index.blocks import warm_up

if __name__ == "__main__":
    print("block index kernels compiled and cached" if warm_up() else "numba is not available: the numpy path is used")
