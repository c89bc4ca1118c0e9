"""The incident page, its live fragment and the JSON timeline, timed through a real `flightdeck server`.

A fresh database (SQLite file or a new PostgreSQL database), one `flightdeck server` process with
the shipped defaults, and `--jobs` jobs of `--ranks` x `--entries` collectives posted to it over
HTTP as a collector would (gzip batches, a token). The last job is a hang: rank 3 never enters the
last collective, the others wait in it; the bench waits for the server's finding, then times, over
HTTP on 127.0.0.1 (median of `--repeat` after one warm-up):

* the incident page (`GET /jobs/<job>`), what a browser opens;
* the live fragment the page polls every 2 s (`HX-Request: true`), first as a fresh poll and then
  as a quiet one (`If-None-Match` with the fragment's ETag: the job has not changed);
* the JSON timeline of the stuck window (`GET /api/v1/jobs/<job>/timeline`) and the job's verdict.

`--copies K` stores K more jobs like the hung one (ten jobs stored: `--copies 9`) as copies made in
SQL, rows of the same tables under a new job id, rather than posted: posting 20 million entries
takes the better part of an hour on these machines, and what the pages read is the same rows.
The running server does not diagnose the copies (it learns of jobs from what it ingests, or from
the database when it starts): they stand for the stored volume the pages' queries read past.

It prints the figures, the server's RSS and the machine's load average. Traffic goes to 127.0.0.1.

    python -m bench.web_server --db sqlite --ranks 1024 --entries 2000 --copies 9
    python -m bench.web_server --db postgresql --ranks 64 --entries 500
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.server_ingest import make_token, start_server, wait_idle
from bench.server_synth import rank_entries, snapshot, stuck_entry, template
from flightdeck.wire import Batch, encode_batch

PG_ADMIN = os.environ.get("FLIGHTDECK_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
CULPRIT = 3


@contextlib.contextmanager
def database(kind: str, keep: Path | None) -> Iterator[str]:
    """A fresh database URL, removed afterwards (`keep`: an SQLite file kept for the next run)."""
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "sqlite":
            yield f"sqlite:///{keep or Path(tmp) / 'web.db'}"
            return
        import psycopg

        name = keep.name if keep is not None else f"flightdeck_web_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                admin.execute(f'CREATE DATABASE "{name}"')
        try:
            base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
            yield f"{base}/{name}"
        finally:
            if keep is None:
                with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _exists(kind: str, keep: Path) -> bool:
    if kind == "sqlite":
        return keep.exists()
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        return (
            admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (keep.name,)).fetchone() is not None
        )


def post_job(
    client: httpx.Client,
    token: str,
    job: str,
    ranks: int,
    entries: int,
    *,
    hang: bool,
    batch_entries: int = 32_000,
) -> None:
    """Every rank's ring, whole rings of `batch_entries` entries at most a batch (a collector's push
    of a host's ranks)."""
    tpl = template()
    now = time.time_ns()
    base = now - (entries + 10) * 1_000_000
    per_batch = max(1, batch_entries // entries)
    for first in range(0, ranks, per_batch):
        snaps = []
        for r in range(first, min(ranks, first + per_batch)):
            if hang:
                es = rank_entries(tpl, r, 0, entries - 1, base)
                if r != CULPRIT:
                    es.append(stuck_entry(tpl, r, entries - 1, base))
            else:
                es = rank_entries(tpl, r, 0, entries, base)
            snaps.append(snapshot(job, r, ranks, es, now))
        post_batch(client, token, Batch(uuid.uuid4().hex, "bench-host", "bench", time.time_ns(), snaps))


def post_batch(client: httpx.Client, token: str, batch: Batch) -> None:
    """POST one batch as a collector does (gzip, bearer token, idempotency key), again after a
    429 / 503 once its Retry-After has passed, and after a dropped connection (a keep-alive
    connection the server closed as it was reused: the idempotency key makes a resend safe)."""
    body = gzip.compress(json.dumps(encode_batch(batch), separators=(",", ":")).encode(), compresslevel=1)
    dropped = 0
    while True:
        try:
            resp = client.post(
                "/api/v1/ingest",
                content=body,
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Encoding": "gzip",
                    "Content-Type": "application/json",
                    "Idempotency-Key": batch.batch_id,
                },
            )
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            dropped += 1
            if dropped > 3:
                raise
            print(f"  (resending a batch: {exc})", flush=True)
            continue
        if resp.status_code in (429, 503):
            time.sleep(float(resp.headers.get("Retry-After", "0.5")))
            continue
        resp.raise_for_status()
        return


