"""A running server's JSON API over plain HTTP, for the tests that start real processes: GET with an
optional token, the job report, and a poll that fails the test when its condition never holds."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest


def get(url: str, token: str | None = None) -> tuple[int, str]:
    """GET `url`: (status, body); status 0 when nothing answers."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except OSError:
        return 0, ""


def wait_until(cond: Any, timeout_s: float, what: str, poll_s: float = 0.2) -> Any:
    """Poll `cond()` until it returns something truthy (returned) or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def job_report(base: str, job: str, token: str | None = None) -> dict[str, Any] | None:
    """The server's report of `job`, None while it does not know the job."""
    status, body = get(f"{base}/api/v1/jobs/{urllib.parse.quote(job)}", token)
    return json.loads(body) if status == 200 else None
