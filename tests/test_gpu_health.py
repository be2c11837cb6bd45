"""The GPU health check of preflight (utils/launch/gpu_health.sh), preflight's host settings and its
removal of finished jobs' containers, the per-node report and the --exclude line of a failed preflight.

This machine has no GPU: the real gpu_health.sh reads fixture trees through its test hooks
(MST_SYSFS_ROOT, MST_PROCFS_ROOT, MST_DEV_ROOT; tests/fixtures/gpu/README.md says where each file's name and
format come from: the amdgpu/amdkfd kernel sources, NVIDIA's documented nvidia-smi CSV), and NVIDIA's
nvidia-smi is a fake that prints the fixture's recorded answers. Containers are real podman ones (in a
private storage), host settings are files of a fixture root (never the real /proc/sys), and the cluster
test is a real 2-node Slurm job whose nodes each see their own fixture tree ("%h" in the hooks).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

from helpers.jobs import log_has, submit, summary, triage, wait_job_end
from helpers.venvs import labelled_venv

GPU_HEALTH = REPO / "utils" / "launch" / "gpu_health.sh"
PREFLIGHT = REPO / "utils" / "launch" / "preflight.sh"
FIX = REPO / "tests" / "fixtures" / "gpu"
FAKE_SMI_DIR = REPO / "tests" / "fixtures" / "nvidia_h100" / "bin"


def hooks(fixture: Path) -> dict[str, str]:
    """The test hooks that point the node-side checks at a fixture node."""
    return {
        "MST_SYSFS_ROOT": str(fixture / "sys"),
        "MST_PROCFS_ROOT": str(fixture / "proc"),
        "MST_DEV_ROOT": str(fixture / "dev"),
        "FAKE_NVIDIA_SMI_DIR": str(fixture),
        "PATH": f"{FAKE_SMI_DIR}:{os.environ['PATH']}",
        "JOB_HOSTNAME": "n7",
    }


def native_on_gpus(tmp_path: Path, accelerator: str) -> dict[str, str]:
    """A job on fixture GPU nodes passes the image stage natively, as a user who asks for it does
    (CONTAINER_RUNTIME=none with an environment for the GPUs: tests/helpers/venvs.py)."""
    return {"CONTAINER_RUNTIME": "none", "MAXTEXT_SLURM_VENV": str(labelled_venv(tmp_path / "venv", accelerator))}


VISIBILITY = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def unused_uid() -> int:
    """A uid that no account of this machine has: gpu_health.sh names the owner of another user's
    process by its user name where it has one, so the expected `uid N` must not depend on the machine."""

    def has_account(uid: int) -> bool:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return False
        return True

    return next(uid for uid in range(1001, 1 << 31) if not has_account(uid))


FOREIGN_UID = unused_uid()


def foreign_fixture(tmp_path: Path, name: str) -> Path:
    """The fixture node NAME (one of the *-foreign-proc ones, whose other user is uid 1001 in the
    files) with that process owned by FOREIGN_UID instead."""
    fx = tmp_path / name
    shutil.copytree(FIX / name, fx, symlinks=True)
    for status in fx.glob("proc/*/status"):
        text = status.read_text()
        status.write_text(re.sub(r"^Uid:.*$", "Uid:" + f"\t{FOREIGN_UID}" * 4, text, flags=re.M))
    return fx


def gpu_health(fixture: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("JOB_GPUS_PER_NODE", "JOB_ID", *VISIBILITY)}
    return subprocess.run(
        [str(GPU_HEALTH)], env={**clean, **hooks(fixture), **env}, capture_output=True, text=True, timeout=60
    )


def lines(res: subprocess.CompletedProcess) -> list[str]:
    return res.stdout.splitlines()


# --- each fixture: exit status, the line of each GPU, the verdict -------------------------------------
CASES = {
    # fixture: (exit status, {gpu index: expected line after "gpu_health: gpu N (...): "}, verdict)
    "amd-healthy": (
        0,
        {0: "ok: 0 uncorrectable errors, 0.2 of 191.9 GiB in use, no process"},
        "ok: 2 amd GPU(s), healthy",
    ),
    "amd-ue": (
        1,
        {0: "ok: ", 1: "FAILED: 3 uncorrectable ECC/RAS errors (gfx 1, umc 2)"},
        "FAILED: 2 amd GPU(s), 1 unhealthy (gpu 1)",
    ),
    "amd-foreign-proc": (
        1,
        {0: "FAILED: pid 4242 of uid {uid} holds 12.0 GiB", 1: "ok: "},
        "FAILED: 2 amd GPU(s), 1 unhealthy (gpu 0)",
    ),
    "amd-mem-held": (
        1,
        {1: "FAILED: 150.0 GiB in use with no process on the GPU (not released by an earlier job?)"},
        "FAILED: 2 amd GPU(s), 1 unhealthy (gpu 1)",
    ),
    "nvidia-healthy": (
        0,
        {3: "ok: 0 uncorrectable errors, 0.0 of 79.6 GiB in use, no process"},
        "ok: 4 nvidia GPU(s), healthy",
    ),
    "nvidia-ue": (
        1,
        {2: "FAILED: 3 uncorrectable ECC/RAS errors; rows pending remapping (reset the GPU)", 0: "ok: "},
        "FAILED: 4 nvidia GPU(s), 1 unhealthy (gpu 2)",
    ),
    "nvidia-foreign-proc": (
        1,
        {1: "FAILED: pid 51234 of uid {uid} holds 20.0 GiB"},
        "FAILED: 4 nvidia GPU(s), 1 unhealthy (gpu 1)",
    ),
    "nvidia-mem-held": (
        1,
        {3: "FAILED: 68.4 GiB in use with no process on the GPU (not released by an earlier job?)"},
        "FAILED: 4 nvidia GPU(s), 1 unhealthy (gpu 3)",
    ),
    "nvidia-no-ecc": (
        0,
        {0: "ok: ECC/RAS error counts not reported, 0.0 of 44.9 GiB in use, no process"},
        "ok: 4 nvidia GPU(s), healthy",
    ),
}


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_fixture_node(fixture, tmp_path):
    rc, gpus, verdict = CASES[fixture]
    res = gpu_health(foreign_fixture(tmp_path, fixture) if fixture.endswith("-foreign-proc") else FIX / fixture)
    out = lines(res)
    assert res.returncode == rc, res.stdout + res.stderr
    assert res.stderr == ""
    per_gpu = [ln for ln in out if re.match(r"gpu_health: gpu \d+ \((amd|nvidia) [0-9A-Fa-f:.]+\): ", ln)]
    assert len(per_gpu) == (2 if fixture.startswith("amd") else 4), out  # one line per GPU, the VGA card is none
    for idx, want in gpus.items():
        got = per_gpu[idx].split("): ", 1)[1]
        assert got.startswith(want.format(uid=FOREIGN_UID)), (idx, got)
    assert out[-1] == f"gpu_health: verdict n7: {verdict}"
    assert sum("verdict" in ln for ln in out) == 1


def test_amd_pci_addresses_come_from_the_cards():
    out = lines(gpu_health(FIX / "amd-healthy"))
    assert out[0].startswith("gpu_health: gpu 0 (amd 0000:05:00.0): ")
    assert out[1].startswith("gpu_health: gpu 1 (amd 0000:26:00.0): ")


@pytest.mark.parametrize(("fixture", "count"), [("amd-healthy", 2), ("nvidia-healthy", 4)])
def test_fewer_gpus_than_requested(fixture, count):
    res = gpu_health(FIX / fixture, JOB_GPUS_PER_NODE=str(count + 2))
    assert res.returncode == 1
    assert f"gpu_health: n7: FAILED: {count} GPU(s) visible, JOB_GPUS_PER_NODE={count + 2} expected" in lines(res)
    assert lines(res)[-1].startswith("gpu_health: verdict n7: FAILED: ")
    assert gpu_health(FIX / fixture, JOB_GPUS_PER_NODE=str(count)).returncode == 0


def test_only_the_gpus_the_scheduler_gave_are_checked():
    """On a node shared with other jobs, another user's process on another job's GPU is no problem."""
    uuid3 = "GPU-c83f1a57-4e92-4d06-a7b1-e2590d6c8f31"
    res = gpu_health(FIX / "nvidia-foreign-proc", CUDA_VISIBLE_DEVICES=f"0,{uuid3}", JOB_GPUS_PER_NODE="2")
    assert res.returncode == 0, res.stdout
    out = lines(res)
    assert (
        out[1]
        == f"gpu_health: gpu 1 (nvidia 00000000:2A:00.0): not checked: another job's (CUDA_VISIBLE_DEVICES=0,{uuid3})"
    )
    assert out[3].startswith("gpu_health: gpu 3 (nvidia 00000000:5D:00.0): ok: ")
    assert out[-1] == "gpu_health: verdict n7: ok: 2 nvidia GPU(s), healthy"
    assert gpu_health(FIX / "nvidia-foreign-proc", CUDA_VISIBLE_DEVICES="1").returncode == 1
    res = gpu_health(FIX / "amd-ue", ROCR_VISIBLE_DEVICES="0", JOB_GPUS_PER_NODE="2")
    assert res.returncode == 1  # the healthy GPU it was given is one, not the two the job expects
    assert "gpu_health: n7: FAILED: 1 GPU(s) visible, JOB_GPUS_PER_NODE=2 expected" in lines(res)
    assert not any("uncorrectable ECC" in ln for ln in lines(res))


def test_node_without_gpus(tmp_path):
    res = gpu_health(tmp_path)
    assert res.returncode == 0 and lines(res) == [
        f"gpu_health: verdict n7: ok: no GPU (no {tmp_path}/dev/kfd or {tmp_path}/dev/nvidiactl)"
    ]
    res = gpu_health(tmp_path, JOB_GPUS_PER_NODE="8")
    assert res.returncode == 1
    assert "gpu_health: n7: FAILED: 0 GPU(s) visible, JOB_GPUS_PER_NODE=8 expected" in lines(res)


def own_process_fixture(tmp_path: Path, job_id: str) -> Path:
    """nvidia-foreign-proc, but its process is this user's, of job JOB_ID."""
    fx = tmp_path / "node"
    shutil.copytree(FIX / "nvidia-foreign-proc", fx, symlinks=True)
    status = fx / "proc" / "51234" / "status"
    uid = os.getuid()
    status.write_text(re.sub(r"^Uid:.*$", f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}", status.read_text(), flags=re.M))
    (fx / "proc" / "51234" / "environ").write_bytes(b"PATH=/usr/bin\0JOB_ID=" + job_id.encode() + b"\0")
    return fx


def test_this_jobs_process_is_no_problem(tmp_path):
    res = gpu_health(own_process_fixture(tmp_path, "77"), JOB_ID="77")
    assert res.returncode == 0, res.stdout
    assert lines(res)[1] == (
        "gpu_health: gpu 1 (nvidia 00000000:2A:00.0): ok: 0 uncorrectable errors, 20.0 of 79.6 GiB in use, "
        "pid 51234 of this job"
    )


def test_memory_held_by_another_process_of_yours(tmp_path):
    res = gpu_health(own_process_fixture(tmp_path, "76"), JOB_ID="77")
    assert res.returncode == 1
    assert lines(res)[1] == (
        "gpu_health: gpu 1 (nvidia 00000000:2A:00.0): FAILED: 20.0 GiB in use by no process of this job: "
        "pid 51234 of yours (job 76), 20.0 GiB"
    )


def test_nvidia_smi_failing_fails_the_node():
    res = gpu_health(FIX / "nvidia-healthy", FAKE_NVIDIA_SMI_FAIL="1", JOB_GPUS_PER_NODE="4")
    assert res.returncode == 1
    out = lines(res)
    assert out[0].startswith("gpu_health: n7: FAILED: nvidia-smi failed: Unable to determine the device handle")
    assert out[-1].startswith("gpu_health: verdict n7: FAILED: 0 nvidia GPU(s), nvidia-smi failed")
    assert not any("JOB_GPUS_PER_NODE" in ln for ln in out)  # one cause, not two


def test_driver_without_remapping_fields(tmp_path):
    """An old driver knows no retired_pages/remapped_rows fields: a note, not a failure."""
    fx = tmp_path / "node"
    shutil.copytree(FIX / "nvidia-healthy", fx, symlinks=True)
    csv = fx / "nvidia-smi-query.csv"
    rows = [ln.split(", ")[:8] for ln in csv.read_text().splitlines()]
    csv.write_text("".join(", ".join(r) + "\n" for r in rows))
    res = gpu_health(fx)
    assert res.returncode == 0
    assert any(
        ln.startswith("gpu_health: n7: note: nvidia-smi knows no retired_pages/remapped_rows") for ln in lines(res)
    )


def test_per_node_fixture_roots(tmp_path):
    """ "%h" in the hooks is the node's name: the nodes of a local cluster each see their own tree."""
    for host, fixture in (("n1", "amd-healthy"), ("n2", "amd-ue")):
        shutil.copytree(FIX / fixture, tmp_path / host, symlinks=True)
    env = {
        "MST_SYSFS_ROOT": f"{tmp_path}/%h/sys",
        "MST_PROCFS_ROOT": f"{tmp_path}/%h/proc",
        "MST_DEV_ROOT": f"{tmp_path}/%h/dev",
    }
    assert gpu_health(FIX / "none", **env, JOB_HOSTNAME="n1").returncode == 0
    assert gpu_health(FIX / "none", **env, JOB_HOSTNAME="n2").returncode == 1


def test_help():
    res = run([str(GPU_HEALTH), "--help"])
    assert res.returncode == 0 and res.stdout.startswith("Usage: utils/launch/gpu_health.sh")


# --- preflight ------------------------------------------------------------------------------------------
def preflight(job_dir: Path, fixture: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JOB_", "PREFLIGHT_")) and k not in VISIBILITY}
    full = {**clean, **hooks(fixture), "JOB_ID": "4242", "JOB_DIR": str(job_dir), **env}
    return subprocess.run([str(PREFLIGHT)], env=full, capture_output=True, text=True, timeout=120)


def test_preflight_fails_on_a_bad_gpu_and_writes_the_node_report(tmp_path):
    res = preflight(tmp_path, FIX / "amd-ue")
    assert res.returncode == 1
    assert "gpu_health: gpu 1 (amd 0000:26:00.0): FAILED: 3 uncorrectable ECC/RAS errors (gfx 1, umc 2)" in res.stdout
    assert res.stderr.splitlines() == [
        "preflight: FAILED: gpu 1 (amd 0000:26:00.0): 3 uncorrectable ECC/RAS errors (gfx 1, umc 2)"
    ]
    assert (
        tmp_path / ".preflight" / "n7"
    ).read_text() == "FAILED: gpu 1 (amd 0000:26:00.0): 3 uncorrectable ECC/RAS errors (gfx 1, umc 2)\n"


def test_preflight_host_level_gpu_problem(tmp_path):
    res = preflight(tmp_path, FIX / "nvidia-healthy", JOB_GPUS_PER_NODE="8")
    assert res.returncode == 1
    assert "preflight: FAILED: GPUs: 4 GPU(s) visible, JOB_GPUS_PER_NODE=8 expected" in res.stderr


def test_preflight_ok_on_healthy_gpus(tmp_path):
    res = preflight(tmp_path, FIX / "nvidia-healthy", JOB_GPUS_PER_NODE="4")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "preflight: ok"
    assert "gpu_health: verdict n7: ok: 4 nvidia GPU(s), healthy" in res.stdout
    assert (tmp_path / ".preflight" / "n7").read_text() == "ok\n"


# --- host settings ----------------------------------------------------------------------------------------
def settings_root(tmp_path: Path) -> Path:
    """A node's /proc/sys and /sys/kernel/mm files as the kernel shows them (a fixture root)."""
    root = tmp_path / "node"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/numa_balancing").write_text("1\n")
    (root / "proc/sys/vm").mkdir(parents=True)
    (root / "proc/sys/vm/swappiness").write_text("60\n")
    thp = root / "sys/kernel/mm/transparent_hugepage"
    thp.mkdir(parents=True)
    (thp / "enabled").write_text("always [madvise] never\n")
    (root / "dev").mkdir()
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def test_host_settings_are_set_where_root_can(tmp_path):
    root = settings_root(tmp_path)
    if os.geteuid() != 0:
        pytest.skip("needs root (the files of the fixture root are root's)")
    res = preflight(tmp_path, root, PREFLIGHT_HOST_SETTINGS="numa_balancing=0 thp=never swappiness=60")
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert "preflight: host setting numa_balancing=0 (/proc/sys/kernel/numa_balancing): changed from 1" in out
    assert (
        "preflight: host setting thp=never (/sys/kernel/mm/transparent_hugepage/enabled): changed from madvise" in out
    )
    assert "preflight: host setting swappiness=60 (/proc/sys/vm/swappiness): already so" in out
    assert (root / "proc/sys/kernel/numa_balancing").read_text() == "0\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the check as the user nobody")
def test_host_settings_a_user_cannot_change_are_a_warning():
    base = Path(tempfile.mkdtemp(prefix="mst-settings-"))  # pytest's tmp_path is closed to other users
    base.chmod(0o755)
    try:
        host_settings_as_nobody(base)
    finally:
        shutil.rmtree(base)


def host_settings_as_nobody(base: Path) -> None:
    root = settings_root(base)
    job_dir = base / "job"
    job_dir.mkdir()
    job_dir.chmod(0o777)  # nobody writes the node report there
    env = {
        "PATH": os.environ["PATH"],
        "JOB_ID": "4242",
        "JOB_DIR": str(job_dir),
        "JOB_HOSTNAME": "n7",
        "TMPDIR": "/tmp",
        "PREFLIGHT_HOST_SETTINGS": "thp=never numa_balancing=1",
        "MST_SYSFS_ROOT": str(root / "sys"),
        "MST_PROCFS_ROOT": str(root / "proc"),
        "MST_DEV_ROOT": str(root / "dev"),
    }
    res = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", str(PREFLIGHT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr  # a warning, not a failure
    out = res.stdout.splitlines()
    assert any(
        ln.startswith(
            "preflight: warning: host setting thp: /sys/kernel/mm/transparent_hugepage/enabled is madvise, "
            "the site asks for never, and uid 65534 cannot change it"
        )
        for ln in out
    ), out
    assert "preflight: host setting numa_balancing=1 (/proc/sys/kernel/numa_balancing): already so" in out
    assert (root / "sys/kernel/mm/transparent_hugepage/enabled").read_text() == "always [madvise] never\n"


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("numa=0", "PREFLIGHT_HOST_SETTINGS: unknown setting 'numa=0'; known: numa_balancing thp thp_defrag"),
        ("thp", "PREFLIGHT_HOST_SETTINGS: unknown setting 'thp'; known: "),
        ("thp=sometimes", "PREFLIGHT_HOST_SETTINGS: 'thp=sometimes' is not allowed; thp takes always, madvise, never"),
        ("swappiness=201", "PREFLIGHT_HOST_SETTINGS: 'swappiness=201' is not allowed; swappiness takes 0-200"),
    ],
)
def test_unknown_host_settings_are_refused_at_launch(spec, error, tmp_path):
    """submit.sh --dry-run checks every setting first: one line, exit 1, nothing done."""
    res = run(
        [str(REPO / "submit.sh"), "tiny", "--dry-run"],
        env={**launcher_env(tmp_path / "ws"), "PREFLIGHT_HOST_SETTINGS": spec},
    )
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines() == [res.stderr.splitlines()[0]] and res.stderr.startswith(f"submit.sh: {error}")
    assert not (tmp_path / "ws").exists()


