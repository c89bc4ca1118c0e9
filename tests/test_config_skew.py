"""Configuration and version skew rules (flightdeck.analysis.config_skew) on plain records, the
config report's codecs (sidecar / wire), and the agent's report helpers (env filter, redaction,
FR settings, the test-only version override)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from flightdeck.agent.config_report import fr_settings, looks_secret, reported_env, static_versions
from flightdeck.analysis import Options, diagnose
from flightdeck.analysis.config_skew import PeerJob, RankConfigRef, config_findings, looks_like_bytes
from flightdeck.analysis.findings import Finding, finding_key
from flightdeck.analysis.summary import RankSummary
from flightdeck.records import GroupConfig, RankConfig, config_from_dict, config_to_dict
from flightdeck.wire import Batch, Snapshot, decode_batch, encode_batch

BASE = RankConfig(
    torch_version="2.14.1",
    torch_git_version="abc123",
    cuda_version="12.6",
    nccl_version="2.21.5",
    python_version="3.11.9",
    fr_buffer_size=2000,
    dump_on_timeout=True,
    groups=(GroupConfig("0", "default_pg", "cuda:nccl", 60_000), GroupConfig("1", "tp", "cuda:nccl", 60_000)),
    env=(("NCCL_DEBUG", "WARN"),),
)


def job(*configs: RankConfig, hosts: tuple[str, ...] = ("a", "a", "b", "b")) -> list[RankConfigRef]:
    """Ranks 0..n-1 with these configs, two ranks per host."""
    return [RankConfigRef(r, hosts[r % len(hosts)], c) for r, c in enumerate(configs)]


def by_setting(findings: list[Finding]) -> dict[str, Finding]:
    out: dict[str, Finding] = {}
    for f in findings:
        setting = str((f.expected or f.actual or {})["setting"])
        key = f"{setting}@{f.process_group}" if f.process_group else setting
        assert key not in out
        out[key] = f
    return out


def test_uniform_job_has_no_finding() -> None:
    assert config_findings(job(BASE, BASE, BASE, BASE)) == []
    assert config_findings([]) == []


def test_ranks_without_a_value_are_left_out() -> None:
    unknown = replace(BASE, nccl_version=None, cuda_version=None, fr_buffer_size=None, dump_on_timeout=None)
    assert config_findings(job(BASE, unknown, BASE, BASE)) == []


@pytest.mark.parametrize(
    ("setting", "other"),
    [
        ("torch_version", "2.15.0"),
        ("nccl_version", "2.26.2"),
        ("python_version", "3.12.1"),
        ("cuda_version", "12.8"),
        ("torch_git_version", "def456"),
    ],
)
def test_version_skew_names_both_sides_with_hosts(setting: str, other: str) -> None:
    odd = config_from_dict({**config_to_dict(BASE), setting: other})
    found = by_setting(config_findings(job(BASE, BASE, odd, BASE)))
    f = found[setting]
    assert f.kind == "version_skew"
    assert f.culprit_ranks == [2] and [(c.rank, c.host) for c in f.culprits] == [(2, "b")]
    assert f.expected == {
        "setting": setting,
        "value": getattr(BASE, setting),
        "ranks": [0, 1, 3],
        "hosts": ["a", "b"],
    }
    assert f.actual == {"setting": setting, "sides": [{"value": other, "ranks": [2], "hosts": ["b"]}]}
    assert other in f.detail and "rank 2 (host b)" in f.detail


def test_git_commit_skew_is_not_repeated_beside_a_version_skew() -> None:
    odd = replace(BASE, torch_version="2.15.0", torch_git_version="fff")
    assert set(by_setting(config_findings(job(BASE, BASE, odd, BASE)))) == {"torch_version"}


def test_a_tie_has_no_majority_and_names_everyone() -> None:
    odd = replace(BASE, nccl_version="2.26.2")
    f = by_setting(config_findings(job(BASE, BASE, odd, odd)))["nccl_version"]
    assert f.expected is None and f.culprit_ranks == [0, 1, 2, 3]
    assert "No value is held by a majority" in f.detail


def test_torch_215_on_python_310_is_a_known_incompatibility() -> None:
    bad = replace(BASE, torch_version="2.15.0+cu126", python_version="3.10.14")
    found = by_setting(config_findings(job(bad, bad, bad, bad)))
    assert set(found) == {"python_floor"}  # uniform, but never works
    f = found["python_floor"]
    assert f.kind == "version_skew" and f.culprit_ranks == [0, 1, 2, 3] and f.expected is None
    assert "Python >= 3.11" in f.detail
    ok = replace(BASE, torch_version="2.15.0", python_version="3.11.2")
    assert config_findings(job(ok, ok)) == []
    old = replace(BASE, torch_version="2.14.1", python_version="3.10.14")
    assert config_findings(job(old, old)) == []


def test_fr_disabled_on_some_and_on_all_ranks() -> None:
    off = replace(BASE, fr_buffer_size=0, fr_buffer_size_var="TORCH_FR_BUFFER_SIZE")
    f = by_setting(config_findings(job(BASE, off, BASE, BASE)))["fr_disabled"]
    assert f.kind == "config_skew" and f.culprit_ranks == [1]
    assert f.actual == {
        "setting": "fr_disabled",
        "sides": [{"value": "0 (TORCH_FR_BUFFER_SIZE)", "ranks": [1], "hosts": ["a"]}],
    }
    assert f.expected is not None and f.expected["ranks"] == [0, 2, 3]
    every = by_setting(config_findings(job(off, off)))
    assert set(every) == {"fr_disabled"} and "no rank records" in every["fr_disabled"].detail


def test_fr_sized_differently_and_in_bytes() -> None:
    small = replace(BASE, fr_buffer_size=500, fr_buffer_size_var="TORCH_NCCL_TRACE_BUFFER_SIZE")
    found = by_setting(config_findings(job(BASE, BASE, small, BASE)))
    assert set(found) == {"fr_buffer_size"} and found["fr_buffer_size"].culprit_ranks == [2]
    in_bytes = replace(BASE, fr_buffer_size=64 * 1024 * 1024)
    found = by_setting(config_findings(job(in_bytes, in_bytes)))
    assert set(found) == {"fr_buffer_bytes"} and found["fr_buffer_bytes"].culprit_ranks == [0, 1]
    assert looks_like_bytes(1 << 20) and looks_like_bytes(65536) and looks_like_bytes(131072)
    assert not looks_like_bytes(2000) and not looks_like_bytes(20000) and not looks_like_bytes(100_000)


def test_group_timeout_differs_between_ranks() -> None:
    odd = replace(BASE, groups=(BASE.groups[0], GroupConfig("1", "tp", "cuda:nccl", 120_000)))
    found = by_setting(config_findings(job(BASE, odd, BASE, BASE)))
    assert set(found) == {"timeout_ms@1"}  # 2 min is within the factor of the job's 1 min
    f = found["timeout_ms@1"]
    assert (f.process_group, f.process_group_desc, f.culprit_ranks) == ("1", "tp", [1])
    assert f.expected is not None and f.expected["value"] == "60 s"
    assert f.actual is not None and f.actual["sides"][0]["value"] == "2 min"


def test_subgroup_left_at_the_30_minute_default() -> None:
    default = tuple(replace(g, timeout_ms=1_800_000) if g.name == "1" else g for g in BASE.groups)
    c = replace(BASE, groups=default)
    found = by_setting(config_findings(job(c, c, c, c)))
    assert set(found) == {"timeout_vs_job@1"}
    f = found["timeout_vs_job@1"]
    assert f.culprit_ranks == [0, 1, 2, 3] and f.process_group == "1"
    assert "30 min" in f.detail and "60 s" in f.detail


def test_members_only_compare_their_own_groups() -> None:
    # Rank 2 is not in group 1 (it does not report it): no skew, and it is on no side.
    c2 = replace(BASE, groups=BASE.groups[:1])
    assert config_findings(job(BASE, BASE, c2, BASE)) == []


def test_dump_on_timeout_off() -> None:
    off = replace(BASE, dump_on_timeout=False)
    found = by_setting(config_findings(job(BASE, BASE, BASE, off)))
    assert set(found) == {"dump_on_timeout"}
    f = found["dump_on_timeout"]
    assert f.culprit_ranks == [3] and f.expected is not None and f.expected["value"] == "on"


def test_checkpoints_shared_across_214_and_215() -> None:
    reader = replace(BASE, torch_version="2.14.1", checkpoint_dir="/ckpt/a")
    writer = PeerJob("trainer", ("2.15.0",), "/ckpt/a")
    f = by_setting(config_findings(job(reader, reader), peers=[writer]))["checkpoint_compat"]
    assert f.kind == "version_skew" and f.culprit_ranks == [0, 1]
    assert (
        f.actual is not None and f.actual["peer_job"] == "trainer" and f.actual["checkpoint_dir"] == "/ckpt/a"
    )
    assert "cannot parse" in f.detail
    new = replace(reader, torch_version="2.15.0")
    f = by_setting(config_findings(job(new), peers=[PeerJob("eval", ("2.14.1",), "/ckpt/a")]))[
        "checkpoint_compat"
    ]
    assert f.actual is not None and f.actual["peer_job"] == "eval"
    # Same side of the boundary, or another directory: nothing.
    assert config_findings(job(reader), peers=[PeerJob("x", ("2.13.0",), "/ckpt/a")]) == []
    assert config_findings(job(reader), peers=[PeerJob("x", ("2.15.0",), "/ckpt/b")]) == []
    assert config_findings(job(BASE), peers=[writer]) == []  # this job declares no checkpoint dir


def test_finding_identity_is_kind_setting_and_group() -> None:
    odd = replace(
        BASE,
        torch_version="2.15.0",
        dump_on_timeout=False,
        groups=(BASE.groups[0], GroupConfig("1", "tp", "cuda:nccl", 1_800_000)),
    )
    findings = config_findings(job(BASE, BASE, BASE, odd))
    keys = [finding_key(f) for f in findings]
    assert len(set(keys)) == len(keys) == 4
    assert ("version_skew", "torch_version", -1, -1) in keys
    assert ("config_skew", "timeout_ms@1", -1, -1) in keys
    # Other culprits later (another rank drifts): the same identity, so the finding is updated.
    later = config_findings(job(BASE, replace(BASE, torch_version="2.15.0"), BASE, odd))
    assert ("version_skew", "torch_version", -1, -1) in {finding_key(f) for f in later}


def test_diagnose_appends_config_findings_after_the_rest() -> None:
    summaries = [
        RankSummary(rank=r, source="t", host="h", config=c)
        for r, c in enumerate([BASE, replace(BASE, nccl_version="2.26.2")])
    ]
    report = diagnose(summaries, now_ns=0, options=Options())
    kinds = [f.kind for f in report.findings]
    assert kinds[-1] == "version_skew" and kinds[0] == "undecided"  # no entries at all: undecided stays
    assert report.to_json()["findings"][-1]["expected"] is None  # 1 vs 1: no majority


# --- codecs --------------------------------------------------------------------------------------


def test_config_round_trips_through_dict_and_wire() -> None:
    c = replace(BASE, checkpoint_dir="/ckpt", simulated=True, fr_buffer_size_var="TORCH_FR_BUFFER_SIZE")
    assert config_from_dict(json.loads(json.dumps(config_to_dict(c)))) == c
    snap = Snapshot(job="j", attempt=0, rank=1, snapshot_time_ns=1, config=c)
    batch = decode_batch(json.loads(json.dumps(encode_batch(Batch("b", "h", "v", 1, [snap])))))
    assert batch.snapshots[0].config == c
    bare = decode_batch(encode_batch(Batch("b", "h", "v", 1, [replace(snap, config=None)])))
    assert bare.snapshots[0].config is None


def test_config_reader_is_lenient_and_bounded() -> None:
    c = config_from_dict(
        {
            "torch_version": 7,
            "fr_buffer_size": True,
            "dump_on_timeout": "no",
            "groups": {"0": {"timeout_ms": "60000", "backend": "gloo"}, "1": "junk"},
            "env": {"TORCH_X": "1", "HOME": "/root", "NCCL_Y": 3, "TORCH_LONG": "x" * 5000},
            "python_version": "3.11.1",
        }
    )
    assert c.torch_version is None and c.fr_buffer_size is None and c.dump_on_timeout is None
    assert c.groups == (GroupConfig("0", "", "gloo", None),)
    assert dict(c.env) == {"TORCH_X": "1", "TORCH_LONG": "x" * 512}
    assert c.python_version == "3.11.1"
    with pytest.raises(ValueError, match="expected an object"):
        config_from_dict([])


# --- the agent's report helpers ------------------------------------------------------------------


def test_reported_env_keeps_torch_and_nccl_only_and_redacts_secrets() -> None:
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TORCH_HUB_TOKEN": "short",
        "NCCL_API_KEY": "k",
        "TORCH_DB_PASSWORD": "p",
        "TORCH_CREDENTIALS_FILE": "/etc/creds",
        "TORCH_SOMETHING": "hf_Zx8Qm2Lr7Tb4Wn9Kc3Vy6Pd1Gs5Jh0Af",
        "TORCH_FR_DUMP_TEMP_FILE": "/very/long/path/to/the/dump/prefix_rank_",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "x",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    out = reported_env(env)
    assert out == {
        "NCCL_API_KEY": "<redacted>",
        "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TORCH_CREDENTIALS_FILE": "<redacted>",
        "TORCH_DB_PASSWORD": "<redacted>",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": "/very/long/path/to/the/dump/prefix_rank_",
        "TORCH_HUB_TOKEN": "<redacted>",
        "TORCH_SOMETHING": "<redacted>",
    }
    assert looks_secret("ghp_16C7e42F292c6912E7710c838347Ae178B4a")
    assert not looks_secret("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")  # long but no entropy
    assert not looks_secret("1234567890123456789012345")  # a number


def test_fr_settings_follow_torchs_variables_and_defaults() -> None:
    assert fr_settings({}) == {"fr_buffer_size": 2000, "fr_buffer_size_var": None, "dump_on_timeout": True}
    assert fr_settings({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"})["fr_buffer_size"] == 100
    both = {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}
    assert fr_settings(both)["fr_buffer_size_var"] == "TORCH_FR_BUFFER_SIZE"  # the new name wins
    assert fr_settings({"TORCH_FR_BUFFER_SIZE": "lots"})["fr_buffer_size"] is None
    assert fr_settings({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"})["dump_on_timeout"] is False
    assert fr_settings({"TORCH_FR_DUMP_ON_TIMEOUT": "false"})["dump_on_timeout"] is False
    assert fr_settings({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"})["dump_on_timeout"] is True


def test_version_override_is_test_only_and_marked_simulated() -> None:
    import platform

    import torch

    real = static_versions({})
    assert (
        real["torch_version"] == str(torch.__version__)
        and real["python_version"] == platform.python_version()
    )
    assert real["simulated"] is False
    fake = static_versions(
        {"FLIGHTDECK_TEST_VERSION_OVERRIDE": json.dumps({"torch_version": "2.15.0", "bogus": 1})}
    )
    assert fake["torch_version"] == "2.15.0" and "bogus" not in fake and fake["simulated"] is True
    with pytest.raises(ValueError, match="JSON object"):
        static_versions({"FLIGHTDECK_TEST_VERSION_OVERRIDE": "[1]"})


def test_reader_takes_config_from_the_sidecar_and_fills_gaps_from_the_dump() -> None:
    """A real gloo dump (tests/data/fr/healthy_4) with a config whose group timeout the agent could
    not read: the reader fills it in from the entries' `timeout_ms`."""
    from pathlib import Path

    from flightdeck.readers.fr.decode import load_raw
    from flightdeck.readers.fr.parse import parse_dump

    path = Path(__file__).parent / "data" / "fr" / "healthy_4" / "rank_0.pkl"
    raw = load_raw(path.read_bytes())
    meta = json.loads(path.with_name(path.name + ".meta.json").read_text())
    cfg = replace(
        BASE, groups=(GroupConfig("0", "default_pg", "nccl2", None), GroupConfig("9", "unused", None, None))
    )
    dump = parse_dump(raw, rank=0, source=str(path), meta={**meta, "config": config_to_dict(cfg)})
    assert dump.config is not None
    assert dump.config.groups == (
        GroupConfig("0", "default_pg", "nccl2", 6000),
        GroupConfig("9", "unused", None, None),
    )
    assert dump.config.torch_version == BASE.torch_version
    assert parse_dump(raw, rank=0, source=str(path), meta=meta).config is None  # an older agent: no report
