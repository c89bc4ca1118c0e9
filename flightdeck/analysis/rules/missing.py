"""The ranks without a dump, as one finding."""

from __future__ import annotations

from flightdeck.analysis.findings import Finding
from flightdeck.analysis.rules.common import _fmt_ranks


def _missing(without: list[int], missing: int) -> Finding:
    return Finding(
        kind="missing_dump",
        detail=(
            f"No dump from {_fmt_ranks(without, total=missing)}: the diagnosis uses the other ranks; where these ranks "
            "are is inferred from what the others wait for."
        ),
        culprit_ranks=list(without),
    )
