"""The diagnosis worker: one thread that folds the jobs' snapshots in and diagnoses them.

Ingest hands every committed snapshot to `LiveDiagnosis.submit` (cheap: a list append). The worker
folds pending snapshots into each rank's `RankSummary` (`fold.fold_snapshot`), and diagnoses a job
once its batches have been quiet for `diagnosis_debounce_s` (a burst from all ranks gives one
diagnosis), and every `diagnosis_interval_s` while the job is active, because a hang shows up
precisely when nothing new arrives. One worker thread: one diagnosis at a time, per job and overall.
Summaries missing from memory (after a restart, or for a job another server ingested) are rebuilt
from the database's entries (`rebuild.rebuild_summaries`). The findings are reconciled with the
stored ones (`store.apply_findings`). What a diagnosis means for the job (its status, its end,
which findings to store while its picture fills in) is `flightdeck.analysis`'s: `lifecycle`,
`live_findings`, `lateness`.

Over 500 lines: the class is the worker's two halves, the step (what is due, the shared budget,
memory handed back, ended jobs let go) and the diagnosis of one job (judged when, held back how,
stored what), which read and write the same bookkeeping of `JobState`; what either delegates is
in the modules beside it (`fold`, `rebuild`, `policy`, `cluster_step`, `gauges`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flightdeck.analysis import Finding, Options, RankSummary, diagnose
from flightdeck.analysis.board import BOARD_KINDS, merge_findings, stall_findings
from flightdeck.analysis.config_skew import PeerJob
from flightdeck.analysis.findings import CONFIG_KINDS, FindingKey, finding_key
from flightdeck.analysis.lateness import judged_as_of_ns
from flightdeck.analysis.lifecycle import end_state, ending, job_end, job_status
from flightdeck.analysis.live_findings import live_findings, settle_state_mismatches
from flightdeck.digest import DigestRequest
from flightdeck.server import store
from flightdeck.server.cluster import Cluster
from flightdeck.server.db import Database
from flightdeck.server.decode_gate import DecodeGate
from flightdeck.server.digest_share import DigestShare
from flightdeck.server.live.boards import Boards, Detail
from flightdeck.server.live.cluster_step import ClusterSteps
from flightdeck.server.live.fold import fold_snapshot
from flightdeck.server.live.gauges import update_gauges
from flightdeck.server.live.policy import filling_in, no_data, replaying
from flightdeck.server.live.rebuild import rebuild_summaries
from flightdeck.server.live.state import DiagnosisBudget, JobState
from flightdeck.server.settings import ServerSettings

log = logging.getLogger(__name__)

NS = 1_000_000_000
Clock = Callable[[], int]


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


def _kept_findings(
    session: Session, job_id: int, seen: Sequence[Finding]
) -> tuple[set[FindingKey], list[Finding]]:
    """The job's open findings that a diagnosis awaiting its entries does not see and its board
    does not make: kept open as stored (their keys, and as findings for the metrics)."""
    current = {finding_key(f) for f in seen}
    keys: set[FindingKey] = set()
    kept: list[Finding] = []
    for row in store.open_findings(session=session, job_id=job_id):
        key = store.finding_row_key(row)
        if row.kind not in BOARD_KINDS and key not in current:
            keys.add(key)
            kept.append(_stored_finding(row.data))
    return keys, kept


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


class LiveDiagnosis(ClusterSteps):
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
        #: Called when the last job this process held is let go (`flightdeck.server.idle_restart`).
        self.on_idle: Callable[[], None] | None = None
        #: The jobs on progress digests (large jobs: their collectors hold the entries back).
        self.boards = Boards(
            stall_after_s=settings.stall_after_s,
            detail_interval_s=settings.detail_interval_s,
            detail_round_s=settings.detail_round_s,
            forget_after_s=settings.job_idle_s,
            monotonic=monotonic,
        )
        #: Several servers: the digests and rounds they share (the boards are the owners').
        self.digest_share = (
            DigestShare(
                db=db,
                clock=clock,
                monotonic=monotonic,
                on_db_error=on_db_error,
                first_round_s=settings.detail_round_s,
            )
            if self.cluster is not None
            else None
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

    def take_digests(self, request: DigestRequest) -> list[Detail]:
        """Fold a digest request into its jobs' boards (no transaction: see live/boards.py); the
        collector and the jobs count as heard from. Returns the jobs whose entries its collector
        is to ship now."""
        share = self.digest_share
        if share is not None:
            detail = share.add(request)
            mine = [b for b in request.blocks if share.owns(b.job, b.attempt)]
            if mine:
                self.boards.fold_blocks(mine)
        else:
            detail = self.boards.take(request)
        now_ns = self._clock()
        keys = {(b.job, b.attempt) for b in request.blocks}
        with self._lock:
            self.heard_ns[request.host] = now_ns
            for js in self.jobs.values():
                if (js.name, js.attempt) in keys:
                    js.heard_ns = now_ns
        return detail

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
        #: Jobs on digests whose board's findings are due, their entries' verdict standing.
        board_due: list[JobState] = []
        #: Jobs whose due diagnosis neither waits for its rest nor counts against the budget.
        urgent: set[int] = set()
        released: list[JobState] = []
        with self._lock:
            jobs = list(self.jobs.values())
        if self.cluster is not None:
            jobs = self._cluster_step(jobs, now, now_ns)
        self._digest_step(jobs, now, now_ns)
        before = self._untrimmed
        expired = False
        for js in jobs:
            if self._expired(js, now_ns):
                expired = True
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
            if not force and replaying(js, now, self._settings):
                continue
            idle = (now_ns - js.heard_ns) / NS > s.job_idle_s
            # A large job's diagnosis takes long: space them so it gets at most its share of a core.
            rested = now - js.last_diagnosis >= js.diagnosis_s / s.diagnosis_max_share
            on_digests = self.boards.holds(js.name, js.attempt)
            mismatch_round = self.boards.mismatch_round(js.name, js.attempt) if on_digests else None
            # The board's verdict moves with the digests, whatever the entries' diagnosis costs or
            # waits for (spaced out by `diagnosis_max_share`, seconds apart at 16,384 ranks while
            # a round's entries stream in): a stall pages on time, and resolves once it clears.
            board_now = (
                on_digests
                and js.entries_report is not None
                and now - js.last_board >= s.diagnosis_interval_s
                and self._board_watch(js)
            )
            if (
                js.dirty
                and on_digests
                and js.entries_report is not None
                and not self.boards.entries_due(js.name, js.attempt)
            ):
                # A stall's evidence came: it words the board's findings; the entries' verdict stands.
                with self._lock:
                    js.dirty = False
                board_due.append(js)
                continue
            if board_now:
                board_due.append(js)
            # While a mismatch round is open its entries are arriving: they are diagnosed once it
            # closes, at once (not spaced, not counted in the budget).
            if js.dirty and (force or mismatch_round != "open"):
                quiet = now - js.last_ingest >= s.diagnosis_debounce_s
                # A job that never goes quiet (thousands of ranks pushing in turn) still gets looked at.
                starving = now - js.dirty_since >= max(2.0, 4 * s.diagnosis_debounce_s)
                if mismatch_round == "closed":
                    urgent.add(js.job_id)
                if force or ((quiet or starving) and (rested or mismatch_round == "closed")):
                    due.append(js)
                    continue
            if board_now:
                continue  # its board's verdict is made this step; its entries' stands
            if (
                js.summaries is not None
                and not idle
                and not js.dirty
                # A job on digests is diagnosed in full when a round's entries come: between
                # rounds its entries are the last cut, and the verdict on them stays the same.
                and not on_digests
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
            elif idle and js.summaries is not None and not js.pending and not js.dirty:
                js.summaries = None  # memory: rebuilt from the database should the job return
        folding = self._untrimmed > before
        if expired and self.on_idle is not None:
            with self._lock:
                idle = not self.jobs
            if idle:
                self.on_idle()
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
        due.sort(key=lambda js: (js.job_id not in urgent, not js.dirty, js.last_diagnosis))
        done = 0
        for js in board_due:
            self.diagnose_job(js, entries=False)
        for js in due:
            if not force and js.job_id not in urgent and self._budget.spent(self._mono()):
                break
            started = time.perf_counter()
            self.diagnose_job(js)
            took = time.perf_counter() - started
            self._budget.charge(self._mono(), took)
            if self._observe_duration is not None:
                self._observe_duration(took)
            done += 1
        return done

    def _board_watch(self, js: JobState) -> bool:
        """Whether a job on digests is to be diagnosed again though no entries came: a group of it
        stalls, or a finding the board makes is open (it resolves when the stall clears)."""
        if self.boards.stalls(js.name, js.attempt):
            return True
        return js.report is not None and any(f.kind in BOARD_KINDS for f in js.report.findings)

    def _digest_step(self, jobs: list[JobState], now: float, now_ns: int) -> None:
        """The boards: in a cluster, fold the owned jobs' digests from the shared feed (and drop
        the boards of jobs owned no more); open the rounds that are due, and in a cluster publish
        them."""
        share = self.digest_share
        if share is not None:
            owned = {(js.name, js.attempt) for js in jobs}
            self.boards.fold_blocks(share.step(owned))
            self.boards.keep(owned)
        opened = self.boards.check()
        if share is not None and opened:
            share.publish([(d, now_ns + int((until - now) * NS)) for d, until in opened])

    def release(self, jobs: Sequence[JobState]) -> None:
        """Drop the summaries of ended jobs and hand the memory back to the system.

        An ended job's diagnosis changes only when a snapshot newer than its end arrives, and
        that rebuilds them from the store (`_fold`). Every object of the summaries is freed
        (in process, 0.2 MiB of a 256-rank job's 33 stayed traced); `gc.collect` and
        `malloc_trim` hand the memory back: most of it under glibc's allocator
        (`PYTHONMALLOC=malloc`); under CPython's own, the default, the arenas that the few
        surviving objects are spread over stay with the process, for the next job
        (docs/performance.md, "Server memory").
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
                self._untrimmed += rebuild_summaries(
                    js,
                    db=self._db,
                    cluster=self.cluster,
                    on_db_error=self._on_db_error,
                    max_seqs=self._settings.max_summary_seqs,
                    max_times=self._settings.enqueue_times_kept,
                    entries=not self.boards.holds(js.name, js.attempt),
                    awaiting_since=self._mono(),
                )
            return
        max_seqs, max_times = self._settings.max_summary_seqs, self._settings.enqueue_times_kept
        for snap in pending:
            self._untrimmed += fold_snapshot(js, snap, max_seqs=max_seqs, max_times=max_times)

    def diagnose_job(self, js: JobState, *, entries: bool = True) -> None:
        """Diagnose one job now and store the outcome (findings, status, report). `entries`:
        False for a job on digests whose last entries' verdict stands: only the board's findings
        are made again (cheap: not spaced out, not counted in `diagnosis_s`)."""
        now_mono = self._mono()
        js.last_board = now_mono
        if entries:
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
        as_of_ns = judged_as_of_ns(
            js.lags(), now=now_mono, now_ns=now_ns, stall_after_s=self._settings.stall_after_s
        )
        on_digests = self.boards.holds(js.name, js.attempt)
        if on_digests:
            # On digests the entries are the newest round's cut: judged as of it, as a dump is.
            as_of_ns = min(as_of_ns, newest)
        if on_digests and not entries and js.entries_report is not None:
            # No entries since the last diagnosis: their verdict stands; only the board's moves.
            report = replace(js.entries_report, findings=list(js.entries_report.findings))
        else:
            report = diagnose(
                summaries,
                # An ended job is judged as of its end: what was open freezes there.
                now_ns=min(ended_at, now_ns) if ended_at is not None else as_of_ns,
                options=self._options,
                world_size=js.world_size,
                job=js.name,
                peers=peers,
                stragglers=stragglers,
                agreed=js.agreed,
            )
            js.agreed = report.agreed
        if on_digests:
            js.entries_report = replace(report, findings=list(report.findings))
            # Hangs, slow ranks and silent ranks from the board: every rank's digest of every
            # interval, where the round's entries are a cut that may be minutes old or, at
            # thousands of ranks, still arriving (its missing ranks would read as lost or behind).
            board = stall_findings(
                self.boards.stalls(js.name, js.attempt), js.summaries, now_ns, self._options
            )
            report.findings = merge_findings(board, report.findings)
        # Wall time, waits for the GIL included: a busy process diagnoses less often. (Spaced by
        # CPU time instead, a 4,096-rank job was diagnosed three times as often, took 0.6 of the
        # process's time and its ingest fell further behind: docs/dev/performance-history.md,
        # "Sixth session".)
        if entries:
            js.diagnosis_s = time.perf_counter() - started
        if stragglers and entries:
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
            filling_in(js, now_mono, now_ns, expected, self._settings, lagging=not on_digests)
            or ending(js.summaries, js.gone, now_ns, self._settings.stall_after_s)
        )
        report.findings = live_findings(
            report,
            job_age_s=(now_ns - first_seen) / NS,
            grace_s=self._settings.stall_after_s,
            unsettled=unsettled,
            filling_in=held,
            open_keys={finding_key(f) for f in open_before},
        )
        if held:
            # Nor does a partial picture resolve what is open: a job going down loses its hang
            # from the diagnosis of the moment some ranks are final and others not yet, and the
            # hang would read resolved instead of ended. It stays, as last seen.
            seen = {finding_key(f) for f in report.findings}
            report.findings += [
                replace(f, consequence_of=None) for f in open_before if finding_key(f) not in seen
            ]
        if ended_at is not None:
            # The faults open at the end: open before and still seen by the end's diagnosis.
            was_open = {finding_key(f) for f in open_before}
            open_kinds: set[str] = {f.kind for f in report.findings if finding_key(f) in was_open}
            status = end_state(open_kinds, js.summaries, js.gone)
        else:
            status = job_status(report, summaries, js.world_size)
            if status == "running" and no_data(js, now_ns, self.heard_ns, self._settings):
                status = "no_data"
        kept: list[Finding] = []
        try:
            with self._db.write() as session, session.begin():
                keep: set[FindingKey] = set()
                if on_digests and self._awaiting_entries(js, summaries, expected, now_mono):
                    keep, kept = _kept_findings(session, js.job_id, report.findings)
                events = store.apply_findings(
                    session=session,
                    job_id=js.job_id,
                    findings=report.findings,
                    report=report.to_json(),
                    status=status,
                    now_ns=now_ns,
                    last_seen_ns=js.last_seen_ns or None,
                    ended_at_ns=ended_at,
                    keep=keep,
                )
                if events and self._record_events is not None:
                    self._record_events(session, js, events)
        except OperationalError:
            self._on_db_error()
            with self._lock:
                js.dirty = True  # try again on the next tick
            return
        js.report = report
        js.restored = kept
        js.status = status
        js.ended_at_ns = ended_at
        if ended_at is not None:
            log.info("job %s ended %s", js.name, status)
        update_gauges(
            js,
            report,
            frontiers=self.boards.frontiers(js.name, js.attempt) if on_digests else None,
            skews=entries,
        )
        if events:
            self._on_events(js, events)

    def _awaiting_entries(
        self, js: JobState, summaries: list[RankSummary], expected: int, now: float
    ) -> bool:
        """Whether a job on digests rebuilt without its entries still awaits them: until every
        rank's entries are in (the round its new board opened asks for them) or, ranks without
        collectives never sending any, for `job_settle_s`."""
        since = js.awaiting_entries_since
        if since is None:
            return False
        if now - since >= self._settings.job_settle_s or sum(1 for x in summaries if x.tracks) >= expected:
            js.awaiting_entries_since = None
            return False
        return True

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
