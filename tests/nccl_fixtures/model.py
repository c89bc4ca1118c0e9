"""A model of what ProcessGroupNCCL's flight recorder writes, for building NCCL-shaped dumps on a
machine without a GPU.

The rules follow PyTorch's sources (FlightRecorder, ProcessGroupNCCL, the tests of the NCCL trace
and of the analyzer), as summarized in docs/comparison.md ("NCCL dumps: what differs from gloo"):

- a collective bumps its group's `collective_seq_id` and `op_id`; its entry carries the group's
  current `p2p_seq_id`;
- a send/recv bumps `p2p_seq_id` and `op_id`, keeps `collective_seq_id`, is named
  `nccl:send <me>-><peer>` / `nccl:recv <me><-<peer>` with group-local ranks, and has `is_p2p`;
- `batch_isend_irecv` records every op with one shared `p2p_seq_id` (state never updated: they stay
  `scheduled`), then one `nccl:coalesced` entry (`is_p2p`, no sizes) that carries the batch's state;
- `_coalescing_manager` around non-fast-path collectives records every op with one shared
  `collective_seq_id`, then a `nccl:coalesced` entry with that seq id and the group's state;
  fast-path coalescing records one `nccl:allreduce_coalesced` entry with several input sizes;
- with `TORCH_NCCL_ENABLE_TIMING=1` a launched kernel is `started` (start event) with
  `time_discovered_started_ns`, a finished one `completed` with `duration_ms`; without it states go
  `scheduled` -> `completed` and `pg_status.last_started_collective` stays -1;
- torch 2.15's `nccl2` backend does not record by itself: a flight-recorder hook does, with no CUDA
  events, so states stay `scheduled` and `retired` is the completion signal (as on gloo).

Nothing here runs NCCL: a case states which op each rank blocks in, and the dump is what the
recorder would hold at that moment. Times are fixed, so the output is byte-for-byte reproducible.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

#: 2026-11-20T10:00:00Z: every case's job starts here (dumps copied later look old, as real ones do).
T0_NS = 1_795_168_800 * 1_000_000_000
#: Spacing of one rank's successive ops, and the extra delay of each rank (arrival skew).
STEP_NS = 20_000_000
SKEW_NS = 37_000
KERNEL_NS = 2_000_000
#: ProcessGroupNCCL's default timeout (10 min); the watchdog dumps once it has passed.
TIMEOUT_MS = 600_000
VERSION = "2.10"
NCCL_VERSION = "2.27.5"
TORCH_DIR = "/usr/local/lib/python3.12/site-packages/torch/distributed"
TRAIN = "/workspace/train.py"

Backend = Literal["nccl", "nccl2"]


@dataclass(frozen=True, slots=True)
class Coll:
    """A collective: `op` as ProcessGroupNCCL names it (`all_reduce`, `_allgather_base`, ...)."""

    op: str
    sizes: tuple[tuple[int, ...], ...] = ((1024,),)
    dtype: str = "Float"
    group: str = "0"
    #: Output sizes when they differ from the input's (all_gather: world x input).
    out: tuple[tuple[int, ...], ...] | None = None
    site: str = "train_step"
    #: A mark the case's expected verdict points at (the faulty op).
    mark: str = ""


@dataclass(frozen=True, slots=True)
class P2P:
    """One send or recv with a peer (global rank)."""

    kind: Literal["send", "recv"]
    peer: int
    sizes: tuple[tuple[int, ...], ...] = ((1024,),)
    dtype: str = "Float"
    group: str = "0"
    site: str = "pipeline_step"
    mark: str = ""


@dataclass(frozen=True, slots=True)
class Batch:
    """`batch_isend_irecv(ops)`: one NCCL group, recorded op by op plus a `coalesced` entry."""

    ops: tuple[P2P, ...]
    mark: str = ""


@dataclass(frozen=True, slots=True)
class Coalesced:
    """`_coalescing_manager` around collectives NCCL cannot fuse (the slow path)."""

    ops: tuple[Coll, ...]
    mark: str = ""


Op = Coll | P2P | Batch | Coalesced


@dataclass(frozen=True, slots=True)
class Group:
    """A process group: its name (`process_group[0]`), description and global member ranks."""

    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RankPlan:
    """What one rank did: its ops in order, the op it blocks in (never completes; nothing after it
    is enqueued), and whether it wrote a dump at all (a dead rank writes none)."""

    ops: tuple[Op, ...]
    stuck_at: int | None = None
    dumps: bool = True


@dataclass(slots=True)
class _Counters:
    coll: int = 0
    p2p: int = 0
    op_id: int = 0


@dataclass(slots=True)
class _Recorder:
    """One rank's flight recorder while the plan runs."""

    rank: int
    groups: dict[str, Group]
    backend: Backend
    timing: bool
    entries: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, _Counters] = field(default_factory=dict)
    pg_ids: dict[str, int] = field(default_factory=dict)
    status: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # pg_id is the per-process construction index of the groups this rank is a member of.
        for g in self.groups.values():
            if self.rank in g.ranks:
                self.pg_ids[g.name] = len(self.pg_ids)
                self.counters[g.name] = _Counters()
                self.status[g.name] = [-1, -1, -1]

    def _local(self, group: str, rank: int) -> int:
        return self.groups[group].ranks.index(rank)

    def entry(
        self,
        *,
        group: str,
        name: str,
        ins: tuple[tuple[int, ...], ...],
        outs: tuple[tuple[int, ...], ...],
        dtype: str,
        is_p2p: bool,
        created: int,
        outcome: Literal["completed", "stuck", "untracked"],
        site: str,
        frames_of: str,
    ) -> None:
        """Append one entry. `untracked`: an op inside a coalesced group, whose state is never updated."""
        c = self.counters[group]
        pg = self.groups[group]
        e: dict[str, Any] = {
            "record_id": len(self.entries),
            "pg_id": self.pg_ids[group],
            "process_group": (pg.name, pg.desc),
            "collective_seq_id": c.coll,
            "p2p_seq_id": c.p2p,
            "op_id": c.op_id,
            "profiling_name": f"{self.backend}:{_HOOK_NAMES.get(name, name) if self.backend == 'nccl2' else name}",
            "time_created_ns": created,
            "input_sizes": [list(s) for s in ins],
            "input_dtypes": [dtype] * len(ins),
            "output_sizes": [list(s) for s in outs],
            "output_dtypes": [dtype] * len(outs),
            "state": "scheduled",
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None,
            "retired": False,
            "timeout_ms": TIMEOUT_MS,
            "is_p2p": is_p2p,
            "thread_id": str(140_000_000_000_000 + self.rank),
            "thread_name": "pt_main_thread",
            "frames": _frames(frames_of, site),
        }
        cuda_events = self.backend == "nccl"  # the nccl2 hook records without CUDA events
        started = created + 30_000 * (1 + self.rank)
        if outcome == "completed":
            e["retired"] = True
            if cuda_events:
                e["state"] = "completed"
                e["time_discovered_completed_ns"] = started + KERNEL_NS
                if self.timing:
                    e["time_discovered_started_ns"] = started
                    e["duration_ms"] = KERNEL_NS / 1e6
        elif outcome == "stuck" and cuda_events and self.timing:
            e["state"] = "started"
            e["time_discovered_started_ns"] = started
        self.entries.append(e)
        if outcome != "untracked" and not is_p2p:
            # ProcessGroupNCCL counts collectives here; the nccl2 hook counts op ids.
            n = c.coll if cuda_events else c.op_id
            st = self.status[group]
            st[0] = n
            if cuda_events and self.timing and e["state"] in ("started", "completed"):
                st[1] = n
            if outcome == "completed":
                st[2] = n

    def run(self, op: Op, created: int, stuck: bool) -> None:
        outcome: Literal["completed", "stuck"] = "stuck" if stuck else "completed"
        if isinstance(op, Coll):
            c = self.counters[op.group]
            c.coll += 1
            c.op_id += 1
            self.entry(
                group=op.group, name=op.op, ins=op.sizes, outs=op.out or op.sizes, dtype=op.dtype,
                is_p2p=False, created=created, outcome=outcome, site=op.site, frames_of=_api(op.op),
            )  # fmt: skip
        elif isinstance(op, P2P):
            c = self.counters[op.group]
            c.p2p += 1
            c.op_id += 1
            self.entry(
                group=op.group, name=self._p2p_name(op), ins=op.sizes, outs=op.sizes, dtype=op.dtype,
                is_p2p=True, created=created, outcome=outcome, site=op.site, frames_of=op.kind,
            )  # fmt: skip
        elif isinstance(op, Batch):
            group = op.ops[0].group
            c = self.counters[group]
            c.p2p += 1
            for p in op.ops:
                c.op_id += 1
                self.entry(
                    group=group, name=self._p2p_name(p), ins=p.sizes, outs=p.sizes, dtype=p.dtype,
                    is_p2p=True, created=created, outcome="untracked", site=p.site,
                    frames_of="batch_isend_irecv",
                )  # fmt: skip
            self.entry(
                group=group, name="coalesced", ins=(), outs=(), dtype="Float", is_p2p=True,
                created=created, outcome=outcome, site=op.ops[0].site, frames_of="batch_isend_irecv",
            )  # fmt: skip
            self.entries[-1]["input_dtypes"] = []
            self.entries[-1]["output_dtypes"] = []
        else:
            group = op.ops[0].group
            c = self.counters[group]
            c.coll += 1
            for k in op.ops:
                c.op_id += 1
                self.entry(
                    group=group, name=k.op, ins=k.sizes, outs=k.out or k.sizes, dtype=k.dtype,
                    is_p2p=False, created=created, outcome="untracked", site=k.site, frames_of=_api(k.op),
                )  # fmt: skip
            self.entry(
                group=group, name="coalesced", ins=(), outs=(), dtype="Float", is_p2p=False,
                created=created, outcome=outcome, site=op.ops[0].site, frames_of="_coalescing_manager",
            )  # fmt: skip
            self.entries[-1]["input_dtypes"] = []
            self.entries[-1]["output_dtypes"] = []

    def _p2p_name(self, p: P2P) -> str:
        me, peer = self._local(p.group, self.rank), self._local(p.group, p.peer)
        return f"send {me}->{peer}" if p.kind == "send" else f"recv {me}<-{peer}"


