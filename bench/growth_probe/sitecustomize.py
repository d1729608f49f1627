"""Instrumentation for bench/growth_latency.py, loaded by the worker processes it starts (this
directory is put first on their PYTHONPATH, so Python imports this module at startup).

It changes no answer; on request (the bench creates the file named by ``GROWTH_PROBE_TRIGGER``)
it logs the sorted runs of every live BlockIndex, through the worker's log file, so the bench can
compute when the next big merge comes due.  (The merges themselves are logged by BlockIndex:
"index merge of N entries ..." at INFO from ``BlockIndex.LOG_MERGE_MIN`` entries.)
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from streamdedup.index.blocks import BlockIndex

_INDEXES: weakref.WeakSet[BlockIndex] = weakref.WeakSet()


def _log(message: str, *args: object) -> None:
    """A line in the worker's log format, written to file descriptor 2 (the worker's log file):
    faust replaces sys.stderr by a logger at WARNING, and log records from this module's threads
    did not come out through the worker's logging."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    os.write(2, f"[{stamp}] [{os.getpid()}] [INFO] {message % args}\n".encode())


def _install() -> None:
    init = BlockIndex.__init__

    def tracked_init(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        init(self, *args, **kwargs)
        _INDEXES.add(self)

    BlockIndex.__init__ = tracked_init  # type: ignore[method-assign]

    trigger = os.environ.get("GROWTH_PROBE_TRIGGER")
    if trigger:
        threading.Thread(target=_watch, args=(trigger,), name="growth-probe", daemon=True).start()


def _watch(trigger: str) -> None:
    """Log every big index's runs each time the trigger file appears, then remove it."""
    while True:
        time.sleep(0.2)
        big = [idx for idx in list(_INDEXES) if idx.rows >= 1 << 12]  # (not a batch's own small index)
        if not big or not os.path.exists(trigger):
            continue  # (the worker's fingerprinting processes load this module too: they hold no index)
        for idx in big:
            runs, pending = [len(r) for r in list(idx._runs)], idx._pending
            busy = [] if pending is None else [len(pending.old), len(pending.new)]
            _log("growth-probe: runs of mask %#x: %s pending %s", idx.mask, runs, busy)
        _log("growth-probe: runs done")
        os.remove(trigger)


_install()
