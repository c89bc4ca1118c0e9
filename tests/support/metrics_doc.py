"""Test helper: the metric names documented in docs/metrics.md, and the names a PromQL expr uses.

The dashboards and the alert rules may only query what the server exposes; this module is the one
place that knows how to read the documented table and how to pull metric names out of PromQL.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
METRICS_DOC = REPO / "docs" / "metrics.md"

#: `| `name` | type | labels | meaning |` rows of the metrics table.
_ROW = re.compile(
    r"^\|\s*`(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(?P<type>counter|gauge|histogram|summary)\s*\|"
)

#: series a histogram (or summary) exposes besides its documented base name.
_SUFFIXES = {
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "counter": ("",),
    "gauge": ("",),
}

#: PromQL words that look like identifiers but are not metric names.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"inf", "nan", "Inf", "NaN", "start", "end"}
)

#: Grafana's built-in interval variables, replaced by a plain duration before parsing.
_GRAFANA_DURATIONS = re.compile(r"\$__(rate_interval|interval|range)|\$\{__(rate_interval|interval|range)\}")


def documented_series() -> dict[str, str]:
    """Every queryable series name from docs/metrics.md mapped to its documented metric type."""
    series: dict[str, str] = {}
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            for suffix in _SUFFIXES[match["type"]]:
                series[match["name"] + suffix] = match["type"]
    if not series:
        raise ValueError(f"no metrics table found in {METRICS_DOC}")
    return series


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (ignores labels, functions, keywords, strings)."""
    text = _GRAFANA_DURATIONS.sub("5m", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', text)  # string literals
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # range and subquery selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names: set[str] = set()
    for match in re.finditer(r"(?P<num>(?<![\w:.])\d[\w.]*)|(?P<ident>[A-Za-z_:][\w:]*)", text):
        word = match["ident"]
        if word is None or word in _KEYWORDS:
            continue
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or aggregation
        names.add(word)
    return names
