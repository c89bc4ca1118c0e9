"""The PostgreSQL server the tests and benchmarks may use."""

from __future__ import annotations

import os

#: PostgreSQL server the tests may use (trust auth); FLIGHTDECK_TEST_PG="" turns those tests off.
PG_ADMIN_URL = os.environ.get("FLIGHTDECK_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
