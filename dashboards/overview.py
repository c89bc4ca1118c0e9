"""Cluster overview: jobs by status, open hangs and mismatches, lost ranks, collectors, ingest.

The page an on-call engineer opens first. Every job-bearing panel links to the job's incident page
in the Flightdeck UI (`${flightdeck_url}/jobs/<job>`).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import stat, table, timeseries
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as model

from flightdeck.dashboards.common import (
    COLLECTOR_STALE_SECONDS,
    DEFAULT_FLIGHTDECK_URL,
    RATE,
    SERVER_SCRAPE_JOB,
    base_dashboard,
    instant_table_query,
    job_incident_link,
    number_panels,
    quantiles_panel,
    query,
    thresholds,
    timeseries_panel,
    with_section,
)

UID = "flightdeck-overview"
TITLE = "Flightdeck / Cluster overview"

#: a (job, group) has an open incident while either finding gauge is 1.
_OPEN = "(flightdeck_job_hang_active == 1 or flightdeck_job_mismatch_active == 1)"


def _counter_stat(title: str, expr: str, description: str) -> stat.Panel:
    """A single-number stat that turns red at 1 (for counts that should be zero)."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .with_target(query(expr))
        .span(4)
        .height(5)
        .graph_mode(common_models.BigValueGraphMode.AREA)
        .color_mode(common_models.BigValueColorMode.BACKGROUND)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(thresholds("green", (1, "red")))
        .no_value("0")
        .min(0)
    )


def jobs_by_status() -> stat.Panel:
    """Number of jobs in each status, one big number per status."""
    return (
        stat.Panel()
        .title("Jobs by status")
        .description(
            "Recent jobs (not ended, or ended within the server's ended_series_s) by status: running, slow, hung, mismatch, lost, no_data, finished, failed."
        )
        .with_target(query("sum by (status) (flightdeck_jobs)", legend="{{status}}"))
        .span(8)
        .height(5)
        .graph_mode(common_models.BigValueGraphMode.NONE)
        .color_mode(common_models.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(thresholds("blue"))
        .min(0)
    )


def active_hangs() -> stat.Panel:
    """Process groups with an open hang finding."""
    return _counter_stat(
        "Active hangs",
        "sum(flightdeck_job_hang_active)",
        "Process groups with an open hang finding (a collective not finished on every member rank).",
    )


def active_mismatches() -> stat.Panel:
    """Process groups with an open mismatch finding."""
    return _counter_stat(
        "Active mismatches",
        "sum(flightdeck_job_mismatch_active)",
        "Process groups with an open mismatch finding (ranks disagree on op, size or order).",
    )


def ranks_lost() -> stat.Panel:
    """Ranks whose snapshots stopped while the rest of their job continues."""
    return _counter_stat(
        "Ranks lost",
        "sum(flightdeck_job_ranks_lost)",
        "Ranks whose snapshots stopped arriving while the other ranks of their job continue.",
    )


def collectors_up() -> stat.Panel:
    """Collectors whose last accepted batch is recent enough to count as up."""
    return (
        stat.Panel()
        .title("Collectors up")
        .description(
            f"Collectors whose last accepted batch is under {COLLECTOR_STALE_SECONDS} s old "
            "(same threshold as the FlightdeckCollectorDown alert)."
        )
        .with_target(
            query(
                f"count(flightdeck_collector_last_push_age_seconds < {COLLECTOR_STALE_SECONDS}) or vector(0)",
                legend="up",
            )
        )
        .span(4)
        .height(5)
        .graph_mode(common_models.BigValueGraphMode.AREA)
        .color_mode(common_models.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(thresholds("red", (1, "green")))
        .min(0)
    )


def open_incidents() -> table.Panel:
    """One row per (job, group) with an open hang or mismatch, linked to the incident page."""
    return (
        table.Panel()
        .title("Open incidents")
        .description("Process groups with an open hang or mismatch. Click a row to open its incident page.")
        .with_target(
            instant_table_query(
                f"max by (job, group) (flightdeck_job_culprit_ranks and on (job, group) {_OPEN})"
            )
        )
        .with_target(
            instant_table_query(
                f"max by (job, group) (flightdeck_job_waiting_ranks and on (job, group) {_OPEN})", ref_id="B"
            )
        )
        .with_target(
            instant_table_query(
                "max by (job, group) (flightdeck_job_oldest_unfinished_elapsed_seconds "
                f"and on (job, group) {_OPEN})",
                ref_id="C",
            )
        )
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": {"job": 0, "group": 1, "Value #A": 2, "Value #B": 3, "Value #C": 4},
                    "renameByName": {
                        "Value #A": "culprit ranks",
                        "Value #B": "waiting ranks",
                        "Value #C": "oldest unfinished (s)",
                    },
                },
            )
        )
        .data_links([job_incident_link("${__data.fields.job}")])
        .span(24)
        .height(8)
        .no_value("no open incidents")
    )


