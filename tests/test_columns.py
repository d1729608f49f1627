"""A store's row columns: ``take`` reads the rows a shard step asks for, from the last memory map
and, for rows appended since, from the file, and always gives what the column holds."""

from __future__ import annotations

import numpy as np
import pytest

from streamdedup.index import file_array
from streamdedup.index.columns import new_column
from streamdedup.index.strings import StringHeap


@pytest.mark.parametrize("where", ["file", "memory"])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_take_reads_what_the_column_holds_across_appends_and_truncates(tmp_path, where, shape):
    rng = np.random.default_rng(7)
    col = new_column(np.uint64, str(tmp_path / "c") if where == "file" else None, ".col", shape)
    held = np.empty((0, *shape), np.uint64)

    def append(n: int) -> None:
        nonlocal held
        values = rng.integers(0, 2**64 - 1, size=(n, *shape), dtype=np.uint64, endpoint=True)
        col.extend(values)
        held = np.concatenate((held, values))

    append(50)
    col.view()  # a memory map of the first 50 rows
    for step in range(40):
        append(int(rng.integers(1, 5)))
        rows = rng.integers(0, len(held), size=int(rng.integers(0, 12)))
        rows[: min(2, len(rows))] = len(held) - 1  # the newest rows, past any map made before
        assert np.array_equal(col.take(rows), held[rows])
        if step % 9 == 8:  # undo an append (a failed write): the rows past n must not be read
            col.truncate(len(held) - 2)
            held = held[:-2]
            assert np.array_equal(col.take(np.arange(len(held))), held)
    # more appended rows than are read one by one: the column is mapped anew
    append(file_array._FEW_ROWS * 3)
    rows = np.arange(len(held))[::-1]
    assert np.array_equal(col.take(rows), held[rows])
    assert np.array_equal(col.view(), held)
    assert col.take(np.zeros(0, np.int64)).shape == (0, *shape)
    for bad in ([len(held)], [-1]):
        with pytest.raises(IndexError):
            col.take(np.array(bad))
    if where == "file":
        col.close()


def test_a_file_backed_heap_reads_each_string_appended_after_its_ends_were_mapped(tmp_path):
    heap = StringHeap(str(tmp_path / "s"))
    heap.extend(["a", "bb", ""])
    heap.ends()  # the ends file mapped with three strings
    words = ["a", "bb", ""]
    for i in range(30):
        new = ["x" * (i % 7), f"u{i}", "é" * (i % 3)]
        heap.extend(new)
        words += new
        assert [heap[j] for j in range(len(words))] == words
    heap.close()


@pytest.mark.parametrize("where", ["file", "memory"])
def test_take_is_a_copy(tmp_path, where):
    col = new_column(np.int64, str(tmp_path / "c") if where == "file" else None, ".col")
    col.extend(np.arange(5))
    col.view()
    got = col.take(np.array([4, 0]))
    got[0] = -1  # (a view of the buffer or of the map would write through, or refuse)
    assert col.take(np.array([4, 0])).tolist() == [4, 0]
    assert col.view().tolist() == [0, 1, 2, 3, 4]
    if where == "file":
        col.close()


@pytest.mark.parametrize("where", ["file", "memory"])
def test_many_reads_what_reading_each_string_reads(tmp_path, where):
    """StringHeap.many (a shard's matches named in one go): the same strings as one ``heap[i]``
    each, for any indices: repeated, out of order, next to each other (one read), the first,
    empty strings, non-ASCII and lone surrogates; an index out of range is refused."""
    heap = StringHeap(str(tmp_path / "s") if where == "file" else None)
    rng = np.random.default_rng(7)
    words: list[str] = []
    for batch in range(20):
        new = [
            ("é\udcff" if j % 5 == 0 else "x") * int(rng.integers(0, 6)) + f"{batch}.{j}" * (j % 2) for j in range(9)
        ]
        heap.extend(new)
        words += new
        for indices in (rng.integers(0, len(words), 25), np.arange(len(words)), np.array([0, 1, 0]), []):
            assert heap.many(indices) == [heap[int(i)] for i in indices] == [words[int(i)] for i in indices]
    with pytest.raises(IndexError):
        heap.many([0, len(words)])
    with pytest.raises(IndexError):
        heap.many([-1])
    heap.close()
