"""`flightdeck collector install`: set a GPU host up for the collector under systemd, in one command.

What it does, in order (each step printed; `--dry-run` prints them and changes nothing):

1. a system group and user `flightdeck` (no login, no home) unless they exist;
2. the spool (`/var/spool/flightdeck`): owned by the collector, group = the group the training
   jobs' users share with it (`--jobs-group`, default the collector's own group), mode 2770, so the
   jobs write there, the collector reads and moves what they wrote, and nobody else sees it;
3. the token, copied to `/etc/flightdeck/collector.token` (root, 0600): systemd hands it to the
   service with `LoadCredential=`, so the collector's user never reads /etc/flightdeck itself;
4. `/etc/flightdeck/collector.toml` (kept if present, unless `--force`): the server URL, the
   spool and the credential path as `token_file`;
5. the unit `/etc/systemd/system/flightdeck-collector.service`: the shipped unit with ExecStart on
   the `flightdeck` executable that runs this command (a venv's `bin/flightdeck` included), the
   credential, the jobs' group and the resource limits;
6. `systemctl daemon-reload` and `systemctl enable --now flightdeck-collector` (skipped with
   `--no-start` or when `--root` is not `/`).

`--root DIR` installs into a staged root instead of `/` (the tests do, then run
`systemd-analyze verify` and `security` on it); users and groups then go to `DIR/etc/passwd` and
`DIR/etc/group` through `useradd --prefix`.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flightdeck.spool import DEFAULT_SPOOL_DIR

#: The service's name; systemd puts its credentials under /run/credentials/<unit>/.
UNIT_NAME = "flightdeck-collector.service"
#: The shipped unit, the template of the installed one.
UNIT_TEMPLATE = Path(__file__).resolve().parent / UNIT_NAME
#: ExecStart's executable in the template, replaced by the real one.
TEMPLATE_EXEC = "/usr/local/bin/flightdeck"
#: Name of the credential holding the token (LoadCredential=<name>:<file>).
CREDENTIAL = "token"
#: Where the collector reads the token at run time (systemd's credentials directory).
CREDENTIAL_PATH = f"/run/credentials/{UNIT_NAME}/{CREDENTIAL}"
#: Where the token file lives on the host (read by systemd as root, never by the collector).
TOKEN_PATH = "/etc/flightdeck/collector.token"  # noqa: S105 (a path, not a secret)
CONFIG_PATH = "/etc/flightdeck/collector.toml"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
DEFAULT_SPOOL = DEFAULT_SPOOL_DIR
USER = "flightdeck"


class InstallError(Exception):
    """The installation cannot go on; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Options:
    """What to install, from the command line."""

    server_url: str
    token_file: Path
    root: Path
    exec_path: str
    jobs_group: str | None
    spool: str
    memory_max: str
    cpu_quota: str
    tasks_max: int
    start: bool
    force: bool
    dry_run: bool


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the `install` options (to the collector's parser, as `--install` mode arguments)."""
    parser.add_argument(
        "--server-url", required=True, help="the Flightdeck server, e.g. https://fd.example:8470"
    )
    parser.add_argument(
        "--token-file", type=Path, required=True, help="a file holding this host's collector token"
    )
    parser.add_argument(
        "--jobs-group",
        help="an existing group the training jobs' users belong to; it owns the spool "
        "(default: the collector's own group `flightdeck`: add the jobs' users to it)",
    )
    parser.add_argument("--spool", default=DEFAULT_SPOOL, help=f"the agents' spool (default {DEFAULT_SPOOL})")
    parser.add_argument(
        "--exec",
        dest="exec_path",
        help="the flightdeck executable ExecStart runs (default: the one running this command)",
    )
    parser.add_argument("--memory-max", default="1G", help="systemd MemoryMax= (default 1G)")
    parser.add_argument("--cpu-quota", default="50%", help="systemd CPUQuota= (default 50%%: half a core)")
    parser.add_argument("--tasks-max", type=int, default=64, help="systemd TasksMax= (default 64)")
    parser.add_argument("--root", type=Path, default=Path("/"), help="install into this root (default /)")
    parser.add_argument("--no-start", action="store_true", help="do not run systemctl")
    parser.add_argument("--force", action="store_true", help="overwrite an existing collector.toml")
    parser.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")


def running_executable() -> str:
    """The `flightdeck` executable of this installation: the script that runs us, else the one on
    PATH beside this interpreter (a venv's bin/), else the one on PATH."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "flightdeck" and argv0.is_file():
        return str(argv0.absolute())
    beside = Path(sys.executable).parent / "flightdeck"
    if beside.is_file():
        return str(beside)
    found = shutil.which("flightdeck")
    if found is None:
        raise InstallError("cannot find the flightdeck executable: pass --exec PATH")
    return str(Path(found).absolute())


def options_from(args: argparse.Namespace) -> Options:
    """Options from parsed arguments; checks what can be checked before changing anything."""
    if not args.server_url.startswith(("http://", "https://")):
        raise InstallError(f"--server-url must start with http:// or https://, got {args.server_url!r}")
    if not args.token_file.is_file():
        raise InstallError(f"--token-file {args.token_file} is not a file")
    if not args.token_file.read_text(encoding="utf-8").strip():
        raise InstallError(f"--token-file {args.token_file} is empty")
    if not Path(args.spool).is_absolute():
        raise InstallError(f"--spool must be an absolute path, got {args.spool!r}")
    return Options(
        server_url=args.server_url,
        token_file=args.token_file,
        root=args.root,
        exec_path=args.exec_path or running_executable(),
        jobs_group=args.jobs_group,
        spool=args.spool,
        memory_max=args.memory_max,
        cpu_quota=args.cpu_quota,
        tasks_max=args.tasks_max,
        start=not args.no_start and args.root == Path("/"),
        force=args.force,
        dry_run=args.dry_run,
    )


def render_unit(template: str, opts: Options) -> str:
    """The installed unit: the template with the real executable, the credential, the jobs' group
    and the resource limits."""
    if f"ExecStart={TEMPLATE_EXEC} " not in template:
        raise InstallError(f"{UNIT_TEMPLATE} has no ExecStart={TEMPLATE_EXEC}: cannot render the unit")
    text = template.replace(f"ExecStart={TEMPLATE_EXEC} ", f"ExecStart={opts.exec_path} ", 1)
    lines = [
        f"LoadCredential={CREDENTIAL}:{TOKEN_PATH}",
        f"MemoryMax={opts.memory_max}",
        f"CPUQuota={opts.cpu_quota}",
        f"TasksMax={opts.tasks_max}",
    ]
    if opts.jobs_group:
        lines.append(f"SupplementaryGroups={opts.jobs_group}")
    if opts.spool != DEFAULT_SPOOL:
        lines.append(f"ReadWritePaths={opts.spool}")
    # Replace the template's own settings of the same keys, then add ours at the end of [Service].
    keys = {line.split("=", 1)[0] for line in lines}
    kept = [ln for ln in text.splitlines() if ln.split("=", 1)[0] not in keys or ln.startswith("#")]
    out = "\n".join(kept) + "\n"
    marker = "\n[Install]"
    if marker not in out:
        raise InstallError(f"{UNIT_TEMPLATE} has no [Install] section")
    block = "# Set by `flightdeck collector install`.\n" + "\n".join(lines) + "\n"
    return out.replace(marker, "\n" + block + marker, 1)


def render_config(opts: Options) -> str:
    """The collector's settings file."""

    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return (
        "# Written by `flightdeck collector install`; every setting: docs/configuration.md (Collector).\n"
        f"server_url = {q(opts.server_url)}\n"
        "# systemd hands the token over with LoadCredential= (the unit); the file it reads is\n"
        f"# {TOKEN_PATH} (root, 0600). To rotate: write it, then systemctl restart {UNIT_NAME}.\n"
        f"token_file = {q(CREDENTIAL_PATH)}\n"
        f"spool_dirs = [{q(opts.spool)}]\n"
    )


class Installer:
    """Applies the steps; `run` executes commands (injected: the tests record them)."""

    def __init__(self, opts: Options, out: Callable[[str], None], run: Callable[[list[str]], None]) -> None:
        self.opts, self.out, self.run_cmd = opts, out, run

    def path(self, absolute: str) -> Path:
        """A path of the target system, under --root."""
        return self.opts.root / absolute.lstrip("/")

    def _ids(self, group: str) -> tuple[int, int]:
        """(uid of the collector user, gid of `group`) in the target root."""
        if self.opts.root == Path("/"):
            return pwd.getpwnam(USER).pw_uid, grp.getgrnam(group).gr_gid
        uid = _lookup(self.path("/etc/passwd"), USER)
        gid = _lookup(self.path("/etc/group"), group)
        if uid is None or gid is None:
            raise InstallError(f"user {USER} or group {group} missing in {self.opts.root}/etc")
        return uid, gid

    def _step(self, text: str) -> bool:
        self.out(("would: " if self.opts.dry_run else "") + text)
        return not self.opts.dry_run

    def user(self) -> None:
        """Step 1: the system group and user."""
        prefix = [] if self.opts.root == Path("/") else ["--prefix", str(self.opts.root)]
        if _lookup(self.path("/etc/group"), USER) is None and self._step(f"create system group {USER}"):
            self.run_cmd(["groupadd", "--system", *prefix, USER])
        if _lookup(self.path("/etc/passwd"), USER) is None and self._step(f"create system user {USER}"):
            self.run_cmd(
                [
                    *("useradd", "--system", *prefix, "--gid", USER, "--no-create-home"),
                    *("--home-dir", "/var/lib/flightdeck-collector", "--shell", "/usr/sbin/nologin", USER),
                ]
            )
        group = self.opts.jobs_group or USER
        if not self.opts.dry_run and _lookup(self.path("/etc/group"), group) is None:
            raise InstallError(f"--jobs-group {group} does not exist: create it first (groupadd)")

    def spool(self) -> None:
        """Step 2: the spool, shared with the training jobs through its group."""
        group = self.opts.jobs_group or USER
        if not self._step(f"spool {self.opts.spool}: owner {USER}, group {group}, mode 2770"):
            return
        uid, gid = self._ids(group)
        d = self.path(self.opts.spool)
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, uid, gid)
        # setgid: what the jobs create inside keeps the group, so the collector can read it.
        os.chmod(d, 0o2770)  # noqa: S103 (group-writable on purpose: the jobs' group writes here)

    def token(self) -> None:
        """Step 3: the token, readable by root only (systemd passes it on as a credential)."""
        if not self._step(f"token {TOKEN_PATH} (root, 0600) from {self.opts.token_file}"):
            return
        dest = self.path(TOKEN_PATH)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.opts.token_file.read_text(encoding="utf-8").strip() + "\n")
        os.chmod(dest, 0o600)

    def config(self) -> None:
        """Step 4: the settings file (an existing one is kept unless --force)."""
        dest = self.path(CONFIG_PATH)
        if dest.exists() and not self.opts.force:
            self.out(f"keep {CONFIG_PATH} (exists; --force overwrites it)")
            return
        if self._step(f"settings {CONFIG_PATH}"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(render_config(self.opts), encoding="utf-8")
            os.chmod(dest, 0o644)

    def unit(self) -> None:
        """Step 5: the systemd unit."""
        text = render_unit(UNIT_TEMPLATE.read_text(encoding="utf-8"), self.opts)
        if self._step(f"unit {UNIT_PATH} (ExecStart={self.opts.exec_path})"):
            dest = self.path(UNIT_PATH)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")
            os.chmod(dest, 0o644)

    def start(self) -> None:
        """Step 6: systemd picks the unit up and starts it."""
        commands = [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", UNIT_NAME]]
        if not self.opts.start:
            self.out("then run: " + " && ".join(" ".join(c) for c in commands))
            return
        for cmd in commands:
            if self._step(" ".join(cmd)):
                self.run_cmd(cmd)

    def all(self) -> None:
        """Every step, in order."""
        for step in (self.user, self.spool, self.token, self.config, self.unit, self.start):
            step()
        group = self.opts.jobs_group or USER
        self.out(
            f"training jobs: run them as users in group {group} (usermod -aG {group} USER) with "
            f"FLIGHTDECK_AGENT_SPOOL_DIR={self.opts.spool}"
        )


def _lookup(table: Path, name: str) -> int | None:
    """The numeric id of `name` in an /etc/passwd or /etc/group file, or None."""
    try:
        lines = table.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        fields = line.split(":")
        if len(fields) > 2 and fields[0] == name:
            return int(fields[2])
    return None


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InstallError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")


def main(argv: list[str]) -> int:
    """Run `flightdeck collector install ARGS`; returns the exit code (0 done, 2 refused)."""
    parser = argparse.ArgumentParser(prog="flightdeck collector install", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    try:
        if os.geteuid() != 0 and not args.dry_run:
            raise InstallError("run as root (or with --dry-run to see the steps)")
        Installer(options_from(args), out=print, run=_run).all()
    except (InstallError, OSError) as exc:
        print(f"flightdeck collector install: {exc}", file=sys.stderr)
        return 2
    return 0
