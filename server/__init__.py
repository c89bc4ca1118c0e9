"""Flightdeck server."""
