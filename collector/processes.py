"""Whether a rank's process still runs on this host: `/proc/<pid>`, its state and its start time.

The collector reports a rank as gone (`flightdeck.wire.GoneRank`) when the pid its snapshots name
no longer runs. Three ways a pid can look alive and not be the rank: it exited and its parent has
not reaped it yet (state Z, a zombie: gone); it exited and the kernel gave the pid to a new process
(pid reuse: the new one started after the rank's first snapshot, which its own process cannot
have); or it runs in another pid namespace (a container): the collector must then share the
jobs' pid namespace (`pid: host`), or the ranks' pids mean nothing here.

The lookup is a small object so that the daemon can be given another one (a test's, one for a
different /proc root); `ProcTable` reads the real /proc.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

#: A process that started up to this long after the rank's first snapshot is still taken for the
#: rank's own: the start time is in clock ticks (10 ms) and the wall clock may have been stepped
#: since boot. A reused pid started after the rank died, normally far later.
START_SLACK_NS = 1_000_000_000


class ProcessLookup(Protocol):
    """Answers whether the process a rank's snapshots name still runs."""

    def running(self, pid: int, *, started_by_ns: int) -> bool:
        """True when `pid` runs (not a zombie) and started by `started_by_ns` (epoch ns)."""
        ...


class ProcTable:
    """The real process table of this host, from `/proc` (Linux)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")

    def running(self, pid: int, *, started_by_ns: int) -> bool:
        """True when `pid` runs (not a zombie) and started by `started_by_ns` (epoch ns)."""
        try:
            raw = (self._proc / str(pid) / "stat").read_bytes()
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return False
        except OSError:
            return True  # cannot tell (permissions): never report a rank gone on a guess
        # `pid (comm) state ... starttime(22)`: comm may hold spaces and parentheses.
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) < 20 or fields[0] == b"Z" or fields[0] == b"X":
            return False
        started_ns = self._boot_ns() + int(fields[19]) * self._tick_ns
        return started_ns <= started_by_ns + START_SLACK_NS

    def _boot_ns(self) -> int:
        """When the host booted, on the wall clock: the same origin as the kernel's start times
        (CLOCK_BOOTTIME), to a few microseconds, unlike /proc/stat's whole-second `btime`."""
        try:
            return time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        except (AttributeError, OSError):  # pragma: no cover - CLOCK_BOOTTIME is Linux's
            for line in (self._proc / "stat").read_text().splitlines():
                if line.startswith("btime "):
                    return int(line.split()[1]) * 1_000_000_000
            raise
