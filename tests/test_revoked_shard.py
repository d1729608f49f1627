"""A shard batch that arrives after its shard partition moved away (issue 11; docs/faust-notes.md §12).

faust hands the shard agent probes that it took before a rebalance: the ``take_events`` buffer
is filled before the revocation and yielded up to ``within`` seconds later, and a failed batch is
retried after a back-off.  Such a *late* batch used to reach ``ShardStore.shard(partition)`` for a
partition the store had dropped at the assignment: a new, EMPTY shard was created, the batch's
pages stored in it, a changelog record written, and ``covered()`` recorded that record's offset.
When the partition came back to this worker, the store trusted that offset (the shard still in
memory, or its snapshot written at the next rebalance) and recovery replayed only the changelog
after it: every page stored before was gone from the index, and its copies were judged unique.

The last test is of the same stage when a changelog write fails (its pages are owed to the
changelog, and written with the retry).

These tests drive a Worker's shard stage (``Worker.on_probes``, the production path) and its
store through faust's rebalance and recovery calls, with the changelog and the answers topic
stubbed.  faust's recovery is played by :func:`recover`: the store's ``persisted_offset``, then
``apply_changelog_batch`` with the changelog records after it, as faust's Recovery does.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
from faust.types import TP
from prometheus_client import CollectorRegistry

from streamdedup.pipeline.intake import id_hash
from streamdedup.pipeline.snapshot_file import read_arrays
from streamdedup.pipeline.wire import ANSWERS, CHANGELOG, PROBES, Batch, decode, encode
from streamdedup.settings import Settings
from streamdedup.stream.app import Worker
from streamdedup.stream.store import NotAssigned, ShardStore

INPUT = 1  # the pages partition whose pages wait for the answers


@dataclass
class Message:
    partition: int
    offset: int
    value: bytes


@dataclass
class Event:
    message: Message

    @property
    def value(self) -> bytes:
        return self.message.value


@dataclass
class Cluster:
    """The shard changelog (one list of records per partition) and the answers sent."""

    changelog: dict[int, list[bytes]] = field(default_factory=dict)
    answers: list[Batch] = field(default_factory=list)

    def append(self, partition: int, value: bytes) -> int:
        records = self.changelog.setdefault(partition, [])
        records.append(value)
        return len(records) - 1

    async def send_changelog(self, partition: int, key: bytes, value: bytes, **kwargs) -> SimpleNamespace:
        return SimpleNamespace(offset=self.append(partition, value))  # what the write's ack says

    async def send_answers(self, value: bytes, partition: int) -> asyncio.Future:
        self.answers.append(decode([value], ANSWERS))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: len(self.changelog.get(p, [])) for p in partitions}

    async def never(self, *tps: TP) -> dict[TP, int]:
        """faust's consumer inside a rebalance: its thread is busy, the request never returns."""
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def stubbed_worker(tmp_path, cluster: Cluster, monkeypatch, **settings) -> Worker:
    """A Worker (2 partitions, no pool) whose Kafka is ``cluster``."""
    w = Worker(
        Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2, **settings), registry=CollectorRegistry()
    )
    monkeypatch.setattr(w.table, "send_changelog", cluster.send_changelog)
    monkeypatch.setattr(w.answers_topic, "send", cluster.send_answers)
    monkeypatch.setattr(ShardStore, "end_offsets", cluster.end_offsets)  # the worker's own client
    monkeypatch.setattr(w.app, "_consumer", SimpleNamespace(highwaters=cluster.never))  # faust's, busy
    return w


def gated_writes(w: Worker, cluster: Cluster, monkeypatch, partition: int | None = None) -> list[asyncio.Future]:
    """Changelog writes of ``w`` (to ``partition``, or to any) that wait on the future put in the
    returned list while it holds one: it stands for the broker's answer to them."""
    gate: list[asyncio.Future] = []

    def send_changelog(p: int, key: bytes, value: bytes, **kwargs):
        if gate and partition in (None, p):
            return gate[0]
        return cluster.send_changelog(p, key, value, **kwargs)

    monkeypatch.setattr(w.table, "send_changelog", send_changelog)
    return gate


