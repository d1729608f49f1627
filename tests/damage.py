"""Damage a shard's row file the ways a restart can find it (for the snapshot-loading tests)."""

from __future__ import annotations

from pathlib import Path

HOW = ("missing", "short", "foreign")


def damage(f: Path, how: str) -> None:
    """``missing``: deleted; ``short``: 10 bytes cut off; ``foreign``: the same length, other
    bytes (as another shard's file)."""
    if how == "missing":
        f.unlink()
    elif how == "short":
        f.write_bytes(f.read_bytes()[:-10])
    else:
        f.write_bytes(bytes(reversed(f.read_bytes())))
