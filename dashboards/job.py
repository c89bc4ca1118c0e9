"""Job: one training job's collectives, arrival skew, stragglers, oldest stuck collective, findings.

Templated by `job` (and optionally `group`); the dashboard link and every panel link go to the
job's incident page `${flightdeck_url}/jobs/${job}`.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import stat, timeseries
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as model

from flightdeck.dashboards.common import (
    DEFAULT_FLIGHTDECK_URL,
    RATE,
    base_dashboard,
    job_incident_link,
    label_variable,
    number_panels,
    quantiles_panel,
    query,
    thresholds,
    timeseries_panel,
    with_section,
)

UID = "flightdeck-job"
TITLE = "Flightdeck / Job"

#: selectors for the chosen job and process groups.
_JOB = 'job="$job"'
_JOB_GROUP = 'job="$job", group=~"$group"'
_JOB_RANK = 'job="$job", rank=~"$rank"'

#: the incident page of the chosen job.
_INCIDENT = "${job}"

#: how many ranks the per-rank panels show at most (world sizes reach thousands).
TOP_RANKS = 10


def job_variable() -> dash.QueryVariable:
    """The job picker: every job the server exports a hang gauge for."""
    return label_variable("job", "Job", "label_values(flightdeck_job_hang_active, job)", multi=False)


def group_variable() -> dash.QueryVariable:
    """The process-group picker for the chosen job (all groups by default)."""
    return label_variable(
        "group", "Process group", 'label_values(flightdeck_job_hang_active{job="$job"}, group)'
    )


def rank_variable() -> dash.QueryVariable:
    """The rank picker for the per-rank panels (all ranks by default; they show the top few)."""
    return label_variable(
        "rank",
        "Rank",
        'label_values(flightdeck_rank_last_seen_age_seconds{job="$job"}, rank)',
        sort=model.VariableSort.NUMERICAL_ASC,
    )


def _state_stat(title: str, expr: str, description: str, red_at: float = 1) -> stat.Panel:
    """A stat for one incident indicator; red from `red_at`, links to the incident page."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .with_target(query(expr))
        .links([job_incident_link(_INCIDENT)])
        .span(4)
        .height(4)
        .graph_mode(common_models.BigValueGraphMode.NONE)
        .color_mode(common_models.BigValueColorMode.BACKGROUND)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(thresholds("green", (red_at, "red")))
        .no_value("0")
        .min(0)
        .decimals(0)
    )


def hang_active() -> stat.Panel:
    """Selected groups of the job with an open hang."""
    return _state_stat(
        "Groups hung", f"sum(flightdeck_job_hang_active{{{_JOB_GROUP}}})", "Groups with an open hang finding."
    )


def mismatch_active() -> stat.Panel:
    """Selected groups of the job with an open mismatch."""
    return _state_stat(
        "Groups mismatched",
        f"sum(flightdeck_job_mismatch_active{{{_JOB_GROUP}}})",
        "Groups with an open mismatch finding.",
    )


def culprit_ranks() -> stat.Panel:
    """Culprit ranks of the open findings."""
    return _state_stat(
        "Culprit ranks",
        f"max(flightdeck_job_culprit_ranks{{{_JOB_GROUP}}})",
        "Ranks blamed by the open hang/mismatch finding; the incident page names them.",
    )


def waiting_ranks() -> stat.Panel:
    """Ranks waiting in the stuck collective."""
    return _state_stat(
        "Waiting ranks",
        f"max(flightdeck_job_waiting_ranks{{{_JOB_GROUP}}})",
        "Ranks waiting inside the stuck collective for the culprits.",
    )


def job_ranks_lost() -> stat.Panel:
    """Ranks of the job whose snapshots stopped."""
    return _state_stat(
        "Ranks lost",
        f"max(flightdeck_job_ranks_lost{{{_JOB}}})",
        "Ranks whose snapshots stopped while the others continue.",
    )


def oldest_unfinished_now() -> stat.Panel:
    """Age of the oldest unfinished collective right now."""
    return (
        _state_stat(
            "Oldest unfinished collective",
            f"max(flightdeck_job_oldest_unfinished_elapsed_seconds{{{_JOB_GROUP}}})",
            "Age of the oldest collective not yet finished on every member rank.",
            red_at=60,
        )
        .unit("s")
        .thresholds(thresholds("green", (10, "orange"), (60, "red")))
    )


