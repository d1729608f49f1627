"""The records of chosen topics handed by faust's consumer straight to a function.

faust passes every record it fetched through ``Consumer._drain_messages``: for each one,
``wait_first`` races the conductor's callback against the flow's suspension (four tasks and an
``asyncio.wait`` a record); the conductor then builds an ``Event`` and queues it, and the agent's
stream takes it out again, with a sensor call on each side.  The worker's pages agent only
buffers the record (``Worker._deliver`` never awaits), so all of that was overhead on every page:
the profile of a backlog put faust's per-message path at about a quarter of the event loop
(bench/README.md, "Where the worker's CPU goes on a backlog").

:func:`deliver_directly` registers a handler for a topic; the drain loop installed here then calls
``handler(message)`` for that topic's records, synchronously, when faust's stream would take them:
the flow is active (no rebalance under way) and the record is of the consumer's generation.  Any
other record of the topic, and every record of other topics, goes faust's way as before (so a
record that faust would drop is dropped by faust; the worker's hole filling reads what was not
delivered).  Apps without a handler run faust's own loop unchanged.

Written against faust-streaming 0.15.3's ``Consumer._drain_messages`` (the loop below is that
loop with the direct branch added); ``tests/test_direct_delivery.py`` fails when faust's loop
changes, so that this one is checked against it again.  Records delivered directly do not pass
faust's stream sensors: ``streamdedup_faust_events*`` no longer count pages (the worker's own
``streamdedup_pages_total`` does).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
from collections.abc import Callable
from typing import Any, cast

from faust.transport import consumer as faust_consumer
from faust.transport.consumer import CONSUMER_FETCHING

__all__ = ["deliver_directly", "install"]

log = logging.getLogger(__name__)

#: faust-streaming 0.15.3's ``Consumer._drain_messages``, the loop :func:`_drain_messages` copies
FAUST_LOOP_SHA256 = "44a2500309e83c630493f6828af50166ec8d96a0b3e4fb2bab735f704ae93417"
_ATTR = "_streamdedup_direct"  # on the faust app: topic name -> handler(message)
_faust_drain = faust_consumer.Consumer._drain_messages


def deliver_directly(app: Any, topic: str, handler: Callable[[Any], None]) -> None:
    """Hand the records of ``topic`` that faust's stream would take to ``handler(message)``
    (faust's ``Message``), from the consumer's drain loop.  ``handler`` must not block: it runs
    inside the loop that reads every topic."""
    if install():
        setattr(app, _ATTR, {**getattr(app, _ATTR, {}), topic: handler})


def install() -> bool:
    """Put the drain loop below in place of faust's (idempotent; apps without handlers get faust's).
    If faust's loop is not the one this was written against, leave it and say so: the records
    then go faust's way, as before, only slower."""
    if faust_consumer.Consumer._drain_messages is _drain_messages:
        return True
    if faust_loop_digest() != FAUST_LOOP_SHA256:
        log.warning(
            "faust's Consumer._drain_messages is not the one of faust-streaming 0.15.3 that "
            "streamdedup.stream.direct_delivery was written against: pages go through faust's "
            "stream (slower); install the faust-streaming version pyproject.toml pins"
        )
        return False
    faust_consumer.Consumer._drain_messages = _drain_messages  # type: ignore[method-assign]
    return True


def faust_loop_digest() -> str:
    """SHA-256 of the source of faust's own drain loop ('' where its source cannot be read)."""
    try:
        return hashlib.sha256(inspect.getsource(_faust_drain).encode()).hexdigest()
    except (OSError, TypeError):
        return ""


async def _drain_messages(
    self: Any, fetcher: Any
) -> None:  # pragma: no cover (faust's loop; covered by the worker tests)
    direct: dict[str, Callable[[Any], None]] | None = getattr(self.app, _ATTR, None)
    if not direct:
        return await _faust_drain(self, fetcher)
    app = self.app
    callback = self.callback
    getmany = self.getmany
    consumer_should_stop = self._stopped.is_set
    fetcher_should_stop = cast(Any, fetcher)._stopped.is_set
    get_read_offset = self._read_offset.__getitem__
    set_read_offset = self._read_offset.__setitem__
    set_flag = self.diag.set_flag
    unset_flag = self.diag.unset_flag
    commit_every = self._commit_every
    acks_enabled_for = app.topics.acks_enabled_for
    flow_active = app.flow_control.is_active
    suspended = self.suspend_flow.is_set
    direct_get = direct.get

    yield_every = 100
    num_since_yield = 0
    sleep = asyncio.sleep

    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            set_flag(CONSUMER_FETCHING)
            ait = getmany(timeout=1.0)
            await self.sleep(0)
            if not self.should_stop:
                async for tp, message in ait:
                    num_since_yield += 1
                    if num_since_yield > yield_every:
                        await sleep(0)
                        num_since_yield = 0
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is None or offset >= r_offset:
                        gap = offset - (r_offset or 0)
                        if gap > 1 and r_offset and acks_enabled_for(message.topic):
                            await self._add_gap(tp, r_offset + 1, offset)
                        if commit_every is not None and self._n_acked >= commit_every:
                            self._n_acked = 0
                            await self.commit()
                        handler = direct_get(tp.topic)
                        if (
                            handler is not None
                            and flow_active()
                            and not suspended()
                            and message.generation_id == app.consumer_generation_id
                        ):
                            handler(message)
                        else:
                            await self.wait_first(callback(message), self.suspend_flow.wait())
                        set_read_offset(tp, offset)
                unset_flag(CONSUMER_FETCHING)
    except self.consumer_stopped_errors:
        if self.transport.app.should_stop:
            self.log.info("Broker stopped consumer, shutting down...")
            return
        raise
    except asyncio.CancelledError:
        if self.transport.app.should_stop:
            self.log.info("Consumer shutting down for user cancel.")
            return
        raise
    except Exception as exc:
        self.log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        unset_flag(CONSUMER_FETCHING)
