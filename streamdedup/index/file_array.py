"""A column of fixed-width values kept in a file, not in the worker's memory.

What a shard must know of a stored page besides its fingerprint (its fetch time, its id hash,
where its id and URL end in the string file) is read only for the few rows a probe finds
within k bits, and for a scan when the retention cutoff moves.  So it need not be resident:
the column is appended to a file with ``pwrite`` and read back through a read-only memory map,
which the OS pages in and out as it likes (page cache, not the process's anonymous memory).

Same reading interface as :class:`~streamdedup.index.arrays.GrowingArray` (``view()``, valid
until the next append; rows of a fixed ``row_shape``), so a store can hold either.

>>> import tempfile, os
>>> d = tempfile.mkdtemp(); col = FileArray(np.int64, os.path.join(d, "c"))
>>> col.extend(np.arange(3)); col.view()[[2, 0]].tolist(), len(col), col.nbytes
([2, 0], 3, 0)
>>> col.close()
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import xxhash

__all__ = ["FileArray"]

_SPAN = 1 << 16  # bytes of each end of the file that the checksum reads


class FileArray:
    """Values of one dtype appended to the file ``path`` (created empty, truncated)."""

    __slots__ = ("_fd", "_map", "dtype", "n", "path", "row_shape")

    def __init__(self, dtype: type | np.dtype, path: os.PathLike[str] | str, row_shape: tuple[int, ...] = ()) -> None:
        self.dtype, self.path, self.n, self.row_shape = np.dtype(dtype), os.fspath(path), 0, tuple(row_shape)
        if self.row_bytes == 0:
            raise ValueError(f"a file column needs rows of at least one byte, not shape {self.row_shape}")
        self._map: np.ndarray | None = None
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))

    @classmethod
    def open(
        cls,
        dtype: type | np.dtype,
        path: os.PathLike[str] | str,
        n: int,
        check: int | None,
        row_shape: tuple[int, ...] = (),
    ) -> FileArray:
        """Reopen a column a snapshot describes: its first ``n`` values, whose :meth:`checksum`
        was ``check`` (None: the caller checks).  Values appended after the snapshot are cut off (the changelog replays
        them).  ValueError if the file is missing, shorter than that, or holds other values."""
        out = cls.__new__(cls)
        out.dtype, out.path, out.n, out._map = np.dtype(dtype), os.fspath(path), int(n), None
        out.row_shape = tuple(row_shape)
        try:
            out._fd = os.open(out.path, os.O_RDWR)
        except OSError as e:
            raise ValueError(f"cannot open the column file {out.path}: {e}") from None
        size = out.n * out.row_bytes
        if os.fstat(out._fd).st_size < size:
            out.close()
            raise ValueError(f"the column file {out.path} is shorter than its snapshot says ({size} bytes)")
        os.ftruncate(out._fd, size)
        if check is not None and out.checksum() != check:
            out.close()
            raise ValueError(f"the column file {out.path} does not hold the values its snapshot describes")
        return out

    @classmethod
    def of(cls, values: np.ndarray, path: os.PathLike[str] | str) -> FileArray:
        """A new file holding ``values`` (rows of ``values.shape[1:]``)."""
        out = cls(values.dtype, path, values.shape[1:])
        out.extend(values)
        return out

    def __len__(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        """Resident bytes: none (the values are in the file and the page cache)."""
        return 0

    @property
    def file_bytes(self) -> int:
        """Bytes of the file (its values)."""
        return self.n * self.row_bytes

    def _write(self, fd: int, data: np.ndarray, at: int) -> None:
        view = memoryview(np.ascontiguousarray(data, dtype=self.dtype).view(np.uint8).tobytes())
        while len(view):  # (a write may be short)
            done = os.pwrite(fd, view, at)
            view, at = view[done:], at + done

    def extend(self, values: np.ndarray) -> None:
        """Append ``values`` (converted to the column's dtype).  A failed write (a full disk)
        raises and leaves the column as it was."""
        values = np.asarray(values)
        if not len(values):
            return
        assert self._fd is not None, "the column is closed"
        if values.shape[1:] != self.row_shape:
            raise ValueError(f"rows of shape {values.shape[1:]} for a column of rows {self.row_shape}")
        self._write(self._fd, values, self.n * self.row_bytes)
        self.n += len(values)
        self._map = None

    def truncate(self, n: int) -> None:
        """Drop the values from ``n`` on (undo an append)."""
        if n < self.n and self._fd is not None:
            os.ftruncate(self._fd, n * self.row_bytes)
            self.n, self._map = n, None

    def view(self) -> np.ndarray:
        """The values appended so far, read-only (a memory map: valid until the next append)."""
        if self._map is None or len(self._map) != self.n:
            self._map = (
                np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n, *self.row_shape))
                if self.n
                else np.empty((0, *self.row_shape), self.dtype)
            )
        return self._map

    def checksum(self) -> int:
        """xxh64 of the length and of the first and last 64 KiB: enough to tell the file from
        another column's, without reading gigabytes at a restart."""
        assert self._fd is not None, "the column is closed"
        size = self.n * self.row_bytes
        head = os.pread(self._fd, min(_SPAN, size), 0)
        tail = os.pread(self._fd, min(_SPAN, size), max(0, size - _SPAN))
        return xxhash.xxh64_intdigest(size.to_bytes(8, "little") + head + tail)

    def replace(self, values_of: Iterable[np.ndarray] | np.ndarray) -> None:
        """Make the column hold ``values_of`` (an array, or chunks in order) instead: written to a
        new file that then replaces the old one, so a failure before that leaves the column as it
        was (retention's compaction)."""
        chunks = [values_of] if isinstance(values_of, np.ndarray) else values_of
        tmp = self.path + ".compacting"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            at = 0
            for chunk in chunks:
                self._write(fd, chunk, at)
                at += len(chunk) * self.row_bytes
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        self.close()
        self._fd, self.n = fd, at // self.row_bytes

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the values at ``rows`` (ascending), in their order."""
        rows = np.asarray(rows, dtype=np.int64)
        chunk, view = 1 << 20, self.view()
        self.replace(np.asarray(view[rows[at : at + chunk]]) for at in range(0, len(rows), chunk))

    def close(self) -> None:
        self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
