"""The network of the collectives (utils/launch/netenv.sh): NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME,
NCCL_IB_HCA and NCCL_IB_GID_INDEX chosen per node where nobody set them, the RDMA devices and verbs
libraries a container gets (_container.sh), and preflight's network check.

This machine has no RDMA NIC: the real netenv.sh reads fixture nodes through its test hooks
(MST_SYSFS_ROOT, MST_DEV_ROOT, MST_PROCFS_ROOT, MST_HOST_ROOT). The trees mirror the kernel's sysfs for mlx5
(ConnectX, InfiniBand and RoCE), bnxt_re (Broadcom Thor 2) and ionic (AMD Pensando Pollara), a node with
no ACTIVE port and one whose address sits on a link that is down; tests/fixtures/sysfs/README.md names the
kernel and rdma-core sources of every file. `ip` is a stand-in that prints each node's recorded
`ip -o addr show`. The container test runs the real _container.sh with the real podman (a private
storage, a tiny image, device nodes made with mknod), so what the container sees is what podman did.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run

from helpers.podman import private_podman, tiny_image

NETENV = REPO / "utils" / "launch" / "netenv.sh"
PREFLIGHT = REPO / "utils" / "launch" / "preflight.sh"
FIX = REPO / "tests" / "fixtures" / "sysfs"
HOST_LIBS = FIX / "host-libs"
NET_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX")
ADDRESS = {  # each fixture node's address
    "mlx5-ib": "10.0.0.7",
    "mlx5-roce": "10.0.0.8",
    "bnxt-roce": "10.0.0.9",
    "ionic-roce": "10.0.0.10",
    "no-active": "10.0.0.11",
    "no-netdev": "10.0.0.12",
    "no-ip": "10.0.0.13",
}


def node_env(fixture: str, nodes: int = 2, **env: str) -> dict[str, str]:
    """The environment of node n7, rank 1 of a job whose coordinator is 10.0.0.1, on a fixture node;
    nothing of the caller's job, network or hooks."""
    node = FIX / fixture
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JOB_", "MST_", "NCCL_", "GLOO_", "CONTAINER_", "PREFLIGHT_"))
    }
    addrs = " ".join(["10.0.0.1", ADDRESS.get(fixture, "10.0.0.2")][:nodes] + ["10.0.0.3"] * (nodes - 2))
    return {
        **clean,
        "PATH": f"{FIX / 'bin'}:{os.environ['PATH']}",
        "MST_SYSFS_ROOT": str(node / "sys"),
        "MST_DEV_ROOT": str(node / "dev"),
        "MST_PROCFS_ROOT": str(node / "proc"),
        "JOB_HOSTNAME": "n7",
        "JOB_NUM_NODES": str(nodes),
        "JOB_NODE_RANK": "1" if nodes > 1 else "0",
        "JOB_NODE_ADDRS": addrs if nodes > 1 else ADDRESS.get(fixture, "10.0.0.2"),
        "JOB_COORDINATOR_ADDR": "10.0.0.1" if nodes > 1 else ADDRESS.get(fixture, "10.0.0.2"),
        **env,
    }


def netenv(fixture: str, *args: str, nodes: int = 2, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(NETENV), *args], env=node_env(fixture, nodes, **env), capture_output=True, text=True, timeout=60
    )


def choices(res: subprocess.CompletedProcess) -> dict[str, str]:
    assert res.returncode == 0, res.stderr
    pairs = [line.split("=", 1) for line in res.stdout.splitlines()]
    assert len({k for k, _ in pairs}) == len(pairs), res.stdout
    return dict(pairs)


