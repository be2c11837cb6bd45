"""Usage: perf.py JOB [--json] [--workspace DIR] [--peak-tflops X | --gpu NAME] [--warmup-steps N] [options]

Performance of a MaxText job from its step lines: steady tokens/s/device (TGS) and TFLOP/s/device,
MFU against one device's peak dense bf16 TFLOP/s, where the step time goes (first step, warm-up,
steady median and tail, stall steps such as checkpoint saves, evals and data waits, and the wall
time they cost), a per-host comparison, and a summary of the profiler traces under the job
directory (top ops, compute / collectives / idle).
JOB is a job id or a job name (<id>-JAX-<model>[-<tag>], looked up in --workspace), a job
directory or a log file, as for triage.py.
--json prints the report for programs (schema: docs/perf.md). Exit 0 when the job was analysed
(also a job without step lines: the report says so), 2 on bad input (no such job, not a job log,
bad option).
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from profiling.traces import analyse_traces, find_traces

import joblog
from diagnosis import cli, jobdir, locate, tsdb
from diagnosis.cli import InputError
from launch import config_header

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "perf/1"  # the JSON report's "schema" (docs/perf.md); bumped when a field changes meaning

# Peak dense (no sparsity) bf16 matrix TFLOP/s of ONE device as JAX sees it, from the vendors'
# datasheets (sources in docs/perf.md). Matched in order against --gpu or XLA's device name.
GPUS: list[tuple[str, str, float, str]] = [
    ("H100-PCIe", r"h100.*pcie", 756.5, "NVIDIA H100 datasheet: BF16 Tensor Core 1,513 TFLOPS with sparsity"),
    ("H100-NVL", r"h100.*nvl", 835.5, "NVIDIA H100 NVL datasheet: BF16 Tensor Core 1,671 TFLOPS with sparsity"),
    ("H100", r"h100", 989.4, "NVIDIA H100 SXM5 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity"),
    ("H200-NVL", r"h200.*nvl", 835.5, "NVIDIA H200 NVL datasheet: BF16 Tensor Core 1,671 TFLOPS with sparsity"),
    ("H200", r"h200", 989.4, "NVIDIA H200 SXM datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity"),
    ("A100", r"a100", 312.0, "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)"),
    ("GB200", r"gb200", 2500.0, "NVIDIA GB200 NVL72: FP16/BF16 360 PFLOPS with sparsity for 72 GPUs"),
    ("B200", r"b200", 2250.0, "NVIDIA HGX B200: FP16/BF16 36 PFLOPS with sparsity for 8 GPUs"),
    ("MI300X", r"mi300x", 1307.4, "AMD Instinct MI300X datasheet: peak BF16 1307.4 TFLOPS (2614.9 with sparsity)"),
    ("MI325X", r"mi325x", 1307.4, "AMD Instinct MI325X datasheet: peak BF16 1307.4 TFLOPS (2614.9 with sparsity)"),
    (
        "MI355X",
        r"mi355x",
        2516.6,
        "AMD Instinct MI355X: 2.5 PFLOPS BF16 dense; 256 CUs x 2.4 GHz x 4096 FLOP/clk = 2516.6",
    ),
]


# --- numbers ------------------------------------------------------------------------------
def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 1]."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def gpu_peak(name: str) -> tuple[str, float, str] | None:
    """(table name, peak TFLOP/s, source) for a GPU name or XLA device name; None when unknown."""
    low = name.lower()
    for key, rx, peak, src in GPUS:
        if re.search(rx, low) or low.replace(" ", "-") == key.lower():
            return key, peak, src
    return None


# --- the GPU model and a sanity check of the TFLOP/s ----------------------------------------
TFLOPS_TOLERANCE = 2.0  # reported TFLOP/s/device within this factor of 6 N tokens/s/device is plausible


def tsdb_models(job_dir: Path | None) -> tuple[list[str], str | None]:
    """The GPU models of the job's hw_gpu_info series (the GPU plugin's), most GPUs first, and a note
    when the job's TSDB could not say (None when it has no TSDB at all: nothing to say)."""
    if job_dir is None or not tsdb.is_tsdb(job_dir / "prometheus"):
        return [], None
    try:
        with tsdb.Served(job_dir) as prom:
            if prom.first is None or prom.last is None:
                return [], "the job's TSDB is empty: no hw_gpu_info"
            span = int(prom.last - prom.first) + 1
            rows = prom.query(f"count by (model) (max_over_time(hw_gpu_info[{span}s]))", prom.last)
    except tsdb.TSDBError as e:
        return [], f"GPU model not read from the job's TSDB: {e}"
    counts = sorted(((int(float(r["value"][1])), r["metric"].get("model", "")) for r in rows), reverse=True)
    models = [m for _, m in counts if m]
    return models, None if models else "the job's TSDB has no hw_gpu_info series (saved before the plugin had it?)"


