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
picks OTHER_JOB itself: the nearest clean run of the same model by time, before or after JOB,
in JOB's own directory (sharing hosts with JOB when one does; diagnosis/baseline.py). When nothing
is found and such a job exists, the report suggests --vs auto. Every finding carries `verify`: one
query, range and reducer that show its deciding signal, with the values diagnose got per host
(docs/diagnose.md).

JOB and OTHER_JOB: a job id or a job name (<id>-JAX-<model>[-<tag>]), looked up in --workspace
(default $JOB_WORKSPACE or <repo>/outputs), a job dir, its log or a TSDB dir; an id that two jobs
share is an error that lists their names.
--json prints the report for programs (schema: docs/diagnose.md); --plot DIR writes PNG charts
of the evidence; --report DIR writes one self-contained HTML page of it (DIR/<job name>-report.html).
Exit 0 when diagnosed (even with too little data: it says so), 2 on bad input, 1 when Prometheus
could not serve the data.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import joblog
from diagnosis import baseline, cli, jobdir, tsdb
from diagnosis import locate as lookup
from diagnosis.checks import (
    NEEDS,
    OPTIONAL,
    _medians,
    _noise,
    run_all,
)
from diagnosis.cli import InputError
from diagnosis.evidence import (
    SCHEMA,
    VERDICTS,
    Data,
    Finding,
    Report,
    Target,
    _jsonable,
    check_values,
    draw_hosts,
    dur,
    fmt,
    nanmed,
    robust_sd,
    set_scope,
    utc,
)
from diagnosis.load import (
    data_gaps,
    load,
    nice_step,
)
from diagnosis.locate import default_workspace

REPO = Path(__file__).resolve().parents[2]


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
    (r"hw_gpu_ras_errors_total|hw_gpu_pcie_aer_errors_total|hw_gpu_kernel_errors_total", "gpu_hardware", +1),
]
# Families that differ with the node type (memory size, GPU power limit): between jobs on other hosts
# they say what the hosts are, not what went wrong, so they never decide there (informational rows).
NODE_TYPE = r"hw_memory_(total|available)_bytes|hw_gpu_power_limit_watts"
ACROSS_HOSTS = (
    "no shared hosts: compared job-level medians across hosts; node-type differences (memory size, GPU power "
    "limit) are listed but never decide"
)


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


def pick_baseline(target: Target) -> tuple[Target, dict] | None:
    """--vs auto: the baseline diagnosis/baseline.py picks for the target (its Target, what was picked
    and why) or None."""
    picked = baseline.pick(target.job_dir, target.tsdb)
    return (locate(str(picked[0])), picked[1]) if picked else None