#: How the nccl2 flight-recorder hook spells ops (its HookOpName strings), where ProcessGroupNCCL
#: spells them otherwise.
_HOOK_NAMES = {
    "all_reduce": "allreduce",
    "_all_gather_base": "allgather",
    "_reduce_scatter_base": "reduce_scatter",
}


def _api(op: str) -> str:
    """The torch.distributed function a user calls for a ProcessGroupNCCL op name."""
    return {
        "all_reduce": "all_reduce",
        "_all_gather_base": "all_gather_into_tensor",
        "_reduce_scatter_base": "reduce_scatter_tensor",
        "allreduce_coalesced": "all_reduce_coalesced",
        "all_to_all": "all_to_all_single",
    }.get(op, op)


def _frames(api: str, site: str) -> list[dict[str, Any]]:
    """Innermost first: the torch.distributed call, its logging wrapper, then the user's code."""
    line = 40 + sum(map(ord, site)) % 120
    return [
        {"name": api, "filename": f"{TORCH_DIR}/distributed_c10d.py", "line": 2700 + len(api) * 7},
        {"name": "wrapper", "filename": f"{TORCH_DIR}/c10d_logger.py", "line": 81},
        {"name": site, "filename": TRAIN, "line": line},
        {"name": "main", "filename": TRAIN, "line": 212},
        {"name": "<module>", "filename": TRAIN, "line": 230},
    ]


