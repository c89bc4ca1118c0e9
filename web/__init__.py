"""Flightdeck web: the incident dashboard (server-rendered HTML + htmx); see web/README.md."""
