"""utils/local_cluster.sh: a real multi-node Slurm cluster (munged, slurmctld, slurmd n1..nN) on this machine.

The cluster is shared: `ensure_local_cluster` brings it up (idempotent `up`) and the session fixture
only takes it down again if it was not already up when the session started. Both are meant to move
into tests/conftest.py once other tests need the cluster.
"""

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "utils" / "local_cluster.sh"
HEALTHY = {"idle", "alloc", "mix", "comp"}

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not all(
            shutil.which(b, path=os.environ.get("PATH", "") + ":/usr/sbin")
            for b in ("slurmctld", "slurmd", "munged", "srun")
        ),
        reason="needs Debian's slurmctld, slurmd, slurm-client and munge",
    ),
]


def local_cluster(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout)


def ensure_local_cluster(nodes: int = 2) -> dict[str, str]:
    """Bring the local cluster up (no-op if it is up with `nodes` nodes); return an env for Slurm clients."""
    up = local_cluster("up", str(nodes))
    if up.returncode != 0:
        raise RuntimeError(f"local_cluster.sh up {nodes} failed ({up.returncode}): {up.stdout}{up.stderr}")
    env = dict(os.environ)
    for line in local_cluster("env").stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            env[name] = value
    return env


@pytest.fixture(scope="session")
def cluster_env() -> Iterator[dict[str, str]]:
    was_up = local_cluster("status").stdout.startswith("local cluster: up")
    yield ensure_local_cluster(2)
    if not was_up:
        local_cluster("down")


def run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=tempfile.gettempdir())


def node_states(env: dict[str, str]) -> dict[str, str]:
    out = run(["sinfo", "-h", "-N", "-o", "%N %t"], env).stdout
    return dict(line.split() for line in out.splitlines())


def test_sinfo_shows_two_idle_nodes(cluster_env):
    deadline = time.monotonic() + 30  # another session's jobs may still hold the nodes
    while (states := node_states(cluster_env)) != {"n1": "idle", "n2": "idle"} and time.monotonic() < deadline:
        assert set(states) == {"n1", "n2"} and set(states.values()) <= HEALTHY, states
        time.sleep(0.2)
    assert states == {"n1": "idle", "n2": "idle"}


def test_env_points_at_the_cluster_dir(cluster_env):
    conf = Path(cluster_env["SLURM_CONF"])
    assert conf.is_file() and conf.name == "slurm.conf"
    text = conf.read_text()
    assert "SlurmctldPort=6817\n" not in text and "PartitionName=debug Nodes=n[1-2] Default=YES" in text


