"""The worker's fingerprinting processes: a process pool that dies with the worker.

A pool process whose worker is SIGKILLed would otherwise wait on its task queue for good;
each one watches its parent and exits when the parent is gone.
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


def fingerprint_pool(processes: int) -> ProcessPoolExecutor:
    """``processes`` spawned (not forked: the worker has threads by then) and already starting."""
    pool = ProcessPoolExecutor(
        processes, mp_context=multiprocessing.get_context("spawn"), initializer=_watch_parent, initargs=(os.getpid(),)
    )
    pool.submit(int)  # start the processes now, not on the first batch
    return pool
