"""Self-healing (utils/job_monitor.py --auto-recover N): resubmit a job that failed or hung
because of specific nodes, without them, from the same code snapshot (docs/job-monitor.md).

`plan()` decides from triage's report alone; `resubmit()` runs the snapshot's own submit.sh with
the recorded command plus --exclude. The job's run alias (--run) makes the new job restore the
latest checkpoint; a job without one starts over (the notification says so).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

# classes that name nodes at fault rather than the job itself (docs/triage.md); never config
# errors, out of memory, NaN loss or the job's own exceptions
NODE_CLASSES = ("node_failure", "gpu_health", "heartbeat_timeout", "collective_error", "hang")


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
    if not culprits:
        return [], f"not recovering: {cls} without a culprit node"
    if len(culprits) >= len(nodes):
        return [], f"not recovering: {cls} blames every node ({' '.join(culprits)})"
    return culprits, f"{cls} on {' '.join(culprits)}"


def command_of(job_dir: Path) -> tuple[Path, list[str]]:
    """The snapshot's submit.sh and the recorded arguments (artifact/.submit/command.txt)."""
    snap = (job_dir / "artifact").resolve()
    try:
        text = (snap / ".submit" / "command.txt").read_text().splitlines()[0]
    except (OSError, IndexError) as e:
        raise RecoverError(f"no recorded submit command in {snap}/.submit/command.txt ({e})") from None
    if "=<redacted>" in text:
        raise RecoverError("the recorded command had secrets redacted: resubmit it yourself")
    argv = shlex.split(text)
    if not argv or Path(argv[0]).name != "submit.sh":
        raise RecoverError(f"the recorded command is not a submit.sh command: {text[:200]}")
    return snap / "submit.sh", without_monitor(argv[1:])


def without_monitor(args: list[str]) -> list[str]:
    """args less --notify and --auto-recover N (before "--"): the monitor that resubmits watches
    the new job itself, with what is left of its budget."""
    cut = args.index("--") if "--" in args else len(args)
    out, i = [], 0
    while i < cut:
        if args[i] == "--notify" or args[i].startswith("--auto-recover="):
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


def resubmit(job_dir: Path, exclude: list[str], header: dict[str, str]) -> dict[str, str]:
    """Submit the job again without `exclude`: {job_id, name, log, job_dir, command}."""
    submit, args = command_of(job_dir)
    if not os.access(submit, os.X_OK):
        raise RecoverError(f"{submit} is not there or not executable")
    args = with_exclude(args, exclude)
    env = {**os.environ, "JOB_WORKSPACE": str(job_dir.parent)}
    repo = Path(__file__).resolve().parents[2]  # this checkout: its environment and site file
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