def refused_writes(w: Worker, cluster: Cluster, monkeypatch, partition: int | None = None) -> list[Exception]:
    """Changelog writes of ``w`` (to ``partition``, or to any) that the producer refuses at once,
    one for each error put in the returned list."""
    errors: list[Exception] = []

    def send_changelog(p: int, key: bytes, value: bytes, **kwargs):
        if errors and partition in (None, p):
            raise errors.pop()
        return cluster.send_changelog(p, key, value, **kwargs)

    monkeypatch.setattr(w.table, "send_changelog", send_changelog)
    return errors


@pytest.fixture
def worker(tmp_path, cluster, monkeypatch):
    w = stubbed_worker(tmp_path, cluster, monkeypatch)
    yield w
    w.close()


def page(n: int, shard: int, plan, near: np.uint64 | None = None) -> tuple[np.uint64, str]:
    """A fingerprint whose group-0 probe goes to ``shard`` (``near``: one bit away from it)."""
    if near is not None:
        bit = next(b for b in range(64) if not int(plan.masks[0]) >> b & 1)  # outside group 0's bits:
        fp = near ^ np.uint64(1 << bit)  # the two agree on group 0, whose probes go to the same shard
        assert int(plan.probes(np.array([fp], dtype=np.uint64))[0, 0]) == shard
        return fp, f"http://a.test/{n}"
    rng = np.random.default_rng(n)
    while True:
        fp = rng.integers(0, 2**64 - 1, dtype=np.uint64, endpoint=True)
        if int(plan.probes(np.array([fp], dtype=np.uint64))[0, 0]) == shard:
            return fp, f"http://a.test/{n}"


def rows(fp: np.uint64, url: str, request: int = 0) -> Batch:
    return Batch.build(
        group=[0],
        fps=[fp],
        fetched=[0],
        id_hash=[id_hash(url)],
        ids=[url],
        urls=[url],
        request=request,
        partition=INPUT,
    )


def probes(shard: int, offset: int, fp: np.uint64, url: str, request: int) -> list[Event]:
    return [Event(Message(shard, offset, encode(rows(fp, url, request), PROBES)))]


async def assign(w: Worker, cluster: Cluster, monkeypatch, active: set[int], standby: set[int] = frozenset()) -> None:
    """A rebalance as faust runs it on this worker: the revocation starts it, the assignment calls
    the store's on_rebalance, and recovery replays each assigned changelog partition from the
    offset the store says it covers (actives and standbys alike)."""
    store, topic = w.store, w.store._changelog()
    w.app.on_rebalance_start()  # faust's revoke listener, before anything else
    before = {TP(topic, p) for p in store.shards}
    assigned = {TP(topic, p) for p in active | standby}
    monkeypatch.setattr(w.app.assignor, "assigned_actives", lambda: {TP(topic, p) for p in active})
    await store.on_rebalance(assigned, before - assigned, assigned - before)
    for tp in sorted(assigned):
        await recover(store, cluster, tp)


async def recover(store: ShardStore, cluster: Cluster, tp: TP) -> None:
    start = store.persisted_offset(tp)
    first = 0 if start is None else start + 1
    records = cluster.changelog.get(tp.partition, [])[first:]
    store.apply_changelog_batch(
        [Event(Message(tp.partition, first + i, value)) for i, value in enumerate(records)], None, None
    )


def answer_to(cluster: Cluster, request: int) -> tuple[int, str]:
    """(distance, match id) of the answer to ``request`` (distance -1: no match)."""
    found = [
        (int(d), i)
        for b in cluster.answers
        for r, d, i in zip(b.rows["request"], b.rows["distance"], b.ids())
        if r == request
    ]
    assert len(found) == 1, f"request {request}: {found}"
    return found[0]


SHARD = 0