def jobs_by_status_over_time() -> timeseries.Panel:
    """Stacked job counts by status over time."""
    return (
        timeseries_panel("Jobs by status over time")
        .with_target(query("sum by (status) (flightdeck_jobs)", legend="{{status}}"))
        .stacking(common_builders.StackingConfig().mode(common_models.StackingMode.NORMAL))
        .fill_opacity(30)
        .min(0)
        .decimals(0)
        .span(8)
        .height(8)
    )


def hangs_and_mismatches_by_job() -> timeseries.Panel:
    """Open hang and mismatch groups per job; a series links to its job's incident page."""
    return (
        timeseries_panel("Hangs and mismatches by job")
        .description("Groups with an open finding, per job. Click a series to open the incident page.")
        .with_target(query("sum by (job) (flightdeck_job_hang_active) > 0", legend="hang {{job}}"))
        .with_target(
            query("sum by (job) (flightdeck_job_mismatch_active) > 0", legend="mismatch {{job}}", ref_id="B")
        )
        .data_links([job_incident_link()])
        .draw_style(common_models.GraphDrawStyle.BARS)
        .fill_opacity(60)
        .min(0)
        .decimals(0)
        .span(8)
        .height(8)
    )


def ranks_lost_by_job() -> timeseries.Panel:
    """Lost ranks per job; a series links to its job's incident page."""
    return (
        timeseries_panel("Ranks lost by job")
        .with_target(query("max by (job) (flightdeck_job_ranks_lost) > 0", legend="{{job}}"))
        .data_links([job_incident_link()])
        .min(0)
        .decimals(0)
        .span(8)
        .height(8)
    )


def config_skew_by_job() -> timeseries.Panel:
    """Jobs whose ranks disagree on versions or settings; a series links to the job's page."""
    return (
        timeseries_panel("Configuration and version skew by job")
        .description(
            "1 while a job has an open config_skew or version_skew finding (ranks on different "
            "torch/NCCL/Python versions, flight recorder off or sized differently, differing timeouts). "
            "These jobs may hang later: see the Configuration section of the incident page."
        )
        .with_target(
            query("max by (job, kind) (flightdeck_job_config_skew_active) > 0", legend="{{kind}} {{job}}")
        )
        .data_links([job_incident_link()])
        .min(0)
        .max(1)
        .decimals(0)
        .span(24)
        .height(6)
    )


def collector_push_age() -> timeseries.Panel:
    """Seconds since each collector's last accepted batch, with the down threshold drawn."""
    return (
        timeseries_panel("Collector last push age")
        .description(f"Above {COLLECTOR_STALE_SECONDS} s the collector counts as down.")
        .with_target(
            query("max by (collector) (flightdeck_collector_last_push_age_seconds)", legend="{{collector}}")
        )
        .unit("s")
        .min(0)
        .thresholds(thresholds("green", (COLLECTOR_STALE_SECONDS, "red")))
        .thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common_models.GraphThresholdsStyleMode.LINE)
        )
        .span(12)
        .height(8)
    )


def findings_opened() -> timeseries.Panel:
    """Findings opened per interval, by kind."""
    return (
        timeseries_panel("Findings opened")
        .with_target(
            query(f"sum by (kind) (increase(flightdeck_job_findings_total[{RATE}]))", legend="{{kind}}")
        )
        .draw_style(common_models.GraphDrawStyle.BARS)
        .stacking(common_builders.StackingConfig().mode(common_models.StackingMode.NORMAL))
        .fill_opacity(60)
        .min(0)
        .span(12)
        .height(8)
    )


def ingest_rate() -> timeseries.Panel:
    """Ingest requests per second by outcome, and collective entries accepted per second."""
    return (
        timeseries_panel("Ingest rate")
        .with_target(
            query(
                f"sum by (outcome) (rate(flightdeck_ingest_batches_total[{RATE}]))",
                legend="batches {{outcome}}",
            )
        )
        .with_target(
            query(
                f"sum(rate(flightdeck_ingest_entries_total[{RATE}]))", legend="entries accepted", ref_id="B"
            )
        )
        .unit("reqps")
        .min(0)
        .span(8)
        .height(8)
    )


