"""`flightdeck collector install` into a staged root: the user, the spool shared with the jobs' group,
the token credential, the settings and a unit that systemd-analyze verifies and rates.

systemd is not PID 1 here, so the unit is checked offline (`--root`). The spool's permissions are
checked with real processes switched to other users (the test runs as root, as CI does).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightdeck.collector.install import CREDENTIAL_PATH, UNIT_NAME
from flightdeck.collector.settings import CollectorSettings

#: the exposure the shipped unit is held to (tests/test_systemd_unit.py).
MAX_EXPOSURE = 2.0

pytestmark = [
    pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed"),
    pytest.mark.skipif(shutil.which("useradd") is None, reason="useradd not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="creates users in a staged root and switches users"),
]

#: a job user and an outsider, by number only (they need no passwd entry to own processes).
JOB_UID, OUTSIDER_UID = 4242, 4343
#: the system's Python, for code run as another user (this venv may sit under root's 0700 home).
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


def _root(tmp_path: Path) -> Path:
    """A staged root: the system units and the host's user tables, so useradd --prefix works."""
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    shutil.copytree("/lib/systemd/system", root / "lib" / "systemd" / "system", symlinks=True)
    (root / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow", "login.defs"):
        if Path("/etc", name).exists():
            shutil.copy(Path("/etc", name), root / "etc" / name)
    return root


def _install(root: Path, token: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "flightdeck", "collector", "install", "--root", str(root)),
            *("--server-url", "http://127.0.0.1:8470", "--token-file", str(token), *extra),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _id(table: Path, name: str) -> int:
    for line in table.read_text(encoding="utf-8").splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2])
    raise AssertionError(f"{name} not in {table}")


def _as(uid: int, gid: int, groups: list[int], code: str) -> subprocess.CompletedProcess[str]:
    """Run Python `code` as another user (real kernel permission checks)."""

    def switch() -> None:
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
        os.umask(0o022)  # a training job's usual umask

    if SYSTEM_PYTHON is None:
        pytest.skip("no system python3 to run as another user")
    return subprocess.run(
        [SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=switch
    )


@pytest.fixture
def world_readable_tmp() -> Iterator[Path]:
    """A scratch folder other users can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="fd-install-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def installed(world_readable_tmp: Path) -> Path:
    tmp_path = world_readable_tmp
    root = _root(tmp_path)
    token = tmp_path / "token"
    token.write_text("fd_col_secret\n", encoding="utf-8")
    exe = root / "opt" / "fd" / "bin" / "flightdeck"  # what verify looks for under the root
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    exe.chmod(0o755)
    done = _install(root, token, "--exec", "/opt/fd/bin/flightdeck")
    assert done.returncode == 0, done.stderr
    assert "then run: systemctl daemon-reload" in done.stdout  # not started in a staged root
    return root


@pytest.mark.slow
def test_install_creates_user_token_settings_and_unit(installed: Path) -> None:
    root = installed
    uid = _id(root / "etc" / "passwd", "flightdeck")
    assert uid != 0 and _id(root / "etc" / "group", "flightdeck") != 0
    token = root / "etc" / "flightdeck" / "collector.token"
    assert token.read_text(encoding="utf-8") == "fd_col_secret\n"
    assert token.stat().st_mode & 0o777 == 0o600 and token.stat().st_uid == 0
    settings = CollectorSettings.load(config=root / "etc" / "flightdeck" / "collector.toml")
    assert settings.server_url == "http://127.0.0.1:8470"
    assert settings.token_file == Path(CREDENTIAL_PATH)
    assert settings.spool_dirs == [Path("/var/spool/flightdeck")]
    unit = (root / "etc" / "systemd" / "system" / UNIT_NAME).read_text(encoding="utf-8").splitlines()
    for line in (
        "ExecStart=/opt/fd/bin/flightdeck collector --config /etc/flightdeck/collector.toml",
        "LoadCredential=token:/etc/flightdeck/collector.token",
        "MemoryMax=1G",
        "CPUQuota=50%",
        "TasksMax=64",
        "User=flightdeck",
    ):
        assert line in unit, line
    assert sum(1 for ln in unit if ln.startswith("MemoryMax=")) == 1  # the template's is replaced


@pytest.mark.slow
def test_installed_unit_verifies_and_is_hardened(installed: Path) -> None:
    unit = installed / "etc" / "systemd" / "system" / UNIT_NAME
    verify = subprocess.run(
        ["systemd-analyze", "verify", f"--root={installed}", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", f"--root={installed}", UNIT_NAME],
        capture_output=True,
        text=True,
        timeout=120,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", security.stdout + security.stderr)
    assert match, security.stdout + security.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE


@pytest.mark.slow
def test_spool_is_shared_with_the_jobs_group_and_closed_to_others(installed: Path) -> None:
    spool = installed / "var" / "spool" / "flightdeck"
    collector_uid = _id(installed / "etc" / "passwd", "flightdeck")
    gid = _id(installed / "etc" / "group", "flightdeck")
    st = spool.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (collector_uid, gid, 0o2770)
    # A training job's user in the group writes a snapshot the way the agent does (rename into place).
    write = (
        "import os, pathlib\n"
        f"d = pathlib.Path({str(spool)!r}) / 'job' / '0'\n"
        "d.mkdir(parents=True)\n"
        "(d / 'rank_0.pkl.tmp').write_bytes(b'snapshot')\n"
        "os.replace(d / 'rank_0.pkl.tmp', d / 'rank_0.pkl')\n"
    )
    job = _as(JOB_UID, JOB_UID, [gid], write)
    assert job.returncode == 0, job.stderr
    written = spool / "job" / "0" / "rank_0.pkl"
    assert written.stat().st_gid == gid  # setgid spool: the group follows
    # The collector reads it.
    read = _as(collector_uid, gid, [], f"print(open({str(written)!r}, 'rb').read().decode())")
    assert read.returncode == 0 and read.stdout.strip() == "snapshot", read.stderr
    # Anyone else cannot even list the spool.
    other = _as(OUTSIDER_UID, OUTSIDER_UID, [], f"import os; os.listdir({str(spool)!r})")
    assert other.returncode != 0 and "PermissionError" in other.stderr


@pytest.mark.slow
def test_default_executable_is_the_one_running_the_command(tmp_path: Path) -> None:
    root = _root(tmp_path)
    token = tmp_path / "token"
    token.write_text("t\n", encoding="utf-8")
    done = _install(root, token, "--dry-run")
    assert done.returncode == 0, done.stderr
    beside = Path(sys.executable).parent / "flightdeck"
    expected = str(beside) if beside.is_file() else shutil.which("flightdeck")
    assert f"(ExecStart={expected})" in done.stdout
    assert not (root / "etc" / "flightdeck").exists()  # a dry run changes nothing


@pytest.mark.slow
def test_bad_arguments_are_refused_with_a_reason(tmp_path: Path) -> None:
    root = _root(tmp_path)
    empty = tmp_path / "empty"
    empty.write_text("", encoding="utf-8")
    done = _install(root, empty)
    assert done.returncode == 2 and "is empty" in done.stderr and "Traceback" not in done.stderr
    missing_token = _install(root, tmp_path / "nope")
    assert missing_token.returncode == 2 and "is not a file" in missing_token.stderr
