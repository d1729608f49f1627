"""The web port's bounds on connections (stream/web_limits.py), on a real aiohttp server on
127.0.0.1 with real sockets as its clients; and the worker's own web server bounded the same way.
Every wait has a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from kafka_broker import free_ports  # tests/ is on sys.path (pytest's rootdir-relative import)
from prometheus_client import CollectorRegistry

from streamdedup.settings import Settings
from streamdedup.stream import app as app_module
from streamdedup.stream.app import Worker
from streamdedup.stream.web_limits import WebInternalsChanged, bound_connections

HOST = "127.0.0.1"
IDLE = 0.5  # the idle limit of these tests, in seconds
SLACK = 2.0  # seconds past a limit the server may take to act on it
AT_ONCE = 1.0  # a refused connection is closed within this (far below the idle limit of those tests)
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


@contextlib.asynccontextmanager
async def serving(idle_seconds: float, max_connections: int = 100) -> AsyncIterator[int]:
    """A real aiohttp server with the bounds applied; yields its port."""
    app = web.Application()
    app.router.add_get("/", _hello)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    bound_connections(runner, idle_seconds=idle_seconds, max_connections=max_connections)
    await runner.setup()
    try:
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        yield site.port
    finally:
        await asyncio.wait_for(runner.cleanup(), 10)


@contextlib.asynccontextmanager
async def connected(port: int) -> AsyncIterator[Stream]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 5)
    try:
        yield reader, writer
    finally:
        writer.close()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True if the server closes the connection within ``seconds`` (end of stream or reset),
    False if it is still open then."""
    try:
        async with asyncio.timeout(seconds):
            await reader.read()  # (until the end of the stream)
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


async def get(stream: Stream) -> tuple[int, bytes]:
    """GET / on a connection (keep-alive, HTTP/1.1): its status and body, within 5 s."""
    reader, writer = stream
    writer.write(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length: *(\d+)", head)
        assert length is not None, head
        body = await reader.readexactly(int(length[1]))
    assert not re.search(rb"(?im)^connection: *close", head), head
    return int(head.split()[1]), body


async def served(stream: Stream) -> bool:
    """Whether a request on the connection is answered (False: the server closed it)."""
    try:
        return await get(stream) == (200, b"hello")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_limit():
    async def main() -> float:
        async with serving(IDLE) as port, connected(port) as (reader, _):
            t0 = time.monotonic()
            assert await closed_within(reader, IDLE + SLACK), "an idle connection stayed open"
            return time.monotonic() - t0

    assert asyncio.run(main()) >= IDLE - 0.1  # (by the idle limit, not at once)


def test_a_request_head_sent_byte_by_byte_is_closed_after_the_idle_limit():
    """Each byte comes well within the idle limit: they must not restart it."""
    head = b"GET / HTTP/1.1\r\nHost: test\r\nX-Slow: " + b"a" * 200
    step = IDLE / 5

    async def main() -> tuple[float, int]:
        async with serving(IDLE) as port, connected(port) as (reader, writer):
            t0 = time.monotonic()
            closed = asyncio.ensure_future(closed_within(reader, IDLE + SLACK))
            sent = 0
            try:
                while not closed.done() and sent < len(head):
                    writer.write(head[sent : sent + 1])
                    sent += 1
                    await asyncio.wait([closed], timeout=step)
                assert await closed, f"a connection sending its head slowly stayed open ({sent} bytes sent)"
            finally:
                closed.cancel()
            return time.monotonic() - t0, sent

    elapsed, sent = asyncio.run(main())
    assert elapsed >= IDLE - 0.1 and sent * step >= IDLE - 0.1  # (bytes kept coming past the limit)


def test_connections_beyond_the_limit_are_closed_at_once_and_room_is_made_as_others_close():
    n = 3

    async def main() -> None:
        async with serving(60.0, max_connections=n) as port, contextlib.AsyncExitStack() as stack:
            open_ = [await stack.enter_async_context(connected(port)) for _ in range(n)]
            for c in open_:
                assert await served(c)
            async with connected(port) as (reader, _):
                assert await closed_within(reader, AT_ONCE), f"connection {n + 1} was not closed at once"
            for c in open_:  # the first n stay open (and are served)
                assert await served(c), "a connection within the limit was closed"
            open_[0][1].close()
            # room again once the server has seen that close: a new connection is served
            deadline = time.monotonic() + 5
            while True:
                again = await stack.enter_async_context(connected(port))
                if await served(again):
                    break
                assert time.monotonic() < deadline, "no connection accepted after one of the open ones closed"
                await asyncio.sleep(0.05)
            async with connected(port) as (reader, _):  # and the limit holds again
                assert await closed_within(reader, AT_ONCE), f"connection {n + 1} was not closed at once"
            assert await served(again) and await served(open_[1])

    asyncio.run(main())


def test_requests_are_answered_and_a_prompt_next_request_reuses_the_connection():
    """Three requests on one connection, each sent 0.4 s after the last answer: 1.2 s in all,
    past the 1 s idle limit, which starts again after each response; then it idles and is closed."""
    idle = 1.0

    async def main() -> None:
        async with serving(idle) as port, connected(port) as stream:
            for _ in range(3):
                assert await get(stream) == (200, b"hello")
                await asyncio.sleep(0.4)
            assert await closed_within(stream[0], idle + SLACK), "the connection stayed open after idling"

    asyncio.run(main())


def test_aiohttp_not_taking_the_idle_limit_stops_the_start():
    """The start-up check: a handler argument that overrides the idle limit (as a changed aiohttp
    would ignore it) makes setup() raise instead of serving unbounded."""

    async def main() -> None:
        runner = web.AppRunner(web.Application(handler_args={"keepalive_timeout": 3630}))
        bound_connections(runner, idle_seconds=IDLE)
        try:
            with pytest.raises(WebInternalsChanged, match="keepalive_timeout"):
                await runner.setup()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_the_worker_s_web_server_is_bounded(tmp_path, monkeypatch):
    """The worker's faust app bounds the runner its web server serves from (faust's start_server:
    that runner's setup(), then its site on --web-port), here with small limits to see them act
    (an idle limit over AT_ONCE: the refused connection must not be the idle one closing)."""
    idle = 2 * AT_ONCE
    limits = functools.partial(bound_connections, idle_seconds=idle, max_connections=2)
    monkeypatch.setattr(app_module, "bound_connections", limits)
    port = free_ports(1)[0]
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, web_port=port), registry=CollectorRegistry())

    async def main() -> None:
        web_driver = w.app.web
        await web_driver.start_server()
        try:
            async with connected(port) as first, connected(port) as second:
                for c in (first, second):  # (no routes outside a running app: 404 is an answer)
                    assert (await get(c))[0] == 404
                t0 = time.monotonic()
                async with connected(port) as (reader, _):
                    assert await closed_within(reader, AT_ONCE), "connection 3 of 2 was not closed at once"
                assert await closed_within(first[0], idle + SLACK), "an idle connection stayed open"
                assert time.monotonic() - t0 >= idle - 0.1  # (by the idle limit, after its response)
        finally:
            await asyncio.wait_for(web_driver.stop_server(), 10)

    try:
        asyncio.run(main())
    finally:
        w.close()
