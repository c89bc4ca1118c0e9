"""Default places on a user's machine (XDG base directories), shared by `flightdeck up`, the
server and `flightdeck token`, so that every command finds the same embedded database."""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback)


def default_data_dir() -> Path:
    """`$XDG_DATA_HOME/flightdeck`, i.e. `~/.local/share/flightdeck` by default."""
    return _xdg("XDG_DATA_HOME", ".local/share") / "flightdeck"


def default_spool_dir() -> Path:
    """`$XDG_CACHE_HOME/flightdeck/spool`, i.e. `~/.cache/flightdeck/spool` by default."""
    return _xdg("XDG_CACHE_HOME", ".cache") / "flightdeck" / "spool"
