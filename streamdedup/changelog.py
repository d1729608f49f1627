"""The shard changelog's record format, encoded per insert and decoded in batches with numpy.

Every page a shard stores is one record of its compacted changelog topic, so a restarted
worker rebuilds the shard by replaying them.  Key: ``group u16 | id hash u64 | fingerprint
u64`` (18 bytes; compaction keeps one record per page and fingerprint in a group).
Value, little-endian::

    offset  0  fingerprint  u64        offset 24  group       u16
            8  fetched      i64 (ms)          26  id length   u32
           16  id hash      u64               30  url length  u32
                                              34  id bytes (UTF-8), then url bytes

Decoding a batch touches each record from Python once (its length); the fixed fields and the
strings are gathered by numpy, so replay runs at millions of records a second.

>>> key, value = encode(2, 0xABC, 1_700_000_000_000, 7, "page-1", "http://a/")[0]
>>> d = decode([value]); int(d.group[0]), hex(int(d.fps[0])), d.ids(), d.urls()
(2, '0xabc', ['page-1'], ['http://a/'])
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["HEADER", "encode", "decode", "Inserts"]

HEADER = np.dtype([("fp", "<u8"), ("fetched", "<i8"), ("id_hash", "<u8"), ("group", "<u2"),
                   ("id_len", "<u4"), ("url_len", "<u4")])
assert HEADER.itemsize == 34
_KEY = struct.Struct("<HQQ")
_HEAD = struct.Struct("<QqQHII")


def encode(group, fps, fetched, id_hash, ids, urls) -> list[tuple[bytes, bytes]]:
    """(key, value) records for stored pages; scalars or equal-length sequences."""
    if isinstance(ids, str):
        group, fps, fetched, id_hash, ids, urls = [group], [fps], [fetched], [id_hash], [ids], [urls]
    out = []
    for g, fp, f, h, i, u in zip(np.asarray(group).tolist(), np.asarray(fps, dtype=np.uint64).tolist(),
                                 np.asarray(fetched).tolist(), np.asarray(id_hash, dtype=np.uint64).tolist(), ids, urls):
        ib, ub = i.encode("utf-8", "surrogatepass"), u.encode("utf-8", "surrogatepass")
        out.append((_KEY.pack(g, h, fp), _HEAD.pack(fp, f, h, g, len(ib), len(ub)) + ib + ub))
    return out


@dataclass
class Inserts:
    """A decoded batch: numpy columns, and every record's id and url, interleaved in one blob
    (id 0, url 0, id 1, url 1, ...) with their byte lengths."""

    group: np.ndarray
    fps: np.ndarray
    fetched: np.ndarray
    id_hash: np.ndarray
    strings: bytes
    lengths: np.ndarray  # int64, 2 per record: id length, url length

    def __len__(self) -> int:
        return len(self.fps)

    def ids(self) -> list[str]:
        return _split(self.strings, self.lengths)[0::2]

    def urls(self) -> list[str]:
        return _split(self.strings, self.lengths)[1::2]

    def select(self, mask: np.ndarray) -> "Inserts":
        """The records where ``mask`` is true."""
        per_record = self.lengths[0::2] + self.lengths[1::2]
        keep = np.repeat(mask, per_record)
        strings = np.frombuffer(self.strings, dtype=np.uint8)[keep].tobytes()
        return Inserts(self.group[mask], self.fps[mask], self.fetched[mask], self.id_hash[mask], strings,
                       self.lengths.reshape(-1, 2)[mask].ravel())


def decode(values: Sequence[bytes]) -> Inserts:
    """Decode a batch of changelog values (raises ValueError on a malformed record)."""
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    if (lengths < HEADER.itemsize).any():
        raise ValueError("a changelog record is shorter than its 34-byte header")
    buf = np.frombuffer(b"".join(values), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    head = buf[starts[:, None] + np.arange(HEADER.itemsize)].view(HEADER).ravel()
    str_lens = np.empty(2 * len(values), dtype=np.int64)
    str_lens[0::2], str_lens[1::2] = head["id_len"], head["url_len"]
    if (HEADER.itemsize + str_lens[0::2] + str_lens[1::2] != lengths).any():
        raise ValueError("a changelog record's lengths do not add up")
    # every record is header + id + url: dropping the headers leaves the strings, in order
    is_string = np.repeat(np.tile(np.array([False, True]), len(values)),
                          np.stack((np.full(len(values), HEADER.itemsize), lengths - HEADER.itemsize), axis=1).ravel())
    return Inserts(head["group"].astype(np.int64), head["fp"].copy(), head["fetched"].copy(), head["id_hash"].copy(),
                   buf[is_string].tobytes(), str_lens)


def _split(blob: bytes, lens: np.ndarray) -> list[str]:
    ends = np.cumsum(lens).tolist()
    out, start = [], 0
    for end in ends:
        out.append(blob[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return out
