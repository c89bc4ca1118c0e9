"""What `flightdeck analyze` imports before it reads: none of the modules that were most of its
serial start-up and that reading does not use (`multiprocessing`, `logging`, `statistics`), and
the straggler rule's median is `statistics.median`'s."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys

import pytest

from flightdeck.analysis.rules.stragglers import _median


def test_the_command_does_not_import_what_it_does_not_use() -> None:
    code = (
        "import sys, flightdeck.cli, flightdeck.analyze_cmd\n"
        "print(' '.join(m for m in ('multiprocessing', 'logging', 'statistics') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


@pytest.mark.parametrize("n", [1, 2, 3, 10, 255, 256])
def test_the_median_is_that_of_statistics(n: int) -> None:
    rng = random.Random(n)
    values = [rng.random() * rng.choice([1e-3, 1.0, 1e6]) for _ in range(n)]
    assert _median(iter(values)) == statistics.median(values)
    with pytest.raises(ValueError):
        _median([])
