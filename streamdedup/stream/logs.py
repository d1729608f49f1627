"""Rate-limit the Kafka clients' repeated warnings and errors (a broker outage floods the log).

During an outage aiokafka and faust log the same connection error for every request, every
retry and every partition: one worker wrote 72,454 ERROR lines in 16 s.  :class:`RateLimit`
lets the first line of each kind through, drops the same kind for ``interval`` seconds, and
says how many it dropped on the next line of that kind it lets through:

    Unable connect to node with id 1: ... (412 similar lines suppressed in the last 10s)

A "kind" is the logger, the level, the message template and its first argument -- the node id
or address in aiokafka's connection messages -- so each node gets its own line per interval and
different errors are never hidden behind each other.  Lines below WARNING pass untouched.

The filter sits on the loggers themselves (a filter on a parent logger does not see its
children's records), so :func:`install` puts one shared instance on every logger of the named
packages that exists when it is called; the worker calls it after faust and aiokafka are imported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["RateLimit", "install", "CLIENT_LOGGERS"]

#: the packages whose warnings and errors are rate-limited
CLIENT_LOGGERS = ("aiokafka", "faust", "mode", "kafka", "aiohttp")  # (aiohttp: a traceback a bad request)


class RateLimit(logging.Filter):
    """At most one WARNING-or-above line per kind per ``interval`` seconds (thread-safe: faust
    runs aiokafka's consumer in a thread of its own)."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval, self.clock = interval, clock
        self._lock = threading.Lock()
        self._last: dict[tuple, float] = {}  # kind -> when its last line was let through
        self._dropped: dict[tuple, int] = {}  # kind -> lines dropped since then
        self.suppressed_total = 0

    @staticmethod
    def kind(record: logging.LogRecord) -> tuple:
        args = record.args
        first = args[0] if isinstance(args, tuple) and args else None
        return (record.name, record.levelno, str(record.msg), repr(first)[:200])

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        kind, now = self.kind(record), self.clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval:
                self._dropped[kind] = self._dropped.get(kind, 0) + 1
                self.suppressed_total += 1
                return False
            dropped = self._dropped.pop(kind, 0)
            self._last[kind] = now
            if len(self._last) > 10_000:  # bounded memory whatever the messages
                self._forget(now)
        if dropped and last is not None:
            record.msg = f"{record.getMessage()} ({dropped} similar lines suppressed in the last {now - last:.0f}s)"
            record.args = ()  # (not None: mode's formatter wraps None into (None,) and formats again)
        return True

    def _forget(self, now: float) -> None:
        for k in [k for k, t in self._last.items() if now - t >= self.interval]:
            self._last.pop(k, None)
            self._dropped.pop(k, None)


def install(interval: float = 10.0, packages: Iterable[str] = CLIENT_LOGGERS) -> RateLimit:
    """Put one :class:`RateLimit` on each existing logger of ``packages`` (and their roots);
    returns it.  Installing twice replaces the earlier filter rather than stacking another."""
    limit = RateLimit(interval)
    prefixes = tuple(packages)
    names = [n for n in list(logging.Logger.manager.loggerDict) if n.split(".")[0] in prefixes]
    for name in {*names, *prefixes}:
        logger = logging.getLogger(name)
        for f in [f for f in logger.filters if isinstance(f, RateLimit)]:
            logger.removeFilter(f)
        logger.addFilter(limit)
    return limit
