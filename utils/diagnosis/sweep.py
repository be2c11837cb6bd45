"""Usage: sweep.py KIND [MODEL[:TAG]] [options] [-- SBATCH_FLAG ... [-- KEY=VALUE ...]]

Drives an experiment sweep through submit.sh, waits for its jobs (polling `scontrol show job -o
ID`), reads each result with utils/triage.py (which reads the log through utils/diagnosis/joblog.py) and
reports what the sweep found.

  batch MODEL --values 1,2,4,8   batch-size search, one job per value (tag bs<value>); stops going
                                 up at the first out-of-memory; reports the best value
  nodes MODEL [--nodes all]      the same 1-node job on each node (sbatch -w NODE -N 1): tokens/s
                                 per node, outliers (median absolute deviation), failing nodes
  bisect MODEL --nodes LIST      2-node jobs over disjoint pairs, then each node of a bad pair with
                                 a node of a good one: which node makes multi-node jobs slow or fail
  regress MODEL --baseline JOB   reruns the baseline's MODEL:TAG, node count and MaxText overrides
                                 from the current code and compares steady tokens/s/device and
                                 final loss with it; the baseline's recorded sbatch flags and
                                 _env_ values are shown, and replayed only with --replay-sbatch /
                                 --replay-env (never a <redacted> value)
  models [--commits A,B]         every model (or --models LIST) at its config header's node count,
                                 synthetic data, on one commit or two side by side (a scratch
                                 clone per commit runs its own submit.sh); tokens/s deltas
  resume RECORD                  continues an interrupted sweep from its record
  show RECORD                    prints a record's report again (submits nothing)

After `--`: sbatch flags for every job; MaxText overrides (KEY=VALUE, _env_NAME=VALUE) after a
second `--`, or given directly as KEY=VALUE tokens.
Every sweep writes <workspace>/<user>/sweeps/<UTC time>-<kind>.json (each job's id, command and result),
updated as it goes. Ctrl-C, SIGTERM or SIGHUP cancel the jobs this sweep submitted, and only those.
--json prints the record for programs (docs/sweep.md).
Exit: 0 done; 1 done, but no job produced a measurement, or regress found a regression or its
rerun failed; 2 bad input (nothing submitted); 130 interrupted (its jobs cancelled).
"""

from __future__ import annotations

import argparse
import calendar
import dataclasses
import json
import math
import os
import pwd
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import trust
from diagnosis import cli, locate, sweep_policy, triage
from diagnosis.cli import InputError
from launch import config_header
from monitor.watch import Rules, Watch

REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "submit.sh"


def sweeps_dir(workspace: Path) -> Path:
    """This user's sweep folder, <workspace>/<user>/sweeps (the user's root, docs/security.md#shared-
    workspaces): made ours when missing; InputError (one line) when it, or the root, is someone else's,
    a link or writable by others. Records there are resubmitted by --resume, checkouts there run."""
    root = workspace / pwd.getpwuid(os.geteuid()).pw_name
    try:
        for d in (root, root / "sweeps"):
            trust.own_dir(d)
    except trust.UntrustedPath as e:
        raise InputError(f"{e} (set --workspace to a directory you can write)") from None
    return root / "sweeps"


def check_submit(workspace: Path, argv0: str) -> None:
    """A job's submit.sh runs only from this repository or from a checkout of ours in
    sweeps_dir(): InputError otherwise (a record can name anything)."""
    if argv0 == str(SUBMIT):
        return
    checkouts = workspace / pwd.getpwuid(os.geteuid()).pw_name / "sweeps" / "checkouts"
    path = Path(argv0)
    if path.name != "submit.sh" or path.parent.parent != checkouts:
        raise InputError(f"refusing to run {argv0}: a sweep runs {SUBMIT} or a checkout in {checkouts} only")
    try:
        trust.check_under(workspace, path, "the sweep's checkout")
    except trust.UntrustedPath as e:
        raise InputError(str(e)) from None


PROG = "sweep.py"
SCHEMA = "sweep/1"  # the record's "schema" (docs/sweep.md); records written before it have "version": 1
OOM_CLASSES = ("oom_device", "oom_host")
ENDED = {"completed", "failed", "cancelled", "timeout", "unknown", "submit_failed"}
USABLE_NODE_STATES = {"idle", "alloc", "mix", "comp", "plnd"}
OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")


class Interrupted(Exception):
    """A stop signal arrived while the sweep ran."""