def gpu_model(device: str | None, job_dir: Path | None, gpu: str | None, ask_tsdb: bool) -> tuple[dict, str | None]:
    """{"model", "source", "models"} of the job's GPUs: --gpu, else XLA's device 0 in the log, else the
    TSDB's hw_gpu_info (only when ask_tsdb: serving a TSDB costs a Prometheus start); and a note."""
    if gpu:
        return {"model": gpu, "source": "--gpu", "models": [gpu]}, None
    if device:
        return {"model": device, "source": "log", "models": [device]}, None
    models, note = tsdb_models(job_dir) if ask_tsdb else ([], None)
    if models:
        if len(models) > 1:
            note = f"the job ran on several GPU models ({', '.join(models)}): the peak is {models[0]}'s (most GPUs)"
        return {"model": models[0], "source": "tsdb", "models": models}, note
    return {"model": None, "source": None, "models": []}, note


def model_params(table: joblog.StepTable, header: dict[str, str], job_dir: Path | None) -> tuple[float | None, str]:
    """(parameters active per token, where the number comes from): the config header's active count
    for a MoE (config_header.read_header; MaxText logs every expert's parameters), else MaxText's own
    parameter count line; (None, why) when neither says."""
    model = header.get("model", "").split(" ")[0]
    for cfg in ([job_dir / "artifact" / "configs" / f"{model}.yml"] if job_dir and model else []) + (
        [REPO / "configs" / f"{model}.yml"] if model else []
    ):
        try:
            head = config_header.read_header(cfg)
        except (OSError, ValueError):
            continue
        if head.active_b:
            return head.active_b * 1e9, f"{cfg.name} header: {head.active_b:g}B active per token (MoE)"
        break
    if table.params:
        return table.params, f"log: {table.params_text}"
    if table.params_text:
        return None, f"log: {table.params_text}: too small to check"
    return None, "no 'number parameters' line in the log"


def tflops_check(
    reported: float | None, tgs: float | None, params: float | None, params_source: str, peak: float | None, gpu: str
) -> dict:
    """MaxText's TFLOP/s/device against the 6 N tokens/s/device of a dense transformer's training
    (forward 2N, backward 4N per token; attention adds to it, so a ratio somewhat above 1 is normal),
    and against one device's peak."""
    expected = 6 * params * tgs / 1e12 if params and tgs else None
    ratio = reported / expected if reported is not None and expected else None
    out = {
        "params": round(params) if params else None,
        "params_source": params_source,
        "tokens_per_sec_per_device": tgs,
        "expected_tflops_per_device": _r(expected, 4),
        "reported_tflops_per_device": _r(reported, 4),
        "ratio": _r(ratio, 3),
        "tolerance": TFLOPS_TOLERANCE,
        "peak_tflops": peak,
        "verdict": "unknown",
        "note": "",
    }
    if reported is not None and peak and reported > peak:
        out["verdict"] = "above_peak"
        out["note"] = (
            f"reported {reported:.4g} TFLOP/s/device is above the peak {peak:g} of {gpu}: MaxText's FLOP count "
            "or the GPU model is wrong; MFU is not to be trusted"
        )
    elif ratio is None:
        why = (
            "no TFLOP/s/device in the step lines"
            if reported is None
            else "no steady tokens/s/device"
            if not tgs
            else params_source
        )
        out["note"] = f"not checked: {why}"
    elif ratio > TFLOPS_TOLERANCE or ratio < 1 / TFLOPS_TOLERANCE:
        out["verdict"] = "too_high" if ratio > 1 else "too_low"
        out["note"] = (
            f"reported {reported:.4g} TFLOP/s/device is {ratio:.2g} x 6 N tokens/s/device ({expected:.4g}, "
            f"N {params / 1e9:.4g}B, {tgs:.6g} tokens/s/device): beyond a factor {TFLOPS_TOLERANCE:g}; check "
            "the parameter count (a MoE counts its active parameters) and MaxText's FLOP accounting"
        )
    else:
        out["verdict"] = "consistent"
        out["note"] = (
            f"reported {reported:.4g} TFLOP/s/device is {ratio:.2g} x 6 N tokens/s/device ({expected:.4g}): "
            f"within a factor {TFLOPS_TOLERANCE:g}"
        )
    return out


