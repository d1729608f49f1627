"""Pages stalled on a dead worker's shard partition take a *match* from a standby held here.

``Worker.answer_from_standbys`` (the production method the worker's timer calls) is driven with
the store assigned as faust assigns it (partition 0 active here, partition 1 a standby filled from
the changelog), and the page's probe recorded as the pages stage records it.  A match in the
standby is that group's answer; "no match" is never taken (docs/stream-design.md, "Faults").
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from test_revoked_shard import INPUT, assign, cluster, page, probes, refused_writes, rows, worker  # noqa: F401  (fixtures)

from streamdedup.pipeline.wire import CHANGELOG, encode
from streamdedup.stream.app import STANDBY_AFTER

ACTIVE, STANDBY = 0, 1


def stalled(w, n: int, fp: np.uint64, url: str, shard: int, sent_at: float) -> int:
    """A page waiting for every group, its group-0 probe sent to ``shard`` at ``sent_at``."""
    request = w.pending.add_page(INPUT, n, page_id=url, url=url, fingerprint=int(fp), key=None, value=b"{}")
    w._sent.append((sent_at, shard, rows(fp, url, request)))
    return request


def test_a_match_in_a_standby_answers_a_stalled_page_and_no_match_leaves_it_waiting(worker, cluster, monkeypatch):  # noqa: F811
    plan = worker.plan
    stored = page(1, STANDBY, plan)  # stored by the standby partition's (dead) owner
    copy = page(2, STANDBY, plan, near=stored[0])
    alone = page(3, STANDBY, plan)
    on_active = page(4, ACTIVE, plan)
    cluster.append(STANDBY, encode(rows(*stored), CHANGELOG))
    asyncio.run(assign(worker, cluster, monkeypatch, active={ACTIVE}, standby={STANDBY}))
    assert STANDBY in worker.store.shards and not worker.store.serves(STANDBY)
    flushes: list[int] = []
    monkeypatch.setattr(worker.outbox, "schedule", flushes.append)

    t0 = 1000.0
    r_copy = stalled(worker, 10, *copy, STANDBY, t0)
    r_alone = stalled(worker, 11, *alone, STANDBY, t0)
    r_active = stalled(worker, 12, *on_active, ACTIVE, t0)
    assert worker.answer_from_standbys(now=t0 + STANDBY_AFTER / 2) == 0  # not stalled yet

    assert worker.answer_from_standbys(now=t0 + STANDBY_AFTER) == 1
    assert flushes == [INPUT]  # its partition may have a page ready now
    w = worker.pending.waiting(r_copy)
    assert w is not None and not w.missing & 1 and w.best is not None and w.best[4] == stored[1]
    assert worker.pending.waiting(r_alone).missing & 1  # "no match" is not an answer
    assert worker.pending.waiting(r_active).missing & 1  # an active partition answers for itself
    # the shard stored nothing: the copy is still the standby owner's to store, after `stored`
    assert len(worker.store.shards[STANDBY]) == 1

    # at the next tick the others are checked again, and the answered probe is forgotten
    assert worker.answer_from_standbys(now=t0 + 2 * STANDBY_AFTER) == 0
    assert [int(entry[2].rows["request"][0]) for entry in worker._sent] == [r_alone, r_active]


def test_a_page_stored_by_the_dead_owner_before_its_copy_is_no_match_for_it(worker, cluster, monkeypatch):  # noqa: F811
    """The replay rule holds in the standby too: a page the dead owner stored already stands at
    its first store, so a copy stored after it is no match for it."""
    plan = worker.plan
    first = page(1, STANDBY, plan)
    later = page(2, STANDBY, plan, near=first[0])
    cluster.append(STANDBY, encode(rows(*first), CHANGELOG))
    cluster.append(STANDBY, encode(rows(*later), CHANGELOG))
    asyncio.run(assign(worker, cluster, monkeypatch, active={ACTIVE}, standby={STANDBY}))
    monkeypatch.setattr(worker.outbox, "schedule", lambda partition: None)
    r_first = stalled(worker, 10, *first, STANDBY, 0.0)  # its answer was lost with the owner
    r_later = stalled(worker, 11, *later, STANDBY, 0.0)
    assert worker.answer_from_standbys(now=STANDBY_AFTER) == 1
    assert worker.pending.waiting(r_first).missing & 1
    w = worker.pending.waiting(r_later)
    assert w is not None and w.best is not None and w.best[4] == first[1]


def all_groups_on(plan, shard: int, seed: int) -> tuple[np.uint64, np.uint64]:
    """A fingerprint and a near copy (one bit apart, agreeing on group 0) whose probes of every
    group go to ``shard``."""
    rng = np.random.default_rng(seed)
    outside = [b for b in range(64) if not int(plan.masks[0]) >> b & 1]
    while True:
        fp = rng.integers(0, 2**64 - 1, dtype=np.uint64, endpoint=True)
        copies = np.array([fp ^ np.uint64(1 << b) for b in outside], dtype=np.uint64)
        both = plan.probes(np.concatenate(([fp], copies)))
        good = np.flatnonzero((both[1:] == shard).all(axis=1))
        if (both[0] == shard).all() and len(good):
            return fp, copies[good[0]]


def stalled_everywhere(w, n: int, fp: np.uint64, url: str, shard: int, sent_at: float) -> int:
    """A page waiting for every group, each group's probe sent to ``shard``."""
    request = w.pending.add_page(INPUT, n, page_id=url, url=url, fingerprint=int(fp), key=None, value=b"{}")
    for g in range(w.plan.n_groups):
        probe = rows(fp, url, request)
        probe.rows["group"] = g
        w._sent.append((sent_at, shard, probe))
    return request


