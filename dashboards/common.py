"""Pieces every Flightdeck dashboard shares: the datasource, queries, links and variables.

Each dashboard module (`overview`, `job`, `nixl`) builds its panels from these helpers, so the
datasource uid, the incident-page link and the `flightdeck_url` variable are spelled in one place.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prometheus_models

from flightdeck.dashboards.defaults import DEFAULT_FLIGHTDECK_URL as DEFAULT_FLIGHTDECK_URL

#: uid of the Prometheus datasource; `provisioning/datasources/flightdeck.yml` creates it, and the
#: `datasource` variable starts on it.
DATASOURCE_UID = "prometheus"

#: name of the dashboard variable choosing the Prometheus datasource; every query uses it, so the
#: dashboards work on a Grafana whose Prometheus has another uid.
DATASOURCE_VARIABLE = "datasource"

#: the Prometheus `job` of the Flightdeck server replicas in the shipped prometheus.yml.
SERVER_SCRAPE_JOB = "flightdeck"

#: name of the dashboard variable holding the Flightdeck base URL; links use `${flightdeck_url}`.
URL_VARIABLE = "flightdeck_url"

#: tag on every Flightdeck dashboard; the dashboard links list dashboards by it.
TAG = "flightdeck"

#: Grafana's rate window for the chosen scrape interval; safe for any zoom level.
RATE = "$__rate_interval"

#: the `collector_last_push_age_seconds` above which a collector counts as down (alert uses it too).
COLLECTOR_STALE_SECONDS = 120


def datasource() -> model.DataSourceRef:
    """The Prometheus datasource the `datasource` variable names."""
    return model.DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VARIABLE + "}")


def datasource_variable() -> dash.DatasourceVariable:
    """The `datasource` drop-down: any Prometheus datasource, the provisioned one first."""
    return (
        dash.DatasourceVariable(DATASOURCE_VARIABLE)
        .label("Prometheus")
        .type("prometheus")
        .current(model.VariableOption(selected=True, text=DATASOURCE_UID, value=DATASOURCE_UID))
    )


def query(expr: str, legend: str = "__auto", ref_id: str = "A") -> prometheus.Dataquery:
    """A range query against the Flightdeck Prometheus datasource."""
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref_id)
        .range()
        .datasource(datasource())
    )


def instant_table_query(expr: str, ref_id: str = "A") -> prometheus.Dataquery:
    """An instant query returning one table row per series (for table panels)."""
    return (
        prometheus.Dataquery()
        .expr(expr)
        .ref_id(ref_id)
        .instant()
        .format(prometheus_models.PromQueryFormat.TABLE)
        .datasource(datasource())
    )


def label_variable(
    name: str,
    label: str,
    query: str,
    *,
    multi: bool = True,
    sort: model.VariableSort = model.VariableSort.ALPHABETICAL_ASC,
) -> dash.QueryVariable:
    """A picker over a label's values (`query`: a `label_values(...)` query), refreshed with the
    time range; `multi`: several values, all of them by default."""
    var = (
        dash.QueryVariable(name)
        .label(label)
        .datasource(datasource())
        .query(query)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(sort)
    )
    return var.multi(True).include_all(True).all_value(".*") if multi else var


def url_variable(default: str) -> dash.TextBoxVariable:
    """The `flightdeck_url` text box: base URL of the Flightdeck UI that the links point at.

    A text box (not a constant) so an operator can override it per view with
    `?var-flightdeck_url=https://...`; the provisioned default comes from the build.
    """
    return (
        dash.TextBoxVariable(URL_VARIABLE)
        .label("Flightdeck URL")
        .description("Base URL of the Flightdeck web UI; incident links point here.")
        .default_value(default)
    )


def job_incident_link(job: str = "${__field.labels.job}") -> dash.DashboardLink:
    """A data link from a series to its job's incident page in the Flightdeck UI.

    `job` is a Grafana interpolation: the series' own `job` label by default, or `${job}` on the
    job dashboard.
    """
    return (
        dash.DashboardLink("Open incident page for job " + job)
        .type(model.DashboardLinkType.LINK)
        .url("${" + URL_VARIABLE + "}/jobs/" + job)
        .target_blank(True)
    )


def flightdeck_home_link() -> dash.DashboardLink:
    """A dashboard link to the Flightdeck UI's front page."""
    return (
        dash.DashboardLink("Flightdeck")
        .type(model.DashboardLinkType.LINK)
        .url("${" + URL_VARIABLE + "}/")
        .icon("external link")
        .tooltip("Open the Flightdeck web UI")
        .target_blank(True)
    )