# --- steps --------------------------------------------------------------------------------
def split_rows(st: joblog.Steps, warmup_steps: int) -> tuple[list[int], list[int]]:
    """(warm-up rows, steady rows) of one host's step columns: the steady rows are joblog's
    (Steps.steady_rows, the rule of every tool); the first row (compilation) is neither."""
    n = len(st.step)
    steady, _ = st.steady_rows(warmup_steps)
    keep = set(steady)
    return [i for i in range(1, n) if i not in keep], [i for i in steady if i != 0 or n == 1]


def step_report(st: joblog.Steps, warmup_steps: int, stall_factor: float) -> dict:
    warm, steady = split_rows(st, warmup_steps)
    sec = st.seconds
    ss = [sec[i] for i in steady]
    med = statistics.median(ss) if ss else None
    total = sum(sec)
    out: dict = {
        "first": _r(sec[0]) if sec else None,
        "first_step": st.step[0] if sec else None,
        "to_first_step": None,
        "warmup_mean": _r(statistics.fmean([sec[i] for i in warm])) if warm else None,
        "warmup_steps": len(warm),
        "median": _r(med),
        "mean": _r(statistics.fmean(ss)) if ss else None,
        "p95": _r(percentile(ss, 0.95)),
        "p99": _r(percentile(ss, 0.99)),
        "max": _r(max(ss)) if ss else None,
        "total": _r(total, 3),
        "steady_steps": len(ss),
    }
    stall_rows = [i for i in steady if med and sec[i] > stall_factor * med]
    stall_s = sum(sec[i] for i in stall_rows)
    excess = sum(sec[i] - med for i in stall_rows) if med else 0.0
    longest = sorted(stall_rows, key=lambda i: -sec[i])[:5]
    stalls = {
        "factor": stall_factor,
        "threshold_seconds": _r(stall_factor * med) if med else None,
        "count": len(stall_rows),
        "steps": [st.step[i] for i in stall_rows[:100]],
        "seconds": _r(stall_s, 3),
        "excess_seconds": _r(excess, 3),
        "share": _r(excess / total) if total > 0 else None,
        "longest": [{"step": st.step[i], "seconds": _r(sec[i])} for i in longest],
    }
    lost = None
    if med is not None:
        first = sec[0] - med
        warm_l = sum(sec[i] - med for i in warm)
        lost_all = total - len(sec) * med
        lost = {
            "seconds": _r(lost_all, 3),
            "share": _r(lost_all / total) if total > 0 else None,
            "first": _r(first, 3),
            "warmup": _r(warm_l, 3),
            "stalls": _r(excess, 3),
            "jitter": _r(lost_all - first - warm_l - excess, 3),
        }
    return {"step_time": out, "stalls": stalls, "lost": lost, "rows": (warm, steady)}


def rates(st: joblog.Steps, steady: list[int]) -> tuple[dict, float | None]:
    tok = [st.tokens[i] for i in steady if st.tokens[i] is not None]
    tfl = [st.tflops[i] for i in steady if st.tflops[i] is not None]
    done = [(st.tokens[i] or 0.0) * st.seconds[i] for i in steady if st.tokens[i] is not None]
    wall = sum(st.seconds[i] for i in steady if st.tokens[i] is not None)
    tgs = {
        "steady": _r(statistics.median(tok), 3) if tok else None,
        "p10": _r(percentile(tok, 0.10), 3),
        "p90": _r(percentile(tok, 0.90), 3),
        "mean": _r(statistics.fmean(tok), 3) if tok else None,
        "effective": _r(sum(done) / wall, 3) if wall > 0 else None,
    }
    return tgs, (statistics.median(tfl) if tfl else None)


