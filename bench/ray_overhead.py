#!/usr/bin/env python3
"""Usage: bench/ray_overhead.py [--pairs N] [--steps S] [--nodes K]

RAY=1 against RAY=0 on the local Slurm cluster (started here if it is not up, stopped after),
same model (tiny), same nodes, runs alternated (RAY=0, RAY=1, RAY=0, ...) so machine noise
hits both. Prints the steady-state tokens/s/device ratio RAY=1 / RAY=0 (from utils/triage.py,
goal >= 0.99) and the extra time from submission to the first completed step with RAY=1
(goal <= 10 s).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python")


def sh(*args: str, env: dict | None = None) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})}).stdout


def one_run(ray: str, steps: int, nodes: int, ws: Path, env: dict) -> tuple[float, float]:
    """(steady tokens/s/device, seconds from submit to the first completed step)"""
    t0 = time.monotonic()
    out = sh(str(REPO / "submit.sh"), "tiny", "-N", str(nodes), "--", f"steps={steps}",
             env={**env, "RAY": ray, "JOB_WORKSPACE": str(ws)})
    job_id, name = re.search(r"Submitted job (\d+) \((\S+)\)", out).groups()
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
    tri = json.loads(sh(PY, str(REPO / "utils" / "triage.py"), str(log), "--json"))
    assert tri["status"] == "completed", tri
    return float(tri["tgs"]["steady"]), float(first or "nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1000, help="per run; enough that start-up (Ray, Prometheus, TensorBoard coming up) is a small part of the median (default 1000)")
    ap.add_argument("--nodes", type=int, default=2)
    a = ap.parse_args()
    tool = str(REPO / "utils" / "local_cluster.sh")
    started = subprocess.run([tool, "status"], capture_output=True).returncode != 0
    sh(tool, "up", str(max(2, a.nodes)))
    env = dict(line[len("export "):].split("=", 1) for line in sh(tool, "env").splitlines() if line.startswith("export "))
    env = {k: v.strip("'\"") for k, v in env.items()}
    ws = Path(sh("mktemp", "-d").strip())
    rates: dict[str, list[float]] = {"0": [], "1": []}
    firsts: dict[str, list[float]] = {"0": [], "1": []}
    try:
        for _ in range(a.pairs):
            for ray in ("0", "1"):
                tgs, first = one_run(ray, a.steps, a.nodes, ws, env)
                rates[ray].append(tgs)
                firsts[ray].append(first)
                print(f"RAY={ray}: steady {tgs:.1f} tokens/s/device, first step after {first:.1f} s", file=sys.stderr)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(ws)])
        subprocess.run(["rm", "-rf", str(ws)])
        if started:
            sh(tool, "down")
    ratio = statistics.median(rates["1"]) / statistics.median(rates["0"])
    extra = statistics.median(firsts["1"]) - statistics.median(firsts["0"])
    print(f"RAY=1/RAY=0 steady tokens/s/device: {ratio:.3f} (goal >= 0.99; {a.pairs} alternated pairs, "
          f"{a.nodes} nodes, {a.steps} steps)")
    print(f"RAY=1 extra time to first step: {extra:+.1f} s (goal <= 10 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
