#!/usr/bin/env python3
"""CPU cost of one metrics-exporter poll cycle with every plugin of utils/ active.

Usage: .venv/bin/python bench/exporter_cpu.py [--cycles 40] [--pause 0.25]

Runs the exporter's poll cycle in this process on the real /proc and /sys, with the TensorBoard plugin
following an event file that a separate writer process keeps appending to (every MaxText scalar tag, one step
every 0.1 s, flushed every step), and one scrape per cycle. Prints CPU seconds per cycle: the exporter
(this process), its plugin processes (reaped children), and the long-lived TensorBoard bridge. Goal: <= 0.02.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "utils"))

import metrics_exporter as mx  # noqa: E402

WRITER = """
import sys, time
from tensorboardX import SummaryWriter
tags = ["learning/loss", "learning/lm_loss", "learning/perplexity", "learning/total_weights", "learning/grad_norm",
        "learning/raw_grad_norm", "learning/param_norm", "learning/current_learning_rate", "learning/z_loss",
        "learning/moe_lb_loss", "learning/mtp_loss", "learning/indexer_loss", "perf/step_time_seconds",
        "perf/per_device_tflops", "perf/per_device_tflops_per_sec", "perf/per_device_tokens",
        "perf/per_device_tokens_per_sec"]
w = SummaryWriter(sys.argv[1])
step = 0
while True:
    for t in tags:
        w.add_scalar(t, 1.0 / (step + 1), step)
    w.flush()
    step += 1
    time.sleep(0.1)
"""


def ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--pause", type=float, default=0.25, help="seconds between cycles (lets events accumulate)")
    args = ap.parse_args()
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="exporter_cpu.") as tmp:
        job = Path(tmp, "job")
        logdir = job / "outputs/bench/tensorboard/bench"
        logdir.mkdir(parents=True)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(logdir)])
        poller = mx.Poller(mx.Config(plugin_dir=str(REPO / "utils"), state_dir=str(Path(tmp, "state")),
                                     host="bench", node_rank="0", job_dir=str(job), interval=5.0, timeout=3.0))
        collector = mx.ExporterCollector(poller)
        bridge = 0
        try:
            for _ in range(3):  # warm-up: the GPU plugin retires itself here, the bridge starts
                poller.poll_once()
                mx.generate_latest(collector)
                time.sleep(args.pause)
            bridge = int(Path(tmp, "state/tb/bridge.pid").read_text())
            t0, b0, w0 = os.times(), ticks(bridge), time.monotonic()
            tb_samples = 0
            for _ in range(args.cycles):
                poller.poll_once()
                text = mx.generate_latest(collector).decode()
                tb_samples += sum(1 for line in text.splitlines() if line.startswith("tb_"))
                time.sleep(args.pause)
            t1, b1, w1 = os.times(), ticks(bridge), time.monotonic()
            stats = {name: (st.runs, st.failures, st.timeouts, st.disabled) for name, st in poller.stats.items()}
        finally:
            writer.terminate()
            writer.wait()
            if bridge:
                os.kill(bridge, signal.SIGTERM)
    n = args.cycles
    own = (t1.user + t1.system - t0.user - t0.system) / n
    plugins = (t1.children_user + t1.children_system - t0.children_user - t0.children_system) / n
    bridge_cpu = (b1 - b0) / hz / n
    total = own + plugins + bridge_cpu
    print(f"cycles: {n} in {w1 - w0:.1f} s wall; tb samples served: {tb_samples}; plugins (runs, failures, "
          f"timeouts, disabled): {stats}")
    print(f"CPU seconds per poll cycle: exporter {own:.4f} + plugin processes {plugins:.4f} + tb bridge "
          f"{bridge_cpu:.4f} = {total:.4f} (goal <= 0.02: {'met' if total <= 0.02 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
