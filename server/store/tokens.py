"""Collector tokens: created, revoked, listed, and looked up by hash at ingest."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from flightdeck.server.models import CollectorToken


def create_token(
    *,
    session: Session,
    name: str,
    token_hash: str,
    now_ns: int,
    host: str | None = None,
    job_patterns: Sequence[str] | None = None,
) -> CollectorToken:
    """Store a new collector token (its hash only), bound to `host` and `job_patterns` when
    given (None: any); raises IntegrityError when the name exists."""
    tok = CollectorToken(
        name=name,
        token_hash=token_hash,
        created_at_ns=now_ns,
        host=host,
        job_patterns=None if job_patterns is None else list(job_patterns),
    )
    session.add(tok)
    session.flush()
    return tok


def revoke_token(*, session: Session, name: str, now_ns: int) -> bool:
    """Revoke a token by collector name; False when there is no such active token."""
    res = session.execute(
        update(CollectorToken)
        .where(CollectorToken.name == name, CollectorToken.revoked_at_ns.is_(None))
        .values(revoked_at_ns=now_ns)
    )
    return bool(getattr(res, "rowcount", 0))


def list_tokens(*, session: Session) -> list[CollectorToken]:
    """Every collector token (active and revoked), by name."""
    return list(session.execute(select(CollectorToken).order_by(CollectorToken.name)).scalars())


def active_token(*, session: Session, token_hash: str) -> CollectorToken | None:
    """The unrevoked token with this hash, if any."""
    q = select(CollectorToken).where(
        CollectorToken.token_hash == token_hash, CollectorToken.revoked_at_ns.is_(None)
    )
    return session.execute(q).scalar_one_or_none()