def record(
    rank: int,
    plan: RankPlan,
    groups: dict[str, Group],
    *,
    backend: Backend = "nccl",
    timing: bool = True,
) -> tuple[dict[str, Any], int]:
    """The pickle-shaped dump of `rank` once it ran `plan`, and the time the dump was written (the
    watchdog's, one timeout after the op it blocks in, or shortly after the last op)."""
    rec = _Recorder(rank, groups, backend, timing)
    created = T0_NS
    blocked_since: int | None = None
    # Collectives keep the ranks in step: an op's time is set by how many collectives the rank ran
    # before it (not by its position in its own plan, which differs where ranks diverge); p2p ops
    # come early in a step, collectives half-way through it.
    n_coll = 0
    for i, op in enumerate(plan.ops):
        is_coll = isinstance(op, Coll | Coalesced)
        created = T0_NS + n_coll * STEP_NS + (STEP_NS // 2 if is_coll else 0) + rank * SKEW_NS
        n_coll += is_coll
        stuck = plan.stuck_at == i
        rec.run(op, created, stuck)
        if stuck:
            blocked_since = created
            break
    dumped = (
        blocked_since + TIMEOUT_MS * 1_000_000 if blocked_since is not None else created
    ) + 1_000_000_000
    pg_config = {
        g.name: {"name": g.name, "desc": g.desc, "ranks": json.dumps(list(g.ranks)).replace(",", ", ")}
        for g in groups.values()
        if rank in g.ranks
    }
    pg_status = {
        str(rec.pg_ids[name]): {
            "last_enqueued_collective": st[0],
            "last_started_collective": st[1],
            "last_completed_collective": st[2],
        }
        for name, st in rec.status.items()
    }
    dump = {
        "version": VERSION,
        "comm_lib_version": NCCL_VERSION,
        "pg_config": pg_config,
        "pg_status": pg_status,
        "entries": rec.entries,
    }
    if backend == "nccl":
        dump["nccl_comm_state"] = {}
    return dump, dumped


def as_json(dump: dict[str, Any]) -> dict[str, Any]:
    """The same dump as `_dump_nccl_trace_json` writes it: no frames, lists for tuples, string
    `pg_status` values, 0 for timestamps not recorded."""
    out = dict(dump)
    entries = []
    for e in dump["entries"]:
        j = {k: v for k, v in e.items() if k != "frames"}
        j["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            j[k] = e[k] or 0
        entries.append(j)
    out["entries"] = entries
    out["pg_status"] = {k: {f: str(v) for f, v in st.items()} for k, st in dump["pg_status"].items()}
    return out
