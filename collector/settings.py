"""The collector's settings: one class, read from `FLIGHTDECK_COLLECTOR_*` variables and an optional
TOML file.

Precedence, highest first: keyword arguments (tests), environment (`FLIGHTDECK_COLLECTOR_<FIELD>`,
lists and tables as JSON), the old names (`FLIGHTDECK_<FIELD>`, read for one release with a warning
naming the new one: `flightdeck.env_names`), the TOML file given with `--config` (top-level keys
named like the fields), the defaults below. Unknown keys in the TOML file are an error, so a typo does not silently fall back to
a default. Every field carries its documentation in `Field(description=...)`; `--check` prints them
and a test fails when one is missing.
"""

from __future__ import annotations

import contextvars
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from flightdeck.env_names import COLLECTOR_PREFIX
from flightdeck.settings_sources import LegacyEnvSource
from flightdeck.spool import DEFAULT_SPOOL_DIR

ENV_PREFIX = COLLECTOR_PREFIX
#: PyTorch's variables naming the dump file prefix (rank appended), newest name first.
TORCH_PREFIX_ENV_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
#: Where releases before the comm_lib rename wrote their dumps.
LEGACY_TORCH_PREFIX = "/tmp/nccl_trace_rank_"
_LISTEN_RE = re.compile(r"^(?P<host>[^:\s]*|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")

# The TOML file's contents while `CollectorSettings.load` builds the settings (see `_FileSource`).
_FILE_DATA: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "flightdeck_collector_file", default=None
)


class SettingsError(ValueError):
    """The configuration is unusable; the message says which setting and why."""


def default_torch_prefixes(env: Mapping[str, str] | None = None) -> list[str]:
    """The dump prefixes PyTorch writes to, as the job's environment would resolve them.

    The collector usually runs as another user than the job, so `~` here is the collector's home:
    set `torch_dump_prefixes` explicitly when the jobs' cache directory is elsewhere.
    """
    env = os.environ if env is None else env
    out = [env[k] for k in TORCH_PREFIX_ENV_VARS if env.get(k)]
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out.append(os.path.join(cache, "torch", "comm_lib_trace_rank_"))
    out.append(LEGACY_TORCH_PREFIX)
    return list(dict.fromkeys(out))


