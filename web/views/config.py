"""The configuration section of the job page: each setting that differs across the job's ranks,
its values side by side."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flightdeck.analysis.findings import CONFIG_KINDS
from flightdeck.web.views.fmt import fmt_ranks


@dataclass(frozen=True, slots=True)
class ConfigSide:
    """One value of a differing setting and who holds it."""

    value: str
    ranks: str
    rank_count: int
    hosts: str
    majority: bool


@dataclass(frozen=True, slots=True)
class ConfigRow:
    """One differing setting of the job's ranks (a version_skew / config_skew finding)."""

    kind: str
    setting: str
    group: str | None
    sides: list[ConfigSide]
    detail: str


#: What each config-skew setting is called on the page.
CONFIG_SETTINGS: dict[str, str] = {
    "torch_version": "torch version",
    "torch_git_version": "torch build (git)",
    "cuda_version": "CUDA version",
    "nccl_version": "NCCL version",
    "python_version": "Python version",
    "python_floor": "torch / Python combination",
    "checkpoint_compat": "checkpoint compatibility",
    "fr_disabled": "flight recorder off",
    "fr_buffer_size": "FR ring size (entries)",
    "fr_buffer_bytes": "FR ring size looks like bytes",
    "timeout_ms": "group timeout",
    "timeout_vs_job": "group timeout vs the job's",
    "dump_on_timeout": "dump on timeout",
}


def config_rows(report: Mapping[str, Any]) -> list[ConfigRow]:
    """The configuration section: each config finding's values side by side, majority first."""
    rows = []
    for f in report.get("findings") or []:
        if f.get("kind") not in CONFIG_KINDS:
            continue
        expected, actual = f.get("expected"), f.get("actual") or {}
        setting = str((expected or actual).get("setting") or "")
        raw_sides = ([expected] if expected else []) + list(actual.get("sides") or [])
        sides = [
            ConfigSide(
                value=str(side.get("value", "")),
                ranks=fmt_ranks([int(r) for r in side.get("ranks") or []]),
                rank_count=len(side.get("ranks") or []),
                hosts=", ".join(str(h) for h in (side.get("hosts") or [])[:8])
                + (f" (+{len(side['hosts']) - 8} more)" if len(side.get("hosts") or []) > 8 else ""),
                majority=expected is not None and i == 0,
            )
            for i, side in enumerate(raw_sides)
            if isinstance(side, Mapping)
        ]
        rows.append(
            ConfigRow(
                kind=str(f["kind"]),
                setting=CONFIG_SETTINGS.get(setting, setting),
                group=None if f.get("process_group") is None else str(f["process_group"]),
                sides=sides,
                detail=str(f.get("detail", "")),
            )
        )
    return rows
