"""RAY=1 security without a Slurm job: the exporter's state dir (defect 2 of issue 7), a node
whose private scratch cannot be made (the job fails, no fallback), a node that finds the Ray token
missing or not private, and a one-node Ray cluster: all of it on loopback, token-authenticated,
driven by the real _ray_actor.py. The 2-node job's sockets are checked in test_ray_job.py."""

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest
from conftest import REPO, VENV, run

from helpers.raynet import grpc_code, http_status, job_processes, listeners

UTILS = REPO / "utils"
NOBODY = 65534  # the other user


def exporter_once(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """One poll of the exporter with a plugin that reports its state dir, that dir's parent's mode, and
    leaves a file and a FIFO there (what a stateful plugin may keep in it)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "probe_metrics_plugin.sh").write_text(
        'touch "$METRICS_STATE_DIR/mark"; mkfifo "$METRICS_STATE_DIR/req" 2>/dev/null\n'
        'parent=$(dirname "$METRICS_STATE_DIR")\n'
        'echo "state_info{dir=\\"$parent\\",mode=\\"$(stat -c %a "$parent")\\"} 1"\n'
    )
    return run(
        [
            sys.executable,
            str(UTILS / "observe" / "metrics_exporter.py"),
            "--once",
            "--plugin-dir",
            str(plugins),
            "--host",
            "n1",
            "--job-dir",
            str(tmp_path),
            *args,
        ],
        env=env,
        timeout=60,
    )


def test_exporter_makes_a_private_state_dir_and_ignores_the_old_predictable_one(tmp_path):
    node_tmp = tmp_path / "tmp"
    node_tmp.mkdir()
    node_tmp.chmod(0o1777)
    # another user made the path the exporter used to take, waiting for the FIFOs
    trap = node_tmp / f"metrics_exporter-{os.getuid()}-4242-n1"
    trap.mkdir()
    os.chown(trap, NOBODY, NOBODY)
    trap.chmod(0o777)
    res = exporter_once(tmp_path, env={"TMPDIR": str(node_tmp), "JOB_ID": "4242"})
    assert res.returncode == 0, res.stderr
    line = next((x for x in res.stdout.splitlines() if x.startswith("state_info{")), "")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert "dir" in labels, res.stdout
    used, mode = labels["dir"], labels["mode"]
    assert Path(used).parent == node_tmp and Path(used) != trap and Path(used).name.startswith("metrics_exporter-")
    assert mode == "700"
    assert not Path(used).exists(), "the exporter's own temporary state dir was left behind"
    assert list(trap.iterdir()) == [], "the exporter wrote into the other user's directory"


@pytest.mark.parametrize("kind", ["other user's", "symlink", "group-readable", "a file"])
def test_exporter_refuses_a_state_dir_that_is_not_private(tmp_path, kind):
    target = tmp_path / "state"
    mine = tmp_path / "mine"  # a private dir of ours a link could point at
    mine.mkdir(mode=0o700)
    if kind == "other user's":
        target.mkdir(mode=0o700)
        os.chown(target, NOBODY, NOBODY)
    elif kind == "symlink":
        target.symlink_to(mine)
    elif kind == "group-readable":
        target.mkdir()
        target.chmod(0o755)
    else:
        target.write_text("")
    res = exporter_once(tmp_path, "--state-dir", str(target))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"metrics_exporter.py: --state-dir {target}"), res.stderr
    assert "mode 0700" in lines[0] and res.stdout == ""
    assert list(mine.iterdir()) == [] and (not target.is_dir() or target.is_symlink() or list(target.iterdir()) == [])


def test_exporter_makes_a_missing_state_dir_private(tmp_path):
    res = exporter_once(tmp_path, "--state-dir", str(tmp_path / "new"))
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    assert (tmp_path / "new" / "probe" / "mark").exists()


def job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    return {
        "JOB_DIR": str(job_dir),
        "JOB_ID": f"sec-{uuid.uuid4().hex[:8]}",
        "JOB_HOSTNAME": "h1",
        "JOB_NUM_NODES": "1",
        "JOB_NODELIST": "h1",
        "JOB_NODE_RANK": "0",
        "MST_REPO": str(REPO),
        "MST_PYTHON": str(VENV / "bin" / "python"),
        **extra,
    }


def test_no_private_scratch_no_job(tmp_path):
    """RAY=1 on a node where the private scratch cannot be made: one clear line, the node fails, and it
    neither falls back to the plain launch nor starts anything."""
    env = job_env(tmp_path, TMPDIR=str(tmp_path / "no-such-dir"))
    res = run([str(REPO / "_train_with_ray.sh")], env=env, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.strip() == (
        f"_train_with_ray.sh: cannot create a private directory in '{tmp_path}/no-such-dir' "
        "(set TMPDIR to a writable node-local directory)"
    )
    assert "falling back" not in res.stdout and not (Path(env["JOB_DIR"]) / "ray" / "head").exists()
    assert job_processes(Path(env["JOB_DIR"])) == {}


@pytest.mark.parametrize("flaw", ["missing", "file readable by others", "dir open to others", "other user's"])
def test_a_node_does_not_start_ray_without_a_private_token(tmp_path, flaw):
    env = job_env(tmp_path, JOB_NUM_NODES="2", MST_JOB_SCRATCH=tempfile.mkdtemp(dir=tmp_path))
    auth = Path(env["JOB_DIR"]) / "ray" / "auth"
    if flaw != "missing":
        auth.mkdir(parents=True, mode=0o700)
        (auth / "token").write_text("0" * 64)
        (auth / "token").chmod(0o600)
    if flaw == "file readable by others":
        (auth / "token").chmod(0o644)
    elif flaw == "dir open to others":
        auth.chmod(0o755)
    elif flaw == "other user's":
        os.chown(auth / "token", NOBODY, NOBODY)
    res = run([str(UTILS / "observe" / "ray_cluster.sh"), "worker", "127.0.0.1", "127.0.0.1:6379"], env=env, timeout=60)
    assert res.returncode == 1 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.strip() == (
        f"ray_cluster.sh: the Ray token '{auth}/token' is missing or not private (want: "
        f"directory 0700, file 0600, owned by {pwd.getpwuid(os.getuid()).pw_name}); "
        "not starting Ray without it"
    )
    assert job_processes(Path(env["JOB_DIR"])) == {}


def test_head_refuses_a_token_dir_made_before_it(tmp_path):
    env = job_env(tmp_path, MST_JOB_SCRATCH=tempfile.mkdtemp(dir=tmp_path))
    auth = Path(env["JOB_DIR"]) / "ray" / "auth"
    auth.mkdir(parents=True, mode=0o777)  # someone else's, made first, where the head would put the token
    os.chown(auth, NOBODY, NOBODY)
    res = run([str(UTILS / "observe" / "ray_cluster.sh"), "head", "127.0.0.1"], env=env, timeout=60)
    assert res.returncode == 1 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.strip() == (
        f"ray_cluster.sh: cannot create '{auth}' for the Ray token (it must not exist before the job starts)"
    )
    assert list(auth.iterdir()) == []


@pytest.mark.slow
@pytest.mark.heavy
def test_one_node_ray_is_on_loopback_and_authenticated(tmp_path):
    """The single-machine case (run_local.sh RAY=1, submit.sh -N 1): every Ray port on 127.0.0.1, each
    refusing a caller without the token; the real driver (_ray_actor.py) connects with the token and
    its actor finds the node's saved environment through MST_JOB_SCRATCH inherited from the raylet."""
    scratch = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))  # short: Ray puts Unix sockets below it
    repo = tmp_path / "repo"  # a stand-in launcher: its _container.sh is the "trainer"
    repo.mkdir()
    (repo / "_container.sh").write_text('#!/bin/sh\necho "trained as $WHO, $1"\n')
    (repo / "_container.sh").chmod(0o755)
    env = job_env(tmp_path, MST_JOB_SCRATCH=str(scratch))
    job_dir = Path(env["JOB_DIR"])
    (scratch / "job.env").write_bytes(f"WHO=saved-env\0JOB_DIR={job_dir}\0PATH=/usr/bin:/bin\0".encode())
    (scratch / "job.env").chmod(0o600)
    try:
        res = run([str(UTILS / "observe" / "ray_cluster.sh"), "head", "127.0.0.1"], env=env, timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        address, dash_port, token_file = res.stdout.split()
        assert address.startswith("127.0.0.1:") and token_file == str(job_dir / "ray" / "auth" / "token")
        token = Path(token_file).read_text()
        socks = listeners(job_processes(job_dir))
        assert len(socks) >= 8 and [s for s in socks if not s.loopback] == [], socks
        gcs_port = int(address.rsplit(":", 1)[1])
        method = "/ray.rpc.NodeInfoGcsService/GetClusterId"
        assert grpc_code("127.0.0.1", gcs_port, method, None) == grpc.StatusCode.UNAUTHENTICATED
        assert grpc_code("127.0.0.1", gcs_port, method, token) == grpc.StatusCode.OK
        url = f"http://127.0.0.1:{dash_port}/api/jobs/"
        assert http_status("POST", url, None, b'{"entrypoint": "id"}')[0] == 401
        assert http_status("POST", url, token, b"{}")[0] == 400
        # the driver does not know the scratch: the actor learns it from its node's raylet
        driver_env = {k: v for k, v in env.items() if k != "MST_JOB_SCRATCH"}
        drv = run(
            [str(VENV / "bin" / "python"), str(REPO / "_ray_actor.py")],
            timeout=180,
            env={
                **driver_env,
                "MST_REPO": str(repo),
                "RAY_ADDRESS": address,
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": token_file,
                "MST_RAY_JOIN_TIMEOUT": "60",
            },
        )
        assert drv.returncode == 0, drv.stdout[-2000:] + drv.stderr[-2000:]
        assert "h1: trained as saved-env, _train.sh" in drv.stdout.splitlines(), drv.stdout
    finally:
        run([str(UTILS / "observe" / "ray_cluster.sh"), "stop"], env=env, timeout=60)
        shutil.rmtree(scratch, ignore_errors=True)


def take_when_picked(owner: str, taken: socket.socket, stop: threading.Event, got: list[int]) -> None:
    """Listen on the port of this job's first `ray start --head --port=PORT` as soon as it runs (after
    ray_cluster.sh picked PORT free, before Ray's GCS binds it: the ~2 s the CLI takes to start), as
    another job's head would. The job's own (MST_RAY_OWNER=OWNER): other jobs may start Ray meanwhile."""
    marker = f"MST_RAY_OWNER={owner}".encode()
    while not stop.is_set():
        for p in Path("/proc").iterdir():
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0") if p.name.isdigit() else []
                if b"--head" not in argv or marker not in (p / "environ").read_bytes().split(b"\0"):
                    continue
            except OSError:
                continue
            port = next((int(a[7:]) for a in argv if a.startswith(b"--port=")), None)
            if port is not None:
                taken.bind(("0.0.0.0", port))  # every address, as a GCS binds it
                taken.listen()
                got.append(port)
                return
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.heavy
def test_a_head_whose_port_was_taken_after_the_pick_starts_on_other_ports(tmp_path):
    """Two jobs starting Ray on one node at the same moment can pick the same free port; the head that
    binds second must not lose Ray. Here another socket takes the GCS port the head picked right after
    the pick; the head stops what it started and comes up on other ports, saying so."""
    scratch = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    env = job_env(tmp_path, MST_JOB_SCRATCH=str(scratch))
    stop, picked = threading.Event(), []
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past a TIME_WAIT of an earlier run
        owner = f"{env['JOB_ID']}:{env['JOB_HOSTNAME']}"
        thief = threading.Thread(target=take_when_picked, args=(owner, taken, stop, picked), daemon=True)
        thief.start()
        try:
            res = run([str(UTILS / "observe" / "ray_cluster.sh"), "head", "127.0.0.1"], env=env, timeout=300)
            assert not thief.is_alive(), "the head never ran ray start with the picked port"
            assert res.returncode == 0, res.stderr[-3000:]
            address, _, _ = res.stdout.split()
            assert address.startswith("127.0.0.1:") and address != f"127.0.0.1:{picked[0]}", (address, picked)
            assert "the Ray head did not start on h1 (try 1 of 3; a port taken meanwhile)" in res.stderr, res.stderr
            with socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=10):
                pass  # the head's GCS answers on its new port
        finally:
            stop.set()
            run([str(UTILS / "observe" / "ray_cluster.sh"), "stop"], env=env, timeout=60)
            shutil.rmtree(scratch, ignore_errors=True)
    # what stop killed is gone a moment later
    deadline = time.monotonic() + 15
    while (left := job_processes(Path(env["JOB_DIR"]))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == {}, f"the head's first try or its stop left Ray processes running: {left}"


def test_a_process_that_ended_while_stop_looks_is_read_quietly():
    """ray_cluster.sh reads /proc/PID/stat of each process it stops until it has ended; one that has
    gone (reaped) is ended, with nothing on stderr (a CI run's job log held 311 lines of
    "/proc/21585/stat: No such file or directory" from one stop)."""
    fn = re.search(r"^stat_fields\(\) \{.*?^\}", (UTILS / "observe" / "ray_cluster.sh").read_text(), re.M | re.S)
    assert fn, "stat_fields not found in ray_cluster.sh"
    gone = subprocess.Popen(["true"])
    gone.wait()
    script = (
        f'{fn.group()}\nstat_fields /proc/{gone.pid}/stat f; echo "gone $?"\n'
        'stat_fields /proc/$$/stat f; echo "here $? ${f[0]}"'
    )
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert (res.stdout, res.stderr) == ("gone 1\nhere 0 R\n", ""), (res.stdout, res.stderr)


@pytest.mark.serial  # stop takes under 4 s
def test_stop_ends_the_unmarked_children_of_rays_processes_but_not_another_session(tmp_path):
    """ray_cluster.sh stop finds the job's Ray processes by MST_RAY_OWNER in their environment. Ray's
    agents overwrite theirs, so their children in the same session go too; a child in a session of its
    own (the trainer and its guard: the guard must outlive a stop that Slurm cuts short) is left. The
    marked parent is this test's child, unreaped until stop returns: a zombie is not waited on (the
    grace for what ignores SIGTERM is 5 s)."""
    env = job_env(tmp_path)
    owner = f"{env['JOB_ID']}:{env['JOB_HOSTNAME']}"
    script = "env -i sleep 300 & echo $! > agent; setsid env -i sleep 300 & echo $! > guard; echo ready > up; wait"
    raylet = subprocess.Popen(
        ["bash", "-c", script], cwd=tmp_path, env={**os.environ, "MST_RAY_OWNER": owner}, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "up").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        agent, guard = (int((tmp_path / name).read_text()) for name in ("agent", "guard"))
        t0 = time.monotonic()
        res = run([str(UTILS / "observe" / "ray_cluster.sh"), "stop"], env=env, timeout=60)
        took = time.monotonic() - t0
        assert res.returncode == 0, res.stderr
        assert took < 4, f"stop waited {took:.1f} s on processes that had ended"
        raylet.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{agent}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{agent}").exists() or "Z" in Path(f"/proc/{agent}/stat").read_text().split(")")[-1][:3]
        assert Path(f"/proc/{guard}").exists(), "a process in its own session is not Ray's to stop"
    finally:
        raylet.kill()
        for name in ("agent", "guard"):
            if (tmp_path / name).exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int((tmp_path / name).read_text()), signal.SIGKILL)
