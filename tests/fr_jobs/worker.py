"""One rank of a scenario job: `python -m tests.fr_jobs.worker --scenario NAME` (env:// rendezvous).

Run it under the agent's launcher (`python -m flightdeck.agent -m tests.fr_jobs.worker ...`), as a
torchrun user would, or with `--agent inject-failing` to start an agent whose dump function always
fails. The call sites are nested like a real training loop (train_step -> sync_grads ->
all_reduce) so that the frames in the dumps look like the ones users will see.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.fr_jobs.scenarios import P2P_KINDS, PAIRS, Fault, Op, Scenario, get

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32}


class Job:
    """The state of one rank: its groups and the model-ish tensors it computes with."""

    def __init__(self, scenario: Scenario, rank: int, compute_s: float, leave_s: float) -> None:
        self.scenario = scenario
        self.rank = rank
        self.compute_s = compute_s
        self.leave_s = leave_s
        self.weights = torch.randn(32, 32)
        self.pairs: dict[str, Any] = {}
        #: The scenario layout's groups this rank is in, by desc prefix ("tp", "pp", "dp").
        self.layout: dict[str, Any] = {}
        #: Called once after the program's first op (raw periodic dumps start there).
        self.after_first_op: Callable[[], None] | None = None

    # -- the "model" --

    def forward_backward(self, index: int) -> None:
        """A little real compute, then a pause standing in for the rest of the step."""
        x = torch.randn(16, 32)
        for _ in range(4):
            x = torch.tanh(x @ self.weights)
        # Uneven work: a rank's extra compute comes at every fourth op, a different one per rank
        # (like batches of uneven length), so no rank is late to most collectives.
        extra = self.scenario.extra_compute_s.get(self.rank, 0.0) if (index + self.rank) % 4 == 0 else 0.0
        time.sleep(self.compute_s + extra)

    def group(self, op: Op) -> Any:
        """The process group an op runs in on this rank (None: the default group)."""
        if op.group == "world":
            return None
        if op.group != "pair":
            return self.layout[op.group]
        for desc, members in PAIRS:
            if self.rank in members:
                return self.pairs[desc]
        raise ValueError(f"rank {self.rank} is in no pair")

    # -- nested call sites --

    def train_step(self, index: int, op: Op, fault: Fault | None = None) -> None:
        """One program op: compute, then the collective through a realistic call chain."""
        self.forward_backward(index)
        delay = self.scenario.straggler_delay_s.get(self.rank)
        if delay:
            time.sleep(delay)  # the straggler is late to every collective
        group = self.group(op)
        if op.kind == "all_reduce":
            self.sync_grads(op, group)
        elif op.kind == "broadcast":
            self.broadcast_params(op, group)
        elif op.kind == "all_gather":
            self.gather_metrics(op, group)
        elif op.kind in P2P_KINDS:
            self.hand_on_activations(op, group, fault)
        elif op.kind == "all_to_all":
            self.dispatch_tokens(op, group, fault)
        elif op.kind == "reduce_scatter":
            self.shard_grads(op, group)
        elif op.kind in ("coalesced_all_reduce", "coalesced_all_gather", "all_reduce_coalesced"):
            self.coalesced_step(op, group)
        else:
            self.checkpoint_barrier(group)

    def hand_on_activations(self, op: Op, group: Any, fault: Fault | None) -> None:
        """Send to the next member of the group and receive from the previous one (batched p2p)."""
        members = (
            dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        )
        idx, n = members.index(self.rank), len(members)
        ring = op.kind == "p2p_ring"
        send = torch.full((op.numel,), float(self.rank))
        recv = torch.empty(op.numel)
        ops = []
        if ring or idx > 0:
            ops.append(dist.P2POp(dist.irecv, recv, members[(idx - 1) % n], group=group))
        if ring or idx < n - 1:
            dst = members[(idx + 1) % n]
            if fault is not None and fault.action == "wrong_peer":
                dst = members[(idx + 2) % n]
            if fault is None or fault.action != "skip_send":
                ops.append(dist.P2POp(dist.isend, send, dst, group=group))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()

    def dispatch_tokens(self, op: Op, group: Any, fault: Fault | None) -> None:
        """all_to_all_single with uneven splits that every pair of ranks agrees on."""
        n = dist.get_world_size(group)
        idx = dist.get_group_rank(group, self.rank) if group is not None else self.rank
        in_splits = [op.numel * (1 + (2 * idx + j) % 3) for j in range(n)]
        out_splits = [op.numel * (1 + (2 * j + idx) % 3) for j in range(n)]
        if fault is not None and fault.action == "short_send":
            in_splits[(idx + 1) % n] -= int(fault.value or 0)
        out = torch.empty(sum(out_splits))
        dist.all_to_all_single(out, torch.ones(sum(in_splits)), out_splits, in_splits, group=group)

    def shard_grads(self, op: Op, group: Any) -> None:
        """reduce_scatter the gradients into this rank's shard."""
        n = dist.get_world_size(group)
        shard = torch.empty(op.numel)
        dist.reduce_scatter_tensor(shard, torch.ones(op.numel * n), group=group)

    def coalesced_step(self, op: Op, group: Any) -> None:
        """Several tensors in one collective: coalescing manager or the *_coalesced API."""
        from torch.distributed.distributed_c10d import _coalescing_manager

        a, b = torch.ones(op.numel), torch.ones(op.numel * 2)
        if op.kind == "all_reduce_coalesced":
            dist.all_reduce_coalesced([a, b], group=group)
            return
        n = dist.get_world_size(group)
        with _coalescing_manager(group=group, async_ops=True) as cm:
            if op.kind == "coalesced_all_reduce":
                dist.all_reduce(a, group=group)
                dist.all_reduce(b, group=group)
            else:
                dist.all_gather_into_tensor(torch.empty(n * a.numel()), a, group=group)
                dist.all_gather_into_tensor(torch.empty(n * b.numel()), b, group=group)
        cm.wait()

    def sync_grads(self, op: Op, group: Any) -> None:
        """Average a gradient bucket across the group."""
        bucket = torch.ones(op.numel, dtype=_DTYPES[op.dtype])
        reduce_bucket(bucket, group)

    def broadcast_params(self, op: Op, group: Any) -> None:
        """Broadcast parameters from the group's first member."""
        params = torch.zeros(op.numel, dtype=_DTYPES[op.dtype])
        src = 0 if group is None else min(dist.get_process_group_ranks(group))
        dist.broadcast(params, src=src, group=group)

    def gather_metrics(self, op: Op, group: Any) -> None:
        """Gather per-rank metrics into one tensor."""
        size = dist.get_world_size(group)
        local = torch.full((op.numel,), float(self.rank), dtype=_DTYPES[op.dtype])
        out = torch.empty(size * op.numel, dtype=_DTYPES[op.dtype])
        dist.all_gather_into_tensor(out, local, group=group)

    def checkpoint_barrier(self, group: Any) -> None:
        """Wait for every rank before a (pretend) checkpoint."""
        dist.barrier(group=group)

    # -- the program --

    def run(self) -> bool:
        """Run the scenario's program with this rank's faults; False when this rank left early."""
        faults = {f.at: f for f in self.scenario.faults if f.rank == self.rank}
        for index, op in enumerate(self.scenario.ops):
            fault = faults.get(index)
            if fault is None:
                self.train_step(index, op)
            elif self.commit(index, op, fault):
                return False
            if index == 0 and self.after_first_op is not None:
                self.after_first_op()
        return True

    def commit(self, index: int, op: Op, fault: Fault) -> bool:
        """Do the faulty thing instead of op `index`; True when this rank leaves the program."""
        print(f"rank {self.rank}: fault {fault.action} at op {index}", file=sys.stderr, flush=True)
        if fault.action == "skip":
            # A rank that skipped a collective usually goes on with something else; staying away
            # past the group timeout makes the others hang until they time out.
            time.sleep(self.leave_s)
            return True
        if fault.action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.action == "late":
            time.sleep(float(fault.value or 0))
        elif fault.action == "kill_inside":
            # The main thread is about to block inside the collective; this one ends the process
            # from there, as a launcher tearing the job down or the OOM killer would.
            killer = threading.Timer(float(fault.value or 0), os.kill, (os.getpid(), signal.SIGKILL))
            killer.daemon = True
            killer.start()
        if fault.action == "op":
            op = Op(str(fault.value), op.group, op.numel, op.dtype)  # type: ignore[arg-type]
        elif fault.action == "numel":
            op = Op(op.kind, op.group, int(fault.value or 0), op.dtype)
        elif fault.action == "dtype":
            op = Op(op.kind, op.group, op.numel, str(fault.value))
        self.train_step(index, op, fault)
        return False


