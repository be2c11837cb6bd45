"""The one parser of the launcher's job-log format: the JOB header (utils/launch/job_header.sh), the
"<host>: " prefix of every node line (utils/launch/run_stage.sh), MaxText step lines with or without
the absl prefix, JAX/XLA coordination-service messages, srun/slurmstepd/bash notices, the
JOB SUMMARY block (utils/launch/job_summary.sh) and the per-node stage records in the job directory
(.stages/<stage>/<host>: "rc=N end=EPOCH reason=exit|timeout|stopped").

`scan(path)` streams the log once, in 4 MiB blocks of one reused buffer, and runs no Python
code per ordinary line: a C-level regex lists the lines that are neither absl INFO lines nor
step lines (the only ones that can hold an error), another collects one reference host's step
lines, and each host's last lines are found by walking back from the end of each block.
Everything else (deciding what failed) is in utils/triage.py.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

BLOCK = 4 << 20  # bytes read per block (4 MiB measured fastest: stays in cache)
LOOKAHEAD = 64 << 10  # bytes kept after the last processed line (tracebacks, task lists)
DENSE = 8000  # more candidate lines than this in a block: search for needles instead
EVENT_CAP = 20  # events kept per (kind, host); the rest are only counted

# --- line grammar -------------------------------------------------------------------------
HOST_RE = rb"[A-Za-z0-9][\w.-]*"
# names that look like a host prefix but are programs (unprefixed lines of the log)
NOT_HOSTS = {
    "srun",
    "sbatch",
    "salloc",
    "slurmstepd",
    "_job.sbatch",
    "run_stage.sh",
    "run_local.sh",
    "_train.sh",
    "_container.sh",
    "preflight",
    "image",
    "gpu_health",
    "Traceback",
    "status",
    "job",
    "nodes",
    "stage",
    "log",
    "job_dir",
}
ABSL = re.compile(rb"([IWEF])(\d{4} \d\d:\d\d:\d\d\.\d+) +\d+ ([^\]\s]*)\] ")
# MaxText 0.2.5's step line (metric_logger.py joins its fields with ", "):
#   completed step: 4, seconds: 0.017, TFLOP/s/device: 0.010, Tokens/s/device: 15434.704, total_weights: 256,
#   loss: 6.079, lm_loss: 6.079, perplexity: 436.634[, moe_lb_loss: ..., ...]
#   [Rampup Batch Size Phase], completed step: 0, seconds: 20.968, total_weights: 128, loss: 6.061, ...
# (loss is printed with "%.3f": "nan" or "inf" when training diverged; tests/fixtures/maxtext_0.2.5/).
# groups: ramp-up marker, step, seconds, TFLOP/s/device, Tokens/s/device (the last two absent in
# ramp-up lines), loss
_RAMPUP = rb"\[Rampup Batch Size Phase\],? "
STEP = re.compile(
    rb"(" + _RAMPUP + rb")?completed step: (\d+), seconds: ([\d.]+)"
    rb"(?:, TFLOP/s/device: ([\d.]+))?(?:[^\n]*?Tokens/s/device: ([\d.]+))?"
    rb"(?:[^\n]*?, loss: (-?[\d.]+|-?inf|nan))?"
)
# a line start that is neither an absl INFO line nor a step line: every error, notice and
# header/summary line (possessive repeat: no backtracking, ~0.2 us per line)
_STEP_TEXT = rb"(?:" + _RAMPUP + rb")?completed step: "
_NOT_BORING = re.compile(rb"\n(?![^:\n]{1,64}+: (?:I\d{4} |" + _STEP_TEXT + rb")|I\d{4} |" + _STEP_TEXT + rb")")
_RECORD = re.compile(r"rc=(\d+)\s+end=([\d.]+)\s+reason=(\w+)")
# MaxText 0.2.5's line when it restores the latest checkpoint of its checkpoint directory (a run's,
# --run), an absl INFO line (maxtext/common/checkpointing.py, load_state_if_possible):
#   checkpointing.py:705] restoring from this run's directory step 5
# Training then goes on at the next step (the checkpoint of step N holds the state after step N).
_RESTORE_TEXT = b"restoring from this run's directory step "
RESTORE = re.compile(re.escape(_RESTORE_TEXT) + rb"(\d+)")
# MaxText 0.2.5 stops training when the loss it just logged is not a number (common/metric_logger.py,
# _maybe_abort_after_write_metrics, with abort_on_nan_loss / abort_on_inf_loss: true, the defaults),
# an absl INFO line right after that step's line, then sys.exit(1) (tests/fixtures/maxtext_0.2.5):
#   metric_logger.py:349] Aborting training due to NaN loss.        (or "... due to Inf loss.")
# Kind "nan_loss", data: what (NaN or Inf).
_NAN_ABORT_TEXT = b"Aborting training due to "
NAN_ABORT = re.compile(r"Aborting training due to (NaN|Inf) loss\.")
# A continuing run's lines (utils/run_next.py, monitor/chain.py say()), whole lines without a host prefix
# (docs/job-log.md), "run_next: " then: at the start "queued job N ...", "job N (queued by this job's
# earlier run) goes on with run ALIAS when this job ends", "this is job K of at most M ...", "no next job
# for run ALIAS: ..."; while it trains "watchdog: ..."; the decision, after the JOB SUMMARY (or at the
# start, for a job that trains nothing): "job N goes on with run ALIAS (STATUS...)", "run ALIAS stops:
# ...[; cancelled job N]", "run ALIAS is complete: ...", "run ALIAS is not done (...), but no next job ...".
# `run_next_decision` tells them apart (the first pattern that matches).
_RUN_NEXT_TEXT = b"run_next: "
# The job's alerts (utils/observe/alert_relay.py, on node rank 0: with that node's prefix), docs/job-log.md:
#   <node>: alert: firing ALERT host=HOST check=CHECK value=VALUE: SUMMARY; query: QUERY
#   <node>: alert: resolved ALERT host=HOST check=CHECK after SECONDS s
# `alert` parses the text after "alert: ".
_ALERT_TEXT = b"alert: "
_ALERT = re.compile(
    r"(firing|resolved) (\S+) host=(\S+) check=(\S+)(?: value=(\S+): (.*?)(?:; query: (.*))?| after (\d+) s)"
)


@dataclasses.dataclass
class Alert:
    """One alert line: state firing or resolved, the alert, the host it is about, the diagnose check of
    the same signal; firing: value, summary, query; resolved: seconds it fired."""

    state: str
    name: str
    host: str
    check: str
    value: str | None = None
    summary: str | None = None
    query: str | None = None
    seconds: int | None = None


def alert(text: str) -> Alert | None:
    """The alert line's fields (text: after "alert: "), None when it is not one."""
    m = _ALERT.fullmatch(text)
    if not m:
        return None
    return Alert(m[1], m[2], m[3], m[4], m[5], m[6], m[7], int(m[8]) if m[8] else None)


_RUN_NEXT_KINDS = (
    ("queued", re.compile(r"queued job (\d+) |job (\d+) \(queued by this job's earlier run\) .* when this job ends$")),
    ("watchdog", re.compile(r"watchdog: ")),
    ("goes_on", re.compile(r"job (\d+) goes on with run ")),
    ("stops", re.compile(r"run \S+ (?:stops|is complete): (?:.*; cancelled job (\d+)$)?")),
    ("no_next", re.compile(r"no next job for run |run \S+ is not done |this is job \d+ of at most ")),
)

