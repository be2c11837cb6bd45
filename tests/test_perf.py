"""utils/perf.py: throughput, MFU, step-time breakdown, stalls and per-host comparison on synthetic
logs in the launcher's real format (tests/helpers/logcorpus.py), with the expected numbers computed here
from the injected step times; a trace laid out as JAX writes it on a GPU (measured on an H100:
/device:GPU:0 with "Stream #N(...)" kernel lanes); a real tiny job run with the profiler on; and
bad input on the command line."""

import gzip
import json
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, launcher_env, run

from diagnosis import perf, triage
from helpers import inproc, logcorpus
from helpers.jobs import bad_job_arg
from helpers.promfixture import write_tsdb

PERF = str(REPO / "utils" / "perf.py")
H100 = 989.4  # NVIDIA's dense bf16 figure, as in the docs


def write_log(
    ws: Path,
    seconds: dict[str, list[float]],
    tokens: float = 4e8,
    rampup: int = 0,
    absl: bool = True,
    prefix: bool = True,
    overrides: int | None = None,
) -> Path:
    """A completed job whose hosts print the given per-step seconds (the real line format)."""
    hosts = list(seconds)
    n = len(seconds[hosts[0]])
    job = logcorpus.Job(
        hosts=hosts,
        steps=n,
        tokens_per_step=tokens,
        rampup_steps=rampup,
        absl=absl,
        host_prefix=prefix,
        total_steps=overrides,
    )
    w = logcorpus._Writer(job)
    lines = logcorpus.header(job, ws)
    for rank, h in enumerate(hosts):
        lines += logcorpus.startup(job, w, h, rank, job.start + 5)
    t = job.start + 15
    for step in range(n):
        t += seconds[hosts[0]][step]
        for h in hosts:
            lines.append(logcorpus.step_line(job, w, h, step, t, seconds[h][step]))
    outcome = logcorpus._Outcome({h: (0, "exit") for h in hosts}, "completed")
    lines += logcorpus.summary_block(job, ws, outcome, int(t - job.start))
    ws.mkdir(parents=True, exist_ok=True)
    log = ws / f"{job.name}.log"
    log.write_text("\n".join(lines) + "\n")
    (ws / job.name).mkdir(exist_ok=True)
    (ws / job.name / "log").symlink_to(log)
    return log


def series(n: int, base: float, stalls: dict[int, float], first: float = 40.0) -> list[float]:
    """Step seconds (3 decimals, as logged): a slow first step, +-2 % jitter, stalls at given steps."""
    rng = np.random.default_rng(7)
    out = [first] + [round(base * (1 + rng.uniform(-0.02, 0.02)), 3) for _ in range(n - 1)]
    for step, sec in stalls.items():
        out[step] = sec
    return out


def logged(x: float) -> float:
    return float(f"{x:.3f}")


