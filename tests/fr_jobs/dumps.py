"""Read the spool files a job left: sidecars (JSON) and dumps (pickle, read without globals)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any


class _NoGlobals(pickle.Unpickler):
    """Flight-recorder pickles hold plain containers only; refuse anything that names a global."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing global {module}.{name} in a dump")


def load_dump(path: Path) -> dict[str, Any]:
    """Load one dump file safely."""
    with open(path, "rb") as f:
        data = _NoGlobals(f).load()
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a flight-recorder dump")
    return data


def load_sidecar(dump_path: Path) -> dict[str, Any]:
    """The sidecar of a dump file (`X.meta.json` for `X`)."""
    meta: dict[str, Any] = json.loads(dump_path.with_name(dump_path.name + ".meta.json").read_text())
    return meta


def rank_files(directory: Path) -> dict[int, list[Path]]:
    """Dump files per rank (`rank_<R>.pkl`, `.stall.pkl`, `.final.pkl`)."""
    out: dict[int, list[Path]] = {}
    for p in sorted(directory.glob("rank_*.pkl")):
        rank = int(p.name.split(".")[0].removeprefix("rank_"))
        out.setdefault(rank, []).append(p)
    return out


def latest_per_rank(directory: Path) -> dict[int, Path]:
    """Each rank's most recent dump, by the sidecar's snapshot time."""
    return {
        rank: max(paths, key=lambda p: int(load_sidecar(p)["snapshot_time_ns"]))
        for rank, paths in rank_files(directory).items()
    }
