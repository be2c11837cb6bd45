"""What a diagnosis is made of and how it is written: the report's schema and verdicts, the data model
(Target, Data, Finding, Report), the robust statistics the checks share, numbers and times for people,
and a finding's per-host chart. The registry of checks (checks.py), the loading (load.py), diagnose.py
and the HTML page (report.py) all build on it; it imports none of them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = "diagnose/2"  # the JSON report's "schema" (docs/diagnose.md); bumped when a field changes meaning


# A finding's scope: `hosts`, a subset of the job's hosts is at fault (culprit_hosts names them: the
# ones to exclude, resubmit without, heal); `fleet`, the whole job or shared infrastructure (storage,
# the job's own processes): no culprit, its hosts are the affected ones. Only `hosts` feeds --exclude.
SCOPES = ("hosts", "fleet")


def set_scope(f: Finding, job_hosts: list[str]) -> None:
    """`fleet` for a finding that names no host or every host of a job with two or more (a cause they
    all share), else `hosts`."""
    every = len(job_hosts) > 1 and set(job_hosts) <= set(f.hosts)
    f.scope = "fleet" if every or not f.hosts else "hosts"


VERDICTS = (
    "network",
    "gpu_thermal",
    "gpu_power",
    "gpu_hardware",
    "cpu_contention",
    "io_pressure",
    "memory",
    "training_dynamics",
    "hang",
    "heartbeat_false_positive",
    "none",
)


@dataclasses.dataclass
class Finding:
    kind: str  # a verdict, or host_outlier / vs_difference / heartbeat_timeout
    summary: str
    hosts: list[str]
    window: tuple[float, float] | None
    queries: list[str]
    values: dict
    score: float  # ranking; findings that may decide the verdict have decides=True
    decides: bool = True
    plot: dict | None = None  # {"title", "unit", "series": {host: (t, y)}, "highlight": [hosts]}
    extra: dict = dataclasses.field(default_factory=dict)  # more top-level fields (accused_hosts, ...)
    verify: list[dict] = dataclasses.field(default_factory=list)  # the checks of its deciding signals (add_verify)
    scope: str = "hosts"  # SCOPES: hosts (a subset at fault: the culprits) or fleet (set by set_scope)

    def culprits(self) -> list[str]:
        """The hosts at fault: the finding's hosts when its scope is `hosts`, none for a `fleet` one."""
        return list(self.hosts) if self.scope == "hosts" else []

    def as_json(self) -> dict:
        w = {"start": round(self.window[0], 3), "end": round(self.window[1], 3)} if self.window else None
        return {
            "kind": self.kind,
            "summary": self.summary,
            "hosts": self.hosts,
            "scope": self.scope,
            "culprit_hosts": self.culprits(),
            **self.extra,
            "window": w,
            "queries": self.queries,
            "values": _jsonable(self.values),
            "score": round(self.score, 3),
            "verify": _jsonable(self.verify),
        }


@dataclasses.dataclass
class Target:
    name: str
    tsdb: Path
    job_dir: Path | None
    log: Path | None


PerHost = dict[str, dict[str, np.ndarray]]  # family key -> host -> values on the grid


@dataclasses.dataclass
class Data:
    """What the range queries returned for one job, on one time grid."""

    target: Target
    start: float
    end: float
    step: float
    interval: float
    names: set[str]
    grid: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    hosts: list[str] = dataclasses.field(default_factory=list)
    gauges: PerHost = dataclasses.field(default_factory=dict)  # max by host
    gpu_min: PerHost = dataclasses.field(default_factory=dict)  # min by host (GPU signals)
    rates: PerHost = dataclasses.field(default_factory=dict)  # counters, per second
    peaks: PerHost = dataclasses.field(default_factory=dict)  # max_over_time by host (pressure)
    throttle: PerHost = dataclasses.field(default_factory=dict)  # GPUs with throttle bits, by host
    deltas: PerHost = dataclasses.field(default_factory=dict)  # increase over the whole range, by host
    tb: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    queries: dict[str, str] = dataclasses.field(default_factory=dict)
    train: tuple[float, float] | None = None
    phases: list[dict] = dataclasses.field(default_factory=list)
    n_queries: int = 0

    def has(self, *names: str) -> bool:
        return any(n in self.names for n in names)

    def mask(self, window: tuple[float, float] | None = None) -> np.ndarray:
        lo, hi = window or self.train or (self.start, self.end)
        return (self.grid >= lo) & (self.grid <= hi)


