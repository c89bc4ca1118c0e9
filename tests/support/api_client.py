"""A running server's JSON API over plain HTTP, for the tests that start real processes: GET with an
optional token, and the job report."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


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


def job_report(base: str, job: str, token: str | None = None) -> dict[str, Any] | None:
    """The server's report of `job`, None while it does not know the job."""
    status, body = get(f"{base}/api/v1/jobs/{urllib.parse.quote(job)}", token)
    return json.loads(body) if status == 200 else None