def ingest_rejects_and_errors() -> timeseries.Panel:
    """Rejected batches by reason and database errors, per second."""
    return (
        timeseries_panel("Ingest rejects and errors")
        .description("Rejected batches by reason (auth, schema, too_large) and database errors.")
        .with_target(
            query(
                f"sum by (reason) (rate(flightdeck_ingest_rejects_total[{RATE}]))",
                legend="rejected {{reason}}",
            )
        )
        .with_target(query(f"sum(rate(flightdeck_db_errors_total[{RATE}]))", legend="db errors", ref_id="B"))
        .unit("reqps")
        .min(0)
        .span(8)
        .height(8)
    )


def _p50_p99(title: str, description: str, metric: str) -> timeseries.Panel:
    """p50 and p99 of a server histogram (seconds), summed over the replicas."""
    bucket = f"sum by (le) (rate({metric}_bucket[{RATE}]))"
    return quantiles_panel(title, description, bucket, (0.5, 0.99)).span(8).height(8)


def ingest_latency() -> timeseries.Panel:
    """Ingest latency quantiles (request received to rows committed)."""
    return _p50_p99(
        "Ingest latency", "Request received → rows committed.", "flightdeck_ingest_latency_seconds"
    )


_SERVER = f'job="{SERVER_SCRAPE_JOB}"'


def server_up() -> stat.Panel:
    """Server replicas Prometheus reaches now, with the version each runs."""
    return (
        stat.Panel()
        .title("Server replicas up")
        .description("Flightdeck server processes that answered the last scrape.")
        .with_target(query(f"sum(up{{{_SERVER}}})"))
        .thresholds(thresholds("red", (1, "green")))
        .span(4)
        .height(8)
    )


def server_versions() -> table.Panel:
    """Which version each replica runs (from flightdeck_build_info)."""
    return (
        table.Panel()
        .title("Server versions")
        .with_target(
            instant_table_query(f"max by (instance, version, python) (flightdeck_build_info{{{_SERVER}}})")
        )
        .span(8)
        .height(8)
    )


def diagnosis_duration() -> timeseries.Panel:
    """Live diagnosis time per job (p50, p99) and the share of a core it takes."""
    return _p50_p99(
        "Diagnosis duration",
        "One live diagnosis of one job. A p99 near the diagnosis interval means the server is behind.",
        "flightdeck_diagnosis_duration_seconds",
    )


def webhook_outbox() -> timeseries.Panel:
    """Webhook deliveries waiting, and deliveries by outcome."""
    return (
        timeseries_panel("Webhook outbox")
        .description(
            "Deliveries waiting in the outbox (a growing line: the receiver is down) and outcomes per second."
        )
        .with_target(query(f"max(flightdeck_webhook_outbox_depth_deliveries{{{_SERVER}}})", legend="waiting"))
        .with_target(
            query(
                f"sum by (outcome) (rate(flightdeck_webhook_deliveries_total[{RATE}]))",
                legend="{{outcome}}",
                ref_id="B",
            )
        )
        .min(0)
        .span(8)
        .height(8)
    )


def _per_replica(title: str, expr: str, unit: str) -> timeseries.Panel:
    """One line per server replica (its `instance`)."""
    return (
        timeseries_panel(title)
        .with_target(query(expr, legend="{{instance}}"))
        .unit(unit)
        .min(0)
        .span(8)
        .height(8)
    )


def server_memory() -> timeseries.Panel:
    """Resident memory of each server replica."""
    return _per_replica("Server memory", f"process_resident_memory_bytes{{{_SERVER}}}", "bytes")


def server_cpu() -> timeseries.Panel:
    """CPU cores each server replica uses."""
    return _per_replica("Server CPU", f"rate(process_cpu_seconds_total{{{_SERVER}}}[{RATE}])", "short")


def build(flightdeck_url: str = DEFAULT_FLIGHTDECK_URL) -> model.Dashboard:
    """The cluster overview dashboard; links point at `flightdeck_url` unless changed in Grafana."""
    board = base_dashboard(
        UID,
        TITLE,
        "Flightdeck fleet view: job states, open incidents, collectors and ingest health.",
        flightdeck_url,
    )
    board = with_section(
        board,
        "Jobs",
        [
            jobs_by_status(),
            active_hangs(),
            active_mismatches(),
            ranks_lost(),
            collectors_up(),
            open_incidents(),
            jobs_by_status_over_time(),
            hangs_and_mismatches_by_job(),
            ranks_lost_by_job(),
            config_skew_by_job(),
        ],
    )
    board = with_section(
        board,
        "Collectors and ingest",
        [
            collector_push_age(),
            findings_opened(),
            ingest_rate(),
            ingest_rejects_and_errors(),
            ingest_latency(),
        ],
    )
    board = with_section(
        board,
        "Server health",
        [
            server_up(),
            server_versions(),
            diagnosis_duration(),
            webhook_outbox(),
            server_memory(),
            server_cpu(),
        ],
    )
    return number_panels(board.build())
