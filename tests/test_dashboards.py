"""The Grafana dashboards: committed JSON matches the code, validates, and queries documented metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from flightdeck.dashboards import build
from flightdeck.dashboards.cmd import main as dashboards_main
from flightdeck.dashboards.common import DATASOURCE_UID, DATASOURCE_VARIABLE, URL_VARIABLE
from flightdeck.dashboards.defaults import BUILD_DIR
from tests.support.metrics_doc import documented_series, metric_names

REPO = Path(__file__).resolve().parents[1]
#: Grafana's schemas, vendored into the repository (tests/data/grafana/README.md).
SCHEMAS = REPO / "tests" / "data" / "grafana"
DASHBOARD_SCHEMA = "dashboard-v11.6.jsonschema.json"


def _registry() -> Registry[Any]:
    """All Grafana schema files, addressable by file name so cross-file `$ref`s resolve."""
    if not (SCHEMAS / DASHBOARD_SCHEMA).is_file():
        pytest.fail(f"Grafana JSON schemas not found at {SCHEMAS}")
    resources = [
        (path.name, Resource.from_contents(json.loads(path.read_text(encoding="utf-8")), DRAFT7))
        for path in sorted(SCHEMAS.glob("*.json"))
    ]
    return Registry().with_resources(resources)


@pytest.fixture(scope="module")
def registry() -> Registry[Any]:
    """The schema registry, loaded once."""
    return _registry()


def _validate(schema_ref: str, instance: object, registry: Registry[Any], where: str) -> None:
    """Fail with the most relevant error if `instance` does not match the referenced schema."""
    validator = Draft7Validator({"$ref": schema_ref}, registry=registry)
    error: ValidationError | None = best_match(validator.iter_errors(instance))
    if error is not None:
        pytest.fail(f"{where}: {'/'.join(map(str, error.absolute_path))}: {error.message[:500]}")


def _dashboards() -> dict[str, dict[str, Any]]:
    """Every committed dashboard JSON, keyed by file name."""
    return {
        path.name: json.loads(path.read_text(encoding="utf-8")) for path in sorted(BUILD_DIR.glob("*.json"))
    }


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel.get('title')!r} target {target.get('refId')}", target["expr"]
    for variable in dashboard["templating"].get("list", []):
        if variable["type"] == "query":
            query = variable["query"]
            inner = query.removeprefix("label_values(").removesuffix(")")
            selector = inner.rsplit(",", 1)[0] if inner != query else query
            yield f"variable {variable['name']!r}", selector


def test_committed_dashboards_match_code(tmp_path: Path) -> None:
    """Regenerating into a temp dir gives byte-identical files to dashboards/build/."""
    assert dashboards_main(["build", "--out", str(tmp_path)]) == 0
    fresh = {p.name: p.read_text(encoding="utf-8") for p in sorted(tmp_path.glob("*.json"))}
    committed = {p.name: p.read_text(encoding="utf-8") for p in sorted(BUILD_DIR.glob("*.json"))}
    assert sorted(fresh) == sorted(committed), "dashboards/build/ has missing or stale files"
    drifted = [name for name in fresh if fresh[name] != committed[name]]
    assert not drifted, f"dashboards/build/ is out of date for {drifted}: run `flightdeck dashboards build`"
    assert build.drift() == []


def test_build_is_deterministic() -> None:
    """Two renders in one process are identical (no ids, timestamps or dict order leaking in)."""
    assert build.render() == build.render()


def test_check_flag_reports_drift(tmp_path: Path) -> None:
    """`--check` exits 1 on a changed or stale file and 0 on a fresh build."""
    assert dashboards_main(["build", "--out", str(tmp_path)]) == 0
    assert dashboards_main(["build", "--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "flightdeck-overview.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "stale.json").write_text("{}\n", encoding="utf-8")
    assert dashboards_main(["build", "--check", "--out", str(tmp_path)]) == 1
    assert build.drift(tmp_path) == ["flightdeck-overview.json", "stale.json"]


@pytest.mark.slow
def test_flightdeck_cli_builds(tmp_path: Path) -> None:
    """`flightdeck dashboards build` writes one file per dashboard."""
    exe = shutil.which("flightdeck")
    if exe is None:
        pytest.skip("the `flightdeck` console script is not installed (pip install -e .)")
    out = subprocess.run(
        [exe, "dashboards", "build", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(build.render())
    assert out.stdout.count(".json") == len(build.DASHBOARDS)


@pytest.mark.parametrize("name", sorted(build.render()))
def test_dashboard_validates_against_grafana_schema(name: str, registry: Registry[Any]) -> None:
    """Each dashboard matches Grafana 11.6's schema; timeseries options and Prometheus targets too."""
    dashboard = _dashboards()[name]
    _validate(f"{DASHBOARD_SCHEMA}#", dashboard, registry, name)
    for panel in _panels(dashboard):
        where = f"{name} panel {panel.get('title')!r}"
        if panel["type"] == "timeseries":
            _validate("timeseries.jsonschema.json#/definitions/Options", panel["options"], registry, where)
            custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
            _validate("timeseries.jsonschema.json#/definitions/FieldConfig", custom, registry, where)
        for target in panel.get("targets", []):
            _validate("prometheus.jsonschema.json#", target, registry, where)