class _FileSource(PydanticBaseSettingsSource):
    """The TOML file as a settings source below the environment (set by `CollectorSettings.load`)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        data = _FILE_DATA.get() or {}
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get() or {})


class CollectorSettings(BaseSettings):
    """Settings of the per-node collector daemon (`flightdeck collector`)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", validate_default=True, frozen=True
    )

    server_url: str | None = Field(
        default=None,
        description="Base URL of the Flightdeck server, e.g. https://flightdeck.example:8470; batches "
        "go to <server_url>/api/v1/ingest. Required to run (not for --check of paths).",
    )
    token: SecretStr | None = Field(
        default=None,
        description="Bearer token for the ingest API. Prefer token_file so it stays out of the "
        "environment and process listings.",
    )
    token_file: Path | None = Field(
        default=None,
        description="File holding the bearer token (surrounding whitespace stripped). Exclusive with token.",
    )
    spool_dirs: list[Path] = Field(
        default_factory=lambda: [Path(DEFAULT_SPOOL_DIR)],
        description="Spool roots the in-job agents write to (<spool>/<job>/<attempt>/rank_<R>[.kind].pkl); "
        "watched recursively. A root that does not exist yet is picked up when it appears.",
    )
    torch_dump_prefixes: list[str] = Field(
        default_factory=default_torch_prefixes,
        description="PyTorch's own dump paths as prefixes (the rank is appended): default "
        "$TORCH_FR_DUMP_TEMP_FILE / $TORCH_NCCL_DEBUG_INFO_TEMP_FILE when set, "
        "~/.cache/torch/comm_lib_trace_rank_ and /tmp/nccl_trace_rank_. These files are never "
        "moved (bad ones are copied to quarantine); an empty list watches none.",
    )
    torch_dump_job: str | None = Field(
        default=None,
        description="Job name given to dumps found at torch_dump_prefixes (they carry no job id). "
        "Default: torch-<host>.",
    )
    nixl_telemetry_dir: Path | None = Field(
        default=None,
        description="NIXL_TELEMETRY_DIR of the jobs on this host: ring files, consumed (the collector "
        "must be their only reader and needs write access). None: not read.",
    )
    nixl_multiproc_dir: Path | None = Field(
        default=None,
        description="NIXL_TELEMETRY_MULTIPROC_DIR of the jobs on this host: prometheus_mp store files, "
        "read without changing them. None: not read.",
    )
    state_dir: Path = Field(
        default=Path("/var/lib/flightdeck-collector"),
        description="The collector's own state: queue.sqlite3 (durable queue, dead letters, what was "
        "shipped per rank) and quarantine/. Created when missing; must be on a local filesystem.",
    )
    polling: bool = Field(
        default=False,
        description="Watch by polling directory listings instead of inotify (for NFS, Lustre and other "
        "network filesystems, where inotify sees no remote writes).",
    )
    poll_interval_s: float = Field(
        default=2.0, gt=0, description="Seconds between directory polls when polling is on."
    )
    rescan_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between full rescans of every watched path, the safety net for missed events.",
    )
    push_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between flushes: changed files are read, their new or changed entries and "
        "the NIXL samples go into one batch. Also how long a torch dump must stay unchanged "
        "(size and mtime across two looks) before it is read. 1 s (with the agent's 1 s snapshots) "
        "keeps fault -> finding within about 3 s of the server's stall_after_s.",
    )
    max_batch_entries: int = Field(
        default=5_000,
        ge=1,
        description="Most entries in one batch; larger flushes are split (and committed to the queue "
        "as they fill, which bounds memory when many ranks change at once).",
    )
    max_batch_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=4096,
        description="Most bytes of encoded JSON (before gzip) in one batch; larger flushes are split.",
    )
    max_queue_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=65536,
        description="Most bytes of queued (gzipped) batches. When full, no new snapshot batch is made: "
        "changed files stay pending and are read again when there is room (the newest file "
        "supersedes), queued batches are never dropped, NIXL samples of that flush are dropped.",
    )
    disk_reserve_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=65536,
        description="Size of the reserve file kept in state_dir (queue.reserve). When the disk fills up it "
        "is released so that delivered batches can still be acknowledged (no batch is sent twice); new "
        "batches are held back until the reserve can be put back (room for it twice over), then the "
        "collector goes on by itself.",
    )
    max_dump_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Dump files larger than this are quarantined unread "
        "(2,000 entries with frames are ~0.3-1 MB).",
    )
    max_dump_entries: int = Field(
        default=100_000,
        ge=1,
        description="Most entries one dump file may hold (PyTorch's ring holds TORCH_FR_BUFFER_SIZE, "
        "default 2,000); a file over it is quarantined (reason over_budget) before it is normalized.",
    )
    max_dump_frames: int = Field(
        default=4_000_000,
        ge=1,
        description="Most stack frames (and, separately, tensor sizes) one dump file may hold, summed over "
        "its entries, a stack shared by several entries counted at each: bounds the CPU and memory one "
        "file may cost (a small pickle can reference one large entry many times). Over it: quarantined.",
    )
    push_deadline_s: float = Field(
        default=60.0,
        gt=0,
        description="Overall time one delivery of a batch may take, retries included; the batch then "
        "stays queued and is tried again.",
    )
    retry_backoff_s: float = Field(
        default=0.5,
        gt=0,
        description="First wait before resending after a retryable failure; doubles per failure, "
        "jittered (50-100%), up to retry_backoff_max_s. A Retry-After from the server is a floor.",
    )
    retry_backoff_max_s: float = Field(
        default=30.0, gt=0, description="Longest wait between two attempts (Retry-After aside)."
    )
    request_timeout_s: float = Field(default=10.0, gt=0, description="Timeout of one HTTP request.")
    auth_retry_max_s: float = Field(
        default=300.0,
        gt=0,
        description="While the server rejects the token (HTTP 401/403: revoked or mistyped), batches stay "
        "queued and sending is retried after 10 s, doubling up to this (jittered). A changed token_file "
        "is picked up within 5 s, without a restart.",
    )
    max_attempts: int = Field(
        default=10,
        ge=1,
        description="Answers other than 2xx, 4xx and 429/502/503/504 (e.g. 500) a batch may get before "
        "it goes to the dead-letter table (retryable statuses and connection errors never count).",
    )
    shutdown_grace_s: float = Field(
        default=5.0,
        ge=0,
        description="On SIGTERM/SIGINT: seconds spent pushing what is queued before exiting "
        "(the rest stays queued for the next start).",
    )
    state_retention_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="What was shipped for a rank is forgotten after this long without a new snapshot.",
    )
    spool_retention_s: float = Field(
        default=86400.0,
        ge=0,
        description="Seconds after which the spool directory of an ended job attempt "
        "(`<spool>/<job>/<attempt>/`: every rank's latest snapshot final or its process gone, no "
        "file newer than this) is removed, with the collector's record of what it shipped from it. "
        "0: never removed.",
    )
    heartbeat_s: float = Field(
        default=15.0,
        ge=0,
        description="When the collector queued nothing for this many seconds (and its queue is "
        "empty), it pushes an empty batch: the server's flightdeck_collector_last_push_age_seconds "
        "then stays under heartbeat_s + push_interval_s for a healthy idle host. 0: off.",
    )
    digest_from_ranks: int = Field(
        default=2048,
        ge=0,
        description="Ranks of a job whose world_size is at least this are on progress digests: each "
        "flush sends their digests (per process group: newest collective entered, finished up to, "
        "waiting since) to <server_url>/api/v1/digest and ships their entries only when the server "
        "asks for them (a detail round: a job first heard of, every detail_interval_s of the server, "
        "when a group looks stalled, when ranks disagree on a span); their stall and final snapshots ship at "
        "once. Smaller jobs ship every changed entry. 0: never (every job ships its entries).",
    )
    metrics_listen: str = Field(
        default="127.0.0.1:9478",
        description="host:port of the collector's own /metrics (Prometheus); port 0 picks a free one; "
        "empty string: off.",
    )
    host: str | None = Field(
        default=None, description="Host name the collector reports; default: socket.gethostname()."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, the environment, the old names, then the TOML file (no .env, no
        secrets dir)."""
        legacy = LegacyEnvSource(settings_cls, prefix=ENV_PREFIX, process="flightdeck collector")
        return (init_settings, env_settings, legacy, _FileSource(settings_cls))

    @classmethod
    def load(cls, config: Path | None = None, **overrides: Any) -> Self:
        """Read the TOML file (when given) and the environment; raises SettingsError when unusable."""
        data: dict[str, Any] = {}
        if config is not None:
            try:
                with open(config, "rb") as fh:
                    data = tomllib.load(fh)
            except OSError as exc:
                raise SettingsError(f"cannot read config file {config}: {exc.strerror}") from None
            except tomllib.TOMLDecodeError as exc:
                raise SettingsError(f"config file {config} is not valid TOML: {exc}") from None
        token = _FILE_DATA.set(data)
        try:
            return cls(**overrides)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise SettingsError(f"invalid collector settings: {exc}") from None
        finally:
            _FILE_DATA.reset(token)

    @field_validator("server_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"server_url must be an http:// or https:// URL, got {v!r}")
        return v.rstrip("/")

    @field_validator("metrics_listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        if v and (not (m := _LISTEN_RE.match(v)) or not 0 <= int(m["port"]) < 65536):
            raise ValueError(f"metrics_listen must be host:port (e.g. 127.0.0.1:9478) or empty, got {v!r}")
        return v

    @model_validator(mode="after")
    def _token_source(self) -> Self:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set token or token_file, not both")
        return self

    # --- derived values -------------------------------------------------------------------------

    @property
    def host_name(self) -> str:
        """The host name to report."""
        return self.host or socket.gethostname()

    @property
    def ingest_url(self) -> str:
        """`<server_url>/api/v1/ingest`; raises SettingsError when server_url is unset."""
        return self._server_url() + "/api/v1/ingest"

    @property
    def digest_url(self) -> str:
        """`<server_url>/api/v1/digest` (digest mode, see digest_from_ranks); raises SettingsError
        when server_url is unset."""
        return self._server_url() + "/api/v1/digest"

    def _server_url(self) -> str:
        if not self.server_url:
            raise SettingsError(
                "server_url is not set (FLIGHTDECK_COLLECTOR_SERVER_URL or server_url in --config)"
            )
        return self.server_url

    @property
    def torch_job(self) -> str:
        """The job name for dumps at torch_dump_prefixes."""
        return self.torch_dump_job or f"torch-{self.host_name}"

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """(host, port) of the metrics listener, or None when off."""
        m = _LISTEN_RE.match(self.metrics_listen)
        if not self.metrics_listen or m is None:
            return None
        return m["host"].strip("[]") or "127.0.0.1", int(m["port"])

    def resolve_token(self) -> str | None:
        """The bearer token from token or token_file; raises SettingsError when the file is unusable."""
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is None:
            return None
        try:
            text = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"cannot read token_file {self.token_file}: {exc}") from None
        if not text:
            raise SettingsError(f"token_file {self.token_file} is empty")
        return text
