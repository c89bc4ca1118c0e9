"""Render every Flightdeck dashboard to deterministic JSON in `dashboards/build/<uid>.json`.

The output is `json.dumps(..., sort_keys=True, indent=2)` of the SDK's encoding, so a diff of the
committed files shows only real changes and a test can fail on drift.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from flightdeck.dashboards import job, nixl, overview
from flightdeck.dashboards.defaults import BUILD_DIR, DEFAULT_FLIGHTDECK_URL

#: every dashboard: a function from the Flightdeck base URL to the built dashboard.
DASHBOARDS: tuple[Callable[[str], Dashboard], ...] = (overview.build, job.build, nixl.build)


def encode(board: Dashboard) -> str:
    """The dashboard as stable JSON text (sorted keys, two-space indent, trailing newline)."""
    return json.dumps(board, cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def render(flightdeck_url: str = DEFAULT_FLIGHTDECK_URL) -> dict[str, str]:
    """Every dashboard's JSON text keyed by file name (`<uid>.json`)."""
    rendered: dict[str, str] = {}
    for make in DASHBOARDS:
        board = make(flightdeck_url)
        if not board.uid:
            raise ValueError(f"dashboard {board.title!r} has no uid")
        name = f"{board.uid}.json"
        if name in rendered:
            raise ValueError(f"two dashboards share the uid {board.uid!r}")
        rendered[name] = encode(board)
    return rendered


def write(out_dir: Path = BUILD_DIR, flightdeck_url: str = DEFAULT_FLIGHTDECK_URL) -> list[Path]:
    """Write every dashboard into `out_dir`, removing stale `*.json` files; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rendered = render(flightdeck_url)
    for stale in sorted(out_dir.glob("*.json")):
        if stale.name not in rendered:
            stale.unlink()
    written = []
    for name, text in sorted(rendered.items()):
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def drift(out_dir: Path = BUILD_DIR, flightdeck_url: str = DEFAULT_FLIGHTDECK_URL) -> list[str]:
    """File names in `out_dir` that differ from a fresh render (missing, changed or stale)."""
    rendered = render(flightdeck_url)
    present = {p.name for p in out_dir.glob("*.json")} if out_dir.is_dir() else set()
    changed = [
        name
        for name, text in rendered.items()
        if name not in present or (out_dir / name).read_text(encoding="utf-8") != text
    ]
    return sorted(changed + [name for name in present if name not in rendered])
