"""The worker's policies on a job's data in flight: whether to hold its diagnosis back while a
collector replays old batches, whether its picture is still filling in, whether its ranks have
gone silent while their collectors still report.

Functions of a job's state (`JobState`) and the server's settings; the pure rules they build on
(when a batch is late) are `flightdeck.analysis.lateness`'s.
"""

from __future__ import annotations

import logging

from flightdeck.analysis.lateness import late_after_s
from flightdeck.server.live.state import JobState
from flightdeck.server.settings import ServerSettings

log = logging.getLogger(__name__)

NS = 1_000_000_000


def replaying(js: JobState, now: float, settings: ServerSettings) -> bool:
    """Whether to hold the job's diagnosis back: a collector is replaying old batches.

    After an outage a collector sends what it queued, oldest first. Judged by the clock, every
    collective pending in those old snapshots would look hung for a moment, and a webhook
    could restart a healthy job. So while a collector's latest batch for the job arrived
    older than half of `stall_after_s` (at least 5 s, above ordinary push delay and clock
    skew), the verdict waits for the newer batches; for at most `stall_after_s`, so that a
    collector stuck mid-replay or a server that is always behind does not hide a real hang.
    """
    threshold = late_after_s(settings.stall_after_s)
    if not any(lag > threshold for lag, _, _ in js.lags()):
        js.replaying_since = None
        return False
    if js.replaying_since is None:
        js.replaying_since = now
        log.info("job %s: a collector is replaying old batches; its diagnosis waits for newer ones", js.name)
    return now - js.replaying_since < settings.stall_after_s


def filling_in(
    js: JobState, now: float, now_ns: int, expected: int, settings: ServerSettings, *, lagging: bool = True
) -> bool:
    """Whether the job's picture is still being filled in. Within `job_settle_s` of the first
    data this process received of it, while its batches still come (the last less than
    `stall_after_s` ago): while fewer than `expected` ranks are in, or while its newest
    snapshot is older than `late_after_s` (a collector shipping the history of a running job;
    the newer snapshots are queued behind). At any time: while a collector's latest batch for
    the job, less than `stall_after_s` ago, carried only snapshots `late_after_s` older than
    the job's newest (it is catching up with the others). A picture complete and old (a job
    that ended before the collector started) is judged once its batches stop coming.

    `lagging`: False for a job on progress digests: its hangs come from its board, every rank's
    digest of every interval, not from the batches a round brings in, which at 16,384 ranks come
    over tens of seconds (429s) and held a hang back that long."""
    assert js.summaries is not None
    late = late_after_s(settings.stall_after_s)
    stall = settings.stall_after_s
    settling = (
        js.arrived_ns is not None
        and now_ns - js.arrived_ns < settings.job_settle_s * NS
        and now - js.last_ingest < stall
    )
    if settling and (len(js.summaries) < expected or now_ns - js.last_seen_ns > late * NS):
        return True
    return lagging and any(age > late and now - at < stall for age, at in list(js.data_lag.values()))


def no_data(js: JobState, now_ns: int, heard_ns: dict[str, int], settings: ServerSettings) -> bool:
    """Whether none of the job's ranks has sent a snapshot for `no_data_after_s` while a
    collector of the job still reports (its batches or heartbeats) and no rank is gone."""
    window = settings.no_data_after_s * NS
    if js.gone or not js.rank_seen_ns or now_ns - max(js.rank_seen_ns.values()) < window:
        return False
    heard = dict(heard_ns)
    return any(now_ns - heard.get(host, 0) < window for host in list(js.batch_lag))
