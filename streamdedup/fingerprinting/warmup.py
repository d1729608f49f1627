"""``python -m streamdedup.fingerprinting.warmup``: compile the numba kernels into their on-disk cache.

Run once after installing (``make install`` does), so that the first batch of the first
``scan`` or worker does not wait for the compiler (tens of seconds on a busy 2-core machine).
"""

from __future__ import annotations

from streamdedup.fingerprinting.kernels import warm_up

if __name__ == "__main__":
    print("numba kernels compiled and cached" if warm_up() else "numba is not available: the numpy path is used")
