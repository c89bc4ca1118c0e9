"""The launchers: whole Flightdeck stacks started on one machine, as child processes.

- `up`: `flightdeck up`, a server on SQLite and a local collector;
- `local_stack`: the child processes both commands start (server, collector, their token);
- `demo`: `flightdeck demo`, the same plus a small real gloo job with an injected fault.

It sits above the rest: it reaches into `flightdeck.server` (the token store) and
`flightdeck.collector` (its settings), and only the CLI (and tests, benchmarks) import it. This
file imports nothing: `python -m flightdeck.launch.demo.worker` runs inside the demo job's ranks.
"""
