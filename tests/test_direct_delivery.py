"""The drain loop that hands the pages topic's records straight to the worker
(stream/direct_delivery.py).

Which records take the direct way is decided per record from faust's consumer state (flow
control, suspension, generation), which a real broker cannot be made to show on cue: these
tests drive the loop with a stand-in for faust's consumer that has exactly the attributes the
loop reads.  The loop on faust's real consumer, with a real broker, runs in every worker test
under tests/integration (the worker registers the pages topic).  Every wait has a deadline."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport import consumer as faust_consumer
from faust.types import TP

from streamdedup.stream import direct_delivery
from streamdedup.stream.direct_delivery import deliver_directly

PAGES, OTHER = "pages", "probes"
DEADLINE = 5.0


class _Flow:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


class _Stopped:
    def __init__(self) -> None:
        self.stopped = False

    def is_set(self) -> bool:
        return self.stopped


def _message(topic: str, partition: int, offset: int, generation: int = 1) -> Any:
    return SimpleNamespace(
        topic=topic, partition=partition, offset=offset, generation_id=generation, tp=TP(topic, partition)
    )


def _consumer(batches: list[list[Any]], on_record: Any = None) -> tuple[Any, list, Any]:
    """A stand-in for faust's consumer: ``getmany`` yields ``batches`` one a call, then the loop
    is stopped; the conductor's callback records what faust's way received."""
    via_faust: list = []
    fetcher = SimpleNamespace(_stopped=_Stopped())
    app = SimpleNamespace(
        topics=SimpleNamespace(acks_enabled_for=lambda topic: False),
        flow_control=_Flow(),
        consumer_generation_id=1,
        should_stop=False,
    )
    pending = list(batches)

    async def getmany(timeout: float):
        batch = pending.pop(0) if pending else []
        if not pending:
            fetcher._stopped.stopped = True
        for m in batch:
            if on_record is not None:
                on_record(m, app, consumer)
            yield m.tp, m

    async def callback(message: Any) -> None:
        via_faust.append(message)

    async def wait_first(*coros: Any) -> None:
        await coros[0]
        coros[1].close()

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)

    consumer = SimpleNamespace(
        app=app,
        callback=callback,
        getmany=getmany,
        _stopped=_Stopped(),
        _read_offset=defaultdict(lambda: None),
        diag=SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None),
        _commit_every=None,
        _n_acked=0,
        suspend_flow=asyncio.Event(),
        sleep=sleep,
        should_stop=False,
        wait_first=wait_first,
        consumer_stopped_errors=(),
        transport=SimpleNamespace(app=app),
        log=SimpleNamespace(info=lambda *a: None, exception=lambda *a: None),
    )
    return consumer, via_faust, fetcher


async def _drain(consumer: Any, fetcher: Any) -> None:
    await asyncio.wait_for(direct_delivery._drain_messages(consumer, fetcher), DEADLINE)


def test_faust_loop_is_the_one_the_direct_loop_copies():
    """A faust upgrade that changes ``Consumer._drain_messages`` fails here: check the copy in
    direct_delivery.py against the new loop, then update FAUST_LOOP_SHA256."""
    assert direct_delivery.faust_loop_digest() == direct_delivery.FAUST_LOOP_SHA256


def test_registering_installs_the_loop_and_an_app_without_handlers_keeps_faust_s():
    app = SimpleNamespace()
    deliver_directly(app, PAGES, lambda m: None)
    assert faust_consumer.Consumer._drain_messages is direct_delivery._drain_messages
    assert set(app._streamdedup_direct) == {PAGES}

    plain = SimpleNamespace(app=SimpleNamespace())  # no handler: faust's own loop is awaited
    called = []

    async def faust_drain(self: Any, fetcher: Any) -> None:
        called.append(self)

    real = direct_delivery._faust_drain
    direct_delivery._faust_drain = faust_drain
    try:
        asyncio.run(_drain(plain, SimpleNamespace()))
    finally:
        direct_delivery._faust_drain = real
    assert called == [plain]


def test_the_direct_topic_s_records_reach_the_handler_in_order_and_others_go_faust_s_way():
    records = [_message(PAGES, 0, 0), _message(OTHER, 0, 0), _message(PAGES, 0, 1), _message(PAGES, 1, 0)]
    consumer, via_faust, fetcher = _consumer([records[:2], records[2:]])
    direct: list = []
    consumer.app._streamdedup_direct = {PAGES: direct.append}
    asyncio.run(_drain(consumer, fetcher))
    assert direct == [records[0], records[2], records[3]]
    assert via_faust == [records[1]]
    assert dict(consumer._read_offset) == {TP(PAGES, 0): 1, TP(OTHER, 0): 0, TP(PAGES, 1): 0}


def test_a_record_read_again_below_the_read_offset_is_not_delivered_twice():
    first = [_message(PAGES, 0, 0), _message(PAGES, 0, 1)]
    consumer, via_faust, fetcher = _consumer([first, [_message(PAGES, 0, 0), _message(PAGES, 0, 2)]])
    direct: list = []
    consumer.app._streamdedup_direct = {PAGES: direct.append}
    asyncio.run(_drain(consumer, fetcher))
    assert [(m.partition, m.offset) for m in direct] == [(0, 0), (0, 1), (0, 2)]
    assert via_faust == []


@pytest.mark.parametrize("state", ["flow_suspended", "suspend_flow_set", "older_generation"])
def test_records_during_a_rebalance_go_faust_s_way_not_the_direct_one(state):
    """faust's stream skips such records (or its conductor holds them until the flow resumes):
    the direct way must not hand them to the worker behind faust's back."""

    def change(m: Any, app: Any, consumer: Any) -> None:
        if m.offset == 1:
            if state == "flow_suspended":
                app.flow_control.active = False
            elif state == "suspend_flow_set":
                consumer.suspend_flow.set()
            else:
                app.consumer_generation_id = 2

    records = [_message(PAGES, 0, 0), _message(PAGES, 0, 1), _message(PAGES, 0, 2)]
    consumer, via_faust, fetcher = _consumer([records], on_record=change)
    direct: list = []
    consumer.app._streamdedup_direct = {PAGES: direct.append}
    asyncio.run(_drain(consumer, fetcher))
    assert direct == [records[0]]
    assert via_faust == records[1:]


def test_a_failing_handler_stops_the_loop_with_its_error():
    consumer, _, fetcher = _consumer([[_message(PAGES, 0, 0)]])

    def broken(message: Any) -> None:
        raise RuntimeError("handler failed")

    consumer.app._streamdedup_direct = {PAGES: broken}
    with pytest.raises(RuntimeError, match="handler failed"):
        asyncio.run(_drain(consumer, fetcher))