@pytest.mark.parametrize("comes_back", ["at the next rebalance", "after another rebalance, from its snapshot"])
def test_a_late_batch_for_a_revoked_shard_does_not_cost_the_pages_stored_before(
    worker, cluster, monkeypatch, comes_back
):
    plan, other = worker.plan, 1 - SHARD
    first, late, new_owners = page(1, SHARD, plan), page(2, SHARD, plan), page(3, SHARD, plan)
    copy = page(4, SHARD, plan, near=first[0])

    async def scenario() -> None:
        await assign(worker, cluster, monkeypatch, active={SHARD, other})
        await worker.on_probes(probes(SHARD, 0, *first, request=11))
        assert answer_to(cluster, 11) == (-1, "")  # stored, unique
        await assign(worker, cluster, monkeypatch, active={other})  # the shard partition moves away
        cluster.append(SHARD, encode(rows(*new_owners), CHANGELOG))  # its new owner stores a page
        # probes taken before that rebalance reach the shard stage only now
        await worker.on_probes(probes(SHARD, 1, *late, request=12))
        if comes_back != "at the next rebalance":
            await assign(worker, cluster, monkeypatch, active={other})  # a snapshot of what it holds now
        await assign(worker, cluster, monkeypatch, active={SHARD, other})  # and it comes back here
        await worker.on_probes(probes(SHARD, 2, *copy, request=13))

    asyncio.run(scenario())
    # the page stored before the move is still in the index: its copy is a near-duplicate of it
    assert answer_to(cluster, 13) == (1, first[1])
    # the late batch was left to the partition's owner (its pages are read again, since their
    # answers never reached them): no record of it in the changelog, no answer from here
    assert [decode([v], CHANGELOG).ids() for v in cluster.changelog[SHARD]] == [[first[1]], [new_owners[1]], [copy[1]]]
    assert not any(12 in b.rows["request"] for b in cluster.answers)


def test_a_late_batch_for_a_shard_now_on_standby_here_does_not_move_its_replay_past_the_owners_records(
    worker, cluster, monkeypatch
):
    """A standby shard holds what the changelog replay gave it, up to the offset it replayed: a
    late batch stored into it claimed its own write's offset, and a failover then replayed the
    changelog after that offset, skipping the new owner's records the standby had not read yet."""
    plan, other = worker.plan, 1 - SHARD
    first, late, new_owners = page(1, SHARD, plan), page(2, SHARD, plan), page(3, SHARD, plan)
    copy = page(4, SHARD, plan, near=new_owners[0])

    async def scenario() -> None:
        await assign(worker, cluster, monkeypatch, active={SHARD, other})
        await worker.on_probes(probes(SHARD, 0, *first, request=11))
        await assign(worker, cluster, monkeypatch, active={other}, standby={SHARD})  # a standby here now
        cluster.append(SHARD, encode(rows(*new_owners), CHANGELOG))  # the owner's write, not replayed here yet
        await worker.on_probes(probes(SHARD, 1, *late, request=12))
        await assign(worker, cluster, monkeypatch, active={SHARD, other})  # the owner fails: it is active here again
        await worker.on_probes(probes(SHARD, 2, *copy, request=13))

    asyncio.run(scenario())
    assert answer_to(cluster, 13) == (1, new_owners[1])
    assert not any(12 in b.rows["request"] for b in cluster.answers)


def test_batches_for_the_shards_this_worker_owns_are_stored_and_answered(worker, cluster, monkeypatch):
    """The guard holds back only partitions not owned: the owned ones, kept across a rebalance, are
    served as always, and what they stored is covered (a restart replays nothing twice)."""
    plan = worker.plan
    first = page(1, SHARD, plan)
    copy = page(4, SHARD, plan, near=first[0])

    async def scenario() -> None:
        await assign(worker, cluster, monkeypatch, active={SHARD})
        await worker.on_probes(probes(SHARD, 0, *first, request=11))
        await assign(worker, cluster, monkeypatch, active={SHARD, 1 - SHARD})  # kept across a rebalance
        await worker.on_probes(probes(SHARD, 1, *copy, request=13))

    asyncio.run(scenario())
    assert answer_to(cluster, 11) == (-1, "")
    assert answer_to(cluster, 13) == (1, first[1])
    assert worker.store.offsets[SHARD] == len(cluster.changelog[SHARD]) - 1 == 1


