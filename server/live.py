"""Live diagnosis: per-rank summaries in memory, one worker that diagnoses jobs as data arrives.

Ingest hands every committed snapshot to `LiveDiagnosis.submit` (cheap: a list append). The worker
folds pending snapshots into each rank's `RankSummary` (`add_entries`), and diagnoses a job once
its batches have been quiet for `diagnosis_debounce_s` (a burst from all ranks gives one
diagnosis), and every `diagnosis_interval_s` while the job is active, because a hang shows up
precisely when nothing new arrives. One worker thread: one diagnosis at a time, per job and overall.
Summaries missing from memory (after a restart, or for a job another server ingested) are rebuilt
from the database's entries. The findings are reconciled with the stored ones (`store.apply_findings`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flightdeck.analysis import Finding, Options, RankSummary, Report, add_entries, diagnose
from flightdeck.analysis.config_skew import PeerJob
from flightdeck.analysis.findings import CONFIG_KINDS, MISMATCH_KINDS
from flightdeck.analysis.packed import pack_track
from flightdeck.analysis.summary import GroupTrack, fingerprint, signature_of
from flightdeck.server import store
from flightdeck.server.cluster import Cluster
from flightdeck.server.db import Database
from flightdeck.server.decode_gate import DecodeGate
from flightdeck.server.settings import ServerSettings
from flightdeck.wire import Snapshot

log = logging.getLogger(__name__)

NS = 1_000_000_000
#: How far back (in `stall_after_s`) a job whose batches arrive late is judged at most.
MAX_JUDGED_LAG = 4
#: A batch at most this old on arrival is on time (push delay, clock skew): judged by the clock.
ON_TIME_LAG_S = 1.0
Clock = Callable[[], int]

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
    process group, at most `max_summary_seqs` (8,192) collectives packed at about 5 bytes each
    (`flightdeck.analysis.packed`: sequence id, fingerprint, enqueue time, op id), its last
    `TAIL` entries in full and a stack per signature; the member lists of a group are one object
    per job (`intern_members`). That is ranks x groups x collectives held x ~5 B plus ~10 KB a
    rank: a job of 1,024 ranks x 2,000 collectives holds ≈ 19 MiB of objects; its share of the
    server's RSS measured -6 to +23 MiB once the store's caches had filled (`bench/server_memory.py`,
    docs/performance.md "Server memory"). When the job ends the
    summaries go once no batch of it came for `stall_after_s` (`LiveDiagnosis.release`), the rest
    `ended_series_s` later; an idle job's after `job_idle_s`. A restart rebuilds them a few
    ranks at a time (`LiveDiagnosis._rebuild`).
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
    #: loaded at start (see `LiveDiagnosis._filling_in`).
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
    #: exported across a restart (Prometheus' first scrape must not see it resolved).
    restored: list[Finding] = field(default_factory=list)
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
    #: Distinct process-group member lists of the job, one object each (see `_apply`).
    member_lists: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    #: id() of each of those lists -> its lowest rank (the rank that counts the group's collectives).
    lowest_member: dict[int, int] = field(default_factory=dict)

    def intern_members(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """The job's one object for this member list (kept alive by `member_lists`)."""
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

    def lags(self) -> list[tuple[float, float, bool]]:
        """`batch_lag`'s values, copied: ingest threads add collectors while the worker reads
        (one C call under the GIL, so the copy is whole; iterating the dict itself raised
        "dictionary changed size during iteration" when a host's first batch came in)."""
        return list(self.batch_lag.values())


def _stored_finding(data: dict[str, Any]) -> Finding:
    """A stored finding (`Finding.to_json()`) with the fields the metrics read."""
    elapsed = data.get("elapsed_s")
    return Finding(
        kind=data["kind"],
        detail=str(data.get("detail") or ""),
        process_group=data.get("process_group"),
        collective_seq_id=data.get("collective_seq_id"),
        op=data.get("op"),
        culprit_ranks=[int(r) for r in data.get("culprit_ranks") or []],
        waiting_ranks=[int(r) for r in data.get("waiting_ranks") or []],
        elapsed_s=None if elapsed is None else float(elapsed),
    )


def job_status(report: Report, summaries: Sequence[RankSummary], world_size: int | None) -> str:
    """The status of a running job implied by a diagnosis (mismatch > hung > lost > slow >
    finished > running; an ended job's is `end_state`'s)."""
    kinds = {f.kind for f in report.findings}
    if kinds & MISMATCH_KINDS:
        return "mismatch"
    if kinds & {"hang", "state_mismatch"}:
        return "hung"
    if "rank_lost" in kinds:
        return "lost"
    if kinds & {"slow_rank", "straggler"}:
        return "slow"
    expected = world_size or report.expected_ranks
    if summaries and len(summaries) >= expected and all(s.kind == "final" for s in summaries):
        return "finished"
    return "running"


#: Findings that make a job that ends with one open `failed` (the others are context or advice).
FAULT_KINDS = MISMATCH_KINDS | {"hang", "slow_rank", "state_mismatch", "rank_lost"}
#: How the agent's final snapshot on SIGTERM / SIGINT starts its `exception` ("terminated by SIGTERM").
KILLED_PREFIXES = ("terminated by ", "interrupted by ")
#: Findings that data still arriving could refute: not opened while a job's picture fills in
#: (`filling_in`). A mismatch between ranks already seen, or their configuration, stays true.
REFUTABLE_KINDS = frozenset({"hang", "slow_rank", "state_mismatch", "rank_lost", "missing_dump", "undecided"})


def job_end(summaries: dict[int, RankSummary], gone: dict[int, int], expected: int) -> int | None:
    """When the job ended: once each of its `expected` ranks has written its final snapshot or
    was reported gone, the latest of those times (epoch ns); None while one still runs."""
    ranks = summaries.keys() | gone.keys()
    if not ranks or len(ranks) < expected:
        return None
    end = 0
    for r in ranks:
        s = summaries.get(r)
        if s is not None and s.kind == "final":
            end = max(end, s.snapshot_time_ns or 0)
        elif r in gone:
            end = max(end, gone[r], (s.snapshot_time_ns or 0) if s is not None else 0)
        else:
            return None
    return end


