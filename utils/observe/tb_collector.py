"""The job's TensorBoard event files, read in the exporter's own process on node rank 0
(utils/observe/metrics_exporter.py --tensorboard): each poll reads what was appended since the last one
and holds the scalars as timestamped tb_* samples for the next scrapes (docs/plugins.md, docs/metrics.md)."""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

try:
    from observe.exposition import Family, HeldSamples, Labels, Sample, to_metric
except ImportError:  # run as a script by a python without the project's import roots (a container's)
    from exposition import Family, HeldSamples, Labels, Sample, to_metric  # type: ignore[no-redef]

log = logging.getLogger("metrics_exporter")

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
            yield to_metric(self.families[fname], samples_)
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
