"""RAY=1 on the local Slurm cluster: a 2-node job that is private and authenticated while it
runs and whose saved TSDB answers afterwards, a whole job killed with SIGKILL that keeps every
scraped sample, and the fallback when Ray cannot start."""

import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import REPO, run

from helpers.jobs import job_state, log_has, submit, summary, trainer_pid, triage, wait_for, wait_job_end, wait_log
from helpers.raynet import http_status, job_processes, listeners, probe, target_ports

NOBODY = 65534  # the other user of the attacks below

pytestmark = pytest.mark.cluster


def query(tsdb: Path, promql: str, at: float | None = None) -> list[dict]:
    args = [str(REPO / "utils/prometheus.sh"), "query", str(tsdb), promql]
    if at is not None:
        args += ["--time", f"{at:.3f}"]
    res = run(args, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["data"]["result"]


def by_host(result: list[dict]) -> dict[str, float]:
    return {r["metric"].get("host", ""): float(r["value"][1]) for r in result}


def step_times(log: Path, host: str) -> dict[int, float]:
    """Wall time of each 'completed step' line of one host, from the absl prefix."""
    year = datetime.now(UTC).year
    out = {}
    pat = re.compile(rf"^{host}: I(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+) .*completed step: (\d+),")
    for line in log.read_text(errors="replace").splitlines():
        m = pat.match(line)
        if m:
            t = datetime.strptime(f"{year}-{m[1]}-{m[2]} {m[3]}", "%Y-%m-%d %H:%M:%S.%f").astimezone()
            out[int(m[4])] = t.timestamp()
    return out


def exporter_of(job_dir: Path, host: str) -> int | None:
    """The pid of the job's metrics exporter for HOST (by its command line), None when none runs."""
    for d in Path("/proc").glob("[0-9]*"):
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"metrics_exporter.py") for a in argv) and str(job_dir).encode() in argv:
            if b"--host" in argv[:-1] and argv[argv.index(b"--host") + 1] == host.encode():
                return int(d.name)
    return None


def plant_old_scratch(node_tmp: Path, job_id: str) -> list[Path]:
    """Defect 2 as another user sets it up: the predictable per-node directories the launcher used
    to save the trainer's environment (with its secrets) and the exporter's FIFOs in
    (TMPDIR/maxtext-slurm-$USER/slurm/<job id>/<host>), made beforehand by that user, an empty
    world-readable job.env and a world-writable exporter dir waiting in each."""
    user = os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name
    traps = []
    for host in ("n1", "n2"):
        d = node_tmp / f"maxtext-slurm-{user}" / "slurm" / job_id / host
        (d / "exporter").mkdir(parents=True)
        (d / "job.env").touch()
        for q in (*d.relative_to(node_tmp).parents, d.relative_to(node_tmp) / "exporter", d.relative_to(node_tmp)):
            if q != Path("."):
                os.chown(node_tmp / q, NOBODY, NOBODY)
                (node_tmp / q).chmod(0o777)
        os.chown(d / "job.env", NOBODY, NOBODY)
        (d / "job.env").chmod(0o666)
        traps.append(d)
    return traps


def plant_links(ray_temp: Path, victim: Path) -> None:
    """Defect 3: links in Ray's temp dir (Ray makes it world-writable) to a private directory of
    the job's owner, where the old cleanup's `cp -rL session_latest/logs` would have copied it into
    the job dir: a link in the logs, a link to one file, and a session whose logs are a link."""
    session = next(d for d in ray_temp.glob("session_2*") if d.is_dir() and not d.is_symlink())
    (session / "logs" / "planted_dir").symlink_to(victim)
    (session / "logs" / "planted.log").symlink_to(victim / "secret.txt")
    fake = ray_temp / "session_2099-01-01_00-00-00_000000_1"
    fake.mkdir()
    (fake / "logs").symlink_to(victim)


def files_containing(root: Path, needle: bytes) -> list[str]:
    """Regular files under root (no link followed) whose content has needle."""
    hits = []
    for d, _, names in os.walk(root):
        for n in names:
            f = Path(d) / n
            if f.is_file() and not f.is_symlink() and needle in f.read_bytes():
                hits.append(str(f))
    return hits


