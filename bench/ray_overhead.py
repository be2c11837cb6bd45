#!/usr/bin/env python3
"""Usage: bench/ray_overhead.py [--models tiny,mid] [--pairs N] [--steps S | MODEL=S,...] [--nodes K] [--retries R]
       [--repo PATH] [--baseline-repo PATH]

RAY=1 against RAY=0 on the local Slurm cluster (started here if it is not up, stopped after),
same model, same nodes, runs alternated (RAY=0, RAY=1, RAY=0, ...) so machine noise hits both.
Two CPU models by default, in one run:
  tiny  configs/tiny.yml as it is: ~3 ms steps, so its ratio says as much about scheduling
        jitter on a busy machine as about throughput (1000 steps per run)
  mid   tiny.yml widened (emb 256, mlp 1024, 4 layers, 4 heads, 256 tokens): ~0.3 s steps on
        an idle 2-core machine (0.4-0.9 s on a busy one), a ratio that measures throughput
        (100 steps per run)
For each model it prints the steady-state tokens/s/device ratio RAY=1 / RAY=0 (from
utils/triage.py, goal >= 0.99; the median of the pairs' ratios, and each pair's ratio to show the
noise) and the extra time from submission to the first completed step with RAY=1 (goal <= 10 s;
median of the pairs' differences).
--baseline-repo B compares RAY=1 of --repo against RAY=1 of checkout B instead (the cost of a
change to the RAY=1 path, e.g. Ray's token authentication).
Uses $MAXTEXT_SLURM_VENV (default <repo>/.venv) like the launchers. Every run pays ~40-60 s of
submission, start-up and compilation on 2 cores: the default (2 pairs of both models, 8 jobs)
takes ~15 min on the 2-core test machine, more when it is busy; --models mid --pairs 1 ~4 min.
Figures from a busy machine move by several percent between runs: compare the per-pair ratios.
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
    "mid": (
        [
            "base_emb_dim=256",
            "base_mlp_dim=1024",
            "base_num_decoder_layers=4",
            "head_dim=64",
            "base_num_query_heads=4",
            "base_num_kv_heads=4",
            "max_target_length=256",
            "per_device_batch_size=1",
        ],
        100,
    ),
}
TINY_SEQ, TINY_BATCH = 64, 1  # configs/tiny.yml: max_target_length, per_device_batch_size


def sh(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})}).stdout


def tokens_per_step(overrides: list[str]) -> int:
    kv = dict(o.split("=", 1) for o in overrides)
    return int(kv.get("max_target_length", TINY_SEQ)) * int(kv.get("per_device_batch_size", TINY_BATCH))


def one_run(
    repo: Path, py: str, ray: str, overrides: list[str], steps: int, nodes: int, ws: Path, env: dict[str, str]
) -> tuple[float, float]:
    """(steady tokens/s/device, seconds from submit to the first completed step)"""
    t0 = time.monotonic()
    out = sh(
        str(repo / "submit.sh"),
        "tiny",
        "-N",
        str(nodes),
        "--",
        *overrides,
        f"steps={steps}",
        env={**env, "RAY": ray, "JOB_WORKSPACE": str(ws)},
    )
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
            raise ValueError(
                f"--steps: '{part}' is not MODEL=N for a selected model ({', '.join(models)}) with N >= 10"
            )
        steps[name] = int(n)
    return steps


def cluster_env(tool: str, env: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in sh(tool, "env", env=env).splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            out[key] = value.strip("'\"")
    return {**env, **out}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models", default="tiny,mid", help="comma-separated, from: " + ", ".join(MODELS) + " (default both)"
    )
    ap.add_argument("--pairs", type=int, default=2, help="alternated pairs (baseline, RAY=1) per model (default 2)")
    ap.add_argument(
        "--steps",
        help="steps per run: N for every model, or MODEL=N,... (defaults: "
        + ", ".join(f"{m}={s}" for m, (_, s) in MODELS.items())
        + "); enough that start-up is a small part",
    )
    ap.add_argument("--nodes", type=int, default=2, help="nodes per job (default 2)")
    ap.add_argument(
        "--retries",
        type=int,
        default=1,
        help="times a failed run is run again (a loaded machine can time out JAX's gloo set-up); default 1",
    )
    ap.add_argument(
        "--repo",
        type=Path,
        default=HERE,
        help="checkout whose submit.sh runs the jobs (default this one); the local cluster is this checkout's",
    )
    ap.add_argument(
        "--baseline-repo",
        type=Path,
        help="compare RAY=1 of --repo against RAY=1 of this checkout instead of "
        "against RAY=0 (what a change to the RAY=1 path costs, e.g. before/after Ray's token auth)",
    )
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
    base_repo = (a.baseline_repo or a.repo).resolve()
    for opt, path in (("--repo", repo), ("--baseline-repo", base_repo)):
        if not (path / "submit.sh").is_file():
            ap.error(f"{opt}: {path} has no submit.sh; give a checkout of this project")
    # (label, checkout, RAY): the baseline side first in every pair
    sides = [("base", base_repo, "1" if a.baseline_repo else "0"), ("test", repo, "1")]
    names = {
        "base": f"RAY=1 {base_repo}" if a.baseline_repo else "RAY=0",
        "test": f"RAY=1 {repo}" if a.baseline_repo else "RAY=1",
    }
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
    rates: dict[str, dict[str, list[float]]] = {m: {"base": [], "test": []} for m in models}
    firsts: dict[str, dict[str, list[float]]] = {m: {"base": [], "test": []} for m in models}
    try:
        for _ in range(a.pairs):
            for m in models:
                for side, checkout, ray in sides:
                    for attempt in range(a.retries + 1):
                        try:
                            tgs, first = one_run(checkout, py, ray, MODELS[m][0], steps[m], a.nodes, ws, env)
                            break
                        except RuntimeError as e:
                            if attempt == a.retries:
                                raise
                            print(f"{m} {names[side]}: {e}; running it again", file=sys.stderr)
                    rates[m][side].append(tgs)
                    firsts[m][side].append(first)
                    print(
                        f"{m} {names[side]}: steady {tgs:.1f} tokens/s/device "
                        f"({tokens_per_step(MODELS[m][0]) / tgs:.3f} s/step), first step after {first:.1f} s",
                        file=sys.stderr,
                    )
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"ray_overhead.py: {e} (workspace kept: {ws})", file=sys.stderr)
        return 1
    else:
        subprocess.run(["chmod", "-R", "u+w", str(ws)])
        shutil.rmtree(ws, ignore_errors=True)
    finally:
        if started:
            sh(tool, "down")
    what = f"RAY=1 of {repo} vs RAY=1 of {base_repo}" if a.baseline_repo else f"RAY=1 vs RAY=0 of {repo}"
    print(f"{what}: {a.pairs} alternated pair(s) per model, {a.nodes} nodes")
    print(
        f"{'model':<6} {'steps':>6} {'s/step':>7} {'tokens/s ratio':>15} {'(per pair)':<16} {'extra to 1st step':>18}"
    )
    for m in models:
        per_pair = [t / b for t, b in zip(rates[m]["test"], rates[m]["base"], strict=True)]
        ratio = statistics.median(per_pair)  # one run caught by a burst of load moves it least
        pairs = ", ".join(f"{r:.2f}" for r in per_pair)
        extra = statistics.median(t - b for t, b in zip(firsts[m]["test"], firsts[m]["base"], strict=True))
        step_s = tokens_per_step(MODELS[m][0]) / statistics.median(rates[m]["base"])
        print(f"{m:<6} {steps[m]:>6} {step_s:>7.3f} {ratio:>15.3f} {'(' + pairs + ')':<16} {extra:>+16.1f} s")
    if a.baseline_repo:
        print(
            "goal: ratio ~1.00 (no measurable cost; judge it on the model with >= 0.2 s steps "
            "and on the per-pair spread)"
        )
    else:
        print("goals: ratio >= 0.99 (judge it on the model with >= 0.2 s steps), extra time to first step <= 10 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
