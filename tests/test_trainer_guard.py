"""A RAY=1 trainer runs outside the Slurm step (a Ray actor's child, in a session of its own): its guard
(utils/observe/trainer_guard.py) stops it once the node's launcher is gone, a trainer that ignores
SIGTERM included, and leaves it alone while the launcher lives. Real processes throughout: a `sleep`
stands for the launcher, a bash process group (with a child) for the trainer. The whole cancelled
RAY=1 job is tests/test_ray_job.py::test_scancel_leaves_nothing_of_a_ray_job_running."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUARD = REPO / "utils" / "observe" / "trainer_guard.py"


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


trainer_guard = load("trainer_guard", GUARD)
ray_actor = load("ray_actor", REPO / "_ray_actor.py")

# a trainer: a shell that ignores SIGTERM (as a trainer busy in a collective may) and a child of it
STUBBORN = "trap '' TERM; sleep 300 & wait; wait"


def trainer(script: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def members(pgid: int) -> list[int]:
    """The running (not zombie) processes of a process group, from /proc."""
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and (fields := trainer_guard.running_stat(p.name)) and fields[2] == str(pgid)
    ]


def started(group: subprocess.Popen) -> None:
    """Until the STUBBORN trainer runs as a shell ignoring SIGTERM and its sleep."""
    deadline = time.monotonic() + 10
    while len(members(group.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(members(group.pid)) == 2


def reap_in_background(proc: subprocess.Popen) -> None:
    threading.Thread(target=proc.wait, daemon=True).start()


def test_the_launchers_end_stops_a_trainer_that_ignores_sigterm():
    launcher = subprocess.Popen(["sleep", "300"])
    group = trainer(STUBBORN)
    reap_in_background(group)
    try:
        started(group)
        done = []
        watcher = threading.Thread(target=lambda: done.append(trainer_guard.guard(launcher.pid, group.pid, 0.05, 0.5)))
        watcher.start()
        time.sleep(0.4)
        assert members(group.pid), "the guard stopped a trainer while its launcher lived"
        launcher.kill()
        launcher.wait()
        watcher.join(10)
        assert done == [True]
        assert members(group.pid) == []
    finally:
        launcher.kill()
        if members(group.pid):
            os.killpg(group.pid, signal.SIGKILL)


@pytest.mark.serial  # the guard ends within 5 s of its trainer
def test_a_trainer_that_ends_takes_its_guard_and_nothing_else_with_it():
    launcher = subprocess.Popen(["sleep", "300"])
    group = trainer("sleep 0.5")
    try:
        started = time.monotonic()
        guard = subprocess.Popen([str(GUARD), str(launcher.pid), str(group.pid)], start_new_session=True)
        group.wait()
        assert guard.wait(10) == 0
        assert time.monotonic() - started < 5
        assert launcher.poll() is None, "the guard touched the launcher"
    finally:
        launcher.kill()


@pytest.mark.serial  # not the 5 s grace: under 2 s
def test_a_group_left_with_an_unreaped_process_is_not_waited_on():
    """A trainer that ended but whose parent has not reaped it yet (a zombie: signals reach it, it runs
    nothing) does not hold the guard for the whole grace."""
    group = trainer("exit 0")
    deadline = time.monotonic() + 10
    while not trainer_guard.group_alive(group.pid) or trainer_guard.live_members(group.pid):
        assert time.monotonic() < deadline, "the trainer did not end"
        time.sleep(0.05)
    started = time.monotonic()
    trainer_guard.stop_group(group.pid, grace=5.0)
    assert time.monotonic() - started < 2
    group.wait()


def test_a_reused_launcher_pid_is_not_taken_for_the_launcher(monkeypatch: pytest.MonkeyPatch):
    """The launcher is known by its start time: the same pid with another start time is a new process."""
    launcher = subprocess.Popen(["sleep", "300"])
    group = trainer(STUBBORN)
    reap_in_background(group)
    started(group)
    real = trainer_guard.start_time(launcher.pid)
    looks = iter([real, real, "1"])  # the first look, one while it lives, then a process started at tick 1
    monkeypatch.setattr(trainer_guard, "start_time", lambda pid: next(looks))
    try:
        assert trainer_guard.guard(launcher.pid, group.pid, 0.05, 0.3) is True
        assert members(group.pid) == []
    finally:
        launcher.kill()


def test_the_actor_starts_a_guard_with_its_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """_ray_actor.py NodeTrainer (without Ray, as in test_ray_actor_lines.py) reads the launcher's pid
    from the node's private scratch; the trainer dies with the launcher, its exit recorded."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    (scratch / "job.env").write_bytes(b"PATH=" + os.environb.get(b"PATH", b"/usr/bin:/bin") + b"\0")
    launcher = subprocess.Popen(["sleep", "300"])
    (scratch / "launcher.pid").write_text(f"{launcher.pid}\n")
    monkeypatch.setenv("MST_JOB_SCRATCH", str(scratch))
    monkeypatch.delenv("MST_REPO", raising=False)
    script = "import time; print('step 0', flush=True); time.sleep(300)"
    node = ray_actor.NodeTrainer("n1", [sys.executable, "-c", script])
    node.env["JOB_DIR"] = str(tmp_path / "job")
    assert node.launcher == launcher.pid
    pid = node.start()
    try:
        assert node.drain(wait=30)[0] == [b"step 0"]
        launcher.kill()  # not reaped: an ended launcher counts as gone before its parent waits for it
        deadline = time.monotonic() + 15
        rc = None
        while rc is None and time.monotonic() < deadline:
            rc = node.drain(wait=1.0)[1]
        assert rc == 128 + signal.SIGTERM
        assert (tmp_path / "job" / ".stages" / "train" / "n1").read_text().startswith(f"rc={rc} ")
    finally:
        launcher.kill()
        if members(pid):
            os.killpg(pid, signal.SIGKILL)


def test_no_launcher_pid_no_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    (scratch / "job.env").write_bytes(b"PATH=/usr/bin:/bin\0")
    monkeypatch.setenv("MST_JOB_SCRATCH", str(scratch))
    assert ray_actor.NodeTrainer("n1", ["true"]).launcher is None
    (scratch / "launcher.pid").write_text("not a pid\n")
    assert ray_actor.NodeTrainer("n1", ["true"]).launcher is None


@pytest.mark.parametrize("args", [[], ["12"], ["12", "x"], ["1", "12"], ["12", "13", "14"]])
def test_bad_input_is_one_line_and_exit_2(args: list[str]):
    res = subprocess.run([str(GUARD), *args], capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2
    assert res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and "LAUNCHER_PID TRAINER_PGID" in res.stderr, res.stderr
