"""Cost of the agent's configuration report (issue 9), which every snapshot's sidecar carries.

A 1-rank gloo job with `--groups` extra process groups; times the first report (torch / NCCL /
Python versions, looked up once per process) and the per-snapshot rest (FR settings, every
group's backend and timeout, the TORCH_* / NCCL_* env scan), and prints the report's size.

    python bench/agent_config.py [--groups 8] [--reports 2000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import time
from pathlib import Path


def main() -> None:
    """Run the measurement and print one line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--reports", type=int, default=2000)
    args = parser.parse_args()
    import torch.distributed as dist

    from flightdeck.agent import Agent, AgentConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    for i in range(args.groups):
        dist.new_group([0], group_desc=f"g{i}")
    agent = Agent(AgentConfig(spool_dir=Path("/nonexistent")))
    t = time.perf_counter()
    agent._config()
    first = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(args.reports):
        agent._config()
    per = (time.perf_counter() - t) / args.reports
    size = len(json.dumps(agent.config_report))
    print(
        f"groups={args.groups + 1} first={first * 1e3:.2f} ms per_snapshot={per * 1e6:.0f} us "
        f"report={size} bytes changes={agent.config_changes}"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
