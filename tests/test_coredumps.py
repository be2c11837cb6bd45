"""Core dumps (ENABLE_COREDUMPS=1): a crashing trainer leaves a whole core in the job directory,
with the binaries that read it recorded beside it, the JOB SUMMARY lists it and triage's next
steps open it; a stage stopped while a core is being written waits for the core first.

Needs a relative kernel.core_pattern (cores in the crashing process's working directory), as on
this project's machines; the test says so instead of passing when the machine sends cores elsewhere.
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, VENV, launcher_env, run

from helpers.jobs import log_has, summary, trainer_pid, wait_for, wait_log

HOST = socket.gethostname()
MIB = 1 << 20


def require_relative_core_pattern() -> None:
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith(("/", "|")):
        raise AssertionError(f"kernel.core_pattern={pattern!r} sends cores elsewhere; these tests need a relative one")


def dumping(pid: int) -> bool:
    try:
        return "CoreDumping:\t1" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.fixture(autouse=True)
def drop_the_cores(tmp_path: Path) -> Iterator[None]:
    """Each test's cores (0.65 and 0.8 GB) go when it ends, pass or fail: left in pytest's temp trees
    (three runs are kept) they would be written back to the disk while the suite's other tests run;
    removed at once, their pages are dropped unwritten."""
    yield
    for f in tmp_path.rglob("core*"):
        if f.is_file() and not f.is_symlink() and f.stat().st_size > MIB:
            f.unlink()


@pytest.mark.slow
@pytest.mark.heavy
def test_crashing_trainer_leaves_a_core_that_the_next_steps_open(workspace, venv):
    """Real MaxText on CPU, killed by SIGSEGV mid-training (what a crash in XLA looks like)."""
    require_relative_core_pattern()
    proc = subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=100000"],
        env={**os.environ, **launcher_env(workspace), "ENABLE_COREDUMPS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        log = wait_for(lambda: list(workspace.glob("local-*.log")), 60, "the log")[0]
        wait_log(log, "core dumps enabled", 90, "the trainer to start")
        job_id = log.name.split("-JAX-")[0]
        pid = wait_for(lambda: trainer_pid(job_id, 0), 30, "the trainer process")
        wait_log(log, r"completed step: 2,", 300, "training steps")
        os.kill(pid, signal.SIGSEGV)
        assert proc.wait(timeout=180) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    job_dir = log.with_suffix("")
    core_dir = job_dir / "cores" / HOST
    cores = sorted(core_dir.glob("core*"))
    assert len(cores) == 1 and cores[0].stat().st_size > 50 * MIB, cores
    s = summary(log)
    assert s["status"] == "failed" and s["failed_nodes"] == f"{HOST} (exit 139)", s
    assert s["cores"] == f"{cores[0]} ({cores[0].stat().st_size} bytes)", s
    context = dict(ln.split(": ", 1) for ln in (core_dir / "context.txt").read_text().splitlines())
    assert Path(context["python"]).is_file() and context["jax"] and context["maxtext"], context
    assert log_has(log, rf"^{HOST}: _train.sh: core dumps enabled: {core_dir} \(ulimit -c unlimited")

    tri = run([str(REPO / "utils/triage.py"), str(job_dir), "--json"], timeout=120)
    verdict = json.loads(tri.stdout)
    assert verdict["failure_class"] == "segfault" and verdict["culprit_hosts"] == [HOST], verdict
    spy = next(s for s in verdict["next_steps"] if " dump --core " in s)
    stacks = run(["bash", "-c", spy.split("   #")[0]], timeout=120)
    assert stacks.returncode == 0, stacks.stderr
    # the Python stack of the trainer at the crash: MaxText's training loop
    assert "train.py" in stacks.stdout and "Thread" in stacks.stdout, stacks.stdout[-2000:]
    gdb = next(s for s in verdict["next_steps"] if s.startswith("gdb "))
    assert shlex.split(gdb.split("   #")[0])[-2] == context["python"]


@pytest.mark.slow
@pytest.mark.heavy
def test_a_stopped_stage_waits_for_the_core_being_written(tmp_path):
    """A node stopped while its trainer is dumping (another node failed first) still leaves a
    whole core: run_stage.sh holds its SIGKILL until the dump ends. The trainer here is a
    stand-in (MST_PYTHON runs a script that fills 768 MiB and waits), started by the real
    _train.sh under the real run_stage.sh; COREDUMP_DIR puts the core outside the job dir, which
    links to it. The dump lasts 0.6-0.8 s on an idle core here (5.7 s at nice 19 beside two busy
    loops), so the test polls for it every 10 ms; and it is heavy: at nice 19 (the whole suite's
    background part) a poll every 0.25 s did not see the dump within 10 s once (CI, stop 33)."""
    require_relative_core_pattern()
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/bash\n"
        '[[ "${1:-}" == -I || "${2:-}" == - ]] && exec "$REAL_PYTHON" "$@"  # the version probes\n'
        'exec "$REAL_PYTHON" -c \'import os, time; b = b"\\x01" * (768 << 20); '
        'print("ready", os.getpid(), flush=True); time.sleep(600)\'\n'
    )
    fake.chmod(0o755)
    job_dir, elsewhere = tmp_path / "job", tmp_path / "scratch"
    job_dir.mkdir()
    env = {
        **os.environ,
        "REAL_PYTHON": str(VENV / "bin" / "python"),
        "MST_PYTHON": str(fake),
        "MST_REPO": str(REPO),
        "MODEL": "tiny",
        "JOB_DIR": str(job_dir),
        "JOB_NAME": "77-JAX-tiny",
        "JOB_HOSTNAME": "node7",
        "ENABLE_COREDUMPS": "1",
        "COREDUMP_DIR": str(elsewhere),
        "STAGE_STOP_GRACE": "0",
    }
    out = tmp_path / "stage.out"
    with out.open("w") as f:
        stage = subprocess.Popen(
            [str(REPO / "utils/launch/run_stage.sh"), "train", "300", str(REPO / "_train.sh")],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        line = wait_for(lambda: [ln for ln in out.read_text().splitlines() if " ready " in ln], 60, "the trainer")
        pid = int(line[0].split()[-1])
        os.kill(pid, signal.SIGSEGV)
        wait_for(lambda: dumping(pid), 10, "the core dump to start", period=0.01)
        started = time.monotonic()
        stage.send_signal(signal.SIGTERM)  # what srun does to a node when another node failed
        assert stage.wait(timeout=120) == 143
        waited = time.monotonic() - started
    finally:
        if stage.poll() is None:
            os.killpg(stage.pid, signal.SIGKILL)
    text = out.read_text()
    assert "node7: run_stage.sh: waiting (at most 120 s) for a core being written on node7" in text, text
    cores = list((elsewhere / "77-JAX-tiny" / "node7").glob("core*"))
    assert len(cores) == 1, cores
    assert cores[0].stat().st_size >= 768 * MIB, f"{cores[0].stat().st_size} bytes after {waited:.1f} s: cut short"
    assert (job_dir / "cores").resolve() == (elsewhere / "77-JAX-tiny").resolve()
    assert (job_dir / ".stages" / "train" / "node7").read_text().startswith("rc=143 ")
