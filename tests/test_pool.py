"""The worker's fingerprinting processes end with it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from streamdedup.settings import Settings
from streamdedup.stream.app import Worker


def test_close_returns_once_the_pool_has_ended_so_the_exit_hook_finds_its_pipe_closed(tmp_path):
    """concurrent.futures' exit hook wakes every pool's manager thread through a pipe that the
    thread closes as it ends.  A close that did not wait for it left the two racing at the
    worker's exit: "OSError: [Errno 9] Bad file descriptor" in the log of a clean stop."""
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=1), registry=CollectorRegistry())
    pool = w._pool
    assert pool is not None
    processes, manager = list(pool._processes.values()), pool._executor_manager_thread
    assert manager is not None and processes
    w.close()
    assert not manager.is_alive()
    assert all(not p.is_alive() for p in processes)
