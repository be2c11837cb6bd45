#!/usr/bin/env python3
"""Usage: bench/monitor_cpu.py [--jobs N] [--hosts H] [--seconds S] [--interval I] [--step S]

CPU time utils/job_monitor.py spends per watched job per minute. Makes N running jobs in a
temporary workspace whose logs grow as a real job's do: every --step seconds each of H hosts
writes a MaxText 0.2.5 step line plus 20 other absl lines (a checkpoint save every 50 steps),
and a stand-in `scontrol` on PATH answers JobState=RUNNING (the monitor runs one per job and
poll, so its fork is counted). Then runs the monitor on all N jobs (--no-notify, --interval I)
for S seconds and prints its user+system CPU seconds (from /proc) divided by jobs and minutes,
next to the same figure for one job. Goal: well under 1 CPU-second per job per minute.
"""

import argparse
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEADER = """==================== JOB ====================
job: {id} {name}
scheduler: slurm
model: tiny
nodes: {n} ({nodes})
overrides: steps=100000000
started: 2026-11-26T22:00:00Z
=============================================
"""


def cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / os.sysconf("SC_CLK_TCK")  # + waited-for children


def writer(logs: list[Path], hosts: int, step_s: float, stop: threading.Event) -> None:
    step = 0
    while not stop.is_set():
        t = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e6):06d}"
        lines = []
        for h in range(hosts):
            lines += [f"node{h:03d}: I{stamp} 1394 xla_bridge.py:120] some library chatter {i}" for i in range(20)]
            lines.append(
                f"node{h:03d}: I{stamp} 1394 metric_logger.py:265] completed step: {step}, seconds: {step_s:.3f}, "
                "TFLOP/s/device: 410.2, Tokens/s/device: 3410.5, total_weights: 524288, loss: 2.310, "
                "lm_loss: 2.310, perplexity: 10.07"
            )
            if step % 50 == 49:
                lines.append(
                    f"node{h:03d}: I{stamp} 1394 checkpointing.py:596] Started an asynchronous "
                    f"checkpoint save for step {step + 1}"
                )
        text = "\n".join(lines) + "\n"
        for log in logs:
            with log.open("a") as f:
                f.write(text)
        step += 1
        stop.wait(max(0.0, step_s - (time.time() - t)))


def measure(ws: Path, jobs: int, a: argparse.Namespace, bin_dir: Path) -> float:
    names = [f"{9000 + i}-JAX-tiny" for i in range(jobs)]
    logs = []
    for i, name in enumerate(names):
        d = ws / name
        d.mkdir()
        log = ws / f"{name}.log"
        nodes = " ".join(f"node{h:03d}" for h in range(a.hosts))
        log.write_text(HEADER.format(id=9000 + i, name=name, n=a.hosts, nodes=nodes))
        (d / "log").symlink_to(log)
        logs.append(log)
    stop = threading.Event()
    t = threading.Thread(target=writer, args=(logs, a.hosts, a.step, stop), daemon=True)
    t.start()
    env = {**os.environ, "JOB_WORKSPACE": str(ws), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    cmd = [str(REPO / ".venv/bin/python"), str(REPO / "utils/job_monitor.py"), *names, "--no-notify"]
    p = subprocess.Popen([*cmd, "--interval", str(a.interval)], env=env, stdout=subprocess.DEVNULL)
    time.sleep(5)  # start-up (imports) is not the steady cost
    c0, t0 = cpu(p.pid), time.time()
    time.sleep(a.seconds)
    c1, t1 = cpu(p.pid), time.time()
    p.terminate()
    p.wait(timeout=30)
    stop.set()
    t.join()
    return (c1 - c0) / jobs / ((t1 - t0) / 60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], usage=__doc__.split("\n")[0][7:])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--step", type=float, default=1.0, help="seconds per training step (default 1)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp) / "bin"
        bin_dir.mkdir()
        sc = bin_dir / "scontrol"
        sc.write_text('#!/bin/sh\necho "JobId=$4 JobName=JAX-tiny JobState=RUNNING"\n')
        sc.chmod(sc.stat().st_mode | stat.S_IXUSR)
        (Path(tmp) / "one").mkdir()
        (Path(tmp) / "many").mkdir()
        one = measure(Path(tmp) / "one", 1, a, bin_dir)
        many = measure(Path(tmp) / "many", a.jobs, a, bin_dir)
    print(
        f"log: {a.hosts} hosts x 21 lines every {a.step:g} s per job; poll every {a.interval:g} s; "
        f"{a.seconds:g} s measured"
    )
    print(f"monitor CPU per watched job per minute: 1 job {one:.3f} s, {a.jobs} jobs {many:.3f} s (goal < 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
