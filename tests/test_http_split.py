"""bench/http_split.py runs real uvicorn processes and reports what splitting the same requests
over one and two of them costs (a short run: the figures are checked for their shape, not their
size, which depends on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_http_split_reports_one_and_two_processes_on_the_same_requests() -> None:
    args = ["--hosts", "64", "--interval", "0.5", "--warmup", "1", "--seconds", "2", "--runs", "1"]
    out = subprocess.run(
        [sys.executable, "bench/http_split.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    one, two, summary = lines
    assert (one["processes"], len(one["cpu"]), two["processes"], len(two["cpu"])) == (1, 1, 2, 2)
    for run in (one, two):
        # 64 hosts every 0.5 s: 128 requests a second, all answered.
        assert run["errors"] == 0
        assert 100 <= run["requests_per_s"] <= 140
        assert all(c > 0 for c in run["cpu"]) and run["us_cpu_per_request"] > 0
    assert summary["median_cpu_one_process"] == one["cpu_total"]
    assert summary["median_cpu_two_processes"] == two["cpu_total"]
    assert summary["two_over_one"] == round(two["cpu_total"] / one["cpu_total"], 2)