def host_table(table: joblog.StepTable, nodes: list[str], warmup_steps: int, stall_factor: float) -> list[dict]:
    """Per host: steady step time, its tail and stalls (a host's own stalls: > factor x its median)."""
    out = []
    single = nodes[0] if len(nodes) == 1 else None
    for host, st in table.hosts.items():
        if not st.step:
            continue
        _, steady = split_rows(st, warmup_steps)
        ss = [st.seconds[i] for i in steady]
        med = statistics.median(ss) if ss else None
        name = host if host is not None else single
        out.append(
            {
                "host": name,
                "rank": nodes.index(name) if name in nodes else None,
                "steps": len(st.step),
                "last_step": st.step[-1],
                "median": _r(med),
                "p95": _r(percentile(ss, 0.95)),
                "max": _r(max(ss)) if ss else None,
                "stalls": sum(1 for x in ss if med and x > stall_factor * med),
                "vs_median": None,
            }
        )
    meds = [h["median"] for h in out if h["median"]]
    if meds:
        m = statistics.median(meds)
        for h in out:
            h["vs_median"] = _r(h["median"] / m) if h["median"] and m else None
    out.sort(key=lambda h: (h["rank"] is None, h["rank"] if h["rank"] is not None else 0, str(h["host"])))
    return out


def job_setting(header: dict[str, str], job_dir: Path | None, key: str) -> str | None:
    """A MaxText setting of the job: the last KEY=V of the header's overrides, else KEY: in the
    snapshot's artifact/configs/<model>.yml; None when neither sets it (MaxText's default applies)."""
    found = None
    for kv in header.get("overrides", "").split():
        k, _, v = kv.partition("=")
        if k == key:
            found = v
    if found is not None or job_dir is None:
        return found
    model = header.get("model", "").split(" ")[0]
    try:
        text = (job_dir / "artifact" / "configs" / f"{model}.yml").read_text(errors="replace") if model else ""
    except OSError:
        return None
    m = re.search(rf"(?m)^{re.escape(key)}:\s*[\"']?([^\"'#\s]*)", text)
    return m.group(1) if m else None


def profiler_window(header: dict[str, str], job_dir: Path | None) -> tuple[int, int] | None:
    """(first, last) step MaxText profiles (common/profiler.py: from skip_first_n_steps_for_profiler,
    profiler_steps long; base.yml defaults 1 and 5), or None without profiler=xplane|nsys."""
    if (job_setting(header, job_dir, "profiler") or "") not in ("xplane", "nsys"):
        return None
    try:
        skip = int(job_setting(header, job_dir, "skip_first_n_steps_for_profiler") or 1)
        n = int(job_setting(header, job_dir, "profiler_steps") or 5)
    except ValueError:
        return None
    return skip, skip + n - 1


