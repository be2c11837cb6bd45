"""A run that continues itself (submit.sh --run ALIAS --continue; docs/runs.md).

Each job of such a run queues the next one when it starts: submit.sh again, from this job's verified
snapshot with the recorded command and `--dependency=afterany:<this job>`, so Slurm holds it until
this job has ended, however it ends (its time limit, preemption, a node failure, a kill). At its end
the job cancels the next one when the run should stop. Nothing outside the jobs (no login-node
process, no monitor) has to stay alive for the run to go on.

  run_next.py queue               after the job holds its run: queue the next job, unless this job is
                                  the run's last (--max-jobs) or a requeued run of it queued one already
  run_next.py watch STAGE_PID     while the train stage runs: the job monitor's hang and first-step rules
                                  (monitor/watch.py, state in <job dir>/watchdog/); on a hang or no first
                                  step it stops the stage (TERM to STAGE_PID), so the next job resumes
                                  from the latest checkpoint: on the same nodes when no host is to blame,
                                  without the hosts triage blames otherwise; <job dir>/watchdog/stopped.json
                                  keeps the evidence
  run_next.py end STATUS [STATE]  after the JOB SUMMARY: keep the next job, or cancel it and say why.
                                  STATUS: the summary's; STATE: Slurm's job state at a stop signal

The run stops (the next job is cancelled) when: the run is complete (the job completed: MaxText trained
to its `steps`; or the run's latest checkpoint is its last step); the job failed in a way a retry cannot
fix (triage's class is one of FINAL_CLASSES); the job was cancelled by scancel (Slurm state CANCELLED at
its end, or, as slurmctld shows such a job COMPLETING at its stop signal, when the next job starts and
finds it CANCELLED: that job trains nothing; a preemption is PREEMPTED, a requeue goes on); or
MST_MAX_STALLED jobs in a row, this one included, saved no new checkpoint; or the watchdog stopped this
job and the job before it (two hangs, or jobs without a first step, in a row). Every decision is one
line in the log, `run_next: ...` (docs/job-log.md); the next job's id is kept in <job dir>/next.
Reads JOB_DIR JOB_ID JOB_WORKSPACE MST_RUN MST_CONTINUE ("MAX_JOBS MAX_STALLED") MST_RUN_JOB (this
job's place in the chain, 1 for the first) MST_RUN_AFTER (the job that queued this one).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import joblog
from diagnosis import cli, jobdir, locate, runs, scheduler
from diagnosis.triage import Options, Triage
from monitor import recover, store
from monitor.watch import Rules, Watch
from trust import UntrustedPath

PROG = "run_next.py"
# failures that the same job would meet again: the run stops (docs/runs.md lists them)
FINAL_CLASSES = ("config_error", "nan_loss", "oom_device", "oom_host", "python_exception")
# what the job's environment holds that the launcher sets, not the user: the next job's submit.sh sets it anew
LAUNCHER_SET = {
    "MST_REPO", "MST_SNAPSHOT", "MST_REPO_SHA256", "MST_USER_ROOT", "MODEL", "MODEL_TAG", "MST_RUN",
    "MST_GPU_REQUEST", "MST_SITE_APPLIED", "TRAIN_OVERRIDES", "TRAIN_ENV_OVERRIDES", "MST_OVERRIDES_IN_ENV",
    "MST_COMMAND_TEXT", "MST_CONTAINER", "MST_PYTHON", "MST_CONTINUE", "MST_RUN_JOB", "MST_RUN_AFTER",
    "MST_CHECKPOINT_EVERY",
}  # fmt: skip
KEPT_JOB_VARS = {"JOB_WORKSPACE", "JOB_GPUS_PER_NODE"}
NEXT = jobdir.NEXT  # <job dir>/next: the next job's id and name
WATCHDOG, STOPPED = "watchdog", "stopped.json"  # <job dir>/watchdog/: the watchdog's state; its evidence
DONE = 3  # run_next.py queue's status when the run is complete already
CANCELLED_BEFORE = 4  # ... when the job before this one was cancelled: the run stops here


def say(msg: str) -> None:
    print(f"run_next: {msg}", flush=True)


class Job:
    """This job, from its environment."""

    def __init__(self) -> None:
        env = os.environ
        missing = [v for v in ("JOB_DIR", "JOB_ID", "JOB_WORKSPACE", "MST_RUN", "MST_CONTINUE") if not env.get(v)]
        if missing:
            raise cli.InputError(f"not in a job of a continuing run: {', '.join(missing)} unset (submit.sh --continue)")
        self.dir, self.id, self.run = Path(env["JOB_DIR"]), env["JOB_ID"], env["MST_RUN"]
        self.workspace = Path(env["JOB_WORKSPACE"])
        m = re.fullmatch(r"(\d+) (\d+)", env["MST_CONTINUE"])
        if not m:
            raise cli.InputError(f"MST_CONTINUE is '{env['MST_CONTINUE']}', not 'MAX_JOBS MAX_STALLED'")
        self.max_jobs, self.max_stalled = int(m.group(1)), int(m.group(2))
        self.index = int(env["MST_RUN_JOB"]) if env.get("MST_RUN_JOB", "").isdigit() else 1
        self.jd = store.Dir.open(self.dir)

    def next_job(self) -> tuple[str, str] | None:
        """(id, name) of the next job this job (or an earlier run of it) queued."""
        return jobdir.parse_next(self.jd.read(NEXT, "the next job's record", limit=512))


def next_env(job: Job) -> dict[str, str]:
    """The next job's submit.sh environment: this job's, less what Slurm and the launcher set in it."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith(("SLURM_", "SLURMD_", "SBATCH_", "SRUN_")) and k != "SLURM_CONF")
        and not (k.startswith("JOB_") and k not in KEPT_JOB_VARS)
        and k not in LAUNCHER_SET
    }
    env["JOB_WORKSPACE"] = str(job.workspace)
    if os.environ.get("MST_VENV"):
        env.setdefault("MAXTEXT_SLURM_VENV", os.environ["MST_VENV"])
    env["MST_RUN_JOB"] = str(job.index + 1)
    env["MST_RUN_AFTER"] = job.id
    return env


