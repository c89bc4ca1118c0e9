"""The in-job agent: periodic flight-recorder snapshots written to a spool directory.

Gloo never dumps its flight recorder by itself, and a rank that dies keeps nothing, so the only way
to see what a job was doing is to take snapshots from inside every rank while it runs. This module
does that from one daemon thread, using nothing but the standard library and torch:

    import flightdeck.agent; flightdeck.agent.start()     # one line after init_process_group

or, without touching the training script:

    torchrun --nproc-per-node 8 -m flightdeck.agent train.py --lr 3e-4
    python -m flightdeck.agent -m my_pkg.train --lr 3e-4

File contract (the collector and reader depend on it exactly; `flightdeck.spool` holds its names,
sidecar keys and ring split), in `<spool_dir>/<job>/<attempt>/`:

- `rank_<R>.pkl`        the whole ring, without frames, rewritten every `full_every_s` (30 s);
- `rank_<R>.recent.pkl` every `interval_s` in between: only the entries new or unfinished since
                        that whole ring (its sidecar's `ring` key says where the ring now begins),
                        so readers decode a few dozen entries, not 2,000 (`flightdeck.spool`);
- `rank_<R>.stall.pkl`  once per stall episode, with frames and every thread's stack: a collective
                        pending for `STACKS_AFTER_S` (2 s) without any finishing, or none pending
                        and the main thread idle (no CPU, same stack) that long: where a rank the
                        others wait for usually is;
- `rank_<R>.final.pkl`  at interpreter exit, on an uncaught exception, and on SIGTERM / SIGINT
                        (its `exception` then reads "terminated by SIGTERM" / "interrupted by
                        SIGINT"), first without frames (milliseconds), then with them;
- `X.meta.json`         the sidecar of every dump file `X`, written before `X` is renamed into place;
                        its `config` key is the rank's configuration report (versions, FR settings,
                        per-group backend and timeout, `TORCH_*`/`NCCL_*` env, secrets redacted);
                        its `progress` key says whether the main thread is working (CPU time,
                        stack fingerprint, innermost frames: `flightdeck.records.Progress`),
                        sampled every `PROGRESS_SAMPLE_S`, so the server can tell a busy rank
                        (a checkpoint save) from a stuck one.

Every file is written to a hidden temporary name (`.<name>.<pid>.tmp`) in the same directory,
fsynced and renamed, so a reader never sees a partial file. The agent never breaks or slows the job:
every failure is logged once (logger `flightdeck.agent`) and the job goes on.

Signals. `start()` from the main thread installs SIGTERM and SIGINT handlers that write the final
snapshot and then do what the handler installed before would have done: call it (a job's own
handler, SIGINT's KeyboardInterrupt), keep ignoring (SIG_IGN), or restore the default and raise the
signal again, so the exit status stays "killed by SIGTERM". A rank blocked in a collective runs no
Python signal handler until the collective returns; a watcher thread woken through
`signal.set_wakeup_fd` writes the snapshot meanwhile and, when the default action was to die,
ends the process with it (within `SIGNAL_FRAMES_BUDGET_S` + `MAIN_THREAD_GRACE_S`, well inside the
30 s torchrun, SLURM and Kubernetes give before SIGKILL). A handler the job installs after the agent
started replaces the agent's: the job then owns the signal, and the atexit snapshot covers a clean
exit. After a terminating signal the periodic snapshots stop (the rank was told to end, and none
may look newer than its final one); a job whose own handler lets it finish its step writes its
final snapshot again at exit, with the same `exception` text. An ignored signal (SIG_IGN) is
recorded the same way, and the periodic snapshots go on. Forked children (data-loader workers) get
the previous handlers back.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import pickle
import platform
import re
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from flightdeck.env_names import AGENT_PREFIX, warn_legacy
from flightdeck.records import PROGRESS_MAX_FRAMES, Frame, Progress, progress_to_dict
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

#: A flight-recorder dump function: `fn(include_stack_traces) -> pickle bytes`.
DumpFn = Callable[[bool], bytes]

ENV_PREFIX = AGENT_PREFIX
#: Environment variables read by `AgentConfig.from_env`, with what they set.
ENV_VARS: dict[str, str] = {
    "FLIGHTDECK_AGENT_ENABLED": "enabled (0/false/no/off disables the agent, 1 or unset enables it)",
    "FLIGHTDECK_AGENT_SPOOL_DIR": "spool_dir",
    "FLIGHTDECK_AGENT_INTERVAL_S": "interval_s",
    "FLIGHTDECK_AGENT_FULL_EVERY_S": "full_every_s",
    "FLIGHTDECK_AGENT_JOB": "job",
    "FLIGHTDECK_AGENT_CHECKPOINT_DIR": "Where the job reads and writes distributed checkpoints, sent in "
    "the rank's configuration report: the server flags jobs that share it across torch 2.14 and 2.15.",
    "FLIGHTDECK_STALL_AFTER_S": "deprecated and ignored (a warning): the server's "
    "FLIGHTDECK_SERVER_STALL_AFTER_S decides what is a hang; the agent writes its stack snapshot "
    "after a fixed STACKS_AFTER_S",
    "FLIGHTDECK_TEST_VERSION_OVERRIDE": "TEST ONLY: a JSON object replacing the reported versions "
    "(torch_version, torch_git_version, cuda_version, nccl_version, python_version); the report is "
    "marked `simulated`",
}
#: The names the agent read before it had its own prefix (read for one release, with a warning).
LEGACY_ENV_VARS: dict[str, str] = {
    "FLIGHTDECK_AGENT": "FLIGHTDECK_AGENT_ENABLED",
    "FLIGHTDECK_SPOOL_DIR": "FLIGHTDECK_AGENT_SPOOL_DIR",
    "FLIGHTDECK_INTERVAL_S": "FLIGHTDECK_AGENT_INTERVAL_S",
    "FLIGHTDECK_FULL_EVERY_S": "FLIGHTDECK_AGENT_FULL_EVERY_S",
    "FLIGHTDECK_JOB": "FLIGHTDECK_AGENT_JOB",
    "FLIGHTDECK_CHECKPOINT_DIR": "FLIGHTDECK_AGENT_CHECKPOINT_DIR",
}
#: The flight-recorder ring size variables, the one torch reads first first; torch's default.
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_BUFFER_DEFAULT = 2000
#: NCCL's dump-on-timeout switch (TORCH_FR_DUMP_ON_TIMEOUT is the torch 2.15 alias); default on.
DUMP_ON_TIMEOUT_VARS = ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT")
TEST_VERSION_OVERRIDE_VAR = "FLIGHTDECK_TEST_VERSION_OVERRIDE"
_VERSION_KEYS = ("torch_version", "torch_git_version", "cuda_version", "nccl_version", "python_version")
#: Env var names containing one of these have their value redacted in the config report.
SECRET_NAME_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")
REDACTED = "<redacted>"
_TOKENISH = re.compile(r"[A-Za-z0-9+/=_.:-]+")
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
#: The c10d store key through which rank 0 hands its job id to the others when no launcher set one.
STORE_JOB_KEY = "flightdeck/job_id"
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
_FALSE = {"0", "false", "no", "off"}
_TRUE = {"1", "true", "yes", "on", ""}


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Settings of the in-job agent; `from_env` reads them from `FLIGHTDECK_AGENT_*` variables."""

    spool_dir: Path = Path(DEFAULT_SPOOL_DIR)
    """Root of the spool; files go to `<spool_dir>/<job>/<attempt>/` (FLIGHTDECK_AGENT_SPOOL_DIR)."""

    interval_s: float = 1.0
    """Seconds between periodic snapshots (FLIGHTDECK_AGENT_INTERVAL_S); at least 0.05. A hang is
    reported about `stall_after_s` (the server's) plus one interval plus one collector push after
    the fault: 1 s keeps that within 3 s of the threshold."""

    stall_after_s: float | None = None
    """Deprecated (FLIGHTDECK_STALL_AFTER_S on the agent): accepted, logged once, ignored. The
    server's `stall_after_s` decides what is a hang; the agent writes its stack snapshot after a
    fixed 2 s (`STACKS_AFTER_S`). Remove it from job environments."""

    full_every_s: float = 30.0
    """Seconds between periodic snapshots of the whole ring (FLIGHTDECK_AGENT_FULL_EVERY_S); the ones in
    between hold only what changed since (`rank_<R>.recent.pkl`). 0 (or less than `interval_s`):
    the whole ring every time."""

    job: str | None = None
    """Job id (FLIGHTDECK_AGENT_JOB); None: TORCHELASTIC_RUN_ID, SLURM_JOB_ID, else agreed across ranks
    through the c10d store. Characters other than letters, digits, `.`, `_`, `-` become `_`."""

    enabled: bool = True
    """False turns `start()` and the launcher into no-ops (FLIGHTDECK_AGENT_ENABLED=0)."""

    def __post_init__(self) -> None:
        if not self.interval_s >= 0.05:  # also rejects NaN
            raise ValueError(f"interval_s must be >= 0.05 seconds, got {self.interval_s}")
        if not self.full_every_s >= 0:  # also rejects NaN; below interval_s every snapshot is whole
            raise ValueError(f"full_every_s must be >= 0 seconds, got {self.full_every_s}")
        if self.job is not None and not sanitize_job(self.job, default=""):
            raise ValueError(f"job must contain a letter or digit, got {self.job!r}")
        if not str(self.spool_dir):
            raise ValueError("spool_dir must not be empty")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AgentConfig:
        """Build the config from `FLIGHTDECK_AGENT_*` variables (the old names warn); keyword
        overrides win over the env."""
        env = agent_env(os.environ if env is None else env)
        values: dict[str, Any] = {}
        if "FLIGHTDECK_AGENT_ENABLED" in env:
            values["enabled"] = _parse_bool("FLIGHTDECK_AGENT_ENABLED", env["FLIGHTDECK_AGENT_ENABLED"])
        if env.get("FLIGHTDECK_AGENT_SPOOL_DIR"):
            values["spool_dir"] = Path(env["FLIGHTDECK_AGENT_SPOOL_DIR"])
        for name, key in (
            ("interval_s", "FLIGHTDECK_AGENT_INTERVAL_S"),
            ("stall_after_s", "FLIGHTDECK_STALL_AFTER_S"),
            ("full_every_s", "FLIGHTDECK_AGENT_FULL_EVERY_S"),
        ):
            if env.get(key):
                try:
                    values[name] = float(env[key])
                except ValueError:
                    raise ValueError(f"{key} must be a number of seconds, got {env[key]!r}") from None
        if env.get("FLIGHTDECK_AGENT_JOB"):
            values["job"] = env["FLIGHTDECK_AGENT_JOB"]
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown agent setting(s): {', '.join(sorted(unknown))}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "spool_dir" in values:
            values["spool_dir"] = Path(values["spool_dir"])
        if "interval_s" in values:
            values["interval_s"] = float(values["interval_s"])
        for name in ("stall_after_s", "full_every_s"):
            if name in values:
                values[name] = float(values[name])
        if "stall_after_s" in values:
            _warn_stall_after_deprecated()
        return cls(**values)


