#!/usr/bin/env python3
"""Usage: _ray_actor.py

Ray driver of a RAY=1 job, run on the head node by _train_with_ray.sh once every node's Ray
worker has joined. It places one thin actor on each node (pinned by the node's custom resource
mst_host_<host>); each actor spawns `_train.sh` as a plain subprocess with exactly the job
environment that node's launcher saved in the node's private scratch ($MST_JOB_SCRATCH/job.env;
the actor inherits MST_JOB_SCRATCH from its node's raylet), so the trainer has no Ray threads and
sees no Ray variables, and hands its output back line by line. Beside each trainer it starts
utils/observe/trainer_guard.py, which stops the trainer once the node's launcher is gone (a
cancelled job's cleanup cut short by Slurm). The driver prints every line as
"<host>: <line>", records each node's outcome in $JOB_DIR/.stages/train/<host>, and when one
node's training exits non-zero it stops the others at once and exits with that status.

The driver, like every Ray process of the job, authenticates with the job's token
(RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH). A cluster on 127.0.0.1 (a one-node job) needs
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the driver too, which is set here.

Exit status: the first failing node's status, 0 when all succeed, 200 when Ray itself could not
run the job (the launcher then falls back to the plain launch; the reason, one line, is also
written to MST_RAY_REASON_FILE when that is set, for the OBSERVE block).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

RAY_UNUSABLE = 200
DRAIN_WAIT = 5.0  # seconds a node's drain call may wait for output or its exit
DRAIN_LINGER = 0.3  # seconds it then gathers more lines before answering


def host_resource(host: str) -> str:
    """Name of the custom Ray resource that pins work to one node."""
    return "mst_host_" + "".join(c if c.isalnum() else "_" for c in host)


def record(job_dir: str, host: str, rc: int, reason: str) -> None:
    """Write the node's outcome unless a record exists already (first writer wins)."""
    path = Path(job_dir) / ".stages" / "train" / host
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(f"rc={rc} end={time.time():.3f} reason={reason}\n")
    except FileExistsError:
        pass


def node_env_file() -> str:
    """This node's saved job environment: job.env in the node's private scratch, which must be
    a directory of ours with mode 0700 (not a link) and the file ours, not a link."""
    scratch = os.environ.get("MST_JOB_SCRATCH", "")
    path = os.path.join(scratch, "job.env")
    try:
        d, f = os.lstat(scratch), os.lstat(path)
    except OSError as e:
        raise RuntimeError(f"no saved job environment at '{path}' (MST_JOB_SCRATCH): {e.strerror}") from None
    if not (
        stat.S_ISDIR(d.st_mode)
        and d.st_uid == os.getuid()
        and stat.S_IMODE(d.st_mode) == 0o700
        and stat.S_ISREG(f.st_mode)
        and f.st_uid == os.getuid()
    ):
        raise RuntimeError(
            f"'{path}' is not in a private scratch directory of ours (want 0700, owned by uid "
            f"{os.getuid()}); not using it"
        )
    return path


def launcher_pid() -> int | None:
    """The pid of this node's launcher (_train_with_ray.sh), which it wrote into the node's private
    scratch (checked by node_env_file) as launcher.pid; None when there is none."""
    path = os.path.join(os.environ.get("MST_JOB_SCRATCH", ""), "launcher.pid")
    try:
        if not os.path.isfile(path) or os.path.islink(path):
            return None
        text = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and int(text) > 1 else None


def read_env_file(path: str) -> dict[str, str]:
    """The NUL-separated environment a node's launcher saved (env -0)."""
    env = {}
    for item in Path(path).read_bytes().split(b"\0"):
        if b"=" in item:
            key, _, value = item.partition(b"=")
            env[os.fsdecode(key)] = os.fsdecode(value)  # any bytes: the trainer gets them back unchanged
    return env


