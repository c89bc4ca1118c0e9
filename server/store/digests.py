"""Progress digests shared by the processes of a cluster (`flightdeck.server.digest_share`): the
digest feed and the open rounds of digest jobs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from flightdeck.server.models import DigestFeedRow, DigestRound
from flightdeck.server.store.common import _insert


def add_digests(
    *, session: Session, rows: Sequence[tuple[str, int, bytes]], received_ns: int, writer: int
) -> None:
    """Keep (job, attempt, body) digest rows written by process `writer` in the feed, in one
    statement."""
    if rows:
        session.execute(
            _insert(session, DigestFeedRow),
            [
                {"job": j, "attempt": a, "body": b, "received_ns": received_ns, "writer": writer}
                for j, a, b in rows
            ],
        )


def digests_after(
    *,
    session: Session,
    after_id: int,
    since_ns: int,
    jobs: Sequence[str],
    not_writer: int = 0,
    all_of: Sequence[str] = (),
) -> list[tuple[int, str, int, bytes]]:
    """(id, job, attempt, body) of the feed rows of these jobs with an id above `after_id`
    received since `since_ns`, by id; but not those process `not_writer` wrote, except the rows
    of the jobs `all_of`."""
    if not jobs:
        return []
    q = (
        select(DigestFeedRow.id, DigestFeedRow.job, DigestFeedRow.attempt, DigestFeedRow.body)
        .where(DigestFeedRow.id > after_id, DigestFeedRow.received_ns >= since_ns)
        .where(DigestFeedRow.job.in_(sorted(set(jobs))))
        .order_by(DigestFeedRow.id)
    )
    if not_writer:
        mine = DigestFeedRow.writer == not_writer
        q = q.where(or_(~mine, DigestFeedRow.job.in_(sorted(set(all_of)))) if all_of else ~mine)
    return [(int(i), str(j), int(a), bytes(b)) for i, j, a, b in session.execute(q).tuples()]


def prune_digests(*, session: Session, before_ns: int) -> int:
    """Delete the feed rows received before `before_ns` and the rounds closed by then; returns
    how many feed rows went."""
    session.execute(delete(DigestRound).where(DigestRound.until_ns < before_ns))
    res = session.execute(delete(DigestFeedRow).where(DigestFeedRow.received_ns < before_ns))
    return int(getattr(res, "rowcount", 0) or 0)


def open_round(*, session: Session, job: str, attempt: int, until_ns: int, asks: str) -> None:
    """Open a digest job's round until `until_ns`, asking for `asks` (JSON), replacing the last."""
    stmt = _insert(session, DigestRound).values(job=job, attempt=attempt, until_ns=until_ns, asks=asks)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["job", "attempt"], set_={"until_ns": until_ns, "asks": asks}
        )
    )


def open_rounds(*, session: Session, now_ns: int) -> list[tuple[str, int, int, str]]:
    """(job, attempt, until_ns, asks JSON) of the rounds open at `now_ns`."""
    q = select(DigestRound.job, DigestRound.attempt, DigestRound.until_ns, DigestRound.asks).where(
        DigestRound.until_ns > now_ns
    )
    return [(str(j), int(a), int(u), str(sp)) for j, a, u, sp in session.execute(q).tuples()]
