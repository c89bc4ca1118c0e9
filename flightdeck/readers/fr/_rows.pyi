from collections.abc import Sequence
from typing import Any

def signature_rows(
    entries: list[Any], states: dict[object, Any], max_frames: int, /
) -> (
    tuple[
        bytes,
        bytes,
        bytes,
        bool,
        list[str],
        dict[str, str],
        list[int] | None,
        list[bool] | None,
        dict[tuple[Any, ...], int],
        list[int],
        Sequence[int],
    ]
    | None
): ...
def take_int64(keys: list[int], values: dict[int, int], /) -> bytes | None: ...
