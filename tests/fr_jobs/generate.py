"""Regenerate the committed sample dumps: `python -m tests.fr_jobs.generate [--out DIR] [SCENARIO...]`.

For each scenario: run the real gloo job with the agent, copy the spool files unmodified into
`<out>/<scenario>/` (and PyTorch's own JSON dumps, which each rank writes on its way out, into
`pytorch_json/r<rank>.json`), write `scenario.json` (the definition, its expected verdict, and what
was observed), check the definition's seq counting against a healthy rank's dump, and store PyTorch's
own analyzer output (on raw copies and on copies whose pg_config was rebuilt from the sidecars) in
`torchfrtrace.txt`, with one line of what it concluded per input in scenario.json
(`torchfrtrace_verdict`).
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from flightdeck.readers.fr.decode import load_raw
from flightdeck.records import canonical_op
from tests.fr_jobs.dumps import latest_per_rank, load_dump, load_sidecar, rank_files
from tests.fr_jobs.runner import REPO_ROOT, JobResult, run_job
from tests.fr_jobs.scenarios import SCENARIOS, Scenario

DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "fr"
#: Where a scenario's PyTorch JSON dumps go inside its directory.
JSON_SUBDIR = "pytorch_json"
#: Fixed scratch path, so that the command recorded in torchfrtrace.txt does not change run to run.
FRTRACE_SCRATCH = Path("/tmp/flightdeck-frtrace")


def generate(scenario: Scenario, out: Path, *, attempts: int = 6) -> dict[str, Any]:
    """Run one scenario and write its directory; returns its scenario.json document.

    A healthy job dumped at exit shows gloo's asynchronous completion flag only when the race
    goes that way: such a scenario is run again (up to `attempts` times) until its last
    collective is finished on some ranks and pending on others in the pickles."""
    tries = 0
    while True:
        tries += 1
        doc = _generate_once(scenario, out)
        if scenario.dump_mode != "exit" or _mixed_exit(doc) or tries >= attempts:
            break
    doc["observed"]["attempts"] = tries
    (out / scenario.name / "scenario.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def _mixed_exit(doc: dict[str, Any]) -> bool:
    """Whether the default group's last collective is retired on some pickles and not others."""
    flags = {
        v["0"][1]
        for k, v in doc["observed"]["newest_seq_and_retired_per_group"].items()
        if k.startswith("pickle/")
    }
    return flags == {True, False}


