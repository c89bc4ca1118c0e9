"""Columns as PostgreSQL arrays in binary form, packed by numpy: the entries upsert's parameters.

The upsert sends each entry column as one array (`INSERT ... SELECT FROM unnest(...)`). As text,
every value went through `str` and PostgreSQL parsed it back: at 4,096 ranks that formatting was
a sixth of the server's GIL time (py-spy). In binary (`array_send`'s layout: a header, then per
element a 4-byte length, -1 for NULL, and the big-endian value), numpy converts the Python list
in C and the server copies the bytes without parsing them.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

#: Element type name -> (numpy type, element oid, array oid), for the types the entries use.
#: Values are converted to the machine's byte order (a third faster than straight to big-endian)
#: and swapped while they are copied into the array.
TYPES: dict[str, tuple[str, int, int]] = {
    "smallint": ("i2", 21, 1005),
    "int": ("i4", 23, 1007),
    "bigint": ("i8", 20, 1016),
    "float8": ("f8", 701, 1022),
    "boolean": ("?", 16, 1000),
}


#: A NULL element: length -1, no value.
_NULL = struct.pack(">i", -1)


class BinaryArray(bytes):
    """An array parameter in PostgreSQL's binary format; `oid` is the array type's."""

    oid = 0


@functools.cache
def _array_class(oid: int) -> type[BinaryArray]:
    """A `BinaryArray` subclass per array type: psycopg picks a dumper, and so an oid, by class."""
    return type(f"BinaryArray{oid}", (BinaryArray,), {"oid": oid})


@functools.cache
def _dumpers() -> list[tuple[type[BinaryArray], type[Any]]]:
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    out: list[tuple[type[BinaryArray], type[Any]]] = []
    for _, _, array_oid in TYPES.values():

        class _Dumper(Dumper):
            format = Format.BINARY
            oid = array_oid

            def dump(self, obj: Any) -> bytes:
                return bytes(obj)

        out.append((_array_class(array_oid), _Dumper))
    return out


def register(adapters: Any) -> None:
    """Teach a psycopg connection's adapters to send `BinaryArray`s as they are (`db.connect`
    does it for every new PostgreSQL connection)."""
    for cls, dumper in _dumpers():
        adapters.register_dumper(cls, dumper)


@functools.cache
def _record(code: str) -> np.dtype[Any]:
    """An element as sent: its 4-byte length, then the big-endian value."""
    return np.dtype([("len", ">i4"), ("v", np.dtype(code).newbyteorder(">"))])


def binary_array(col: Sequence[Any], typ: str) -> BinaryArray:
    """`col` as a one-dimensional array of `typ` (a `TYPES` key), None as NULL.

    The values must already be of the column's kind (ints; floats for float8; bools for
    boolean), as the store's columns are (built from decoded, type-checked batches): numpy would
    convert others. A value out of the type's range raises OverflowError before anything is sent.
    """
    code, elem_oid, array_oid = TYPES[typ]
    n = len(col)
    null: np.ndarray[Any, np.dtype[np.bool_]] | None = None
    if typ == "float8":
        values = np.array(col, dtype=float)  # None becomes NaN, which JSON cannot carry otherwise
        isnan = np.isnan(values)
        if isnan.any():
            null = isnan
    elif None in col:  # numpy would take None for False, or fail
        if col.count(None) == n:  # a column left out of the batch: all NULL
            return _array_class(array_oid)(_header(True, elem_oid, n) + _NULL * n)
        # As objects, NULLs are found and zeroed in C: a Python expression per element cost three
        # times as much, the largest part of the upsert where the completion times of entries
        # still in flight are NULL.
        objs = np.array(col, dtype=object)
        null = np.equal(objs, cast(Any, None))
        objs[null] = 0
        values = objs.astype(code)
    else:
        values = np.fromiter(col, dtype=code, count=n)
    rec = np.empty(n, dtype=_record(code))
    rec["len"] = rec.itemsize - 4
    rec["v"] = values
    if null is None:
        body = rec.tobytes()
    else:
        rec["len"][null] = -1
        # A NULL element is its length alone: drop the value bytes of those rows.
        keep = np.ones((n, rec.itemsize), dtype=bool)
        keep[null, 4:] = False
        body = rec.view(np.uint8).reshape(n, rec.itemsize)[keep].tobytes()
    return _array_class(array_oid)(_header(null is not None, elem_oid, n) + body)


def _header(has_null: bool, elem_oid: int, n: int) -> bytes:
    """A one-dimensional array's header: dimensions, NULL flag, element type, length, lower bound."""
    return struct.pack(">iiiii", 1, has_null, elem_oid, n, 1)
