"""Manku's table designs: the right number of tables and key bits, and the guarantee that
every pair within k bits shares the key of at least one table."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from streamdedup.index.tables import DESIGNS, TableDesign


@pytest.mark.parametrize("name, tables, key_bits", [("20", 20, 31), ("16", 16, 28), ("10", 10, 25), ("4", 4, 16)])
def test_paper_designs(name, tables, key_bits):
    d = TableDesign.named(name)
    assert (d.n_tables, d.key_bits) == (tables, key_bits)
    assert len(set(d.keys)) == tables  # no two tables alike


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_every_k_bit_difference_leaves_some_key_intact(name):
    """For all C(64,3) sets of flipped bits, some table's key avoids all of them."""
    keys = [frozenset(k) for k in TableDesign.named(name).keys]
    for flipped in combinations(range(64), 3):
        assert any(key.isdisjoint(flipped) for key in keys), flipped


def test_packed_keys_equal_for_neighbours():
    d = TableDesign.named("16")
    rng = np.random.default_rng(1)
    fps = rng.integers(0, 2**64 - 1, size=200, dtype=np.uint64, endpoint=True)
    flips = np.array(
        [(1 << a) | (1 << b) | (1 << c) for a, b, c in rng.integers(0, 64, size=(200, 3))], dtype=np.uint64
    )
    same = d.packed_keys(fps) == d.packed_keys(fps ^ flips)
    assert same.any(axis=0).all()
    # table numbers sit in the top 4 bits
    assert ((d.packed_keys(fps) >> np.uint32(28)) == np.arange(16)[:, None]).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 3, "levels": (3, 4)}, "more blocks than k"),
        ({"f": 32}, "64 bits"),
        ({"k": 64}, "0..63"),
        ({"k": 3, "levels": (32,)}, "4960 tables"),
        ({"k": 1, "levels": (40, 40)}, "splits 25 bits into 40 blocks"),
    ],
)
def test_bad_designs_are_rejected_with_a_hint(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TableDesign(**kwargs)


def test_unknown_name():
    with pytest.raises(ValueError, match="choose one of 20, 16, 10, 4"):
        TableDesign.named("12")
