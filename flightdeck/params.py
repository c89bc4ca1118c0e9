"""The path and query parameters the JSON API and the pages share, as annotated types.

FastAPI answers a value outside them with 422 (naming the parameter) before the route runs, so
nothing the store cannot compare (a NUL, which PostgreSQL text cannot hold; an int beyond 64 bits)
reaches a query. The limits are the store's (`flightdeck.limits`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from flightdeck.limits import CONTROL_CHARS, INT32_MAX, INT64_MAX, MAX_GROUP, MAX_JOB, MAX_WORLD_SIZE

#: A name as stored: no control character (so no NUL), not empty.
NAME_PATTERN = f"^[^{CONTROL_CHARS}]+$"

JobParam = Annotated[str, Path(min_length=1, max_length=MAX_JOB, pattern=NAME_PATTERN)]
GroupQuery = Annotated[str | None, Query(min_length=1, max_length=MAX_GROUP, pattern=NAME_PATTERN)]
GroupRequired = Annotated[str, Query(min_length=1, max_length=MAX_GROUP, pattern=NAME_PATTERN)]
AttemptQuery = Annotated[int | None, Query(ge=0, le=INT32_MAX)]
RankQuery = Annotated[int | None, Query(ge=0, le=MAX_WORLD_SIZE - 1)]
RankRequired = Annotated[int, Query(ge=0, le=MAX_WORLD_SIZE - 1)]
RankPath = Annotated[int, Path(ge=0, le=MAX_WORLD_SIZE - 1)]
SeqQuery = Annotated[int | None, Query(ge=0, le=INT64_MAX)]
SeqRequired = Annotated[int, Query(ge=0, le=INT64_MAX)]
