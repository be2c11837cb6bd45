"""The sweep loop: one Job per submit.sh call, the Sweep that submits (at most --max-parallel at a
time), polls, applies the failure policy (policy.py) and the job monitor's hang rule, reads each
result with triage, and keeps the record file up to date.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from diagnosis import triage
from diagnosis.cli import InputError
from diagnosis.scheduler import slurm_state
from monitor.watch import Rules, Watch
from sweep import policy
from sweep.common import (
    ENDED,
    REPO,
    SCHEMA,
    SUBMIT,
    Interrupted,
    check_submit,
    now_iso,
    number,
    quiet_run,
    say,
    strict,
    sweeps_dir,
)
from sweep.slurm import scancel


@dataclasses.dataclass
class Job:
    """One submit.sh call of the sweep and what came of it."""

    label: str
    command: str  # shell-quoted submit.sh command line
    info: dict = dataclasses.field(default_factory=dict)  # kind-specific: value, node, nodes, round
    status: str = "planned"  # planned|submitted|completed|failed|cancelled|timeout|unknown|
    job_id: str | None = None  # submit_failed|skipped|interrupted
    job_name: str | None = None
    log: str | None = None
    job_dir: str | None = None
    submitted_at: str | None = None
    ended_at: str | None = None
    wall_seconds: float | None = None
    slurm_state: str | None = None
    failure_class: str | None = None
    summary: str = ""
    tgs_steady: float | None = None
    final_loss: float | None = None
    last_step: int | None = None
    note: str = ""
    timed_out: bool = False  # cancelled by the sweep at --timeout
    previous_job_ids: list[str] = dataclasses.field(default_factory=list)
    culprit_hosts: list[str] = dataclasses.field(default_factory=list)
    _t0: float | None = dataclasses.field(default=None, repr=False)

    def to_json(self) -> dict:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("info", "_t0")}
        return {"label": self.label, **self.info, **out}

    @classmethod
    def from_json(cls, d: dict) -> Job:
        names = {f.name for f in dataclasses.fields(cls)} - {"info", "_t0"}
        job = cls(**{k: v for k, v in d.items() if k in names})
        job.final_loss, job.tgs_steady = number(job.final_loss), number(job.tgs_steady)
        job.info = {k: v for k, v in d.items() if k not in names}
        return job

    @property
    def measured(self) -> bool:
        return self.status == "completed" and self.tgs_steady is not None


def read_result(job: Job) -> None:
    """Fill the job's outcome from its log and job directory (triage.py / joblog.py)."""
    log = Path(job.log) if job.log else None
    if log is None or not log.is_file():
        job.status = "cancelled" if job.slurm_state == "CANCELLED" else "unknown"
        job.summary = f"no log at {log} (Slurm state {job.slurm_state}): the job never started?"
        return
    job_dir = Path(job.job_dir) if job.job_dir and Path(job.job_dir).is_dir() else None
    try:
        t = triage.Triage(log, job_dir, triage.Options())
        r = t.report()
    except (InputError, OSError, ValueError) as e:
        job.status, job.summary = "unknown", f"cannot read the result: {e}"
        return
    job.status = r["status"] if r["status"] in ENDED else "unknown"
    job.failure_class, job.summary = r["failure_class"], r["summary"]
    job.culprit_hosts = list(r.get("culprit_hosts") or [])
    job.tgs_steady, job.last_step = r["tgs"]["steady"], r["progress"]["last_step"]
    job.final_loss = t.scan.steps.final_loss()


@dataclasses.dataclass
class Options:
    workspace: Path
    timeout: float = 3600.0
    max_parallel: int = 1
    poll: float = 2.0
    dry_run: bool = False


