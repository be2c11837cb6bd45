#!/usr/bin/env python3
"""Usage: bench/monitor_false_alarms.py [--runs N] [--steps S] [--checkpoint-period P] [--nodes K]

False alarms of utils/job_monitor.py on clean runs: submits N healthy `tiny` jobs one after the
other to the local Slurm cluster (utils/local_cluster.sh up K, started when it is not up), each a
resumable run (--run, so checkpoints are on) saving every P steps, each watched by its own monitor
with the default rules (--no-notify); then counts the hang and slowdown events (goal: none) and
prints each run's events. The jobs and their monitors use a temporary workspace, removed after.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def sh(cmd: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], usage=__doc__.split("\n")[0][7:])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--checkpoint-period", type=int, default=50)
    ap.add_argument("--nodes", type=int, default=2)
    a = ap.parse_args()
    tool = str(REPO / "utils/local_cluster.sh")
    if sh([tool, "up", str(a.nodes)], dict(os.environ)).returncode != 0:
        print("bench: the local cluster did not come up (utils/local_cluster.sh up)", file=sys.stderr)
        return 1
    env = dict(os.environ)
    for line in sh([tool, "env"], env).stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            k, _, v = line[7:].partition("=")
            env[k] = v.strip("'\"")
    env.setdefault("MAXTEXT_SLURM_VENV", str(REPO / ".venv"))
    alarms, saves = 0, 0
    with tempfile.TemporaryDirectory(dir=REPO / "outputs" if (REPO / "outputs").is_dir() else None) as ws:
        env["JOB_WORKSPACE"] = ws
        for i in range(a.runs):
            res = sh(
                [
                    str(REPO / "submit.sh"),
                    "tiny",
                    "-N",
                    str(a.nodes),
                    "--run",
                    f"clean{i}",
                    "--",
                    f"steps={a.steps}",
                    f"checkpoint_period={a.checkpoint_period}",
                ],
                env,
            )
            m = re.search(r"Submitted job (\d+) \((\S+)\)", res.stdout)
            if not m:
                print(f"bench: submit failed: {res.stderr.strip()}", file=sys.stderr)
                return 1
            job_id, name = m.group(1), f"{m.group(1)}-{m.group(2)}"
            t0 = time.time()
            mon = sh([str(REPO / "utils/job_monitor.py"), job_id, "--no-notify", "--interval", "2"], env, timeout=900)
            events = [json.loads(x) for x in (Path(ws) / name / "monitor/events.jsonl").read_text().splitlines()]
            bad = [e for e in events if e["kind"] in ("hang", "slowdown")]
            alarms += len(bad)
            log = (Path(ws) / f"{name}.log").read_text(errors="replace")
            n_saves = len(set(re.findall(r"checkpoint save for step (\d+)|Saved a checkpoint at step (\d+)", log)))
            saves += n_saves
            end = next((e for e in events if e["key"] == "end"), {})
            print(
                f"run {i + 1}: job {job_id} {end.get('kind', '?')} in {time.time() - t0:.0f} s, {n_saves} checkpoint "
                f"saves, events {[e['kind'] for e in events]}"
                + (f"; FALSE ALARMS {[e['title'] for e in bad]}" if bad else "")
                + ("" if mon.returncode == 0 else f"; monitor exit {mon.returncode}")
            )
    print(f"false alarms (hang or slowdown) over {a.runs} clean runs with {saves} checkpoint saves: {alarms} (goal 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
