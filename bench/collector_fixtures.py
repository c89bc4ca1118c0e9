"""Real flight-recorder dumps for the collector benchmark: `python -m bench.collector_fixtures [DIR]`.

Runs a 2-process gloo job on 127.0.0.1 that performs a few thousand collectives from nested call
sites (so the ring of 2,000 entries wraps and every entry has Python frames), then each rank dumps
its ring with `_dump_fr_trace(includeStackTraces=True)` to `DIR/rank_<R>.pkl`. The result is cached:
a second call with the same directory returns at once. torch is imported only in the children.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO_ROOT / ".data" / "bench-fr"
#: Collectives per rank: more than the ring holds, so the dump is a wrapped, full ring.
OPS = 2300

_CHILD = r"""
import os, sys, torch, torch.distributed as dist

def leaf(t, i):
    if i % 3 == 0:
        dist.all_reduce(t)
    elif i % 3 == 1:
        dist.broadcast(t, src=0)
    else:
        dist.all_gather_into_tensor(torch.empty(t.numel() * dist.get_world_size()), t)

def sync_grads(t, i):
    leaf(t, i)

def train_step(t, i):
    sync_grads(t, i)

dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
t = torch.ones(64)
for i in range(int(os.environ["OPS"])):
    train_step(t, i)
dist.barrier()
data = torch._C._distributed_c10d._dump_fr_trace(
    includeCollectives=True, includeStackTraces=True, onlyActive=False
)
out = os.path.join(os.environ["OUT"], f"rank_{dist.get_rank()}.pkl")
with open(out + ".tmp", "wb") as f:
    f.write(data)
os.replace(out + ".tmp", out)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def real_dumps(directory: Path = DEFAULT_DIR, *, timeout_s: float = 180.0) -> list[Path]:
    """The two ranks' 2,000-entry dumps with frames, generating them on first use."""
    paths = [directory / f"rank_{r}.pkl" for r in range(2)]
    if all(p.exists() for p in paths):
        return paths
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE="2",
        OPS=str(OPS),
        OUT=str(directory),
        OMP_NUM_THREADS="1",
        TORCH_FR_BUFFER_SIZE="2000",
    )
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], env=dict(env, RANK=str(r))) for r in range(2)]
    try:
        for p in procs:
            if p.wait(timeout=timeout_s) != 0:
                raise RuntimeError(f"dump job failed with exit code {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return paths


if __name__ == "__main__":
    for path in real_dumps(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR):
        print(path, path.stat().st_size)
