"""Configuration and version skew across a job's ranks: config reports in, findings out.

Many hangs are set up before the first collective: one host on another torch or NCCL version, the
flight recorder off on some ranks, a subgroup left at the 30-minute default timeout while the job
set 60 s. Every rank's agent reports its configuration (`flightdeck.records.RankConfig`); this
module compares them. Pure: no files, clock, env or database.

Findings have kind `version_skew` or `config_skew`. `expected["setting"]` names what differs (it is
also part of the finding's identity in the server); `expected` holds the majority side and
`actual["sides"]` the others, each `{"value", "ranks", "hosts"}`; the culprits are the ranks off the
majority. Settings:

| kind | setting | when |
|---|---|---|
| version_skew | torch_version, torch_git_version, cuda_version, nccl_version, python_version | ranks of one job differ |
| version_skew | python_floor | a rank runs torch >= 2.15 on Python < 3.11 (see `KNOWN_INCOMPATIBLE`) |
| version_skew | checkpoint_compat | this job and another share a checkpoint dir across torch 2.14 / 2.15 |
| config_skew | fr_disabled | the flight-recorder ring is 0 (recording off) on some ranks |
| config_skew | fr_buffer_size | ring sizes differ between ranks |
| config_skew | fr_buffer_bytes | a ring size that looks like bytes, not entries |
| config_skew | timeout_ms (per group) | the group's timeout differs between its member ranks |
| config_skew | timeout_vs_job (per group) | the group's timeout is far from the default group's |
| config_skew | dump_on_timeout | NCCL's dump-on-timeout is off on some ranks |
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from flightdeck.analysis.findings import Finding, FindingKind, RankRef
from flightdeck.records import RankConfig

#: Settings compared for equality across a job's ranks, all of kind `version_skew`.
VERSION_SETTINGS = ("torch_version", "torch_git_version", "cuda_version", "nccl_version", "python_version")
#: A ring at least this large looks like bytes (1 MiB), not entries; so does one of at least
#: `BYTES_MIN_ALIGNED` that is a whole number of KiB (a vendor guide's "64K" buffer).
BYTES_LIKE_ENTRIES = 1 << 20
BYTES_MIN_ALIGNED = 1 << 16
#: A group timeout at least this many times off the default group's (either way) is "far".
TIMEOUT_FAR_FACTOR = 4.0
#: The default group's name (`process_group[0]`), whose timeout is the job's.
DEFAULT_GROUP = "0"

_LABELS = {
    "torch_version": "The torch version",
    "torch_git_version": "The torch build (git commit)",
    "cuda_version": "The CUDA version torch was built with",
    "nccl_version": "The NCCL version",
    "python_version": "The Python version",
}
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)")


@dataclass(frozen=True, slots=True)
class RankConfigRef:
    """One rank's configuration report with where the rank runs."""

    rank: int
    host: str | None
    config: RankConfig


@dataclass(frozen=True, slots=True)
class PeerJob:
    """Another job the server knows, as far as cross-job rules need it."""

    job: str
    torch_versions: tuple[str, ...]
    checkpoint_dir: str


@dataclass(frozen=True, slots=True)
class Incompatibility:
    """A known-incompatible combination on one rank."""

    setting: str
    #: Whether the rank's config is affected.
    applies: Callable[[RankConfig], bool]
    #: One sentence saying why this breaks (ends with a period).
    why: str


