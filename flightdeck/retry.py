"""How long to wait before trying again: jittered exponential backoff and the `Retry-After` header.

One rule for every sender that retries over HTTP: the collector's pusher (batches to the server,
and its long wait while the server refuses the token) and the server's webhook sender. The wait
doubles per failure up to a bound and is jittered to 50-100 % of it, so that many senders failing
at once (a server or a receiver coming back) do not all return at once; a `Retry-After` from the
other side is a floor under it, itself bounded (a server saying "come back in a day" should not
stall a sender that long without another look).
"""

from __future__ import annotations

import email.utils

#: Doublings after which the wait stops growing (it reached any sane bound long before; the
#: bound keeps 2**n small after thousands of failures).
_MAX_DOUBLINGS = 16


def backoff_s(failures: int, *, base_s: float, max_s: float, jitter: float) -> float:
    """The wait after `failures` consecutive failures (1: the first): `base_s` doubled per
    failure up to `max_s`, times 0.5-1.0 as `jitter` (a random number in [0, 1)) says."""
    cap = min(max_s, base_s * 2.0 ** min(failures - 1, _MAX_DOUBLINGS))
    return cap * (0.5 + 0.5 * jitter)


def retry_delay_s(
    failures: int,
    *,
    base_s: float,
    max_s: float,
    jitter: float,
    retry_after_s: float | None,
    retry_after_max_s: float,
) -> float:
    """`backoff_s`, or the other side's `Retry-After` (at most `retry_after_max_s`) when longer."""
    delay = backoff_s(failures, base_s=base_s, max_s=max_s, jitter=jitter)
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, retry_after_max_s))
    return delay


def parse_retry_after(value: str | None, *, now_s: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date, `now_s` the wall
    clock), or None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - now_s)