# --- leftover containers ---------------------------------------------------------------------------------
@pytest.fixture()
def podman_env(tmp_path: Path) -> dict[str, str]:
    """podman with a private storage under tmp_path (the machine's own containers stay out of sight),
    and a tiny image made from a tar of a few files (a container needs only to exist)."""
    if not shutil.which("podman"):
        pytest.skip("podman is not installed")
    conf = tmp_path / "podman"
    conf.mkdir()
    (conf / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{conf}/root"\nrunroot = "{conf}/run"\n'
    )
    (conf / "containers.conf").write_text(
        '[engine]\nruntime = "runc"\n[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
    )
    env = {"CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"), "CONTAINERS_CONF": str(conf / "containers.conf")}
    rootfs = conf / "rootfs"
    rootfs.mkdir()
    shutil.copy("/bin/true", rootfs / "true")
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(conf / "x.tar"), "."], check=True)
    res = run(["podman", "import", str(conf / "x.tar"), "localhost/mst-leftover:1"], env=env)
    assert res.returncode == 0, res.stderr
    yield env
    run(["podman", "rm", "-a", "-f"], env=env)
    run(["podman", "rmi", "-a", "-f"], env=env)


def create_container(env: dict[str, str], name: str, job: str, workspace: Path, scheduler: str = "slurm") -> None:
    labels = [f"mst.job={job}", f"mst.workspace={workspace}", f"mst.scheduler={scheduler}"]
    args = [x for lab in labels for x in ("--label", lab)]
    res = run(["podman", "create", "--name", name, *args, "localhost/mst-leftover:1", "/true"], env=env)
    assert res.returncode == 0, res.stderr


