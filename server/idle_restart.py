"""Restarting `flightdeck server` in place once it holds no job, to give back what its jobs left.

CPython's allocator (pymalloc) returns a 1 MiB arena to the system only once every object in it
is freed. A job's summaries and the batches decoded for it are spread over tens of arenas, and the
few objects that outlive the job (statement caches, interned strings, a report kept for /metrics)
keep them: measured in the server's process (`python -m bench.server_heap --ranks 1024
--batch-entries 5000`, PostgreSQL), 54 arenas at rest, 80 with a 1,024-rank job open and still
79 once it ended and its state was freed (52.6 MiB of objects in 79 MiB of arenas; RSS 120 ->
152-154 MiB). No allocator setting gives it back without costing 10-29 % of the server's CPU
(docs/performance.md, "Server memory"). A fresh process does, and the server already restarts
safely: everything it knows is in the store, and an open job's summaries are rebuilt from it.
Measured with the shipped defaults (`python -m bench.server_memory --jobs 3`, three 1,024-rank
jobs, 2026-12-07): 167-173 MiB held once the jobs ended on PostgreSQL, 114-115 after the restart
against 115-116 at start (SQLite: 150, then 94 against 95); requests made across a restart
waited 1.8-2.3 s at most, none failed (`python -m bench.idle_restart`).

So, as uWSGI's `reload-on-rss` and gunicorn's `max_requests` do for their workers, once the
diagnosis worker holds no job at all (every job ended and its series left /metrics after
`ended_series_s`) and the process's RSS is more than `idle_restart_above_mib` above what it was
once started, the server stops the way SIGTERM stops it (requests in flight answered, the
workers stopped, the database closed) and executes itself again: the same process id (systemd,
Docker and `flightdeck up` see nothing), and the listening socket kept open across the exec, so
a connection made meanwhile waits in the kernel's accept queue and is answered by the new image
(~2 s later) instead of being refused. `IdleRestart` decides; `flightdeck.server.cmd` owns the
socket and the exec.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

MIB = 1024 * 1024

#: The hidden `flightdeck server` option that hands the listening socket to the new image.
LISTEN_FD_OPTION = "--listen-fd"


def rss_bytes() -> int | None:
    """This process's resident set size (Linux: /proc/self/statm), or None where not known."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class IdleRestart:
    """Decides when the server restarts itself: it holds no job and its RSS has grown by more than
    `above_mib` since `at_rest` was called (the end of start-up). One per server process; the
    diagnosis worker calls `idle` when the last job it held is gone, and `stop` (set by the
    command that runs uvicorn) starts the graceful shutdown that `flightdeck.server.cmd` follows
    with the exec."""

    def __init__(
        self,
        *,
        above_mib: float,
        rss: Callable[[], int | None] = rss_bytes,
        say: Callable[[str], None] = log.warning,
    ) -> None:
        self._above = above_mib * MIB
        self._rss = rss
        self._say = say
        self.rest_bytes: int | None = None
        #: Set once the restart is asked for (never cleared: the process is going away).
        self.requested = False
        #: Starts the server's graceful shutdown; set by whoever runs the server.
        self.stop: Callable[[], None] | None = None

    def at_rest(self) -> None:
        """Take the RSS to compare with: the server has started and holds no job yet."""
        self.rest_bytes = self._rss()

    def idle(self) -> None:
        """The diagnosis worker holds no job: restart if the RSS is more than `above_mib` over
        the RSS at rest. Called from the worker's thread only."""
        now = self._rss()
        if self.requested or self.stop is None or self.rest_bytes is None or now is None:
            return
        if now - self.rest_bytes <= self._above:
            return
        self.requested = True
        self._say(
            f"no job held and RSS {now / MIB:.0f} MiB, {(now - self.rest_bytes) / MIB:.0f} MiB above "
            f"its {self.rest_bytes / MIB:.0f} MiB at rest (idle_restart_above_mib "
            f"{self._above / MIB:g}): restarting in place to give the memory back"
        )
        self.stop()


def supported() -> bool:
    """Whether this platform can restart the server in place (exec with an inherited socket, RSS
    from /proc): Linux, with a known interpreter."""
    return sys.platform == "linux" and bool(sys.executable) and rss_bytes() is not None


def exec_again(argv: Sequence[str], listen_fd: int) -> None:
    """Replace this process with `python -m flightdeck ARGV --listen-fd=N`: `argv` is the command
    line it was started with (after the program name), `listen_fd` the listening socket, kept."""
    args = [a for a in argv if not a.startswith(f"{LISTEN_FD_OPTION}=")]
    os.set_inheritable(listen_fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    # The interpreter itself, not a shell: the arguments are this process's own command line.
    os.execv(sys.executable, [sys.executable, "-m", "flightdeck", *args, f"{LISTEN_FD_OPTION}={listen_fd}"])  # noqa: S606