def sibling_dashboards_link() -> dash.DashboardLink:
    """A drop-down listing every dashboard tagged `flightdeck`."""
    return (
        dash.DashboardLink("Flightdeck dashboards")
        .type(model.DashboardLinkType.DASHBOARDS)
        .tags([TAG])
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True)
    )


def thresholds(base: str, *steps: tuple[float, str]) -> dash.ThresholdsConfig:
    """Absolute thresholds: colour `base` below the first step, then `(value, colour)` steps.

    Grafana treats the first step as the base (-Infinity) whatever its value and writes it as
    `null`; the v11.6 JSON schema requires a number there, so the base step carries 0.
    """
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=0, color=base)] + [model.Threshold(value=v, color=c) for v, c in steps])
    )


def alerts_annotation() -> dash.AnnotationQuery:
    """Flightdeck's firing alerts as annotations on every time series (from Prometheus' ALERTS)."""
    return (
        dash.AnnotationQuery()
        .name("Flightdeck alerts")
        .datasource(datasource())
        .enable(True)
        .icon_color("red")
        .expr('ALERTS{alertname=~"Flightdeck.*", alertstate="firing"}')
    )


def base_dashboard(uid: str, title: str, description: str, flightdeck_url: str) -> dash.Dashboard:
    """A dashboard with Flightdeck's common settings: tags, refresh, time, links, URL variable."""
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .readonly()
        .annotation(alerts_annotation())
        .with_variable(datasource_variable())
        .with_variable(url_variable(flightdeck_url))
        .link(flightdeck_home_link())
        .link(sibling_dashboards_link())
    )


def number_panels(board: model.Dashboard) -> model.Dashboard:
    """Give every panel (rows and the panels inside them) a stable id in document order."""
    next_id = 1
    for panel in board.panels or []:
        panel.id_val = next_id
        next_id += 1
        if isinstance(panel, model.RowPanel):
            for inner in panel.panels:
                inner.id_val = next_id
                next_id += 1
    return board


def with_section(
    board: dash.Dashboard, title: str, panels: list[cogbuilder.Builder[model.Panel]]
) -> dash.Dashboard:
    """Append an expanded row titled `title` followed by its panels.

    Expanded rows keep their panels at the top level (Grafana's layout for an open row); the SDK's
    `Row.with_panel` nests them, which Grafana only shows for a collapsed row.
    """
    board = board.with_row(dash.Row(title).collapsed(False))
    for panel in panels:
        board = board.with_panel(panel)
    return board


def timeseries_panel(title: str) -> timeseries.Panel:
    """A time series panel with Flightdeck's legend (list, bottom) and all-series tooltip."""
    return (
        timeseries.Panel()
        .title(title)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common_models.LegendDisplayMode.LIST)
            .placement(common_models.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common_models.TooltipDisplayMode.MULTI)
            .sort(common_models.SortOrder.DESCENDING)
        )
    )


def quantiles_panel(
    title: str, description: str, bucket: str, quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)
) -> timeseries.Panel:
    """A time series of a histogram's quantiles in seconds, one line each (`p50`, `p90`, ...).

    `bucket` is the `sum by (le) (rate(<metric>_bucket[...]))` expression the quantiles read.
    """
    panel = timeseries_panel(title).description(description).unit("s").min(0)
    for i, q in enumerate(quantiles):
        panel = panel.with_target(
            query(f"histogram_quantile({q}, {bucket})", legend=f"p{round(q * 100)}", ref_id=chr(ord("A") + i))
        )
    return panel
