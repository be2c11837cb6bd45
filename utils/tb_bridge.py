#!/usr/bin/env python3
"""Long-lived helper of tb_metrics_plugin.sh: TensorBoard scalars appended since the last poll, as Prometheus text.

Usage: tb_bridge.py --state-dir DIR --job-dir DIR [--exporter-pid PID] [--idle-exit SECONDS]

Started once per job by tb_metrics_plugin.sh (in its own session) and kept alive, so the Python start-up is
not paid at every poll. Protocol, all files in --state-dir:
  req (FIFO)   the plugin writes "poll <nonce> <acked>"; <acked> is the nonce of the last answer it printed
  ack (FIFO)   the bridge answers "done <nonce> <response file>" once the response file is complete
  response.prom, offsets.json (per event file: inode and byte offset), bridge.pid, bridge.log, bridge.lock,
  bridge.fatal (why the bridge cannot run at all; the plugin then stops asking)
An answer that the plugin did not acknowledge is sent again, merged with the new samples, at the next poll.

Event files (events.out.tfevents.*) are found recursively under --job-dir. Records are read straight from the
TFRecord framing, from the saved offset to the last complete record (a record still being written stays for
the next poll). Each scalar becomes tb_<tag with every character outside [a-zA-Z0-9_] replaced by _>{run=
<directory holding the event file>} with the event's wall time as the sample timestamp; `tb_step` carries the
step of each new step seen. Exits when the exporter is gone or nobody asked for --idle-exit seconds.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import math
import os
import re
import select
import signal
import struct
import sys
import time
from collections.abc import Iterator

log = logging.getLogger("tb_bridge")
EVENT_PREFIX = "events.out.tfevents."
MAX_PENDING = 200_000  # samples kept for a plugin that does not come back; the oldest go first
READ_CHUNK = 64 << 20


def metric_name_for_tag(tag: str) -> str:
    """TensorBoard tag -> Prometheus metric name, e.g. learning/loss -> tb_learning_loss."""
    return "tb_" + re.sub(r"[^a-zA-Z0-9_]", "_", tag)


# ---- TFRecord framing: uint64 length, uint32 masked crc32c(length), data, uint32 masked crc32c(data) ----

def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class CorruptRecord(Exception):
    pass


def split_records(data: bytes) -> tuple[list[bytes], int]:
    """Complete records at the start of `data` and the number of bytes they use (a torn tail is left)."""
    records, pos, end = [], 0, len(data)
    while end - pos >= 12:
        (length,) = struct.unpack_from("<Q", data, pos)
        (crc,) = struct.unpack_from("<I", data, pos + 8)
        if masked_crc32c(data[pos:pos + 8]) != crc:
            raise CorruptRecord(f"bad length checksum at +{pos}")
        stop = pos + 12 + length + 4
        if stop > end:
            break
        records.append(data[pos + 12:pos + 12 + length])
        pos = stop
    return records, pos


# ---- Event decoding ---------------------------------------------------------------------------------

_TENSOR_KINDS = {1: ("float_val", "<f"), 2: ("double_val", "<d"), 3: ("int_val", "<i"), 9: ("int64_val", "<q"),
                 19: ("half_val", "<e")}  # DataType enum: DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64, DT_HALF


def _tensor_scalar(t: object) -> float | None:
    """The value of a one-element numeric TensorProto (tf.summary / new-style writers), else None."""
    if any(d.size != 1 for d in t.tensor_shape.dim):
        return None
    kind = _TENSOR_KINDS.get(t.dtype)
    if kind is None:
        return None
    field, fmt = kind
    if t.tensor_content:
        if len(t.tensor_content) != struct.calcsize(fmt):
            return None
        return float(struct.unpack(fmt, t.tensor_content)[0])
    values = getattr(t, field)
    if len(values) != 1:
        return None
    if t.dtype == 19:  # half_val holds the raw 16 bits
        return float(struct.unpack("<e", struct.pack("<H", values[0] & 0xFFFF))[0])
    return float(values[0])


def format_value(x: float, single: bool) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if single:  # shortest text that reads back to the same float32 (6.123, not 6.123000144958496)
        packed = struct.pack("<f", x)
        for digits in range(6, 10):
            text = f"{x:.{digits}g}"
            if struct.pack("<f", float(text)) == packed:
                return text
    return repr(x)


def scalars(record: bytes, event_cls: type) -> Iterator[tuple[str, float, bool, float, int]]:
    """(tag, value, is_float32, wall_time, step) for each scalar in one serialized Event."""
    event = event_cls.FromString(record)
    if event.WhichOneof("what") != "summary":
        return
    for v in event.summary.value:
        kind = v.WhichOneof("value")
        if kind == "simple_value":
            yield v.tag, v.simple_value, True, event.wall_time, event.step
        elif kind == "tensor":
            x = _tensor_scalar(v.tensor)
            if x is not None:
                yield v.tag, x, v.tensor.dtype == 1, event.wall_time, event.step


# ---- The feed: files, offsets, pending samples --------------------------------------------------------

class ScalarFeed:
    def __init__(self, job_dir: str, state_dir: str, event_cls: type) -> None:
        self.job_dir = os.path.abspath(job_dir)
        self.state_dir = os.path.abspath(state_dir)
        self.event_cls = event_cls
        self.offsets_path = os.path.join(state_dir, "offsets.json")
        self.offsets: dict[str, list[int]] = {}  # path -> [inode, offset]
        try:
            with open(self.offsets_path, encoding="utf-8") as f:
                self.offsets = {k: list(v) for k, v in json.load(f).items()}
        except (OSError, ValueError):
            pass
        self.bad: set[str] = set()
        self.next_scan = 0.0
        self.last_ts: dict[tuple[str, str], int] = {}
        self.last_step: dict[str, int] = {}
        self.pending: list[tuple[str, str, int, str]] = []  # (metric, run, ts_ms, value text)
        self.help: dict[str, str] = {}
        self.last_nonce = ""

    def scan(self) -> None:
        """Find event files; a scan costing t seconds is not repeated for 100 t (at most 60 s)."""
        t0 = time.monotonic()
        for root, dirs, files in os.walk(self.job_dir):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and os.path.join(root, d) != self.state_dir)
            for name in sorted(files):
                path = os.path.join(root, name)
                if name.startswith(EVENT_PREFIX) and path not in self.offsets:
                    log.info("new event file %s", path)
                    self.offsets[path] = [0, 0]
        cost = time.monotonic() - t0
        self.next_scan = time.monotonic() + min(60.0, 100 * cost)

    def read_new(self) -> None:
        if time.monotonic() >= self.next_scan:
            self.scan()
        for path in sorted(self.offsets, key=lambda p: (os.path.dirname(p), os.path.basename(p))):
            if path not in self.bad:
                self._read_file(path)

    def _read_file(self, path: str) -> None:
        inode, offset = self.offsets[path]
        try:
            f = open(path, "rb")
        except OSError:
            return
        with f:
            st = os.fstat(f.fileno())
            if st.st_ino != inode or st.st_size < offset:  # new, replaced or truncated: start over
                inode, offset = st.st_ino, 0
            run = os.path.basename(os.path.dirname(path))
            while offset < st.st_size:
                f.seek(offset)
                data = f.read(min(READ_CHUNK, st.st_size - offset))
                try:
                    records, used = split_records(data)
                except CorruptRecord as exc:
                    log.error("%s: %s; not reading this file any further", path, exc)
                    self.bad.add(path)
                    break
                for rec in records:
                    self._add_event(rec, run)
                offset += used
                if used == 0:
                    break  # only a partial record: wait for the writer
        self.offsets[path] = [inode, offset]

    def _add_event(self, record: bytes, run: str) -> None:
        try:
            values = list(scalars(record, self.event_cls))
        except Exception as exc:  # a record that is not an Event: skip it
            log.warning("undecodable record in run %s: %s", run, exc)
            return
        for tag, value, single, wall_time, step in values:
            ts = int(round(wall_time * 1000))
            metric = metric_name_for_tag(tag)
            if metric not in self.help:
                tag_text = tag.replace("\\", "\\\\").replace("\n", " ")  # HELP escapes only \\ and newlines
                self.help[metric] = f"TensorBoard scalar {tag_text} (one sample per event, at its wall time)."
            if ts <= self.last_ts.get((metric, run), -1):
                continue  # Prometheus needs increasing timestamps per series
            self.last_ts[metric, run] = ts
            self.pending.append((metric, run, ts, format_value(value, single)))
            if step > self.last_step.get(run, -1) and ts > self.last_ts.get(("tb_step", run), -1):
                self.last_step[run] = step
                self.last_ts["tb_step", run] = ts
                self.pending.append(("tb_step", run, ts, str(step)))
        if len(self.pending) > MAX_PENDING:
            del self.pending[: len(self.pending) - MAX_PENDING]

    def answer(self, nonce: str, acked: str) -> str:
        """Exposition text for one poll: unacknowledged samples plus everything new."""
        if acked == self.last_nonce:
            self.pending.clear()  # the previous answer reached the exporter
        self.read_new()
        self.last_nonce = nonce
        self._save_offsets()
        by_metric: dict[str, list[str]] = {}
        for metric, run, ts, value in self.pending:
            by_metric.setdefault(metric, []).append(f'{metric}{{run="{_escape(run)}"}} {value} {ts}\n')
        out = []
        for metric, lines in by_metric.items():
            doc = "Step of each new TensorBoard step of the run (stamped with its first event's wall time)." \
                if metric == "tb_step" else self.help[metric]
            out.append(f"# HELP {metric} {doc}\n# TYPE {metric} gauge\n")
            out.extend(lines)
        return "".join(out)

    def _save_offsets(self) -> None:
        tmp = self.offsets_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.offsets, f)
        os.replace(tmp, self.offsets_path)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# ---- Serving the plugin ---------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _drain(fd: int) -> None:
    """Throw away answers no plugin read (their plugin was killed); we hold the FIFO's read side too."""
    try:
        while os.read(fd, 65536):
            pass
    except BlockingIOError:
        pass


