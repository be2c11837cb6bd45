"""A job's metrics from its served TSDB onto one time grid (diagnose.py's range queries): which families
it holds, the scrape interval, per-host values and rates, the training window and its phases.
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from diagnosis import tsdb
from diagnosis.alerts import RULES
from diagnosis.evidence import (
    Data,
    PerHost,
    Target,
    nanmed,
    rolling_median,
)
from diagnosis.phases import segments

POINTS = 480  # target points per range query (step = range / POINTS, at least the scrape interval)
MIN_PHASE_S = 600  # a throughput phase lasts at least this long (and 6 grid points; docs/diagnose.md step 4)


MAX_SAMPLES = 20_000  # samples per series in the range above which the step doubles (a long job at 5 s)


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
                # every grid point of a gap gets the mean rate over it: point i after idx[k-1], up to idx[k]
                points = np.arange(idx[0] + 1, idx[-1] + 1)
                r[points] = rate[np.searchsorted(idx, points) - 1]
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
    # counted from the exporter's start, a series appearing with its first event: its largest value is the increase
    name = "hw_gpu_kernel_errors_total"
    if name in d.names:
        q[name] = f"sum by (host, code) (max_over_time({name}[{d.end - d.start + 1:.0f}s] @ {d.end:.0f}))"
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
                sub = r["metric"].get("kind") or r["metric"].get("severity") or r["metric"].get("code") or ""
                d.deltas.setdefault(f"{k}{{{sub}}}" if sub else k, {})[r["metric"]["host"]] = float(r["value"][1])
    hosts = set()
    for fam in (d.gauges, d.gpu_min, d.rates):
        for per in fam.values():
            hosts.update(per)
    d.hosts = sorted(hosts, key=natural)
    d.n_queries = prom.queries
    d.train = train_window(d)
    d.phases = phases(d)
    return d


def natural(host: str) -> list:
    """n2 before n10."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", host)]


# a host without samples for this many scrape intervals (and >= 2 grid points) has a gap (alerts.tsv NodeNotScraped)
GAP_INTERVALS = int(RULES["NodeNotScraped"].value)


def data_gaps(d: Data, nodes: list[str]) -> list[dict]:
    """Where a host of the job has no samples of its host plugin (hw_procs_running, else hw_load1) in the
    training window (else the data's): its exporter was not scraped (down, killed, its node unreachable), so
    the checks saw nothing of it then. NODES: the job's hosts from its log header (a node never scraped at
    all is a gap over the whole window). [{host, start, end, seconds}], by host then time."""
    ref = d.gauges.get("hw_procs_running") or d.gauges.get("hw_load1")
    if not ref or not d.grid.size:
        return []
    m = d.mask()
    least = max(2 * d.step, GAP_INTERVALS * d.interval)
    out = []
    for h in sorted(set(d.hosts) | set(nodes), key=natural):
        v = ref.get(h)
        hole = m & (~np.isfinite(v) if v is not None else np.ones(d.grid.size, bool))
        edges = np.flatnonzero(np.diff(np.concatenate(([0], hole.astype(np.int8), [0]))))
        for a, b in zip(edges[::2], edges[1::2], strict=True):
            start, end = float(d.grid[a]), float(d.grid[b - 1])
            if end - start + d.step >= least:
                out.append({"host": h, "start": start, "end": end, "seconds": round(end - start + d.step, 1)})
    return out


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
    out = []
    for a, b in segments(sm.tolist(), max(6, min(v.size // 12, math.ceil(MIN_PHASE_S / d.step))), 0.05):
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
