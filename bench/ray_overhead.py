#!/usr/bin/env python3
"""Usage: bench/ray_overhead.py [--models tiny,mid] [--pairs N] [--steps S | MODEL=S,...] [--nodes K] [--retries R] [--repo PATH]

RAY=1 against RAY=0 on the local Slurm cluster (started here if it is not up, stopped after),
same model, same nodes, runs alternated (RAY=0, RAY=1, RAY=0, ...) so machine noise hits both.
Two CPU models by default, in one run:
  tiny  configs/tiny.yml as it is: ~3 ms steps, so its ratio says as much about scheduling
        jitter on a busy machine as about throughput (1000 steps per run)
  mid   tiny.yml widened (emb 256, mlp 1024, 4 layers, 4 heads, 256 tokens): 0.2-0.4 s steps
        on a 2-core machine, a ratio that measures throughput (150 steps per run)
For each model it prints the steady-state tokens/s/device ratio RAY=1 / RAY=0 (from
utils/triage.py, goal >= 0.99) and the extra time from submission to the first completed step
with RAY=1 (goal <= 10 s). Uses $MAXTEXT_SLURM_VENV (default <repo>/.venv) like the launchers.
The default run (2 pairs of both models) takes ~10 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

# name -> (MaxText overrides on top of configs/tiny.yml, default steps per run)
MODELS: dict[str, tuple[list[str], int]] = {
    "tiny": ([], 1000),
    "mid": (["base_emb_dim=256", "base_mlp_dim=1024", "base_num_decoder_layers=4", "head_dim=64",
             "base_num_query_heads=4", "base_num_kv_heads=4", "max_target_length=256", "per_device_batch_size=1"], 150),
}
TINY_SEQ, TINY_BATCH = 64, 1  # configs/tiny.yml: max_target_length, per_device_batch_size


def sh(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})}).stdout


def tokens_per_step(overrides: list[str]) -> int:
    kv = dict(o.split("=", 1) for o in overrides)
    return int(kv.get("max_target_length", TINY_SEQ)) * int(kv.get("per_device_batch_size", TINY_BATCH))


def one_run(repo: Path, py: str, ray: str, overrides: list[str], steps: int, nodes: int, ws: Path,
            env: dict[str, str]) -> tuple[float, float]:
    """(steady tokens/s/device, seconds from submit to the first completed step)"""
    t0 = time.monotonic()
    out = sh(str(repo / "submit.sh"), "tiny", "-N", str(nodes), "--", *overrides, f"steps={steps}",
             env={**env, "RAY": ray, "JOB_WORKSPACE": str(ws)})
    m = re.search(r"Submitted job (\d+) \((\S+)\)", out)
    if not m:
        raise RuntimeError(f"submit.sh printed no job id: {out!r}")
    job_id, name = m.groups()
    log = ws / f"{job_id}-{name}.log"
    first = None
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if first is None and "completed step: 0," in text:
            first = time.monotonic() - t0
        state = re.search(r"JobState=(\S+)", sh("scontrol", "show", "job", "-o", job_id, env=env))
        if state and state.group(1) not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            break
        time.sleep(0.2)
    if ray == "1" and "falling back to the plain launch" in log.read_text(errors="replace"):
        raise RuntimeError(f"RAY=1 job {job_id} fell back to the plain launch (see {log}): not a RAY=1 figure")
    tri = json.loads(sh(py, str(repo / "utils" / "triage.py"), str(log), "--json"))
    if tri["status"] != "completed" or tri["tgs"]["steady"] is None:
        raise RuntimeError(f"job {job_id} did not complete with a steady throughput (see {log}): {tri['status']}")
    return float(tri["tgs"]["steady"]), float(first if first is not None else "nan")


def parse_steps(text: str | None, models: list[str]) -> dict[str, int]:
    steps = {m: MODELS[m][1] for m in models}
    if text is None:
        return steps
    if text.isdigit():
        return dict.fromkeys(models, int(text))
    for part in text.split(","):
        name, _, n = part.partition("=")
        if name not in steps or not n.isdigit() or int(n) < 10:
            raise ValueError(f"--steps: '{part}' is not MODEL=N for a selected model ({', '.join(models)}) with N >= 10")
        steps[name] = int(n)
    return steps


def cluster_env(tool: str, env: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in sh(tool, "env", env=env).splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export "):].partition("=")
            out[key] = value.strip("'\"")
    return {**env, **out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,mid", help="comma-separated, from: " + ", ".join(MODELS) + " (default both)")
    ap.add_argument("--pairs", type=int, default=2, help="alternated RAY=0/RAY=1 pairs per model (default 2)")
    ap.add_argument("--steps", help="steps per run: N for every model, or MODEL=N,... (defaults: "
                    + ", ".join(f"{m}={s}" for m, (_, s) in MODELS.items()) + "); enough that start-up is a small part")
    ap.add_argument("--nodes", type=int, default=2, help="nodes per job (default 2)")
    ap.add_argument("--retries", type=int, default=1, help="times a failed run is run again (a loaded machine can time "
                    "out JAX's gloo set-up); default 1")
    ap.add_argument("--repo", type=Path, default=HERE, help="checkout whose submit.sh runs the jobs (default this one); "
                    "the local cluster is this checkout's")
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        ap.error(f"--models: unknown model(s) {', '.join(bad) or '(none)'}; choose from {', '.join(MODELS)}")
    try:
        steps = parse_steps(a.steps, models)
    except ValueError as e:
        ap.error(str(e))
    if a.pairs < 1 or not 1 <= a.nodes <= 16 or a.retries < 0:
        ap.error(f"--pairs must be >= 1, --nodes 1..16, --retries >= 0; got {a.pairs}, {a.nodes}, {a.retries}")
    repo = a.repo.resolve()
    if not (repo / "submit.sh").is_file():
        ap.error(f"--repo: {repo} has no submit.sh; give a checkout of this project")
    venv = Path(os.environ.get("MAXTEXT_SLURM_VENV", HERE / ".venv"))
    py = str(venv / "bin" / "python")
    if not os.access(py, os.X_OK):
        ap.error(f"no Python at {py}: set MAXTEXT_SLURM_VENV to the project's environment")

    tool = str(HERE / "utils" / "local_cluster.sh")
    base_env = {"MAXTEXT_SLURM_VENV": str(venv)}
    started = subprocess.run([tool, "status"], capture_output=True).returncode != 0
    sh(tool, "up", str(max(2, a.nodes)))
    env = cluster_env(tool, base_env)
    ws = Path(tempfile.mkdtemp(prefix="ray_overhead."))
    rates = {m: {"0": [], "1": []} for m in models}
    firsts = {m: {"0": [], "1": []} for m in models}
    try:
        for _ in range(a.pairs):
            for m in models:
                for ray in ("0", "1"):
                    for attempt in range(a.retries + 1):
                        try:
                            tgs, first = one_run(repo, py, ray, MODELS[m][0], steps[m], a.nodes, ws, env)
                            break
                        except RuntimeError as e:
                            if attempt == a.retries:
                                raise
                            print(f"{m} RAY={ray}: {e}; running it again", file=sys.stderr)
                    rates[m][ray].append(tgs)
                    firsts[m][ray].append(first)
                    print(f"{m} RAY={ray}: steady {tgs:.1f} tokens/s/device "
                          f"({tokens_per_step(MODELS[m][0]) / tgs:.3f} s/step), first step after {first:.1f} s",
                          file=sys.stderr)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"ray_overhead.py: {e} (workspace kept: {ws})", file=sys.stderr)
        return 1
    else:
        subprocess.run(["chmod", "-R", "u+w", str(ws)])
        shutil.rmtree(ws, ignore_errors=True)
    finally:
        if started:
            sh(tool, "down")
    print(f"RAY=1 vs RAY=0, {a.pairs} alternated pair(s) per model, {a.nodes} nodes, repo {repo}")
    print(f"{'model':<6} {'steps':>6} {'s/step':>7} {'RAY=1/RAY=0 tokens/s':>21} {'RAY=1 extra to 1st step':>24}")
    for m in models:
        ratio = statistics.median(rates[m]["1"]) / statistics.median(rates[m]["0"])
        extra = statistics.median(firsts[m]["1"]) - statistics.median(firsts[m]["0"])
        step_s = tokens_per_step(MODELS[m][0]) / statistics.median(rates[m]["0"])
        print(f"{m:<6} {steps[m]:>6} {step_s:>7.3f} {ratio:>21.3f} {extra:>+22.1f} s")
    print("goals: ratio >= 0.99 (judge it on the model with >= 0.2 s steps), extra time to first step <= 10 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
