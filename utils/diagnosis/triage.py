"""Usage: triage.py JOB [--json] [--workspace DIR] [options]

Takes a MaxText job from symptom to root cause: reads its log once (fast, also while the job
runs), its job directory (.stages records, artifact) and, for a Slurm job whose log has no
JOB SUMMARY yet, scontrol; prints the status, the failure class, the culprit host(s) with the
log lines that prove it, progress, throughput phases and what to do next.
JOB is a job id or a job name (<id>-JAX-<model>[-<tag>], looked up in --workspace), a job
directory or a log file; an id that two jobs share is an error that lists their names.
--json prints the report for programs (schema: docs/triage.md). Exit 0 when the job could be
triaged, 2 on bad input (no such job, not a job log).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import statistics
import time
from pathlib import Path

import joblog
from diagnosis import cli, jobdir, locate, scheduler
from diagnosis import failure_classes as fc
from diagnosis.phases import segments as level_segments

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "triage/1"  # the JSON report's "schema" (docs/triage.md); bumped when a field changes meaning
CLASSES = fc.CLASSES
RUNNING_STATES = {"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT"}


@dataclasses.dataclass
class Options:
    now: float | None = None
    hang_factor: float = 10.0
    hang_min_seconds: float = 120.0
    warmup_steps: int = joblog.WARMUP_STEPS
    phase_min_steps: int = 20
    phase_threshold: float = 0.10
    scheduler: bool = True


# --- numbers ------------------------------------------------------------------------------
def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def throughput_phases(steps: list[int], rates: list[float], min_steps: int, rel: float) -> list[dict]:
    """[{start_step, end_step, mean}] of the per-step rate; long series are first reduced to at most
    4000 bucket medians (so one slow step never makes a phase and the search stays fast)."""
    n = len(rates)
    if not n:
        return []
    k = max(1, math.ceil(n / 4000))
    pts = [statistics.median(rates[i : i + k]) for i in range(0, n, k)]
    segs = level_segments(pts, max(2, math.ceil(min_steps / k)), rel)
    out = []
    for a, b in segs:
        lo, hi = a * k, min(b * k, n)
        out.append(
            {"start_step": steps[lo], "end_step": steps[hi - 1], "mean": round(statistics.fmean(rates[lo:hi]), 3)}
        )
    return out


# --- the analysis -------------------------------------------------------------------------
@dataclasses.dataclass
class Host:
    name: str
    rank: int | None
    last_step: int | None = None
    last_step_ts: float | None = None
    last_step_line: int | None = None
    last_ts: float | None = None
    exit: int | None = None
    reason: str | None = None  # exit | timeout | stopped (stage record) or exit (srun / summary)
    end: float | None = None
    record: str | None = None
    events: list[joblog.Event] = dataclasses.field(default_factory=list)

    def first(self, *kinds: str) -> joblog.Event | None:
        """The first event of these kinds, preferring lines the host printed itself over lines
        attributed to it (unprefixed notices of a one-node job)."""
        ranked = sorted(
            (e for e in self.events if e.kind in kinds),
            key=lambda e: (e.host is None, joblog.is_job_control(e.text), e.line),
        )
        return ranked[0] if ranked else None


def message(e: joblog.Event | None) -> str:
    """An event's text without the absl prefix, for one-line summaries."""
    if not e:
        return ""
    text = joblog.strip_absl(e.text).strip()[:200]
    detail = e.data.get("detail")
    return f"{text} ({detail})" if detail else text


