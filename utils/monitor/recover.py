"""Self-healing (utils/job_monitor.py --auto-recover N): resubmit a job that failed or hung
because of specific nodes, without them, from the same code snapshot (docs/job-monitor.md).

`plan()` decides from triage's report alone; `resubmit()` runs the snapshot's own submit.sh with
the recorded command plus --exclude, only for the snapshot named in <job dir>/snapshot.sha256 (never
the `artifact` link) once it is ours, nobody else can write it, and its content hash, computed
again by this monitor's own _job.sbatch, is the one submit.sh recorded. The job's run alias
(--run) makes the new job restore the latest checkpoint; a job without one starts over (the
notification says so).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import trust
from monitor import store
from trust import UntrustedPath

# classes that name nodes at fault rather than the job itself (docs/triage.md); never config
# errors, out of memory, NaN loss or the job's own exceptions
NODE_CLASSES = ("node_failure", "gpu_health", "gpu_error", "heartbeat_timeout", "collective_error", "hang", "slowdown")
# (slowdown: not triage's; job_monitor.py --recover-slowdowns sets it for a diagnose verdict scoped to some hosts)


class RecoverError(RuntimeError):
    """The job cannot be resubmitted (one line: why)."""


def plan(report: dict, nodes: list[str]) -> tuple[list[str], str]:
    """(nodes to exclude, why): empty when the failure is not one to recover from. A process
    SIGKILLed without an out-of-memory message (triage: oom_host with confidence low, "killed")
    was killed from outside the job: a node fault too; a real host OOM is the job's own use."""
    cls = report.get("failure_class")
    culprits = [h for h in report.get("culprit_hosts") or [] if h in nodes] if nodes else []
    if cls == "oom_host" and report.get("confidence") == "low" and len(culprits) == 1:
        cls = "killed"
    if cls not in NODE_CLASSES and cls != "killed":
        return [], f"not recovering: {cls or report.get('status') or 'unclassified'} is not a node fault"
    if report.get("scope") == "fleet":  # the job or what every node shares: excluding nodes cannot help
        return [], f"not recovering: {cls} is fleet-wide (no culprit node)"
    if not culprits:
        return [], f"not recovering: {cls} without a culprit node"
    if len(culprits) >= len(nodes):
        return [], f"not recovering: {cls} blames every node ({' '.join(culprits)})"
    return culprits, f"{cls} on {' '.join(culprits)}"


RECORD = "snapshot.sha256"  # <job dir>/snapshot.sha256: "<64 hex>  <snapshot path>", written by submit.sh
REPO = Path(__file__).resolve().parents[2]  # this monitor's own checkout: its _job.sbatch hashes snapshots


def recorded_snapshot(job_dir: Path, jd: store.Dir) -> tuple[str, Path]:
    """(hash, snapshot) from the job's snapshot record, read through the trusted job directory."""
    where = job_dir / RECORD
    try:
        data = jd.read(RECORD, "the snapshot record", limit=4096)
    except UntrustedPath as e:
        raise RecoverError(str(e)) from None
    if data is None:
        raise RecoverError(f"no snapshot record {where} (a job submitted before it was written): resubmit it yourself")
    m = re.fullmatch(rb"([0-9a-f]{64})  (/[^\n]+)\n?", data)
    snap = m and os.fsdecode(m.group(2))
    if not m or not snap or os.path.normpath(snap) != snap:
        raise RecoverError(f"the snapshot record {where} is not '<sha256>  <absolute snapshot path>'")
    return m.group(1).decode(), Path(snap)


def check_snapshot(snap: Path, ws: Path) -> None:
    """The snapshot and every directory between the job's workspace and it are ours and writable by
    us only, and so is everything in it (links aside: their targets are in the hash), so that what
    is hashed is what runs. RecoverError otherwise."""
    roots = [r for r in (ws, Path(os.path.realpath(ws))) if snap.is_relative_to(r)]
    if not roots:
        raise RecoverError(f"refusing the snapshot {snap}: it is not under the job's workspace {ws}")
    try:
        trust.check_under(roots[0], snap, "the job's snapshot", store.ADVICE)
        for top, dirs, files in os.walk(snap):
            for name in dirs + files:
                p = os.path.join(top, name)
                st = os.lstat(p)
                if not stat.S_ISLNK(st.st_mode) and (why := trust.problem(st, p)):
                    raise UntrustedPath(f"refusing the job's snapshot {snap}: {p} {why}")
    except (UntrustedPath, OSError) as e:
        raise RecoverError(str(e)) from None


