"""Fault -> finding -> page on loopback, shipped defaults: `flightdeck demo --scenario X` (issue #19).

    python -m bench.demo_scenarios [--repeat 3] [--scenario stall crash mismatch partition busy]

Each run is a fresh demo with its defaults (own server on SQLite with stall_after 5 s, one collector
per "host" pushing every 1 s, a 4-rank gloo job with the agent snapshotting every 1 s). One real
Prometheus + Alertmanager with the shipped configuration (tests/support/ops_stack.py `render_shipped`)
scrapes the demo's server throughout. Per run: fault -> finding in the API (the demo's own figure)
and fault -> page (the fault's firing alert at the paging receiver, /flightdeck/critical). `busy`
(rank 1 computes and writes for `--busy-s` while the others wait in a barrier) reports the findings
opened and the pages for the job until the job went on and 12 s more (target: 0 pages). Prints one
line per run and a Markdown table of medians; docs/alerting.md records the results.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from flightdeck.launch.demo.cmd import SCENARIOS
from flightdeck.launch.demo.ranks import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from tests.support.ops_stack import Delivery, HangTarget, OpsStack, pages

_JOB = re.compile(r"^job (\S+): ")
_FAULT_AT = re.compile(r"\(?at (\d+\.\d+)\)")
_FINDING = re.compile(r"^fault -> finding: ([\d.]+) s \(blocked collective named after ([\d.]+) s")
_HANGS = re.compile(r"^hang findings: (\d+)")
_BUSY_KIND = re.compile(r"^  (\w+) after ([\d.]+) s:")
#: The alert each true fault pages with.
ALERT = {
    "stall": "FlightdeckCollectiveHang",
    "crash": "FlightdeckCollectiveHang",
    "partition": "FlightdeckCollectiveHang",
    "mismatch": "FlightdeckCollectiveMismatch",
}
BUSY_SETTLE_S = 12.0


class DemoRun:
    """A running `flightdeck demo` whose stdout lines are collected by a thread."""

    def __init__(self, scenario: str, port: int, extra: list[str]) -> None:
        cmd = [
            sys.executable,
            "-m",
            "flightdeck",
            "demo",
            "--scenario",
            scenario,
            "--port",
            str(port),
            *extra,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def find(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        """The first output line matching `pattern`; SystemExit when the demo ends or time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            for line in list(self.lines):
                m = pattern.search(line)
                if m:
                    return m
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(
                    f"demo: no line matching {pattern.pattern!r}:\n" + "\n".join(self.lines[-40:])
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM (the demo stops its job, collectors and server), kill after 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._thread.join(timeout=10)


def run_once(ops: OpsStack, scenario: str, port: int, busy_s: float) -> dict[str, Any]:
    """One demo run against the shared alert path."""
    offset = time.time() - time.monotonic()
    extra = ["--busy-s", str(busy_s)] if scenario == "busy" else []
    demo = DemoRun(scenario, port, extra)
    try:
        job = demo.find(_JOB, 300)[1]
        fault_at = float(demo.find(_FAULT_AT, 300)[1]) - offset  # monotonic
        if scenario == "busy":
            hangs = int(demo.find(_HANGS, busy_s + 300)[1])
            time.sleep(BUSY_SETTLE_S)
            kinds = [(m[1], float(m[2])) for line in demo.lines if (m := _BUSY_KIND.match(line))]
            slow = [line.strip() for line in demo.lines if line.startswith("  slow_rank after")]
            return {
                "pages": len(pages(ops.webhook.deliveries, job)),
                "hangs": hangs,
                "kinds": kinds,
                "slow": slow[:1],
            }
        m = demo.find(_FINDING, 300)
        name = ALERT[scenario]

        def match(d: Delivery) -> bool:
            return bool(pages([d], job)) and any(a["labels"].get("alertname") == name for a in d.alerts())

        page = ops.webhook.wait_for(match, 90)
        return {"finding": float(m[1]), "named": float(m[2]), "page": page.received_at - fault_at}
    finally:
        demo.stop()


def _med(values: list[float]) -> str:
    out = f"{statistics.median(values):.1f}"
    return out if len(values) == 1 else f"{out} ({min(values):.1f}–{max(values):.1f})"


def main() -> int:
    """Run the scenarios and print the measured times."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", nargs="*", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--repeat", type=int, default=3, help="runs per true fault")
    p.add_argument("--busy-repeat", type=int, default=1, help="runs of the busy scenario")
    p.add_argument("--busy-s", type=float, default=90.0)
    args = p.parse_args()
    port = free_port()
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="fd-demo-bench-") as tmp:
        target = HangTarget(f"127.0.0.1:{port}", "/metrics", lambda: None)
        with OpsStack(rule_files=[], targets=[target], workdir=Path(tmp), shipped=True) as ops:
            ops.wait_for_alertmanager_discovered(timeout=90)
            for scenario in args.scenario:
                n = args.busy_repeat if scenario == "busy" else args.repeat
                rows[scenario] = []
                for i in range(n):
                    got = run_once(ops, scenario, port, args.busy_s)
                    rows[scenario].append(got)
                    print(f"run {i + 1} {scenario}: {got}", flush=True)
    print()
    print(
        "| scenario | fault -> finding in API (s) | fault -> blocked collective named (s) | fault -> page (s) | pages | target |"
    )
    print("|---|---|---|---|---|---|")
    for scenario, runs in rows.items():
        if scenario == "busy":
            kinds = "; ".join(
                ", ".join(f"{k} after {t:.1f} s" for k, t in g["kinds"]) or "none" for g in runs
            )
            print(
                f"| busy {args.busy_s:.0f} s | findings: {kinds} | – | – "
                f"| {', '.join(str(g['pages']) for g in runs)} (hang findings {', '.join(str(g['hangs']) for g in runs)}) | 0 pages |"
            )
            continue
        print(
            f"| {scenario} | {_med([g['finding'] for g in runs])} | {_med([g['named'] for g in runs])} "
            f"| **{_med([g['page'] for g in runs])}** | – | < 15 |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