# --- the choices on each node -----------------------------------------------------------------------------
CASES = {
    # InfiniBand ports only (the front-end RoCE port is left out), version-sorted, the DOWN one skipped;
    # the socket interface is the front-end netdev that carries the node's address
    "mlx5-ib": {
        "NCCL_SOCKET_IFNAME": "=ens6f0np0",
        "GLOO_SOCKET_IFNAME": "ens6f0np0",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_10:1",
    },
    # RoCE: the one RoCE v2 IPv4 GID of both ports is at index 3
    "mlx5-roce": {
        "NCCL_SOCKET_IFNAME": "=eno1",
        "GLOO_SOCKET_IFNAME": "eno1",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
        "NCCL_IB_GID_INDEX": "3",
    },
    # the ports' IPv4 GIDs are at 3 and 5: no single index, NCCL picks per port
    "bnxt-roce": {
        "NCCL_SOCKET_IFNAME": "=bond0",
        "GLOO_SOCKET_IFNAME": "bond0",
        "NCCL_IB_HCA": "=bnxt_re0:1,bnxt_re1:1",
    },
    # RoCE v2 only: the IPv4 GID is at index 1
    "ionic-roce": {
        "NCCL_SOCKET_IFNAME": "=eno1",
        "GLOO_SOCKET_IFNAME": "eno1",
        "NCCL_IB_HCA": "=ionic_0:1,ionic_1:1",
        "NCCL_IB_GID_INDEX": "1",
    },
    # INIT (no subnet manager) and DOWN ports: no NCCL_IB_HCA at all
    "no-active": {"NCCL_SOCKET_IFNAME": "=eno1", "GLOO_SOCKET_IFNAME": "eno1"},
    # no ip command: the interface of the route to the node's address in /proc/net/route
    "no-ip": {"NCCL_SOCKET_IFNAME": "=eno1", "GLOO_SOCKET_IFNAME": "eno1"},
    # the address is on a link that is down: nothing for the socket
    "no-netdev": {},
}


@pytest.mark.parametrize("fixture", CASES)
def test_choices_on_each_node(fixture):
    assert choices(netenv(fixture)) == CASES[fixture]
    assert choices(netenv(fixture, "--print")) == CASES[fixture]


def test_report_lists_the_ports_their_states_and_why_a_port_is_left_out():
    res = netenv("mlx5-ib", "--report")
    assert res.returncode == 0, res.stdout
    out = res.stdout.splitlines()
    assert out[0].startswith("netenv: address 10.0.0.7 on ens6f0np0; interfaces: lo 127.0.0.1/8 (the loopback), ")
    assert "docker0 172.17.0.1/16 (a container or VM bridge)" in out[0]
    nic = "NVIDIA (Mellanox) ConnectX-4 to ConnectX-8, BlueField (mlx5_core, mlx5_ib, provider mlx5)"
    assert f"netenv: rdma mlx5_0 port 1: ACTIVE, LinkUp, InfiniBand, 400 Gb/sec (4X NDR); {nic}" in out
    assert (
        f"netenv: rdma mlx5_3 port 1: DOWN, Disabled, InfiniBand, 10 Gb/sec (4X SDR); {nic}; not used: port not ACTIVE"
    ) in out
    assert f"netenv: rdma mlx5_4 port 1 (ens6f0np0): ACTIVE, LinkUp, Ethernet, 100 Gb/sec (4X EDR); {nic}" in out
    assert "netenv: RoCE ports mlx5_4:1 left out: the node has InfiniBand ports" in out
    assert "netenv: warning: mlx5_3:1 is not ACTIVE while 4 other InfiniBand port(s) are: cable, switch?" in out
    assert out[-1] == (
        "netenv: chosen: NCCL_SOCKET_IFNAME==ens6f0np0 GLOO_SOCKET_IFNAME=ens6f0np0 "
        "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_10:1"
    )
    # why no GID index on the Broadcom node, and the AMD node's NICs by name
    bnxt = netenv("bnxt-roce", "--report").stdout.splitlines()
    assert (
        "netenv: NCCL_IB_GID_INDEX left to NCCL: not one RoCE v2 IPv4 GID at the same index on every port: "
        "bnxt_re0:1 index 3, bnxt_re1:1 index 5"
    ) in bnxt
    ionic = netenv("ionic-roce", "--report").stdout
    assert "netenv: rdma ionic_2 port 1 (enp41s0np0): DOWN, Polling, Ethernet" in ionic
    assert "AMD (Pensando) Pollara 400, Pensando DSC (ionic, ionic_rdma, provider ionic)" in ionic


def test_values_set_before_are_kept():
    """A value of the user's, the site's (both in the environment) is neither replaced nor printed."""
    res = netenv("mlx5-roce", NCCL_IB_HCA="=mlx5_1:1", NCCL_SOCKET_IFNAME="ens1np0")
    assert choices(res) == {"GLOO_SOCKET_IFNAME": "eno1", "NCCL_IB_GID_INDEX": "3"}
    assert res.stderr == "netenv: kept (set before): NCCL_SOCKET_IFNAME=ens1np0 NCCL_IB_HCA==mlx5_1:1\n"
    rep = netenv("mlx5-roce", "--report", NCCL_IB_HCA="=mlx5_1:1").stdout.splitlines()
    assert rep[-1] == (
        "netenv: chosen: NCCL_SOCKET_IFNAME==eno1 GLOO_SOCKET_IFNAME=eno1 NCCL_IB_GID_INDEX=3; "
        "set before, kept: NCCL_IB_HCA==mlx5_1:1"
    )


