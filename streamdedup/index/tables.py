"""Manku's permuted-table designs: which bits of a fingerprint key each table.

Two fingerprints within ``k`` bits differ in at most ``k`` of any ``b`` disjoint blocks, so at
least ``b - k`` blocks are identical.  A table keyed by a choice of ``b - k`` blocks finds every
such neighbour; one table per choice covers them all.  Applying the argument again to the bits
left over gives the two-level designs (Manku, Jain, Das Sarma 2007, section 3.1.1), e.g. the
default for f = 64, k = 3::

    level 1: 4 blocks of 16 bits, keep 1        level 2: the other 48 bits, 4 blocks of 12, keep 1
    |  A  |  B  |  C  |  D  |                   |  b1 |  b2 |  b3 |  b4 |   (from B C D)
    key of table (A, b2) = A (16 bits) + b2 (12 bits) = 28 bits;  4 x 4 = 16 tables

Named designs for f = 64, k = 3 (tables: levels -> key bits):

    "20": (6,)   -> C(6,3) = 20 tables, 31-33 key bits
    "16": (4, 4) -> 16 tables, 28 key bits (default)
    "10": (5,)   -> C(5,2) = 10 tables, 25-26 key bits
    "4":  (4,)   -> 4 tables, 16 key bits

A table key is the chosen bits in fingerprint order.  The index packs it with the table number
into one uint32, ``table << (32 - t) | key's top (32 - t) bits`` (t = bits for the table
number); cutting a key shorter only adds candidates, which are checked exactly anyway.

>>> d = TableDesign.named("16")
>>> d.n_tables, d.key_bits
(16, 28)
>>> TableDesign(f=64, k=3, levels=(6,)).n_tables
20
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from math import comb

import numpy as np

__all__ = ["TableDesign", "DESIGNS"]

#: Named designs for f = 64, k = 3, after the paper.
DESIGNS: dict[str, tuple[int, ...]] = {"20": (6,), "16": (4, 4), "10": (5,), "4": (4,)}


def _split(bits: list[int], blocks: int) -> list[list[int]]:
    """Split bit positions into ``blocks`` contiguous runs, larger runs first."""
    size, extra = divmod(len(bits), blocks)
    out, start = [], 0
    for i in range(blocks):
        n = size + (1 if i < extra else 0)
        out.append(bits[start : start + n])
        start += n
    return out


def _tables(bits: list[int], k: int, levels: tuple[int, ...]) -> list[list[int]]:
    """Every table's key bits: choose ``b - k`` of ``b`` blocks, recurse on the rest."""
    if not levels:
        return [[]]
    b = levels[0]
    blocks = _split(bits, b)
    out = []
    for chosen in combinations(range(b), b - k):
        key = sorted(i for c in chosen for i in blocks[c])
        rest = [i for i in bits if i not in set(key)]
        for sub in _tables(rest, k, levels[1:]):
            out.append(sorted(key + sub))
    return out


