"""The whole worker's memory, for ``streamdedup_worker_memory_bytes`` and its limit.

``process_resident_memory_bytes`` covers the main process only; the fingerprinting processes
(``stream/pool.py``) and multiprocessing's resource tracker hold a good share of the worker's
memory too, and the container's limit counts them all.  Linux is read from /proc and /sys
(no dependency); elsewhere the standard library's ``getrusage`` is the fallback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["memory_limit_bytes", "worker_memory_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a huge number (9223372036854771712)


def _children(proc: Path) -> dict[int, list[int]]:
    """parent pid -> child pids, from every /proc/<pid>/stat (no CONFIG_PROC_CHILDREN needed)."""
    out: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # after "(comm) state"; comm may hold spaces
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def worker_memory_bytes(pid: int | None = None, proc: Path = Path("/proc")) -> int:
    """Resident memory of process ``pid`` (default: this one) and all its descendants, in bytes.

    Linux: /proc/<pid>/statm of each.  Elsewhere: the peak resident size of this process plus
    that of its waited-for children (``getrusage``), the best the standard library offers.
    """
    pid = os.getpid() if pid is None else pid
    if not (proc / str(pid) / "statm").exists():
        import resource

        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return scale * (own + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    children, total, todo = _children(proc), 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += int((proc / str(p) / "statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
        todo.extend(children.get(p, ()))
    return total


def memory_limit_bytes(configured: int = 0, cgroup_root: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """The memory the worker may use, and where the figure comes from: ``configured`` if above 0
    (``--memory-limit``), else the container's cgroup limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), else the machine's memory."""
    if configured > 0:
        return configured, "setting"
    for path in _cgroup_limit_files(cgroup_root):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < _UNLIMITED:
            return int(text), "cgroup"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024, "machine"
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "machine"


def _cgroup_limit_files(root: Path) -> list[Path]:
    """This process's own cgroup first (from /proc/self/cgroup), then the namespace's root."""
    own: list[Path] = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if controllers == "":
                own.append(root / rel / "memory.max")
            elif "memory" in controllers.split(","):
                own.append(root / "memory" / rel / "memory.limit_in_bytes")
    except (OSError, ValueError):
        pass
    return [*own, root / "memory.max", root / "memory" / "memory.limit_in_bytes"]