def container_names(env: dict[str, str]) -> set[str]:
    return set(run(["podman", "ps", "-a", "--format", "{{.Names}}"], env=env).stdout.split())


def test_preflight_removes_finished_jobs_containers(tmp_path, podman_env):
    ws = tmp_path / "ws"
    for job in ("5", "6", "99", "7"):
        (ws / f"{job}-JAX-tiny").mkdir(parents=True)
    create_container(podman_env, "finished5", "5", ws)
    create_container(podman_env, "active6", "6", ws)  # listed in JOB_ACTIVE_IDS
    create_container(podman_env, "newer99", "99", ws)  # a newer id: may have started after the list was made
    create_container(podman_env, "otherws7", "7", tmp_path / "other_ws")
    create_container(podman_env, "local7", "7", ws, scheduler="local")
    create_container(podman_env, "nodir8", "8", ws)  # no job directory of this user in the workspace
    res = preflight(
        tmp_path,
        tmp_path / "nogpu",
        JOB_SCHEDULER="slurm",
        JOB_ACTIVE_IDS="6 10",
        JOB_WORKSPACE=str(ws),
        JOB_ID="10",
        **podman_env,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (
        "preflight: removed leftover podman container finished5 (created) of finished job 5" in res.stdout.splitlines()
    )
    assert container_names(podman_env) == {"active6", "newer99", "otherws7", "local7", "nodir8"}


def test_preflight_removes_no_container_without_the_active_list(tmp_path, podman_env):
    ws = tmp_path / "ws"
    (ws / "5-JAX-tiny").mkdir(parents=True)
    create_container(podman_env, "finished5", "5", ws)
    res = preflight(
        tmp_path, tmp_path / "nogpu", JOB_SCHEDULER="slurm", JOB_WORKSPACE=str(ws), JOB_ID="10", **podman_env
    )
    assert res.returncode == 0
    assert container_names(podman_env) == {"finished5"}


# --- the report of a failed preflight ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "hosts", "want"),
    [
        ("submit.sh tiny -N 2 -- steps=5", ["n2"], "submit.sh tiny -N 2 --exclude=n2 -- steps=5"),
        ("submit.sh tiny -N 4 -p gpu", ["n2", "n3"], "submit.sh tiny -N 4 -p gpu --exclude=n2,n3"),
        ("submit.sh tiny -x n9,n8 -N 4 -- a=1", ["n2", "n8"], "submit.sh tiny -N 4 --exclude=n9,n8,n2 -- a=1"),
        ("submit.sh tiny --exclude=n9 -- x", ["n1"], "submit.sh tiny --exclude=n9,n1 -- x"),
    ],
)
def test_resubmit_command(command, hosts, want):
    res = run(["bash", "-c", f'source {REPO}/utils/launch/lib.sh; resubmit_excluding "$@"', "bash", command, *hosts])
    assert res.stdout.strip() == want


