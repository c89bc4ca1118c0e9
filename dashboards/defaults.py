"""Defaults of `flightdeck dashboards` that the command line needs without the Grafana SDK installed."""

from __future__ import annotations

from pathlib import Path

#: where the Flightdeck web UI answers by default (`flightdeck server --port 8470`).
DEFAULT_FLIGHTDECK_URL = "http://127.0.0.1:8470"

#: where `flightdeck dashboards build` writes the dashboards (committed; Grafana provisions them).
BUILD_DIR = Path(__file__).resolve().parent / "build"

#: the base of every alert's `runbook_url`: the runbook as the Flightdeck server serves it
#: (`GET /runbook`, one section per alert), so the default links open wherever the incident links
#: do. Publish docs/runbook.md elsewhere too (a wiki, your forge) and render the rules with that
#: address (`flightdeck dashboards alerts --runbook-url URL`) if on-call must read it while every
#: Flightdeck server is down.
DEFAULT_RUNBOOK_URL = DEFAULT_FLIGHTDECK_URL + "/runbook"

#: the shipped alert rules and their promtool tests (the rendering of the two defaults above).
ALERTS_DIR = Path(__file__).resolve().parent / "alerts"
