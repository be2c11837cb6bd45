"""Helpers for tests that drive real jobs: submit, wait, read the JOB SUMMARY."""

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from conftest import REPO, launcher_env, run


def wait_for(pred: Callable[[], object], timeout: float, what: str, period: float = 0.25) -> object:
    """Poll pred() until it returns something truthy; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


SUBMITTED: list[str] = []  # job ids submitted by the running test (conftest cancels what is left)


def own_cache_if_several_nodes(args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """COMPILE_CACHE_DIR="" (the job's own cache in its workspace, not the suite's shared one) when
    submit.sh ARGS ask for more than one node. On CPU a rank 1 never hits the cache: JAX writes it from
    process 0 only, and rank 1's keys differ from rank 0's (three 2-node jobs on one cache, with
    JAX_EXPLAIN_CACHE_MISSES: rank 0 compiled jit_train_step once and then hit it; rank 1 missed it in
    every job, under a key of its own). With the shared cache rank 0 started from it while rank 1
    compiled, 38 s behind on a loaded machine (a CI run), past the 30 s in which the CPU's Gloo
    collectives must meet ("Gloo context initialization failed: DEADLINE_EXCEEDED"); with a cold cache
    of its own each rank compiles and they meet."""
    nodes = 1
    for i, a in enumerate(args):
        if a == "--":
            break
        value = args[i + 1] if a in ("-N", "--nodes") and i + 1 < len(args) else ""
        if a.startswith("--nodes="):
            value = a.split("=", 1)[1]
        elif a.startswith("-N") and a != "-N":
            value = a[2:]
        if m := re.match(r"\d+", value):
            nodes = int(m.group())
    return {"COMPILE_CACHE_DIR": ""} if nodes > 1 else {}


def submit(cluster: dict[str, str], workspace: Path, *args: str, **env: str) -> tuple[str, Path]:
    """submit.sh ARGS on the local cluster; returns (job id, log path)."""
    env = {**cluster, **launcher_env(workspace), **own_cache_if_several_nodes(args), **env}
    res = run([str(REPO / "submit.sh"), *args], env=env)
    assert res.returncode == 0, res.stderr
    m = re.search(r"Submitted job (\d+) \((\S+)\)", res.stdout)
    assert m, res.stdout
    SUBMITTED.append(m.group(1))
    return m.group(1), workspace / f"{m.group(1)}-{m.group(2)}.log"


def job_state(cluster: dict[str, str], job_id: str) -> str:
    out = run(["scontrol", "show", "job", "-o", job_id], env=cluster).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "UNKNOWN"


def wait_job_end(cluster: dict[str, str], job_id: str, timeout: float) -> str:
    def ended() -> str:
        state = job_state(cluster, job_id)
        return "" if state in {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING"} else state

    return str(wait_for(ended, timeout, f"job {job_id} to end"))


def summary(log: Path) -> dict[str, str]:
    """The JOB SUMMARY block at the end of a log, as a dict."""
    text = log.read_text(errors="replace")
    assert "==== JOB SUMMARY ====" in text, text[-3000:]
    block = text.rsplit("==== JOB SUMMARY ====", 1)[1].split("\n=====", 1)[0]
    return dict(line.split(": ", 1) for line in block.strip().splitlines() if ": " in line)


def log_has(log: Path, pattern: str) -> bool:
    return log.exists() and re.search(pattern, log.read_text(errors="replace"), re.M) is not None


def wait_log(log: Path, pattern: str, timeout: float, what: str, period: float = 0.25) -> None:
    """Wait until the job's LOG has a line matching PATTERN. Fails at once when the job ended without
    it (its JOB SUMMARY is written), else after TIMEOUT seconds; the failure shows the log's tail, so
    a job that crashed or crawled says which in the test's report."""
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if re.search(pattern, text, re.M):
            return
        ended = "==== JOB SUMMARY ====" in text
        if ended or time.monotonic() >= deadline:
            why = "the job ended" if ended else f"timed out after {timeout} s"
            tail = text[-4000:] or "(no log)"
            raise AssertionError(f"{why} waiting for {what} ({pattern!r} not in its log):\n{tail}")
        time.sleep(period)


def trainer_pid(job_id: str, rank: int) -> int | None:
    """The MaxText process of one rank of one job (found by its environment)."""
    out = subprocess.run(["pgrep", "-f", "maxtext.trainers.pre_train.train"], capture_output=True, text=True).stdout
    for pid in out.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if not Path(argv0.decode(errors="replace")).name.startswith("python"):
            continue  # a wrapper whose command line names the trainer (timeout, bash): not the trainer
        if f"JOB_ID={job_id}".encode() in env and f"NODE_RANK={rank}".encode() in env:
            return int(pid)
    return None


def triage(job: Path | str, cluster: dict[str, str] | None = None, *args: str) -> dict:
    """utils/triage.py JOB --json, as an agent runs it (exit 0 expected for any job state)."""
    res = run([str(REPO / "utils/triage.py"), str(job), "--json", *args], env=cluster)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


def bad_job_arg(kind: str, tmp_path: Path) -> str:
    """A JOB argument of one bad kind for the tools' bad-input tests, made under tmp_path: binary,
    text or empty file, "dir" (a directory that is no job directory), "fifo", "dangling" (a symlink
    to nothing), "long" (a name longer than the file system allows); any other kind is passed
    through (a missing id or path, '', '.')."""
    files = {
        "binary": ("x.log", b"\x7fELF\0\0\0" * 100),
        "text": ("notes.txt", b"shopping list\nmilk\n"),
        "empty": ("empty.log", b""),
    }
    if kind in files:
        name, data = files[kind]
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)
    if kind == "dir":
        (tmp_path / "photos").mkdir()
        return str(tmp_path / "photos")
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.log")
        return str(tmp_path / "pipe.log")
    if kind == "dangling":
        (tmp_path / "gone.log").symlink_to(tmp_path / "nothing-here")
        return str(tmp_path / "gone.log")
    if kind == "long":
        return "7" * 300
    return kind