def check_listeners_and_auth(job_dir: Path, log: Path, token: str) -> None:
    """Every listening socket of the job's processes: off loopback only Ray's inter-node ports, each
    refusing a caller without the token and letting one with it in, plus the read-only metrics pages
    Prometheus scrapes (each node's exporter and Ray metrics port, the Ray dashboard's own); job
    submission without the token refused on the dashboard and on every dashboard agent port."""
    procs = job_processes(job_dir)
    for pid, cmd in procs.items():
        assert token not in cmd, f"the Ray token is in the argv of pid {pid}"
        assert not re.search(r"ray\.util\.client\.server|autoscaler/_private/monitor\.py|log_monitor\.py", cmd), cmd
    # srun is Slurm's: its I/O ports take only the step's credential-signed connections
    socks = [lis for lis in listeners(procs) if not lis.cmd.startswith("srun ")]
    assert socks and 10001 not in {lis.port for lis in socks}, socks
    node_addr = (job_dir / "ray" / "head").read_text().strip().rsplit(":", 1)[0]
    dashboard = [lis for lis in socks if "ray/dashboard/dashboard.py" in lis.cmd]
    metrics_ports = target_ports(job_dir) | {lis.port for lis in dashboard if not lis.loopback}
    verdicts = {}
    for lis in socks:
        if not lis.loopback:
            verdicts[(lis.addr, lis.port, lis.cmd[:60])] = probe(lis.host(node_addr), lis.port, token)
    open_ports = {
        k: v
        for k, v in verdicts.items()
        if v not in ("authenticated", "unreachable") and not (v == "metrics" and k[1] in metrics_ports)
    }
    assert not open_ports, f"reachable off loopback without the token: {open_ports}"
    assert list(verdicts.values()).count("authenticated") >= 8, verdicts  # GCS, 2 raylets x 2, 2 agents x 2, ...
    # the dashboard's Jobs API (loopback) and every dashboard agent HTTP port (node address and loopback)
    dash_port = re.search(r"^n1: ray_dashboard: http://127\.0\.0\.1:(\d+) ", log.read_text(), re.M).group(1)
    url = f"http://127.0.0.1:{dash_port}/api/jobs/"
    assert http_status("POST", url, None, b'{"entrypoint": "id"}')[0] == 401
    assert http_status("POST", url, "0" * 64, b'{"entrypoint": "id"}')[0] == 403
    assert http_status("POST", url, token, b"{}")[0] == 400  # let in, then refused for the missing entrypoint
    agents = [lis for lis in socks if lis.cmd.startswith("ray::DashboardAgent") and lis.port not in metrics_ports]
    agent_http = [
        lis for lis in agents if http_status("GET", f"http://{lis.host(node_addr)}:{lis.port}/")[0] is not None
    ]
    assert len({lis.pid for lis in agent_http}) == 2 and len(agent_http) == 4, (
        agents
    )  # 2 nodes x (node address, loopback)
    for lis in agent_http:
        url = f"http://{lis.host(node_addr)}:{lis.port}/api/job_agent/jobs/"
        assert http_status("POST", url, None, b'{"entrypoint": "id"}')[0] == 401, url
        assert http_status("POST", url, token, b"{}")[0] == 400, url


