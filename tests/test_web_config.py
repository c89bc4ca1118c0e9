"""The job page's configuration section (issue 9), rendered through the real router from the
committed dumps of a real 4-rank gloo job whose ranks are given differing configuration reports
(plain records, as the reader would produce them from the agent's sidecars); from both sources of
the pages' data (`web_pages.web_data`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from flightdeck.records import GroupConfig, RankConfig
from flightdeck.web import views
from flightdeck.web.data import WebData
from tests.support.web_pages import (
    HX,
    XSS,
    Source,
    app_for,
    client_get,
    live_dumps,
    need_dumps,
    web_data,
)

CONFIG = RankConfig(
    torch_version="2.13.0+cpu",
    python_version="3.11.7",
    fr_buffer_size=2000,
    dump_on_timeout=True,
    groups=(GroupConfig("0", "default_pg", "cpu:gloo", 60_000),),
)


@pytest.fixture
def data(source: Source, tmp_path: Path) -> Iterator[WebData]:
    need_dumps("healthy_4")
    dumps = live_dumps("healthy_4", final=True)
    skewed = []
    for d in dumps:
        cfg = CONFIG
        if d.rank == 3:
            cfg = replace(CONFIG, torch_version=XSS, fr_buffer_size=0)
        skewed.append(replace(d, config=cfg, host="<i>host</i>" if d.rank == 3 else d.host))
    with web_data(source, {"healthy_4": skewed, "plain": dumps}, db_dir=tmp_path) as web:
        yield web


def test_configuration_section_shows_values_side_by_side_escaped(data: WebData) -> None:
    r = client_get(app_for(data), "/jobs/healthy_4", HX)
    assert r.status_code == 200
    html = r.text
    assert '<section id="configuration"' in html
    section = html.split('<section id="configuration"', 1)[1].split("</section>", 1)[0]
    assert "torch version" in section and "flight recorder off" in section
    assert "<code>2.13.0+cpu</code> <small>majority</small>" in section
    assert "<td>0–2</td>" in section and "<td>3</td>" in section
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    assert "<i>host</i>" not in html and "&lt;i&gt;host&lt;/i&gt;" in section
    rows = views.config_rows(data.job_report("healthy_4") or {})
    assert [(row.kind, row.setting) for row in rows] == [
        ("version_skew", "torch version"),
        ("config_skew", "flight recorder off"),
    ]
    torch_row = rows[0]
    assert [(s.value, s.rank_count, s.majority) for s in torch_row.sides] == [
        ("2.13.0+cpu", 3, True),
        (XSS, 1, False),
    ]


def test_no_section_without_differences(data: WebData) -> None:
    r = client_get(app_for(data), "/jobs/plain", HX)
    assert r.status_code == 200
    assert "configuration" not in r.text
