"""The diagnosis worker goes first: while it folds and diagnoses, new batches wait to be decoded.

Under load dozens of ingest threads decode batches while one worker thread folds snapshots into
the summaries and diagnoses the jobs, and all of them share the GIL. At 4,096 ranks on one
process a diagnosis took 1.6 s of wall time for 0.12-0.29 s of work, so the job was diagnosed
every ~8 s and its hang found 30.8 s after `stall_after`; with decoding held back during the
worker's step a diagnosis took ~0.35 s and the hang was found 4.4 s after `stall_after`
(`bench/loadgen/`, 4,096 ranks x 300 s: docs/dev/performance-history.md, "Eighth session"). The group-commit writers go on meanwhile: only decoding waits, and at most
`DECODE_GATE_MAX_WAIT_S`, so a slow step delays ingest by a bounded amount and never stops it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: Longest an ingest thread waits for the diagnosis worker's step before decoding anyway.
DECODE_GATE_MAX_WAIT_S = 1.0


class DecodeGate:
    """Held by the diagnosis worker (`hold`) while ingest threads `wait` before decoding.

    One per server process, shared by `LiveDiagnosis` (the holder) and `IngestService` (the
    waiters). The worker holds it from one thread only, so holds do not nest.
    """

    def __init__(self, *, max_wait_s: float = DECODE_GATE_MAX_WAIT_S) -> None:
        self._max_wait_s = max_wait_s
        # Set while decoding may go on: waiters wait for it to be set.
        self._open = threading.Event()
        self._open.set()

    @property
    def held(self) -> bool:
        """Whether decoding is held back now."""
        return not self._open.is_set()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold decoding back while the block runs (the worker's step)."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    @contextmanager
    def let_through(self) -> Iterator[None]:
        """Let decoding go on while the block runs, inside a hold or not: for work of the worker
        that mostly waits for the database (rebuilding a job's summaries from its rows)."""
        held = self.held
        self._open.set()
        try:
            yield
        finally:
            if held:
                self._open.clear()

    def wait(self) -> None:
        """Wait until decoding may go on, at most `max_wait_s` (then go on anyway)."""
        self._open.wait(self._max_wait_s)