def test_summary_names_the_command_without_the_bad_nodes(tmp_path):
    snap = tmp_path / "snap"
    (snap / ".submit").mkdir(parents=True)
    (snap / ".submit" / "command.txt").write_text("submit.sh tiny -N 3 -- steps=5\n")
    job_dir = tmp_path / "job"
    (job_dir / ".stages" / "preflight").mkdir(parents=True)
    for host, rc in (("n1", 0), ("n2", 1)):
        (job_dir / ".stages" / "preflight" / host).write_text(f"rc={rc} end=1.0 reason=exit\n")
    env = {"JOB_DIR": str(job_dir), "JOB_NODELIST": "n1 n2 n3", "JOB_SCHEDULER": "slurm", "MST_REPO": str(snap)}
    res = run([str(REPO / "utils/launch/job_summary.sh"), "failed", "preflight"], env=env)
    got = dict(ln.split(": ", 1) for ln in res.stdout.splitlines() if ": " in ln)
    assert got["failed_nodes"] == "n2 (exit 1)" and got["no_exit_record"] == "n3"
    assert got["resubmit"] == "submit.sh tiny -N 3 --exclude=n2,n3 -- steps=5"
    # a failed training is no node check: no resubmit line
    (job_dir / ".stages" / "train").mkdir()
    (job_dir / ".stages" / "train" / "n1").write_text("rc=1 end=1.0 reason=exit\n")
    res = run([str(REPO / "utils/launch/job_summary.sh"), "failed", "train"], env={**env, "JOB_NODELIST": "n1"})
    assert "resubmit:" not in res.stdout