def reduce_bucket(bucket: torch.Tensor, group: Any) -> None:
    """All-reduce one gradient bucket (the innermost user frame of most entries)."""
    dist.all_reduce(bucket, group=group)


_DUMP_LOCK = threading.Lock()


def write_raw_dump(rank: int) -> None:
    """Dump the flight recorder the way a user without Flightdeck would: PyTorch's own dump calls,
    pickle and JSON, into `$FDTEST_RAW_DIR/{pickle,json}/` under PyTorch's default file name."""
    import torch._C._distributed_c10d as c10d

    root = Path(os.environ["FDTEST_RAW_DIR"])
    # Private functions without type stubs (as the agent reaches them, by name).
    pickled: bytes = c10d._dump_fr_trace(True, True, False)  # type: ignore[attr-defined]
    as_json: bytes = c10d._dump_fr_trace_json(True, False)  # type: ignore[attr-defined]
    blobs = (
        ("pickle", f"comm_lib_trace_rank_{rank}", pickled),
        ("json", f"comm_lib_trace_rank_{rank}.json", as_json),
    )
    with _DUMP_LOCK:  # the periodic thread and the exit path write the same files
        for sub, name, data in blobs:
            (root / sub).mkdir(parents=True, exist_ok=True)
            tmp = root / sub / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.rename(root / sub / name)
    print(f"rank {rank}: raw dump written", file=sys.stderr, flush=True)


