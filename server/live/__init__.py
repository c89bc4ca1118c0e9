"""Live diagnosis: per-rank summaries in memory, one worker that diagnoses jobs as data arrives.

- `worker`: `LiveDiagnosis`, the worker thread: ingest's `submit`, the step (what is due, the
  shared budget, memory handed back), the diagnosis of one job and what is stored of it.
- `state`: `JobState`, what is held per job attempt; `DiagnosisBudget`; `SkewHistogram`.
- `fold`: each new snapshot into its rank's summary, incrementally.
- `rebuild`: a job's summaries rebuilt from the store.
- `policy`: holding a job's diagnosis back while its data is in flight (replays, filling in).
- `cluster_step`: with several servers, the step for the jobs this process owns.
- `gauges`: the per-job gauges the metrics export.

The pure parts (a job's status and end, which findings to store, when a late job is judged, how a
rank's snapshots merge, where each group stands) are in `flightdeck.analysis`.
"""

from flightdeck.server.live.state import SKEW_BUCKETS, DiagnosisBudget, JobState, SkewHistogram
from flightdeck.server.live.worker import LiveDiagnosis

__all__ = ["SKEW_BUCKETS", "DiagnosisBudget", "JobState", "LiveDiagnosis", "SkewHistogram"]
