"""A numpy array that grows by appending rows, at amortised O(1) cost per row.

>>> col = GrowingArray(np.uint64); col.extend(np.arange(3, dtype=np.uint64)); col.view().tolist()
[0, 1, 2]
>>> sigs = GrowingArray(np.uint32, (4,)); sigs.extend(np.ones((2, 4), np.uint32)); sigs.view().shape
(2, 4)
"""

from __future__ import annotations

import numpy as np

__all__ = ["GrowingArray", "first_occurrences"]

#: Rows up to which :func:`first_occurrences` pairs them in a dict, not with numpy.
FEW_ROWS = 64


class GrowingArray:
    """Rows of a fixed shape and dtype, appended in batches; the buffer doubles when full."""

    __slots__ = ("_buf", "n")

    def __init__(self, dtype: type, row_shape: tuple[int, ...] = ()) -> None:
        self._buf: np.ndarray = np.empty((64, *row_shape), dtype=dtype)
        self.n = 0

    @classmethod
    def of(cls, rows: np.ndarray) -> GrowingArray:
        """The rows of ``rows``, which it takes over (no copy: the caller must not use it again)."""
        out = cls.__new__(cls)
        out._buf, out.n = (rows if rows.flags.writeable and rows.flags.c_contiguous else rows.copy()), len(rows)
        if len(out._buf) == 0:
            out._buf = np.empty((64, *rows.shape[1:]), dtype=rows.dtype)
        return out

    def __len__(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        return self._buf.nbytes

    def view(self) -> np.ndarray:
        """The rows appended so far (a view: valid until the next extend)."""
        return self._buf[: self.n]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows at ``rows`` (indices in 0..n-1), a fresh array (as :meth:`FileArray.take`)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= self.n):
            raise IndexError(f"rows outside the column's 0..{self.n - 1}")
        return self._buf[rows]

    def truncate(self, n: int) -> None:
        """Drop the rows from ``n`` on (undo an append)."""
        self.n = min(self.n, n)

    def extend(self, rows: np.ndarray) -> None:
        need = self.n + len(rows)
        if need > len(self._buf):
            grown = np.empty((max(need, 2 * len(self._buf)), *self._buf.shape[1:]), dtype=self._buf.dtype)
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n : need] = rows
        self.n = need


def first_occurrences(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows given as equal-length integer columns: the position of the first row of each
    distinct tuple of values, and for every row the index of its tuple in that list (so
    ``first[inverse]`` is each row's first occurrence).  A few rows (a shard step at a low rate)
    go through a dict: ``np.unique`` over rows costs ~70 us however few they are.

    >>> first, inverse = first_occurrences(np.array([5, 7, 5]), np.array([1, 2, 1]))
    >>> first[inverse].tolist()
    [0, 1, 0]
    """
    n = len(columns[0])
    if n <= FEW_ROWS:
        seen: dict[tuple[int, ...], int] = {}
        firsts: list[int] = []
        inverse = np.empty(n, dtype=np.int64)
        for i, key in enumerate(zip(*(c.tolist() for c in columns))):
            at = seen.setdefault(key, len(firsts))
            if at == len(firsts):
                firsts.append(i)
            inverse[i] = at
        return np.array(firsts, dtype=np.int64), inverse
    _, first, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)
    return first, inverse.ravel()
