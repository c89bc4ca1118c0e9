"""Write the NCCL-shaped fixtures: `python -m tests.nccl_fixtures.generate [--out DIR] [CASE...]`.

For each case of `tests.nccl_fixtures.cases`: `<out>/<case>/pickle/comm_lib_trace_rank_<R>` (as
the watchdog, `_dump_nccl_trace` or `_dump_fr_trace_file` write them), the same dumps as JSON in
`<out>/<case>/json/comm_lib_trace_rank_<R>.json` (`_dump_nccl_trace_json`), and `scenario.json`
(the definition and its expected verdict). The output is byte-for-byte reproducible; a test checks
that the committed files are what this writes.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
from pathlib import Path

from tests.nccl_fixtures.cases import CASES, Case
from tests.nccl_fixtures.model import as_json, record

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "data" / "nccl"
PREFIX = "comm_lib_trace_rank_"


def write_case(case: Case, out: Path) -> Path:
    """Write one case's directory under `out`; returns it."""
    target = out / case.name
    shutil.rmtree(target, ignore_errors=True)
    (target / "pickle").mkdir(parents=True)
    (target / "json").mkdir()
    groups = case.all_groups()
    for rank, plan in sorted(case.plans.items()):
        if not plan.dumps:
            continue
        dump, dumped_ns = record(rank, plan, groups, backend=case.backend, timing=case.timing)
        pkl = target / "pickle" / f"{PREFIX}{rank}"
        # ProcessGroupNCCL's C++ pickler writes protocol 2.
        pkl.write_bytes(pickle.dumps(dump, protocol=2))
        js = target / "json" / f"{PREFIX}{rank}.json"
        js.write_text(json.dumps(as_json(dump)))
        for p in (pkl, js):
            os.utime(p, ns=(dumped_ns, dumped_ns))
    (target / "scenario.json").write_text(json.dumps(case.to_json(), indent=2, sort_keys=True) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    """Write the chosen cases (all by default)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("cases", nargs="*", choices=[[], *CASES], metavar="CASE")
    args = parser.parse_args(argv)
    for name in args.cases or list(CASES):
        print(write_case(CASES[name], args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
