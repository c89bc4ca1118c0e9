"""When a job whose data arrives late is judged: as of the time its data reaches, not the clock.

Pure: the ages on arrival of each collector's latest batch in, a time out. The live server
(`flightdeck.server.live`) holds those ages per job (`JobState.batch_lag`) and judges the job at
the time `judged_as_of_ns` gives.
"""

from __future__ import annotations

from collections.abc import Sequence

NS = 1_000_000_000
#: How far back (in `stall_after_s`) a job whose batches arrive late is judged at most.
MAX_JUDGED_LAG = 4
#: A batch at most this old on arrival is on time (push delay, clock skew): judged by the clock.
ON_TIME_LAG_S = 1.0


def late_after_s(stall_after_s: float) -> float:
    """A batch older than this on arrival is late: above ordinary push delay and clock skew."""
    return max(stall_after_s / 2, 5.0)


def judged_as_of_ns(
    lags: Sequence[tuple[float, float, bool]], *, now: float, now_ns: int, stall_after_s: float
) -> int:
    """The time at which the job is judged: the clock, or the time its data reaches while late.

    `lags` holds, per collector of the job, its latest batch's age on arrival (seconds), when it
    arrived (monotonic, as `now`) and whether that age is free of clock skew.

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
    limit = MAX_JUDGED_LAG * stall_after_s
    recent = [
        (lag if skew_free else min(lag, limit), now - at) for lag, at, skew_free in lags if now - at <= limit
    ]
    if max((lag for lag, _ in recent), default=0.0) <= ON_TIME_LAG_S:
        return now_ns
    return now_ns - int(max(lag + since for lag, since in recent) * NS)