def test_no_shard_is_made_for_a_partition_not_assigned_here(worker, cluster, monkeypatch):
    """The store's own guard, whatever calls it: no empty shard for a partition held neither
    active nor standby, and changelog records of such a partition (a replay still running
    when it moved) are not restored into one."""
    plan, other = worker.plan, 1 - SHARD
    stored = page(1, SHARD, plan)
    cluster.append(SHARD, encode(rows(*stored), CHANGELOG))

    async def scenario() -> None:
        await assign(worker, cluster, monkeypatch, active={other})

    asyncio.run(scenario())
    store = worker.store
    with pytest.raises(NotAssigned):
        store.shard(SHARD)
    store.apply_changelog_batch([Event(Message(SHARD, 0, cluster.changelog[SHARD][0]))], None, None)
    assert SHARD not in store.shards and SHARD not in store.offsets
    assert not store.serves(SHARD) and store.serves(other)
    worker.app.on_rebalance_start()  # a rebalance begins: nothing is served until its assignment
    assert not store.serves(other)


def test_end_offsets_are_read_by_the_workers_own_client_not_fausts_busy_consumer(worker, cluster, monkeypatch):
    """Inside a rebalance faust's consumer thread runs the rebalance, so an offsets request made
    through it waits until its timeout (docs/faust-notes.md §11): a SIGTERM then waited too.  The
    store reads the changelog's end offsets with the worker's own client instead."""
    store, topic = worker.store, worker.store._changelog()
    for value in (b"a", b"b", b"c"):
        cluster.append(1, value)

    async def rebalance() -> None:
        worker.app.on_rebalance_start()
        monkeypatch.setattr(worker.app.assignor, "assigned_actives", lambda: {TP(topic, 1)})
        tps = {TP(topic, 0), TP(topic, 1)}
        await asyncio.wait_for(store.on_rebalance(tps, set(), tps), timeout=4.0)  # < END_OFFSETS_TIMEOUT

    asyncio.run(rebalance())
    assert store.ends == {0: 0, 1: 3}


@pytest.mark.parametrize("fails", ["when sent", "when awaited"])
def test_a_page_whose_changelog_write_failed_is_written_by_the_retry_before_it_is_answered(
    worker, cluster, monkeypatch, fails
):
    """The first changelog write fails (the producer refuses it at once, or its future fails
    later): the step raises before any answer, and its retry, which finds the page stored and so
    stores nothing, writes the page's changelog record all the same before it answers (so a
    shard rebuilt from the changelog has the page)."""
    plan = worker.plan
    first = page(1, SHARD, plan)
    copy = page(4, SHARD, plan, near=first[0])
    broken = [RuntimeError("the broker is away")]

    def send_changelog(partition: int, key: bytes, value: bytes, **kwargs):
        if broken:
            error = broken.pop()
            if fails == "when sent":
                raise error

            async def failed():
                raise error

            return failed()
        return cluster.send_changelog(partition, key, value, **kwargs)

    monkeypatch.setattr(worker.table, "send_changelog", send_changelog)

    async def scenario() -> None:
        await assign(worker, cluster, monkeypatch, active={SHARD})
        with pytest.raises(RuntimeError, match="the broker is away"):
            await worker.on_probes(probes(SHARD, 0, *first, request=11))
        assert not cluster.changelog.get(SHARD) and not cluster.answers  # no answer about a page it could lose
        await worker.on_probes(probes(SHARD, 0, *first, request=11))  # the stage's retry
        assert answer_to(cluster, 11) == (-1, "")
        # the page is in the changelog (a shard rebuilt from it has the page), covered here
        assert [decode([v], CHANGELOG).ids() for v in cluster.changelog[SHARD]] == [[first[1]]]
        assert worker.store.offsets[SHARD] == 0
        await worker.on_probes(probes(SHARD, 1, *copy, request=13))

    asyncio.run(scenario())
    assert answer_to(cluster, 13) == (1, first[1])
    assert [decode([v], CHANGELOG).ids() for v in cluster.changelog[SHARD]] == [[first[1]], [copy[1]]]


