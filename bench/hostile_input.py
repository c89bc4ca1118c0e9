"""A corpus of malformed and edge-case requests against a real `flightdeck server` over HTTP.

Starts the server on the given database, sends `--requests` requests drawn at random (seeded) from
`tests/support/hostile_corpus.py` over one keep-alive connection (mutated wire batches field by field,
raw garbage bodies, reads of every OpenAPI GET route and dashboard page with hostile parameters),
then lets the live diagnosis run over what was stored and prints: requests tried, answers by
status, 5xx, dropped connections, peak server RSS (VmHWM), and healthy entries lost (sent beside
the hostile parts in batches the server said it applied, missing from the database).

    python bench/hostile_input.py --database-url sqlite:////tmp/hostile.db --requests 2000
    python bench/hostile_input.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test --requests 2000

A PostgreSQL URL gets a fresh schema of its own (dropped at the end).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from tests.support.hostile_corpus import Choice, Corpus, Request, Tally, entries_lost, send, stored_entries
from tests.support.server_process import ServerProcess


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--settle-s", type=float, default=10.0, help="diagnosis time after the corpus")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    url = args.database_url or f"sqlite:///{tmp}/hostile.db"
    schema = None
    if url.startswith("postgresql"):
        import psycopg

        schema = f"hostile_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')  # a fresh hex name, not input
        url = f"{url}?options=-csearch_path%3D{schema}"
    env = {
        **os.environ,
        "FLIGHTDECK_SERVER_DATABASE_URL": url,
        "FLIGHTDECK_SERVER_ALLOW_UNAUTHENTICATED_INGEST": "true",
        "FLIGHTDECK_SERVER_MIGRATE": "true",  # a fresh PostgreSQL schema is migrated only when told
        "FLIGHTDECK_SERVER_DIAGNOSIS_INTERVAL_S": "1",
    }
    log = tmp / "server.log"
    server = ServerProcess(env, log)
    base = server.url
    try:
        try:
            server.start()
        except AssertionError as exc:
            raise SystemExit(
                f"the server did not come up:\n{log.read_text(errors='replace')[-3000:]}"
            ) from exc
        rng = random.Random(args.seed)
        tally = Tally()
        started = time.monotonic()
        with httpx.Client(base_url=base, timeout=60) as client:
            corpus = Corpus(time.time_ns(), openapi=client.get("/openapi.json").json())
            last: list[object] = [None]
            for _ in range(args.requests):
                c = Choice(*(rng.randrange(1_000_000) for _ in range(4)))
                send(client, corpus.request(c), tally, last)
            sent_s = time.monotonic() - started
            corpus_tried = tally.tried
            time.sleep(args.settle_s)  # the live diagnosis runs over everything stored
            last[0] = None  # idle past uvicorn's keep-alive timeout (5 s): a new connection is due
            # Every job's page and API answer once more, after the diagnosis.
            for j in client.get("/api/v1/jobs").json():
                for path in (f"/api/v1/jobs/{j['job']}", f"/jobs/{j['job']}"):
                    send(client, _get(path), tally, last)
        rss = _peak_rss_mb(server.pid)
        alive = server.proc is not None and server.proc.poll() is None
    finally:
        server.stop()

    try:
        lost = entries_lost(tally.healthy, lambda jobs: stored_entries(url, jobs))
    finally:
        if schema is not None:
            import psycopg

            with psycopg.connect(args.database_url.replace("+psycopg", ""), autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

    tracebacks = log.read_text(errors="replace").count("Traceback")
    print(f"database: {'postgresql' if schema else 'sqlite'}; seed {args.seed}; {sent_s:.0f} s")
    print(
        f"requests tried                {tally.tried:,} ({corpus_tried:,} of the corpus, then every job's API answer and page)"
    )
    print(f"answers by status             {dict(sorted(tally.by_status.items()))}")
    print(f"answers >= 500                {tally.five_xx}")
    print(f"dropped connections           {tally.dropped}")
    print(f"requests without an answer    {len(tally.no_answer)}")
    print(f"peak server RSS               {rss:,.0f} MiB")
    print(f"healthy entries sent          {sum(tally.healthy.values()):,} ({len(tally.healthy)} jobs)")
    print(f"healthy entries lost          {lost}")
    print(f"server alive at the end       {alive}; tracebacks in its log: {tracebacks}")
    for line in (tally.server_errors + tally.no_answer + tally.drops)[:10]:
        print("  ", line)


def _get(path: str) -> Request:
    return Request("GET", path, {})


if __name__ == "__main__":
    main()
