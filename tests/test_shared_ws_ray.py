"""RAY=1 in a shared workspace, with two real users (tests/helpers/users.py; docs/security.md).

Attack 5 of issue 19: the other nodes connect to the Ray head's address in the job directory and
send it the job's token, so a record planted by another user would hand him the token (and with it
a Ray job running as the victim). Here the attacker plants such a record wherever he can (straight
into the victim's job dir; or, in a group workspace, by renaming the victim's job dir away and putting
his own in its place) pointing at a listener of his: no node ever connects to it, the job trains or
stops with one line naming the attacker's path, and a Ray job the attacker would start with a
captured token never writes its canary.

Attack 10: a RAY=1 job in a 2775 group workspace, submitted with umask 002, trains with Ray, its
TensorBoard collector, Prometheus and the dashboards (Ray's private directories are made without the
setgid bit the workspace hands down), and nothing of its job directory is writable by the group.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, VENV

from helpers.jobs import SUBMITTED, job_state, log_has, summary, wait_for, wait_job_end, wait_log
from helpers.users import GROUP, User, as_user, ensure_users, reachable_base, shared_workspace
from observe import job_record

# The attacker's listener: accepts every connection on 127.0.0.1:PORT and appends what it gets to
# CAPTURE ("connect" and the bytes); a Ray node that trusted the planted record would connect here
# and send its token.
LISTENER = r"""
import socket, sys, threading
port_file, capture = sys.argv[1], sys.argv[2]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
open(port_file + ".tmp", "w").write(str(srv.getsockname()[1]))
import os; os.rename(port_file + ".tmp", port_file)
lock = threading.Lock()
def serve(conn):
    with lock, open(capture, "ab") as f:
        f.write(b"connect\n")
    conn.settimeout(30)
    try:
        while data := conn.recv(65536):
            with lock, open(capture, "ab") as f:
                f.write(data)
    except OSError:
        pass
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# The attacker's use of a captured token: POST a Ray job to the victim's dashboard (Jobs API);
# prints the HTTP status (0: nothing answered).
PAYLOAD = r"""
import sys, urllib.error, urllib.request
url, body, token = sys.argv[1:4]
headers = {"Content-Type": "application/json"}
if token:
    headers["Authorization"] = "Bearer " + token
req = urllib.request.Request(url, data=body.encode(), method="POST", headers=headers)
try:
    print(urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print(0)
"""


@pytest.fixture(scope="module")
def users() -> tuple[User, User]:
    return ensure_users()


@pytest.fixture
def base() -> Iterator[Path]:
    d = reachable_base()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def submit_as(user: User, cluster: dict[str, str], ws: Path, *args: str, umask: int, **env: str) -> tuple[str, Path]:
    """submit.sh ARGS as ``user`` on the local cluster; returns (job id, log path)."""
    res = as_user(
        user,
        [str(REPO / "submit.sh"), *args],
        env={**cluster, "MAXTEXT_SLURM_VENV": str(VENV), "JOB_WORKSPACE": str(ws), **env},
        umask=umask,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"Submitted job (\d+) \((\S+)\)", res.stdout)
    assert m, res.stdout
    SUBMITTED.append(m.group(1))  # cancelled by conftest if the test fails half-way
    return m.group(1), ws / f"{m.group(1)}-{m.group(2)}.log"


# The attacker's loop in a job dir of his own: keep a `ray/` anyone may write there (the job moves
# earlier files aside), and once the head has made its token, put his address in `ray/head` at once
# (the other nodes would then join him with the token).
REPLANT = r"""
for _ in $(seq 6000); do
  if [[ -d "$1/ray/auth" ]]; then
    echo "$2" > "$1/ray/.h" && mv -f "$1/ray/.h" "$1/ray/head"
    exit 0
  fi
  [[ -d "$1/ray" ]] || { mkdir -p "$1/ray" && chmod 777 "$1/ray" && chmod g-s "$1/ray"; } 2>/dev/null
  sleep 0.05
done
"""


