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

import math
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

__all__ = ["FileArray", "Blob", "Staged", "WritesAhead", "call_ahead", "pwrite_all", "stage_file"]

_SPAN = 1 << 16  # bytes of each end of the file that the checksum reads
Blob = bytes | bytearray | memoryview


def pwrite_all(fd: int, blob: Blob, at: int) -> None:
    """Write all of ``blob`` at ``at`` (a write may be short)."""
    view = memoryview(blob).cast("B")
    while len(view):
        done = os.pwrite(fd, view, at)
        view, at = view[done:], at + done


class Staged:
    """A change prepared aside: :meth:`commit` makes it (renames and assignments only, nothing
    that runs out of space) and returns what it gives, :meth:`discard` drops it.  A compaction
    stages every file it rewrites before it commits any, so a failure (a full disk) leaves all
    of them as they were, never some rewritten and others not."""

    def __init__(self, commit: Callable[[], Any], discard: Callable[[], None] = lambda: None) -> None:
        self._commit, self._discard = commit, discard

    def commit(self) -> Any:
        return self._commit()

    def discard(self) -> None:
        self._discard()


def stage_file(path: str, write: Callable[[int], None]) -> tuple[int, Callable[[], None]]:
    """A new file beside ``path`` (``path + ".compacting"``) filled by ``write(fd)``: returns its
    descriptor and a function that closes and removes it.  A failed write removes it first."""
    tmp = path + ".compacting"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def discard() -> None:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass

    try:
        write(fd)
    except BaseException:
        discard()
        raise
    return fd, discard


