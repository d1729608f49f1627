"""Pages waiting for their shard answers: released per input partition in offset order, best
answer wins, stale or repeated answers change nothing, redeliveries and revoked partitions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.pipeline.pending import Pending
from streamdedup.pipeline.wire import ANSWERS, Batch, decode, encode


def page(p: Pending, partition: int, offset: int, page_id: str | None = None):
    page_id = page_id or f"p{partition}-{offset}"
    return p.add_page(
        partition,
        offset,
        page_id=page_id,
        url=f"http://x/{page_id}",
        fingerprint=offset,
        key=page_id.encode(),
        value=b"{}",
    )


def bad(p: Pending, partition: int, offset: int, reason: str = "not_json"):
    p.add_bad(partition, offset, reason, "a sentence", key=None, value=b"x")


def answer_all(p: Pending, request: int, match: tuple | None = None, distance: int = -1):
    for g in range(p.n_groups):
        p.answer_one(request, g, distance if g == 0 else -1, match if g == 0 else None)


def drain(p: Pending, partition: int) -> list[int]:
    ready = p.ready(partition)
    p.release(partition, ready)
    return [w.offset for w in ready]


def test_a_later_done_page_waits_for_an_earlier_one_and_partitions_are_independent():
    p = Pending(n_groups=4)
    r10, r11 = page(p, 0, 10), page(p, 0, 11)
    r5 = page(p, 1, 5)
    answer_all(p, r11)
    answer_all(p, r5)
    assert p.ready(0) == []  # 11 is done, but 10 is not: nothing may be committed past 10
    assert drain(p, 1) == [5]  # partition 1 does not wait for partition 0
    answer_all(p, r10)
    assert drain(p, 0) == [10, 11]
    assert len(p) == 0


def test_ready_holds_records_until_released():
    p = Pending(n_groups=1)
    answer_all(p, page(p, 0, 1))
    assert [w.offset for w in p.ready(0)] == [1] == [w.offset for w in p.ready(0)]
    assert drain(p, 0) == [1] and p.ready(0) == []


def test_a_dead_letter_between_pages_is_released_in_its_place():
    p = Pending(n_groups=2)
    r1 = page(p, 0, 1)
    bad(p, 0, 2)
    r3 = page(p, 0, 3)
    assert p.ready(0) == []  # the dead letter is done, but behind a waiting page
    answer_all(p, r1)
    ready = p.ready(0)
    assert [(w.offset, w.verdict, w.reason) for w in ready] == [(1, "unique", None), (2, None, "not_json")]
    p.release(0, ready)
    answer_all(p, r3)
    assert drain(p, 0) == [3]


def test_a_dead_letter_at_the_head_is_ready_at_once():
    p = Pending(n_groups=4)
    bad(p, 3, 0, "too_large")
    assert [(w.offset, w.reason, w.error) for w in p.ready(3)] == [(0, "too_large", "a sentence")]


def test_the_best_answer_is_the_nearest_then_the_lowest_group():
    p = Pending(n_groups=4)
    r = page(p, 0, 0)
    # match = (fetched, id hash, fingerprint, id, url); fetch times and id hashes do not order matches
    p.answer_one(r, 0, 3, (1, 1, 0xA, "far", "u-far"))
    p.answer_one(r, 3, 2, (10, 1, 0xD, "near-group-3", "u3"))
    p.answer_one(r, 2, 2, (90, 9, 0xC, "near-group-2", "u2"))
    p.answer_one(r, 1, 2, (50, 9, 0xB, "near-group-1", "u1"))
    [w] = p.ready(0)
    assert w.verdict == "near_duplicate"
    assert (w.best, w.best_group) == ((2, 50, 9, 0xB, "near-group-1", "u1"), 1)


def test_the_best_answer_does_not_depend_on_arrival_order():
    answers = [(0, 1, (7, 1, 1, "a", "ua")), (1, 1, (7, 0, 2, "b", "ub")), (2, -1, None), (3, 0, (9, 5, 3, "c", "uc"))]
    bests = set()
    for order in (answers, answers[::-1], answers[1:] + answers[:1], answers[2:] + answers[:2]):
        p = Pending(n_groups=4)
        r = page(p, 0, 0)
        for g, d, m in order:
            p.answer_one(r, g, d, m)
        bests.add(p.ready(0)[0].best)
    assert bests == {(0, 9, 5, 3, "c", "uc")}
    ties = set()
    for order in (answers[:2], answers[1::-1]):  # equally near: the lower group's match, in any order
        p = Pending(n_groups=2)
        r = page(p, 0, 0)
        for g, d, m in order:
            p.answer_one(r, g, d, m)
        ties.add(p.ready(0)[0].best)
    assert ties == {(1, 7, 1, 1, "a", "ua")}


def test_no_match_in_any_group_is_unique():
    p = Pending(n_groups=4)
    answer_all(p, page(p, 0, 0))
    [w] = p.ready(0)
    assert w.verdict == "unique" and w.best is None


def test_a_repeated_answer_for_one_group_does_not_complete_the_page_early():
    p = Pending(n_groups=2)
    r = page(p, 0, 0)
    assert p.answer_one(r, 0, -1) == 0
    assert p.answer_one(r, 0, 1, (1, 1, 1, "dup", "u")) is None  # the same group again: ignored
    assert p.ready(0) == []
    p.answer_one(r, 1, -1)
    [w] = p.ready(0)
    assert w.verdict == "unique"  # the repeated group's match was not taken either


def test_answers_to_another_process_are_ignored():
    earlier, now = Pending(n_groups=1), Pending(n_groups=1)
    stale = page(earlier, 0, 0)  # an earlier incarnation's request, replayed after a crash
    mine = page(now, 0, 0)
    assert stale != mine and stale >> 32 != mine >> 32  # random per-process prefix
    assert now.answer_one(stale, 0, 1, (1, 1, 1, "x", "u")) is None
    assert now.ready(0) == []
    batch = Batch.build(
        group=[0],
        fps=[1],
        fetched=[1],
        id_hash=[1],
        request=[stale],
        distance=[1],
        partition=[0],
        ids=["x"],
        urls=["u"],
        kind=ANSWERS,
    )
    assert now.answer(decode([encode(batch, ANSWERS)], ANSWERS)) == set()
    assert now.answer_one(mine, 0, -1) == 0
    assert now.ready(0)[0].verdict == "unique"


def test_answer_takes_a_decoded_answers_batch():
    p = Pending(n_groups=2)
    r0, r1, r9 = page(p, 0, 0), page(p, 0, 1), page(p, 1, 9)
    batch = Batch.build(
        group=[0, 1, 0, 1, 0],
        fps=[0, 0xF00D, 0, 0, 0xBEEF],
        fetched=[0, 30, 0, 0, 20],
        id_hash=[0, 31, 0, 0, 21],
        request=[r0, r0, r1, r1, r9],
        distance=[-1, 2, -1, -1, 1],
        partition=[0, 0, 0, 0, 1],
        ids=["", "m0", "", "", "m9"],
        urls=["", "u0", "", "", "u9"],
        kind=ANSWERS,
    )
    assert p.answer(decode([encode(batch, ANSWERS)], ANSWERS)) == {0, 1}
    assert [(w.offset, w.best) for w in p.ready(0)] == [(0, (2, 30, 31, 0xF00D, "m0", "u0")), (1, None)]
    assert p.ready(1) == []  # group 1 of page 9 is still missing


def test_a_redelivered_offset_is_ignored_while_it_waits():
    p = Pending(n_groups=1)
    r = page(p, 0, 5, "first")
    assert page(p, 0, 5, "second") is None
    bad(p, 0, 5)  # a redelivery that now fails to parse does not replace the waiting page either
    assert len(p) == 1
    answer_all(p, r)
    [w] = p.ready(0)
    assert (w.page_id, w.reason) == ("first", None)
    p.release(0, [w])
    assert page(p, 0, 5, "again") is not None  # once released, a new delivery is a new record


def test_fail_turns_a_waiting_page_into_a_dead_letter():
    p = Pending(n_groups=2)
    r = page(p, 0, 0)
    p.answer_one(r, 0, 1, (1, 1, 1, "m", "u"))
    p.fail(0, 0, "internal_error", "boom", key=b"k", value=b"{}")
    [w] = p.ready(0)
    assert (w.verdict, w.reason, w.error, w.best) == (None, "internal_error", "boom", None)
    assert p.answer_one(r, 1, -1) is None  # late answers for it are ignored


def test_fail_of_an_unknown_record_adds_a_dead_letter_in_offset_order():
    p = Pending(n_groups=1)
    r2 = page(p, 0, 2)
    p.fail(0, 1, "internal_error", "boom", key=None, value=b"v")  # an earlier offset, added late
    answer_all(p, r2)
    assert [(w.offset, w.reason) for w in p.ready(0)] == [(1, "internal_error"), (2, None)]


def test_drop_forgets_a_revoked_partition_and_its_requests():
    p = Pending(n_groups=1)
    r0, r1 = page(p, 0, 0), page(p, 0, 1)
    bad(p, 0, 2)
    r9 = page(p, 1, 9)
    assert p.drop(0) == 3 and p.partitions() == [1]
    assert p.answer_one(r0, 0, -1) is None and p.answer_one(r1, 0, -1) is None
    assert p.ready(0) == [] and p.drop(0) == 0
    answer_all(p, r9)
    assert drain(p, 1) == [9]


# ---------------------------------------------------------------- property


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.integers(1, 3)), min_size=1, max_size=25), st.data())
def test_any_interleaving_releases_each_partition_in_offset_order_exactly_once(records, data):
    """records: (partition, bad?, offset gap).  Adds come in offset order per partition, answers
    in any order (some twice); after every step the worker drains what is ready."""
    n_groups = 3
    p = Pending(n_groups)
    offsets, last = [], {}
    for part, _, gap in records:
        last[part] = last.get(part, -1) + gap
        offsets.append(last[part])
    record_at = {(r[0], offsets[i]): i for i, r in enumerate(records)}
    to_add = {part: [i for i, r in enumerate(records) if r[0] == part] for part in last}
    to_answer: list[tuple[int, int, int, tuple | None]] = []  # (record, group, distance, match)
    requests, answered, best = {}, {}, {}  # by record: request id, groups answered, expected best
    released: dict[int, list[int]] = {part: [] for part in last}

    while any(to_add.values()) or to_answer:
        steps = [("add", part) for part, todo in to_add.items() if todo]
        steps += [("answer", j) for j in range(len(to_answer))]
        kind, what = data.draw(st.sampled_from(steps))
        if kind == "add":
            i = to_add[what].pop(0)
            part, is_bad, _ = records[i]
            answered[i] = set(range(n_groups)) if is_bad else set()
            best[i] = None
            if is_bad:
                bad(p, part, offsets[i])
            else:
                requests[i] = page(p, part, offsets[i])
                for g in range(n_groups):
                    d = data.draw(st.integers(-1, 3))
                    m = (data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3)), g, "m", "u") if d >= 0 else None
                    to_answer.append((i, g, d, m))
                    if m and (best[i] is None or (d, g) < best[i][:2]):
                        best[i] = (d, g, *m)
                if data.draw(st.booleans()):
                    to_answer.append(to_answer[-1])  # the same group answered twice
        else:
            i, g, d, m = to_answer.pop(what)
            if g not in answered[i]:
                p.answer_one(requests[i], g, d, m)
                answered[i].add(g)
            else:
                assert p.answer_one(requests[i], g, d, m) is None
        for part in last:
            ready = p.ready(part)
            p.release(part, ready)
            for w in ready:
                i = record_at[(part, w.offset)]
                assert answered[i] == set(range(n_groups)), "released before all its answers were in"
                assert (w.best, w.best_group) == ((best[i][0], *best[i][2:]), best[i][1]) if best[i] else (None, -1), (
                    "not the nearest, then lowest group answer"
                )
                released[part].append(w.offset)

    for part, got in released.items():
        assert got == [offsets[i] for i, r in enumerate(records) if r[0] == part]  # all, once, in order
    assert len(p) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["page", "bad", "fail", "release", "drop"]),
            st.integers(0, 2),
            st.integers(0, 30),
            st.integers(0, 500),
        )
    )
)
def test_bytes_held_are_the_values_of_the_records_held(ops):
    """(The worker pauses its partitions on them: a count that drifts would pause it for good,
    or never.)"""
    p = Pending(n_groups=1)
    for op, partition, offset, size in ops:
        value = b"v" * size
        if op == "page":
            req = p.add_page(partition, offset, page_id="a", url="u", fingerprint=1, key=None, value=value)
            if req is not None:
                p.answer_one(req, 0, -1)
        elif op == "bad":
            p.add_bad(partition, offset, "not_json", "x", key=None, value=value)
        elif op == "fail":
            p.fail(partition, offset, "internal_error", "x", key=None, value=value)
        elif op == "release":
            ready = p.ready(partition)
            p.release(partition, ready[: offset % 4])
        else:
            p.drop(partition)
        assert p.bytes == sum(len(w.value) for part in p._parts.values() for w in part.values())


def test_a_check_s_answers_name_no_partition_to_flush():
    """A check (partition -1) still missing groups gave -1 back, and the worker scheduled a flush
    of partition -1, which logged "partition -1 is not ours (any more)" for every such check."""
    p = Pending(n_groups=4)
    done = []
    request = p.add_check("c", "http://c/", 5, done.append)
    assert [p.answer_one(request, g, -1) for g in range(4)] == [None, None, None, None]
    assert len(done) == 1
