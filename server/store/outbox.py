"""The webhook outbox: deliveries added in the diagnosis's transaction, claimed (leased)
by a sender, settled or released, and pruned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, delete, func, or_, select, update
from sqlalchemy.orm import Session

from flightdeck.server.models import WebhookDelivery
from flightdeck.server.store.common import _insert


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A webhook delivery a sender holds (leased) until it settles it."""

    row_id: int
    event_id: str
    url: str
    payload: dict[str, Any]
    #: Attempts so far, the one about to be made included.
    attempts: int
    deadline_ns: int


def add_webhook_deliveries(*, session: Session, deliveries: Sequence[dict[str, Any]]) -> None:
    """Put deliveries into the outbox; call in the transaction that stores what caused them.

    Each dict: event_id, url, payload, created_ns, due_ns, deadline_ns.
    """
    if deliveries:
        rows = [{**d, "attempts": 0, "state": "pending"} for d in deliveries]
        session.connection().execute(_insert(session, WebhookDelivery), rows)


def claim_webhook_deliveries(
    *, session: Session, urls: Sequence[str], now_ns: int, limit: int, lease_ns: int, claim: str
) -> list[ClaimedDelivery]:
    """Take up to `limit` due deliveries to `urls`, earliest due first, and lease them to `claim`.

    The k-th row's lease ends k * `lease_ns` from now: the sender posts them one after another.
    PostgreSQL: `FOR UPDATE SKIP LOCKED`, so a row another server process is claiming is skipped
    rather than waited for, and re-checked after its commit (its lease then makes it not due).
    SQLite: the write session's BEGIN IMMEDIATE already serializes claims.
    """
    if not urls or limit <= 0:
        return []
    w = WebhookDelivery
    q = (
        select(w.id, w.event_id, w.url, w.payload, w.attempts, w.deadline_ns)
        .where(w.state == "pending", w.due_ns <= now_ns, w.url.in_(list(urls)))
        .order_by(w.due_ns, w.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(skip_locked=True)
    rows = session.execute(q).tuples().all()
    if not rows:
        return []
    stmt = (
        update(w)
        .where(w.id == bindparam("rid"))
        .values(due_ns=bindparam("lease"), claim=claim, attempts=w.attempts + 1)
    )
    leases = [{"rid": r[0], "lease": now_ns + (k + 1) * lease_ns} for k, r in enumerate(rows)]
    session.connection().execute(stmt, leases)
    return [
        ClaimedDelivery(row_id=int(i), event_id=e, url=u, payload=p, attempts=int(a) + 1, deadline_ns=int(dl))
        for i, e, u, p, a, dl in rows
    ]


def settle_webhook_delivery(
    *,
    session: Session,
    row_id: int,
    claim: str,
    state: str,
    now_ns: int,
    due_ns: int | None = None,
    error: str | None = None,
) -> bool:
    """Record the outcome of an attempt on a delivery still leased to `claim`: `delivered` or
    `dropped` (done), or `pending` again at `due_ns` (a retry). False when the lease was lost."""
    values: dict[str, Any] = {"state": state, "claim": None, "last_error": error[:256] if error else None}
    if state == "pending":
        values["due_ns"] = due_ns if due_ns is not None else now_ns
    else:
        values["done_ns"] = now_ns
    w = WebhookDelivery
    res = session.execute(update(w).where(w.id == row_id, w.claim == claim).values(**values))
    return int(getattr(res, "rowcount", 0) or 0) == 1


def release_webhook_deliveries(*, session: Session, row_ids: Sequence[int], claim: str, now_ns: int) -> None:
    """Hand back leased deliveries that were not attempted (the sender stops): due now, and the
    attempt counted at the claim is taken back."""
    if not row_ids:
        return
    w = WebhookDelivery
    session.execute(
        update(w)
        .where(w.id.in_(list(row_ids)), w.claim == claim)
        .values(claim=None, due_ns=now_ns, attempts=w.attempts - 1)
    )


def webhook_outbox_status(*, session: Session, urls: Sequence[str]) -> tuple[int, int | None]:
    """(deliveries to `urls` waiting, the earliest due time among them or None)."""
    if not urls:
        return 0, None
    w = WebhookDelivery
    q = select(func.count(), func.min(w.due_ns)).where(w.state == "pending", w.url.in_(list(urls)))
    n, due = session.execute(q).tuples().one()
    return int(n), None if due is None else int(due)


def webhook_deliveries(*, session: Session, event_id: str | None = None) -> list[WebhookDelivery]:
    """The outbox's rows (of one event), oldest first."""
    q = select(WebhookDelivery).order_by(WebhookDelivery.id)
    if event_id is not None:
        q = q.where(WebhookDelivery.event_id == event_id)
    return list(session.execute(q).scalars())


def prune_webhook_outbox(*, session: Session, before_ns: int) -> int:
    """Delete deliveries done (delivered or dropped) before `before_ns`, and those whose deadline
    passed before it (left pending for a URL no longer configured); returns how many."""
    w = WebhookDelivery
    res = session.execute(
        delete(w).where(or_(and_(w.state != "pending", w.done_ns < before_ns), w.deadline_ns < before_ns))
    )
    return int(getattr(res, "rowcount", 0) or 0)
