"""The worker's table manager (stream/recovery.py): faust's, without the 1 s sleep before its
tables are registered (the consumer subscribes, and so every start joins the group, only then)."""

from __future__ import annotations

import asyncio
import time

from faust.tables.manager import TableManager
from prometheus_client import CollectorRegistry

from streamdedup.settings import Settings
from streamdedup.stream.app import Worker
from streamdedup.stream.recovery import ShardTables


def registered_after(manager_class: type[TableManager], tmp_path) -> float:
    """Seconds from the manager's on_start until its tables are registered (the registration and
    the recovery's start stubbed: they need a broker)."""
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    manager = manager_class(w.app)
    for table in w.app.tables.values():
        manager.add(table)

    async def register() -> None:
        manager._tables_registered.set()

    async def no_recovery() -> None:
        pass

    manager._update_channels = register  # type: ignore[method-assign]
    manager.recovery.start = no_recovery  # type: ignore[method-assign]

    async def run() -> float:
        t0 = time.perf_counter()
        await asyncio.wait_for(manager.on_start(), 5)
        assert manager._tables_registered.is_set()
        return time.perf_counter() - t0

    return asyncio.run(run())


def test_the_worker_app_uses_the_shard_tables(tmp_path):
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    assert type(w.app.tables) is ShardTables
    assert "shards" in w.app.tables


def test_tables_are_registered_without_fausts_second_of_sleep(tmp_path):
    assert registered_after(TableManager, tmp_path / "faust") >= 1.0  # (what is left out)
    assert registered_after(ShardTables, tmp_path / "ours") < 0.5
