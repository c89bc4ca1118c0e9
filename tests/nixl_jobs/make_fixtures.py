"""Regenerate tests/data/nixl from real NIXL runs of `pair.py` (not run by the tests).

Usage, from the repository root with the venv active:

    pip download --no-deps nixl-cu12==1.0.1 -d /tmp/whl   # likewise 1.1.0, 1.2.0, 1.3.2
    pip install --no-deps --target /tmp/nixl-1.0.1 /tmp/whl/nixl_cu12-1.0.1-*.whl   # and so on
    python tests/nixl_jobs/make_fixtures.py 1.5.1= 1.0.1=/tmp/nixl-1.0.1 1.1.0=/tmp/nixl-1.1.0 \
        1.2.0=/tmp/nixl-1.2.0 1.3.2=/tmp/nixl-1.3.2

`RELEASE=DIR` runs with DIR first on PYTHONPATH (an empty DIR: the installed wheel). Per release it
writes `ring-<release>/{initiator,target}`: the producer's phase 1 consumed by our reader (as the
collector would), phase 2 left unread, so the unread region wraps around the 32-slot ring. For
1.5.1 it also writes `mp-<release>/` (a separate run: NIXL turns the ring exporter off when
`NIXL_TELEMETRY_EXPORTER` is set). `expected.json` holds the producer's own reports.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from flightdeck.readers.nixl_ring import read_ring

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "tests" / "nixl_jobs" / "pair.py"
OUT = ROOT / "tests" / "data" / "nixl"
#: What the fixtures' producer does (also read by the tests through expected.json).
REPORT_PREFIX = "PAIR-REPORT "
PAIR_ARGS = ["--writes", "3", "--reads", "2", "--writes2", "4", "--fail"]
RING_CAPACITY = 32


def nixl_env(extra: dict[str, str], pythonpath: str = "") -> dict[str, str]:
    """The environment a NIXL producer needs on a machine without RDMA hardware or GPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIXL_", "UCX_"))}
    # With only the agent config's capture_telemetry, NIXL 1.0.1 writes no ring file; the variable
    # works with every release.
    env.update(UCX_TLS="tcp,sm,self", UCX_NET_DEVICES="lo", LOCAL_RANK="0", NIXL_TELEMETRY_ENABLE="y")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(extra)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (for the prometheus_mp owner's HTTP server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_pair(env: dict[str, str], between: list[Any]) -> list[dict[str, Any]]:
    """Run pair.py; after phase i's report, call between[i]() before letting it go on."""
    proc = subprocess.Popen(
        [sys.executable, str(PAIR), *PAIR_ARGS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    reports = []
    for step in between:
        line = proc.stdout.readline()
        while line and not line.startswith(REPORT_PREFIX):
            line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"pair.py ended early with status {proc.wait()}")
        reports.append(json.loads(line.removeprefix(REPORT_PREFIX)))
        step()
        proc.stdin.write("\n")
        proc.stdin.flush()
    if proc.wait(timeout=60) != 0:
        raise SystemExit(f"pair.py failed with status {proc.returncode}")
    return reports


def make(release: str, pythonpath: str) -> dict[str, Any]:
    """Produce the fixtures of one release; returns its expected.json entry."""
    entry: dict[str, Any] = {"args": PAIR_ARGS, "ring_capacity": RING_CAPACITY}
    with tempfile.TemporaryDirectory() as tmp:
        ring = Path(tmp) / "ring"
        ring.mkdir()
        env = nixl_env(
            {"NIXL_TELEMETRY_DIR": str(ring), "NIXL_TELEMETRY_BUFFER_SIZE": str(RING_CAPACITY)},
            pythonpath,
        )

        def consume() -> None:
            for agent in ("initiator", "target"):
                read_ring(ring / agent, consume=True)

        entry["ring"] = run_pair(env, [consume, lambda: None])
        dest = OUT / f"ring-{release}"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(ring, dest)

        if release == "1.5.1":
            mp = Path(tmp) / "mp"
            mp.mkdir()
            env = nixl_env(
                {
                    "NIXL_TELEMETRY_EXPORTER": "prometheus_mp",
                    "NIXL_TELEMETRY_MULTIPROC_DIR": str(mp),
                    "NIXL_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
                    "NIXL_TELEMETRY_PROMETHEUS_LOCAL": "1",
                },
                pythonpath,
            )
            entry["mp"] = run_pair(env, [lambda: None, lambda: None])
            dest = OUT / f"mp-{release}"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(mp, dest)
    return entry


def main(argv: list[str]) -> int:
    """Regenerate the fixtures of the releases named on the command line."""
    expected_path = OUT / "expected.json"
    expected = json.loads(expected_path.read_text()) if expected_path.exists() else {}
    for arg in argv:
        release, _, pythonpath = arg.partition("=")
        expected[release] = make(release, pythonpath)
        print(f"{release}: done", file=sys.stderr)
    OUT.mkdir(parents=True, exist_ok=True)
    expected_path.write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
