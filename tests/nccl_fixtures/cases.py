"""The NCCL fault classes: what each rank did, and the verdict that follows from that definition.

The expected verdict is derived from the definition alone (which rank does what, where it blocks),
never from running an analyzer on the dumps: `expected_seq` counts the group's collectives before
the op the case marks as the faulty one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.nccl_fixtures.model import P2P, Backend, Batch, Coalesced, Coll, Group, Op, RankPlan


@dataclass(frozen=True, slots=True)
class Case:
    """One job: its groups, what every rank did, and the verdict a correct analyzer gives."""

    name: str
    description: str
    world_size: int
    plans: dict[int, RankPlan]
    #: The root cause: kind, group, culprits; `mark` names the op it is about (its seq id is
    #: counted from the definition); None for a healthy job.
    kind: str | None = None
    culprit_ranks: tuple[int, ...] = ()
    group: str = "0"
    mark: str = ""
    op: str | None = None
    #: Other finding kinds the report must hold (consequences, missing dumps).
    also: tuple[str, ...] = ()
    groups: tuple[Group, ...] = ()
    backend: Backend = "nccl"
    timing: bool = True
    #: Rank whose plan holds the marked op (a rank that entered it).
    witness: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def all_groups(self) -> dict[str, Group]:
        """The default group plus the case's subgroups, in creation order."""
        out = {"0": Group("0", "default_pg", tuple(range(self.world_size)))}
        for g in self.groups:
            out[g.name] = g
        return out

    def expected_seq(self) -> int | None:
        """collective_seq_id of the marked op on the witness rank (None for p2p ops or no mark)."""
        if not self.mark:
            return None
        n = 0
        for op in self.plans[self.witness].ops:
            group = _group_of(op)
            if group == self.group and isinstance(op, Coll | Coalesced):
                n += 1
            if op.mark == self.mark:
                return n if isinstance(op, Coll | Coalesced) else None
        raise ValueError(f"{self.name}: no op marked {self.mark!r} on rank {self.witness}")

    def expected(self) -> dict[str, Any]:
        """The scenario.json `expected` block (same keys as tests/data/fr)."""
        if self.kind is None:
            return {"healthy": True, "kind": None, "process_group": None, "collective_seq_id": None,
                    "culprit_ranks": [], "op": None}  # fmt: skip
        return {
            "healthy": False,
            "kind": self.kind,
            "process_group": self.group,
            "collective_seq_id": self.expected_seq(),
            "culprit_ranks": sorted(self.culprit_ranks),
            "op": self.op,
            "also": list(self.also),
        }

    def to_json(self) -> dict[str, Any]:
        """The scenario.json document."""
        return {
            "name": self.name,
            "description": self.description,
            "world_size": self.world_size,
            "backend": self.backend,
            "timing": self.timing,
            "source": "synthetic NCCL-shaped dumps (tests/nccl_fixtures), no GPU run",
            "ranks_with_dump": sorted(r for r, p in self.plans.items() if p.dumps),
            "expected": self.expected(),
            **self.extra,
        }


def _group_of(op: Op) -> str:
    if isinstance(op, Coll | P2P):
        return op.group
    return op.ops[0].group


def _ar(n: int) -> list[Op]:
    """n gradient all_reduces of the default group."""
    return [Coll("all_reduce", site="sync_grads") for _ in range(n)]


def _same(world: int, ops: list[Op], **kw: Any) -> dict[int, RankPlan]:
    return {r: RankPlan(tuple(ops), **kw) for r in range(world)}


def _skip_one(world: int, culprit: int) -> dict[int, RankPlan]:
    """Everybody runs 11 all_reduces; all but `culprit` block in the 12th, which it never calls."""
    plans = {}
    for r in range(world):
        ops = _ar(11)
        if r == culprit:
            plans[r] = RankPlan(tuple(ops))
        else:
            plans[r] = RankPlan((*ops, Coll("all_reduce", site="sync_grads", mark="fault")), stuck_at=11)
    return plans


def _diverge(world: int, culprit: int, bad: Coll) -> dict[int, RankPlan]:
    """Everybody blocks in the 12th collective; `culprit` called `bad` there instead of the all_reduce."""
    plans = {}
    for r in range(world):
        last = bad if r == culprit else Coll("all_reduce", site="sync_grads", mark="fault")
        plans[r] = RankPlan((*_ar(11), last), stuck_at=11)
    return plans


