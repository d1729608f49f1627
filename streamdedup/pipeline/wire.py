"""Columnar batches of page rows: the bytes of probes, answers and shard changelog records.

The stream worker moves fingerprints between its stages in batches (one Kafka message per
batch and destination, never one per probe), and a shard's changelog holds one record per
batch of stored pages.  All three use one layout, decoded with a single ``np.frombuffer``::

    magic b"SDB2" | kind u8 | scheme u8 | n u32 | n rows of ROW (48 bytes) | strings

    ROW: fp u64 | fetched i64 (ms) | id_hash u64 | request u64 | group u16 | distance i16
         | partition u32 | id_len u32 | url_len u32            (little-endian)

and the strings are every row's id then url, UTF-8, in row order; an id equal to its url (the
default id) is written empty, since ids are never empty.  Rows of the LSH band modes carry
``w`` more bytes each (the band keys and sketch, :meth:`~streamdedup.index.bands.BandScheme.extra`),
in a layout of its own::

    magic b"SDB3" | kind u8 | scheme u8 | n u32 | w u16 | n rows of ROW | n x w extra bytes | strings  What the fields mean:

* a **probe**: a page to look up in one table group; ``request`` names the waiting page,
  ``partition`` is the input partition its answer goes back to;
* an **answer**: the best earlier match in that group (``distance`` -1 and empty strings when
  there is none; otherwise the match's fingerprint, order key, id hash, id and url);
* a **changelog** record: pages a shard stored (``distance``, ``partition`` 0; ``request``: the
  row's retention clock value, :func:`~streamdedup.pipeline.shard.clock_values`, 0 in records
  written before it was kept).  A record whose pages have all expired (``--retention``) is
  deleted by a tombstone: its key with no value.

``scheme`` is the fingerprint scheme (:data:`streamdedup.fingerprinting.SCHEME`) the row's
fingerprints were computed with.  :func:`decode` refuses a batch of another scheme with a
:class:`~streamdedup.errors.SchemeError` (fingerprints of two schemes must never share an index);
batches of the older layout ``b"SDB1" | kind u8 | n u32`` were all written by scheme 1.

>>> b = Batch.build(group=[1], fps=[0xABC], fetched=[5], id_hash=[7], ids=["p1"], urls=["http://a/"])
>>> d = decode([encode(b, CHANGELOG)]); int(d.group[0]), hex(int(d.fps[0])), d.ids(), d.urls()
(1, '0xabc', ['p1'], ['http://a/'])
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from streamdedup.errors import SchemeError
from streamdedup.fingerprinting import SCHEME, kernels

__all__ = [
    "ROW",
    "PROBES",
    "ANSWERS",
    "CHANGELOG",
    "CHECKS",
    "SCHEME_ADVICE",
    "Batch",
    "encode",
    "decode",
    "kind_of",
    "row_counts",
]

ROW = np.dtype(
    [
        ("fp", "<u8"),
        ("fetched", "<i8"),
        ("id_hash", "<u8"),
        ("request", "<u8"),
        ("group", "<u2"),
        ("distance", "<i2"),
        ("partition", "<u4"),
        ("id_len", "<u4"),
        ("url_len", "<u4"),
    ]
)
assert ROW.itemsize == 48
PROBES, ANSWERS, CHANGELOG, CHECKS = 1, 2, 3, 4  # CHECKS: probes that only look (POST /check)
_MAGIC = b"SDB2"
_HEAD = struct.Struct("<4sBBI")
_MAGIC_EXTRA = b"SDB3"  # rows with extra bytes (the band modes)
_WIDTH = struct.Struct("<H")
_MAGIC_V1 = b"SDB1"  # the layout before the scheme byte: every such batch is scheme 1
_HEAD_V1 = struct.Struct("<4sBI")
#: What an operator does about state of another scheme (the worker's messages add the topics).
SCHEME_ADVICE = (
    "run this version with a new --app-id (its shards start empty), or delete the app's "
    "internal topics (<app-id>-shards-changelog, -probes, -answers) and its --data-dir snapshots, "
    "or go on with the streamdedup version that wrote them"
)


@dataclass
class Batch:
    """Rows as numpy columns; ids and urls interleaved in one UTF-8 blob (id 0, url 0, id 1, ...)
    with their byte lengths, so no Python object per row until a string is asked for."""

    rows: np.ndarray  # ROW structured array
    strings: bytes | memoryview  # (a memoryview: by_group's parts are views of one regrouped buffer)
    kind: int = 0
    extra: np.ndarray | None = None  # (n, w) uint8: each row's extra bytes (band modes), or None

    def __len__(self) -> int:
        return len(self.rows)

    # column views, named as the shard uses them
    @property
    def group(self) -> np.ndarray:
        return self.rows["group"].astype(np.int64)

    @property
    def fps(self) -> np.ndarray:
        return self.rows["fp"]

    @property
    def fetched(self) -> np.ndarray:
        return self.rows["fetched"]

    @property
    def id_hash(self) -> np.ndarray:
        return self.rows["id_hash"]

    @property
    def lengths(self) -> np.ndarray:
        """Byte lengths, two per row: id, url."""
        out = np.empty(2 * len(self.rows), dtype=np.int64)
        out[0::2], out[1::2] = self.rows["id_len"], self.rows["url_len"]
        return out

    def ids(self) -> list[str]:
        both = _split(self.strings, self.lengths)
        return [i or u for i, u in zip(both[0::2], both[1::2])]

    def urls(self) -> list[str]:
        return _split(self.strings, self.lengths)[1::2]

    def select(self, mask_or_index: np.ndarray) -> Batch:
        """The rows picked by a boolean mask or an index array, in that order."""
        idx = (
            np.flatnonzero(mask_or_index)
            if np.asarray(mask_or_index).dtype == bool
            else np.asarray(mask_or_index, dtype=np.int64)
        )
        per_row = self.rows["id_len"].astype(np.int64) + self.rows["url_len"]
        if len(idx) < 2 or (np.diff(idx) > 0).all():  # in order: one numpy mask over the bytes
            keep = np.zeros(len(self.rows), dtype=bool)
            keep[idx] = True
            strings = np.frombuffer(self.strings, dtype=np.uint8)[np.repeat(keep, per_row)].tobytes()
        else:  # reordered
            ends = np.cumsum(per_row)
            blob = memoryview(self.strings)
            strings = b"".join(blob[e - n : e] for e, n in zip(ends[idx].tolist(), per_row[idx].tolist()))
        return Batch(self.rows[idx], strings, self.kind, None if self.extra is None else self.extra[idx])

    def by_group(self) -> list[tuple[int, Batch]]:
        """The rows of each group, in row order within it, groups ascending: like
        ``select(group == g)`` for every g, in one pass over the rows (a replay's batches hold
        tens of megabytes of strings, and a changelog record interleaves its groups)."""
        groups, fill = self.by_group_later()
        if fill is not None:
            fill()
        return groups

    def by_group_later(self) -> tuple[list[tuple[int, Batch]], Callable[[], None] | None]:
        """:meth:`by_group`, but the groups' strings may be views of a buffer not filled yet:
        the callable returned fills it (None: nothing to fill).  Call it once, from any thread
        (the numba kernel releases the GIL: a changelog replay fills the buffer in the thread
        that then writes it to the string files), before anything reads the strings."""
        group = self.rows["group"]
        if not len(group):
            return [], None
        counted = np.bincount(group)  # (groups are small numbers: no sort)
        values = np.flatnonzero(counted)
        counts = counted[values]
        if len(values) == 1:
            return [(int(values[0]), self)], None
        per_row = self.rows["id_len"].astype(np.int64) + self.rows["url_len"]
        ends = np.cumsum(counts).tolist()
        if (group[1:] >= group[:-1]).all():  # already in group order: slices
            byte_at = [0, *np.cumsum(per_row)[np.subtract(ends, 1)].tolist()]
            view = memoryview(self.strings)
            return [
                (
                    int(g),
                    Batch(
                        self.rows[lo:hi],
                        view[byte_at[i] : byte_at[i + 1]],
                        self.kind,
                        None if self.extra is None else self.extra[lo:hi],
                    ),
                )
                for i, (g, lo, hi) in enumerate(zip(values.tolist(), [0, *ends], ends))
            ], None
        # Rows: one stable gather (np.take, far cheaper than fancy indexing of a structured
        # array).  Strings: with numba, one pass copying each row's bytes to its group's place;
        # else each byte labelled with its row's group (one byte a byte when the groups fit),
        # then one boolean compress per group (no index array of a byte's position).
        order = np.argsort(group, kind="stable")
        rows = np.take(self.rows, order)
        extra = None if self.extra is None else np.take(self.extra, order, axis=0)
        blob = np.frombuffer(self.strings, dtype=np.uint8)
        module = _kernel_module()
        fill: Callable[[], None] | None = None
        if module is not None:
            rank = np.zeros(len(counted), dtype=np.int64)
            rank[values] = np.arange(len(values))
            slot = rank[group]
            group_bytes = np.bincount(slot, weights=per_row, minlength=len(values)).astype(np.int64)
            byte_at = [0, *np.cumsum(group_bytes).tolist()]
            out = np.empty(len(blob), dtype=np.uint8)
            starts = np.array(byte_at[:-1], dtype=np.int64)
            regrouped = out.data
            parts = [regrouped[byte_at[k] : byte_at[k + 1]] for k in range(len(values))]

            def fill() -> None:
                module.regroup_strings_into(out, blob, per_row, slot, starts)

        else:
            labels = np.repeat(group.astype(np.uint8) if int(values[-1]) < 256 else group, per_row)
            parts = [blob[labels == g].data for g in values.tolist()]
        return [
            (int(g), Batch(rows[lo:hi], part, self.kind, None if extra is None else extra[lo:hi]))
            for g, lo, hi, part in zip(values.tolist(), [0, *ends], ends, parts)
        ], fill

    @classmethod
    def build(
        cls,
        *,
        group,
        fps,
        fetched,
        id_hash,
        ids: Sequence[str],
        urls: Sequence[str],
        request=0,
        distance=0,
        partition=0,
        kind: int = 0,
        extra: np.ndarray | None = None,
    ) -> Batch:
        """Rows from columns (scalars broadcast), strings and, for the band modes, extra bytes."""
        n = len(ids)
        rows = np.zeros(n, dtype=ROW)
        for name, value in (
            ("group", group),
            ("fp", fps),
            ("fetched", fetched),
            ("id_hash", id_hash),
            ("request", request),
            ("distance", distance),
            ("partition", partition),
        ):
            rows[name] = value
        parts: list[bytes] = []
        id_len, url_len = np.empty(n, np.uint32), np.empty(n, np.uint32)
        for i, (a, b) in enumerate(zip(ids, urls)):
            ab, ub = b"" if a == b else a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
            parts += (ab, ub)
            id_len[i], url_len[i] = len(ab), len(ub)
        rows["id_len"], rows["url_len"] = id_len, url_len
        if extra is not None:
            extra = np.ascontiguousarray(extra, dtype=np.uint8).reshape(n, -1)
        return cls(rows, b"".join(parts), kind, extra)

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        if not batches:
            return cls(np.zeros(0, dtype=ROW), b"")
        extras = [b.extra for b in batches]
        if any(e is None for e in extras) and not all(e is None for e in extras):
            raise ValueError("cannot join batches with and without extra bytes")
        extra = None if extras[0] is None else np.concatenate([e for e in extras if e is not None])
        rows = np.concatenate([b.rows for b in batches])
        return cls(rows, b"".join(b.strings for b in batches), batches[0].kind, extra)


def encode(batch: Batch, kind: int) -> bytes:
    """One message value for ``batch``."""
    if batch.extra is not None and batch.extra.shape[1]:
        head = _HEAD.pack(_MAGIC_EXTRA, kind, SCHEME, len(batch.rows)) + _WIDTH.pack(batch.extra.shape[1])
        return head + batch.rows.tobytes() + np.ascontiguousarray(batch.extra).tobytes() + batch.strings
    return _HEAD.pack(_MAGIC, kind, SCHEME, len(batch.rows)) + batch.rows.tobytes() + batch.strings


def decode(values: Sequence[bytes], kind: int | None = None) -> Batch:
    """Decode message values into one batch (raises ValueError on a malformed value, and
    :class:`~streamdedup.errors.SchemeError`, a ValueError, on a batch of another scheme).

    ``kind``: the kind every value must have (None: any, taken from the first).
    """
    rows, strings, extras, ns = [], [], [], []  # (ns: each batch's row count)
    width: int | None = None
    for value in values:
        if value[:4] == _MAGIC_V1:
            _refuse(1, _HEAD_V1.unpack_from(value)[1] if len(value) >= _HEAD_V1.size else None)
        if len(value) < _HEAD.size:
            raise ValueError(f"a batch of {len(value)} bytes is shorter than its header")
        magic, k, scheme, n = _HEAD.unpack_from(value)
        if magic not in (_MAGIC, _MAGIC_EXTRA):
            raise ValueError(f"not a streamdedup batch (magic {magic!r})")
        if scheme != SCHEME:
            _refuse(scheme, k)
        if kind is not None and k != kind:
            raise ValueError(f"expected a batch of kind {kind}, got kind {k}")
        kind, at, w = k, _HEAD.size, 0
        if magic == _MAGIC_EXTRA:
            if len(value) < at + _WIDTH.size:
                raise ValueError("a batch with extra bytes is shorter than its header")
            (w,), at = _WIDTH.unpack_from(value, at), at + _WIDTH.size
        if width is not None and w != width:
            raise ValueError(f"batches of {width} and {w} extra bytes a row cannot be joined")
        width = w
        if len(value) < at + n * (ROW.itemsize + w):
            raise ValueError(f"a batch of {n} rows is cut short ({len(value)} bytes)")
        r = np.frombuffer(value, dtype=np.uint8, count=n * ROW.itemsize, offset=at)  # (ROW once joined)
        at += n * ROW.itemsize
        if w:
            extras.append(np.frombuffer(value, dtype=np.uint8, count=n * w, offset=at).reshape(n, w))
            at += n * w
        body = memoryview(value)[at:]  # (joined below: no copy of its own)
        if not n and len(body):
            raise ValueError("a batch's string lengths do not add up")
        rows.append(r)
        ns.append(n)
        strings.append(body)
    if not rows:
        return Batch(np.zeros(0, dtype=ROW), b"", kind or 0)
    # joined as bytes: a concatenation of structured arrays promotes their dtype pair by pair, in
    # Python (most of a replay's decode)
    counts = np.array(ns, dtype=np.int64)
    joined = np.empty(int(counts.sum()), dtype=ROW)
    np.concatenate(rows, out=joined.view(np.uint8))
    # each batch's strings against its rows' lengths, all batches at once (not a sum a batch)
    held = counts > 0
    if held.any():
        per_row = joined["id_len"].astype(np.int64) + joined["url_len"]
        sums = np.add.reduceat(per_row, (np.cumsum(counts) - counts)[held])
        sizes = np.fromiter((len(b) for b in strings), dtype=np.int64, count=len(strings))[held]
        if (sums != sizes).any():
            raise ValueError("a batch's string lengths do not add up")
    extra = np.concatenate(extras) if width else None
    return Batch(joined, b"".join(strings), kind or 0, extra)


def row_counts(values: Sequence[bytes]) -> np.ndarray:
    """The number of rows in each encoded batch (its header only: for the batches :func:`decode`
    checked, whose rows it concatenates in this order)."""
    return np.array([_HEAD.unpack_from(v)[3] for v in values], dtype=np.int64)


def kind_of(value: bytes) -> int | None:
    """The kind of an encoded batch, of any scheme (None if it is not one)."""
    if len(value) < 5 or value[:4] not in (_MAGIC, _MAGIC_EXTRA, _MAGIC_V1):
        return None
    return value[4]


_KIND_NAMES = {PROBES: "probe", ANSWERS: "answer", CHANGELOG: "shard changelog", CHECKS: "check"}


def _refuse(scheme: int, kind: int | None) -> None:
    what = _KIND_NAMES.get(kind or 0, "streamdedup")
    raise SchemeError(
        f"a {what} batch holds fingerprints of scheme {scheme}, but this streamdedup computes "
        f"fingerprint scheme {SCHEME}; fingerprints of two schemes cannot share an index: {SCHEME_ADVICE}",
        scheme,
        SCHEME,
    )


def _kernel_module() -> ModuleType | None:
    """The numba kernel of :meth:`Batch.by_group`, or None for its numpy path (no numba, or the
    numpy path forced: ``STREAMDEDUP_KERNELS=numpy``, :func:`~streamdedup.fingerprinting.kernels.numpy_only`)."""
    if kernels.compiled() is None:
        return None
    try:
        return importlib.import_module("streamdedup.pipeline.wire_kernels")
    except ImportError:
        return None


def warm_up() -> bool:
    """Compile (or load from numba's cache) the kernel of :meth:`Batch.by_group` now, not in a
    replay's first batch; False when the numpy path is in use."""
    module = _kernel_module()
    if module is None:
        return False
    module.warm_up()
    return True


def _split(blob: bytes | memoryview, lens: np.ndarray) -> list[str]:
    out, start = [], 0
    for end in np.cumsum(lens).tolist():
        out.append(str(blob[start:end], "utf-8", "surrogatepass"))
        start = end
    return out