# --- signatures: (kind, pattern) searched in candidate lines (after the host prefix) -----------
# Texts are the ones the programs print: JAX/XLA 0.12 (jaxlib strings and measured runs),
# CPython, bash job control, Slurm 22.05 srun/slurmstepd, the launcher's own scripts.
# Every regex over the job log's text lives in this file; the tools work from the kinds and
# fields it gives (utils/launch/job_summary.sh's first_error guess is the one exception: it must
# print in every job, without Python; see its comment).
_OOM_DEVICE = r"RESOURCE_EXHAUSTED|Out of memory while trying to allocate"  # XLA's allocator
_JOBCTL = r"^\S+: line \d+: +\d+ "
# a GPU that failed under the trainer (the host's own hardware): CUDA's uncorrectable ECC error (driver API
# CUDA_ERROR_ECC_UNCORRECTABLE, runtime "uncorrectable ECC error encountered"), the NVIDIA kernel driver's Xid
# and "fallen off the bus" lines when they reach the job log, NCCL/RCCL's "unhandled cuda error" (a CUDA call
# failed on this host: not a peer's death), ROCm's HSA runtime errors and its queue abort
# (":0:rocdevice.cpp :2660: ... Device::callbackQueue aborting with error : HSA_STATUS_ERROR_...")
_GPU_ERROR = (
    r"CUDA_ERROR_ECC_UNCORRECTABLE|uncorrectable ECC error|NVRM: Xid\b|GPU has fallen off the bus"
    r"|unhandled (?:cuda|hip) error|HSA_STATUS_ERROR_\w+|rocdevice\.cpp\b.*\b[Aa]bort"
)  # bash job control: "<script>: line N: PID Killed  <command>"
SIGNATURES: list[tuple[str, str]] = [
    ("header", r"^={20} JOB ={20}$"),
    ("summary", r"^={20} JOB SUMMARY ={20}$"),
    ("traceback", r"^Traceback \(most recent call last\):"),
    ("srun_exit", r"^srun: error: (\S+): tasks? [\d,-]+: (.*)$"),
    ("cancel", r"received a stop signal \(job state ([A-Z_]*)\)|\*\*\* (?:JOB|STEP) [\d.]+ ON (\S+) CANCELLED AT"),
    ("stage_timeout", r"run_stage\.sh: stage '([\w-]+)' exceeded its (\d+) s limit on (\S+)"),
    # utils/launch/gpu_health.sh (in preflight): "gpu_health: gpu N (VENDOR BUS): FAILED: ...", a host check
    # "gpu_health: HOST: FAILED: ..." and the verdict "gpu_health: verdict HOST: FAILED: ..."
    ("gpu_health", r"^gpu_health: (?:verdict )?(.+?): FAILED: (.*)"),
    ("preflight", r"^preflight: FAILED: (.*)"),
    # utils/launch/image.sh: a node's image stage failed, or (unprefixed) the nodes' images differ; then
    # the per-node table's rows mark the nodes that differ or left no record
    ("image", r"^image: FAILED: (.*)"),
    ("image_odd", r"^image:   (\S+)  .*  <- (differs|no record)$"),
    ("run_busy", r"\brun '[^']+' is in use\b"),  # utils/launch/run_alias.sh: another job holds the run
    (
        "config_error",
        r"MAXTEXT CONFIG ERROR|ValidationError: \d+ validation errors? for"
        r"|yaml\.(?:scanner|parser|constructor|composer)\.\w+Error",
    ),
    ("oom_device", _OOM_DEVICE),
    ("gpu_error", _GPU_ERROR),
    ("oom_host", r"\bOut Of Memory\b|oom-kill|oom_kill|Out of memory: Killed process|invoked oom-killer"),
    ("hb_claim", r"The following tasks are unhealthy \(stopped sending heartbeats\)"),
    ("hb_task", r"Task (?:/job:[\w-]+/replica:\d+/task:)?(\d+) heartbeat timeout"),
    ("death_notice", r"Terminating process because the JAX distributed service detected fatal errors"),
    (
        "coordination",
        r"Polled an error from coordination service|Failed to send RPC to coordination service"
        r"|Leader incarnation ID mismatch",
    ),
    ("preemption", r"Received preemption notice|will be preempted at"),
    (
        "segfault",
        r"Segmentation fault|Fatal Python error|\*\*\* SIG\w+ received at time=|\*\*\* Signal \d+ received at time=",
    ),
    (
        "collective",
        r"Gloo\b.*(?:failed|[Ee]rror|[Tt]imed? ?out)|\b[NR]CCL WARN|\b[NR]CCL (?:error|Error)"
        r"|\bnccl\w*Error\b|\bRCCL\b.*(?:failed|[Ee]rror)",
    ),
    ("node_failure", r"Node failure on (\S+)|DUE TO NODE FAILURE|\bNODE_FAIL\b"),
    ("killed", _JOBCTL + r"Killed\b"),
    ("fatal", r"^F\d{4} \d\d:\d\d:\d\d\.\d+ "),
]
_PYDANTIC_HEAD = re.compile(r"\d+ validation errors? for \w+\s*$")
_PYDANTIC_TAIL = re.compile(r"\s*\[type=.*$")
_SIG_ANY = re.compile("|".join(f"(?:{p})" for _, p in SIGNATURES))  # cheap "anything here?" test
_SIG_KIND = [(k, re.compile(p)) for k, p in SIGNATURES]  # then the kind, by priority
_ABSL_S = re.compile(ABSL.pattern.decode())
# a block with very many candidate lines (e.g. every line a warning) is searched for these
# literals instead (bytes.find, ~1.5 GB/s each); each signature above has one of them
_NEEDLES = (
    b"Traceback (most recent",
    b"MAXTEXT CONFIG ERROR",
    b"ValidationError",
    b"yaml.",
    b"RESOURCE_EXHAUSTED",
    b"Out of memory",
    b"Out Of Memory",
    b"oom",
    b"unhealthy",
    b"heartbeat timeout",
    b"Terminating process",
    b"coordination service",
    b"incarnation",
    b"preempt",
    b"Segmentation fault",
    b"Fatal Python",
    b"received at time=",
    b"Gloo",
    b"CCL",
    b"nccl",
    b"exceeded its",
    b"stop signal",
    b"CANCELLED",
    b"Node failure",
    b"NODE_FAIL",
    b"srun: error",
    b" Killed",
    b"==== JOB",
    b"preflight: FAILED",
    b"image: FAILED",
    b"  <- differs",
    b"  <- no record",
    b"' is in use",
    b"gpu_health: ",
    b"ECC error",
    b"CUDA_ERROR_ECC",
    b"Xid",
    b"fallen off the bus",
    b"unhandled",
    b"HSA_STATUS_ERROR",
    b"rocdevice",
)
_F_LINE = re.compile(rb"\n(?:[^:\n]{1,64}+: )?F\d{4} \d\d:")
_EXC_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Warning)\b(?::|$)"
)
_CANCEL = re.compile(
    r"job state ([A-Z_]*)\)|\*\*\* (JOB|STEP) ([\d.]+) ON (\S+) CANCELLED AT (?:\S+)"
    r"(?: DUE TO ([A-Z ]+?))?(?:,| \*\*\*)"
)
_TASK_LINE = re.compile(r"^(?:/job:[\w-]+/replica:\d+/task:)?(\d+)$")
_JOBCTL_RE = re.compile(_JOBCTL)

# --- what an exception line means (the line after a traceback, kind "exception"), in this order;
# anything else is a python_exception. A collective or coordination error is the consequence of
# another task's death, not a cause; KeyboardInterrupt/SystemExit are how a stop request ends.
EXCEPTION_KINDS: list[tuple[str, re.Pattern[str]]] = [
    (
        "config_error",
        re.compile(
            r"ValidationError|yaml\.\w+\.\w+Error|'[^']+' not in '|MAXTEXT CONFIG ERROR|[Cc]onfig(?:uration)? error"
        ),
    ),
    ("oom_device", re.compile(_OOM_DEVICE)),
    ("gpu_error", re.compile(_GPU_ERROR)),
    ("collective", re.compile(r"Gloo|\b[NR]CCL\b|nccl\w*Error|Connection reset by peer|Connection closed by peer")),
    ("interrupt", re.compile(r"^(?:KeyboardInterrupt|SystemExit)\b")),
    (
        "coordination",
        re.compile(
            r"heartbeat|coordination service|Barrier|DEADLINE_EXCEEDED|UNAVAILABLE|PollForError|"
            r"distributed service|preempt",
            re.I,
        ),
    ),
]
# the abort a fatal error ends in (CPython's fault handler, absl's failure signal handler)
_ABORT = re.compile(r"Fatal Python error: Aborted|SIGABRT|Signal 6 received")