@dataclass(frozen=True)
class TableDesign:
    """A set of tables that together find every fingerprint within ``k`` bits.

    ``levels`` gives the number of blocks at each level; each level keeps ``b - k`` blocks.

    >>> TableDesign(f=64, k=3, levels=(3,))
    Traceback (most recent call last):
    ...
    ValueError: each level needs more blocks than k = 3 (got levels=(3,)); try levels=(4, 4)
    """

    f: int = 64
    k: int = 3
    levels: tuple[int, ...] = (4, 4)
    #: Keep only these tables of the design (a shard holds the tables of one group).
    only: tuple[int, ...] | None = None
    keys: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.f != 64:
            raise ValueError(f"fingerprints are 64 bits; f={self.f} is not supported")
        if not 0 <= self.k < 64:
            raise ValueError(f"k must be in 0..63, got {self.k}")
        if not self.levels or any(b <= self.k for b in self.levels):
            raise ValueError(
                f"each level needs more blocks than k = {self.k} (got levels={self.levels}); "
                f"try levels=({self.k + 1}, {self.k + 1})"
            )
        n_tables, bits = 1, 64
        for b in self.levels:
            if b > bits:
                raise ValueError(f"levels={self.levels} splits {bits} bits into {b} blocks; use fewer blocks")
            n_tables *= comb(b, b - self.k)
            bits -= (b - self.k) * (bits // b)
        if n_tables > 4096:
            raise ValueError(f"levels={self.levels} gives {n_tables} tables; use fewer blocks or levels")
        tables = _tables(list(range(64)), self.k, tuple(self.levels))
        if self.only is not None:
            if (
                not self.only
                or len(set(self.only)) != len(self.only)
                or not all(0 <= t < len(tables) for t in self.only)
            ):
                raise ValueError(f"only= must name distinct tables in 0..{len(tables) - 1}, got {self.only}")
            tables = [tables[t] for t in self.only]
        object.__setattr__(self, "keys", tuple(tuple(t) for t in tables))

    @classmethod
    def named(cls, name: str, k: int = 3) -> TableDesign:
        """A design by its number of tables for k = 3: "20", "16", "10" or "4"."""
        if name not in DESIGNS:
            raise ValueError(f"unknown table design {name!r}; choose one of {', '.join(DESIGNS)}")
        return cls(f=64, k=k, levels=DESIGNS[name])

    def groups(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """The tables grouped by their first-level block choice: (group bits, table numbers).

        Two fingerprints within k bits agree on all the bits of at least one group, so a
        store sharded by (group, value of the group's bits) brings every such pair together.

        >>> [(len(bits), tables) for bits, tables in TableDesign.named("16").groups()][:2]
        [(16, (0, 1, 2, 3)), (16, (4, 5, 6, 7))]
        >>> len(TableDesign.named("20").groups()), len(TableDesign.named("20").groups()[0][0])
        (20, 33)
        """
        if self.only is not None:
            raise ValueError("groups() is defined on a whole design, not on a restricted one")
        b = self.levels[0]
        blocks = _split(list(range(64)), b)
        per_group = 1
        for level in self.levels[1:]:
            per_group *= comb(level, level - self.k)
        out = []
        for g, chosen in enumerate(combinations(range(b), b - self.k)):
            bits = tuple(sorted(i for c in chosen for i in blocks[c]))
            out.append((bits, tuple(range(g * per_group, (g + 1) * per_group))))
        return out

    def restricted(self, tables: tuple[int, ...]) -> TableDesign:
        """The same design keeping only some of its tables."""
        return TableDesign(f=self.f, k=self.k, levels=self.levels, only=tuple(tables))

    @property
    def n_tables(self) -> int:
        return len(self.keys)

    @property
    def key_bits(self) -> int:
        """The shortest table key, in bits."""
        return min(len(key) for key in self.keys)

    @property
    def table_bits(self) -> int:
        """Bits needed for a table number in a packed key."""
        return max(1, (self.n_tables - 1).bit_length())

    def packed_keys(self, fps: np.ndarray) -> np.ndarray:
        """Packed uint32 keys, shape (n_tables, len(fps)), row t for table t.

        >>> d = TableDesign.named("4")
        >>> [hex(int(x)) for x in d.packed_keys(np.array([0xFFFF], dtype=np.uint64))[:, 0]]
        ['0x3fffc000', '0x40000000', '0x80000000', '0xc0000000']
        """
        fps = np.asarray(fps, dtype=np.uint64)
        room = 32 - self.table_bits
        out = np.empty((self.n_tables, len(fps)), dtype=np.uint32)
        for t, (shifts, masks, width) in enumerate(self._plans):
            key = np.zeros(len(fps), dtype=np.uint64)
            for shift, mask in zip(shifts, masks):  # contiguous runs of key bits
                key |= ((fps >> np.uint64(shift[0])) & np.uint64(mask)) << np.uint64(shift[1])
            # keep the top `room` bits of the key, put the table number above them
            if width > room:
                key >>= np.uint64(width - room)
            else:
                key <<= np.uint64(room - width)
            out[t] = key.astype(np.uint32) | np.uint32(t << room)
        return out

    @property
    def _plans(self) -> list[tuple[list[tuple[int, int]], list[int], int]]:
        plans = self.__dict__.get("_plan_cache")
        if plans is None:
            plans = [_plan(key) for key in self.keys]
            object.__setattr__(self, "_plan_cache", plans)
        return plans


def _plan(key: tuple[int, ...]) -> tuple[list[tuple[int, int]], list[int], int]:
    """How to gather a key's bits: for each contiguous run, (source shift, target shift) and mask.

    Key bits keep fingerprint order; the highest fingerprint bit lands highest in the key.
    """
    runs: list[list[int]] = []
    for bit in key:
        if runs and bit == runs[-1][-1] + 1:
            runs[-1].append(bit)
        else:
            runs.append([bit])
    shifts, masks, pos = [], [], 0
    for run in runs:  # low runs land in low key bits
        shifts.append((run[0], pos))
        masks.append((1 << len(run)) - 1)
        pos += len(run)
    return shifts, masks, len(key)
