"""`flightdeck analyze` on dumps as users bring them (issue 26, classes 1 and 5).

Raw PyTorch dumps without sidecars reach a user by scp, `kubectl cp`, object storage or git, all
of which set the file times to the copy's moment. Every test here copies the committed dumps
(`shutil.copy`: fresh file times) and many then skew those times on purpose (`os.utime`): a copy
time must never make a hang or a lost rank, nor hide a real one. The healthy jobs are real gloo
jobs (tests/fr_jobs): dumped by PyTorch's own call at exit (the last barrier finished on some ranks,
still pending on others: gloo sets completion flags asynchronously) and mid-training at different
moments with a wrapped ring and uneven work; both as pickle and as JSON. The kills are real too:
a rank SIGKILLed while it waits inside a subgroup collective, with and without its peers failing
first (agent snapshots; the JSON form is PyTorch's JSON shape of the same dumps).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from flightdeck.cli import main
from flightdeck.readers.fr.decode import load_raw

DATA = Path(__file__).parent / "data" / "fr"
RAW_HEALTHY = ("healthy_exit_raw", "healthy_midtrain_raw")
FORMS = ("pickle", "json")
KILLS = ("kill_in_subgroup", "kill_in_subgroup_after_peers_failed")
#: Agent-made scenarios whose newest dump per rank, bare, shows the fault by positions alone.
BARE_FAULTS = ("skip", "wrapped", "subgroup_hang", "rank0_culprit", "op_order", "dtype_same_bytes")


def _analyze(*args: str) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["analyze", "--format", "json", *args])
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / name / "scenario.json").read_text())
    return doc


def _copy_raw(name: str, form: str, dest: Path) -> list[Path]:
    """The raw dumps of one form, copied as a user's copy would be (fresh file times)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for p in sorted((DATA / name / form).glob("comm_lib_trace_rank_*")):
        shutil.copy(p, dest / p.name)
        out.append(dest / p.name)
    assert out, f"no {form} dumps in {name}"
    return out


