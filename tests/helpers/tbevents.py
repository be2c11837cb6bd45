"""TensorBoard event files for the tests and benchmarks of the exporter's TensorBoard collector.

MAXTEXT_TAGS: the scalar tags MaxText 0.2.5 writes (shared notes: environment-facts.md).
event_record(): one framed record (one scalar), as tensorboard's own RecordWriter writes it.
write_history(): an event file holding a long history of those tags, one scalar per event, in step order.
"""

from __future__ import annotations

import io
from pathlib import Path

MAXTEXT_TAGS = [
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


def event_record(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """One framed record of one simple_value scalar, written by tensorboard's own RecordWriter."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    buf = io.BytesIO()
    event = event_pb2.Event(
        wall_time=wall_time,
        step=step,
        summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]),
    )
    RecordWriter(buf).write(event.SerializeToString())
    return buf.getvalue()


def write_history(logdir: Path, scalars: int, t0: float = 1763779480.0) -> Path:
    """An event file in (new) `logdir` with `scalars` events of one scalar each, cycling through MAXTEXT_TAGS
    step by step, as tensorboardX writes them (simple_value); 1 s of wall time a step. Returns its path."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    logdir.mkdir(parents=True)
    path = logdir / f"events.out.tfevents.{int(t0)}.bench"
    with open(path, "wb") as f:
        w = RecordWriter(f)
        w.write(event_pb2.Event(wall_time=t0, file_version="brain.Event:2").SerializeToString())
        for i in range(scalars):
            step, tag = divmod(i, len(MAXTEXT_TAGS))
            value = summary_pb2.Summary.Value(tag=MAXTEXT_TAGS[tag], simple_value=6.0 / (step + 1) + tag)
            event = event_pb2.Event(
                wall_time=t0 + step + tag / 1000, step=step, summary=summary_pb2.Summary(value=[value])
            )
            w.write(event.SerializeToString())
    return path