def with_dependency(args: list[str], job_id: str) -> list[str]:
    """args with --dependency=afterany:JOB_ID before "--", instead of a dependency or hold of the user's."""
    cut = args.index("--") if "--" in args else len(args)
    out, i = [], 0
    while i < cut:
        a = args[i]
        if a in ("-d", "--dependency"):
            i += 2
            continue
        if not (a.startswith(("--dependency=", "-d")) or a in ("-H", "--hold")):
            out.append(a)
        i += 1
    return [*out, f"--dependency=afterany:{job_id}", *args[cut:]]


def complete(job: Job) -> str | None:
    """Why the run needs no more training (its latest checkpoint is its last step); None when it does."""
    planned = jobdir.planned_steps(jobdir.header(job.dir.parent / f"{job.dir.name}.log"), job.dir)
    latest = runs.latest_checkpoint(job.run, job.workspace)
    if planned is not None and latest is not None and latest >= planned - 1:
        return f"run {job.run} is complete: its checkpoint of step {latest} ends its {planned} steps"
    return None


def queue(job: Job) -> int:
    """0: the next job is queued (or not needed: --max-jobs); 1: it could not be; DONE: the run is complete,
    this job trains nothing (MaxText refuses to start on a checkpoint of the last step)."""
    if why := complete(job):
        say(f"{why}: this job trains nothing and queues no next job")
        return DONE
    # a job cancelled by you reads COMPLETING at its stop signal, not yet CANCELLED: the job after it decides
    after = os.environ.get("MST_RUN_AFTER", "")
    if after.isdigit() and scheduler.final_state(after) == "CANCELLED":
        say(f"run {job.run} stops: job {after} before this one was cancelled (scancel): this job trains nothing")
        return CANCELLED_BEFORE
    held = job.next_job()
    if held and scheduler.slurm_state(held[0]) == "PENDING":  # a requeued run of this job queued it already
        say(f"job {held[0]} (queued by this job's earlier run) goes on with run {job.run} when this job ends")
        return 0
    if job.index >= job.max_jobs:
        say(f"this is job {job.index} of at most {job.max_jobs} of run {job.run} (--max-jobs): no next job is queued")
        return 0
    try:
        snap = recover.verified_snapshot(job.dir, job.jd)
        submit, args = recover.command_of(snap)
    except recover.RecoverError as e:
        say(f"no next job for run {job.run}: {e}")
        return 1
    args = with_dependency(args, job.id)
    try:
        res = subprocess.run([str(submit), *args], capture_output=True, text=True, env=next_env(job), timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        say(f"no next job for run {job.run}: submit.sh did not run: {e}")
        return 1
    m = re.search(r"^Submitted job (\d+) \((\S+)\)", res.stdout, re.M)
    if res.returncode != 0 or not m:
        last = (res.stderr.strip() or res.stdout.strip()).splitlines()
        say(f"no next job for run {job.run}: submit.sh failed: {last[-1] if last else f'exit {res.returncode}'}")
        return 1
    job.jd.write(NEXT, f"{m.group(1)} {m.group(1)}-{m.group(2)}\n".encode())
    say(
        f"queued job {m.group(1)} (job {job.index + 1} of at most {job.max_jobs} of run {job.run}): "
        f"it starts when this job ends, unless this job stops the run"
    )
    return 0


def stalled(job: Job) -> int:
    """How many jobs of the run in a row, this one the last, saved no new checkpoint: each job's mark is the
    run's latest checkpoint when it started (its header), this one's is also compared with the run's now."""
    # oldest first, this one last; headers only (a time limit leaves KillWait for this)
    marks = [joblog.checkpoint_at_start(head.get("run", "")) for _, head in runs.logs_of(job.run, job.workspace)]
    marks.append(runs.latest_checkpoint(job.run, job.workspace))
    n = 0
    for before, after in zip(reversed(marks[:-1]), reversed(marks[1:]), strict=True):
        if (after if after is not None else -1) > (before if before is not None else -1):
            break
        n += 1
    return n


def stopped_by_watchdog(job_dir: Path) -> dict | None:
    """The evidence the watchdog kept when it stopped that job's train stage (None: it did not)."""
    try:
        w = store.Dir.open(job_dir / WATCHDOG, "the watchdog directory")
    except UntrustedPath:
        return None
    try:
        got = w.read_json(STOPPED, "the watchdog's evidence")
    except (OSError, UntrustedPath):
        got = None
    finally:
        w.close()
    return got if isinstance(got, dict) else None


def job_dir_of(job: Job, job_id: str) -> Path | None:
    """The directory of job JOB_ID in this job's workspace (the tools' one lookup, diagnosis/locate.py)."""
    try:
        return locate.find(job_id, job.workspace).dir
    except cli.InputError:
        return None


def stop_reason(job: Job, status: str, state: str | None) -> str | None:
    """Why the run stops after this job; None: it goes on."""
    if status == "completed":
        return "the run is complete: MaxText trained to its steps"
    if done := complete(job):  # e.g. the time limit came while MaxText ended, after its last checkpoint
        return done
    mine = stopped_by_watchdog(job.dir)
    if mine is not None:
        after = os.environ.get("MST_RUN_AFTER", "")
        before_dir = job_dir_of(job, after) if after.isdigit() else None
        before = stopped_by_watchdog(before_dir) if before_dir else None
        if before is not None:
            return (
                f"the watchdog stopped two jobs in a row: job {after}: {before.get('title')}; "
                f"job {job.id}: {mine.get('title')}"
            )
        return None  # one hang or stall: the next job resumes (the watchdog chose its nodes)
    if state == "CANCELLED" or status == "cancelled" and state is None:
        return f"job {job.id} was cancelled (scancel); resubmit with --run {job.run} --continue to go on"
    if status == "failed":
        try:
            r = Triage(job.dir.parent / f"{job.dir.name}.log", job.dir, Options()).report()
        except Exception as e:  # noqa: BLE001  # a failed triage must not stop the run
            say(f"triage of job {job.id} failed ({e}); the run goes on")
            r = {}
        cls = r.get("failure_class")
        if cls == "oom_host" and r.get("confidence") == "low":
            cls = "killed"  # SIGKILLed without an out-of-memory message: from outside the job (recover.plan's rule)
        if cls in FINAL_CLASSES:
            return f"{cls}, which a retry cannot fix: {r.get('summary', '')}"[:600]
    n = stalled(job)
    if n >= job.max_stalled:
        return f"{n} jobs in a row saved no new checkpoint (at most {job.max_stalled})"
    return None


def end(job: Job, status: str, state: str | None) -> int:
    held = job.next_job()
    why = stop_reason(job, status, state)
    if why is None:
        if held:
            say(f"job {held[0]} goes on with run {job.run} ({status}{f', Slurm state {state}' if state else ''})")
        else:
            say(f"run {job.run} is not done ({status}), but no next job was queued: resubmit it yourself")
        return 0
    if not held:
        say(f"run {job.run} stops: {why}")
        return 0
    nxt, name = held
    res = subprocess.run(["scancel", nxt], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        say(f"run {job.run} stops: {why}; but 'scancel {nxt}' failed: {res.stderr.strip()[:300]}")
        return 1
    say(f"run {job.run} stops: {why}; cancelled job {nxt}")
    remove_unstarted(job.workspace, name)
    return 0


def remove_unstarted(ws: Path, name: str) -> None:
    """The log and job directory submit.sh made for a job that was cancelled before it started: removed
    when they are still what submit.sh left (an empty log of ours; links artifact and log, snapshot.sha256)."""
    log = ws / f"{name}.log"
    try:
        st = os.lstat(log)
        if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size == 0):
            return
        d = store.Dir.open(ws / name)
    except (OSError, UntrustedPath):
        return
    try:
        entries = set(os.listdir(d.fd))
        if not entries <= {"artifact", "log", "snapshot.sha256"}:
            return
        for e in entries:
            os.unlink(e, dir_fd=d.fd)
    finally:
        d.close()
    os.rmdir(ws / name)
    os.unlink(log)


def pin_next(job: Job, culprits: list[str]) -> str:
    """Ask Slurm to run the queued next job on this job's nodes, or without CULPRITS; what was asked."""
    held = job.next_job()
    if not held:
        return "no next job is queued"
    nodes = os.environ.get("JOB_NODELIST", "").split()
    blamed = [h for h in culprits if h in nodes]
    if blamed and len(blamed) < len(nodes):
        field, hosts, said = "ExcNodeList", blamed, f"without {' '.join(blamed)}"
    elif nodes:
        field, hosts, said = "ReqNodeList", nodes, f"on the same nodes ({' '.join(nodes)})"
    else:
        return f"job {held[0]} goes on wherever Slurm puts it"
    why = scheduler.place(held[0], field, hosts)
    if why:
        return f"job {held[0]} goes on wherever Slurm puts it (scontrol update {field}: {why})"
    return f"job {held[0]} resumes from the run's latest checkpoint {said}"


# the watchdog's settings (utils/launch/settings.tsv, checked at launch) -> Rules fields
WATCHDOG_SETTINGS = {
    "MST_WATCHDOG_HANG_FLOOR": "hang_floor",
    "MST_WATCHDOG_PAUSE_GRACE": "pause_grace",
    "MST_WATCHDOG_FIRST_STEP_LIMIT": "first_step_limit",
}


def watchdog_rules(env: Mapping[str, str]) -> Rules:
    """The job monitor's rules, with the watchdog's settings where set (a bad value keeps the default:
    submit.sh refused it already)."""
    given = {}
    for name, field in WATCHDOG_SETTINGS.items():
        v = env.get(name, "")
        if v.isdigit():
            given[field] = float(v)
    return Rules(**given)


def watch(job: Job, stage_pid: int, interval: float) -> int:
    """The watchdog (see the module's docstring); returns when the stage has ended or was stopped."""
    rules = watchdog_rules(os.environ)
    w = Watch(job.dir, rules, home=WATCHDOG)
    try:
        while _alive(stage_pid):
            for ev in w.poll(time.time(), "RUNNING"):
                if ev.kind not in ("hang", "no_first_step"):
                    continue
                culprits: list[str] = []
                if ev.kind == "hang":
                    try:
                        culprits = list(w.triage(time.time(), scheduler=False).get("culprit_hosts") or [])
                    except (OSError, UntrustedPath, ValueError):
                        culprits = []
                where = pin_next(job, culprits)
                w.home.write_json(STOPPED, {"kind": ev.kind, "title": ev.title, "lines": ev.lines, "culprits": culprits,
                                            "at": ev.at, "next": where})  # fmt: skip
                say(f"watchdog: {ev.title} ({'; '.join(ev.lines[:1])}): stopping the train stage; {where}")
                os.kill(stage_pid, signal.SIGTERM)
                return 0
            time.sleep(interval)
    finally:
        w.close()
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("queue", help="queue the next job of the run (at the job's start)")
    e = sub.add_parser("end", help="keep or cancel the next job (at the job's end)")
    e.add_argument("status", choices=("completed", "failed", "cancelled", "timeout", "stage_timeout"))
    e.add_argument("state", nargs="?", help="Slurm's job state at a stop signal")
    w = sub.add_parser("watch", help="the watchdog of the train stage (its pid)")
    w.add_argument("stage_pid", type=int)
    w.add_argument("--interval", type=float, default=5.0, help="seconds between looks at the log (default 5)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        job = Job()
        if a.cmd == "watch":
            return watch(job, a.stage_pid, a.interval)
        return queue(job) if a.cmd == "queue" else end(job, a.status, a.state)
    except (cli.InputError, UntrustedPath) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