def spawn_as(user: User, cmd: list[str]) -> subprocess.Popen:
    """Start ``cmd`` as ``user`` in the background (umask 002, no output)."""
    return subprocess.Popen(
        ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--"]
        + ["bash", "-c", 'umask 002; exec "$@"', "spawn_as", *cmd],
        env={"HOME": str(user.home), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Listener:
    """The attacker's listener, run as the attacker."""

    def __init__(self, attacker: User, where: Path) -> None:
        where.mkdir()
        shutil.chown(where, attacker.name)
        self.port_file, self.capture = where / "port", where / "capture"
        self.proc = spawn_as(attacker, [sys.executable, "-c", LISTENER, str(self.port_file), str(self.capture)])
        self.port = int(str(wait_for(lambda: self.port_file.exists() and self.port_file.read_text(), 30, "listener")))
        with socket.create_connection(("127.0.0.1", self.port), timeout=5):
            pass  # it answers (and counts this one)
        wait_for(lambda: self.got() == b"connect\n", 10, "the listener to record the probe")

    def got(self) -> bytes:
        """Everything received, after the test's own probe."""
        return self.capture.read_bytes() if self.capture.exists() else b""

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def plant(attacker: User, ws: Path, job_dir: Path, address: str) -> dict[str, subprocess.CompletedProcess]:
    """The attacker's two ways to a planted `ray/head`: straight into the victim's job dir, and
    (where the workspace lets him rename its entries) by moving the victim's job dir away and making
    his own, open to all, in its place. Returns each attempt's result."""
    direct = as_user(
        attacker,
        ["bash", "-c", f'mkdir -p "$1/ray" && echo "{address}" > "$1/ray/head"', "plant", str(job_dir)],
        umask=0o002,
    )
    swap = as_user(
        attacker,
        [
            "bash",
            "-c",
            'mv -T "$1" "$1.moved" && mkdir -m 777 "$1" "$1/ray" && chmod g-s "$1" "$1/ray"'
            ' && echo "$2" > "$1/ray/head"'
            ' && chmod 666 "$1/ray/head"',
            "plant",
            str(job_dir),
            address,
        ],
        umask=0o002,
    )
    return {"direct": direct, "swap": swap}


def attacker_payload(attacker: User, log: Path, token: str, canary: Path) -> int | None:
    """What the attacker does with a captured token: submit a Ray job that writes the canary as the
    victim, through the victim's dashboard (its port is in the log, which the group may read).
    Returns the HTTP status (None: no dashboard to talk to)."""
    m = re.search(r"^n1: ray_dashboard: http://127\.0\.0\.1:(\d+) ", log.read_text(errors="replace"), re.M)
    if not m:
        return None
    body = json.dumps({"entrypoint": f"touch {canary}"})
    res = as_user(
        attacker, [sys.executable, "-c", PAYLOAD, f"http://127.0.0.1:{m.group(1)}/api/jobs/", body, token], timeout=60
    )
    return int(res.stdout.strip() or 0) or None


def captured_token(data: bytes) -> str:
    m = re.search(rb"authorization[^0-9a-f]{0,8}(?:bearer )?([0-9a-f]{64})", data, re.I)
    return m.group(1).decode() if m else ""


def group_or_world_writable(root: Path) -> list[str]:
    """Everything under root (links not followed, not counted) the group or others may write."""
    bad = []
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            st = (Path(d) / n).lstat()
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                bad.append(f"{Path(d) / n} {stat.S_IMODE(st.st_mode):04o}")
    return bad


# --- the record reader itself ------------------------------------------------------------------


def test_job_record_reads_only_a_record_that_is_ours_all_the_way(users, base):
    """utils/observe/job_record.py, run by the victim: her own record is read; a record, or any
    directory above it, that the attacker owns, that is a link, or that the group may write is
    refused with one line naming it, its owner and mode; a missing one is exit 3 (wait)."""
    victim, attacker = users
    ws = shared_workspace(base, "group")
    job = ws / "7-JAX-tiny"
    res = as_user(
        victim,
        [
            "bash",
            "-c",
            f'source {REPO}/utils/launch/lib.sh; own_dir "$1"; own_dir "$1/ray"; echo 10.0.0.1:6379 > "$1/ray/head"',
            "x",
            str(job),
        ],
        umask=0o022,
    )
    assert res.returncode == 0, res.stderr
    reader = [str(VENV / "bin/python"), str(REPO / "utils/observe/job_record.py"), "read", str(ws)]

    def read(path: Path) -> subprocess.CompletedProcess:
        return as_user(victim, [*reader, str(path), "--what", "the Ray head's address"], umask=0o002)

    ok = read(job / "ray" / "head")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "10.0.0.1:6379\n", "")
    assert read(job / "ray" / "missing").returncode == 3
    # the attacker's own job dir with his record (the swap attack), a link, a group-writable record
    theirs = ws / "8-JAX-tiny"
    assert (
        as_user(attacker, ["bash", "-c", f"mkdir -p {theirs}/ray && echo 127.0.0.1:1 > {theirs}/ray/head"]).returncode
        == 0
    )
    res = read(theirs / "ray" / "head")
    assert res.returncode == 1 and res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(
        f"refusing the Ray head's address {theirs}/ray/head: {theirs} is owned by mstattacker (mode "
    )
    link = ws / "9-JAX-tiny"
    assert as_user(attacker, ["ln", "-s", str(job), str(link)]).returncode == 0
    res = read(link / "ray" / "head")
    assert res.returncode == 1 and f"{link} is a symbolic link (to {job}), owned by mstattacker" in res.stderr
    (job / "ray" / "head").chmod(0o664)
    res = read(job / "ray" / "head")
    assert res.returncode == 1 and "head is writable by others (mode 0664)" in res.stderr, res.stderr
    # the Python function: the same refusal, as an exception with that one line
    os.seteuid(victim.uid)
    try:
        with pytest.raises(job_record.trust.UntrustedPath, match="owned by mstattacker"):
            job_record.read_record(str(ws), str(theirs / "ray" / "head"), "the record")
    finally:
        os.seteuid(0)


def test_a_worker_never_sends_the_token_to_a_planted_head(users, base, tmp_path):
    """The other node's side of attack 5 without Slurm: the victim's job dir in a 2775 workspace is
    swapped by the attacker for his own, with a `ray/head` pointing at his listener. The victim's
    node (rank 1 of 2) stops with one line naming the attacker's directory, starts no Ray, and the
    listener gets no connection."""
    victim, attacker = users
    ws = shared_workspace(base, "group")
    job = ws / "42-JAX-tiny"
    assert (
        as_user(victim, ["bash", "-c", f"source {REPO}/utils/launch/lib.sh; own_dir {job}"], umask=0o002).returncode
        == 0
    )
    listener = Listener(attacker, base / "attacker")
    try:
        res = plant(attacker, ws, job, f"127.0.0.1:{listener.port}")
        assert res["direct"].returncode != 0 and "Permission denied" in res["direct"].stderr
        assert res["swap"].returncode == 0, res["swap"].stderr
        node_tmp = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
        node_tmp.chmod(0o1777)
        env = {
            "JOB_DIR": str(job),
            "JOB_WORKSPACE": str(ws),
            "JOB_ID": f"sws-{uuid.uuid4().hex[:8]}",
            "JOB_HOSTNAME": "n2",
            "JOB_NUM_NODES": "2",
            "JOB_NODELIST": "n1 n2",
            "JOB_NODE_ADDRS": "127.0.0.1 127.0.0.1",
            "JOB_NODE_RANK": "1",
            "MST_REPO": str(REPO),
            "MST_PYTHON": str(VENV / "bin/python"),
            "MST_RAY_JOIN_TIMEOUT": "10",
            "TMPDIR": str(node_tmp),
        }
        run = as_user(victim, [str(REPO / "_train_with_ray.sh")], env=env, umask=0o002, timeout=120)
        shutil.rmtree(node_tmp, ignore_errors=True)
    finally:
        listener.stop()
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"_train_with_ray.sh: refusing the job directory {job}: it is owned by mstattacker"
    ), run.stderr
    assert "falling back" not in run.stdout
    assert listener.got() == b"connect\n", "a node connected to the attacker's address"