class NotALog(ValueError):
    """The file is not a text log."""


@dataclasses.dataclass
class Event:
    """One signature found in the log."""

    kind: str
    host: str | None
    line: int
    text: str
    ts: float | None = None
    data: dict = dataclasses.field(default_factory=dict)
    raw: str = ""  # the whole log line, as written


@dataclasses.dataclass
class HostSeen:
    """The last things one host printed (host None: lines without a host prefix)."""

    last_step: int | None = None
    last_step_ts: float | None = None
    last_step_line: int | None = None
    last_step_text: str = ""
    last_ts: float | None = None
    last_line: int | None = None


WARMUP_STEPS = 3  # first steps left out of steady numbers by default (compilation, first data)


@dataclasses.dataclass
class Steps:
    """Step lines of one host, in log order. Columns: step, seconds, tokens (Tokens/s/device),
    tflops (TFLOP/s/device; both None in ramp-up lines), loss (nan when training diverged, None
    when the line has none) and the raw absl stamp (b"" without absl prefix), turned into epoch
    seconds on demand by ts(i)."""

    host: str | None = None
    step: list[int] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)
    tokens: list[float | None] = dataclasses.field(default_factory=list)
    tflops: list[float | None] = dataclasses.field(default_factory=list)
    loss: list[float | None] = dataclasses.field(default_factory=list)
    stamp: list[bytes] = dataclasses.field(default_factory=list)
    rampup: int = 0
    clock: AbslClock | None = dataclasses.field(default=None, repr=False, compare=False)

    def ts(self, i: int) -> float | None:
        """Epoch seconds of row i (None without absl stamps)."""
        stamp = self.stamp[i]
        return self.clock.epoch(stamp) if (stamp and self.clock) else None

    def steady_rows(self, warmup_steps: int = WARMUP_STEPS) -> tuple[list[int], int]:
        """The warm-up rule of every tool (triage, perf, sweep): (rows of steady training, number
        of warm-up steps left out). Ramp-up lines (no rates) are never steady; of the other rows,
        those of the first `warmup_steps` step numbers (compilation, first data) are left out, but
        never all: the last step stays. Step numbers, not rows: a log whose lines carry no host
        prefix holds each step once per process."""
        idx = [i for i in range(len(self.step)) if self.tokens[i] is not None or not self.rampup]
        order = list(dict.fromkeys(self.step[i] for i in idx))
        skip = min(warmup_steps, max(0, len(order) - 1))
        left_out = set(order[:skip])
        return [i for i in idx if self.step[i] not in left_out], skip

    def final_loss(self) -> float | None:
        """The loss of the last step line (nan when training diverged; None without step lines)."""
        return self.loss[-1] if self.loss else None

    def diverged_at(self) -> int | None:
        """The row of the first step line whose loss is nan or inf (None: every loss is finite)."""
        return next((i for i, x in enumerate(self.loss) if x is not None and not math.isfinite(x)), None)


@dataclasses.dataclass
class Scan:
    path: str
    size: int = 0
    mtime: float = 0.0
    lines: int = 0
    header: dict[str, str] = dataclasses.field(default_factory=dict)
    header_line: int | None = None
    runs: int = 0  # JOB headers seen (a requeued job appends a second run)
    summary: dict[str, str] = dataclasses.field(default_factory=dict)
    summary_lines: dict[str, int] = dataclasses.field(default_factory=dict)
    hosts: dict[str | None, HostSeen] = dataclasses.field(default_factory=dict)
    steps: Steps = dataclasses.field(default_factory=Steps)
    step_lines_seen: bool = False
    host_prefix: bool | None = None
    absl_prefix: bool | None = None
    events: list[Event] = dataclasses.field(default_factory=list)
    counts: Counter = dataclasses.field(default_factory=Counter)
    seconds: float = 0.0
    restored: Event | None = None  # MaxText's first restore line (kind "restore", data: step)
    run_next: list[str] = dataclasses.field(default_factory=list)  # a continuing run's lines, "run_next: " cut

    def nodes(self) -> list[str]:
        """Node names in node-rank order, from the header (JAX task i runs on nodes()[i])."""
        m = re.match(r"\s*\d+\s*\((.*)\)", self.header.get("nodes", ""))
        return m.group(1).split() if m else []


# --- small parsers ------------------------------------------------------------------------
def exception_kind(text: str) -> str:
    """What an exception line means: config_error, oom_device, gpu_error, collective, interrupt,
    coordination or python_exception (see EXCEPTION_KINDS)."""
    return next((kind for kind, rx in EXCEPTION_KINDS if rx.search(text)), "python_exception")


def is_abort(text: str) -> bool:
    """A fatal-signal or fault-handler line that reports an abort (SIGABRT)."""
    return _ABORT.search(text) is not None


def is_job_control(text: str) -> bool:
    """bash's job-control notice ("<script>: line N: PID Killed  <command>"), which names a
    host's death from the outside rather than in the host's own words."""
    return _JOBCTL_RE.match(text) is not None


def strip_absl(text: str) -> str:
    """The text without its absl prefix ("E1122 04:35:44.775712 123 file.cc:12] ")."""
    m = _ABSL_S.match(text)
    return text[m.end() :] if m else text


def split_host(line: str, known: set[str] | None = None) -> tuple[str | None, str]:
    """("n2", rest) for "n2: rest"; (None, line) when the line has no host prefix."""
    head, sep, rest = line.partition(": ")
    if sep and re.fullmatch(HOST_RE.decode(), head) and head not in NOT_HOSTS and (not known or head in known):
        return head, rest
    return None, line


def parse_block(lines: list[str]) -> dict[str, str]:
    """'key: value' lines of the header or summary block."""
    out: dict[str, str] = {}
    for ln in lines:
        key, sep, value = ln.partition(": ")
        if sep and re.fullmatch(r"[a-z_]+", key):
            out[key] = value.strip()
        elif ln.endswith(":") and re.fullmatch(r"[a-z_]+", ln[:-1]):
            out[ln[:-1]] = ""
    return out


def parse_record(text: str) -> dict | None:
    """A stage record 'rc=N end=EPOCH reason=R' as {rc, end, reason}."""
    m = _RECORD.search(text)
    return {"rc": int(m.group(1)), "end": float(m.group(2)), "reason": m.group(3)} if m else None


def read_records(job_dir: Path) -> dict[str, dict[str, dict]]:
    """{stage: {host: {rc, end, reason, file}}} from JOB_DIR/.stages (stages in run order)."""
    out: dict[str, dict[str, dict]] = {}
    order = {"image": 0, "preflight": 1, "train": 2}
    try:
        stages = sorted((job_dir / ".stages").iterdir(), key=lambda p: (order.get(p.name, 2), p.name))
    except OSError:
        return out
    for d in stages:
        if not d.is_dir():
            continue
        out[d.name] = {}
        for f in sorted(d.iterdir()):
            try:
                rec = parse_record(f.read_text(errors="replace"))
            except OSError:
                rec = None
            if rec:
                rec["file"] = str(f)
                out[d.name][f.name] = rec
    return out


def parse_failed_nodes(value: str) -> dict[str, tuple[int, str]]:
    """'n2 (exit 137) n1 (exit 124timeout)' -> {n2: (137, 'exit'), n1: (124, 'timeout')}."""
    return {h: (int(rc), why or "exit") for h, rc, why in re.findall(r"(\S+) \(exit (\d+)([a-z]*)\)", value)}