def _copy_bare(name: str, dest: Path) -> list[Path]:
    """Each rank's newest agent dump, without its sidecar, under PyTorch's file name."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for rank in range(_doc(name)["world_size"]):
        for n in (f"rank_{rank}.final.pkl", f"rank_{rank}.stall.pkl", f"rank_{rank}.pkl"):
            if (DATA / name / n).exists():
                shutil.copy(DATA / name / n, dest / f"comm_lib_trace_rank_{rank}")
                out.append(dest / f"comm_lib_trace_rank_{rank}")
                break
    return out


# --- file-time skews: what copies do to the times ------------------------------------------------


def _older_most(files: list[Path]) -> None:
    """Most files (all but the first quarter) made 15 s older than the rest."""
    now = time.time()
    for i, p in enumerate(files):
        t = now - (15.0 if i >= len(files) // 4 else 0.0)
        os.utime(p, (t, t))


def _one_day_old(files: list[Path]) -> None:
    """One file 30 hours older than the others (copied the day before)."""
    t = time.time() - 30 * 3600
    os.utime(files[-1], (t, t))


def _written_over_a_minute(files: list[Path]) -> None:
    """Written one after another over a minute, in reverse rank order."""
    now = time.time()
    for i, p in enumerate(reversed(files)):
        t = now - 60.0 + 60.0 * i / max(1, len(files) - 1)
        os.utime(p, (t, t))


SKEWS: dict[str, Callable[[list[Path]], None]] = {
    "fresh": lambda files: None,
    "most_15s_older": _older_most,
    "one_30h_older": _one_day_old,
    "over_a_minute": _written_over_a_minute,
}


# --- the committed data is what the tests claim it is --------------------------------------------


def _newest(raw: dict[str, Any]) -> dict[str, tuple[int, bool]]:
    last: dict[str, tuple[int, bool]] = {}
    for e in raw["entries"]:
        last[str(e["process_group"][0])] = (e["collective_seq_id"], bool(e["retired"]))
    return last


def test_exit_dumps_show_the_last_barrier_finished_on_some_ranks_and_pending_on_others() -> None:
    dumps = [load_raw(p.read_bytes()) for p in sorted((DATA / "healthy_exit_raw" / "pickle").iterdir())]
    last = [_newest(d)["0"] for d in dumps]
    assert len({seq for seq, _ in last}) == 1, last  # every member recorded it
    assert {done for _, done in last} == {True, False}, last
    assert _doc("healthy_exit_raw")["observed"]["exit_codes"] == {str(r): 0 for r in range(4)}


@pytest.mark.parametrize("form", FORMS)
def test_midtrain_dumps_are_wrapped_and_taken_at_different_moments(form: str) -> None:
    dumps = [load_raw(p.read_bytes()) for p in sorted((DATA / "healthy_midtrain_raw" / form).iterdir())]
    assert all(d["entries"][0]["record_id"] > 0 for d in dumps)  # the ring wrapped
    assert len({_newest(d)["0"][0] for d in dumps}) > 1  # each rank's newest collective differs
    assert _doc("healthy_midtrain_raw")["observed"]["exit_codes"] == {str(r): 0 for r in range(4)}


# --- class 1: healthy jobs stay healthy ----------------------------------------------------------


@pytest.mark.parametrize("skew", sorted(SKEWS))
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("scenario", RAW_HEALTHY)
def test_raw_dumps_of_healthy_jobs_are_healthy_whatever_the_file_times(
    scenario: str, form: str, skew: str, tmp_path: Path
) -> None:
    files = _copy_raw(scenario, form, tmp_path)
    SKEWS[skew](files)
    code, verdict, err = _analyze(str(tmp_path), "--world-size", "4")
    assert err == ""
    assert verdict["healthy"], [f["detail"] for f in verdict["findings"]]
    assert code == 0
    assert verdict["clock"] == {"source": "file", "elapsed_known": False}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("scenario", RAW_HEALTHY)
def test_a_given_now_hours_later_does_not_make_a_healthy_job_hang(
    scenario: str, form: str, tmp_path: Path
) -> None:
    _copy_raw(scenario, form, tmp_path)
    later = time.time() + 30 * 3600
    _, verdict, _ = _analyze(str(tmp_path), "--world-size", "4", "--now", str(later))
    assert verdict["healthy"], [f["detail"] for f in verdict["findings"]]
    assert verdict["clock"] == {"source": "given", "elapsed_known": True}


def test_text_output_says_where_the_clock_came_from(tmp_path: Path) -> None:
    _copy_raw("healthy_exit_raw", "pickle", tmp_path / "raw")
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["analyze", str(tmp_path / "raw")]) == 0
    assert "clock: file times only" in out.getvalue().splitlines()[0]
    out = io.StringIO()
    with redirect_stdout(out):
        main(["analyze", str(DATA / "skip")])
    assert "clock: snapshot times" in out.getvalue().splitlines()[0]
    _, verdict, _ = _analyze(str(DATA / "skip"))
    assert verdict["clock"] == {"source": "snapshot", "elapsed_known": True}


# --- real faults in bare dumps keep their verdict, whatever the file times -----------------------


@pytest.mark.parametrize("skew", sorted(SKEWS))
@pytest.mark.parametrize("scenario", BARE_FAULTS)
def test_faults_in_bare_dumps_are_found_whatever_the_file_times(
    scenario: str, skew: str, tmp_path: Path
) -> None:
    exp = _doc(scenario)["expected"]
    files = _copy_bare(scenario, tmp_path)
    SKEWS[skew](files)
    code, verdict, _ = _analyze(str(tmp_path), "--world-size", str(_doc(scenario)["world_size"]))
    assert code == 1
    root = verdict["findings"][0]
    got = (root["kind"], root["culprit_ranks"], root["process_group"], root["collective_seq_id"], root["op"])
    assert got == (
        exp["kind"],
        exp["culprit_ranks"],
        exp["process_group"],
        exp["collective_seq_id"],
        exp["op"],
    )
    assert not [f for f in verdict["findings"] if f["kind"] == "rank_lost"]
    if root["kind"] == "hang":
        assert root["elapsed_s"] is None  # only file times: how long is unknown, and said so
        assert "unknown time" in root["detail"]


# --- the lost-rank and silent-rank rules on many ranks -------------------------------------------


def _synth_job(out: Path, ranks: int, entries: int, culprit: int) -> list[Path]:
    """A job of `ranks` raw dumps built from a real gloo dump's entries; `culprit` never enters
    the last collective, which every other rank waits in."""
    src = load_raw((DATA / "healthy_4" / "rank_0.final.pkl").read_bytes())
    templates = [
        e for e in src["entries"] if e["process_group"][0] == "0" and "gather" not in e["profiling_name"]
    ]
    t0 = time.time_ns() - 3600 * 1_000_000_000
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(ranks)))}}
    files = []
    for r in range(ranks):
        ring = []
        for i in range(entries - 1 if r == culprit else entries):
            e = dict(templates[i % len(templates)])
            e.update(
                record_id=i,
                collective_seq_id=i + 1,
                op_id=i + 1,
                time_created_ns=t0 + i * 10_000_000 + r * 1000,
                retired=i < entries - 1,
                state="scheduled",
                process_group=("0", "default_pg"),
            )
            ring.append(e)
        dump = {"version": src["version"], "pg_config": pg_config, "pg_status": {}, "entries": ring}
        path = out / f"comm_lib_trace_rank_{r}"
        path.write_bytes(pickle.dumps(dump))
        files.append(path)
    return files


@pytest.mark.slow
@pytest.mark.parametrize("skew", ["most_15s_older", "over_a_minute"])
def test_a_hang_on_many_ranks_names_its_one_culprit_whatever_the_file_times(
    skew: str, tmp_path: Path
) -> None:
    files = _synth_job(tmp_path, 256, 24, culprit=137)
    SKEWS[skew](files)
    code, verdict, _ = _analyze(str(tmp_path), "--workers", "1")
    assert code == 1
    root = verdict["findings"][0]
    assert (root["kind"], root["culprit_ranks"], root["collective_seq_id"]) == ("hang", [137], 24)
    assert len(root["waiting_ranks"]) == 255
    assert [f["kind"] for f in verdict["findings"]] == ["hang"]


# --- class 5: a rank killed inside a subgroup collective -----------------------------------------


def _pytorch_json(raw: dict[str, Any]) -> dict[str, Any]:
    """A dump in the shape of PyTorch's JSON dump (`_dump_fr_trace_json`): no frames, lists for
    tuples, 0 for unrecorded NCCL times, pg_status values as strings."""
    entries = []
    for e in raw.get("entries") or []:
        j = {k: v for k, v in e.items() if k != "frames"}
        j["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            j[k] = e.get(k) or 0
        entries.append(j)
    status = {g: {k: str(v) for k, v in s.items()} for g, s in (raw.get("pg_status") or {}).items()}
    return {**raw, "entries": entries, "pg_status": status, "nccl_comm_state": {}}


def _copy_agent(name: str, form: str, dest: Path) -> None:
    """The agent's snapshots and sidecars, copied (fresh file times); as JSON when asked."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in sorted((DATA / name).glob("rank_*.pkl")):
        if form == "pickle":
            shutil.copy(p, dest / p.name)
            shutil.copy(p.with_name(p.name + ".meta.json"), dest / (p.name + ".meta.json"))
        else:
            target = dest / (p.name.removesuffix(".pkl") + ".json")
            target.write_text(json.dumps(_pytorch_json(load_raw(p.read_bytes()))))
            shutil.copy(p.with_name(p.name + ".meta.json"), target.with_name(target.name + ".meta.json"))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("scenario", KILLS)