def test_ray_job_is_private_authenticated_and_leaves_a_tsdb(cluster, workspace, venv, tmp_path):
    # the nodes' TMPDIR: a /tmp of this test's own (mode 1777 like /tmp; short, for Ray's socket paths)
    node_tmp = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    node_tmp.chmod(0o1777)
    victim = tmp_path / "cache"  # the job owner's private files (think ~/.cache/huggingface)
    victim.mkdir(mode=0o700)
    secret = f"PRIVATE-{uuid.uuid4().hex}".encode()
    (victim / "secret.txt").write_bytes(secret)
    (victim / "secret.txt").chmod(0o600)
    # the job dir taken to be on NFS (MST_TSDB_FSTYPE: this machine cannot serve NFS): the TSDB is written
    # on n1's disk and copied into the job dir; every check of the saved TSDB below reads that copy
    job_id, log = submit(
        cluster, workspace, "tiny", "-N", "2", "--hold", "--", "steps=40", "log_period=5",
        RAY="1", TMPDIR=str(node_tmp), MST_TSDB_FSTYPE="nfs", METRICS_TSDB_COPY_INTERVAL="5",
    )  # fmt: skip
    traps: list[Path] = []
    try:
        traps = plant_old_scratch(node_tmp, job_id)
        assert run(["scontrol", "release", job_id], env=cluster).returncode == 0
        job_dir = log.with_suffix("")
        # while it runs: the trainer is a plain process, with no Ray in it
        pid = wait_for(lambda: trainer_pid(job_id, 1), 240, "the rank 1 trainer")
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not [e for e in env if e.startswith(b"RAY_")], "trainer got Ray's environment"
        assert b"_raylet" not in Path(f"/proc/{pid}/maps").read_bytes(), "trainer has Ray loaded"
        # ... and it runs at the launcher's priority, not at the nice 15 Ray gives its workers
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0), "trainer was niced"
        # n2's exporter killed (SIGKILL) mid-job serves again within two scrape intervals (5 s each)
        gone = wait_for(lambda: exporter_of(job_dir, "n2"), 60, "n2's exporter")
        os.kill(gone, signal.SIGKILL)
        killed = time.monotonic()

        def serving_again() -> bool:
            if exporter_of(job_dir, "n2") in (None, gone):
                return False
            target = json.loads((job_dir / "metrics/targets/n2-node.json").read_text())[0]["targets"][0]
            try:
                with urllib.request.urlopen(f"http://{target}/metrics", timeout=2) as r:
                    return 'exporter_restarts_total{host="n2"} 1.0' in r.read().decode()
            except OSError:
                return False

        wait_for(serving_again, 60, "n2's exporter to serve again")
        back_after = time.monotonic() - killed
        assert back_after <= 10, back_after

        # each node's private scratch: ours, 0700, holding Ray's temp dir, job.env and the exporter's state
        tsdb_local = [s for s in node_tmp.glob("mst.*") if (s / "tsdb").is_dir()]
        assert [s.name for s in tsdb_local] and (tsdb_local[0] / "job").read_text().split()[2] == "n1", tsdb_local
        assert stat.S_IMODE(tsdb_local[0].stat().st_mode) == 0o700
        scratch = {
            (s / "job").read_text().split()[2]: s
            for s in node_tmp.glob("mst.*")
            if not (s / "repo").exists() and s not in tsdb_local
        }
        assert sorted(scratch) == ["n1", "n2"], scratch
        for s in scratch.values():
            st = s.lstat()
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
            assert stat.S_IMODE((s / "job.env").stat().st_mode) == 0o600
            assert b"RAY_AUTH" not in (s / "job.env").read_bytes()
            assert (s / "ray").is_dir() and (s / "exporter").is_dir()
            plant_links(s / "ray", victim)
        # the job's Ray token: 0600 in a 0700 directory of the job dir
        auth = job_dir / "ray" / "auth"
        assert stat.S_IMODE(auth.lstat().st_mode) == 0o700 and stat.S_IMODE((auth / "token").lstat().st_mode) == 0o600
        token = (auth / "token").read_text()
        assert re.fullmatch(r"[0-9a-f]{64}", token)

        wait_log(log, r"^n[12]: .*completed step: 0,", 240, "the first step")
        check_listeners_and_auth(job_dir, log, token)
        assert wait_job_end(cluster, job_id, 300) == "COMPLETED", log.read_text()[-3000:]
    finally:
        if job_state(cluster, job_id) in ("PENDING", "RUNNING"):
            run(["scancel", job_id], env=cluster)
            wait_job_end(cluster, job_id, 60)
        leftovers = sorted(p.name for p in node_tmp.glob("mst.*"))
        trapped = [
            (d / "job.env").read_bytes() + b"".join(p.name.encode() for p in (d / "exporter").iterdir()) for d in traps
        ]
        shutil.rmtree(node_tmp, ignore_errors=True)
    assert summary(log)["status"] == "completed"
    assert log_has(log, r"^n1: prometheus: http://127\.0\.0\.1:(\d+) +tunnel: ssh -N -L \1:127\.0\.0\.1:\1 n1$")
    assert log_has(log, r"^n1: ray_dashboard: http://127\.0\.0\.1:\d+ ")
    assert log_has(log, rf"^n1: ray_token: {re.escape(str(job_dir / 'ray/auth/token'))} ")  # where, never what
    assert log_has(log, r"^n1: tsdb: .*/prometheus$")
    assert log_has(log, r"^tsdb: node_local \(nfs; Prometheus does not support it\): .* every 5 s and at the end$")
    assert log_has(log, rf"^n1: tsdb_local: {re.escape(str(node_tmp))}/mst\.\w+/tsdb +\(the job dir is on nfs, ")
    assert log_has(log, r"^n1: tsdb: the last copy from this node's disk is in .*/prometheus \(copied ")
    assert not (job_dir / "prometheus" / "queries.active").exists()  # Prometheus never ran in the job dir
    # afterwards: the scratch dirs and the token are gone, the token was never written anywhere
    assert leftovers == [], "scratch dirs left behind"
    assert not (job_dir / "ray" / "auth").exists()
    assert files_containing(job_dir, token.encode()) == [] and token not in log.read_text()
    # the other user's traps got nothing (the old launcher wrote the environment and FIFOs into them)
    assert len(trapped) == 2 and trapped == [b"", b""], trapped
    # each node's Ray logs are kept, as regular files only; nothing the planted links pointed at
    for host in ("n1", "n2"):
        logs = job_dir / "ray" / f"logs-{host}"
        assert (logs / "raylet.out").is_file(), sorted(p.name for p in logs.iterdir())
        assert not [p for p in logs.rglob("*") if p.is_symlink() or p.name.startswith("planted")]
    assert files_containing(job_dir, secret) == []

    tsdb = log.with_suffix("") / "prometheus"
    # the last scrape reached every node's exporter and Ray (Prometheus stops before any of them),
    # so the saved data, queried at its end, holds every node
    assert by_host(query(tsdb, "exporter_restarts_total")) == {"n1": 0.0, "n2": 1.0}
    # one restart, the kill's: none when the job stopped it at the end
    restarts = re.findall(
        r"_train_with_ray\.sh: the exporter exited .*", (job_dir / "metrics/exporter-n2.log").read_text()
    )
    assert restarts == ["_train_with_ray.sh: the exporter exited (status 137); start 2 in 1 s"], restarts
    assert "exporter exited" not in (job_dir / "metrics/exporter-n1.log").read_text()
    ups = query(tsdb, "up")  # two nodes: each one's exporter and Ray metrics port
    assert len(ups) == 4 and {u["value"][1] for u in ups} == {"1"}, ups
    assert set(by_host(query(tsdb, "count by (host) (hw_procs_running)"))) == {"n1", "n2"}
    assert set(by_host(query(tsdb, "count by (host) (hw_tcp_retransmits_total)"))) == {"n1", "n2"}
    assert set(by_host(query(tsdb, 'count by (host) ({__name__=~"ray_node_cpu_utilization|ray_node_mem_used"})'))) == {
        "n1",
        "n2",
    }
    # every step's loss and step time, stamped with the event's wall time, which matches the log
    for name in ("tb_learning_loss", "tb_perf_step_time_seconds"):
        assert by_host(query(tsdb, f"count_over_time({name}[1d])")) == {"n1": 40.0}
    steps = step_times(log, "n1")
    assert sorted(steps) == list(range(40)), "n1's step lines are not attributed to n1"
    last = query(tsdb, "timestamp(tb_learning_loss)")
    assert abs(float(last[0]["value"][1]) - steps[39]) < 3, (last, steps[39])

    # the diagnosis tools on this real job: no GPUs or RDMA here, everything present is clean
    res = run(
        [str(venv / "bin/python"), str(REPO / "utils/diagnose.py"), str(log.with_suffix("")), "--json"], timeout=300
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    d = json.loads(res.stdout)
    assert d["verdict"] == "none" and d["culprit_hosts"] == [] and not d["insufficient_evidence"], d["summary"]
    assert len(d["hosts"]) == 2 and {"hw_gpu_*", "hw_ib_*"} <= set(d["missing"])
    assert {"network", "cpu_contention", "io_pressure", "memory"} <= {c["check"] for c in d["ruled_out"]}
    assert any(f.startswith("tb_") for f in d["families"])
    t = triage(log, cluster)
    assert t["status"] == "completed" and t["progress"]["last_step"] == 39 and t["tgs"]["steady"] > 0, t["summary"]


@pytest.mark.parametrize("place", ["in_place", "node_local"])
def test_sigkill_of_the_whole_job_keeps_every_scraped_sample(cluster, workspace, venv, place):
    """In place, the saved TSDB keeps every sample scraped before the kill (Prometheus' WAL). On node-local
    disk (the job dir taken to be on NFS, MST_TSDB_FSTYPE), it keeps what the last copy held: the samples
    scraped after it are lost (printed)."""
    extra = {"MST_TSDB_FSTYPE": "nfs", "METRICS_TSDB_COPY_INTERVAL": "5"} if place == "node_local" else {}
    job_id, log = submit(
        cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000", RAY="1", METRICS_INTERVAL="1", **extra
    )
    port = wait_for(
        lambda: (
            log_has(log, r"^n1: prometheus: http://127\.0\.0\.1:(\d+)")
            and re.search(r"^n1: prometheus: http://127\.0\.0\.1:(\d+)", log.read_text(), re.M).group(1)
        ),
        240,
        "Prometheus",
    )
    wait_log(log, r"completed step: 20,", 240, "training")

    def live_count() -> float:
        out = subprocess.run(
            [
                "curl",
                "-s",
                "--noproxy",
                "*",
                f"http://127.0.0.1:{port}/api/v1/query",
                "--data-urlencode",
                "query=sum(count_over_time(hw_procs_running[1h]))",
            ],
            capture_output=True,
            text=True,
        ).stdout
        try:  # a restarted Prometheus answers "Service Unavailable" until its WAL is replayed
            result = json.loads(out)["data"]["result"]
        except (ValueError, KeyError):
            return 0.0
        return float(result[0]["value"][1]) if result else 0.0

    wait_for(lambda: live_count() >= 10, 60, "ten scrapes")
    # Prometheus dies mid-job: the job restarts it on the same TSDB and scraping goes on
    tsdb = log.with_suffix("") / "prometheus"

    def prometheus_pid() -> int | None:
        conf = tsdb.parent / "metrics/prometheus.yml"
        out = subprocess.run(["pgrep", "-f", f"config.file={conf}"], capture_output=True, text=True).stdout
        return int(out.split()[0]) if out.split() else None

    first_pid = prometheus_pid()
    assert first_pid
    os.kill(first_pid, signal.SIGKILL)
    wait_for(lambda: (prometheus_pid() or first_pid) != first_pid, 30, "Prometheus to be restarted")
    after_restart = wait_for(lambda: live_count(), 30, "Prometheus to answer again")
    wait_for(lambda: live_count() > after_restart, 30, "scrapes after the restart")
    before = live_count()
    if place == "node_local":  # a copy into the job dir after that count
        copies = tsdb.parent / "metrics/tsdb-copy.log"
        seen = len(copies.read_text().splitlines())
        wait_for(lambda: len(copies.read_text().splitlines()) > seen, 30, "a copy into the job dir")
    at_kill = live_count()
    # SIGKILL every process of the job (what a node crash does), Prometheus included; found by the
    # job dir in their environment (a job id alone may be another local cluster's job on this machine)
    killed = []
    for pid in job_processes(log.with_suffix("")):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    assert killed
    run(["scancel", job_id], env=cluster)
    wait_job_end(cluster, job_id, 180)  # a hang bound only: under load Slurm took over 60 s to end it (a CI run)
    assert (tsdb / "wal").is_dir()
    saved = float(query(tsdb, "sum(count_over_time(hw_procs_running[1h]))")[0]["value"][1])
    assert saved >= before
    print(f"{place}: hw_procs_running samples (2 nodes, 1 s): {at_kill:.0f} live before the kill, {saved:.0f} saved")


def test_falls_back_to_the_plain_launch_when_ray_cannot_start(cluster, workspace, venv):
    # an object store larger than the machine's memory (1 TB; valid for the launcher, which only
    # checks the range) makes `ray start` fail on every node
    job_id, log = submit(
        cluster,
        workspace,
        "tiny",
        "-N",
        "2",
        "--",
        "steps=5",
        RAY="1",
        MST_RAY_OBJECT_STORE_BYTES="1000000000000",
        MST_RAY_JOIN_TIMEOUT="20",
    )
    assert wait_job_end(cluster, job_id, 300) == "COMPLETED", log.read_text()[-3000:]
    assert log_has(log, r"^n1: _train_with_ray.sh: Ray head did not start on n1: .* falling back to the plain launch")
    # the OBSERVE block says why there is no Ray, and Prometheus and TensorBoard still run
    text = log.read_text()
    block = text.split("n1: ==================== OBSERVE ====================\n", 1)[1].split("\nn1: =====", 1)[0]
    ray_lines = [line for line in block.splitlines() if line.startswith("n1: ray")]
    assert len(ray_lines) == 1, block
    assert re.fullmatch(
        r"n1: ray: off - Ray head did not start on n1: .+ \(see \S+/metrics/ray-start-n1\.log\);"
        r" training with the plain launch \(metrics, Prometheus and TensorBoard stay on\)",
        ray_lines[0],
    ), ray_lines[0]
    assert re.search(r"^n1: prometheus: http://127\.0\.0\.1:\d+ ", block, re.M) and "n1: tensorboard: " in block
    assert log_has(log, r"^n2: _train_with_ray.sh: .*falling back to the plain launch")
    for host in ("n1", "n2"):
        assert log_has(log, rf"^{host}: .*completed step: 4,")
    assert summary(log)["status"] == "completed"
    assert trainer_pid(job_id, 0) is None


def test_killed_rank_stops_the_ray_job_fast(cluster, workspace, venv):
    """RAY=1: the actor of the node whose trainer dies reports it at once and the driver stops the
    other nodes' trainers: rank 0's trainer is gone within 15 s (under 1 s here), the job ends within
    45 s (it keeps its metrics up 11 s for a last scrape and copies the TSDB: 30.6 s in a whole-suite
    run in a slow hour; waiting for JAX's heartbeat timeout instead would take over a minute), and the
    JOB SUMMARY names the node."""
    # the job dir taken to be on NFS: the cancel's cleanup also copies the node-local TSDB into the job dir
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000", RAY="1", MST_TSDB_FSTYPE="nfs")
    wait_log(log, r"^n2: .*completed step: 3,", 240, "n2 to train")
    pid = trainer_pid(job_id, 1)
    assert pid and trainer_pid(job_id, 0), "a trainer not found"
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: trainer_pid(job_id, 0) is None, 15, "the driver to stop rank 0's trainer")
    wait_job_end(cluster, job_id, 90)
    assert time.monotonic() - killed_at < 45, "the job took too long to end after the kill"
    s = summary(log)
    assert s["status"] == "failed" and s["failed_nodes"].startswith("n2 (exit 137)"), s
    assert log_has(log, r"^n1: _ray_actor\.py: training on n2 exited with 137; stopping the other nodes")
    assert trainer_pid(job_id, 0) is None, "rank 0 survived"


