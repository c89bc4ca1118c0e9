"""NIXL telemetry for the collector: every NIXL agent's samples on the host, checked, and shipped
when they changed (or a heartbeat ago).

A part of `Collector` (`flightdeck.collector.daemon`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flightdeck.collector.metrics import CollectorMetrics
from flightdeck.collector.settings import CollectorSettings
from flightdeck.readers.nixl import NixlFormatError
from flightdeck.snapshot_check import nixl_wire_problem

#: The daemon's parts log under the one name they had as one module (log lines name it).
log = logging.getLogger("flightdeck.collector.daemon")

#: An unchanged NIXL sample is shipped again after this long, so the server sees the agent alive.
NIXL_HEARTBEAT_NS = 60_000_000_000


class NixlTelemetry:
    """The `Collector`'s part that reads NIXL telemetry (ring files consumed, mp stores only read).

    Its state is the `Collector`'s, set in `Collector.__init__` (what each field holds is said
    there); the annotations below name the fields this part uses.
    """

    settings: CollectorSettings
    clock: Callable[[], int]
    host: str
    metrics: CollectorMetrics
    _nixl_rings: Any
    _nixl_shipped: dict[tuple[Any, ...], tuple[dict[str, Any], int]]
    _nixl_errors_logged: set[str]

    def _read_nixl(self) -> list[dict[str, Any]]:
        """Wire samples of every NIXL agent on the host (rings consumed, mp stores only read)."""
        out: list[dict[str, Any]] = []
        failures: list[Exception] = []
        if self._nixl_rings is not None:
            rings = self._nixl_rings
            full, unknown = rings.ring_full_reads, rings.unknown_events
            try:
                samples, errs = rings.poll()
                out += [s.to_wire() for s in samples]
                failures += errs
            except Exception:
                log.exception("reading NIXL ring files failed")
                self.metrics.loop_errors.labels(loop="nixl").inc()
            # Silent loss made visible: a full ring means NIXL was discarding events.
            self.metrics.nixl_ring_full_reads.inc(rings.ring_full_reads - full)
            self.metrics.nixl_unknown_events.inc(rings.unknown_events - unknown)
        if self.settings.nixl_multiproc_dir is not None:
            from flightdeck.readers.nixl_mp import read_mp_dir

            try:
                samples, errs = read_mp_dir(
                    Path(os.path.expanduser(self.settings.nixl_multiproc_dir)),
                    host=self.host,
                    clock=self.clock,
                )
                out += [s.to_wire() for s in samples]
                failures += errs
            except Exception:
                log.exception("reading NIXL store files failed")
                self.metrics.loop_errors.labels(loop="nixl").inc()
        checked = []
        for w in out:
            problem = nixl_wire_problem(w)
            if problem is None:
                checked.append(w)
            else:  # the server would refuse it (and, an older server, the whole batch with it)
                failures.append(
                    NixlFormatError(f"NIXL sample of {str(w.get('agent'))[:64]!r} refused: {problem}")
                )
        out = checked
        for err in failures:
            msg = str(err)
            if msg not in self._nixl_errors_logged:  # once per distinct problem, not every flush
                self._nixl_errors_logged.add(msg)
                self.metrics.parse_errors.labels(reason="nixl_format").inc()
                log.warning("NIXL telemetry file skipped: %s", msg)
        return out

    def _changed_nixl(self, wires: list[dict[str, Any]]) -> list[tuple[dict[str, Any], tuple[Any, ...]]]:
        """Samples that changed since shipped, or were last shipped a heartbeat ago."""
        now = self.clock()
        out = []
        for w in wires:
            ident = (w["host"], w["agent"], w["source"], w["run"], w["pid"])
            last = self._nixl_shipped.get(ident)
            if last is None or last[0] != _strip_time(w) or now - last[1] >= NIXL_HEARTBEAT_NS:
                out.append((w, ident))
        return out


def _strip_time(wire: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in wire.items() if k != "read_time_ns"}
