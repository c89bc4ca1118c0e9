# Flightdeck server image: `docker build -t flightdeck .` (docker-compose.yml builds it too).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FLIGHTDECK_SERVER_DATA_DIR=/var/lib/flightdeck

# An unprivileged system user owns the data directory; nothing runs as root after the build.
RUN groupadd --system --gid 10001 flightdeck \
 && useradd --system --uid 10001 --gid flightdeck --home-dir /var/lib/flightdeck --create-home \
        --shell /usr/sbin/nologin flightdeck

WORKDIR /opt/flightdeck
# flightdeck/{collector,server,web,dashboards} are symbolic links to the top-level folders, so
# those are copied beside the package; the install below follows the links.
COPY pyproject.toml README.md ./
COPY flightdeck ./flightdeck
COPY collector ./collector
COPY server ./server
COPY web ./web
COPY dashboards ./dashboards
RUN pip install ".[server]" \
 && rm -rf build *.egg-info

USER flightdeck:flightdeck
WORKDIR /var/lib/flightdeck
EXPOSE 8470

HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; r = urllib.request.urlopen('http://127.0.0.1:8470/healthz', timeout=2); sys.exit(0 if r.status == 200 else 1)"]

# 0.0.0.0 inside the container is right: docker-compose.yml publishes the port on 127.0.0.1 only.
CMD ["flightdeck", "server", "--host", "0.0.0.0", "--port", "8470"]
