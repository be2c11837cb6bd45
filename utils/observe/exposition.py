"""Prometheus text exposition (format 0.0.4): the only place the project reads it (the plugins' output,
utils/observe/metrics_exporter.py; tests), the timestamped samples held until a scrape served them
(HeldSamples), and a family served through prometheus_client (to_metric). Used by metrics_exporter.py
and tb_collector.py."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.core import Metric

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


def to_metric(fam: Family, samples: Iterable[Sample]) -> Metric:
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
