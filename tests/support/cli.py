"""The `flightdeck` command line as the tests run it: a subprocess of this interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

#: `flightdeck` from this checkout, under the interpreter running the tests.
FLIGHTDECK = [sys.executable, "-m", "flightdeck"]


def flightdeck(env: Mapping[str, str], *args: str, timeout_s: float = 60) -> str:
    """Run `flightdeck ARGS` with exactly `env` (it names the database); its standard output,
    stripped. A non-zero exit raises CalledProcessError."""
    done = subprocess.run(
        [*FLIGHTDECK, *args], env=env, capture_output=True, text=True, check=True, timeout=timeout_s
    )
    return done.stdout.strip()


def create_token(env: Mapping[str, str], name: str, *scope: str) -> str:
    """A new collector token in the database `env` names (`flightdeck token create`); unscoped
    (`--any-host`) unless a scope is given."""
    return flightdeck(env, "token", "create", name, *(scope or ("--any-host",)))


def clean_env() -> dict[str, str]:
    """This process's environment without FLIGHTDECK_* variables: the caller's would change the
    defaults under test."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}


def collector_env(env: Mapping[str, str], server_url: str, workdir: Path, spool: Path) -> dict[str, str]:
    """`env` plus what `flightdeck collector` needs to ship `spool` to `server_url` with the token
    in `<workdir>/token`, its state in `<workdir>/state`, torch's own dumps and /metrics off."""
    return {
        **env,
        "FLIGHTDECK_COLLECTOR_SERVER_URL": server_url,
        "FLIGHTDECK_COLLECTOR_TOKEN_FILE": str(workdir / "token"),
        "FLIGHTDECK_COLLECTOR_SPOOL_DIRS": json.dumps([str(spool)]),
        "FLIGHTDECK_COLLECTOR_TORCH_DUMP_PREFIXES": "[]",
        "FLIGHTDECK_COLLECTOR_STATE_DIR": str(workdir / "state"),
        "FLIGHTDECK_COLLECTOR_METRICS_LISTEN": "",
    }
