"""Flightdeck dashboards."""
