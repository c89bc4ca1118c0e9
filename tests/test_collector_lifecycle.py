"""The collector's part in a job's lifecycle, on real processes, real dumps and a real SQLite queue:

- a rank whose process is gone (exited, a zombie) is reported once (`gone`), after its snapshots,
  never again after a restart, and never when its latest snapshot is final;
- a restart ships nothing again (in-process against a real `flightdeck server`, and
  `flightdeck up` restarted on the same folders: the job's `last_seen` does not move);
- the spool directory of an ended job is removed after `spool_retention_s`;
- an idle collector heartbeats: the server's last-push age stays under heartbeat_s + push interval.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flightdeck.collector.processes import ProcTable
from flightdeck.launch.demo.ranks import free_port
from flightdeck.wire import decode_batch
from tests.support.cli import FLIGHTDECK
from tests.support.collector_fixtures import FR_DATA, spool_scenario, thread_guard
from tests.support.collector_harness import Harness, settings_for
from tests.support.collector_recorder import Recorder
from tests.support.collector_stack import Server, get_json
from tests.support.waiting import wait_until

HOST = "node-a"  # settings_for's collector host name


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    yield from thread_guard()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process standing in for a rank (killed by the test, or at its end)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def spool_rank(directory: Path, source: Path, *, job: str, pid: int, when_ns: int, host: str = HOST) -> Path:
    """A real committed dump and its sidecar, the sidecar naming `job`, this host and `pid`."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = json.loads(source.with_name(source.name + ".meta.json").read_text())
    meta.update(job=job, host=host, pid=pid, snapshot_time_ns=when_ns)
    dest = directory / source.name
    tmp = directory / f".{source.name}.tmp"
    tmp.with_name(tmp.name + ".meta").write_text(json.dumps(meta))
    os.replace(tmp.with_name(tmp.name + ".meta"), dest.with_name(dest.name + ".meta.json"))
    shutil.copy(source, tmp)
    os.replace(tmp, dest)
    return dest


def job_of(server: Server, job: str) -> dict[str, Any]:
    """The server's report of `job` (its JSON API)."""
    doc: dict[str, Any] = get_json(f"{server.url}/api/v1/jobs/{job}")
    return doc


def gone_of(recorder: Recorder) -> list[dict[str, Any]]:
    return [g for d in recorder.docs() for g in d.get("gone", [])]


def snapshots_of(recorder: Recorder) -> list[tuple[str, int, str]]:
    return [(s.job, s.rank, s.kind) for d in recorder.docs() for s in decode_batch(d).snapshots]


# --- the process table ----------------------------------------------------------------------------


@pytest.mark.slow
def test_proc_table_tells_running_from_zombie_gone_and_reused(sleeper: subprocess.Popen[bytes]) -> None:
    table = ProcTable()
    now = time.time_ns()
    assert table.running(sleeper.pid, started_by_ns=now)
    # Started long after the rank's first snapshot: the pid was reused by another process.
    assert not table.running(sleeper.pid, started_by_ns=now - 3600 * 10**9)
    sleeper.kill()
    for _ in range(100):  # the kill is asynchronous; until reaped it is a zombie
        if not table.running(sleeper.pid, started_by_ns=now):
            break
        time.sleep(0.05)
    assert not table.running(sleeper.pid, started_by_ns=now)  # a zombie (not waited for yet)
    sleeper.wait()
    assert not table.running(sleeper.pid, started_by_ns=now)


