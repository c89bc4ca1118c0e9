"""Merging one rank's snapshots into what the diagnosis reads of it.

`fold_entries` folds a snapshot's entries into its rank's summary (the live server's path).
"""

from __future__ import annotations

from flightdeck.analysis.summary import RankSummary, add_entries, fingerprint, signature_of
from flightdeck.wire import Snapshot


def fold_entries(s: RankSummary, snap: Snapshot) -> None:
    """Fold a snapshot's entries into its rank's summary."""
    c = snap.columns
    if c is None:
        add_entries(s, snap.entries)
    else:  # each signature's fingerprint once per signature table, not once per entry
        table = [fingerprint(signature_of(op, i, o, idt, odt)) for _, op, _, _, i, o, idt, odt in c.sigs]
        add_entries(s, snap.entries, map(table.__getitem__, c.sig))
