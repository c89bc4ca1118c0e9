"""The NIXL page: each agent's totals, rates and transfer-time quantiles, by host."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flightdeck.nixl_rates import RATE_WINDOW_S, Quantiles, window_stats
from flightdeck.web.views.fmt import fmt_bytes, fmt_duration, fmt_time_ns


def _fmt_us(us: float | None) -> str:
    if us is None:
        return "–"
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.1f} ms"
    return f"{us / 1e6:.2f} s"


def _fmt_rate(n: float) -> str:
    return f"{n:.0f}/s" if n >= 100 else f"{n:.1f}/s"


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One NIXL agent: totals over its whole life, rates and quantiles over the recent window."""

    host: str
    agent: str
    pid: str
    local_rank: str
    source: str
    #: Whether the owning process runs: "running", "exited", "not found" (ring owner unknown).
    alive: str
    #: When the newest sample was read (UTC clock time), and how long ago when known.
    sampled: str
    #: No sample for longer than the rate window: the rates describe the past, not now.
    stale: bool
    #: Bytes moved over every counter run.
    tx: str
    rx: str
    #: Over the window; "–" until two samples are kept.
    tx_rate: str
    rx_rate: str
    req_rate: str
    #: "last 58 s", or why there is no rate yet.
    window: str
    #: Transfer-time quantiles of the window's transfers, else of the current counter run.
    p50: str
    p90: str
    p99: str
    #: What the quantiles describe: "last 58 s (12 transfers)", "since start", "no transfers".
    quantile_scope: str
    #: Failures by kind over every counter run, and how many of them are new in the window.
    errors: list[tuple[str, int]]
    new_errors: int
    dropped: int
    new_dropped: int
    problem: bool
    #: The window as `NixlWindow.to_json()` (numbers, for the JSON twin); None without a window.
    rates: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class HostGroup:
    """The agents of one host."""

    host: str
    agents: list[AgentRow]


@dataclass(frozen=True, slots=True)
class NixlView:
    """The NIXL page."""

    hosts: list[HostGroup]
    agents: int
    total_errors: int
    total_dropped: int
    #: Errors and dropped events in the agents' recent windows: what is happening now.
    new_errors: int
    new_dropped: int
    window_s: float


def nixl_view(agents: list[dict[str, Any]]) -> NixlView:
    """The NIXL page from `WebData.nixl_agents()`: `NixlSample.to_wire()` dicts, each optionally
    with `totals` (counters over every counter run) and `history` (earlier samples of the same
    agent in the rate window, oldest first; see `flightdeck.nixl_rates`)."""
    by_host: dict[str, list[AgentRow]] = {}
    total_err = total_drop = new_err = new_drop = 0
    for a in sorted(agents, key=lambda a: (str(a.get("host")), str(a.get("agent")))):
        history = [h for h in a.get("history") or [] if isinstance(h, Mapping)]
        win = window_stats([*history, a])
        totals = a.get("totals") or a
        errors = sorted((str(k), int(v)) for k, v in (totals.get("errors") or {}).items() if int(v))
        dropped = int(totals.get("events_dropped") or 0)
        w_err = 0 if win is None else sum(win.errors.values())
        w_drop = 0 if win is None else win.events_dropped
        total_err += sum(n for _, n in errors)
        total_drop += dropped
        new_err += w_err
        new_drop += w_drop
        if win is not None and win.xfer_time is not None and win.xfer_time.count:
            q = win.xfer_time
            scope = f"last {fmt_duration(win.seconds)} ({q.count} transfer{'s' if q.count != 1 else ''})"
        else:
            hist = a.get("xfer_time") or {}
            q = Quantiles.of(hist.get("bounds_us") or [], hist.get("counts") or [])
            if not q.count:
                scope = "no transfers"
            elif win is None:
                scope = f"since start ({q.count} transfer{'s' if q.count != 1 else ''})"
            else:
                scope = f"none in last {fmt_duration(win.seconds)}; since start: {q.count}"
        alive = a.get("writer_alive")
        read_ns = a.get("read_time_ns")
        age_s = a.get("age_s")
        stale = age_s is not None and float(age_s) > RATE_WINDOW_S
        sampled = "" if read_ns is None else fmt_time_ns(int(read_ns)) + " UTC"
        if sampled and age_s is not None:
            sampled += f", {fmt_duration(float(age_s))} ago"
        row = AgentRow(
            host=str(a.get("host", "?")),
            agent=str(a.get("agent", "?")),
            pid="?" if a.get("pid") is None else str(a["pid"]),
            local_rank="–" if a.get("local_rank") is None else str(a["local_rank"]),
            source=str(a.get("source", "")),
            alive="not found" if alive is None else ("running" if alive else "exited"),
            sampled=sampled,
            stale=stale,
            tx=fmt_bytes(int(totals.get("tx_bytes") or 0)),
            rx=fmt_bytes(int(totals.get("rx_bytes") or 0)),
            tx_rate="–" if win is None else fmt_bytes(win.tx_bytes_per_s) + "/s",
            rx_rate="–" if win is None else fmt_bytes(win.rx_bytes_per_s) + "/s",
            req_rate="–" if win is None else _fmt_rate(win.tx_requests_per_s + win.rx_requests_per_s),
            window="no rate yet: one sample" if win is None else f"last {fmt_duration(win.seconds)}",
            p50=_fmt_us(q.p50_us),
            p90=_fmt_us(q.p90_us),
            p99=_fmt_us(q.p99_us),
            quantile_scope=scope,
            errors=errors,
            new_errors=w_err,
            dropped=dropped,
            new_dropped=w_drop,
            # Failures long past should not light the row up at 3 a.m.: with a window, only new
            # ones do (the totals stay in the errors column).
            problem=alive is False
            or (bool(w_err or w_drop) if win is not None else bool(errors) or dropped > 0),
            rates=None if win is None else win.to_json(),
        )
        by_host.setdefault(row.host, []).append(row)
    return NixlView(
        hosts=[HostGroup(h, rows) for h, rows in sorted(by_host.items())],
        agents=sum(len(r) for r in by_host.values()),
        total_errors=total_err,
        total_dropped=total_drop,
        new_errors=new_err,
        new_dropped=new_drop,
        window_s=RATE_WINDOW_S,
    )
