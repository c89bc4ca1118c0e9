"""The in-job agent: periodic flight-recorder snapshots written to a spool directory.

Gloo never dumps its flight recorder by itself, and a rank that dies keeps nothing, so the only way
to see what a job was doing is to take snapshots from inside every rank while it runs. This package
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

The package, one concern a module (this `__init__` only re-exports the API below):

- `api`            `start()` / `stop()`: the process-wide agent;
- `launcher`       `python -m flightdeck.agent`: starts the agent right after `init_process_group`;
- `settings`       `AgentConfig` and the `FLIGHTDECK_AGENT_*` variables it reads (`ENV_VARS`);
- `core`           the `Agent`: its snapshot thread, snapshot writing, exit and exception hooks;
- `signals`        the SIGTERM / SIGINT handlers and their wakeup-fd watcher;
- `progress`       stall detection's evidence: finished collectives, the main thread's CPU and stack;
- `torch_dump`     torch access: the flight-recorder dump, process groups, the agreed job id;
- `config_report`  the configuration report every sidecar carries;
- `stacks`         every thread's Python stack.
"""

from __future__ import annotations

from flightdeck.agent.api import start, stop
from flightdeck.agent.core import Agent
from flightdeck.agent.launcher import install_init_hook, main
from flightdeck.agent.settings import ENV_VARS, AgentConfig

__all__ = ["ENV_VARS", "Agent", "AgentConfig", "install_init_hook", "main", "start", "stop"]
