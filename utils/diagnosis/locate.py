"""The one rule by which triage, diagnose, perf and sweep turn the JOB a user names into a job.

JOB is, in this order:
1. a path that exists: a job directory (it holds `log`, `artifact/`, `.stages/` or `prometheus/`,
   or has `<dir>.log` beside it), a log file (its job directory is the log without `.log`), or,
   where the tool takes one, a TSDB directory (diagnose);
2. a job's name as `utils/prometheus.sh list` prints it, `<id>-JAX-<model>[-<tag>]` (also with
   `.log`), looked up in the workspace as `<name>.log` and/or `<name>/`;
3. a job id, matching every `<id>-JAX-*` job there (its log and/or its directory).
The workspace is --workspace, else $JOB_WORKSPACE, else <repo>/outputs. Two different jobs for one
id (Slurm's ids restart after a state reset) are an error that lists them: give the name. Results
that submit.sh moved aside for a new job with the same name (`<name>.earlier-<UTC>`,
`<name>.log.earlier-<UTC>`) never match an id or a name; as a path they are that earlier job.
Anything else raises cli.InputError with one line saying what is wrong and what to give.

CLI mode (answer.sh's cache key): `python3 -m diagnosis.locate key JOB` prints what an answer about
JOB depends on, one JSON line (jobdir.fingerprint: the job's real path, the size and time of its log
and TSDB); a JOB that names no job is one line on stderr, exit 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import joblog
from diagnosis import jobdir
from diagnosis.cli import InputError
from diagnosis.jobdir import EARLIER, dir_of, listing, log_of

__all__ = [  # EARLIER, dir_of and log_of: the job directory's paths, from jobdir.py
    "EARLIER",
    "Job",
    "default_workspace",
    "dir_of",
    "find",
    "find_log",
    "forms",
    "job_id_and_name",
    "job_id_of",
    "log_of",
    "read_log",
]

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Job:
    """What JOB named: the job's name and, where they exist, its directory and its log (absolute).
    A TSDB directory given to diagnose is `path` with no dir and no log."""

    name: str
    path: Path
    dir: Path | None
    log: Path | None


def default_workspace() -> Path:
    return Path(os.environ.get("JOB_WORKSPACE") or REPO / "outputs")


def forms(tsdb: bool = False) -> str:
    """What a JOB argument may be, for the end of an error line."""
    tail = ", a log file or a TSDB dir" if tsdb else " or a log file"
    return f"give a job id, a job name (<id>-JAX-<model>[-<tag>]), a job directory{tail}"


def find(
    arg: str, workspace: Path | None = None, *, what: str = "JOB", tsdb: Callable[[Path], bool] | None = None
) -> Job:
    """The job ARG names (see the module's doc); InputError (one line) otherwise.

    what: the argument's name in that line; tsdb: also take a directory for which tsdb(dir) holds."""
    if not arg.strip():
        raise InputError(f"empty {what} argument: {forms(tsdb is not None)}")
    try:
        return _find(arg, workspace or default_workspace(), tsdb)
    except OSError as e:  # a name too long, a permission, a symlink loop: no traceback
        raise InputError(f"cannot look up '{arg}': {e.strerror or e} ({forms(tsdb is not None)})") from None


def find_log(arg: str, workspace: Path | None = None, *, what: str = "JOB") -> Job:
    """find(), for a tool that reads the job log: a job without one yet is an InputError."""
    job = find(arg, workspace, what=what)
    if job.log is None:
        raise InputError(
            f"{job.path} has no log yet (looked for {job.path}/log and {job.name}.log beside it; "
            "is the job still pending?)"
        )
    return job


def read_log(log: Path, job_dir: Path | None) -> tuple[joblog.Scan, Path | None]:
    """The log read once (joblog.scan) and the job directory: JOB's, else the one the log's header
    names (`job_dir:`, for a log copied away from its job) where it exists. InputError when the
    log cannot be read or holds nothing of the job-log format."""
    try:
        scan = joblog.scan(log)
    except joblog.NotALog as e:
        raise InputError(str(e)) from None
    except OSError as e:
        raise InputError(f"cannot read {log}: {e.strerror or e}") from None
    if not joblog.looks_like_job_log(scan):
        raise InputError(f"{log} is not a job log (no JOB header, step line or known error line)")
    if job_dir is None and scan.header.get("job_dir") and Path(scan.header["job_dir"]).is_dir():
        job_dir = Path(scan.header["job_dir"])
    return scan, job_dir


def job_id_and_name(scan: joblog.Scan, log: Path) -> tuple[str, str]:
    """(id, name) of the job a log belongs to: from its JOB header ("job: <id> <name>") or JOB
    SUMMARY, else from the log's file name (<id>-JAX-<model>[-<tag>].log)."""
    job_id = (scan.header.get("job") or scan.summary.get("job") or "").split(" ")[0] or log.name.split("-JAX-")[0]
    return job_id, ((scan.header.get("job") or "").split(" ") + [""])[1] or log.name.removesuffix(".log")


def job_id_of(name: str) -> str | None:
    """The job id in a job name (`<id>-JAX-<model>[-<tag>]`); None for a name of another form (a TSDB
    directory given by itself)."""
    head, sep, _ = name.partition("-JAX-")
    return head if sep and head else None


def _find(arg: str, workspace: Path, tsdb: Callable[[Path], bool] | None) -> Job:
    p = Path(arg)
    try:
        mode = p.lstat().st_mode  # raises for a name too long or a directory we may not read
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    if mode is None and "/" in arg:
        raise InputError(f"{arg} does not exist (no such job, directory or log; {forms(tsdb is not None)})")
    if mode is None:
        p = _by_name(arg, workspace, tsdb is not None)
    elif stat.S_ISLNK(mode) and not p.exists():
        raise InputError(f"{arg} is a dangling symlink or a symlink loop: {forms(tsdb is not None)}")
    p = p.absolute()
    if p.is_file():
        d = dir_of(p)
        return Job(d.name if d else p.name.removesuffix(".log"), p, d, p)
    if not p.is_dir():
        raise InputError(f"{arg} is not a regular file or directory: {forms(tsdb is not None)}")
    log = log_of(p)
    if log or any(os.path.lexists(p / m) for m in ("log", "artifact", ".stages", "prometheus")):
        return Job(p.name, p, p, log)
    if tsdb is not None and tsdb(p):
        return Job(p.name, p, None, None)
    if tsdb is not None:
        raise InputError(
            f"{arg} is neither a job dir nor a TSDB (no log, artifact/, .stages/ or prometheus/; no block "
            f"dir or wal/): {forms(True)}"
        )
    raise InputError(
        f"{arg} is a directory but not a job directory (no log, artifact/, .stages/ or prometheus/): {forms()}"
    )


def _by_name(arg: str, workspace: Path, tsdb: bool) -> Path:
    """The one job in the workspace that a job name or id names: its directory, else its log."""
    try:
        is_ws = workspace.is_dir()
    except OSError as e:
        raise InputError(
            f"cannot use workspace {workspace}: {e.strerror or e} (set --workspace or JOB_WORKSPACE)"
        ) from None
    if not is_ws:
        raise InputError(f"workspace {workspace} does not exist (set --workspace or JOB_WORKSPACE)")
    key = arg.removesuffix(".log")
    is_name = "-JAX-" in key
    names = {n for n, _ in listing(workspace) if (n == key if is_name else n.startswith(f"{key}-JAX-"))}
    if not names:
        looked = f"{key}.log and {key}/" if is_name else f"{key}-JAX-*.log and {key}-JAX-*/"
        raise InputError(f"no job '{arg}' in {workspace} (looked for {looked}; {forms(tsdb)})")
    if len(names) > 1:
        raise InputError(
            f"job id {arg} is ambiguous in {workspace}: {', '.join(sorted(names))} (give one of these job names)"
        )
    (name,) = names
    return workspace / name if (workspace / name).is_dir() else workspace / f"{name}.log"


def main(argv: list[str] | None = None) -> int:
    """`key JOB`: answer.sh's cache key (see the module's doc)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "key":
        print("locate: expected `key JOB`", file=sys.stderr)
        return 2
    try:
        job = find(args[1], tsdb=jobdir.is_tsdb)
    except InputError as e:
        print(f"locate: {e}", file=sys.stderr)
        return 2
    print(json.dumps(jobdir.fingerprint(job.path.resolve(), job.dir.resolve() if job.dir else None, job.log)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