def test_an_address_on_no_interface_takes_the_route_to_the_coordinator():
    res = netenv("mlx5-roce", JOB_NODE_ADDRS="10.0.0.1 10.99.0.8")
    assert choices(res)["NCCL_SOCKET_IFNAME"] == "=eno1"
    rep = netenv("mlx5-roce", "--report", JOB_NODE_ADDRS="10.0.0.1 10.99.0.8").stdout.splitlines()
    assert "netenv: this node's address 10.99.0.8 (10.99.0.8) is on no interface of this node" in rep
    assert "netenv: the route to the coordinator 10.0.0.1 leaves by eno1" in rep


def test_loopback_only_when_every_node_is_on_this_machine():
    """The local cluster: every NodeAddr is 127.0.0.1, lo is right. A loopback address among real ones
    (a node name that /etc/hosts maps to 127.0.1.1) is no interface for the others to reach."""
    local = {"JOB_NODE_ADDRS": "127.0.0.1 127.0.0.1", "JOB_COORDINATOR_ADDR": "127.0.0.1"}
    assert choices(netenv("mlx5-roce", **local))["NCCL_SOCKET_IFNAME"] == "=lo"
    mixed = {"JOB_NODE_ADDRS": "127.0.1.1 10.0.0.8", "JOB_COORDINATOR_ADDR": "127.0.1.1", "JOB_NODE_RANK": "0"}
    res = netenv("mlx5-roce", "--report", **mixed)
    assert res.returncode == 1
    assert "netenv: this node's address 127.0.1.1 is a loopback address, while other nodes' are not" in res.stdout
    assert (
        "netenv: FAILED: node n7: its address 127.0.1.1 is a loopback address, which the other nodes cannot reach; "
        "seen: lo 127.0.0.1/8"
    ) in res.stdout
    # on another node than the coordinator's, the route to the coordinator is the way out
    other = {"JOB_NODE_ADDRS": "10.0.0.1 127.0.1.1", "JOB_COORDINATOR_ADDR": "10.0.0.1"}
    assert choices(netenv("mlx5-roce", **other))["NCCL_SOCKET_IFNAME"] == "=eno1"


def test_help_and_bad_options():
    res = run([str(NETENV), "--help"])
    assert res.returncode == 0 and res.stdout.startswith("Usage: utils/launch/netenv.sh [--print | --report |")
    res = run([str(NETENV), "--nccl"])
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (
        "netenv.sh: unknown option '--nccl' (expected --print, --report, --container-args or --help)\n"
    )
    res = run([str(NETENV), "--print", "--report"])
    assert res.returncode == 2 and res.stderr == "netenv.sh: one option at a time, got: --print --report\n"


