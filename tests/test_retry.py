"""The retry rule of every HTTP sender (flightdeck/retry.py): jittered doubling up to a bound,
and the other side's Retry-After as a floor."""

from __future__ import annotations

import email.utils

import pytest

from flightdeck.retry import backoff_s, parse_retry_after, retry_delay_s


def test_backoff_doubles_up_to_its_bound_jittered_to_half_of_it() -> None:
    waits = [backoff_s(n, base_s=0.5, max_s=30.0, jitter=1.0) for n in range(1, 10)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff_s(3, base_s=0.5, max_s=30.0, jitter=0.0) == 1.0
    assert backoff_s(10_000, base_s=0.5, max_s=30.0, jitter=0.5) == 22.5  # no overflow


def test_retry_after_is_a_bounded_floor() -> None:
    common = {"base_s": 0.5, "max_s": 30.0, "jitter": 1.0, "retry_after_max_s": 300.0}
    assert retry_delay_s(1, retry_after_s=None, **common) == 0.5
    assert retry_delay_s(1, retry_after_s=7.0, **common) == 7.0
    assert retry_delay_s(4, retry_after_s=1.0, **common) == 4.0
    assert retry_delay_s(1, retry_after_s=86_400.0, **common) == 300.0


def test_retry_after_forms() -> None:
    assert parse_retry_after("3", now_s=0) == 3.0
    when = email.utils.formatdate(1000.0, usegmt=True)
    assert parse_retry_after(when, now_s=990.0) == pytest.approx(10.0)
    assert parse_retry_after("soon", now_s=0) is None
    assert parse_retry_after(None, now_s=0) is None