# --- real jobs ------------------------------------------------------------------------------------------
def test_local_job_with_a_foreign_process_on_a_gpu(workspace, venv, tmp_path):
    """run_local.sh on a node where another user holds a GPU: the job stops in preflight, and triage
    reads its real log as gpu_health with this node as the culprit."""
    node = foreign_fixture(tmp_path, "nvidia-foreign-proc")
    env = {**launcher_env(workspace), **hooks(node), **native_on_gpus(tmp_path, "cuda")}
    env.pop("JOB_HOSTNAME")
    res = run([str(REPO / "run_local.sh"), "tiny", "--", "steps=1"], env=env)
    assert res.returncode == 1, res.stdout[-3000:]
    log = next(workspace.glob("local-*-JAX-tiny.log"))
    host = summary(log)["first_failure"]
    assert summary(log)["stage"] == "preflight" and "resubmit" not in summary(log)  # no --exclude without Slurm
    assert log_has(
        log, rf"^{host}: gpu_health: gpu 1 \(nvidia 00000000:2A:00\.0\): FAILED: pid 51234 of uid {FOREIGN_UID} holds"
    )
    assert not log_has(log, "completed step")
    r = triage(log)
    assert r["failure_class"] == "gpu_health" and r["culprit_hosts"] == [host], r
    assert r["confidence"] == "high" and f"pid 51234 of uid {FOREIGN_UID} holds 20.0 GiB" in r["summary"]
    assert r["evidence"][0]["text"].startswith(f"{host}: gpu_health: gpu 1 ")


