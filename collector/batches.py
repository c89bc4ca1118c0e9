"""Encoding a flush's snapshots and NIXL samples into batches within the size limits.

A part of `Collector` (`flightdeck.collector.daemon`).
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from flightdeck import __version__
from flightdeck.collector.queue import NewBatch
from flightdeck.collector.settings import CollectorSettings
from flightdeck.wire import Batch, Snapshot, encode_batch

#: The daemon's parts log under the one name they had as one module (log lines name it).
log = logging.getLogger("flightdeck.collector.daemon")


class BatchEncoding:
    """The `Collector`'s part that turns snapshots and samples into `NewBatch`es for the queue.

    Its state is the `Collector`'s, set in `Collector.__init__` (what each field holds is said
    there); the annotations below name the fields this part uses.
    """

    settings: CollectorSettings
    clock: Callable[[], int]
    host: str

    def _batches(self, snapshots: list[Snapshot], nixl: list[dict[str, Any]]) -> list[NewBatch]:
        """Encode into batches within max_batch_entries and max_batch_bytes."""
        limit = self.settings.max_batch_entries
        groups: list[list[Snapshot]] = [[]]
        count = 0
        for snap in snapshots:
            entries = snap.entries
            for i in range(0, max(len(entries), 1), limit):
                part = dataclasses.replace(snap, entries=entries[i : i + limit])
                if count + len(part.entries) > limit and groups[-1]:
                    groups.append([])
                    count = 0
                groups[-1].append(part)
                count += len(part.entries)
        out: list[NewBatch] = []
        for i, group in enumerate(groups):
            self._encode(group, nixl if i == 0 else [], out)
        return out

    def _encode(self, snaps: list[Snapshot], nixl: list[dict[str, Any]], out: list[NewBatch]) -> None:
        """Encode one batch; halve it while it is over max_batch_bytes and can still be split."""
        batch_id = str(uuid.uuid4())
        doc = encode_batch(Batch(batch_id, self.host, __version__, self.clock(), snapshots=snaps, nixl=nixl))
        # orjson: ~5x faster than the standard library on thousands of small objects, and this
        # encoding was the collector's largest cost per shipped entry after normalizing it.
        data = orjson.dumps(doc)
        if len(data) > self.settings.max_batch_bytes:
            if len(snaps) > 1:
                half = len(snaps) // 2
                self._encode(snaps[:half], nixl, out)
                self._encode(snaps[half:], [], out)
                return
            if snaps and len(snaps[0].entries) > 1:
                s, half = snaps[0], len(snaps[0].entries) // 2
                self._encode([dataclasses.replace(s, entries=s.entries[:half])], nixl, out)
                self._encode([dataclasses.replace(s, entries=s.entries[half:])], [], out)
                return
            if len(nixl) > 1:
                self._encode(snaps, nixl[: len(nixl) // 2], out)
                self._encode([], nixl[len(nixl) // 2 :], out)
                return
            log.warning(
                "batch %s is %d bytes, over max_batch_bytes, and cannot be split", batch_id, len(data)
            )
        entries = sum(len(s.entries) for s in snaps)
        kind = "fr" if snaps else "nixl"
        out.append(NewBatch(batch_id, kind, entries, gzip.compress(data, compresslevel=3)))