def _linked(panel: timeseries.Panel) -> timeseries.Panel:
    """A full-width time series whose series link to the chosen job's incident page."""
    return panel.data_links([job_incident_link(_INCIDENT)]).span(12).height(8)


def _job_series(title: str, expr: str, legend: str) -> timeseries.Panel:
    """A linked full-width time series of one query, from 0."""
    return _linked(timeseries_panel(title).with_target(query(expr, legend=legend))).min(0)


def collective_rate_by_op() -> timeseries.Panel:
    """Collectives per second by canonical op name."""
    return (
        _job_series(
            "Collective rate by op",
            f"sum by (op) (rate(flightdeck_job_collectives_total{{{_JOB_GROUP}}}[{RATE}]))",
            "{{op}}",
        )
        .description("Collectives seen per second on the lowest member rank, by op.")
        .unit("ops")
    )


def arrival_skew_quantiles() -> timeseries.Panel:
    """p50 / p90 / p99 of the last-minus-first arrival time per collective."""
    return _linked(
        quantiles_panel(
            "Arrival skew quantiles",
            "Last minus first rank arrival per collective. A rising p99 means a straggler.",
            f"sum by (le) (rate(flightdeck_job_arrival_skew_seconds_bucket{{{_JOB_GROUP}}}[{RATE}]))",
        )
    )


def oldest_unfinished_elapsed() -> timeseries.Panel:
    """Age of the oldest unfinished collective per group over time (a hang is a ramp)."""
    return (
        _job_series(
            "Oldest unfinished collective",
            f"max by (group) (flightdeck_job_oldest_unfinished_elapsed_seconds{{{_JOB_GROUP}}})",
            "group {{group}}",
        )
        .description("Per group; a straight upward ramp is a hang, a sawtooth is normal progress.")
        .unit("s")
    )


def findings_over_time() -> timeseries.Panel:
    """Open findings of the job by kind."""
    return (
        _job_series(
            "Open findings by kind", f"sum by (kind) (flightdeck_job_findings_open{{{_JOB}}})", "{{kind}}"
        )
        .draw_style(common_models.GraphDrawStyle.BARS)
        .stacking(common_builders.StackingConfig().mode(common_models.StackingMode.NORMAL))
        .fill_opacity(60)
        .decimals(0)
    )


def stragglers_by_rank() -> timeseries.Panel:
    """Median arrival lag of the worst straggler ranks."""
    return (
        _job_series(
            f"Stragglers by rank (top {TOP_RANKS})",
            f"topk({TOP_RANKS}, max by (rank) (flightdeck_job_straggler_lag_seconds{{{_JOB_RANK}}}))",
            "rank {{rank}}",
        )
        .description("Median arrival lag of each straggler rank behind the first arrival.")
        .unit("s")
    )


def rank_last_seen_age() -> timeseries.Panel:
    """Seconds since the stalest ranks' last snapshot (a lost rank climbs without bound)."""
    return _job_series(
        f"Rank last-seen age (top {TOP_RANKS})",
        f"topk({TOP_RANKS}, max by (rank) (flightdeck_rank_last_seen_age_seconds{{{_JOB_RANK}}}))",
        "rank {{rank}}",
    ).unit("s")


def incident_link() -> dash.DashboardLink:
    """Dashboard link to the chosen job's incident page."""
    return job_incident_link(_INCIDENT).icon("bolt").tooltip("Open this job in the Flightdeck UI")


def build(flightdeck_url: str = DEFAULT_FLIGHTDECK_URL) -> model.Dashboard:
    """The per-job dashboard; links point at `flightdeck_url` unless changed in Grafana."""
    board = (
        base_dashboard(
            UID,
            TITLE,
            "One distributed job: collectives, arrival skew, stragglers, stuck collectives, findings.",
            flightdeck_url,
        )
        .with_variable(job_variable())
        .with_variable(group_variable())
        .with_variable(rank_variable())
        .link(incident_link())
    )
    board = with_section(
        board,
        "State",
        [
            hang_active(),
            mismatch_active(),
            culprit_ranks(),
            waiting_ranks(),
            job_ranks_lost(),
            oldest_unfinished_now(),
        ],
    )
    board = with_section(
        board,
        "Collectives",
        [
            collective_rate_by_op(),
            arrival_skew_quantiles(),
            oldest_unfinished_elapsed(),
            findings_over_time(),
        ],
    )
    board = with_section(board, "Ranks", [stragglers_by_rank(), rank_last_seen_age()])
    return number_panels(board.build())