# --- the training tier --------------------------------------------------------------------------------------
def test_train_applies_the_choices_after_the_users_layers(scratch_repo: Path):
    """_train.sh: configs/MODEL.env.sh and _env_ overrides win, a value in the environment (user, site) is
    kept; the rest of the choices are set and listed in --print-env and in the log's `env set:` line."""
    (scratch_repo / "configs" / "probe.yml").write_text('base_config: "base.yml"\n')
    (scratch_repo / "configs" / "probe.env.sh").write_text("# probe\nexport NCCL_IB_GID_INDEX=5\n")
    train = str(scratch_repo / "_train.sh")
    env = node_env(
        "mlx5-roce",
        MST_REPO=str(scratch_repo),
        MODEL="probe",
        TRAIN_ENV_OVERRIDES="NCCL_IB_HCA==mlx5_1:1\n",
        GLOO_SOCKET_IFNAME="ens2np0",  # the user's or the site's
        JOB_DIR="/nonexistent/7-JAX-probe",
        MST_PYTHON="true",
    )
    res = subprocess.run([train, "--print-env"], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = dict(line.split("=", 1) for line in res.stdout.splitlines())
    assert got["NCCL_IB_GID_INDEX"] == "5"  # configs/probe.env.sh
    assert got["NCCL_IB_HCA"] == "=mlx5_1:1"  # _env_
    assert got["NCCL_SOCKET_IFNAME"] == "=eno1"  # chosen
    assert "GLOO_SOCKET_IFNAME" not in got  # not this tier's: kept as it was
    # the trainer's log line names what was set on this node (the trainer is `true` here)
    res = subprocess.run([train], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    env_line = next(line for line in res.stderr.splitlines() if "env set:" in line)
    assert " NCCL_IB_GID_INDEX=5 " in env_line and " NCCL_IB_HCA==mlx5_1:1 " in env_line
    assert " NCCL_SOCKET_IFNAME==eno1" in env_line and "GLOO_SOCKET_IFNAME" not in env_line
    assert "netenv: kept (set before): GLOO_SOCKET_IFNAME=ens2np0 NCCL_IB_HCA==mlx5_1:1 NCCL_IB_GID_INDEX=5" in (
        res.stderr
    )


# --- the container tier -------------------------------------------------------------------------------------
def memlock_limit() -> str:
    """What a container started by this test process can get: unlimited where the hard limit is, or where
    the process has CAP_SYS_RESOURCE (bit 24 of CapEff); else the hard limit, in bytes."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    caps = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapEff:"))
    if hard == resource.RLIM_INFINITY or int(caps.split()[1], 16) >> 24 & 1:
        return "unlimited"
    return str(hard)


def expected_mounts() -> list[str]:
    lib = "/usr/lib/x86_64-linux-gnu"
    mounts = [f"{HOST_LIBS}/etc/libibverbs.d:/etc/libibverbs.d:ro"]
    for link, real in [
        ("libibverbs.so.1", "libibverbs.so.1.15.61.0"),
        ("libibverbs.so.1.15.61.0", "libibverbs.so.1.15.61.0"),
        ("libibverbs", "libibverbs"),
        ("libmlx5.so.1", "libmlx5.so.1.25.61.0"),
        ("libmlx5.so.1.25.61.0", "libmlx5.so.1.25.61.0"),
        ("libionic.so.1", "libionic.so.1.0.61.0"),
        ("libionic.so.1.0.61.0", "libionic.so.1.0.61.0"),
        ("libefa.so.1", "libefa.so.1.4.61.0"),
        ("libefa.so.1.4.61.0", "libefa.so.1.4.61.0"),
    ]:
        mounts.append(f"{HOST_LIBS}{lib}/{real}:{lib}/{link}:ro")
    return mounts


def test_container_args_give_the_rdma_devices_and_the_hosts_verbs_libraries():
    if platform.machine() != "x86_64":
        pytest.skip("the host-libs fixture has the x86_64 Debian layout")
    res = netenv("mlx5-ib", "--container-args", MST_HOST_ROOT=str(HOST_LIBS))
    assert res.returncode == 0, res.stderr
    limit = memlock_limit()
    memlock = "memlock=-1" if limit == "unlimited" else f"memlock={limit}:{limit}"
    want = ["--device", f"{FIX}/mlx5-ib/dev/infiniband:/dev/infiniband", "--ulimit", memlock]
    for m in expected_mounts():
        want += ["-v", m]
    assert res.stdout.splitlines() == want
    # a site's CONTAINER_MOUNTS entry for the same place wins (no mount twice)
    site = netenv(
        "mlx5-ib", "--container-args", MST_HOST_ROOT=str(HOST_LIBS), CONTAINER_MOUNTS="/opt/v:/etc/libibverbs.d"
    )
    assert f"{HOST_LIBS}/etc/libibverbs.d:/etc/libibverbs.d:ro" not in site.stdout.splitlines()
    # no /dev/infiniband: nothing at all
    none = netenv("no-netdev", "--container-args", MST_HOST_ROOT=str(HOST_LIBS))
    assert none.returncode == 0 and none.stdout == ""


@pytest.fixture()
def rdma_container(tmp_path: Path):
    """The real podman (private storage) with a tiny image holding ls, cat and sh with their libraries, a dev
    root whose infiniband/ holds real character devices (1:3 and 1:5, the numbers of /dev/null and
    /dev/zero: any will do), and the host-libs fixture as the host."""
    if not shutil.which("podman"):
        pytest.skip("podman is not installed")
    if platform.machine() != "x86_64":
        pytest.skip("the host-libs fixture has the x86_64 Debian layout")
    dev = tmp_path / "dev" / "infiniband"
    dev.mkdir(parents=True)
    try:
        os.mknod(dev / "uverbs0", 0o666 | 0o020000, os.makedev(1, 3))
        os.mknod(dev / "rdma_cm", 0o666 | 0o020000, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making device nodes needs root")
    with private_podman(tmp_path) as env:
        # sh: _container.sh runs COMMAND under a small sh (process 1)
        tiny_image(env, tmp_path / "rootfs", ["ls", "cat", "sh"], "localhost/mst-netenv:1")
        yield {**env, "MST_DEV_ROOT": str(tmp_path / "dev"), "MST_HOST_ROOT": str(HOST_LIBS)}


def test_container_gets_the_rdma_devices_libraries_and_memlock(rdma_container):
    """_container.sh with the real podman: inside, /dev/infiniband has the devices, the host's verbs
    libraries are there read-only at their own paths, and locked memory is unlimited."""
    env = {
        **node_env("mlx5-ib", nodes=1),
        **rdma_container,
        "CONTAINER_RUNTIME": "podman",
        "CONTAINER_IMAGE": "localhost/mst-netenv:1",
        # this machine's hard limits (podman's own defaults are above them once any --ulimit is given)
        "CONTAINER_ARGS": "--ulimit nofile=1024:1024 --ulimit nproc=1024:1024",
    }
    lib = "/usr/lib/x86_64-linux-gnu"
    cmd = [str(REPO / "_container.sh"), "ls", "/dev/infiniband", f"{lib}/libibverbs", "/etc/libibverbs.d"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    listed = res.stdout.split()
    assert {"uverbs0", "rdma_cm", "libmlx5-rdmav59.so", "libbnxt_re-rdmav59.so", "mlx5.driver", "ionic.driver"} <= set(
        listed
    ), listed
    res = subprocess.run(
        [str(REPO / "_container.sh"), "cat", f"{lib}/libibverbs/libmlx5-rdmav59.so", "/proc/self/limits"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    # the provider link resolves to the mounted libmlx5; locked memory is unlimited where this user may
    # have it so, else the hard limit (asking more would fail the container), with a warning
    assert res.stdout.startswith("stand-in for a shared library of rdma-core 61.0")
    memlock = next(line for line in res.stdout.splitlines() if line.startswith("Max locked memory"))
    assert memlock.split()[3:5] == [memlock_limit()] * 2, memlock
    if memlock_limit() != "unlimited":
        assert "netenv: warning: locked memory is limited to " in res.stderr


# --- preflight ----------------------------------------------------------------------------------------------
def preflight(job_dir: Path, fixture: str, nodes: int) -> subprocess.CompletedProcess:
    env = {**node_env(fixture, nodes), "JOB_ID": "4242", "JOB_DIR": str(job_dir)}
    return subprocess.run([str(PREFLIGHT)], env=env, capture_output=True, text=True, timeout=120)


def test_preflight_fails_a_multi_node_job_on_a_node_without_a_usable_interface(tmp_path):
    res = preflight(tmp_path, "no-netdev", nodes=2)
    assert res.returncode == 1
    problem = (
        "network: node n7: its address 10.0.0.12 is on eno1, which is down; seen: lo 127.0.0.1/8 (the loopback), "
        "eno1 10.0.0.12/16 (down), docker0 172.17.0.1/16 (a container or VM bridge)"
    )
    assert res.stderr.splitlines() == [f"preflight: FAILED: {problem}"]
    assert (tmp_path / ".preflight" / "n7").read_text() == f"FAILED: {problem}\n"


def test_preflight_passes_the_same_node_on_a_single_node_job(tmp_path):
    res = preflight(tmp_path, "no-netdev", nodes=1)
    assert res.returncode == 0, res.stderr
    assert "netenv: node n7: its address 10.0.0.12 is on eno1, which is down (one node: not needed)" in res.stdout
    assert res.stdout.splitlines()[-1] == "preflight: ok"


def test_preflight_reports_the_rdma_ports(tmp_path):
    res = preflight(tmp_path, "no-active", nodes=2)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any(line.startswith("netenv: rdma mlx5_0 port 1: INIT, LinkUp, InfiniBand, 400 Gb/sec") for line in lines)
    assert any(line.startswith("netenv: rdma mlx5_1 port 1: DOWN, Polling, InfiniBand") for line in lines)
    assert "netenv: chosen: NCCL_SOCKET_IFNAME==eno1 GLOO_SOCKET_IFNAME=eno1" in lines
