"""SIGTERM / SIGINT: the final snapshot, then what the handler installed before would have done.

See the package docstring (`flightdeck.agent`, "Signals") for the whole behaviour.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
import weakref
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flightdeck.agent.core import Agent

logger = logging.getLogger("flightdeck.agent")

#: Signals after which the agent writes its final snapshot, with the `exception` text it carries;
#: the server reads the leading "terminated by " / "interrupted by " as "the rank was ended".
FINAL_SIGNALS: dict[int, str] = {
    signal.SIGTERM: "terminated by SIGTERM",
    signal.SIGINT: "interrupted by SIGINT",
}
#: Seconds the final snapshot with the entries' frames may take after a signal before the process
#: goes on with what the signal means; the one without frames, written first, takes milliseconds.
#: The first symbolization of frames took 9-12 s on a loaded 2-core machine; launchers send
#: SIGKILL 30 s after SIGTERM (torchrun's --shutdown-timeout, SLURM's KillWait, Kubernetes' grace).
SIGNAL_FRAMES_BUDGET_S = 10.0
#: Seconds the signal watcher waits, after the snapshot, for the main thread to enter the Python
#: handler; past it the main thread is blocked in native code (a collective) and, where the
#: signal's default action was to end the process, the watcher ends it.
MAIN_THREAD_GRACE_S = 1.0
#: A second delivery of the same signal within this many seconds of a finished snapshot reuses it
#: (the watcher and the main thread both see every delivery).
_SIGNAL_DEDUPE_S = 1.0


@dataclass(eq=False)
class _SignalEpisode:
    """One delivery of a signal, seen by the watcher and the main thread's handler alike."""

    signum: int
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    main_entered: threading.Event = dataclasses.field(default_factory=threading.Event)
    done_at: float = 0.0


