"""NIXL agents: the latest sample per agent with the totals of its earlier counter runs, and
a thinned history of samples (for rates)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flightdeck.server.models import NixlAgent, NixlSampleRow

#: Cumulative scalar counters of a NIXL sample.
NIXL_COUNTERS = ("tx_bytes", "rx_bytes", "tx_requests", "rx_requests", "events_dropped")
NIXL_HISTOGRAMS = ("xfer_time", "post_time")


def _add_counters(base: dict[str, Any] | None, sample: dict[str, Any]) -> dict[str, Any]:
    """base + the counters of `sample` (a finished counter run), histograms bucket-wise."""
    out: dict[str, Any] = dict(base or {})
    for k in NIXL_COUNTERS:
        out[k] = int(out.get(k, 0)) + int(sample.get(k, 0))
    errors: dict[str, int] = dict(out.get("errors") or {})
    for kind, n in (sample.get("errors") or {}).items():
        errors[kind] = errors.get(kind, 0) + int(n)
    out["errors"] = errors
    for h in NIXL_HISTOGRAMS:
        new = sample.get(h) or {}
        old = out.get(h)
        if old and old.get("bounds_us") == new.get("bounds_us"):
            out[h] = {
                "bounds_us": new["bounds_us"],
                "counts": [a + b for a, b in zip(old["counts"], new["counts"], strict=True)],
                "sum_us": old["sum_us"] + new["sum_us"],
                "count": old["count"] + new["count"],
            }
        elif new:
            # Different bucket layout: the older runs cannot be merged bucket-wise; keep the newest.
            out[h] = new
    return out


#: The history keeps at most one sample per agent per this many ns (plus the last sample of every
#: counter run), so a collector pushing every 2 s costs ~8,640 rows per agent and day, not 43,200.
#: Rates over `nixl_rates.RATE_WINDOW_S` still see several samples.
NIXL_HISTORY_STEP_NS = 10 * 1_000_000_000


def _keep_nixl_history(
    *, session: Session, agent_id: int, run: str, read_time_ns: int, wire: dict[str, Any], force: bool
) -> None:
    """Add a sample to the agent's history unless one was kept less than a step before it."""
    last = session.execute(
        select(func.max(NixlSampleRow.read_time_ns)).where(NixlSampleRow.agent_id == agent_id)
    ).scalar_one()
    if last is not None and (
        read_time_ns <= last or (not force and read_time_ns - last < NIXL_HISTORY_STEP_NS)
    ):
        return
    session.add(NixlSampleRow(agent_id=agent_id, read_time_ns=read_time_ns, run=run, sample=wire))


def upsert_nixl(*, session: Session, samples: Sequence[Any]) -> None:
    """Store the latest sample per agent and keep a thinned history of them (`nixl_samples`);
    a new counter run carries the old run's totals over."""
    for smp in samples:
        wire = smp.to_wire()
        row = session.execute(
            select(NixlAgent)
            .where(NixlAgent.host == smp.host, NixlAgent.agent == smp.agent, NixlAgent.source == smp.source)
            .with_for_update()
        ).scalar_one_or_none()
        first = row is None
        if row is None:
            row = NixlAgent(host=smp.host, agent=smp.agent, source=smp.source, carried=None)
            session.add(row)
        new_run = not first and row.run != smp.run
        if new_run:
            row.carried = _add_counters(row.carried, row.sample)
            # The old run's last sample ends its counting: keep it, so a window across the reset
            # sees everything the old run counted.
            _keep_nixl_history(
                session=session,
                agent_id=row.id,
                run=row.run,
                read_time_ns=row.read_time_ns,
                wire=row.sample,
                force=True,
            )
        elif not first and smp.read_time_ns < row.read_time_ns:
            continue  # an older sample of the same run: counters only grow, keep the newer one
        row.run = smp.run
        row.pid = smp.pid
        row.local_rank = smp.local_rank
        row.read_time_ns = smp.read_time_ns
        row.sample = wire
        if first:
            session.flush()  # the id, for the history row
        _keep_nixl_history(
            session=session,
            agent_id=row.id,
            run=smp.run,
            read_time_ns=smp.read_time_ns,
            wire=wire,
            force=first or new_run,
        )
        session.flush()  # the next sample of this batch may be the same agent's: let it see this one


def nixl_agents(*, session: Session) -> list[NixlAgent]:
    """Every NIXL agent with its latest sample and carried totals."""
    return list(session.execute(select(NixlAgent).order_by(NixlAgent.host, NixlAgent.agent)).scalars())


def nixl_totals(agent: NixlAgent) -> dict[str, Any]:
    """The agent's counters over all its runs (latest sample plus the carried totals)."""
    return _add_counters(agent.carried, agent.sample)


def nixl_history(*, session: Session, window_ns: int) -> dict[int, list[dict[str, Any]]]:
    """Per agent id: its kept samples of the `window_ns` before its latest one, oldest first
    (the latest itself is `NixlAgent.sample`, and is left out here)."""
    q = (
        select(NixlSampleRow.agent_id, NixlSampleRow.sample)
        .join(NixlAgent, NixlAgent.id == NixlSampleRow.agent_id)
        .where(
            NixlSampleRow.read_time_ns >= NixlAgent.read_time_ns - window_ns,
            NixlSampleRow.read_time_ns < NixlAgent.read_time_ns,
        )
        .order_by(NixlSampleRow.agent_id, NixlSampleRow.read_time_ns)
    )
    out: dict[int, list[dict[str, Any]]] = {}
    for agent_id, sample in session.execute(q).tuples():
        out.setdefault(agent_id, []).append(dict(sample))
    return out