def _add_rows(st: Steps, ts: tuple, ramp: tuple, step: tuple, sec: tuple, tfl: tuple, tok: tuple, loss: tuple) -> None:
    """Append the columns of STEP's findall rows (with the absl stamp first) to st."""
    st.step.extend(map(int, step))
    st.seconds.extend(map(float, sec))
    st.stamp.extend(ts)
    st.loss.extend(float(x) if x else None for x in loss)
    ramped = len(ramp) - ramp.count(b"")
    if ramped:
        st.rampup += ramped
        st.tokens.extend(float(t) if t and not r else None for t, r in zip(tok, ramp, strict=True))
        st.tflops.extend(float(t) if t and not r else None for t, r in zip(tfl, ramp, strict=True))
    else:
        st.tokens.extend(float(t) if t else None for t in tok)
        st.tflops.extend(float(t) if t else None for t in tfl)


class AbslClock:
    """absl stamps ("1122 04:35:44.775712", local time, no year) to epoch seconds.

    The year comes from the header's started: (UTC); a stamp whose month is more than six months
    before that month belongs to the next year (a job that ran over New Year). Without a header
    the file's mtime is the reference and no stamp can be after it: a later month is last year."""

    def __init__(self, year: int, month: int, ref_is_end: bool = False) -> None:
        self.year, self.month, self.ref_is_end = year, month, ref_is_end
        self._hours: dict[bytes, float] = {}

    @classmethod
    def for_scan(cls, started: str, mtime: float) -> AbslClock:
        m = re.match(r"(\d{4})-(\d\d)-\d\dT", started or "")
        if m:
            return cls(int(m.group(1)), int(m.group(2)))
        tm = time.localtime(mtime or time.time())
        return cls(tm.tm_year, tm.tm_mon, ref_is_end=True)

    def epoch(self, stamp: bytes) -> float | None:
        key = stamp[:7]
        base = self._hours.get(key)
        if base is None:
            try:
                mon, day, hour = int(stamp[0:2]), int(stamp[2:4]), int(stamp[5:7])
            except ValueError:
                return None
            year = self.year
            if self.ref_is_end:
                year -= mon > self.month
            elif mon < self.month - 6:
                year += 1
            elif mon > self.month + 6:
                year -= 1
            try:
                base = time.mktime((year, mon, day, hour, 0, 0, 0, 0, -1))
            except (OverflowError, ValueError):
                return None
            self._hours[key] = base
        try:
            return base + int(stamp[8:10]) * 60 + float(stamp[11:])
        except ValueError:
            return None


