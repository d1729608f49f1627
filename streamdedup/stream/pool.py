"""The worker's fingerprinting processes: a process pool that dies with the worker, and is
started again when one of its processes dies.

A pool process whose worker is SIGKILLed would otherwise wait on its task queue for good;
each one watches its parent and exits when the parent is gone.  Each also loads the compiled
fingerprint kernels (about 2 s from numba's cache) and runs one small page through the whole
path as it starts, so the first batch of pages does not wait for them.

A process can die under the worker (the OOM killer, a crash in a C extension on a hostile
page, an operator's ``kill``).  A ``ProcessPoolExecutor`` is then broken for good: every later
submit raises ``BrokenProcessPool``, which turned every later page into a dead letter until the
worker restarted.  :class:`FingerprintPool` starts new processes at the next submit instead;
the tasks that were running fail with ``BrokenProcessPool`` and their callers run them again
(the worker: :meth:`streamdedup.stream.app.Worker._fingerprint`).  A task that runs past its
deadline (:func:`deadline_seconds`) has its processes killed the same way.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = ["fingerprint_pool", "FingerprintPool", "BrokenProcessPool", "deadline_seconds"]

#: How long fingerprinting may take: a base, and more for each MiB of content.  Pages of a few
#: MiB take well under a second (bench/README.md); a page that takes longer is hostile (lexbor
#: parses an element's attributes in time quadratic in their count: 400,000 of them in one tag,
#: 3 MB, ran for minutes and held up every page behind it).
DEADLINE_SECONDS = 10.0
DEADLINE_SECONDS_PER_MIB = 2.0


def deadline_seconds(content_bytes: int) -> float:
    """The time fingerprinting ``content_bytes`` of pages may take before its process is killed.

    >>> deadline_seconds(0), deadline_seconds(5 << 20)
    (10.0, 20.0)
    """
    return DEADLINE_SECONDS + DEADLINE_SECONDS_PER_MIB * content_bytes / (1 << 20)


log = logging.getLogger(__name__)


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


class FingerprintPool(Executor):
    """:func:`fingerprint_pool`'s processes, started again when the pool is broken (a process died).
    ``renewals``: how many times."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.renewals = 0
        self._pool = fingerprint_pool(processes)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        try:
            return self._pool.submit(fn, *args, **kwargs)
        except BrokenProcessPool:
            self.renew(self._pool)
            return self._pool.submit(fn, *args, **kwargs)

    def renew(self, broken: ProcessPoolExecutor | None = None) -> None:
        """New processes in place of ``broken`` (the current pool if None); nothing if the pool
        was renewed since (several callers see the same death)."""
        if broken is not None and broken is not self._pool:
            return
        old, self.renewals = self._pool, self.renewals + 1
        log.error("a fingerprinting process died; starting %d new one(s) (renewal %d)", self.processes, self.renewals)
        self._pool = fingerprint_pool(self.processes)
        # (a broken pool's manager thread has ended or is ending: this does not wait for work.)
        # Not cancel_futures: a task submitted just before a kill, not yet handed to a process, was
        # cancelled by it, and its batch ended with CancelledError, neither judged nor retried;
        # the broken pool fails it with BrokenProcessPool, which the caller retries
        old.shutdown(wait=True, cancel_futures=False)

    def kill(self) -> None:
        """Kill the processes (a task ran past its deadline: a running task cannot be cancelled);
        the tasks they ran fail with ``BrokenProcessPool``, and new processes take their place."""
        pool = self._pool
        processes = getattr(pool, "_processes", None)  # (ProcessPoolExecutor's own)
        if processes is None:  # shut down (the worker is stopping): nothing runs, nothing to renew
            return
        for process in list(processes.values()):
            process.kill()
        self.renew(pool)

    @property
    def current(self) -> ProcessPoolExecutor:
        return self._pool

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