# --- small helpers ----------------------------------------------------------------------------
def now_iso(ts: float | None = None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def say(msg: str) -> None:
    """Progress for people, on stderr (stdout is the report)."""
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def strict(x: object) -> object:
    """X with every nan/inf float written as the string "nan", "inf" or "-inf" (a diverged loss):
    the record and --json stay strict JSON, which json.loads of any language reads."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict(v) for v in x]
    return x


def number(x: object) -> float | None:
    """A number of a record back as a float ("nan", "inf", "-inf" too); None for anything else."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return float(x)
    if x in ("nan", "inf", "-inf"):
        return float(str(x))
    return None


def quiet_run(cmd: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a helper in its own session: a Ctrl-C meant for the sweep never reaches it half-way."""
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env, start_new_session=True
    )


def resolve_model(name: str) -> str:
    """The config name MODEL stands for, resolved by the launcher's own resolve_model (utils/launch/lib.sh)."""
    script = 'source "$1/utils/launch/lib.sh"; PROG=sweep.py; resolve_model "$2" "$1/configs"'
    res = quiet_run(["bash", "-c", script, "_", str(REPO), name])
    if res.returncode != 0:
        raise InputError((res.stderr.strip().splitlines() or [f"unknown model '{name}'"])[-1].removeprefix(f"{PROG}: "))
    return res.stdout.strip()


def split_model_arg(arg: str) -> tuple[str, str]:
    """MODEL[:TAG] -> (MODEL, TAG); the tag must already be a safe name (submit.sh would rewrite it)."""
    model, _, tag = arg.partition(":")
    if tag and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", tag):
        raise InputError(f"bad tag '{tag}': use letters, digits, '.', '_' or '-'")
    return model, tag


def join_tag(*parts: str) -> str:
    return "-".join(p for p in parts if p)


def submit_command(model: str, tag: str, nodes: int, sbatch: list[str], overrides: list[str]) -> list[str]:
    """The submit.sh argv of one job."""
    cmd = [str(SUBMIT), f"{model}:{tag}" if tag else model, "-N", str(nodes), *sbatch]
    return cmd + ["--", *overrides] if overrides else cmd


def override_key(item: str) -> str:
    return item.partition("=")[0]


def merge_overrides(base: list[str], extra: list[str]) -> list[str]:
    """KEY=VALUE lists merged by key: extra wins, in the place of the value it replaces."""
    merged = {override_key(x): x for x in base}
    for x in extra:
        merged[override_key(x)] = x
    return list(merged.values())


def split_passthrough(rest: list[str]) -> tuple[list[str], list[str]]:
    """Arguments after `--` -> (sbatch flags, overrides): overrides after a second `--`; without
    one, KEY=VALUE tokens are overrides and everything else is an sbatch flag."""
    if "--" in rest:
        i = rest.index("--")
        sbatch, overrides = rest[:i], rest[i + 1 :]
    else:
        sbatch = [t for t in rest if not OVERRIDE.match(t)]
        overrides = [t for t in rest if OVERRIDE.match(t)]
    for t in overrides:
        if not OVERRIDE.match(t):
            raise InputError(f"override '{t}' is not KEY=VALUE (MaxText) or _env_NAME=VALUE (environment)")
    return sbatch, overrides


def flag_name(token: str) -> str:
    """'--nodes=2' -> '--nodes', '-N2' -> '-N', '-w' -> '-w'."""
    return token.partition("=")[0] if token.startswith("--") else token[:2]


def check_sbatch_flags(flags: list[str], forbidden: dict[str, str]) -> None:
    """Refuse flags the sweep sets itself. forbidden: flag -> what to use instead."""
    for f in flags:
        if f.startswith("-") and flag_name(f) in forbidden:
            raise InputError(f"sbatch flag '{f}' is set by the sweep: {forbidden[flag_name(f)]}")


def check_overrides(overrides: list[str], forbidden: dict[str, str]) -> None:
    for o in overrides:
        if override_key(o) in forbidden:
            raise InputError(f"override '{o}' is set by the sweep: {forbidden[override_key(o)]}")


def nonempty_path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (give a path)")
    return Path(text)


def parse_values(text: str) -> list[str]:
    """'1,2,4' -> ['1', '2', '4']: positive numbers, deduplicated, ascending."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError("--values needs at least one number, e.g. --values 1,2,4,8")
    out: dict[float, str] = {}
    for t in items:
        if not re.fullmatch(r"\d+(\.\d+)?|\.\d+", t) or float(t) <= 0:
            raise InputError(f"--values: '{t}' is not a positive number (e.g. --values 1,2,4,8)")
        out.setdefault(float(t), t)
    return [out[k] for k in sorted(out)]


def parse_node_list(text: str) -> list[str]:
    nodes = [t.strip() for t in text.split(",") if t.strip()]
    for n in nodes:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n):
            raise InputError(f"bad node name '{n}' (give host names, comma-separated: --nodes n1,n2,n3)")
    if len(set(nodes)) != len(nodes):
        raise InputError(f"--nodes lists a node twice: {text}")
    return nodes


# --- Slurm ------------------------------------------------------------------------------------
def cluster_nodes() -> list[tuple[str, str]] | None:
    """[(node, short state)] from sinfo, or None when Slurm cannot be asked."""
    if not shutil.which("sinfo"):
        return None
    try:
        res = quiet_run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    seen: dict[str, str] = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            seen.setdefault(parts[0], parts[1])
    return list(seen.items())


def node_usable(state: str) -> bool:
    return state.rstrip("~#$@!%^-+") in USABLE_NODE_STATES and not state.endswith("*")


def choose_nodes(spec: str) -> tuple[list[str], list[dict]]:
    """(nodes to run on, [{node, state}] left out) for --nodes all|n1,n2,..."""
    known = cluster_nodes()
    if spec == "all":
        if known is None:
            raise InputError("--nodes all needs sinfo (run on a Slurm login node, or list the nodes: --nodes n1,n2)")
        use = [n for n, st in known if node_usable(st)]
        left = [{"node": n, "state": st} for n, st in known if not node_usable(st)]
        return use, left
    nodes = parse_node_list(spec)
    if known is not None:
        names = {n for n, _ in known}
        unknown = [n for n in nodes if n not in names]
        if unknown:
            raise InputError(f"unknown node(s) {', '.join(unknown)}; sinfo lists {', '.join(sorted(names))}")
    return nodes, []


def slurm_state(job_id: str) -> str | None:
    """JobState from `scontrol show job -o ID`; GONE when Slurm no longer knows the id; None when
    Slurm could not be asked (try again later)."""
    try:
        res = quiet_run(["scontrol", "show", "job", "-o", job_id], timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bJobState=([A-Z_]+)", res.stdout)
    if m:
        return m.group(1)
    return "GONE" if "Invalid job id" in res.stderr else None


def scancel(job_ids: list[str]) -> None:
    """Cancel exactly these jobs (the sweep's own)."""
    if job_ids:
        try:
            quiet_run(["scancel", *job_ids], timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            say(f"scancel {' '.join(job_ids)} failed: {e}")


# --- jobs -------------------------------------------------------------------------------------
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


# --- the sweep --------------------------------------------------------------------------------
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
        """The failure policy (sweep_policy.decide) on an ended job: record the decision with its
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
        d = sweep_policy.decide(
            job.status, job.failure_class, job.culprit_hosts, bool(job.info.get("retry_of")), earlier
        )
        if not self.policy_retries and d["action"] in (sweep_policy.RETRY, sweep_policy.EXCLUDE_NODE_RETRY):
            d = {
                "action": sweep_policy.MARK_FAILED,
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
        if d["action"] == sweep_policy.STOP:
            self.stop_reason = f"{job.label}: {d['reason']}"
        elif d["action"] in (sweep_policy.RETRY, sweep_policy.EXCLUDE_NODE_RETRY):
            argv = shlex.split(job.command)
            if d["action"] == sweep_policy.EXCLUDE_NODE_RETRY:
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


# --- statistics -------------------------------------------------------------------------------
def mad_outliers(rates: dict[str, float], z: float, min_deviation: float) -> dict:
    """Robust outliers: modified z-score 0.6745 * (x - median) / MAD beyond z, and at least
    min_deviation (fraction) away from the median. Needs three values."""
    if len(rates) < 3:
        return {
            "median": statistics.median(rates.values()) if rates else None,
            "mad": None,
            "outliers": [],
            "note": "outliers need at least 3 measured nodes" if rates else "no node was measured",
        }
    med = statistics.median(rates.values())
    mad = statistics.median(abs(x - med) for x in rates.values())
    out = []
    for node, x in rates.items():
        dev = (x - med) / med if med else 0.0
        score = 0.6745 * (x - med) / mad if mad else (0.0 if x == med else float("inf") * (1 if x > med else -1))
        if abs(score) > z and abs(dev) >= min_deviation:
            out.append(
                {
                    "node": node,
                    "tgs_steady": x,
                    "deviation_pct": round(100 * dev, 1),
                    "score": round(score, 2) if abs(score) != float("inf") else None,
                    "direction": "slow" if x < med else "fast",
                }
            )
    return {
        "median": round(med, 3),
        "mad": round(mad, 3),
        "outliers": sorted(out, key=lambda o: o["deviation_pct"]),
        "note": "",
    }


# --- batch ------------------------------------------------------------------------------------
def numeric(values: list[str]) -> bool:
    return all(re.fullmatch(r"\d+(\.\d+)?|\.\d+", v) for v in values)


def batch_label(p: dict, i: int, v: str) -> str:
    """bs<value> for numbers; v<n> (1-based, in the given order) for free-form values (_env_)."""
    return f"bs{v}" if numeric(p["values"]) else f"v{i + 1}"


def drive_batch(sw: Sweep) -> None:
    p = sw.params
    for i, v in enumerate(p["values"]):
        overrides = [f"{p['key']}={v}", f"steps={p['steps']}", *p["overrides"]]
        label = batch_label(p, i, v)
        sw.plan(
            label,
            submit_command(p["model"], join_tag(p["tag"], label), p["nodes"], p["sbatch"], overrides),
            value=v,
        )
    if sw.opts.dry_run:
        return
    ordered = numeric(p["values"])

    def after(job: Job) -> None:
        # failure policy: out of memory -> skip the value; larger numeric values would not fit either
        if job.failure_class in OOM_CLASSES and ordered:
            for other in sw.jobs:
                if other.status == "planned" and float(other.info["value"]) > float(job.info["value"]):
                    other.status = "skipped"
                    other.note = f"not run: {p['key']}={job.info['value']} ran out of memory ({job.failure_class})"
            sw.save()

    sw.run(sw.jobs, after)
    sw.result = batch_result(sw.jobs, p["key"])


def batch_result(jobs: list[Job], key: str) -> dict:
    jobs = [j for j in jobs if not j.info.get("retried_as")]  # a retried job counts by its retry
    order = (lambda j: float(j.info["value"])) if numeric([j.info["value"] for j in jobs]) else None
    rows = [
        {
            "value": j.info["value"],
            "job_id": j.job_id,
            "status": j.status,
            "failure_class": j.failure_class,
            "tgs_steady": j.tgs_steady,
            "final_loss": j.final_loss,
        }
        for j in jobs
    ]
    done = [j for j in jobs if j.measured]
    best = max(done, key=lambda j: j.tgs_steady or 0.0, default=None)
    fits = max(done, key=order, default=None) if order else None
    ooms = [j for j in jobs if j.failure_class in OOM_CLASSES]
    oom = min(ooms, key=order, default=None) if order else next(iter(ooms), None)
    skipped = [j.info["value"] for j in jobs if j.status == "skipped"]
    parts = []
    if best:
        parts.append(f"best {key}={best.info['value']}: {best.tgs_steady:.6g} tokens/s/device (job {best.job_id})")
    else:
        parts.append(f"no {key} value completed with a measured rate")
    if oom:
        parts.append(f"{key}={oom.info['value']} ran out of memory ({oom.failure_class}, job {oom.job_id})")
    if skipped:
        parts.append(f"not run: {', '.join(skipped)}")
    failed = [j for j in jobs if j.status in ENDED and not j.measured and j.failure_class not in OOM_CLASSES]
    if failed:
        parts.append(
            "other failures: "
            + ", ".join(
                f"{j.info['value']} ({j.status}{', ' + j.failure_class if j.failure_class else ''})" for j in failed
            )
        )
    return {
        "key": key,
        "values": rows,
        "best": {"value": best.info["value"], "job_id": best.job_id, "tgs_steady": best.tgs_steady} if best else None,
        "largest_fitting": fits.info["value"] if fits else None,
        "first_oom": {"value": oom.info["value"], "job_id": oom.job_id, "failure_class": oom.failure_class}
        if oom
        else None,
        "skipped": skipped,
        "conclusion": "; ".join(parts),
    }


# --- nodes ------------------------------------------------------------------------------------
def drive_nodes(sw: Sweep) -> None:
    p = sw.params
    sw.policy_retries = False
    for node in p["nodes"]:
        cmd = submit_command(
            p["model"],
            join_tag(p["tag"], f"node-{node}"),
            1,
            ["-w", node, *p["sbatch"]],
            [f"steps={p['steps']}", *p["overrides"]],
        )
        sw.plan(f"node-{node}", cmd, node=node)
    if sw.opts.dry_run:
        return
    sw.run(sw.jobs)
    sw.result = nodes_result(sw.jobs, p["unavailable"], p["z"], p["min_deviation_pct"] / 100)


def nodes_result(jobs: list[Job], unavailable: list[dict], z: float, min_deviation: float) -> dict:
    rates = {j.info["node"]: j.tgs_steady for j in jobs if j.measured}
    stats = mad_outliers(rates, z, min_deviation)
    failing = [
        {
            "node": j.info["node"],
            "job_id": j.job_id,
            "status": j.status,
            "failure_class": j.failure_class,
            "summary": j.summary or j.note,
        }
        for j in jobs
        if j.status in ENDED and not j.measured
    ]
    slow = [o["node"] for o in stats["outliers"] if o["direction"] == "slow"]
    parts = [f"{len(rates)} of {len(jobs)} node(s) measured"]
    if stats["median"] is not None:
        parts.append(f"median {stats['median']:.6g} tokens/s/device")
    parts.append(f"slow outliers: {', '.join(slow)}" if slow else "no slow outlier")
    if failing:
        parts.append("failing: " + ", ".join(f"{f['node']} ({f['failure_class'] or f['status']})" for f in failing))
    if unavailable:
        parts.append("not usable in Slurm: " + ", ".join(f"{u['node']} ({u['state']})" for u in unavailable))
    if stats["note"]:
        parts.append(stats["note"])
    return {
        "rates": rates,
        "median": stats["median"],
        "mad": stats["mad"],
        "z": z,
        "min_deviation_pct": round(100 * min_deviation, 2),
        "outliers": stats["outliers"],
        "failing": failing,
        "unavailable": unavailable,
        "conclusion": "; ".join(parts),
    }


# --- bisect -----------------------------------------------------------------------------------
def first_pairs(nodes: list[str]) -> list[tuple[str, str]]:
    """Disjoint neighbour pairs; an odd last node is paired with the first node."""
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2:
        pairs.append((nodes[-1], nodes[0]))
    return pairs


def pair_command(p: dict, a: str, b: str) -> list[str]:
    return submit_command(
        p["model"],
        join_tag(p["tag"], f"pair-{a}-{b}"),
        2,
        ["-w", f"{a},{b}", *p["sbatch"]],
        [f"steps={p['steps']}", *p["overrides"]],
    )


def drive_bisect(sw: Sweep) -> None:
    sw.policy_retries = False
    p = sw.params
    round1 = [sw.plan(f"r1-{a}-{b}", pair_command(p, a, b), round=1, nodes=[a, b]) for a, b in first_pairs(p["nodes"])]
    if sw.opts.dry_run:
        return
    sw.run(round1)
    threshold = p["slow_threshold_pct"] / 100
    ref = reference_rate([j.tgs_steady for j in round1 if j.measured])
    verdicts = {j.label: judge(j, ref, threshold) for j in round1}
    for a, b in cross_checks(round1, verdicts):
        sw.plan(f"r2-{a}-{b}", pair_command(p, a, b), round=2, nodes=[a, b], testing=a)
    sw.run([j for j in sw.jobs if j.info.get("round") == 2])
    sw.result = bisect_result(sw.jobs, threshold)


def reference_rate(rates: list[float]) -> float | None:
    """The rate of a healthy pair: the median of three or more pairs, else the best one."""
    if not rates:
        return None
    return statistics.median(rates) if len(rates) >= 3 else max(rates)


def judge(job: Job, ref: float | None, threshold: float) -> str:
    """good | slow | failed for one pair job."""
    if not job.measured:
        return "failed"
    if ref is not None and job.tgs_steady is not None and job.tgs_steady < (1 - threshold) * ref:
        return "slow"
    return "good"


def cross_checks(round1: list[Job], verdicts: dict[str, str]) -> list[tuple[str, str]]:
    """(node under test, a node of a good pair other than its bad partners) for every node of a bad
    pair that no good pair cleared; the good nodes take turns."""
    bad = [j.info["nodes"] for j in round1 if verdicts[j.label] != "good"]
    cleared = list(dict.fromkeys(n for j in round1 if verdicts[j.label] == "good" for n in j.info["nodes"]))
    todo = list(dict.fromkeys(n for pair in bad for n in pair if n not in cleared))
    out: list[tuple[str, str]] = []
    for n in todo:
        partners = {m for pair in bad if n in pair for m in pair}
        choices = [c for c in cleared if c not in partners]
        if choices:
            out.append((n, choices[len(out) % len(choices)]))
    return out


def evidence(job: Job, verdict: str) -> dict:
    return {
        "job_id": job.job_id,
        "label": job.label,
        "nodes": job.info["nodes"],
        "verdict": verdict,
        "status": job.status,
        "failure_class": job.failure_class,
        "tgs_steady": job.tgs_steady,
    }


def bisect_result(jobs: list[Job], threshold: float) -> dict:
    r1 = [j for j in jobs if j.info.get("round") == 1]
    r2 = [j for j in jobs if j.info.get("round") == 2]
    ref = reference_rate([j.tgs_steady for j in r1 if j.measured])
    verdict = {j.label: judge(j, ref, threshold) for j in jobs}
    pairs = [{**evidence(j, verdict[j.label]), "round": j.info["round"]} for j in jobs]
    bad1 = [j for j in r1 if verdict[j.label] != "good"]
    cleared = sorted({n for j in jobs if verdict[j.label] == "good" for n in j.info["nodes"]})
    suspects = []
    for j in r2:
        node = j.info["testing"]
        if verdict[j.label] != "good":
            ev = [evidence(x, verdict[x.label]) for x in bad1 if node in x.info["nodes"]] + [
                evidence(j, verdict[j.label])
            ]
            suspects.append({"node": node, "evidence": ev})
    suspect_pairs = [j.info["nodes"] for j in bad1 if all(n in cleared for n in j.info["nodes"])]
    if not bad1:
        conclusion = "no suspect: every pair ran at speed"
    elif not r2 and not any(verdict[j.label] == "good" for j in r1):
        conclusion = (
            "every pair was slow or failed: not one node; suspect the network fabric, a shared service "
            "or the job's configuration"
        )
    else:
        parts = []
        if suspects:
            parts.append(
                "suspect node(s): "
                + ", ".join(s["node"] for s in suspects)
                + " (bad with a partner that is good elsewhere)"
            )
        if suspect_pairs:
            parts.append(
                "pair(s) bad only together: "
                + ", ".join("+".join(x) for x in suspect_pairs)
                + " (both nodes are good with other partners: suspect the link between them)"
            )
        conclusion = "; ".join(parts) or "inconclusive: the cross-checks did not reproduce the bad pair(s)"
    return {
        "reference_tgs": round(ref, 3) if ref is not None else None,
        "slow_threshold_pct": round(100 * threshold, 2),
        "pairs": pairs,
        "cleared": cleared,
        "suspects": suspects,
        "suspect_pairs": suspect_pairs,
        "conclusion": conclusion,
    }


# --- regress ----------------------------------------------------------------------------------
def parse_submit_command(text: str) -> tuple[str, int, list[str], list[str]]:
    """A recorded 'submit.sh MODEL[:TAG] [-N N] [SBATCH...] [-- OVERRIDES...]' -> its parts
    (the same argument grammar as submit.sh)."""
    if "$'" in text:  # bash's printf %q for control characters: shlex would misread it
        raise InputError(
            f"the baseline command has a $'...'-quoted value (control characters), which regress does "
            f"not replay: rerun it by hand: {text}"
        )
    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise InputError(f"cannot read the baseline command '{text}': {e}") from None
    if len(tokens) < 2 or Path(tokens[0]).name != "submit.sh":
        raise InputError(f"the baseline command is not a submit.sh command: {text}")
    model_arg, rest, nodes, sbatch, overrides = tokens[1], tokens[2:], "1", [], []
    while rest:
        t = rest.pop(0)
        if t == "--":
            overrides = rest
            break
        if t in ("-N", "--nodes") and rest:
            nodes = rest.pop(0)
        elif t.startswith("--nodes="):
            nodes = t.removeprefix("--nodes=")
        elif t.startswith("-N") and t != "-N":
            nodes = t[2:]
        else:
            sbatch.append(t)
    if not re.fullmatch(r"[1-9]\d*", nodes):
        raise InputError(f"the baseline command has a bad node count '{nodes}': {text}")
    return model_arg, int(nodes), sbatch, overrides


REDACTED = "<redacted>"
MODEL_ARG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9_][A-Za-z0-9._-]*)?")


def owner_of(path: Path) -> tuple[int, str]:
    """(uid, user name) of a file's owner."""
    uid = path.stat().st_uid
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, f"uid {uid}"


def is_env(item: str) -> bool:
    return item.startswith("_env_")


def baseline_of(job: str, workspace: Path) -> dict:
    """What regress needs of the baseline job; InputError when it cannot be rerun or compared.

    The recorded command is split into what regress replays by default (MODEL:TAG, node count,
    MaxText overrides) and what it only shows unless asked (sbatch flags, _env_ values): the
    command.txt may belong to someone else in a shared workspace."""
    try:
        found = locate.find_log(job, workspace)
    except InputError as e:
        raise InputError(f"baseline: {e}") from None
    log, job_dir = found.log, found.dir
    if job_dir is None:
        raise InputError(f"baseline {job} has no job directory next to {log} (its artifact holds the command)")
    path = job_dir / "artifact" / ".submit" / "command.txt"
    try:
        if not path.is_file():
            raise InputError(f"baseline {job}: no submit command at {path} (a job submitted by submit.sh has one)")
        command = path.read_text(errors="replace").strip()
        owner_uid, owner = owner_of(path)
    except OSError as e:
        raise InputError(f"baseline {job}: cannot read {path}: {e.strerror or e}") from None
    model_arg, nodes, sbatch, overrides = parse_submit_command(command)
    if not MODEL_ARG.fullmatch(model_arg):
        raise InputError(f"baseline {job}: its command's MODEL[:TAG] '{model_arg}' is not a model name ({path})")
    bad = [o for o in overrides if not OVERRIDE.match(o)]
    if bad:
        raise InputError(f"baseline {job}: its command has '{bad[0]}' after `--`, not KEY=VALUE ({path})")
    try:
        r = triage.Triage(log, job_dir, triage.Options())
        rep = r.report()
    except (InputError, OSError, ValueError) as e:
        raise InputError(f"baseline {job}: cannot read its log: {e}") from None
    if rep["tgs"]["steady"] is None:
        raise InputError(
            f"baseline {job} has no steady tokens/s/device to compare with (status {rep['status']}"
            f"{', ' + rep['failure_class'] if rep['failure_class'] else ''})"
        )
    steps = next((o.partition("=")[2] for o in overrides if override_key(o) == "steps"), None)
    return {
        "job_id": rep["job_id"],
        "log": str(log),
        "job_dir": str(job_dir),
        "command": command,
        "command_file": str(path),
        "command_owner": owner,
        "command_owner_is_you": owner_uid == os.getuid(),
        "model": (r.scan.header.get("model") or "").split(" ")[0] or None,
        "model_arg": model_arg,
        "nodes": nodes,
        "sbatch": sbatch,
        "overrides": [o for o in overrides if not is_env(o)],
        "env": [o for o in overrides if is_env(o)],
        "steps": steps,
        "status": rep["status"],
        "tgs_steady": rep["tgs"]["steady"],
        "final_loss": r.scan.steps.final_loss(),
        "last_step": rep["progress"]["last_step"],
    }


def check_not_redacted(job: str, items: list[str], how: str) -> None:
    """A redacted value can never be replayed: InputError naming it and what to do instead."""
    for item in items:
        if REDACTED in item:
            name = override_key(item) if OVERRIDE.match(item) else item
            what = f"'{name}' was redacted in its command.txt" + (f" ({item})" if name != item else "")
            raise InputError(f"baseline {job}: {what}; a redacted value cannot be replayed: {how.format(name=name)}")


def drive_regress(sw: Sweep) -> None:
    p = sw.params
    sw.plan("rerun", shlex.split(p["command"]), baseline=p["baseline"]["job_id"])
    if sw.opts.dry_run:
        return
    sw.run(sw.jobs)
    sw.result = regress_result(p["baseline"], sw.jobs[0], p["threshold_pct"], p["loss_tolerance_pct"], p["same_steps"])


def regress_result(base: dict, job: Job, threshold_pct: float, loss_tol_pct: float, same_steps: bool) -> dict:
    delta = None
    if job.measured and base["tgs_steady"]:
        delta = round(100 * (job.tgs_steady - base["tgs_steady"]) / base["tgs_steady"], 2)
    if not job.measured:
        verdict = "failed"
    elif delta is not None and delta <= -threshold_pct:
        verdict = "regression"
    elif delta is not None and delta >= threshold_pct:
        verdict = "faster"
    else:
        verdict = "same"
    loss_delta, loss_verdict = None, "not_compared"
    old_loss = number(base["final_loss"])  # "nan"/"inf" in a resumed sweep's record
    if same_steps and job.final_loss is not None and old_loss is not None:
        new, old = job.final_loss, old_loss
        if math.isfinite(new) and math.isfinite(old):
            loss_delta = round(new - old, 6)
            rel = abs(loss_delta) / max(abs(old), 1e-12)
            loss_verdict = "changed" if 100 * rel > loss_tol_pct else "same"
        else:  # nan or inf: training diverged, on one side or on both alike
            loss_verdict = "same" if str(new) == str(old) else "changed"
    if verdict == "failed":
        conclusion = f"the rerun did not complete ({job.status}{', ' + job.failure_class if job.failure_class else ''})"
    else:
        conclusion = (
            f"{job.tgs_steady:.6g} vs {base['tgs_steady']:.6g} tokens/s/device ({delta:+.2f} %, "
            f"threshold {threshold_pct:g} %): {verdict}"
        )
    if loss_verdict != "not_compared":
        conclusion += f"; final loss {job.final_loss:g} vs {old_loss:g}: {loss_verdict}"
    elif not same_steps:
        conclusion += "; final loss not compared (different step count)"
    return {
        "baseline": {k: base[k] for k in ("job_id", "status", "tgs_steady", "final_loss", "last_step", "command")},
        "rerun": {
            "job_id": job.job_id,
            "status": job.status,
            "failure_class": job.failure_class,
            "tgs_steady": job.tgs_steady,
            "final_loss": job.final_loss,
            "last_step": job.last_step,
        },
        "tgs_delta_pct": delta,
        "threshold_pct": threshold_pct,
        "verdict": verdict,
        "loss_delta": loss_delta,
        "loss_tolerance_pct": loss_tol_pct,
        "loss_verdict": loss_verdict,
        "conclusion": conclusion,
    }


# --- building sweeps from the command line ----------------------------------------------------
# --- models -----------------------------------------------------------------------------------
CONFIGS = REPO / "configs"


def all_models() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.yml"))


def documented_nodes(model: str) -> int:
    """The config header's `# Minimum nodes: N with 8x 80 GB GPUs` N (config_header.read_header); 1 without it."""
    try:
        nodes = config_header.read_header(CONFIGS / f"{model}.yml").min_nodes
    except (OSError, ValueError):
        return 1
    return nodes[0].nodes if nodes else 1


def resolve_commit(ref: str) -> str:
    res = quiet_run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
    if res.returncode != 0 or not res.stdout.strip():
        raise InputError(f"--commits: '{ref}' is not a commit of {REPO}")
    return res.stdout.strip()


def checkout_of(sw: Sweep, sha: str) -> Path:
    """A scratch clone of the repository at commit sha under <workspace>/<user>/sweeps/checkouts/
    (made once, reused when it is ours to trust; `git clone --shared`, so the repository's own
    worktree list is untouched): its submit.sh snapshots that checkout, so each job runs the
    commit's code."""
    if sw.opts.dry_run:
        return sw.opts.workspace / pwd.getpwuid(os.geteuid()).pw_name / "sweeps" / "checkouts" / sha[:12]
    checkouts = sweeps_dir(sw.opts.workspace) / "checkouts"
    path = checkouts / sha[:12]
    try:
        trust.own_dir(checkouts)
        if (path / "submit.sh").exists() or (path / "submit.sh").is_symlink():
            trust.check_under(sw.opts.workspace, path / "submit.sh", "the sweep's checkout")
            return path
    except trust.UntrustedPath as e:
        raise InputError(str(e)) from None
    old_umask = os.umask(0o022)  # nobody else writes into the code a job will run
    try:
        for cmd in (
            ["git", "clone", "--quiet", "--shared", "--no-checkout", str(REPO), str(path)],
            ["git", "-C", str(path), "checkout", "--quiet", "--detach", sha],
        ):
            res = quiet_run(cmd, timeout=300)
            if res.returncode != 0:
                raise InputError(f"cannot make a checkout of {sha[:12]} at {path}: {res.stderr.strip()}")
    finally:
        os.umask(old_umask)
    return path


def drive_models(sw: Sweep) -> None:
    p = sw.params
    commits = p["commits"] or [None]
    for model in p["models"]:  # model by model, the commits side by side: deltas come early
        for sha in commits:
            repo = checkout_of(sw, sha) if sha else REPO
            label = f"{model}@{sha[:8]}" if sha else model
            sbatch = [*(["-w", ",".join(p["node_lists"][model])] if p["node_lists"].get(model) else []), *p["sbatch"]]
            cmd = submit_command(
                model,
                join_tag(p["tag"], f"c{sha[:8]}" if sha else "models"),
                p["nodes_per_model"][model],
                sbatch,
                [f"steps={p['steps']}", "dataset_type=synthetic", *p["overrides"]],
            )
            cmd[0] = str(repo / "submit.sh")
            sw.plan(label, cmd, config=model, commit=sha)
    if sw.opts.dry_run:
        return

    def after(job: Job) -> None:
        if len(commits) < 2 or sw.stop_reason:
            return
        done = {c: {} for c in commits}
        for j in sw.jobs:
            if j.status in ENDED and not j.info.get("retried_as"):
                done[j.info["commit"]][j.info["config"]] = j.status == "completed"
        bad = sweep_policy.candidate_only_failures(done[commits[0]], done[commits[1]])
        if len(bad) >= 2:
            sw.stop_reason = f"{len(bad)} models fail on {commits[1][:8]} but not on {commits[0][:8]}: {', '.join(bad)}"
            sw.decisions.append({"label": job.label, "action": sweep_policy.STOP, "reason": sw.stop_reason})

    sw.run(sw.jobs, after)
    sw.result = models_result(sw.jobs, p)


def models_result(jobs: list[Job], p: dict) -> dict:
    commits = p["commits"] or [None]
    live = [j for j in jobs if not j.info.get("retried_as")]
    rows = []
    for model in p["models"]:
        row: dict = {"model": model, "nodes": p["nodes_per_model"][model], "node_list": p["node_lists"].get(model)}
        per = []
        for sha in commits:
            j = next((j for j in live if j.info["config"] == model and j.info["commit"] == sha), None)
            per.append(
                {
                    "commit": sha,
                    "job_id": j.job_id if j else None,
                    "status": j.status if j else "planned",
                    "failure_class": j.failure_class if j else None,
                    "tgs_steady": j.tgs_steady if j else None,
                }
            )
        row["runs"] = per
        a, b = per[0]["tgs_steady"], per[-1]["tgs_steady"]
        row["tgs_delta_pct"] = round(100 * (b - a) / a, 2) if len(per) == 2 and a and b is not None else None
        rows.append(row)
    measured = sum(1 for r in rows for x in r["runs"] if x["tgs_steady"] is not None)
    deltas = [f"{r['model']} {r['tgs_delta_pct']:+.2f} %" for r in rows if r["tgs_delta_pct"] is not None]
    conclusion = f"{measured} of {len(rows) * len(commits)} job(s) measured"
    if deltas:
        conclusion += f"; tokens/s/device {commits[-1][:8]} vs {commits[0][:8]}: " + ", ".join(deltas)
    return {"commits": commits, "models": rows, "conclusion": conclusion}


def models_table(res: dict) -> list[str]:
    """The side-by-side table: one line per model, tokens/s/device per commit and the delta."""
    commits = res.get("commits") or [None]
    heads = [(c or "current")[:8] for c in commits]
    lines = [
        f"  {'model':<20} {'nodes':>5} "
        + " ".join(f"{h:>14}" for h in heads)
        + (f" {'delta':>9}" if len(commits) == 2 else "")
    ]
    for r in res.get("models", []):
        cells = [
            fmt(x["tgs_steady"]) if x["tgs_steady"] is not None else (x["failure_class"] or x["status"])
            for x in r["runs"]
        ]
        d = (
            f" {r['tgs_delta_pct']:+8.2f}%"
            if r.get("tgs_delta_pct") is not None
            else (" " * 10 if len(commits) == 2 else "")
        )
        lines.append(f"  {r['model']:<20} {r['nodes']:>5} " + " ".join(f"{c:>14}" for c in cells) + d)
    return lines


def models_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    sbatch, overrides = split_passthrough(passthrough)
    check_sbatch_flags(sbatch, {**NODE_FLAGS, **PIN_FLAGS})
    check_overrides(overrides, {"steps": "use --steps", "dataset_type": "the sweep runs synthetic data"})
    names = all_models() if a.models == "all" else [t.strip() for t in a.models.split(",") if t.strip()]
    if not names:
        raise InputError("--models needs config names or all")
    models = list(dict.fromkeys(resolve_model(m) for m in names))
    commits = [resolve_commit(c.strip()) for c in a.commits.split(",") if c.strip()] if a.commits else []
    if len(commits) > 2 or (commits and len(set(commits)) != len(commits)):
        raise InputError("--commits takes one commit or two different ones (A,B: B is compared with A)")
    per_model = {m: a.nodes_per_model or documented_nodes(m) for m in models}
    node_lists: dict[str, list[str]] = {}
    if a.nodes:
        pool = parse_node_list(a.nodes)
        for m in models:
            if per_model[m] > len(pool):
                raise InputError(f"{m} needs {per_model[m]} node(s); --nodes names {len(pool)}")
            node_lists[m] = pool[: per_model[m]]  # the same nodes per model in every sweep given this list
    return {
        "model": ",".join(models),
        "models": models,
        "tag": a.tag,
        "commits": commits,
        "nodes_per_model": per_model,
        "node_lists": node_lists,
        "steps": a.steps,
        "sbatch": sbatch,
        "overrides": overrides,
        "notes": [],
    }


DRIVERS: dict[str, Callable[[Sweep], None]] = {
    "batch": drive_batch,
    "nodes": drive_nodes,
    "bisect": drive_bisect,
    "regress": drive_regress,
    "models": drive_models,
}
NODE_FLAGS = {
    "-N": "use -N",
    "--nodes": "use -N",
    "-W": "the sweep polls scontrol",
    "--wait": "the sweep polls scontrol",
}
PIN_FLAGS = {"-w": "the sweep picks the nodes (--nodes)", "--nodelist": "the sweep picks the nodes (--nodes)"}


def min_nodes_notes(model: str, per_job: int, ignore: bool) -> list[str]:
    """Jobs of PER_JOB nodes against the `# Minimum nodes:` header of MODEL's config
    (config_header.read_header): InputError below the smallest minimum (the training state cannot
    fit on any GPU the header names) unless IGNORE; a note below the 80 GB GPUs' minimum."""
    try:
        head = config_header.read_header(REPO / "configs" / f"{model}.yml")
    except (OSError, ValueError):
        return []
    if not head.min_nodes:
        return []
    n80, n192 = head.min_nodes[0].nodes, head.minimum().nodes
    says = f"configs/{model}.yml says '# Minimum nodes: {head.min_nodes_text}'"
    if per_job < n192:
        if not ignore:
            raise InputError(
                f"{model} needs at least {n192} nodes per job and this sweep plans {per_job}-node jobs ({says}); "
                "sweep with a model that fits, or pass --ignore-min-nodes"
            )
        return [f"--ignore-min-nodes: {per_job}-node jobs, below the minimum of {n192} nodes ({says})"]
    if per_job < n80:
        return [f"{per_job}-node jobs fit only on GPUs with more than 80 GB ({says})"]
    return []


def common_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    model, tag = split_model_arg(a.model)
    model = resolve_model(model)
    sbatch, overrides = split_passthrough(passthrough)
    sbatch += ["--ignore-min-nodes"] if a.ignore_min_nodes else []  # the sweep judged it (min_nodes_notes)
    return {"model": model, "tag": tag, "sbatch": sbatch, "overrides": overrides}


def batch_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    p = common_params(a, passthrough)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", a.key):
        raise InputError(f"--key '{a.key}' is not a MaxText key (like per_device_batch_size)")
    check_sbatch_flags(p["sbatch"], NODE_FLAGS)
    check_overrides(p["overrides"], {a.key: "use --values", "steps": "use --steps"})
    notes = min_nodes_notes(p["model"], a.num_nodes, a.ignore_min_nodes)
    if (a.values is None) == (not a.value):
        raise InputError("give the values with --values 1,2,4 (numbers) or --value V once per value (any text)")
    if a.value:
        if not is_env(a.key):
            raise InputError(f"--value (free-form values) is for _env_ keys; '{a.key}' takes --values 1,2,4")
        values = list(dict.fromkeys(a.value))  # as given, each one token: never through a shell
    else:
        values = parse_values(a.values)
    return {**p, "values": values, "key": a.key, "nodes": a.num_nodes, "steps": a.steps, "notes": notes}


def nodes_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    p = common_params(a, passthrough)
    check_sbatch_flags(p["sbatch"], {**NODE_FLAGS, **PIN_FLAGS})
    check_overrides(p["overrides"], {"steps": "use --steps"})
    notes = min_nodes_notes(p["model"], 1, a.ignore_min_nodes)
    nodes, unavailable = choose_nodes(a.nodes)
    if not nodes:
        raise InputError("no usable node to run on" + (f" (Slurm: {unavailable})" if unavailable else ""))
    return {
        **p,
        "nodes": nodes,
        "unavailable": unavailable,
        "steps": a.steps,
        "z": a.z,
        "min_deviation_pct": a.min_deviation,
        "notes": notes,
    }


def bisect_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    p = common_params(a, passthrough)
    check_sbatch_flags(p["sbatch"], {**NODE_FLAGS, **PIN_FLAGS})
    check_overrides(p["overrides"], {"steps": "use --steps"})
    notes = min_nodes_notes(p["model"], 2, a.ignore_min_nodes)
    nodes, unavailable = choose_nodes(a.nodes)
    if len(nodes) < 3:
        raise InputError(
            f"bisect needs at least 3 usable nodes (got {len(nodes)}): with 2 a bad pair cannot be "
            "split; use 'sweep.py nodes' to check single nodes"
        )
    if unavailable:
        say("left out (not usable in Slurm): " + ", ".join(f"{u['node']} ({u['state']})" for u in unavailable))
    return {
        **p,
        "nodes": nodes,
        "unavailable": unavailable,
        "steps": a.steps,
        "slow_threshold_pct": a.slow_threshold,
        "notes": notes,
    }


def regress_params(a: argparse.Namespace, passthrough: list[str], workspace: Path) -> dict:
    model, tag = split_model_arg(a.model)
    if tag:
        raise InputError("regress reruns the baseline's own MODEL:TAG; give MODEL without a tag")
    model = resolve_model(model)
    base = baseline_of(a.baseline, workspace)
    base_model = base["model"] or resolve_model(split_model_arg(base["model_arg"])[0])
    if base_model != model:
        raise InputError(f"baseline {a.baseline} trained '{base_model}', not '{model}'")
    sbatch, extra = split_passthrough(passthrough)
    check_sbatch_flags(sbatch, NODE_FLAGS)
    job = a.baseline
    replayed = base["overrides"] + (base["env"] if a.replay_env else [])
    overrides = merge_overrides(replayed, extra)
    if a.steps is not None:
        overrides = merge_overrides(overrides, [f"steps={a.steps}"])
    check_not_redacted(
        job,
        [o for o in overrides if not is_env(o)],
        "give {name}=VALUE yourself after `-- --` (it replaces the recorded one)",
    )
    check_not_redacted(
        job, [o for o in overrides if is_env(o)], "give {name}=VALUE yourself after `-- --`, or leave out --replay-env"
    )
    base_sbatch = base["sbatch"] if a.replay_sbatch else []
    if a.replay_sbatch:
        check_not_redacted(job, base_sbatch, "give the flag yourself after `--`, or leave out --replay-sbatch")
        try:
            check_sbatch_flags(base_sbatch, NODE_FLAGS)
        except InputError as e:
            raise InputError(f"baseline {job}: {e} (leave out --replay-sbatch)") from None
    new_steps = next((o.partition("=")[2] for o in overrides if override_key(o) == "steps"), None)
    nodes = a.num_nodes or base["nodes"]
    argv = [str(SUBMIT), base["model_arg"], "-N", str(nodes), *base_sbatch, *sbatch]
    argv += ["--", *overrides] if overrides else []
    notes = []
    if not base["command_owner_is_you"]:
        notes.append(
            f"the baseline's command.txt ({base['command_file']}) is owned by {base['command_owner']}, not "
            "by you: read what it asks for before replaying its sbatch flags or environment"
        )
    for what, items, flag, on in (
        ("sbatch flags", base["sbatch"], "--replay-sbatch", a.replay_sbatch),
        ("environment values (_env_)", base["env"], "--replay-env", a.replay_env),
    ):
        if items and on:
            notes.append(f"replaying the baseline's {what} ({flag}): {shlex.join(items)}")
        elif items:
            notes.append(
                f"the baseline's {what} are NOT replayed: {shlex.join(items)} (add {flag} to replay them, "
                "or give the ones you want after `--`)"
            )
    return {
        "model": model,
        "baseline": base,
        "command": shlex.join(argv),
        "same_steps": new_steps == base["steps"],
        "threshold_pct": a.threshold,
        "loss_tolerance_pct": a.loss_tolerance,
        "replay": {"sbatch": a.replay_sbatch, "env": a.replay_env},
        "not_replayed": {
            "sbatch": [] if a.replay_sbatch else base["sbatch"],
            "env": [] if a.replay_env else base["env"],
        },
        "notes": notes,
    }


# --- output -----------------------------------------------------------------------------------
def fmt(x: float | str | None, spec: str = ".6g") -> str:
    """A number of a record for people ("nan"/"inf" as they are)."""
    return "-" if x is None else x if isinstance(x, str) else format(x, spec)


def render(rec: dict) -> str:
    """A record as text for people."""
    head = f"sweep {rec['sweep']} {rec['model']}: {rec['state']}"
    lines = [head + (f" (record {rec['record']})" if rec.get("record") else "")]
    if rec["state"] == "dry_run":
        lines.append(f"{len(rec['jobs'])} job(s) would be submitted (nothing submitted):")
        lines += [f"  {j['command']}" for j in rec["jobs"]]
        lines += [f"note: {n}" for n in rec.get("notes", [])]
        return "\n".join(lines)
    notes = [f"note: {n}" for n in rec.get("notes", [])]
    lines.append(f"  {'label':<22} {'job':>8} {'status':<13} {'class':<18} {'tokens/s/dev':>13} {'loss':>9}")
    for j in rec["jobs"]:
        lines.append(
            f"  {j['label']:<22} {j['job_id'] or '-':>8} {j['status']:<13} {j['failure_class'] or '-':<18} "
            f"{fmt(j['tgs_steady']):>13} {fmt(j['final_loss'], '.4g'):>9}"
        )
    res = rec.get("result") or {}
    if rec["sweep"] == "models" and res.get("models"):
        lines += models_table(res)
    if res.get("conclusion"):
        lines.append(res["conclusion"])
    for s in res.get("suspects", []):
        ev = "; ".join(
            f"job {e['job_id']} {'+'.join(e['nodes'])}: {e['verdict']} ({fmt(e['tgs_steady'])})" for e in s["evidence"]
        )
        lines.append(f"  suspect {s['node']}: {ev}")
    for o in res.get("outliers", []):
        lines.append(
            f"  outlier {o['node']}: {fmt(o['tgs_steady'])} tokens/s/device ({o['deviation_pct']:+.1f} % "
            f"from the median, {o['direction']})"
        )
    for f in res.get("failing", []):
        lines.append(f"  failing {f['node']}: job {f['job_id']} {f['status']}: {f['summary']}")
    lines += notes
    if rec["state"] == "interrupted":
        lines.append(
            "interrupted: the sweep cancelled its unfinished jobs; continue with: "
            f"{shlex.quote(str(REPO / 'utils' / 'sweep.py'))} resume {shlex.quote(str(rec['record']))}"
        )
    return "\n".join(lines)


def emit(rec: dict, as_json: bool) -> None:
    cli.emit(rec, as_json, render)


def exit_code(sw: Sweep) -> int:
    if sw.state == "interrupted":
        return cli.INTERRUPTED
    if sw.kind == "regress":
        return cli.FAILED if sw.result.get("verdict") in ("regression", "failed") else cli.OK
    return cli.OK if any(j.measured for j in sw.jobs) else cli.FAILED


# --- running ----------------------------------------------------------------------------------
def execute(sw: Sweep, as_json: bool) -> int:
    """Plan, submit, wait and report; cancels the sweep's own jobs on a stop signal or an error."""
    driver = DRIVERS[sw.kind]
    if sw.opts.dry_run:
        driver(sw)
        sw.state = "dry_run"
        rec = sw.to_json()
        if sw.kind == "bisect":
            rec["notes"] += [
                "round 2 depends on round 1: each node of a slow or failed pair that no good pair "
                "cleared is run again with a node of a good pair (tag pair-NODE-GOOD)"
            ]
        emit(rec, as_json)
        return cli.OK
    if not shutil.which("sbatch") or not shutil.which("scontrol"):
        raise InputError(
            "sbatch/scontrol not found: run on a Slurm login node, or try Slurm on this machine: "
            'utils/local_cluster.sh up 2 (installs Slurm as root), then eval "$(utils/local_cluster.sh env)"'
        )
    if sw.record is None:
        sw.open_record()
    say(f"record: {sw.record}")
    for n in sw.params.get("notes", []):
        say(f"note: {n}")

    def on_signal(signum: int, _frame: object) -> None:
        sw.stop_requested = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        driver(sw)
        sw.state = "stopped" if sw.stop_reason else "done"
    except Interrupted as e:
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # finish the clean-up whatever arrives now
        ids = sw.cancel_active(f"sweep stopped by {e}")
        say(f"stopped by {e}: cancelled the sweep's job(s) {' '.join(ids) or '(none running)'}")
        sw.state = "interrupted"
    except BaseException:
        ids = sw.cancel_active("the sweep failed")
        sw.state = "error"
        sw.save()
        say(f"internal error: cancelled the sweep's job(s) {' '.join(ids) or '(none running)'}")
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    sw.save()
    emit(sw.to_json(), as_json)
    return exit_code(sw)


RECORD_KEYS = {
    "state": str,
    "model": str,
    "workspace": str,
    "started_at": str,
    "options": dict,
    "argv": list,
    "params": dict,
    "jobs": list,
    "result": dict,
}
JOB_KEYS = ("label", "command", "status", "job_id", "failure_class", "tgs_steady", "final_loss")


def _this_schema(rec: dict) -> bool:
    """A record of this schema: "schema": "sweep/1", or "version": 1 as records were written before."""
    return rec.get("schema") == SCHEMA if "schema" in rec else rec.get("version") == 1


def load_record(path: Path) -> dict:
    """A sweep record as written by this tool; InputError (one line) for anything else."""
    where = "give a <workspace>/<user>/sweeps/<time>-<kind>.json file"
    try:
        if not path.is_file():
            raise InputError(
                f"cannot read record {path}: {'not a regular file' if path.exists() else 'no such file'} ({where})"
            )
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read record {path}: {getattr(e, 'strerror', None) or e} ({where})") from None
    if not isinstance(rec, dict) or rec.get("sweep") not in DRIVERS or not _this_schema(rec):
        raise InputError(f"{path} is not a sweep record (schema {SCHEMA})")
    bad = [k for k, t in RECORD_KEYS.items() if not isinstance(rec.get(k), t)]
    bad += [
        f"jobs[{i}]"
        for i, j in enumerate(rec.get("jobs") or [])
        if not isinstance(j, dict) or any(k not in j for k in JOB_KEYS)
    ]
    if not bad and not all(k in rec["options"] for k in ("timeout", "max_parallel", "poll")):
        bad = ["options"]
    if bad:
        raise InputError(f"{path} is not a complete sweep record (bad or missing: {', '.join(bad[:5])})")
    return rec


def resume(a: argparse.Namespace) -> int:
    """Go on with a record: ended jobs are kept, running ones waited for, the rest (re)submitted."""
    path = a.record
    try:  # its commands are submitted again: only a record nobody else can have written
        trust.check(path, "the sweep record", "resume only a record of your own")
    except trust.UntrustedPath as e:
        raise InputError(str(e)) from None
    rec = load_record(path)
    o = rec["options"]
    opts = Options(
        Path(rec["workspace"]), a.timeout or o["timeout"], a.max_parallel or o["max_parallel"], a.poll or o["poll"]
    )
    sw = Sweep(rec["sweep"], rec["model"], rec["params"], opts, rec["argv"])
    sw.jobs = [Job.from_json(j) for j in rec["jobs"]]
    sw.decisions = list(rec.get("decisions") or [])  # kept; a stopped sweep resumed runs its skipped jobs
    for j in sw.jobs:
        if j.status == "submitted":
            j._t0 = time.time()
        if j.status in ("interrupted", "skipped", "submit_failed"):
            if j.job_id:
                j.previous_job_ids.append(j.job_id)
            j.status, j.job_id, j.note = "planned", None, ""
    sw.record = path
    sw.started_at = calendar.timegm(time.strptime(rec["started_at"], "%Y-%m-%dT%H:%M:%SZ"))
    return execute(sw, a.json)


def build_parser() -> argparse.ArgumentParser:
    doc = (__doc__ or "").strip()
    ap = cli.Parser(
        prog=PROG,
        usage=doc.splitlines()[0].removeprefix("Usage: "),
        description="\n".join(doc.splitlines()[2:]),
    )
    common = cli.Parser(add_help=False)
    common.add_argument(
        "--workspace", type=nonempty_path, help="job workspace (default $JOB_WORKSPACE or <repo>/outputs)"
    )
    common.add_argument("--dry-run", action="store_true", help="print the submit commands; submit nothing")
    common.add_argument(
        "--timeout",
        type=cli.positive_float,
        default=3600.0,
        help="seconds a job may take from submission before the sweep cancels it (default 3600)",
    )
    common.add_argument("--max-parallel", type=cli.positive_int, default=1, help="jobs in flight at once (default 1)")
    common.add_argument(
        "--poll", type=cli.positive_float, default=2.0, help="seconds between scontrol polls (default 2)"
    )
    common.add_argument("--json", action="store_true", help="print the record as JSON (for agents and scripts)")
    sub = ap.add_subparsers(dest="kind", required=True, parser_class=cli.Parser, metavar="KIND")

    b = add_kind(sub, "batch", "batch-size search", common)
    b.add_argument("model", metavar="MODEL[:TAG]")
    b.add_argument("--values", help="comma-separated numbers, e.g. 1,2,4,8")
    b.add_argument(
        "--value",
        action="append",
        default=[],
        help="one value, any text (repeat; --value=V when V starts with -); for --key _env_NAME",
    )
    b.add_argument("-N", dest="num_nodes", type=cli.positive_int, default=1, help="nodes per job (default 1)")
    b.add_argument("--steps", type=cli.positive_int, default=30, help="training steps per job (default 30)")
    b.add_argument(
        "--key", default="per_device_batch_size", help="MaxText key to sweep (default per_device_batch_size)"
    )

    b.add_argument(
        "--ignore-min-nodes",
        action="store_true",
        help="plan jobs below the minimum node count of the config's header (refused by default)",
    )

    m = add_kind(sub, "models", "every model (or a list) at its documented node count, one or two commits", common)
    m.add_argument("--models", default="all", help="config names, comma-separated, or all (default)")
    m.add_argument("--commits", help="A or A,B: run each commit's checkout (a scratch clone); B vs A")
    m.add_argument(
        "--nodes-per-model", type=cli.positive_int, help="nodes per job (default: the config header's minimum, 80 GB)"
    )
    m.add_argument("--nodes", help="n1,n2,...: each model runs on the first N of them (the same list every sweep)")
    m.add_argument("--steps", type=cli.positive_int, default=10, help="training steps per job (default 10)")
    m.add_argument("--tag", default="", help="tag in front of each job's own tag")

    n = add_kind(sub, "nodes", "per-node health", common)
    n.add_argument("model", metavar="MODEL[:TAG]")
    n.add_argument("--nodes", default="all", help="n1,n2,... or all (default: every usable node sinfo lists)")
    n.add_argument("--steps", type=cli.positive_int, default=30, help="training steps per job (default 30)")
    n.add_argument(
        "--z",
        type=cli.positive_float,
        default=3.5,
        help="modified z-score beyond which a node is an outlier (default 3.5)",
    )
    n.add_argument(
        "--min-deviation",
        type=cli.positive_float,
        default=5.0,
        help="... and at least this many percent from the median (default 5)",
    )

    n.add_argument(
        "--ignore-min-nodes",
        action="store_true",
        help="plan 1-node jobs below the minimum node count of the config's header (refused by default)",
    )

    s = add_kind(sub, "bisect", "find the node that spoils multi-node jobs", common)
    s.add_argument("model", metavar="MODEL[:TAG]")
    s.add_argument("--nodes", required=True, help="n1,n2,n3,... or all (at least 3)")
    s.add_argument("--steps", type=cli.positive_int, default=30, help="training steps per job (default 30)")
    s.add_argument(
        "--slow-threshold",
        type=cli.positive_float,
        default=10.0,
        help="a pair slower than the reference by this many percent is bad (default 10)",
    )

    s.add_argument(
        "--ignore-min-nodes",
        action="store_true",
        help="plan 2-node jobs below the minimum node count of the config's header (refused by default)",
    )

    r = add_kind(sub, "regress", "rerun a baseline job and compare", common)
    r.add_argument("model", metavar="MODEL")
    r.add_argument("--baseline", required=True, help="baseline job id, job name, job directory or log")
    r.add_argument("--steps", type=cli.positive_int, help="training steps (default: the baseline's)")
    r.add_argument("-N", dest="num_nodes", type=cli.positive_int, help="nodes (default: the baseline's)")
    r.add_argument(
        "--threshold",
        type=cli.positive_float,
        default=3.0,
        help="slower than the baseline by this many percent is a regression (default 3)",
    )
    r.add_argument(
        "--loss-tolerance",
        type=cli.positive_float,
        default=1.0,
        help="final loss differing by more than this many percent is 'changed' (default 1)",
    )
    r.add_argument(
        "--replay-sbatch",
        action="store_true",
        help="also replay the baseline's recorded sbatch flags (default: shown, not replayed)",
    )
    r.add_argument(
        "--replay-env",
        action="store_true",
        help="also replay the baseline's recorded _env_NAME=VALUE values (default: shown, not replayed)",
    )

    x = add_kind(sub, "resume", "continue an interrupted sweep", _json_only())
    x.add_argument("record", type=nonempty_path, metavar="RECORD")
    x.add_argument("--timeout", type=cli.positive_float, help="per-job timeout (default: the record's)")
    x.add_argument("--max-parallel", type=cli.positive_int, help="jobs in flight at once (default: the record's)")
    x.add_argument("--poll", type=cli.positive_float, help="seconds between polls (default: the record's)")
    x = add_kind(sub, "show", "print a record's report", _json_only())
    x.add_argument("record", type=nonempty_path, metavar="RECORD")
    return ap


def add_kind(
    sub: argparse._SubParsersAction, name: str, what: str, parent: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    return sub.add_parser(name, parents=[parent], prog=f"{PROG} {name}", help=what)


def _json_only() -> argparse.ArgumentParser:
    p = cli.Parser(add_help=False)
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head, passthrough = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    a = build_parser().parse_args(head)
    try:
        if a.kind == "show":
            emit(load_record(a.record), a.json)
            return cli.OK
        if a.kind == "resume":
            return resume(a)
        workspace = (a.workspace or locate.default_workspace()).absolute()
        if workspace.exists() and not workspace.is_dir():
            raise InputError(f"workspace {workspace} is not a directory (set --workspace or JOB_WORKSPACE)")
        if a.kind == "regress":
            params = regress_params(a, passthrough, workspace)
        else:
            params = {"batch": batch_params, "nodes": nodes_params, "bisect": bisect_params, "models": models_params}[
                a.kind
            ](a, passthrough)
        opts = Options(workspace, a.timeout, a.max_parallel, a.poll, a.dry_run)
        return execute(Sweep(a.kind, params["model"], params, opts, argv), a.json)
    except InputError as e:
        return cli.fail(PROG, e)
