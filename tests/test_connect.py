"""Connecting to a port that accepts and never answers: the clients say so after
``PROBE_SILENCE`` seconds, not after the whole connect timeout; a listener that answers the
probe as Kafka keeps the whole timeout for the client's own start.  No broker needed: the
listeners are sockets the tests open on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streamdedup.crawler.client import CONNECT_TIMEOUT, PROBE_SILENCE, connect
from streamdedup.errors import ClientError
from streamdedup.settings import Settings


@contextmanager
def silent_port() -> Iterator[str]:
    """A TCP server that accepts every connection and never says anything (nor hangs up)."""
    accepted: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.1)

        def accept() -> None:
            while server.fileno() != -1:
                try:
                    accepted.append(server.accept()[0])
                except TimeoutError:
                    continue
                except OSError:  # closed
                    return

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield f"127.0.0.1:{server.getsockname()[1]}"
        finally:
            server.close()
            thread.join(10)
            for s in accepted:
                s.close()


def _silent(port: str, seconds: float, tls: bool = False) -> str:
    handshake = "completed no TLS handshake and " if tls else ""
    return (
        f"{port} accepted the connection but {handshake}answered no Kafka request in {seconds:g} s: "
        "is it a Kafka listener, of this --security-protocol?"
    )


def test_the_cli_names_a_silent_port_well_before_its_connect_timeout(tmp_path: Path) -> None:
    (tmp_path / "page.jsonl").write_text(json.dumps({"url": "http://a/", "content": "<p>words</p>"}) + "\n")
    runs = {
        "produce": ["produce", "page.jsonl"],
        "verdicts": ["verdicts"],
        "produce over SSL": ["produce", "page.jsonl", "--security-protocol", "SSL"],
    }
    with silent_port() as port:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDEDUP_")}
        env["STREAMDEDUP_BROKERS"] = port
        t0 = time.monotonic()
        procs = {  # at once: each waits on the same silence
            name: subprocess.Popen(
                [sys.executable, "-m", "streamdedup", *args],
                env=env,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, args in runs.items()
        }
        out = {}
        try:
            for name, proc in procs.items():
                _, err = proc.communicate(timeout=2 * CONNECT_TIMEOUT)  # the test's deadline, whatever happens
                out[name] = (proc.returncode, err, time.monotonic() - t0)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
    for name, (code, err, seconds) in out.items():
        protocol = "SSL" if "SSL" in name else "PLAINTEXT"
        assert code == 1, (name, err[-2000:])
        assert "Traceback" not in err, (name, err[-2000:])
        line = (
            f"Error: cannot connect to Kafka at {port} ({protocol}): {_silent(port, PROBE_SILENCE, protocol == 'SSL')}"
        )
        assert line in err, (name, err[-2000:])
        # before, the silence took the whole connect timeout: now the silence limit, plus the CLI's start
        assert seconds < 0.75 * CONNECT_TIMEOUT, (name, seconds)


class _KafkaLike:
    """Answers the probe's request as a Kafka broker does (size, then its correlation id) after
    ``delay`` seconds; says nothing else."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.answered = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            request = await reader.readexactly(size)
            await asyncio.sleep(self.delay)
            writer.write(struct.pack(">ii", 6, struct.unpack(">i", request[4:8])[0]) + b"\0\0")
            await writer.drain()
            self.answered += 1
            await reader.read()  # until the client hangs up
        finally:
            writer.close()


def _run_connect(port: str, start_seconds: float, timeout: float, silence: float) -> dict:
    """connect() with a stand-in for aiokafka's start that takes ``start_seconds``: what happened."""
    seen = {"started": False, "stopped": False}

    async def start() -> None:
        await asyncio.sleep(start_seconds)
        seen["started"] = True

    async def stop() -> None:
        seen["stopped"] = True

    settings = Settings.from_sources({"brokers": port}, {})
    try:
        asyncio.run(asyncio.wait_for(connect(start, stop, settings, timeout, silence), 30))
    except ClientError as e:
        seen["error"] = str(e)
    return seen


def test_a_listener_that_answers_as_kafka_keeps_the_whole_timeout() -> None:
    kafka = _KafkaLike(delay=0.1)

    async def main() -> dict:
        server = await asyncio.start_server(kafka.serve, "127.0.0.1", 0)
        port = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            # the client's start takes 3 times the silence limit: it is still waited for
            return await asyncio.to_thread(_run_connect, port, 3.0, 20.0, 1.0)

    seen = asyncio.run(main())
    assert seen == {"started": True, "stopped": False} and kafka.answered == 1


def test_a_silent_port_ends_the_start_after_the_silence_limit() -> None:
    with silent_port() as port:
        seen = _run_connect(port, 60.0, 20.0, 0.5)  # a start that would outlast the test's deadline
    assert seen["error"] == f"cannot connect to Kafka at {port} (PLAINTEXT): {_silent(port, 0.5)}"
    assert not seen["started"] and seen["stopped"]  # the client's start was cancelled, and stopped


def test_the_silence_limit_is_no_longer_than_the_timeout() -> None:
    with silent_port() as port:
        seen = _run_connect(port, 60.0, 0.4, 5.0)
    assert seen["error"] == f"cannot connect to Kafka at {port} (PLAINTEXT): {_silent(port, 0.4)}"