# --- attack 5 end to end ------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_planted_ray_head_gets_no_token_and_runs_nothing(users, base, cluster, kind):
    """The victim's 2-node RAY=1 job in a shared workspace (1777 with umask 022, 2775 with umask 002);
    while it is held, the attacker plants `ray/head` -> his listener where he can (and, where he could
    put his own job dir in its place, keeps planting it while the job runs). No node connects
    to the listener; the job either trains with Ray as usual (nothing could be planted) or stops with
    one line naming the attacker's directory; the Ray job the attacker would submit with a token is
    refused and its canary never appears."""
    victim, attacker = users
    ws = shared_workspace(base, kind)
    umask = 0o002 if kind == "group" else 0o022
    canary = victim.home / f"canary-{uuid.uuid4().hex}"
    listener = Listener(attacker, base / "attacker")
    job_id, swapped = "", False
    try:
        job_id, log = submit_as(
            victim,
            cluster,
            ws,
            "tiny",
            "-N",
            "2",
            "--hold",
            "--",
            "steps=200",
            umask=umask,
            RAY="1",
            MST_RAY_JOIN_TIMEOUT="60",
        )
        job_dir = log.with_suffix("")
        tries = plant(attacker, ws, job_dir, f"127.0.0.1:{listener.port}")
        assert tries["direct"].returncode != 0, "the attacker could write into the victim's job dir"
        swapped = tries["swap"].returncode == 0
        assert swapped == (kind == "group"), tries["swap"].stderr  # a sticky workspace keeps her entries hers
        replant = None
        if swapped:  # keep a record in place while the job runs (the job moves earlier files aside)
            replant = spawn_as(attacker, ["bash", "-c", REPLANT, "replant", str(job_dir), f"127.0.0.1:{listener.port}"])
        assert as_user(victim, ["scontrol", "release", job_id], env=cluster).returncode == 0
        status = None
        if not swapped:
            wait_log(log, r"^n[12]: .*completed step: 0,", 300, "the first step")
            status = attacker_payload(attacker, log, captured_token(listener.got()), canary)
        state = wait_job_end(cluster, job_id, 420)
        got = listener.got()
    finally:
        listener.stop()
        if swapped and replant:
            replant.kill()
            replant.wait()
        if job_id and job_state(cluster, job_id) in ("PENDING", "RUNNING"):
            subprocess.run(["scancel", job_id], env={**os.environ, **cluster}, check=False)
    text = log.read_text(errors="replace")
    assert got == b"connect\n", f"a node connected to the attacker's address: {got[:200]!r}"
    assert "falling back" not in text and "ray: off" not in text
    if swapped:
        # stopped before any Ray started, with one line naming what the attacker made
        assert state == "FAILED", text[-3000:]
        # the batch script refuses the swapped job dir before any stage; failing that, each node does
        refusals = re.findall(r"^(?:n\d: )?\S+: (?:error: )?refusing .* it is owned by mstattacker.*$", text, re.M)
        assert refusals, text[-3000:]
        assert "ray_dashboard:" not in text and not re.search(r"completed step", text)
    else:
        assert state == "COMPLETED", text[-3000:]
        assert summary(log)["status"] == "completed"
        assert status == 401, status  # no token, no Ray job
        assert log_has(log, r"^n1: ray_dashboard: http://127\.0\.0\.1:\d+ ")
        assert (job_dir / "ray" / "head").read_text().strip() != f"127.0.0.1:{listener.port}"
    assert not canary.exists(), "the attacker's Ray job ran as the victim"