def iso(ts: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts is not None else None


class Triage:
    def __init__(self, log: Path, job_dir: Path | None, opts: Options) -> None:
        self.log, self.opts = log, opts
        self.scan, self.job_dir = locate.read_log(log, job_dir)
        s = self.scan
        self.now = opts.now if opts.now is not None else time.time()
        self.notes: list[str] = []
        self.evidence: list[dict] = []
        self.records = joblog.read_records(self.job_dir) if self.job_dir else {}
        self.stage = s.summary.get("stage") or (list(self.records)[-1] if self.records else None)
        self.job_id, self.job_name = locate.job_id_and_name(s, log)
        self.sched = None
        self.accused_hosts: list[str] = []  # the hosts a heartbeat claim named (failure_classes.on_job_heartbeat)
        self.suspect_hosts: list[str] = []  # where to look after a heartbeat claim
        if opts.scheduler and not s.summary and s.header.get("scheduler") == "slurm":
            self.sched = scheduler.slurm_state(self.job_id, timeout=5)
        self.hosts = self._hosts()

    # hosts ------------------------------------------------------------------------------
    def _hosts(self) -> dict[str, Host]:
        s = self.scan
        nodes = s.nodes()
        seen = [h for h in s.hosts if h is not None and h not in nodes]
        hosts = {h: Host(h, i) for i, h in enumerate(nodes)}
        for h in seen:
            hosts[h] = Host(h, None)
        single = nodes[0] if len(nodes) == 1 else None
        for key, hs in s.hosts.items():
            name = key if key is not None else single
            if name is None:
                continue
            h = hosts.setdefault(name, Host(name, None))
            h.last_step, h.last_step_ts, h.last_step_line = hs.last_step, hs.last_step_ts, hs.last_step_line
            h.last_ts = hs.last_ts
        for e in s.events:
            name = e.host if e.host is not None else single
            if name in hosts:
                hosts[name].events.append(e)
        failed = joblog.parse_failed_nodes(s.summary.get("failed_nodes", ""))
        for e in s.events:
            if e.kind == "srun_exit" and e.host in hosts and e.data.get("exit") is not None:
                hosts[e.host].exit, hosts[e.host].reason = e.data["exit"], "exit"
        for name, (rc, why) in failed.items():
            if name in hosts:
                hosts[name].exit, hosts[name].reason = rc, why
        for name, rec in self.records.get(self.stage or "", {}).items():
            h = hosts.setdefault(name, Host(name, None))
            h.exit, h.reason, h.end, h.record = rec["rc"], rec["reason"], rec["end"], rec["file"]
        return hosts

    # status -----------------------------------------------------------------------------
    def status(self) -> str:
        s = self.scan
        st = s.summary.get("status")
        if st:
            return {
                "completed": "completed",
                "cancelled": "cancelled",
                "failed": "failed",
                "stage_timeout": "failed",
                "timeout": "failed",
            }.get(st, "unknown")
        if self.sched == scheduler.GONE:  # it ended long ago, without writing its summary
            self.notes.append(f"Slurm no longer knows job {self.job_id} and the log has no JOB SUMMARY")
            return "unknown"
        if self.sched:
            if self.sched in RUNNING_STATES:
                return "running"
            self.notes.append(f"Slurm says the job ended ({self.sched}) but the log has no JOB SUMMARY")
            return {"COMPLETED": "completed", "CANCELLED": "cancelled"}.get(self.sched, "failed")
        if self.job_dir is None:
            self.notes.append("no job directory and no JOB SUMMARY: cannot tell whether the job still runs")
            return "unknown"
        recs = self.records.get(self.stage or "", {})
        nodes = s.nodes()
        if not self.records or (nodes and len(recs) < len(nodes)) or self.stage != "train":
            return "running"
        self.notes.append("every node has an exit record but the log has no JOB SUMMARY yet")
        return "failed" if any(r["rc"] != 0 for r in recs.values()) else "completed"

    # steps, progress, throughput --------------------------------------------------------
    def throughput(self) -> tuple[dict, list[int]]:
        st = self.scan.steps
        rows, skipped = st.steady_rows(self.opts.warmup_steps)
        rates = [st.tokens[i] for i in rows if st.tokens[i] is not None]
        steps = [st.step[i] for i in rows if st.tokens[i] is not None]
        tgs = {
            "steady": round(statistics.median(rates), 3) if rates else None,
            "warmup_steps_excluded": skipped,
            "phases": throughput_phases(steps, rates, self.opts.phase_min_steps, self.opts.phase_threshold),
            "host": st.host,
        }
        return tgs, rows

    def step_period(self, rows: list[int]) -> float | None:
        st = self.scan.steps
        recent = rows[-1000:]  # the current step period; also bounds the work on huge logs
        ts = [(st.step[i], t) for i in recent for t in [st.ts(i)] if t is not None]
        diffs = [(t2 - t1) / (s2 - s1) for (s1, t1), (s2, t2) in zip(ts, ts[1:], strict=False) if s2 > s1]
        if diffs:
            return statistics.median(diffs)
        return median([st.seconds[i] for i in recent])

    def progress(self, status: str, tgs: dict, rows: list[int]) -> dict:
        st = self.scan.steps
        last = max([h.last_step for h in self.hosts.values() if h.last_step is not None] + st.step[-1:], default=None)
        total = self.total_steps()
        rate = None
        ts_rows = [i for i in rows if st.stamp[i]]
        if tgs["phases"]:
            start = tgs["phases"][-1]["start_step"]
            ts_rows = [i for i in ts_rows if st.step[i] >= start] or ts_rows
        pts = [(st.step[i], t) for i in ts_rows[-5000:] for t in [st.ts(i)] if t is not None]
        gaps = [((t2 - t1), s2 - s1) for (s1, t1), (s2, t2) in zip(pts, pts[1:], strict=False) if s2 > s1]
        if gaps:
            # mean step period over the current phase, stalls (> 10 x the median) left out:
            # periodic checkpoints and evals still count, a hang or a restart does not
            typical = statistics.median(dt / ds for dt, ds in gaps)
            kept = [(dt, ds) for dt, ds in gaps if dt / ds <= 10 * typical] or gaps
            rate = sum(ds for _, ds in kept) / sum(dt for dt, _ in kept) if sum(dt for dt, _ in kept) > 0 else None
        elif rows:
            per = median([st.seconds[i] for i in rows])
            rate = 1 / per if per else None
        eta = None
        if status == "completed":
            eta = 0.0
        elif status == "running" and rate and total is not None and last is not None:
            eta = max(0.0, (total - (last + 1)) / rate)
        last_ts = self.last_step_time()
        return {
            "last_step": last,
            "total_steps": total,
            "steps_per_sec": round(rate, 4) if rate else None,
            "eta_seconds": round(eta, 1) if eta is not None else None,
            "last_step_time": iso(last_ts),
            "last_step_age_seconds": round(self.now - last_ts, 1) if last_ts is not None else None,
        }

    def last_step_time(self) -> float | None:
        times = [h.last_step_ts for h in self.hosts.values() if h.last_step_ts is not None]
        st = self.scan.steps
        if st.step and st.ts(len(st.step) - 1) is not None:
            times.append(st.ts(len(st.step) - 1))
        if times:
            return max(times)
        if self.scan.steps.step:  # steps without absl stamps: the log's mtime is the best we have
            return self.scan.mtime
        return None

    def total_steps(self) -> int | None:
        return jobdir.planned_steps(self.scan.header, self.job_dir)

    # evidence helpers -------------------------------------------------------------------
    def cite(self, line: int | None, text: str, why: str, host: str | None = None, file: str | None = None) -> None:
        if line is None:
            return
        item = {"file": file or str(self.log), "line": line, "text": text[:400], "host": host, "why": why}
        if not any(e["file"] == item["file"] and e["line"] == line for e in self.evidence):
            self.evidence.append(item)

    def cite_event(self, e: joblog.Event | None, why: str) -> None:
        if e is not None:
            self.cite(e.line, e.raw or e.text, why, e.host)

    def cite_record(self, h: Host, why: str) -> None:
        if h.record:
            self.cite(1, f"rc={h.exit} end={h.end:.3f} reason={h.reason}", why, h.name, h.record)

    def cite_image_record(self, h: Host) -> None:
        """The node's image record ($JOB_DIR/.images/<host>, written by utils/launch/image.sh)."""
        f = self.job_dir / ".images" / h.name if self.job_dir else None
        if f and f.is_file():
            self.cite(1, f.read_text(errors="replace").strip()[:400], "image record", h.name, str(f))

    def cite_summary(self, key: str, why: str) -> None:
        line = self.scan.summary_lines.get(key)
        if line:
            self.cite(line, f"{key}: {self.scan.summary[key]}", why)

    def cite_last_step(self, h: Host, why: str) -> None:
        text = self.scan.hosts.get(h.name, self.scan.hosts.get(None, joblog.HostSeen())).last_step_text
        if h.last_step_line:
            self.cite(h.last_step_line, text or f"{h.name}: completed step: {h.last_step}", why, h.name)

    # root causes per host ---------------------------------------------------------------
    def root_of(self, h: Host) -> tuple[str, joblog.Event | None] | None:
        """The host's own failure (not a consequence of another host's): the registry's per-host
        root cause of highest priority, and the event that shows it (None: only its exit record)."""
        for c in fc.ROOT_CAUSES:
            found, e = c.on_host(h)
            if found:
                return c.name, e
        return None

    def fail_time(self, h: Host, e: joblog.Event | None) -> tuple[float, float]:
        """Sort key: (when it failed, where in the log); unknown times sort last."""
        t = h.end if (h.end is not None and h.reason != "stopped") else (e.ts if e and e.ts else None)
        return (t if t is not None else math.inf, e.line if e else math.inf)

    # classification ---------------------------------------------------------------------
    def classify(self, status: str) -> tuple[str | None, list[str], str, str | None]:
        """(failure_class, culprits, one-line summary, confidence), in docs/triage.md's order: a
        config error anywhere, the first host's root cause, then the registry's job-level rules."""
        hosts = list(self.hosts.values())
        roots = [(h, *r) for h in hosts for r in [self.root_of(h)] if r]
        # a config error anywhere is the cause, whatever else happened
        cfg = [(h, k, e) for h, k, e in roots if k == "config_error"]
        if cfg:
            h, _, e = min(cfg, key=lambda r: self.fail_time(r[0], r[2]))
            self.cite_event(e, "configuration rejected")
            self.cite_event(next((x for x in h.events if x.kind == "exception"), None), "the exception")
            return "config_error", [h.name], fc.explain("config_error", host=h.name, detail=f": {message(e)}"), "high"
        # MaxText stopped because the loss is not a number: the job's own fault, whatever exited first
        nan = [(h, e) for h, k, e in roots if k == "nan_loss"]
        if nan:
            return self.explain_nan_loss(*min(nan, key=lambda r: r[1].line if r[1] else math.inf))
        # a heartbeat claim is cited even when a host's root cause decides: it happened on the way
        first_rule, *rules = fc.JOB_RULES
        hb = first_rule(self, status)
        if roots:
            h, kind, e = min(roots, key=lambda r: self.fail_time(r[0], r[2]))
            if kind == "gpu_health":  # a node check: every node that failed it is a culprit
                return self.explain_gpu_health([x for x, k, _ in roots if k == kind], e)
            return self.explain_root(h, kind, e)
        if hb:
            return hb
        for rule in rules:
            verdict = rule(self, status)
            if verdict:
                return verdict
        return self.unclassified(status)

    def unclassified(self, status: str) -> tuple[str | None, list[str], str, str | None]:
        """Failures outside the classes: the image stage or the nodes' images, a preflight check, or an exit
        code with no known text."""
        hosts = list(self.hosts.values())
        busy = next((e for e in self.scan.events if e.kind == "run_busy"), None)
        if busy:  # refused before its first stage: another job holds the run (--run)
            self.cite_event(busy, "another job holds the run: this one did not start")
            return None, [], f"not started: {message(busy)}", "high"
        # a node check that failed on some nodes: the image stage (utils/launch/image.sh), preflight
        for kind, what in (("image", "image stage"), ("preflight", "preflight")):
            failed = [h for h in hosts if h.first(kind)]
            if failed:
                for h in failed:
                    self.cite_event(h.first(kind), f"{what} check failed")
                names = ", ".join(h.name for h in failed)
                return (
                    None,
                    [h.name for h in failed],
                    f"{what} failed on {names}: {message(failed[0].first(kind))}",
                    "high",
                )
        agree = next((e for e in self.scan.events if e.kind == "image" and e.host is None), None)
        if agree:  # image.sh --agree after the image stage: the nodes do not all have one runtime and image
            odd = [h for h in hosts if h.first("image_odd")]
            self.cite_event(agree, "the nodes' images differ")
            for h in odd:
                self.cite_event(h.first("image_odd"), "this node's image")
                self.cite_image_record(h)
            return None, [h.name for h in odd], f"the image check stopped the job: {message(agree)}", "high"
        if status == "failed":
            bad = [h for h in hosts if h.exit not in (None, 0) and h.reason != "stopped"]
            self.cite_summary("first_error", "the launcher's guess at the first error")
            if bad:
                h = min(bad, key=lambda x: self.fail_time(x, None))
                self.cite_record(h, "exit record")
                return None, [h.name], f"{h.name} exited with code {h.exit}; no known error signature in the log", "low"
            return None, [], "the job failed but the log names no cause", "low"
        return None, [], "", None

    def explain_nan_loss(self, h: Host, e: joblog.Event | None) -> tuple:
        """The loss became nan/inf and MaxText aborted: the first such step and the loss before it;
        no culprit (every host computes the same loss)."""
        self.cite_event(e, "MaxText stopped: the loss is not a number")
        what = e.data.get("what", "NaN") if e else "NaN"
        flag = f"abort_on_{what.lower()}_loss"
        st = self.scan.steps
        i = st.diverged_at()
        if i is None:
            return "nan_loss", [], fc.explain("nan_loss", "no_step", what=what, flag=flag), "high"
        before = next((j for j in range(i - 1, -1, -1) if st.loss[j] is not None), None)
        after = f" (loss {st.loss[before]:g} at step {st.step[before]})" if before is not None else ""
        if h.last_step == st.step[i]:  # MaxText aborts right after it logs that step: the host's last step line
            self.cite_last_step(h, "the first step whose loss is not a number")
        return "nan_loss", [], fc.explain("nan_loss", what=what, step=st.step[i], after=after, flag=flag), "high"

    def explain_gpu_health(self, bad: list[Host], e: joblog.Event | None) -> tuple:
        """The preflight GPU check failed on these hosts (in node order): each one's first bad line."""
        for x in bad:
            self.cite_event(x.first("gpu_health"), "GPU health check failed on this node")
            self.cite_record(x, "exit record of the node's preflight")
        self.cite_summary("resubmit", "the command that leaves the bad nodes out")
        names = [x.name for x in bad]
        return "gpu_health", names, fc.explain("gpu_health", hosts=", ".join(names), detail=message(e)), "high"

    def explain_root(self, h: Host, kind: str, e: joblog.Event | None) -> tuple:
        """The verdict for the host whose root cause came first: its evidence and the registry's summary."""
        if kind == "stage_timeout":
            self.cite_event(e, "stage time limit")
            self.cite_record(h, "exit record")
            last = self.last_step_time()
            extra = (
                f"; the last step was {h.end - last:.0f} s before the limit hit" if last is not None and h.end else ""
            )
            return "stage_timeout", self.laggards(), fc.explain(kind, stage=self.stage, extra=extra), "high"
        if kind != "killed":
            self.cite_event(e, "the first error on the culprit")
        self.cite_record(h, "exit record of the first node that failed")
        if kind == "python_exception":
            self.cite_event(next((x for x in h.events if x.kind == "exception"), None), "the exception")
        self.cite_last_step(h, "the culprit's last step")
        self.cite_summary("first_failure", "first node to fail (job summary)")
        for x in self.hosts.values():
            c = (x.first("collective") or fc.first_exception(x, "collective")) if x is not h else None
            if c:
                self.cite_event(c, "a survivor's collective error (consequence)")
                break
        if kind == "killed":
            self.cite_event(
                h.first("killed") or next((x for x in self.scan.events if x.kind == "killed"), None),
                "bash: the stage's process was killed",
            )
            return fc.reported(kind), [h.name], fc.explain(kind, host=h.name), "low"
        detail = f": {message(e)}" if e else ""
        code = f" (exit {h.exit})" if h.exit else ""
        return kind, [h.name], fc.explain(kind, host=h.name, detail=detail, exit=code), "high" if e else "medium"

    def cite_hang(self, newest: str) -> list[str]:
        """A hang's evidence: the last step line of each host behind the others (returned) and the
        newest step line of all (its note NEWEST)."""
        culprits = self.laggards()
        for n in culprits:
            self.cite_last_step(self.hosts[n], "this host is behind the others")
        best = max(self.hosts.values(), key=lambda h: h.last_step_ts or 0, default=None)
        if best:
            self.cite_last_step(best, newest)
        return culprits

    def laggards(self) -> list[str]:
        steps = {h.name: h.last_step for h in self.hosts.values() if h.last_step is not None}
        if len(steps) < 2 or len(set(steps.values())) < 2:
            return []
        low = min(steps.values())
        return [n for n, v in steps.items() if v == low]

    # hang ---------------------------------------------------------------------------------
    def hang_check(self, rows: list[int]) -> dict | None:
        period = self.step_period(rows)
        last = self.last_step_time()
        if last is None:
            return None
        threshold = max(self.opts.hang_factor * (period or 0), self.opts.hang_min_seconds)
        age = self.now - last
        return {
            "threshold_seconds": round(threshold, 1),
            "last_step_age_seconds": round(age, 1),
            "median_step_seconds": round(period, 4) if period else None,
            "hung": age > threshold,
        }

    def hang_before_end(self, rows: list[int]) -> dict | None:
        """For a job that was cancelled or timed out: had it stopped stepping long before it ended?
        The end is the newest stage record (written when each node's stage ended)."""
        ends = [h.end for h in self.hosts.values() if h.end is not None]
        last, period = self.last_step_time(), self.step_period(rows)
        if not ends or last is None or not self.scan.steps.stamp or not any(self.scan.steps.stamp):
            return None
        threshold = max(self.opts.hang_factor * (period or 0), self.opts.hang_min_seconds)
        gap = max(ends) - last
        if gap <= threshold:
            return None
        return {
            "threshold_seconds": round(threshold, 1),
            "last_step_age_seconds": round(gap, 1),
            "median_step_seconds": round(period, 4) if period else None,
            "hung": True,
            "before_end": True,
        }

    # next steps ---------------------------------------------------------------------------
    def metrics_step(self, cls: str | None, status: str, phases: int) -> list[str]:
        """Where the log ends and the metrics begin: a throughput change, a hang or a heartbeat claim."""
        why = (
            "throughput changed during the run"
            if phases > 1
            else fc.BY_NAME["hang"].metrics_why
            if status == "hung"
            else fc.BY_NAME[cls].metrics_why
            if cls
            else ""
        )
        if not why or not self.job_dir:
            return []
        if (self.job_dir / "prometheus").is_dir():
            return [
                f"{shlex.quote(str(REPO / 'utils' / 'diagnose.py'))} {shlex.quote(str(self.job_dir))}"
                f"   # {why}: what the metrics say (GPU, network, host)"
            ]
        return [f"{why}, but the job saved no metrics: rerun it with RAY=1 to see GPU, network and host metrics"]

    def next_steps(self, cls: str | None, culprits: list[str], status: str, phases: int = 1) -> list[str]:
        """The culprit's last lines, the class's own steps (registry), the metrics, triage again."""
        log = shlex.quote(str(self.log))
        out: list[str] = []
        if culprits:
            out.append(f"grep -a -n '^{culprits[0]}: ' {log} | tail -40   # what {culprits[0]} printed last")
        if cls:
            job = fc.Job(
                log=log,
                job_id=self.job_id,
                scheduler=self.scan.header.get("scheduler"),
                status=status,
                culprits=culprits,
                command=self.command(),
                resubmit=self.scan.summary.get("resubmit"),
                job_dir=self.job_dir,
                coordinator=(self.scan.nodes() or ["the coordinator"])[0],
            )
            out += fc.BY_NAME[cls].next_steps(job)
        out += self.metrics_step(cls, status, phases)
        if status in ("running", "hung"):
            out.append(f"tail -F {log}")
        again = f"{shlex.quote(str(REPO / 'utils' / 'triage.py'))} {shlex.quote(str(self.log))} --json"
        out.append(f"{again}   # triage again")  # the log: an id may be ambiguous or in another workspace
        return out

    def command(self) -> str | None:
        if not self.job_dir:
            return None
        try:
            return (self.job_dir / "artifact" / ".submit" / "command.txt").read_text(errors="replace").strip() or None
        except OSError:
            return None

    # report -------------------------------------------------------------------------------
    def report(self) -> dict:
        s = self.scan
        status = self.status()
        tgs, rows = self.throughput()
        hang = None
        if status == "running":
            hang = self.hang_check(rows)
            if hang and hang["hung"]:
                status = "hung"
        prog = self.progress(status, tgs, rows)
        cls, culprits, summary, conf = (None, [], "", None)
        if status in ("failed", "cancelled", "unknown", "running", "hung"):
            cls, culprits, summary, conf = self.classify(status)
            if status in ("running", "unknown") and cls is None:
                summary = ""
        if status == "hung" and cls is None:
            culprits = self.cite_hang("the newest step line in the log")
            cls, conf = "hang", "medium" if culprits else "low"
            summary = fc.explain(
                "hang",
                "running",
                age=hang["last_step_age_seconds"],
                threshold=hang["threshold_seconds"],
                behind=f"; {', '.join(culprits)} is behind the others" if culprits else "",
            )
        if cls in ("cancelled", "stage_timeout") and status in ("cancelled", "failed"):
            pre = self.hang_before_end(rows)
            if pre:  # the cancel or the time limit only ended a job that had hung: the hang is the cause
                hang, ended = pre, "cancelled" if cls == "cancelled" else "timed out"
                before, self.evidence = self.evidence, []
                culprits = self.cite_hang("the newest step line: nothing after it until the end")
                self.evidence += [e for e in before if e not in self.evidence]
                cls, conf = "hang", "medium" if culprits else "low"
                summary = fc.explain(
                    "hang",
                    "before_end",
                    age=pre["last_step_age_seconds"],
                    threshold=pre["threshold_seconds"],
                    ended=ended,
                    stop="cancel" if ended == "cancelled" else "time limit",
                    behind=f"; {', '.join(culprits)} is behind the others" if culprits else "",
                )
        if status == "completed":  # not one step line: never a healthy job (class no_steps)
            verdict = fc.on_job_no_steps(self, status)
            if verdict:
                status = "failed"
                cls, culprits, summary, conf = verdict
                self.notes.append("every node exited 0 (status completed), but no step line reached the log")
        run = joblog.run_of(s)
        if status == "completed" and not summary:
            summary = f"completed {prog['last_step'] + 1 if prog['last_step'] is not None else 0} steps"
            if run and run["restored_from_step"] is not None and prog["last_step"] is not None:
                first = run["restored_from_step"] + 1
                summary += (
                    f" (this job restored the checkpoint of step {first - 1} and ran steps {first}-{prog['last_step']})"
                )
            if s.summary_lines.get("status"):
                self.cite_summary("status", "job summary")
        if status == "running" and not summary:
            summary = f"running: step {prog['last_step']}" if prog["last_step"] is not None else "running: no step yet"
        if s.runs > 1:
            self.notes.append(f"the log holds {s.runs} runs (requeued); this report is about the last one")
        # scope (evidence.SCOPES): a class that blames every node of a multi-node job blames none of them
        # (the job itself or what they share): affected_hosts lists them, culprit_hosts is empty
        affected = list(culprits)
        fleet = len(self.hosts) > 1 and set(self.hosts) <= set(culprits)
        scope = None if cls is None else "fleet" if fleet or not culprits else "hosts"
        culprits = [] if fleet else culprits
        hosts = [
            {
                "host": h.name,
                "rank": h.rank,
                "last_step": h.last_step,
                "last_step_time": iso(h.last_step_ts),
                "exit_code": h.exit,
                "end_reason": h.reason,
            }
            for h in self.hosts.values()
        ]
        return {
            "schema": SCHEMA,
            "job_id": self.job_id,
            "job_name": self.job_name,
            "log": str(self.log),
            "job_dir": str(self.job_dir) if self.job_dir else None,
            "scheduler": s.header.get("scheduler"),
            "scheduler_state": self.sched,
            "status": status,
            "failure_class": cls,
            "scope": scope,
            "culprit_hosts": culprits,
            "affected_hosts": affected,
            "accused_hosts": self.accused_hosts,
            "suspect_hosts": self.suspect_hosts,
            "confidence": conf,
            "summary": summary,
            "evidence": self.evidence,
            "progress": prog,
            "run": run,
            "tgs": {k: v for k, v in tgs.items() if k != "host"},
            "hang": hang,
            "hosts": hosts,
            "next_steps": self.next_steps(cls, culprits, status, len(tgs.get("phases") or [])),
            "notes": self.notes,
            "scan": {
                "bytes": s.size,
                "lines": s.lines,
                "seconds": round(s.seconds, 3),
                "mb_per_s": round(s.size / s.seconds / 1e6, 1) if s.seconds else None,
            },
        }


def triage(job: str, workspace: Path | None = None, opts: Options | None = None) -> dict:
    """The report for JOB (as diagnosis/locate.py finds it) as a dict (see docs/triage.md)."""
    found = locate.find_log(job, workspace)
    return Triage(found.log, found.dir, opts or Options()).report()


def render(r: dict) -> str:
    """The report as text for people."""
    p, t = r["progress"], r["tgs"]
    head = f"job {r['job_id']} ({r['job_name']}): {r['status'].upper()}"
    if r["failure_class"]:
        head += f" - {r['failure_class']}"
        if r["culprit_hosts"]:
            head += f" on {', '.join(r['culprit_hosts'])}"
        head += f" (confidence {r['confidence']})"
    lines = [head]
    if r["summary"]:
        lines.append(f"  {r['summary']}")
    if p["last_step"] is not None:
        prog = f"progress: step {p['last_step']}"
        if p["total_steps"]:
            prog += f" of {p['total_steps']} ({100 * (p['last_step'] + 1) / p['total_steps']:.0f}%)"
        if p["steps_per_sec"]:
            prog += f", {p['steps_per_sec']:.3g} steps/s"
        if p["eta_seconds"]:
            prog += (
                f", eta {p['eta_seconds'] / 3600:.1f} h"
                if p["eta_seconds"] > 5400
                else f", eta {p['eta_seconds']:.0f} s"
            )
        if p["last_step_age_seconds"] is not None and r["status"] in ("running", "hung"):
            prog += f", last step {p['last_step_age_seconds']:.0f} s ago"
        lines.append(prog)
    run = r.get("run")
    if run:
        where = f"{run['alias']} ({run['dir']})" if run["alias"] else "(no run: line in the header)"
        if run["restored_from_step"] is not None:
            lines.append(
                f"run: {where}: restored_from_step {run['restored_from_step']} (log line {run['restore_line']})"
            )
        else:
            lines.append(f"run: {where}: no checkpoint restored, started from step 0")
    if t["steady"] is not None:
        ph = "; ".join(f"steps {x['start_step']}-{x['end_step']}: {x['mean']:.6g}" for x in t["phases"])
        lines.append(
            f"throughput: {t['steady']:.6g} tokens/s/device steady"
            + (f" (phases: {ph})" if len(t["phases"]) > 1 else "")
        )
    if r["evidence"]:
        lines.append("evidence:")
        for e in r["evidence"]:
            where = e["file"] if e["file"] != r["log"] else Path(e["file"]).name
            lines.append(f"  {where}:{e['line']}: {e['text']}")
            lines.append(f"      ({e['why']})")
    for n in r["notes"]:
        lines.append(f"note: {n}")
    if r["next_steps"]:
        lines.append("next steps:")
        lines += [f"  {x}" for x in r["next_steps"]]
    return "\n".join(lines)


NO_SCHEDULER = "the MCP tool never asks Slurm (a job's result depends on its files only)"
# The options of triage.py, declared once: its parser below and the MCP tool `triage` (cli.Option).
OPTIONS = (
    cli.JSON,
    cli.WORKSPACE,
    cli.Option("hang_factor", "hung when no step for FACTOR x the median step time", float, 10.0, ge=1),
    cli.Option(
        "hang_min_seconds",
        "... and for at least this long",
        float,
        120.0,
        ge=0,
        cli_only="not offered over MCP (the hang floor for runs with a short step time)",
    ),
    cli.Option("warmup_steps", "first steps left out of the steady throughput", int, joblog.WARMUP_STEPS, ge=0),
    cli.Option(
        "phase_min_steps",
        "shortest throughput phase in steps",
        int,
        20,
        ge=2,
        cli_only="not offered over MCP (a tuning knob of the phase split)",
    ),
    cli.Option(
        "phase_threshold",
        "relative change that starts a new phase",
        float,
        0.10,
        ge=0,
        note="default 0.10",
        cli_only="not offered over MCP (a tuning knob of the phase split)",
    ),
    cli.Option(
        "now",
        "evaluate as if at this epoch time (reproducible hang checks)",
        float,
        ge=0,
        must="an epoch time (seconds since 1970, 0 or more)",
        cli_only="the MCP tool judges a hang at the time of the call",
    ),
    cli.Option(
        "no_scheduler", "do not ask Slurm (scontrol) about a job without a summary", bool, cli_only=NO_SCHEDULER
    ),
)


def build_parser() -> cli.Parser:
    return cli.tool_parser("triage.py", __doc__, "JOB", "job id, job name, job directory or log file", OPTIONS)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    opts = Options(
        now=a.now,
        hang_factor=a.hang_factor,
        hang_min_seconds=a.hang_min_seconds,
        warmup_steps=a.warmup_steps,
        phase_min_steps=a.phase_min_steps,
        phase_threshold=a.phase_threshold,
        scheduler=not a.no_scheduler,
    )
    try:
        r = triage(a.job, a.workspace, opts)
    except cli.InputError as e:
        return cli.fail("triage.py", e)
    cli.emit(r, a.json, render)
    return cli.OK
