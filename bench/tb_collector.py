#!/usr/bin/env python3
"""Cost of the exporter's TensorBoard collector: the first poll over a long history, then polls with nothing new.

Usage: .venv/bin/python bench/tb_collector.py [--histories 10000,100000] [--idle-polls 50]

For each history size N, writes N scalars (the 17 tags MaxText writes, one event per scalar, in step order) into
one event file with tensorboard's own RecordWriter, then times, in this process, a fresh TensorBoardCollector:
its first poll (reads and holds all N samples), the scrape that serves them, and --idle-polls polls with
nothing new (median and max). Goals: first poll of 100k scalars <= 0.4 s; a poll with nothing new independent
of the history (about the same at every N).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from observe import metrics_exporter as mx

REPO = Path(__file__).resolve().parents[1]


TAGS = [
    "learning/loss",
    "learning/lm_loss",
    "learning/perplexity",
    "learning/total_weights",
    "learning/grad_norm",
    "learning/raw_grad_norm",
    "learning/param_norm",
    "learning/current_learning_rate",
    "learning/z_loss",
    "learning/moe_lb_loss",
    "learning/mtp_loss",
    "learning/indexer_loss",
    "perf/step_time_seconds",
    "perf/per_device_tflops",
    "perf/per_device_tflops_per_sec",
    "perf/per_device_tokens",
    "perf/per_device_tokens_per_sec",
]


def write_events(logdir: Path, scalars: int) -> None:
    """`scalars` events of one scalar each, as tensorboardX writes them (simple_value), 1 s of wall time a step."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    logdir.mkdir(parents=True)
    t0 = 1763779480.0
    with open(logdir / "events.out.tfevents.1763779480.bench", "wb") as f:
        w = RecordWriter(f)
        w.write(event_pb2.Event(wall_time=t0, file_version="brain.Event:2").SerializeToString())
        for i in range(scalars):
            step, tag = divmod(i, len(TAGS))
            value = summary_pb2.Summary.Value(tag=TAGS[tag], simple_value=6.0 / (step + 1) + tag)
            w.write(
                event_pb2.Event(
                    wall_time=t0 + step + tag / 1000, step=step, summary=summary_pb2.Summary(value=[value])
                ).SerializeToString()
            )


def timed(fn: object) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--histories", default="10000,100000", help="comma-separated scalar counts (default 10000,100000)")
    ap.add_argument("--idle-polls", type=int, default=50, help="polls with nothing new to time (default 50)")
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.histories.split(",")]
    except ValueError:
        sys.exit(f"tb_collector.py: --histories {args.histories!r} is not a comma-separated list of integers")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tb_collector.") as tmp:
        for n in sizes:
            job = Path(tmp, f"job{n}")
            write_events(job / "outputs/bench/tensorboard/bench", n)
            tb = mx.TensorBoardCollector(str(job), "bench")
            first = timed(tb.poll)
            held = sum(len(q) for q in tb.held.waiting.values())
            text: list[str] = []
            scrape = timed(lambda: text.append(mx.generate_latest(tb).decode()))  # noqa: B023
            served = sum(1 for line in text[0].splitlines() if line.startswith("tb_"))
            idle = [timed(tb.poll) for _ in range(args.idle_polls)]
            rows.append((n, first, held, scrape, served, idle))
    print(
        f"{'history':>8} {'first poll wall/CPU s':>22} {'held':>7} {'first scrape wall s':>20} {'served':>7} "
        f"{'idle poll median/max ms':>24}"
    )
    for n, first, held, scrape, served, idle in rows:
        walls = [w for w, _ in idle]
        print(
            f"{n:>8} {first[0]:>11.3f}/{first[1]:<10.3f} {held:>7} {scrape[0]:>20.3f} {served:>7} "
            f"{statistics.median(walls) * 1000:>12.3f}/{max(walls) * 1000:<11.3f}"
        )
    biggest = max(rows, key=lambda r: r[0])
    verdict = "met" if biggest[1][0] <= 0.4 else "NOT met"
    print(
        f"first poll of {biggest[0]} scalars: {biggest[1][0]:.3f} s (goal <= 0.4 s: {verdict}); poll with nothing new: "
        + ", ".join(f"{statistics.median([w for w, _ in r[5]]) * 1000:.3f} ms at {r[0]}" for r in rows)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