def test_numbers_follow_the_injected_step_times(tmp_path):
    base, tokens = 0.8, 4e8
    s1 = series(60, base, {20: 6.0, 41: 4.5})  # a checkpoint save and an eval
    slow = [x * 1.25 for x in s1]  # n3 steps 25 % slower
    log = write_log(tmp_path / "ws", {"n1": s1, "n2": s1, "n3": slow}, tokens=tokens)
    r = perf.perf(str(log), gpu="H100")

    steady = s1[3:]  # default: the first 3 steps are left out
    tgs = [logged(tokens / s) for s in steady]
    tfl = [logged(tokens / s * 1e-6) for s in steady]
    med = statistics.median(steady)
    assert r["job_id"] == "4242" and r["host"] == "n1" and r["status"] == "completed"
    assert r["steps"] == {"count": 60, "first": 0, "last": 59, "rampup": 0, "warmup": 2, "steady": 57}
    assert r["tgs"]["steady"] == pytest.approx(statistics.median(tgs), abs=1e-3)
    assert r["tgs"]["p10"] == pytest.approx(np.percentile(tgs, 10), abs=1e-3)
    assert r["tgs"]["p90"] == pytest.approx(np.percentile(tgs, 90), abs=1e-3)
    assert r["tflops_per_device"] == pytest.approx(statistics.median(tfl), abs=1e-4)
    assert r["peak_tflops"] == H100 and r["mfu"] == pytest.approx(statistics.median(tfl) / H100, abs=1e-4)

    st = r["step_time"]
    assert st["first"] == 40.0 and st["warmup_mean"] == pytest.approx(statistics.fmean(s1[1:3]), abs=1e-4)
    assert st["median"] == pytest.approx(med, abs=1e-4)
    assert st["p95"] == pytest.approx(np.percentile(steady, 95), abs=1e-4)
    assert st["p99"] == pytest.approx(np.percentile(steady, 99), abs=1e-4)
    assert st["to_first_step"] == pytest.approx(15 + 40.0, abs=0.01)  # header started: -> step 0's stamp
    total = sum(s1)
    assert st["total"] == pytest.approx(total, abs=1e-3)

    excess = (6.0 - med) + (4.5 - med)
    stalls = r["stalls"]
    assert stalls["count"] == 2 and stalls["steps"] == [20, 41] and stalls["seconds"] == pytest.approx(10.5)
    assert stalls["excess_seconds"] == pytest.approx(excess, abs=1e-3)
    assert stalls["share"] == pytest.approx(excess / total, abs=1e-4)
    lost = r["lost"]
    assert lost["seconds"] == pytest.approx(total - 60 * med, abs=1e-3)
    assert lost["first"] == pytest.approx(40.0 - med, abs=1e-3) and lost["stalls"] == pytest.approx(excess, abs=1e-3)

    hosts = {h["host"]: h for h in r["hosts"]}
    assert [h["host"] for h in r["hosts"]] == ["n1", "n2", "n3"] and [h["rank"] for h in r["hosts"]] == [0, 1, 2]
    med3 = statistics.median(slow[3:])
    assert hosts["n3"]["vs_median"] == pytest.approx(med3 / med, abs=1e-3) and hosts["n1"]["vs_median"] == 1.0
    assert hosts["n3"]["stalls"] == 2 and all(h["last_step"] == 59 for h in r["hosts"])
    assert any("n3" in n and "slower" in n for n in r["notes"])
    json.dumps(r)


@pytest.mark.parametrize("fmt", ["no_absl", "no_prefix"])
def test_formats_without_prefixes(fmt, tmp_path):
    s = series(30, 0.5, {})
    log = write_log(tmp_path / "ws", {"n1": s}, absl=fmt != "no_absl", prefix=fmt != "no_prefix")
    r = perf.perf(str(log), peak_tflops=500.0)
    tfl = statistics.median(logged(4e8 / x * 1e-6) for x in s[3:])
    assert r["steps"]["count"] == 30 and r["mfu"] == pytest.approx(tfl / 500.0, abs=1e-4)
    assert r["hosts"][0]["host"] == "n1" and r["stalls"]["count"] == 0
    assert (r["step_time"]["to_first_step"] is None) == (fmt == "no_absl")


def test_rampup_lines_and_warmup_option(tmp_path):
    s = series(30, 0.5, {})
    log = write_log(tmp_path / "ws", {"n1": s, "n2": s}, rampup=4)
    r = perf.perf(str(log), warmup_steps=1)
    # ramp-up lines carry no rate and are never steady; then 1 warm-up step (the first non-ramp-up one)
    assert r["steps"]["rampup"] == 4 and r["steps"]["steady"] == 30 - 5 and r["steps"]["warmup"] == 4
    assert r["tgs"]["steady"] == pytest.approx(statistics.median(logged(4e8 / x) for x in s[5:]), abs=1e-3)
    assert r["mfu"] is None and any("--gpu" in n and "--peak-tflops" in n for n in r["notes"])


def test_real_maxtext_rampup_lines_are_warmup(tmp_path):
    # recorded MaxText 0.2.5 lines: "[Rampup Batch Size Phase], completed step: N, ..." for steps 0-3
    lines = (REPO / "tests" / "fixtures" / "maxtext_0.2.5" / "rampup_steps.log").read_text().splitlines()
    log = tmp_path / "rampup.log"
    log.write_text("".join(f"n1: {ln}\n" for ln in lines))
    r = perf.perf(str(log), warmup_steps=1)
    assert r["steps"]["rampup"] == 4 and r["steps"]["warmup"] == 4 and r["steps"]["steady"] == 3
    assert r["step_time"]["median"] == 0.016  # steps 5-7 (0.004, 0.058, 0.016), not the ramp-up's 14.269 s
    assert r["tgs"]["steady"] == pytest.approx(15717.092)


