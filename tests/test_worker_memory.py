"""The worker's memory gauge counts its child processes, and its limit comes from the setting,
else the container's cgroup, else the machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from streamdedup.settings import Settings
from streamdedup.stream.memory import memory_limit_bytes, worker_memory_bytes
from streamdedup.stream.metrics import Metrics

CHILD_BYTES = 64 * 1024 * 1024


def _rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_worker_memory_counts_child_processes():
    before = worker_memory_bytes()
    code = f"import sys, time; b = bytearray({CHILD_BYTES}); b[::4096] = b'x' * len(b[::4096]); print(1, flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"1\n"  # its memory is touched
        deadline = time.monotonic() + 10
        while _rss(child.pid) < CHILD_BYTES and time.monotonic() < deadline:
            time.sleep(0.05)
        with_child = worker_memory_bytes()
        assert with_child - before >= CHILD_BYTES * 0.9, (before, with_child)
        assert with_child >= _rss(os.getpid()) + _rss(child.pid) * 0.9
    finally:
        child.kill()
        child.wait(10)
    assert worker_memory_bytes() < with_child - CHILD_BYTES * 0.5  # gone with the child


def test_memory_limit_from_setting_then_cgroup_then_machine(tmp_path):
    assert memory_limit_bytes(123_000_000, tmp_path) == (123_000_000, "setting")
    (tmp_path / "memory.max").write_text("max\n")  # cgroup v2 without a limit
    limit, source = memory_limit_bytes(0, tmp_path)
    assert source == "machine" and limit > 100_000_000
    (tmp_path / "memory.max").write_text("2147483648\n")
    assert memory_limit_bytes(0, tmp_path) == (2147483648, "cgroup")
    (tmp_path / "memory.max").unlink()
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1, no limit
    assert memory_limit_bytes(0, tmp_path)[1] == "machine"
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("4831838208\n")
    assert memory_limit_bytes(0, tmp_path) == (4831838208, "cgroup")


def test_the_gauges_as_scraped():
    registry = CollectorRegistry()
    m = Metrics.create(registry)
    m.configure(Settings.from_sources({"memory_limit": "1000000000"}, {}), 16, 4)
    text = generate_latest(registry).decode()
    (line,) = [x for x in text.splitlines() if x.startswith("streamdedup_worker_memory_bytes ")]
    assert float(line.split()[1]) > 10_000_000  # this process, read at the scrape
    assert "streamdedup_worker_memory_limit_bytes 1e+09" in text
    assert "streamdedup_table_groups 4.0" in text
    assert 'tables="16"' in text and "design=" not in text
