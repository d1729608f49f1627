"""BlockIndex logs its merges: the big ones (``LOG_MERGE_MIN`` entries and more) at INFO, so that
operators see when the index's biggest jobs ran and how long they took; the others at DEBUG."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from streamdedup.index.blocks import BlockIndex

LOGGER = "streamdedup.index.blocks"


def _fps(first: int, n: int) -> np.ndarray:
    return (np.arange(first, first + n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)


def _merges(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER and "index merge" in r.message]


@pytest.mark.parametrize("background", [False, True])
def test_a_big_merge_is_logged_at_info_with_its_entries_seconds_and_thread(caplog, background):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    idx = BlockIndex(0xFFFF_0000, background=background)
    idx.LOG_MERGE_MIN = 3000
    idx.BACKGROUND_MIN = 3000  # (with background: this merge runs in the merge thread)
    idx.add_many(range(2000), _fps(0, 2000))
    idx.add_many(range(2000, 3000), _fps(2000, 1000))
    idx.wait()
    merges = _merges(caplog)
    assert len(merges) == 1
    level, message = merges[0]
    assert level == logging.INFO
    assert message.startswith("index merge of 3000 entries (2000 + 1000) in ")
    assert f"mask {0xFFFF_0000:#x}, thread " in message
    assert message.endswith("thread block-merge" if background else "thread MainThread")
    assert len(idx) == 3000 and idx.search(_fps(2500, 1)).row.tolist() == [2500]


def test_a_small_merge_is_logged_at_debug_only(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    idx = BlockIndex(0xFFFF_0000, background=False)
    idx.add_many(range(100), _fps(0, 100))
    idx.add_many(range(100, 200), _fps(100, 100))
    assert _merges(caplog) == []  # merged (runs below SMALL_RUN), but not at INFO
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    idx.add_many(range(200, 300), _fps(200, 100))
    assert [level for level, _ in _merges(caplog)] == [logging.DEBUG]
    assert "index merge of 300 entries (200 + 100)" in _merges(caplog)[0][1]
