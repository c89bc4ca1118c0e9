"""The recording ingest endpoint of the collector tests (tests/support/collector_recorder.py) counts a
batch once and answers what it is scripted to."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx

from tests.support.collector_recorder import Recorder, Scripted


def _post(url: str, doc: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        url + "/api/v1/ingest",
        content=gzip.compress(json.dumps(doc).encode()),
        headers={"Content-Encoding": "gzip"},
    )


def test_recorder_counts_a_batch_once_and_answers_scripts() -> None:
    with Recorder() as rec:
        rec.script = [Scripted(503, {"Retry-After": "1"})]
        r = _post(rec.url, {"batch_id": "b1", "snapshots": [], "nixl": []})
        assert (r.status_code, r.headers["Retry-After"]) == (503, "1")
        assert _post(rec.url, {"batch_id": "b1", "snapshots": [], "nixl": []}).json() == {"accepted": True}
        assert _post(rec.url, {"batch_id": "b1", "snapshots": [], "nixl": []}).json() == {"duplicate": True}
        assert list(rec.batches) == ["b1"]
        port = rec.port
        rec.stop()
        try:
            _post(rec.url, {"batch_id": "b2"})
            raise AssertionError("a stopped recorder must refuse connections")
        except httpx.ConnectError:
            pass
        rec.start()
        assert rec.port == port
        assert _post(rec.url, {"batch_id": "b2", "snapshots": [], "nixl": []}).status_code == 200
