"""Hand a :class:`~streamdedup.stream.app.Worker`'s store an assignment as faust's rebalance does
(for tests that drive ``ShardStore.on_rebalance`` without a consumer group)."""

from __future__ import annotations

from faust.types import TP

from streamdedup.stream.app import Worker


async def assign(w: Worker, monkeypatch, partitions: set[int]) -> None:
    """A rebalance that gives ``w`` the shard changelog ``partitions`` as actives."""
    store, topic = w.store, w.store._changelog()
    w.app.on_rebalance_start()
    assigned = {TP(topic, p) for p in partitions}
    monkeypatch.setattr(w.app.assignor, "assigned_actives", lambda: assigned)
    await store.on_rebalance(assigned, set(), assigned)
