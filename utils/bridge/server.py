"""`serve` and `stop`: the host side of the bridge (docs/host-bridge.md#security-model).

One Unix socket, `sock`, in a directory only its owner may enter (made new with mode 0700, or an
existing one of the owner's with mode 0700). Each connection carries one JSON line
{"argv": [...]}; the caller's uid (SO_PEERCRED) must be the owner's; the argv goes through
policy.plan() and runs without a shell, with a time limit and an output cap, and the answer is
one JSON line {"exit", "stdout", "stderr", "refused", "truncated", "timed_out"}. Every request,
run or refused, is one JSON line of the audit log (mode 0600).
"""

from __future__ import annotations

import datetime
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from bridge.client import SOCKET, config_home
from bridge.policy import REPO, BridgeError, Plan, Policy, Refused, plan
from diagnosis import scheduler

PID_FILE = "pid"
MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT = 10.0
MAX_CONCURRENT = 8
CONFIG_KEYS = {
    "allow_submit": bool,
    "allow_scancel": bool,
    "timeout_s": (int, float),
    "max_output_bytes": int,
    "audit_log": str,
    "workspaces": list,
    "paths": list,
    "check_code": bool,
}


def default_config() -> Path:
    return config_home() / "host-bridge.toml"


@dataclass
class Config:
    allow_submit: bool = False
    allow_scancel: bool = False
    timeout_s: float | None = None
    max_output_bytes: int = 4 << 20
    audit_log: str | None = None
    workspaces: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    check_code: bool = True
    source: str = "defaults (no config file)"


