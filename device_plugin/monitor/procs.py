"""Is the process behind a region slot still alive? One `/proc` snapshot per scan.

Why this is needed: a process killed with SIGKILL leaves its slot behind until another process of the
container sweeps it (libvgpu does that on its next allocation or query, HAMi-core at its next slot
registration). A monitor that simply summed the slots would keep showing a dead process's memory.

Why it is not a plain ``kill(pid, 0)``: slots carry the pid *inside the container's PID namespace*,
while the monitor reads the host's ``/proc`` (it runs with ``hostPID``). A process is alive when some
host process that is not a zombie has that pid as the innermost entry of its ``NSpid`` line and, for
libvgpu slots, the same ``starttime`` (``/proc/<pid>/stat`` field 22, clock ticks since boot: the
same in every namespace) - which also guards against pid reuse. When monitor and container share one
namespace (tests, a monitor without ``hostPID``) the direct ``/proc/<pid>`` lookup answers first.

HAMi-core slots carry no start time: with a ``hostpid`` filled in, that host pid is checked; without
one, the container pid is checked against every namespace's pids, which can only err on the side of
"alive" (a pid of the same number in another container).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEAD_STATES = frozenset("ZXx")  # zombie, dead: the process no longer runs and holds no GPU memory


@dataclass(frozen=True)
class ProcStat:
    """`state` letter and `starttime` (clock ticks since boot) of one process."""

    state: str
    starttime: int


def read_stat(proc: str, pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat`` -> `ProcStat`, or None when the process does not exist (or is unreadable)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    close = raw.rfind(b")")
    fields = raw[close + 2 :].split()
    if close < 0 or len(fields) < 20:
        return None
    try:
        return ProcStat(state=fields[0].decode(), starttime=int(fields[19]))
    except ValueError:
        return None


def _innermost_nspid(proc: str, pid: int) -> int | None:
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    parts = line.split()
                    return int(parts[-1]) if len(parts) > 1 else None
    except (OSError, ValueError):
        return None
    return None


class ProcTable:
    """Liveness answers for one scan (see module docstring). Create a new one per scan.

    Implements `device_plugin.monitor.regions.Liveness`. The namespace index (every process's innermost
    pid and start time) is built at most once, on the first slot the direct lookup cannot confirm.
    """

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._stats: dict[int, ProcStat | None] = {}
        self._ns: dict[int, set[int]] | None = None  # innermost pid -> start times of live processes

    def _stat(self, pid: int) -> ProcStat | None:
        if pid not in self._stats:
            self._stats[pid] = read_stat(self.proc, pid)
        return self._stats[pid]

    def _running(self, pid: int) -> ProcStat | None:
        st = self._stat(pid)
        return st if st is not None and st.state not in DEAD_STATES else None

    def _namespaced(self) -> dict[int, set[int]]:
        if self._ns is None:
            index: dict[int, set[int]] = {}
            try:
                names = os.listdir(self.proc)
            except OSError:
                names = []
            for name in names:
                if not (name.isascii() and name.isdigit()):
                    continue
                host = int(name)
                st = self._running(host)
                if st is None:
                    continue
                inner = _innermost_nspid(self.proc, host)
                if inner is not None and inner != host:
                    index.setdefault(inner, set()).add(st.starttime)
            self._ns = index
        return self._ns

    def libvgpu_alive(self, pid: int, start_time: int) -> bool:
        st = self._running(pid)
        if st is not None and (start_time == 0 or st.starttime == start_time):
            return True
        starts = self._namespaced().get(pid)
        return bool(starts) and (start_time == 0 or start_time in starts)

    def hami_alive(self, pid: int, hostpid: int) -> bool:
        if hostpid > 0:
            return self._running(hostpid) is not None
        return self._running(pid) is not None or pid in self._namespaced()
