"""What a collector token may write: the ranks (and NIXL agents) of its host, of the jobs its
patterns match. An unscoped token (no host, no patterns: tokens made before scopes existed, or
with `flightdeck token create --any-host`) may write anything.

The host of a snapshot is the one it names (the rank's, from its agent), else the batch's
collector; a scoped token's batches must also come from a collector of that host. One snapshot
out of scope refuses the whole batch (403): a token used for another host is a configuration
error or an attack, not bad data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from flightdeck.wire import Batch


@dataclass(frozen=True, slots=True)
class TokenScope:
    """A token's host (None: any) and job name patterns (None: any)."""

    host: str | None = None
    jobs: tuple[str, ...] | None = None

    @classmethod
    def of(cls, host: str | None, patterns: Sequence[object] | None) -> TokenScope:
        """From the token row's columns."""
        return cls(host or None, None if patterns is None else tuple(str(p) for p in patterns))

    @property
    def unscoped(self) -> bool:
        """Whether the token may write any host's and any job's data."""
        return self.host is None and self.jobs is None

    def describe(self) -> str:
        """For `flightdeck token list`."""
        if self.unscoped:
            return "UNSCOPED (any host, any job)"
        host = f"host {self.host}" if self.host else "any host"
        jobs = "any job" if self.jobs is None else "jobs " + ",".join(self.jobs)
        return f"{host}, {jobs}"

    def refusal(self, batch: Batch, *, collector: str) -> str | None:
        """Why `batch` is outside this scope (one line naming what), or None when it is inside."""
        if self.unscoped:
            return None
        if self.host is not None:
            if batch.collector_host != self.host:
                return (
                    f"token {collector!r} is bound to host {self.host!r}; this batch comes from "
                    f"collector host {batch.collector_host!r}"
                )
            for i, s in enumerate(batch.snapshots):
                if (s.host or batch.collector_host) != self.host:
                    return (
                        f"token {collector!r} is bound to host {self.host!r}; snapshots[{i}] "
                        f"(job {s.job!r}, rank {s.rank}) is of host {s.host!r}"
                    )
            for i, d in enumerate(batch.nixl):
                host = d.get("host") if isinstance(d, dict) else None
                if host != self.host:
                    return (
                        f"token {collector!r} is bound to host {self.host!r}; nixl[{i}] is of host {host!r}"
                    )
        if self.jobs is not None:
            for i, s in enumerate(batch.snapshots):
                if not any(fnmatchcase(s.job, p) for p in self.jobs):
                    return (
                        f"token {collector!r} may write jobs {', '.join(self.jobs)}; snapshots[{i}] "
                        f"is of job {s.job!r}"
                    )
        return None