def copy_stalled_everywhere(worker, cluster, monkeypatch) -> int:  # noqa: F811
    """A page stored in the standby partition's changelog, and a copy of it waiting for every
    group, each group's probe sent to that partition."""
    stored, copy = all_groups_on(worker.plan, STANDBY, seed=5)
    cluster.append(STANDBY, encode(rows(stored, "http://a.test/stored"), CHANGELOG))
    asyncio.run(assign(worker, cluster, monkeypatch, active={ACTIVE}, standby={STANDBY}))
    monkeypatch.setattr(worker.outbox, "schedule", lambda partition: None)
    return stalled_everywhere(worker, 10, copy, "http://a.test/copy", STANDBY, 0.0)


def test_a_page_with_a_match_that_waits_only_for_stalled_groups_is_released(worker, cluster, monkeypatch):  # noqa: F811
    plan = worker.plan
    r = copy_stalled_everywhere(worker, cluster, monkeypatch)
    unique_fp, _ = all_groups_on(plan, STANDBY, seed=6)
    r_unique = stalled_everywhere(worker, 11, unique_fp, "http://a.test/unique", STANDBY, 0.0)
    assert worker.answer_from_standbys(now=STANDBY_AFTER) == 1
    assert worker.pending.waiting(r) is None  # done
    assert worker.pending.waiting(r_unique).missing == (1 << plan.n_groups) - 1  # waits for the owner
    [w] = worker.pending.ready(INPUT)  # (the unique page after it still waits)
    assert (w.offset, w.verdict, w.best[4]) == (10, "near_duplicate", "http://a.test/stored")


def test_a_page_with_a_match_that_also_waits_for_a_live_group_waits_for_it(worker, cluster, monkeypatch):  # noqa: F811
    plan = worker.plan
    r = copy_stalled_everywhere(worker, cluster, monkeypatch)
    worker._sent[-1] = (0.0, ACTIVE, worker._sent[-1][2])  # its last group's shard is alive (here)
    assert worker.answer_from_standbys(now=STANDBY_AFTER) == 1
    w = worker.pending.waiting(r)
    # group 0 answered with the match; the others wait (the live one will answer, the rest then too)
    assert w is not None and w.missing == (1 << plan.n_groups) - 2 and w.best[4] == "http://a.test/stored"


def test_a_live_owner_that_keeps_answering_is_not_second_guessed(worker, cluster, monkeypatch):  # noqa: F811
    """Probes slow to be answered by a live (busy) owner are left to it: the standby is asked only
    once no probe sent to that partition has been answered for STANDBY_AFTER."""
    plan = worker.plan
    stored = page(1, STANDBY, plan)
    copy = page(2, STANDBY, plan, near=stored[0])
    answered = page(3, STANDBY, plan)
    cluster.append(STANDBY, encode(rows(*stored), CHANGELOG))
    asyncio.run(assign(worker, cluster, monkeypatch, active={ACTIVE}, standby={STANDBY}))
    monkeypatch.setattr(worker.outbox, "schedule", lambda partition: None)
    r_copy = stalled(worker, 10, *copy, STANDBY, 0.0)
    r_answered = stalled(worker, 11, *answered, STANDBY, 0.0)
    worker.pending.answer_one(r_answered, group=0, distance=-1)  # the owner answers this one
    t = STANDBY_AFTER
    assert worker.answer_from_standbys(now=t) == 0  # it was heard from just now
    assert worker.pending.waiting(r_copy).missing & 1
    assert worker.answer_from_standbys(now=t + STANDBY_AFTER / 2) == 0  # not silent long enough yet
    assert worker.answer_from_standbys(now=t + STANDBY_AFTER) == 1  # silent since: the standby answers
    assert not worker.pending.waiting(r_copy).missing & 1


def test_a_standby_holding_a_row_its_changelog_lacks_does_not_answer(worker, cluster, monkeypatch):  # noqa: F811
    """A page stored here whose changelog write failed (owed) stays in the shard when it becomes a
    standby here.  Its new owner does not have that page, so the standby must not release a
    copy of it as a near-duplicate while the page is owed."""
    plan = worker.plan
    first = page(1, STANDBY, plan)
    copy = page(4, STANDBY, plan, near=first[0])
    refused_writes(worker, cluster, monkeypatch).append(RuntimeError("the broker is away"))
    monkeypatch.setattr(worker.outbox, "schedule", lambda p: None)

    async def failed_then_standby() -> None:
        await assign(worker, cluster, monkeypatch, active={ACTIVE, STANDBY})
        with pytest.raises(RuntimeError, match="the broker is away"):
            await worker.on_probes(probes(STANDBY, 0, *first, request=11))
        await assign(worker, cluster, monkeypatch, active={ACTIVE}, standby={STANDBY})

    asyncio.run(failed_then_standby())
    assert worker.store.owed_rows() == 1
    r = stalled(worker, 20, *copy, STANDBY, 0.0)
    assert worker.answer_from_standbys(now=STANDBY_AFTER) == 0
    assert worker.pending.waiting(r) is not None  # still waiting for its owner's answer
