from typing import Any

from flightdeck.readers.fr.signatures import _Rows

def signature_rows(entries: list[Any], states: dict[object, Any], max_frames: int, /) -> _Rows | None: ...
def take_int64(keys: list[int], values: dict[int, int], /) -> bytes | None: ...

#: 1 where `signature_rows` reads the entries' items from CPython's key tables (3.11, 3.12), else 0.
KEY_TABLE_READ: int