def test_a_tombstone_whose_write_failed_is_written_by_the_retry(tmp_path, cluster, monkeypatch):
    """--retention: a page's changelog record whose rows have all expired is deleted with a
    tombstone.  If that write fails, the retry writes the tombstone (so Kafka's compaction still
    removes the record, and a replay does not hold the page again)."""
    w = stubbed_worker(tmp_path, cluster, monkeypatch, retention=3600)  # an hour
    broken = [RuntimeError("the broker is away")]

    async def send_changelog(partition: int, key: bytes, value: bytes | None, **kwargs):
        if value is None and broken:
            raise broken.pop()
        return await cluster.send_changelog(partition, key, value, **kwargs)

    monkeypatch.setattr(w.table, "send_changelog", send_changelog)
    old, new = page(1, SHARD, w.plan), page(2, SHARD, w.plan)
    hour = 3600 * 1000
    t0 = int(time.time() * 1000) - 10 * hour

    def fetched_at(at: int, fp: np.uint64, url: str, request: int) -> list[Event]:
        batch = rows(fp, url, request)
        batch.rows["fetched"] = at
        return [Event(Message(SHARD, request, encode(batch, PROBES)))]

    async def scenario() -> None:
        await assign(w, cluster, monkeypatch, active={SHARD})
        await w.on_probes(fetched_at(t0, *old, request=1))
        with pytest.raises(RuntimeError, match="the broker is away"):  # 2 h later: the old page has expired
            await w.on_probes(fetched_at(t0 + 2 * hour, *new, request=2))
        assert [v is None for v in cluster.changelog[SHARD]] == [False, False]
        await w.on_probes(fetched_at(t0 + 2 * hour, *new, request=2))  # the stage's retry

    try:
        asyncio.run(scenario())
    finally:
        w.close()
    assert [None if v is None else decode([v], CHANGELOG).ids() for v in cluster.changelog[SHARD]] == [
        [old[1]],
        [new[1]],
        None,
    ]
    assert answer_to(cluster, 2) == (-1, "")


@pytest.mark.parametrize("then", ["moves away", "is a standby here", "the worker stops"])
def test_a_page_owed_to_the_changelog_reaches_it_after_the_shard_moves_or_the_worker_stops(
    tmp_path, cluster, monkeypatch, then
):
    """A step stored a page and its changelog write failed: the page is owed to the changelog.
    Before a step of that shard succeeds, the shard partition moves away (its snapshot is taken),
    becomes a standby here (it stays in memory), or the worker stops (snapshots are taken).  The
    page, never answered, is read again and its probe comes to this worker once the shard is
    active here again.  The changelog must then hold the page, so that a shard rebuilt from it
    alone (another worker, no snapshot) has it too: a snapshot or a shard in memory that holds a
    page the changelog lacks made the retry find it stored and write nothing."""
    w = stubbed_worker(tmp_path / "w", cluster, monkeypatch)
    plan, other = w.plan, 1 - SHARD
    before, first, elsewhere = page(3, SHARD, plan), page(1, SHARD, plan), page(2, other, plan)
    copy = page(4, SHARD, plan, near=first[0])
    broken = refused_writes(w, cluster, monkeypatch, SHARD)

    async def failed_step() -> None:
        await assign(w, cluster, monkeypatch, active={SHARD, other})
        await w.on_probes(probes(SHARD, 0, *before, request=10))  # written: the shard covers offset 0
        broken.append(RuntimeError("the broker is away"))
        with pytest.raises(RuntimeError, match="the broker is away"):
            await w.on_probes(probes(SHARD, 1, *first, request=11))
        if then == "the worker stops":
            await w.store.on_stop()
            return
        if then == "moves away":
            await assign(w, cluster, monkeypatch, active={other})
        else:
            await assign(w, cluster, monkeypatch, active={other}, standby={SHARD})
        await w.on_probes(probes(other, 0, *elsewhere, request=12))  # another shard's step meanwhile
        await assign(w, cluster, monkeypatch, active={SHARD, other})  # the shard comes back

    async def read_again(w: Worker) -> None:
        if then == "the worker stops":
            await assign(w, cluster, monkeypatch, active={SHARD, other})
        await w.on_probes(probes(SHARD, 2, *first, request=21))

    asyncio.run(failed_step())
    if then == "the worker stops":
        w.close()
        w = stubbed_worker(tmp_path / "w", cluster, monkeypatch)  # restarted on its data dir
    try:
        asyncio.run(read_again(w))
    finally:
        w.close()
    assert answer_to(cluster, 21) == (-1, "")
    assert [first[1]] in [decode([v], CHANGELOG).ids() for v in cluster.changelog[SHARD]]
    fresh = stubbed_worker(tmp_path / "fresh", cluster, monkeypatch)  # rebuilt from the changelog alone

    async def rebuilt() -> None:
        await assign(fresh, cluster, monkeypatch, active={SHARD, other})
        await fresh.on_probes(probes(SHARD, 3, *copy, request=31))

    try:
        asyncio.run(rebuilt())
    finally:
        fresh.close()
    assert answer_to(cluster, 31) == (1, first[1])


