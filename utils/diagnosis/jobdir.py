"""The job directory, read in one place: what every tool (triage, diagnose, perf, investigate, the job
monitor, the MCP server, answer.sh) knows of a job without asking the scheduler.

A job directory <workspace>/<id>-JAX-<model>[-<tag>]/ holds `log` (a link to `<dir>.log` beside it),
`summary.txt` (the JOB SUMMARY, docs/job-log.md), `artifact/configs/<model>.yml` (the config the job
ran) and, for a RAY=1 job, `prometheus/` (its TSDB). Results that submit.sh moved aside for a new job
with the same name (`<name>.earlier-<UTC>`) are that earlier job, never listed as a job.
Which job a user's JOB argument names is locate.py's rule, on top of this module (answer.sh's
key: `python3 -m diagnosis.locate key JOB`, this module's fingerprint).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import joblog

EARLIER = re.compile(r"\.earlier-\d{8}T\d{6}Z(-\w+)?$")  # launch_lib.sh move_aside_job: PATH.earlier-<UTC>[-XXXX]
JOB_RULE = "=" * 20 + " JOB " + "=" * 20  # the JOB header's first line (utils/launch/job_header.sh)
SUMMARY = "summary.txt"  # the JOB SUMMARY, as the job writes it in its directory
SUMMARY_LIMIT = 1 << 20  # bytes of it read at most
NEXT = "next"  # a continuing run's job (--continue): "<id> <name>" of the next job it queued (utils/run_next.py)


def log_of(job_dir: Path) -> Path | None:
    """A job directory's log: its `log` link, else `<dir>.log` beside it; for a directory that
    submit.sh moved aside, the log moved aside with it (its `log` link names the new job's log)."""
    earlier = EARLIER.search(job_dir.name)
    if earlier:
        cands = [job_dir.with_name(job_dir.name[: earlier.start()] + ".log" + earlier.group(0))]
    else:
        cands = [job_dir / "log"] + ([job_dir.with_name(job_dir.name + ".log")] if job_dir.name else [])  # "/"
    return next((c.resolve() for c in cands if c.is_file()), None)


def dir_of(log: Path) -> Path | None:
    """A log's job directory: the log's path without `.log`, when that is a directory (for a log
    moved aside, the directory moved aside with it)."""
    earlier = EARLIER.search(log.name)
    base, tail = (log.name[: earlier.start()], earlier.group(0)) if earlier else (log.name, "")
    d = log.with_name(base.removesuffix(".log") + tail) if base.endswith(".log") else None
    return d if d is not None and d.is_dir() else None


def listing(workspace: Path) -> Iterator[tuple[str, Path]]:
    """The jobs of a workspace, each entry as (job name, path): a job directory `<name>/` and a log
    `<name>.log` (links followed), for names `<id>-JAX-...`; never results moved aside. OSError when
    the workspace cannot be read."""
    with os.scandir(workspace) as entries:
        for e in entries:
            name = e.name.removesuffix(".log")
            if "-JAX-" not in name or EARLIER.search(e.name):
                continue
            try:
                if e.is_dir() if name == e.name else e.is_file():
                    yield name, Path(e.path)
            except OSError:
                continue


def parse_next(data: bytes | None) -> tuple[str, str] | None:
    """(id, name) from the `next` file's content, None unless it is one id and that job's name."""
    words = (data or b"").decode(errors="replace").split()
    if len(words) == 2 and words[0].isdigit() and words[1].startswith(f"{words[0]}-") and "/" not in words[1]:
        return words[0], words[1]
    return None


def parse_summary(data: bytes | str) -> dict[str, str]:
    """The JOB SUMMARY's fields from summary.txt's text (docs/job-log.md)."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return joblog.parse_block([x for x in text.splitlines() if not x.startswith("=====")])


def summary(job_dir: Path | None) -> dict[str, str]:
    """The JOB SUMMARY of a job directory ({} before the job wrote it): summary.txt, never through a
    link and only a regular file, at most SUMMARY_LIMIT bytes."""
    if job_dir is None:
        return {}
    try:
        fd = os.open(job_dir / SUMMARY, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return {}
            return parse_summary(f.read(SUMMARY_LIMIT))
    except OSError:
        return {}


def read_header(f: BinaryIO) -> dict[str, str]:
    """The JOB header's fields from the start of an open log ({} for a log that starts otherwise)."""
    try:
        f.seek(0)
        head = f.read(64 << 10).decode(errors="replace").splitlines()
    except OSError:
        return {}
    if not head or head[0] != JOB_RULE:
        return {}
    end = next((i for i, ln in enumerate(head[1:], 1) if ln.startswith("=====")), len(head))
    return joblog.parse_block(head[1:end])


def header(log: Path | None) -> dict[str, str]:
    """The JOB header's fields of a log ({} without one)."""
    if log is None:
        return {}
    try:
        with log.open("rb") as f:
            return read_header(f)
    except OSError:
        return {}


def started(head: dict[str, str]) -> float | None:
    """The job's start (the header's `started:`, UTC) in unix seconds; None without one."""
    try:
        return datetime.strptime(head.get("started", ""), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def model(head: dict[str, str]) -> str | None:
    """The config a job ran, from its header's `model:` line."""
    return head.get("model", "").split(" ")[0] or None


def planned_steps(head: dict[str, str], job_dir: Path | None) -> int | None:
    """The steps the job was asked for: the last `steps=N` of the header's MaxText overrides, else the
    `steps:` of the config the job ran (artifact/configs/<model>.yml, the one the job saved); None when
    neither says."""
    found = None
    for kv in head.get("overrides", "").split():
        k, _, v = kv.partition("=")
        if k == "steps" and re.fullmatch(r"-?\d+", v):
            found = int(v)
    name = model(head)
    if found is not None or job_dir is None or name is None:
        return found
    try:
        text = (job_dir / "artifact" / "configs" / f"{name}.yml").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"(?m)^steps:\s*(-?\d+)\s*(?:#.*)?$", text)
    return int(m.group(1)) if m else None


def tsdb_dir(job_dir: Path) -> Path:
    return job_dir / "prometheus"


def has_blocks(path: Path) -> bool:
    return any((d / "meta.json").is_file() for d in path.iterdir() if d.is_dir()) if path.is_dir() else False


def is_tsdb(path: Path) -> bool:
    """A dir holding Prometheus blocks and/or a WAL."""
    return path.is_dir() and ((path / "wal").is_dir() or has_blocks(path))


def tsdb_span(db: Path) -> tuple[float, float] | None:
    """The time range the TSDB's blocks hold (unix s, from their meta.json); None without a readable block."""
    lo, hi = math.inf, -math.inf
    for meta in db.glob("*/meta.json"):
        try:
            m = json.loads(meta.read_text())
            lo, hi = min(lo, m["minTime"] / 1000), max(hi, m["maxTime"] / 1000)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return (lo, hi) if lo <= hi else None


def _stat(p: Path | None) -> tuple[int, int] | None:
    try:
        st = p.stat() if p is not None else None
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if st else None


def fingerprint(path: Path, job_dir: Path | None, log: Path | None) -> tuple:
    """What changes when a job's log or TSDB changes (a TSDB given alone is PATH): the answer caches'
    key (mcpserver/cache.py, answer.sh)."""
    prom = tsdb_dir(job_dir) if job_dir else path
    return (str(path), _stat(log), _stat(prom), _stat(prom / "wal"))
