"""Collector settings: sources and precedence, validation, and that everything is documented."""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from flightdeck.collector.metrics import CollectorMetrics
from flightdeck.collector.queue import QueueStats
from flightdeck.collector.settings import CollectorSettings, SettingsError, default_torch_prefixes
from flightdeck.env_names import LegacyEnvWarning
from tests.support.metrics_doc import METRICS_DOC


def test_every_setting_is_documented() -> None:
    for name, field in CollectorSettings.model_fields.items():
        assert field.description and len(field.description) > 20, f"setting {name} has no documentation"


def test_every_collector_metric_is_documented() -> None:
    registry = CollectorRegistry()
    metrics = CollectorMetrics(registry)
    metrics.watch_queue(lambda: QueueStats(0, 0, None, 0), time.time_ns)
    exported = set()
    for family in registry.collect():
        exported.add(family.name + ("_total" if family.type == "counter" else ""))
    section = METRICS_DOC.read_text().split("## Collector", 1)[1]
    documented = set(re.findall(r"^\| `(flightdeck_collector_[a-z_]+)`", section, re.M))
    assert exported == documented
    for name in (
        "flightdeck_collector_files_seen_total",
        "flightdeck_collector_parse_errors_total",
        "flightdeck_collector_quarantined_total",
        "flightdeck_collector_batches_sent_total",
        "flightdeck_collector_batches_failed_total",
        "flightdeck_collector_queue_depth_batches",
        "flightdeck_collector_queue_bytes",
        "flightdeck_collector_push_lag_seconds",
    ):
        assert name in exported


def test_environment_wins_over_the_file_which_wins_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "collector.toml"
    cfg.write_text(
        'server_url = "http://file:8000/"\n'
        "push_interval_s = 7.5\n"
        f'spool_dirs = ["{tmp_path / "a"}", "{tmp_path / "b"}"]\n'
    )
    monkeypatch.setenv("FLIGHTDECK_SERVER_URL", "https://env:9000")
    s = CollectorSettings.load(cfg)
    assert s.server_url == "https://env:9000"
    assert s.ingest_url == "https://env:9000/api/v1/ingest"
    assert s.push_interval_s == 7.5
    assert s.spool_dirs == [tmp_path / "a", tmp_path / "b"]
    assert s.max_queue_bytes == CollectorSettings.model_fields["max_queue_bytes"].default


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('server_urll = "http://x"\n', "server_urll"),
        ('server_url = "ftp://x"\n', "http:// or https://"),
        ('metrics_listen = "9478"\n', "host:port"),
        ("push_interval_s = 0\n", "push_interval_s"),
        ('token = "a"\ntoken_file = "/t"\n', "not both"),
        ("server_url = \n", "not valid TOML"),
    ],
)
def test_bad_settings_are_refused_clearly(tmp_path: Path, toml: str, message: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    with pytest.raises(SettingsError, match=re.escape(message)):
        CollectorSettings.load(cfg)


def test_token_file_and_torch_prefixes(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("  abc\n")
    s = CollectorSettings(token_file=tmp_path / "tok", host="n1")
    assert s.resolve_token() == "abc"
    assert s.torch_job == "torch-n1"
    env = {"TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_", "XDG_CACHE_HOME": "/c"}
    assert default_torch_prefixes(env) == [
        "/scratch/fr_",
        "/c/torch/comm_lib_trace_rank_",
        "/tmp/nccl_trace_rank_",
    ]
    with pytest.raises(SettingsError, match="server_url is not set"):
        _ = CollectorSettings().ingest_url


def _clear(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("FLIGHTDECK_"):
            monkeypatch.delenv(name)


def test_collector_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FLIGHTDECK_COLLECTOR_*` names, lists as JSON; the server's new names are not the collector's."""
    _clear(monkeypatch)
    monkeypatch.setenv("FLIGHTDECK_COLLECTOR_SERVER_URL", "http://127.0.0.1:8470/")
    monkeypatch.setenv("FLIGHTDECK_COLLECTOR_SPOOL_DIRS", '["/a", "/b"]')
    monkeypatch.setenv("FLIGHTDECK_COLLECTOR_HOST", "gpu-node-3")
    monkeypatch.setenv("FLIGHTDECK_SERVER_HOST", "0.0.0.0")  # the server's bind address
    with warnings.catch_warnings():
        warnings.simplefilter("error", LegacyEnvWarning)
        s = CollectorSettings.load()
    assert (s.server_url, s.spool_dirs, s.host_name) == (
        "http://127.0.0.1:8470",
        [Path("/a"), Path("/b")],
        "gpu-node-3",
    )


def test_collector_old_names_warn_and_still_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """FLIGHTDECK_SERVER_URL and FLIGHTDECK_HOST, the collector's names of old, work for one
    release and name the new variable; they win over the TOML file, as before."""
    _clear(monkeypatch)
    cfg = tmp_path / "c.toml"
    cfg.write_text('host = "from-file"\n', encoding="utf-8")
    monkeypatch.setenv("FLIGHTDECK_SERVER_URL", "http://127.0.0.1:8470")
    monkeypatch.setenv("FLIGHTDECK_HOST", "gpu-node-3")
    with pytest.warns(LegacyEnvWarning) as record:
        s = CollectorSettings.load(cfg)
    assert (s.server_url, s.host_name) == ("http://127.0.0.1:8470", "gpu-node-3")
    said = " | ".join(str(w.message) for w in record)
    assert "FLIGHTDECK_SERVER_URL is deprecated, set FLIGHTDECK_COLLECTOR_SERVER_URL instead" in said
    assert "FLIGHTDECK_HOST is deprecated, set FLIGHTDECK_COLLECTOR_HOST instead" in said


def test_collector_new_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv("FLIGHTDECK_COLLECTOR_PUSH_INTERVAL_S", "3")
    monkeypatch.setenv("FLIGHTDECK_PUSH_INTERVAL_S", "9")
    with pytest.warns(LegacyEnvWarning, match="FLIGHTDECK_PUSH_INTERVAL_S is ignored"):
        s = CollectorSettings.load()
    assert s.push_interval_s == 3.0
