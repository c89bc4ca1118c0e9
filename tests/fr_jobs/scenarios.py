"""Scenario definitions: one collective program for all ranks, plus the faults some ranks commit.

The expected verdict of each scenario is derived here, from the definition alone (which rank does
what at which collective), never from running an analyzer on the dumps it produces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

OpKind = Literal["all_reduce", "broadcast", "all_gather", "barrier"]
#: "world" is the default group; "pair" is the rank's own pair group (ranks {0,1} or {2,3}).
GroupRef = Literal["world", "pair"]
FaultAction = Literal["skip", "op", "numel", "dtype", "sigkill", "late", "kill_inside"]
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
    dump_mode: DumpMode = "agent"
    #: "timed" dumps: rank -> seconds after its program started at which it dumps.
    dump_at_s: dict[int, float] = field(default_factory=dict)
    #: rank -> extra seconds of compute before every fourth op, a different op per rank (uneven
    #: work that leaves no rank late to most collectives).
    extra_compute_s: dict[int, float] = field(default_factory=dict)
    #: Timeout of the default group (the runner's default when None) and of the pair groups (the
    #: default group's when None).
    pg_timeout_s: float | None = None
    pair_timeout_s: float | None = None

    def group_name(self, ref: GroupRef, rank: int) -> str:
        """The `process_group[0]` name `ref` has on `rank`."""
        if ref == "world":
            return "0"
        for i, (_, members) in enumerate(PAIRS):
            if rank in members:
                return str(i + 1)
        raise ValueError(f"rank {rank} is in no pair")

    def expected(self) -> dict[str, Any]:
        """The verdict implied by the definition (see scenario.json's `expected`)."""
        faults = [f for f in self.faults if f.action in _FAULT_KIND]
        if faults:
            fault = faults[0]
            op = self.ops[fault.at]
            group = self.group_name(op.group, fault.rank)
            # collective_seq_id counts this group's collectives from 1; every op here records
            # exactly one entry in its group (checked against real dumps by `generate`).
            seq = sum(1 for o in self.ops[: fault.at + 1] if self.group_name(o.group, fault.rank) == group)
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
                "op": op.kind,
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
