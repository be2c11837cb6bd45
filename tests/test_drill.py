"""utils/drill.sh without a cluster: --help, bad arguments (exit 2, one line), and the refusals
when the --netns cluster, the node or the trainer is not there (exit 1, one line). The faults
themselves run in tests/test_live_incidents.py (and net --delay in tests/test_local_cluster.py)."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DRILL = REPO / "utils" / "drill.sh"


def drill(*args: str, cluster_dir: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "LOCAL_CLUSTER_DIR": str(cluster_dir), **env}
    return subprocess.run([str(DRILL), *args], capture_output=True, text=True, env=full, timeout=30)


def fake_cluster(tmp_path: Path) -> Path:
    """A cluster dir whose node table names n1 and n2 with empty cgroups (no process in them)."""
    d = tmp_path / "c"
    (d / "run").mkdir(parents=True)
    rows = []
    for i in (1, 2):
        cg = tmp_path / f"cg{i}"
        cg.mkdir()
        (cg / "cgroup.procs").write_text("")
        rows.append(f"n{i} mstabcn{i} 10.1.2.{10 + i} {cg}\n")
    (d / "run" / "netns").write_text("".join(rows))
    return d


def test_help_prints_the_usage_header(tmp_path):
    r = drill("--help", cluster_dir=tmp_path / "none")
    assert r.returncode == 0 and r.stdout.startswith("Usage: utils/drill.sh FAULT"), r.stderr
    for fault in ("net --loss PCT", "net --delay MS", "io [--seconds S]", "oom", "freeze | thaw | kill", "clear"):
        assert fault in r.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "missing FAULT"),
        (["melt"], "unknown FAULT 'melt'"),
        (["net"], "net needs --loss PCT or --delay MS"),
        (["net", "--loss"], "--loss needs a value"),
        (["net", "--loss", "0"], "--loss must be a percentage"),
        (["net", "--loss", "101"], "--loss must be a percentage"),
        (["net", "--loss", "5%"], "--loss must be a percentage"),
        (["net", "--loss", "2.55"], "--loss must be a percentage"),
        (["net", "--loss", "5", "--delay", "10"], "not both"),
        (["net", "--delay", "0"], "--delay must be milliseconds"),
        (["io", "--loss", "5"], "options of net only"),
        (["net", "--loss", "5", "--seconds", "9"], "options of io only"),
        (["net", "--delay", "5", "--inside"], "--inside goes with --loss"),
        (["oom", "--inside"], "--inside is an option of net --loss only"),
        (["io", "--seconds", "-3"], "--seconds must be"),
        (["kill", "--node", "n0"], "--node must be n1 .. n16"),
        (["kill", "--node", "host7"], "--node must be n1 .. n16"),
        (["kill", "--job", "12a"], "--job must be a job id"),
        (["freeze", "--now"], "unknown argument '--now'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, says):
    r = drill(*args, cluster_dir=fake_cluster(tmp_path))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("drill.sh: ") and says in r.stderr, r.stderr


@pytest.mark.parametrize("fault", [["net", "--loss", "5"], ["io", "--dir", "/tmp"], ["oom"], ["freeze"], ["kill"]])
def test_refused_without_a_netns_cluster(tmp_path, fault):
    r = drill(*fault, cluster_dir=tmp_path / "nothing")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"drill.sh: no local cluster started with --netns in {tmp_path / 'nothing'} "
        "(utils/local_cluster.sh up N --netns)"
    ]


def test_refused_for_a_node_the_cluster_does_not_have(tmp_path):
    r = drill("kill", "--node", "n3", cluster_dir=fake_cluster(tmp_path))
    assert r.returncode == 1 and r.stderr.strip().endswith("has no node n3 (n1 n2 )"), r.stderr


@pytest.mark.parametrize("fault", ["freeze", "thaw", "kill", "oom"])
def test_refused_when_no_trainer_runs_on_the_node(tmp_path, fault):
    r = drill(fault, "--job", "42", cluster_dir=fake_cluster(tmp_path))
    assert r.returncode == 1 and r.stderr.splitlines() == ["drill.sh: no trainer running on n2 for job 42"], r.stderr


def test_net_refused_when_the_nodes_port_is_gone(tmp_path):
    r = drill("net", "--delay", "20", "--node", "n1", cluster_dir=fake_cluster(tmp_path))
    assert r.returncode == 1 and "port mstabcn1 is gone" in r.stderr and len(r.stderr.splitlines()) == 1


def test_io_needs_a_writable_workspace(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JOB_WORKSPACE"}
    r = subprocess.run(
        [str(DRILL), "io"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "LOCAL_CLUSTER_DIR": str(fake_cluster(tmp_path))},
    )
    assert r.returncode == 2 and "set JOB_WORKSPACE or pass --dir DIR" in r.stderr
    r = drill("io", "--dir", str(tmp_path / "missing"), cluster_dir=fake_cluster(tmp_path / "x"))
    assert r.returncode == 1 and "is not a writable directory" in r.stderr


def test_clear_without_a_cluster_is_safe(tmp_path):
    r = drill("clear", cluster_dir=tmp_path / "nothing")
    assert r.returncode == 0 and r.stdout.startswith("drill: cleared"), r.stderr
    assert not (tmp_path / "nothing").exists()


def test_io_refuses_a_directory_in_memory(tmp_path):
    """Writes to a tmpfs never wait on a disk: no IO pressure to see, so the drill says so and
    writes nothing (the tmpfs here is /dev/shm, which every Linux machine mounts)."""
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        r = drill("io", "--dir", str(shm), cluster_dir=fake_cluster(tmp_path))
        assert r.returncode == 1 and r.stdout == "", r.stderr
        assert r.stderr.splitlines() == [
            f"drill.sh: io: '{shm}' is in memory (tmpfs): writes there never wait on a disk; pass --dir DIR on a disk"
        ]
        assert list(shm.iterdir()) == []
    finally:
        shutil.rmtree(shm)
