"""Is this rank making progress? Its collectives (from its own dumps) and its main thread (CPU time,
stack), sampled by the agent; the evidence the server tells a busy rank from a stuck one by."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightdeck.records import PROGRESS_MAX_FRAMES, Frame, Progress

#: Seconds a collective may stay pending (or, with none pending, the main thread idle) before the
#: stall snapshot (every thread's stack, the entries' frames) is written. Short, so that the first
#: hang finding (the server's `stall_after_s`, 5 s by default) already has it; long enough that
#: the waits of a healthy job (milliseconds to a second) do not write one. Fixed: the threshold
#: that matters is the server's, and one knob cannot drift from another.
STACKS_AFTER_S = 2.0
#: Seconds between samples of the main thread's CPU time and stack: the resolution of "when did
#: it last make progress", which a hang finding waits on beyond the server's `stall_after_s`.
PROGRESS_SAMPLE_S = 0.5
#: A sampling window in which the main thread used at least this share of one core is progress;
#: below it (a thread polling a queue with a timeout wakes for microseconds) it is not.
CPU_ACTIVE_SHARE = 0.05
#: Innermost frames hashed into the stack fingerprint: deep enough to see a loop move, shallow
#: enough that the fingerprint is cheap.
FINGERPRINT_FRAMES = 8


@dataclass(slots=True)
class _Progress:
    """What the agent knows about this rank's progress, from its own dumps."""

    #: Highest record_id of a finished entry; record ids only grow, even after the ring wraps.
    marker: int = -1
    last_progress_ns: int | None = None
    stalled: bool = False


def progress_of(dump: Mapping[str, Any]) -> tuple[int, int | None]:
    """(highest finished record_id or -1, creation time of the oldest pending entry or None).

    An entry is finished when its state is `completed` or `retired` is True (on gloo, where state
    stays `scheduled`, `retired` is the only signal).
    """
    marker = -1
    oldest_pending: int | None = None
    for e in dump.get("entries") or ():
        if e.get("state") == "completed" or e.get("retired"):
            marker = max(marker, int(e.get("record_id", -1)))
        else:
            created = int(e.get("time_created_ns") or 0)
            oldest_pending = created if oldest_pending is None else min(oldest_pending, created)
    return marker, oldest_pending


# --- is the main thread working? ----------------------------------------------------------------


def thread_cpu(native_id: int, proc: Path = Path("/proc/self/task")) -> tuple[int | None, str]:
    """(CPU time in ns (user + system), scheduler state) of one thread of this process, from
    `/proc/self/task/<tid>/stat`; (None, "") where that cannot be read (not Linux)."""
    try:
        raw = (proc / str(native_id) / "stat").read_text()
    except OSError:
        return None, ""
    # Fields after the command name (which may hold spaces and parentheses) start after its last ")":
    # state is field 3 of stat(5), utime and stime fields 14 and 15.
    fields = raw.rsplit(")", 1)[-1].split()
    try:
        ticks = int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None, fields[0] if fields else ""
    return ticks * 1_000_000_000 // _CLK_TCK, fields[0]


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (AttributeError, ValueError, OSError):
        return 100


_CLK_TCK = _clock_ticks()


def main_thread_frames(thread: threading.Thread, limit: int = PROGRESS_MAX_FRAMES) -> tuple[Frame, ...]:
    """The thread's innermost `limit` Python frames, innermost first; when none of them is user
    code, the innermost user frame is appended (so it is always among them)."""
    from flightdeck.analysis.frames import is_user_frame

    frame = sys._current_frames().get(thread.ident or 0)
    out: list[Frame] = []
    user_seen = False
    depth = 0
    while frame is not None and depth < 512:
        code = frame.f_code
        f = Frame(code.co_name, code.co_filename, frame.f_lineno or 0)
        if len(out) < limit:
            out.append(f)
            user_seen = user_seen or is_user_frame(f)
        elif user_seen:
            break
        elif is_user_frame(f):
            out.append(f)
            break
        frame = frame.f_back
        depth += 1
    return tuple(out)


def stack_fingerprint(frames: Sequence[Frame]) -> str:
    """A short stable fingerprint of the innermost FINGERPRINT_FRAMES frames (name, file, line)."""
    h = hashlib.blake2b(digest_size=8)
    for f in frames[:FINGERPRINT_FRAMES]:
        h.update(f"{f.name}\0{f.filename}\0{f.line}\n".encode())
    return h.hexdigest()


class ProgressSampler:
    """Samples the main thread's CPU time and stack, and remembers when it last made progress.

    Progress between two samples: the thread used at least CPU_ACTIVE_SHARE of a core, its stack
    fingerprint changed, or it is in disk I/O (state D: a checkpoint write waiting on the disk).
    """

    def __init__(
        self,
        clock_ns: Callable[[], int],
        thread: threading.Thread | None = None,
        cpu: Callable[[int], tuple[int | None, str]] = thread_cpu,
    ) -> None:
        self._clock_ns = clock_ns
        self._thread = thread or threading.main_thread()
        self._cpu = cpu
        self._last: tuple[int, int | None, str] | None = None
        self.since_ns: int | None = None
        self.active_ns: int | None = None
        self.latest: Progress | None = None

    def sample(self) -> Progress:
        """Take one sample now and return the evidence so far."""
        now = self._clock_ns()
        cpu, state = self._cpu(self._thread.native_id or 0)
        frames = main_thread_frames(self._thread)
        fp = stack_fingerprint(frames)
        share: float | None = None
        if self._last is None:
            self.since_ns = now
        else:
            t0, cpu0, fp0 = self._last
            if cpu is not None and cpu0 is not None and now > t0:
                share = min(1.0, max(0.0, (cpu - cpu0) / (now - t0)))
            if (share is not None and share >= CPU_ACTIVE_SHARE) or fp != fp0 or state == "D":
                self.active_ns = now
        self._last = (now, cpu, fp)
        self.latest = Progress(
            sampled_ns=now,
            active_ns=self.active_ns,
            since_ns=self.since_ns,
            cpu_ns=cpu,
            cpu_share=None if share is None else round(share, 3),
            state=state,
            stack_fp=fp,
            frames=frames,
        )
        return self.latest

    def idle_s(self, now_ns: int) -> float:
        """Seconds since progress was last seen (since sampling began when never)."""
        last = self.active_ns if self.active_ns is not None else self.since_ns
        return 0.0 if last is None else max(0.0, (now_ns - last) / 1e9)
