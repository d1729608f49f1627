"""``POST /check``: one page judged against every stored page, without storing it.

The page's probes go to the shards as a batch of kind CHECKS (the shards answer and do not
insert), their answers come back to a partition this worker owns, and the request waits for
them in :class:`~streamdedup.pipeline.pending.Pending` like a page, but is never released to Kafka.

What keeps a crawler's burst of checks from stalling the worker's stream:

* the body is read in chunks up to ``--max-page-bytes`` (413 JSON beyond, before reading
  it all when ``Content-Length`` says so);
* parsing and fingerprinting run in the worker's fingerprinting process pool, never on
  the event loop (:func:`judge_body` is a plain function of bytes);
* at most ``max_concurrent`` checks are in progress; beyond that the answer is 503 with
  ``Retry-After`` at once, so a burst costs the loop one short answer per extra request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from streamdedup.engine.records import page_from_json, page_text
from streamdedup.errors import RecordError
from streamdedup.fingerprinting.cluster import DEFAULT_CLUSTER_N
from streamdedup.fingerprinting.pages import Fingerprints
from streamdedup.index.bands import BandScheme
from streamdedup.pipeline.intake import fetched_ms, id_hash, probe_batches
from streamdedup.pipeline.pending import Pending
from streamdedup.pipeline.routing import verdict_record
from streamdedup.pipeline.shard import Plan
from streamdedup.pipeline.wire import CHECKS, encode
from streamdedup.stream.pool import BrokenProcessPool, FingerprintPool, deadline_seconds

__all__ = ["Checker", "Judged", "judge_body", "RETRY_AFTER_SECONDS", "READ_SECONDS"]

#: How long a check's body may pause between two pieces before the request is refused (a
#: client that sends part of it and then nothing held its connection and buffers for good).
READ_SECONDS = 10.0

RETRY_AFTER_SECONDS = 1
READ_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Judged:
    """What :func:`judge_body` made of a body: a page's fingerprint, or why there is none."""

    page_id: str = ""
    url: str = ""
    fetched: int = 0
    fingerprint: int = 0
    cluster: int | None = None
    reason: str | None = None
    error: str | None = None
    extra: bytes = b""  # the band modes: the page's band keys and sketch (BandScheme.extra)


def judge_body(
    body: bytes, max_bytes: int, now_ms: int, cluster_n: int = DEFAULT_CLUSTER_N, bands: BandScheme | None = None
) -> Judged:
    """Parse, extract and fingerprint one check body (runs in the process pool), with its
    bottom-``cluster_n`` cluster key and (``bands``) its band keys and sketch.

    Every failure is a :class:`Judged` with a reason, never an exception: a bug the body
    triggers is ``internal_error`` for this request only.

    >>> judge_body(b"[" * 100000 + b"]" * 100000, 1 << 20, 0).reason
    'not_json'
    """
    try:
        page = page_from_json(body, max_bytes)
        fetched = fetched_ms(page.fetched_at, now_ms)
        fingerprints = Fingerprints([page_text(page)], bands.num_perm if bands is not None else 128)
        fp = int(fingerprints.simhash[0])
        cluster = fingerprints.cluster_keys(cluster_n)[0]
        extra = b"" if bands is None else bands.extra(fingerprints.minhash).tobytes()
    except RecordError as e:
        return Judged(reason=e.reason, error=e.message)
    except Exception as e:  # one request's bug is that request's answer
        return Judged(reason="internal_error", error=f"{type(e).__name__}: {e}")
    return Judged(page.id, page.url, fetched, fp, cluster, extra=extra)


