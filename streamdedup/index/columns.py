"""A store's per-row columns, held in memory or in a file, and what a snapshot keeps of them.

The simhash groups (:mod:`streamdedup.pipeline.shard`) and the LSH band tables
(:mod:`streamdedup.index.bands`) keep the parts of a row that only a found row needs (its fetch
time, id hash, simhash, sketch...) as columns: a :class:`~streamdedup.index.arrays.GrowingArray`
without a file prefix, else a :class:`~streamdedup.index.file_array.FileArray` in
``prefix + suffix``.  A snapshot holds a column's values (in memory) or its file's checksum
(``<name>_check``: the file stays beside the snapshot); loading takes either, so a snapshot
written with the values loads into files.

>>> import tempfile, os
>>> prefix = os.path.join(tempfile.mkdtemp(), "s")
>>> col = new_column(np.int64, prefix, ".t"); col.extend(np.arange(4))
>>> back = column_from_state("t", np.int64, column_state("t", col), 4, prefix, ".t")
>>> back.view().tolist(), keep(back, np.array([1, 3])).view().tolist()
([0, 1, 2, 3], [1, 3])
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from streamdedup.index.arrays import GrowingArray
from streamdedup.index.file_array import FileArray, Staged

__all__ = ["Column", "new_column", "keep", "stage_keep", "column_state", "column_from_state", "file_bytes", "close"]

Column = GrowingArray | FileArray


def new_column(dtype: type, prefix: str | None, suffix: str, shape: tuple[int, ...] = ()) -> Column:
    """An empty column of rows of ``shape``: in memory, or in the file ``prefix + suffix``."""
    if prefix is None or 0 in shape:  # (rows of no bytes: nothing to put in a file)
        return GrowingArray(dtype, shape)
    return FileArray(dtype, prefix + suffix, shape)


def keep(col: Column, rows: np.ndarray) -> Column:
    """The column's values at ``rows`` (ascending) only (a file is rewritten and replaced whole)."""
    return stage_keep(col, rows).commit()


def stage_keep(col: Column, rows: np.ndarray) -> Staged:
    """:func:`keep`, staged: ``commit()`` returns the column (a file's is written now and replaces
    the old one at the commit; see :class:`~streamdedup.index.file_array.Staged`)."""
    if isinstance(col, FileArray):
        return col.stage_keep(rows)
    kept = GrowingArray.of(col.view()[rows])
    return Staged(lambda: kept)


def column_state(name: str, col: Column) -> dict[str, np.ndarray]:
    """What a snapshot keeps of a column: its values, or the file's checksum."""
    if isinstance(col, FileArray):
        return {f"{name}_check": np.array(col.checksum(), dtype=np.uint64)}
    return {name: col.view()}


def column_from_state(
    name: str,
    dtype: type,
    state: dict[str, np.ndarray],
    rows: int,
    prefix: str | None,
    suffix: str,
    shape: tuple[int, ...] = (),
) -> Column:
    """The column :func:`column_state` describes, with ``rows`` values, in memory or in a file
    (values from the snapshot are written to a new file).  ValueError if the values do not fit,
    or a file is missing, short or holds other values."""
    if name in state:
        values = state[name]
        if len(values) != rows:
            raise ValueError(f"the snapshot's {name} column has {len(values)} rows, not {rows}")
        values = values.reshape(rows, *shape)
        if prefix is None or 0 in shape:
            return GrowingArray.of(values)
        return FileArray.of(values.astype(dtype), prefix + suffix)
    if prefix is None:
        raise ValueError("the snapshot keeps its columns in files, and no string file was given")
    return FileArray.open(dtype, prefix + suffix, rows, int(state[f"{name}_check"]), shape)


def file_bytes(cols: Iterable[Column]) -> int:
    """Bytes of the columns' files (0 for those in memory)."""
    return sum(c.file_bytes for c in cols if isinstance(c, FileArray))


def close(cols: Iterable[Column]) -> None:
    """Close the columns' files (the store is no longer used)."""
    for c in cols:
        if isinstance(c, FileArray):
            c.close()
