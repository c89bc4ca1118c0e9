"""View models of the web pages: pure functions from plain data to what the templates show.

No I/O, no clock, no HTTP here: the routes fetch data through `WebData` and hand it to these
builders; tests and benchmarks call them directly. Every string that comes from a job (names,
frames, file paths, exception texts) stays a plain string: the templates escape it.

One module per page: `jobs` (the jobs list), `job` (a job's incident page), with its `timeline`
(cell states, folded rows), `time_lanes` (the wall-time view), `verdict` (banner, finding lines)
and `config` (differing settings); `cell` (a cell's detail), `rank` (a rank's page), `nixl` (the
NIXL page); shared: `fmt` (formatting) and `entries` (collectives and frames). This package
exports every public name of them: `views.job_view` reads as it always did.
"""

from flightdeck.web.views.cell import CellPanel, CellView, cell_view
from flightdeck.web.views.config import CONFIG_SETTINGS, ConfigRow, ConfigSide, config_rows
from flightdeck.web.views.entries import (
    EntryView,
    FrameView,
    entry_view,
    frame_views,
    seq_of,
)
from flightdeck.web.views.fmt import (
    MAX_RANKS,
    fmt_bytes,
    fmt_datetime_s,
    fmt_duration,
    fmt_ranks,
    fmt_sizes,
    fmt_time_ns,
    parse_ranks,
)
from flightdeck.web.views.job import (
    DEFAULT_COLUMNS,
    MAX_EXPANDED,
    GroupOption,
    JobView,
    Window,
    default_group,
    incident_finding,
    job_view,
    plan_window,
)
from flightdeck.web.views.jobs import (
    FILTER_STATUSES,
    JOB_STATUS_ORDER,
    JOBS_PAGE,
    JobRow,
    JobsView,
    jobs_view,
)
from flightdeck.web.views.nixl import AgentRow, HostGroup, NixlView, nixl_view
from flightdeck.web.views.rank import RANK_RECENT, RankView, rank_view
from flightdeck.web.views.time_lanes import MIN_BAR, TIME_WIDTH, Bar, Lane, TimeAxis
from flightdeck.web.views.timeline import (
    STATES,
    Cell,
    CellState,
    Column,
    Row,
    StateStyle,
    cell_state,
    mismatched_cells,
)
from flightdeck.web.views.verdict import TITLES, Banner, Culprit, FindingLine, banner, verdict_fingerprint

__all__ = [
    "CONFIG_SETTINGS",
    "DEFAULT_COLUMNS",
    "FILTER_STATUSES",
    "JOBS_PAGE",
    "JOB_STATUS_ORDER",
    "MAX_EXPANDED",
    "MAX_RANKS",
    "MIN_BAR",
    "RANK_RECENT",
    "STATES",
    "TIME_WIDTH",
    "TITLES",
    "AgentRow",
    "Banner",
    "Bar",
    "Cell",
    "CellPanel",
    "CellState",
    "CellView",
    "Column",
    "ConfigRow",
    "ConfigSide",
    "Culprit",
    "EntryView",
    "FindingLine",
    "FrameView",
    "GroupOption",
    "HostGroup",
    "JobRow",
    "JobView",
    "JobsView",
    "Lane",
    "NixlView",
    "RankView",
    "Row",
    "StateStyle",
    "TimeAxis",
    "Window",
    "banner",
    "cell_state",
    "cell_view",
    "config_rows",
    "default_group",
    "entry_view",
    "fmt_bytes",
    "fmt_datetime_s",
    "fmt_duration",
    "fmt_ranks",
    "fmt_sizes",
    "fmt_time_ns",
    "frame_views",
    "incident_finding",
    "job_view",
    "jobs_view",
    "mismatched_cells",
    "nixl_view",
    "parse_ranks",
    "plan_window",
    "rank_view",
    "seq_of",
    "verdict_fingerprint",
]