def _generate_once(scenario: Scenario, out: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fd-spool-") as tmp:
        # PyTorch's first dump with stacks symbolizes them: seconds, minutes on a loaded machine.
        result = run_job(scenario, Path(tmp), deadline_s=45.0 if scenario.dump_mode == "agent" else 240.0)
        target = out / scenario.name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        if scenario.dump_mode != "agent":
            # Raw PyTorch dumps: pickle/comm_lib_trace_rank_<r> and json/comm_lib_trace_rank_<r>.json.
            for sub in ("pickle", "json"):
                if (result.spool / sub).is_dir():
                    shutil.copytree(result.spool / sub, target / sub)
            json_files: list[Path] = []
        else:
            for path in sorted(result.spool.glob("rank_*")):
                shutil.copy2(path, target / path.name)
            json_dir = Path(tmp) / f"{scenario.name}.json"
            json_files = sorted(json_dir.glob("r*.json")) if json_dir.is_dir() else []
            if json_files:
                # Named r<rank>.json so that analyzing the scenario directory does not merge them in.
                (target / JSON_SUBDIR).mkdir()
                for path in json_files:
                    shutil.copy2(path, target / JSON_SUBDIR / path.name)
    doc = scenario.to_json()
    if scenario.dump_mode != "agent":
        doc["observed"] = observed_raw(result, target)
        (target / "scenario.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        (target / "torchfrtrace.txt").write_text(run_torchfrtrace_raw(target / "pickle"))
        return doc
    if json_files:
        doc["json_dumps"] = (
            f"{JSON_SUBDIR}/r<rank>.json: PyTorch's _dump_fr_trace_json, written by each rank as it "
            "left (the moment of the agent's final snapshot)"
        )
    doc["observed"] = observed(result, target)
    problems = check_definition(scenario, target)
    if problems:
        doc["observed"]["definition_check"] = problems
    frtrace = run_torchfrtrace(scenario.name, target)
    doc["torchfrtrace_verdict"] = frtrace_verdict(frtrace)
    (target / "scenario.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    (target / "torchfrtrace.txt").write_text(frtrace)
    return doc


def _errors(msg: str) -> str:
    """'Culprit rank 0; Error type: X, why, Culprit rank 2; ...' -> 'X by ranks 0, 2 (why)'."""
    found = re.findall(r"Culprit rank (\d+); Error type: (\w+), (.*?)(?=, Culprit rank |$)", msg)
    if not found:
        return msg
    kinds: dict[tuple[str, str], list[str]] = {}
    for rank, kind, why in found:
        kinds.setdefault((kind, why), []).append(rank)
    return "; ".join(f"{k} by ranks {', '.join(sorted(rs))} ({why})" for (k, why), rs in kinds.items())


def frtrace_verdict(text: str) -> dict[str, str]:
    """One line per input of `run_torchfrtrace`'s output: what PyTorch's analyzer concluded."""
    out: dict[str, str] = {}
    for block in text.split("python -m torch.distributed.flight_recorder.fr_trace")[1:]:
        lines = block.splitlines()
        label = "raw" if "input: raw" in block else "repaired"
        if "Traceback (most recent call last)" in block:
            out[label] = "crashed: " + next((x for x in reversed(lines) if x.strip()), "").strip()
            continue
        said: list[str] = []
        group = ""
        for i, line in enumerate(lines):
            if line.startswith("group info:"):
                group = line.removeprefix("group info:").strip()
            if line.startswith("Not all ranks joining collective, sequence number:"):
                seq = line.rsplit(":", 1)[1].strip()
                missing = next((x for x in lines[i : i + 8] if x.startswith("missing ranks:")), "")
                where = next((x for x in lines[i : i + 4] if x.startswith("group info:")), "")
                said.append(f"seq {seq} {where.removeprefix('group info: ')} {missing}".strip())
            elif line.startswith("Collective sequence number:") and "has errors" in line:
                seq = line.split(":", 1)[1].split()[0]
                err = next((x for x in lines[i : i + 12] if x.startswith("error msg:")), "")
                where = next((x for x in lines[i : i + 4] if x.startswith("group info:")), group)
                said.append(
                    f"seq {seq} {where.removeprefix('group info: ')} {_errors(err.removeprefix('error msg: '))}"
                )
            elif "cannot decide" in line.lower() or "UNDECIDED" in line:
                said.append(line.strip())
        shown = "; ".join(said[:3]) + (f"; ... ({len(said)} in all)" if len(said) > 3 else "")
        out[label] = shown or "no finding"
    return out


def observed_raw(result: JobResult, directory: Path) -> dict[str, Any]:
    """What a raw-dump job did: exit codes, and per rank its newest entry per group in each form."""
    newest: dict[str, dict[str, list[Any]]] = {}
    for sub in ("pickle", "json"):
        for path in sorted((directory / sub).glob("comm_lib_trace_rank_*")):
            raw = load_raw(path.read_bytes())
            last: dict[str, list[Any]] = {}
            for e in raw.get("entries") or []:
                last[str(e["process_group"][0])] = [e["collective_seq_id"], bool(e["retired"])]
            newest[f"{sub}/{path.name}"] = dict(sorted(last.items()))
    return {
        "exit_codes": {str(r): c for r, c in sorted(result.returncodes.items())},
        "newest_seq_and_retired_per_group": newest,
    }


def run_torchfrtrace_raw(directory: Path) -> str:
    """PyTorch's analyzer on the raw pickles, as a user would run it."""
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", "-p", "comm_lib_trace_rank_"]
    cmd.append(str(directory))
    shown = " ".join(["python", *cmd[1:-1], directory.name])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=False)
    return f"{shown}\n# input: raw PyTorch pickles, no sidecars; exit code {proc.returncode}\n{proc.stdout}{proc.stderr}"


def observed(result: JobResult, directory: Path) -> dict[str, Any]:
    """What actually happened: exit codes, which snapshots each rank left, exceptions."""
    files = rank_files(directory)
    exceptions = {}
    for rank, paths in files.items():
        finals = [p for p in paths if p.name.endswith(".final.pkl")]
        if finals:
            exceptions[str(rank)] = load_sidecar(finals[0]).get("exception")
    return {
        "exit_codes": {str(r): c for r, c in sorted(result.returncodes.items())},
        "snapshots": {str(r): sorted(p.name for p in ps) for r, ps in sorted(files.items())},
        "exceptions": exceptions,
    }


def check_definition(scenario: Scenario, directory: Path) -> list[str]:
    """Cross-check the seq counting in `Scenario.expected` against the dumps of non-culprit ranks.

    This validates our own bookkeeping (one FR entry per program op), not a verdict.
    """
    exp = scenario.expected()
    if exp["collective_seq_id"] is None:
        return []
    # A rank that left its p2p send out does reach the next collective; the rank it stranded does not.
    absent = set(exp["blocked_ranks"]) if exp.get("blocked_ranks") else set(exp["culprit_ranks"])
    seen: list[str] = []
    for rank, paths in rank_files(directory).items():
        if rank in absent:
            continue
        for path in paths:
            for e in load_dump(path).get("entries", []):
                if (
                    e["process_group"][0] == exp["process_group"]
                    and e["collective_seq_id"] == exp["collective_seq_id"]
                ):
                    op = canonical_op(e["profiling_name"])
                    if op == exp["op"]:
                        return []
                    seen.append(f"rank {rank} {path.name}: {op}")
    return [f"no non-culprit dump has {exp['op']} at seq {exp['collective_seq_id']}; saw {seen or 'nothing'}"]


def run_torchfrtrace(name: str, directory: Path) -> str:
    """PyTorch's analyzer on the latest dump per rank: raw copies, then pg_config-repaired copies."""
    scratch = FRTRACE_SCRATCH / name
    shutil.rmtree(scratch, ignore_errors=True)
    raw_dir, fixed_dir = scratch / "raw", scratch / "repaired"
    raw_dir.mkdir(parents=True)
    fixed_dir.mkdir()
    latest = latest_per_rank(directory)
    groups: dict[str, dict[str, Any]] = {}
    for path in latest.values():
        groups.update(load_sidecar(path)["groups"])
    pg_config = {
        g: {"name": g, "desc": v["desc"], "ranks": str(v["ranks"])} for g, v in sorted(groups.items())
    }
    for rank, path in sorted(latest.items()):
        shutil.copyfile(path, raw_dir / f"rank_{rank}")
        dump = load_dump(path)
        dump["pg_config"] = pg_config
        (fixed_dir / f"rank_{rank}").write_bytes(pickle.dumps(dump))
    chosen = ", ".join(f"rank {r}: {p.name}" for r, p in sorted(latest.items()))
    parts = []
    for label, d in (
        ("raw gloo dumps", raw_dir),
        ("pg_config repaired from the sidecars' groups", fixed_dir),
    ):
        cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", "-p", "rank_", str(d)]
        shown = " ".join(["python", *cmd[1:]])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=False)
        parts.append(
            f"{shown}\n# input: {label}; latest dump per rank ({chosen}); exit code {proc.returncode}\n"
            f"{proc.stdout}{proc.stderr}"
        )
    shutil.rmtree(scratch, ignore_errors=True)
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Regenerate the chosen scenarios (all by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("scenarios", nargs="*", choices=[[], *SCENARIOS], metavar="SCENARIO")
    args = parser.parse_args(argv)
    names = args.scenarios or list(SCENARIOS)
    failed = 0
    for name in names:
        doc = generate(SCENARIOS[name], args.out)
        check = doc["observed"].get("definition_check")
        failed += bool(check)
        print(
            f"{name}: exit codes {doc['observed']['exit_codes']}"
            + (f"; DEFINITION CHECK: {check}" if check else "")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
