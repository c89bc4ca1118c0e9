"""Real multi-process gloo jobs that produce flight-recorder dumps through the Flightdeck agent.

`scenarios` defines the programs (which rank does what at which collective) and derives the
expected verdict from that definition; `worker` is one rank of such a job; `runner` starts the
ranks; `generate` writes the committed sample dumps under `tests/data/fr/`.
"""
