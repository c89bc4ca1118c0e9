"""The server's settings: one class, read from `FLIGHTDECK_SERVER_*` environment variables in `main()`.

The old names (`FLIGHTDECK_<SETTING>`, shared with the collector and the agent) are still read for
one release, with a warning naming the new one (`flightdeck.env_names`). Every field carries a
description; `tests/test_server_settings.py` fails when one does not.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from flightdeck.env_names import SERVER_PREFIX
from flightdeck.paths import default_data_dir
from flightdeck.settings_sources import LegacyEnvSource

#: Shortest accepted bearer secret (read, admin and web tokens).
MIN_SECRET_CHARS = 16
#: What the placeholders of `.env.example` look like; a secret holding one is refused at start.
_PLACEHOLDER_MARKS = ("change-me", "changeme", "change_me")


def is_placeholder(value: str) -> bool:
    """Whether `value` is a placeholder from `.env.example` (or another obvious non-secret)."""
    lowered = value.strip().lower()
    return not lowered or any(mark in lowered for mark in _PLACEHOLDER_MARKS)


def secret_problem(value: str) -> str | None:
    """Why `value` is not usable as a bearer secret, or None. Never quotes the value."""
    if not value.strip():
        return "is empty: set a secret (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
    if is_placeholder(value):
        return "is the placeholder from .env.example: set a real secret"
    if len(value) < MIN_SECRET_CHARS:
        return f"is shorter than {MIN_SECRET_CHARS} characters"
    return None


def make_url_password(url: str) -> str | None:
    """The password in a database URL (None: none, or not a URL)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).password
    except ArgumentError:
        return None


def settings_problems(exc: ValidationError) -> list[str]:
    """One line per invalid setting of `exc`, naming its environment variable; never the value
    (it may be a secret)."""
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "settings"
        msg = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{ENV_PREFIX}{field.upper()} ({field}): {msg}" if err["loc"] else msg)
    return lines


#: Prefix of the server's environment variables.
ENV_PREFIX = SERVER_PREFIX


