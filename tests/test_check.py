"""POST /check's logic without Kafka or HTTP: the Checker with fakes for what it is given."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.pending import Pending
from streamdedup.pipeline.shard import ShardPlan
from streamdedup.pipeline.wire import CHECKS, decode
from streamdedup.stream.check import RETRY_AFTER_SECONDS, Checker, judge_body

PLAN = ShardPlan(TableDesign.named("16"), partitions=2)
LIMIT = 1_000_000
PAGE = json.dumps({"url": "http://a/", "content": "<p>some words to fingerprint here</p>"}).encode()


class Stream:
    """aiohttp's request.content: read(n) gives at most n bytes, b"" at the end."""

    def __init__(self, data: bytes) -> None:
        self.data, self.reads = data, 0

    async def read(self, n: int) -> bytes:
        self.reads += 1
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk


def checker(owned=(0,), answer=True, **kwargs) -> Checker:
    pending = Pending(PLAN.n_groups)
    sent = []

    async def send_probes(shard: int, value: bytes) -> None:
        sent.append((shard, value))
        if answer:  # every group answers "no match"
            batch = decode([value], CHECKS)
            for req, group in zip(batch.rows["request"].tolist(), batch.rows["group"].tolist()):
                pending.answer_one(req, group, -1)

    c = Checker(pending, PLAN, send_probes, lambda: list(owned), max_bytes=LIMIT, **kwargs)
    c.sent = sent
    return c


def test_a_page_is_judged_and_nothing_stays_waiting():
    c = checker()
    status, payload, headers = asyncio.run(c.check(PAGE))
    assert (status, payload["verdict"], payload["id"], headers) == (200, "unique", "http://a/", {})
    assert {s for s, _ in c.sent} <= {0, 1} and c.active == 0
    assert not c.pending._requests


@pytest.mark.parametrize(
    "body, status, reason",
    [
        (b"[" * 200_000 + b"]" * 200_000, 400, "not_json"),
        (b'{"url": "http://a/", "content": "<p>x</p>", "n": ' + b"9" * 5000 + b"}", 400, "bad_field"),
        (b'{"id": "sur\\ud800", "url": "http://a/", "content": "<p>x</p>"}', 400, "bad_field"),
        (b'{"url": "http://a/", "content": "<nav>Home</nav><script>x()</script>"}', 400, "empty"),
        (b"x" * (LIMIT + 1), 413, "too_large"),
    ],
)
def test_hostile_bodies_get_json_errors(body, status, reason):
    c = checker()
    got, payload, _ = asyncio.run(c.check(body))
    assert (got, payload["reason"]) == (status, reason)
    assert payload["error"] and not c.sent


def test_beyond_the_concurrency_limit_the_answer_is_503_with_retry_after():
    c = checker(max_concurrent=2, answer=False, timeout=5.0)

    async def burst():
        first = [asyncio.create_task(c.check(PAGE)) for _ in range(2)]
        while c.active < 2:
            await asyncio.sleep(0.01)
        busy = await c.check(PAGE)
        assert c.busy() is not None
        for t in first:
            t.cancel()
        await asyncio.gather(*first, return_exceptions=True)
        return busy

    status, payload, headers = asyncio.run(burst())
    assert (status, payload["reason"], headers) == (503, "busy", {"Retry-After": str(RETRY_AFTER_SECONDS)})
    assert c.active == 0 and not c.pending._requests  # cancelled checks are forgotten


def test_no_partition_is_503_and_no_answer_is_504():
    status, payload, headers = asyncio.run(checker(owned=()).check(PAGE))
    assert (status, payload["reason"], "Retry-After" in headers) == (503, "unavailable", True)
    c = checker(answer=False, timeout=0.2)
    status, payload, _ = asyncio.run(c.check(PAGE))
    assert (status, payload["reason"]) == (504, "timeout") and not c.pending._requests


def test_the_body_is_read_up_to_the_limit_only():
    c = checker()
    body, error = asyncio.run(c.read_body(None, Stream(b"x" * LIMIT)))
    assert (len(body), error) == (LIMIT, None)
    stream = Stream(b"x" * 10 * LIMIT)
    body, error = asyncio.run(c.read_body(None, stream))
    assert body is None and error["reason"] == "too_large" and stream.reads <= 5
    stream = Stream(b"x" * (LIMIT + 1))
    body, error = asyncio.run(c.read_body(LIMIT + 1, stream))  # Content-Length says so: nothing read
    assert body is None and error["reason"] == "too_large" and stream.reads == 0


def test_judge_body_in_a_process_pool_gives_the_fingerprint_scan_gives():
    from concurrent.futures import ProcessPoolExecutor

    from streamdedup.fingerprinting.pages import fingerprint

    with ProcessPoolExecutor(1) as pool:
        judged = pool.submit(judge_body, PAGE, 10_000, 0).result(timeout=60)
    assert judged.reason is None
    assert judged.fingerprint == fingerprint("<p>some words to fingerprint here</p>", None)
    assert np.uint64(judged.fingerprint) == judged.fingerprint
