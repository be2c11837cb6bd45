"""Usage: diagnose.py JOB [--vs OTHER_JOB|auto] [--json] [--plot DIR] [--report DIR] [--workspace DIR]

Diagnoses a job from its metrics: serves the job's Prometheus TSDB once (a private copy, see
utils/diagnosis/tsdb.py), finds which metric families it holds (hw_*, tb_*, ray_*), runs a few range
queries over the job's own time range and then playbooks that each return findings with their
evidence (the PromQL run, the hosts, the time window, the values seen):

  hang                      steps stopped, GPUs 100 % busy at standby power (collective deadlock)
  heartbeat_false_positive  hosts JAX declared dead kept drawing power / logging steps
  network                   hosts whose TCP/RDMA retransmits rose when throughput dropped
  gpu_thermal, gpu_power    hot / clock-throttled / power-capped GPUs on some hosts
  gpu_hardware              ECC/RAS, PCIe AER errors, degraded PCIe links
  cpu_contention            run queue up on a host vs its peers (or everywhere vs --vs)
  io_pressure, memory       IO stalls (PSI), host OOM kills and memory pressure
  training_dynamics         loss / MoE load-balance loss / grad-norm spikes, systems clean
and compares every host with its peers for every hw_ family. With --vs OTHER_JOB it ranks every
family by how much it differs between the two jobs (per host, robust effect size); --vs auto
picks OTHER_JOB itself: the latest completed job of the same model (sharing hosts with JOB when
one does) that ended before JOB started. When nothing is found and such a job exists, the report
suggests --vs auto. Every finding carries `verify`: one query, range and reducer that show its
deciding signal, with the values diagnose got per host (docs/diagnose.md).

JOB and OTHER_JOB: a job id or a job name (<id>-JAX-<model>[-<tag>]), looked up in --workspace
(default $JOB_WORKSPACE or <repo>/outputs), a job dir, its log or a TSDB dir; an id that two jobs
share is an error that lists their names.
--json prints the report for programs (schema: docs/diagnose.md); --plot DIR writes PNG charts
of the evidence; --report DIR writes one self-contained HTML page of it (DIR/<job name>-report.html).
Exit 0 when diagnosed (even with too little data: it says so), 2 on bad input, 1 when Prometheus
could not serve the data.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from diagnosis import cli, tsdb
from diagnosis import locate as lookup
from diagnosis.cli import InputError
from diagnosis.locate import default_workspace
from diagnosis.rdma import is_rdma_retransmit

try:
    from diagnosis import joblog  # the one parser of the job log format (utils/diagnosis/joblog.py)
except ImportError:  # pragma: no cover - joblog is part of the repo; without it log facts are missing
    joblog = None

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "diagnose/1"  # the JSON report's "schema" (docs/diagnose.md); bumped when a field changes meaning
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
POINTS = 480  # target points per range query (step = range / POINTS, at least the scrape interval)
MAX_SAMPLES = 20_000  # samples per series in the range above which the step doubles (a long job at 5 s)
HB_TIMEOUT = 100.0  # JAX's default heartbeat timeout, seconds
TRAIN_COST_PCT = 5.0  # a training-scalar spike is an incident when tokens/s fell by more than this from it on

# The checks and the families each needs (any one of them is enough to run it).
NEEDS: dict[str, tuple[str, ...]] = {
    "hang": ("hw_gpu_utilization_pct", "hw_gpu_power_watts"),
    "heartbeat_false_positive": ("hw_gpu_power_watts", "tb_step"),
    "network": ("hw_tcp_retransmits_total", "hw_ib_port_transport_errors_total", "hw_ib_port_errors_total"),
    "gpu_thermal": ("hw_gpu_temperature_celsius", "hw_gpu_clock_mhz", "hw_gpu_throttle_reasons"),
    "gpu_power": ("hw_gpu_power_limit_watts", "hw_gpu_power_watts", "hw_gpu_throttle_reasons"),
    "gpu_hardware": ("hw_gpu_ras_errors_total", "hw_gpu_pcie_aer_errors_total", "hw_gpu_pcie_link_width"),
    "cpu_contention": ("hw_procs_running", "hw_cpu_pressure_some_pct"),
    "io_pressure": ("hw_io_pressure_full_pct", "hw_io_pressure_some_pct", "hw_procs_blocked"),
    "memory": ("hw_oom_kills_total", "hw_memory_available_bytes", "hw_memory_pressure_full_pct"),
    "training_dynamics": ("tb_learning_loss", "tb_learning_moe_lb_loss", "tb_learning_grad_norm"),
    "throughput": ("tb_perf_per_device_tokens_per_sec", "tb_perf_step_time_seconds"),
}
OPTIONAL = {"hw_gpu_throttle_reasons"}  # NVIDIA only: its absence on AMD is no gap in the evidence
# Which verdict a family points to when it differs between two jobs (--vs), and which way is worse.
VS_CATEGORY: list[tuple[str, str, int]] = [  # first match wins; within a verdict, earlier entries lead
    (r"hw_procs_running", "cpu_contention", +1),
    (r"hw_cpu_pressure_.*|hw_load\d+", "cpu_contention", +1),
    (r"hw_io_pressure_.*|hw_procs_blocked", "io_pressure", +1),
    (r"hw_memory_pressure_.*|hw_oom_kills_total|hw_major_page_faults_total", "memory", +1),
    (r"hw_memory_available_bytes", "memory", -1),
    (r"hw_tcp_(retransmits|timeouts)_total|hw_ib_port_(transport_)?errors_total", "network", +1),
    (r"hw_gpu_temperature_celsius", "gpu_thermal", +1),
    (r"hw_gpu_power_limit_watts", "gpu_power", -1),
    (r"hw_gpu_ras_errors_total|hw_gpu_pcie_aer_errors_total", "gpu_hardware", +1),
]


# --- data model ---------------------------------------------------------------------------
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
    verify: dict | None = None  # how to check the deciding signal yourself (see add_verify)

    def as_json(self) -> dict:
        w = {"start": round(self.window[0], 3), "end": round(self.window[1], 3)} if self.window else None
        return {
            "kind": self.kind,
            "summary": self.summary,
            "hosts": self.hosts,
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


# --- finding the job ----------------------------------------------------------------------
def locate(arg: str, workspace: Path | None = None, what: str = "JOB") -> Target:
    """The job ARG names (diagnosis/locate.py's rule; a TSDB dir is also taken) and its TSDB;
    InputError with one line otherwise (what: the argument's name in that line)."""
    job = lookup.find(arg, workspace, what=what, tsdb=tsdb.is_tsdb)
    if job.dir is None and job.log is not None:
        raise InputError(f"{arg} is not a directory and no job dir is beside it: {lookup.forms(tsdb=True)}")
    if job.dir is not None and not (job.dir / "prometheus").is_dir():
        raise InputError(f"{job.dir} has no saved metrics (no prometheus/): only RAY=1 jobs record a TSDB")
    try:
        db = tsdb.resolve(job.dir or job.path)
    except tsdb.TSDBError as e:
        raise InputError(str(e)) from None
    job_dir = job.dir or (db.parent if db.name == "prometheus" else None)
    log = job.log or (lookup.log_of(job_dir) if job_dir else None)
    return Target(job_dir.name if job_dir else db.name, db, job_dir, log)


@dataclasses.dataclass
class JobFacts:
    """What --vs auto needs to know of a job: from its log's JOB header, summary.txt and TSDB blocks."""

    dir: Path
    model: str | None
    hosts: list[str]
    status: str | None
    first: float | None  # the TSDB's time range (unix s), from its blocks' meta.json
    last: float | None


def _head(log: Path | None) -> dict[str, str]:
    """The key: value lines of the log's JOB header (its first lines)."""
    if log is None:
        return {}
    try:
        with log.open(errors="replace") as fh:
            lines = [ln.rstrip("\n") for ln in itertools.islice(fh, 80)]
    except OSError:
        return {}
    if not lines or not lines[0].startswith("=====") or joblog is None:
        return {}
    end = next((i for i, ln in enumerate(lines[1:], 1) if ln.startswith("=====")), len(lines))
    return joblog.parse_block(lines[1:end])


def _span(db: Path) -> tuple[float, float] | None:
    """The time range the TSDB's blocks hold (unix s); None without a readable block."""
    lo, hi = math.inf, -math.inf
    for meta in db.glob("*/meta.json"):
        try:
            m = json.loads(meta.read_text())
            lo, hi = min(lo, m["minTime"] / 1000), max(hi, m["maxTime"] / 1000)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return (lo, hi) if lo <= hi else None


def job_facts(job_dir: Path, db: Path | None = None) -> JobFacts:
    head = _head(lookup.log_of(job_dir))
    summary = job_dir / "summary.txt"
    status = None
    if summary.is_file() and joblog:
        status = joblog.parse_block(summary.read_text(errors="replace").splitlines()).get("status")
    nodes = re.search(r"\(([^)]*)\)", head.get("nodes", ""))
    span = _span(db or job_dir / "prometheus")
    return JobFacts(
        job_dir,
        head.get("model", "").split(" ")[0] or None,
        nodes.group(1).split() if nodes else [],
        status,
        span[0] if span else None,
        span[1] if span else None,
    )


def pick_baseline(target: Target, workspace: Path | None) -> tuple[Target, dict] | None:
    """--vs auto: the latest completed job of the same model that ended before the target started,
    preferring one that shares hosts with it; (its Target, what was picked and why) or None."""
    if target.job_dir is None:
        return None
    me = job_facts(target.job_dir, target.tsdb)
    ws = workspace if workspace is not None and workspace.is_dir() else target.job_dir.parent
    if me.model is None or me.first is None:
        return None
    cands = []
    try:
        entries = [p for p in ws.iterdir() if "-JAX-" in p.name and p.is_dir() and p != target.job_dir]
    except OSError:
        return None
    for p in entries:
        if lookup.EARLIER.search(p.name) or not tsdb.is_tsdb(p / "prometheus"):
            continue
        f = job_facts(p)
        if f.model == me.model and f.status == "completed" and f.last is not None and f.last <= me.first:
            cands.append((len(set(f.hosts) & set(me.hosts)), f))
    if not cands:
        return None
    shared = any(n for n, _ in cands)
    n, best = max(((n, f) for n, f in cands if n or not shared), key=lambda x: x[1].last)
    why = f"the latest completed {me.model} job that ended before this one started" + (
        f" and shares hosts with it ({n} of {len(me.hosts)})" if shared else " (none shares hosts with it)"
    )
    info = {"picked": best.dir.name, "ended": best.last, "shared_hosts": n, "candidates": len(cands), "why": why}
    return locate(str(best.dir), ws), info


# --- numeric helpers ----------------------------------------------------------------------
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


def window_of(grid: np.ndarray, hit: np.ndarray, step: float) -> tuple[float, float] | None:
    idx = np.flatnonzero(hit)
    return (float(grid[idx[0]] - step), float(grid[idx[-1]])) if idx.size else None


def rolling_median(y: np.ndarray, k: int) -> np.ndarray:
    if y.size < k:
        return y.copy()
    pad = k // 2
    ext = np.concatenate([np.full(pad, y[0]), y, np.full(pad, y[-1])])
    return np.median(np.lib.stride_tricks.sliding_window_view(ext, k), axis=1)


def change_points(y: np.ndarray, min_len: int, rel: float, depth: int = 3) -> list[int]:
    """Binary segmentation on the mean: split indexes where both sides differ by >= rel."""
    n = y.size
    if depth == 0 or n < 2 * min_len:
        return []
    c1, c2 = np.cumsum(y), np.cumsum(y * y)
    k = np.arange(min_len, n - min_len + 1)
    left = c2[k - 1] - c1[k - 1] ** 2 / k
    right = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    best = int(k[np.argmin(left + right)])
    a, b = float(np.mean(y[:best])), float(np.mean(y[best:]))
    if abs(a - b) / max(abs(a), abs(b), 1e-12) < rel:
        return []
    return (
        change_points(y[:best], min_len, rel, depth - 1)
        + [best]
        + [best + i for i in change_points(y[best:], min_len, rel, depth - 1)]
    )


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


# --- loading ------------------------------------------------------------------------------
def nice_step(seconds: float) -> float:
    for s in (1, 2, 5, 10, 15, 20, 30, 60, 120, 180, 240, 300, 360, 480, 600, 720, 900, 1200, 1800, 3600):
        if s >= seconds:
            return float(s)
    return float(math.ceil(seconds / 3600) * 3600)


def _key(metric: dict[str, str], labels: tuple[str, ...]) -> str:
    extra = ",".join(f'{k}="{metric[k]}"' for k in labels if metric.get(k))
    return f"{metric.get('__name__', '')}{{{extra}}}" if extra else metric.get("__name__", "")


def _to_grid(values: list, start: float, step: float, n: int) -> np.ndarray:
    out = np.full(n, np.nan)
    if values:
        t = np.fromiter((p[0] for p in values), float, len(values))
        v = np.array([p[1] for p in values], dtype=float)
        idx = np.rint((t - start) / step).astype(int)
        ok = (idx >= 0) & (idx < n)
        out[idx[ok]] = v[ok]
    return out


def _per_host(rows: list[dict], d: Data, labels: tuple[str, ...] = ()) -> PerHost:
    out: PerHost = {}
    for r in rows:
        host = r["metric"].get("host")
        if host:
            out.setdefault(_key(r["metric"], labels), {})[host] = _to_grid(r["values"], d.start, d.step, d.grid.size)
    return out


def _rates(counters: PerHost, step: float) -> PerHost:
    """Counter sums on the grid -> per-second rates (a drop, i.e. a reset, gives NaN). Across a gap
    (scrapes that failed: a host with a bad network misses some) the increase is spread over it, so
    the points after the gap carry the rate instead of losing it."""
    out: PerHost = {}
    for key, hosts in counters.items():
        for h, c in hosts.items():
            r = np.full_like(c, np.nan)
            idx = np.flatnonzero(np.isfinite(c))
            if idx.size >= 2:
                with np.errstate(invalid="ignore"):
                    rate = np.diff(c[idx]) / (np.diff(idx) * step)
                rate = np.where(rate >= 0, rate, np.nan)
                for (a, b), v in zip(zip(idx[:-1], idx[1:], strict=True), rate, strict=True):
                    r[a + 1 : b + 1] = v  # every grid point of the gap gets the mean rate over it
            out.setdefault(key, {})[h] = r
    return out


def _names(prom: tsdb.Served, start: float, end: float) -> set[str]:
    return set(prom.label_values("__name__", '{__name__=~"hw_.+|tb_.+|ray_.+"}', start, end))


def _interval(prom: tsdb.Served, names: set[str], start: float, end: float) -> float:
    span = max(end - start, 1.0)
    for ref in ("hw_procs_running", "hw_load1", "hw_gpu_power_watts", "ray_node_cpu_utilization"):
        if ref in names:
            rows = prom.query(f"max(count_over_time({ref}[{int(span) + 1}s]))", end)
            if rows and float(rows[0]["value"][1]) > 1:
                return span / (float(rows[0]["value"][1]) - 1)
    return 15.0


def _queries(d: Data) -> dict[str, str]:
    """The range queries to run, by what they feed; only those whose families exist."""
    s, q = f"{int(d.step)}s", {}
    if any(n.startswith(("hw_", "ray_node_")) and not n.endswith("_total") for n in d.names):
        q["gauges"] = (
            'max by (__name__, host, type, sensor) ({__name__=~"hw_.+|ray_node_.+", '
            '__name__!~".+_total|hw_gpu_throttle_reasons|hw_gpu_info"})'
        )
    if d.has("hw_gpu_utilization_pct", "hw_gpu_clock_mhz", "hw_gpu_power_limit_watts", "hw_gpu_pcie_link_width"):
        q["gpu_min"] = (
            'min by (__name__, host) ({__name__=~"hw_gpu_(utilization_pct|clock_mhz|power_limit_watts|'
            'pcie_link_width)", type!="memory"})'
        )
    if any(n.startswith("hw_") and n.endswith("_total") for n in d.names):
        q["counters"] = 'sum by (__name__, host, mode, kind, severity, counter) ({__name__=~"hw_.+_total"})'
    for name in (
        "hw_io_pressure_full_pct",
        "hw_io_pressure_some_pct",
        "hw_memory_pressure_full_pct",
        "hw_memory_pressure_some_pct",
    ):
        if name in d.names:
            q[f"peak:{name}"] = f"max by (host) (max_over_time({name}[{s}]))"
    if "hw_gpu_throttle_reasons" in d.names:
        x = "hw_gpu_throttle_reasons"
        q["throttle:thermal"] = f"count by (host) (floor({x} / 32) % 4 > 0 or floor({x} / 8) % 2 > 0)"
        q["throttle:power"] = f"count by (host) (floor({x} / 4) % 2 > 0 or floor({x} / 128) % 2 > 0)"
    tb = {
        "tokens": ("avg", "tb_perf_per_device_tokens_per_sec"),
        "step_time": ("avg", "tb_perf_step_time_seconds"),
        "tflops": ("avg", "tb_perf_per_device_tflops_per_sec"),
        "steps": ("count", "tb_step"),
        "step": ("max", "tb_step"),
        "loss": ("max", "tb_learning_loss"),
        "moe_lb_loss": ("max", "tb_learning_moe_lb_loss"),
        "grad_norm": ("max", "tb_learning_grad_norm"),
    }
    for key, (fn, name) in tb.items():
        if name in d.names:
            q[f"tb:{key}"] = f"{'sum' if fn == 'count' else 'max'}({fn}_over_time({name}[{s}]))"
    return q


def _deltas(d: Data) -> dict[str, str]:
    """Instant queries: each counter's increase over the whole range, by host: its last value minus its first
    (of a counter, what max_over_time - min_over_time of the range gives), read from the last and the first
    hour only, so a long job's every sample is not read."""
    hour = 3601  # s: a window holds a sample at its start
    last, first = f"[{hour}s] @ {d.end:.0f}", f"[{hour}s] @ {d.start + hour - 1:.0f}"
    q = {}
    for name, by in (
        ("hw_oom_kills_total", ""),
        ("hw_gpu_ras_errors_total", ", kind"),
        ("hw_gpu_pcie_aer_errors_total", ", severity"),
    ):
        if name in d.names:
            q[name] = (
                f"sum by (host{by}) (last_over_time({name}{last})) - sum by (host{by}) (min_over_time({name}{first}))"
            )
    return q


def load(target: Target, prom: tsdb.Served) -> Data:
    """Discover the families, then run every range query once (in parallel)."""
    start, end = prom.first, prom.last
    assert start is not None and end is not None
    names = _names(prom, start, end)
    interval = _interval(prom, names, start, end)
    step = nice_step(max(interval, (end - start) / POINTS, 1.0))
    if (end - start) / interval > MAX_SAMPLES:
        step = nice_step(2 * step)
    d = Data(target, start, end, step, interval, names)
    d.grid = start + step * np.arange(int((end - start) // step) + 1)
    d.queries = _queries(d)
    deltas = _deltas(d)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futs = {k: pool.submit(prom.query_range, q, start, end, step) for k, q in d.queries.items()}
        dfuts = {k: pool.submit(prom.query, q, end) for k, q in deltas.items()}
        res = {k: f.result() for k, f in futs.items()}
        dres = {k: f.result() for k, f in dfuts.items()}
    d.queries.update({f"delta:{k}": f"{q}   @ {end:.0f}" for k, q in deltas.items()})  # instant, at the end
    d.gauges = _per_host(res.get("gauges", []), d, ("type", "sensor"))
    d.gpu_min = _per_host(res.get("gpu_min", []), d)
    d.rates = _rates(_per_host(res.get("counters", []), d, ("mode", "kind", "severity", "counter")), step)
    for k, rows in res.items():
        kind, _, name = k.partition(":")
        if kind == "peak":
            d.peaks[name] = _per_host(rows, d).get("", {})
        elif kind == "throttle":
            d.throttle[name] = {
                r["metric"]["host"]: _to_grid(r["values"], start, step, d.grid.size)
                for r in rows
                if "host" in r["metric"]
            }
        elif kind == "tb":
            d.tb[name] = _to_grid(rows[0]["values"], start, step, d.grid.size) if rows else np.full(d.grid.size, np.nan)
    for k, rows in dres.items():
        for r in rows:
            if "host" in r["metric"]:
                sub = r["metric"].get("kind") or r["metric"].get("severity") or ""
                d.deltas.setdefault(f"{k}{{{sub}}}" if sub else k, {})[r["metric"]["host"]] = float(r["value"][1])
    hosts = set()
    for fam in (d.gauges, d.gpu_min, d.rates):
        for per in fam.values():
            hosts.update(per)
    d.hosts = sorted(hosts, key=lambda h: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", h)])
    d.n_queries = prom.queries
    d.train = train_window(d)
    d.phases = phases(d)
    return d


def train_window(d: Data) -> tuple[float, float] | None:
    """From the first to the last grid point with steps (tb_step), else with busy GPUs."""
    steps = d.tb.get("steps")
    if steps is not None and np.nansum(steps) > 0:
        idx = np.flatnonzero(np.nan_to_num(steps) > 0)
        return float(d.grid[idx[0]]), float(d.grid[idx[-1]])
    util = d.gauges.get("hw_gpu_utilization_pct")
    busy = np.nanmax(np.vstack(list(util.values())), axis=0) > 50 if util else np.zeros(0, bool)
    if busy.any():
        idx = np.flatnonzero(busy)
        return float(d.grid[idx[0]]), float(d.grid[idx[-1]])
    return None


def phases(d: Data) -> list[dict]:
    """Throughput phases: change points of tokens/s (or 1/step time), short dips smoothed out."""
    y = d.tb.get("tokens")
    inverse = False
    if y is None or not np.isfinite(y).any():
        y, inverse = d.tb.get("step_time"), True
    if y is None:
        return []
    ok = np.isfinite(y) & d.mask()
    t, v = d.grid[ok], y[ok]
    if inverse:
        with np.errstate(divide="ignore"):
            v = 1.0 / v
    if v.size < 4:
        return [{"start": float(t[0]), "end": float(t[-1]), "level": nanmed(v)}] if v.size else []
    sm = rolling_median(v, 7)
    cuts = [0] + change_points(sm, max(6, v.size // 12), 0.05) + [v.size]
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        level = float(np.median(v[a:b]))
        if out and abs(level - out[-1]["level"]) / max(level, out[-1]["level"]) < 0.04:
            out[-1]["end"] = float(t[b - 1])
            out[-1]["level"] = float(np.median(v[(t >= out[-1]["start"]) & (t <= t[b - 1])]))
            continue
        out.append({"start": float(t[a] - (d.step if a else 0)), "end": float(t[b - 1]), "level": level})
    unit = "steps/s" if inverse else "tokens/s/device"
    for p in out:
        p["unit"] = unit
    return out


# --- playbooks ----------------------------------------------------------------------------
def series_plot(title: str, unit: str, series: dict[str, np.ndarray], d: Data, hi: list[str]) -> dict:
    return {"title": title, "unit": unit, "series": {h: (d.grid, v) for h, v in series.items()}, "highlight": hi}


def _spin_tail(util: dict[str, np.ndarray], power: dict[str, np.ndarray], hosts: list[str]) -> tuple[int, dict]:
    """Index where the trailing run of "GPUs busy at low power on >= 75 % of the hosts" starts (size if none),
    and each host's full-power reference (90th percentile of its power while its GPUs were busy)."""
    ref, spin = {}, []
    for h in hosts:
        u, p = util.get(h), power.get(h)
        if u is None or p is None:
            continue
        busy = np.nan_to_num(u) >= 90
        ref[h] = float(np.nanpercentile(p[busy], 90)) if np.isfinite(p[busy]).any() else math.nan
        with np.errstate(invalid="ignore"):
            spin.append(busy & (p <= 0.5 * ref[h]))
    if not spin:
        return 0, ref
    frac = np.mean(np.vstack(spin), axis=0)
    i = frac.size
    while i > 0 and frac[i - 1] >= 0.75:
        i -= 1
    return i, ref


def check_hang(d: Data, rep: Report) -> None:
    util, power = d.gpu_min.get("hw_gpu_utilization_pct"), d.gauges.get("hw_gpu_power_watts")
    if not util or not power:
        return rep.skipped.append({"check": "hang", "needs": ["hw_gpu_utilization_pct", "hw_gpu_power_watts"]})
    first, ref = _spin_tail(util, power, d.hosts)
    steps = d.tb.get("steps")
    last = None
    if steps is not None and np.nansum(steps) > 0:
        last = float(d.grid[np.flatnonzero(np.nan_to_num(steps) > 0)[-1]])
        first = max(first, int(np.searchsorted(d.grid, last + d.step, side="left")))
    need = max(3, int(300 // d.step))
    if d.grid.size - first < need:
        return rep.clean(
            "hang",
            "steps advanced until the end of the data"
            if last and last >= d.end - need * d.step
            else "no tail with busy GPUs at low power",
            NEEDS["hang"],
        )
    tail = np.arange(d.grid.size) >= first
    start = last if last is not None else float(d.grid[first] - d.step)
    idle = [h for h in d.hosts if h in util and np.nanmean(util[h][tail] < 50) > 0.8]
    spinning = [h for h in ref if h not in idle]
    rep.findings.append(
        Finding(
            "hang",
            f"{'steps stopped' if last else 'GPUs went quiet'} at {utc(start)} ({dur(d.end - start)} before the "
            f"end of the data) while the GPUs of {len(spinning)}/{len(ref)} hosts stayed 100 % busy at standby "
            f"power: a collective deadlock"
            + (f"; {', '.join(idle)} had idle GPUs (never entered the collective)" if idle else ""),
            idle,
            (start, d.end),
            [d.queries["gpu_min"], d.queries["gauges"]] + ([d.queries["tb:steps"]] if "tb:steps" in d.queries else []),
            {
                "last_step_time": last,
                "hosts_spinning": len(spinning),
                "hosts": len(ref),
                "util_min_median": {h: nanmed(util[h][tail]) for h in ref},
                "power_median_w": {h: nanmed(power[h][tail]) for h in ref},
                "power_full_w": ref,
            },
            0.97,
            plot=series_plot("GPU power per host (max GPU)", "W", power, d, idle),
        )
    )


def check_heartbeat(d: Data, rep: Report, prom: tsdb.Served) -> None:
    log = d.target.log
    if log is None or joblog is None:
        rep.missing.add("job log" if log is None else "utils/diagnosis/joblog.py")
        return rep.skipped.append({"check": "heartbeat_false_positive", "needs": ["job log"]})
    summary = d.target.job_dir / "summary.txt" if d.target.job_dir else None
    if summary and summary.is_file():
        status = joblog.parse_block(summary.read_text(errors="replace").splitlines()).get("status")
        if status == "completed":  # a heartbeat claim ends the job: a completed one had none
            return rep.clean("heartbeat_false_positive", "the job completed (summary.txt)", ["summary.txt"])
    try:
        scan = joblog.scan(log)
    except (OSError, ValueError) as e:  # a binary or unreadable log (joblog.NotALog is a ValueError)
        rep.missing.add("job log")
        rep.notes.append(f"the job log could not be read ({e}): heartbeat claims not checked")
        return rep.skipped.append({"check": "heartbeat_false_positive", "needs": ["job log"]})
    claim = joblog.heartbeat_claim(scan)
    if claim is None:
        return rep.clean("heartbeat_false_positive", "the log holds no heartbeat claim", ["log"])
    if claim.time is None:
        rep.notes.append("the log's heartbeat claim has no absl time stamp: it cannot be lined up with the metrics")
        return rep.skipped.append({"check": "heartbeat_false_positive", "needs": ["job log"]})
    t_claim, tasks, accused = claim.time, claim.tasks, claim.hosts
    power = d.gauges.get("hw_gpu_power_watts", {})
    # "Alive up to the claim" must hold right before it: a host that froze or died stops at least one
    # heartbeat timeout (tens of seconds; ~56 s measured with JAX 0.12) before the claim, so a longer
    # look-back would count the work it did before it stopped.
    near = max(20.0, 2.5 * d.interval)
    q = f"max by (host) (min_over_time(hw_gpu_power_watts[{int(near)}s]))"
    at_claim = (
        {r["metric"]["host"]: float(r["value"][1]) for r in prom.query(q, t_claim) if "host" in r["metric"]}
        if power
        else {}
    )
    # training is synchronous: a step completed just before the claim means every host took part in it
    qs = "timestamp(tb_step)"
    rows = prom.query(qs, t_claim) if "tb_step" in d.names else []
    last_tb = max((float(r["value"][1]) for r in rows), default=math.nan)
    steps_to_claim = math.isfinite(last_tb) and last_tb >= t_claim - near
    alive, dead, values = [], [], {}
    for h in accused:
        base = nanmed(power[h][d.mask()]) if h in power else math.nan
        ratio = at_claim.get(h, math.nan) / base if base and math.isfinite(base) else math.nan
        seen = scan.hosts.get(h)
        last_step = seen.last_step_ts if seen else None
        logged = last_step is not None and last_step >= t_claim - near
        values[h] = {
            "power_at_claim_w": at_claim.get(h, math.nan),
            "power_training_w": base,
            "last_step_logged": last_step,
            "last_step": seen.last_step if seen else None,
        }
        (alive if (ratio >= 0.7 or logged or steps_to_claim) else dead).append(h)
    queries = [q + f"   @ {t_claim:.0f}"] + ([qs + f"   @ {t_claim:.0f}"] if rows else [])
    win = (t_claim - HB_TIMEOUT, t_claim)
    vals = {
        "claim_time": t_claim,
        "tasks": tasks,
        "hosts": values,
        "near_seconds": near,
        "last_tb_step_time": last_tb if math.isfinite(last_tb) else None,
    }
    if accused and not dead:
        rep.findings.append(
            Finding(
                "heartbeat_false_positive",
                f"JAX declared task(s) {tasks} ({', '.join(accused)}) dead at {utc(t_claim)}, "
                "but they were alive up to "
                f"the claim (GPU power in the last {near:.0f} s "
                f"{', '.join(fmt(values[h]['power_at_claim_w']) + ' W' for h in accused)}"
                + (f"; the last step {t_claim - last_tb:.0f} s before it" if steps_to_claim else "")
                + f"): the heartbeats were lost, not the hosts (look at the coordinator {claim.coordinator or '?'} "
                "and the network around that time)",
                [],  # the accused hosts were healthy: no culprit
                win,
                queries,
                vals,
                0.96,
                plot=series_plot("GPU power per host (max GPU)", "W", power, d, accused) if power else None,
                extra={"accused_hosts": accused, "suspect_hosts": [claim.coordinator] if claim.coordinator else []},
            )
        )
    elif dead:
        rep.findings.append(
            Finding(
                "heartbeat_timeout",
                f"{', '.join(dead)} stopped ({'GPU power fell, ' if power else ''}no steps"
                + (f"; the last one {t_claim - last_tb:.0f} s" if math.isfinite(last_tb) else "")
                + f" before JAX's heartbeat claim at {utc(t_claim)}): a real loss of the host or its process",
                dead,
                win,
                queries,
                vals,
                0.5,
                decides=False,
                extra={"accused_hosts": accused, "suspect_hosts": dead},
            )
        )
        rep.clean(
            "heartbeat_false_positive",
            "the accused hosts really stopped before the claim",
            ["hw_gpu_power_watts", "tb_step"],
        )


def _phase_windows(d: Data) -> tuple[dict, dict] | None:
    if len(d.phases) < 2:
        return None
    fast = max(d.phases, key=lambda p: p["level"])
    slow = min(d.phases, key=lambda p: p["level"])
    return (fast, slow) if slow["level"] <= 0.95 * fast["level"] else None


def _network_signals(d: Data) -> dict[str, tuple[dict[str, np.ndarray], float]]:
    """Per-host counter rates that mean retransmission or link trouble, with a rate floor (/s)."""
    out = {}
    for key, per in d.rates.items():
        name = key.split("{")[0]
        counter = re.search(r'counter="([^"]+)"', key)
        if name in ("hw_tcp_retransmits_total", "hw_tcp_timeouts_total"):
            out[key] = (per, 5.0)
        elif name == "hw_ib_port_transport_errors_total" and counter and is_rdma_retransmit(counter.group(1)):
            out[key] = (per, 0.5)
        elif name == "hw_ib_port_errors_total":
            out[key] = (per, 0.05)
    return out


def _network_bursts(d: Data, per: dict[str, np.ndarray], floor: float, m: np.ndarray) -> dict[str, np.ndarray]:
    """Hosts whose rate was at least the floor and 4x the median of the other hosts at the same
    moments, for 3 or more grid points of the training window: a fault for part of the run (no
    throughput phases found, the whole-run mean diluted). host -> those grid points."""
    out = {}
    for h, v in per.items():
        rest = [per[o] for o in per if o != h]
        if not rest:
            continue
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            om = np.nan_to_num(np.nanmedian(np.vstack(rest), axis=0))
        hit = m & (np.nan_to_num(v) >= np.maximum(floor, 4 * om))
        if hit.sum() >= 3:
            out[h] = hit
    return out if len(out) <= max(1, len(per) // 2) else {}


def check_network(d: Data, rep: Report) -> None:
    signals = _network_signals(d)
    if not signals:
        return rep.skipped.append({"check": "network", "needs": list(NEEDS["network"])})
    pw = _phase_windows(d)
    best: Finding | None = None
    for key, (per, floor) in signals.items():
        bad: list[str] = []
        if pw:
            fast, slow = pw
            mf, ms = d.mask((fast["start"], fast["end"])), d.mask((slow["start"], slow["end"]))
            r_fast = {h: float(np.nanmean(v[mf])) if mf.any() else math.nan for h, v in per.items()}
            r_slow = {h: float(np.nanmean(v[ms])) if ms.any() else math.nan for h, v in per.items()}
            z = robust_z(r_slow, floor / 4)
            peer = nanmed(list(r_slow.values()))
            # each host against the median of the OTHER hosts (with 2 hosts the culprit is half the median)
            others = {h: nanmed([r for o, r in r_slow.items() if o != h]) for h in r_slow}
            bad = [
                h
                for h in d.hosts
                if h in r_slow
                and r_slow[h] >= max(floor, 4 * np.nan_to_num(others[h]))
                and r_slow[h] >= 4 * r_fast.get(h, 0) + floor / 2
                and (z[h] >= 4 or len(per) < 3)
            ]
            score, win, how = (
                0.82,
                (slow["start"], slow["end"]),
                (
                    f"rose in the slow phase ({utc(slow['start'])} .. {utc(slow['end'])}: "
                    f"{fmt(slow['level'])} vs {fmt(fast['level'])} {slow.get('unit', '')})"
                ),
            )
        if not bad:  # no phases, or the fault was not in the slowest phase (a short one elsewhere)
            m = d.mask()
            r_slow = {h: float(np.nanmean(v[m])) if m.any() else math.nan for h, v in per.items()}
            r_fast = {}
            z = robust_z(r_slow, floor / 4)
            peer = nanmed(list(r_slow.values()))
            bad = [h for h in d.hosts if h in r_slow and r_slow[h] >= max(4 * floor, 10 * peer) and z[h] >= 6]
            score, win, how = 0.65, d.train, "are far above their peers over the whole run"
            burst = {} if bad else _network_bursts(d, per, floor, m)
            if burst:
                hit = np.logical_or.reduce(list(burst.values()))
                bad = [h for h in d.hosts if h in burst]
                r_slow = {h: float(np.nanmean(v[hit])) for h, v in per.items()}
                peer = nanmed([r for h, r in r_slow.items() if h not in bad])
                w = window_of(d.grid, hit, d.step)
                score, win = 0.75, w or d.train
                how = f"burst above every peer ({utc(win[0])} .. {utc(win[1])})"
        if not bad or len(bad) > max(1, len(per) // 2):
            continue
        rest = nanmed([r for h, r in r_slow.items() if h not in bad])
        peer = rest if math.isfinite(rest) else peer  # the peers: the hosts not accused
        rate = sum(r_slow[h] for h in bad)
        if best is None or rate / floor > best.values["_weight"]:
            q = f"sum by (host) (rate({key}[{int(max(d.step, 4 * d.interval))}s]))"
            best = Finding(
                "network",
                f"{key} {how} on {', '.join(bad)}: "
                + ", ".join(f"{h} {fmt(r_slow[h])}/s" for h in bad)
                + f" (peer median {fmt(peer)}/s)",
                bad,
                win,
                [d.queries["counters"] + f"   # {key}: rate by host", q],
                {
                    "signal": key,
                    "rate_per_s": {h: r_slow[h] for h in bad},
                    "peer_median_per_s": peer,
                    "rate_before_per_s": {h: r_fast.get(h, math.nan) for h in bad},
                    "_weight": rate / floor,
                    "phases": d.phases,
                },
                score,
                plot=series_plot(f"rate({key}) per host", "/s", per, d, bad),
            )
    if best:
        best.values.pop("_weight")
        rep.findings.append(best)
    else:
        detail = "no host's retransmit or link-error rate stands out" + (" (not even in the slow phase)" if pw else "")
        rep.clean("network", detail, NEEDS["network"])


def check_gpu_thermal(d: Data, rep: Report) -> None:
    temps = {k: v for k, v in d.gauges.items() if k.startswith("hw_gpu_temperature_celsius")}
    clock = d.gpu_min.get("hw_gpu_clock_mhz", {})
    thr = d.throttle.get("thermal", {})
    if not temps and not thr:
        return rep.skipped.append({"check": "gpu_thermal", "needs": ["hw_gpu_temperature_celsius"]})
    m = d.mask()
    hot: dict[str, float] = {}
    for key, per in temps.items():
        if "mem" in key:
            continue
        for h, f in deviation_fraction(per, m, lambda v, p: v >= p + 10).items():
            hot[h] = max(hot.get(h, 0.0), f)
    slow = deviation_fraction(clock, m, lambda v, p: v <= 0.9 * p) if clock else {}
    thr_frac = {h: float(np.nanmean(np.nan_to_num(v[m]) > 0)) for h, v in thr.items()} if thr else {}
    thr_peer = nanmed([thr_frac.get(h, 0.0) for h in d.hosts]) if thr else 0.0
    bad = [
        h
        for h in d.hosts
        if (hot.get(h, 0) >= 0.1 and (slow.get(h, 0) >= 0.05 or thr_frac.get(h, 0) >= 0.05))
        or (thr_frac.get(h, 0) >= 0.1 and thr_peer < 0.02 and hot.get(h, 0) >= 0.02)
    ]
    if not bad or len(bad) > max(1, len(d.hosts) // 2):
        return rep.clean(
            "gpu_thermal",
            "no host runs hotter than its peers with lower clocks or thermal throttling",
            NEEDS["gpu_thermal"],
        )
    key = next((k for k in temps if "junction" in k), next((k for k in temps if "mem" not in k), None))
    per = temps.get(key, {}) if key else {}
    hit = np.zeros(d.grid.size, bool)
    for h in bad:
        if h in per:
            hit |= m & (per[h] >= peer_median(per, h) + 10)
    vals = {
        h: {
            "temp_c": nanmed(per[h][hit]) if h in per and hit.any() else math.nan,
            "peer_temp_c": nanmed(peer_median(per, h)[hit]) if h in per and hit.any() else math.nan,
            "min_core_clock_mhz": nanmed(clock[h][hit]) if h in clock and hit.any() else math.nan,
            "peer_core_clock_mhz": nanmed(peer_median(clock, h)[hit]) if h in clock and hit.any() else math.nan,
            "hot_fraction": hot.get(h, 0.0),
            "throttle_fraction": thr_frac.get(h, math.nan),
        }
        for h in bad
    }
    qs = [d.queries.get("gauges", ""), d.queries.get("gpu_min", "")] + ([d.queries["throttle:thermal"]] if thr else [])
    rep.findings.append(
        Finding(
            "gpu_thermal",
            f"GPUs on {', '.join(bad)} run hot and clock down while their peers don't: "
            + "; ".join(
                f"{h} {fmt(v['temp_c'])}C vs {fmt(v['peer_temp_c'])}C, core clock {fmt(v['min_core_clock_mhz'])} "
                f"vs {fmt(v['peer_core_clock_mhz'])} MHz"
                for h, v in vals.items()
            ),
            bad,
            window_of(d.grid, hit, d.step) or d.train,
            qs,
            {"sensor": key, "hosts": vals},
            0.85,
            plot=series_plot(f"{key} (max GPU per host)", "C", per, d, bad) if per else None,
        )
    )


def check_gpu_power(d: Data, rep: Report) -> None:
    limit = d.gpu_min.get("hw_gpu_power_limit_watts", {})
    power = d.gauges.get("hw_gpu_power_watts", {})
    thr = d.throttle.get("power", {})
    if not limit and not thr:
        return rep.skipped.append({"check": "gpu_power", "needs": ["hw_gpu_power_limit_watts"]})
    m = d.mask()
    capped = deviation_fraction(limit, m, lambda v, p: v <= 0.9 * p) if limit else {}
    thr_frac = {h: float(np.nanmean(np.nan_to_num(v[m]) > 0)) for h, v in thr.items()}
    thr_peer = nanmed([thr_frac.get(h, 0.0) for h in d.hosts]) if thr else 0.0
    bad = [h for h in d.hosts if capped.get(h, 0) >= 0.1 or (thr_frac.get(h, 0) >= 0.3 and thr_peer < 0.1)]
    if not bad or len(bad) > max(1, len(d.hosts) // 2):
        return rep.clean(
            "gpu_power",
            "no host has a lower GPU power limit or more power-cap throttling than its peers",
            NEEDS["gpu_power"],
        )
    hit = np.zeros(d.grid.size, bool)
    for h in bad:
        if h in limit:
            hit |= m & (limit[h] <= 0.9 * peer_median(limit, h))
    if not hit.any():
        hit = m
    vals = {
        h: {
            "power_limit_w": nanmed(limit[h][hit]) if h in limit else math.nan,
            "peer_power_limit_w": nanmed(peer_median(limit, h)[hit]) if h in limit else math.nan,
            "power_w": nanmed(power[h][hit]) if h in power else math.nan,
            "capped_fraction": capped.get(h, 0.0),
            "power_throttle_fraction": thr_frac.get(h, math.nan),
        }
        for h in bad
    }
    rep.findings.append(
        Finding(
            "gpu_power",
            f"GPU power capped on {', '.join(bad)}: "
            + "; ".join(
                f"{h} limit {fmt(v['power_limit_w'])} W vs peers {fmt(v['peer_power_limit_w'])} W, drawing "
                f"{fmt(v['power_w'])} W"
                for h, v in vals.items()
            ),
            bad,
            window_of(d.grid, hit, d.step),
            [d.queries.get("gpu_min", "")] + ([d.queries["throttle:power"]] if thr else []),
            {"hosts": vals},
            0.84,
            plot=series_plot("GPU power limit (min GPU per host)", "W", limit, d, bad) if limit else None,
        )
    )


def check_gpu_hardware(d: Data, rep: Report) -> None:
    fams = [k for k in d.deltas if k.startswith(("hw_gpu_ras", "hw_gpu_pcie_aer"))]
    width = d.gpu_min.get("hw_gpu_pcie_link_width", {})
    if not fams and not width:
        return rep.skipped.append({"check": "gpu_hardware", "needs": list(NEEDS["gpu_hardware"])})
    bad: dict[str, list[str]] = {}
    for key in fams:
        per = d.deltas[key]
        severe = "{ue}" in key or "{fatal}" in key or "{nonfatal}" in key
        peer = nanmed(list(per.values()))
        for h, inc in per.items():
            if (severe and inc >= 1) or (not severe and inc >= max(100, 10 * peer)):
                bad.setdefault(h, []).append(f"{key} +{inc:g}")
    m = d.mask()
    if width:
        for h, f in deviation_fraction(width, m, lambda v, p: v < p).items():
            if f >= 0.5:
                bad.setdefault(h, []).append(f"PCIe link width {nanmed(width[h][m]):g} < peers")
    if not bad or len(bad) > max(1, len(d.hosts) // 2):
        return rep.clean(
            "gpu_hardware",
            "no RAS/ECC or PCIe AER error counts, no degraded PCIe link (XID events are not exported)",
            NEEDS["gpu_hardware"],
        )
    hosts = [h for h in d.hosts if h in bad]
    severe = any("{ue}" in s or "fatal" in s for h in hosts for s in bad[h])
    ce = d.rates.get(next((k for k in d.rates if k.startswith("hw_gpu_ras_errors_total") and 'kind="ce"' in k), ""), {})
    rep.findings.append(
        Finding(
            "gpu_hardware",
            "GPU hardware errors on " + "; ".join(f"{h}: {', '.join(bad[h])}" for h in hosts),
            hosts,
            d.train,
            [
                d.queries[f"delta:{k}"]
                for k in ("hw_gpu_ras_errors_total", "hw_gpu_pcie_aer_errors_total")
                if f"delta:{k}" in d.queries
            ],
            {"errors": bad},
            0.9 if severe else 0.7,
            plot=series_plot("rate(hw_gpu_ras_errors_total{kind=ce}) per host", "/s", ce, d, hosts) if ce else None,
        )
    )


def check_cpu(d: Data, rep: Report) -> None:
    procs = d.gauges.get("hw_procs_running", {})
    if not procs:
        return rep.skipped.append({"check": "cpu_contention", "needs": ["hw_procs_running"]})
    m = d.mask()
    frac = deviation_fraction(procs, m, lambda v, p: v - p >= np.maximum(8, 0.5 * p))
    bad = [h for h in d.hosts if frac.get(h, 0) >= 0.2]
    pw = _phase_windows(d)
    if not bad and pw and len(procs) >= 2:
        fast, slow = pw
        mf, ms = d.mask((fast["start"], fast["end"])), d.mask((slow["start"], slow["end"]))
        rise = {h: nanmed(v[ms]) - nanmed(v[mf]) for h, v in procs.items()}
        base = {h: nanmed(v[mf]) for h, v in procs.items()}
        up = [h for h in d.hosts if h in rise and rise[h] >= max(8, 0.5 * base[h])]
        if len(up) >= 0.75 * len(procs):
            rep.findings.append(
                Finding(
                    "cpu_contention",
                    f"the run queue rose on {len(up)}/{len(procs)} hosts when throughput dropped "
                    f"(median +{nanmed(list(rise.values())):.0f} tasks)",
                    up,
                    (slow["start"], slow["end"]),
                    [d.queries["gauges"] + "   # hw_procs_running"],
                    {"rise": rise, "before": base},
                    0.7,
                    plot=series_plot("hw_procs_running per host", "tasks", procs, d, up),
                )
            )
            return
    cpu = d.gauges.get("hw_cpu_pressure_some_pct", {})
    # more runnable tasks is contention only when they wait for a CPU: the host's CPU pressure
    # ('some') must be above its peers' at those moments too (a big host absorbs a few extra
    # threads; two scrapes of one busy machine differ by chance)
    unfelt = []
    for h in list(bad):
        if h in cpu and len(cpu) >= 2:
            at = m & (procs[h] - peer_median(procs, h) >= 8)
            with np.errstate(all="ignore"):
                excess = nanmed((cpu[h] - peer_median(cpu, h))[at])
            if math.isfinite(excess) and excess < 5:
                bad.remove(h)
                unfelt.append(h)
    if not bad or len(bad) > max(1, len(d.hosts) // 2):
        detail = "run queues are alike on every host" + (" and did not rise with the slowdown" if pw else "")
        if unfelt:
            detail = (
                f"run queue above the peers on {', '.join(unfelt)} without CPU pressure above theirs: no contention"
            )
        return rep.clean("cpu_contention", detail, NEEDS["cpu_contention"])
    hit = np.zeros(d.grid.size, bool)
    for h in bad:
        hit |= m & (procs[h] - peer_median(procs, h) >= 8)
    vals = {
        h: {
            "procs_running": nanmed(procs[h][hit]),
            "peer_procs_running": nanmed(peer_median(procs, h)[hit]),
            "cpu_pressure_some_pct": nanmed(cpu[h][hit]) if h in cpu else math.nan,
            "peer_cpu_pressure_some_pct": nanmed(peer_median(cpu, h)[hit]) if h in cpu else math.nan,
            "fraction": frac[h],
        }
        for h in bad
    }
    rep.findings.append(
        Finding(
            "cpu_contention",
            "run queue far above the peers on "
            + "; ".join(
                f"{h}: {v['procs_running']:.0f} runnable vs {v['peer_procs_running']:.0f}" for h, v in vals.items()
            ),
            bad,
            window_of(d.grid, hit, d.step),
            [d.queries["gauges"] + "   # hw_procs_running, hw_cpu_pressure_some_pct"],
            {"hosts": vals},
            0.75,
            plot=series_plot("hw_procs_running per host", "tasks", procs, d, bad),
        )
    )


def check_io(d: Data, rep: Report) -> None:
    full, some = d.peaks.get("hw_io_pressure_full_pct", {}), d.peaks.get("hw_io_pressure_some_pct", {})
    if not full and not some:
        return rep.skipped.append({"check": "io_pressure", "needs": ["hw_io_pressure_full_pct"]})
    m = (d.grid >= d.start) & (d.grid <= d.end)
    hit_of = {}
    for h in d.hosts:
        f, s = full.get(h), some.get(h)
        hit = np.zeros(d.grid.size, bool)
        if f is not None:
            hit |= np.nan_to_num(f) >= 25
        if s is not None:
            hit |= np.nan_to_num(s) >= 50
        if (hit & m).sum() >= 2:
            hit_of[h] = hit & m
    if not hit_of:
        peak = max((np.nanmax(v) for v in full.values() if np.isfinite(v).any()), default=math.nan)
        return rep.clean("io_pressure", f"IO pressure stayed low (peak 'full' {fmt(peak)} %)", NEEDS["io_pressure"])
    bad = [h for h in d.hosts if h in hit_of]
    anyhit = np.logical_or.reduce(list(hit_of.values()))
    tok = d.tb.get("tokens")
    dip = math.nan
    if tok is not None and np.isfinite(tok[anyhit]).any():
        dip = nanmed(tok[anyhit]) / nanmed(tok[~anyhit & d.mask()])
    vals = {
        h: {
            "io_full_peak_pct": float(np.nanmax(full[h])) if h in full else math.nan,
            "io_some_peak_pct": float(np.nanmax(some[h])) if h in some else math.nan,
            "minutes_pressured": float(hit_of[h].sum() * d.step / 60),
        }
        for h in bad
    }
    every = len(bad) == len(d.hosts)
    rep.findings.append(
        Finding(
            "io_pressure",
            ("every host" if every else ", ".join(bad)) + " stalled on IO (PSI 'full' up to "
            f"{fmt(max(v['io_full_peak_pct'] for v in vals.values()))} %) in {int(_runs(anyhit))} episode(s)"
            + (f"; throughput in those windows was {dip * 100:.0f} % of the rest" if math.isfinite(dip) else ""),
            bad,
            window_of(d.grid, anyhit, d.step),
            [d.queries[k] for k in d.queries if k.startswith("peak:hw_io")],
            {"hosts": vals, "throughput_ratio_in_windows": dip},
            0.72,
            plot=series_plot("max_over_time(hw_io_pressure_full_pct) per host", "%", full, d, bad) if full else None,
        )
    )


def _runs(mask: np.ndarray) -> int:
    return int(np.sum(mask[1:] & ~mask[:-1]) + (1 if mask.size and mask[0] else 0))


def check_memory(d: Data, rep: Report) -> None:
    kills = d.deltas.get("hw_oom_kills_total", {})
    avail, total = d.gauges.get("hw_memory_available_bytes", {}), d.gauges.get("hw_memory_total_bytes", {})
    mfull = d.peaks.get("hw_memory_pressure_full_pct", {})
    if not kills and not avail and not mfull:
        return rep.skipped.append({"check": "memory", "needs": list(NEEDS["memory"])})
    killed = [h for h in d.hosts if kills.get(h, 0) >= 1]
    low = []
    for h in d.hosts:
        if h in avail and h in total and np.isfinite(avail[h]).any():
            if np.nanmin(avail[h] / total[h]) <= 0.03:
                low.append(h)
        if h in mfull and np.nanmax(np.nan_to_num(mfull[h])) >= 20 and h not in low:
            low.append(h)
    bad = killed or low
    if not bad or (not killed and len(low) > max(1, len(d.hosts) // 2)):
        return rep.clean("memory", "no OOM kill, host memory never ran out", NEEDS["memory"])
    ref = avail.get(bad[0])
    hit = np.zeros(d.grid.size, bool)
    for h in bad:
        if h in avail and h in total:
            hit |= (avail[h] / total[h]) <= 0.1
    vals = {
        h: {
            "oom_kills": kills.get(h, 0.0),
            "min_available_pct": float(np.nanmin(avail[h] / total[h]) * 100) if h in avail and h in total else math.nan,
            "memory_pressure_full_peak_pct": float(np.nanmax(mfull[h])) if h in mfull else math.nan,
            **_leak(d, avail.get(h)),
        }
        for h in bad
    }
    what = "the kernel OOM killer killed a process" if killed else "host memory ran out (no OOM kill recorded)"

    def leak_text(v: dict) -> str:
        if v["leak_onset"] is None:
            return ""
        return f", leaking {fmt(v['leak_gib_per_h'])} GiB/h from {utc(v['leak_onset'])}"

    rep.findings.append(
        Finding(
            "memory",
            f"{what} on {', '.join(bad)}: "
            + "; ".join(
                f"{h} available memory down to {fmt(v['min_available_pct'])} %{leak_text(v)}" for h, v in vals.items()
            ),
            bad,
            window_of(d.grid, hit, d.step) or d.train,
            [
                d.queries.get("delta:hw_oom_kills_total", ""),
                d.queries.get("gauges", "") + "   # hw_memory_available_bytes",
            ],
            {"hosts": vals},
            0.93 if killed else 0.6,
            plot=series_plot("hw_memory_available_bytes per host", "B", avail, d, bad) if ref is not None else None,
        )
    )


def _leak(d: Data, avail: np.ndarray | None) -> dict:
    """When a host's available memory began its decline to the minimum and how fast it fell: a line fitted
    to the decline (from the first quarter of the drop to the minimum) and traced back to the level it
    left (the median of the training window's first tenth). None/NaN without a decline of >= 5 %."""
    none = {"leak_onset": None, "leak_bytes_per_s": math.nan, "leak_gib_per_h": math.nan}
    if avail is None:
        return none
    ok = np.flatnonzero(d.mask() & np.isfinite(avail))
    if ok.size < 6:
        return none
    t, y = d.grid[ok], avail[ok]
    low = int(np.argmin(y))
    level = float(np.median(y[: max(3, y.size // 10)]))
    drop = level - float(y[low])
    if low < 3 or drop < 0.05 * level:
        return none
    above = np.flatnonzero(y[:low] >= level - 0.25 * drop)
    first = int(above[-1]) if above.size else 0
    if low - first < 2:
        return none
    slope, icept = np.polyfit(t[first : low + 1] - t[0], y[first : low + 1], 1)
    if slope >= 0:
        return none
    onset = min(max(t[0] + (level - icept) / slope, float(t[0])), float(t[low]))
    return {
        "leak_onset": float(onset),
        "leak_bytes_per_s": float(-slope),
        "leak_gib_per_h": float(-slope * 3600 / 2**30),
    }


def _spikes(d: Data, key: str, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """Windows where the max of a scalar jumps above its trailing median by `ratio` (and the baseline)."""
    y = d.tb.get(key)
    if y is None:
        return np.zeros(d.grid.size, bool), np.full(d.grid.size, np.nan)
    base = np.full(y.size, np.nan)
    hist: list[float] = []
    for i, v in enumerate(y):
        if len(hist) >= 5:
            base[i] = float(np.median(hist[-15:]))
        if math.isfinite(v):
            hist.append(v)
    with np.errstate(invalid="ignore"):
        if key == "loss":
            resid = y - base
            sd = max(robust_sd(resid), 0.01)
            hit = (resid >= np.maximum(8 * sd, 0.03 * np.abs(base))) & (resid >= 0.1)
        else:
            hit = (y >= ratio * base) & (y - base >= 1e-6) & (base > 0)
    return hit & d.mask(), base


def check_training(d: Data, rep: Report) -> None:
    present = [k for k in ("loss", "moe_lb_loss", "grad_norm") if k in d.tb]
    if not present:
        return rep.skipped.append({"check": "training_dynamics", "needs": list(NEEDS["training_dynamics"])})
    found, anyhit = {}, np.zeros(d.grid.size, bool)
    for key, ratio in (("loss", 0.0), ("moe_lb_loss", 2.5), ("grad_norm", 3.0)):
        if key not in d.tb:
            continue
        hit, base = _spikes(d, key, ratio)
        if hit.any():
            i = int(np.nanargmax(np.where(hit, d.tb[key] / np.where(base > 0, base, np.nan), -np.inf)))
            step = d.tb.get("step")
            found[key] = {
                "peak": float(d.tb[key][i]),
                "baseline": float(base[i]),
                "at": float(d.grid[i]),
                "step": float(step[i]) if step is not None else None,
                "windows": int(_runs(hit)),
            }
            anyhit |= hit
    if not found:
        return rep.clean(
            "training_dynamics", "no loss, MoE load-balance loss or grad-norm spike", NEEDS["training_dynamics"]
        )
    key = max(found, key=lambda k: found[k]["peak"] / max(found[k]["baseline"], 1e-12))
    win = window_of(d.grid, anyhit, d.step)
    cost = _throughput_cost(d, win)
    m = d.mask()
    back = all(_settled(k, d.tb[k][m], v["baseline"]) for k, v in found.items())
    # A spike that cost no throughput and settled back is worth knowing, not an incident.
    brief = cost is not None and cost["pct"] > -TRAIN_COST_PCT and back
    text = "; ".join(
        f"{k} {fmt(v['peak'])} vs baseline {fmt(v['baseline'])} at {utc(v['at'])}"
        + (f" (step ~{v['step']:.0f})" if v["step"] is not None else "")
        for k, v in found.items()
    )
    costs = (
        f"; tokens/s {fmt(cost['before'])} before, {fmt(cost['after'])} from the spike on ({cost['pct']:+.1f} %)"
        if cost
        else "; no tokens/s to tell its throughput cost"
    )
    if brief:
        rep.clean("training_dynamics", f"a brief spike that settled and cost no throughput ({text}{costs})", present)
    rep.findings.append(
        Finding(
            "training_spike" if brief else "training_dynamics",
            ("a brief training-scalar spike, no throughput cost: " if brief else "training scalars spiked: ")
            + text
            + costs,
            [],
            win,
            [d.queries[f"tb:{k}"] for k in found],
            {**found, "throughput_cost": cost},
            0.4 if brief else 0.45,
            decides=not brief,
            plot={
                "title": f"{key} (max per window)",
                "unit": "",
                "series": {"job": (d.grid, d.tb[key])},
                "highlight": ["job"],
            },
        )
    )


def _throughput_cost(d: Data, win: tuple[float, float] | None) -> dict | None:
    """Median tokens/s/device over the training window before a spike and from the spike on."""
    tok = d.tb.get("tokens")
    if tok is None or win is None:
        return None
    m = d.mask() & np.isfinite(tok)
    before, after = nanmed(tok[m & (d.grid < win[0])]), nanmed(tok[m & (d.grid >= win[0])])
    if not (math.isfinite(before) and math.isfinite(after)) or before <= 0:
        return None
    return {"before": before, "after": after, "pct": (after / before - 1) * 100, "unit": "tokens/s/device"}


def _settled(key: str, y: np.ndarray, baseline: float) -> bool:
    """Whether a scalar ended the run back near the level it spiked from."""
    ok = y[np.isfinite(y)]
    if not ok.size:
        return True
    end = float(np.median(ok[-max(3, ok.size // 20) :]))
    return end <= baseline + 0.1 if key == "loss" else end <= 1.5 * baseline


# --- per-host outliers and the comparison of two jobs ---------------------------------------
def _medians(d: Data) -> dict[str, dict[str, float]]:
    m = d.mask()
    out = {}
    for fam in (d.gauges, d.rates):
        for key, per in fam.items():
            out[key] = {h: nanmed(v[m]) for h, v in per.items()}
    return out


def _noise(d: Data) -> dict[str, dict[str, float]]:
    m = d.mask()
    out = {}
    for fam in (d.gauges, d.rates):
        for key, per in fam.items():
            out[key] = {h: robust_sd(v[m]) for h, v in per.items()}
    return out


def abs_floor(key: str, med: float) -> float:
    """The smallest per-host difference worth reporting for a family (by its unit)."""
    name = key.split("{")[0]
    for suffix, floor in (
        ("_pct", 2.0),
        ("_celsius", 3.0),
        ("_watts", 20.0),
        ("_mhz", 100.0),
        ("_gts", 1.0),
        ("_width", 1.0),
        ("_seconds_total", 1.0),
        ("_total", 1.0),
    ):
        if name.endswith(suffix):
            return floor
    return max(0.1 * abs(med), 2.0) if not name.endswith("_bytes") else max(0.05 * abs(med), 1.0)


def check_outliers(d: Data, rep: Report) -> None:
    """Every hw_ family: hosts whose median is far from the other hosts' (robust z-score)."""
    if len(d.hosts) < 3:
        rep.notes.append("per-host outliers need at least 3 hosts")
        return
    found = []
    for key, per in _medians(d).items():
        if not key.startswith("hw_") or len(per) < 3:
            continue
        med = nanmed(list(per.values()))
        floor = abs_floor(key, med)
        z = robust_z(per, floor / 2)
        for h, zz in z.items():
            dev = per[h] - med
            if abs(zz) >= 6 and abs(dev) >= max(0.25 * abs(med), floor):
                found.append((abs(zz), key, h, per[h], med, zz))
    found.sort(reverse=True)
    for _, key, h, v, med, zz in found[:8]:
        rep.findings.append(
            Finding(
                "host_outlier",
                f"{h}: {key} median {fmt(v)} vs {fmt(med)} on the other hosts (robust z {zz:+.0f})",
                [h],
                d.train,
                [d.queries["gauges" if key in d.gauges else "counters"] + f"   # {key}"],
                {"family": key, "host_median": v, "hosts_median": med, "robust_z": zz},
                0.2 + min(abs(zz), 50) / 500,
                decides=False,
            )
        )


def _vs_rows(a: Data, b: Data) -> list[tuple[str, dict, dict, dict]]:
    """(family, effect by host, relative difference by host, (a, b) medians by host) for every shared family;
    host "*" stands for the job level (tokens/s, step time, or jobs without shared hosts)."""
    ma, mb, na, nb = _medians(a), _medians(b), _noise(a), _noise(b)
    shared = set(a.hosts) & set(b.hosts)
    rows = []
    for key in sorted(set(ma) & set(mb)):
        hosts = sorted(shared & set(ma[key]) & set(mb[key]))
        pairs = (
            [(h, ma[key][h], mb[key][h], na[key][h], nb[key][h]) for h in hosts]
            if hosts
            else [
                (
                    "*",
                    nanmed(list(ma[key].values())),
                    nanmed(list(mb[key].values())),
                    nanmed(list(na[key].values())),
                    nanmed(list(nb[key].values())),
                )
            ]
        )
        eff, rel = {}, {}
        for h, x, y, sx, sy in pairs:
            if not (math.isfinite(x) and math.isfinite(y)):
                continue
            sd = nanmed([sx, sy])
            noise = max(sd if math.isfinite(sd) else 0.0, 0.01 * max(abs(x), abs(y)), 1e-9)
            eff[h], rel[h] = (x - y) / noise, (x - y) / max(abs(y), 1e-9)
        if eff:
            rows.append((key, eff, rel, {h: (ma[key].get(h, math.nan), mb[key].get(h, math.nan)) for h in eff}))
    for name in ("tokens", "step_time"):
        if name in a.tb and name in b.tb:
            ya, yb = a.tb[name][a.mask()], b.tb[name][b.mask()]
            x, y = nanmed(ya), nanmed(yb)
            if math.isfinite(x) and math.isfinite(y):
                sd = nanmed([robust_sd(ya), robust_sd(yb)])
                noise = max(sd if math.isfinite(sd) else 0.0, 1e-4 * abs(y), 1e-12)
                rows.append((f"tb_{name}", {"*": (x - y) / noise}, {"*": (x - y) / max(abs(y), 1e-12)}, {"*": (x, y)}))
    return rows


def compare(a: Data, b: Data, rep: Report) -> None:
    """Rank every family by how it differs between job a and job b (per host when they share hosts)."""
    rows = _vs_rows(a, b)
    shared = set(a.hosts) & set(b.hosts)
    ranked = sorted(
        ((abs(nanmed(list(r[1].values()))), abs(nanmed(list(r[2].values()))), r) for r in rows),
        key=lambda x: (-x[0], -x[1], x[2][0]),
    )
    table, verdicts = [], {}
    for size, relsize, (key, eff, rel, vals) in ranked:
        if size < 3 or relsize < 0.005:
            continue
        row = {
            "family": key,
            "effect": nanmed(list(eff.values())),
            "relative": nanmed(list(rel.values())),
            "hosts": len(eff),
            "this_median": nanmed([v[0] for v in vals.values()]),
            "other_median": nanmed([v[1] for v in vals.values()]),
        }
        table.append(row)
        text = (
            f"{key} {fmt(row['this_median'])} vs {fmt(row['other_median'])} "
            f"({row['this_median'] - row['other_median']:+.3g}, {row['relative'] * 100:+.1f} %, "
            f"effect {row['effect']:+.1f} noise units"
            + (f" over {len(eff)} host(s))" if "*" not in eff else ", job level)")
        )
        query = (
            (
                a.queries.get("gauges")
                if key in a.gauges
                else a.queries.get("counters")
                if key in a.rates
                else a.queries.get(f"tb:{key[3:]}", "")
            )
            or ""
        ) + f"   # {key}"
        cat = _vs_category(key, eff, rel)
        if cat:
            verdicts.setdefault(cat[0], []).append((cat[2], -abs(row["effect"]), text, cat[1], query, row))
        elif len(table) <= 12:
            rep.findings.append(
                Finding(
                    "vs_difference",
                    f"vs {b.target.name}: {text}",
                    [h for h in eff if h != "*"],
                    a.train,
                    [query],
                    {**row, "this": {h: v[0] for h, v in vals.items()}, "other": {h: v[1] for h, v in vals.items()}},
                    0.3 + min(size, 50) / 500,
                    decides=False,
                )
            )
    for cat, items in verdicts.items():
        items.sort(key=lambda it: it[:2])
        hosts = sorted({h for it in items for h in it[3]}, key=a.hosts.index if a.hosts else None)
        rep.findings.append(
            Finding(
                cat,
                f"vs {b.target.name}: " + "; ".join(it[2] for it in items[:3]),
                hosts,
                a.train,
                [it[4] for it in items[:3]],
                {"families": [it[5] for it in items]},
                0.62,
                plot=_vs_plot(a, b, items[0][5]["family"], hosts),
            )
        )
    rep.vs = {
        "other": b.target.name,
        "other_tsdb": str(b.target.tsdb),
        "shared_hosts": len(shared),
        "ranked": table[:30],
    }


def _vs_plot(a: Data, b: Data, key: str, hosts: list[str]) -> dict | None:
    """This job's per-host series of a family (coloured) over the other job's (grey, shifted to the same start)."""
    mine, theirs = (a.gauges.get(key) or a.rates.get(key)), (b.gauges.get(key) or b.rates.get(key))
    if not mine:
        return None
    series = {h: (a.grid, v) for h, v in mine.items()}
    shift = a.grid[0] - b.grid[0]
    series.update({f"{b.target.name}:{h}": (b.grid + shift, v) for h, v in (theirs or {}).items()})
    return {"title": f"{key} per host; grey: {b.target.name}", "unit": "", "series": series, "highlight": hosts}


def _vs_category(key: str, eff: dict[str, float], rel: dict[str, float]) -> tuple[str, list[str], int] | None:
    """(verdict, hosts where it is worse, rank of the pattern) when a family differs for the worse."""
    name = key.split("{")[0]
    for i, (pattern, cat, sign) in enumerate(VS_CATEGORY):
        if re.fullmatch(pattern, name):
            worse = [h for h in eff if sign * eff[h] >= 3 and sign * rel[h] >= 0.2]
            if len(worse) >= max(1, 0.5 * len(eff)) and sign * nanmed(list(eff.values())) >= 5:
                return cat, sorted(h for h in worse if h != "*"), i
            return None
    return None


# --- verify: one query that shows each finding's deciding signal --------------------------------
REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "max": max,
    "min": min,
    "mean": lambda v: sum(v) / len(v),
    "median": lambda v: float(np.median(v)),
    "last": lambda v: v[-1],
    "delta": lambda v: v[-1] - v[0],
}


def _family_query(d: Data, key: str) -> tuple[str, str] | None:
    """(PromQL by host, unit) for a family key of d.gauges / d.rates / d.tb (tb_<name>: job level)."""
    if key in d.gauges:
        return f"max by (host) ({key})", ""
    if key in d.rates:
        return f"sum by (host) (rate({key}[{int(max(d.step, 4 * d.interval))}s]))", "/s"
    if key.startswith("tb_") and f"tb:{key[3:]}" in d.queries:
        return d.queries[f"tb:{key[3:]}"], ""
    return None


def _spec(query: str, window: tuple[float, float], reducer: str, direction: str, unit: str, shows: str, **kw) -> dict:
    return {"query": query, "window": window, "reducer": reducer, "direction": direction, "unit": unit,
            "shows": shows, **kw}  # fmt: skip


def _vspec(d: Data, f: Finding) -> dict | None:
    """What add_verify runs for a finding: query, window, reducer and how to read the values."""
    w = f.window or d.train or (d.start, d.end)
    whole = (d.start, d.end)
    v, k = f.values, f.kind
    rate = f"{int(max(d.step, 4 * d.interval))}s"
    if "family" in v or "families" in v:  # host_outlier, vs_difference and the --vs findings
        row = v["families"][0] if "families" in v else v
        fq = _family_query(d, row["family"])
        if fq is None:
            return None
        this, other = row.get("host_median", row.get("this_median")), row.get("hosts_median", row.get("other_median"))
        up = (this or 0) >= (other or 0)
        vs = "other_median" in row
        shows = f"{row['family']} per host" + (" (the baseline: the other job's median)" if vs else "")
        return _spec(
            fq[0], w, "median", "higher" if up else "lower", fq[1], shows, **({"baseline": other} if vs else {})
        )
    if k == "hang":
        full = nanmed(list(v.get("power_full_w", {}).values()))
        shows = (
            "GPU power per host after the steps stopped: standby power (the baseline is full power while training) "
            "although every GPU stayed 100 % busy"
        )
        return _spec("max by (host) (hw_gpu_power_watts)", w, "median", "lower", "W", shows, baseline=full)
    if k in ("heartbeat_false_positive", "heartbeat_timeout"):
        if "hw_gpu_power_watts" not in d.gauges:
            return None
        near, alive = v["near_seconds"], k == "heartbeat_false_positive"
        shows = f"GPU power per host in the {near:.0f} s before JAX's heartbeat claim: " + (
            "the accused hosts drew full power like their peers (alive)"
            if alive
            else "the stopped hosts had dropped to idle power"
        )
        win = (v["claim_time"] - near, v["claim_time"])
        return _spec(
            "max by (host) (hw_gpu_power_watts)",
            win,
            "min",
            "same" if alive else "lower",
            "W",
            shows,
            step=nice_step(max(d.interval, 1.0)),
            accused=f.extra.get("accused_hosts", []),
        )
    if k == "network" and "signal" in v:
        sig = v["signal"]
        return _spec(f"sum by (host) (rate({sig}[{rate}]))", w, "mean", "higher", "/s", f"rate of {sig} per host")
    if k == "gpu_thermal" and v.get("sensor"):
        return _spec(f"max by (host) ({v['sensor']})", w, "median", "higher", "C", "hottest GPU temperature per host")
    if k == "gpu_power":
        if "hw_gpu_power_limit_watts" in d.gpu_min:
            q = "min by (host) (hw_gpu_power_limit_watts)"
            return _spec(q, w, "median", "lower", "W", "lowest GPU power limit per host")
        q = d.queries["throttle:power"]
        return _spec(q, w, "median", "higher", "GPUs", "GPUs with power-cap throttle bits per host")
    if k == "gpu_hardware":
        errs = [e for h in f.hosts for e in v["errors"].get(h, [])]
        errs.sort(key=lambda e: not re.search(r"\{(ue|fatal|nonfatal)\}", e))
        m = re.match(r"(hw_gpu_\w+_total)\{(\w+)\}", errs[0]) if errs else None
        if m:
            label = "kind" if m.group(1).startswith("hw_gpu_ras") else "severity"
            q = f'sum by (host) ({m.group(1)}{{{label}="{m.group(2)}"}})'
            return _spec(q, whole, "delta", "higher", "errors", f"{m.group(1)} ({label} {m.group(2)}) per host, job")
        q = "min by (host) (hw_gpu_pcie_link_width)"
        return _spec(q, w, "median", "lower", "lanes", "narrowest GPU PCIe link per host")
    if k == "cpu_contention":
        if "before" in v:
            base = nanmed(list(v["before"].values()))
            shows = "run queue per host after throughput dropped (the baseline: the median before)"
            return _spec("max by (host) (hw_procs_running)", w, "median", "higher", "tasks", shows, baseline=base)
        return _spec("max by (host) (hw_procs_running)", w, "median", "higher", "tasks", "run queue per host")
    if k == "io_pressure" and "peak:hw_io_pressure_full_pct" in d.queries:
        q = d.queries["peak:hw_io_pressure_full_pct"]
        return _spec(q, w, "max", "higher", "%", "peak IO pressure (PSI full) per host", threshold=25.0)
    if k == "memory":
        if any(x["oom_kills"] >= 1 for x in v["hosts"].values()):
            q = "sum by (host) (hw_oom_kills_total)"
            return _spec(q, whole, "delta", "higher", "kills", "OOM kills per host over the job")
        q = "min by (host) (hw_memory_available_bytes) / max by (host) (hw_memory_total_bytes) * 100"
        return _spec(q, whole, "min", "lower", "%", "lowest available memory per host, % of total", threshold=3.0)
    if k in ("training_dynamics", "training_spike"):
        tb = [x for x in v if x in d.tb and isinstance(v[x], dict)]
        if not tb:
            return None
        key = max(tb, key=lambda x: v[x]["peak"] / max(v[x]["baseline"], 1e-12))
        shows = f"peak of {key} (job level) over the spike's window"
        return _spec(d.queries[f"tb:{key}"], w, "max", "higher", "", shows, baseline=v[key]["baseline"])
    return None


def add_verify(d: Data, rep: Report, prom: tsdb.Served) -> None:
    """Give every finding a `verify` object: the query, range and reducer that show its deciding signal
    and the values they give (culprits, accused hosts, the peers' or every host's median, or the job's).
    The queries run 4 at a time; one Prometheus refuses leaves its finding without verify (and a note)."""
    specs = [(f, spec) for f in rep.findings if (spec := _vspec(d, f)) is not None]
    ranges = []
    for _, spec in specs:
        lo, hi = spec.pop("window")
        step = spec.pop("step", d.step)
        start = math.floor(lo)
        ranges.append((start, max(math.ceil(hi), start + int(step)), step))
    with ThreadPoolExecutor(max_workers=4) as pool:
        futs = [pool.submit(prom.query_range, spec["query"], *rg) for (_, spec), rg in zip(specs, ranges, strict=True)]
        for (f, spec), (start, end, step), fut in zip(specs, ranges, futs, strict=True):
            try:
                rows = fut.result()
            except tsdb.TSDBError as e:
                rep.notes.append(f"the verify query of the {f.kind} finding failed: {e}")
                continue
            f.verify = _verify(f, spec, rows, start, end, step)


def _verify(f: Finding, spec: dict, rows: list[dict], start: int, end: int, step: float) -> dict:
    red = REDUCERS[spec["reducer"]]
    got = {}
    for r in rows:
        xs = [x for x in (float(p[1]) for p in r["values"]) if math.isfinite(x)]
        if xs:
            got[r["metric"].get("host", "")] = red(xs)
    accused = spec.pop("accused", [])
    expect: dict = {"culprits": {h: got.get(h) for h in f.hosts}}
    if accused:
        expect["accused"] = {h: got.get(h) for h in accused}
    if set(got) == {""}:
        expect["job"] = got[""]
    elif (f.hosts or accused) and set(got) - set(f.hosts) - set(accused):
        peers = [x for h, x in got.items() if h not in f.hosts and h not in accused]
        expect["peers_median"] = float(np.median(peers))
    else:  # no culprit, or every host is one: the level of every host (compare with the baseline)
        expect["hosts_median"] = float(np.median(list(got.values()))) if got else None
    return {"query": spec.pop("query"), "start": start, "end": end, "step": step, "reducer": spec.pop("reducer"),
            "expect": expect, **spec}  # fmt: skip


# --- the whole diagnosis --------------------------------------------------------------------
def missing_families(d: Data) -> set[str]:
    """Families the checks use that the TSDB lacks (whole plugins collapse to a pattern)."""
    need = {n for names in NEEDS.values() for n in names} - OPTIONAL
    absent = need - d.names
    out = set()
    for prefix, group in (("tb_", "tb_*"), ("hw_gpu_", "hw_gpu_*"), ("hw_ib_", "hw_ib_*")):
        if not any(n.startswith(prefix) for n in d.names):
            absent = {n for n in absent if not n.startswith(prefix)}
            out.add(group)
    if not any(n.startswith("hw_") for n in d.names):
        absent = {n for n in absent if not n.startswith("hw_")}
        out = (out - {"hw_gpu_*", "hw_ib_*"}) | {"hw_*"}
    return out | absent


def diagnose(
    target: Target, vs: Target | None = None, *, auto: dict | None = None, workspace: Path | None = None
) -> dict:
    """Run every playbook on one job (optionally against another); the JSON report (plus _report).
    auto: how --vs auto picked vs (pick_baseline); workspace: where to look for a baseline to suggest
    when nothing is found (default: beside the job)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows are expected (gaps, idle hosts)
        r = _diagnose(target, vs)
    if r["vs"] is not None:
        r["vs"]["auto"] = _jsonable(auto)
    elif vs is None and r["verdict"] == "none" and not r["insufficient_evidence"]:
        picked = pick_baseline(target, workspace)
        if picked:
            r["notes"].append(
                f"a baseline exists: {picked[1]['picked']} ({picked[1]['why']}); compare with it: "
                f"utils/diagnose.py {target.name} --vs auto"
            )
            r["summary"] += f"; try --vs auto (it would compare with {picked[1]['picked']})"
    return r


def _diagnose(target: Target, vs: Target | None) -> dict:
    t0 = time.monotonic()
    with tsdb.Served(target.tsdb) as prom:
        if prom.first is None:
            return _empty(target, t0)
        d = load(target, prom)
        rep = Report(d)
        check_hang(d, rep)
        check_heartbeat(d, rep, prom)
        check_network(d, rep)
        check_gpu_thermal(d, rep)
        check_gpu_power(d, rep)
        check_gpu_hardware(d, rep)
        check_cpu(d, rep)
        check_io(d, rep)
        check_memory(d, rep)
        check_training(d, rep)
        check_outliers(d, rep)
        n = 0
        if vs is not None:
            with tsdb.Served(vs.tsdb) as other:
                if other.first is None:
                    rep.notes.append(f"{vs.name} holds no samples: no comparison")
                else:
                    compare(d, load(vs, other), rep)
                    n += other.queries
        add_verify(d, rep, prom)
        n += prom.queries
    rep.missing |= missing_families(d)
    return _assemble(rep, n, time.monotonic() - t0)


def _empty(target: Target, t0: float) -> dict:
    return {
        "schema": SCHEMA,
        "job_id": lookup.job_id_of(target.name),
        "job_name": target.name,
        "tsdb": str(target.tsdb),
        "log": str(target.log) if target.log else None,
        "verdict": "none",
        "culprit_hosts": [],
        "insufficient_evidence": True,
        "summary": "insufficient evidence: the TSDB holds no samples",
        "findings": [],
        "ruled_out": [],
        "missing": ["hw_*", "tb_*"],
        "skipped": [],
        "hosts": [],
        "phases": [],
        "range": None,
        "vs": None,
        "notes": [],
        "queries_run": 0,
        "seconds": round(time.monotonic() - t0, 3),
        "_report": None,
    }


def _assemble(rep: Report, n_queries: int, seconds: float) -> dict:
    d = rep.data
    rep.findings.sort(key=lambda f: -f.score)
    deciding = [f for f in rep.findings if f.decides and f.kind in VERDICTS]
    fired = {f.kind for f in deciding}
    rep.ruled_out = [c for c in rep.ruled_out if c["check"] not in fired]
    verdict = deciding[0].kind if deciding else "none"
    culprits = deciding[0].hosts if deciding else []
    has_hw = any(n.startswith("hw_") for n in d.names)
    has_tb = any(n.startswith("tb_") for n in d.names)
    insufficient = not has_hw and not has_tb
    if deciding:
        summary = f"{verdict}: {deciding[0].summary}"
    elif insufficient:
        summary = "insufficient evidence: the TSDB holds no hw_* or tb_* metrics (was the exporter running?)"
    else:
        hb = next((f for f in rep.findings if f.kind == "heartbeat_timeout"), None)
        summary = (
            "no system cause in the metrics; " + hb.summary + " (the log tells why: utils/triage.py)"
            if hb
            else "no incident found: every check with data came out clean"
        ) + (f" (no data for: {', '.join(sorted(rep.missing))})" if rep.missing else "")
    return {
        "schema": SCHEMA,
        "job_id": lookup.job_id_of(d.target.name),
        "job_name": d.target.name,
        "tsdb": str(d.target.tsdb),
        "log": str(d.target.log) if d.target.log else None,
        "verdict": verdict,
        "culprit_hosts": culprits,
        "insufficient_evidence": insufficient,
        "summary": summary,
        "range": {"start": d.start, "end": d.end, "step": d.step, "interval": round(d.interval, 3)},
        "train_window": {"start": d.train[0], "end": d.train[1]} if d.train else None,
        "hosts": d.hosts,
        "phases": _jsonable(d.phases),
        "findings": [f.as_json() for f in rep.findings],
        "ruled_out": rep.ruled_out,
        "missing": sorted(rep.missing),
        "skipped": rep.skipped,
        "vs": _jsonable(rep.vs),
        "notes": rep.notes,
        "families": sorted(n for n in d.names if not n.startswith("ray_"))
        + sorted({"ray_*"} if any(n.startswith("ray_") for n in d.names) else set()),
        "queries_run": n_queries,
        "seconds": round(seconds, 3),
        "_report": rep,
    }


# --- output ---------------------------------------------------------------------------------
def render(r: dict) -> str:
    lines = [f"Job {r['job_name']}  (TSDB {r['tsdb']})"]
    if r["range"]:
        rg = r["range"]
        lines.append(
            f"Data: {utc(rg['start'])} .. {utc(rg['end'])} ({dur(rg['end'] - rg['start'])}), "
            f"{len(r['hosts'])} hosts, query step {rg['step']:g} s, scrape ~{rg['interval']:.3g} s"
        )
    if r.get("vs"):
        auto = r["vs"].get("auto")
        lines.append(f"Compared with: {r['vs']['other']}" + (f" (--vs auto: {auto['why']})" if auto else ""))
    head = f"Verdict: {r['verdict']}"
    if r["culprit_hosts"]:
        head += f"   hosts: {' '.join(r['culprit_hosts'])}"
    lines += [head, f"  {r['summary']}"]
    if r["insufficient_evidence"]:
        lines.append("  INSUFFICIENT EVIDENCE: no hardware or training metrics to judge from")
    if len(r["phases"]) > 1:
        lines.append(
            "Throughput phases: "
            + "; ".join(f"{utc(p['start'])[11:16]}..{utc(p['end'])[11:16]} {fmt(p['level'])}" for p in r["phases"])
        )
    if r["findings"]:
        lines.append("Findings (strongest first):")
        for i, f in enumerate(r["findings"], 1):
            w = f["window"]
            when = f"  [{utc(w['start'])} .. {utc(w['end'])}]" if w else ""
            lines.append(f" {i:2d}. {f['kind']}{when}")
            lines.append(f"     {f['summary']}")
            shown = [q for q in f["queries"] if q]
            for q in shown[:2]:
                lines.append(f"     query: {q}")
            if len(shown) > 2:
                lines.append(f"     (showing 2 of its {len(shown)} queries: --json lists them all)")
            v = f.get("verify")
            if v:
                e = v["expect"]
                got = ", ".join(
                    f"{h} {fmt(x if x is not None else math.nan)}" for h, x in list(e["culprits"].items())[:4]
                )
                got += f" (+{len(e['culprits']) - 4} more)" if len(e["culprits"]) > 4 else ""
                ref = next(
                    (
                        f"{k} {fmt(e[k] if e[k] is not None else math.nan)}"
                        for k in ("peers_median", "hosts_median", "job")
                        if k in e
                    ),
                    "",
                )
                lines.append(
                    f"     check: {v['reducer']} of {v['query']} -> {'; '.join(x for x in (got, ref) if x)}"
                    + (f" {v['unit']}" if v.get("unit") else "")
                )
    if r["ruled_out"]:
        lines.append("Ruled out:")
        lines += [f"  - {c['check']}: {c['detail']}" for c in r["ruled_out"]]
    if r["skipped"]:
        lines.append(
            "Not checked (no data): "
            + ", ".join(f"{s['check']} (needs {' or '.join(s['needs'])})" for s in r["skipped"])
        )
    if r["missing"]:
        lines.append("Missing families: " + ", ".join(r["missing"]))
    for n in r.get("notes", []):
        lines.append(f"Note: {n}")
    lines.append(f"({r['queries_run']} queries, {r['seconds']:.1f} s)")
    return "\n".join(lines)


def plot(r: dict, out: Path) -> list[Path]:
    """PNG charts: throughput with its phases, and each of the top findings' per-host signal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep: Report | None = r.get("_report")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if rep is None:
        return written
    d = rep.data
    tok = d.tb.get("tokens")
    figs = [f for f in rep.findings if f.plot][:4]
    for i, f in enumerate(figs or [None], 1):
        fig, axes = plt.subplots(
            2 if (f and tok is not None) else 1, 1, figsize=(11, 6.5 if f else 3.5), sharex=True, squeeze=False
        )
        ax = axes[0][0]
        x0 = d.grid[0]
        if tok is not None:
            ax.plot((d.grid - x0) / 3600, tok, color="tab:blue", lw=1)
            for p in d.phases:
                ax.axhline(p["level"], xmin=0, xmax=1, color="tab:blue", alpha=0.0)
                ax.hlines(p["level"], (p["start"] - x0) / 3600, (p["end"] - x0) / 3600, colors="black", lw=2)
            ax.set_ylabel("tokens/s/device")
            ax.set_title(f"{d.target.name}: throughput and phases")
        if f is not None:
            draw_hosts(axes[-1][0], f, x0, axes[0][0])
        axes[-1][0].set_xlabel(f"hours since {utc(x0)}")
        fig.tight_layout()
        path = out / (f"{i}-{f.kind}.png" if f else "1-throughput.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


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


def check_out_dir(out: Path, option: str = "--plot", what: str = "the PNG charts") -> None:
    """InputError unless OUT is a directory this user can write to, or can be made one (checked before the
    diagnosis runs, so nothing is written on bad input); OPTION and WHAT name it in the one line."""
    p = out.absolute()
    try:
        while not p.exists() and p != p.parent:
            p = p.parent
        ok = p.is_dir()
    except OSError as e:
        raise InputError(f"{option} {out}: {e.strerror or e} (give a directory for {what})") from None
    if not ok:
        raise InputError(f"{option} {out}: {p} is not a directory (give a directory for {what})")
    try:
        if not os.access(p, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
        tempfile.TemporaryFile(dir=p).close()  # a read-only file system, or root where it may not write
    except OSError as e:
        raise InputError(
            f"{option} {out}: {p} is not writable: {e.strerror or e} (give a directory you can write {what} to)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = cli.Parser(
        prog="diagnose.py",
        description=__doc__.split("\n", 2)[2],
        usage="diagnose.py JOB [--vs OTHER_JOB|auto] [--json] [--plot DIR] [--report DIR] [--workspace DIR]",
    )
    ap.add_argument("job", help="job id, job name, job dir, its log or TSDB dir")
    ap.add_argument(
        "--vs",
        metavar="OTHER_JOB",
        help="compare with this job (as JOB), or auto: the latest completed job of the same model that ended "
        "before JOB started (sharing hosts with it when one does)",
    )
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--plot", metavar="DIR", type=Path, help="write PNG charts of the evidence to DIR")
    ap.add_argument(
        "--report", metavar="DIR", type=Path, help="write one HTML page of the diagnosis: DIR/<job name>-report.html"
    )
    ap.add_argument("--workspace", metavar="DIR", type=Path, help="where job ids and names are looked up")
    a = ap.parse_args(argv)
    ws = a.workspace or default_workspace()
    try:
        if a.plot is not None:
            check_out_dir(a.plot)
        if a.report is not None:
            check_out_dir(a.report, "--report", "the HTML page")
        target = locate(a.job, ws)
        other, auto = None, None
        if a.vs == "auto":
            picked = pick_baseline(target, ws)
            if picked is None:
                raise InputError(
                    f"--vs auto: no completed job of the same model that ended before {target.name} started "
                    f"(in {ws}); give --vs OTHER_JOB"
                )
            other, auto = picked
        elif a.vs is not None:
            other = locate(a.vs, ws, "--vs")
        if other is not None and other.tsdb.resolve() == target.tsdb.resolve():
            raise InputError(f"--vs {a.vs} is {target.name} itself: compare with another job (or --vs auto)")
        report = diagnose(target, other, auto=auto, workspace=ws)
    except InputError as e:
        return cli.fail("diagnose.py", e)
    except tsdb.TSDBError as e:
        return cli.fail("diagnose.py", e, cli.FAILED)
    try:
        pngs = plot(report, a.plot) if a.plot else []
    except OSError as e:
        return cli.fail(
            "diagnose.py",
            f"cannot write the charts to {a.plot}: {e.strerror or e} (give a directory you can write to, or leave "
            "out --plot)",
        )
    page = None
    if a.report is not None:
        from diagnosis import report as html_report  # matplotlib and the page, only when asked for

        try:
            page = html_report.write(report, a.report)
        except OSError as e:
            return cli.fail(
                "diagnose.py",
                f"--report {a.report}: cannot write the page: {e.strerror or e} (give a directory you can write to)",
            )
    report.pop("_report", None)
    if pngs:
        report["plots"] = [str(p) for p in pngs]
    if page is not None:
        report["report_page"] = str(page)
    charts = "\nCharts: " + " ".join(map(str, pngs)) if pngs else ""
    charts += f"\nReport: {page}" if page is not None else ""
    cli.emit(report, a.json, lambda r: render(r) + charts)
    return cli.OK