# --- the scanner --------------------------------------------------------------------------
class _Scanner:
    """One pass over the log in blocks of a reused buffer. buf[0] is a '\n' sentinel, so every
    line, the first included, starts right after a '\n'; buf[:n] holds data, buf[:cut] is the part
    processed now (whole lines, with at least LOOKAHEAD bytes after it unless at the end)."""

    def __init__(self, path: Path, start: int = 0, end: int | None = None) -> None:
        self.s = Scan(path=str(path))
        self.start, self.end = start, end  # the bytes of the log read (scan_runs: one run of a requeued job)
        self.known: set[str] = set()
        self.clock: AbslClock | None = None
        self.ref_re: re.Pattern[bytes] | None = None
        self.host_keys: list[tuple[str, bytes]] = []
        self.kept: Counter = Counter()
        self.skip_until = -1  # absolute line numbers already consumed by a block parse
        self.exc_seen: set[tuple[str | None, int]] = set()
        self.n = 0  # valid bytes in the buffer
        self.gone: set[str] = set()  # hosts absent from a whole block (see _host_tails)
        self.diverged = False  # the reference host logged a nan/inf loss (see _nan_abort)

    def _set_header(self, header: dict[str, str], line: int) -> None:
        s = self.s
        if s.runs:  # a second run appended to the same log: start over, keep counting lines
            s.summary, s.summary_lines, s.events, s.hosts = {}, {}, [], {}
            s.steps, s.counts, self.kept = Steps(), Counter(), Counter()
            s.step_lines_seen, self.ref_re, s.restored = False, None, None
            s.run_next = []
            self.diverged = False
        s.runs += 1
        s.header, s.header_line = header, line
        self.known = set(s.nodes())
        self.host_keys = [(h, b"\n" + h.encode() + b": ") for h in s.nodes()]
        self.clock = AbslClock.for_scan(header.get("started", ""), s.mtime)
        s.steps.clock = self.clock

    def _learn_format(self, buf: bytearray, cut: int) -> None:
        """From the first step line of the run (after the block's last JOB header, when it holds one: a
        requeued job's rerun may be on other nodes): host prefix? absl prefix? which host is the reference."""
        i = buf.find(b"completed step: ", max(0, buf.rfind(_HEADER_OPEN, 0, cut)), cut)
        if i < 0:
            return
        a = buf.rfind(b"\n", 0, i) + 1
        e = buf.find(b"\n", i, self.n)
        line = buf[a : e if e >= 0 else self.n].decode(errors="replace")
        host, rest = split_host(line, self.known or None)
        s = self.s
        s.step_lines_seen = True
        s.host_prefix = host is not None
        s.absl_prefix = ABSL.match(rest.encode()) is not None
        if self.clock is None:
            self.clock = AbslClock.for_scan("", s.mtime)
        s.steps.clock = self.clock
        if host is not None and not self.known:
            # no header: learn the hosts from the step lines near the first one
            window = buf[a : min(cut, a + (1 << 20))]
            found = re.findall(rb"(?m)^(" + HOST_RE + rb"): [^\n]*completed step: ", window)
            hosts = list(dict.fromkeys(h.decode() for h in found if h.decode() not in NOT_HOSTS))
            self.known = set(hosts)
            self.host_keys = [(h, b"\n" + h.encode() + b": ") for h in hosts]
        s.steps.host = host
        prefix = re.escape(b"\n" + host.encode() + b": ") if host else b"\n"
        absl = rb"[IWEF](\d{4} \d\d:\d\d:\d\d\.\d+) +\d+ [^\]\n]*\] " if s.absl_prefix else rb"()"
        self.ref_re = re.compile(prefix + absl + STEP.pattern)

    def _steps(self, buf: bytearray, cut: int) -> int:
        """Collect the reference host's step lines of this block, from its last JOB header on when it
        holds one (an earlier run's steps before it are not this run's); returns how many."""
        if self.ref_re is None:
            self._learn_format(buf, cut)
            if self.ref_re is None:
                return 0
        rows = self.ref_re.findall(buf, max(0, buf.rfind(_HEADER_OPEN, 0, cut)), cut)
        if not rows:
            return 0
        _add_rows(self.s.steps, *zip(*rows, strict=True))
        return len(rows)

    def _host_tails(self, buf: bytearray, cut: int, base: int, nl_total: int, has_steps: bool) -> None:
        """Per host: the last timestamped line and the last step line in this block, by walking
        back from the block's end. The walk stops once every host still printing was seen and
        resolved within the last max(2000, 8 x hosts) lines (in steady training that is all of
        them: cost ~ hosts, not block size); it goes on through the block only while some host
        is missing, and a host absent from a whole block is marked gone (not searched for again
        until it shows up at a block's end), so a dead node costs one block walk."""
        prefixed = self.s.host_prefix is not False and bool(self.host_keys)
        hosts = [h for h, _ in self.host_keys] if prefixed else [None]
        want = {h: [True, has_steps] for h in hosts if h not in self.gone}  # [want last ts, want last step]
        seen: set[str | None] = set()
        limit = max(2000, 8 * len(hosts))
        pos, k = cut, 0
        while want and pos > 0:
            if k >= limit and seen.issuperset(want):
                break
            p = buf.rfind(b"\n", 0, pos)
            k += 1
            full = buf[p + 1 : pos]
            pos = p
            if prefixed:
                c = full.find(b": ", 0, 80)
                host = full[:c].decode(errors="replace") if c > 0 else None
                if host in self.gone:
                    self.gone.discard(host)
                    want[host] = [True, has_steps]
                if host not in want:
                    continue
                rest = full[c + 2 :]
            else:
                host, rest = None, full
            seen.add(host)
            state = want[host]
            info = self.s.hosts.setdefault(host, HostSeen())
            line = base + nl_total - k + 1
            m = ABSL.match(rest)
            if state[0] and m:
                info.last_line, state[0] = line, False
                info.last_ts = self.clock.epoch(m.group(2)) if self.clock else None
            if state[1] and b"completed step: " in rest:
                sm = STEP.search(rest)
                if sm:
                    info.last_step, info.last_step_line, state[1] = int(sm.group(2)), line, False
                    info.last_step_ts = self.clock.epoch(m.group(2)) if (m and self.clock) else None
                    info.last_step_text = bytes(full[:400]).decode(errors="replace")
            if not state[0] and not state[1]:
                del want[host]
        if pos <= 0:
            self.gone.update(h for h in want if h not in seen and h is not None)

    def _candidates(self, buf: bytearray, cut: int) -> list[int]:
        """Positions of the '\n' that starts each line worth a look."""
        pos = [m.start() for m in _NOT_BORING.finditer(buf, 0, cut)]
        if len(pos) <= DENSE:
            return pos
        starts = {m.start() for m in _F_LINE.finditer(buf, 0, cut)}
        for needle in _NEEDLES:
            i = buf.find(needle, 0, cut)
            while i >= 0:
                starts.add(buf.rfind(b"\n", 0, i))
                nxt = buf.find(b"\n", i, cut)
                i = buf.find(needle, nxt, cut) if nxt >= 0 else -1
        return sorted(starts)

    def _line_at(self, buf: bytearray, p: int) -> tuple[str, int]:
        """The line that starts after the '\n' at p, and the position of its own end '\n'."""
        end = buf.find(b"\n", p + 1, self.n)
        if end < 0:
            end = self.n
        return buf[p + 1 : end].decode(errors="replace"), end

    def _follow(self, buf: bytearray, p: int, host: str | None, n: int = 400) -> list[tuple[int, str]]:
        """Up to n following lines of the same host: [(offset of their '\n', text after the prefix)]."""
        out = []
        q = buf.find(b"\n", p + 1, self.n)
        stop = min(self.n, p + LOOKAHEAD)
        while 0 <= q < stop and len(out) < n:
            text, end = self._line_at(buf, q)
            h, rest = split_host(text, self.known or None)
            if h == host:
                out.append((q, rest))
            q = end if end < self.n else -1
        return out

    def _add(
        self, kind: str, host: str | None, line: int, text: str, ts: float | None = None, raw: str = "", **data: object
    ) -> None:
        self.s.counts[kind] += 1
        key = (kind, host)
        self.kept[key] += 1
        if self.kept[key] > EVENT_CAP and kind not in ("hb_claim", "death_notice"):
            return
        self.s.events.append(Event(kind, host, line, text[:600], ts, dict(data), (raw or text)[:600]))

    def _kind(self, rest: str) -> tuple[str, re.Match[str]] | None:
        if not _SIG_ANY.search(rest):
            return None
        for kind, rx in _SIG_KIND:
            m = rx.search(rest)
            if m:
                return kind, m
        return None

    def _block(self, buf: bytearray, p: int) -> list[str]:
        """The 'key: value' lines after a header/summary opener, up to the closing '====='."""
        block, q = [], buf.find(b"\n", p + 1, self.n)
        while 0 <= q < self.n and len(block) < 60:
            ln, end = self._line_at(buf, q)
            if ln.startswith("====="):
                break
            block.append(ln)
            q = end
        return block

    def _examine(self, buf: bytearray, cands: list[int], base: int) -> None:
        s = self.s
        counted_to, nl = 0, 0
        for p in cands:
            nl += buf.count(b"\n", counted_to, p)
            counted_to = p
            line_no = base + nl + 1
            if line_no <= self.skip_until:
                continue
            text, _ = self._line_at(buf, p)
            host, rest = split_host(text, self.known or None)
            found = self._kind(rest)
            if not found:
                continue
            if rest.startswith("alert: ") and alert(rest[7:]):
                continue  # the job's own metrics alerts (their summaries and queries name OOM kills, Xid, ...)
            kind, m = found
            if kind in ("header", "summary"):
                block = self._block(buf, p)
                if kind == "header":
                    self._set_header(parse_block(block), line_no)
                else:
                    s.summary = parse_block(block)
                    s.summary_lines = {"_open": line_no}
                    for i, ln in enumerate(block):
                        key = ln.partition(":")[0]
                        if key in s.summary:
                            s.summary_lines[key] = line_no + 1 + i
                self.skip_until = line_no + len(block) + 1
                continue
            am = _ABSL_S.match(rest)
            ts = self.clock.epoch(am.group(2)) if (am and self.clock) else None
            data: dict = {}
            if kind == "traceback":
                for q, nxt in self._follow(buf, p, host):
                    if nxt and not nxt[0].isspace() and _EXC_LINE.match(nxt):
                        ln = line_no + buf.count(b"\n", p, q)
                        if (host, ln) not in self.exc_seen:
                            self.exc_seen.add((host, ln))
                            self._add("exception", host, ln, nxt, ts, raw=f"{host}: {nxt}" if host else nxt)
                        break
                continue
            if kind in ("hb_claim", "death_notice"):
                tasks = []
                if kind == "hb_claim" or "unhealthy (stopped sending heartbeats)" in rest:
                    for _, nxt in self._follow(buf, p, host, n=4096):
                        tm = _TASK_LINE.match(nxt.strip())
                        if not tm:
                            break
                        tasks.append(int(tm.group(1)))
                notice = "Terminating process because" in rest
                if notice:
                    self._add("death_notice", host, line_no, rest, ts, raw=text, tasks=tasks)
                if tasks or "unhealthy" in rest:
                    self._add(
                        "hb_claim",
                        host,
                        line_no,
                        rest,
                        ts,
                        raw=text,
                        tasks=tasks,
                        notice=notice,
                        coordinator="propagate the following error" in rest,
                    )
                continue
            if kind == "hb_task":
                data = {"tasks": [int(m.group(1))]}
            elif kind == "srun_exit":
                host = m.group(1) if (not self.known or m.group(1) in self.known) else host
                em = re.match(r"Exited with exit code (\d+)", m.group(2))
                data = {"exit": int(em.group(1)) if em else None, "what": m.group(2)}
                if m.group(2).startswith("Out Of Memory"):
                    self._add("oom_host", host, line_no, rest, ts, raw=text)
            elif kind == "image_odd":
                host = m.group(1) if (not self.known or m.group(1) in self.known) else host
                data = {"why": m.group(2)}
            elif kind == "stage_timeout":
                host = host or m.group(3)
                data = {"stage": m.group(1), "limit": int(m.group(2))}
            elif kind == "cancel":
                # _job.sbatch's trap (level "job"), or slurmstepd's "*** JOB|STEP id ON host CANCELLED
                # AT time [DUE TO reason] ***" (a STEP is also cancelled by --kill-on-bad-exit)
                cm = _CANCEL.search(rest)
                if cm and cm.group(1) is not None:
                    data = {"level": "job", "state": cm.group(1), "due_to": None}
                elif cm:
                    data = {"level": cm.group(2).lower(), "state": None, "due_to": cm.group(5)}
                    if not self.known or cm.group(4) in self.known:
                        host = host or cm.group(4)
                    if cm.group(5) == "NODE FAILURE":
                        self._add("node_failure", None, line_no, rest, ts, raw=text)
            elif kind == "node_failure":
                nm = re.search(r"Node failure on (\S+)", rest)
                host = host or (nm.group(1) if nm else None)
            elif kind == "config_error" and _PYDANTIC_HEAD.search(rest):
                data = {"detail": self._pydantic_detail(buf, p, host)}
            self._add(kind, host, line_no, rest, ts, raw=text, **data)

    def _pydantic_detail(self, buf: bytearray, p: int, host: str | None) -> str:
        """The reason under pydantic's 'N validation error(s) for X' line: its field line and
        message ('steps: Input should be a valid integer', 'Value error, ...'), without the
        '[type=..., input_value=...]' tail. Empty when the next lines are not pydantic's."""
        parts: list[str] = []
        for _, nxt in self._follow(buf, p, host, n=3):
            if not nxt.strip() or _ABSL_S.match(nxt) or nxt.startswith(("Traceback", "pydantic")):
                break
            parts.append(_PYDANTIC_TAIL.sub("", nxt).strip())
            if nxt[0].isspace():  # the message line ends one error's description
                break
        return ": ".join(parts)[:300]

    def _lines_with(self, buf: bytearray, cut: int, base: int, needle: bytes) -> Iterator[tuple]:
        """The lines of this block holding NEEDLE after the run's header (absl INFO lines, which the
        candidate search skips): (line number, host, text after the prefix, whole line, epoch or None)."""
        i = buf.find(needle, 0, cut)
        while i >= 0:
            line = base + buf.count(b"\n", 0, i)
            a = buf.rfind(b"\n", 0, i) + 1
            e = buf.find(b"\n", i, self.n)
            if self.s.header_line is None or line > self.s.header_line:
                text = buf[a : e if e >= 0 else self.n].decode(errors="replace")
                host, rest = split_host(text, self.known or None)
                am = _ABSL_S.match(rest)
                yield line, host, rest, text, self.clock.epoch(am.group(2).encode()) if (am and self.clock) else None
            i = buf.find(needle, e if e >= 0 else cut, cut)

    def _restore(self, buf: bytearray, cut: int, base: int) -> None:
        """MaxText's restore line, if this block holds the run's first (after the run's header)."""
        for line, host, rest, text, ts in self._lines_with(buf, cut, base, _RESTORE_TEXT):
            m = RESTORE.search(rest.encode())
            if m and line > (self.s.header_line or 0):  # not an earlier run's, in the block of a later header
                self.s.restored = Event("restore", host, line, rest[:600], ts, {"step": int(m.group(1))}, text[:600])
                return

    def _run_next(self, buf: bytearray, cut: int, base: int) -> None:
        """A continuing run's decision lines of this block (after the run's header)."""
        if buf.find(_RUN_NEXT_TEXT, 0, cut) < 0:
            return
        for _line, _host, _rest, text, _ts in self._lines_with(buf, cut, base, _RUN_NEXT_TEXT):
            if text.startswith(_RUN_NEXT_TEXT.decode()):  # the whole line: no host prefix
                self.s.run_next.append(text[len(_RUN_NEXT_TEXT) :][:1000])

    def _nan_abort(self, buf: bytearray, cut: int, base: int) -> None:
        """MaxText's "Aborting training due to NaN loss." lines of this block, as events of kind nan_loss."""
        for line, host, rest, text, ts in self._lines_with(buf, cut, base, _NAN_ABORT_TEXT):
            m = NAN_ABORT.search(rest)
            if m:
                self._add("nan_loss", host, line, rest, ts, raw=text, what=m.group(1))

    def run(self) -> Scan:
        s = self.s
        t0 = time.perf_counter()
        path = Path(s.path)
        st = path.stat()
        s.size, s.mtime = st.st_size, st.st_mtime
        base = 0
        with path.open("rb", buffering=0) as raw:
            f = _Slice(raw, self.start, self.end)
            head = f.read(4096)
            if b"\0" in head:
                raise NotALog(f"{path} is binary, not a job log")
            buf = bytearray(1 + BLOCK + 2 * LOOKAHEAD)
            buf[0] = 10
            buf[1 : 1 + len(head)] = head
            self.n = 1 + len(head)
            eof = not head
            while True:
                while not eof and self.n < len(buf):  # fill the buffer
                    with memoryview(buf) as mv:
                        got = f.readinto(mv[self.n :])
                    if not got:
                        eof = True
                    self.n += got or 0
                n = self.n
                cut = n if eof else buf.rfind(b"\n", 0, n - LOOKAHEAD)
                if cut <= 0:  # no line ends in this much data: a giant line, grow the buffer
                    buf.extend(bytes(BLOCK))
                    continue
                nl_total = buf.count(b"\n", 0, cut)
                self._examine(buf, self._candidates(buf, cut), base)
                if s.restored is None:
                    self._restore(buf, cut, base)
                self._run_next(buf, cut, base)
                had = len(s.steps.loss)
                rows = self._steps(buf, cut)
                # MaxText aborts right after a step line whose loss is nan/inf: look for its abort line only
                # from the block where the reference host's loss stopped being a number (every host aborts)
                if not self.diverged and rows:
                    self.diverged = any(x is not None and not math.isfinite(x) for x in s.steps.loss[had:])
                if self.diverged:
                    self._nan_abort(buf, cut, base)
                if s.step_lines_seen or self.host_keys:
                    steps_here = rows > 0 or buf.find(b"completed step: ", max(0, cut - (256 << 10)), cut) >= 0
                    self._host_tails(buf, cut, base, nl_total, steps_here)
                base += nl_total
                if eof:
                    if n > 1 and buf[n - 1] == 10:
                        base -= 1  # the final newline ends the last line, it starts none
                    break
                rest = n - cut - 1
                buf[1 : 1 + rest] = buf[cut + 1 : n]
                self.n = 1 + rest
        s.lines = base
        if self.clock is None:
            self.clock = AbslClock.for_scan("", s.mtime)
        s.steps.clock = self.clock
        s.seconds = time.perf_counter() - t0
        return s