def copy_job(url: str, job: str, names: list[str]) -> None:
    """Store copies of `job` under `names`: its job, rank, configuration, group and entry rows
    under new ids, received now (so the server sees recent, running jobs)."""
    from sqlalchemy import Table, insert, literal, select

    from flightdeck.server.db import connect
    from flightdeck.server.models import EntryRow, Job, ProcessGroup, Rank, RankConfigRow

    def sa_table(model: type) -> Table:
        table = model.__table__  # type: ignore[attr-defined]
        assert isinstance(table, Table)
        return table

    db = connect(url)
    try:
        with db.write() as session, session.begin():
            src = session.execute(select(Job).where(Job.name == job)).scalar_one()
            groups = (
                session.execute(select(ProcessGroup).where(ProcessGroup.job_id == src.id)).scalars().all()
            )
            now_ns = time.time_ns()
            for name in names:
                new = Job(
                    name=name,
                    attempt=src.attempt,
                    world_size=src.world_size,
                    first_seen_ns=src.first_seen_ns,
                    last_seen_ns=src.last_seen_ns,
                    status=src.status,
                )
                session.add(new)
                session.flush()
                for table in (sa_table(Rank), sa_table(RankConfigRow)):
                    cols = [c for c in table.columns if c.name != "job_id"]
                    fill = [literal(now_ns) if c.name == "received_ns" else c for c in cols]
                    session.execute(
                        insert(table).from_select(
                            ["job_id", *(c.name for c in cols)],
                            select(literal(new.id), *fill).where(table.c.job_id == src.id),
                        )
                    )
                for g in groups:
                    ng = ProcessGroup(job_id=new.id, name=g.name, desc=g.desc, ranks=g.ranks)
                    session.add(ng)
                    session.flush()
                    t = sa_table(EntryRow)
                    cols = [c for c in t.columns if c.name not in ("job_id", "group_id")]
                    session.execute(
                        insert(t).from_select(
                            ["job_id", "group_id", *(c.name for c in cols)],
                            select(literal(new.id), literal(ng.id), *cols).where(
                                t.c.job_id == src.id, t.c.group_id == g.id
                            ),
                        )
                    )
    finally:
        db.dispose()


