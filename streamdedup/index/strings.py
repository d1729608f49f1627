"""Append-only strings (a shard's stored ids and URLs) with no Python object per string.

In memory (a bytearray and a numpy column of ends), or, given ``path``, in two files: the
UTF-8 bytes (``path``) and the end offset of each string (``path + ".ends"``, a
:class:`~streamdedup.index.file_array.FileArray`).  A file-backed heap keeps nothing per string
in memory: both are read back only for the strings an answer reports.

>>> h = StringHeap(); h.extend(["a", "Ωb"]); h[1], len(h)
('Ωb', 2)
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import xxhash

from streamdedup.index.file_array import Blob, FileArray, Staged, WritesAhead, pwrite_all, stage_file

__all__ = ["StringHeap", "texts_state", "texts_from_state"]

_SPAN = 1 << 16


class StringHeap:
    """Strings appended in batches, read back by number."""

    def __init__(self, path: os.PathLike[str] | str | None = None) -> None:
        self._data = bytearray()
        self._mem_ends = np.zeros(0 if path is not None else 1024, dtype=np.int64)  # (in memory only)
        self._file_ends: FileArray | None = None
        self._n, self._size = 0, 0
        self._fd: int | None = None
        self._ahead = WritesAhead()  # writes past the end, in file order (write_ahead)
        self._ends_ahead: deque[np.ndarray] = deque()  # (their ends, written ahead too)
        self.path = None if path is None else os.fspath(path)
        if self.path is not None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            self._file_ends = FileArray(np.int64, self.path + ".ends")

    @classmethod
    def open(cls, path: os.PathLike[str] | str, count: int | np.ndarray, check: int) -> StringHeap:
        """Reopen the file-backed heap a snapshot describes: its first ``count`` strings (or,
        from snapshots that kept them, the array of their ends, written to the ends file) and
        ``check`` (:meth:`checksum` when the snapshot was taken).  Bytes appended after the
        snapshot are cut off (the changelog replays them).  ValueError if a file is missing,
        shorter than the snapshot says, or holds other bytes."""
        heap = cls.__new__(cls)
        heap._data, heap._mem_ends, heap._fd, heap._file_ends = bytearray(), np.zeros(0, np.int64), None, None
        heap._ahead, heap._ends_ahead = WritesAhead(), deque()
        heap.path, heap._n, heap._size = os.fspath(path), 0, 0
        try:
            heap._fd = os.open(heap.path, os.O_RDWR)
        except OSError as e:
            raise ValueError(f"cannot open the string file {heap.path}: {e}") from None
        try:
            if isinstance(count, np.ndarray):  # the ends, kept in the snapshot (format 1)
                heap._file_ends = FileArray.of(count.astype(np.int64), heap.path + ".ends")
                heap._n = len(count)
            else:
                heap._n = int(count)
                heap._file_ends = FileArray.open(np.int64, heap.path + ".ends", heap._n, None)
            heap._size = int(heap._file_ends.view()[-1]) if heap._n else 0
            if heap._size < 0:
                raise ValueError(f"the ends file of {heap.path} is damaged (its last end is {heap._size})")
            if os.fstat(heap._fd).st_size < heap._size:
                raise ValueError(f"the string file {heap.path} is shorter than its snapshot says ({heap._size} bytes)")
            os.ftruncate(heap._fd, heap._size)
            # (format 1's checksum covers the data file alone)
            got = xxhash.xxh64_intdigest(heap._digest()) if isinstance(count, np.ndarray) else heap.checksum()
            if got != check:
                raise ValueError(f"the string file {heap.path} does not hold the strings its snapshot describes")
        except BaseException:
            heap.close()
            raise
        return heap

    def __len__(self) -> int:
        return self._n

    @property
    def size(self) -> int:
        """Bytes of string data."""
        return self._size

    @property
    def nbytes(self) -> int:
        """Resident bytes (a file-backed heap's data and ends are not resident)."""
        return len(self._data) + self._mem_ends.nbytes

    @property
    def file_bytes(self) -> int:
        """Bytes in files (the data and the ends file); 0 for a heap held in memory."""
        return 0 if self._file_ends is None else self._size + self._file_ends.file_bytes

    def extend(self, values: list[str]) -> None:
        encoded = [v.encode("utf-8", "surrogatepass") for v in values]
        self.extend_raw(b"".join(encoded), np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))

    def write_ahead(self, blob: Blob, lengths: np.ndarray, after: Future[None] | None = None) -> None:
        """Start writing the strings of a coming :meth:`extend_raw` (``blob``: that very object;
        its bytes and their ends) to the files in a thread, after the heap's end and the writes
        ahead before it: ``pwrite`` releases the GIL, so a changelog replay decodes its next
        batch meanwhile.  Nothing is numbered until that ``extend_raw``, which waits for the
        writes and raises their error; until then the heap reads as it was.  A heap in memory
        writes nothing ahead.  ``after``: a job of the writer thread that fills ``blob``
        (:func:`~streamdedup.index.file_array.call_ahead`)."""
        if self._fd is None or self._file_ends is None or not len(lengths):
            return
        at = self._ahead.end(self._size)
        ends = at + np.cumsum(lengths, dtype=np.int64)
        self._ahead.add(self._fd, blob, blob, at, after)
        self._file_ends.write_ahead(ends)
        self._ends_ahead.append(ends)

    def wait_ahead(self, blob: Blob) -> None:
        """Wait for the write ahead of ``blob`` (:meth:`write_ahead`), if it is the next one, and
        raise its error: every write ahead is then dropped, and the heap is as it was."""
        try:
            if self._ahead.waited(blob, self._fd, self._size) and self._file_ends is not None:
                self._file_ends.wait_ahead(self._ends_ahead[0])
        except BaseException:
            self.drop_ahead()
            raise

    def drop_ahead(self) -> None:
        """Wait for the writes ahead and forget them (the files are cut back to the heap's end)."""
        self._ahead.drop(self._fd, self._size)
        self._ends_ahead.clear()
        if self._file_ends is not None:
            self._file_ends.drop_ahead()

    def extend_raw(self, blob: Blob, lengths: np.ndarray | Callable[[], np.ndarray]) -> None:
        """Append strings given as one UTF-8 blob and their byte lengths (no decoding).  A failed
        write (a full disk) raises and leaves the heap as it was.  ``blob`` may have been written
        ahead (:meth:`write_ahead`); other writes ahead are dropped.  ``lengths`` may be a function
        that gives them, called only if they are needed (not for a blob written ahead: its ends
        are known)."""
        if self._fd is None:
            ends = self._size + np.cumsum(_given(lengths), dtype=np.int64)
            if self._n + len(ends) > len(self._mem_ends):
                self._mem_ends = np.resize(self._mem_ends, max(self._n + len(ends), 2 * len(self._mem_ends)))
            self._data += blob
            self._mem_ends[self._n : self._n + len(ends)] = ends
        else:
            assert self._file_ends is not None
            try:
                written = self._ahead.take(blob, self._fd, self._size)
            except BaseException:
                self.drop_ahead()
                raise
            if written:
                ends = self._ends_ahead.popleft()
            else:
                ends = self._size + np.cumsum(_given(lengths), dtype=np.int64)
                if len(ends):
                    self.drop_ahead()  # (a write out of their order: they are written again)
                    pwrite_all(self._fd, blob, self._size)
            try:
                self._file_ends.extend(ends)  # last: the strings are numbered once both are written
            except BaseException:
                self.drop_ahead()  # (written after these bytes, which are not numbered)
                raise
        self._n += len(ends)
        if len(ends):
            self._size = int(ends[-1])

    def truncate(self, n: int) -> None:
        """Drop the strings from ``n`` on (undo an append)."""
        if n >= self._n:
            return
        self.drop_ahead()
        self._size = int(self.ends()[n - 1]) if n else 0
        if self._file_ends is not None:
            self._file_ends.truncate(n)
        else:
            del self._data[self._size :]
        if self._fd is not None:
            os.ftruncate(self._fd, self._size)
        self._n = n

    def ends(self) -> np.ndarray:
        """The end offset of every string (a file-backed heap's: a read-only memory map)."""
        return self._mem_ends[: self._n] if self._file_ends is None else self._file_ends.view()

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < self._n:
            raise IndexError(i)
        if self._file_ends is None:
            ends = self._mem_ends
            start, end = (int(ends[i - 1]) if i else 0), int(ends[i])
        else:  # (take: no new memory map of the ends after every append)
            both = self._file_ends.take(np.array([i - 1, i]) if i else np.array([i]))
            start, end = (int(both[0]) if i else 0), int(both[-1])
        raw = self._data[start:end] if self._fd is None else os.pread(self._fd, end - start, start)
        return raw.decode("utf-8", "surrogatepass")

    def many(self, indices: np.ndarray | list[int]) -> list[str]:
        """``[self[i] for i in indices]`` with one read of the ends for all of them and, from a
        file, one ``pread`` for each run of strings that lie next to each other (a stored page's
        id and URL are numbered 2 r and 2 r + 1)."""
        idx = np.asarray(indices, dtype=np.int64)
        if not len(idx):
            return []
        if idx.min() < 0 or idx.max() >= self._n:
            raise IndexError(int(idx[(idx < 0) | (idx >= self._n)][0]))
        before = np.maximum(idx - 1, 0)
        if self._file_ends is None:
            starts, stops = self._mem_ends[before], self._mem_ends[idx]
        else:
            both = self._file_ends.take(np.concatenate((before, idx)))
            starts, stops = both[: len(idx)], both[len(idx) :]
        s, t = np.where(idx > 0, starts, 0).tolist(), stops.tolist()
        if self._fd is None:
            data = self._data
            return [data[a:b].decode("utf-8", "surrogatepass") for a, b in zip(s, t)]
        out: list[str] = []
        i = 0
        while i < len(s):
            j = i
            while j + 1 < len(s) and s[j + 1] == t[j]:
                j += 1
            base = s[i]
            blob = os.pread(self._fd, t[j] - base, base)
            out.extend(
                blob[a - base : b - base].decode("utf-8", "surrogatepass") for a, b in zip(s[i : j + 1], t[i : j + 1])
            )
            i = j + 1
        return out

    def data(self) -> bytes:
        """All string bytes (reads the whole file of a file-backed heap)."""
        return bytes(self._data) if self._fd is None else os.pread(self._fd, self._size, 0)

    def checksum(self) -> int:
        """xxh64 of the size and of the data's first and last 64 KiB (and, file-backed, of the
        ends file's): enough to tell a heap from another's, without reading gigabytes at a
        restart."""
        if self._file_ends is None:
            return xxhash.xxh64_intdigest(self._digest())
        return xxhash.xxh64_intdigest(self._digest() + self._file_ends.checksum().to_bytes(8, "little"))

    def _digest(self) -> bytes:
        """The size and the data's first and last 64 KiB."""
        size = self._size
        if self._fd is None:
            head, tail = bytes(self._data[:_SPAN]), bytes(self._data[max(0, size - _SPAN) : size])
        else:
            head = os.pread(self._fd, min(_SPAN, size), 0)
            tail = os.pread(self._fd, min(_SPAN, size), max(0, size - _SPAN))
        return size.to_bytes(8, "little") + head + tail

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the strings ``rows`` (ascending), renumbered in their order (retention's
        compaction).  A file-backed heap is copied, a chunk at a time, to new files that then
        replace the old ones: a failure before that leaves the heap as it was."""
        self.stage_keep(rows).commit()

    def stage_keep(self, rows: np.ndarray) -> Staged:
        """:meth:`keep`, staged: the new files are written now and replace the old ones at
        ``commit()`` (:class:`~streamdedup.index.file_array.Staged`)."""
        self.drop_ahead()
        rows = np.asarray(rows, dtype=np.int64)
        ends = np.asarray(self.ends())
        lengths = np.diff(ends, prepend=0)
        keep = np.zeros(self._n, dtype=bool)
        keep[rows] = True
        new_ends = np.cumsum(lengths[rows], dtype=np.int64)
        n, size = len(rows), int(new_ends[-1]) if len(new_ends) else 0
        if self._fd is None:
            data = bytearray(np.frombuffer(self._data, np.uint8)[np.repeat(keep, lengths)].tobytes())

            def in_memory() -> None:
                self._data, self._mem_ends, self._n, self._size = data, new_ends, n, size

            return Staged(in_memory)
        assert self.path is not None and self._file_ends is not None
        old_fd, path = self._fd, self.path

        def write(fd: int) -> None:
            at, chunk = 0, 1 << 16
            for lo in range(0, self._n, chunk):
                hi = min(self._n, lo + chunk)
                start = int(ends[lo - 1]) if lo else 0
                raw = np.frombuffer(os.pread(old_fd, int(ends[hi - 1]) - start, start), np.uint8)
                blob = raw[np.repeat(keep[lo:hi], lengths[lo:hi])].tobytes()
                pwrite_all(fd, blob, at)
                at += len(blob)

        fd, discard = stage_file(path, write)
        try:
            new_ends_file = self._file_ends.stage(new_ends)
        except BaseException:
            discard()
            raise

        def commit() -> None:
            new_ends_file.commit()
            os.replace(path + ".compacting", path)
            os.close(old_fd)
            self._fd, self._n, self._size = fd, n, size

        def drop() -> None:
            new_ends_file.discard()
            discard()

        return Staged(commit, drop)

    def close(self) -> None:
        self.drop_ahead()  # (its thread writes to the file descriptor)
        if self._file_ends is not None:
            self._file_ends.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._data = bytearray()


def _given(lengths: np.ndarray | Callable[[], np.ndarray]) -> np.ndarray:
    return lengths() if callable(lengths) else lengths


def texts_state(texts: StringHeap) -> dict[str, np.ndarray]:
    """What a snapshot keeps of a store's strings: their ends and bytes (in memory), or their
    count and the files' checksum (file-backed: the files hold them; :meth:`StringHeap.open`)."""
    if texts.path is None:
        return {"text_ends": texts.ends(), "texts": np.frombuffer(texts.data(), dtype=np.uint8)}
    return {
        "text_count": np.array(len(texts), dtype=np.int64),
        "text_check": np.array(texts.checksum(), dtype=np.uint64),
    }


def texts_from_state(state: dict[str, np.ndarray], strings: str | None) -> StringHeap:
    """The strings :func:`texts_state` describes, in memory or in the file ``strings``."""
    if "texts" in state:  # a snapshot of in-memory strings (to memory, or to a new file)
        ends = state["text_ends"]
        texts = StringHeap(strings)
        texts.extend_raw(state["texts"].tobytes(), np.diff(ends, prepend=0))
        return texts
    if strings is None:
        raise ValueError("the snapshot keeps its strings in files, and no string file was given")
    if "text_count" in state:
        return StringHeap.open(strings, int(state["text_count"]), int(state["text_check"]))
    # format 1: the ends in the snapshot, the checksum of the data file alone
    return StringHeap.open(strings, state["text_ends"], int(state["text_check"]))
