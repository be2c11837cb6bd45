#!/usr/bin/env python3
"""Per-node metrics exporter: runs every *_metrics_plugin.sh, reads TensorBoard scalars, serves both.

Usage: metrics_exporter.py [--port 9400] [--bind 127.0.0.1] [--interval 5] [--timeout 3]
                           [--plugin-dir DIR] [--state-dir DIR] [--host NAME] [--node-rank N]
                           [--job-dir DIR] [--tensorboard auto|on|off] [--port-file FILE] [--sd-file FILE]
                           [--log FILE] [--restarts N] [--once]

A background thread polls every --interval seconds: it lists the *_metrics_plugin.sh files in --plugin-dir
(so a plugin dropped in mid-job is picked up at the next poll), starts them all at once (`bash FILE`, each
in its own process group, the whole group killed after --timeout), checks their Prometheus text output line
by line and publishes the merged result. In the same thread, on node rank 0 (--tensorboard auto), it reads
what was appended to the job's TensorBoard event files since the last poll (tb_* series).
GET /metrics serves the last completed poll; a scrape never waits for a plugin. If --port is taken
the next free port is used; the real one is printed on stdout
("metrics_exporter: serving http://ADDR:PORT/metrics") and written to --port-file / --sd-file.
--restarts N: how many exporters of this node ran before this one (its supervisor, _train_with_ray.sh,
restarts it when it exits), served as exporter_restarts_total.
--once runs one poll, prints the exposition and exits. The plugin contract is docs/plugins.md; every
series is listed in docs/metrics.md.
"""

from __future__ import annotations

import argparse
import collections
import errno
import itertools
import json
import logging
import math
import os
import re
import runpy
import selectors
import shutil
import signal
import socket
import socketserver
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "entry.py"))["enter_venv"]()

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

PLUGIN_SUFFIX = "_metrics_plugin.sh"
RESERVED_PREFIXES = ("exporter_", "tb_")  # the exporter's own series and its TensorBoard collector's
NEVER_AGAIN_EXIT = 64  # a plugin exiting with this code is not run again by this exporter
MAX_OUTPUT_BYTES = 16 << 20  # a plugin printing more than this is killed and counted as a failure
STDERR_TAIL_BYTES = 2048
log = logging.getLogger("metrics_exporter")

# --------------------------------------------------------------------------------------------------
# Prometheus text exposition (0.0.4) parsing: the only place this format is read.
# --------------------------------------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_NAME_RE = re.compile(_NAME)
_SAMPLE_RE = re.compile(rf"({_NAME})(?:\{{(.*)\}})?[ \t]+([^ \t]+)(?:[ \t]+(-?[0-9]+))?[ \t]*")
_LABEL_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\[\\"n])*)"[ \t]*(?:,|$)')
_VALUE_RE = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|nan)", re.IGNORECASE)
_META_RE = re.compile(rf"#[ \t]+(HELP|TYPE)[ \t]+({_NAME})(?:[ \t]+(.*))?")
_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count", "_created"), "summary": ("", "_sum", "_count", "_created")}

Labels = tuple[tuple[str, str], ...]


class Sample(NamedTuple):
    name: str
    labels: Labels  # sorted by label name
    value: float
    ts_ms: int | None  # explicit timestamp (milliseconds since the epoch) or None


@dataclass
class Family:
    name: str  # the name on the TYPE line (a counter's ends in _total)
    type: str  # counter | gauge | histogram | summary | untyped
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


@dataclass
class Parsed:
    families: dict[str, Family]
    accepted: int
    rejected: int


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def _parse_labels(blob: str) -> Labels | None:
    pairs: dict[str, str] = {}
    pos, end = 0, len(blob)
    while pos < end and blob[pos:].strip():
        m = _LABEL_RE.match(blob, pos)
        if not m or m.group(1) in pairs or m.group(1).startswith("__"):
            return None
        pairs[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return tuple(sorted(pairs.items()))


def _family_of(name: str, families: dict[str, Family]) -> Family | None:
    fam = families.get(name)
    if fam is not None and fam.type not in _SUFFIXES:
        return fam
    for ftype, suffixes in _SUFFIXES.items():
        for suffix in suffixes:
            if name.endswith(suffix):
                base = families.get(name[: len(name) - len(suffix)] if suffix else name)
                if base is not None and base.type == ftype:
                    return base
    return None


def parse_exposition(text: str) -> Parsed:
    """Parse Prometheus text exposition strictly, line by line.

    A malformed line (or a HELP/TYPE that contradicts earlier lines, or a label set that is not unique) is
    dropped and counted; every other line is kept. Samples without a TYPE form an untyped family of their own.
    """
    families: dict[str, Family] = {}
    accepted = rejected = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _META_RE.fullmatch(line)
            if m is None:
                if re.match(r"#[ \t]+(HELP|TYPE)\b", line):
                    rejected += 1  # a broken HELP/TYPE line; other comments are allowed
                continue
            kind, name, rest = m.group(1), m.group(2), m.group(3) or ""
            fam = families.get(name)
            if kind == "TYPE":
                if rest not in _TYPES or (fam is not None and (fam.samples or fam.type != "untyped")):
                    rejected += 1
                    continue
                if fam is None:
                    families[name] = Family(name, rest)
                else:
                    fam.type = rest
            else:
                if fam is None:
                    fam = families[name] = Family(name, "untyped")
                fam.help = _unescape(rest)
            continue
        m = _SAMPLE_RE.fullmatch(line)
        labels = _parse_labels(m.group(2) or "") if m else None
        if m is None or labels is None or not _VALUE_RE.fullmatch(m.group(3)):
            rejected += 1
            continue
        name = m.group(1)
        fam = _family_of(name, families)
        if fam is None:
            if name in families:  # a histogram/summary name used as a plain sample
                rejected += 1
                continue
            fam = families[name] = Family(name, "untyped")
        if fam.type == "histogram" and name.endswith("_bucket") and "le" not in dict(labels):
            rejected += 1
            continue
        ts = int(m.group(4)) if m.group(4) is not None else None
        fam.samples.append(Sample(name, labels, float(m.group(3)), ts))
        accepted += 1
    return Parsed({k: f for k, f in families.items() if f.samples}, accepted, rejected)


# --------------------------------------------------------------------------------------------------
# Running plugins
# --------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    rc: int | None = None  # None: timed out (killed)
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0
    stuck: subprocess.Popen | None = None  # killed but not reaped (e.g. blocked in a kernel read)


@dataclass
class _Running:
    name: str
    proc: subprocess.Popen
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    open_streams: int = 2
    done_at: float | None = None
    too_big: bool = False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_plugins(
    cmds: dict[str, list[str]],
    envs: dict[str, dict[str, str]],
    cwds: dict[str, str],
    timeout: float,
    started: list[subprocess.Popen] | None = None,
) -> dict[str, RunResult]:
    """Start every command at once (own session each), collect stdout/stderr, kill what outlives `timeout`.

    `started`, if given, is cleared and then holds the processes of this call while it runs.
    """
    started = [] if started is None else started
    started.clear()
    t0 = time.monotonic()
    deadline = t0 + timeout
    sel = selectors.DefaultSelector()
    runs: list[_Running] = []
    results: dict[str, RunResult] = {}
    for name, cmd in cmds.items():
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=envs[name],
                cwd=cwds[name],
                start_new_session=True,
            )
        except OSError as exc:
            results[name] = RunResult(rc=127, stderr=str(exc).encode())
            continue
        started.append(proc)
        run = _Running(name, proc)
        runs.append(run)
        sel.register(proc.stdout, selectors.EVENT_READ, (run, run.out))
        sel.register(proc.stderr, selectors.EVENT_READ, (run, run.err))
    while sel.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        for key, _ in sel.select(remaining):
            run, buf = key.data
            chunk = os.read(key.fd, 65536)
            if chunk:
                buf += chunk
                if buf is run.err and len(buf) > STDERR_TAIL_BYTES:
                    del buf[:-STDERR_TAIL_BYTES]
                if len(run.out) > MAX_OUTPUT_BYTES:
                    run.too_big = True
                    _kill_group(run.proc)
                continue
            sel.unregister(key.fileobj)
            key.fileobj.close()
            run.open_streams -= 1
            if run.open_streams == 0:
                run.done_at = time.monotonic()
    for run in runs:
        proc = run.proc
        rc: int | None = None
        if run.open_streams == 0:
            try:
                rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))  # its pipes are closed: exiting
            except subprocess.TimeoutExpired:
                rc = None
        # Kill the whole group: after a timeout, and also anything a finished plugin left behind.
        _kill_group(proc)
        stuck = None
        if rc is None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None and not stream.closed:
                    sel.unregister(stream)
                    stream.close()
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                stuck = proc
        if run.too_big and rc is not None:
            rc = 1
            run.err += b"\nmetrics_exporter: output larger than %d bytes, killed" % MAX_OUTPUT_BYTES
        end = run.done_at if rc is not None and run.done_at is not None else time.monotonic()
        results[run.name] = RunResult(rc, bytes(run.out), bytes(run.err), end - t0, stuck)
    sel.close()
    return results