def test_frozen_rank_hang_then_heartbeat_timeout(cluster, workspace, venv):
    """A rank frozen with SIGSTOP (what a stuck driver call or a swap storm looks like). While the job
    runs, triage says hung; once JAX's coordination service declares the task dead (~1 min), the job
    fails and triage blames the frozen node (heartbeat_timeout, not the survivor's abort), and
    diagnose finds the accused host really stopped (not a heartbeat false positive)."""
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000", RAY="1", METRICS_INTERVAL="2")
    wait_log(log, r"^n2: .*completed step: 30,", 240, "n2 to train")
    pid = trainer_pid(job_id, 1)
    assert pid, "rank 1 trainer not found"
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(20)
        r = triage(log, cluster, "--hang-min-seconds", "15")
        assert r["status"] == "hung" and r["failure_class"] == "hang", r["summary"]
        assert r["hang"]["last_step_age_seconds"] > 15 and r["scheduler_state"] == "RUNNING"
        assert any("py-spy dump" in n for n in r["next_steps"])
        assert wait_job_end(cluster, job_id, 180) == "FAILED", log.read_text()[-3000:]
    finally:
        if job_state(cluster, job_id) in ("RUNNING", "PENDING"):
            run(["scancel", job_id], env=cluster)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert log_has(log, r"stopped sending heartbeats")
    r = triage(log, cluster)
    assert r["failure_class"] == "heartbeat_timeout" and r["culprit_hosts"] == ["n2"], r["summary"]
    res = run(
        [str(venv / "bin/python"), str(REPO / "utils/diagnose.py"), str(log.with_suffix("")), "--json"], timeout=300
    )
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["verdict"] != "heartbeat_false_positive", d["summary"]
    hb = [f for f in d["findings"] if f["kind"] == "heartbeat_timeout"]
    assert hb and hb[0]["hosts"] == ["n2"], d["findings"]


