"""Binary array parameters (`server/pg_arrays.py`) read back by a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from flightdeck.server.pg_arrays import binary_array, register

INT64 = 2**63


@pytest.fixture
def conn(pg_database: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_database.replace("postgresql+psycopg://", "postgresql://")) as c:
        register(c.adapters)
        yield c


def read_back(conn: psycopg.Connection[Any], col: list[Any], typ: str) -> list[Any]:
    row = conn.execute(f"SELECT %b::{typ}[]", [binary_array(col, typ)]).fetchone()
    assert row is not None
    return list(row[0])


@pytest.mark.parametrize(
    ("typ", "col"),
    [
        ("int", [0, 1, -1, 2**31 - 1, -(2**31)]),
        ("int", [None, 5, None, None, 7]),  # some NULL
        ("int", [None, None, None]),  # a column left out of its batch
        ("bigint", [INT64 - 1, -INT64, 1_700_000_000_123_456_789]),
        ("bigint", [1_700_000_000_123_456_789, None]),
        ("bigint", [None, INT64 - 1, -INT64, None, 0]),
        ("smallint", [0, 2, 32767, -32768]),
        ("float8", [0.5, 1e300, -2.25, 0.0]),
        ("float8", [None, 3.5, None]),
        ("boolean", [True, False, True]),
        ("boolean", [True, None, False]),
    ],
)
def test_columns_read_back_as_sent(conn: psycopg.Connection[Any], typ: str, col: list[Any]) -> None:
    assert read_back(conn, col, typ) == col


def test_unnest_of_binary_and_text_arrays_makes_rows(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT * FROM unnest(%b::int[], %b::float8[], %s::text[])",
        [binary_array([1, 2, 3], "int"), binary_array([None, 0.5, None], "float8"), "{a,NULL,c}"],
    ).fetchall()
    assert rows == [(1, None, "a"), (2, 0.5, None), (3, None, "c")]


@pytest.mark.parametrize(("typ", "value"), [("int", 2**31), ("smallint", -(2**15) - 1), ("bigint", INT64)])
def test_out_of_range_values_raise_before_sending(typ: str, value: int) -> None:
    with pytest.raises(OverflowError):
        binary_array([1, value], typ)
    with pytest.raises(OverflowError):  # beside a NULL too
        binary_array([None, value], typ)