# --------------------------------------------------------------------------------------------------
# Polling and merging
# --------------------------------------------------------------------------------------------------


@dataclass
class PluginStats:
    runs: int = 0
    failures: int = 0
    timeouts: int = 0
    rejected: int = 0
    last_duration: float = 0.0
    last_success: float = 0.0
    samples: int = 0
    disabled: bool = False
    stuck: subprocess.Popen | None = None
    failing: bool = False


@dataclass
class Config:
    plugin_dir: str
    state_dir: str
    host: str
    node_rank: str = "0"
    job_dir: str = ""
    interval: float = 5.0
    timeout: float = 3.0
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    hold_seconds: float = 900.0  # re-serve a series' newest timestamped sample for this long
    restarts: int = 0  # exporters of this node before this one (--restarts)


class HeldSamples:
    """Samples with explicit timestamps wait here until a scrape has served them once.

    A scrape serves every waiting sample of a series (oldest first) and, when none waits, re-serves the newest
    one already served (Prometheus drops that exact duplicate silently) for `hold_seconds`. So a burst of
    TensorBoard events is not lost when Prometheus scrapes less often than the exporter polls.
    """

    def __init__(self, hold_seconds: float, max_per_series: int = 20000) -> None:
        self.hold_ms = int(hold_seconds * 1000)
        self.max_per_series = max_per_series
        self.meta: dict[str, tuple[str, str]] = {}  # family name -> (type, help)
        self.waiting: dict[tuple[str, str, Labels], collections.deque[Sample]] = {}
        self.served: dict[tuple[str, str, Labels], Sample] = {}
        self.dropped = 0

    def add(self, fam: Family, sample: Sample) -> None:
        self.meta[fam.name] = (fam.type, fam.help)
        key = (fam.name, sample.name, sample.labels)
        queue = self.waiting.get(key)
        if queue is None:
            queue = self.waiting[key] = collections.deque(maxlen=self.max_per_series)
        newest = queue[-1] if queue else self.served.get(key)
        if newest is not None and sample.ts_ms <= newest.ts_ms:
            return  # already have it, or out of order for this series
        if len(queue) == queue.maxlen:
            self.dropped += 1
        queue.append(sample)

    def extend(self, fam: Family, labels: Labels, samples: list[Sample]) -> None:
        """add() for samples of one series (name fam.name), in increasing timestamp order."""
        if not samples:
            return
        self.meta[fam.name] = (fam.type, fam.help)
        key = (fam.name, fam.name, labels)
        queue = self.waiting.get(key)
        if queue is None:
            queue = self.waiting[key] = collections.deque(maxlen=self.max_per_series)
        newest = queue[-1] if queue else self.served.get(key)
        if newest is not None and samples[0].ts_ms <= newest.ts_ms:
            samples = [s for s in samples if s.ts_ms > newest.ts_ms]
        self.dropped += max(0, len(queue) + len(samples) - self.max_per_series)
        queue.extend(samples)

    def take(self, now_ms: int) -> list[tuple[str, Sample]]:
        out: list[tuple[str, Sample]] = []
        for key, queue in self.waiting.items():
            if queue:
                out.extend((key[0], s) for s in queue)
                self.served[key] = queue[-1]
                queue.clear()
            elif key in self.served and now_ms - self.served[key].ts_ms <= self.hold_ms:
                out.append((key[0], self.served[key]))
        return out


# --------------------------------------------------------------------------------------------------
# TensorBoard event files, read in this process
# --------------------------------------------------------------------------------------------------

EVENT_PREFIX = "events.out.tfevents."
TB_READ_CHUNK = 64 << 20
TB_STEP_HELP = "Step of each new TensorBoard step of the run (stamped with its first event's wall time)."
# DataType enum -> (TensorProto field, struct format): DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64, DT_HALF
_TENSOR_KINDS = {
    1: ("float_val", "<f"),
    2: ("double_val", "<d"),
    3: ("int_val", "<i"),
    9: ("int64_val", "<q"),
    19: ("half_val", "<e"),
}