def test_warmup_rule_is_the_one_of_triage(tmp_path):
    # two processes without host prefixes: every step twice; the first 3 *steps* are the warm-up
    rates = [10.0, 20.0, 30.0, 100.0]
    lines = [
        f"completed step: {k}, seconds: {2048 / t:.3f}, TFLOP/s/device: 0.001, Tokens/s/device: {t:.3f}, "
        f"total_weights: 64, loss: 6.000"
        for k, t in enumerate(rates)
        for _ in range(2)
    ]
    log = tmp_path / "two.log"
    log.write_text("\n".join(lines) + "\n")
    r = perf.perf(str(log))
    t = triage.triage(str(log), opts=triage.Options(scheduler=False))
    assert r["tgs"]["steady"] == t["tgs"]["steady"] == 100.0
    assert r["steps"]["steady"] == 2 and t["tgs"]["warmup_steps_excluded"] == 3


def test_gpu_names_map_to_peaks():
    assert perf.gpu_peak("NVIDIA H100 80GB HBM3")[:2] == ("H100", 989.4)  # XLA's name on an H100 SXM (measured)
    assert perf.gpu_peak("NVIDIA H100 PCIe")[0] == "H100-PCIe"
    assert perf.gpu_peak("mi355x")[1] == pytest.approx(2516.6) and perf.gpu_peak("MI300X")[1] == 1307.4
    assert perf.gpu_peak("b200")[1] == 2250.0 and perf.gpu_peak("GB200")[1] == 2500.0
    assert perf.gpu_peak("Host") is None and perf.gpu_peak("tpu v5e") is None


def test_device_name_in_the_log_gives_the_peak(tmp_path):
    s = series(20, 0.5, {})
    log = write_log(tmp_path / "ws", {"n1": s})
    text = log.read_text().replace(
        "Jax distributed system initialized on GPU!",
        "Jax distributed system initialized on GPU!\n"
        "n1: I1122 04:00:06.000000    523 service.cc:170]   StreamExecutor [0]: "
        "NVIDIA H100 80GB HBM3, Compute Capability 9.0a (Driver: 13.0.0[580.159.4]; Runtime: 13.0.0)",
        1,
    )
    log.write_text(text)
    r = perf.perf(str(log))
    assert r["device"] == "NVIDIA H100 80GB HBM3" and r["peak_tflops"] == H100 and "log:" in r["peak_source"]
    assert r["gpu"] == {"model": "NVIDIA H100 80GB HBM3", "source": "log", "models": ["NVIDIA H100 80GB HBM3"]}
    assert perf.perf(str(log), peak_tflops=100.0)["peak_tflops"] == 100.0  # the option wins


def with_step_tflops(log: Path, tflops: float, params_line: str | None, model: str = "tiny") -> Path:
    """The log with every step line's TFLOP/s/device set, MaxText's parameter count line (as metric_logger.py
    writes it) before the first step, and the header's model."""
    text = re.sub(r"TFLOP/s/device: [0-9.]+", f"TFLOP/s/device: {tflops:.3f}", log.read_text())
    if params_line:
        text = text.replace(
            "Jax distributed system initialized on GPU!",
            "Jax distributed system initialized on GPU!\n"
            f"n1: I1122 04:00:07.000000 1 metric_logger.py:425] {params_line}",
            1,
        )
    log.write_text(text.replace("model: tiny\n", f"model: {model}\n", 1))
    return log