@pytest.mark.parametrize("write", ["fails", "lands"])
def test_a_snapshot_taken_while_a_changelog_write_is_under_way_waits_for_it(tmp_path, cluster, monkeypatch, write):
    """A shard's periodic snapshot is taken while a write of rows it stored is under way (another
    step's).  It is written once the write lands; if the write fails, never: it would hold a page
    the changelog lacks, and the restarted worker, loading it, would find the page stored when it
    is read again and write nothing.  Instead the shard is rebuilt from the changelog there, and
    the page is stored and written."""
    w = stubbed_worker(tmp_path / "w", cluster, monkeypatch)
    before, first = page(3, SHARD, w.plan), page(1, SHARD, w.plan)
    copy = page(4, SHARD, w.plan, near=first[0])
    gate = gated_writes(w, cluster, monkeypatch)
    path = w.store._snapshot_path(SHARD)

    async def scenario() -> None:
        await assign(w, cluster, monkeypatch, active={SHARD})
        await w.on_probes(probes(SHARD, 0, *before, request=10))
        gate.append(asyncio.get_running_loop().create_future())
        step = asyncio.ensure_future(w.on_probes(probes(SHARD, 1, *first, request=11)))
        await asyncio.sleep(0.01)  # the step stored the page and waits for its write
        assert w.store.snapshot(SHARD, background=True)
        w.store.finish_snapshots()
        assert not path.exists()  # not while the write is under way
        if write == "lands":
            landed = cluster.append(SHARD, encode(rows(*first), CHANGELOG))
            gate[0].set_result(SimpleNamespace(offset=landed))
            await step
            w.store.finish_snapshots()
            assert path.exists()
            # it holds the write's page, so it covers the write's offset: a restart from it does
            # not replay that record and store the page twice (it said the offset of before)
            assert read_arrays(path)[1]["offset"] == landed
            return
        gate[0].set_exception(RuntimeError("the broker is away"))
        with pytest.raises(RuntimeError, match="the broker is away"):
            await step
        w.store.finish_snapshots()
        assert not path.exists() and w.store.owed_rows() == 1
        await w.store.on_stop()  # no snapshot while the page is owed

    try:
        asyncio.run(scenario())
    finally:
        w.close()
    gate.clear()
    w = stubbed_worker(tmp_path / "w", cluster, monkeypatch)

    async def restarted() -> None:
        await assign(w, cluster, monkeypatch, active={SHARD})
        await w.on_probes(probes(SHARD, 2, *first, request=21))  # read again
        await w.on_probes(probes(SHARD, 3, *copy, request=31))

    try:
        asyncio.run(restarted())
    finally:
        w.close()
    assert [decode([v], CHANGELOG).ids() for v in cluster.changelog[SHARD]] == [[before[1]], [first[1]], [copy[1]]]
    assert answer_to(cluster, 31) == (1, first[1])