# --- attack 10: the Done-when of issue 19 -------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.slow
def test_ray_job_in_a_group_workspace_trains_with_its_collector_and_dashboards(users, base, cluster):
    """A 2-node RAY=1 job submitted by the victim with umask 002 into a 2775 group workspace, the
    nodes' TMPDIR a setgid group directory too: Ray starts (no fallback), the OBSERVE block gives
    Prometheus, TensorBoard and the Ray dashboard, the TSDB holds every step's loss (the TensorBoard
    collector) and both nodes' metrics, and nothing in the job dir is writable by the group."""
    victim, _ = users
    ws = shared_workspace(base, "group")
    node_tmp = Path(tempfile.mkdtemp(prefix="g", dir="/tmp"))  # short: Ray's socket paths
    shutil.chown(node_tmp, "root", GROUP)
    node_tmp.chmod(0o3777)  # setgid (and sticky): what mktemp -d makes in it inherits the group bit
    try:
        job_id, log = submit_as(
            victim,
            cluster,
            ws,
            "tiny",
            "-N",
            "2",
            "--",
            "steps=20",
            "log_period=5",
            umask=0o002,
            RAY="1",
            TMPDIR=str(node_tmp),
        )
        state = wait_job_end(cluster, job_id, 420)
        leftovers = sorted(p.name for p in node_tmp.glob("mst.*"))  # the nodes' private scratch dirs
    finally:
        shutil.rmtree(node_tmp, ignore_errors=True)
    text = log.read_text(errors="replace")
    assert state == "COMPLETED" and summary(log)["status"] == "completed", text[-3000:]
    assert "falling back" not in text and "ray: off" not in text, text[-3000:]
    assert re.search(r"^n1: _ray_actor\.py: trainers started: n1 pid \d+, n2 pid \d+$", text, re.M)
    for name in ("prometheus", "tensorboard", "ray_dashboard"):
        assert re.search(
            rf"^n1: {name}: http://127\.0\.0\.1:(\d+) +tunnel: ssh -N -L \1:127\.0\.0\.1:\1 n1$", text, re.M
        ), name
    job_dir = log.with_suffix("")
    assert re.search(rf"^n1: tsdb: {re.escape(str(job_dir))}/prometheus$", text, re.M)
    assert leftovers == [], leftovers
    # the TensorBoard events the collector read, and the TSDB it fed (read as the victim)
    assert list(job_dir.rglob("events.out.tfevents.*")), "no TensorBoard events"

    def query(promql: str) -> dict[str, float]:
        res = as_user(
            victim, [str(REPO / "utils/prometheus.sh"), "query", str(job_dir / "prometheus"), promql], timeout=180
        )
        assert res.returncode == 0, res.stderr
        return {r["metric"].get("host", ""): float(r["value"][1]) for r in json.loads(res.stdout)["data"]["result"]}

    assert query("count_over_time(tb_learning_loss[1d])") == {"n1": 20.0}
    assert set(query("count by (host) (hw_procs_running)")) == {"n1", "n2"}
    # at the end of the saved data every node's Ray is there (Prometheus stopped before any Ray did);
    # on failure, how many samples each host's Ray series got over the whole job, and each target's
    # last scrape, say whether a node was never scraped or only its end was lost
    ray = '{__name__=~"ray_node_cpu_utilization|ray_node_mem_used"}'
    assert set(query(f"count by (host) ({ray})")) == {"n1", "n2"}, (
        query(f"sum by (host) (count_over_time({ray}[1d]))"),
        query("up"),
    )
    # the job's files: the victim's, none writable by the group, Ray's directory without setgid
    assert group_or_world_writable(job_dir) == []
    ray_dir = job_dir / "ray"
    assert ray_dir.lstat().st_uid == victim.uid and stat.S_IMODE(ray_dir.lstat().st_mode) == 0o755
    assert (ray_dir / "head").lstat().st_uid == victim.uid and not (ray_dir / "auth").exists()
    assert {p.name for p in ray_dir.iterdir()} >= {"head", "done", "logs-n1", "logs-n2"}


