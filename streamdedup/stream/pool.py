"""The worker's fingerprinting processes: a process pool that dies with the worker.

A pool process whose worker is SIGKILLed would otherwise wait on its task queue for good;
each one watches its parent and exits when the parent is gone.  Each also loads the compiled
fingerprint kernels (about 2 s from numba's cache) and runs one small page through the whole
path as it starts, so the first batch of pages does not wait for them.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

__all__ = ["fingerprint_pool"]


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def _start(parent: int) -> None:
    _watch_parent(parent)
    from streamdedup.fingerprinting.kernels import warm_up
    from streamdedup.pipeline.intake import fingerprint_contents

    warm_up()
    # and the rest of a batch's path (the HTML parser, text extraction), once: the ~20 ms
    # that the first batch of pages would otherwise wait for
    fingerprint_contents([("<html><body><p>warm up</p></body></html>", "text/html", None)])


def fingerprint_pool(processes: int) -> ProcessPoolExecutor:
    """``processes`` spawned (not forked: the worker has threads by then) and already starting."""
    pool = ProcessPoolExecutor(
        processes, mp_context=multiprocessing.get_context("spawn"), initializer=_start, initargs=(os.getpid(),)
    )
    pool.submit(int)  # start the processes now, not on the first batch
    return pool
