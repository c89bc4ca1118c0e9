"""`flightdeck up`: the server (SQLite) and a local collector on this machine, in one command.

    flightdeck up [--port 8470] [--data-dir DIR] [--spool-dir DIR] [--stall-after S]

Both listen on 127.0.0.1 only. The collector's token is created in the server's token store on
first start and kept in `<data_dir>/collector.token` (mode 0600); ingest stays authenticated.
Ctrl-C or SIGTERM stops both; when either dies, the other is stopped and the exit code is 1.
For PostgreSQL, several hosts or another bind address, run `flightdeck server` and
`flightdeck collector` separately (docs/runbook.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from flightdeck.paths import default_data_dir, default_spool_dir


class UpSettings(BaseSettings):
    """Settings of `flightdeck up` (environment prefix `FLIGHTDECK_UP_`; options win)."""

    model_config = SettingsConfigDict(env_prefix="FLIGHTDECK_UP_", extra="ignore", frozen=True)

    port: int = Field(default=8470, ge=1, le=65535, description="TCP port of the server on 127.0.0.1.")
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="The server's SQLite database, the collector's queue and its token file live here.",
    )
    spool_dir: Path = Field(
        default_factory=default_spool_dir,
        description="Spool the training jobs' agents write to (their FLIGHTDECK_AGENT_SPOOL_DIR); the "
        "collector also watches PyTorch's own dump paths.",
    )
    stall_after_s: float | None = Field(
        default=None,
        ge=1.0,
        description="Seconds a collective may stay unfinished before it is a hang; default: the "
        "server's FLIGHTDECK_SERVER_STALL_AFTER_S (5).",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the arguments of `flightdeck up`."""
    parser.add_argument("--port", type=int, default=None, help="server port on 127.0.0.1 (default 8470)")
    parser.add_argument("--data-dir", type=Path, default=None, help="default ~/.local/share/flightdeck")
    parser.add_argument("--spool-dir", type=Path, default=None, help="default ~/.cache/flightdeck/spool")
    parser.add_argument(
        "--stall-after", type=float, default=None, help="hang threshold in seconds (server default 5)"
    )
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))


def banner(
    url: str,
    spool_dir: Path,
    data_dir: Path,
    *,
    torch_prefixes: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> str:
    """What to tell the user once everything runs: the URL, what the collector watches (the
    spool and `torch_prefixes`) and the lines for the training jobs. A spool set in `env` (this
    shell) that the collector does not watch is pointed out."""
    watched = [f"    spool  {spool_dir}   (the agents' snapshots: FLIGHTDECK_AGENT_SPOOL_DIR below)"]
    watched += [f"    torch  {p}<rank>   (PyTorch's own dump files)" for p in torch_prefixes]
    notes = ""
    for name in ("FLIGHTDECK_AGENT_SPOOL_DIR", "FLIGHTDECK_SPOOL_DIR"):
        have = (env or {}).get(name)
        if have and Path(have).expanduser().resolve() != spool_dir:
            notes += f"\nNote: this shell has {name}={have}: jobs started from it write where this collector does not look.\n"
            break
    return f"""\
Flightdeck is up: {url}   (incidents at {url}/jobs/<job>, API at {url}/docs)
  data:  {data_dir}
  spool: {spool_dir}
  the collector watches:
{chr(10).join(watched)}
{notes}
In your training jobs (same machine, same user):
  export FLIGHTDECK_AGENT_SPOOL_DIR={spool_dir}   # where the agent writes; this collector watches it
  export FLIGHTDECK_AGENT_JOB=my-run-42   # the name the job is shown under (default: the scheduler's id,
                                          # TORCHELASTIC_RUN_ID or SLURM_JOB_ID; plain torchrun makes a UUID)
  python -m flightdeck.agent train.py ...            # or: torchrun --nproc-per-node N -m flightdeck.agent train.py ...
  # or, in the script after init_process_group:  import flightdeck.agent; flightdeck.agent.start()

Ctrl-C stops the server and the collector.
"""


def run(args: argparse.Namespace) -> int:
    """Start the server and the collector, print how to use them, run until a signal or a death."""
    from flightdeck.launch.local_stack import LocalStack, StackError, provision_token, sqlite_url

    overrides = {
        k: v
        for k, v in (
            ("port", args.port),
            ("data_dir", args.data_dir),
            ("spool_dir", args.spool_dir),
            ("stall_after_s", args.stall_after),
        )
        if v is not None
    }
    try:
        settings = UpSettings(**overrides)
    except ValueError as exc:
        print(f"flightdeck up: invalid settings: {exc}", file=sys.stderr)
        return 2
    data_dir = settings.data_dir.expanduser().resolve()
    spool_dir = settings.spool_dir.expanduser().resolve()
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stack = LocalStack()
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        spool_dir.mkdir(parents=True, exist_ok=True)
        token_file = data_dir / "collector.token"
        provision_token(sqlite_url(data_dir), token_file)
        url = stack.start_server(
            data_dir=data_dir,
            port=settings.port,
            stall_after_s=settings.stall_after_s,
            log_level=args.log_level,
        )
        stack.start_collector(
            name="collector",
            server_url=url,
            spool_dirs=[spool_dir],
            state_dir=data_dir / "collector",
            token_file=token_file,
            log_level=args.log_level,
        )
        from flightdeck.collector.settings import default_torch_prefixes

        # The collector's default torch prefixes, as it resolves them in this same environment.
        prefixes = default_torch_prefixes(os.environ)
        print(banner(url, spool_dir, data_dir, torch_prefixes=prefixes, env=os.environ), flush=True)
        while not stopping.wait(0.5):
            dead = stack.exited()
            if dead is not None:
                print(
                    f"flightdeck up: the {dead.name} exited (code {dead.proc.returncode}); stopping",
                    file=sys.stderr,
                )
                return 1
        print("flightdeck up: stopping", file=sys.stderr, flush=True)
        return 0
    except (StackError, OSError) as exc:
        print(f"flightdeck up: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