def metric_name_for_tag(tag: str) -> str:
    """TensorBoard tag -> Prometheus metric name, e.g. learning/loss -> tb_learning_loss."""
    return "tb_" + re.sub(r"[^a-zA-Z0-9_]", "_", tag)


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
    """The TFRecord checksum: CRC-32C, rotated and offset ("masked")."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class CorruptRecord(Exception):
    """A TFRecord header whose checksum does not match: the rest of the file cannot be framed."""


_good_headers: dict[bytes, int] = {}  # verified 12-byte record headers -> data length (records repeat sizes)


def _record_length(header: bytes) -> int:
    """The data length of a TFRecord header (uint64 length, uint32 masked CRC-32C of it), checksum checked."""
    length = _good_headers.get(header)
    if length is None:
        if masked_crc32c(header[:8]) != int.from_bytes(header[8:], "little"):
            raise CorruptRecord("bad length checksum")
        if len(_good_headers) >= 4096:
            _good_headers.clear()
        length = _good_headers[header] = int.from_bytes(header[:8], "little")
    return length


def _tensor_scalar(t: object) -> float | None:
    """The value of a one-element numeric TensorProto (tf.summary and newer writers), else None."""
    if any(d.size != 1 for d in t.tensor_shape.dim):
        return None
    kind = _TENSOR_KINDS.get(t.dtype)
    if kind is None:
        return None
    field_name, fmt = kind
    if t.tensor_content:
        if len(t.tensor_content) != struct.calcsize(fmt):
            return None
        x = float(struct.unpack(fmt, t.tensor_content)[0])
    else:
        values = getattr(t, field_name)
        if len(values) != 1:
            return None
        if t.dtype == 19:  # half_val holds the raw 16 bits
            return float(struct.unpack("<e", struct.pack("<H", values[0] & 0xFFFF))[0])
        x = float(values[0])
    return float32_value(x) if t.dtype == 1 else x


_pack_f32 = struct.Struct("<f").pack
_f32_cache: dict[float, float] = {}  # training scalars repeat (total_weights, learning rate, tokens)


def float32_value(x: float) -> float:
    """The double of the shortest decimal (at least 6 digits asked) that reads back as float32 `x`: 6.123, not
    6.123000144958496, the value as written rather than its float32 rounding."""
    y = _f32_cache.get(x)
    if y is not None:
        return y
    if not x or math.isnan(x) or math.isinf(x):
        return x  # a zero keeps its sign (0.0 and -0.0 are one key of the cache)
    packed = _pack_f32(x)  # more digits only get closer: search 6..9 digits by halves (9 always reads back)
    y = float(f"{x:.7g}")
    if _pack_f32(y) == packed:
        z = float(f"{x:.6g}")
        if _pack_f32(z) == packed:
            y = z
    else:
        y = float(f"{x:.8g}")
        if _pack_f32(y) != packed:
            y = float(f"{x:.9g}")
    if len(_f32_cache) >= 65536:
        _f32_cache.clear()
    _f32_cache[x] = y
    return y


_numpy: Any = None  # numpy, once float32_values has imported it (tensorboard depends on it); False: not installed
_NUMPY_FROM = 256  # values; unless something imported numpy already, only from 32768 (its import: ~0.08 CPU s)
_NUMPY_IMPORT_FROM = 32768
_POW10 = [10.0**k for k in range(23)]  # the powers of ten a double holds exactly


def float32_values(xs: list[float]) -> list[float]:
    """float32_value of each of `xs` (the same values), for many at once: a first poll meets tens of thousands
    of values no earlier poll has seen, and formatting each three times costs more than reading the events.

    With numpy, for all values together, and without formatting: the p-digit decimal nearest x is q * 10**-k
    with k = p - 1 - floor(log10 |x|) and q = x * 10**k rounded to an integer, and it reads back when its double
    (q / 10**k, one correctly rounded division of exact numbers, as float() of the digits gives) rounds to the
    float32 x. The search over p is float32_value's. That arithmetic is exact while |k| <= 22 and x * 10**k,
    computed with an error below 2**-24, is not within 2**-21 of a tie (and the decade was estimated right);
    any other value (and zero, NaN, infinity) goes through float32_value."""
    global _numpy
    if _numpy is None and len(xs) >= (_NUMPY_FROM if "numpy" in sys.modules else _NUMPY_IMPORT_FROM):
        try:
            import numpy
        except ImportError:
            numpy = False
        _numpy = numpy
    if len(xs) < _NUMPY_FROM or not _numpy:
        return list(map(float32_value, xs))
    np = _numpy
    x = np.array(xs, dtype=np.float64)
    with np.errstate(all="ignore"):
        mag = np.abs(x)
        exact = np.isfinite(x) & (mag > 0)
        decade = np.where(exact, np.floor(np.log10(np.where(exact, mag, 1.0))), 0.0).astype(np.int64)
        pow10 = np.array(_POW10)

        def written(i: Any, digits: int) -> tuple[Any, Any, Any]:
            """(p-digit decimal of x[i] as double, whether it reads back, whether that is exact) at indices i."""
            k = digits - 1 - decade[i]
            scale = pow10[np.minimum(np.abs(k), 22)]
            up, xi = k >= 0, x[i]
            v = np.where(up, xi * scale, xi / scale)
            q = np.rint(v)
            sure = (np.abs(k) <= 22) & (np.abs(v - np.floor(v) - 0.5) > 2.0**-21)
            sure &= (np.abs(q) >= 10.0 ** (digits - 1)) & (np.abs(q) <= 10.0**digits)
            y = np.where(up, q / scale, q * scale)
            return y, y.astype(np.float32) == xi, sure

        every = np.arange(len(x))
        y, reads, sure = written(every, 7)
        exact &= sure
        i = every[reads]  # 7 digits read back: 6 may too
        y6, reads6, sure = written(i, 6)
        exact[i] &= sure
        y[i[reads6]] = y6[reads6]
        i = every[~reads]  # 8, else 9
        y8, reads8, sure = written(i, 8)
        exact[i] &= sure
        y[i] = y8
        i = i[~reads8]
        y9, _, sure = written(i, 9)
        exact[i] &= sure
        y[i] = y9
    out = y.tolist()
    for j in np.flatnonzero(~exact).tolist():
        out[j] = float32_value(xs[j])
    return out


_unpack_f64 = struct.Struct("<d").unpack_from
_unpack_f32 = struct.Struct("<f").unpack_from


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _step_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """An int64 varint (a step) at buf[pos]: (value, position after it)."""
    step, pos = _varint(buf, pos)
    return (step - (1 << 64) if step >= 1 << 63 else step), pos


def plain_scalar_event(buf: bytes, pos: int, end: int) -> tuple[float, int, list[tuple[bytes, float]]] | None:
    """(wall_time, step, [(tag, float32 value), ...]) when the serialized Event buf[pos:end] is nothing but wall
    time, step and a summary of simple_value scalars (what tensorboardX, MaxText's writer, writes), read straight
    from the protobuf wire format; None for any other event (the caller then decodes it with tensorboard's
    Event). The values are the float32s as read (float32_value gives them as written)."""
    try:
        if buf[pos] != 0x09:  # field 1 wall_time, fixed64
            return None
        wall = _unpack_f64(buf, pos + 1)[0]
        pos += 9
        if buf[pos] == 0x10:  # field 2 step, varint (absent when 0)
            step = buf[pos + 1]
            pos += 2
            if step >= 0x80:
                step, pos = _step_varint(buf, pos - 1)
        else:
            step = 0
        if buf[pos] != 0x2A:  # field 5 summary, length-delimited
            return None
        size = buf[pos + 1]
        pos += 2
        if size >= 0x80:
            size, pos = _varint(buf, pos - 1)
        if pos + size != end:
            return None
        values = []
        while pos < end:
            # Summary field 1 value {field 1 tag, field 2 simple_value (fixed32)}, each short: one-byte lengths
            size, tag_size = buf[pos + 1], buf[pos + 3]
            if buf[pos] != 0x0A or buf[pos + 2] != 0x0A or size >= 0x80 or tag_size >= 0x80:
                return None
            stop = pos + 2 + size
            tag_end = pos + 4 + tag_size
            if tag_end + 5 != stop or stop > end or buf[tag_end] != 0x15:
                return None
            values.append((buf[pos + 4 : tag_end], _unpack_f32(buf, tag_end + 1)[0]))
            pos = stop
        return wall, step, values
    except (IndexError, struct.error):
        return None


def protobuf_scalar_event(rec: bytes, event_cls: type) -> tuple[float, int, list[tuple[str, float]]] | None:
    """The same as plain_scalar_event for any Event, decoded with tensorboard's protobuf class (slower); scalars
    are simple_value or one-element numeric tensors. None when the event holds no summary."""
    event = event_cls.FromString(rec)
    if event.WhichOneof("what") != "summary":
        return None
    values = []
    for v in event.summary.value:
        kind = v.WhichOneof("value")
        if kind == "simple_value":
            values.append((v.tag, float32_value(v.simple_value)))
        elif kind == "tensor":
            x = _tensor_scalar(v.tensor)
            if x is not None:
                values.append((v.tag, x))
    return event.wall_time, event.step, values


@dataclass(slots=True)
class _Series:
    fam: Family
    labels: Labels
    float32: bool = True  # a tag's series: its values are read as float32 and served as written
    last_ts: int = -1
    # read in this poll, not yet handed to HeldSamples: values and timestamps (ms); the values of a float32
    # series as read, but for those of `exact` (index, value), which the slow path read as they are served
    values: list[float] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)
    exact: list[tuple[int, float]] = field(default_factory=list)


def _as_written(series: list[_Series]) -> None:
    """The float32 values the series read in this poll, as written (float32_values, all series at once)."""
    written = iter(float32_values(list(itertools.chain.from_iterable(s.values for s in series))))
    for s in series:
        values = s.values = list(itertools.islice(written, len(s.values)))
        for i, value in s.exact:
            values[i] = value


def _samples(name: str, labels: Labels, values: list[float], ts: list[int]) -> list[Sample]:
    """Sample(name, labels, value, ts) for each value and timestamp, built in C (tuple.__new__ over zip)."""
    same = itertools.repeat
    return list(map(tuple.__new__, same(Sample), zip(same(name), same(labels), values, ts)))  # noqa: B905 (endless)


@dataclass(slots=True)
class _Run:
    labels: Labels
    by_tag: dict[str | bytes, _Series] = field(default_factory=dict)  # a tag as text and as raw bytes
    series: list[_Series] = field(default_factory=list)  # each tag's, in the order first met
    # the bytes of a one-scalar summary (lengths, tag, simple_value's field key) -> its tag's series
    summaries: dict[bytes, _Series] = field(default_factory=dict)
    step: _Series | None = None
    last_step: int = -1


@dataclass
class _EventFile:
    run: _Run
    inode: int = 0
    offset: int = 0
    bad: bool = False


class TensorBoardCollector:
    """Custom collector of the job's TensorBoard scalars: tb_<tag>{host, run}, one sample per event.

    `poll()` (the exporter's poll thread) reads what was appended to every events.out.tfevents.* file under
    the job directory since the last poll: TFRecord framing from a remembered byte offset per file, a record
    still being written left for the next poll, a truncated or replaced file read again from its start, a new
    file found by a directory walk (a walk costing t is not repeated for 100 t, at most 60 s). Each scalar
    is held as a sample stamped with its event's wall time; `collect()` (a scrape) serves it through
    HeldSamples: once, then the newest of each series for `hold_seconds`.
    """

    def __init__(self, job_dir: str, host: str, hold_seconds: float = 900.0, skip_dir: str = "") -> None:
        self.job_dir = os.path.abspath(job_dir)
        self.skip_dir = os.path.abspath(skip_dir) if skip_dir else ""
        self.host = host
        self.held = HeldSamples(hold_seconds)
        self.lock = threading.Lock()
        self.files: dict[str, _EventFile] = {}
        self.runs: dict[str, _Run] = {}
        self.families: dict[str, Family] = {"tb_step": Family("tb_step", "gauge", TB_STEP_HELP)}
        self.next_walk = 0.0
        self.event_cls: type | None = None
        self.unavailable = ""  # why tensorboard's protobufs cannot be imported
        self.samples_read = 0
        self.errors = 0
        self.last_read = 0.0

    def _walk(self) -> None:
        t0 = time.monotonic()
        for root, dirs, names in os.walk(self.job_dir):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and os.path.join(root, d) != self.skip_dir)
            for name in names:
                path = os.path.join(root, name)
                if name.startswith(EVENT_PREFIX) and path not in self.files:
                    log.info("tensorboard: new event file %s", path)
                    run = os.path.basename(root)
                    if run not in self.runs:
                        self.runs[run] = _Run((("host", self.host), ("run", run)))
                    self.files[path] = _EventFile(self.runs[run])
        cost = time.monotonic() - t0
        self.next_walk = time.monotonic() + min(60.0, 100 * cost)

    def poll(self) -> None:
        """Read everything appended since the last poll."""
        t0 = time.monotonic()
        if self.event_cls is None:
            if self.unavailable:
                return
            try:
                from tensorboard.compat.proto.event_pb2 import Event
            except ImportError as exc:
                self.unavailable = f"{sys.executable} cannot import tensorboard ({exc})"
                self.errors += 1
                log.error("tensorboard: %s; no tb_* metrics from this exporter", self.unavailable)
                return
            self.event_cls = Event
        if time.monotonic() >= self.next_walk:
            self._walk()
        read = False
        for path in sorted(self.files, key=lambda p: (os.path.dirname(p), os.path.basename(p))):
            ef = self.files[path]
            if not ef.bad:
                read |= self._read_file(path, ef)
        if not read:
            with self.lock:
                self.last_read = time.monotonic() - t0
            return
        fresh = [s for run in self.runs.values() for s in (*run.series, run.step) if s is not None and s.ts]
        _as_written([s for s in fresh if s.float32])
        with self.lock:
            for series in fresh:
                new = _samples(series.fam.name, series.labels, series.values, series.ts)
                self.held.extend(series.fam, series.labels, new)
                self.samples_read += len(new)
                series.values, series.ts, series.exact = [], [], []
            self.last_read = time.monotonic() - t0

    def _series(self, run: _Run, tag: str | bytes) -> _Series:
        text = tag.decode(errors="replace") if isinstance(tag, bytes) else tag
        metric = metric_name_for_tag(text)
        fam = self.families.get(metric)
        if fam is None:
            doc = text.replace("\\", "\\\\").replace("\n", " ")
            fam = self.families[metric] = Family(
                metric, "gauge", f"TensorBoard scalar {doc} (one sample per event, at its wall time)."
            )
        series = next((s for s in run.series if s.fam is fam), None)
        if series is None:
            series = _Series(fam, run.labels)
            run.series.append(series)
        run.by_tag[tag] = series
        return series

    def _new_step(self, run: _Run, step: int, ts: int) -> None:
        """A value of a step beyond the run's last: a tb_step sample, unless its time is not after the last one."""
        steps = run.step
        if steps is None:
            steps = run.step = _Series(self.families["tb_step"], run.labels, float32=False)
        if ts > steps.last_ts:
            run.last_step = step
            steps.last_ts = ts
            steps.ts.append(ts)
            steps.values.append(float(step))

    def _read_file(self, path: str, ef: _EventFile) -> bool:
        """Read what was appended to one event file; whether there was anything."""
        try:
            f = open(path, "rb")
        except OSError:
            return False
        got = False
        with f:
            st = os.fstat(f.fileno())
            if st.st_ino != ef.inode or st.st_size < ef.offset:  # new, replaced or truncated: from the start
                ef.inode, ef.offset = st.st_ino, 0
            while ef.offset < st.st_size:
                f.seek(ef.offset)
                data = f.read(min(TB_READ_CHUNK, st.st_size - ef.offset))
                used = self._read_records(path, ef, data)
                ef.offset += used
                got |= used > 0
                if used == 0 or ef.bad:
                    break  # only part of a record: the writer has not finished it
        return got

    def _read_records(self, path: str, ef: _EventFile, data: bytes) -> int:
        """Take every complete record at the start of `data`; returns the bytes used.

        Most records are what tensorboardX writes for one scalar: wall time, step, and a summary of one
        simple_value whose bytes up to the value (lengths, tag, field key) are the same for every event of that
        tag. Once _read_event has decoded such a summary, its bytes name the series of every later record that
        carries them, and the record is read here without decoding (this loop is a first poll's cost)."""
        run, pos, end = ef.run, 0, len(data)
        good, summaries, unpack_f64, unpack_f32 = _good_headers, run.summaries, _unpack_f64, _unpack_f32
        while end - pos >= 12:
            length = good.get(data[pos : pos + 12])
            if length is None:
                try:
                    length = _record_length(data[pos : pos + 12])
                except CorruptRecord as exc:
                    log.error(
                        "tensorboard: %s: %s at +%d; not reading this file any further", path, exc, ef.offset + pos
                    )
                    ef.bad = True
                    self.errors += 1
                    break
            start = pos + 12
            stop = start + length + 4
            if stop > end:
                break
            pos = stop
            summary = b""
            if length >= 20 and data[start] == 0x09:  # field 1 wall_time; then step, summary, value (4 bytes)
                p, step = start + 9, 0
                if data[p] == 0x10:  # field 2 step, a varint (absent when 0): steps below 2**21 here
                    step, p = data[p + 1], p + 2
                    if step >= 0x80:
                        high = data[p]
                        if high < 0x80:
                            step, p = step & 0x7F | high << 7, p + 1
                        elif data[p + 1] < 0x80:
                            step, p = step & 0x7F | (high & 0x7F) << 7 | data[p + 1] << 14, p + 2
                        else:
                            p = stop  # no summary: the slow path
                summary = data[p : stop - 8]
                series = summaries.get(summary)
                if series is not None:
                    ts = round(unpack_f64(data, start + 1)[0] * 1000)
                    if ts > series.last_ts:  # Prometheus needs increasing timestamps per series
                        series.last_ts = ts
                        series.ts.append(ts)
                        series.values.append(unpack_f32(data, stop - 8)[0])
                        if step > run.last_step:
                            self._new_step(run, step, ts)
                    continue
            self._read_event(path, ef, data, start, stop - 4, summary)
        return pos

    def _read_event(self, path: str, ef: _EventFile, data: bytes, start: int, end: int, summary: bytes) -> None:
        """The event data[start:end] decoded (wire format, else tensorboard's protobuf class); `summary`: its
        bytes between step and value, remembered for the fast path when it holds one simple_value."""
        run = ef.run
        event = plain_scalar_event(data, start, end)
        if event is not None:
            wall, step, raw = event
            values = [(tag, float32_value(x)) for tag, x in raw]
            if len(raw) == 1 and summary:
                run.summaries[summary] = run.by_tag.get(raw[0][0]) or self._series(run, raw[0][0])
        else:
            try:
                event = protobuf_scalar_event(data[start:end], self.event_cls)
            except Exception as exc:  # a record that is not an Event: skip it
                self.errors += 1
                log.warning("tensorboard: %s: undecodable record at +%d: %s", path, ef.offset + end + 4, exc)
                return
            if event is None:
                return
            wall, step, values = event
        ts = round(wall * 1000)
        for tag, value in values:
            series = run.by_tag.get(tag) or self._series(run, tag)
            if ts <= series.last_ts:
                continue  # Prometheus needs increasing timestamps per series
            series.last_ts = ts
            series.exact.append((len(series.values), value))
            series.values.append(value)
            series.ts.append(ts)
            if step > run.last_step:
                self._new_step(run, step, ts)

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            held = self.held.take(int(time.time() * 1000))
            files, read, samples, errors = len(self.files), self.last_read, self.samples_read, self.errors
        by_family: dict[str, list[Sample]] = {}
        for fname, s in held:
            by_family.setdefault(fname, []).append(s)
        for fname, samples_ in by_family.items():
            yield _to_metric(self.families[fname], samples_)
        host = [self.host]
        g = GaugeMetricFamily("exporter_tensorboard_files", "TensorBoard event files followed.", labels=["host"])
        g.add_metric(host, files)
        yield g
        c = CounterMetricFamily(
            "exporter_tensorboard_samples", "tb_* samples read from the event files.", labels=["host"]
        )
        c.add_metric(host, samples)
        yield c
        g = GaugeMetricFamily(
            "exporter_tensorboard_read_seconds", "Wall time of the last read of the event files.", labels=["host"]
        )
        g.add_metric(host, read)
        yield g
        c = CounterMetricFamily(
            "exporter_tensorboard_errors",
            "Event files abandoned at a corrupt record, undecodable records, and a missing tensorboard package.",
            labels=["host"],
        )
        c.add_metric(host, errors)
        yield c


class Poller:
    """Discovers and runs the plugins, keeps the last merged result and the self-metrics."""

    def __init__(self, cfg: Config, bash: str | None = None, sources: list[TensorBoardCollector] | None = None) -> None:
        self.cfg = cfg
        self.sources = list(sources or [])  # in-process collectors read at every poll, after the plugins
        self.bash = bash or shutil.which("bash") or "/bin/bash"
        self.stats: dict[str, PluginStats] = {}
        self.families: dict[str, Family] = {}
        self.held = HeldSamples(cfg.hold_seconds)
        self.lock = threading.Lock()
        self.polls = 0
        self.last_cycle = 0.0
        self.last_poll_time = 0.0
        self.running: list[subprocess.Popen] = []  # the current cycle's plugin processes

    def discover(self) -> dict[str, str]:
        """Plugin name (file name without the suffix) -> path, for every plugin file present now."""
        found = {}
        try:
            entries = sorted(os.scandir(self.cfg.plugin_dir), key=lambda e: e.name)
        except OSError as exc:
            log.error("cannot list plugin dir %s: %s", self.cfg.plugin_dir, exc)
            return {}
        for entry in entries:
            if entry.name.endswith(PLUGIN_SUFFIX) and entry.is_file():
                found[entry.name[: -len(PLUGIN_SUFFIX)]] = entry.path
        return found

    def _env(self, state_dir: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "METRICS_HOST": self.cfg.host,
                "JOB_NODE_RANK": self.cfg.node_rank,
                "JOB_DIR": self.cfg.job_dir,
                "METRICS_INTERVAL": f"{self.cfg.interval:g}",
                "METRICS_TIMEOUT": f"{self.cfg.timeout:g}",
                "METRICS_STATE_DIR": state_dir,
                "METRICS_SYSFS_ROOT": self.cfg.sysfs_root,
                "METRICS_PROCFS_ROOT": self.cfg.procfs_root,
                "METRICS_EXPORTER_PID": str(os.getpid()),
                "METRICS_PYTHON": sys.executable,
                "METRICS_NEVER_AGAIN_EXIT": str(NEVER_AGAIN_EXIT),
                "LC_ALL": "C",
            }
        )
        return env

    def poll_once(self) -> None:
        t0 = time.monotonic()
        plugins = self.discover()
        cmds, envs, cwds = {}, {}, {}
        with self.lock:
            self.stats = {n: self.stats.get(n) or PluginStats() for n in plugins}
            for name, path in plugins.items():
                st = self.stats[name]
                if st.disabled:
                    continue
                if st.stuck is not None:
                    if st.stuck.poll() is None:  # the last run is still unkillable: do not pile up another
                        st.timeouts += 1
                        continue
                    st.stuck = None
                state_dir = os.path.join(self.cfg.state_dir, name)
                os.makedirs(state_dir, mode=0o700, exist_ok=True)
                cmds[name], envs[name], cwds[name] = [self.bash, path], self._env(state_dir), state_dir
        results = run_plugins(cmds, envs, cwds, self.cfg.timeout, self.running) if cmds else {}
        for source in self.sources:
            try:
                source.poll()
            except Exception:  # a bug in one source must not cost the plugins' results
                log.exception("reading %s failed", type(source).__name__)
        merged: dict[str, Family] = {}
        seen: set[tuple[str, Labels]] = set()
        with self.lock:
            for name in sorted(results):
                if name in self.stats:
                    self._account(name, results[name], merged, seen)
            self.families = merged
            self.polls += 1
            self.last_cycle = time.monotonic() - t0
            self.last_poll_time = time.time()

    def kill_running(self) -> None:
        """Kill the process groups of plugins still running (used at shutdown)."""
        for proc in list(self.running):
            if proc.poll() is None:
                _kill_group(proc)

    def _account(self, name: str, res: RunResult, merged: dict[str, Family], seen: set[tuple[str, Labels]]) -> None:
        st = self.stats[name]
        st.runs += 1
        st.last_duration = res.duration
        err = res.stderr.decode(errors="replace").strip()
        if res.rc is None:
            st.timeouts += 1
            st.stuck = res.stuck
            self._note_failure(name, st, f"timed out after {self.cfg.timeout:g}s", err)
            return
        if res.rc == NEVER_AGAIN_EXIT:
            st.disabled = True
            log.info("plugin %s exited %d: not running it again (%s)", name, res.rc, err or "no reason given")
            return
        parsed = parse_exposition(res.stdout.decode(errors="replace"))
        refused = self._merge(parsed, merged, seen)
        st.rejected += parsed.rejected + refused
        st.samples = parsed.accepted - refused
        if res.rc != 0 or (parsed.accepted == 0 and parsed.rejected > 0):
            st.failures += 1
            self._note_failure(name, st, f"exit {res.rc}, {parsed.rejected} bad lines", err)
            return
        st.last_success = time.time()
        if st.failing:
            log.info("plugin %s recovered", name)
        st.failing = False

    @staticmethod
    def _note_failure(name: str, st: PluginStats, what: str, err: str) -> None:
        if not st.failing or (st.failures + st.timeouts) % 100 == 0:  # log state changes, then rarely
            log.warning("plugin %s failed (%s): %s", name, what, err[-500:] or "no stderr")
        st.failing = True

    def _merge(self, parsed: Parsed, merged: dict[str, Family], seen: set[tuple[str, Labels]]) -> int:
        """Add one plugin's families to the poll result; returns how many samples were refused."""
        refused = 0
        host = ("host", self.cfg.host)
        for fam in parsed.families.values():
            target = merged.get(fam.name)
            if target is not None and target.type != fam.type and "untyped" in (target.type, fam.type):
                target.type = fam.type if target.type == "untyped" else target.type  # TYPE given by one plugin
                target.help = target.help or fam.help
            if fam.name.startswith(RESERVED_PREFIXES) or (target is not None and target.type != fam.type != "untyped"):
                refused += len(fam.samples)  # reserved prefix, or two plugins declare different types
                continue
            if target is None:
                target = merged[fam.name] = Family(fam.name, fam.type, fam.help)
            for s in fam.samples:
                if all(k != "host" for k, _ in s.labels):
                    s = s._replace(labels=tuple(sorted(s.labels + (host,))))
                if s.ts_ms is not None:
                    self.held.add(target, s)
                    continue
                key = (s.name, s.labels)
                if key in seen:
                    refused += 1
                    continue
                seen.add(key)
                target.samples.append(s)
        return refused

    def run_forever(self, stop: threading.Event) -> None:
        next_t = time.monotonic()
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a bug here must not end the polling thread
                log.exception("poll cycle failed")
            next_t += self.cfg.interval
            now = time.monotonic()
            if next_t < now:
                next_t = now  # overran the interval: start again at once, do not try to catch up
            stop.wait(next_t - now)


# --------------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------------


def _to_metric(fam: Family, samples: Iterable[Sample]) -> Metric:
    name, typ = fam.name, fam.type
    if typ == "counter":
        if name.endswith("_total"):
            name = name[: -len("_total")]
        else:
            typ = "untyped"  # the client library would rename it; serve it untyped under its own name
    metric = Metric(name, fam.help, typ)
    for s in samples:
        metric.add_sample(s.name, dict(s.labels), s.value, None if s.ts_ms is None else s.ts_ms / 1000)
    return metric


class ExporterCollector:
    """Custom collector: the plugins' last merged result, the held timestamped samples, and self-metrics."""

    def __init__(self, poller: Poller) -> None:
        self.poller = poller

    def collect(self) -> Iterator[Metric]:
        p = self.poller
        with p.lock:
            families = dict(p.families)
            held = p.held.take(int(time.time() * 1000))
            held_meta = dict(p.held.meta)
            stats = {
                n: PluginStats(
                    **{
                        k: getattr(s, k)
                        for k in (
                            "runs",
                            "failures",
                            "timeouts",
                            "rejected",
                            "last_duration",
                            "last_success",
                            "samples",
                            "disabled",
                        )
                    }
                )
                for n, s in p.stats.items()
            }
            polls, cycle, last_poll = p.polls, p.last_cycle, p.last_poll_time
        extra: dict[str, list[Sample]] = {}
        for fname, s in held:
            extra.setdefault(fname, []).append(s)
        for fname, fam in families.items():
            yield _to_metric(fam, fam.samples + extra.pop(fname, []))
        for fname, samples in extra.items():
            typ, doc = held_meta[fname]
            yield _to_metric(Family(fname, typ, doc), samples)
        yield from self._self_metrics(stats, polls, cycle, last_poll)

    def _self_metrics(
        self, stats: dict[str, PluginStats], polls: int, cycle: float, last_poll: float
    ) -> Iterator[Metric]:
        host = self.poller.cfg.host
        per_plugin = [
            (
                GaugeMetricFamily,
                "exporter_plugin_duration_seconds",
                "Wall time of the plugin's last run.",
                "last_duration",
            ),
            (CounterMetricFamily, "exporter_plugin_runs", "Runs of the plugin.", "runs"),
            (
                CounterMetricFamily,
                "exporter_plugin_failures",
                "Runs that exited non-zero (not the never-again code) or printed only unparseable output.",
                "failures",
            ),
            (
                CounterMetricFamily,
                "exporter_plugin_timeouts",
                "Runs killed (whole process group) at --timeout.",
                "timeouts",
            ),
            (
                GaugeMetricFamily,
                "exporter_plugin_last_success_timestamp_seconds",
                "Unix time of the plugin's last successful run (0: never).",
                "last_success",
            ),
            (
                CounterMetricFamily,
                "exporter_plugin_lines_rejected",
                "Output lines or samples dropped as malformed, "
                "duplicate, type-clashing or using the reserved exporter_ prefix.",
                "rejected",
            ),
            (GaugeMetricFamily, "exporter_plugin_samples", "Samples accepted from the plugin's last run.", "samples"),
            (
                GaugeMetricFamily,
                "exporter_plugin_disabled",
                "1 if the plugin exited with the never-again code.",
                "disabled",
            ),
        ]
        for cls, name, doc, attr in per_plugin:
            fam = cls(name, doc, labels=["host", "plugin"])
            for plugin, st in sorted(stats.items()):
                fam.add_metric([host, plugin], float(getattr(st, attr)))
            yield fam
        g = GaugeMetricFamily("exporter_poll_cycle_seconds", "Wall time of the last poll cycle.", labels=["host"])
        g.add_metric([host], cycle)
        yield g
        c = CounterMetricFamily("exporter_polls", "Completed poll cycles.", labels=["host"])
        c.add_metric([host], polls)
        yield c
        g = GaugeMetricFamily(
            "exporter_last_poll_timestamp_seconds", "Unix time the last poll cycle ended.", labels=["host"]
        )
        g.add_metric([host], last_poll)
        yield g
        t = os.times()
        c = CounterMetricFamily(
            "exporter_cpu_seconds",
            "CPU time of the exporter (scope=self, all threads) and of its finished plugin processes (scope=plugins).",
            labels=["host", "scope"],
        )
        c.add_metric([host, "self"], t.user + t.system)
        c.add_metric([host, "plugins"], t.children_user + t.children_system)
        yield c
        c = CounterMetricFamily(
            "exporter_held_samples_dropped",
            "Timestamped samples dropped because a series had too many waiting for a scrape.",
            labels=["host"],
        )
        c.add_metric([host], self.poller.held.dropped + sum(s.held.dropped for s in self.poller.sources))
        yield c
        c = CounterMetricFamily(
            "exporter_restarts",
            "Exporters of this node that exited before this one (its supervisor restarted it).",
            labels=["host"],
        )
        c.add_metric([host], self.poller.cfg.restarts)
        yield c


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, ctype, code = generate_latest(self.server.registry), CONTENT_TYPE_PLAIN_0_0_4, 200
        elif path == "/":
            body, ctype, code = b"metrics_exporter: metrics are at /metrics\n", "text/plain; charset=utf-8", 200
        else:
            body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry

    def server_bind(self) -> None:
        # HTTPServer.server_bind would resolve the address with getfqdn(): a DNS lookup that can hang.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


def bind_server(bind: str, port: int, registry: CollectorRegistry, tries: int = 100) -> _Server:
    """HTTP server on the first free port >= `port` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    server_cls = type("_BoundServer", (_Server,), {"address_family": family})
    last: OSError | None = None
    for candidate in range(port, port + tries) if port else [0]:
        try:
            server = server_cls((bind, candidate), _Handler)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            last = exc
            continue
        server.registry = registry
        return server
    raise OSError(errno.EADDRINUSE, f"no free port in {port}..{port + tries - 1} on {bind}") from last


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _default_host() -> str:
    return os.environ.get("METRICS_HOST") or os.environ.get("JOB_HOSTNAME") or socket.gethostname().split(".")[0]


class StateDirError(Exception):
    """--state-dir names a directory that is not private to this user."""


def private_state_dir(path: str | None) -> str:
    """The directory for the plugins' state.

    None: a new directory with a random name in $TMPDIR or /tmp (tempfile.mkdtemp: created
    atomically with mode 0700), removed again at exit. A given path is created with mode 0700 when
    missing; either way it must then be a directory (not a symbolic link) owned by this user that
    nobody else can enter, or StateDirError says why not."""
    if path is None:
        return tempfile.mkdtemp(prefix="metrics_exporter-")
    path = os.path.abspath(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise StateDirError(f"--state-dir {path}: cannot create it: {e.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise StateDirError(f"--state-dir {path} is a symbolic link; give a directory of yours with mode 0700")
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise StateDirError(
            f"--state-dir {path} is not private (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}); give a directory of yours with mode 0700"
        )
    return path


def _write_atomic(path: str, text: str) -> None:
    """Write ``path`` whole: a new file (never through a link, 0644) renamed over it."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    ap.add_argument("--port", type=int, default=9400, help="first port to try; moves up if taken (default 9400)")
    ap.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between polls (default 5)")
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds each plugin may run (default 3)")
    ap.add_argument(
        "--plugin-dir",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins"),
        help="where *_metrics_plugin.sh live (default: this script's directory)",
    )
    ap.add_argument(
        "--job-dir",
        default=os.environ.get("JOB_DIR", os.getcwd()),
        help="the job's directory, passed to plugins as JOB_DIR (default $JOB_DIR or cwd)",
    )
    ap.add_argument(
        "--host",
        default=_default_host(),
        help="value of the host label (default $METRICS_HOST, $JOB_HOSTNAME or the short hostname)",
    )
    ap.add_argument(
        "--node-rank",
        default=os.environ.get("JOB_NODE_RANK", "0"),
        help="passed to plugins as JOB_NODE_RANK (default $JOB_NODE_RANK or 0)",
    )
    ap.add_argument(
        "--tensorboard",
        choices=("auto", "on", "off"),
        default="auto",
        help="read the TensorBoard event files under --job-dir: auto = on node rank 0 only (MaxText "
        "writes them there), or on every node with TB_METRICS_ALL_NODES=1 (default auto)",
    )
    ap.add_argument(
        "--state-dir",
        help="parent of the per-plugin state dirs: a directory of yours with mode 0700, "
        "made if missing (default: a new private dir in $TMPDIR or /tmp, removed at exit)",
    )
    ap.add_argument("--sysfs-root", default=os.environ.get("METRICS_SYSFS_ROOT", "/sys"))
    ap.add_argument("--procfs-root", default=os.environ.get("METRICS_PROCFS_ROOT", "/proc"))
    ap.add_argument("--port-file", help="write the port actually used to this file")
    ap.add_argument("--sd-file", help="write a Prometheus file_sd target list (JSON) for this exporter here")
    ap.add_argument("--log", help="append the log here instead of stderr")
    ap.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="exporters of this node that ran before this one (served as exporter_restarts_total; default 0)",
    )
    ap.add_argument("--once", action="store_true", help="run one poll, print the exposition, exit")
    args = ap.parse_args(argv)
    if args.interval <= 0 or args.timeout <= 0:
        ap.error("--interval and --timeout must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        filename=args.log,
        level=logging.INFO,
        format="%(asctime)s metrics_exporter[%(process)d] %(levelname)s %(message)s",
    )
    job_dir = os.path.abspath(args.job_dir)
    try:
        state_dir = private_state_dir(args.state_dir)
    except StateDirError as e:
        print(f"metrics_exporter.py: {e}", file=sys.stderr)
        if args.log:
            log.error("%s", e)
        return 2
    cfg = Config(
        plugin_dir=os.path.abspath(args.plugin_dir),
        state_dir=state_dir,
        host=args.host,
        node_rank=str(args.node_rank),
        job_dir=job_dir,
        interval=args.interval,
        timeout=args.timeout,
        sysfs_root=args.sysfs_root,
        procfs_root=args.procfs_root,
        restarts=max(0, args.restarts),
    )
    try:
        return serve(args, cfg)
    finally:
        if args.state_dir is None:  # made here: nobody else knows it
            shutil.rmtree(state_dir, ignore_errors=True)


