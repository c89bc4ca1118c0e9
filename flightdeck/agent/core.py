"""The `Agent`: its snapshot thread, the snapshots it writes to the spool, its exit and exception hooks."""

from __future__ import annotations

import atexit
import json
import logging
import os
import pickle
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from flightdeck.agent.config_report import _group_configs, fr_settings, reported_env, static_versions
from flightdeck.agent.progress import (
    PROGRESS_SAMPLE_S,
    STACKS_AFTER_S,
    ProgressSampler,
    _Progress,
    progress_of,
)
from flightdeck.agent.settings import AgentConfig
from flightdeck.agent.signals import FINAL_SIGNALS, SIGNAL_FRAMES_BUDGET_S, _SignalHooks
from flightdeck.agent.stacks import _frame_chain, thread_stacks
from flightdeck.agent.torch_dump import DumpFn, _agree_job_id, _dist_groups, default_dump_fn
from flightdeck.records import progress_to_dict
from flightdeck.spool import (
    DEFAULT_SPOOL_DIR,
    SIDECAR_VERSION,
    Identity,
    Part,
    RingExtent,
    RingSplitter,
    Sidecar,
    SnapshotKind,
    attempt_dir,
    sanitize_job,
    sidecar_path,
    snapshot_name,
    temp_path,
)