def test_gpu_model_from_the_tsdb_gives_the_mfu(tmp_path):
    # no XLA device line in the log: the GPU plugin's hw_gpu_info in the job's TSDB names the model
    log = with_step_tflops(write_log(tmp_path / "ws", {"n1": [40.0] + [0.5] * 19}, tokens=4e3), 420.0, None)
    job_dir = log.with_suffix("")
    t0 = 1795322400
    info = [
        (
            "hw_gpu_info",
            {"host": h, "gpu": str(g), "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "driver": "535.161.08"},
            [(t0 + 5 * i, 1.0) for i in range(20)],
        )
        for h in ("n1", "n2")
        for g in range(8)
    ]
    write_tsdb(job_dir / "prometheus", info)
    r = perf.perf(str(log))
    assert r["gpu"] == {"model": "NVIDIA H100 80GB HBM3", "source": "tsdb", "models": ["NVIDIA H100 80GB HBM3"]}
    assert r["peak_tflops"] == H100 and r["peak_source"].startswith("TSDB: hw_gpu_info model")
    assert r["mfu"] == pytest.approx(420.0 / H100, abs=1e-4)
    assert "gpu: NVIDIA H100 80GB HBM3 (from tsdb)" in perf.render(r)
    # two models in one job: the one with most GPUs, and a note naming both
    shutil.rmtree(job_dir / "prometheus")
    mixed = [
        (n, {**lbl, "model": "NVIDIA H200"} if lbl["host"] == "n2" and lbl["gpu"] < "3" else lbl, v)
        for n, lbl, v in info
    ]
    write_tsdb(job_dir / "prometheus", mixed)
    r = perf.perf(str(log))
    assert (
        r["gpu"]["models"] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"] and r["gpu"]["model"] == "NVIDIA H100 80GB HBM3"
    )
    assert any("several GPU models (NVIDIA H100 80GB HBM3, NVIDIA H200)" in n for n in r["notes"]), r["notes"]
    # --peak-tflops needs no model: the TSDB is not served
    r = perf.perf(str(log), peak_tflops=500.0)
    assert r["gpu"]["source"] is None and r["mfu"] == pytest.approx(0.84)


def test_tflops_are_checked_against_six_n_tokens(tmp_path):
    # 8000 tokens/s/device of an 8.03B model: 6 N tokens/s = 385.44 TFLOP/s/device
    steps = {"n1": [40.0] + [0.5] * 19}
    line = "number parameters: 8.030 billion"
    r = perf.perf(str(with_step_tflops(write_log(tmp_path / "a", steps, tokens=4e3), 420.0, line)), gpu="H100")
    c = r["tflops_check"]
    assert c["params"] == 8_030_000_000 and c["params_source"] == f"log: {line}"
    assert c["tokens_per_sec_per_device"] == 8000.0 and c["expected_tflops_per_device"] == pytest.approx(385.44)
    assert c["verdict"] == "consistent" and c["ratio"] == pytest.approx(1.09, abs=0.01), c
    # reported 2.4 x what the model's size allows: flagged
    r = perf.perf(str(with_step_tflops(write_log(tmp_path / "b", steps, tokens=4e3), 930.0, line)), gpu="H100")
    assert r["tflops_check"]["verdict"] == "too_high" and any("TFLOP/s check:" in n for n in r["notes"])
    # above the GPU's own peak: impossible, whatever the ratio
    r = perf.perf(str(with_step_tflops(write_log(tmp_path / "c", steps, tokens=4e3), 1200.0, line)), gpu="H100")
    assert r["tflops_check"]["verdict"] == "above_peak", r["tflops_check"]
    assert "above the peak 989.4 of H100" in r["tflops_check"]["note"] and r["mfu"] > 1
    # a MoE: the config header's active parameters (configs/mixtral-8x7b.yml: 13B active of 46.7B), not the log's
    log = with_step_tflops(
        write_log(tmp_path / "d", steps, tokens=4e3), 700.0, "number parameters: 46.703 billion", model="mixtral-8x7b"
    )
    c = perf.perf(str(log), gpu="H100")["tflops_check"]
    assert c["params"] == 13_000_000_000 and "13B active per token" in c["params_source"]
    assert c["verdict"] == "consistent" and c["expected_tflops_per_device"] == pytest.approx(624.0), c
    # without the parameter line (or a tiny model's "0.000 billion"): not checked, and said why
    r = perf.perf(str(with_step_tflops(write_log(tmp_path / "e", steps, tokens=4e3), 420.0, None)))
    assert r["tflops_check"]["verdict"] == "unknown" and "no 'number parameters' line" in r["tflops_check"]["note"]
    log = with_step_tflops(write_log(tmp_path / "f", steps, tokens=4e3), 420.0, "number parameters: 0.000 billion")
    assert "too small to check" in perf.perf(str(log))["tflops_check"]["note"]


# --- traces -----------------------------------------------------------------------------------
def gpu_trace(path: Path, compute: list[tuple[float, float]], nccl: list[tuple[float, float]]) -> None:
    """A Chrome trace as JAX writes it on a GPU: /device:GPU:0 with stream lanes of kernels (args
    hlo_op / hlo_module), /host:CPU with Python events that must not count."""
    ev = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 701, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 1, "tid": 14, "name": "thread_name", "args": {"name": "Stream #14(Compute)"}},
        {"ph": "M", "pid": 1, "tid": 20, "name": "thread_name", "args": {"name": "Stream #20(Nccl)"}},
        {"ph": "X", "pid": 701, "tid": 5, "ts": 0, "dur": 99999, "name": "$train.py:798 training_loop_iteration"},
    ]
    for i, (a, b) in enumerate(compute):
        ev.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": 14,
                "ts": a,
                "dur": b - a,
                "name": f"gemm_fusion_dot_general_{i % 2}",
                "args": {"hlo_module": "jit_train_step", "hlo_op": "command_buffer_1"},
            }
        )
    for a, b in nccl:
        ev.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": 20,
                "ts": a,
                "dur": b - a,
                "name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                "args": {"hlo_module": "jit_train_step", "hlo_op": "all-gather-start.3"},
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"displayTimeUnit": "ns", "metadata": {"highres-ticks": True}, "traceEvents": ev + [{}]}, f)