class _Writer:
    """The one thread that writes ahead (:class:`WritesAhead`), in the order asked: ``pwrite``
    releases the GIL, so a changelog replay decodes its next batch meanwhile.  A daemon thread
    of its own (a ThreadPoolExecutor's exit hook would join it; every file waits for its own
    writes before it closes)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[None], Callable[[], None]]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="writes-ahead", daemon=True).start()

    def call(self, job: Callable[[], None]) -> Future[None]:
        """Run ``job`` in the thread, after the jobs before it."""
        done: Future[None] = Future()
        self._jobs.put((done, job))
        return done

    def submit(self, fd: int, blob: Blob, at: int, after: Future[None] | None = None) -> Future[None]:
        """Write ``blob`` at ``at`` in the thread; ``after``: a job it depends on (:meth:`call`,
        made before), whose error it fails with."""

        def write() -> None:
            if after is not None:
                after.result()  # (done already: the jobs run in order)
            _write_ahead(fd, blob, at)

        return self.call(write)

    def _run(self) -> None:
        while True:
            done, job = self._jobs.get()
            try:
                job()
            except BaseException as e:
                done.set_exception(e)
            else:
                done.set_result(None)


def _write_ahead(fd: int, blob: Blob, at: int) -> None:
    """(The writer thread's write: a test makes it fail.)"""
    pwrite_all(fd, blob, at)


def call_ahead(job: Callable[[], None]) -> Future[None]:
    """Run ``job`` in the thread that writes ahead, before the writes asked after this (e.g. fill
    the buffer they write: :meth:`~streamdedup.pipeline.wire.Batch.by_group` ``later``)."""
    return _writer().call(job)


_WRITER: _Writer | None = None
_WRITER_LOCK = threading.Lock()


def _writer() -> _Writer:
    global _WRITER
    with _WRITER_LOCK:
        if _WRITER is None:
            _WRITER = _Writer()
        return _WRITER


@dataclass
class _Ahead:
    key: Any  # what the coming append is given (see WritesAhead.key)
    at: int
    size: int
    written: Future[None]
    held: Any  # (kept alive until written and taken: the bytes, and the caller's object)


class WritesAhead:
    """Writes past a file's end made by the writer thread before the append that numbers them
    (:meth:`FileArray.write_ahead`, :meth:`~streamdedup.index.strings.StringHeap.write_ahead`):
    in file order, each matched by what the append is given."""

    def __init__(self) -> None:
        self._queue: deque[_Ahead] = deque()

    def __bool__(self) -> bool:
        return bool(self._queue)

    @staticmethod
    def key(values: Any) -> Any:
        """An array is known by its memory (a column view such as ``rows["fetched"]`` is a new
        object each time it is taken), anything else by its identity."""
        if isinstance(values, np.ndarray):
            face = values.__array_interface__
            return ("array", face["data"][0], face["shape"], face["strides"], face["typestr"])
        return ("object", id(values))

    def end(self, end: int) -> int:
        """Where the next write ahead goes: after the last one, or at the file's ``end``."""
        return self._queue[-1].at + self._queue[-1].size if self._queue else end

    def add(self, fd: int, values: Any, data: Blob, at: int, after: Future[None] | None = None) -> None:
        """Write ``data`` (``values``' bytes) at ``at`` in the writer thread, after the job
        ``after`` if given (:func:`call_ahead`: it fills ``data``)."""
        size = memoryview(data).nbytes
        written = _writer().submit(fd, data, at, after)
        self._queue.append(_Ahead(self.key(values), at, size, written, (values, data)))

    def waited(self, values: Any, fd: int | None, end: int) -> bool:
        """Wait for the next write ahead if it holds ``values`` at the file's ``end`` (True:
        written; its error is raised once every write ahead is dropped, the file cut back to
        ``end``); False: it holds something else."""
        if not self._queue or self._queue[0].key != self.key(values) or self._queue[0].at != end:
            return False
        try:
            self._queue[0].written.result()
        except BaseException:
            self.drop(fd, end)
            raise
        return True

    def take(self, values: Any, fd: int | None, end: int) -> bool:
        """:meth:`waited`, and the write is the caller's (True), or it was not ahead (False)."""
        if self.waited(values, fd, end):
            self._queue.popleft()
            return True
        return False

    def drop(self, fd: int | None, end: int) -> None:
        """Wait for every write ahead and forget them; the file ``fd`` is cut back to ``end``."""
        if not self._queue:
            return
        for ahead in self._queue:
            try:
                ahead.written.result()
            except BaseException:  # (dropped all the same)
                pass
        self._queue.clear()
        if fd is not None:
            os.ftruncate(fd, end)


#: Rows past a column's memory map that :meth:`FileArray.take` reads one ``pread`` each; more,
#: and it maps the file anew.
_FEW_ROWS = 32


class FileArray:
    """Values of one dtype appended to the file ``path`` (created empty, truncated)."""

    __slots__ = ("_ahead", "_fd", "_map", "dtype", "n", "path", "row_shape")

    def __init__(self, dtype: type | np.dtype, path: os.PathLike[str] | str, row_shape: tuple[int, ...] = ()) -> None:
        self.dtype, self.path, self.n, self.row_shape = np.dtype(dtype), os.fspath(path), 0, tuple(row_shape)
        if self.row_bytes == 0:
            raise ValueError(f"a file column needs rows of at least one byte, not shape {self.row_shape}")
        self._map: np.ndarray | None = None
        self._ahead = WritesAhead()
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.row_shape)

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
        out._ahead = WritesAhead()
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

    def _bytes(self, data: np.ndarray) -> bytes:
        return np.ascontiguousarray(data, dtype=self.dtype).view(np.uint8).tobytes()

    def _write(self, fd: int, data: np.ndarray, at: int) -> None:
        pwrite_all(fd, self._bytes(data), at)

    def write_ahead(self, values: np.ndarray) -> None:
        """Start writing ``values``, those of a coming :meth:`extend` (the same array, unchanged
        until then), past the column's end in a thread (``pwrite`` releases the GIL).  Nothing is
        appended until that ``extend``, which waits for the write and raises its error."""
        if len(values) and self._fd is not None and np.shape(values)[1:] == self.row_shape:
            self._ahead.add(self._fd, values, self._bytes(values), self._ahead.end(self.n * self.row_bytes))

    def extend(self, values: np.ndarray) -> None:
        """Append ``values`` (converted to the column's dtype).  A failed write (a full disk)
        raises and leaves the column as it was.  ``values`` may have been written ahead
        (:meth:`write_ahead`); other writes ahead are dropped."""
        if not len(values):
            return
        assert self._fd is not None, "the column is closed"
        if not self._ahead.take(values, self._fd, self.n * self.row_bytes):
            values = np.asarray(values)
            if values.shape[1:] != self.row_shape:
                raise ValueError(f"rows of shape {values.shape[1:]} for a column of rows {self.row_shape}")
            self.drop_ahead()  # (a write out of their order)
            self._write(self._fd, values, self.n * self.row_bytes)
        self.n += len(values)
        # (the memory map is kept: an append never rewrites the bytes it maps, so it stays a
        # valid view of the rows before; view() maps the file anew, take() only when it must)

    def wait_ahead(self, values: np.ndarray) -> None:
        """Wait for the write ahead of ``values`` if it is the next one, and raise its error
        (every write ahead is then dropped: the column is as it was)."""
        self._ahead.waited(values, self._fd, self.n * self.row_bytes)

    def drop_ahead(self) -> None:
        """Wait for the writes ahead and forget them (the file is cut back to the column's end)."""
        self._ahead.drop(self._fd, self.n * self.row_bytes)

    def truncate(self, n: int) -> None:
        """Drop the values from ``n`` on (undo an append)."""
        self.drop_ahead()
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

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The values at ``rows`` (indices in 0..n-1, any order), a fresh array.  Rows the last
        memory map covers are read from it, the few appended since with ``pread``: a shard step
        reads a handful of rows after every append, and mapping the file anew each time (an
        ``open``, an ``mmap`` and a ``munmap``) cost more than the step's searches."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return np.empty((0, *self.row_shape), self.dtype)
        if int(rows.min()) < 0 or int(rows.max()) >= self.n:
            raise IndexError(f"rows outside the column's 0..{self.n - 1}")
        mapped = self._map
        covered = 0 if mapped is None else len(mapped)
        beyond = np.flatnonzero(rows >= covered)
        if mapped is None or len(beyond) > _FEW_ROWS:
            return self.view()[rows]
        out = np.empty((len(rows), *self.row_shape), self.dtype)
        if len(beyond) < len(rows):
            out[...] = mapped[np.minimum(rows, covered - 1)]  # (the rows beyond: overwritten below)
        assert self._fd is not None, "the column is closed"
        size = self.row_bytes
        for i in beyond.tolist():
            raw = os.pread(self._fd, size, int(rows[i]) * size)
            out[i] = np.frombuffer(raw, self.dtype).reshape(self.row_shape)
        return out

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
        self.stage(values_of).commit()

    def stage(self, values_of: Iterable[np.ndarray] | np.ndarray) -> Staged:
        """:meth:`replace`, staged: the new file is written now, and replaces the old one at
        ``commit()`` (which returns the column)."""
        self.drop_ahead()
        chunks = [values_of] if isinstance(values_of, np.ndarray) else values_of
        written = [0]

        def write(fd: int) -> None:
            for chunk in chunks:
                self._write(fd, chunk, written[0])
                written[0] += len(chunk) * self.row_bytes

        fd, discard = stage_file(self.path, write)

        def commit() -> FileArray:
            os.replace(self.path + ".compacting", self.path)
            self.close()
            self._fd, self.n = fd, written[0] // self.row_bytes
            return self

        return Staged(commit, discard)

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the values at ``rows`` (ascending), in their order."""
        self.stage_keep(rows).commit()

    def stage_keep(self, rows: np.ndarray) -> Staged:
        """:meth:`keep`, staged (see :meth:`stage`)."""
        rows = np.asarray(rows, dtype=np.int64)
        chunk, view = 1 << 20, self.view()
        return self.stage(np.asarray(view[rows[at : at + chunk]]) for at in range(0, len(rows), chunk))

    def close(self) -> None:
        self.drop_ahead()  # (the writer thread writes to its file descriptor)
        self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