def snapshot_hash(snap: Path) -> str:
    """The snapshot's content hash by this monitor's own _job.sbatch (never the snapshot's)."""
    try:
        res = subprocess.run(
            ["bash", str(REPO / "_job.sbatch"), "--snapshot-hash", str(snap)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise RecoverError(f"cannot hash the snapshot {snap}: {e}") from None
    h = res.stdout.strip()
    if res.returncode != 0 or not re.fullmatch(r"[0-9a-f]{64}", h):
        raise RecoverError(f"cannot hash the snapshot {snap}: {(res.stderr.strip() or h)[:300]}")
    return h


def verified_snapshot(job_dir: Path, jd: store.Dir) -> Path:
    """The job's snapshot, from its record only (never the `artifact` link), checked (ours, no link,
    nobody else can write it) and hashed again: its content is what submit.sh recorded."""
    want, snap = recorded_snapshot(job_dir, jd)
    check_snapshot(snap, job_dir.parent)
    got = snapshot_hash(snap)
    if got != want:
        raise RecoverError(
            f"refusing the job's snapshot {snap}: its content hash {got[:12]}... is not the {want[:12]}... "
            f"recorded at submit ({job_dir / RECORD}); it changed since: resubmit it yourself"
        )
    return snap


def command_of(snap: Path) -> tuple[Path, list[str]]:
    """The snapshot's submit.sh and the recorded arguments (<snapshot>/.submit/command.txt)."""
    try:
        data = store.read_file(snap / ".submit" / "command.txt", "the recorded command", snap / ".submit/command.txt")
        text = (data or b"").decode(errors="replace").splitlines()[0]
    except (OSError, IndexError, UntrustedPath) as e:
        raise RecoverError(f"no recorded submit command in {snap}/.submit/command.txt ({e})") from None
    if "=<redacted>" in text:
        raise RecoverError("the recorded command had secrets redacted: resubmit it yourself")
    argv = shlex.split(text)
    if not argv or Path(argv[0]).name != "submit.sh":
        raise RecoverError(f"the recorded command is not a submit.sh command: {text[:200]}")
    return snap / "submit.sh", without_monitor(argv[1:])


def without_monitor(args: list[str]) -> list[str]:
    """args less --notify, --auto-recover N and --recover-slowdowns (before "--"): the monitor that
    resubmits watches the new job itself, with what is left of its budget."""
    cut = args.index("--") if "--" in args else len(args)
    out, i = [], 0
    while i < cut:
        if args[i] in ("--notify", "--recover-slowdowns") or args[i].startswith("--auto-recover="):
            i += 1
        elif args[i] == "--auto-recover":
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out + args[cut:]


def with_exclude(args: list[str], hosts: list[str]) -> list[str]:
    """args with --exclude=LIST before "--", merged with the hosts args already excluded."""
    cut = args.index("--") if "--" in args else len(args)
    head, tail = args[:cut], args[cut:]
    have: list[str] = []
    out: list[str] = []
    i = 0
    while i < len(head):
        a = head[i]
        if a in ("--exclude", "-x") and i + 1 < len(head):
            have += head[i + 1].split(",")
            i += 2
            continue
        m = re.fullmatch(r"(?:--exclude=|-x)(.+)", a)
        if m:
            have += m.group(1).split(",")
        else:
            out.append(a)
        i += 1
    merged = list(dict.fromkeys([*have, *hosts]))
    return [*out, f"--exclude={','.join(merged)}", *tail]


def resubmit(job_dir: Path, jd: store.Dir, exclude: list[str], header: dict[str, str]) -> dict[str, str]:
    """Submit the job again without `exclude`, from its verified snapshot (`jd`: the job directory,
    held open and trusted): {job_id, name, log, job_dir, command}."""
    submit, args = command_of(verified_snapshot(job_dir, jd))
    if not os.access(submit, os.X_OK):
        raise RecoverError(f"{submit} is not there or not executable")
    args = with_exclude(args, exclude)
    env = {**os.environ, "JOB_WORKSPACE": str(job_dir.parent)}
    repo = REPO  # this checkout: its environment and site file
    if (repo / ".venv").is_dir():
        env.setdefault("MAXTEXT_SLURM_VENV", str(repo / ".venv"))
    if (repo / "configs" / "site.env.sh").is_file():
        env.setdefault("MST_SITE_FILE", str(repo / "configs" / "site.env.sh"))
    if header.get("ray") in ("0", "1"):
        env["RAY"] = header["ray"]  # the observability the job had
    for var in ("MST_NOTIFY", "MST_AUTO_RECOVER"):
        env.pop(var, None)  # the monitor that resubmits watches the new job itself
    try:
        res = subprocess.run([str(submit), *args], capture_output=True, text=True, env=env, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise RecoverError(f"submit.sh did not run: {e}") from None
    m = re.search(r"^Submitted job (\S+) \((\S+)\)", res.stdout, re.M)
    if res.returncode != 0 or not m:
        last = (res.stderr.strip() or res.stdout.strip()).splitlines()
        raise RecoverError(f"submit.sh failed: {last[-1] if last else f'exit {res.returncode}'}")
    name = f"{m.group(1)}-{m.group(2)}"
    return {
        "job_id": m.group(1),
        "name": name,
        "job_dir": str(job_dir.parent / name),
        "command": "submit.sh " + shlex.join(args),
    }
