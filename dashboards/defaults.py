"""Defaults of `flightdeck dashboards` that the command line needs without the Grafana SDK installed."""

from __future__ import annotations

from pathlib import Path

#: where the Flightdeck web UI answers by default (`flightdeck server --port 8470`).
DEFAULT_FLIGHTDECK_URL = "http://127.0.0.1:8470"

#: where `flightdeck dashboards build` writes the dashboards (committed; Grafana provisions them).
BUILD_DIR = Path(__file__).resolve().parent / "build"

#: where docs/runbook.md is published, the base of every alert's `runbook_url` (publish the
#: runbook where on-call can open it, e.g. your forge or wiki, and render the rules with it:
#: `flightdeck dashboards alerts --runbook-url URL`).
DEFAULT_RUNBOOK_URL = "https://flightdeck.example/docs/runbook.md"

#: the shipped alert rules and their promtool tests (the rendering of the two defaults above).
ALERTS_DIR = Path(__file__).resolve().parent / "alerts"