logger = logging.getLogger("flightdeck.agent")


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = temp_path(path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Agent:
    """Takes flight-recorder snapshots of this rank from a daemon thread.

    `dump_fn`, `clock_ns` and `dist_info` are injectable for tests; by default they use torch.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        dump_fn: DumpFn | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.config = config
        self._dump_fn = dump_fn
        self._clock_ns = clock_ns
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Serializes dumps and writes: the agent thread, atexit and the exception hooks all write.
        # Re-entrant: a signal handler may run in the main thread while it writes (an exception's).
        self._io_lock = threading.RLock()
        # One identity lookup at a time: rank 0 must publish a single job id to the store.
        self._ident_lock = threading.Lock()
        self._logged: set[str] = set()
        self._progress = _Progress()
        #: The main thread's CPU time and stack, sampled every PROGRESS_SAMPLE_S.
        self.sampler = ProgressSampler(clock_ns)
        self._splitter = RingSplitter(config.full_every_s)
        self._groups: dict[str, dict[str, Any]] = {}
        self._ident: Identity | None = None
        self._dir: Path | None = None
        self._exception: str | None = None
        self._final_done = False
        self._stall_thread: threading.Thread | None = None
        self._prev_excepthook: Callable[..., Any] | None = None
        self._prev_threading_excepthook: Callable[..., Any] | None = None
        self.snapshots_written = 0
        self._versions: dict[str, Any] | None = None
        self._config_groups: dict[str, dict[str, Any]] = {}
        #: The latest configuration report; every sidecar carries it (a reader may only ever see
        #: the newest periodic file, so none may depend on an earlier one).
        self.config_report: dict[str, Any] | None = None
        #: How often the report changed (the first report counts): new groups, env changes.
        self.config_changes = 0
        self._signals: _SignalHooks | None = None
        #: The final text of a terminating signal received, kept by later exception snapshots.
        self._signal_text: str | None = None

    # -- lifecycle --

    def start(self) -> None:
        """Start the snapshot thread and install the exit and exception hooks (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="flightdeck-agent", daemon=True)
        self._thread.start()
        atexit.register(self._on_exit)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_threading_excepthook = threading.excepthook
        threading.excepthook = self._threading_excepthook
        if threading.current_thread() is threading.main_thread():
            # signal.signal and set_wakeup_fd work from the main thread only.
            self._signals = self._guarded("signal-hooks", lambda: _SignalHooks.install(self))

    def stop(self, *, final: bool = False, timeout_s: float = 10.0) -> None:
        """Stop the thread and remove the hooks; with `final`, write a final snapshot first."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        if final:
            self.snapshot("final")
        atexit.unregister(self._on_exit)
        if sys.excepthook == self._excepthook and self._prev_excepthook is not None:
            sys.excepthook = self._prev_excepthook
        if threading.excepthook == self._threading_excepthook and self._prev_threading_excepthook:
            threading.excepthook = self._prev_threading_excepthook
        if self._signals is not None and self._signals.uninstall():
            self._signals = None

    @property
    def directory(self) -> Path | None:
        """`<spool_dir>/<job>/<attempt>/` once known (after the first snapshot)."""
        return self._dir

    # -- the thread --

    def _run(self) -> None:
        # First snapshot at once, so even a job that dies in its first seconds leaves one.
        next_tick = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self.config.interval_s
                try:
                    self.tick()  # samples the main thread first
                except Exception:  # tick already guards; this keeps the thread alive whatever happens
                    self._log_once("tick", "flightdeck agent: snapshot failed")
            else:
                self._guarded("progress", self.sampler.sample)
            self._stop.wait(max(0.0, min(PROGRESS_SAMPLE_S, next_tick - time.monotonic())))

    def tick(self) -> None:
        """One periodic snapshot, then a stall snapshot if this rank looks stuck."""
        if not self._ensure_identity(store_timeout_s=300.0):
            return
        self._guarded("progress", self.sampler.sample)
        raw = self._guarded("dump", lambda: self._dump(False))
        if raw is None:
            return
        now = self._clock_ns()
        dump: dict[str, Any] | None = None
        try:
            dump = pickle.loads(raw)  # noqa: S301 - bytes produced by this very process
            marker, oldest_pending = progress_of(dump)
        except Exception:
            self._log_once("parse", "flightdeck agent: could not parse own dump; stall detection off")
            marker, oldest_pending = self._progress.marker, None
        p = self._progress
        if marker != p.marker or p.last_progress_ns is None:
            p.marker, p.last_progress_ns, p.stalled = marker, now, False
        part = Part("full", raw)
        if dump is not None:
            part = self._guarded("split", lambda: self._splitter.split(dump, raw, now)) or part
        if self._guarded("write-periodic", lambda: self._write("periodic", part.data, now, ring=part.ring)):
            self._splitter.written(part, now)
        if p.stalled:
            return
        # Blocked: measure from the later of the last progress and the oldest pending op's
        # creation, so a collective issued after a long compute-only phase is not a stall.
        # Quiet (nothing pending, nothing finished): this may be the rank the others wait for,
        # stuck in a data loader or a kernel; its stacks show where it is instead.
        since = p.last_progress_ns if oldest_pending is None else max(p.last_progress_ns, oldest_pending)
        # Quiet and busy (computing, writing a checkpoint) is not a stall: its evidence is in every
        # snapshot already. Quiet and idle (asleep, blocked on a queue or a lock) is.
        idle = oldest_pending is not None or self.sampler.idle_s(now) >= STACKS_AFTER_S
        if now - since >= STACKS_AFTER_S * 1e9 and idle:
            p.stalled = True  # once per episode; progress (a new finished op) starts a new one
            stacks = thread_stacks()  # first: the blocked thread's stack is what matters most
            logger.warning(
                "flightdeck agent: no collective %s for %.1f s; writing a stall snapshot",
                "finished" if oldest_pending is not None else "started or finished",
                (now - since) / 1e9,
            )
            self._write_stall(stacks, p.last_progress_ns)

    def _write_stall(self, stacks: list[dict[str, Any]], last_progress_ns: int | None) -> None:
        """Write the stall snapshot from a thread of its own: torch symbolizes the entries' frames
        the first time for seconds (9-12 s measured on a loaded 2-core machine; it releases the
        GIL), and the periodic snapshots must go on meanwhile, or the rank would look lost."""

        def write() -> None:
            # Timed when the dump starts (torch copies the ring then): the rest is symbolizing,
            # which can outlast the op, the job's final snapshot included, which must stay newer.
            when = self._clock_ns()
            self._guarded(
                "stall",
                lambda: self._write(
                    "stall", self._dump(True), when, stacks, last_progress_ns=last_progress_ns
                ),
            )

        if self._stall_thread is not None and self._stall_thread.is_alive():
            return  # the previous episode's is still being written
        self._stall_thread = threading.Thread(target=write, name="flightdeck-stall", daemon=True)
        self._stall_thread.start()

    # -- snapshots --

    def snapshot(
        self,
        kind: SnapshotKind,
        *,
        stacks: list[dict[str, Any]] | None = None,
        frames: bool | None = None,
    ) -> None:
        """Take and write one snapshot now; never raises (failures are logged once).

        `frames`: whether entries carry their call-site frames (default: all but periodic ones).
        """
        if not self._ensure_identity():
            return
        with_frames = kind != "periodic" if frames is None else frames
        if kind != "periodic" and stacks is None:
            stacks = thread_stacks()
        self._guarded(kind, lambda: self._write(kind, self._dump(with_frames), self._clock_ns(), stacks))

    def _dump(self, include_stack_traces: bool) -> bytes:
        # Periodic, stall and final snapshots share one dump function: one log line for all.
        try:
            if self._dump_fn is None:
                self._dump_fn = default_dump_fn()
            return self._dump_fn(include_stack_traces)
        except Exception:
            self._log_once("dump", "flightdeck agent: flight-recorder dump failed; the job goes on")
            raise _AlreadyLogged from None

    def _write(
        self,
        kind: SnapshotKind,
        raw: bytes,
        when_ns: int,
        stacks: list[dict[str, Any]] | None = None,
        *,
        ring: RingExtent | None = None,
        last_progress_ns: int | None = None,
    ) -> bool:
        """Write one snapshot (sidecar first); `ring`: it holds only the ring's recent changes."""
        assert self._ident is not None and self._dir is not None
        groups = self._guarded("groups", _dist_groups)
        if groups:
            # Keep groups seen before: after destroy_process_group `_world` is empty, but the
            # final snapshot still holds their entries.
            self._groups.update(groups)
        rank = self._ident["rank"]
        path = self._dir / snapshot_name(rank, kind, recent=ring is not None)
        meta: Sidecar = {
            "flightdeck_snapshot": SIDECAR_VERSION,
            "kind": kind,
            **self._ident,
            "snapshot_time_ns": when_ns,
            "interval_s": self.config.interval_s,
            "stacks_after_s": STACKS_AFTER_S,
            "groups": self._groups,
            "exception": self._exception if kind == "final" else None,
            "thread_stacks": stacks if kind != "periodic" else None,
            # A stall snapshot's is the one its episode was judged on: the write takes seconds
            # (torch symbolizes the frames), and the op may have failed or finished meanwhile.
            "last_progress_ns": self._progress.last_progress_ns
            if last_progress_ns is None
            else last_progress_ns,
            "config": self._guarded("config", self._config),
            "progress": None if self.sampler.latest is None else progress_to_dict(self.sampler.latest),
            "ring": ring,
        }
        with self._io_lock:
            self._dir.mkdir(parents=True, exist_ok=True)
            # Sidecar first: whoever sees the dump file can rely on its sidecar being there.
            _write_atomic(sidecar_path(path), json.dumps(meta, sort_keys=True).encode())
            _write_atomic(path, raw)
            self.snapshots_written += 1
            first = self.snapshots_written == 1
        if first:
            # Once, so that a job whose spool no collector watches can be told from its own log.
            logger.info(
                "flightdeck agent: rank %d writes its snapshots to %s (spool %s%s; a collector must "
                "watch that spool: its spool_dirs)",
                rank,
                self._dir,
                self.config.spool_dir,
                ""
                if self.config.spool_dir != Path(DEFAULT_SPOOL_DIR)
                else ", the default: set FLIGHTDECK_AGENT_SPOOL_DIR",
            )
        return True

    def _config(self) -> dict[str, Any]:
        """This rank's configuration report (versions once per process, the rest per snapshot:
        groups come and go, and a few env reads cost microseconds)."""
        env = os.environ
        if self._versions is None:
            self._versions = static_versions(env)
        report: dict[str, Any] = dict(self._versions)
        report.update(fr_settings(env))
        groups = self._guarded("config-groups", _group_configs)
        if groups:
            # Keep groups seen before: after destroy_process_group torch's registry is empty.
            self._config_groups.update(groups)
        report["groups"] = dict(self._config_groups)
        report["env"] = reported_env(env)
        report["checkpoint_dir"] = (
            env.get("FLIGHTDECK_AGENT_CHECKPOINT_DIR") or env.get("FLIGHTDECK_CHECKPOINT_DIR") or None
        )
        if report != self.config_report:
            self.config_changes += 1
            logger.info(
                "flightdeck agent: configuration report %s",
                "taken" if self.config_report is None else "changed",
            )
            self.config_report = report
        return report

    def _ensure_identity(self, store_timeout_s: float = 5.0) -> bool:
        """Learn rank, world size and job once torch.distributed is initialized.

        Only the agent thread waits long for rank 0's job id; exit and exception paths give up
        soon, so a job whose rank 0 died is not held at exit.
        """
        if self._ident is not None:
            return True
        if not self._ident_lock.acquire(timeout=store_timeout_s):
            return False
        try:
            return self._learn_identity(store_timeout_s)
        finally:
            self._ident_lock.release()

    def _learn_identity(self, store_timeout_s: float) -> bool:
        if self._ident is not None:
            return True
        try:
            import torch
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_initialized():
                return False
            rank, world = dist.get_rank(), dist.get_world_size()
            job = self.config.job or os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")
            if not job:
                job = _agree_job_id(rank, store_timeout_s)
            local = os.environ.get("LOCAL_RANK")
            ident: Identity = {
                "job": sanitize_job(job),
                "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0),
                "rank": rank,
                "world_size": world,
                "local_rank": int(local) if local and local.isdigit() else None,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "torch_version": str(torch.__version__),
                "backend": str(dist.get_backend()),
            }
        except Exception:
            self._log_once("identity", "flightdeck agent: could not learn rank/job; no snapshots")
            return False
        self._dir = attempt_dir(self.config.spool_dir, ident["job"], ident["attempt"])
        self._ident = ident
        return True

    # -- exit and exception hooks --

    def _on_exit(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if not self._final_done:
            self._final_done = True
            # First without the entries' frames, like the exception hook (the first symbolization
            # takes seconds, while the other ranks' final snapshots already say they exited).
            self.snapshot("final", frames=False)
            self.snapshot("final")

    def _excepthook(self, etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        try:
            self._exception = _describe(etype, value)
            if self._signal_text is not None:
                # The exception follows the signal (SIGINT's KeyboardInterrupt, a job handler's
                # error): the signal is what ended the rank, and its words must lead.
                self._exception = (
                    self._signal_text
                    if issubclass(etype, KeyboardInterrupt)
                    else f"{self._signal_text}; then {self._exception}"
                )
            self._stop.set()
            stacks = thread_stacks({threading.main_thread().ident or 0: tb} if tb is not None else None)
            self._final_done = True  # the process is going down; atexit must not overwrite this one
            # First without the entries' frames: torch symbolizes them for seconds the first time
            # (3 s or more), which a crash diagnosis waits on and a launcher tearing the job down
            # may not grant. Then again with them; the file is replaced whole.
            self.snapshot("final", stacks=stacks, frames=False)
            self.snapshot("final", stacks=stacks)
        finally:
            (self._prev_excepthook or sys.__excepthook__)(etype, value, tb)

    def _threading_excepthook(self, args: threading.ExceptHookArgs) -> None:
        try:
            if args.thread is not self._thread:
                self._exception = _describe(args.exc_type, args.exc_value)
                tid = args.thread.ident if args.thread is not None else None
                tb = args.exc_traceback
                self.snapshot("final", stacks=thread_stacks({tid: tb} if tid and tb else None))
        finally:
            (self._prev_threading_excepthook or threading.__excepthook__)(args)

    def final_on_signal(self, signum: int, frame: FrameType | None = None, *, going: bool = True) -> None:
        """Write the final snapshot for a terminating signal: without frames first, then with them
        within SIGNAL_FRAMES_BUDGET_S. `going`: the process is expected to end (its periodic
        snapshots stop, so none is newer than this one); False for an ignored signal."""
        before = self._exception
        self._exception = self._signal_text = FINAL_SIGNALS.get(signum, f"terminated by signal {signum}")
        if going:
            self._stop.set()
        stacks = thread_stacks()
        if frame is not None:
            # The interrupted code, not the handler's frames, is where the main thread was.
            main = threading.main_thread().ident
            for st in stacks:
                if st["thread_id"] == main:
                    st["frames"] = _frame_chain(frame)
        self.snapshot("final", stacks=stacks, frames=False)
        with_frames = threading.Thread(
            target=lambda: self.snapshot("final", stacks=stacks), name="flightdeck-final", daemon=True
        )
        with_frames.start()
        with_frames.join(SIGNAL_FRAMES_BUDGET_S)
        if not going and not with_frames.is_alive():
            self._exception, self._signal_text = before, None

    # -- failure handling --

    def _guarded(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except _AlreadyLogged:
            return None
        except Exception:
            self._log_once(what, f"flightdeck agent: {what} failed; the job goes on")
            return None

    def _log_once(self, key: str, message: str) -> None:
        if key in self._logged:
            logger.debug(message, exc_info=True)
        else:
            self._logged.add(key)
            logger.warning(message + " (logged once)", exc_info=True)


class _AlreadyLogged(Exception):
    """A failure that has been logged already; unwinds to the guard without another line."""


def _describe(etype: type[BaseException] | None, value: BaseException | None) -> str:
    return "".join(traceback.format_exception_only(etype or BaseException, value)).strip()