@dataclasses.dataclass
class Report:
    data: Data
    findings: list[Finding] = dataclasses.field(default_factory=list)
    ruled_out: list[dict] = dataclasses.field(default_factory=list)
    skipped: list[dict] = dataclasses.field(default_factory=list)
    missing: set[str] = dataclasses.field(default_factory=set)
    notes: list[str] = dataclasses.field(default_factory=list)
    gaps: list[dict] = dataclasses.field(default_factory=list)  # load.data_gaps: hosts without samples, when
    vs: dict | None = None

    def clean(self, check: str, detail: str, families: Iterable[str]) -> None:
        used = {f for f in families if f in self.data.names or not f.startswith(("hw_", "tb_", "ray_"))}
        self.ruled_out.append({"check": check, "families": sorted(used), "detail": detail})


def _jsonable(x: object) -> object:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        v = float(x)
        if not math.isfinite(v):
            return None
        return round(v, 3) if abs(v) >= 1e6 else float(f"{v:.6g}")  # unix times keep their milliseconds
    return x


# A verify check's reducers: what each series' values (finite ones) become, one number per host.
REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "max": max,
    "min": min,
    "mean": lambda v: sum(v) / len(v),
    "median": lambda v: float(np.median(v)),
    "last": lambda v: v[-1],
    "delta": lambda v: v[-1] - v[0],
}
TOLERANCE = 1e-4  # relative: a rerun verify check matches when every value agrees this closely


def check_values(rows: list[dict], reducer: str, culprits: list[str], accused: list[str]) -> tuple[dict, dict]:
    """A verify check's range-query result ROWS -> (every host's value under REDUCER, the check's `expect`):
    the culprits' and accused hosts' values, and `job` (a job-level series), `peers_median` (the other
    hosts') or `hosts_median` (every host's, when no host or every host is to blame). diagnose.py makes
    `expect` with it and diagnosis/verify.py checks a rerun with it: one reduction for both."""
    red = REDUCERS[reducer]
    got: dict[str, float] = {}
    for r in rows:
        xs = [x for x in (float(p[1]) for p in r["values"]) if math.isfinite(x)]
        if xs:
            got[r["metric"].get("host", "")] = red(xs)
    expect: dict = {"culprits": {h: got.get(h) for h in culprits}}
    if accused:
        expect["accused"] = {h: got.get(h) for h in accused}
    if set(got) == {""}:
        expect["job"] = got[""]
    elif (culprits or accused) and set(got) - set(culprits) - set(accused):
        expect["peers_median"] = float(np.median([x for h, x in got.items() if h not in culprits + accused]))
    else:  # no culprit, or every host is one: the level of every host (compare with the baseline)
        expect["hosts_median"] = float(np.median(list(got.values()))) if got else None
    return got, expect


def close(a: float | None, b: float | None, tol: float = TOLERANCE) -> bool:
    """Two values of a verify check agree: both absent, or equal within TOL relative (1e-9 absolute)."""
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= max(tol * max(abs(a), abs(b)), 1e-9)


def nanmed(x: np.ndarray | list) -> float:
    a = np.asarray(x, float)
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else math.nan


def robust_sd(x: np.ndarray) -> float:
    a = x[np.isfinite(x)]
    return float(1.4826 * np.median(np.abs(a - np.median(a)))) if a.size else math.nan


def peer_median(series: dict[str, np.ndarray], host: str) -> np.ndarray:
    """Median over the other hosts at each grid point."""
    others = [v for h, v in series.items() if h != host]
    if not others:
        return np.full_like(series[host], np.nan)
    return np.nanmedian(np.vstack(others), axis=0)