def end_state(open_kinds: set[str], summaries: dict[int, RankSummary], gone: dict[int, int]) -> str:
    """How an ended job ended: `failed` with a fault open at the end, a rank whose process ended
    without a final snapshot (gone), or a final snapshot with an exception (a crash, or killed:
    `KILLED_PREFIXES`); else `finished`."""
    if open_kinds & FAULT_KINDS:
        return "failed"
    for r in summaries.keys() | gone.keys():
        s = summaries.get(r)
        if s is None or s.kind != "final" or s.exception:
            return "failed"
    return "finished"


#: Seconds a state_mismatch must hold before it is stored (and pages). When a long wait ends (a
#: busy rank joins at last), the rank that left the collective may be snapshotted finished before
#: its peers' next snapshots, up to an interval and a push later, show it finished too: measured
#: once in four 3-minute busy runs, open for about a second. Two 1 s intervals cover that.
STATE_MISMATCH_HOLD_S = 3.0

MismatchKey = tuple[str | None, int | None]


def settle_state_mismatches(
    report: Report, since: dict[MismatchKey, int], now_ns: int, hold_s: float = STATE_MISMATCH_HOLD_S
) -> tuple[dict[MismatchKey, int], set[MismatchKey]]:
    """When each state_mismatch of `report` was first diagnosed (carried over from `since`), and
    which of them have not held for `hold_s` yet."""
    held: dict[MismatchKey, int] = {}
    for f in report.findings:
        if f.kind == "state_mismatch":
            key = (f.process_group, f.collective_seq_id)
            held[key] = since.get(key, now_ns)
    young = {k for k, t in held.items() if now_ns - t < hold_s * NS}
    return held, young


def live_findings(
    report: Report,
    *,
    job_age_s: float,
    grace_s: float,
    unsettled: set[MismatchKey] | None = None,
    filling_in: bool = False,
    open_keys: set[store.FindingKey] | None = None,
) -> list[Finding]:
    """The findings worth storing from a live diagnosis.

    A job whose ranks are still coming up has no dump from some of them, and no collective yet:
    `missing_dump` within the first `grace_s` and `undecided` are the normal state of a starting
    job, not findings (the offline analyzer, which sees a finished picture, keeps them). Neither is
    a state_mismatch in `unsettled` (`settle_state_mismatches`): it may be the peers' snapshots
    lagging the end of a collective. While the job's picture is `filling_in` (ranks still
    arriving, a collector catching up), a finding of `REFUTABLE_KINDS` is kept only if it is open
    already (`open_keys`): the data on its way could refute it. `consequence_of` indexes are
    renumbered to the kept list.
    """
    young = unsettled or set()
    held = open_keys or set()
    keep = [
        i
        for i, f in enumerate(report.findings)
        if f.kind != "undecided"
        and not (f.kind == "missing_dump" and job_age_s < grace_s)
        and not (f.kind == "state_mismatch" and (f.process_group, f.collective_seq_id) in young)
        and not (filling_in and f.kind in REFUTABLE_KINDS and store.finding_key(f) not in held)
    ]
    if len(keep) == len(report.findings):
        return report.findings
    new_index = {old: new for new, old in enumerate(keep)}
    out = []
    for i in keep:
        f = report.findings[i]
        if f.consequence_of is not None:
            f.consequence_of = new_index.get(f.consequence_of)
        out.append(f)
    return out


def fold_entries(s: RankSummary, snap: Snapshot) -> None:
    """Fold a snapshot's entries into its rank's summary."""
    c = snap.columns
    if c is None:
        add_entries(s, snap.entries)
    else:  # each signature's fingerprint once per signature table, not once per entry
        table = [fingerprint(signature_of(op, i, o, idt, odt)) for _, op, _, _, i, o, idt, odt in c.sigs]
        add_entries(s, snap.entries, map(table.__getitem__, c.sig))


def _malloc_trim() -> None:
    """Give the C heap's free memory back to the system (glibc's `malloc_trim`; elsewhere nothing)."""
    global _trim
    if _trim is None:
        name = ctypes.util.find_library("c")
        fn = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
        _trim = fn if fn is not None else False
    if _trim:
        _trim(0)


_trim: Any = None

#: Entries folded in (from batches or a rebuild) after which the worker hands the C heap's free
#: memory back (`malloc_trim`) once the burst is over (or after ten times as many meanwhile).
TRIM_AFTER_ENTRIES = 100_000

#: Least time between two steps of the worker (folds, diagnoses): see `LiveDiagnosis._run`.
STEP_GAP_S = 0.05


