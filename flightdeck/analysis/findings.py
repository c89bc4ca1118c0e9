"""What the diagnosis says: findings, the report around them, and the knobs that steer it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from flightdeck.records import Entry, Stack

FindingKind = Literal[
    "hang",
    "slow_rank",
    "collective_type_mismatch",
    "size_mismatch",
    "dtype_mismatch",
    "state_mismatch",
    "p2p_mismatch",
    "rank_lost",
    "missing_dump",
    "straggler",
    "undecided",
    "version_skew",
    "config_skew",
]

#: Order in which findings are listed: root causes before their consequences.
KIND_ORDER: dict[str, int] = {
    "collective_type_mismatch": 0,
    "size_mismatch": 1,
    "dtype_mismatch": 2,
    "p2p_mismatch": 3,
    "rank_lost": 4,
    "hang": 5,
    # A rank the others wait for that is still working (flightdeck.analysis.progress): where a
    # hang would be, a warning instead.
    "slow_rank": 5,
    "state_mismatch": 6,
    "missing_dump": 7,
    "undecided": 8,
    "straggler": 9,
    # Set up before the first collective: context for whatever else was found, listed after it.
    "version_skew": 10,
    "config_skew": 11,
}

#: Findings about how the ranks are set up (flightdeck.analysis.config_skew), not what they ran.
CONFIG_KINDS = frozenset({"version_skew", "config_skew"})
MISMATCH_KINDS = frozenset({"collective_type_mismatch", "size_mismatch", "dtype_mismatch", "p2p_mismatch"})


@dataclass(frozen=True, slots=True)
class Options:
    """Thresholds of the diagnosis. Defaults suit offline analysis of dumps taken during a fault."""

    #: A collective unfinished for at least this long (seconds) on some ranks is a hang.
    stall_after_s: float = 5.0
    #: A rank whose newest snapshot is older than the job's newest by this many snapshot intervals
    #: (or `lost_after_s` when no interval is known) while others continued is lost.
    lost_after_intervals: float = 3.0
    #: Fallback for `lost_after_intervals` when snapshots carry no interval.
    lost_after_s: float = 10.0
    #: A culprit still working while the others wait (a `slow_rank` finding) becomes a hang once
    #: they have waited this long (seconds); None: half the group's timeout (from the entries or
    #: the rank's configuration report), else `slow_ceiling_default_s`.
    slow_ceiling_s: float | None = None
    #: The ceiling when it is not set and the group's timeout is unknown.
    slow_ceiling_default_s: float = 300.0
    #: A straggler arrives last in at least this share of the compared collectives...
    straggler_min_share: float = 0.5
    #: ...by a median lag of at least this many seconds...
    straggler_min_lag_s: float = 0.01
    #: ...over at least this many collectives.
    straggler_min_samples: int = 8

    def __post_init__(self) -> None:
        if self.stall_after_s < 0:
            raise ValueError("stall_after_s must be >= 0")
        if (
            self.slow_ceiling_s is not None and not self.slow_ceiling_s > 0
        ) or not self.slow_ceiling_default_s > 0:
            raise ValueError("slow ceilings must be > 0 seconds")
        if self.lost_after_intervals <= 0 or self.lost_after_s <= 0:
            raise ValueError("lost-rank thresholds must be > 0")
        if not 0 < self.straggler_min_share <= 1:
            raise ValueError("straggler_min_share must be in (0, 1]")
        if self.straggler_min_samples < 1:
            raise ValueError("straggler_min_samples must be >= 1")


@dataclass(frozen=True, slots=True)
class RankRef:
    """A rank with where it runs, for naming culprits a person can go and look at."""

    rank: int
    host: str | None = None
    pid: int | None = None


@dataclass(slots=True)
class Finding:
    """One thing that went wrong (or one reason nothing can be decided)."""

    kind: FindingKind
    detail: str
    process_group: str | None = None
    process_group_desc: str = ""
    collective_seq_id: int | None = None
    op: str | None = None
    culprit_ranks: list[int] = field(default_factory=list)
    waiting_ranks: list[int] = field(default_factory=list)
    elapsed_s: float | None = None
    #: Where culprits run (host, pid), when known.
    culprits: list[RankRef] = field(default_factory=list)
    #: What the majority (reference) and the culprit recorded, for mismatches and hangs.
    expected: dict[str, Any] | None = None
    actual: dict[str, Any] | None = None
    #: The stack the waiting ranks are blocked in, and where the culprit is instead.
    waiting_frames: Stack = ()
    culprit_frames: Stack = ()
    #: The culprit's last entry in this group (hangs), as plain data.
    culprit_last_entry: dict[str, Any] | None = None
    #: Index (in the report's list) of the finding this one follows from, when it is a consequence.
    consequence_of: int | None = None

    def sort_key(self) -> tuple[int, int, str, int]:
        """Root cause first, then by group and sequence."""
        return (
            1 if self.consequence_of is not None else 0,
            KIND_ORDER[self.kind],
            self.process_group or "",
            self.collective_seq_id or 0,
        )

    def to_json(self) -> dict[str, Any]:
        """The finding in the documented JSON shape (see README, `flightdeck analyze --format json`)."""
        return {
            "kind": self.kind,
            "process_group": self.process_group,
            "process_group_desc": self.process_group_desc,
            "collective_seq_id": self.collective_seq_id,
            "op": self.op,
            "culprit_ranks": self.culprit_ranks,
            "waiting_ranks": self.waiting_ranks,
            "elapsed_s": None if self.elapsed_s is None else round(self.elapsed_s, 3),
            "detail": self.detail,
            "culprits": [{"rank": r.rank, "host": r.host, "pid": r.pid} for r in self.culprits],
            "expected": self.expected,
            "actual": self.actual,
            "waiting_frames": frames_json(self.waiting_frames),
            "culprit_frames": frames_json(self.culprit_frames),
            "culprit_last_entry": self.culprit_last_entry,
            "consequence_of": self.consequence_of,
        }


FindingKey = tuple[str, str, int, int]


def finding_key(f: Finding) -> FindingKey:
    """The identity of a finding across diagnoses: (kind, group, seq, rank).

    A configuration finding is one per job and setting (and group), whoever the culprits are: its
    group key is `<setting>` or `<setting>@<group>`.
    """
    if f.kind in CONFIG_KINDS:
        setting = str((f.expected or f.actual or {}).get("setting") or "")
        return (f.kind, (f"{setting}@{f.process_group}" if f.process_group else setting)[:128], -1, -1)
    per_rank = f.kind in ("rank_lost", "straggler", "missing_dump") or f.collective_seq_id is None
    rank = f.culprit_ranks[0] if per_rank and f.culprit_ranks else -1
    seq = f.collective_seq_id if f.collective_seq_id is not None else -1
    return (f.kind, f.process_group or "", seq, rank)


@dataclass(slots=True)
class Report:
    """The verdict for one job."""

    expected_ranks: int
    with_dump: list[int]
    #: The ranks below `expected_ranks` without a dump; bounded (`diagnose.MAX_LISTED_MISSING`
    #: more than `with_dump`): `without_dump_count` is how many there are in all.
    without_dump: list[int]
    findings: list[Finding]
    job: str | None = None
    #: The moment the diagnosis was made for (epoch seconds).
    now_s: float = 0.0
    #: Where `now_s` came from: "snapshot" (snapshot times), "given" (the caller's, `--now`) or
    #: "file" (file times only: elapsed times are then unknown, `elapsed_s` null).
    clock: str = "snapshot"
    #: Arrival skew (last minus first enqueue, seconds) of the compared collectives, per group.
    arrival_skew_s: dict[str, list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: Per group: (the sequence id up to which every member holding it recorded the same
    #: collectives, how many members held it). A live caller hands it to the next `diagnose`
    #: (`agreed=`), which then compares only the newer collectives. Not part of the JSON.
    agreed: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: How many ranks have no dump (None: `len(without_dump)`, the list is whole).
    without_dump_count: int | None = None

    @property
    def healthy(self) -> bool:
        """No finding at all (an undecided finding is not healthy either)."""
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        """The documented JSON shape of `flightdeck analyze --format json` and the server API."""
        return {
            "healthy": self.healthy,
            "job": self.job,
            "now_s": round(self.now_s, 3),
            "clock": {"source": self.clock, "elapsed_known": self.clock != "file"},
            "ranks": {
                "expected": self.expected_ranks,
                "with_dump": self.with_dump,
                "without_dump": self.without_dump,
                "without_dump_count": len(self.without_dump)
                if self.without_dump_count is None
                else self.without_dump_count,
            },
            "findings": [f.to_json() for f in self.findings],
            "warnings": self.warnings,
        }


def frames_json(frames: Stack) -> list[dict[str, Any]]:
    """Frames as `[{name, filename, line}]`, innermost first."""
    return [{"name": f.name, "filename": f.filename, "line": f.line} for f in frames]


def entry_json(e: Entry) -> dict[str, Any]:
    """An entry as readable plain data (for findings and the API)."""
    return {
        "record_id": e.record_id,
        "process_group": e.group,
        "collective_seq_id": e.collective_seq_id,
        "op": e.op,
        "profiling_name": e.raw_op,
        "input_sizes": [list(s) for s in e.input_sizes],
        "output_sizes": [list(s) for s in e.output_sizes],
        "input_dtypes": list(e.input_dtypes),
        "output_dtypes": list(e.output_dtypes),
        "state": e.state,
        "retired": e.retired,
        "time_created_ns": e.time_created_ns,
        "frames": frames_json(e.frames),
    }