def serve(args: argparse.Namespace, cfg: Config) -> int:
    """Poll and serve until SIGTERM/SIGINT (or one poll with --once)."""
    tb_on = args.tensorboard == "on" or (
        args.tensorboard == "auto" and (cfg.node_rank == "0" or os.environ.get("TB_METRICS_ALL_NODES") == "1")
    )
    sources = [TensorBoardCollector(cfg.job_dir, cfg.host, cfg.hold_seconds, skip_dir=cfg.state_dir)] if tb_on else []
    poller = Poller(cfg, sources=sources)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(poller))
    for source in sources:
        registry.register(source)
    if args.once:
        poller.poll_once()
        sys.stdout.write(generate_latest(registry).decode())
        return 0

    server = bind_server(args.bind, args.port, registry)
    port = server.server_address[1]
    url_host = f"[{args.bind}]" if ":" in args.bind else args.bind
    written = []
    if args.port_file:
        _write_atomic(args.port_file, f"{port}\n")
        written.append(args.port_file)
    if args.sd_file:
        # No "host" target label: the samples carry host already, Prometheus would rename it exported_host.
        target = [{"targets": [f"{url_host}:{port}"], "labels": {"node_rank": cfg.node_rank}}]
        _write_atomic(args.sd_file, json.dumps(target) + "\n")
        written.append(args.sd_file)
    print(f"metrics_exporter: serving http://{url_host}:{port}/metrics", flush=True)
    log.info(
        "serving http://%s:%d/metrics; plugins from %s every %gs (timeout %gs), state in %s; TensorBoard "
        "events under %s: %s",
        url_host,
        port,
        cfg.plugin_dir,
        cfg.interval,
        cfg.timeout,
        cfg.state_dir,
        cfg.job_dir,
        "read" if tb_on else f"not read (--tensorboard {args.tensorboard}, node rank {cfg.node_rank})",
    )

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    poll_thread = threading.Thread(target=poller.run_forever, args=(stop,), name="poll", daemon=True)
    poll_thread.start()
    while not stop.wait(3600):
        pass
    log.info("stopping")
    server.shutdown()
    poller.kill_running()
    poll_thread.join(timeout=cfg.timeout + 1)
    poller.kill_running()
    for path in written:
        try:
            os.unlink(path)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