class _Slice:
    """The bytes START .. END of an open file, read as the scanner reads a whole one."""

    def __init__(self, f: BinaryIO, start: int, end: int | None) -> None:
        self.f, self.left = f, None if end is None else max(0, end - start)
        if start:
            f.seek(start)

    def _room(self, n: int) -> int:
        return n if self.left is None else min(n, self.left)

    def read(self, n: int) -> bytes:
        data = self.f.read(self._room(n)) or b""
        if self.left is not None:
            self.left -= len(data)
        return data

    def readinto(self, mv: memoryview) -> int:
        room = self._room(len(mv))
        got = self.f.readinto(mv[:room]) if room else 0
        if self.left is not None:
            self.left -= got or 0
        return got or 0


def scan(path: str | Path) -> Scan:
    """Stream the job log once and return what it holds (see the module docstring)."""
    return _Scanner(Path(path)).run()


def run_starts(path: str | Path) -> list[int]:
    """The byte offsets where each run of the log begins (its JOB header's first line): one for a job
    that ran once, one more for each requeue (Slurm reruns the job under its id, appending to its log)."""
    rule = _HEADER_OPEN[1:]
    out: list[int] = []
    with Path(path).open("rb") as f:
        pos, tail = 0, b"\n"  # the file's start counts as a line start
        while chunk := f.read(BLOCK):
            buf = tail + chunk
            i = buf.find(b"\n" + rule)
            while i >= 0:
                out.append(pos - len(tail) + i + 1)
                i = buf.find(b"\n" + rule, i + 1)
            tail = buf[-len(rule) :]
            pos += len(chunk)
    return sorted(set(out))


def scan_runs(path: str | Path) -> list[Scan]:
    """One Scan per run of the log, oldest first (a requeued job's log holds several; scan() keeps the
    last one only). Lines before the first header, if any, belong to the first run."""
    starts = run_starts(path)
    if len(starts) <= 1:
        return [scan(path)]
    bounds = [0, *starts[1:], None]
    return [_Scanner(Path(path), a, b).run() for a, b in zip(bounds, bounds[1:], strict=False)]


def checkpoint_at_start(run_line: str) -> int | None:
    """The run's latest checkpoint step when the job started, from its header's `run:` line
    ("ALIAS RUN_DIR (latest checkpoint: step N, ...)"); None for "(no checkpoint: ...)"."""
    m = re.search(r"\(latest checkpoint: step (\d+)", run_line)
    return int(m.group(1)) if m else None


def run_of(s: Scan) -> dict | None:
    """The run (--run) of the log's last run: `alias` and `dir` from the header's `run:` line
    ("ALIAS RUN_DIR (latest checkpoint: step N, ...)", utils/launch/job_header.sh; `checkpoint_at_start`: that N,
    None for "(no checkpoint: ...)"), `restored_from_step` and
    `restore_line` from MaxText's restore line (None: it started from step 0). None when the log has
    neither."""
    line = s.header.get("run", "")
    words = line.split()
    if not words and s.restored is None:
        return None
    return {
        "alias": words[0] if words else None,
        "dir": words[1] if len(words) > 1 else None,
        "checkpoint_at_start": checkpoint_at_start(line),
        "restored_from_step": s.restored.data["step"] if s.restored else None,
        "restore_line": s.restored.line if s.restored else None,
    }


