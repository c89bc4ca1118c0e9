"""PostgreSQL's ingest statements: one INSERT ... SELECT FROM unnest(arrays) per table,
the arrays bound in binary (text as an array literal), and the batch-claim statement."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from flightdeck.server.store.ingest_sql import _COLS, _ON_CONFLICT, _RANK_COLUMNS, _RANK_UPSERT

_PG_CLAIM = (
    "INSERT INTO ingested_batches (batch_id, received_at_ns, collector_id) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::int[]) "
    "ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id"
)


def _pg_placeholders(types: Sequence[str]) -> str:
    """unnest's array parameters of these element types: text as a literal, others in binary."""
    return ", ".join(f"%s::{t}[]" if t == "text" else f"%b::{t}[]" for t in types)


def _pg_arrays(cols: Iterable[Sequence[Any]], types: Sequence[str]) -> list[Any]:
    """The values of `_pg_placeholders(types)`: columns as array parameters."""
    from flightdeck.server.pg_arrays import binary_array  # numpy: PostgreSQL servers only

    return [
        _pg_text_array(c) if t == "text" else binary_array(c, t) for c, t in zip(cols, types, strict=True)
    ]


#: PostgreSQL element type of each ENTRY_COLUMNS column (`pg_arrays.TYPES`, or text).
_PG_TYPES = (
    "int", "int", "bigint", "int", "bigint", "bigint", "bigint", "int", "smallint", "boolean",
    "bigint", "bigint", "bigint", "float8", "bigint", "text", "int", "int",
)  # fmt: skip
#: One statement whatever the size: each column one array parameter, binary except the text one.
_PG_UNNEST = (
    f"INSERT INTO entries ({_COLS}) SELECT * FROM unnest("  # noqa: S608
    + _pg_placeholders(_PG_TYPES)
    + f") {_ON_CONFLICT}"
)


def _pg_text(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pg_text_array(col: Sequence[str | None]) -> str:
    """A text column as a PostgreSQL array literal, each distinct string escaped once (a column
    repeats a few thread names)."""
    quoted = {v: "NULL" if v is None else _pg_text(v) for v in set(col)}
    return "{" + ",".join(map(quoted.__getitem__, col)) + "}"


#: PostgreSQL element type of each _RANK_COLUMNS column (thread_stacks: JSON text, cast below).
_PG_RANK_TYPES = (
    "int", "int", "int", "bigint", "int", "int", "bigint", "bigint", "text", "float8", "text", "boolean",
    "bigint", "text", "text", "text", "text", "text",
)  # fmt: skip
_PG_RANK_UPSERT = _RANK_UPSERT.format(
    # Constants only: the values are the bound array parameters.
    values=f"SELECT {', '.join(_RANK_COLUMNS[:-2])}, CAST(thread_stacks AS json), CAST(progress AS json) "  # noqa: S608
    "FROM unnest(" + _pg_placeholders(_PG_RANK_TYPES) + f") AS u({', '.join(_RANK_COLUMNS)})"
)
