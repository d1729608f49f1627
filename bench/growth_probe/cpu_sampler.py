"""Every second, the processes that used the most CPU in that second: one line each,
``HH:MM:SS  NN% PID COMMAND | ...`` (percent of one core), to tell which process ran during a
stall of bench/growth_latency.py on a shared machine.  Run beside it under the same bench lock:

    python bench/growth_probe/cpu_sampler.py > cpu.txt & vmstat -t 1 > vmstat.txt &

It reads /proc/<pid>/stat (Linux); it costs ~1 % of a core.  (This directory is put on the
workers' PYTHONPATH for its sitecustomize; nothing imports this module.)
"""

from __future__ import annotations

import os
import time

HZ = os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> dict[int, int]:
    """utime + stime of every process, by pid."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()  # (the command may hold spaces)
            out[int(pid)] = int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):  # (gone meanwhile)
            pass
    return out


def command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:110]
    except OSError:
        return "?"


def main(top: int = 6, least: float = 5.0) -> None:
    before, t0 = cpu_ticks(), time.monotonic()
    while True:
        time.sleep(1.0)
        now, t1 = cpu_ticks(), time.monotonic()
        used = sorted(((ticks - before.get(pid, ticks)) / HZ / (t1 - t0) * 100, pid) for pid, ticks in now.items())
        busy = [(round(pct), pid) for pct, pid in reversed(used[-top:]) if pct >= least]
        print(time.strftime("%H:%M:%S"), " | ".join(f"{pct}% {pid} {command(pid)}" for pct, pid in busy), flush=True)
        before, t0 = now, t1


if __name__ == "__main__":
    main()