def run_next_decision(text: str) -> tuple[str, str | None]:
    """(kind, job id) of one run_next line's text ("run_next: " cut): kind queued, watchdog, goes_on,
    stops (the run stops or is complete), no_next, or other; the id is the job queued, going on, or
    cancelled (stops), else None."""
    for kind, rx in _RUN_NEXT_KINDS:
        m = rx.match(text)
        if m:
            return kind, next((g for g in m.groups() if g), None)
    return "other", None


def run_next_end(lines: list[str]) -> str | None:
    """What a continuing run's job decided (of its run_next lines, "run_next: " cut): its last goes_on
    or stops line, else its last no_next line; None before it decided or outside such a run."""
    kinds = [run_next_decision(t)[0] for t in lines]
    for want in (("goes_on", "stops"), ("no_next",)):
        ends = [t for t, k in zip(lines, kinds, strict=True) if k in want]
        if ends:
            return ends[-1]
    return None


def looks_like_job_log(s: Scan) -> bool:
    """True when the file holds anything of the launcher's or MaxText's format."""
    return bool(s.runs or s.summary or s.step_lines_seen or s.events)


# --- the steps a run logged and where its output stops (JOB SUMMARY `steps:`, triage's no_steps) --
TAIL_BYTES = 1 << 20  # how much of the log's end last_lines() reads


def steps_seen(s: Scan) -> str:
    """The last run's step lines as the JOB SUMMARY's `steps:` value (docs/job-log.md): the reference
    host's "FIRST..LAST (N lines)", with " on HOST" when the lines carry a host prefix; "none"."""
    st = s.steps
    if not st.step:
        return "none"
    where = f" on {st.host}" if st.host else ""
    return f"{st.step[0]}..{st.step[-1]} ({len(st.step)} lines{where})"


def last_lines(s: Scan, n: int = 3) -> list[tuple[int, str]]:
    """Where the nodes' output of the log's last run stops: the last line before the JOB SUMMARY of each
    node (a "<host>: " prefix, run_stage.sh; at most N nodes, the latest), as (line number, text cut at
    400 characters) in log order; without a node line among the log's last TAIL_BYTES, the last N lines
    without a prefix. Reads only the log's end (up to the size scan() read)."""
    end = s.summary_lines.get("_open", s.lines + 1)
    start = s.header_line or 0
    try:
        with open(s.path, "rb") as f:
            f.seek(max(0, s.size - TAIL_BYTES))
            data = f.read(min(s.size, TAIL_BYTES))
    except OSError:
        return []
    rows = data.split(b"\n")
    if rows and rows[-1] == b"":
        rows.pop()
    if s.size > TAIL_BYTES:
        rows = rows[1:]  # the first row is the end of a line cut by the window
    first_no = s.lines - len(rows) + 1
    known = set(s.nodes())
    nodes: dict[str, tuple[int, str]] = {}
    others: list[tuple[int, str]] = []
    for i, raw in enumerate(rows):
        no = first_no + i
        if not start < no < end or not raw.strip():
            continue
        text = raw.decode(errors="replace")[:400]
        host, _ = split_host(text, known or None)
        if host:
            nodes[host] = (no, text)
        else:
            others.append((no, text))
    return sorted(nodes.values())[-n:] if nodes else others[-n:]


@dataclasses.dataclass
class HeartbeatClaim:
    """JAX's coordination service declaring tasks dead (they stopped sending heartbeats), mapped
    to hosts: JAX task i is the process of node rank i, the i-th node of the header's list."""

    events: list[Event]  # the claim lines that name tasks (kinds hb_claim, hb_task)
    first: Event  # the earliest of them (by absl time, then by line)
    time: float | None  # the earliest claim's absl time (None: no claim line has one)
    tasks: list[int]  # every task id claimed, sorted
    hosts: list[str]  # the accused hosts, in task order (task ids beyond the node list have none)
    coordinator: str | None  # node rank 0, where the coordination service runs


def heartbeat_claim(s: Scan) -> HeartbeatClaim | None:
    """The heartbeat claim of the log (every claim line together), or None without one."""
    claims = [e for e in s.events if e.kind in ("hb_claim", "hb_task") and e.data.get("tasks")]
    if not claims:
        return None
    nodes = s.nodes()
    tasks = sorted({x for e in claims for x in e.data["tasks"]})
    return HeartbeatClaim(
        events=claims,
        first=min(claims, key=lambda e: (e.ts is None, e.ts or 0.0, e.line)),
        time=min((e.ts for e in claims if e.ts is not None), default=None),
        tasks=tasks,
        hosts=[nodes[x] for x in tasks if x < len(nodes)],
        coordinator=nodes[0] if nodes else None,
    )


# --- every host's step lines (utils/perf.py) ---------------------------------------------------
_HEADER_OPEN = b"\n==================== JOB ====================\n"
# XLA's device list at start-up (GPU, absl INFO): "StreamExecutor [0]: NVIDIA H100 80GB HBM3, Compute Capability
# 9.0a (...)" (jaxlib 0.11, measured on an H100), "StreamExecutor device (0): <name>, <version>" in older XLA
_DEVICE = re.compile(rb"StreamExecutor (?:\[0\]|device \(0\)): ([^,\n]*)")
_TB_DIR = b"To see full metrics 'tensorboard --logdir="  # MaxText's metric_logger, every log_period steps
# MaxText 0.2.5's parameter count, once before the first step (common/metric_logger.py,
# write_setup_info_to_tensorboard: "%.3f" billions, every parameter, all experts of a MoE included):
#   metric_logger.py:425] number parameters: 8.030 billion
_PARAMS = re.compile(rb"number parameters: ([0-9]+(?:\.[0-9]+)?) billion")
_ANY_STEP = re.compile(
    rb"\n(?:(" + HOST_RE + rb"): )?(?:[IWEF](\d{4} \d\d:\d\d:\d\d\.\d+) +\d+ [^\]\n]*\] )?" + STEP.pattern
)


@dataclasses.dataclass
class StepTable:
    """Every host's step lines (the last run of the log only), for performance analysis."""

    path: str
    hosts: dict[str | None, Steps] = dataclasses.field(default_factory=dict)  # in order of first step line
    device: str | None = None  # XLA's name of device 0 ("NVIDIA H100 80GB HBM3"), None for the CPU
    tensorboard_dir: str | None = None  # MaxText's "tensorboard --logdir=DIR" (profiles go to DIR/plugins/profile)
    runs: int = 0  # JOB headers seen (a requeued job appends; only the last run is kept)
    params: float | None = None  # MaxText's "number parameters: X billion", as a count (X x 1e9)
    params_text: str | None = None  # that line's text from "number parameters"
    seconds: float = 0.0


