"""Scenario definitions: one collective program for all ranks, plus the faults some ranks commit.

The expected verdict of each scenario is derived here, from the definition alone (which rank does
what at which collective), never from running an analyzer on the dumps it produces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

OpKind = Literal[
    "all_reduce",
    "broadcast",
    "all_gather",
    "barrier",
    # Point-to-point (gloo records no entry for these, but each send/recv uses up an op_id):
    # p2p_ring: batch_isend_irecv, send to the next member of the group, receive from the previous;
    # p2p_chain: the same without the wrap (the first member only sends, the last only receives),
    # as pipeline stages hand activations on.
    "p2p_ring",
    "p2p_chain",
    # all_to_all_single with uneven splits: rank r sends numel * (1 + (2r + j) % 3) elements to
    # member j (consistent: what j expects from r is exactly that).
    "all_to_all",
    # reduce_scatter_tensor of a numel * group-size input (gloo records an all_reduce of it).
    "reduce_scatter",
    # _coalescing_manager around two all_reduces / two all_gather_into_tensor (one entry each),
    # and all_reduce_coalesced of two tensors.
    "coalesced_all_reduce",
    "coalesced_all_gather",
    "all_reduce_coalesced",
]
#: "world" is the default group; "pair" is the rank's own pair group (ranks {0,1} or {2,3});
#: "tp", "pp", "dp" are the rank's groups of a scenario's `layout` (tensor, pipeline, data parallel).
GroupRef = Literal["world", "pair", "tp", "pp", "dp"]
FaultAction = Literal[
    "skip", "op", "numel", "dtype", "sigkill", "skip_send", "wrong_peer", "short_send", "late", "kill_inside"
]

#: Ops that write no flight-recorder entry on gloo.
P2P_KINDS = frozenset({"p2p_ring", "p2p_chain"})
#: What gloo records each op kind as (the canonical op of its entry).
RECORDED_AS: dict[str, str] = {
    "reduce_scatter": "all_reduce",
    "coalesced_all_reduce": "all_reduce",
    "coalesced_all_gather": "all_gather",
    "all_reduce_coalesced": "all_reduce",
}
#: How the ranks' dumps are taken: by the Flightdeck agent (snapshots with sidecars), or raw by
#: PyTorch's own dump call and nothing else, as a user without Flightdeck would bring them: "exit"
#: right after the last collective returns, "timed" by a thread of each rank at its own moment,
#: "periodic" by a thread every half second and once more when the rank leaves (or fails).
DumpMode = Literal["agent", "exit", "timed", "periodic"]

#: Subgroups created by `new_group` when a scenario asks for pairs, in creation order. Group names
#: are handed out in creation order from "1" (the default group is "0") on every rank.
PAIRS: tuple[tuple[str, tuple[int, ...]], ...] = (("pair01", (0, 1)), ("pair23", (2, 3)))

_FAULT_KIND: dict[FaultAction, str] = {
    "skip": "hang",
    "op": "collective_type_mismatch",
    "numel": "size_mismatch",
    "dtype": "dtype_mismatch",
    "sigkill": "rank_lost",
    "skip_send": "hang",
    "wrong_peer": "hang",
    "short_send": "size_mismatch",
    "kill_inside": "rank_lost",
}


@dataclass(frozen=True, slots=True)
class Op:
    """One collective every member of its group calls (unless a fault says otherwise)."""

    kind: OpKind
    group: GroupRef = "world"
    numel: int = 256
    dtype: str = "float32"


@dataclass(frozen=True, slots=True)
class Fault:
    """What `rank` does instead of program op `at`.

    skip: does not call it and leaves for a long non-collective phase (past the group timeout);
    op / numel / dtype: calls it with another op kind / element count / dtype (`value`);
    sigkill: SIGKILLs itself instead of calling it;
    skip_send (p2p op): posts its receive but not its send, and goes on to the next collective;
    wrong_peer (p2p op): sends to the member after the intended one (the others do not expect it);
    short_send (all_to_all): sends `value` fewer elements to the next member than that member expects.
    late: sleeps `value` seconds, then calls it (not a fault by itself: a slow rank);
    kill_inside: calls it and is SIGKILLed `value` seconds later, while still inside it when its
    peers are not there yet (a thread of its own sends the signal, as a launcher or the OOM killer
    would from outside).
    """

    at: int
    rank: int
    action: FaultAction
    value: str | float | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A job definition: world size, program, faults, and the per-rank delay of stragglers."""

    name: str
    description: str
    world_size: int
    ops: tuple[Op, ...]
    faults: tuple[Fault, ...] = ()
    fr_buffer_size: int = 2000
    pairs: bool = False
    #: rank -> seconds slept before every collective.
    straggler_delay_s: dict[int, float] = field(default_factory=dict)
    #: Extra groups (desc, members), created after the pairs in this order; `tp`/`pp`/`dp` ops run
    #: in the rank's group whose desc starts with that prefix.
    layout: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: The group timeout and run deadline for this job (None: the runner's defaults).
    pg_timeout_s: float | None = None
    deadline_s: float | None = None
    #: Seconds a rank waits after its last op before it leaves (lets gloo's async completion flags
    #: settle, so that a healthy job's last collective reads finished everywhere).
    settle_s: float = 0.0
    dump_mode: DumpMode = "agent"
    #: "timed" dumps: rank -> seconds after its program started at which it dumps.
    dump_at_s: dict[int, float] = field(default_factory=dict)
    #: rank -> extra seconds of compute before every fourth op, a different op per rank (uneven
    #: work that leaves no rank late to most collectives).
    extra_compute_s: dict[int, float] = field(default_factory=dict)
    #: Timeout of the pair groups (the default group's, `pg_timeout_s`, when None).
    pair_timeout_s: float | None = None

    def group_name(self, ref: GroupRef, rank: int) -> str:
        """The `process_group[0]` name `ref` has on `rank`."""
        if ref == "world":
            return "0"
        if ref != "pair":
            base = 1 + (len(PAIRS) if self.pairs else 0)
            for i, (desc, members) in enumerate(self.layout):
                if desc.startswith(ref) and rank in members:
                    return str(base + i)
            raise ValueError(f"rank {rank} is in no {ref} group")
        for i, (_, members) in enumerate(PAIRS):
            if rank in members:
                return str(i + 1)
        raise ValueError(f"rank {rank} is in no pair")

    def group_members(self, ref: GroupRef, rank: int) -> tuple[int, ...]:
        """The global ranks of the group `ref` names on `rank`."""
        if ref == "world":
            return tuple(range(self.world_size))
        name = int(self.group_name(ref, rank))
        if ref == "pair":
            return PAIRS[name - 1][1]
        return self.layout[name - 1 - (len(PAIRS) if self.pairs else 0)][1]

    def expected(self) -> dict[str, Any]:
        """The verdict implied by the definition (see scenario.json's `expected`)."""
        if self.faults and self.faults[0].action in ("skip_send", "wrong_peer"):
            return self._expected_p2p(self.faults[0])
        faults = [f for f in self.faults if f.action in _FAULT_KIND]
        if faults:
            fault = faults[0]
            op = self.ops[fault.at]
            group = self.group_name(op.group, fault.rank)
            # collective_seq_id counts this group's collectives from 1; every op here records
            # exactly one entry in its group (checked against real dumps by `generate`).
            seq = sum(
                1
                for o in self.ops[: fault.at + 1]
                if o.kind not in P2P_KINDS and self.group_name(o.group, fault.rank) == group
            )
            kind = _FAULT_KIND[fault.action]
            if fault.action == "kill_inside" and self.dump_mode != "agent":
                # Raw dumps hold no liveness: they show the killed rank as the member that was in
                # the collective long before its late peer came, which then still did not finish.
                kind = "hang"
            return {
                "healthy": False,
                "kind": kind,
                "culprit_ranks": sorted({f.rank for f in faults}),
                "process_group": group,
                "collective_seq_id": seq,
                "op": RECORDED_AS.get(op.kind, op.kind),
            }
        if self.straggler_delay_s:
            return {
                "healthy": False,
                "kind": "straggler",
                "culprit_ranks": sorted(self.straggler_delay_s),
                "process_group": "0",
                "collective_seq_id": None,
                "op": None,
            }
        return {
            "healthy": True,
            "kind": None,
            "culprit_ranks": [],
            "process_group": "0",
            "collective_seq_id": None,
            "op": None,
        }

    def _expected_p2p(self, fault: Fault) -> dict[str, Any]:
        """A p2p fault strands the rank that waits for the message before the group's next collective.

        gloo records no p2p entry, so the verdict is at that next collective (group, seq), which the
        stranded rank never reaches. skip_send: the culprit is the rank that left its send out (it
        reaches the next collective with one op_id fewer used); the stranded receiver is blocked by
        it. wrong_peer: the sender waits for a receive nobody posts and its intended receiver for a
        send that went elsewhere; both issued as many p2p ops as usual, so no op count tells which
        of the two addressed the wrong peer: both are named.
        """
        op = self.ops[fault.at]
        group = self.group_name(op.group, fault.rank)
        members = self.group_members(op.group, fault.rank)
        idx = members.index(fault.rank)
        receiver = members[(idx + 1) % len(members)]
        nxt = next(
            i
            for i in range(fault.at + 1, len(self.ops))
            if self.ops[i].kind not in P2P_KINDS and self.group_name(self.ops[i].group, fault.rank) == group
        )
        seq = sum(
            1
            for o in self.ops[: nxt + 1]
            if o.kind not in P2P_KINDS and self.group_name(o.group, fault.rank) == group
        )
        culprits = [fault.rank] if fault.action == "skip_send" else sorted({fault.rank, receiver})
        return {
            "healthy": False,
            "kind": _FAULT_KIND[fault.action],
            "culprit_ranks": culprits,
            "blocked_ranks": [receiver] if fault.action == "skip_send" else [],
            "process_group": group,
            "collective_seq_id": seq,
            "op": RECORDED_AS.get(self.ops[nxt].kind, self.ops[nxt].kind),
        }

    def to_json(self) -> dict[str, Any]:
        """The scenario.json document (without what was observed)."""
        return {
            "name": self.name,
            "description": self.description,
            "world_size": self.world_size,
            "fr_buffer_size": self.fr_buffer_size,
            "dump_mode": self.dump_mode,
            "expected": self.expected(),
        }


def training_program(steps: int, *, pairs: bool = False) -> tuple[Op, ...]:
    """A small data-parallel loop: broadcast params, two gradient buckets per step, now and then
    a metrics all_gather, a barrier, and (with `pairs`) a pair-group all_reduce; a final barrier."""
    ops = [Op("broadcast", numel=64)]
    for s in range(steps):
        ops += [Op("all_reduce", numel=256), Op("all_reduce", numel=128)]
        if pairs:
            ops.append(Op("all_reduce", group="pair", numel=32))
        if s % 3 == 2:
            ops.append(Op("all_gather", numel=16))
        if s % 5 == 4:
            ops.append(Op("barrier"))
    ops.append(Op("barrier"))
    return tuple(ops)


def nth(ops: tuple[Op, ...], kind: OpKind, n: int, group: GroupRef = "world") -> int:
    """Index in `ops` of the n-th (from 0) op of `kind` in `group`."""
    hits = [i for i, o in enumerate(ops) if o.kind == kind and o.group == group]
    return hits[n]


_P8 = training_program(8)
_P10 = training_program(10)
_P30 = training_program(30)
_PAIRS = training_program(7, pairs=True)
_P40_PAIRS = training_program(40, pairs=True)

_ALL: tuple[Scenario, ...] = (
    Scenario("healthy_2", "2 ranks, healthy training loop", 2, _P8),
    Scenario("healthy_4", "4 ranks, healthy training loop", 4, _P8),
    Scenario(
        "skip",
        "rank 2 skips one default-group all_reduce and leaves; the others hang until the timeout",
        4,
        _P10,
        (Fault(nth(_P10, "all_reduce", 9), 2, "skip"),),
    ),
    Scenario(
        "op_order",
        "rank 1 calls all_gather_into_tensor where the others call all_reduce (same seq); gloo hangs",
        4,
        _P10,
        (Fault(nth(_P10, "all_reduce", 9), 1, "op", "all_gather"),),
    ),
    Scenario(
        "size_mismatch",
        "rank 3 all_reduces 320 elements where the others use 256; gloo aborts the rank receiving "
        "its oversized data (a rank with the smaller buffer would abort itself and leave no evidence)",
        4,
        _P10,
        (Fault(nth(_P10, "all_reduce", 10), 3, "numel", 320),),
    ),
    Scenario(
        "dtype_mismatch",
        "rank 1 all_reduces float64 where the others use float32 (different byte count)",
        4,
        _P10,
        (Fault(nth(_P10, "all_reduce", 10), 1, "dtype", "float64"),),
    ),
    Scenario(
        "dtype_same_bytes",
        "rank 2 all_reduces int32 where the others use float32 (same byte count): completes silently",
        4,
        _P10,
        (Fault(nth(_P10, "all_reduce", 10), 2, "dtype", "int32"),),
    ),
    Scenario(
        "sigkill",
        "rank 2 SIGKILLs itself instead of calling an all_reduce; expected seq is the first "
        "collective it never entered",
        4,
        _P10,
        (Fault(nth(_P10, "all_reduce", 10), 2, "sigkill"),),
    ),
    Scenario(
        "wrapped",
        "TORCH_FR_BUFFER_SIZE=16: ~60 collectives, then rank 1 skips an all_reduce (ring wrapped)",
        4,
        _P30,
        (Fault(nth(_P30, "all_reduce", 45), 1, "skip"),),
        fr_buffer_size=16,
    ),
    Scenario(
        "subgroup_hang",
        "pairs {0,1} and {2,3} via new_group; rank 3 skips a pair23 all_reduce: rank 2 hangs in "
        "pair23, ranks 0 and 1 then hang in the next default-group collective",
        4,
        _PAIRS,
        (Fault(nth(_PAIRS, "all_reduce", 4, "pair"), 3, "skip"),),
        pairs=True,
    ),
    Scenario(
        "rank0_culprit",
        "rank 0 (the first rank, PyTorch's analyzer's reference) skips an all_reduce",
        4,
        _P10,
        (Fault(nth(_P10, "all_reduce", 9), 0, "skip"),),
    ),
    Scenario(
        "straggler",
        "rank 3 sleeps 40 ms before every collective; otherwise healthy",
        4,
        _P8,
        straggler_delay_s={3: 0.04},
    ),
    # Issue 26: dumps as users bring them (raw PyTorch dumps, no sidecars) and kills inside a subgroup.
    Scenario(
        "healthy_exit_raw",
        "healthy, pairs, uneven work; each rank dumps with PyTorch's own call right after the last "
        "barrier returns (raw pickle and JSON, no agent): gloo sets completion flags asynchronously, "
        "so the barrier may be finished on some ranks and pending on others",
        4,
        _PAIRS,
        pairs=True,
        dump_mode="exit",
        extra_compute_s={0: 0.02, 1: 0.04, 2: 0.06, 3: 0.03},
    ),
    Scenario(
        "healthy_midtrain_raw",
        "healthy, pairs, uneven work, TORCH_FR_BUFFER_SIZE=16 (ring wrapped); each rank dumps raw "
        "from a thread at its own moment, 0.3 s apart (0.9 s first to last), mid-training",
        4,
        _P40_PAIRS,
        fr_buffer_size=16,
        pairs=True,
        dump_mode="timed",
        dump_at_s={0: 3.1, 1: 2.5, 2: 3.4, 3: 2.8},
        extra_compute_s={0: 0.02, 1: 0.04, 2: 0.06, 3: 0.03},
    ),
    Scenario(
        "kill_in_subgroup",
        "pairs; rank 2 is 3 s late to a pair23 all_reduce; rank 3 enters it and is SIGKILLed 1 s later "
        "while waiting inside it; its peers fail only after that",
        4,
        _PAIRS,
        (
            Fault(nth(_PAIRS, "all_reduce", 4, "pair"), 3, "kill_inside", 1.0),
            Fault(nth(_PAIRS, "all_reduce", 4, "pair"), 2, "late", 3.0),
        ),
        pairs=True,
    ),
    Scenario(
        "kill_in_subgroup_after_peers_failed",
        "pairs, default-group timeout 2 s, pair timeout 12 s; rank 2 is 6 s late to a pair23 "
        "all_reduce; ranks 0 and 1 time out in the next default-group collective and exit first; "
        "then rank 3, waiting inside the pair23 all_reduce, is SIGKILLed (4 s in)",
        4,
        _PAIRS,
        (
            Fault(nth(_PAIRS, "all_reduce", 4, "pair"), 3, "kill_inside", 4.0),
            Fault(nth(_PAIRS, "all_reduce", 4, "pair"), 2, "late", 6.0),
        ),
        pairs=True,
        pg_timeout_s=2.0,
        pair_timeout_s=12.0,
    ),
    Scenario(
        "kill_in_subgroup_raw",
        "as kill_in_subgroup, with raw PyTorch dumps only (no agent): each rank dumps every 0.5 s "
        "and when it leaves or fails; group timeouts 15 s; rank 2 is 9 s late, rank 3 is SIGKILLed 6 s "
        "into the wait (its last dump shows it inside), then its peers fail",
        4,
        _PAIRS,
        (
            Fault(nth(_PAIRS, "all_reduce", 4, "pair"), 3, "kill_inside", 6.0),
            Fault(nth(_PAIRS, "all_reduce", 4, "pair"), 2, "late", 9.0),
        ),
        pairs=True,
        dump_mode="periodic",
        pg_timeout_s=15.0,
    ),
)

#: The scenarios whose dumps are committed under tests/data/fr/.
SCENARIOS: dict[str, Scenario] = {s.name: s for s in _ALL}

_TEST_PROGRAM = training_program(3)
#: Small jobs for tests/test_agent.py (not committed as data).
TEST_SCENARIOS: dict[str, Scenario] = {
    "t_healthy": Scenario("t_healthy", "2 ranks, short healthy loop", 2, _TEST_PROGRAM),
    "t_skip": Scenario(
        "t_skip",
        "rank 1 skips the 4th all_reduce; rank 0 blocks until the timeout",
        2,
        _TEST_PROGRAM,
        (Fault(nth(_TEST_PROGRAM, "all_reduce", 3), 1, "skip"),),
    ),
}


def get(name: str) -> Scenario:
    """A scenario by name, published or test-only."""
    found = SCENARIOS.get(name) or TEST_SCENARIOS.get(name)
    if found is None:
        raise KeyError(f"unknown scenario {name!r}")
    return found


# --- point-to-point, all_to_all, reduce_scatter, coalesced, and a 3-D parallel layout (issue 26) ---


def p2p_program(steps: int, kind: OpKind) -> tuple[Op, ...]:
    """A loop whose steps hand a tensor on between neighbours (`kind`) before two gradient buckets."""
    ops = [Op("broadcast", numel=64)]
    for _ in range(steps):
        ops += [Op(kind, numel=32), Op("all_reduce", numel=256), Op("all_reduce", numel=128)]
    ops.append(Op("barrier"))
    return tuple(ops)


def a2a_program(steps: int) -> tuple[Op, ...]:
    """Expert-parallel-ish steps: a gradient bucket, an uneven all_to_all, another bucket."""
    ops = [Op("broadcast", numel=64)]
    for _ in range(steps):
        ops += [Op("all_reduce", numel=256), Op("all_to_all", numel=4), Op("all_reduce", numel=128)]
    ops.append(Op("barrier"))
    return tuple(ops)


def rs_program(steps: int) -> tuple[Op, ...]:
    """Sharded-optimizer-ish steps: reduce_scatter the gradients, all_gather the parameters."""
    ops = [Op("broadcast", numel=64)]
    for _ in range(steps):
        ops += [Op("reduce_scatter", numel=32), Op("all_gather", numel=32), Op("all_reduce", numel=16)]
    ops.append(Op("barrier"))
    return tuple(ops)


def coalesced_program(steps: int) -> tuple[Op, ...]:
    """Steps of coalesced collectives (each one entry with several tensors) and a plain bucket."""
    ops = [Op("broadcast", numel=64)]
    for _ in range(steps):
        ops += [
            Op("coalesced_all_reduce", numel=64),
            Op("coalesced_all_gather", numel=8),
            Op("all_reduce_coalesced", numel=16),
            Op("all_reduce", numel=128),
        ]
    ops.append(Op("barrier"))
    return tuple(ops)


def layout_3d(tp: int, pp: int, dp: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Megatron's rank order (tensor parallel fastest, then data, then pipeline): the TP groups are
    contiguous, the DP groups stride by `tp` and the PP groups by `tp * dp` (non-contiguous)."""

    def rank(p: int, d: int, t: int) -> int:
        return p * tp * dp + d * tp + t

    groups: list[tuple[str, tuple[int, ...]]] = []
    groups += [
        (f"tp{p * dp + d}", tuple(rank(p, d, t) for t in range(tp))) for p in range(pp) for d in range(dp)
    ]
    groups += [
        (f"pp{d * tp + t}", tuple(rank(p, d, t) for p in range(pp))) for d in range(dp) for t in range(tp)
    ]
    groups += [
        (f"dp{p * tp + t}", tuple(rank(p, d, t) for d in range(dp))) for p in range(pp) for t in range(tp)
    ]
    return tuple(groups)


def program_3d(steps: int) -> tuple[Op, ...]:
    """Per step: TP all_reduces around a PP activation hand-off (p2p), the tied-embedding all_reduce
    between the first and last stage (PP group), and the DP gradient all_reduce."""
    ops = [Op("broadcast", numel=64)]
    for _ in range(steps):
        ops += [
            Op("all_reduce", group="tp", numel=64),
            Op("p2p_ring", group="pp", numel=32),
            Op("all_reduce", group="tp", numel=64),
            Op("all_reduce", group="pp", numel=16),
            Op("all_reduce", group="dp", numel=128),
        ]
    ops.append(Op("barrier"))
    return tuple(ops)


_PCHAIN = p2p_program(6, "p2p_chain")
_PRING = p2p_program(6, "p2p_ring")
_A2A = a2a_program(6)
_RS = rs_program(6)
_COAL = coalesced_program(6)
_L3D = layout_3d(2, 2, 4)
_P3D = program_3d(3)

_ISSUE26: tuple[Scenario, ...] = (
    Scenario(
        "p2p_skip_send",
        "pipeline-style p2p chain (rank i sends to i+1 with batch_isend_irecv) before each step's "
        "all_reduces; rank 1 leaves its send to rank 2 out: rank 2 is stranded in its recv, rank 1 "
        "goes on to the next all_reduce with one op_id fewer used",
        4,
        _PCHAIN,
        (Fault(nth(_PCHAIN, "p2p_chain", 3), 1, "skip_send"),),
        settle_s=0.3,
        deadline_s=120.0,
    ),
    Scenario(
        "p2p_wrong_peer",
        "p2p ring (send to the next rank, receive from the previous) before each step's all_reduces; "
        "rank 1 sends to rank 3 instead of rank 2: rank 1 waits for a recv nobody posts, rank 2 for "
        "a send that went elsewhere",
        4,
        _PRING,
        (Fault(nth(_PRING, "p2p_ring", 3), 1, "wrong_peer"),),
        settle_s=0.3,
        deadline_s=120.0,
    ),
    Scenario(
        "a2a_uneven",
        "all_to_all_single with uneven but consistent splits (every rank's input and output totals "
        "differ); healthy",
        4,
        _A2A,
        settle_s=0.3,
        deadline_s=120.0,
    ),
    Scenario(
        "a2a_short_send",
        "uneven all_to_all_single; at the 4th one rank 2 sends 3 elements fewer to rank 3 than "
        "rank 3 expects: gloo completes it silently with wrong data",
        4,
        _A2A,
        (Fault(nth(_A2A, "all_to_all", 3), 2, "short_send", 3),),
        settle_s=0.3,
        deadline_s=120.0,
    ),
    Scenario(
        "reduce_scatter_size",
        "reduce_scatter_tensor (recorded by gloo as an all_reduce of the full input); at the 4th one "
        "rank 3 passes 40 elements per rank where the others pass 32: gloo aborts a peer",
        4,
        _RS,
        (Fault(nth(_RS, "reduce_scatter", 3), 3, "numel", 40),),
        settle_s=0.3,
        deadline_s=120.0,
    ),
    Scenario(
        "coalesced_healthy",
        "_coalescing_manager around two all_reduces and around two all_gather_into_tensor (gloo "
        "records wrong output sizes for the coalesced all_gather), all_reduce_coalesced; healthy",
        4,
        _COAL,
        settle_s=0.3,
        deadline_s=120.0,
    ),
    Scenario(
        "coalesced_hang",
        "coalesced steps as in coalesced_healthy; rank 2 skips the 4th coalesced all_reduce block and "
        "leaves: the others hang in it",
        4,
        _COAL,
        (Fault(nth(_COAL, "coalesced_all_reduce", 3), 2, "skip"),),
        settle_s=0.3,
        deadline_s=120.0,
    ),
    Scenario(
        "tp_pp_dp_healthy",
        "16 ranks, TP=2 x PP=2 x DP=4 in Megatron order (DP and PP groups of non-contiguous ranks): TP "
        "all_reduces, a PP p2p hand-off, a PP tied-embedding all_reduce, a DP gradient all_reduce; healthy",
        16,
        _P3D,
        layout=_L3D,
        pg_timeout_s=60.0,
        deadline_s=400.0,
        settle_s=0.5,
    ),
    Scenario(
        "tp_pp_dp_hang",
        "as tp_pp_dp_healthy; rank 9 skips its 3rd DP gradient all_reduce (DP group 1,3,5,...: ranks "
        "9, 11, 13, 15) and leaves: its DP peers hang there, the rest of the job then hangs behind them",
        16,
        _P3D,
        (Fault(nth(_P3D, "all_reduce", 2, "dp"), 9, "skip"),),
        layout=_L3D,
        pg_timeout_s=30.0,
        deadline_s=400.0,
        settle_s=0.5,
    ),
)
SCENARIOS.update({s.name: s for s in _ISSUE26})

_ISSUE26_MORE: tuple[Scenario, ...] = (
    Scenario(
        "tp_pp_dp_pp_skip_send",
        "as tp_pp_dp_healthy; at the 3rd step rank 10 (pipeline stage 1) leaves its PP send to rank 2 "
        "out: rank 2 is stranded in its recv, rank 10 goes on to the PP tied-embedding all_reduce with "
        "one op_id fewer used, and the job hangs behind rank 2",
        16,
        _P3D,
        (Fault(nth(_P3D, "p2p_ring", 2, "pp"), 10, "skip_send"),),
        layout=_L3D,
        pg_timeout_s=30.0,
        deadline_s=400.0,
        settle_s=0.5,
    ),
)
SCENARIOS.update({s.name: s for s in _ISSUE26_MORE})