def perf(
    job: str,
    workspace: Path | None = None,
    *,
    peak_tflops: float | None = None,
    gpu: str | None = None,
    warmup_steps: int = joblog.WARMUP_STEPS,
    stall_factor: float = 3.0,
    max_traces: int = 2,
    top: int = 10,
) -> dict:
    """The report for JOB (as diagnosis/locate.py finds it) as a dict (see docs/perf.md)."""
    found = locate.find_log(job, workspace)
    log = found.log
    s, job_dir = locate.read_log(log, found.dir)
    try:
        table = joblog.read_steps(log, s.steps.clock)
    except OSError as e:
        raise InputError(f"cannot read {log}: {e.strerror or e}") from None
    notes: list[str] = []
    job_id, job_name = locate.job_id_and_name(s, log)
    nodes = s.nodes()
    ref = s.steps.host if s.steps.host in table.hosts else next(iter(table.hosts), None)
    st = table.hosts.get(ref) if table.hosts else None

    # the GPU model (--gpu, the log, the TSDB's hw_gpu_info) and its peak
    if gpu and gpu_peak(gpu) is None:
        raise InputError(f"unknown GPU '{gpu}' (known: {', '.join(g[0] for g in GPUS)}; or pass --peak-tflops X)")
    has_steps = any(x is not None for h in table.hosts.values() for x in h.tflops)
    gpu_info, gpu_note = gpu_model(table.device, job_dir, gpu, ask_tsdb=peak_tflops is None and has_steps)
    if gpu_note:
        notes.append(gpu_note)
    peak, source = None, None
    hit = gpu_peak(gpu_info["model"]) if gpu_info["model"] else None
    if peak_tflops is not None:
        peak, source = peak_tflops, "--peak-tflops"
    elif hit:
        where = {
            "--gpu": "--gpu",
            "log": f"log: XLA device 0 is '{gpu_info['model']}'",
            "tsdb": f"TSDB: hw_gpu_info model '{gpu_info['model']}'",
        }[gpu_info["source"]]
        peak, source = hit[1], f"{where} -> {hit[0]}: {hit[2]}"

    rep: dict = {
        "schema": SCHEMA,
        "job_id": job_id,
        "job_name": job_name,
        "log": str(log),
        "job_dir": str(job_dir) if job_dir else None,
        "status": s.summary.get("status") or None,
        "host": ref if ref is not None else (nodes[0] if len(nodes) == 1 else None),
        "device": table.device,
        "gpu": gpu_info,
        "steps": None,
        "tgs": {"steady": None, "p10": None, "p90": None, "mean": None, "effective": None},
        "tflops_per_device": None,
        "peak_tflops": peak,
        "peak_source": source,
        "mfu": None,
        "tflops_check": None,
        "step_time": None,
        "stalls": None,
        "lost": None,
        "hosts": [],
        "traces": [],
        "notes": notes,
        "scan": {"seconds": round(s.seconds + table.seconds, 3)},
    }
    if not s.summary:
        notes.append("no JOB SUMMARY yet: the job may still be running; the numbers cover the steps logged so far")
    if table.runs > 1:
        notes.append(f"the log holds {table.runs} runs (a requeued job); this report is about the last one")
    if st is None or not st.step:
        notes.append("no step lines: nothing to measure (did training start? utils/triage.py tells why a job failed)")
    else:
        sr = step_report(st, warmup_steps, stall_factor)
        warm, steady = sr.pop("rows")
        tgs, tfl = rates(st, steady)
        rep["steps"] = {
            "count": len(st.step),
            "first": st.step[0],
            "last": st.step[-1],
            "rampup": st.rampup,
            "warmup": len(warm),
            "steady": len(steady),
        }
        rep["tgs"] = tgs
        rep["tflops_per_device"] = _r(tfl, 4)
        rep.update(sr)
        t0, started = st.ts(0), jobdir.started(s.header)
        if t0 is not None and started is not None and t0 >= started:
            rep["step_time"]["to_first_step"] = _r(t0 - started, 3)
        span = st.step[-1] - st.step[0] + 1
        if len(st.step) < 0.9 * span:
            notes.append(
                f"the log has step lines for {len(st.step)} of the {span} steps {st.step[0]}-{st.step[-1]}: "
                "totals and lost time cover the logged steps only"
            )
        if len(steady) < 10:
            notes.append(
                f"only {len(steady)} steady steps (after {len(warm) + 1} first/warm-up steps): medians are rough"
            )
        if tfl is not None and peak:
            rep["mfu"] = _r(tfl / peak, 4)
        elif tfl is None:
            notes.append("the step lines carry no TFLOP/s/device (batch ramp-up only?): no MFU")
        else:
            dev = f" ({gpu_info['source']}: '{gpu_info['model']}', not in the table)" if gpu_info["model"] else ""
            notes.append(
                f"MFU needs one device's peak dense bf16 TFLOP/s{dev}: pass --gpu NAME "
                f"({', '.join(g[0] for g in GPUS)}) or --peak-tflops X"
            )
        n, n_source = model_params(table, s.header, job_dir)
        chk = tflops_check(tfl, tgs["steady"], n, n_source, peak, gpu_info["model"] or "this GPU")
        rep["tflops_check"] = chk
        if chk["verdict"] not in ("consistent", "unknown"):
            notes.append(f"TFLOP/s check: {chk['note']}")
        stl = rep["stalls"]
        window = profiler_window(s.header, job_dir)
        stl["profiler"] = [x for x in stl["steps"] if window and window[0] - 1 <= x <= window[1] + 2]
        if stl["count"]:
            notes.append(
                f"{stl['count']} stall step(s) over {stall_factor:g} x the median step cost "
                f"{stl['excess_seconds']:.3g} s ({100 * (stl['share'] or 0):.1f} % of the step time); "
                "checkpoint saves, evals and input stalls look like this"
            )
        if stl["profiler"]:
            notes.append(
                f"the profiler ran over steps {window[0]}-{window[1]}: stall step(s) "
                f"{', '.join(map(str, stl['profiler']))} are likely the profiler starting or writing its trace"
            )
        rep["hosts"] = host_table(table, nodes, warmup_steps, stall_factor)
        slow = max((h for h in rep["hosts"] if h["vs_median"]), key=lambda h: h["vs_median"], default=None)
        if slow and len(rep["hosts"]) > 1 and slow["vs_median"] >= 1.05:
            notes.append(f"host {slow['host']} steps {100 * (slow['vs_median'] - 1):.0f} % slower than the median host")
    dirs = [d for d in (job_dir,) if d]
    if table.tensorboard_dir and Path(table.tensorboard_dir).is_dir():
        tbd = Path(table.tensorboard_dir)
        if not any(tbd.resolve().is_relative_to(d.resolve()) for d in dirs):
            dirs.append(tbd)
    if dirs:
        rep["traces"] = find_traces(dirs)
        analyse_traces(rep["traces"], max_traces, top, notes)
        for t in rep["traces"]:
            t.pop("mtime", None)
        if not rep["traces"]:
            notes.append(
                "no profiler traces (run with profiler=xplane skip_first_n_steps_for_profiler=N "
                "profiler_steps=M to get some)"
            )
    else:
        notes.append("no job directory: traces not searched")
    return rep