# --- gone ranks -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_rank_whose_process_is_gone_is_reported_once_after_its_snapshots(
    tmp_path: Path, recorder: Recorder, sleeper: subprocess.Popen[bytes]
) -> None:
    job_dir = tmp_path / "spool" / "gone-job" / "0"
    ended = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        start = time.time_ns()
        spool_rank(
            job_dir, FR_DATA / "healthy_2" / "rank_0.pkl", job="gone-job", pid=sleeper.pid, when_ns=start
        )
        # Rank 1's latest snapshot is final: its process ending needs no report.
        spool_rank(
            job_dir, FR_DATA / "healthy_2" / "rank_1.final.pkl", job="gone-job", pid=ended.pid, when_ns=start
        )
        # Another host's rank with a pid that does not run here: not ours to judge.
        spool_rank(
            tmp_path / "spool" / "far-job" / "0",
            FR_DATA / "healthy_2" / "rank_0.pkl",
            job="far-job",
            pid=ended.pid + 100000,
            when_ns=start,
            host="node-b",
        )
        h = Harness(settings_for(tmp_path, recorder.url))
        try:
            h.flush_and_push()
            assert sorted(snapshots_of(recorder)) == [
                ("far-job", 0, "periodic"),
                ("gone-job", 0, "periodic"),
                ("gone-job", 1, "final"),
            ]
            h.flush_and_push()
            assert gone_of(recorder) == []  # both processes still run
            ended.kill()
            ended.wait()
            sleeper.kill()  # not waited for: a zombie until the fixture reaps it
            # Its last periodic snapshot, written just before it died, is not shipped yet.
            spool_rank(
                job_dir,
                FR_DATA / "healthy_2" / "rank_0.pkl",
                job="gone-job",
                pid=sleeper.pid,
                when_ns=time.time_ns(),
            )
            for _ in range(100):
                if not ProcTable().running(sleeper.pid, started_by_ns=time.time_ns()):
                    break
                time.sleep(0.05)
            before = len(recorder.docs())
            h.flush_and_push()
            docs = recorder.docs()[before:]
            assert [bool(d["snapshots"]) for d in docs] == [True, False], docs  # snapshot, then gone
            assert gone_of(recorder) == [
                {
                    "job": "gone-job",
                    "attempt": 0,
                    "rank": 0,
                    "pid": sleeper.pid,
                    "gone_at_ns": gone_of(recorder)[0]["gone_at_ns"],
                }
            ]
            assert gone_of(recorder)[0]["gone_at_ns"] >= start
            h.flush_and_push()
            assert len(gone_of(recorder)) == 1  # once
            assert h.metric("flightdeck_collector_gone_ranks_total") == 1
        finally:
            h.close()
        again = Harness(settings_for(tmp_path, recorder.url))
        try:
            again.flush_and_push()
        finally:
            again.close()
        assert len(gone_of(recorder)) == 1  # not again after a restart
    finally:
        if ended.poll() is None:
            ended.kill()
            ended.wait()


