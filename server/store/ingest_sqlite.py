"""SQLite's ingest statements: multi-row INSERT ... VALUES upserts of a few fixed
sizes, within the build's host-parameter limit."""

from __future__ import annotations

from flightdeck.server.store.ingest_sql import _COLS, _ON_CONFLICT, _RANK_COLUMNS, ENTRY_COLUMNS

_SQLITE_ROW = f"({', '.join('?' * len(ENTRY_COLUMNS))})"
#: Rows per SQLite upsert statement, largest first; a batch is cut into these sizes. Many rows
#: per statement, because sqlite3 releases the GIL around each statement step: with one step per
#: row, an ingest thread writing gets the GIL back only every switch interval (5 ms) while
#: another thread decodes a batch, so writes and decoding could not overlap. Sizes whose
#: parameters exceed the SQLite build's limit (32,766 by default: 1,820 rows) are skipped; each
#: size's statement is prepared once per connection (sqlite3's statement cache).
_SQLITE_ROWS_PER_STATEMENT = (2048, 512, 64, 8, 1)


def _sqlite_upsert(rows: int) -> str:
    """The SQLite entries upsert of `rows` rows (built from the constants above only: no input
    reaches this string, the values are bound parameters)."""
    values = ", ".join([_SQLITE_ROW] * rows)
    return f"INSERT INTO entries ({_COLS}) VALUES {values} {_ON_CONFLICT}"  # noqa: S608


_SQLITE_UPSERTS = {n: _sqlite_upsert(n) for n in _SQLITE_ROWS_PER_STATEMENT}


#: Within SQLite's 32,766 host parameters.
_RANK_ROWS_PER_STATEMENT = 500


_SQLITE_RANK_ROW = "(" + ", ".join(["?"] * len(_RANK_COLUMNS)) + ")"