def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def test_gpu_trace_split_and_top_ops(tmp_path):
    compute = [(0, 100), (150, 250), (400, 700), (690, 720)]
    nccl = [(200, 300), (500, 520), (800, 900)]
    log = write_log(tmp_path / "ws", {"n1": series(12, 0.5, {})})
    prof = log.with_suffix("") / "run" / "tensorboard" / "plugins" / "profile" / "2026_11_22_04_10_00"
    gpu_trace(prof / "n1.trace.json.gz", compute, nccl)
    (prof / "n1.xplane.pb").write_bytes(b"\x0a\x00")
    r = perf.perf(str(log))
    by_kind = {t["kind"]: t for t in r["traces"]}
    assert set(by_kind) == {"trace_json", "xplane"} and by_kind["xplane"]["same_as"] == by_kind["trace_json"]["path"]
    sm = by_kind["trace_json"]["summary"]
    cu, nu = union(compute), union(nccl)
    lo, hi = min(a for a, _ in cu + nu), max(b for _, b in cu + nu)
    c_len, n_len = sum(b - a for a, b in cu), sum(b - a for a, b in nu)
    ov = sum(max(0, min(b, d) - max(a, c)) for a, b in cu for c, d in nu)
    win = hi - lo
    assert sm["backend"] == "device" and sm["devices"] == 1 and sm["window_ms"] == pytest.approx(win / 1e3)
    assert sm["split"]["compute"] == pytest.approx((c_len - ov) / win, abs=1e-4)
    assert sm["split"]["collective_exposed"] == pytest.approx((n_len - ov) / win, abs=1e-4)
    assert sm["split"]["overlap"] == pytest.approx(ov / win, abs=1e-4)
    assert sm["split"]["idle"] == pytest.approx(1 - (c_len + n_len - ov) / win, abs=1e-4)
    top = sm["top_ops"][0]
    assert top["name"].startswith("gemm_fusion_dot_general") and top["kind"] == "compute"
    assert any(o["kind"] == "collective" and o["ms"] == pytest.approx(0.22) for o in sm["top_ops"])
    assert any("127.0.0.1" in c and "--logdir" in c for c in by_kind["xplane"]["view"])