def other_job(target: Target, vs: str | None, workspace: Path | None) -> tuple[Target | None, dict | None]:
    """The job --vs VS names (None without --vs) and, for --vs auto, how it was picked; InputError with one
    line when there is none or it is TARGET itself."""
    other, auto = None, None
    if vs == "auto":
        picked = pick_baseline(target)
        if picked is None:
            where = target.job_dir.parent if target.job_dir else None
            raise InputError(f"--vs auto: {baseline.none_found(target.name, where)}; give --vs OTHER_JOB")
        other, auto = picked
    elif vs is not None:
        other = locate(vs, workspace, "--vs")
    if other is not None and other.tsdb.resolve() == target.tsdb.resolve():
        raise InputError(f"--vs {vs} is {target.name} itself: compare with another job (or --vs auto)")
    return other, auto


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
            rows.append((key, eff, rel, {h: (x, y) for h, x, y, _, _ in pairs if h in eff}))
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
        this, other = nanmed([v[0] for v in vals.values()]), nanmed([v[1] for v in vals.values()])
        row = {
            "family": key,
            "effect": nanmed(list(eff.values())),
            # the difference of the medians shown, so that the sign and the percentage agree with them
            "relative": (this - other) / max(abs(other), 1e-12),
            "hosts": len(eff),
            "this_median": this,
            "other_median": other,
        }
        table.append(row)
        text = (
            f"{key} {fmt(this)} vs {fmt(other)} ({this - other:+.3g}, {row['relative'] * 100:+.1f} %, "
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
        node_type = not shared and re.fullmatch(NODE_TYPE, key.split("{")[0])
        cat = None if node_type else _vs_category(key, eff, rel)
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
    if not shared:
        rep.notes.append(ACROSS_HOSTS)
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


def _family_query(d: Data, key: str) -> tuple[str, str] | None:
    """(PromQL by host, unit) for a family key of d.gauges / d.gpu_min / d.rates / d.tb (tb_<name>: job level).
    Each gives the values the checks read on their grid at the grid's points: a counter's rate is its
    increase over one step (a reset dropped), as load.py computes d.rates."""
    if key in d.gauges:
        return f"max by (host) ({key})", ""
    if key in d.gpu_min:
        return f'min by (host) ({key}{{type!="memory"}})', ""
    if key in d.rates:
        s = int(d.step)
        return f"(sum by (host) ({key}) - sum by (host) ({key} offset {s}s)) / {s} >= 0", "/s"
    if key.startswith("tb_") and f"tb:{key[3:]}" in d.queries:
        return d.queries[f"tb:{key[3:]}"], ""
    return None


def _spec(
    signal: str, query: str, window: tuple[float, float], reducer: str, direction: str, unit: str, shows: str, **kw
) -> dict:
    return {"signal": signal, "query": query, "window": window, "reducer": reducer, "direction": direction,
            "unit": unit, "shows": shows, **kw}  # fmt: skip


def _family_specs(d: Data, f: Finding, other: Data | None) -> list[dict]:
    """host_outlier, vs_difference and the --vs findings: each family the summary names, on this job and
    (--vs) on the other job too."""
    v = f.values
    rows = v["families"][:3] if "families" in v else [v]  # the rows the summary shows
    out = []
    for row in rows:
        fam = row["family"]
        this, ref = row.get("host_median", row.get("this_median")), row.get("hosts_median", row.get("other_median"))
        up = (this or 0) >= (ref or 0)
        vs = "other_median" in row
        fq = _family_query(d, fam)
        if fq is None:
            continue
        w = d.train or (d.start, d.end)  # the window its medians were taken over
        shows = f"{fam} per host" + (" (the baseline: the other job's median)" if vs else "")
        extra = {"baseline": ref} if vs else {}
        out.append(_spec(fam, fq[0], w, "median", "higher" if up else "lower", fq[1], shows, **extra))
        oq = _family_query(other, fam) if vs and other is not None else None
        if oq is not None:
            ow = other.train or (other.start, other.end)
            shows = f"{fam} per host on the other job (the level this job is compared with)"
            out.append(_spec(fam, oq[0], ow, "median", "lower" if up else "higher", oq[1], shows, job="other"))
    return out


def _vspecs(d: Data, f: Finding, other: Data | None = None) -> list[dict]:
    """What add_verify runs for a finding: one check per deciding signal (query, window, reducer and how
    to read the values); `job: other` runs on the other job of --vs."""
    w = f.window or d.train or (d.start, d.end)
    whole = (d.start, d.end)
    v, k = f.values, f.kind
    rate = f"{int(max(d.step, 4 * d.interval))}s"
    if "family" in v or "families" in v:  # host_outlier, vs_difference and the --vs findings
        return _family_specs(d, f, other)
    if k == "hang":
        full = nanmed(list(v.get("power_full_w", {}).values()))
        shows = "GPU power per host after the steps stopped: standby power (the baseline is full power while training)"
        busy = "the least busy GPU per host after the steps stopped: still 100 % busy (spinning in a collective)"
        util = 'min by (host) (hw_gpu_utilization_pct{type!="memory"})'
        return [
            _spec("power", "max by (host) (hw_gpu_power_watts)", w, "median", "lower", "W", shows, baseline=full),
            _spec("utilization", util, w, "median", "higher", "%", busy, threshold=90.0),
        ]
    if k in ("heartbeat_false_positive", "heartbeat_timeout"):
        if "hw_gpu_power_watts" not in d.gauges:
            return []
        near, alive = v["near_seconds"], k == "heartbeat_false_positive"
        shows = f"GPU power per host in the {near:.0f} s before JAX's heartbeat claim: " + (
            "the accused hosts drew full power like their peers (alive)"
            if alive
            else "the stopped hosts had dropped to idle power"
        )
        win = (v["claim_time"] - near, v["claim_time"])
        return [
            _spec(
                "power",
                "max by (host) (hw_gpu_power_watts)",
                win,
                "min",
                "same" if alive else "lower",
                "W",
                shows,
                step=nice_step(max(d.interval, 1.0)),
                accused=f.extra.get("accused_hosts", []),
            )
        ]
    if k == "network" and v.get("side") == "local":  # the hosts' own stack dropped what they sent
        shows = "packets per second dropped before the NIC per host (IP OutRequests - OutTransmits)"
        return [_spec("local_drops", f.queries[1], w, "mean", "higher", "packets/s", shows)]
    if k == "network" and "signal" in v:
        sig = v["signal"]
        q = f"sum by (host) (rate({sig}[{rate}]))"
        if "extent" in v:  # every host rose with the slowdown: the level against the hosts' own before
            base = nanmed(list(v["rate_before_per_s"].values()))
            shows = f"rate of {sig} per host in the slow stretch (the baseline: the hosts' median when fast)"
            return [_spec(sig, q, w, "mean", "higher", "/s", shows, baseline=base)]
        return [_spec(sig, q, w, "mean", "higher", "/s", f"rate of {sig} per host")]
    if k == "gpu_thermal" and v.get("sensor"):
        out = [_spec("temperature", f"max by (host) ({v['sensor']})", w, "median", "higher", "C",
                     "hottest GPU temperature per host")]  # fmt: skip
        if "hw_gpu_clock_mhz" in d.gpu_min:
            q = 'min by (host) (hw_gpu_clock_mhz{type!="memory"})'
            out.append(_spec("clock", q, w, "median", "lower", "MHz", "slowest GPU core clock per host (clocked down)"))
        return out
    if k == "gpu_power":
        if "hw_gpu_power_limit_watts" in d.gpu_min:
            q = 'min by (host) (hw_gpu_power_limit_watts{type!="memory"})'
            return [_spec("power_limit", q, w, "median", "lower", "W", "lowest GPU power limit per host")]
        q = d.queries["throttle:power"]
        return [_spec("power_throttle", q, w, "median", "higher", "GPUs", "GPUs with power-cap throttle bits per host")]
    if k == "gpu_hardware":
        errs = [e for h in f.hosts for e in v["errors"].get(h, [])]
        errs.sort(key=lambda e: not re.search(r"\{(ue|fatal|nonfatal)\}|^hw_gpu_kernel_errors", e))
        m = re.match(r"(hw_gpu_\w+_total)\{(\w+)\}", errs[0]) if errs else None
        if m and m.group(1) == "hw_gpu_kernel_errors_total":  # counted from the exporter's start: its largest value
            q = f'sum by (host) ({m.group(1)}{{code="{m.group(2)}"}})'
            if "hw_gpu_kernel_log_readable" in d.names:  # the hosts that could see events and had none: 0
                q += " or 0 * max by (host) (hw_gpu_kernel_log_readable)"
            shows = f"kernel GPU error events (code {m.group(2)}) per host"
            return [_spec(m.group(1), q, whole, "max", "higher", "events", shows)]
        if m:
            label = "kind" if m.group(1).startswith("hw_gpu_ras") else "severity"
            q = f'sum by (host) ({m.group(1)}{{{label}="{m.group(2)}"}})'
            shows = f"{m.group(1)} ({label} {m.group(2)}) per host, job"
            return [_spec(m.group(1), q, whole, "delta", "higher", "errors", shows)]
        q = 'min by (host) (hw_gpu_pcie_link_width{type!="memory"})'
        return [_spec("pcie_link_width", q, w, "median", "lower", "lanes", "narrowest GPU PCIe link per host")]
    if k == "cpu_contention":
        q = "max by (host) (hw_procs_running)"
        if "before" in v:
            base = nanmed(list(v["before"].values()))
            shows = "run queue per host after throughput dropped (the baseline: the median before)"
            return [_spec("run_queue", q, w, "median", "higher", "tasks", shows, baseline=base)]
        return [_spec("run_queue", q, w, "median", "higher", "tasks", "run queue per host")]
    if k == "io_pressure" and "peak:hw_io_pressure_full_pct" in d.queries:
        q = d.queries["peak:hw_io_pressure_full_pct"]
        shows = "peak IO pressure (PSI full) per host"
        return [_spec("io_pressure", q, w, "max", "higher", "%", shows, threshold=25.0)]
    if k == "memory":
        if any(x["oom_kills"] >= 1 for x in v["hosts"].values()):
            q = "sum by (host) (hw_oom_kills_total)"
            return [_spec("oom_kills", q, whole, "delta", "higher", "kills", "OOM kills per host over the job")]
        q = "min by (host) (hw_memory_available_bytes) / max by (host) (hw_memory_total_bytes) * 100"
        shows = "lowest available memory per host, % of total"
        return [_spec("memory_available", q, whole, "min", "lower", "%", shows, threshold=3.0)]
    if k in ("training_dynamics", "training_spike"):
        return _training_specs(d, f)
    return []


def _training_specs(d: Data, f: Finding) -> list[dict]:
    """Each spike at its peak (the value the summary quotes, vs its trailing baseline) and, for a verdict, the
    throughput cost that makes it one: tokens/s before the spike and from the spike on (job level)."""
    v = f.values
    out = [
        _spec(key, d.queries[f"tb:{key}"], (x["at"], x["at"]), "max", "higher", "",
              f"{key} (job level) at its spike's peak; the baseline: its trailing median", baseline=x["baseline"])
        for key, x in v.items()
        if key in d.tb and isinstance(x, dict) and "peak" in x
    ]  # fmt: skip
    cost, tok = v.get("throughput_cost"), d.queries.get("tb:tokens")
    if cost and tok and f.window and d.train and f.decides:  # a brief spike (no cost) is no verdict: its peaks only
        at = f.window[0]
        before = (d.train[0], at - d.step)
        shows = "tokens/s/device (job level) before the first spike"
        out.append(_spec("tokens_before", tok, before, "median", "higher", "tokens/s/device", shows))
        shows = "tokens/s/device (job level) from the first spike on; the baseline: the level before"
        out.append(
            _spec("tokens_after", tok, (at, d.train[1]), "median", "lower", "tokens/s/device", shows,
                  baseline=cost["before"])
        )  # fmt: skip
    return out


def _on_grid(d: Data, lo: float, hi: float, step: float) -> tuple[float, float]:
    """A check's range on the grid the checks read (its first and last grid point within [lo, hi]), so that the
    query gives the very values the checks took; a finer step than the grid's: whole seconds around [lo, hi]."""
    if step != d.step or not d.grid.size:
        start = math.floor(lo)
        return start, max(math.ceil(hi), start + int(step))
    i = int(np.clip(math.ceil((lo - d.start) / step - 1e-9), 0, d.grid.size - 1))
    j = int(np.clip(math.floor((hi - d.start) / step + 1e-9), i, d.grid.size - 1))
    return float(d.grid[i]), float(d.grid[j])


def add_verify(d: Data, rep: Report, prom: tsdb.Served, other: tuple[Data, tsdb.Served] | None = None) -> None:
    """Give every finding its `verify` checks: for each deciding signal the query, range and reducer that
    show it and the values they give (culprits, accused hosts, the peers' or every host's median, or the
    job's), on this job and, for --vs findings, on the other job (OTHER: its Data and served TSDB). The
    queries run 4 at a time; a check Prometheus refuses is left out (and a note says so)."""
    jobs = {"this": (d, prom)} | ({"other": other} if other else {})
    todo = []
    for f in rep.findings:
        for spec in _vspecs(d, f, other[0] if other else None):
            dj, pj = jobs[spec.pop("job", "this")]
            lo, hi = spec.pop("window")
            step = spec.pop("step", dj.step)
            todo.append((f, dj, pj, spec, (*_on_grid(dj, lo, hi, step), step)))
    with ThreadPoolExecutor(max_workers=4) as pool:
        futs = [pool.submit(pj.query_range, spec["query"], *rg) for _, _, pj, spec, rg in todo]
        for (f, dj, _, spec, (start, end, step)), fut in zip(todo, futs, strict=True):
            try:
                rows = fut.result()
            except tsdb.TSDBError as e:
                rep.notes.append(f"the verify query {spec['signal']} of the {f.kind} finding failed: {e}")
                continue
            _, expect = check_values(rows, spec["reducer"], f.culprits(), spec.pop("accused", []))
            head = {"signal": spec.pop("signal"), "job": dj.target.name, "tsdb": str(dj.target.tsdb)}
            rg = {"query": spec.pop("query"), "start": start, "end": end, "step": step, "reducer": spec.pop("reducer")}
            f.verify.append({**head, **rg, "expect": expect, **spec})


HOST_PLUGIN_GPU = "hw_gpu_kernel_"  # hw_gpu_* names the host plugin writes (from the kernel log), not the GPU one


def missing_families(d: Data) -> set[str]:
    """Families the checks use that the TSDB lacks (whole plugins collapse to a pattern)."""
    need = {n for names in NEEDS.values() for n in names} - OPTIONAL
    absent = need - d.names
    out = set()
    for prefix, group in (("tb_", "tb_*"), ("hw_gpu_", "hw_gpu_*"), ("hw_ib_", "hw_ib_*")):
        # the host plugin's kernel-log counters (hw_gpu_kernel_*) do not make the GPU plugin present
        if not any(n.startswith(prefix) and not n.startswith(HOST_PLUGIN_GPU) for n in d.names):
            absent = {n for n in absent if not n.startswith(prefix)}
            out.add(group)
    if not any(n.startswith("hw_") for n in d.names):
        absent = {n for n in absent if not n.startswith("hw_")}
        out = (out - {"hw_gpu_*", "hw_ib_*"}) | {"hw_*"}
    return out | absent


def diagnose(target: Target, vs: Target | None = None, *, auto: dict | None = None) -> dict:
    """Run every playbook on one job (optionally against another); the JSON report (plus _report).
    auto: how --vs auto picked vs (pick_baseline); when nothing is found, the baseline --vs auto would
    pick is suggested."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows are expected (gaps, idle hosts)
        r = _diagnose(target, vs)
    if r["vs"] is not None:
        r["vs"]["auto"] = _jsonable(auto)
    elif vs is None and r["verdict"] == "none" and not r["insufficient_evidence"]:
        picked = pick_baseline(target)
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
        rep.gaps = data_gaps(d, _nodes(target))
        run_all(d, rep, prom)
        with contextlib.ExitStack() as stack:
            against = None
            if vs is not None:
                other = stack.enter_context(tsdb.Served(vs.tsdb))
                if other.first is None:
                    rep.notes.append(f"{vs.name} holds no samples: no comparison")
                else:
                    against = (load(vs, other), other)
                    compare(d, against[0], rep)
            for f in rep.findings:  # hosts or fleet, before verify and the verdict read the culprits
                set_scope(f, d.hosts)
            add_verify(d, rep, prom, against)  # the other job's TSDB stays served for its checks
            n = prom.queries + (against[1].queries if against else 0)
    rep.missing |= missing_families(d)
    return _assemble(rep, n, time.monotonic() - t0)


def _nodes(target: Target) -> list[str]:
    """The job's hosts from its log header (nodes: N (h1 h2 ...)), [] without a log."""
    if target.log is None:
        return []
    return joblog.Scan(path="", header=jobdir.header(target.log)).nodes()


def _gaps_said(gaps: list[dict]) -> str:
    """'n2 for 3m20s, n3 for 45s' (each host's total)."""
    total: dict[str, float] = {}
    for g in gaps:
        total[g["host"]] = total.get(g["host"], 0.0) + g["seconds"]
    return ", ".join(f"{h} for {dur(s)}" for h, s in total.items())


def _empty(target: Target, t0: float) -> dict:
    return {
        "schema": SCHEMA,
        "job_id": lookup.job_id_of(target.name),
        "job_name": target.name,
        "tsdb": str(target.tsdb),
        "log": str(target.log) if target.log else None,
        "verdict": "none",
        "scope": None,
        "culprit_hosts": [],
        "affected_hosts": [],
        "insufficient_evidence": True,
        "summary": "insufficient evidence: the TSDB holds no samples",
        "findings": [],
        "ruled_out": [],
        "missing": ["hw_*", "tb_*"],
        "data_gaps": [],
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
    culprits = deciding[0].culprits() if deciding else []
    affected = list(deciding[0].hosts) if deciding else []
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
    if rep.gaps:  # a host not scraped for a while is missing data, not a healthy host
        summary += f"; no data from {_gaps_said(rep.gaps)} (not scraped then: what happened there is not known)"
    return {
        "schema": SCHEMA,
        "job_id": lookup.job_id_of(d.target.name),
        "job_name": d.target.name,
        "tsdb": str(d.target.tsdb),
        "log": str(d.target.log) if d.target.log else None,
        "verdict": verdict,
        "scope": deciding[0].scope if deciding else None,
        "culprit_hosts": culprits,
        "affected_hosts": affected,
        "insufficient_evidence": insufficient,
        "summary": summary,
        "range": {"start": d.start, "end": d.end, "step": d.step, "interval": round(d.interval, 3)},
        "train_window": {"start": d.train[0], "end": d.train[1]} if d.train else None,
        "hosts": d.hosts,
        "phases": _jsonable(d.phases),
        "findings": [f.as_json() for f in rep.findings],
        "ruled_out": rep.ruled_out,
        "missing": sorted(rep.missing),
        "data_gaps": rep.gaps,
        "skipped": rep.skipped,
        "vs": _jsonable(rep.vs),
        "notes": rep.notes,
        "families": sorted(n for n in d.names if not n.startswith("ray_"))
        + sorted({"ray_*"} if any(n.startswith("ray_") for n in d.names) else set()),
        "queries_run": n_queries,
        "seconds": round(seconds, 3),
        "_report": rep,
    }


def check_line(v: dict, job: str) -> str:
    """One verify check for people: the reducer, the query (and the other job's name when it runs there) and
    what diagnose got: the culprits' values, and the peers', every host's or the job's."""
    e = v["expect"]
    got = ", ".join(f"{h} {fmt(x if x is not None else math.nan)}" for h, x in list(e["culprits"].items())[:4])
    got += f" (+{len(e['culprits']) - 4} more)" if len(e["culprits"]) > 4 else ""
    ref = next(
        (
            f"{k} {fmt(e[k] if e[k] is not None else math.nan)}"
            for k in ("peers_median", "hosts_median", "job")
            if k in e
        ),
        "",
    )
    where = f" on {v['job']}" if v["job"] != job else ""
    return f"{v['reducer']} of {v['query']}{where} -> {'; '.join(x for x in (got, ref) if x)}" + (
        f" {v['unit']}" if v.get("unit") else ""
    )


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
    elif r.get("scope") == "fleet" and r.get("affected_hosts"):
        head += f"   fleet-wide: every host ({len(r['affected_hosts'])}), no culprit host"
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
            for v in f.get("verify") or []:
                lines.append(f"     check {v['signal']}: {check_line(v, r['job_name'])}")
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
    for g in r.get("data_gaps") or []:
        when = f"{utc(g['start'])} .. {utc(g['end'])}"
        lines.append(f"Missing data: {g['host']} {when} ({dur(g['seconds'])}): not scraped, nothing known of it then")
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


# The options of diagnose.py, declared once: its parser below and the MCP tool `diagnose` (cli.Option).
OPTIONS = (
    cli.Option(
        "vs",
        "compare with this job (as JOB), or auto: the nearest clean run of the same model by time, before or "
        "after JOB, beside it (sharing hosts with it when one does)",
        metavar="OTHER_JOB",
    ),
    cli.JSON,
    cli.Option(
        "plot",
        "write PNG charts of the evidence to DIR",
        Path,
        metavar="DIR",
        cli_only="the MCP tools write nothing",
    ),
    cli.Option(
        "report",
        "write one HTML page of the diagnosis: DIR/<job name>-report.html",
        Path,
        metavar="DIR",
        cli_only="the MCP tools write nothing",
    ),
    cli.WORKSPACE,
)


def build_parser() -> cli.Parser:
    return cli.tool_parser("diagnose.py", __doc__, "JOB", "job id, job name, job dir, its log or TSDB dir", OPTIONS)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    ws = a.workspace or default_workspace()
    try:
        if a.plot is not None:
            check_out_dir(a.plot)
        if a.report is not None:
            check_out_dir(a.report, "--report", "the HTML page")
        target = locate(a.job, ws)
        other, auto = other_job(target, a.vs, ws)
        report = diagnose(target, other, auto=auto)
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
