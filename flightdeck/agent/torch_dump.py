"""Torch access: the flight-recorder dump, the process groups, the job id agreed through the store.

Every call here is feature-detected; nothing branches on version numbers.
"""

from __future__ import annotations

import logging
import pickle
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

logger = logging.getLogger("flightdeck.agent")

#: A flight-recorder dump function: `fn(include_stack_traces) -> pickle bytes`.
DumpFn = Callable[[bool], bytes]

#: The c10d store key through which rank 0 hands its job id to the others when no launcher set one.
STORE_JOB_KEY = "flightdeck/job_id"


def default_dump_fn() -> DumpFn:
    """The flight-recorder dump of this torch build, dumping every backend ring in use.

    `_dump_fr_trace` (torch >= 2.5, all backends) is preferred over the older NCCL-only
    `_dump_nccl_trace`. When the function accepts `backend=` (torch 2.15: NCCL2 records into its own
    ring), the rings of the extra backends in use are dumped too and merged into one dump.
    """
    import torch

    c10d = torch._C._distributed_c10d
    fn = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if fn is None:
        raise RuntimeError("this torch build has no flight-recorder dump function")
    return _BackendMergingDump(fn)


class _BackendMergingDump:
    """Calls the dump function once for the default ring and once per extra backend ring."""

    def __init__(self, fn: Callable[..., bytes]) -> None:
        self._fn = fn
        #: None until known; False once a call with `backend=` raised TypeError.
        self._backend_kwarg: bool | None = None
        self._failed_backends: set[str] = set()

    def __call__(self, include_stack_traces: bool) -> bytes:
        kwargs = {"includeCollectives": True, "includeStackTraces": include_stack_traces, "onlyActive": False}
        base = self._fn(**kwargs)
        extras = [b for b in _extra_backends() if b not in self._failed_backends]
        if self._backend_kwarg is False or not extras:
            return base
        merged: dict[str, Any] | None = None
        for backend in extras:
            try:
                raw = self._fn(**kwargs, backend=backend)
            except TypeError:
                # pybind11 raises TypeError for an unknown keyword: this build has one ring only.
                self._backend_kwarg = False
                return base
            except Exception:
                self._failed_backends.add(backend)
                logger.warning(
                    "flight-recorder dump of backend %r failed; skipping it", backend, exc_info=True
                )
                continue
            self._backend_kwarg = True
            if merged is None:
                merged = pickle.loads(base)  # noqa: S301 - bytes produced by this very process
            _merge_dump(merged, pickle.loads(raw))  # noqa: S301 - bytes produced by this very process
        return base if merged is None else pickle.dumps(merged, protocol=pickle.HIGHEST_PROTOCOL)


def _extra_backends() -> list[str]:
    """Backends in use whose flight recorder may live in a ring of its own (torch 2.15 `nccl2`)."""
    names: set[str] = set()
    try:
        from torch.distributed import distributed_c10d as c10d

        for value in list(c10d._world.pg_map.values()):
            # Values are (backend string, store); the string may read "cpu:gloo,cuda:nccl".
            for part in str(value[0]).split(","):
                names.add(part.split(":")[-1].strip().lower())
    except Exception:
        return []
    extras = {n for n in names if n and n not in ("gloo", "undefined", "nccl-legacy")}
    if extras & {"nccl", "nccl2"}:
        extras.discard("nccl")
        extras.add("nccl2")
    return sorted(extras)


def _merge_dump(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Append `other`'s entries and groups to `into`, skipping entries already present."""

    def key(e: Mapping[str, Any]) -> tuple[Any, ...]:
        pg = e.get("process_group") or ("",)
        fields = ("collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "time_created_ns")
        return (pg[0], *(e.get(f) for f in fields))

    entries = into.setdefault("entries", [])
    seen = {key(e) for e in entries}
    entries.extend(e for e in other.get("entries", []) if key(e) not in seen)
    entries.sort(key=lambda e: int(e.get("time_created_ns") or 0))
    for section in ("pg_config", "pg_status"):
        if isinstance(other.get(section), dict):
            into.setdefault(section, {}).update(
                {k: v for k, v in other[section].items() if k not in into.get(section, {})}
            )


def _dist_groups() -> dict[str, dict[str, Any]]:
    """The real name, description and member ranks of every group this rank belongs to.

    Gloo registers a group with the flight recorder before Python names it, so its dump's
    `pg_config` is empty; `_world` knows the names (`process_group[0]` in entries) and the ranks.
    """
    from torch.distributed import distributed_c10d as c10d

    groups: dict[str, dict[str, Any]] = {}
    world = c10d._world
    for pg, name in list(world.pg_names.items()):
        members = world.pg_group_ranks.get(pg) or {}
        groups[str(name)] = {
            "desc": str(getattr(pg, "group_desc", "") or ""),
            "ranks": sorted(int(r) for r in members),
        }
    return groups


def _agree_job_id(rank: int, timeout_s: float) -> str:
    """A job id shared by all ranks, agreed through the default c10d store (never a collective:
    that would add a flight-recorder entry and shift every `collective_seq_id`)."""
    from torch.distributed import distributed_c10d as c10d

    store = c10d._get_default_store()
    if rank == 0:
        value = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        store.set(STORE_JOB_KEY, value)
        return value
    store.wait([STORE_JOB_KEY], timedelta(seconds=timeout_s))
    got: bytes = store.get(STORE_JOB_KEY)
    return got.decode()
