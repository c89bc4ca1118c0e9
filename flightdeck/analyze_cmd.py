"""`flightdeck analyze PATH...`: diagnose a job offline from its flight-recorder dumps.

Exit codes: 0 healthy, 1 a fault was found, 2 the input was unusable.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from flightdeck.analysis import Options, RankSummary, Report, diagnose, summarize
from flightdeck.analysis.evidence import CLOCK_WORDS, ClockSource
from flightdeck.analysis.findings import CONFIG_KINDS, Finding
from flightdeck.analysis.frames import is_library_path
from flightdeck.analyze_readers import default_processes, read_all
from flightdeck.readers.fr.decode import gc_paused
from flightdeck.readers.fr.errors import DumpError
from flightdeck.readers.fr.files import discover, load_dump_file, read_dump_file, read_meta
from flightdeck.readers.fr.merge import merge
from flightdeck.readers.fr.normalize import SharedStacks
from flightdeck.records import GroupInfo, Stack
from flightdeck.spool import rank_from_name


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the arguments of `flightdeck analyze`."""
    parser.add_argument(
        "paths", nargs="+", type=Path, help="dump files or directories (searched recursively)"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    parser.add_argument(
        "--now",
        type=float,
        default=None,
        help="the moment to judge elapsed times at (epoch seconds); default: the newest snapshot time "
        "from the agent's sidecars, else the newest time recorded inside the dumps (file times, which "
        "a copy resets, are never used to time a hang)",
    )
    parser.add_argument(
        "--stall-after",
        type=float,
        default=Options().stall_after_s,
        help="seconds a collective must be unfinished to count as a hang (default %(default)s)",
    )
    parser.add_argument("--world-size", type=int, default=None, help="expected number of ranks, if known")
    parser.add_argument("--job", default=None, help="which job to analyze when the paths hold several")
    parser.add_argument("--workers", type=int, default=None, help="parallel reader processes (default: CPUs)")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal and input is large)",
    )


@dataclass(frozen=True, slots=True)
class _RankFiles:
    job: str | None
    attempt: int
    rank: int
    paths: tuple[str, ...]
    #: Each file's sidecar as `load_summaries` read it (the workers do not read it again).
    metas: tuple[dict[str, Any] | None, ...]


#: The stacks this process's ranks share (`SharedStacks`): one object per distinct stack in the
#: summaries a reader process sends, so each chunk's pickle holds each stack once.
_STACKS = SharedStacks()


def _load_rank(item: _RankFiles) -> tuple[RankSummary | None, list[tuple[str, str]]]:
    """Read, merge and summarize one rank's files (runs in a worker process)."""
    with gc_paused(), _STACKS:
        return _read_rank(item)


def _read_rank(item: _RankFiles) -> tuple[RankSummary | None, list[tuple[str, str]]]:
    errors: list[tuple[str, str]] = []
    if len(item.paths) == 1:
        try:
            return _summary_of_file(Path(item.paths[0]), item.metas[0]), errors
        except DumpError as exc:
            return None, [(item.paths[0], f"{type(exc).__name__}: {exc}")]
    dumps = []
    for p in item.paths:
        try:
            dumps.append(read_dump_file(Path(p)))
        except DumpError as exc:
            errors.append((p, f"{type(exc).__name__}: {exc}"))
    if not dumps:
        return None, errors
    return summarize(merge(dumps)), errors


def _summary_of_file(path: Path, meta: dict[str, Any] | None) -> RankSummary:
    """The summary of a rank that has one file: folded from the entries' columns where the
    reader gives them (`parse_columns`: whole entries built only for what the summary keeps in
    full), else from the normalized entries. The same summary either way."""
    loaded = load_dump_file(path, meta=meta)
    lean = loaded.parse_signatures()
    if lean is not None:
        return summarize(lean[0], signatures=lean[1])
    got = loaded.parse_columns()
    if got is None:
        return summarize(loaded.parse())
    return summarize(*got)