def read_steps(path: str | Path, clock: AbslClock | None = None) -> StepTable:
    """Stream the log once and return the step columns of every host (host None: lines without a
    host prefix), with TFLOP/s/device, plus the device name and MaxText's TensorBoard directory.
    A separate pass from scan(), which follows one reference host only and stays as fast as it is;
    `clock` (scan(path).steps.clock) turns the absl stamps into epoch seconds (Steps.ts)."""
    t0 = time.perf_counter()
    out = StepTable(path=str(path))
    if clock is None:
        clock = AbslClock.for_scan("", Path(path).stat().st_mtime)
    look_device, look_params, read = True, True, 0
    with Path(path).open("rb", buffering=0) as f:
        buf = bytearray(1 + BLOCK)
        buf[0] = 10
        n, eof = 1, False
        while not eof:
            while n < len(buf):
                with memoryview(buf) as mv:
                    got = f.readinto(mv[n:])
                if not got:
                    eof = True
                    break
                n += got
            cut = n if eof else buf.rfind(b"\n", 0, n)
            if cut <= 0:  # a giant line: grow the buffer
                buf.extend(bytes(BLOCK))
                continue
            start = 0
            h = buf.rfind(_HEADER_OPEN, 0, cut)
            if h >= 0:  # a (new) run starts here: forget the steps of an earlier one
                out.runs += buf.count(_HEADER_OPEN, 0, cut)
                out.hosts, start = {}, h + 1
                look_device, out.device, out.tensorboard_dir = True, None, None
                look_params, out.params, out.params_text = True, None, None
            if look_device and read < (256 << 20):
                m = _DEVICE.search(buf, start, cut)
                if m:
                    name = m.group(1).decode(errors="replace").strip()
                    out.device, look_device = (None if name == "Host" else name), False
            if out.tensorboard_dir is None:
                i = buf.find(_TB_DIR, start, cut)
                if i >= 0:
                    e = buf.find(b"'", i + len(_TB_DIR), cut)
                    if e > 0:
                        out.tensorboard_dir = bytes(buf[i + len(_TB_DIR) : e]).decode(errors="replace")
            if look_params:
                m = _PARAMS.search(buf, start, cut)
                if m:
                    out.params, look_params = float(round(float(m.group(1)) * 1e9)), False
                    out.params_text = m.group(0).decode()
            rows = _ANY_STEP.findall(buf, start, cut)
            if rows and out.hosts:
                look_params = False  # printed before training: a block after the first steps cannot hold it
            if rows:
                by_host: dict[bytes, list] = {}
                for r in rows:
                    by_host.setdefault(r[0], []).append(r)
                for hb, hrows in by_host.items():
                    host = hb.decode(errors="replace") if hb else None
                    if host in NOT_HOSTS:
                        continue
                    st = out.hosts.get(host)
                    if st is None:
                        st = out.hosts[host] = Steps(host=host, clock=clock)
                    _add_rows(st, *list(zip(*hrows, strict=True))[1:])
            read += cut
            rest = n - cut - 1
            if rest > 0:
                buf[1 : 1 + rest] = buf[cut + 1 : n]
            n = 1 + max(rest, 0)
    out.seconds = time.perf_counter() - t0
    return out


# --- following a log as it grows (utils/job_monitor.py) ----------------------------------------
# MaxText 0.2.5's checkpoint and eval lines (absl INFO; common/checkpointing.py print_save_message,
# trainers/pre_train/train.py): a step that saved or evaluated is slow by design.
#   Started an asynchronous checkpoint save for step 100      (async_checkpointing: true)
#   Saved a checkpoint at step 100.                           (synchronous)
#   Starting eval after train step 200
_PAUSE = re.compile(
    rb"(Started an asynchronous checkpoint save for step|Saved a checkpoint at step"
    rb"|Starting eval after train step) (\d+)"
)
_FOLLOW_STEP = re.compile(
    rb"^(?:(" + HOST_RE + rb"): )?(?:[IWEF](\d{4} \d\d:\d\d:\d\d\.\d+) +\d+ [^\]\n]*\] )?" + STEP.pattern
)
_FOLLOW_BLOCK = 1 << 20  # bytes per read of a growing log


@dataclasses.dataclass
class Tick:
    """One line of interest in the new part of a growing log: kind "step" (host, step, seconds,
    tokens = Tokens/s/device or None in ramp-up, loss), "save" or "eval" (step: the train step it
    follows), "header" (a new run of the job starts: a requeue), "summary" (the JOB SUMMARY
    began: the job is ending), "run_next" (a continuing run's line; text: after "run_next: ") or "alert"
    (an alert line, `alert` parses its text, after "alert: "; host: the node that printed it).
    ts: the absl stamp in epoch seconds, None without one."""

    kind: str
    host: str | None = None
    step: int | None = None
    seconds: float | None = None
    tokens: float | None = None
    loss: float | None = None
    ts: float | None = None
    text: str | None = None


class Follower:
    """Reads what was appended to a job log since the last call, whole lines only, and returns the
    Ticks in it; `offset` (bytes consumed) can be saved and given back to resume after a restart.
    Lines are read in blocks of 1 MiB; a line longer than that is skipped. `opener` opens the log
    (default: by its path); the job monitor passes one that opens only a log it may trust."""

    def __init__(self, path: str | Path, offset: int = 0, opener: Callable[[Path], BinaryIO] | None = None) -> None:
        self.path, self.offset = Path(path), offset
        self.opener = opener or (lambda p: p.open("rb"))
        self.clock: AbslClock | None = None

    def read(self, max_bytes: int = 64 << 20) -> list[Tick]:
        out: list[Tick] = []
        try:
            f = self.opener(self.path)
        except OSError:
            return out
        with f:
            size = os.fstat(f.fileno()).st_size
            if size < self.offset:  # truncated or replaced: start over
                self.offset = 0
            f.seek(self.offset)
            budget = max_bytes
            while budget > 0:
                buf = f.read(min(_FOLLOW_BLOCK, budget))
                if not buf:
                    break
                cut = buf.rfind(b"\n")
                if cut < 0:
                    if len(buf) < _FOLLOW_BLOCK:
                        break  # a partial last line: wait for the rest
                    cut = len(buf) - 1  # a giant line: skip this block of it
                self._lines(buf[: cut + 1], out)
                self.offset += cut + 1
                budget -= cut + 1
                f.seek(self.offset)
        return out

    def _stamp(self, stamp: bytes | None) -> float | None:
        if not stamp:
            return None
        if self.clock is None:
            self.clock = AbslClock.for_scan("", time.time())
        return self.clock.epoch(stamp)

    def _lines(self, buf: bytes, out: list[Tick]) -> None:
        for line in buf.splitlines():
            if b"completed step: " in line:
                m = _FOLLOW_STEP.match(line)
                if m:
                    host = m.group(1).decode() if m.group(1) else None
                    if host in NOT_HOSTS:
                        continue
                    tok, loss = m.group(7), m.group(8)
                    out.append(
                        Tick(
                            "step",
                            host,
                            int(m.group(4)),
                            float(m.group(5)),
                            float(tok) if tok and not m.group(3) else None,
                            float(loss) if loss else None,
                            self._stamp(m.group(2)),
                        )
                    )
                continue
            m = _PAUSE.search(line)
            if m:
                kind = "eval" if m.group(1).startswith(b"Starting eval") else "save"
                out.append(Tick(kind, step=int(m.group(2))))
            elif line == _HEADER_OPEN[1:-1]:
                out.append(Tick("header"))
                self.clock = None
            elif line.startswith(b"=" * 20 + b" JOB SUMMARY "):
                out.append(Tick("summary"))
            elif line.startswith(_RUN_NEXT_TEXT):
                out.append(Tick("run_next", text=line[len(_RUN_NEXT_TEXT) :][:1000].decode(errors="replace")))
            elif line.find(_ALERT_TEXT, 0, 80) >= 0:  # no copy of the line (this runs for most lines)
                head, _, rest = line.partition(_ALERT_TEXT)
                if not head or (head.endswith(b": ") and b" " not in head[:-2]):  # "alert: " or "<node>: alert: "
                    out.append(Tick("alert", host=head[:-2].decode(errors="replace") or None,
                                    text=rest[:2000].decode(errors="replace")))  # fmt: skip
            elif self.clock is None and line.startswith(b"started: "):
                self.clock = AbslClock.for_scan(line[9:].decode(errors="replace"), time.time())


def main(argv: list[str] | None = None) -> int:
    """`joblog.py steps LOG`: print the JOB SUMMARY's `steps:` value of LOG (utils/launch/job_summary.sh
    runs it with whatever Python 3.11+ the host has: this module needs only the standard library)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "steps":
        print("Usage: joblog.py steps LOG", file=sys.stderr)
        return 2
    try:
        print(steps_seen(scan(args[1])))
    except (OSError, NotALog) as e:
        print(f"joblog.py: cannot read {args[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
