"""NIXL transfers: KV-cache transfer throughput, request rate, latency quantiles, errors, drops.

Templated by `host` and `agent` (multi-select, all by default).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.models import dashboard as model

from flightdeck.dashboards.common import (
    DEFAULT_FLIGHTDECK_URL,
    RATE,
    base_dashboard,
    label_variable,
    number_panels,
    quantiles_panel,
    query,
    timeseries_panel,
    with_section,
)

UID = "flightdeck-nixl"
TITLE = "Flightdeck / NIXL transfers"

_SEL = 'host=~"$host", agent=~"$agent"'


def host_variable() -> dash.QueryVariable:
    """The host picker (all hosts by default)."""
    return label_variable("host", "Host", "label_values(flightdeck_nixl_tx_requests_total, host)")


def agent_variable() -> dash.QueryVariable:
    """The NIXL agent picker for the chosen hosts (all agents by default)."""
    return label_variable(
        "agent", "Agent", 'label_values(flightdeck_nixl_tx_requests_total{host=~"$host"}, agent)'
    )


def _per_agent_rate(metric: str) -> str:
    """Per-second rate of `metric` for each selected host/agent."""
    return f"sum by (host, agent) (rate({metric}{{{_SEL}}}[{RATE}]))"


def _write_read_panel(title: str, write_metric: str, read_metric: str, unit: str) -> timeseries.Panel:
    """Per-second rates of a WRITE and a READ counter, one line each per selected host/agent."""
    return (
        timeseries_panel(title)
        .with_target(query(_per_agent_rate(write_metric), legend="{{host}}/{{agent}} write"))
        .with_target(query(_per_agent_rate(read_metric), legend="{{host}}/{{agent}} read", ref_id="B"))
        .unit(unit)
        .min(0)
        .span(12)
        .height(8)
    )


def throughput() -> timeseries.Panel:
    """Bytes per second written and read per host/agent."""
    return _write_read_panel(
        "Throughput per agent", "flightdeck_nixl_tx_bytes_total", "flightdeck_nixl_rx_bytes_total", "Bps"
    ).description("Bytes moved by transfers each agent initiated (WRITE = tx, READ = rx).")


def request_rate() -> timeseries.Panel:
    """Completed WRITE and READ requests per second per host/agent."""
    return _write_read_panel(
        "Request rate per agent",
        "flightdeck_nixl_tx_requests_total",
        "flightdeck_nixl_rx_requests_total",
        "reqps",
    )


def _quantile_panel(title: str, metric: str, description: str) -> timeseries.Panel:
    """p50 / p90 / p99 of a NIXL latency histogram over the selected agents."""
    bucket = f"sum by (le) (rate({metric}_bucket{{{_SEL}}}[{RATE}]))"
    return quantiles_panel(title, description, bucket).span(12).height(8)


def transfer_time_quantiles() -> timeseries.Panel:
    """Post → completion time quantiles."""
    return _quantile_panel(
        "Transfer time quantiles", "flightdeck_nixl_xfer_time_seconds", "Post → completion time per transfer."
    )


def post_time_quantiles() -> timeseries.Panel:
    """Post start → backend submission time quantiles."""
    return _quantile_panel(
        "Post time quantiles",
        "flightdeck_nixl_post_time_seconds",
        "Post start → backend submission; high values point at the agent, not the network.",
    )


def errors_by_kind() -> timeseries.Panel:
    """Failed transfers per second by NIXL status."""
    return (
        timeseries_panel("Errors by kind")
        .description("Failed transfers by NIXL status (not_posted, backend, remote_disconnect, ...).")
        .with_target(
            query(f"sum by (kind) (rate(flightdeck_nixl_errors_total{{{_SEL}}}[{RATE}]))", legend="{{kind}}")
        )
        .unit("reqps")
        .min(0)
        .span(8)
        .height(8)
    )


def dropped_events() -> timeseries.Panel:
    """Telemetry events NIXL dropped per second (the other panels under-count while non-zero)."""
    return (
        timeseries_panel("Dropped telemetry events")
        .description("Events NIXL dropped before Flightdeck read them; other panels under-count meanwhile.")
        .with_target(
            query(_per_agent_rate("flightdeck_nixl_events_dropped_total"), legend="{{host}}/{{agent}}")
        )
        .min(0)
        .span(8)
        .height(8)
    )


def registered_memory() -> timeseries.Panel:
    """Registered minus deregistered memory per host/agent."""
    return (
        timeseries_panel("Registered memory")
        .with_target(
            query(
                f"sum by (host, agent) (flightdeck_nixl_memory_registered_bytes{{{_SEL}}})",
                legend="{{host}}/{{agent}}",
            )
        )
        .unit("bytes")
        .min(0)
        .span(8)
        .height(8)
    )


def build(flightdeck_url: str = DEFAULT_FLIGHTDECK_URL) -> model.Dashboard:
    """The NIXL transfers dashboard; links point at `flightdeck_url` unless changed in Grafana."""
    board = (
        base_dashboard(
            UID,
            TITLE,
            "NIXL KV-cache transfers: throughput, requests, latency quantiles, errors and dropped events.",
            flightdeck_url,
        )
        .with_variable(host_variable())
        .with_variable(agent_variable())
    )
    board = with_section(board, "Traffic", [throughput(), request_rate()])
    board = with_section(board, "Latency", [transfer_time_quantiles(), post_time_quantiles()])
    board = with_section(board, "Health", [errors_by_kind(), dropped_events(), registered_memory()])
    return number_panels(board.build())