def test_srun_runs_one_task_per_node_with_its_own_hostname(cluster_env):
    r = run(["srun", "-N2", "--immediate=10", "hostname"], cluster_env)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["n1", "n2"]
    # n1..nN resolve inside the jobs (private /etc/hosts per node): coordinators can be addressed by node name.
    r = run(["srun", "-N2", "--immediate=10", "getent", "hosts", "n1"], cluster_env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["127.0.0.1", "n1", "n2"] * 2


def test_kill_on_bad_exit_stops_the_other_node_in_seconds(cluster_env):
    script = 'if [ "$(hostname)" = n2 ]; then sleep 1; exit 3; else sleep 100; fi'
    start = time.monotonic()
    r = run(["srun", "-N2", "--immediate=10", "--kill-on-bad-exit=1", "bash", "-c", script], cluster_env)
    assert time.monotonic() - start < 15, r.stderr
    assert r.returncode != 0
    assert "n2: task 1: Exited with exit code 3" in r.stderr
    assert "n1: task 0: Terminated" in r.stderr


def test_sbatch_job_completes(cluster_env, tmp_path):
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\n#SBATCH -N2\nsrun hostname\n")
    out = tmp_path / "job.out"
    r = run(["sbatch", "--parsable", "-o", str(out), str(job)], cluster_env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while True:
        show = run(["scontrol", "show", "job", "-o", job_id], cluster_env).stdout
        fields = dict(f.split("=", 1) for f in show.split() if "=" in f)
        if fields.get("JobState") not in {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}:
            break
        assert time.monotonic() < deadline, show
        time.sleep(0.1)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", show
    assert sorted(out.read_text().split()) == ["n1", "n2"]


def test_status_reports_nodes(cluster_env):
    r = local_cluster("status")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("local cluster: up, 2 nodes, SLURM_CONF=")
    states = dict(line.split() for line in lines[1:])
    assert set(states) == {"n1", "n2"}
    assert r.returncode == (0 if set(states.values()) <= HEALTHY else 1)


def test_up_is_idempotent_and_refuses_another_node_count(cluster_env):
    r = local_cluster("up", "2")
    assert r.returncode == 0 and r.stdout.startswith("local cluster: up, 2 nodes"), r.stderr
    r = local_cluster("up", "3")
    assert r.returncode == 1 and "already up with 2 nodes" in r.stderr and "down" in r.stderr
    assert local_cluster("status").stdout.startswith("local cluster: up, 2 nodes")


@pytest.mark.parametrize(
    "args",
    [
        ["up", "0"],
        ["up", "17"],
        ["up", "-1"],
        ["up", "two"],
        ["up", "1.5"],
        ["up", "2", "3"],
        ["up", "--netns", "x"],
        ["up", "2", "--netns", "3"],
        ["frob"],
        [],
        ["down", "now"],
        ["status", "x"],
    ],
)
def test_bad_input_exits_2_with_one_line_and_starts_nothing(args):
    with tempfile.TemporaryDirectory(prefix="lc-") as tmp:
        d = Path(tmp) / "c"
        r = local_cluster(*args, env={**os.environ, "LOCAL_CLUSTER_DIR": str(d)})
        assert r.returncode == 2
        assert r.stdout == "" and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("local_cluster.sh: ")
        assert not d.exists()


def test_netns_as_another_user_is_bad_input():
    with tempfile.TemporaryDirectory(prefix="lc-") as tmp:  # short: a pytest worker's tmp_path may pass 64
        os.chmod(tmp, 0o755)
        r = subprocess.run(
            ["runuser", "-u", "nobody", "--", str(SCRIPT), "up", "2", "--netns"],
            capture_output=True,
            text=True,
            env={**os.environ, "LOCAL_CLUSTER_DIR": f"{tmp}/c"},
            timeout=60,
        )
        assert (
            r.returncode == 2
            and r.stderr == "local_cluster.sh: --netns needs root (network namespaces, a bridge, cgroups)\n"
        )
        assert not Path(tmp, "c").exists()


def test_too_long_dir_is_bad_input():
    r = local_cluster("up", env={**os.environ, "LOCAL_CLUSTER_DIR": "/tmp/" + "x" * 80})
    assert r.returncode == 2 and "at most 64 characters" in r.stderr


def test_a_bad_first_job_id_is_bad_input():
    with tempfile.TemporaryDirectory(prefix="lc-") as tmp:  # short: a pytest worker's tmp_path may pass 64
        d = Path(tmp) / "c"
        env = {**os.environ, "LOCAL_CLUSTER_DIR": str(d), "LOCAL_CLUSTER_FIRST_JOB_ID": "0x10"}
        r = local_cluster("up", env=env)
        assert r.returncode == 2 and r.stdout == ""
        want = "LOCAL_CLUSTER_FIRST_JOB_ID must be a job id from 1 to 9999999, got '0x10'"
        assert r.stderr == f"local_cluster.sh: {want}\n"
        assert not d.exists()


@pytest.mark.slow
def test_two_clusters_that_come_up_at_once_take_their_own_ports_and_job_ids():
    """tests/run.sh's phase B: a cluster's up picks its ports only while it holds the user's port lock
    (held here by the test: nothing is written until it lets go), two clusters started at the same
    moment bind different ports, and each numbers its jobs from its FirstJobId."""
    with tempfile.TemporaryDirectory(prefix="lc-") as tmp:
        os.chmod(tmp, 0o755)
        cache = Path(tmp, "cache")  # a private XDG_CACHE_HOME: no other cluster waits on this lock
        lock = cache / "maxtext-slurm" / "local_cluster.ports.lock"
        lock.parent.mkdir(parents=True)
        envs = [
            {**os.environ, "XDG_CACHE_HOME": str(cache), "LOCAL_CLUSTER_DIR": f"{tmp}/c{i}",
             "LOCAL_CLUSTER_FIRST_JOB_ID": str(1 + 100000 * i)}
            for i in (1, 2)
        ]  # fmt: skip
        try:
            with lock.open("a") as held:
                fcntl.flock(held, fcntl.LOCK_EX)
                ups = [
                    subprocess.Popen([str(SCRIPT), "up", "1"], env=e, stdout=subprocess.PIPE, text=True) for e in envs
                ]
                time.sleep(2)
                assert [p.poll() for p in ups] == [None, None]
                assert not any(Path(e["LOCAL_CLUSTER_DIR"], "slurm.conf").exists() for e in envs)
            assert [p.wait(timeout=120) for p in ups] == [0, 0], [p.stdout.read() for p in ups if p.stdout]
            ports = [re.findall(r"Port=(\d+)", Path(e["LOCAL_CLUSTER_DIR"], "slurm.conf").read_text()) for e in envs]
            assert len(ports[0]) == len(ports[1]) == 2 and not set(ports[0]) & set(ports[1]), ports
            for i, e in enumerate(envs, 1):
                r = run(["sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "true"],
                        {**e, "SLURM_CONF": f"{e['LOCAL_CLUSTER_DIR']}/slurm.conf"})  # fmt: skip
                assert r.stdout.strip() == str(1 + 100000 * i), r.stdout + r.stderr
        finally:
            for e in envs:
                local_cluster("down", env=e)


def test_private_cluster_lifecycle():
    """A second, private 1-node cluster next to the shared one: up, status, down, nothing left running."""
    with tempfile.TemporaryDirectory(prefix="lc-") as tmp:  # short path: Unix sockets live under it
        os.chmod(tmp, 0o755)  # munged insists that every parent of its socket is a+x
        env = {**os.environ, "LOCAL_CLUSTER_DIR": f"{tmp}/c"}
        pids: list[int] = []
        try:
            r = local_cluster("up", "1", env=env)
            assert r.returncode == 0, r.stderr
            assert r.stdout.splitlines()[1:] == ["n1 idle"]
            pids = [int(p.read_text()) for p in Path(tmp, "c", "run").glob("*.pid")]
            assert len(pids) == 3  # munged, slurmctld, slurmd n1
            r = run(["srun", "-N1", "--immediate=10", "hostname"], {**env, "SLURM_CONF": f"{tmp}/c/slurm.conf"})
            assert r.stdout == "n1\n", r.stderr
        finally:
            r = local_cluster("down", env=env)
        assert r.returncode == 0
        for pid in pids:
            status = Path(f"/proc/{pid}/status")
            assert not status.exists() or "State:\tZ" in status.read_text()
        r = local_cluster("status", env=env)
        assert r.returncode == 1 and "down" in r.stdout
        assert local_cluster("down", env=env).returncode == 0  # safe when nothing is up


def test_netns_cluster_gives_each_node_its_own_network_and_pressure():
    """up 2 --netns (root): each node has its own address on the cluster's bridge, resolves the
    others to theirs, reaches them, reads its own cgroup's PSI as /proc/pressure, and down leaves
    no namespace, bridge or cgroup. net --delay is applied with netem or refused in one line."""
    with tempfile.TemporaryDirectory(prefix="lc-") as tmp:
        os.chmod(tmp, 0o755)
        env = {**os.environ, "LOCAL_CLUSTER_DIR": f"{tmp}/c"}
        senv = {**env, "SLURM_CONF": f"{tmp}/c/slurm.conf"}
        try:
            r = local_cluster("up", "2", "--netns", env=env)
            assert r.returncode == 0, r.stderr
            rows = [line.split() for line in Path(tmp, "c", "run", "netns").read_text().splitlines()]
            names = [p.name for p in Path("/run/netns").glob("mst-*")] if Path("/run/netns").is_dir() else []
            names = [n for n in names if n.startswith(f"mst-{rows[0][1][3:-2]}-")]
            assert [row[0] for row in rows] == ["n1", "n2"]
            addr = {row[0]: row[2] for row in rows}
            subnet = addr["n1"].rsplit(".", 1)[0]
            assert addr == {"n1": f"{subnet}.11", "n2": f"{subnet}.12"} and subnet.startswith("10.")
            script = (
                'echo "$(hostname) $(ip -o -4 addr show eth0 | awk "{print \\$4}") $(getent hosts n1 | cut -d" " -f1)'
                ' $(cat /proc/self/cgroup | tail -1)"; exec 3<>/dev/tcp/n1/1 2>/dev/null; echo "n1 port 1: $?"'
            )
            r = run(["srun", "-N2", "--immediate=10", "bash", "-c", script], senv)
            assert r.returncode == 0, r.stderr
            got = sorted(line for line in r.stdout.splitlines() if not line.startswith("n1 port"))
            tag = rows[0][1][len("mst") : -len("n1")]
            assert got == [f"n{i} {subnet}.{10 + i}/24 {subnet}.11 0::/mst-{tag}/n{i}" for i in (1, 2)], r.stdout
            # n1 is reachable from both nodes: a refused connection (exit 1), not a timeout or no route
            assert r.stdout.count("n1 port 1: 1") == 2, r.stdout

            # n2's /proc/pressure is its cgroup's: its 'some' total is the cgroup's (a young cgroup's, far
            # below the machine's), not the machine's
            def some_total(text: str) -> int:
                return int(text.splitlines()[0].rsplit("total=", 1)[1])

            r = run(["srun", "-N1", "-w", "n2", "--immediate=10", "cat", "/proc/pressure/cpu"], senv)
            node = some_total(r.stdout)
            cgroup = some_total(Path(rows[1][3], "cpu.pressure").read_text())
            machine = some_total(Path("/proc/pressure/cpu").read_text())
            assert node <= cgroup < machine, (node, cgroup, machine)
            r = subprocess.run(
                [str(REPO / "utils/drill.sh"), "net", "--delay", "20", "--node", "n2"],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
            )
            qdisc = subprocess.run(["tc", "qdisc", "show", "dev", rows[1][1]], capture_output=True, text=True).stdout
            if r.returncode == 0:
                assert "netem" in qdisc and "delay 20ms" in qdisc, qdisc
            else:
                assert r.returncode == 1 and r.stderr.splitlines() == [
                    "drill.sh: --delay needs tc netem, which this kernel lacks (no sch_netem module); use --loss"
                ], r.stderr
                assert "netem" not in qdisc
        finally:
            subprocess.run([str(REPO / "utils/drill.sh"), "clear"], capture_output=True, env=env, timeout=30)
            r = local_cluster("down", env=env)
        assert r.returncode == 0
        # no cgroup, veth (the namespaces' ends) or bridge left, no namespace name at any time after up
        assert not [row for row in rows if Path("/sys/class/net", row[1]).exists() or Path(row[3]).exists()]
        assert not Path("/sys/class/net", f"mst{tag}").exists() and not names, names
