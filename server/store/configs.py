"""Rank configuration reports: the newest one per rank (written at ingest), and the reads of
the configuration-skew diagnosis (a job's reports, other jobs sharing its checkpoint dirs)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from flightdeck.analysis.config_skew import PeerJob
from flightdeck.records import RankConfig, config_from_dict, config_to_dict
from flightdeck.server.models import Job, RankConfigRow
from flightdeck.server.store.common import _IN_CHUNK, _digest, _insert, _latest_per_rank
from flightdeck.wire import Snapshot


def _upsert_rank_configs(
    session: Session, snapshots: Sequence[Snapshot], job_ids: dict[tuple[str, int], int]
) -> None:
    """Store each rank's newest configuration report; an unchanged report writes nothing."""
    latest = _latest_per_rank((s for s in snapshots if s.config is not None), job_ids)
    if not latest:
        return
    rows = []
    for (job_id, rank), s in sorted(latest.items()):
        assert s.config is not None
        doc = config_to_dict(s.config)
        rows.append(
            {
                "job_id": job_id,
                "rank": rank,
                "config_hash": _digest(doc),
                "reported_ns": s.snapshot_time_ns,
                "torch_version": (s.config.torch_version or "")[:64] or None,
                "checkpoint_dir": (s.config.checkpoint_dir or "")[:512] or None,
                "config": doc,
            }
        )
    ins = _insert(session, RankConfigRow)
    ex = ins.excluded
    stmt = ins.on_conflict_do_update(
        index_elements=["job_id", "rank"],
        set_={
            "config_hash": ex.config_hash,
            "reported_ns": ex.reported_ns,
            "torch_version": ex.torch_version,
            "checkpoint_dir": ex.checkpoint_dir,
            "config": ex.config,
        },
        # Only a changed report, and never an older one (a retried batch overtaken by a newer one).
        where=(RankConfigRow.config_hash != ex.config_hash) & (RankConfigRow.reported_ns <= ex.reported_ns),
    )
    session.execute(stmt, rows)


def rank_configs(*, session: Session, job_id: int) -> dict[int, RankConfig]:
    """rank -> its latest configuration report, for the ranks of the job that sent one."""
    q = select(RankConfigRow.rank, RankConfigRow.config).where(RankConfigRow.job_id == job_id)
    return {int(r): config_from_dict(c) for r, c in session.execute(q).tuples()}


def checkpoint_peers(*, session: Session, job_name: str, dirs: Sequence[str]) -> list[PeerJob]:
    """Other jobs (by name: attempts of this job are not peers) whose ranks report one of the
    checkpoint directories `dirs`, with the torch versions they run there."""
    if not dirs:
        return []
    q = (
        select(Job.name, RankConfigRow.checkpoint_dir, RankConfigRow.torch_version)
        .join(Job, Job.id == RankConfigRow.job_id)
        .where(RankConfigRow.checkpoint_dir.in_(list(dirs)[:_IN_CHUNK]), Job.name != job_name)
        .distinct()
    )
    found: dict[tuple[str, str], set[str]] = {}
    for name, d, version in session.execute(q).tuples():
        versions = found.setdefault((name, str(d)), set())
        if version:
            versions.add(version)
    return [PeerJob(name, tuple(sorted(v)), d) for (name, d), v in sorted(found.items())]