def private_file(path: Path, what: str) -> int:
    """Open PATH for reading; refused unless it is a regular file of ours that only we may read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise BridgeError(f"{what} {path}: {e.strerror}") from None
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to you"
    elif st.st_mode & 0o077:
        problem = f"may be read or written by group or others (mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it"
    if problem:
        os.close(fd)
        raise BridgeError(f"{what} {path} {problem}")
    return fd


def load_config(path: Path | None) -> Config:
    """The owner's settings: PATH (must exist), else the default file when it exists, else defaults."""
    explicit = path is not None
    path = path or default_config()
    if not explicit and not os.path.lexists(path):
        return Config()
    with os.fdopen(private_file(path, "config"), "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise BridgeError(f"config {path}: not TOML: {e}") from None
    cfg = Config(source=str(path))
    for key, value in data.items():
        kind = CONFIG_KEYS.get(key)
        if kind is None:
            raise BridgeError(f"config {path}: unknown key {key!r} (known: {', '.join(CONFIG_KEYS)})")
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise BridgeError(f"config {path}: {key} = {value!r} has the wrong type")
        if kind is list and not all(isinstance(v, str) and v.startswith("/") for v in value):
            raise BridgeError(f"config {path}: {key} must be a list of absolute paths")
        setattr(cfg, key, value)
    if cfg.audit_log is not None and not cfg.audit_log.startswith("/"):
        raise BridgeError(f"config {path}: audit_log must be an absolute path")
    if cfg.timeout_s is not None and cfg.timeout_s <= 0 or cfg.max_output_bytes <= 0:
        raise BridgeError(f"config {path}: timeout_s and max_output_bytes must be positive")
    return cfg


def make_policy(cfg: Config) -> Policy:
    workspaces = cfg.workspaces or [os.environ.get("JOB_WORKSPACE") or str(REPO / "outputs")]
    roots = [REPO, *(Path(p) for p in workspaces + cfg.paths)]
    owner = pwd.getpwuid(os.getuid()).pw_name
    return Policy(owner, roots, cfg.allow_submit, cfg.allow_scancel, cfg.timeout_s)


def bridge_dir(requested: Path | None) -> Path:
    """A directory only we may enter: REQUESTED (made now, or an existing one of ours with mode
    0700), else a new one under $XDG_RUNTIME_DIR (when it is ours and private) or the temp dir."""
    if requested is None:
        base = os.environ.get("XDG_RUNTIME_DIR") or ""
        ok = False
        if base:
            try:
                st = os.stat(base)
                ok = st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
            except OSError:
                pass
        return Path(tempfile.mkdtemp(prefix="mst-bridge-", dir=base if ok else None))
    requested = requested.absolute()
    try:
        os.mkdir(requested, 0o700)
        return requested
    except FileExistsError:
        pass
    except OSError as e:
        raise BridgeError(f"cannot make {requested}: {e.strerror}") from None
    st = os.lstat(requested)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise BridgeError(f"{requested} exists and is not a directory of yours with mode 0700 (not a link)")
    return requested


class Audit:
    """The audit log: one JSON line per request, appended; the file is ours and 0600."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise BridgeError(f"audit log {path}: {e.strerror}") from None
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            os.close(self.fd)
            raise BridgeError(f"audit log {path} is not a regular file of yours with mode 600")
        self.lock = threading.Lock()

    def write(self, **record: Any) -> None:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        line = json.dumps({"time": now, **record}) + "\n"
        with self.lock:
            os.write(self.fd, line.encode())


def code_state(repo: Path) -> dict[str, tuple[int, int, int, int]]:
    """(inode, size, mtime, ctime) of every file the allowed tools run: the top-level scripts,
    utils/ and configs/. ctime moves on any write or rename and cannot be set back. Bytecode caches
    (__pycache__) are left out because the tools never read them: they run with PYTHONPYCACHEPREFIX
    set to the bridge's own private cache (Bridge.pycache); a .pyc or .so beside the sources, which
    Python would import, is a file of utils/ like any other and counted."""
    state: dict[str, tuple[int, int, int, int]] = {}
    tops = [p for p in repo.iterdir() if p.is_file() and p.suffix in (".sh", ".sbatch", ".py")]
    for top in [repo / "utils", repo / "configs", *tops]:
        for root, dirs, files in os.walk(top) if top.is_dir() else [(str(repo), [], [top.name])]:
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                p = os.path.join(root, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                state[os.path.relpath(p, repo)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return state


def changed(before: dict[str, tuple[int, int, int, int]], now: dict[str, tuple[int, int, int, int]]) -> list[str]:
    return sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))


def peer_uid(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, from the kernel (SO_PEERCRED)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def drain(stream: BinaryIO, cap: int, out: dict[str, Any]) -> None:
    """Read STREAM to its end, keeping the first CAP bytes in out['data'], counting all."""
    data, total = bytearray(), 0
    while chunk := stream.read(65536):
        total += len(chunk)
        if len(data) < cap:
            data += chunk[: cap - len(data)]
    out["data"], out["total"] = bytes(data), total


class Bridge:
    def __init__(self, directory: Path, cfg: Config, audit: Audit) -> None:
        self.dir = directory
        self.cfg = cfg
        self.policy = make_policy(cfg)
        self.audit = audit
        self.code = code_state(REPO) if cfg.check_code else {}
        # the tools' bytecode goes to, and is read only from, a directory of ours that only we may write:
        # never a __pycache__ of the repository, which whoever may write the repository could fill
        self.pycache = tempfile.mkdtemp(prefix="mst-bridge-pycache-")
        self.env = {**os.environ, "PYTHONPYCACHEPREFIX": self.pycache}
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self.running: set[subprocess.Popen[bytes]] = set()
        self.lock = threading.Lock()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.serve_one(conn)
            except Exception as e:  # one bad connection never stops the bridge
                print(f"host_bridge: request failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def serve_one(self, conn: socket.socket) -> None:
        pid, uid = peer_uid(conn)
        t0 = time.monotonic()

        def refuse(reason: str, argv: Any = None) -> None:
            self.audit.write(uid=uid, pid=pid, argv=argv, decision="refused", reason=reason)
            reply(conn, {"exit": None, "refused": reason})

        conn.settimeout(REQUEST_TIMEOUT)
        argv, bad = None, None
        try:
            argv = json.loads(read_line(conn))["argv"]
        except (ValueError, KeyError, TypeError, OSError) as e:
            bad = f'bad request (one JSON line {{"argv": [...]}} expected): {e}'
        if uid != os.getuid():  # read first, so that the log says what another uid asked for
            print(f"host_bridge: refused a caller with uid {uid} (pid {pid})", file=sys.stderr, flush=True)
            return refuse(f"uid {uid} is not the bridge's owner (uid {os.getuid()})", argv)
        if bad:
            return refuse(bad)
        try:
            todo = plan(argv, self.policy)
            if todo.runs_repo_code and self.cfg.check_code:
                moved = changed(self.code, code_state(REPO))
                if moved:
                    raise Refused(
                        f"the repository's code changed since the bridge started ({', '.join(moved[:3])}"
                        f"{' ...' if len(moved) > 3 else ''}); the owner restarts the bridge after checking it"
                    )
            if todo.cancel_ids:
                self.check_owner(todo.cancel_ids)
        except Refused as e:
            return refuse(str(e), argv)
        if not self.slots.acquire(blocking=False):
            return refuse(f"busy: {MAX_CONCURRENT} commands already run", argv)
        try:
            answer = self.execute(todo)
        finally:
            self.slots.release()
        self.audit.write(
            uid=uid,
            pid=pid,
            argv=argv,
            decision="allowed",
            exit=answer["exit"],
            duration_s=round(time.monotonic() - t0, 3),
            out_bytes=answer.pop("out_bytes"),
            timed_out=answer["timed_out"],
            truncated=answer["truncated"],
        )
        reply(conn, answer)

    def check_owner(self, ids: list[str]) -> None:
        """scancel: every job must be in the queue and be the owner's."""
        owners = scheduler.owners(ids)
        if owners is None:
            raise Refused("cannot check whose jobs these are (squeue could not be asked); scancel refused")
        for job in ids:
            if owners.get(job, "").strip() != self.policy.owner:
                raise Refused(f"job {job} is not a job of {self.policy.owner} in the queue; scancel refused")

    def execute(self, todo: Plan) -> dict[str, Any]:
        cap = self.cfg.max_output_bytes
        try:
            proc = subprocess.Popen(
                todo.argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            msg = f"host_bridge: {todo.argv[0]}: {e.strerror} on the host\n"
            return {"exit": 127, "stdout": "", "stderr": msg, "timed_out": False, "truncated": False, "out_bytes": 0}
        with self.lock:
            self.running.add(proc)
        outs: list[dict[str, Any]] = [{}, {}]
        readers = [
            threading.Thread(target=drain, args=(s, cap, o), daemon=True)
            for s, o in zip((proc.stdout, proc.stderr), outs, strict=True)
        ]
        for r in readers:
            r.start()
        timed_out = False
        try:
            proc.wait(timeout=todo.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
        for r in readers:
            r.join(timeout=10)
        with self.lock:
            self.running.discard(proc)
        stdout, stderr = (o.get("data", b"") for o in outs)
        totals = [o.get("total", 0) for o in outs]
        truncated = any(t > cap for t in totals)
        if truncated:
            stderr += f"\nhost_bridge: output cut at {cap} bytes per stream (had {max(totals)})\n".encode()
        if timed_out:
            stderr += f"\nhost_bridge: killed after {todo.timeout_s:g} s (the command's time limit)\n".encode()
        return {
            "exit": 124 if timed_out else proc.returncode,
            "stdout": stdout.decode("utf-8", "surrogateescape"),
            "stderr": stderr.decode("utf-8", "surrogateescape"),
            "timed_out": timed_out,
            "truncated": truncated,
            "out_bytes": sum(totals),
        }

    def stop_all(self) -> None:
        with self.lock:
            for proc in list(self.running):
                kill_group(proc)
        shutil.rmtree(self.pycache, ignore_errors=True)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the command this bridge started (its own session): TERM, then KILL after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def read_line(conn: socket.socket) -> bytes:
    buf = bytearray()
    while b"\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            raise ValueError(f"request longer than {MAX_REQUEST} bytes")
    return bytes(buf).split(b"\n", 1)[0]


def reply(conn: socket.socket, answer: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(answer).encode() + b"\n")
    except OSError:
        pass  # the caller has gone


class Stop(Exception):
    pass


def listen(directory: Path) -> socket.socket:
    path = directory / SOCKET
    if len(os.fsencode(path)) > 107:
        raise BridgeError(f"socket path {path} is longer than 107 bytes; choose a shorter --dir")
    if os.path.lexists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            raise BridgeError(f"a bridge already serves {directory} (utils/host_bridge.py stop --dir {directory})")
        except OSError:
            os.unlink(path)  # left by a bridge that was killed
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(16)
    return sock


def write_private(path: Path, text: str) -> None:
    """Replace PATH with TEXT atomically, mode 0600 (its directory made 0700 when missing)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".host-bridge.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def serve(directory: Path | None, config: Path | None, audit_log: Path | None, address: Path, detach: bool) -> int:
    cfg = load_config(config)
    where = bridge_dir(directory)
    audit = Audit(audit_log or Path(cfg.audit_log or where / "audit.jsonl"))
    bridge = Bridge(where, cfg, audit)
    sock = listen(where)
    write_private(address, f"{where}\n")
    enabled = [name for name, on in (("submit", cfg.allow_submit), ("scancel", cfg.allow_scancel)) if on]
    print(where, flush=True)
    print(
        f"host_bridge: serving {where / SOCKET} for uid {os.getuid()}; config: {cfg.source}; "
        f"enabled beyond read-only: {', '.join(enabled) or 'nothing'}; audit log: {audit.path}\n"
        f"host_bridge: in a container: podman run -v {where}:{where}:ro -e MST_HOST_BRIDGE={where} ...",
        file=sys.stderr,
        flush=True,
    )
    if detach:
        if os.fork():
            return 0
        os.setsid()
        log = os.open(where / "serve.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
    write_private(where / PID_FILE, f"{os.getpid()}\n")

    def on_signal(signum: int, _frame: Any) -> None:
        raise Stop(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=bridge.handle, args=(conn,), daemon=True).start()
    except Stop:
        pass
    finally:
        sock.close()
        bridge.stop_all()
        for name in (SOCKET, PID_FILE):
            try:
                os.unlink(where / name)
            except FileNotFoundError:
                pass
        print(f"host_bridge: stopped ({where}; audit log {audit.path})", file=sys.stderr, flush=True)
    return 0


def alive(pid: int) -> bool:
    """PID still runs (a zombie, one that exited and waits for its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop(directory: Path) -> int:
    """End the bridge that serves DIRECTORY (its pid file; the process must be ours and a bridge)."""
    try:
        pid = int((directory / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        raise BridgeError(f"no bridge runs in {directory} (no pid file)") from None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        cmdline, owner = b"", -1
    if b"host_bridge" not in cmdline or owner != os.getuid():
        (directory / PID_FILE).unlink(missing_ok=True)
        raise BridgeError(f"no bridge runs in {directory} (pid {pid} is gone or not a bridge of yours)")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    print(f"host_bridge: stopped the bridge in {directory} (pid {pid})")
    return 0
