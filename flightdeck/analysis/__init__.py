"""Cross-rank diagnosis of flight-recorder data: pure functions, records in, findings out.

summaries = [summarize(dump) for dump in dumps]      # per rank, cheap, can run anywhere
report = diagnose(summaries, now_ns=..., options=Options(stall_after_s=30))
report.to_json()                                      # the documented verdict shape
"""

from flightdeck.analysis.diagnose import diagnose
from flightdeck.analysis.findings import Finding, Options, RankRef, Report
from flightdeck.analysis.summary import (
    GroupTrack,
    RankSummary,
    add_entries,
    summarize,
)

__all__ = [
    "Finding",
    "GroupTrack",
    "Options",
    "RankRef",
    "RankSummary",
    "Report",
    "add_entries",
    "diagnose",
    "summarize",
]