@dataclass
class Checker:
    """Answers checks with what it is given, not the whole worker.

    ``send_probes(shard_partition, value)`` sends one probes message; ``owned()`` lists the
    answers partitions this worker holds now; ``pool`` runs :func:`judge_body` (None: in a
    thread, for tests and ``--fingerprint-processes 0``).
    """

    pending: Pending
    plan: Plan
    send_probes: Callable[[int, bytes], Awaitable[object]]
    owned: Callable[[], list[int]]
    max_bytes: int
    pool: Executor | None = None
    max_concurrent: int = 16
    timeout: float = 10.0
    cluster_n: int = DEFAULT_CLUSTER_N
    bands: BandScheme | None = None  # the band modes' scheme (None: simhash)
    active: int = field(default=0, init=False)

    async def read_body(self, content_length: int | None, content) -> tuple[bytes | None, dict | None]:
        """The body from an aiohttp stream, or (None, a payload saying why not): over the limit
        (reason ``too_large``: a 413), or a body that is not one (reason ``bad_request``: a 400;
        a broken chunked encoding, a client gone before its end)."""
        if content_length is not None and content_length > self.max_bytes:
            return None, self._too_large(content_length)
        chunks, size = [], 0
        try:
            while chunk := await asyncio.wait_for(content.read(READ_CHUNK), READ_SECONDS):
                size += len(chunk)
                if size > self.max_bytes:
                    return None, self._too_large(size, at_least=True)
                chunks.append(chunk)
        except TimeoutError:
            return None, {"error": f"no byte of the body came for {READ_SECONDS:.0f}s", "reason": "bad_request"}
        except (OSError, ValueError) as e:  # (aiohttp's payload errors; a connection lost)
            return None, {"error": f"the request body cannot be read ({type(e).__name__})", "reason": "bad_request"}
        return b"".join(chunks), None

    def _too_large(self, size: int, at_least: bool = False) -> dict:
        return {
            "error": f"the record is {'over ' if at_least else ''}{size} bytes, over the limit of {self.max_bytes} "
            "(--max-page-bytes)",
            "reason": "too_large",
        }

    def busy(self) -> tuple[int, dict, dict] | None:
        """A 503 answer when ``max_concurrent`` checks are in progress already."""
        if self.active < self.max_concurrent:
            return None
        return (
            503,
            {"error": f"{self.active} checks in progress, the most this worker takes; retry", "reason": "busy"},
            {"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    async def check(self, body: bytes, hold: float = 0.0, reserved: bool = False) -> tuple[int, dict, dict]:
        """(HTTP status, JSON body, extra headers) for one page record; ``hold`` seconds in
        progress first (the worker's test hook for a slow check: it counts against the limit).
        ``reserved``: the caller holds a slot already (:meth:`reserve`, taken before it read the body)."""
        if reserved:
            return await self._check(body) if not hold else await self._held(body, hold)
        if (busy := self.busy()) is not None:
            return busy
        self.active += 1
        try:
            if hold:
                await asyncio.sleep(hold)
            return await self._check(body)
        finally:
            self.active -= 1

    async def _held(self, body: bytes, hold: float) -> tuple[int, dict, dict]:
        await asyncio.sleep(hold)
        return await self._check(body)

    def reserve(self) -> tuple[int, dict, dict] | None:
        """Take a slot for a check whose body is still to be read (bodies in transit count
        against the limit too: slow uploads past it each held a buffer of up to --max-page-bytes);
        None when taken (give it back with :meth:`release`), else the 503 answer."""
        if (busy := self.busy()) is not None:
            return busy
        self.active += 1
        return None

    def release(self) -> None:
        self.active -= 1

    async def _check(self, body: bytes) -> tuple[int, dict, dict]:
        loop = asyncio.get_running_loop()
        judging = loop.run_in_executor(
            self.pool, judge_body, body, self.max_bytes, int(time.time() * 1000), self.cluster_n, self.bands
        )
        seconds = deadline_seconds(len(body))
        try:  # (a page that takes longer is hostile markup; it would hold the stream's pages up)
            judged = await asyncio.wait_for(judging, seconds)
        except TimeoutError:
            if isinstance(self.pool, FingerprintPool):
                self.pool.kill()  # (a running task cannot be cancelled)
            return (
                400,
                {"error": f"parsing this page took over {seconds:.0f}s (hostile markup?)", "reason": "unparsable"},
                {},
            )
        except BrokenProcessPool:  # (its process died, or was killed for another's deadline)
            return (
                503,
                {"error": "the fingerprinting process was restarted; retry", "reason": "busy"},
                {"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        if judged.reason is not None:
            status = 413 if judged.reason == "too_large" else 500 if judged.reason == "internal_error" else 400
            return status, {"error": judged.error, "reason": judged.reason}, {}
        owned = self.owned()
        if not owned:
            return (
                503,
                {
                    "error": "this worker holds no partition right now (starting or rebalancing); retry soon",
                    "reason": "unavailable",
                },
                {"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        done: asyncio.Future = loop.create_future()

        def answered(w) -> None:
            if not done.done():
                done.set_result(w)

        request = self.pending.add_check(judged.page_id, judged.url, judged.fingerprint, answered, judged.cluster)
        try:
            batches = probe_batches(
                self.plan,
                np.array([judged.fingerprint], dtype=np.uint64),
                [request],
                [judged.fetched],
                [id_hash(judged.page_id)],
                [owned[0]],
                [judged.page_id],
                [judged.url],
                kind=CHECKS,
                extra=np.frombuffer(judged.extra, dtype=np.uint8).reshape(1, -1) if self.bands is not None else None,
            )
            for s, batch in batches.items():
                await self.send_probes(s, encode(batch, CHECKS))
            w = await asyncio.wait_for(done, self.timeout)
        except TimeoutError:
            return 504, {"error": f"no answer from the shards within {self.timeout:.0f}s", "reason": "timeout"}, {}
        finally:
            self.pending.cancel(request)
        record = verdict_record(w)
        for key in ("partition", "offset"):
            record.pop(key)
        return 200, record, {}
