"""A shard snapshot on disk: named numpy arrays stored as they are in memory, read back with one
read each (no zip, no per-member copy), each checked against its xxh3 hash.

Layout::

    b"SDSNAP1\\n" | u64 header length | header (JSON) | arrays, each at a 64-byte aligned offset

The header lists each array's name, dtype, shape, offset, byte length and xxh3-64, and holds
the caller's ``meta``.  A file that is short, has another magic, or whose bytes do not hash to
what the header says is refused with ValueError.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import struct
from typing import Any

import numpy as np
import xxhash

__all__ = ["MAGIC", "write_arrays", "read_arrays"]

MAGIC = b"SDSNAP1\n"
_ALIGN = 64


def _raw(a: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, writable if the array is."""
    return a.reshape(-1).data.cast("B")


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def write_arrays(path: os.PathLike[str] | str, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write ``arrays`` and ``meta`` to ``path`` (through a temporary file, replaced atomically)."""
    entries: list[dict[str, Any]] = []
    offset = 0
    contiguous = {name: a if a.flags.c_contiguous else a.copy(order="C") for name, a in arrays.items()}
    for name, a in contiguous.items():
        if a.dtype.hasobject:
            raise ValueError(f"array {name!r} holds Python objects")
        entries.append(
            {
                "name": name,
                "dtype": a.dtype.str,
                "shape": list(a.shape),
                "offset": offset,
                "nbytes": a.nbytes,
                "xxh3": xxhash.xxh3_64_intdigest(_raw(a)) if a.nbytes else 0,
            }
        )
        offset = _aligned(offset + a.nbytes)
    header = json.dumps({"arrays": entries, "meta": meta}).encode()
    start = _aligned(len(MAGIC) + 8 + len(header))
    path = os.fspath(path)
    _remove_stale_temps(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(header)) + header)
            for entry, a in zip(entries, contiguous.values()):
                f.seek(start + entry["offset"])
                f.write(_raw(a) if a.nbytes else b"")
            f.truncate(start + offset)
        os.replace(tmp, path)
    except BaseException:  # (a full disk: the half-written file would hold the space it has)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _remove_stale_temps(path: str) -> None:
    """Remove ``path``'s temporary files left by processes that are gone (a SIGKILL mid-write):
    each can be as large as a snapshot, on a disk that may be full already."""
    for tmp in glob.glob(glob.escape(path) + ".tmp-*"):
        pid = tmp.rsplit(".tmp-", 1)[1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        except PermissionError:  # (alive, another user's)
            pass


def read_arrays(path: os.PathLike[str] | str) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and meta :func:`write_arrays` wrote (each a fresh, writable array)."""
    path = os.fspath(path)
    try:
        with open(path, "rb", buffering=0) as f:
            head = f.read(len(MAGIC) + 8)
            if len(head) < len(MAGIC) + 8 or head[: len(MAGIC)] != MAGIC:
                raise ValueError(f"{path} is not a streamdedup snapshot")
            (size,) = struct.unpack("<Q", head[len(MAGIC) :])
            if size > 1 << 30:
                raise ValueError(f"{path}: a header of {size} bytes (damaged)")
            raw = f.read(size)
            try:
                header = json.loads(raw)
                entries, meta = header["arrays"], header["meta"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}: the header is damaged ({e})") from None
            start = _aligned(len(MAGIC) + 8 + size)
            out: dict[str, np.ndarray] = {}
            end = os.fstat(f.fileno()).st_size
            for entry in entries:
                try:
                    dtype, shape = np.dtype(entry["dtype"]), tuple(int(x) for x in entry["shape"])
                except (TypeError, ValueError) as err:
                    raise ValueError(f"{path}: array {entry.get('name')!r} has a damaged type ({err})") from None
                n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                if (
                    dtype.hasobject
                    or min(shape, default=0) < 0
                    or n != entry["nbytes"]
                    or start + entry["offset"] + n > end
                ):
                    raise ValueError(f"{path}: array {entry['name']!r} is damaged or cut short")
                a = np.empty(shape, dtype=dtype)
                f.seek(start + entry["offset"])
                view = _raw(a) if a.nbytes else memoryview(b"")
                got = 0
                while got < a.nbytes:
                    n = f.readinto(view[got:])
                    if not n:
                        raise ValueError(f"{path} is cut short (array {entry['name']!r})")
                    got += n
                if a.nbytes and xxhash.xxh3_64_intdigest(view) != entry["xxh3"]:
                    raise ValueError(f"{path}: array {entry['name']!r} does not match its checksum (damaged)")
                out[entry["name"]] = a
    except OSError as e:
        raise ValueError(f"cannot read the shard snapshot {path}: {e}") from None
    return out, meta