def wait_hang(client: httpx.Client, job: str, timeout_s: float) -> dict[str, object]:
    """The hang finding of `job`, once the server has opened it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = client.get(f"/api/v1/jobs/{job}")
        if r.status_code == 200:
            for f in r.json().get("findings") or []:
                if f.get("kind") == "hang":
                    return dict(f)
        time.sleep(0.5)
    raise SystemExit(f"no hang finding for {job} within {timeout_s:.0f} s")


def timed(
    client: httpx.Client, url: str, repeat: int, headers: dict[str, str] | None = None, *, pid: int
) -> tuple[float, int, float]:
    """Median milliseconds of `repeat` GETs after one warm-up, the last status code, and the
    median server CPU milliseconds per GET (user + system of the server process: less sensitive
    than wall time to other work on a shared machine, though it counts the live diagnosis's
    periodic work that falls inside a request)."""
    client.get(url, headers=headers)
    times, cpus, status = [], [], 0
    for _ in range(repeat):
        c = cpu_s(pid)
        t = time.perf_counter()
        r = client.get(url, headers=headers)
        times.append((time.perf_counter() - t) * 1000)
        cpus.append((cpu_s(pid) - c) * 1000)
        status = r.status_code
        if status >= 400:
            raise SystemExit(f"GET {url}: {status} {r.text[:200]}")
    return statistics.median(times), status, statistics.median(cpus)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> None:
    """Build the jobs, time the pages, print the figures."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=1, help="jobs stored (the last one is the hang)")
    ap.add_argument("--copies", type=int, default=0, help="more jobs stored as SQL copies of the hung one")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--keep",
        type=Path,
        help="SQLite file (or PostgreSQL database name) to keep; a kept one is timed again as it is",
    )
    args = ap.parse_args(argv)
    reuse = args.keep is not None and _exists(args.db, args.keep)
    with database(args.db, args.keep) as url:
        token = make_token(url)
        server = start_server(url, {})
        try:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                t0 = time.monotonic()
                rss0 = rss_mib(server.pid)
                for i in range(0 if reuse else args.jobs):
                    last = i == args.jobs - 1
                    post_job(client, token, f"web-{i}", args.ranks, args.entries, hang=last)
                load_s = time.monotonic() - t0
                job = f"web-{args.jobs - 1}"
                finding = wait_hang(client, job, 300)
                seq = int(str(finding["collective_seq_id"]))
                if args.copies and not reuse:
                    copy_job(url, job, [f"web-copy-{i}" for i in range(args.copies)])
                wait_idle(server.pid)
                page = f"/jobs/{job}"
                live = {"HX-Request": "true", "HX-Target": "live"}
                rows: list[tuple[str, tuple[float, int, float]]] = [
                    ("incident page", timed(client, page, args.repeat, pid=server.pid)),
                    ("live fragment", timed(client, page, args.repeat, live, pid=server.pid)),
                    (
                        "timeline fragment",
                        timed(client, page, args.repeat, {**live, "HX-Target": "timeline"}, pid=server.pid),
                    ),
                    ("wall-time view", timed(client, page + "?view=time", args.repeat, pid=server.pid)),
                ]
                etag = client.get(page, headers=live).headers.get("ETag")
                if etag:
                    quiet = {**live, "If-None-Match": etag}
                    rows.append(
                        ("quiet live fragment", timed(client, page, args.repeat, quiet, pid=server.pid))
                    )
                cell = f"{page}/cell?group=0&seq={seq}&rank=3"
                rows.append(("cell detail", timed(client, cell, args.repeat, pid=server.pid)))
                tl = f"/api/v1/jobs/{job}/timeline?group=0&seq_from={seq - 20}&seq_to={seq}&limit=10000"
                rows.append(("JSON timeline, 21 seqs", timed(client, tl, args.repeat, pid=server.pid)))
                rows.append(
                    ("JSON verdict", timed(client, f"/api/v1/jobs/{job}", args.repeat, pid=server.pid))
                )
                rss = rss_mib(server.pid)
        finally:
            server.stop()
    load = Path("/proc/loadavg").read_text().split()[:3]
    if reuse:
        print(f"{args.db}, the jobs kept in {args.keep} (server restarted on them)")
    else:
        stored = args.jobs + args.copies
        print(f"{args.db}, {stored} job(s) of {args.ranks} ranks x {args.entries} collectives stored")
    print(f"  load average {' '.join(load)}; jobs posted in {load_s:.1f} s; hang seq {seq}")
    print(f"  {'':24} {'wall ms':>9} {'server CPU ms':>14}  status")
    for name, (ms, status, cpu) in rows:
        print(f"  {name:24} {ms:9.1f} {cpu:14.1f}  {status}")
    print(f"  server RSS {rss:.0f} MiB ({rss - rss0:+.0f} MiB since start)")


if __name__ == "__main__":
    main()