# --- text -------------------------------------------------------------------------------------
def _fmt(x: float | None, unit: str = "", nd: int = 4) -> str:
    return "-" if x is None else f"{x:.{nd}g}{unit}"


def render(r: dict) -> str:
    """The report as text for people."""
    lines = [f"job {r['job_id']} ({r['job_name']})" + (f": {r['status']}" if r["status"] else "")]
    st, t = r["step_time"], r["tgs"]
    if r["steps"]:
        s = r["steps"]
        lines.append(
            f"steps {s['first']}-{s['last']} on {r['host'] or 'the log'}: {s['count']} logged, "
            f"{s['warmup']} warm-up, {s['steady']} steady"
        )
        lines.append(
            f"throughput: {_fmt(t['steady'], nd=6)} tokens/s/device steady (p10 {_fmt(t['p10'], nd=6)}, "
            f"p90 {_fmt(t['p90'], nd=6)}; effective incl. stalls {_fmt(t['effective'], nd=6)})"
        )
        mfu = f"MFU {100 * r['mfu']:.1f} % of {r['peak_tflops']:g}" if r["mfu"] is not None else "MFU -"
        lines.append(
            f"compute: {_fmt(r['tflops_per_device'])} TFLOP/s/device, {mfu}"
            + (f" ({r['peak_source']})" if r["peak_source"] else "")
        )
        g = r["gpu"]
        if g["model"]:
            lines.append(f"gpu: {g['model']} (from {g['source']})")
        if r["tflops_check"]:
            lines.append(f"TFLOP/s check: {r['tflops_check']['verdict']}: {r['tflops_check']['note']}")
        lines.append(
            f"step time: first {_fmt(st['first'], ' s')}"
            + (f" ({_fmt(st['to_first_step'], ' s')} from job start)" if st["to_first_step"] else "")
            + f", warm-up mean {_fmt(st['warmup_mean'], ' s')}, steady median {_fmt(st['median'], ' s')}, "
            f"p95 {_fmt(st['p95'], ' s')}, p99 {_fmt(st['p99'], ' s')}, max {_fmt(st['max'], ' s')}"
        )
        sl = r["stalls"]
        if sl["count"]:
            shown = ", ".join(str(x) for x in sl["steps"][:12]) + (" ..." if sl["count"] > 12 else "")
            lines.append(
                f"stalls (> {sl['factor']:g} x median): {sl['count']} at steps {shown}; "
                f"{_fmt(sl['excess_seconds'], ' s')} lost ({100 * (sl['share'] or 0):.1f} %)"
            )
        else:
            lines.append(f"stalls (> {sl['factor']:g} x median): none")
        lo = r["lost"]
        if lo:
            lines.append(
                f"lost vs. every step at the median: {_fmt(lo['seconds'], ' s')} of {_fmt(st['total'], ' s')} "
                f"({100 * (lo['share'] or 0):.1f} %): first step {_fmt(lo['first'], ' s')}, warm-up "
                f"{_fmt(lo['warmup'], ' s')}, stalls {_fmt(lo['stalls'], ' s')}, jitter {_fmt(lo['jitter'], ' s')}"
            )
        if len(r["hosts"]) > 1:
            lines.append("hosts (steady median step time, x the median host):")
            for h in sorted(r["hosts"], key=lambda h: -(h["vs_median"] or 0))[:8]:
                lines.append(
                    f"  {h['host']}: {_fmt(h['median'], ' s')} (x{_fmt(h['vs_median'])}), p95 "
                    f"{_fmt(h['p95'], ' s')}, {h['stalls']} stalls, last step {h['last_step']}"
                )
    for tr in r["traces"]:
        lines.append(f"trace: {tr['path']} ({tr['kind']}, {tr['bytes'] / 1e6:.1f} MB)")
        sm = tr["summary"]
        if tr["same_as"]:
            lines.append("  same profile as the trace.json.gz beside it")
        if sm and sm["split"]:
            sp = sm["split"]
            lines.append(
                f"  {sm['source']}: window {_fmt(sm['window_ms'], ' ms')}, compute {100 * sp['compute']:.1f} %, "
                f"collectives exposed {100 * sp['collective_exposed']:.1f} %, overlapped {100 * sp['overlap']:.1f} %, "
                f"idle {100 * sp['idle']:.1f} %"
            )
            for op in sm["top_ops"][:5]:
                lines.append(
                    f"    {op['ms']:>10.3f} ms {100 * op['share']:5.1f} %  {op['name']} ({op['kind']}, x{op['count']})"
                )
        for c in tr["view"]:
            lines.append(f"  view: {c}")
    for n in r["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


# The options of perf.py, declared once: its parser below and the MCP tool `perf` (cli.Option).
OPTIONS = (
    cli.JSON,
    cli.WORKSPACE,
    cli.Option(
        "peak_tflops",
        "peak dense bf16 TFLOP/s of one device, for MFU (overrides the table)",
        float,
        gt=0,
        metavar="X",
        note="",
        group="peak",
    ),
    cli.Option("gpu", "device type for the peak: " + ", ".join(g[0] for g in GPUS), metavar="NAME", group="peak"),
    cli.Option(
        "warmup_steps",
        "first steps left out of the steady numbers, the first (compilation) included",
        int,
        joblog.WARMUP_STEPS,
        gt=0,
        metavar="N",
        cli_only="not offered over MCP yet",
    ),
    cli.Option(
        "stall_factor",
        "a steady step longer than F x the median is a stall",
        float,
        3.0,
        gt=0,
        metavar="F",
        cli_only="not offered over MCP yet",
    ),
    cli.Option(
        "max_traces",
        "summarise at most N trace files, newest first",
        int,
        2,
        ge=0,
        metavar="N",
        note="default 2; 0: only list them",
        cli_only="not offered over MCP yet",
    ),
    cli.Option("top", "ops listed per trace", int, 10, gt=0, metavar="N", cli_only="not offered over MCP yet"),
)


def build_parser() -> cli.Parser:
    peaks = ", ".join(f"{g[0]} {g[2]:g}" for g in GPUS)
    epilog = f"Peaks (dense bf16 TFLOP/s per device): {peaks}. Sources: docs/perf.md."
    return cli.tool_parser("perf.py", __doc__, "JOB", "job id, job name, job directory or log file", OPTIONS, epilog)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        r = perf(
            a.job,
            a.workspace,
            peak_tflops=a.peak_tflops,
            gpu=a.gpu,
            warmup_steps=a.warmup_steps,
            stall_factor=a.stall_factor,
            max_traces=a.max_traces,
            top=a.top,
        )
    except InputError as e:
        return cli.fail("perf.py", e)
    cli.emit(r, a.json, render)
    return cli.OK
