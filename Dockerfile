# Flightdeck server image: `docker build -t flightdeck .` (docker-compose.yml builds it too).
# Two stages: the wheel is built in the first, the second installs only that wheel and its
# dependencies at the versions of docker/constraints.txt (no source tree, no build tools).
# The base image is pinned to a patch release; pin it by digest too where a registry is at hand:
#   docker buildx imagetools inspect python:3.11.11-slim   -> FROM python:3.11.11-slim@sha256:...

FROM python:3.11.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# flightdeck/{collector,server,web,dashboards} are symbolic links to the top-level folders, so
# those are copied beside the package; the wheel build follows the links.
COPY pyproject.toml setup.py README.md ./
COPY flightdeck ./flightdeck
COPY collector ./collector
COPY server ./server
COPY web ./web
COPY dashboards ./dashboards
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FLIGHTDECK_SERVER_DATA_DIR=/var/lib/flightdeck

# An unprivileged system user owns the data directory; nothing runs as root after the build.
RUN groupadd --system --gid 10001 flightdeck \
 && useradd --system --uid 10001 --gid flightdeck --home-dir /var/lib/flightdeck --create-home \
        --shell /usr/sbin/nologin flightdeck

# Locked: every package the server extra needs, at the exact version of docker/constraints.txt.
COPY docker/constraints.txt /tmp/constraints.txt
COPY --from=build /wheels /tmp/wheels
RUN pip install --constraint /tmp/constraints.txt "$(ls /tmp/wheels/torch_flightdeck-*.whl)[server]" \
 && rm -rf /tmp/wheels /tmp/constraints.txt

USER flightdeck:flightdeck
WORKDIR /var/lib/flightdeck
EXPOSE 8470

HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; r = urllib.request.urlopen('http://127.0.0.1:8470/healthz', timeout=2); sys.exit(0 if r.status == 200 else 1)"]

# 0.0.0.0 inside the container is right: docker-compose.yml publishes the port on 127.0.0.1 only.
CMD ["flightdeck", "server", "--host", "0.0.0.0", "--port", "8470"]
