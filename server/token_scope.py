"""What a collector token may write: the ranks (and NIXL agents) of its host, of the jobs its
patterns match. An unscoped token (no host, no patterns: tokens made before scopes existed, or
with `flightdeck token create --any-host`) may write anything.

The host of a snapshot is the one it names (the rank's, from its agent), else the batch's
collector; a scoped token's batches must also come from a collector of that host. A batch from a
collector of another host is refused whole (403: the token is used on the wrong machine, a
configuration error or an attack). A snapshot (or NIXL sample) out of scope in a batch of the
right collector is refused alone, like an invalid one (422, the rest applied): a dump copied from
another node into a spool must not hold back the healthy jobs the collector ships with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from itertools import count

from flightdeck.wire import Batch, GoneRank, Refusal, Snapshot


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

    def batch_refusal(self, batch: Batch, *, collector: str) -> str | None:
        """Why the whole `batch` is outside this scope (its collector is of another host), or None."""
        if self.host is not None and batch.collector_host != self.host:
            return (
                f"token {collector!r} is bound to host {self.host!r}; this batch comes from "
                f"collector host {batch.collector_host!r}"
            )
        return None

    def take_out_gone(self, batch: Batch) -> list[GoneRank]:
        """Remove (and return) the gone reports of jobs outside this scope's patterns. Whether a
        rank runs on the token's host is the store's to say (`store.ingest_batches(gone_hosts=)`)."""
        if self.jobs is None or not batch.gone:
            return []
        jobs = self.jobs
        out = [g for g in batch.gone if not any(fnmatchcase(g.job, p) for p in jobs)]
        batch.gone = [g for g in batch.gone if any(fnmatchcase(g.job, p) for p in jobs)]
        return out

    def take_out(self, batch: Batch, refused: list[Refusal], *, collector: str) -> None:
        """Move the snapshots and NIXL samples of `batch` outside this scope to `refused`, each with
        its reason and its index in the batch as sent (`refused` holds the ones validation left
        out already: the kept ones are the indexes it does not name, in order)."""
        if self.unscoped:
            return
        gone = {r.index for r in refused if not r.nixl}
        sent = (i for i in count() if i not in gone)
        kept: list[Snapshot] = []
        for i, s in zip(sent, batch.snapshots, strict=False):
            why = None
            if self.host is not None and (s.host or batch.collector_host) != self.host:
                why = (
                    f"token {collector!r} is bound to host {self.host!r}; the snapshot is of host {s.host!r}"
                )
            elif self.jobs is not None and not any(fnmatchcase(s.job, p) for p in self.jobs):
                why = f"token {collector!r} may write jobs {', '.join(self.jobs)}; the snapshot is of job {s.job!r}"
            if why is None:
                kept.append(s)
            else:
                refused.append(
                    Refusal(i, f"batch.snapshots[{i}]: {why}", job=s.job, attempt=s.attempt, rank=s.rank)
                )
        batch.snapshots = kept
        if self.host is None or not batch.nixl:
            return
        gone = {r.index for r in refused if r.nixl}
        sent = (i for i in count() if i not in gone)
        samples = []
        for i, d in zip(sent, batch.nixl, strict=False):
            host = d.get("host") if isinstance(d, dict) else None
            if host == self.host:
                samples.append(d)
            else:
                why = f"token {collector!r} is bound to host {self.host!r}; the sample is of host {host!r}"
                refused.append(
                    Refusal(
                        i, f"batch.nixl[{i}]: {why}", nixl=True, host=host if isinstance(host, str) else None
                    )
                )
        batch.nixl = samples
