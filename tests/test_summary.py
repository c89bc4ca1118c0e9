"""The per-rank summary folded snapshot by snapshot, as the server does, against the summary of
the rank's merged dump, as `flightdeck analyze` does."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from flightdeck.analysis import diagnose
from flightdeck.analysis.merge import snapshot_order
from flightdeck.analysis.summary import RankSummary, add_entries, summarize
from flightdeck.readers.fr.files import discover, read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.records import META_FIELDS, Progress, RankDump, meta_of
from flightdeck.server.live.fold import fold_snapshot
from flightdeck.server.live.state import JobState
from flightdeck.server.settings import ServerSettings
from flightdeck.wire import Snapshot, decode_batch, encode_batch, snapshot_from_dump
from tests.support.server_batches import make_batch, scenario_dumps


@pytest.mark.parametrize("scenario", ["skip", "healthy_4", "size_mismatch"])
def test_a_later_snapshot_without_frames_takes_no_frames_away(scenario: str) -> None:
    # The skip ranks' periodic snapshot re-sends the stuck collective without frames after their
    # stall snapshot sent it with them: the tail keeps them, as merging the dumps does.
    for rank, dumps in scenario_dumps(scenario).items():
        ordered = sorted(dumps, key=lambda d: d.snapshot_time_ns or 0)
        folded = summarize(ordered[0])
        for d in ordered[1:]:
            add_entries(folded, d.entries)
        merged = summarize(merge(ordered))
        assert folded.tracks.keys() == merged.tracks.keys()
        for g, track in merged.tracks.items():
            want = [(e.collective_seq_id, e.state, e.frames) for e in track.tail]
            got = [(e.collective_seq_id, e.state, e.frames) for e in folded.tracks[g].tail]
            assert got == want, (scenario, rank, g)


def test_every_shape_of_a_rank_carries_all_of_its_metadata() -> None:
    # A file's dump, the wire's snapshot and the diagnosis's summary each hold `RankMeta`'s
    # fields, and a copy from one to the next keeps every one.
    for cls in (RankDump, Snapshot, RankSummary):
        assert set(META_FIELDS) <= set(cls.__dataclass_fields__), cls
    for dumps in scenario_dumps("kill_in_subgroup").values():
        for d in dumps:
            assert meta_of(summarize(d)) == meta_of(d)
            assert meta_of(snapshot_from_dump(d)) == meta_of(d)


def _scenarios() -> list[Path]:
    """Every committed job: the agent's (snapshots per rank, under tests/data/fr/) and PyTorch's
    own dumps (one per rank: tests/data/fr/*_raw/pickle, tests/data/nccl/*/pickle)."""
    data = Path(__file__).parent / "data"
    agent = [p for p in sorted((data / "fr").iterdir()) if any(p.glob("rank_*.pkl"))]
    raw = sorted((data / "fr").glob("*/pickle")) + sorted((data / "nccl").glob("*/pickle"))
    return agent + raw


def _dumps(where: Path) -> dict[int, list[RankDump]]:
    out: dict[int, list[RankDump]] = defaultdict(list)
    for p in discover([where]):
        d = read_dump_file(p)
        out[d.rank].append(d)
    return dict(out)


def _folded_live(dumps: dict[int, list[RankDump]], job: str) -> dict[int, RankSummary]:
    """The summaries a live server folds: every snapshot through the wire, oldest first."""
    snaps = sorted(
        (snapshot_from_dump(d, job=job) for ds in dumps.values() for d in ds),
        key=lambda s: snapshot_order(s.snapshot_time_ns, s.kind),
    )
    doc = json.loads(json.dumps(encode_batch(make_batch(snaps))))
    js = JobState(job_id=1, name=job, attempt=snaps[0].attempt, summaries={})
    settings = ServerSettings()
    for snap in decode_batch(doc).snapshots:
        fold_snapshot(js, snap, max_seqs=settings.max_summary_seqs, max_times=settings.enqueue_times_kept)
    assert js.summaries is not None
    return js.summaries


def _what_diagnosis_reads(s: RankSummary) -> dict[str, object]:
    tracks = {
        g: (list(t.seqs), list(t.fps), list(t.created_ns), list(t.op_ids), t.tail, t.p2p, t.totals)
        for g, t in s.tracks.items()
    }
    return {
        "meta": meta_of(s),
        "tracks": tracks,
        "groups": s.groups,
        "sigs": s.sigs,
        "sig_frames": s.sig_frames,
        "progress": s.progress,
        "thread_stacks": s.thread_stacks,
        "config": s.config,
        "wrapped": s.wrapped,
    }


@pytest.mark.parametrize("where", _scenarios(), ids=lambda p: "/".join(p.parts[-2:]))
def test_the_live_fold_and_the_files_merge_give_one_summary(where: Path) -> None:
    # `flightdeck analyze` merges each rank's snapshot files, then summarizes; the live server
    # folds each snapshot in as it arrives: by the rules they share (`flightdeck.analysis.merge`),
    # both end with the same summary, and the same findings.
    dumps = _dumps(where)
    job = next(d.job for ds in dumps.values() for d in ds) or "unknown"
    offline = {r: summarize(merge(ds)) for r, ds in sorted(dumps.items())}
    live = _folded_live(dumps, job)
    assert sorted(live) == sorted(offline)
    for r, s in offline.items():
        if s.job is None:  # PyTorch's own dumps name no job: the wire's snapshot does
            s.job = job
        # Not on the wire: whether the time is only a file's mtime, NCCL's pg_status counters.
        s.snapshot_time_from_file, s.pg_status = False, {}
        assert _what_diagnosis_reads(live[r]) == _what_diagnosis_reads(s), r
    now_ns = max(s.snapshot_time_ns or 0 for s in offline.values())
    want = diagnose(list(offline.values()), now_ns=now_ns, job=job).to_json()
    got = diagnose([live[r] for r in sorted(live)], now_ns=now_ns, job=job).to_json()
    assert got["findings"] == want["findings"]


def test_both_paths_move_an_entry_forward_keep_what_a_snapshot_leaves_empty_and_take_the_last_sample() -> (
    None
):
    # A newer snapshot that holds an older view of an entry (a stall snapshot written after the
    # final one), no host or pid, and a progress sample taken before the one the older snapshot
    # carried: the files' merge and the live fold both keep what the older snapshot said.
    older = next(d for d in scenario_dumps("skip")[0] if d.kind == "final")
    last = older.entries[-1]
    assert last.retired and older.host and older.pid
    seen = Progress(sampled_ns=(older.snapshot_time_ns or 0) - 10, state="S")
    older = replace(older, progress=seen)
    newer = replace(
        older,
        kind="stall",
        snapshot_time_ns=(older.snapshot_time_ns or 0) + 1,
        host=None,
        pid=None,
        entries=[*older.entries[:-1], replace(last, retired=False)],
        progress=Progress(sampled_ns=seen.sampled_ns - 1, state="R"),
    )
    merged = merge([newer, older])
    assert (merged.kind, merged.host, merged.pid) == ("stall", older.host, older.pid)
    assert merged.entries[-1] == last
    assert merged.progress == seen
    live = _folded_live({0: [older, newer]}, "skip")[0]
    assert _what_diagnosis_reads(live) == _what_diagnosis_reads(summarize(merged))