def guards() -> dict[int, int]:
    """Trainer process group -> pid of every trainer guard running now (found by its command line)."""
    out = {}
    for p in Path("/proc").iterdir():
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 4 and argv[1].endswith(b"/trainer_guard.py") and argv[3].isdigit():
            out[int(argv[3])] = int(p.name)
    return out


def test_scancel_leaves_nothing_of_a_ray_job_running(cluster, workspace, venv):
    """Ray's daemons leave the job's process tree (Slurm's own kill does not reach them): a cancelled
    RAY=1 job must still stop every trainer, Ray process and service it started, on every node."""
    # the job dir taken to be on NFS: the cancel's cleanup also copies the node-local TSDB into the job dir
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000", RAY="1", MST_TSDB_FSTYPE="nfs")
    wait_log(log, r"^n2: .*completed step: 3,", 240, "n2 to train")
    job_dir = log.with_suffix("")
    assert job_processes(job_dir), "the job's processes were not found"
    # each trainer has its guard (utils/observe/trainer_guard.py LAUNCHER_PID TRAINER_PGID), which stops
    # it should the cancel's cleanup be cut short: MaxText takes SIGTERM as a preemption notice and
    # trains on, and Slurm's kill does not reach a Ray actor's child
    trainers = {os.getpgid(pid) for rank in (0, 1) if (pid := trainer_pid(job_id, rank))}
    assert len(trainers) == 2, trainers
    assert set(guards()) >= trainers, (guards(), trainers)
    run(["scancel", job_id], env=cluster)
    cancelled = time.time()
    assert wait_job_end(cluster, job_id, 60) == "CANCELLED"
    deadline = time.monotonic() + 30
    while (left := job_processes(job_dir)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"the job's processes still ran 30 s after it ended: {left}"
    assert trainer_pid(job_id, 0) is None and trainer_pid(job_id, 1) is None
    deadline = time.monotonic() + 10  # a guard ends once its trainer's group is empty
    while set(guards()) & trainers and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(guards()) & trainers, "a trainer's guard outlived it by 10 s"
    assert summary(log)["status"] == "cancelled"
    # the node-local TSDB: copied into the job dir up to the cancel (a copy every 60 s would hold
    # none of this short job; Slurm's SIGTERM reached the copier, which copied once Prometheus had
    # stopped), then removed from the node
    last = query(job_dir / "prometheus", "max(timestamp(hw_procs_running))")
    assert last and cancelled - float(last[0]["value"][1]) < 10, (last, cancelled)
    assert " tsdb_mirror: copied " in (job_dir / "metrics/tsdb-copy.log").read_text()
    left = [
        p.parent
        for p in Path(tempfile.gettempdir()).glob("mst.*/tsdb")
        if str(workspace) in (p.parent / "job").read_text()
    ]
    assert left == [], left