def serve(feed: ScalarFeed, state_dir: str, exporter_pid: int, idle_exit: float) -> None:
    req_fd = os.open(os.path.join(state_dir, "req"), os.O_RDWR | os.O_NONBLOCK)
    ack_fd = os.open(os.path.join(state_dir, "ack"), os.O_RDWR | os.O_NONBLOCK)
    response = os.path.join(state_dir, "response.prom")
    buf = b""
    last_request = time.monotonic()
    while True:
        ready, _, _ = select.select([req_fd], [], [], 1.0)
        if not _alive(exporter_pid):
            log.info("exporter %d is gone; exiting", exporter_pid)
            return
        if not ready:
            if time.monotonic() - last_request > idle_exit:
                log.info("no request for %.0f s; exiting", idle_exit)
                return
            continue
        try:
            buf += os.read(req_fd, 65536)
        except BlockingIOError:
            continue
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            parts = line.decode(errors="replace").split()
            if len(parts) != 3 or parts[0] != "poll":
                log.warning("ignoring request %r", line[:100])
                continue
            last_request = time.monotonic()
            nonce, acked = parts[1], parts[2]
            text = feed.answer(nonce, acked)
            tmp = response + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, response)
            _drain(ack_fd)
            try:
                os.write(ack_fd, f"done {nonce} {response}\n".encode())
            except OSError as exc:
                if exc.errno != errno.EAGAIN:
                    raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--job-dir", required=True)
    ap.add_argument("--exporter-pid", type=int, default=0, help="exit when this process is gone (0: never)")
    ap.add_argument("--idle-exit", type=float, default=300.0, help="exit after this long without a request")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tb_bridge[%(process)d] %(levelname)s %(message)s")
    try:
        os.setsid()  # survive the plugin's process group being killed
    except OSError:
        pass
    lock = open(os.path.join(args.state_dir, "bridge.lock"), "w")  # held for the process' life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log.info("another bridge holds %s; exiting", lock.name)
        return 0
    try:
        from tensorboard.compat.proto.event_pb2 import Event
    except ImportError as exc:
        with open(os.path.join(args.state_dir, "bridge.fatal"), "w", encoding="utf-8") as f:
            f.write(f"{sys.executable} cannot import tensorboard ({exc}); set METRICS_PYTHON to a Python with it\n")
        log.error("cannot import tensorboard: %s", exc)
        return 1
    pid_path = os.path.join(args.state_dir, "bridge.pid")
    with open(pid_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(pid_path + ".tmp", pid_path)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log.info("serving %s for %s (exporter pid %d)", args.state_dir, args.job_dir, args.exporter_pid)
    try:
        serve(ScalarFeed(args.job_dir, args.state_dir, Event), args.state_dir, args.exporter_pid, args.idle_exit)
    finally:
        try:
            os.unlink(pid_path)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
