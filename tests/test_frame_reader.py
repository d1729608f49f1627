"""The bulk reader's connection stream (:class:`streamdedup.stream.connection._FrameReader`): the
same frames as asyncio's StreamReader, however the socket cuts the bytes, with no copy of a
frame that came in one read, and no pause of the socket."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from streamdedup.stream.connection import _FrameReader


class Transport:
    """What a StreamReader calls on its transport; counts the pauses."""

    def __init__(self) -> None:
        self.pauses = 0

    def pause_reading(self) -> None:
        self.pauses += 1

    def resume_reading(self) -> None:
        pass


def frames(rng: random.Random, n: int) -> list[bytes]:
    return [rng.randbytes(rng.choice([0, 1, 3, 100, 70_000, 300_000])) for _ in range(n)]


def cuts(rng: random.Random, data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        size = rng.choice([1, 2, 4, 5, 1000, 65_536, 200_000, 1 << 20])
        out.append(data[at : at + size])
        at += size
    return out


async def read_all(reader: asyncio.StreamReader, chunks: list[bytes], count: int, eof: bool) -> list[bytes]:
    """Feed ``chunks`` (a turn of the loop each) while reading ``count`` frames (size, then body)."""

    async def feed() -> None:
        for chunk in chunks:
            reader.feed_data(chunk)
            await asyncio.sleep(0)
        if eof:
            reader.feed_eof()

    feeding = asyncio.ensure_future(feed())
    out = []
    try:
        for _ in range(count):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            out.append(await reader.readexactly(size))
    finally:
        await feeding
    return out


def taken_over(transport: Transport) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=2**16)
    reader.set_transport(transport)  # type: ignore[arg-type]
    _FrameReader.take_over(reader)
    return reader


@pytest.mark.parametrize("seed", range(6))
def test_the_same_frames_as_asyncio_however_the_bytes_are_cut(seed):
    rng = random.Random(seed)
    sent = frames(rng, 12)
    data = b"".join(struct.pack(">i", len(f)) + f for f in sent)
    chunks = cuts(rng, data)

    async def main() -> None:
        plain, transport = asyncio.StreamReader(limit=2**16), Transport()
        plain.set_transport(Transport())  # type: ignore[arg-type]
        ours = taken_over(transport)
        assert isinstance(ours, _FrameReader)
        assert await read_all(plain, chunks, len(sent), eof=False) == sent
        got = await read_all(ours, chunks, len(sent), eof=True)
        assert got == sent and all(type(f) is bytes for f in got)
        assert transport.pauses == 0 and ours.at_eof()

    asyncio.run(main())


def test_a_frame_that_came_in_one_read_is_not_copied_and_a_short_stream_raises_like_asyncio():
    async def main() -> None:
        reader = taken_over(Transport())
        body = b"x" * 100_000
        reader.feed_data(struct.pack(">i", len(body)))
        reader.feed_data(body)
        assert await reader.readexactly(4) == struct.pack(">i", len(body))
        assert await reader.readexactly(len(body)) is body
        assert await reader.readexactly(0) == b""
        for r in (reader, asyncio.StreamReader()):
            r.feed_data(b"abc")
            r.feed_data(b"de")
            assert await r.readexactly(1) == b"a"
            r.feed_eof()
            assert not r.at_eof()
            with pytest.raises(asyncio.IncompleteReadError) as e:
                await r.readexactly(10)
            assert e.value.partial == b"bcde" and e.value.expected == 10
            assert r.at_eof()

    asyncio.run(main())


def test_bytes_received_before_the_take_over_are_kept():
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(b"\x00\x00\x00\x03ab")
        _FrameReader.take_over(reader)
        reader.feed_data(b"c")
        assert await reader.readexactly(4) == b"\x00\x00\x00\x03"
        assert await reader.readexactly(3) == b"abc"

    asyncio.run(main())
