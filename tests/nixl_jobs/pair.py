"""A real NIXL producer for the telemetry reader tests: two agents, WRITE and READ over loopback.

Run by `tests/test_nixl_live.py` in a subprocess with telemetry switched on through the environment
(`NIXL_TELEMETRY_DIR` for ring files, or `NIXL_TELEMETRY_EXPORTER=prometheus_mp` with
`NIXL_TELEMETRY_MULTIPROC_DIR`) and `UCX_TLS=tcp,sm,self UCX_NET_DEVICES=lo`, which UCX needs to run
without RDMA hardware.

The job runs in two phases. After each it waits for NIXL's telemetry flush, prints one JSON line
with the cumulative totals it caused (the test's ground truth), and waits for a line on stdin, so
the test can read the telemetry while the process (the writer) is still alive. Report lines start
with `PAIR-REPORT `; other stdout lines are NIXL's logging.

Phase 1: both agents register one DRAM buffer; the initiator posts `--writes` WRITEs and `--reads`
READs of `--size` bytes each. Phase 2: `--writes2` more WRITEs, then (with `--fail`) one transfer
posted on a handle whose remote agent was removed, which NIXL refuses with NIXL_ERR_NOT_FOUND and
counts as `agent_err_not_found`; then the initiator deregisters its buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

try:
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:  # releases before 1.4 ship only the nixl_cu12 package, no `nixl` shim
    from nixl_cu12._api import nixl_agent, nixl_agent_config

#: Marks our report lines: NIXL's Python logging also writes to stdout.
REPORT_PREFIX = "PAIR-REPORT "
#: NIXL flushes its in-process staging queue every NIXL_TELEMETRY_RUN_INTERVAL (100 ms by default).
FLUSH_WAIT_S = 0.4


def _post(agent: Any, handle: Any) -> str:
    """Post a transfer and spin until it leaves the in-progress state; returns DONE or ERR."""
    state: str = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    return state


def _checkpoint(report: dict[str, Any], *, wait: bool) -> None:
    """Print the cumulative totals, then block until the test says go on (a line on stdin)."""
    time.sleep(FLUSH_WAIT_S)
    print(REPORT_PREFIX + json.dumps(report, sort_keys=True), flush=True)
    if wait:
        sys.stdin.readline()


def main(argv: list[str] | None = None) -> int:
    """Run the two phases; exit status 0 when every transfer ended as planned."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, default=4096, help="bytes per transfer")
    p.add_argument("--writes", type=int, default=3)
    p.add_argument("--reads", type=int, default=2)
    p.add_argument("--writes2", type=int, default=2)
    p.add_argument("--fail", action="store_true", help="post one transfer to a removed remote agent")
    p.add_argument("--no-wait", action="store_true", help="do not wait for stdin between phases")
    p.add_argument("--prefix", default="", help="prefix of both agent names")
    args = p.parse_args(argv)

    initiator_name = f"{args.prefix}initiator"
    target_name = f"{args.prefix}target"
    region = 1 << 16
    if args.size > region:
        p.error(f"--size must be at most {region}")

    config = nixl_agent_config(backends=["UCX"], capture_telemetry=True)
    initiator = nixl_agent(initiator_name, config)
    target = nixl_agent(target_name, config)
    src = np.arange(region, dtype=np.uint8)
    dst = np.zeros(region, dtype=np.uint8)
    src_reg = initiator.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    target.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    initiator.add_remote_agent(target.get_agent_metadata())
    local = initiator.get_xfer_descs([(src.ctypes.data, args.size, 0)], "DRAM")
    remote = target.get_xfer_descs([(dst.ctypes.data, args.size, 0)], "DRAM")

    def run(op: str, n: int) -> None:
        handle = initiator.initialize_xfer(op, local, remote, target_name)
        for _ in range(n):
            state = _post(initiator, handle)
            if state != "DONE":
                raise SystemExit(f"{op} ended {state}")
        initiator.release_xfer_handle(handle)

    run("WRITE", args.writes)
    run("READ", args.reads)
    if not np.array_equal(src[: args.size], dst[: args.size]):
        raise SystemExit("WRITE did not land in the target buffer")
    report: dict[str, Any] = {
        "phase": 1,
        "pid": os.getpid(),
        "initiator": initiator_name,
        "target": target_name,
        "region_bytes": region,
        "tx_bytes": args.writes * args.size,
        "rx_bytes": args.reads * args.size,
        "tx_requests": args.writes,
        "rx_requests": args.reads,
        "memory_registered_bytes": region,
        "memory_deregistered_bytes": 0,
        "errors": {},
    }
    _checkpoint(report, wait=not args.no_wait)

    run("WRITE", args.writes2)
    report.update(
        phase=2,
        tx_bytes=(args.writes + args.writes2) * args.size,
        tx_requests=args.writes + args.writes2,
    )
    if args.fail:
        stale = initiator.initialize_xfer("WRITE", local, remote, target_name)
        initiator.remove_remote_agent(target_name)
        try:
            state = _post(initiator, stale)
        except Exception as e:  # NIXL raises nixlNotFoundError for a stale handle
            state = type(e).__name__
        if state == "DONE":
            raise SystemExit("the transfer to a removed agent succeeded")
        report["errors"] = {"not_found": 1}
        report["failed_post"] = state
    initiator.deregister_memory(src_reg)
    report["memory_deregistered_bytes"] = region
    _checkpoint(report, wait=not args.no_wait)
    return 0


if __name__ == "__main__":
    sys.exit(main())
