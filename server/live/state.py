"""What the server holds in memory about each job attempt, and the budget all diagnoses share.

`JobState` is written by the ingest threads (`LiveDiagnosis.submit`, under its lock) and by the
diagnosis worker; `SkewHistogram` is the per-group arrival-skew histogram the metrics export;
`DiagnosisBudget` spaces every job's diagnosis together.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from flightdeck.analysis import Finding, RankSummary, Report
from flightdeck.wire import Snapshot

#: Buckets (seconds) of `flightdeck_job_arrival_skew_seconds`.
SKEW_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(slots=True)
class SkewHistogram:
    """A cumulative histogram of arrival skews (counts per bucket, non-cumulative, +Inf last)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(SKEW_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, v: float) -> None:
        """Add one observation."""
        for i, b in enumerate(SKEW_BUCKETS):
            if v <= b:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.total += v
        self.n += 1


@dataclass(slots=True)
class JobState:
    """What the server holds in memory about one job attempt.

    Bound (issue 22): nearly all of it is `summaries`, one `RankSummary` per rank holding, per
    process group, at most `max_summary_seqs` (8,192) collectives packed at about 3 bytes each
    (`flightdeck.analysis.packed`: sequence id, fingerprint, op id), the enqueue times of only
    the newest `enqueue_times_kept` (512) of them (~5 bytes each: what the diagnosis compares,
    `fold.bound_track`), its last `TAIL` entries in full and a stack per signature; the member
    lists of a group are one object per job (`intern_members`). That is ranks x groups x
    (collectives held x ~3 B + 512 x ~5 B) plus ~10 KB a rank: a job of 1,024 ranks x 2,000
    collectives holds ≈ 12.6 MiB of objects (`bench/job_state_parts.py`); its share of the
    server's RSS on PostgreSQL once the store's caches had filled: a median of ≈ 18 MiB, single
    increments +2 to +35 (`bench/server_memory.py`, docs/performance.md "Server memory"). Under
    the default allocator (pymalloc) an ended job's memory is reused by the next one rather than
    handed back to the system (the same page). When the job ends the
    summaries go once no batch of it came for `stall_after_s` (`LiveDiagnosis.release`), the rest
    `ended_series_s` later; an idle job's after `job_idle_s`. A restart rebuilds them a few
    ranks at a time (`rebuild.rebuild_summaries`).
    """

    job_id: int
    name: str
    attempt: int
    world_size: int | None = None
    status: str = "running"
    #: rank -> summary; None until rebuilt from the database.
    summaries: dict[int, RankSummary] | None = None
    pending: list[Snapshot] = field(default_factory=list)
    dirty: bool = False
    dirty_since: float = 0.0
    last_ingest: float = 0.0
    last_diagnosis: float = 0.0
    #: Seconds the last diagnosis took (it spaces the next ones: `diagnosis_max_share`).
    diagnosis_s: float = 0.0
    #: Monotonic time of the last diagnosis that ran the straggler analysis.
    last_stragglers: float = float("-inf")
    #: Epoch ns of the newest snapshot accepted for the job (what the ranks say happened, at most
    #: the server's clock): a replayed batch does not move it.
    last_seen_ns: int = 0
    #: Epoch ns (server clock) of the latest batch for the job: whether it is idle
    #: (`job_idle_s`) is told by when we last heard of it, whatever its data says.
    heard_ns: int = 0
    #: Epoch ns the job was first seen (its oldest snapshot; the stored value after a restart).
    first_seen_ns: int = 0
    #: Epoch ns (server clock) this process first received data of the job; None for a job
    #: loaded at start (see `policy.filling_in`).
    arrived_ns: int | None = None
    #: When the job ended (every rank final or gone; `job_end`), None while it runs.
    ended_at_ns: int | None = None
    #: rank -> when its collector saw its process gone (collector clock).
    gone: dict[int, int] = field(default_factory=dict)
    #: collector host -> (seconds the newest snapshot of its latest batch for the job was behind
    #: the job's newest snapshot, monotonic arrival): a collector shipping old data while the
    #: job's other data is newer is catching up (the ranks' clocks compared, not ours).
    data_lag: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: rank -> snapshot time (epoch ns) of its latest snapshot.
    rank_seen_ns: dict[int, int] = field(default_factory=dict)
    report: Report | None = None
    #: The job's open findings as stored, loaded at start (one process alone): what the metrics
    #: export until the job's first diagnosis here sets `report`, so that an open incident stays
    #: exported across a restart (Prometheus' first scrape must not see it resolved); after it,
    #: those kept as stored while the job awaits its entries (`awaiting_entries_since`).
    restored: list[Finding] = field(default_factory=list)
    #: Monotonic time a job on digests was rebuilt without its entries (a takeover, a restart:
    #: `rebuild.rebuild_summaries`); None once its entries are in. Until then the open findings
    #: its board does not make stay open as stored: judged on no entries, they would resolve,
    #: and open again (a second page) once the entries came.
    awaiting_entries_since: float | None = None
    #: (group, seq) -> epoch ns a state_mismatch there was first diagnosed (`settle_state_mismatches`).
    state_mismatch_since: dict[tuple[str | None, int | None], int] = field(default_factory=dict)
    #: The last diagnosis's `Report.agreed`, for the next (reset when the summaries are rebuilt).
    agreed: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: group -> enqueue time (epoch ns) of the oldest collective not finished on every member.
    oldest_unfinished_ns: dict[str, int] = field(default_factory=dict)
    #: (group, op) -> collectives seen on the group's lowest member rank.
    collectives: Counter[tuple[str, str]] = field(default_factory=Counter)
    counted_seq: dict[str, int] = field(default_factory=dict)
    skew: dict[str, SkewHistogram] = field(default_factory=dict)
    skew_hi: dict[str, int] = field(default_factory=dict)
    #: Distinct process-group member lists of the job, one object each (see `fold.fold_snapshot`).
    member_lists: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    #: id() of each of those lists -> its lowest rank (the rank that counts the group's collectives).
    lowest_member: dict[int, int] = field(default_factory=dict)

    def intern_members(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """The job's one object for this member list (kept alive by `member_lists`)."""
        if id(ranks) in self.lowest_member:
            # The very object kept (held alive, so no other has its id): no hashing of a
            # world's members, which every snapshot that carries groups would cost.
            return ranks
        kept = self.member_lists.setdefault(ranks, ranks)
        if kept is ranks:
            self.lowest_member[id(ranks)] = min(ranks)
        return kept

    #: collector host -> (age in seconds of its latest batch when it arrived, monotonic arrival,
    #: whether the age is free of clock skew: measured by the collector's and our own clock).
    batch_lag: dict[str, tuple[float, float, bool]] = field(default_factory=dict)
    #: Monotonic time since when a collector of the job has been replaying old batches.
    replaying_since: float | None = None
    #: Whether `summaries` were dropped when the job ended (`LiveDiagnosis.release`).
    released: bool = False
    #: A job on digests: the verdict of its latest round's entries (before the board's findings
    #: are added), which stands until the next round's entries come.
    entries_report: Report | None = None
    #: Monotonic time the board's findings were last made (a job on digests).
    last_board: float = 0.0

    def lags(self) -> list[tuple[float, float, bool]]:
        """`batch_lag`'s values, copied: ingest threads add collectors while the worker reads
        (one C call under the GIL, so the copy is whole; iterating the dict itself raised
        "dictionary changed size during iteration" when a host's first batch came in)."""
        return list(self.batch_lag.values())


class DiagnosisBudget:
    """The share of a core that all jobs' diagnoses together may take (`diagnosis_max_share`).

    Each job's own spacing (`JobState.diagnosis_s`) keeps one large job to that share; without
    a common budget ten of them took ten shares, a whole core: with ten open hung 1,024-rank
    jobs on SQLite the incident page took 486 ms; with it, 130 ms (126 ms with one of them
    diagnosed; docs/performance.md). Virtual time: each diagnosis of `d` seconds moves the next allowed
    start `d / share` on; idle time is credited up to `burst_s`, so a few small jobs due at once
    are diagnosed together.
    """

    def __init__(self, *, share: float, burst_s: float) -> None:
        """`share` of one core (0-1] over time; up to `burst_s` of idle time is credited."""
        self._share = share
        self._burst_s = burst_s
        self._free_at = float("-inf")

    def spent(self, now: float) -> bool:
        """Whether a diagnosis starting at monotonic time `now` would exceed the share."""
        return self._free_at > now

    def charge(self, now: float, took_s: float) -> None:
        """Count a diagnosis that took `took_s` seconds and ended at monotonic time `now`."""
        self._free_at = max(self._free_at, now - self._burst_s) + took_s / self._share