def _dump_every(rank: int, interval_s: float) -> None:
    """Dump every `interval_s` (overwriting), as a user's periodic dump thread would."""
    while True:
        time.sleep(interval_s)
        write_raw_dump(rank)


def main(argv: list[str] | None = None) -> int:
    """Join the job (env://), create the scenario's groups, run its program."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--compute-s", type=float, default=0.01)
    parser.add_argument("--leave-s", type=float, default=10.0)
    parser.add_argument("--pg-timeout-s", type=float, default=6.0)
    parser.add_argument("--pair-timeout-s", type=float, default=None)
    parser.add_argument("--agent", choices=["launcher", "inject-failing", "none"], default="launcher")
    args = parser.parse_args(argv)
    scenario = get(args.scenario)
    if scenario.dump_mode == "exit":
        # One CPU per rank (as ranks pinned to cores run): gloo's worker thread and the main
        # thread then share it, and the main thread, woken when the last barrier completes, is
        # often scheduled before the worker thread marks the barrier retired: the dump at exit
        # then shows the race that gloo's asynchronous completion flag allows.
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(os.environ.get("RANK", "0")) % len(cpus)]})
    torch.set_num_threads(1)
    timeout = timedelta(seconds=args.pg_timeout_s)
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    if args.agent == "inject-failing":
        from flightdeck.agent import Agent, AgentConfig

        def failing_dump(include_stack_traces: bool) -> bytes:
            raise RuntimeError("injected dump failure")

        agent = Agent(AgentConfig.from_env(), dump_fn=failing_dump)
        agent.start()
    job = Job(scenario, rank, args.compute_s, args.leave_s)
    if scenario.pairs:
        # Every rank creates every group, in the same order (new_group's contract); new_group does
        # not inherit the init_process_group timeout, so pass it.
        pair_timeout = timedelta(seconds=args.pair_timeout_s) if args.pair_timeout_s else timeout
        for desc, members in PAIRS:
            job.pairs[desc] = dist.new_group(list(members), timeout=pair_timeout, group_desc=desc)
    for desc, members in scenario.layout:
        made = dist.new_group(list(members), timeout=timeout, group_desc=desc)
        if rank in members:
            job.layout[desc[:2]] = made
    json_dir = os.environ.get("FDTEST_JSON_DIR")
    if scenario.dump_mode == "timed":
        at = scenario.dump_at_s[rank]
        dumper = threading.Timer(at, write_raw_dump, (rank,))
        dumper.daemon = True
        dumper.start()
    elif scenario.dump_mode == "periodic":
        # The first dump with stacks symbolizes them (seconds, more on a loaded machine): taken
        # after the first op, before the periodic thread starts, so that its dumps keep up.
        def start_dumping() -> None:
            write_raw_dump(rank)
            threading.Thread(target=_dump_every, args=(rank, 0.5), daemon=True).start()

        job.after_first_op = start_dumping
    try:
        finished = job.run()
        time.sleep(scenario.settle_s)
    except Exception:
        if scenario.dump_mode == "periodic":
            write_raw_dump(rank)  # what a user's exception handler would keep
        raise
    finally:
        if json_dir and scenario.dump_mode == "agent":
            # PyTorch's JSON dump of the same ring, at the moment the agent takes its final snapshot.
            data = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json")(True, False)  # noqa: B009 (not in the stubs)
            os.makedirs(json_dir, exist_ok=True)
            with open(os.path.join(json_dir, f"r{rank}.json"), "wb") as f:
                f.write(data)
    if scenario.dump_mode == "periodic":
        write_raw_dump(rank)
    if scenario.dump_mode == "exit" and finished:
        write_raw_dump(rank)  # at once: the last collective has just returned
    if scenario.dump_mode == "timed":
        dumper.join()
    if args.agent == "inject-failing":
        print(f"rank {rank}: agent snapshots written: {agent.snapshots_written}", file=sys.stderr, flush=True)
    if finished:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