class NodeTrainer:
    """Runs on one node: spawns the trainer and buffers its output for the driver."""

    def __init__(self, host: str, command: list[str]) -> None:
        self.host = host
        self.env = read_env_file(node_env_file())
        # command[0] is a file of the launcher: from this node's own checked copy of the code (MST_REPO
        # in its saved environment), not the driver's, which lives in the head node's private scratch
        repo = self.env.get("MST_REPO")
        self.command = [str(Path(repo) / Path(command[0]).name) if repo else command[0], *command[1:]]
        self.launcher = launcher_pid()
        self.lines: list[bytes] = []  # the trainer's lines as it wrote them: any length, any bytes
        self.lock = threading.Condition()
        self.proc: subprocess.Popen | None = None
        self.rc: int | None = None
        self.stopped = False

    def start(self) -> int:
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._guard(self.proc.pid)
        threading.Thread(target=self._pump, daemon=True).start()
        return self.proc.pid

    def _guard(self, pgid: int) -> None:
        """Start utils/observe/trainer_guard.py (this node's copy) on the trainer's group: it stops
        the trainer once this node's launcher is gone, even when Slurm killed the launcher's cleanup
        and Ray with it. Its own session, an environment without the job's variables."""
        if self.launcher is None:
            return
        repo = self.env.get("MST_REPO")
        guard = Path(repo or Path(__file__).resolve().parent) / "utils" / "observe" / "trainer_guard.py"
        proc = subprocess.Popen(
            [sys.executable, str(guard), str(self.launcher), str(pgid)],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        threading.Thread(target=proc.wait, daemon=True).start()  # reaped when it ends

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        for raw in self.proc.stdout:
            with self.lock:
                self.lines.append(raw.rstrip(b"\n"))
                self.lock.notify_all()
        rc = self.proc.wait()
        if rc < 0:
            rc = 128 - rc
        record(self.env.get("JOB_DIR", "."), self.host, rc, "stopped" if self.stopped else "exit")
        with self.lock:
            self.rc = rc
            self.lock.notify_all()

    def drain(self, wait: float = 0.0, linger: float = 0.0) -> tuple[list[bytes], int | None]:
        """New output lines since the last call, and the exit status once the trainer ended.
        Blocks up to `wait` seconds for either; once a line is there, gathers for `linger` more
        seconds (fewer, larger batches), but returns at once when the trainer exits."""
        with self.lock:
            self.lock.wait_for(lambda: self.lines or self.rc is not None, timeout=wait)
            if self.lines and self.rc is None and linger > 0:
                self.lock.wait_for(lambda: self.rc is not None, timeout=linger)
            lines, self.lines = self.lines, []
            return lines, self.rc

    def stop(self, grace: float = 5.0) -> None:
        """TERM the trainer's process group, KILL it after grace seconds."""
        if not self.proc or self.proc.poll() is not None:
            return
        self.stopped = True
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def unusable(say: Callable[[str], None], why: str) -> int:
    """Say why Ray cannot run the job, leave the reason (one line) for the launcher's OBSERVE
    block in MST_RAY_REASON_FILE (a new file in the node's private scratch), return RAY_UNUSABLE."""
    why = " ".join(why.split())[:300]
    say(why)
    path = os.environ.get("MST_RAY_REASON_FILE")
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(why + "\n")
        except OSError:
            pass  # the launcher then points at the line above
    return RAY_UNUSABLE


def main() -> int:
    if len(sys.argv) > 1:
        print(__doc__.strip())
        return 0 if sys.argv[1] in ("-h", "--help") else 2
    if os.environ.get("RAY_ADDRESS", "").startswith("127."):  # a one-node cluster kept on loopback
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray  # only the driver and the actors import Ray; the trainer never does

    hosts = os.environ["JOB_NODELIST"].split()
    join_timeout = float(os.environ.get("MST_RAY_JOIN_TIMEOUT", "120"))
    say = lambda msg: print(f"_ray_actor.py: {msg}", flush=True)  # noqa: E731

    try:
        ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
        deadline = time.monotonic() + join_timeout
        wanted = {host_resource(h) for h in hosts}
        while not wanted <= set(ray.cluster_resources()):
            if time.monotonic() > deadline:
                missing = sorted(wanted - set(ray.cluster_resources()))
                return unusable(say, f"nodes did not join Ray within {join_timeout:.0f} s: {missing}")
            time.sleep(0.5)
        actor_cls = ray.remote(num_cpus=0, max_concurrency=4)(NodeTrainer)
        command = [str(Path(os.environ["MST_REPO"]) / "_container.sh"), "_train.sh"]
        actors = {h: actor_cls.options(resources={host_resource(h): 0.001}).remote(h, command) for h in hosts}
        pids = ray.get([a.start.remote() for a in actors.values()], timeout=120)
    except Exception as e:  # any failure before training started: let the launcher fall back
        return unusable(say, f"Ray could not start the training actors: {type(e).__name__}: {e}")
    say("trainers started: " + ", ".join(f"{h} pid {p}" for h, p in zip(hosts, pids, strict=True)))

    # One outstanding drain per node, all at once: a node answers when it has output (batched for
    # DRAIN_LINGER s) or exits, so an idle job costs one call per node per DRAIN_WAIT s and a
    # failure is seen as soon as it happens, on 2 nodes or 1000.
    status: dict[str, int] = {}
    first_failure: str | None = None
    pending = {actor.drain.remote(DRAIN_WAIT, DRAIN_LINGER): host for host, actor in actors.items()}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=DRAIN_WAIT * 2)
        for ref in ready:
            host = pending.pop(ref)
            lines, rc = ray.get(ref)
            if lines:  # byte for byte: a line of invalid UTF-8 or of 1 MiB reaches the log as the trainer wrote it
                prefix = f"{host}: ".encode()
                sys.stdout.flush()
                sys.stdout.buffer.write(b"".join(prefix + line + b"\n" for line in lines))
                sys.stdout.buffer.flush()
            if rc is None:
                pending[actors[host].drain.remote(DRAIN_WAIT, DRAIN_LINGER)] = host
                continue
            status[host] = rc
            if rc != 0 and first_failure is None:
                first_failure = host
                say(f"training on {host} exited with {rc}; stopping the other nodes")
                ray.get([a.stop.remote() for h, a in actors.items() if h != host and h not in status])
    return status[first_failure] if first_failure else 0


if __name__ == "__main__":
    sys.exit(main())
