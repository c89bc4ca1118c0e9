"""Polling for the tests that drive real processes: wait for a condition, fail naming what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.2) -> Any:
    """Poll `cond()` until it returns something truthy (returned, as Any: the caller knows it is not
    None); AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