class _SignalHooks:
    """The agent's SIGTERM / SIGINT handlers, their wakeup-fd watcher, and what they replaced.

    Python runs signal handlers in the main thread between bytecodes only, so a rank blocked in a
    collective (gloo waits in C++ with the GIL released) would run the handler only when the
    collective times out, long after the launcher's SIGKILL. The C-level handler writes each
    signal's number to the wakeup fd at once, whatever the main thread does; the watcher thread
    reads it and writes the snapshot itself.
    """

    def __init__(self, agent: Agent) -> None:
        self._agent = weakref.ref(agent)
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._episode: _SignalEpisode | None = None
        self.previous: dict[int, Any] = {}
        self._prev_wakeup_fd = -1
        self._read_fd = -1
        self._write_fd = -1
        self._watcher: threading.Thread | None = None
        self.active = True

    @classmethod
    def install(cls, agent: Agent) -> _SignalHooks:
        """Install the handlers and the watcher (main thread only)."""
        hooks = cls(agent)
        for signum in FINAL_SIGNALS:
            prev = signal.getsignal(signum)
            if prev is None:
                continue  # installed outside Python: not ours to wrap, and it could not be restored
            hooks.previous[signum] = prev
            signal.signal(signum, hooks.on_signal)
        r, w = os.pipe()  # non-inheritable: a spawned program never writes into it
        os.set_blocking(w, False)  # set_wakeup_fd requires it; a full pipe drops a byte, no more
        try:
            hooks._prev_wakeup_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return hooks  # the handlers alone still cover a main thread running Python
        hooks._read_fd, hooks._write_fd = r, w
        hooks._watcher = threading.Thread(target=hooks._watch, name="flightdeck-signals", daemon=True)
        hooks._watcher.start()
        ref = weakref.WeakMethod(hooks._after_fork_in_child)

        def after_fork() -> None:
            fn = ref()
            if fn is not None:
                fn()

        os.register_at_fork(after_in_child=after_fork)
        return hooks

    def uninstall(self) -> bool:
        """Restore what was there before where it is still ours; False outside the main thread
        (nothing can be changed there; the handlers then only chain)."""
        self.active = False
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum, prev in self.previous.items():
            if signal.getsignal(signum) == self.on_signal:
                signal.signal(signum, prev)
        if self._write_fd >= 0:
            current = signal.set_wakeup_fd(self._prev_wakeup_fd)
            if current != self._write_fd:
                signal.set_wakeup_fd(current)  # someone replaced ours since: leave theirs
            with contextlib.suppress(OSError):
                os.write(self._write_fd, b"\0")  # the watcher's stop sentinel (no signal is 0)
            if self._watcher is not None:
                self._watcher.join(2.0)
            for fd in (self._read_fd, self._write_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._read_fd = self._write_fd = -1
        return True

    # -- the two ways a signal arrives --

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The Python-level handler (main thread): the snapshot, then the previous handler."""
        prev = self.previous.get(signum, signal.SIG_DFL)
        if self.active and os.getpid() == self._pid:
            self._final(signum, frame, main=True)
        if callable(prev):
            prev(signum, frame)
        elif prev != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data or 0 in data:
                return
            if self._prev_wakeup_fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._prev_wakeup_fd, data)  # the previous owner (asyncio) sees them too
            for signum in sorted(set(data)):
                if signum in self.previous and self.active:
                    try:
                        self._from_watcher(signum)
                    except Exception:
                        logger.warning("flightdeck agent: signal snapshot failed", exc_info=True)

    def _from_watcher(self, signum: int) -> None:
        if signal.getsignal(signum) != self.on_signal:
            return  # the job installed its own handler since: it owns the signal
        episode = self._final(signum, None, main=False)
        if self.previous[signum] not in (signal.SIG_DFL, None):
            return  # a Python handler (or SIG_IGN) can only run in the main thread: as without us
        if not episode.main_entered.wait(MAIN_THREAD_GRACE_S):
            logger.warning(
                "flightdeck agent: main thread blocked in native code; ending the process with %s",
                signal.Signals(signum).name,
            )
            _die_by_default_action(signum)

    def _final(self, signum: int, frame: FrameType | None, *, main: bool) -> _SignalEpisode:
        """The final snapshot of this delivery, written once whoever sees it first."""
        now = time.monotonic()
        with self._lock:
            ep = self._episode
            owner = (
                ep is None
                or ep.signum != signum
                or (ep.done.is_set() and now - ep.done_at > _SIGNAL_DEDUPE_S)
            )
            if owner:
                ep = self._episode = _SignalEpisode(signum)
            assert ep is not None
            if main:
                ep.main_entered.set()
        if not owner:
            ep.done.wait(SIGNAL_FRAMES_BUDGET_S + 1.0)
            return ep
        try:
            agent = self._agent()
            if agent is not None:
                going = self.previous.get(signum) != signal.SIG_IGN
                agent.final_on_signal(signum, frame, going=going)
        finally:
            ep.done_at = time.monotonic()
            ep.done.set()
        return ep

    def _after_fork_in_child(self) -> None:
        # A forked child (a data-loader worker) is no rank: it gets the previous handlers back and
        # must not write signal numbers into the parent's pipe.
        if not self.active:
            return
        self.active = False
        for signum, prev in self.previous.items():
            if signal.getsignal(signum) == self.on_signal:
                signal.signal(signum, prev)
        if self._write_fd >= 0:
            with contextlib.suppress(ValueError):  # forked from a thread other than the main one
                current = signal.set_wakeup_fd(self._prev_wakeup_fd)
                if current != self._write_fd:
                    signal.set_wakeup_fd(current)
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _die_by_default_action(signum: int) -> None:
    """End the process as the signal's default action would, from a thread other than the main
    one (where `signal.signal` is refused): reset the C-level disposition and send it again."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # None is NULL: SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(2.0)
    except Exception:
        logger.warning("flightdeck agent: could not restore the default action", exc_info=True)
    os._exit(128 + signum)
