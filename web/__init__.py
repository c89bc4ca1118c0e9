"""Flightdeck web."""
