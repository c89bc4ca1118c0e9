"""Fault -> finding on loopback: run `flightdeck demo --scenario X --exit` and collect its times.

    python -m bench.demo_scenarios [--repeat 2] [--stall-after 10] [--scenario stall ...]

Each run is a fresh demo: its own server (SQLite), collector(s) and a 4-rank gloo job with the agent.
Prints one line per run and the median per scenario; docs/performance.md records the results.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys

from flightdeck.demo.cmd import SCENARIOS
from flightdeck.demo.ranks import free_port

_TIMES = re.compile(r"^fault -> finding: ([\d.]+) s \(blocked collective named after ([\d.]+) s", re.M)
_BACK = re.compile(r"^host-b's data arrived ([\d.]+) s after the link returned", re.M)


def run_once(scenario: str, stall_after: float, extra: list[str]) -> tuple[float, float, float | None]:
    """One demo run: (fault -> first finding, fault -> blocked collective named, partition data back)."""
    cmd = [sys.executable, "-m", "flightdeck", "demo", "--scenario", scenario, "--exit"]
    cmd += ["--port", str(free_port()), "--stall-after", str(stall_after), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = _TIMES.search(res.stdout)
    if res.returncode != 0 or m is None:
        raise SystemExit(f"demo {scenario} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    back = _BACK.search(res.stdout)
    return float(m[1]), float(m[2]), float(back[1]) if back else None


def main() -> int:
    """Run the scenarios and print the measured times."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", nargs="*", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--stall-after", type=float, default=10.0)
    p.add_argument("--partition-s", type=float, default=20.0)
    args = p.parse_args()
    for scenario in args.scenario:
        extra = ["--partition-s", str(args.partition_s)] if scenario == "partition" else []
        runs = [run_once(scenario, args.stall_after, extra) for _ in range(args.repeat)]
        for first, named, back in runs:
            tail = f", host-b data back {back:.1f} s after the link" if back is not None else ""
            print(
                f"{scenario:9s} fault->finding {first:5.1f} s, blocked collective named {named:5.1f} s{tail}"
            )
        med = statistics.median(r[1] for r in runs)
        print(
            f"{scenario:9s} median fault->blocked collective named: {med:.1f} s (stall_after {args.stall_after} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
