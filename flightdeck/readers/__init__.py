"""Flightdeck's readers of the files other programs write: PyTorch's flight-recorder dumps and
NIXL's telemetry files, turned into `flightdeck.records` and `flightdeck.nixl_records` types.

Shared by the collector, `flightdeck analyze` and the pages' dump-file source; they import nothing
of the collector, the server or the web pages.
"""
