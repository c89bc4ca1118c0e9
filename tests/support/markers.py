"""Skip marks shared by test files: what a test needs from the machine, said once."""

from __future__ import annotations

import pytest

from tests.support.ops_stack import ALERTMANAGER_BINARIES, PROMETHEUS_BINARIES, find_binary

#: Prometheus and Alertmanager on PATH (the alert-path tests run both for real).
needs_ops_binaries = pytest.mark.skipif(
    find_binary(PROMETHEUS_BINARIES) is None or find_binary(ALERTMANAGER_BINARIES) is None,
    reason="needs `prometheus` and `prometheus-alertmanager` (Debian packages of the same names)",
)