def deviation_fraction(series: dict[str, np.ndarray], mask: np.ndarray, test: Callable) -> dict[str, float]:
    """Per host: the fraction of points under mask where test(value, peer_median) holds."""
    out = {}
    for h, v in series.items():
        peer = peer_median(series, h)
        ok = mask & np.isfinite(v) & np.isfinite(peer)
        with np.errstate(all="ignore"):
            out[h] = float(np.mean(test(v[ok], peer[ok]))) if ok.sum() >= 2 else 0.0
    return out


def robust_z(values: dict[str, float], floor: float) -> dict[str, float]:
    """(x - median) / max(1.4826 * MAD, floor) over hosts."""
    xs = np.array([v for v in values.values() if math.isfinite(v)])
    if xs.size < 3:
        return {h: 0.0 for h in values}
    med = float(np.median(xs))
    scale = max(1.4826 * float(np.median(np.abs(xs - med))), floor, 1e-12)
    return {h: (v - med) / scale if math.isfinite(v) else 0.0 for h, v in values.items()}


def window_medians(series: dict[str, np.ndarray], mask: np.ndarray, bad: list[str]) -> tuple[dict[str, float], float]:
    """Each host's median under MASK, and the median of those of the hosts not in BAD (the peers): the
    numbers a verify check gives for a finding's window (a median reducer, `peers_median`)."""
    med = {h: nanmed(v[mask]) for h, v in series.items()}
    return med, nanmed([x for h, x in med.items() if h not in bad])


def window_of(grid: np.ndarray, hit: np.ndarray, step: float) -> tuple[float, float] | None:
    idx = np.flatnonzero(hit)
    return (float(grid[idx[0]] - step), float(grid[idx[-1]])) if idx.size else None


def rolling_median(y: np.ndarray, k: int) -> np.ndarray:
    if y.size < k:
        return y.copy()
    pad = k // 2
    ext = np.concatenate([np.full(pad, y[0]), y, np.full(pad, y[-1])])
    return np.median(np.lib.stride_tricks.sliding_window_view(ext, k), axis=1)


def fmt(v: float, unit: str = "") -> str:
    if not math.isfinite(v):
        return "n/a"
    a = abs(v)
    s = (
        f"{v / 1e12:.3g}T"
        if a >= 1e12
        else f"{v / 1e9:.3g}G"
        if a >= 1e9
        else f"{v / 1e6:.3g}M"
        if a >= 1e6
        else f"{v / 1e3:.3g}k"
        if a >= 1e4
        else f"{v:.3g}"
    )
    return s + unit


def utc(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t)) if t is not None else "?"


def dur(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def series_plot(title: str, unit: str, series: dict[str, np.ndarray], d: Data, hi: list[str]) -> dict:
    return {"title": title, "unit": unit, "series": {h: (d.grid, v) for h, v in series.items()}, "highlight": hi}


def draw_hosts(ax: Any, f: Finding, x0: float, *also: Any) -> None:
    """Finding F's per-host signal on AX (matplotlib Axes; hours since X0): its culprits in colour and
    named, the peers in grey, F's window shaded on AX and on the axes in ALSO."""
    everyone = not f.plot["highlight"]  # nothing singled out: every host in one colour
    for h, (t, y) in f.plot["series"].items():
        hot = h in f.plot["highlight"]
        ax.plot(
            (t - x0) / 3600,
            y,
            lw=1.4 if hot else 0.7,
            color="tab:blue" if everyone else (None if hot else "0.7"),
            alpha=0.5 if everyone else 1,
            label=h if hot else None,
            zorder=3 if hot else 1,
        )
    if f.window:
        for a in (*also, ax):
            a.axvspan((f.window[0] - x0) / 3600, (f.window[1] - x0) / 3600, color="tab:red", alpha=0.08)
    ax.set_ylabel(f.plot["unit"])
    grey = "" if everyone or "grey" in f.plot["title"] else " (grey: peers)"
    ax.set_title(f"{f.kind}: {f.plot['title']}{grey}")
    if 0 < len(f.plot["highlight"]) <= 8:
        ax.legend(loc="best", fontsize=8)
