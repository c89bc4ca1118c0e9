"""Flightdeck collector."""
