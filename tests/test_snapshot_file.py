"""Shard snapshots on disk: arrays back exactly as written, and any damage refused with ValueError."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from streamdedup.index.tables import TableDesign
from streamdedup.pipeline.shard import Shard, ShardPlan
from streamdedup.pipeline.snapshot_file import MAGIC, read_arrays, write_arrays

ARRAYS = {
    "u64": np.arange(1000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15),
    "scalar": np.array(3),
    "empty": np.zeros(0, dtype=np.int64),
    "bools": np.array([True, False, True]),
    "matrix": np.arange(12, dtype=np.int32).reshape(3, 4),
    "strided": np.arange(20, dtype=np.int64)[::2],
}


def test_arrays_and_meta_come_back_exactly(tmp_path):
    write_arrays(tmp_path / "s", ARRAYS, {"offset": 7, "scheme": 2})
    arrays, meta = read_arrays(tmp_path / "s")
    assert meta == {"offset": 7, "scheme": 2} and list(arrays) == list(ARRAYS)
    for name, a in ARRAYS.items():
        assert arrays[name].dtype == a.dtype and arrays[name].shape == a.shape
        assert np.array_equal(arrays[name], a)
        assert arrays[name].flags.writeable
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no temporary file left behind


def damage(path, how: str) -> None:
    raw = bytearray(path.read_bytes())
    if how == "cut":
        raw = raw[:-100]
    elif how == "flip":  # one bit in the middle of the largest array
        (size,) = struct.unpack("<Q", raw[len(MAGIC) : len(MAGIC) + 8])
        header = json.loads(raw[len(MAGIC) + 8 : len(MAGIC) + 8 + size])
        start = -(-(len(MAGIC) + 8 + size) // 64) * 64
        big = max(header["arrays"], key=lambda e: e["nbytes"])
        raw[start + big["offset"] + big["nbytes"] // 2] ^= 0x01
    elif how == "magic":
        raw[:4] = b"XXXX"
    elif how == "header":
        (size,) = struct.unpack("<Q", raw[len(MAGIC) : len(MAGIC) + 8])
        raw[len(MAGIC) + 8 : len(MAGIC) + 8 + size] = b"{" * size
    elif how == "object":  # a header that asks for Python objects must never be read into memory
        (size,) = struct.unpack("<Q", raw[len(MAGIC) : len(MAGIC) + 8])
        header = json.loads(raw[len(MAGIC) + 8 : len(MAGIC) + 8 + size])
        header["arrays"][0]["dtype"] = "|O"
        new = json.dumps(header).encode().ljust(size)[:size]
        raw[len(MAGIC) + 8 : len(MAGIC) + 8 + size] = new
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "how, why",
    [
        ("cut", "cut short"),
        ("flip", "checksum"),
        ("magic", "not a streamdedup snapshot"),
        ("header", "header is damaged"),
        ("object", "damaged"),
    ],
)
def test_damage_is_refused(tmp_path, how, why):
    write_arrays(tmp_path / "s", ARRAYS, {})
    damage(tmp_path / "s", how)
    with pytest.raises(ValueError, match=why):
        read_arrays(tmp_path / "s")


def test_a_damaged_shard_snapshot_is_refused_by_shard_load(tmp_path):
    plan = ShardPlan(TableDesign.named("16"), 1)
    shard = Shard(plan)
    fps = np.arange(1, 200, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    n = len(fps)
    shard.probe_and_insert(np.zeros(n, np.int64), fps, np.zeros(n, np.int64), fps, ["a"] * n, ["u"] * n)
    shard.save(tmp_path / "s.npz", {"offset": 1})
    damage(tmp_path / "s.npz", "flip")
    with pytest.raises(ValueError, match="checksum"):
        Shard.load(tmp_path / "s.npz", plan)


def test_a_snapshot_in_the_earlier_npz_format_still_loads(tmp_path):
    """Snapshots written before this format (np.savez) load as they did."""
    plan = ShardPlan(TableDesign.named("16"), 1)
    shard = Shard(plan)
    fps = np.arange(1, 300, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    n, ids = len(fps), [f"id{i}" for i in range(len(fps))]
    shard.probe_and_insert(np.zeros(n, np.int64), fps, np.zeros(n, np.int64), fps, ids, ids)
    arrays = {"meta": np.array(json.dumps({"offset": 4})), "plan": np.array([1, *plan.design.levels])}
    for g, store in shard._groups.items():
        arrays |= {f"g{g}.{k}": v for k, v in store.state().items()}
    with open(tmp_path / "old.npz", "wb") as f:
        np.savez(f, **arrays)
    loaded, meta = Shard.load(tmp_path / "old.npz", plan)
    probe = fps[:50] ^ np.uint64(1)
    args = (np.zeros(50, np.int64), probe, np.zeros(50, np.int64), probe + np.uint64(1), ["q"] * 50, ["q"] * 50)
    assert (
        meta == {"offset": 4}
        and loaded.probe_and_insert(*args, store=False).ids == shard.probe_and_insert(*args, store=False).ids
    )


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path, monkeypatch):
    """(A full disk: the half-written file kept the space it had, beside the old snapshot.)"""
    from streamdedup.pipeline import snapshot_file

    write_arrays(tmp_path / "s.shard", {"a": np.arange(10)}, {"offset": 1})
    real, calls = snapshot_file._raw, []

    def full(a):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(a)

    monkeypatch.setattr(snapshot_file, "_raw", full)
    with pytest.raises(OSError, match="No space"):
        write_arrays(tmp_path / "s.shard", {"a": np.arange(20)}, {"offset": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.shard"]
    assert read_arrays(tmp_path / "s.shard")[1]["offset"] == 1  # the old snapshot, whole


def test_temporary_files_of_processes_that_are_gone_are_removed_at_the_next_write(tmp_path):
    """(A worker SIGKILLed mid-write left one; each can be as large as a snapshot.)"""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = int(gone.stdout), os.getppid()
    for pid in (dead, alive):
        (tmp_path / f"s.shard.tmp-{pid}").write_bytes(b"half a snapshot")
    write_arrays(tmp_path / "s.shard", {"a": np.arange(3)}, {"offset": 0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.shard", f"s.shard.tmp-{alive}"]