def load_summaries(
    paths: Sequence[Path],
    *,
    workers: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    found: Sequence[Path] | None = None,
) -> tuple[dict[tuple[str | None, int], list[RankSummary]], list[tuple[str, str]]]:
    """Read every dump under `paths`: summaries per (job, attempt), and (path, reason) per bad file.

    `found`: the files `discover(paths)` gives, where the caller has them already."""
    groups: dict[tuple[str | None, int, int], list[tuple[str, dict[str, Any] | None]]] = defaultdict(list)
    errors: list[tuple[str, str]] = []
    for p in discover(paths) if found is None else found:
        meta = read_meta(p)
        rank = meta.get("rank") if meta else None
        if not isinstance(rank, int):
            rank = rank_from_name(p.name)
        if rank is None:
            errors.append((str(p), "NotADumpError: no rank in the file name and no metadata sidecar"))
            continue
        job = str(meta["job"]) if meta and meta.get("job") is not None else None
        attempt = int(meta.get("attempt") or 0) if meta else 0
        groups[(job, attempt, rank)].append((str(p), meta))
    items = [
        _RankFiles(j, a, r, tuple(p for p, _m in files), tuple(m for _p, m in files))
        for (j, a, r), files in sorted(groups.items(), key=_key)
    ]
    out: dict[tuple[str | None, int], list[RankSummary]] = defaultdict(list)
    n_workers = workers if workers is not None else default_processes()
    results: list[tuple[RankSummary | None, list[tuple[str, str]]] | None] = [None] * len(items)
    # Every rank's summary names the same groups, each with its member list (4,096 ints for the
    # world group of a 4,096-rank job): one copy is kept, not one per rank (~0.6 GB at 4,096),
    # as each summary arrives.
    shared: dict[GroupInfo, GroupInfo] = {}
    got = 0

    def keep(i: int, res: tuple[RankSummary | None, list[tuple[str, str]]]) -> None:
        nonlocal got
        summary = res[0]
        if summary is not None:
            summary.groups = {k: shared.setdefault(g, g) for k, g in summary.groups.items()}
        results[i] = res
        got += 1
        if on_progress:
            on_progress(got, len(items))

    # This process reads a share itself (`read_all`): as many processes as workers asked for.
    read_all(items, _load_rank, processes=n_workers if len(items) >= 16 else 1, on_result=keep)
    for item, res in zip(items, results, strict=True):
        assert res is not None
        summary, errs = res
        errors.extend(errs)
        if summary is not None:
            out[(item.job, item.attempt)].append(summary)
    return out, errors


def _key(kv: tuple[tuple[str | None, int, int], list[Any]]) -> tuple[str, int, int]:
    (job, attempt, rank), _ = kv
    return (job or "", attempt, rank)


def _progress_bar(stream: TextIO) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // total
        stream.write(f"\rreading dumps [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done == total:
            stream.write("\n")
        stream.flush()

    return show


def run(args: argparse.Namespace) -> int:
    """Run `flightdeck analyze`; returns the exit code."""
    started = time.monotonic()
    try:
        candidates = list(discover(args.paths))
    except FileNotFoundError as exc:
        print(f"flightdeck: no such file or directory: {exc}", file=sys.stderr)
        return 2
    show = args.progress if args.progress is not None else (sys.stderr.isatty() and len(candidates) >= 64)
    as_program = getattr(args, "as_program", False)
    # Run as the program, which holds every summary until it ends: the cyclic collector is paused
    # while they are read and then leaves them out of its walks (`gc.freeze`). It found ~200
    # objects to free at 1,024 ranks, and walked the growing summaries for ~45 ms of CPU.
    with gc_paused() if as_program else contextlib.nullcontext():
        by_job, errors = load_summaries(
            args.paths,
            workers=args.workers,
            on_progress=_progress_bar(sys.stderr) if show else None,
            found=candidates,
        )
        if as_program:
            gc.freeze()
    for path, reason in errors:
        print(f"flightdeck: {path}: {reason}", file=sys.stderr)
    if not by_job:
        print("flightdeck: no usable flight-recorder dump found", file=sys.stderr)
        return 2
    jobs = sorted({j for j, _ in by_job}, key=lambda j: j or "")
    if args.job is not None:
        jobs = [j for j in jobs if j == args.job]
        if not jobs:
            print(f"flightdeck: no dumps of job {args.job!r}", file=sys.stderr)
            return 2
    if len(jobs) > 1:
        names = ", ".join(repr(j) for j in jobs)
        print(
            f"flightdeck: the paths hold dumps of several jobs ({names}); pick one with --job",
            file=sys.stderr,
        )
        return 2
    job = jobs[0]
    attempt = max(a for j, a in by_job if j == job)
    summaries = by_job[(job, attempt)]
    older = sorted(a for j, a in by_job if j == job and a != attempt)
    now_ns = int(args.now * 1e9) if args.now is not None else _newest(summaries)
    clock: ClockSource | None = "given" if args.now is not None else None
    try:
        options = Options(stall_after_s=args.stall_after)
    except ValueError as exc:
        print(f"flightdeck: {exc}", file=sys.stderr)
        return 2
    report = diagnose(
        summaries, now_ns=now_ns, options=options, world_size=args.world_size, job=job, clock=clock
    )
    if older:
        report.warnings.append(f"dumps of earlier attempts {older} ignored; analyzed attempt {attempt}")
    if args.format == "json":
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report, attempt=attempt, seconds=time.monotonic() - started))
    code = 0 if report.healthy else 1
    if as_program:
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """End the process with `code` once the output is flushed, without freeing the summaries
    and the interpreter (~30 ms at 1,024 ranks, serial, after the verdict is written): nothing
    is left to do but exit (no atexit handlers, no files open for writing)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _newest(summaries: Sequence[RankSummary]) -> int:
    times = [s.snapshot_time_ns for s in summaries if s.snapshot_time_ns]
    return max(times) if times else time.time_ns()


def user_frames(frames: Stack, limit: int = 6) -> list[str]:
    """The user's own frames of a stack (library plumbing hidden), innermost first, as text."""
    own = [f for f in frames if not is_library_path(f.filename)] or list(frames)
    return [f"{f.filename}:{f.line} in {f.name}" for f in own[:limit]]