# --- a real job ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, venv):
    ws = tmp_path_factory.mktemp("perf-real")
    res = run(
        [
            str(REPO / "run_local.sh"),
            "tiny",
            "--",
            "steps=10",
            "profiler=xplane",
            "skip_first_n_steps_for_profiler=2",
            "profiler_steps=3",
        ],
        env=launcher_env(ws, COMPILE_CACHE_DIR=""),  # its own cache: step 0 compiles (checked below)
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return ws


@pytest.mark.slow
@pytest.mark.heavy
def test_real_tiny_job_with_the_profiler(tiny_job):
    res = run(
        [
            str(Path(launcher_env(tiny_job)["MAXTEXT_SLURM_VENV"]) / "bin" / "python"),
            PERF,
            next(tiny_job.glob("*-JAX-tiny.log")).name.split("-JAX-")[0],
            "--json",
        ],
        env=launcher_env(tiny_job),
    )
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    st = r["step_time"]
    assert r["status"] == "completed" and r["steps"]["count"] == 10 and r["tgs"]["steady"] > 0
    assert r["tflops_per_device"] > 0 and r["mfu"] is None  # a CPU: no peak to compare with
    assert st["first"] > 3 * st["median"], st  # step 0 runs the freshly compiled program
    assert st["to_first_step"] > 20 * st["first"], st  # start-up and compilation come before it
    kinds = {t["kind"] for t in r["traces"]}
    assert kinds == {"trace_json", "xplane"}, r["traces"]  # what JAX writes on the CPU
    tj = next(t for t in r["traces"] if t["kind"] == "trace_json")
    assert "/tensorboard/plugins/profile/" in tj["path"] and tj["host"]
    sm = tj["summary"]
    assert sm["backend"] == "host" and sm["top_ops"] and sum(sm["split"].values()) == pytest.approx(1, abs=1e-3)
    text = inproc.tool("perf", r["job_dir"], env=launcher_env(tiny_job))
    assert text.returncode == 0 and "tokens/s/device" in text.stdout and "trace:" in text.stdout


# --- the command line ---------------------------------------------------------------------------
def test_cli_help_and_lookup(tmp_path):
    res = inproc.tool("perf", "--help")
    assert res.returncode == 0 and res.stdout.startswith("Usage: perf.py") and "--peak-tflops" in res.stdout
    log = write_log(tmp_path / "ws", {"n1": series(20, 0.5, {10: 3.0})})
    for arg in (str(log), str(log.with_suffix("")), "4242"):
        res = inproc.tool("perf", arg, "--json", "--workspace", str(log.parent), "--gpu", "mi300x")
        assert res.returncode == 0, res.stderr
        r = json.loads(res.stdout)
        assert r["peak_tflops"] == 1307.4 and r["stalls"]["steps"] == [10] and r["job_dir"] == str(log.with_suffix(""))
    res = inproc.tool("perf", "4242", env={"JOB_WORKSPACE": str(log.parent)})
    assert res.returncode == 0 and "stalls (> 3 x median): 1 at steps 10" in res.stdout, res.stdout


@pytest.mark.parametrize(
    "bad",
    [
        "nosuchjob",
        "/nonexistent/x.log",
        "binary",
        "text",
        "empty",
        "",
        ".",
        "dir",
        "fifo",
        "dangling",
        "long",
        "gpu",
        "peak",
        "warmup",
        "both",
    ],
)
def test_cli_bad_input_is_one_line_exit_2(bad, tmp_path):
    log = write_log(tmp_path / "ws", {"n1": series(8, 0.5, {})})
    args = {
        "gpu": [str(log), "--gpu", "tpu-v9"],
        "peak": [str(log), "--peak-tflops", "-3"],
        "warmup": [str(log), "--warmup-steps", "0"],
        "both": [str(log), "--gpu", "H100", "--peak-tflops", "9"],
    }
    arg = bad_job_arg(bad, tmp_path)
    res = inproc.tool("perf", *args.get(bad, [arg, "--workspace", str(tmp_path)]), cwd=tmp_path)
    assert res.returncode == 2, res.stdout
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith("perf.py: ")


def test_job_without_step_lines_is_reported_not_rejected(tmp_path):
    job = logcorpus.Job(hosts=["n1", "n2"], failure="config_error")
    log = logcorpus.write_job(job, tmp_path / "ws")
    res = inproc.tool("perf", str(log), "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["steps"] is None and r["tgs"]["steady"] is None and any("no step lines" in n for n in r["notes"])


def test_requeued_log_reports_the_last_run(tmp_path):
    first = write_log(tmp_path / "a", {"n1": series(30, 2.0, {})})
    second = write_log(tmp_path / "b", {"n1": series(12, 0.5, {})})
    both = tmp_path / "4242-JAX-tiny.log"
    both.write_text(first.read_text() + second.read_text())
    r = perf.perf(str(both))
    assert r["steps"]["count"] == 12 and r["step_time"]["median"] < 1 and any("2 runs" in n for n in r["notes"])
