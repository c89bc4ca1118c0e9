"""Recorded collectives and stack frames as the pages show them (library frames marked, to fold away)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flightdeck.analysis.frames import is_library_path
from flightdeck.records import Entry
from flightdeck.web.data import EntryLike
from flightdeck.web.views.fmt import fmt_sizes, fmt_time_ns


@dataclass(frozen=True, slots=True)
class FrameView:
    """One stack frame; `library` marks PyTorch/stdlib plumbing, folded away by default."""

    name: str
    filename: str
    line: int
    library: bool


@dataclass(frozen=True, slots=True)
class EntryView:
    """One recorded collective, ready to show."""

    seq: int
    group: str
    op: str
    profiling_name: str
    state: str
    finished: bool
    input_sizes: str
    output_sizes: str
    input_dtypes: str
    output_dtypes: str
    created: str
    started: str
    completed: str
    duration: str
    frames: list[FrameView]

    @property
    def user_frames(self) -> list[FrameView]:
        """The frames that are not library plumbing (all frames when every one is)."""
        return [f for f in self.frames if not f.library] or self.frames


def frame_views(frames: Iterable[Any]) -> list[FrameView]:
    """Frames (records or `{name, filename, line}` dicts) as views, innermost first."""
    out = []
    for f in frames:
        if isinstance(f, Mapping):
            name, filename, line = str(f.get("name", "")), str(f.get("filename", "")), f.get("line", 0)
        else:
            name, filename, line = str(f.name), str(f.filename), f.line
        out.append(FrameView(name, filename, int(line or 0), is_library_path(filename)))
    return out


def seq_of(e: EntryLike) -> int:
    """The collective_seq_id of an entry or entry dict."""
    return e.collective_seq_id if isinstance(e, Entry) else int(e["collective_seq_id"])


def _finished(e: EntryLike) -> bool:
    if isinstance(e, Entry):
        return e.finished
    return e.get("state") == "completed" or bool(e.get("retired"))


def _op_of(e: EntryLike) -> str:
    return e.op if isinstance(e, Entry) else str(e.get("op", ""))


def entry_view(e: EntryLike) -> EntryView:
    """An entry (record or `entry_json` dict) as a view."""
    if isinstance(e, Entry):
        dur = e.duration_ms
        if dur is None and e.time_started_ns and e.time_completed_ns:
            dur = (e.time_completed_ns - e.time_started_ns) / 1e6
        return EntryView(
            seq=e.collective_seq_id,
            group=e.group,
            op=e.op,
            profiling_name=e.raw_op,
            state="retired" if e.retired and e.state != "completed" else e.state,
            finished=e.finished,
            input_sizes=fmt_sizes(e.input_sizes),
            output_sizes=fmt_sizes(e.output_sizes),
            input_dtypes=", ".join(e.input_dtypes) or "–",
            output_dtypes=", ".join(e.output_dtypes) or "–",
            created=fmt_time_ns(e.time_created_ns),
            started=fmt_time_ns(e.time_started_ns),
            completed=fmt_time_ns(e.time_completed_ns),
            duration="" if dur is None else f"{dur:.3f} ms",
            frames=frame_views(e.frames),
        )
    state = str(e.get("state", ""))
    retired = bool(e.get("retired"))
    return EntryView(
        seq=int(e["collective_seq_id"]),
        group=str(e.get("process_group", "")),
        op=str(e.get("op", "")),
        profiling_name=str(e.get("profiling_name", "")),
        state="retired" if retired and state != "completed" else state,
        finished=_finished(e),
        input_sizes=fmt_sizes(e.get("input_sizes") or []),
        output_sizes=fmt_sizes(e.get("output_sizes") or []),
        input_dtypes=", ".join(e.get("input_dtypes") or []) or "–",
        output_dtypes=", ".join(e.get("output_dtypes") or []) or "–",
        created=fmt_time_ns(e.get("time_created_ns")),
        started=fmt_time_ns(e.get("time_started_ns")),
        completed=fmt_time_ns(e.get("time_completed_ns")),
        duration="" if e.get("duration_ms") is None else f"{float(e['duration_ms']):.3f} ms",
        frames=frame_views(e.get("frames") or []),
    )