def test_schema_rejects_a_misspelled_key(registry: Registry[Any]) -> None:
    """The validation is real: a typo in a dashboard key is caught."""
    dashboard = json.loads(next(iter(build.render().values())))
    dashboard["panels"][1]["titel"] = dashboard["panels"][1].pop("title")
    validator = Draft7Validator({"$ref": f"{DASHBOARD_SCHEMA}#"}, registry=registry)
    assert best_match(validator.iter_errors(dashboard)) is not None


@pytest.mark.parametrize("name", sorted(build.render()))
def test_exprs_use_only_documented_metrics(name: str) -> None:
    """Every PromQL expression queries only series listed in docs/metrics.md."""
    documented = documented_series().keys() | {"up"}  # Prometheus's own series per target
    exprs = list(_exprs(_dashboards()[name]))
    assert exprs, f"{name} has no queries"
    for where, expr in exprs:
        used = metric_names(expr)
        assert used, f"{name} {where}: no metric found in {expr!r}"
        unknown = used - documented
        assert not unknown, f"{name} {where}: {sorted(unknown)} not in docs/metrics.md: {expr!r}"


def test_metric_name_extraction() -> None:
    """The PromQL scanner finds metrics and skips functions, labels, keywords and strings."""
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{job="$job", x=~"b|c"}[$__rate_interval])))'
        " / on (job) group_left () max without (rank) (b_total offset 5m) > bool 1e3"
        ' or label_replace(c, "dst", "$1", "src", "(.*)") and vector(0)'
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}
    assert metric_names("flightdeck_jobs") == {"flightdeck_jobs"}


def test_documented_series_include_histogram_parts() -> None:
    """Histograms contribute their _bucket/_sum/_count series; counters keep their _total name."""
    series = documented_series()
    assert series["flightdeck_nixl_xfer_time_seconds_bucket"] == "histogram"
    assert "flightdeck_nixl_xfer_time_seconds" not in series
    assert series["flightdeck_ingest_batches_total"] == "counter"


@pytest.mark.parametrize("name", sorted(build.render()))
def test_links_reach_the_incident_page(name: str) -> None:
    """Links use the `flightdeck_url` variable, and job-bearing dashboards link to /jobs/<job>."""
    dashboard = _dashboards()[name]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables[URL_VARIABLE]["type"] == "textbox"
    assert variables[URL_VARIABLE]["query"] == "http://127.0.0.1:8470"
    links = [link["url"] for link in dashboard["links"] if link["type"] == "link"]
    for panel in _panels(dashboard):
        links += [link["url"] for link in panel.get("links", [])]
        links += [link["url"] for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])]
    assert links and all(url.startswith("${flightdeck_url}/") for url in links), links
    if name != "flightdeck-nixl.json":
        assert any("/jobs/$" in url for url in links), f"{name} has no incident-page link"


def test_flightdeck_url_is_a_build_parameter() -> None:
    """The default of the URL variable follows `--flightdeck-url`."""
    rendered = build.render("https://flightdeck.example.com")
    for text in rendered.values():
        variables = json.loads(text)["templating"]["list"]
        assert {v["name"]: v for v in variables}[URL_VARIABLE]["query"] == "https://flightdeck.example.com"


@pytest.mark.parametrize("name", sorted(build.render()))
def test_panels_use_the_provisioned_datasource(name: str) -> None:
    """Every target queries the `datasource` variable, which starts on the uid the provisioning file
    creates; panel ids are unique."""
    dashboard = _dashboards()[name]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables[DATASOURCE_VARIABLE]["type"] == "datasource"
    assert variables[DATASOURCE_VARIABLE]["query"] == "prometheus"
    assert variables[DATASOURCE_VARIABLE]["current"]["value"] == DATASOURCE_UID
    ids = [panel["id"] for panel in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${" + DATASOURCE_VARIABLE + "}"}
    provisioning = (REPO / "dashboards" / "provisioning" / "datasources" / "flightdeck.yml").read_text()
    assert f"uid: {DATASOURCE_UID}" in provisioning


@pytest.mark.slow
def test_exprs_parse_with_promtool(tmp_path: Path) -> None:
    """Every dashboard expression is valid PromQL (checked as recording rules by promtool)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    lines = ["groups:", "  - name: dashboard-exprs", "    rules:"]
    for name, dashboard in _dashboards().items():
        for index, (_, expr) in enumerate(_exprs(dashboard)):
            concrete = expr.replace("$__rate_interval", "5m").replace("$job", "j").replace("$group", ".*")
            concrete = concrete.replace("$host", ".*").replace("$agent", ".*")
            lines += [
                f"      - record: dashboard:{name.removesuffix('.json').replace('-', '_')}:{index}",
                f"        expr: {json.dumps(concrete)}",
            ]
    rules = tmp_path / "exprs.yml"
    rules.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