class DiagnosisBudget:
    """The share of a core that all jobs' diagnoses together may take (`diagnosis_max_share`).

    Each job's own spacing (`JobState.diagnosis_s`) keeps one large job to that share; without
    a common budget ten of them took ten shares, a whole core: with ten open 1,024-rank jobs
    on SQLite the incident page took 486 ms instead of 154 ms with nothing diagnosed beside it
    (docs/performance.md). Virtual time: each diagnosis of `d` seconds moves the next allowed
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


class LiveDiagnosis:
    """In-memory summaries of the active jobs and the worker that diagnoses them."""

    def __init__(
        self,
        *,
        db: Database,
        settings: ServerSettings,
        clock: Clock,
        on_events: Callable[[JobState, list[store.FindingEvent]], None],
        on_db_error: Callable[[], None],
        decode_gate: DecodeGate,
        monotonic: Callable[[], float] = time.monotonic,
        record_events: Callable[[Session, JobState, list[store.FindingEvent]], None] | None = None,
        observe_duration: Callable[[float], None] | None = None,
        schema_problem: Callable[[BaseException], str | None] | None = None,
    ) -> None:
        """`on_events` runs after the findings' transaction commits; `record_events` inside it
        (the webhook outbox: an event is stored if and only if its finding change is);
        `observe_duration` gets the seconds of each job's diagnosis; `schema_problem` says
        whether a failed step is explained by a vanished schema (`SchemaGuard.explains`: logged
        once there, not once per step here); `decode_gate` is held during each worker step
        (`run_step`), the ingest threads wait on it."""
        self._schema_problem = schema_problem
        self._db = db
        self._settings = settings
        self._clock = clock
        self._mono = monotonic
        self._on_events = on_events
        self._record_events = record_events
        self._on_db_error = on_db_error
        self._observe_duration = observe_duration
        self._options = Options(
            stall_after_s=settings.stall_after_s,
            lost_after_intervals=settings.lost_after_intervals,
            slow_ceiling_s=settings.slow_ceiling_s,
        )
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._decode_gate = decode_gate
        self._thread: threading.Thread | None = None
        self.jobs: dict[int, JobState] = {}
        #: collector host -> server clock (epoch ns) of its latest batch, heartbeats included.
        self.heard_ns: dict[str, int] = {}
        #: Several servers on one PostgreSQL: which jobs this process diagnoses (see cluster.py).
        self.cluster = Cluster(db=db, clock=clock, on_db_error=on_db_error) if settings.cluster else None
        #: job id -> monotonic time of the last try to own it (cluster mode).
        self._claim_tried: dict[int, float] = {}
        #: Entries folded in since the C heap was last trimmed (`step`).
        self._untrimmed = 0
        self._budget = DiagnosisBudget(
            share=settings.diagnosis_max_share, burst_s=settings.diagnosis_interval_s
        )

    # --- lifecycle ------------------------------------------------------------------------------

    def load(self) -> None:
        """Know the recent jobs: not ended and seen within `job_idle_s` (memory and /metrics hold
        those only; the others stay in the store and on the pages). They are marked for a rebuild
        of their summaries from the database, so a hang is still found after a restart; until then
        their open findings are exported as stored (`JobState.restored`). With several replicas
        nothing is restored: a job's owner exports it, and a process taking a job over exports
        it from its own first diagnosis (restored findings could be stale by then)."""
        now_ns = self._clock()
        since = now_ns - int(self._settings.job_idle_s * NS)
        with self._db.read() as session:
            for j, heard_ns in store.recent_jobs(session=session, since_ns=since):
                restored = (
                    [_stored_finding(row.data) for row in store.open_findings(session=session, job_id=j.id)]
                    if self.cluster is None
                    else []
                )
                self.jobs[j.id] = JobState(
                    restored=restored,
                    job_id=j.id,
                    name=j.name,
                    attempt=j.attempt,
                    world_size=j.world_size,
                    status=j.status,
                    last_seen_ns=j.last_seen_ns,
                    heard_ns=heard_ns,
                    first_seen_ns=j.first_seen_ns,
                    dirty=True,
                )

    def start(self) -> None:
        """Start the worker thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="flightdeck-diagnosis", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the worker thread (finishes the diagnosis in progress)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self.cluster is not None:
            self.cluster.close()

    def _run(self) -> None:
        tick = max(0.02, min(0.1, self._settings.diagnosis_debounce_s / 4))
        gap = min(STEP_GAP_S, tick)
        while not self._stop.is_set():
            try:
                self.run_step()
            except Exception as exc:  # the worker must outlive any one bad job or DB hiccup
                if self._schema_problem is None or self._schema_problem(exc) is None:
                    log.exception("diagnosis step failed")
            # A wake-up (each ingest commit) ends the wait, but not before STEP_GAP_S: under
            # load commits come every few ms, and a step per commit spent more on its own
            # overhead and on holding decoding back (`run_step`) than on folding.
            if self._stop.wait(gap):
                return
            self._wake.wait(tick - gap)
            self._wake.clear()

    # --- ingest side ----------------------------------------------------------------------------

    def submit(
        self, result: store.IngestResult, *, source: str = "", lag_s: float = 0.0, skew_free: bool = True
    ) -> None:
        """Queue a committed batch's snapshots for their jobs (called by ingest, after commit).

        `source` is the collector that sent it and `lag_s` how old the batch was on arrival;
        `skew_free`: measured without comparing the collector's clock with ours.
        """
        now = self._mono()
        now_ns = self._clock()
        # Per job, the oldest and newest snapshot time of the batch (what the ranks say happened).
        span: dict[int, tuple[int, int]] = {}
        for a in result.snapshots:
            t = min(a.snapshot.snapshot_time_ns or now_ns, now_ns)
            lo, hi = span.get(a.job_id, (t, t))
            span[a.job_id] = (min(lo, t), max(hi, t))
        with self._lock:
            if source:
                self.heard_ns[source] = now_ns
            for job_id, (name, attempt) in result.jobs.items():
                js = self.jobs.get(job_id)
                oldest, newest = span.get(job_id, (0, 0))
                if js is None:
                    created = job_id in result.created_jobs
                    # A job this process has never seen may hold rows another server wrote.
                    js = self.jobs[job_id] = JobState(
                        job_id=job_id,
                        name=name,
                        attempt=attempt,
                        summaries={} if created else None,
                        first_seen_ns=oldest or now_ns,
                    )
                if js.arrived_ns is None:
                    js.arrived_ns = now_ns
                if newest:
                    js.last_seen_ns = max(js.last_seen_ns, newest)
                    js.data_lag[source] = ((js.last_seen_ns - newest) / NS, now)
                js.last_ingest = now
                js.heard_ns = now_ns
                js.batch_lag[source] = (lag_s, now, skew_free)
                if not js.dirty:
                    js.dirty = True
                    js.dirty_since = now
            for g in result.gone:
                js = self.jobs[g.job_id]
                js.gone[g.rank] = g.gone_at_ns
            if self.cluster is not None:
                # The owner folds every batch in feed order, its own ones included (cluster.py).
                self.cluster.remember(result.feed_ids, result.snapshots)
                return
            for applied in result.snapshots:
                js = self.jobs[applied.job_id]
                js.pending.append(applied.snapshot)
                if applied.snapshot.world_size:
                    js.world_size = applied.snapshot.world_size

    # --- worker side ----------------------------------------------------------------------------

    def run_step(self) -> int:
        """`step`, with the ingest threads' decoding held back while it runs (see decode_gate.py);
        decoding goes on while a job's summaries are rebuilt from the database (`_fold`)."""
        with self._decode_gate.hold():
            return self.step()

    def step(self, *, force: bool = False) -> int:
        """Fold pending snapshots in and diagnose the jobs that are due; returns how many were.

        `force` diagnoses every job that has summaries or pending data, due or not (tests).
        """
        now = self._mono()
        now_ns = self._clock()
        s = self._settings
        due: list[JobState] = []
        released: list[JobState] = []
        with self._lock:
            jobs = list(self.jobs.values())
        if self.cluster is not None:
            jobs = self._cluster_step(jobs, now, now_ns)
        before = self._untrimmed
        for js in jobs:
            if self._expired(js, now_ns):
                continue
            self._fold(js)
            if (
                js.ended_at_ns is not None
                and js.summaries is not None
                and not (js.dirty or js.pending)
                and now - js.last_ingest >= s.stall_after_s
            ):
                # Ended and diagnosed, and no batch since for a while (the late final snapshots
                # of a job going down come within that): its memory goes back (`release`).
                released.append(js)
                continue
            if not force and self._replaying(js, now):
                continue
            idle = (now_ns - js.heard_ns) / NS > s.job_idle_s
            # A large job's diagnosis takes long: space them so it gets at most its share of a core.
            rested = now - js.last_diagnosis >= js.diagnosis_s / s.diagnosis_max_share
            if js.dirty:
                quiet = now - js.last_ingest >= s.diagnosis_debounce_s
                # A job that never goes quiet (thousands of ranks pushing in turn) still gets looked at.
                starving = now - js.dirty_since >= max(2.0, 4 * s.diagnosis_debounce_s)
                if force or ((quiet or starving) and rested):
                    due.append(js)
            elif (
                js.summaries is not None
                and not idle
                and (
                    force
                    or (
                        js.ended_at_ns is None
                        and rested
                        and now - js.last_diagnosis >= s.diagnosis_interval_s
                    )
                )
            ):
                due.append(js)
            elif idle and js.summaries is not None and not js.pending:
                js.summaries = None  # memory: rebuilt from the database should the job return
        folding = self._untrimmed > before
        if released:
            self.release(released)
        elif self._untrimmed >= TRIM_AFTER_ENTRIES and (
            not folding or self._untrimmed >= 10 * TRIM_AFTER_ENTRIES
        ):
            # A burst folded in (a job's backfill, a rebuild) leaves its transient memory (the
            # decoded batches, their records) with the C heap of each thread: handed back once
            # the burst is over, or every so often while it goes on. Measured in process: 40 MiB
            # of 66 a 256-rank x 2,000-collective job added to RSS (docs/performance.md).
            self._untrimmed = 0
            _malloc_trim()
        # Jobs with new data first, then the longest undiagnosed: what the budget leaves for a
        # later step is the re-diagnosis of a job that has changed least.
        due.sort(key=lambda js: (not js.dirty, js.last_diagnosis))
        done = 0
        for js in due:
            if not force and self._budget.spent(self._mono()):
                break
            started = time.perf_counter()
            self.diagnose_job(js)
            took = time.perf_counter() - started
            self._budget.charge(self._mono(), took)
            if self._observe_duration is not None:
                self._observe_duration(took)
            done += 1
        return done

    def release(self, jobs: Sequence[JobState]) -> None:
        """Drop the summaries of ended jobs and hand the memory back to the system.

        An ended job's diagnosis changes only when a snapshot newer than its end arrives, and
        that rebuilds them from the store (`_fold`). Every object of the summaries is freed
        (in process, 0.2 MiB of a 256-rank job's 33 stayed traced), but much of the memory stays
        with the process, fragmented (CPython's arenas, glibc's heaps): `gc.collect` and
        `malloc_trim` hand back what they can (docs/performance.md, "Server memory").
        """
        for js in jobs:
            js.summaries = None
            js.released = True
        gc.collect()
        _malloc_trim()

    def _expired(self, js: JobState, now_ns: int) -> bool:
        """Drop an ended job's state `ended_series_s` after its end (its series leave /metrics;
        a late snapshot brings it back from the store, still ended unless newer than the end).
        Counted from the later of the end and when the server last heard of the job: the end is a
        snapshot time, which copied dumps or a skewed clock put long before the server saw it."""
        if js.ended_at_ns is None:
            return False
        if now_ns - max(js.ended_at_ns, js.heard_ns) < self._settings.ended_series_s * NS:
            return False
        with self._lock:
            if js.pending:
                return False
            self.jobs.pop(js.job_id, None)
            self._claim_tried.pop(js.job_id, None)
        if self.cluster is not None and js.job_id in self.cluster.owned:
            self.cluster.release(js.job_id)
        return True

    def _cluster_step(self, jobs: list[JobState], now: float, now_ns: int) -> list[JobState]:
        """Own what can be owned, release idle jobs, queue the feed's new snapshots of the owned
        jobs; returns the owned jobs (the others are diagnosed by another process)."""
        c = self.cluster
        assert c is not None
        idle_s = self._settings.job_idle_s
        housekept = c.housekeeping()
        if housekept:
            if not c.check():
                for js in jobs:
                    js.summaries = None
            jobs = self._discover(jobs, now_ns)
        want = []
        for js in jobs:
            active = (now_ns - js.heard_ns) / NS <= idle_s
            if js.job_id in c.owned:
                if not active:
                    c.release(js.job_id)
                    js.summaries = None
            elif active and now - self._claim_tried.get(js.job_id, -1e9) >= 1.0:
                self._claim_tried[js.job_id] = now
                want.append(js.job_id)
        for job_id in c.claim(want):
            js = self.jobs[job_id]
            with self._lock:
                js.pending.clear()
                js.summaries = None  # rebuilt from the database, then the feed from there on
                js.dirty = True
                js.dirty_since = now
        owned = [js for js in jobs if js.job_id in c.owned]
        for js in jobs:
            if js.job_id not in c.owned:
                js.summaries = None
        if housekept and owned:
            self._learn_gone([js for js in owned if js.ended_at_ns is None])
        feed = c.read({js.job_id: (js.name, js.attempt) for js in owned if js.summaries is not None})
        for job_id, snaps in feed.items():
            js = self.jobs[job_id]
            with self._lock:
                js.pending.extend(snaps)
                js.world_size = next((x.world_size for x in reversed(snaps) if x.world_size), js.world_size)
                newest = max((min(x.snapshot_time_ns, now_ns) for x in snaps), default=0)
                js.last_seen_ns = max(js.last_seen_ns, newest)
                js.heard_ns = now_ns
                js.last_ingest = now
                if not js.dirty:
                    js.dirty = True
                    js.dirty_since = now
        return owned

    def _learn_gone(self, jobs: list[JobState]) -> None:
        """The gone reports other processes ingested for these owned jobs (the feed carries the
        snapshots only): read from the store every `cluster.HOUSEKEEPING_S`."""
        try:
            with self._db.read() as session:
                gone = store.gone_ranks(session=session, job_ids=[js.job_id for js in jobs])
        except OperationalError:
            self._on_db_error()
            return
        now = self._mono()
        with self._lock:
            for js in jobs:
                new = gone.get(js.job_id, {})
                if new.keys() - js.gone.keys():
                    js.gone.update(new)
                    if not js.dirty:
                        js.dirty = True
                        js.dirty_since = now

    def _discover(self, jobs: list[JobState], now_ns: int) -> list[JobState]:
        """Learn the active jobs other processes ingested (to take them over should their owner
        die) and the status of the jobs this process does not own."""
        since = now_ns - int(self._settings.job_idle_s * NS)
        try:
            with self._db.read() as session:
                rows = store.active_jobs(session=session, since_ns=since)
        except OperationalError:
            self._on_db_error()
            return jobs
        owned = self.cluster.owned if self.cluster is not None else set()
        with self._lock:
            for r in rows:
                js = self.jobs.get(r.id)
                if js is None:
                    js = self.jobs[r.id] = JobState(
                        job_id=r.id,
                        name=r.name,
                        attempt=r.attempt,
                        world_size=r.world_size,
                        status=r.status,
                        first_seen_ns=r.first_seen_ns,
                    )
                js.last_seen_ns = max(js.last_seen_ns, r.last_seen_ns)
                js.heard_ns = max(js.heard_ns, r.heard_ns)
                if r.id not in owned:
                    js.status = r.status
                    js.ended_at_ns = r.ended_at_ns
            return list(self.jobs.values())

    def _fold(self, js: JobState) -> None:
        with self._lock:
            pending, js.pending = js.pending, []
        if js.summaries is None:
            if not js.dirty and not pending:
                return
            if js.released and js.ended_at_ns is not None:
                for snap in pending:
                    if snap.snapshot_time_ns > js.rank_seen_ns.get(snap.rank, 0):
                        js.rank_seen_ns[snap.rank] = snap.snapshot_time_ns
                if max(js.rank_seen_ns.values(), default=0) <= js.ended_at_ns:
                    # Ended, and nothing newer than its end came (a late batch from before it, a
                    # gone report): the diagnosis would change nothing (`diagnose_job`), so the
                    # summaries stay released.
                    return
            # Reads the rows the pending snapshots were committed as: seconds for a large job,
            # mostly waiting for the database, so decoding is not held back meanwhile.
            with self._decode_gate.let_through():
                self._rebuild(js)
            return
        for snap in pending:
            self._apply(js, snap)

    def _rebuild(self, js: JobState) -> None:
        """Summaries of every rank of the job from the database (restart, or another server's job).

        The entries are read and folded in a few ranks at a time (`store.rank_entries`): all of a
        1,024-rank x 2,000-collective job's entries as records at once took 1.2 GB."""
        from flightdeck.records import GroupInfo

        summaries: dict[int, RankSummary] = {}
        gone: dict[int, int] = {}
        seen: dict[int, int] = {}
        try:
            with self._db.read() as session:
                if self.cluster is not None:
                    # One snapshot for the rows and the feed ids they include (cluster.py).
                    session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                    self.cluster.mark_seen(session, js.job_id)
                job = store.get_job_by_id(session=session, job_id=js.job_id)
                if job is None:
                    return
                js.world_size = job.world_size
                js.ended_at_ns = job.ended_at_ns
                if job.ended_at_ns is not None:
                    js.status = job.status
                js.last_seen_ns = max(js.last_seen_ns, job.last_seen_ns)
                ranks = store.job_ranks(session=session, job_id=js.job_id)
                groups = {g.name: g for g in store.job_groups(session=session, job_id=js.job_id)}
                sids = {sid for r, _ in ranks for _, _, sid in (r.thread_stacks or []) if sid is not None}
                sids |= store.progress_stack_ids(r for r, _ in ranks)
                stacks = store.stacks_by_id(session=session, ids=sids)
                configs = store.rank_configs(session=session, job_id=js.job_id)
                # The job's groups, one object each, shared by every rank (a world-sized member
                # list per rank would be ranks x world ints; diagnosis counts member lists by object).
                js.member_lists, js.lowest_member = {}, {}
                infos = {
                    n: GroupInfo(n, g.desc, None if g.ranks is None else js.intern_members(tuple(g.ranks)))
                    for n, g in groups.items()
                }
                for r, host in ranks:
                    summaries[r.rank] = RankSummary(
                        rank=r.rank,
                        source="db",
                        job=js.name,
                        attempt=js.attempt,
                        world_size=r.world_size,
                        host=host,
                        pid=r.pid,
                        backend=r.backend,
                        version=r.version,
                        snapshot_time_ns=r.last_snapshot_ns,
                        kind=r.kind,
                        interval_s=r.interval_s,
                        exception=r.exception,
                        wrapped=r.wrapped,
                        groups=dict(infos),
                        thread_stacks=store.thread_stacks_of(r, stacks),
                        config=configs.get(r.rank),
                        progress=store.progress_of(r, stacks),
                    )
                    seen[r.rank] = r.last_snapshot_ns
                    if r.gone_at_ns is not None:
                        gone[r.rank] = r.gone_at_ns
                for rank, entries in store.rank_entries(
                    session=session, job_id=js.job_id, ranks=list(summaries)
                ):
                    s = summaries[rank]
                    add_entries(s, entries)
                    self._untrimmed += len(entries)
                    for t in s.tracks.values():
                        pack_track(t)
        except OperationalError:
            self._on_db_error()
            return
        js.gone = gone
        js.rank_seen_ns.update(seen)
        js.summaries = summaries
        js.released = False
        js.agreed = {}
        js.dirty = True

    def _apply(self, js: JobState, snap: Snapshot) -> None:
        assert js.summaries is not None
        if snap.snapshot_time_ns == js.rank_seen_ns.get(snap.rank):
            # The rank's newest snapshot again (a restarted collector re-sending what it shipped):
            # nothing to learn. An older one changes no metadata below, and its entries only fill
            # in what the newer ones lacked (`add_entries` moves no state back).
            return
        if snap.snapshot_time_ns > js.gone.get(snap.rank, snap.snapshot_time_ns):
            del js.gone[snap.rank]  # seen again after it was reported gone
        s = js.summaries.get(snap.rank)
        if s is None:
            s = js.summaries[snap.rank] = RankSummary(rank=snap.rank, source=snap.source, job=js.name)
        if snap.snapshot_time_ns >= (s.snapshot_time_ns or 0):
            s.attempt = snap.attempt
            s.source = snap.source or s.source
            s.world_size = snap.world_size or s.world_size
            s.host = snap.host or s.host
            s.pid = snap.pid or s.pid
            s.backend = snap.backend or s.backend
            s.version = snap.version or s.version
            s.snapshot_time_ns = snap.snapshot_time_ns
            s.kind = snap.kind
            s.interval_s = snap.interval_s or s.interval_s
            s.exception = snap.exception or s.exception
            s.wrapped = snap.wrapped
            if snap.thread_stacks:
                s.thread_stacks = snap.thread_stacks
            if snap.config is not None:
                s.config = snap.config
            if snap.progress is not None:
                s.progress = snap.progress
            js.rank_seen_ns[snap.rank] = snap.snapshot_time_ns
        for name, g in snap.groups.items():
            old = s.groups.get(name)
            ranks = g.ranks or (old.ranks if old else None)
            if ranks is not None:
                # One object per distinct member list of the job: diagnosis counts them by object.
                ranks = js.intern_members(ranks)
            s.groups[name] = type(g)(name, g.desc or (old.desc if old else ""), ranks)
        fold_entries(s, snap)
        self._count_collectives(js, s, snap)
        cap = self._settings.max_summary_seqs
        self._untrimmed += len(snap.entries)
        for t in s.tracks.values():
            pack_track(t)  # a new group's track comes as plain arrays (`add_entries`)
            if len(t.seqs) > cap:
                cut = len(t.seqs) - cap
                del t.seqs[:cut], t.fps[:cut], t.created_ns[:cut]
                if len(t.op_ids) > cap:
                    del t.op_ids[: len(t.op_ids) - cap]
            if len(t.p2p) > cap:
                del t.p2p[: len(t.p2p) - cap]

    def _count_collectives(self, js: JobState, s: RankSummary, snap: Snapshot) -> None:
        """Count each collective once: on the lowest member rank of its group."""
        names = snap.columns.cols["g"] if snap.columns is not None else [e.group for e in snap.entries]
        counted: set[str] = set()  # the groups whose lowest member is this rank
        for name in dict.fromkeys(names):
            info = s.groups.get(name)
            if info is not None and info.ranks:
                # Known when interned; min() over a world-sized list per snapshot was most of
                # the cost of folding snapshots in at thousands of ranks.
                lowest = js.lowest_member.get(id(info.ranks))
                if lowest is None:
                    lowest = min(info.ranks)
            else:
                # Members unknown: which rank counts is unclear, so none does (but the default
                # group's lowest member is rank 0).
                lowest = 0 if name == "0" else None
            if lowest == snap.rank:
                counted.add(name)
        if not counted:
            return  # most ranks are the lowest member of none of their groups
        for e in snap.entries:
            if e.group in counted and not e.is_p2p and e.collective_seq_id > js.counted_seq.get(e.group, 0):
                js.counted_seq[e.group] = e.collective_seq_id
                js.collectives[(e.group, e.op)] += 1

    def _replaying(self, js: JobState, now: float) -> bool:
        """Whether to hold the job's diagnosis back: a collector is replaying old batches.

        After an outage a collector sends what it queued, oldest first. Judged by the clock, every
        collective pending in those old snapshots would look hung for a moment, and a webhook
        could restart a healthy job. So while a collector's latest batch for the job arrived
        older than half of `stall_after_s` (at least 5 s, above ordinary push delay and clock
        skew), the verdict waits for the newer batches; for at most `stall_after_s`, so that a
        collector stuck mid-replay or a server that is always behind does not hide a real hang.
        """
        threshold = self._late_after_s()
        if not any(lag > threshold for lag, _, _ in js.lags()):
            js.replaying_since = None
            return False
        if js.replaying_since is None:
            js.replaying_since = now
            log.info(
                "job %s: a collector is replaying old batches; its diagnosis waits for newer ones", js.name
            )
        return now - js.replaying_since < self._settings.stall_after_s

    def _late_after_s(self) -> float:
        """A batch older than this on arrival is late: above ordinary push delay and clock skew."""
        return max(self._settings.stall_after_s / 2, 5.0)

    def _as_of_ns(self, js: JobState, now: float, now_ns: int) -> int:
        """The time at which the job is judged: the clock, or the time its data reaches while late.

        A server (or collector) falling behind delivers every snapshot late. Judged by the clock,
        each collective in flight at a snapshot would look pending for as long as its batch waited,
        and the ranks whose batches wait longest would look silent: false hangs and lost ranks
        under load. So while the job's batches arrive late (the latest batch of a collector was
        older than `ON_TIME_LAG_S` on arrival), the job is judged as of the time up to which every
        collector has delivered: per collector, its latest batch's age on arrival plus the time
        since; the stalest counts. A finding comes that much later, but never from delivery delay
        alone. Only collectors heard from in the last `MAX_JUDGED_LAG` x `stall_after_s` count (one
        cut off must not hold the job back for longer: its ranks are then judged silent), and an
        age that compares the collector's clock with ours (no `BATCH_AGE_HEADER`) counts for at
        most that much, so that a wrong clock cannot hide a hang for long. An age the collector
        measured is trusted however long: the server is that far behind, and judging older data by
        the clock would raise false alarms. On time, a collector that goes quiet is judged by the
        clock as before: a cut-off host is found within a few snapshot intervals.
        """
        limit = MAX_JUDGED_LAG * self._settings.stall_after_s
        recent = [
            (lag if skew_free else min(lag, limit), now - at)
            for lag, at, skew_free in js.lags()
            if now - at <= limit
        ]
        if max((lag for lag, _ in recent), default=0.0) <= ON_TIME_LAG_S:
            return now_ns
        return now_ns - int(max(lag + since for lag, since in recent) * NS)

    def _filling_in(self, js: JobState, now: float, now_ns: int, expected: int) -> bool:
        """Whether the job's picture is still being filled in. Within `job_settle_s` of the first
        data this process received of it, while its batches still come (the last less than
        `stall_after_s` ago): while fewer than `expected` ranks are in, or while its newest
        snapshot is older than `_late_after_s` (a collector shipping the history of a running job;
        the newer snapshots are queued behind). At any time: while a collector's latest batch for
        the job, less than `stall_after_s` ago, carried only snapshots `_late_after_s` older than
        the job's newest (it is catching up with the others). A picture complete and old (a job
        that ended before the collector started) is judged once its batches stop coming."""
        assert js.summaries is not None
        late = self._late_after_s()
        stall = self._settings.stall_after_s
        settling = (
            js.arrived_ns is not None
            and now_ns - js.arrived_ns < self._settings.job_settle_s * NS
            and now - js.last_ingest < stall
        )
        if settling and (len(js.summaries) < expected or now_ns - js.last_seen_ns > late * NS):
            return True
        return any(age > late and now - at < stall for age, at in list(js.data_lag.values()))

    def _ending(self, js: JobState, now_ns: int) -> bool:
        """Whether the job is going down: some of its ranks wrote their final snapshot (or were
        reported gone) less than `stall_after_s` ago and the others have not yet. A scheduler's
        SIGTERM reaches the ranks within moments of each other, but their final snapshots (and the
        collector's gone reports) arrive apart: a rank whose final is a second behind the others'
        is not lost, and a collective they all left is not hung."""
        assert js.summaries is not None
        ends = [s.snapshot_time_ns or 0 for s in js.summaries.values() if s.kind == "final"]
        ends += js.gone.values()
        return bool(ends) and now_ns - max(ends) < self._settings.stall_after_s * NS

    def _no_data(self, js: JobState, now_ns: int) -> bool:
        """Whether none of the job's ranks has sent a snapshot for `no_data_after_s` while a
        collector of the job still reports (its batches or heartbeats) and no rank is gone."""
        window = self._settings.no_data_after_s * NS
        if js.gone or not js.rank_seen_ns or now_ns - max(js.rank_seen_ns.values()) < window:
            return False
        heard = dict(self.heard_ns)
        return any(now_ns - heard.get(host, 0) < window for host in list(js.batch_lag))

    def diagnose_job(self, js: JobState) -> None:
        """Diagnose one job now and store the outcome (findings, status, report)."""
        now_mono = self._mono()
        with self._lock:
            js.dirty = False
        js.last_diagnosis = now_mono
        if not js.summaries:
            return
        now_ns = self._clock()
        newest = max(js.rank_seen_ns.values(), default=0)
        if js.ended_at_ns is not None:
            if newest <= js.ended_at_ns:
                return  # ended: a late snapshot from before the end changes nothing
            end = js.ended_at_ns
            if any(s.kind != "final" for s in js.summaries.values() if (s.snapshot_time_ns or 0) > end):
                log.info("job %s: a snapshot newer than its end arrived; it runs again", js.name)
                js.ended_at_ns = None
                js.status = "running"
            # Else final snapshots written after the ranks were reported gone (their last words
            # came late): still ended, its end moved to them below; nothing reopens.
        summaries = list(js.summaries.values())
        expected = js.world_size or max((s.world_size or 0 for s in summaries), default=0) or len(summaries)
        ended_at = job_end(js.summaries, js.gone, expected)
        dirs = sorted({s.config.checkpoint_dir for s in summaries if s.config and s.config.checkpoint_dir})
        peers: list[PeerJob] = []
        if dirs:
            # Cross-job rule (checkpoints shared across torch 2.14 / 2.15): the jobs sharing a dir.
            try:
                with self._db.read() as session:
                    peers = store.checkpoint_peers(session=session, job_name=js.name, dirs=dirs)
            except OperationalError:
                self._on_db_error()
        # The straggler analysis is the costliest part on large jobs, and no emergency: when the
        # diagnoses are spaced by their cost, it runs at most every fourth of them.
        every = max(
            self._settings.straggler_interval_s, 4 * js.diagnosis_s / self._settings.diagnosis_max_share
        )
        stragglers = now_mono - js.last_stragglers >= every
        started = time.perf_counter()
        report = diagnose(
            summaries,
            # An ended job is judged as of its end: the elapsed times of what was open freeze there.
            now_ns=min(ended_at, now_ns) if ended_at is not None else self._as_of_ns(js, now_mono, now_ns),
            options=self._options,
            world_size=js.world_size,
            job=js.name,
            peers=peers,
            stragglers=stragglers,
            agreed=js.agreed,
        )
        js.agreed = report.agreed
        # Wall time, waits for the GIL included: a busy process diagnoses less often. (Spaced by
        # CPU time instead, a 4,096-rank job was diagnosed three times as often, took 0.6 of the
        # process's time and its ingest fell further behind: docs/dev/performance-history.md,
        # "Sixth session".)
        js.diagnosis_s = time.perf_counter() - started
        if stragglers:
            js.last_stragglers = now_mono
        elif js.report is not None and all(f.kind in CONFIG_KINDS for f in report.findings):
            # Between straggler analyses the last verdict stands (diagnose adds stragglers only to
            # an otherwise healthy job, ahead of the configuration findings, which link to nothing).
            report.findings[:0] = [f for f in js.report.findings if f.kind == "straggler"]
        # Job age by the server's clock: snapshot times say when the ranks wrote, not when we heard.
        first_seen = js.first_seen_ns or now_ns
        js.state_mismatch_since, unsettled = settle_state_mismatches(report, js.state_mismatch_since, now_ns)
        open_before = list(js.report.findings) if js.report is not None else []
        held = ended_at is None and (
            self._filling_in(js, now_mono, now_ns, expected) or self._ending(js, now_ns)
        )
        report.findings = live_findings(
            report,
            job_age_s=(now_ns - first_seen) / NS,
            grace_s=self._settings.stall_after_s,
            unsettled=unsettled,
            filling_in=held,
            open_keys={store.finding_key(f) for f in open_before},
        )
        if held:
            # Nor does a partial picture resolve what is open: a job going down loses its hang
            # from the diagnosis of the moment some ranks are final and others not yet, and the
            # hang would read resolved instead of ended. It stays, as last seen.
            seen = {store.finding_key(f) for f in report.findings}
            report.findings += [
                replace(f, consequence_of=None) for f in open_before if store.finding_key(f) not in seen
            ]
        if ended_at is not None:
            # The faults open at the end: open before and still seen by the end's diagnosis.
            was_open = {store.finding_key(f) for f in open_before}
            open_kinds: set[str] = {f.kind for f in report.findings if store.finding_key(f) in was_open}
            status = end_state(open_kinds, js.summaries, js.gone)
        else:
            status = job_status(report, summaries, js.world_size)
            if status == "running" and self._no_data(js, now_ns):
                status = "no_data"
        try:
            with self._db.write() as session, session.begin():
                events = store.apply_findings(
                    session=session,
                    job_id=js.job_id,
                    findings=report.findings,
                    report=report.to_json(),
                    status=status,
                    now_ns=now_ns,
                    last_seen_ns=js.last_seen_ns or None,
                    ended_at_ns=ended_at,
                )
                if events and self._record_events is not None:
                    self._record_events(session, js, events)
        except OperationalError:
            self._on_db_error()
            with self._lock:
                js.dirty = True  # try again on the next tick
            return
        js.report = report
        js.status = status
        js.ended_at_ns = ended_at
        if ended_at is not None:
            log.info("job %s ended %s", js.name, status)
        self._update_gauges(js, report, now_ns)
        if events:
            self._on_events(js, events)

    def _update_gauges(self, js: JobState, report: Report, now_ns: int) -> None:
        assert js.summaries is not None
        oldest: dict[str, int] = {}
        # One pass over the ranks' tracks (not one per group: thousands of groups x ranks).
        by_group: dict[str, list[GroupTrack]] = {}
        for s in js.summaries.values():
            for g, t in s.tracks.items():
                if t.seqs:
                    by_group.setdefault(g, []).append(t)
        for g, holders in by_group.items():
            t_min: int | None = None
            for t in holders:
                for e in t.tail:
                    if not e.finished and (t_min is None or e.time_created_ns < t_min):
                        t_min = e.time_created_ns
            low = min(t.last_seq for t in holders)
            if any(t.last_seq > low for t in holders):
                # Entered by some ranks, not yet by the slowest: unfinished on that member.
                for t in holders:
                    i = t.index_of(low + 1)
                    if i is not None and (t_min is None or t.created_ns[i] < t_min):
                        t_min = t.created_ns[i]
            if t_min is not None:
                oldest[g] = t_min
            hi = low
            skews = report.arrival_skew_s.get(g)
            if skews:
                prev = js.skew_hi.get(g, 0)
                new = len(skews) if prev == 0 else max(0, min(len(skews), hi - prev))
                hist = js.skew.setdefault(g, SkewHistogram())
                for v in skews[len(skews) - new :]:
                    hist.observe(v)
                js.skew_hi[g] = max(prev, hi)
        js.oldest_unfinished_ns = oldest

    def forget_all(self) -> None:
        """Drop every job held (the database they came from is gone: a recreated one has none of
        their rows, and would give their ids to other jobs)."""
        with self._lock:
            self.jobs = {}
            self._claim_tried = {}

    def jobs_snapshot(self) -> list[JobState]:
        """The job states (shared objects: readers must tolerate concurrent updates)."""
        with self._lock:
            return list(self.jobs.values())

    def wake(self) -> None:
        """Wake the worker early (after ingest)."""
        self._wake.set()
