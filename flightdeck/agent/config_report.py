"""The configuration report every sidecar carries: versions, flight-recorder settings, per-group
backend and timeout, `TORCH_*`/`NCCL_*` env (secrets redacted)."""

from __future__ import annotations

import json
import math
import platform
import re
from collections.abc import Mapping
from typing import Any

from flightdeck.agent.settings import _FALSE

#: The flight-recorder ring size variables, the one torch reads first first; torch's default.
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_BUFFER_DEFAULT = 2000
#: NCCL's dump-on-timeout switch (TORCH_FR_DUMP_ON_TIMEOUT is the torch 2.15 alias); default on.
DUMP_ON_TIMEOUT_VARS = ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT")
TEST_VERSION_OVERRIDE_VAR = "FLIGHTDECK_TEST_VERSION_OVERRIDE"
_VERSION_KEYS = ("torch_version", "torch_git_version", "cuda_version", "nccl_version", "python_version")
#: Env var names containing one of these have their value redacted in the config report.
SECRET_NAME_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")
REDACTED = "<redacted>"
_TOKENISH = re.compile(r"[A-Za-z0-9+/=_.:-]+")


def looks_secret(value: str) -> bool:
    """Whether an env value looks like a credential: a long, high-entropy token (not a path, list or
    number), e.g. an API key pasted into a variable whose name does not say so."""
    if len(value) < 24 or value[0] in "/.~" or not _TOKENISH.fullmatch(value):
        return False
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return False
    counts = {c: value.count(c) for c in set(value)}
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= 3.5


def reported_env(env: Mapping[str, str]) -> dict[str, str]:
    """The `TORCH_*` / `NCCL_*` variables only, values redacted where they look secret."""
    out: dict[str, str] = {}
    for name in sorted(env):
        if not name.startswith(("TORCH_", "NCCL_")):
            continue
        value = env[name]
        secret = any(w in name.upper() for w in SECRET_NAME_WORDS) or looks_secret(value)
        out[name] = REDACTED if secret else value[:512]
    return out


def fr_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """Flight-recorder settings as torch reads them: ring size (and which variable set it), and
    whether NCCL dumps on a watchdog timeout."""
    size: int | None = FR_BUFFER_DEFAULT
    size_var: str | None = None
    for var in FR_BUFFER_VARS:
        raw = env.get(var)
        if raw is not None and raw.strip():
            size_var = var
            try:
                size = int(raw.strip())
            except ValueError:
                size = None  # torch would refuse or misread it; reported as unknown
            break
    dump_on_timeout = True
    for var in DUMP_ON_TIMEOUT_VARS:
        raw = env.get(var)
        if raw is not None and raw.strip():
            dump_on_timeout = raw.strip().lower() not in _FALSE
            break
    return {"fr_buffer_size": size, "fr_buffer_size_var": size_var, "dump_on_timeout": dump_on_timeout}


def static_versions(env: Mapping[str, str]) -> dict[str, Any]:
    """Versions that do not change while the process runs: torch (and its commit), CUDA, NCCL,
    Python. FLIGHTDECK_TEST_VERSION_OVERRIDE (tests only) replaces them and marks them simulated."""
    import torch

    out: dict[str, Any] = {
        "torch_version": str(torch.__version__),
        "torch_git_version": str(getattr(torch.version, "git_version", "") or "") or None,
        "cuda_version": str(getattr(torch.version, "cuda", "") or "") or None,
        "nccl_version": None,
        "python_version": platform.python_version(),
        "simulated": False,
    }
    try:
        # The NCCL a CUDA build was compiled with (no GPU needed); a CPU build raises.
        v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: S110 - no NCCL in this build: nothing to report
        pass
    raw = env.get(TEST_VERSION_OVERRIDE_VAR)
    if raw:
        override = json.loads(raw)
        if not isinstance(override, dict):
            raise ValueError(f"{TEST_VERSION_OVERRIDE_VAR} must be a JSON object")
        out.update({k: str(v) for k, v in override.items() if k in _VERSION_KEYS})
        out["simulated"] = True
    return out


def _group_configs() -> dict[str, dict[str, Any]]:
    """Backend and timeout of every group this rank belongs to, from torch's group registry."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    out: dict[str, dict[str, Any]] = {}
    for pg, name in list(world.pg_names.items()):
        backend = str(world.pg_backend_config.get(pg, "") or "") or None
        out[str(name)] = {
            "desc": str(getattr(pg, "group_desc", "") or ""),
            "backend": backend,
            "timeout_ms": _timeout_ms(pg, backend, torch),
        }
    return out


def _timeout_ms(pg: Any, backend: str | None, torch: Any) -> int | None:
    """The group's timeout from its backend's options (gloo and NCCL both expose `_timeout`)."""
    devices = [part.split(":")[0] for part in (backend or "").split(",") if ":" in part] or ["cpu", "cuda"]
    for dev in devices:
        try:
            t = pg._get_backend(torch.device(dev)).options._timeout
            return int(t.total_seconds() * 1000)
        except Exception:  # noqa: S112 - this device has no backend, or no options: try the next
            continue
    return None
