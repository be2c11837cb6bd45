"""What Slurm says, asked in one place for every tool in utils/: a job's state (triage, the job
monitor, the sweep), the user's jobs in the queue (the monitor with no JOB) and whose queued jobs
these are (the host bridge, before a scancel).

One answer for a job Slurm no longer knows ("Invalid job id": it ended long enough ago, or never
existed): GONE. None means Slurm could not be asked, or the id is not a Slurm job's (a
run_local.sh job, local-...): try again later, or decide from the job directory alone.
Nothing here submits or cancels; the one change is `place()`, where a pending job of ours may run (a
continuing run's watchdog, utils/monitor/chain.py). Each command runs in its own session, so that a
Ctrl-C meant for the caller never reaches it half-way.
"""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess

GONE = "GONE"  # Slurm no longer knows the id
SLURM_ID = re.compile(r"\d+(_\d+)?")  # a job id, or an array task's


def _ask(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    if not shutil.which(argv[0]):
        return None
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, start_new_session=True
        )
    except (OSError, subprocess.SubprocessError):
        return None


def slurm_state(job_id: str, timeout: float = 30) -> str | None:
    """JobState from `scontrol show job -o ID`; GONE when Slurm no longer knows the id; None when
    Slurm could not be asked or the id is not a Slurm job id."""
    if not SLURM_ID.fullmatch(job_id or ""):
        return None
    res = _ask(["scontrol", "show", "job", "-o", job_id], timeout)
    if res is None:
        return None
    m = re.search(r"\bJobState=([A-Z_]+)", res.stdout)
    if m:
        return m.group(1)
    return GONE if "Invalid job id" in res.stderr else None


def final_state(job_id: str, timeout: float = 30) -> str | None:
    """A job's state, from slurmctld while it remembers the job (MinJobAge), else from accounting
    (`sacct -X -n -o State`: "CANCELLED by 1000" reads CANCELLED); None when neither answers."""
    st = slurm_state(job_id, timeout)
    if st not in (None, GONE):
        return st
    res = _ask(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"], timeout)
    words = res.stdout.split() if res is not None and res.returncode == 0 else []
    return words[0] if words and re.fullmatch(r"[A-Z_]+", words[0]) else None


def place(job_id: str, field: str, nodes: list[str], timeout: float = 60) -> str | None:
    """`scontrol update JobId=ID FIELD=NODES` for FIELD ReqNodeList (run there) or ExcNodeList (not
    there); None when done, else why not (one line)."""
    if field not in ("ReqNodeList", "ExcNodeList") or not SLURM_ID.fullmatch(job_id or "") or not nodes:
        return f"not a placement: {field} for job {job_id!r} on {nodes}"
    res = _ask(["scontrol", "update", f"JobId={job_id}", f"{field}={','.join(nodes)}"], timeout)
    if res is None:
        return "scontrol could not be run"
    return None if res.returncode == 0 else (res.stderr.strip() or f"exit {res.returncode}")[:200]


def my_jobs(user: str | None = None) -> list[tuple[str, str]]:
    """(id, name) of each job the user (default: this one) has in Slurm's queue; [] when Slurm could
    not be asked."""
    res = _ask(["squeue", "-h", "-u", user or getpass.getuser(), "-o", "%i %j"], 30)
    rows = [line.split() for line in res.stdout.splitlines()] if res else []
    return [(r[0], r[1]) for r in rows if len(r) == 2]


def owners(ids: list[str]) -> dict[str, str] | None:
    """{id: user} of the given jobs that are in Slurm's queue; None when Slurm could not be asked."""
    res = _ask(["squeue", "-h", "-o", "%i %u", "-j", ",".join(ids)], 60)
    if res is None:
        return None
    return {a: b.strip() for a, b in (line.split(None, 1) for line in res.stdout.splitlines() if " " in line)}