def version_tuple(v: str | None) -> tuple[int, int] | None:
    """(major, minor) of "2.15.0+cu126" / "3.10.14", or None when it does not parse."""
    m = _VERSION_RE.match(v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _torch_215_old_python(c: RankConfig) -> bool:
    t, p = version_tuple(c.torch_version), version_tuple(c.python_version)
    return t is not None and p is not None and t >= (2, 15) and p < (3, 11)


#: Combinations known not to work, per rank. Extend with care: each entry must be a documented
#: fact about a release, not a preference.
KNOWN_INCOMPATIBLE: tuple[Incompatibility, ...] = (
    Incompatibility(
        "python_floor",
        _torch_215_old_python,
        "torch 2.15 wheels require Python >= 3.11.",
    ),
)
#: Distributed checkpoints written by torch >= 2.15 carry stride metadata torch <= 2.14 cannot parse.
CHECKPOINT_WRITER_MIN = (2, 15)


def config_findings(ranks: Sequence[RankConfigRef], *, peers: Sequence[PeerJob] = ()) -> list[Finding]:
    """Findings of configuration and version skew among one job's ranks (those with a report),
    and against `peers` (other jobs) for the cross-job checkpoint rule."""
    by_rank = {r.rank: r for r in sorted(ranks, key=lambda r: r.rank)}
    refs = list(by_rank.values())
    if not refs:
        return []
    out: list[Finding] = []
    for setting in VERSION_SETTINGS:
        if setting == "torch_git_version" and len(_sides(refs, lambda c: c.torch_version)) > 1:
            continue  # different torch versions have different commits: one finding says it
        f = _skew("version_skew", setting, refs, operator.attrgetter(setting), label=_LABELS[setting])
        if f is not None:
            out.append(f)
    for inc in KNOWN_INCOMPATIBLE:
        bad = [r for r in refs if inc.applies(r.config)]
        if bad:
            out.append(_per_rank("version_skew", inc.setting, refs, bad, inc.why, _versions_of))
    out.extend(_checkpoint(refs, peers))
    out.extend(_fr(refs))
    out.extend(_timeouts(refs))
    off = [r for r in refs if r.config.dump_on_timeout is False]
    if off:
        out.append(
            _per_rank(
                "config_skew",
                "dump_on_timeout",
                refs,
                off,
                "NCCL will not dump its flight recorder when its watchdog times out "
                "(TORCH_NCCL_DUMP_ON_TIMEOUT / TORCH_FR_DUMP_ON_TIMEOUT is off); a hang there leaves "
                "only the agent's snapshots.",
                lambda c: _onoff(c.dump_on_timeout),
            )
        )
    return out


# --- sides ---------------------------------------------------------------------------------------


def _sides(
    refs: Sequence[RankConfigRef], value: Callable[[RankConfig], object]
) -> dict[str, list[RankConfigRef]]:
    """value (as text) -> the ranks with it; ranks whose value is unknown (None) are left out."""
    sides: dict[str, list[RankConfigRef]] = {}
    for r in refs:
        v = value(r.config)
        if v is not None:
            sides.setdefault(str(v), []).append(r)
    return sides


def _side(value: str, members: Sequence[RankConfigRef]) -> dict[str, object]:
    return {
        "value": value,
        "ranks": [r.rank for r in members],
        "hosts": sorted({r.host for r in members if r.host}),
    }


def _fmt(members: Sequence[RankConfigRef], limit: int = 8) -> str:
    ranks = [r.rank for r in members]
    hosts = sorted({r.host for r in members if r.host})
    shown = ", ".join(str(r) for r in ranks[:limit]) + (
        f" (+{len(ranks) - limit} more)" if len(ranks) > limit else ""
    )
    more = f" +{len(hosts) - 4} more" if len(hosts) > 4 else ""
    where = f" ({'host' if len(hosts) == 1 else 'hosts'} {', '.join(hosts[:4])}{more})" if hosts else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + shown + where


def _finding(
    kind: FindingKind,
    setting: str,
    majority: tuple[str, list[RankConfigRef]] | None,
    others: Sequence[tuple[str, list[RankConfigRef]]],
    detail: str,
    group: str | None = None,
    group_desc: str = "",
) -> Finding:
    culprits = sorted((r for _, members in others for r in members), key=lambda r: r.rank)
    return Finding(
        kind=kind,
        detail=detail,
        process_group=group,
        process_group_desc=group_desc,
        culprit_ranks=[r.rank for r in culprits],
        culprits=[RankRef(r.rank, r.host, None) for r in culprits],
        expected=None if majority is None else {"setting": setting, **_side(*majority)},
        actual={"setting": setting, "sides": [_side(v, m) for v, m in others]},
    )


def _split(
    sides: dict[str, list[RankConfigRef]],
) -> tuple[tuple[str, list[RankConfigRef]] | None, list[tuple[str, list[RankConfigRef]]]]:
    """(the majority side, the other sides by size); no majority when the largest sides tie."""
    ordered = sorted(sides.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if len(ordered) > 1 and len(ordered[0][1]) == len(ordered[1][1]):
        return None, ordered
    return ordered[0], ordered[1:]


def _skew(
    kind: FindingKind,
    setting: str,
    refs: Sequence[RankConfigRef],
    value: Callable[[RankConfig], object],
    *,
    group: str | None = None,
    group_desc: str = "",
    label: str | None = None,
) -> Finding | None:
    """A finding when the ranks that report `value` do not all agree."""
    sides = _sides(refs, value)
    if len(sides) < 2:
        return None
    majority, others = _split(sides)
    parts = [f"{v} on {_fmt(m)}" for v, m in ([majority] if majority else []) + list(others)]
    what = label or setting
    detail = f"{what} differs across the job's ranks: " + "; ".join(parts) + "."
    if majority is None:
        detail += " No value is held by a majority."
    return _finding(kind, setting, majority, others, detail, group, group_desc)


def _per_rank(
    kind: FindingKind,
    setting: str,
    refs: Sequence[RankConfigRef],
    bad: Sequence[RankConfigRef],
    why: str,
    value: Callable[[RankConfig], object],
) -> Finding:
    """A finding about some ranks' own configuration (the rest, if any, are the good side)."""
    bad_ranks = {r.rank for r in bad}
    good = [r for r in refs if r.rank not in bad_ranks]
    bad_sides = _sides(bad, value)
    good_sides = _sides(good, value)
    majority = max(good_sides.items(), key=lambda kv: (len(kv[1]), kv[0])) if good_sides else None
    others = sorted(bad_sides.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    who = "; ".join(f"{v} on {_fmt(m)}" for v, m in others)
    return _finding(kind, setting, majority, others, f"{who}: {why}")


def _versions_of(c: RankConfig) -> str:
    return f"torch {c.torch_version or '?'} / Python {c.python_version or '?'}"


def _onoff(v: bool | None) -> str:
    return "unknown" if v is None else ("on" if v else "off")


# --- cross-job: distributed checkpoints ---------------------------------------------------------


def _checkpoint(refs: Sequence[RankConfigRef], peers: Sequence[PeerJob]) -> list[Finding]:
    """Jobs sharing a checkpoint dir across the 2.14 / 2.15 boundary: the older one cannot read what
    the newer one writes. Reported on both jobs, naming the other."""
    out: list[Finding] = []
    dirs = sorted({r.config.checkpoint_dir for r in refs if r.config.checkpoint_dir})
    for d in dirs:
        mine = [r for r in refs if r.config.checkpoint_dir == d and version_tuple(r.config.torch_version)]
        if not mine:
            continue
        new_here = [
            r for r in mine if (version_tuple(r.config.torch_version) or (0, 0)) >= CHECKPOINT_WRITER_MIN
        ]
        old_here = [
            r for r in mine if (version_tuple(r.config.torch_version) or (0, 0)) < CHECKPOINT_WRITER_MIN
        ]
        for p in sorted((p for p in peers if p.checkpoint_dir == d), key=lambda p: p.job):
            vs = [v for v in p.torch_versions if version_tuple(v)]
            peer_new = sorted(v for v in vs if (version_tuple(v) or (0, 0)) >= CHECKPOINT_WRITER_MIN)
            peer_old = sorted(v for v in vs if (version_tuple(v) or (0, 0)) < CHECKPOINT_WRITER_MIN)
            if old_here and peer_new:
                bad, theirs, why = (
                    old_here,
                    peer_new,
                    (
                        f"job {p.job} writes distributed checkpoints to {d} with torch {', '.join(peer_new)}; "
                        "torch <= 2.14 cannot parse their stride metadata."
                    ),
                )
            elif new_here and peer_old:
                bad, theirs, why = (
                    new_here,
                    peer_old,
                    (
                        f"job {p.job} reads distributed checkpoints from {d} with torch {', '.join(peer_old)}, "
                        "which cannot parse the stride metadata torch >= 2.15 writes."
                    ),
                )
            else:
                continue
            f = _per_rank(
                "version_skew",
                "checkpoint_compat",
                refs,
                bad,
                why,
                lambda c: f"torch {c.torch_version or '?'}",
            )
            assert f.actual is not None
            f.actual["peer_job"] = p.job
            f.actual["peer_torch_versions"] = theirs
            f.actual["checkpoint_dir"] = d
            out.append(f)
    return out


# --- flight recorder -----------------------------------------------------------------------------


def looks_like_bytes(size: int) -> bool:
    """Whether a ring size in entries looks like a byte count (see BYTES_LIKE_ENTRIES)."""
    return size >= BYTES_LIKE_ENTRIES or (size >= BYTES_MIN_ALIGNED and size % 1024 == 0)


def _fr_value(c: RankConfig) -> str | None:
    if c.fr_buffer_size is None:
        return None
    return f"{c.fr_buffer_size} ({c.fr_buffer_size_var or 'default'})"


def _fr(refs: Sequence[RankConfigRef]) -> list[Finding]:
    out: list[Finding] = []
    off = [r for r in refs if r.config.fr_buffer_size == 0]
    if off:
        every = len(off) == len(refs)
        out.append(
            _per_rank(
                "config_skew",
                "fr_disabled",
                refs,
                off,
                "the flight recorder is off (ring size 0): "
                + (
                    "no rank records collectives, so hangs cannot be diagnosed."
                    if every
                    else "these ranks record no collectives, so a hang they cause cannot be traced to them."
                ),
                _fr_value_text,
            )
        )
    on = [r for r in refs if r.config.fr_buffer_size]
    f = _skew(
        "config_skew",
        "fr_buffer_size",
        on,
        lambda c: c.fr_buffer_size,
        label="The flight-recorder ring size (TORCH_FR_BUFFER_SIZE, entries)",
    )
    if f is not None:
        f.detail += (
            " Ranks with a smaller ring lose history first; after a long hang they cannot be compared."
        )
        out.append(f)
    big = [r for r in on if looks_like_bytes(r.config.fr_buffer_size or 0)]
    if big:
        out.append(
            _per_rank(
                "config_skew",
                "fr_buffer_bytes",
                refs,
                big,
                "TORCH_FR_BUFFER_SIZE counts entries, not bytes; this looks like a byte count, so each "
                "rank keeps that many entries in memory and every dump is that much larger.",
                _fr_value_text,
            )
        )
    return out


def _fr_value_text(c: RankConfig) -> str:
    return _fr_value(c) or "unknown"


# --- group timeouts ------------------------------------------------------------------------------


def _timeouts(refs: Sequence[RankConfigRef]) -> list[Finding]:
    out: list[Finding] = []
    names = sorted({g.name for r in refs for g in r.config.groups}, key=_group_key)
    per_group: dict[str, dict[int, int]] = {}
    descs: dict[str, str] = {}
    for name in names:
        timeouts: dict[int, int] = {}
        for r in refs:
            g = next((g for g in r.config.groups if g.name == name), None)
            if g is not None and g.timeout_ms is not None:
                timeouts[r.rank] = g.timeout_ms
                descs.setdefault(name, g.desc)
        per_group[name] = timeouts
    for name in names:
        timeouts = per_group[name]
        members = [r for r in refs if r.rank in timeouts]
        f = _skew(
            "config_skew",
            "timeout_ms",
            members,
            _timeout_text(name),
            group=name,
            group_desc=descs.get(name, ""),
            label=f"The timeout of group {name}" + (f" ({descs[name]})" if descs.get(name) else ""),
        )
        if f is not None:
            f.detail += " Ranks with the shorter timeout give up first and the others hang on them."
            out.append(f)
    job = _job_timeout(per_group.get(DEFAULT_GROUP, {}))
    if job is None:
        return out
    for name in names:
        if name == DEFAULT_GROUP:
            continue
        far = [
            r
            for r in refs
            if r.rank in per_group[name]
            and max(per_group[name][r.rank], job)
            >= TIMEOUT_FAR_FACTOR * max(1, min(per_group[name][r.rank], job))
        ]
        if not far:
            continue
        label = f"group {name}" + (f" ({descs[name]})" if descs.get(name) else "")
        f = _per_rank(
            "config_skew",
            "timeout_vs_job",
            refs,
            far,
            f"the timeout of {label} is far from the job's ({_ms(job)} on the default group); "
            "new_group does not inherit init_process_group's timeout (default 30 min), so a hang in this "
            "group is noticed at a very different time than elsewhere.",
            _timeout_text(name),
        )
        f.process_group = name
        f.process_group_desc = descs.get(name, "")
        out.append(f)
    return out


def _timeout_text(group: str) -> Callable[[RankConfig], str | None]:
    """The group's timeout on a rank, as text; None when the rank is not a member (left out)."""

    def text(c: RankConfig) -> str | None:
        ms = _timeout_of(c, group)
        return None if ms is None else _ms(ms)

    return text


def _timeout_of(c: RankConfig, group: str) -> int | None:
    return next((g.timeout_ms for g in c.groups if g.name == group), None)


def _job_timeout(timeouts: Mapping[int, int]) -> int | None:
    """The default group's most common timeout (the job's), or None when unknown."""
    if not timeouts:
        return None
    counts: dict[int, int] = {}
    for t in timeouts.values():
        counts[t] = counts.get(t, 0) + 1
    return max(counts.items(), key=lambda kv: (kv[1], -kv[0]))[0]


def _ms(ms: int | None) -> str:
    if ms is None:
        return "unknown"
    return f"{ms / 1000:g} s" if ms < 120_000 else f"{ms / 60_000:g} min"


def _group_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)
