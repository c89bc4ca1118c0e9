"""Time from fault injection to the finding and to the alert, on a namespace cluster (issue #7).

    sudo .venv/bin/python bench/fault_injection.py [--repeat N] [--faults partition,stall,crash,mismatch]

Builds the cluster of tests/netns_cluster.py (two namespace hosts, two ranks of one 4-rank gloo job
each, a collector per host, the server on the bridge) and the real Prometheus + Alertmanager of
tests/ops_stack.py, then for each fault and repetition starts a fresh job, commits the fault on
rank 3 (host 1) and measures, from the injection:

- finding: the first open finding of the expected kind in GET /api/v1/jobs/{job}/findings
  (polled every 0.1 s);
- first: the first open finding of any kind that names a culprit (a lost rank is told sooner than
  the hang it causes);
- alert: the arrival of the firing alert for the job at the Alertmanager webhook.

stall_after is 10 s for the agents and the server; agents snapshot every 1 s, collectors push every
0.5 s, Prometheus scrapes and evaluates every 1 s. Needs root; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
sys.path.insert(0, str(ROOT / "tests"))
if TYPE_CHECKING:
    from tests.netns_cluster import (
        EXPECTED,
        FAULTS,
        FaultRun,
        NetnsCluster,
        await_alert,
        await_finding,
        inject_fault,
        netns_unavailable,
    )
    from tests.ops_stack import HangTarget, OpsStack
else:
    from netns_cluster import (
        EXPECTED,
        FAULTS,
        FaultRun,
        NetnsCluster,
        await_alert,
        await_finding,
        inject_fault,
        netns_unavailable,
    )
    from ops_stack import HangTarget, OpsStack

RULES = ROOT / "dashboards" / "alerts" / "flightdeck.rules.yml"
#: Targets of issue #7 (seconds from injection to finding and alert).
TARGETS = {"partition": 15.0, "stall": 15.0, "crash": 5.0, "mismatch": 5.0}


def first_culprit_s(cluster: NetnsCluster, run: FaultRun) -> float | None:
    """Seconds from injection to the earliest-opened finding naming a culprit (from its opened_at)."""
    doc = cluster.api(f"/api/v1/jobs/{run.job.spec.job}/findings") or {}
    opened = [
        float(row["opened_at_s"]) for row in doc.get("findings", []) if row["finding"].get("culprit_ranks")
    ]
    if not opened:
        return None
    # opened_at is the server's wall clock; the injection is monotonic: convert through now.
    offset = time.time() - time.monotonic()
    return min(opened) - (run.injected_at + offset)


def main() -> int:
    """Run every fault `--repeat` times and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per fault")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated faults to run")
    args = parser.parse_args()
    reason = netns_unavailable()
    if reason is not None:
        print(f"cannot build a namespace cluster: {reason}", file=sys.stderr)
        return 2
    faults = [f for f in args.faults.split(",") if f]
    rows: dict[str, list[tuple[float, float | None, float]]] = {f: [] for f in faults}
    with tempfile.TemporaryDirectory(prefix="fd-fault-bench-") as tmp:
        work = Path(tmp)
        with NetnsCluster(work / "cluster", hosts_n=2, stall_after_s=10.0) as cluster:
            target = HangTarget(f"{cluster.bridge_ip}:{cluster.port}", "/metrics", lambda: None)
            with OpsStack(rule_files=[RULES], targets=[target], workdir=work / "ops") as ops:
                ops.wait_for_targets_up(timeout=60)
                ops.wait_for_alertmanager_discovered(timeout=60)
                for i in range(args.repeat):
                    for fault in faults:
                        run = inject_fault(cluster, fault, f"bench-{fault}-{uuid.uuid4().hex[:6]}")
                        try:
                            await_finding(cluster, run, timeout_s=90)
                            await_alert(ops.webhook, run, timeout_s=90)
                            first = first_culprit_s(cluster, run)
                        finally:
                            if fault == "partition":
                                cluster.set_link(run.job.hosts[3], up=True)
                            cluster.end_job(run.job)
                        rows[fault].append((run.finding_s, first, run.alert_s))
                        print(
                            f"run {i + 1} {fault}: finding {run.finding_s:.2f} s, alert {run.alert_s:.2f} s"
                            f" ({run.finding['kind']}, culprits {run.finding['culprit_ranks']})",
                            flush=True,
                        )
    print()
    print(
        "| fault | finding kind | first culprit finding (s) | finding in API (s) | alert at webhook (s) | target (s) |"
    )
    print("|---|---|---|---|---|---|")
    for fault, got in rows.items():
        if not got:
            continue
        med = statistics.median
        firsts = [g[1] for g in got if g[1] is not None]
        first_s = f"{med(firsts):.1f}" if firsts else "–"
        spread = "" if len(got) == 1 else f" (max {max(g[0] for g in got):.1f})"
        print(
            f"| {fault} | {EXPECTED[fault][0]} | {first_s} | {med(g[0] for g in got):.1f}{spread} "
            f"| {med(g[2] for g in got):.1f} | < {TARGETS[fault]:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