def test_a_rank_killed_inside_a_subgroup_collective_is_named_with_group_and_seq(
    scenario: str, form: str, tmp_path: Path
) -> None:
    exp = _doc(scenario)["expected"]
    _copy_agent(scenario, form, tmp_path)
    SKEWS["over_a_minute"](sorted(tmp_path.glob("rank_*")))
    code, verdict, err = _analyze(str(tmp_path))
    assert err == ""
    assert code == 1
    root = verdict["findings"][0]
    assert root["consequence_of"] is None
    got = (root["kind"], root["culprit_ranks"], root["process_group"], root["collective_seq_id"], root["op"])
    assert got == ("rank_lost", [3], "2", exp["collective_seq_id"], "all_reduce")
    assert root["process_group_desc"] == "pair23"
    assert "unfinished" in root["detail"]  # it was inside it when it went silent
    # The rest follows from it: nobody else is blamed as a root cause.
    # (The after-peers-failed job also set its pair groups' timeout far from the default group's,
    # which the configuration rules rightly report beside it.)
    assert all(
        f["consequence_of"] is not None for f in verdict["findings"][1:] if f["kind"] not in ("config_skew",)
    )


@pytest.mark.parametrize("skew", ["fresh", "over_a_minute"])
@pytest.mark.parametrize("form", FORMS)
def test_a_rank_killed_inside_a_subgroup_collective_is_named_from_raw_dumps_too(
    form: str, skew: str, tmp_path: Path
) -> None:
    """Raw dumps (no agent, each rank dumping every 0.5 s and when it fails) hold no liveness: the
    killed rank shows as the member that was inside the pair collective long before its late peer
    came, after which it still did not finish."""
    exp = _doc("kill_in_subgroup_raw")["expected"]
    files = _copy_raw("kill_in_subgroup_raw", form, tmp_path)
    SKEWS[skew](files)
    code, verdict, _ = _analyze(str(tmp_path), "--world-size", "4")
    assert code == 1
    root = verdict["findings"][0]
    got = (root["kind"], root["culprit_ranks"], root["process_group"], root["collective_seq_id"], root["op"])
    assert got == (exp["kind"], [3], "2", exp["collective_seq_id"], "all_reduce")
    assert root["consequence_of"] is None
    assert root["waiting_ranks"] == [2]
    # The default group's ranks wait for ranks 2 and 3: that follows from it.
    later = [f for f in verdict["findings"][1:] if f["kind"] == "hang"]
    assert later and all(f["consequence_of"] == 0 for f in later)


@pytest.mark.parametrize("sidecars", [False, True])
def test_a_barrier_pending_on_one_rank_at_exit_is_not_a_state_mismatch(
    sidecars: bool, tmp_path: Path
) -> None:
    """The exit race in isolation, on a real job's final snapshots: rank 1's last barrier left
    pending (as gloo's asynchronous completion flag leaves it when the dump wins the race), judged
    with file times only, and with the agent's sidecars 30 hours later (`--now`)."""
    for rank in range(4):
        src = DATA / "healthy_4" / f"rank_{rank}.final.pkl"
        raw = load_raw(src.read_bytes())
        if rank == 1:
            raw["entries"][-1]["retired"] = False
        name = f"rank_{rank}.final.pkl" if sidecars else f"comm_lib_trace_rank_{rank}"
        (tmp_path / name).write_bytes(pickle.dumps(raw))
        if sidecars:
            shutil.copy(src.with_name(src.name + ".meta.json"), tmp_path / (name + ".meta.json"))
    args = ["--now", str(time.time() + 30 * 3600)] if sidecars else []
    code, verdict, _ = _analyze(str(tmp_path), "--world-size", "4", *args)
    assert verdict["healthy"], [f["detail"] for f in verdict["findings"]]
    assert code == 0