@pytest.mark.parametrize("write", ["lands within the wait", "is still under way"])
def test_a_shard_that_moves_away_waits_for_its_changelog_writes_before_its_snapshot(
    tmp_path, cluster, monkeypatch, write
):
    """At a revocation, a write of rows the shard stored is under way: the store waits for it
    (WRITES_TIMEOUT) and snapshots the shard once it landed, so a return replays only the tail.
    A write still under way after the wait leaves the shard without that snapshot (it would hold
    a page the changelog may never get): the one before stands."""
    from streamdedup.stream import store as store_module

    monkeypatch.setattr(store_module, "WRITES_TIMEOUT", 0.3)
    w = stubbed_worker(tmp_path / "w", cluster, monkeypatch)
    other = 1 - SHARD
    before, first = page(3, SHARD, w.plan), page(1, SHARD, w.plan)
    gate = gated_writes(w, cluster, monkeypatch)
    path = w.store._snapshot_path(SHARD)

    async def scenario() -> None:
        await assign(w, cluster, monkeypatch, active={SHARD, other})
        await w.on_probes(probes(SHARD, 0, *before, request=10))
        gate.append(asyncio.get_running_loop().create_future())
        step = asyncio.ensure_future(w.on_probes(probes(SHARD, 1, *first, request=11)))
        await asyncio.sleep(0.01)  # the step stored the page and waits for its write
        if write == "lands within the wait":
            landed = SimpleNamespace(offset=cluster.append(SHARD, encode(rows(*first), CHANGELOG)))
            asyncio.get_running_loop().call_later(0.1, gate[0].set_result, landed)
        await assign(w, cluster, monkeypatch, active={other})  # the shard moves away
        if write == "lands within the wait":
            assert path.exists()
            await step
        else:
            assert not path.exists()
            gate[0].set_exception(RuntimeError("the broker is away"))
            with pytest.raises(RuntimeError):
                await step

    try:
        asyncio.run(scenario())
    finally:
        w.close()
    assert not w.store.owed  # (a shard that left owes nothing: the page's retry goes to its owner)


@pytest.mark.parametrize("between", ["moved away", "a standby here"])
def test_a_write_that_lands_after_the_shard_came_back_covers_nothing(tmp_path, cluster, monkeypatch, between):
    """A write of page ``first`` is under way when the shard partition moves (away, or to a
    standby here); its new owner stores ``theirs``; the partition comes back before the write
    lands.  The write's offset, above the new owner's record, must not count as covered by the
    shard here (it holds neither record yet): recovery would start after it and skip ``theirs``,
    and a copy of it would be judged unique."""
    from streamdedup.stream import store as store_module

    monkeypatch.setattr(store_module, "WRITES_TIMEOUT", 0.01)
    w = stubbed_worker(tmp_path / "w", cluster, monkeypatch)
    plan, other = w.plan, 1 - SHARD
    before, first, theirs = page(3, SHARD, plan), page(1, SHARD, plan), page(5, SHARD, plan)
    copy = page(6, SHARD, plan, near=theirs[0])
    gate = gated_writes(w, cluster, monkeypatch, SHARD)
    topic = w.store._changelog()
    tps = {TP(topic, SHARD), TP(topic, other)}

    async def scenario() -> None:
        await assign(w, cluster, monkeypatch, active={SHARD, other})
        await w.on_probes(probes(SHARD, 0, *before, request=10))
        assert w.store.snapshot(SHARD)  # at offset 0
        gate.append(asyncio.get_running_loop().create_future())
        step = asyncio.ensure_future(w.on_probes(probes(SHARD, 1, *first, request=11)))
        await asyncio.sleep(0.01)  # the step stored the page and waits for its write
        if between == "moved away":
            await assign(w, cluster, monkeypatch, active={other})
        else:
            await assign(w, cluster, monkeypatch, active={other}, standby={SHARD})
        cluster.append(SHARD, encode(rows(*theirs), CHANGELOG))  # offset 1: the new owner's page
        w.app.on_rebalance_start()  # back here, active; the write lands before faust's recovery
        monkeypatch.setattr(w.app.assignor, "assigned_actives", lambda: tps)
        await w.store.on_rebalance(tps, set(), {TP(topic, SHARD)} if between == "moved away" else set())
        landed = SimpleNamespace(offset=cluster.append(SHARD, encode(rows(*first), CHANGELOG)))  # offset 2
        gate[0].set_result(landed)
        gate.clear()
        await step
        assert w.store.offsets[SHARD] == 0
        for tp in sorted(tps):
            await recover(w.store, cluster, tp)
        await w.on_probes(probes(SHARD, 3, *copy, request=31))

    try:
        asyncio.run(scenario())
    finally:
        w.close()
    assert answer_to(cluster, 31) == (1, theirs[1])