class ServerSettings(BaseSettings):
    """Configuration of `flightdeck server` (environment prefix `FLIGHTDECK_SERVER_`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, `FLIGHTDECK_SERVER_*`, then the old `FLIGHTDECK_*` names (warned)."""
        legacy = LegacyEnvSource(settings_cls, prefix=ENV_PREFIX, process="flightdeck server")
        return (init_settings, env_settings, legacy, dotenv_settings, file_secret_settings)

    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Directory for the server's own files (the default SQLite database lives here); "
        "default `$XDG_DATA_HOME/flightdeck` (`~/.local/share/flightdeck`), the same as `flightdeck up`, "
        "so `flightdeck token` and `flightdeck server` find up's database.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy database URL, e.g. postgresql+psycopg://user@host/db; "
        "default: a SQLite file (WAL mode) `flightdeck.db` under data_dir.",
    )
    db_busy_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="SQLite only: how long a writer waits for the database lock before the request "
        "is answered 503 with Retry-After.",
    )
    migrate: bool | None = Field(
        default=None,
        description="Whether the server brings a missing or older database schema up to its own "
        "version (Alembic migrations) at start, and again should the schema vanish while it runs "
        "(a database dropped and recreated). Unset: yes for SQLite (the server's own file), no for "
        "PostgreSQL, where the server then refuses to start with a one-line message (exit code 4) "
        "until `flightdeck migrate` has run or it is started with `--migrate` / this set to true. "
        "A schema newer than the server's is always refused.",
    )
    db_startup_timeout_s: float = Field(
        default=60.0,
        ge=0,
        description="How long the server keeps trying to reach the database at start (exponential "
        "backoff from 0.5 s to 5 s, one log line per attempt) before it gives up with exit code 3.",
    )
    host: str = Field(default="127.0.0.1", description="Address the HTTP server binds to.")
    port: int = Field(default=8470, ge=1, le=65535, description="TCP port the HTTP server listens on.")
    access_log: bool = Field(
        default=False,
        description="Log every HTTP request (uvicorn's access log, at --log-level info). Off by "
        "default: collectors send a request per host every interval (1,024 a second for a "
        "16,384-rank job on digests), a line each. Requests are counted by outcome either way "
        "(flightdeck_ingest_batches_total, flightdeck_ingest_digests_total, "
        "flightdeck_ingest_rejects_total).",
    )
    stall_after_s: float = Field(
        default=5.0,
        ge=1.0,
        description="A collective unfinished on some ranks for at least this many seconds is a hang, "
        "unless the ranks it waits for are still working (a slow_rank finding, no page); one of those "
        "that makes no progress (no CPU, same stack) for this long is hung. The one threshold: "
        "agents write their stack snapshot after a fixed 2 s, so the first hang finding has it. "
        "5 s is about 6x the longest wait in a collective and the longest gap between a rank's "
        "collectives measured in healthy gloo jobs, well above snapshot and push delays, and lets "
        "the shipped alert path page within 15 s of the fault (docs/alerting.md).",
    )
    slow_ceiling_s: float | None = Field(
        default=None,
        gt=0,
        description="A rank still working while the others wait (slow_rank) is reported as a hang once "
        "they have waited this many seconds; unset: half the group's timeout (5 min when unknown).",
    )
    lost_after_intervals: float = Field(
        default=3.0,
        gt=0,
        description="A rank whose snapshots lag the job's newest by this many snapshot intervals, "
        "while the others continue, is lost.",
    )
    diagnosis_debounce_s: float = Field(
        default=0.5,
        ge=0,
        description="Quiet time after a job's last ingested batch before it is diagnosed "
        "(a burst of batches from all ranks gives one diagnosis).",
    )
    diagnosis_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="Active jobs are re-diagnosed this often even without new data, so a hang is "
        "found when snapshots stop changing or a rank stops sending.",
    )
    diagnosis_max_share: float = Field(
        default=0.2,
        gt=0,
        le=1,
        description="Largest share of one CPU core that diagnosing may take, all jobs together: a "
        "job whose diagnosis takes d seconds (wall clock, so a busy process diagnoses less often) "
        "is diagnosed at most every d / share seconds (and its straggler analysis runs at most "
        "every fourth time), and when several are due, jobs with new data go first, then the "
        "longest undiagnosed, until the share is spent. Only large jobs are slowed down: "
        "4,096 ranks take about 0.17-0.18 s, 0.51-0.54 s with the straggler analysis; 16,384 "
        "ranks 0.62-0.77 s, 1.18-1.34 s (docs/performance.md). Raising it makes "
        "large jobs' verdicts fresher at the cost of ingest throughput: at 0.5 a 2,048-rank job "
        "fell behind its ingest within minutes.",
    )
    detail_interval_s: float = Field(
        default=300.0,
        gt=0,
        description="Jobs whose collectors send progress digests (`POST /api/v1/digest`: jobs of at "
        "least the collector's digest_from_ranks ranks) are asked for their entries (a round: each "
        "rank's newest, its open ones) this often, and when first heard of. When ranks disagree on "
        "a span's fingerprint, the odd ranks and more of those that agreed are asked for that span "
        "at once. While a process group has waited in a collective for stall_after_s / 2 or "
        "longer, its culprits and a few of its waiters are asked every stall_after_s / 2. Hangs and "
        "busy ranks of such a job are found from the digests; its other findings from the entries "
        "of the latest rounds, judged as of them.",
    )
    detail_round_s: float = Field(
        default=4.0,
        gt=0,
        description="How long a request for a digest job's entries stays open: every collector that "
        "sends a digest of the job meanwhile is answered to ship its ranks' entries (once per "
        "round). At least the collectors' push_interval_s, so that each hears it.",
    )
    straggler_interval_s: float = Field(
        default=10.0,
        ge=0,
        description="The arrival-skew (straggler) analysis, the costliest part of a diagnosis on "
        "large jobs, runs at most this often per job; in between, its last verdict stands.",
    )
    job_idle_s: float = Field(
        default=3600.0,
        gt=0,
        description="A job without a snapshot for this long is no longer re-diagnosed periodically "
        "and its in-memory summaries are dropped (they are rebuilt from the database if it returns).",
    )
    ended_series_s: float = Field(
        default=600.0,
        ge=0,
        description="An ended job (every rank final or reported gone) keeps its series on /metrics, "
        "its gauges at 0, for this long after it ended; then its in-memory state is dropped "
        "(its history stays in the store and on the pages).",
    )
    no_data_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A job none of whose ranks has sent a snapshot for this long, while a collector "
        "of the job still reports (batches or idle heartbeats) and none of its ranks was reported "
        "gone, has status no_data.",
    )
    job_settle_s: float = Field(
        default=120.0,
        ge=0,
        description="For this long after this process first receives data of a job, while fewer "
        "ranks than its world size are in or its newest snapshot is older than max(stall_after_s / "
        "2, 5 s) (a collector shipping a running job's history), the job's picture is still filling "
        "in: the diagnosis opens no finding that the arriving data could refute (hang, slow_rank, "
        "rank_lost, missing_dump, state_mismatch). The whole-ring backfill of a 1,024-rank job took "
        "34-56 s. 0: judge every picture as it comes.",
    )
    max_summary_seqs: int = Field(
        default=8192,
        ge=16,
        description="Collectives kept per rank and process group in the in-memory summaries "
        "(older ones are dropped: they are older than any flight-recorder ring holds).",
    )
    enqueue_times_kept: int = Field(
        default=512,
        ge=256,
        description="Enqueue times kept per rank and process group in the in-memory summaries, for "
        "the newest collectives (the rest of max_summary_seqs is held without its time: the times "
        "were half of an open job's memory). The diagnosis compares arrival times over a group's "
        "newest 256 collectives (arrival skew, stragglers): with 512 it sees what it would see "
        "with every time kept while no rank is more than 256 collectives ahead of the group's "
        "slowest; further apart, it compares the collectives all of them kept.",
    )
    idle_restart_above_mib: float = Field(
        default=16.0,
        ge=0,
        description="Once the server holds no job (the last one ended and its series left /metrics "
        "after ended_series_s) and its RSS is more than this many MiB above its RSS at start, "
        "`flightdeck server` restarts itself in place to give the memory back (CPython's allocator "
        "keeps the arenas a job's objects were spread over: a 1,024-rank job left 32-65 MiB): "
        "stopped as SIGTERM stops it, then executed again with the same process id and the "
        "listening socket kept open, so requests meanwhile wait ~2 s instead of failing. Its "
        "counters start again from 0 (Prometheus' rate() and increase() take that as a reset). "
        "0: never.",
    )
    max_request_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Largest accepted ingest body, checked on the wire and after gzip "
        "decompression (413 above).",
    )
    max_inflight_ingests: int = Field(
        default=64,
        ge=1,
        description="Ingest requests in flight at once, each on a worker thread of its own "
        "(decoding, or waiting to share a group commit); more wait in the ingest queue. More in "
        "flight make bigger group commits and let batches be decoded while a group is written.",
    )
    max_queued_ingests: int = Field(
        default=1024,
        ge=0,
        description="Ingest requests waiting for an in-flight slot (on the event loop, no thread, "
        "body unread); more get 429 with Retry-After.",
    )
    ingest_queue_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="Longest wait of an ingest request for an in-flight slot before it gets 429 "
        "(keep it well under the collectors' request timeout, 10 s by default).",
    )
    auth_cache_s: float = Field(
        default=1.0,
        ge=0,
        description="How long a verified collector token is trusted without asking the database "
        "again (one query per request otherwise): a revoked token is refused within this time.",
    )
    retry_after_s: int = Field(
        default=1, ge=1, description="Retry-After (seconds) sent with 429 and 503 answers."
    )
    retention_days: float = Field(
        default=14.0,
        gt=0,
        description="Collective entries and NIXL history samples older than this are deleted "
        "periodically; findings and each NIXL agent's latest sample stay.",
    )
    entries_per_rank: int | None = Field(
        default=None,
        ge=1,
        description="Rolling window of raw collective entries: each rank of an active job keeps its "
        "newest this many in the database (trimmed every trim_interval_s; findings, reports and the "
        "in-memory summaries stay). Unset: only retention_days applies. 20,000 is about half an hour "
        "at 10 collectives per second.",
    )
    trim_interval_s: float = Field(
        default=60.0, gt=0, description="How often the entries_per_rank window is applied."
    )
    retention_interval_s: float = Field(
        default=3600.0, gt=0, description="How often the retention task runs."
    )
    webhook_urls: list[str] = Field(
        default_factory=list,
        description="URLs that receive every opened or resolved finding as JSON (env: a JSON list, "
        'e.g. ["http://127.0.0.1:9000/hook"]).',
    )
    webhook_timeout_s: float = Field(default=5.0, gt=0, description="Timeout of one webhook POST.")
    webhook_max_attempts: int = Field(
        default=8, ge=1, description="Attempts per webhook delivery before it is dropped (logged)."
    )
    webhook_backoff_initial_s: float = Field(
        default=0.5, gt=0, description="First retry delay of a failed webhook delivery; doubles each time."
    )
    webhook_backoff_max_s: float = Field(
        default=30.0, gt=0, description="Upper bound of one webhook retry delay (jitter included)."
    )
    webhook_deadline_s: float = Field(
        default=600.0,
        gt=0,
        description="Overall time after which an undelivered webhook event is dropped, whatever "
        "attempts are left, counted from the event (server restarts included).",
    )
    webhook_poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often the webhook sender looks for due deliveries in the outbox table: "
        "retries, and events that another server process wrote or a restart left; this process's "
        "new events are sent at once.",
    )
    cluster: bool = Field(
        default=False,
        description="Several server processes share this PostgreSQL database (behind one address): "
        "each job's diagnosis is owned by one process at a time (a PostgreSQL advisory lock), which "
        "reads the batches the other processes ingested from a short-lived feed table. PostgreSQL only.",
    )
    require_read_token: bool = Field(
        default=False,
        description="Require a bearer token for the read API (/api/v1/...) and /metrics: a collector's "
        "token, read_token or admin_token. The OpenAPI docs (/docs, /redoc, /openapi.json) are then "
        "not served; /healthz stays open (it says only whether the database answers). "
        "docker-compose.yml turns this on.",
    )
    read_token: str | None = Field(
        default=None,
        description="A bearer token for reads only (the read API and /metrics) when require_read_token "
        "is on: what Prometheus scrapes with (docker-compose.yml hands it over as a credentials file). "
        "At least 16 characters; placeholders (`change-me...`) are refused at start.",
    )
    admin_token: str | None = Field(
        default=None,
        description="Bearer token of the admin API: create, list and revoke collector tokens over HTTP "
        "(/api/v1/admin/tokens); it may read as well. Unset: the admin API answers 403 and tokens are "
        "managed with `flightdeck token` on the server's database only. At least 16 characters; "
        "placeholders refused at start.",
    )
    allow_unauthenticated_ingest: bool = Field(
        default=False,
        description="Accept ingest batches without a token (local development and tests only).",
    )

    web_token: str | None = Field(
        default=None,
        description="When set, the incident dashboard (the HTML pages at /, /jobs/...) needs this "
        "token as `Authorization: Bearer <token>` or as the basic-auth password (what a browser "
        "sends); unset: the pages are open, for a trusted network. The JSON API is unaffected. "
        "At least 16 characters; placeholders refused at start.",
    )

    @field_validator("read_token", "admin_token", "web_token")
    @classmethod
    def _real_secret(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = secret_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("database_url")
    @classmethod
    def _real_password(cls, value: str | None) -> str | None:
        password = None if value is None else make_url_password(value)
        if password is not None and is_placeholder(password):
            raise ValueError("the database password is the placeholder from .env.example: set a real one")
        return value

    @field_validator("webhook_urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"webhook URL {u!r} must start with http:// or https://")
        return urls

    @model_validator(mode="after")
    def _cluster_needs_postgresql(self) -> ServerSettings:
        if self.cluster and not self.effective_database_url.startswith("postgresql"):
            raise ValueError("cluster mode needs a PostgreSQL database_url (advisory locks)")
        return self

    @property
    def effective_migrate(self) -> bool:
        """`migrate`, or when unset: True for SQLite, False for PostgreSQL."""
        if self.migrate is not None:
            return self.migrate
        return self.effective_database_url.startswith("sqlite")

    @property
    def effective_database_url(self) -> str:
        """`database_url`, or the default SQLite file under `data_dir`."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'flightdeck.db').resolve()}"