@pytest.mark.cluster
def test_two_node_job_with_a_bad_gpu_node(cluster, workspace, tmp_path, venv):
    """n1 healthy, n2 with uncorrectable errors: both nodes report, training never starts, the log
    and the JOB SUMMARY name the command that excludes n2, and triage blames n2 for gpu_health."""
    nodes = tmp_path / "nodes"
    shutil.copytree(FIX / "amd-healthy", nodes / "n1", symlinks=True)
    shutil.copytree(FIX / "amd-ue", nodes / "n2", symlinks=True)
    env = {f"MST_{k}_ROOT": f"{nodes}/%h/{d}" for k, d in (("SYSFS", "sys"), ("PROC", "proc"), ("DEV", "dev"))}
    env.update(native_on_gpus(tmp_path, "rocm"))
    # the local cluster has no GPU GRES: a whole-node cluster's setting, nothing asked, 2 checked
    env["SITE_GPU_REQUEST"] = "0"
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=5", JOB_GPUS_PER_NODE="2", **env)
    assert wait_job_end(cluster, job_id, 180) == "FAILED", log.read_text()[-3000:]
    assert log_has(log, r"^n1: gpu_health: verdict n1: ok: 2 amd GPU\(s\), healthy$")
    assert log_has(
        log, r"^n2: gpu_health: gpu 1 \(amd 0000:26:00\.0\): FAILED: 3 uncorrectable ECC/RAS errors \(gfx 1, umc 2\)$"
    )
    assert log_has(log, r"^n2: preflight: FAILED: gpu 1 \(amd 0000:26:00\.0\): 3 uncorrectable")
    assert log_has(log, r"^_job\.sbatch:   n1: ok$")
    assert log_has(log, r"^_job\.sbatch:   n2: FAILED: gpu 1 \(amd 0000:26:00\.0\): 3 uncorrectable ECC/RAS errors")
    want = "submit.sh tiny -N 2 --exclude=n2 -- steps=5"
    assert not log_has(log, "completed step")
    s = summary(log)
    assert s["status"] == "failed" and s["stage"] == "preflight" and s["failed_nodes"] == "n2 (exit 1)", s
    assert s["resubmit"] == want
    job_dir = workspace / f"{job_id}-JAX-tiny"
    assert not (job_dir / ".stages" / "train").exists()
    # the healthy node ran its checks to the end (no --kill-on-bad-exit for node checks)
    assert (job_dir / ".stages" / "preflight" / "n1").read_text().startswith("rc=0 ")
    r = triage(log, cluster)
    assert r["failure_class"] == "gpu_health" and r["culprit_hosts"] == ["n2"], r["summary"]
    assert "gpu 1 (amd 0000:26:00.0): FAILED: 3 uncorrectable ECC/RAS errors" in r["summary"]
    assert f"resubmit without the bad nodes: {want}" in r["next_steps"]
    assert any(e["why"] == "GPU health check failed on this node" and e["host"] == "n2" for e in r["evidence"])