_deprecation_logged = False


def _warn_stall_after_deprecated() -> None:
    global _deprecation_logged
    if not _deprecation_logged:
        _deprecation_logged = True
        logger.warning(
            "flightdeck agent: FLIGHTDECK_STALL_AFTER_S (stall_after_s) is deprecated and ignored: "
            "the server's FLIGHTDECK_SERVER_STALL_AFTER_S decides what is a hang, and the agent writes its "
            "stack snapshot after a fixed %.0f s",
            STACKS_AFTER_S,
        )


def agent_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with each old agent variable (`LEGACY_ENV_VARS`) copied to its new name where that
    is unset; each old one set warns (the new name wins when both are)."""
    out = dict(env)
    for old, new in LEGACY_ENV_VARS.items():
        if old in env:
            if new in env:
                warn_legacy(old, new, process="flightdeck agent", ignored=True)
            else:
                warn_legacy(old, new, process="flightdeck agent")
                out[new] = env[old]
    return out


def _parse_bool(key: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _FALSE:
        return False
    if low in _TRUE:
        return True
    raise ValueError(f"{key} must be 0 or 1, got {raw!r}")


# --- torch access (every call here is feature-detected; nothing branches on version numbers) -------


def default_dump_fn() -> DumpFn:
    """The flight-recorder dump of this torch build, dumping every backend ring in use.

    `_dump_fr_trace` (torch >= 2.5, all backends) is preferred over the older NCCL-only
    `_dump_nccl_trace`. When the function accepts `backend=` (torch 2.15: NCCL2 records into its own
    ring), the rings of the extra backends in use are dumped too and merged into one dump.
    """
    import torch

    c10d = torch._C._distributed_c10d
    fn = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if fn is None:
        raise RuntimeError("this torch build has no flight-recorder dump function")
    return _BackendMergingDump(fn)


class _BackendMergingDump:
    """Calls the dump function once for the default ring and once per extra backend ring."""

    def __init__(self, fn: Callable[..., bytes]) -> None:
        self._fn = fn
        #: None until known; False once a call with `backend=` raised TypeError.
        self._backend_kwarg: bool | None = None
        self._failed_backends: set[str] = set()

    def __call__(self, include_stack_traces: bool) -> bytes:
        kwargs = {"includeCollectives": True, "includeStackTraces": include_stack_traces, "onlyActive": False}
        base = self._fn(**kwargs)
        extras = [b for b in _extra_backends() if b not in self._failed_backends]
        if self._backend_kwarg is False or not extras:
            return base
        merged: dict[str, Any] | None = None
        for backend in extras:
            try:
                raw = self._fn(**kwargs, backend=backend)
            except TypeError:
                # pybind11 raises TypeError for an unknown keyword: this build has one ring only.
                self._backend_kwarg = False
                return base
            except Exception:
                self._failed_backends.add(backend)
                logger.warning(
                    "flight-recorder dump of backend %r failed; skipping it", backend, exc_info=True
                )
                continue
            self._backend_kwarg = True
            if merged is None:
                merged = pickle.loads(base)  # noqa: S301 - bytes produced by this very process
            _merge_dump(merged, pickle.loads(raw))  # noqa: S301 - bytes produced by this very process
        return base if merged is None else pickle.dumps(merged, protocol=pickle.HIGHEST_PROTOCOL)


def _extra_backends() -> list[str]:
    """Backends in use whose flight recorder may live in a ring of its own (torch 2.15 `nccl2`)."""
    names: set[str] = set()
    try:
        from torch.distributed import distributed_c10d as c10d

        for value in list(c10d._world.pg_map.values()):
            # Values are (backend string, store); the string may read "cpu:gloo,cuda:nccl".
            for part in str(value[0]).split(","):
                names.add(part.split(":")[-1].strip().lower())
    except Exception:
        return []
    extras = {n for n in names if n and n not in ("gloo", "undefined", "nccl-legacy")}
    if extras & {"nccl", "nccl2"}:
        extras.discard("nccl")
        extras.add("nccl2")
    return sorted(extras)


def _merge_dump(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Append `other`'s entries and groups to `into`, skipping entries already present."""

    def key(e: Mapping[str, Any]) -> tuple[Any, ...]:
        pg = e.get("process_group") or ("",)
        fields = ("collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "time_created_ns")
        return (pg[0], *(e.get(f) for f in fields))

    entries = into.setdefault("entries", [])
    seen = {key(e) for e in entries}
    entries.extend(e for e in other.get("entries", []) if key(e) not in seen)
    entries.sort(key=lambda e: int(e.get("time_created_ns") or 0))
    for section in ("pg_config", "pg_status"):
        if isinstance(other.get(section), dict):
            into.setdefault(section, {}).update(
                {k: v for k, v in other[section].items() if k not in into.get(section, {})}
            )


def _dist_groups() -> dict[str, dict[str, Any]]:
    """The real name, description and member ranks of every group this rank belongs to.

    Gloo registers a group with the flight recorder before Python names it, so its dump's
    `pg_config` is empty; `_world` knows the names (`process_group[0]` in entries) and the ranks.
    """
    from torch.distributed import distributed_c10d as c10d

    groups: dict[str, dict[str, Any]] = {}
    world = c10d._world
    for pg, name in list(world.pg_names.items()):
        members = world.pg_group_ranks.get(pg) or {}
        groups[str(name)] = {
            "desc": str(getattr(pg, "group_desc", "") or ""),
            "ranks": sorted(int(r) for r in members),
        }
    return groups


# --- the configuration report ---------------------------------------------------------------------


def looks_secret(value: str) -> bool:
    """Whether an env value looks like a credential: a long, high-entropy token (not a path, list or
    number), e.g. an API key pasted into a variable whose name does not say so."""
    if len(value) < 24 or value[0] in "/.~" or not _TOKENISH.fullmatch(value):
        return False
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return False
    counts = {c: value.count(c) for c in set(value)}
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= 3.5


def reported_env(env: Mapping[str, str]) -> dict[str, str]:
    """The `TORCH_*` / `NCCL_*` variables only, values redacted where they look secret."""
    out: dict[str, str] = {}
    for name in sorted(env):
        if not name.startswith(("TORCH_", "NCCL_")):
            continue
        value = env[name]
        secret = any(w in name.upper() for w in SECRET_NAME_WORDS) or looks_secret(value)
        out[name] = REDACTED if secret else value[:512]
    return out


def fr_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """Flight-recorder settings as torch reads them: ring size (and which variable set it), and
    whether NCCL dumps on a watchdog timeout."""
    size: int | None = FR_BUFFER_DEFAULT
    size_var: str | None = None
    for var in FR_BUFFER_VARS:
        raw = env.get(var)
        if raw is not None and raw.strip():
            size_var = var
            try:
                size = int(raw.strip())
            except ValueError:
                size = None  # torch would refuse or misread it; reported as unknown
            break
    dump_on_timeout = True
    for var in DUMP_ON_TIMEOUT_VARS:
        raw = env.get(var)
        if raw is not None and raw.strip():
            dump_on_timeout = raw.strip().lower() not in _FALSE
            break
    return {"fr_buffer_size": size, "fr_buffer_size_var": size_var, "dump_on_timeout": dump_on_timeout}


def static_versions(env: Mapping[str, str]) -> dict[str, Any]:
    """Versions that do not change while the process runs: torch (and its commit), CUDA, NCCL,
    Python. FLIGHTDECK_TEST_VERSION_OVERRIDE (tests only) replaces them and marks them simulated."""
    import torch

    out: dict[str, Any] = {
        "torch_version": str(torch.__version__),
        "torch_git_version": str(getattr(torch.version, "git_version", "") or "") or None,
        "cuda_version": str(getattr(torch.version, "cuda", "") or "") or None,
        "nccl_version": None,
        "python_version": platform.python_version(),
        "simulated": False,
    }
    try:
        # The NCCL a CUDA build was compiled with (no GPU needed); a CPU build raises.
        v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: S110 - no NCCL in this build: nothing to report
        pass
    raw = env.get(TEST_VERSION_OVERRIDE_VAR)
    if raw:
        override = json.loads(raw)
        if not isinstance(override, dict):
            raise ValueError(f"{TEST_VERSION_OVERRIDE_VAR} must be a JSON object")
        out.update({k: str(v) for k, v in override.items() if k in _VERSION_KEYS})
        out["simulated"] = True
    return out


def _group_configs() -> dict[str, dict[str, Any]]:
    """Backend and timeout of every group this rank belongs to, from torch's group registry."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    out: dict[str, dict[str, Any]] = {}
    for pg, name in list(world.pg_names.items()):
        backend = str(world.pg_backend_config.get(pg, "") or "") or None
        out[str(name)] = {
            "desc": str(getattr(pg, "group_desc", "") or ""),
            "backend": backend,
            "timeout_ms": _timeout_ms(pg, backend, torch),
        }
    return out


def _timeout_ms(pg: Any, backend: str | None, torch: Any) -> int | None:
    """The group's timeout from its backend's options (gloo and NCCL both expose `_timeout`)."""
    devices = [part.split(":")[0] for part in (backend or "").split(",") if ":" in part] or ["cpu", "cuda"]
    for dev in devices:
        try:
            t = pg._get_backend(torch.device(dev)).options._timeout
            return int(t.total_seconds() * 1000)
        except Exception:  # noqa: S112 - this device has no backend, or no options: try the next
            continue
    return None


def _agree_job_id(rank: int, timeout_s: float) -> str:
    """A job id shared by all ranks, agreed through the default c10d store (never a collective:
    that would add a flight-recorder entry and shift every `collective_seq_id`)."""
    from torch.distributed import distributed_c10d as c10d

    store = c10d._get_default_store()
    if rank == 0:
        value = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        store.set(STORE_JOB_KEY, value)
        return value
    store.wait([STORE_JOB_KEY], timedelta(seconds=timeout_s))
    got: bytes = store.get(STORE_JOB_KEY)
    return got.decode()


# --- snapshot helpers ----------------------------------------------------------------------------


def thread_stacks(
    replace: Mapping[int, TracebackType] | None = None,
) -> list[dict[str, Any]]:
    """Every thread's Python stack, innermost first; `replace` maps a thread id to a traceback to
    show instead (the stack where an exception was raised, rather than the hook's)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out: list[dict[str, Any]] = []
    for tid, frame in sys._current_frames().items():
        tb = (replace or {}).get(tid)
        frames = _tb_frames(tb) if tb is not None else _frame_chain(frame)
        out.append({"thread_name": names.get(tid, f"thread-{tid}"), "thread_id": tid, "frames": frames})
    return sorted(out, key=lambda s: (s["thread_name"] != "MainThread", s["thread_id"]))


def _frame_chain(frame: FrameType | None) -> list[dict[str, Any]]:
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append({"name": code.co_name, "filename": code.co_filename, "line": frame.f_lineno or 0})
        frame = frame.f_back
    return frames


def _tb_frames(tb: TracebackType) -> list[dict[str, Any]]:
    summary = traceback.extract_tb(tb)
    return [{"name": f.name, "filename": f.filename, "line": f.lineno or 0} for f in reversed(summary)]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = temp_path(path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


# --- the agent -----------------------------------------------------------------------------------


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
            self._write_stall(stacks)

    def _write_stall(self, stacks: list[dict[str, Any]]) -> None:
        """Write the stall snapshot from a thread of its own: torch symbolizes the entries' frames
        the first time for seconds (9-12 s measured on a loaded 2-core machine; it releases the
        GIL), and the periodic snapshots must go on meanwhile, or the rank would look lost."""

        def write() -> None:
            self._guarded("stall", lambda: self._write("stall", self._dump(True), self._clock_ns(), stacks))

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
            "last_progress_ns": self._progress.last_progress_ns,
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


class _AlreadyLogged(Exception):
    """A failure that has been logged already; unwinds to the guard without another line."""


def _describe(etype: type[BaseException] | None, value: BaseException | None) -> str:
    return "".join(traceback.format_exception_only(etype or BaseException, value)).strip()


# --- module-level API ----------------------------------------------------------------------------

_agent: Agent | None = None
_agent_lock = threading.Lock()


def start(
    *,
    spool_dir: str | os.PathLike[str] | None = None,
    interval_s: float | None = None,
    stall_after_s: float | None = None,
    job: str | None = None,
) -> Agent | None:
    """Start the agent for this process (idempotent); keyword arguments override the environment.

    Call it after `init_process_group`. Returns the running agent, or None when disabled
    (FLIGHTDECK_AGENT_ENABLED=0) or misconfigured (logged; the job goes on).
    """
    global _agent
    with _agent_lock:
        if _agent is not None:
            return _agent
        try:
            cfg = AgentConfig.from_env(
                spool_dir=spool_dir, interval_s=interval_s, stall_after_s=stall_after_s, job=job
            )
        except ValueError:
            logger.warning("flightdeck agent: bad configuration; agent not started", exc_info=True)
            return None
        if not cfg.enabled:
            return None
        _agent = Agent(cfg)
        _agent.start()
        return _agent


def stop(*, final: bool = False) -> None:
    """Stop the process-wide agent started by `start()` (for tests)."""
    global _agent
    with _agent_lock:
        if _agent is not None:
            _agent.stop(final=final)
            _agent = None


# --- the launcher: python -m flightdeck.agent script.py args... ----------------------------------


def install_init_hook() -> None:
    """Wrap `torch.distributed.init_process_group` so that the agent starts right after it returns."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    if getattr(original, "__flightdeck_wrapped__", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            start()
        except Exception:  # start() guards itself; belt and braces: never fail the user's init
            logger.warning("flightdeck agent: start failed", exc_info=True)
        return result

    init_process_group.__flightdeck_wrapped__ = True  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    # Modules that imported the function by name before us keep the original; patch those loaded.
    for module in (dist, distributed_c10d, *_modules_binding(original)):
        if getattr(module, "init_process_group", None) is original:
            module.init_process_group = init_process_group


def _modules_binding(fn: object) -> Iterator[Any]:
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.") and getattr(module, "init_process_group", None) is fn:
            yield module


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m flightdeck.agent [-m module | script.py] args...`: run the training program with
    the agent started right after its `init_process_group`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: python -m flightdeck.agent (SCRIPT | -m MODULE) [ARGS...]\n\n" + __doc__.split("\n\n")[0]
        )
        return 0 if args else 2
    try:
        enabled = AgentConfig.from_env().enabled
    except ValueError as exc:
        logger.warning("flightdeck agent: bad configuration (%s); running without it", exc)
        enabled = False
    if enabled:
        os.environ["FLIGHTDECK_AGENT_ENABLED"] = "1"  # so child interpreters can tell the agent is wanted
        try:
            install_init_hook()
        except Exception:
            logger.warning("flightdeck agent: could not hook init_process_group", exc_info=True)
    if args[0] == "-m":
        if len(args) < 2:
            print("flightdeck.agent: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        # Like `python script.py`: the script's directory comes first on sys.path.
        sys.path.insert(0, str(Path(args[0]).resolve().parent))
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    # Delegate to the importable module so that start() and stop() share one agent singleton.
    from flightdeck.agent import main as _main

    raise SystemExit(_main())
