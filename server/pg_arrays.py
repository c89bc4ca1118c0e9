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
from typing import Any

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
    else:
        try:
            # numpy would take None for False: booleans are checked for it first.
            if typ == "boolean" and None in col:
                raise TypeError
            values = np.fromiter(col, dtype=code, count=n)
        except TypeError:
            if col.count(None) == n:  # a column left out of the batch: all NULL
                return _array_class(array_oid)(_header(True, elem_oid, n) + _NULL * n)
            null = np.array([v is None for v in col])
            values = np.array([0 if v is None else v for v in col], dtype=code)
    size = np.dtype(code).itemsize
    rec = np.empty(n, dtype=[("len", ">i4"), ("v", np.dtype(code).newbyteorder(">"))])
    rec["len"] = size
    rec["v"] = values
    if null is None:
        body = rec.tobytes()
    else:
        rec["len"][null] = -1
        # A NULL element is its length alone: drop the value bytes of those rows.
        keep = np.ones((n, 4 + size), dtype=bool)
        keep[null, 4:] = False
        body = rec.view(np.uint8).reshape(n, 4 + size)[keep].tobytes()
    return _array_class(array_oid)(_header(null is not None, elem_oid, n) + body)


def _header(has_null: bool, elem_oid: int, n: int) -> bytes:
    """A one-dimensional array's header: dimensions, NULL flag, element type, length, lower bound."""
    return struct.pack(">iiiii", 1, has_null, elem_oid, n, 1)
