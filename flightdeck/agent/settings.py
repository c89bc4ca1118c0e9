"""The agent's settings: `AgentConfig`, read from `FLIGHTDECK_AGENT_*` variables (the old names warn)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightdeck.agent.progress import STACKS_AFTER_S
from flightdeck.env_names import AGENT_PREFIX, warn_legacy
from flightdeck.spool import DEFAULT_SPOOL_DIR, sanitize_job

logger = logging.getLogger("flightdeck.agent")

ENV_PREFIX = AGENT_PREFIX
#: Environment variables read by `AgentConfig.from_env`, with what they set.
ENV_VARS: dict[str, str] = {
    "FLIGHTDECK_AGENT_ENABLED": "enabled (0/false/no/off disables the agent, 1 or unset enables it)",
    "FLIGHTDECK_AGENT_SPOOL_DIR": "spool_dir",
    "FLIGHTDECK_AGENT_INTERVAL_S": "interval_s",
    "FLIGHTDECK_AGENT_FULL_EVERY_S": "full_every_s",
    "FLIGHTDECK_AGENT_JOB": "job",
    "FLIGHTDECK_AGENT_CHECKPOINT_DIR": "Where the job reads and writes distributed checkpoints, sent in "
    "the rank's configuration report: the server flags jobs that share it across torch 2.14 and 2.15.",
    "FLIGHTDECK_STALL_AFTER_S": "deprecated and ignored (a warning): the server's "
    "FLIGHTDECK_SERVER_STALL_AFTER_S decides what is a hang; the agent writes its stack snapshot "
    "after a fixed STACKS_AFTER_S",
    "FLIGHTDECK_TEST_VERSION_OVERRIDE": "TEST ONLY: a JSON object replacing the reported versions "
    "(torch_version, torch_git_version, cuda_version, nccl_version, python_version); the report is "
    "marked `simulated`",
}
#: The names the agent read before it had its own prefix (read for one release, with a warning).
LEGACY_ENV_VARS: dict[str, str] = {
    "FLIGHTDECK_AGENT": "FLIGHTDECK_AGENT_ENABLED",
    "FLIGHTDECK_SPOOL_DIR": "FLIGHTDECK_AGENT_SPOOL_DIR",
    "FLIGHTDECK_INTERVAL_S": "FLIGHTDECK_AGENT_INTERVAL_S",
    "FLIGHTDECK_FULL_EVERY_S": "FLIGHTDECK_AGENT_FULL_EVERY_S",
    "FLIGHTDECK_JOB": "FLIGHTDECK_AGENT_JOB",
    "FLIGHTDECK_CHECKPOINT_DIR": "FLIGHTDECK_AGENT_CHECKPOINT_DIR",
}
_FALSE = {"0", "false", "no", "off"}
_TRUE = {"1", "true", "yes", "on", ""}


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Settings of the in-job agent; `from_env` reads them from `FLIGHTDECK_AGENT_*` variables."""

    spool_dir: Path = Path(DEFAULT_SPOOL_DIR)
    """Root of the spool; files go to `<spool_dir>/<job>/<attempt>/` (FLIGHTDECK_AGENT_SPOOL_DIR)."""

    interval_s: float = 1.0
    """Seconds between periodic snapshots (FLIGHTDECK_AGENT_INTERVAL_S); at least 0.05. A hang is
    reported about `stall_after_s` (the server's) plus one interval plus one collector push after
    the fault: 1 s keeps that within 3 s of the threshold."""

    stall_after_s: float | None = None
    """Deprecated (FLIGHTDECK_STALL_AFTER_S on the agent): accepted, logged once, ignored. The
    server's `stall_after_s` decides what is a hang; the agent writes its stack snapshot after a
    fixed 2 s (`STACKS_AFTER_S`). Remove it from job environments."""

    full_every_s: float = 30.0
    """Seconds between periodic snapshots of the whole ring (FLIGHTDECK_AGENT_FULL_EVERY_S); the ones in
    between hold only what changed since (`rank_<R>.recent.pkl`). 0 (or less than `interval_s`):
    the whole ring every time."""

    job: str | None = None
    """Job id (FLIGHTDECK_AGENT_JOB); None: TORCHELASTIC_RUN_ID, SLURM_JOB_ID, else agreed across ranks
    through the c10d store. Characters other than letters, digits, `.`, `_`, `-` become `_`."""

    enabled: bool = True
    """False turns `start()` and the launcher into no-ops (FLIGHTDECK_AGENT_ENABLED=0)."""

    def __post_init__(self) -> None:
        if not self.interval_s >= 0.05:  # also rejects NaN
            raise ValueError(f"interval_s must be >= 0.05 seconds, got {self.interval_s}")
        if not self.full_every_s >= 0:  # also rejects NaN; below interval_s every snapshot is whole
            raise ValueError(f"full_every_s must be >= 0 seconds, got {self.full_every_s}")
        if self.job is not None and not sanitize_job(self.job, default=""):
            raise ValueError(f"job must contain a letter or digit, got {self.job!r}")
        if not str(self.spool_dir):
            raise ValueError("spool_dir must not be empty")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AgentConfig:
        """Build the config from `FLIGHTDECK_AGENT_*` variables (the old names warn); keyword
        overrides win over the env."""
        env = agent_env(os.environ if env is None else env)
        values: dict[str, Any] = {}
        if "FLIGHTDECK_AGENT_ENABLED" in env:
            values["enabled"] = _parse_bool("FLIGHTDECK_AGENT_ENABLED", env["FLIGHTDECK_AGENT_ENABLED"])
        if env.get("FLIGHTDECK_AGENT_SPOOL_DIR"):
            values["spool_dir"] = Path(env["FLIGHTDECK_AGENT_SPOOL_DIR"])
        for name, key in (
            ("interval_s", "FLIGHTDECK_AGENT_INTERVAL_S"),
            ("stall_after_s", "FLIGHTDECK_STALL_AFTER_S"),
            ("full_every_s", "FLIGHTDECK_AGENT_FULL_EVERY_S"),
        ):
            if env.get(key):
                try:
                    values[name] = float(env[key])
                except ValueError:
                    raise ValueError(f"{key} must be a number of seconds, got {env[key]!r}") from None
        if env.get("FLIGHTDECK_AGENT_JOB"):
            values["job"] = env["FLIGHTDECK_AGENT_JOB"]
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown agent setting(s): {', '.join(sorted(unknown))}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "spool_dir" in values:
            values["spool_dir"] = Path(values["spool_dir"])
        if "interval_s" in values:
            values["interval_s"] = float(values["interval_s"])
        for name in ("stall_after_s", "full_every_s"):
            if name in values:
                values[name] = float(values[name])
        if "stall_after_s" in values:
            _warn_stall_after_deprecated()
        return cls(**values)


_deprecation_logged = False


def _warn_stall_after_deprecated() -> None:
    global _deprecation_logged
    if not _deprecation_logged:
        _deprecation_logged = True
        logger.warning(
            "flightdeck agent: FLIGHTDECK_STALL_AFTER_S (stall_after_s) is deprecated and ignored: "
            "the server's FLIGHTDECK_SERVER_STALL_AFTER_S decides what is a hang, and the agent writes its "
            "stack snapshot after a fixed %.0f s",
            STACKS_AFTER_S,
        )


def agent_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with each old agent variable (`LEGACY_ENV_VARS`) copied to its new name where that
    is unset; each old one set warns (the new name wins when both are)."""
    out = dict(env)
    for old, new in LEGACY_ENV_VARS.items():
        if old in env:
            if new in env:
                warn_legacy(old, new, process="flightdeck agent", ignored=True)
            else:
                warn_legacy(old, new, process="flightdeck agent")
                out[new] = env[old]
    return out


def _parse_bool(key: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _FALSE:
        return False
    if low in _TRUE:
        return True
    raise ValueError(f"{key} must be 0 or 1, got {raw!r}")