@pytest.mark.slow
def test_a_gone_rank_waits_for_its_files_on_disk(
    tmp_path: Path, recorder: Recorder, sleeper: subprocess.Popen[bytes]
) -> None:
    """A file of the rank that cannot be shipped yet (caught half-written: looked at again at the
    next flush) holds the report back until it is dealt with (here: quarantined, still bad)."""
    job_dir = tmp_path / "spool" / "gone-late" / "0"
    spool_rank(
        job_dir,
        FR_DATA / "healthy_2" / "rank_0.pkl",
        job="gone-late",
        pid=sleeper.pid,
        when_ns=time.time_ns(),
    )
    h = Harness(settings_for(tmp_path, recorder.url))
    try:
        h.flush_and_push()
        sleeper.kill()
        sleeper.wait()
        half = (FR_DATA / "healthy_2" / "rank_0.pkl").read_bytes()
        (job_dir / "rank_0.recent.pkl").write_bytes(half[: len(half) // 2])
        first = h.collector.flush()
        assert first.gone == 0  # its recent file is not shipped yet
        second = h.collector.flush()
        assert (second.quarantined, second.gone) == (1, 1)
        assert h.collector.pusher.drain(timeout_s=10)
        assert [g["rank"] for g in gone_of(recorder)] == [0]
    finally:
        h.close()


# --- re-delivery ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_restarted_collector_ships_nothing_again_to_a_real_server(tmp_path: Path) -> None:
    server = Server(tmp_path / "server", tmp_path / "server.log")
    token = server.token("create", "node-a")
    server.start()
    try:
        spool_scenario(tmp_path / "spool", "skip")
        settings = settings_for(tmp_path, server.url, token=token, push_deadline_s=30.0)
        first = Harness(settings)
        try:
            result = first.collector.flush()
            assert first.collector.pusher.drain(timeout_s=30)
        finally:
            first.close()
        assert result.snapshots > 0
        report = job_of(server, "skip")
        received = server.metric("flightdeck_ingest_entries_total")
        assert received > 0

        second = Harness(settings)
        try:
            again = second.collector.flush()
            assert second.collector.pusher.drain(timeout_s=30)
            assert (again.files_read, again.snapshots) == (0, 0)
        finally:
            second.close()
        assert server.metric("flightdeck_ingest_entries_total") == received
        # Nothing moved: the job's last_seen (and with it elapsed times) is what it was.
        assert job_of(server, "skip")["last_seen_s"] == report["last_seen_s"]
    finally:
        server.stop()


# --- spool cleanup --------------------------------------------------------------------------------


def _age(directory: Path, seconds: float) -> None:
    """Make every file of `directory` look `seconds` old (as if the job ended that long ago)."""
    t = time.time() - seconds
    for p in directory.iterdir():
        os.utime(p, (t, t))


def _rescan_flush(h: Harness) -> Any:
    """A flush that rescans (and so cleans): rescan_interval_s is 1 ms in these settings."""
    time.sleep(0.01)
    return h.collector.flush()


def test_the_spool_of_an_ended_job_is_removed_after_the_retention(tmp_path: Path, recorder: Recorder) -> None:
    # A short retention for the test (the default is a day): 60 s, files aged past it.
    ended = spool_scenario(tmp_path / "spool", "healthy_2")  # every rank has a final snapshot
    running = spool_scenario(tmp_path / "spool", "healthy_4", periodic_only=True)
    _age(ended, 0)  # copied with the committed files' times: written now, as by a job
    _age(running, 0)
    h = Harness(settings_for(tmp_path, recorder.url, spool_retention_s=60.0))
    try:
        h.flush_and_push()
        assert _rescan_flush(h).removed_dirs == 0  # its files are new
        _age(ended, 120)
        _age(running, 120)
        assert _rescan_flush(h).removed_dirs == 1
        assert not ended.exists() and not ended.parent.exists()
        assert running.exists()  # its ranks' latest snapshots are periodic: not ended
        assert not [p for p in h.collector.queue.load_delivered() if p.startswith(str(ended))]
        assert h.metric("flightdeck_collector_spool_dirs_removed_total") == 1
    finally:
        h.close()


def test_a_zero_retention_keeps_the_spool(tmp_path: Path, recorder: Recorder) -> None:
    ended = spool_scenario(tmp_path / "spool", "healthy_2")
    h = Harness(settings_for(tmp_path, recorder.url, spool_retention_s=0))
    try:
        h.flush_and_push()
        _age(ended, 10 * 86400)
        assert _rescan_flush(h).removed_dirs == 0
        assert ended.exists()
    finally:
        h.close()


# --- heartbeat ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_idle_collector_heartbeats_to_a_real_server(tmp_path: Path) -> None:
    """Nothing in the spool: the server still hears from the collector every heartbeat_s (1 s for
    the test; 15 s by default)."""
    server = Server(tmp_path / "server", tmp_path / "server.log")
    token = server.token("create", "node-a")
    server.start()
    heartbeat_s, push_interval_s = 1.0, 0.2
    settings = settings_for(
        tmp_path, server.url, token=token, heartbeat_s=heartbeat_s, push_interval_s=push_interval_s
    )
    h = Harness(settings)
    runner = threading.Thread(target=h.collector.run, name="collector-run")
    try:
        h.collector.start(metrics=False)
        runner.start()
        ages = []
        for _ in range(12):  # 6 s: without heartbeats the age would pass 5 s
            time.sleep(0.5)
            ages.append(server.metric("flightdeck_collector_last_push_age_seconds", collector="node-a"))
        # Heartbeat period + one flush + the push itself (milliseconds) + up to 0.5 s of scrape.
        assert max(ages[2:]) < heartbeat_s + push_interval_s + 1.0, ages
        assert h.metric("flightdeck_collector_heartbeats_total") >= 3
    finally:
        h.collector.stop_event.set()
        runner.join(10)
        h.close()
        server.stop()


def test_heartbeats_off_and_not_while_batches_wait(tmp_path: Path, recorder: Recorder) -> None:
    off = Harness(settings_for(tmp_path, recorder.url, heartbeat_s=0))
    try:
        assert not off.collector.flush().heartbeat
    finally:
        off.close()
    h = Harness(settings_for(tmp_path, recorder.url, heartbeat_s=3600))
    try:
        assert h.collector.flush().heartbeat  # the first flush of an idle collector says it is up
        assert not h.collector.flush().heartbeat  # then once per heartbeat_s
        assert h.collector.pusher.drain(timeout_s=10)
        assert [d["snapshots"] for d in recorder.docs()] == [[]]
    finally:
        h.close()


# --- flightdeck up, restarted on the same folders ------------------------------------------------


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


def _report(base: str, job: str) -> dict[str, Any] | None:
    status, body = _get(f"{base}/api/v1/jobs/{job}")
    return json.loads(body) if status == 200 else None


def _metric_sum(base: str, name: str) -> float:
    """The sum of every series of `name` on a server's /metrics."""
    status, body = _get(f"{base}/metrics")
    assert status == 200, body[:500]
    return sum(s.value for f in text_string_to_metric_families(body) for s in f.samples if s.name == name)


@contextlib.contextmanager
def _flightdeck_up(root: Path) -> Iterator[str]:
    """`flightdeck up` on a free port, its data and spool under `root` (the same on every call)."""
    port = free_port()
    cmd = [*FLIGHTDECK, "up", "--port", str(port), "--data-dir", str(root / "data")]
    cmd += ["--spool-dir", str(root / "spool"), "--stall-after", "3"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env["TORCH_FR_DUMP_TEMP_FILE"] = str(root / "torch" / "comm_lib_trace_rank_")
    env["XDG_CACHE_HOME"] = str(root / "cache")
    log = root / f"up-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(
            lambda: "Flightdeck is up" in log.read_text() or proc.poll() is not None, 90, "flightdeck up"
        )
        assert proc.poll() is None, log.read_text()
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


@pytest.mark.slow
def test_flightdeck_up_restarted_on_the_same_folders_ships_nothing_again(tmp_path: Path) -> None:
    job_dir = tmp_path / "spool" / "up-replay" / "0"
    job_dir.mkdir(parents=True)
    for f in (FR_DATA / "skip").glob("rank_*"):
        if f.name.endswith(".meta.json"):
            meta = json.loads(f.read_text())
            meta["job"] = "up-replay"
            (job_dir / f.name).write_text(json.dumps(meta))
        else:
            shutil.copy(f, job_dir / f.name)
    with _flightdeck_up(tmp_path) as base:
        wait_until(
            lambda: bool((r := _report(base, "up-replay")) and r["ranks"]["with_dump"] == [0, 1, 2, 3]),
            60,
            "the spooled job in the API",
        )
        # Every file shipped: the entries the server accepted stop growing.
        seen: list[float] = []

        def settled() -> bool:
            seen.append(_metric_sum(base, "flightdeck_ingest_entries_total"))
            return len(seen) >= 3 and seen[-1] == seen[-3] > 0

        wait_until(settled, 60, "every spooled entry at the server", poll_s=1.0)
        before = _report(base, "up-replay")
        assert before is not None
    with _flightdeck_up(tmp_path) as base:
        # The restarted collector's first flush looks at every file; it sends at least a heartbeat.
        wait_until(
            lambda: _metric_sum(base, "flightdeck_ingest_batches_total") >= 1,
            60,
            "the collector's first push",
        )
        after = _report(base, "up-replay")
        assert after is not None
        assert _metric_sum(base, "flightdeck_ingest_entries_total") == 0
    assert after["last_seen_s"] == before["last_seen_s"]
