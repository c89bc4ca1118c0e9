"""`python -m bench.loadgen`: the load generator's command line (bench/loadgen/cli.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from bench.loadgen.cli import main

if __name__ == "__main__":
    main()
