"""Defaults of `flightdeck dashboards` that the command line needs without the Grafana SDK installed."""

from __future__ import annotations

from pathlib import Path

#: where the Flightdeck web UI answers by default (`flightdeck server --port 8470`).
DEFAULT_FLIGHTDECK_URL = "http://127.0.0.1:8470"

#: where `flightdeck dashboards build` writes the dashboards (committed; Grafana provisions them).
BUILD_DIR = Path(__file__).resolve().parent / "build"
