"""``POST /check``: one page judged against every stored page, without storing it.

The page's probes go to the shards as a batch of kind CHECKS (the shards answer and do not
insert), their answers come back to a partition this worker owns, and the request waits for
them in :class:`~streamdedup.pipeline.pending.Pending` like a page, but is never released to Kafka.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from streamdedup.engine.records import page_from_json, page_text
from streamdedup.errors import RecordError
from streamdedup.fingerprinting.pages import Fingerprints
from streamdedup.pipeline.intake import fetched_ms, id_hash, probe_batches
from streamdedup.pipeline.routing import verdict_record
from streamdedup.pipeline.wire import CHECKS, encode

if TYPE_CHECKING:
    from streamdedup.stream.app import Worker

__all__ = ["check"]


async def check(worker: Worker, body: bytes, timeout: float = 10.0) -> tuple[int, dict]:
    """(HTTP status, JSON body) for a synchronous check of one page record."""
    try:
        page = page_from_json(body, worker.settings.max_page_bytes)
        fetched = fetched_ms(page.fetched_at, int(time.time() * 1000))
        text = page_text(page)
    except RecordError as e:
        return (413 if e.reason == "too_large" else 400), {"error": e.message, "reason": e.reason}
    owned = sorted(
        tp.partition for tp in worker.app.consumer.assignment() if tp.topic == worker.answers_topic.get_topic_name()
    )
    if not owned:
        return 503, {
            "error": "this worker holds no partition right now (starting or rebalancing); retry soon",
            "reason": "unavailable",
        }
    fp = Fingerprints([text]).simhash
    done: asyncio.Future = asyncio.get_running_loop().create_future()
    request = worker.pending.add_check(page.id, page.url, int(fp[0]), lambda w: done.done() or done.set_result(w))
    batches = probe_batches(
        worker.plan, fp, [request], [fetched], [id_hash(page.id)], [owned[0]], [page.id], [page.url], kind=CHECKS
    )
    for s, batch in batches.items():
        await worker.probes_topic.send(value=encode(batch, CHECKS), partition=s)
    try:
        w = await asyncio.wait_for(done, timeout)
    except TimeoutError:
        worker.pending.cancel(request)
        return 504, {"error": f"no answer from the shards within {timeout:.0f}s", "reason": "timeout"}
    record = verdict_record(w)
    for key in ("partition", "offset"):
        record.pop(key)
    return 200, record
