"""The worker's fingerprinting processes end with it, and are replaced when one dies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pool_faults
import pytest
from prometheus_client import CollectorRegistry
from test_worker_rebalance import events, stubbed

from streamdedup.pipeline.intake import PROCESS_DIED
from streamdedup.settings import Settings
from streamdedup.stream import app as app_module
from streamdedup.stream.app import Worker


def test_close_returns_once_the_pool_has_ended_so_the_exit_hook_finds_its_pipe_closed(tmp_path):
    """concurrent.futures' exit hook wakes every pool's manager thread through a pipe that the
    thread closes as it ends.  A close that did not wait for it left the two racing at the
    worker's exit: "OSError: [Errno 9] Bad file descriptor" in the log of a clean stop."""
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=1), registry=CollectorRegistry())
    assert w._pool is not None
    pool = w._pool.current
    processes, manager = list(pool._processes.values()), pool._executor_manager_thread
    assert manager is not None and processes
    w.close()
    assert not manager.is_alive()
    assert all(not p.is_alive() for p in processes)


@pytest.fixture
def pooled(tmp_path):
    w = stubbed(tmp_path, processes=1)
    yield w
    w.close()


def outcomes(w: Worker, partition: int, offsets) -> list[str | None]:
    """Each record's dead letter reason, None for a page judged (waiting for its answers)."""
    return [w.pending.at(partition, o).reason for o in offsets]


def test_a_fingerprinting_process_that_dies_is_replaced_and_later_pages_are_judged(pooled):
    """A broken ProcessPoolExecutor stays broken: every later batch, of every partition, became
    internal_error dead letters until the worker restarted."""

    async def scenario() -> None:
        await pooled.drain(events(0, range(0, 3)))
        assert outcomes(pooled, 0, range(0, 3)) == [None] * 3
        assert pooled._pool is not None
        for pid in list(pooled._pool.current._processes):
            os.kill(pid, signal.SIGKILL)  # the OOM killer
        deadline = time.monotonic() + 30
        while not pooled._pool.current._broken:
            assert time.monotonic() < deadline, "the pool never saw its process die"
            await asyncio.sleep(0.05)
        await pooled.drain(events(0, range(3, 6)))
        await pooled.drain(events(1, range(0, 3)))
        assert outcomes(pooled, 0, range(3, 6)) == [None] * 3
        assert outcomes(pooled, 1, range(0, 3)) == [None] * 3
        assert pooled._pool.renewals == 1

    asyncio.run(scenario())


def test_a_page_that_kills_its_process_is_a_dead_letter_and_its_neighbours_are_judged(pooled, monkeypatch):
    monkeypatch.setattr(app_module, "fingerprint_contents", pool_faults.fingerprint_or_die)
    batch = events(0, range(0, 6))
    page = json.loads(batch[3].message.value)
    page["content"] += pool_faults.KILL
    batch[3].message.value = json.dumps(page).encode()

    async def scenario() -> None:
        await pooled.drain(batch)
        assert outcomes(pooled, 0, range(0, 6)) == [None, None, None, "internal_error", None, None]
        assert pooled.pending.at(0, 3).error == PROCESS_DIED
        await pooled.drain(events(0, range(6, 9)))  # and the processes work for the next batch
        assert outcomes(pooled, 0, range(6, 9)) == [None] * 3

    asyncio.run(scenario())


def test_kill_ends_a_task_past_its_deadline_and_the_pool_goes_on():
    """A running task cannot be cancelled: ``kill`` ends its processes, the task fails with
    BrokenProcessPool, and new processes take the next one; a shut-down pool is left alone."""
    from streamdedup.stream.pool import BrokenProcessPool, FingerprintPool

    pool = FingerprintPool(1)
    try:
        stuck = pool.submit(time.sleep, 600)
        queued = pool.submit(sum, [1])  # behind it, not handed to a process yet: failed, not cancelled
        t0 = time.monotonic()
        pool.kill()
        with pytest.raises(BrokenProcessPool):
            stuck.result(timeout=60)
        with pytest.raises(BrokenProcessPool):  # (the worker retries those; a CancelledError was lost)
            queued.result(timeout=60)
        assert time.monotonic() - t0 < 30 and pool.renewals == 1
        assert pool.submit(sum, [1, 2]).result(timeout=60) == 3
    finally:
        pool.shutdown()
    renewals = pool.renewals
    pool.kill()  # shut down (the worker stopping): no AttributeError, and no new processes
    assert pool.renewals == renewals