# --- attack 10 in parts: the setgid bit, and a fallback that says why ----------------------------


@pytest.mark.slow
@pytest.mark.heavy
def test_ray_head_in_a_setgid_job_dir_makes_a_private_token_dir(users, base):
    """The condition of attack 10: a job dir made in a 2775 workspace inherits the setgid bit, and so
    did `ray/` and `ray/auth` (2700, which the privacy check refuses: RAY=1 fell back without a word).
    The victim's Ray head now makes `ray/` 0755 and `ray/auth` 0700 without it, and starts."""
    victim, _ = users
    ws = shared_workspace(base, "group")
    job = ws / "5-JAX-tiny"
    script = f"""
set -u
mkdir "$JOB_DIR"
export MST_JOB_SCRATCH; MST_JOB_SCRATCH=$(mktemp -d /tmp/rXXXXXX)
{REPO}/utils/observe/ray_cluster.sh head 127.0.0.1 > /dev/null 2> "$MST_JOB_SCRATCH/err"; rc=$?
echo "rc=$rc modes=$(stat -c %a "$JOB_DIR" "$JOB_DIR/ray" "$JOB_DIR/ray/auth" "$JOB_DIR/ray/auth/token" | paste -sd,)"
tail -n 1 "$MST_JOB_SCRATCH/err"
{REPO}/utils/observe/ray_cluster.sh stop
rm -rf "$MST_JOB_SCRATCH"
"""
    env = {
        "JOB_DIR": str(job),
        "JOB_WORKSPACE": str(ws),
        "JOB_ID": f"sws-{uuid.uuid4().hex[:8]}",
        "JOB_HOSTNAME": "h1",
        "JOB_NUM_NODES": "1",
        "MST_PYTHON": str(VENV / "bin/python"),
    }
    res = as_user(victim, ["bash", "-c", script], env=env, umask=0o022, timeout=180)
    assert res.stdout.startswith("rc=0 modes=2755,755,700,600\n"), res.stdout + res.stderr


def test_a_late_fallback_says_why_in_the_observe_block(tmp_path):
    """Ray stopped being usable after the OBSERVE block was printed (nodes did not join): the block is
    printed again, the Ray dashboard and token lines replaced by one `ray: off - WHY` line."""
    job = tmp_path / "job"
    (job / "metrics" / "run").mkdir(parents=True)
    (job / "metrics" / "run" / "observe").write_text("prometheus: http://127.0.0.1:9190   tunnel: x\n")
    res = subprocess.run(
        [str(REPO / "utils/observe/job_services.sh"), "fallback", "Ray could not run the job: nodes did not join"],
        env={**os.environ, "JOB_DIR": str(job), "JOB_HOSTNAME": "n1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert res.stdout.splitlines() == [
        "==================== OBSERVE ====================",
        "prometheus: http://127.0.0.1:9190   tunnel: x",
        "ray: off - Ray could not run the job: nodes did not join; training with the plain launch"
        " (metrics, Prometheus and TensorBoard stay on)",
        f"tsdb: {job}/prometheus",
        f"browse_later: utils/prometheus.sh view {job}",
        "=================================================",
    ]
