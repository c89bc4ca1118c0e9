"""Flightdeck: observability for PyTorch distributed jobs (flight recorder and NIXL telemetry)."""

__version__ = "0.1.0"
