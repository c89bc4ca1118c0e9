"""What the web pages read, and from whom: the `WebData` protocol and the plain shapes it returns.

The pages never touch a database or a dump file. A `WebData` implementation hands them plain data
(dicts in the documented JSON shapes of the API, `Entry` records or their `entry_json` dicts); the
view builders in `flightdeck.web.views` turn that into what the templates show. The implementation is
the server's store-backed one (`flightdeck.server.page_data.StoreData`); the tests and benchmarks
have another over flight-recorder dumps analysed in process (`tests/support/dump_data.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from flightdeck.records import Entry

#: An entry as a record, or as the plain dict `flightdeck.analysis.findings.entry_json` makes.
EntryLike = Entry | Mapping[str, Any]
#: How much of each entry a timeline read returns (`WebData.timeline`).
Detail = Literal["entries", "cells", "spans"]


@dataclass(frozen=True, slots=True)
class RankTrack:
    """One rank's part of a timeline: where it runs, and its entries of one group in a seq window."""

    rank: int
    host: str | None = None
    pid: int | None = None
    #: Entries of the group whose collective_seq_id lies in the requested window (any order).
    entries: Sequence[EntryLike] = ()
    #: Lowest and highest collective_seq_id the rank holds for the group in its whole ring buffer
    #: (not only the window): they tell "never entered" (after last) from "not recorded" (before
    #: first, the ring overwrote it). None when the rank holds nothing of the group. A rank that
    #: holds every seq of the window may give its window's bounds instead: no cell needs more.
    first_seq: int | None = None
    last_seq: int | None = None


@dataclass(frozen=True, slots=True)
class TimelineData:
    """The entries of one process group for a set of ranks and a window of sequence ids."""

    group: str
    ranks: Sequence[RankTrack]


@dataclass(frozen=True, slots=True)
class ThreadStackData:
    """The Python stack of one thread at the rank's latest snapshot; frames innermost first."""

    thread_name: str
    frames: Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class RankDetail:
    """One rank of a job: where it runs, how it last reported, what it recently did."""

    rank: int
    host: str | None = None
    pid: int | None = None
    #: Epoch ns of the newest snapshot, and its kind ("periodic", "stall", "final", "dump").
    snapshot_time_ns: int | None = None
    snapshot_kind: str | None = None
    exception: str | None = None
    #: The most recent entries across all groups, oldest first.
    recent: Sequence[EntryLike] = ()
    thread_stacks: Sequence[ThreadStackData] = ()


class WebData(Protocol):
    """Everything the HTML pages read. Implementations must be safe to call from worker threads.

    Dict shapes:

    * `list_jobs()` items: `{"job", "attempt", "active", "status", "healthy", "ranks_expected",
      "ranks_reporting", "hosts", "first_seen_s", "last_seen_s", "ended_at_s", "open_findings",
      "root_cause", "cursor"}` where `root_cause` is None or a finding dict (`Finding.to_json()`
      shape) and `cursor` the `before` value of the page after this job; missing keys show as
      unknown.
    * `job_report(job)`: `Report.to_json()`.
    * `job_meta(job)`: `{"job", "attempt", "active", "world_size", "last_seen_s",
      "groups": [{"name", "desc", "ranks", "min_seq", "max_seq"}]}`.
    * `nixl_agents()` items: `NixlSample.to_wire()` dicts, each optionally with `"totals"` (the
      counters summed over every counter run, same keys) and `"history"`: earlier samples of the
      same agent (same shape, oldest first) within `flightdeck.nixl_rates.RATE_WINDOW_S` before
      it, from which rates and recent quantiles are computed; and `"age_s"`: seconds since the
      latest sample was read, when the implementation has a clock.
    """

    def list_jobs(
        self,
        *,
        status: str | None = None,
        search: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs, newest first: of one `status`, whose name contains `search` (case-insensitive),
        after the `cursor` `before`, at most `limit`."""
        ...

    def job_report(self, job: str) -> dict[str, Any] | None:
        """The current verdict of a job, or None when the job is unknown."""
        ...

    def job_meta(self, job: str) -> dict[str, Any] | None:
        """What is known about a job besides the verdict (groups and their seq ranges, liveness)."""
        ...

    def timeline(
        self,
        job: str,
        *,
        group: str,
        ranks: Sequence[int] | None,
        seqs: tuple[int, int] | None,
        detail: Detail = "entries",
    ) -> TimelineData:
        """Entries of `group` for `ranks` (None: all) with seq in `seqs` (inclusive; None: all).

        `detail`: what of each entry the caller needs. "entries": whole entries; "cells": at
        least `collective_seq_id`, `op`, `state` and `retired` (what a timeline cell shows);
        "spans": those and the four times (the wall-time view). An implementation may always
        give more.
        """
        ...

    def job_version(self, job: str) -> str | None:
        """A token that changes whenever what the job's page shows changes (new data, another
        verdict or status), read without reading the job's entries; elapsed times alone do not
        change it (the page shows them "as of" their diagnosis). None: unknown, do not cache."""
        ...

    def rank_detail(self, job: str, rank: int) -> RankDetail | None:
        """One rank's recent collectives and latest stack snapshot; None when unknown."""
        ...

    def nixl_agents(self) -> list[dict[str, Any]]:
        """The latest NIXL telemetry sample of every agent, with its totals and recent history."""
        ...