def test_a_step_answers_only_once_the_shards_earlier_writes_landed(tmp_path, cluster, monkeypatch):
    """The local path stores a page X while the write of an earlier step's page P (near X) is
    still under way: X is not answered before P's write lands (its answer names P).  If P's
    write fails, X's step fails too, and its retry writes P (owed) before it answers."""
    w = stubbed_worker(tmp_path / "w", cluster, monkeypatch)
    p_page = page(1, SHARD, w.plan)
    x_page = page(4, SHARD, w.plan, near=p_page[0])
    gate: list[asyncio.Future] = []

    def send_changelog(partition: int, key: bytes, value: bytes, **kwargs):
        return gate.pop() if gate else cluster.send_changelog(partition, key, value, **kwargs)

    monkeypatch.setattr(w.table, "send_changelog", send_changelog)
    x_probes = [(SHARD, encode(rows(*x_page, request=12), PROBES))]

    async def scenario() -> None:
        await assign(w, cluster, monkeypatch, active={SHARD})
        p_write = asyncio.get_running_loop().create_future()
        gate.append(p_write)
        agent = asyncio.ensure_future(w.on_probes(probes(SHARD, 0, *p_page, request=11)))
        await asyncio.sleep(0.01)  # P stored, its write under way
        step, writes = w._store_probes(x_probes)  # the local path (Worker._probe_here)
        durable = asyncio.ensure_future(w._durable(writes))
        await asyncio.sleep(0.05)
        assert not durable.done()  # X's own write landed; P's has not
        p_write.set_exception(RuntimeError("the broker is away"))
        for failed in (durable, agent):
            with pytest.raises(RuntimeError, match="the broker is away"):
                await failed
        step, writes = w._store_probes(x_probes)  # X's retry
        await w._durable(writes)
        assert [int(d) for d in step.answers[INPUT].rows["distance"]] == [1]
        assert step.answers[INPUT].ids() == [p_page[1]]

    try:
        asyncio.run(scenario())
    finally:
        w.close()
    assert [decode([v], CHANGELOG).ids() for v in cluster.changelog[SHARD]] == [[x_page[1]], [p_page[1]]]


def test_rows_a_step_could_not_hand_to_the_producer_stay_owed(worker, cluster, monkeypatch):
    """The encoding of a step's changelog record fails (a bug, out of memory) after the page was
    stored: the step raises before any answer, the page stays owed, and the retry writes it."""
    from streamdedup.stream import app as app_module

    first = page(1, SHARD, worker.plan)
    encode_record = app_module.encode
    failures = [MemoryError()]

    def failing_encode(batch, kind):
        if kind == CHANGELOG and failures:
            raise failures.pop()
        return encode_record(batch, kind)

    monkeypatch.setattr(app_module, "encode", failing_encode)

    async def scenario() -> None:
        await assign(worker, cluster, monkeypatch, active={SHARD})
        with pytest.raises(MemoryError):
            await worker.on_probes(probes(SHARD, 0, *first, request=11))
        assert worker.store.owed_rows() == 1 and not cluster.answers
        await worker.on_probes(probes(SHARD, 0, *first, request=11))  # the stage's retry

    asyncio.run(scenario())
    assert [decode([v], CHANGELOG).ids() for v in cluster.changelog[SHARD]] == [[first[1]]]
    assert answer_to(cluster, 11) == (-1, "")