def _healthy() -> dict[int, RankPlan]:
    plans = {}
    for r in range(4):
        ops: list[Op] = []
        for _step in range(3):
            ops += _ar(2)
            ops.append(Coll("all_reduce", sizes=((64,),), group="1" if r < 2 else "2", site="tp_reduce"))
            # pipeline hand-off inside each pair: 0 -> 1 and 2 -> 3
            peer = r ^ 1
            ops.append(P2P("send" if r % 2 == 0 else "recv", peer, site="pipeline_step"))
        ops.append(Coll("_all_gather_base", sizes=((256,),), out=((1024,),), site="gather_metrics"))
        ring = Batch((P2P("send", (r + 1) % 4, sizes=((32,),)), P2P("recv", (r - 1) % 4, sizes=((32,),))))
        ops.append(ring)
        ops += _ar(1)
        plans[r] = RankPlan(tuple(ops))
    return plans


def _p2p_base(r: int) -> list[Op]:
    """Three pipeline steps: rank 1 sends activations to rank 2; everybody all_reduces."""
    ops: list[Op] = []
    for _ in range(3):
        if r == 1:
            ops.append(P2P("send", 2))
        elif r == 2:
            ops.append(P2P("recv", 1))
        ops += _ar(3)
    ops += _ar(2)  # collectives 1..11
    return ops


def _p2p_case(kind: str) -> dict[int, RankPlan]:
    plans = {}
    for r in range(4):
        ops = _p2p_base(r)
        last = Coll("all_reduce", site="sync_grads")
        if r == 1:
            if kind == "unmatched":
                p = P2P("send", 2, mark="fault")
            elif kind == "wrong_peer":
                p = P2P("send", 3, mark="fault")
            else:
                p = P2P("send", 2, sizes=((512,),), mark="fault")
            plans[r] = RankPlan((*ops, p), stuck_at=len(ops))  # blocks in its send (a host sync waits on it)
        elif r == 2 and kind != "unmatched":
            plans[r] = RankPlan((*ops, P2P("recv", 1, mark="fault")), stuck_at=len(ops))
        else:
            # rank 2 (unmatched: it skips its recv) and ranks 0, 3 go on to collective 12 and wait
            plans[r] = RankPlan((*ops, last), stuck_at=len(ops))
    return plans


def _coalesced(hang: bool) -> dict[int, RankPlan]:
    plans = {}
    bcast = Coalesced(
        tuple(Coll("broadcast", sizes=((128,),), site="sync_buffers") for _ in range(3)), mark="fault"
    )
    for r in range(4):
        ops: list[Op] = _ar(10)
        if hang:
            if r == 3:
                plans[r] = RankPlan(tuple(_ar(11)))
                continue
            ops += _ar(1)
            plans[r] = RankPlan((*ops, bcast), stuck_at=len(ops))
            continue
        ops.append(bcast)
        ops.append(Coll("allreduce_coalesced", sizes=((16,), (32,), (64,)), site="sync_small"))
        ops.append(
            Batch((P2P("send", (r + 1) % 4, sizes=((32,),)), P2P("recv", (r - 1) % 4, sizes=((32,),))))
        )
        ops += _ar(1)
        plans[r] = RankPlan(tuple(ops))
    return plans


PAIRS = (Group("1", "tp_0_1", (0, 1)), Group("2", "tp_2_3", (2, 3)))

CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case(
            "nccl_healthy",
            "4 ranks: data-parallel all_reduces, tensor-parallel pair all_reduces, pipeline send/recv "
            "in each pair, an all_gather_into_tensor and a batch_isend_irecv ring; everything completed",
            4, _healthy(), groups=PAIRS,
        ),
        Case(
            "nccl_hang",
            "rank 2 never calls the 12th all_reduce; ranks 0, 1, 3 launched it (started) and wait; "
            "TORCH_NCCL_ENABLE_TIMING=1",
            4, _skip_one(4, 2), kind="hang", culprit_ranks=(2,), mark="fault", op="all_reduce", witness=0,
        ),
        Case(
            "nccl_hang_no_timing",
            "as nccl_hang without TORCH_NCCL_ENABLE_TIMING: states only scheduled/completed, no start "
            "times, no duration_ms, pg_status last_started -1",
            4, _skip_one(4, 2), kind="hang", culprit_ranks=(2,), mark="fault", op="all_reduce", timing=False,
        ),
        Case(
            "nccl_type_mismatch",
            "at the 12th collective rank 1 calls all_gather_into_tensor where the others all_reduce; "
            "NCCL does not notice: everybody waits",
            4, _diverge(4, 1, Coll("_all_gather_base", sizes=((1024,),), out=((4096,),), site="sync_grads")),
            kind="collective_type_mismatch", culprit_ranks=(1,), mark="fault", op="all_reduce",
        ),
        Case(
            "nccl_size_mismatch",
            "at the 12th all_reduce rank 3 passes 1280 elements where the others pass 1024; everybody waits",
            4, _diverge(4, 3, Coll("all_reduce", sizes=((1280,),), site="sync_grads")),
            kind="size_mismatch", culprit_ranks=(3,), mark="fault", op="all_reduce",
        ),
        Case(
            "nccl_dtype_mismatch",
            "at the 12th all_reduce rank 1 passes float64 where the others pass float32; everybody waits",
            4, _diverge(4, 1, Coll("all_reduce", dtype="Double", site="sync_grads")),
            kind="dtype_mismatch", culprit_ranks=(1,), mark="fault", op="all_reduce",
        ),
        Case(
            "nccl_rank_lost",
            "rank 2 dies (process killed, GPU fault) during the 12th all_reduce and leaves no dump; the "
            "others' watchdogs time out in it and dump",
            4,
            {**_skip_one(4, 2), 2: RankPlan((*_ar(11), Coll("all_reduce")), stuck_at=11, dumps=False)},
            kind="hang", culprit_ranks=(2,), mark="fault", op="all_reduce", also=("missing_dump",),
        ),
        Case(
            "nccl_p2p_unmatched_send",
            "pipeline: rank 1 sends to rank 2 a 4th time, rank 2 skips that recv and waits in the next "
            "all_reduce; rank 1 blocks in its send, so ranks 0, 2, 3 wait for it in collective 12",
            4, _p2p_case("unmatched"), kind="hang", culprit_ranks=(2,), mark="fault", op="send",
            also=("hang",), witness=1, extra={"p2p_seq_id": 4},
        ),
        Case(
            "nccl_p2p_wrong_peer",
            "pipeline: the 4th time, rank 1 sends to rank 3 instead of rank 2; rank 2 waits in its recv "
            "from rank 1, rank 1 in its send, ranks 0 and 3 in collective 12",
            4, _p2p_case("wrong_peer"), kind="p2p_mismatch", culprit_ranks=(1,), mark="fault", op="send",
            witness=1,
        ),
        Case(
            "nccl_p2p_size_mismatch",
            "pipeline: the 4th time, rank 1 sends 512 elements where rank 2 receives 1024, as in the 3 "
            "steps before; both block, ranks 0 and 3 wait in collective 12",
            4, _p2p_case("size"), kind="p2p_mismatch", culprit_ranks=(1,), mark="fault", op="send",
            witness=1,
        ),
        Case(
            "nccl_coalesced_healthy",
            "coalesced ops: _coalescing_manager around 3 broadcasts (per-op entries, then nccl:coalesced), "
            "all_reduce_coalesced (one entry, 3 sizes), a batch_isend_irecv ring; all completed (the "
            "per-op entries stay scheduled, as NCCL leaves them)",
            4, _coalesced(False),
        ),
        Case(
            "nccl_coalesced_hang",
            "rank 3 never enters the coalesced group of 3 broadcasts (collective 12); the others wait in it",
            4, _coalesced(True), kind="hang", culprit_ranks=(3,), mark="fault", op="broadcast",
        ),
        Case(
            "nccl_watchdog_timeout",
            "TORCH_NCCL_DUMP_ON_TIMEOUT: 2 ranks, rank 1 runs one all_reduce and exits; rank 0's watchdog "
            "times out in the second one and writes the only dump (no timing: it is still scheduled)",
            2,
            {0: RankPlan((*_ar(1), Coll("all_reduce", site="sync_grads", mark="fault")), stuck_at=1),
             1: RankPlan(tuple(_ar(1)), dumps=False)},
            kind="hang", culprit_ranks=(1,), mark="fault", op="all_reduce", also=("missing_dump",), timing=False,
        ),
        Case(
            "nccl2_healthy",
            "torch 2.15 default backend nccl2, recorded by its flight-recorder hook (no CUDA events: "
            "states stay scheduled, retired marks completion) and written by _dump_fr_trace_file",
            4, _same(4, [*_ar(6), Coll("_all_gather_base", sizes=((256,),), out=((1024,),)), *_ar(5)]),
            backend="nccl2",
        ),
        Case(
            "nccl2_hang",
            "nccl2 backend: rank 2 never calls the 12th all_reduce; the others wait (not retired)",
            4, _skip_one(4, 2), kind="hang", culprit_ranks=(2,), mark="fault", op="all_reduce", backend="nccl2",
        ),
    ]
}  # fmt: skip
