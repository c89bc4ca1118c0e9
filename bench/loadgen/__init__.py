"""Load generator: N simulated ranks on H simulated hosts push to real `flightdeck server` processes.

It speaks the collector's protocol: one batch per host and snapshot interval (the document
`flightdeck.wire.encode_batch` writes, built column by column: tests/test_loadgen.py), gzip,
`Authorization: Bearer`, `Idempotency-Key` = the batch id, `Flightdeck-Batch-Age-Ms` = how long
it waited to be sent), each rank's
snapshot carrying only its new or changed entries (what `flightdeck/readers/delta.py` ships: a collective
is shipped when it appears, and again when it completes if it was in flight at the snapshot), one
request in flight per host, retried on 429/503 after `Retry-After` like `collector/pusher.py`.

With `--digests` the hosts speak the protocol of large jobs instead (`flightdeck.digest`, the
server's `POST /api/v1/digest`): per interval one digest request per host (the document
`encode_digests` writes of its ranks' entries, built column by column: tests/test_loadgen.py), gzip,
one request in flight per host; when the answer names the job, that snapshot's batch goes at once
by ingest, with each rank's new and changed entries and its open ones even if unchanged; else
nothing (the snapshot's changes are dropped), but the completion of each entry shipped open
earlier whose completion fell in a dropped snapshot goes with the next batch (as the collector
does; `--drop-completions` leaves them out). A round for a stall's evidence names its ranks: only
those ship. The report then gives the digests apart (requests/s
against the one per host and interval expected, latency, bytes, answers asking for entries) and
counts both request kinds in the wire bytes.

Each rank runs `--rate` collectives per second, round-robin over `--groups` kinds of process
groups (the world, per-host blocks, same-local-rank stripes, two-host blocks, ...). Faults, as many
as wanted, each `--fault KIND@SECONDS[:rank=R][:for=S]`: at the first world collective from that
moment rank R (5 unless given) stops before it (`hang`: every other rank waits in it) or enters it
with other sizes (`mismatch`); with `for=S` the collective completes S seconds later on every rank
and the job goes on (a stall that clears; `mismatch@T:for=0` is a silent one), else the job stops
there, so a fault after it is refused. The old single form, `--fault hang|mismatch|none
--fault-at S --fault-rank R`, still works. The generator polls `GET /api/v1/jobs/{job}/findings`
until each fault's finding appears, and at the end matches every finding episode to the fault
that explains it (its own finding, or one at its collective or naming its rank after it); the
others are `false_findings`.

Reports delivered entries/s, per-request and delivery latency percentiles, the delivery lag behind
the snapshot time, wire bytes per rank-second, each fault -> finding, false findings, server CPU
and RSS, the generator's own CPU, PostgreSQL backends' CPU and memory (PSS from /proc), the
database's size at the start and end (MiB per hour, extrapolated), machine CPU; and all of these
per `--window-s` window, to show how they move over the run. Traffic goes to 127.0.0.1 only.

    # spawn the servers on a fresh database (dropped afterwards) and run 60 s:
    python -m bench.loadgen --spawn postgresql --servers 1 --ranks 1024 --hosts 128 --duration 60
    # against running servers:
    python -m bench.loadgen --url http://127.0.0.1:8470 --token fdk_... --server-pid 1234 ...
    # issue #25's job: a silent mismatch at 60 s, a hang for good at 120 s, figures every 30 s:
    python -m bench.loadgen --spawn postgresql --ranks 16384 --hosts 2048 --groups 4
        --duration 150 --fault mismatch@60:rank=9000:for=0 --fault hang@120:rank=5 --window-s 30
    # the same job on progress digests, a hang 240 s in:
    python -m bench.loadgen --spawn postgresql --ranks 16384 --hosts 2048 --groups 4 --digests
        --duration 300 --fault hang@240:rank=5 --window-s 30

The modules: `job` (the simulated ranks, groups and faults, and each host's batch and digests),
`transport` (the HTTP senders), `findings` (which fault explains a finding), `stats` (what was
observed, the figures per window), `resources` (server, generator, PostgreSQL and machine from
/proc), `run` (the run and its report), `cli` (the command line and the spawned servers);
`python -m bench.loadgen` runs `cli.main`.
"""
