"""`flightdeck collector` (a real process) on a state directory it cannot use: one clear line on
stderr and exit code 3, never a traceback; a read-only filesystem is a real read-only mount."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.collector_stack import write_config

EXIT_STATE = 3


@pytest.fixture
def read_only_fs(tmp_path: Path) -> Iterator[Path]:
    """A read-only directory: a read-only tmpfs mount as root (root may write anywhere else), a
    0555 directory otherwise."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True, text=True
        )
        if done.returncode != 0:  # root without CAP_SYS_ADMIN: nothing is read-only to it
            pytest.skip(f"cannot mount a read-only tmpfs: {done.stderr.strip()}")
        try:
            yield ro
        finally:
            subprocess.run(["umount", "-l", str(ro)], check=False)
    else:
        ro.chmod(0o555)
        try:
            yield ro
        finally:
            ro.chmod(0o755)


def run(tmp_path: Path, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = write_config(tmp_path, "http://127.0.0.1:9", state_dir=str(state))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    return subprocess.run(
        [sys.executable, "-m", "flightdeck", "collector", "--config", str(cfg), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _garbage_queue(tmp_path: Path) -> Path:
    state = tmp_path / "garbage"
    state.mkdir()
    (state / "queue.sqlite3").write_bytes(b"this is not a database, it is a text file\n" * 100)
    return state


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("x")
    return tmp_path / "a-file"


CASES: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "read-only mount": (lambda tmp, ro: ro, "is not usable: "),
    "missing below a read-only mount": (lambda tmp, ro: ro / "state", "is not usable: "),
    "a regular file": (lambda tmp, ro: _a_file(tmp), "is not usable: "),
    "a queue that is no database": (lambda tmp, ro: _garbage_queue(tmp), "file is not a database"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(
    "mode", [(), ("--once",), ("--requeue-dead-letters",)], ids=["run", "once", "requeue"]
)
def test_unusable_state_dir_is_one_clear_line_and_exit_3(
    case: str, mode: tuple[str, ...], tmp_path: Path, read_only_fs: Path
) -> None:
    make, detail = CASES[case]
    state = make(tmp_path, read_only_fs)
    out = run(tmp_path, state, *mode)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EXIT_STATE, out.stderr
    assert "Traceback" not in out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"flightdeck collector: state_dir {state} is not usable"), lines[0]
    assert detail in lines[0]
    assert "it must be a writable directory on a local filesystem" in lines[0]