class Sweep:
    """A sweep's jobs, its record file and the loop that submits and waits for them."""

    def __init__(self, kind: str, model: str, params: dict, opts: Options, argv: list[str]) -> None:
        self.kind, self.model, self.params, self.opts, self.argv = kind, model, params, opts, argv
        self.jobs: list[Job] = []
        self.state = "running"
        self.result: dict = {}
        self.record: Path | None = None
        self.started_at = time.time()
        self.stop_requested: int | None = None
        self.decisions: list[dict] = []
        self.stop_reason: str | None = None
        self.watches: dict[str, Watch] = {}  # the job monitor's rules on each running job

    # record ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The record, strict JSON (a nan/inf loss as a string: strict())."""
        rec = {
            "schema": SCHEMA,
            "sweep": self.kind,
            "state": self.state,
            "model": self.model,
            "record": str(self.record) if self.record else None,
            "workspace": str(self.opts.workspace),
            "started_at": now_iso(self.started_at),
            "updated_at": now_iso(time.time()),
            "options": {"timeout": self.opts.timeout, "max_parallel": self.opts.max_parallel, "poll": self.opts.poll},
            "argv": self.argv,
            "params": self.params,
            "jobs": [j.to_json() for j in self.jobs],
            "result": self.result,
            "decisions": self.decisions,
            "stop_reason": self.stop_reason,
            "notes": list(self.params.get("notes", [])),
        }
        return strict(rec)  # type: ignore[return-value]

    def open_record(self) -> None:
        folder = sweeps_dir(self.opts.workspace)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.started_at))
        for n in range(1, 1000):
            path = folder / f"{stamp}{'' if n == 1 else f'-{n}'}-{self.kind}.json"
            try:
                path.open("x").close()
            except FileExistsError:
                continue
            self.record = path
            self.save()
            return
        raise OSError(f"cannot create a record in {folder}")

    def save(self) -> None:
        if self.record is None:
            return
        tmp = self.record.with_name(self.record.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, self.record)

    # planning ----------------------------------------------------------------------------
    def plan(self, label: str, argv: list[str], **info: object) -> Job:
        """The job with this label: the one already in the record (resume) or a new one."""
        for j in self.jobs:
            if j.label == label:
                return j
        job = Job(label=label, command=shlex.join(argv), info=dict(info))
        self.jobs.append(job)
        return job

    # the loop ----------------------------------------------------------------------------
    def run(self, jobs: list[Job], after: Callable[[Job], None] | None = None) -> None:
        """Submit the planned jobs (at most max_parallel at a time) and wait until all ended.
        after(job) is called for each job that ended (also for ones that had ended before a resume)."""
        for j in jobs:
            if j.status in ENDED and after:
                after(j)
        queue = [j for j in jobs if j.status == "planned"]
        active = [j for j in jobs if j.status == "submitted"]
        while queue or active:
            self.check_stop()
            while queue and len(active) < self.opts.max_parallel:
                job = queue.pop(0)
                if job.status != "planned":
                    continue  # skipped meanwhile
                self.submit(job)
                if job.status == "submitted":
                    active.append(job)
                elif after:
                    after(job)
                self.check_stop()
            for job in list(active):
                if self.poll(job):
                    active.remove(job)
                    self.finish(job)
                    if after:
                        after(job)
                    retry = self.apply_policy(job)
                    if retry is not None:
                        queue.append(retry)
                    if self.stop_reason:
                        self.cancel_active(self.stop_reason)
                        return
            if queue or active:
                self.sleep(self.opts.poll)

    def apply_policy(self, job: Job) -> Job | None:
        """The failure policy (policy.decide) on an ended job: record the decision with its
        evidence; returns the retry to queue, if any; sets stop_reason to stop the sweep."""
        if job.status == "completed" or job.status not in ENDED:
            return None
        earlier = [
            j.failure_class or j.status
            for j in self.jobs
            if j is not job and j.status in ENDED and j.status != "completed" and not j.info.get("retried_as")
        ]  # a retried job counts once, by its retry
        if any(j.status == "completed" for j in self.jobs):
            earlier = []  # something worked: not the same failure on every job
        d = policy.decide(job.status, job.failure_class, job.culprit_hosts, bool(job.info.get("retry_of")), earlier)
        if not self.policy_retries and d["action"] in (policy.RETRY, policy.EXCLUDE_NODE_RETRY):
            d = {
                "action": policy.MARK_FAILED,
                "reason": f"{self.kind} pins its nodes: the failure is the finding",
            }
        entry = {
            "label": job.label,
            "job_id": job.job_id,
            "status": job.status,
            "failure_class": job.failure_class,
            "culprit_hosts": job.culprit_hosts,
            "evidence": job.summary or job.note,
            **d,
        }
        self.decisions.append(entry)
        say(f"{job.label}: policy: {d['action']} ({d['reason']})")
        retry = None
        if d["action"] == policy.STOP:
            self.stop_reason = f"{job.label}: {d['reason']}"
        elif d["action"] in (policy.RETRY, policy.EXCLUDE_NODE_RETRY):
            argv = shlex.split(job.command)
            if d["action"] == policy.EXCLUDE_NODE_RETRY:
                cut = argv.index("--") if "--" in argv else len(argv)
                argv[cut:cut] = [f"--exclude={job.culprit_hosts[0]}"]
                entry["excluded_node"] = job.culprit_hosts[0]
            retry = Job(label=f"{job.label}-retry", command=shlex.join(argv), info={**job.info, "retry_of": job.label})
            job.info["retried_as"] = retry.label
            self.jobs.append(retry)
        self.save()
        return retry

    policy_retries = True  # nodes/bisect set it False on their sweeps (their failures are findings)

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.check_stop()
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    def check_stop(self) -> None:
        if self.stop_requested is not None:
            raise Interrupted(signal.Signals(self.stop_requested).name)

    def submit(self, job: Job) -> None:
        argv = shlex.split(job.command)
        try:
            check_submit(self.opts.workspace, argv[0] if argv else "")
        except InputError as e:
            job.status, job.note = "submit_failed", str(e)
            say(f"{job.label}: submit refused: {e}")
            self.save()
            return
        env = {**os.environ, "JOB_WORKSPACE": str(self.opts.workspace)}
        if (REPO / ".venv").is_dir():  # a scratch checkout (models --commits) has none: use this one's
            env.setdefault("MAXTEXT_SLURM_VENV", str(REPO / ".venv"))
        try:
            res = quiet_run(argv, timeout=600, env=env)
        except (OSError, subprocess.SubprocessError) as e:
            job.status, job.note = "submit_failed", f"submit.sh did not run: {e}"
            self.save()
            return
        m = re.search(r"^Submitted job (\S+) \((\S+)\) on \d+ node", res.stdout, re.M)
        if res.returncode != 0 or not m:
            lines = (res.stderr.strip() or res.stdout.strip()).splitlines()
            job.status, job.note = "submit_failed", (lines[-1] if lines else f"submit.sh exited {res.returncode}")
            say(f"{job.label}: submit failed: {job.note}")
            self.save()
            return
        job.job_id, name = m.group(1), m.group(2)
        job.job_name = f"{job.job_id}-{name}"
        job.log = field_of(res.stdout, "log") or str(self.opts.workspace / f"{job.job_name}.log")
        job.job_dir = field_of(res.stdout, "job dir") or str(self.opts.workspace / job.job_name)
        job.status, job._t0, job.submitted_at = "submitted", time.time(), now_iso(time.time())
        say(f"{job.label}: submitted job {job.job_id} ({job.command.replace(str(SUBMIT), 'submit.sh', 1)})")
        self.save()

    def poll(self, job: Job) -> bool:
        """True once the job has ended; cancels it when it ran past --timeout."""
        state = slurm_state(job.job_id or "")
        if state is not None:
            job.slurm_state = state
        if state is not None and state not in triage.RUNNING_STATES:
            return True
        if state == "RUNNING" and job.job_dir and not job.timed_out and Path(job.job_dir).is_dir():
            # a hang by the job monitor's rule (no step for max(10 x median step, 45 s)): cancelled
            # now, not at --timeout; the failure policy retries it once
            w = self.watches.get(job.label) or Watch(Path(job.job_dir), Rules())
            self.watches[job.label] = w
            hang = next((ev for ev in w.poll(time.time(), state) if ev.kind == "hang"), None)
            if hang is not None:
                say(f"{job.label}: job {job.job_id}: {hang.title}; cancelling it")
                job.timed_out, job.note = True, f"{hang.title} (the job monitor's hang rule): cancelled by the sweep"
                scancel([job.job_id or ""])
                self.save()
        t0 = job._t0 or self.started_at
        age = time.time() - t0
        if age > self.opts.timeout and not job.timed_out:
            say(f"{job.label}: job {job.job_id} ran past --timeout {self.opts.timeout:g} s; cancelling it")
            job.timed_out, job.note = True, f"ran past --timeout {self.opts.timeout:g} s: cancelled by the sweep"
            scancel([job.job_id or ""])
            self.save()
        return age > self.opts.timeout + 120  # Slurm did not confirm the end: give up on it

    def finish(self, job: Job) -> None:
        job.ended_at = now_iso(time.time())
        job.wall_seconds = round(time.time() - job._t0, 1) if job._t0 else None
        read_result(job)
        if job.timed_out:  # the sweep cancelled it: triage's class would describe the cancel, not the job
            job.status, job.failure_class = "timeout", None
        rate = f", {job.tgs_steady:.6g} tokens/s/device" if job.tgs_steady is not None else ""
        loss = f", loss {job.final_loss:g}" if job.final_loss is not None else ""
        cls = f" ({job.failure_class})" if job.failure_class else ""
        say(f"{job.label}: job {job.job_id} {job.status}{cls}{rate}{loss}")
        self.save()

    def cancel_active(self, why: str) -> list[str]:
        """Cancel the sweep's jobs that have not ended; mark the rest as not run."""
        ids = [j.job_id for j in self.jobs if j.status == "submitted" and j.job_id]
        scancel(ids)
        for j in self.jobs:
            if j.status == "submitted":
                j.status, j.note = "interrupted", f"cancelled by the sweep ({why})"
            elif j.status == "planned":
                j.status, j.note = "skipped", f"not submitted ({why})"
        return ids


def field_of(text: str, name: str) -> str | None:
    """A 'name: value' line of submit.sh's output."""
    m = re.search(rf"^\s*{name}:\s+(\S.*?)\s*$", text, re.M)
    return m.group(1) if m else None
