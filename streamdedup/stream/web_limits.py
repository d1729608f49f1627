"""Bounds on the connections to the worker's web port (faust's aiohttp server).

faust leaves aiohttp's default of 3630 s before an idle connection is closed and no cap on open
connections: ~21,000 idle (or slowly-sending-headers) connections used up the worker's file
descriptors, and it could open no Kafka connection or file.  :func:`bound_connections` closes a
connection that has sent no complete request within :data:`IDLE_SECONDS` (of its opening, or of
its last response), and closes at once, right after the accept, any connection beyond
:data:`MAX_CONNECTIONS` open ones.

aiohttp internals relied on (aiohttp 3.14).  What can be checked is checked when the function is
applied or as the runner is set up (faust's web server start), and a mismatch raises there
instead of leaving the port unbounded:

* ``AppRunner._kwargs``: the keyword arguments the runner gives the :class:`aiohttp.web.Server`
  it makes at ``setup()``, which passes them to each connection's ``RequestHandler``
  (``AppRunner(app, keepalive_timeout=...)`` is the documented way; faust builds its runner
  without it).  Checked: a handler made by the set-up server reports ``keepalive_timeout`` (a
  public property) equal to the idle limit.
* ``RequestHandler`` arms its ``keepalive_timeout`` timer when the connection opens and after
  each response, and closes the connection if no complete request has arrived when it fires
  (``connection_made`` / ``_process_keepalive``; bytes of an unfinished request do not re-arm
  it).  Not checkable at start-up: tests/test_web_limits.py checks it on a real server.
* ``Server.connection_made(handler, transport)``, which each ``RequestHandler`` calls as its
  connection opens, and ``Server.connections``, the handlers registered by it that are not
  gone yet.  Checked to exist; the cap wraps the first on the server instance.
* ``AppRunner`` has ``__slots__``, so the runner's ``setup()`` is hooked by switching its class
  to a subclass (``__class__`` assignment, which raises if the layouts ever differ).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, cast

from aiohttp import web

__all__ = ["IDLE_SECONDS", "MAX_CONNECTIONS", "WebInternalsChanged", "bound_connections"]

#: A connection that has sent no complete request within this many seconds of opening, or of
#: its last response, is closed (a slow request header counts as no request).  Longer than
#: Prometheus's scrape intervals (15 s in deploy/prometheus, 1 min by default): at an idle limit
#: equal to the interval, each scrape would race the close of its kept-alive connection.
IDLE_SECONDS = 75.0
#: Open connections at most; one beyond is closed right after it is accepted.
MAX_CONNECTIONS = 1000
REFUSED_LOG_SECONDS = 60.0  # at most one warning about refused connections this often

log = logging.getLogger(__name__)


class WebInternalsChanged(RuntimeError):
    """aiohttp no longer has what :func:`bound_connections` relies on (see the module's doc)."""


def bound_connections(
    runner: web.AppRunner, *, idle_seconds: float = IDLE_SECONDS, max_connections: int = MAX_CONNECTIONS
) -> None:
    """Make ``runner`` (not set up yet) close idle and slow connections after ``idle_seconds``
    and refuse connections beyond ``max_connections`` open ones.  Raises
    :class:`WebInternalsChanged` now, or from ``runner.setup()``, if aiohttp has changed."""
    if not idle_seconds > 0 or max_connections < 1:
        raise ValueError(f"need idle_seconds > 0 and max_connections >= 1, not {idle_seconds}, {max_connections}")
    if runner.server is not None:
        raise RuntimeError("bound_connections: the runner is set up already (apply it before setup())")
    handler_kwargs = getattr(runner, "_kwargs", None)
    if not isinstance(handler_kwargs, dict):
        raise WebInternalsChanged("aiohttp's AppRunner has no _kwargs dict for its handlers")
    handler_kwargs["keepalive_timeout"] = idle_seconds
    base = type(runner)

    async def setup(self: web.AppRunner) -> None:
        await base.setup(self)
        server = self.server
        assert server is not None
        made = server()  # a handler as made for each connection (never connected: dropped)
        if getattr(made, "keepalive_timeout", None) != idle_seconds:
            raise WebInternalsChanged(f"aiohttp's handlers did not take keepalive_timeout={idle_seconds}")
        _cap(server, max_connections)

    runner.__class__ = type(f"Bounded{base.__name__}", (base,), {"__slots__": (), "setup": setup})


def _cap(server: web.Server, max_connections: int) -> None:
    accept = getattr(server, "connection_made", None)
    if not callable(accept) or not isinstance(getattr(server, "connections", None), list):
        raise WebInternalsChanged("aiohttp's Server has no connection_made(handler, transport) or connections")
    refused, warned = 0, -math.inf

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        nonlocal refused, warned
        if len(server.connections) < max_connections:
            accept(handler, transport)
            return
        transport.abort()  # (never registered: its handler's connection_lost finds nothing to remove)
        refused += 1
        if (now := time.monotonic()) - warned >= REFUSED_LOG_SECONDS:
            log.warning("web port: %d open connections, the most allowed: refused %d more", max_connections, refused)
            refused, warned = 0, now

    cast(Any, server).connection_made = connection_made