_TITLES = {
    "hang": "HANG",
    "slow_rank": "SLOW RANK",
    "collective_type_mismatch": "COLLECTIVE TYPE MISMATCH",
    "size_mismatch": "SIZE MISMATCH",
    "dtype_mismatch": "DTYPE MISMATCH",
    "state_mismatch": "STATE MISMATCH",
    "p2p_mismatch": "P2P MISMATCH",
    "rank_lost": "RANK LOST",
    "missing_dump": "MISSING DUMPS",
    "straggler": "STRAGGLER",
    "undecided": "UNDECIDED",
    "version_skew": "VERSION SKEW",
    "config_skew": "CONFIG SKEW",
}


def render_text(report: Report, *, attempt: int = 0, seconds: float | None = None) -> str:
    """The verdict a person reads in five seconds: the root cause first, then what follows from it."""
    lines: list[str] = []
    job = f"job {report.job}" if report.job else "job"
    lines.append(
        f"{job} (attempt {attempt}): {report.expected_ranks} ranks expected, {len(report.with_dump)} with dumps"
        + (
            f", none from {_short(report.without_dump, total=report.without_dump_count)}"
            if report.without_dump
            else ""
        )
        + f"; clock: {CLOCK_WORDS.get(report.clock, report.clock)}"
    )
    if report.healthy:
        lines.append("HEALTHY: every group's collectives agree across ranks and none is stuck.")
    for i, f in enumerate(report.findings):
        lines.append("")
        lines.append(_headline(i, f))
        lines.append(f"  {f.detail}")
        if f.culprits:
            who = ", ".join(
                f"{c.rank}" + (f" on {c.host}" if c.host else "") + (f" pid {c.pid}" if c.pid else "")
                for c in f.culprits[:8]
            )
            lines.append(
                f"  culprit: {who}" + (f" (+{len(f.culprits) - 8} more)" if len(f.culprits) > 8 else "")
            )
        if f.waiting_ranks:
            lines.append(f"  waiting: {_short(f.waiting_ranks)}")
        if f.waiting_frames and f.kind != "straggler":
            label = (
                "waiting ranks are in" if f.kind in ("hang", "state_mismatch") else "the other ranks called"
            )
            lines.append(f"  {label}:")
            lines.extend(f"    {x}" for x in user_frames(f.waiting_frames))
        if f.culprit_frames:
            lines.append("  culprit is at:" if f.kind in ("hang", "rank_lost") else "  culprit called:")
            lines.extend(f"    {x}" for x in user_frames(f.culprit_frames))
    for w in report.warnings:
        lines.append(f"warning: {w}")
    if seconds is not None:
        lines.append("")
        lines.append(f"({seconds:.2f} s)")
    return "\n".join(lines) + "\n"


def _headline(i: int, f: Finding) -> str:
    where = []
    if f.process_group is not None:
        where.append(
            f"group {f.process_group}" + (f" ({f.process_group_desc})" if f.process_group_desc else "")
        )
    if f.collective_seq_id is not None:
        where.append(f"seq {f.collective_seq_id}")
    if f.kind in CONFIG_KINDS:
        setting = (f.expected or f.actual or {}).get("setting")
        if setting:
            where.append(str(setting))
    if f.op:
        where.append(f.op)
    if f.elapsed_s is not None and f.kind in ("hang", "rank_lost", "state_mismatch"):
        where.append(f"{f.elapsed_s:.1f} s")
    root = i == 0 and f.consequence_of is None and f.kind != "straggler" and f.kind not in CONFIG_KINDS
    prefix = "ROOT CAUSE " if root else ""
    after = f"  [follows from #{f.consequence_of + 1}]" if f.consequence_of is not None else ""
    return f"#{i + 1} {prefix}{_TITLES[f.kind]}: " + ", ".join(where) + after


def _short(ranks: Sequence[int], limit: int = 16, total: int | None = None) -> str:
    """The first `limit` ranks, then how many more (`total`: how many `ranks` stands for)."""
    total = len(ranks) if total is None else total
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" (+{total - min(limit, len(ranks))} more)" if total > min(limit, len(ranks)) else "")
