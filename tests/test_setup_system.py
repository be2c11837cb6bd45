"""utils/setup_system.sh (the one installer of the system packages) and what each user command says
when a system program it needs is missing: one line naming what to install, exit 1, nothing started
or written. The machines here are root and have every package (tests/run.sh installs them), so a
missing program is made real by a PATH without it or by an empty /usr/sbin in a mount namespace
(tests/helpers/syspath.py); a user without root is the real user nobody."""

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers.syspath import path_without, without_sbin

REPO = Path(__file__).resolve().parents[1]
INSTALLER = REPO / "utils" / "setup_system.sh"
APT_HISTORY = Path("/var/log/apt/history.log")

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a mount namespace, the user nobody)")


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env=env, timeout=timeout, cwd=tempfile.gettempdir()
    )


def assert_one_line(res: subprocess.CompletedProcess, prog: str, *needles: str, rc: int = 1) -> str:
    assert res.returncode == rc, (res.returncode, res.stdout, res.stderr)
    assert res.stdout == "" and len(res.stderr.splitlines()) == 1, res.stdout + res.stderr
    line = res.stderr.strip()
    assert line.startswith(f"{prog}: ") and "Traceback" not in line, line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


# --- the installer ------------------------------------------------------------------------------


def test_check_finds_every_package_of_every_group():
    res = run([INSTALLER, "--check"])
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    res = run([INSTALLER, "--check", "cluster", "observe", "tests", "containers"])
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["frob"], "unknown group 'frob': expected cluster observe tests containers"),
        (["cluster", "--force"], "unknown option '--force'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, needle):
    assert_one_line(run([INSTALLER, *args]), "setup_system.sh", needle, rc=2)


@needs_root
def test_a_user_without_the_packages_is_told_what_to_install():
    res = run(without_sbin([INSTALLER, "cluster"], as_nobody=True), env={"PATH": "/usr/bin:/bin"})
    line = assert_one_line(res, "setup_system.sh", "missing system packages for cluster: munge slurmctld slurmd;")
    assert line.endswith("install them: sudo apt-get install --no-install-recommends munge slurmctld slurmd")


@needs_root
def test_check_as_root_names_what_is_missing_and_installs_nothing():
    before = APT_HISTORY.stat().st_size if APT_HISTORY.exists() else None
    res = run(without_sbin([INSTALLER, "--check"]), env={"PATH": "/usr/bin:/bin"})
    # runc and nft (nftables) live in /usr/sbin too
    line = assert_one_line(
        res, "setup_system.sh", "for cluster observe tests containers: munge nftables runc slurmctld slurmd;"
    )
    assert line.endswith("install them: apt-get install --no-install-recommends munge nftables runc slurmctld slurmd")
    assert (APT_HISTORY.stat().st_size if APT_HISTORY.exists() else None) == before


# --- the user commands ----------------------------------------------------------------------------


@needs_root
def test_local_cluster_up_without_slurm_names_the_packages_and_starts_nothing():
    with tempfile.TemporaryDirectory(prefix="lc-") as tmp:
        os.chmod(tmp, 0o777)  # nobody could create the cluster dir: it must not
        cluster = Path(tmp) / "c"
        env = {"PATH": "/usr/bin:/bin", "LOCAL_CLUSTER_DIR": str(cluster)}
        res = run(without_sbin([REPO / "utils" / "local_cluster.sh", "up", "2"], as_nobody=True), env=env)
        assert_one_line(res, "setup_system.sh", "munge slurmctld slurmd", "apt-get install")
        assert not cluster.exists()


def test_submit_without_sbatch_says_where_slurm_comes_from(tmp_path):
    env = {
        **os.environ,
        "PATH": path_without(tmp_path / "bin", "sbatch"),
        "JOB_WORKSPACE": str(tmp_path / "ws"),
        "MAXTEXT_SLURM_VENV": str(tmp_path / "venv"),
    }
    res = run([REPO / "submit.sh", "tiny", "-N", "2"], env=env)
    assert_one_line(res, "submit.sh", "sbatch not found", "utils/local_cluster.sh up 2 (installs Slurm as root)")
    assert not (tmp_path / "ws").exists() and not (tmp_path / "venv").exists()  # checked before any setup


def test_sweep_without_slurm_says_where_slurm_comes_from(tmp_path):
    env = {**os.environ, "PATH": path_without(tmp_path / "bin", "sbatch", "scontrol"), "JOB_WORKSPACE": str(tmp_path)}
    res = run([REPO / "utils" / "sweep.py", "batch", "tiny", "--values", "1,2"], env=env)
    assert_one_line(res, "sweep.py", "sbatch/scontrol not found", "utils/local_cluster.sh up 2", rc=2)
    assert list(tmp_path.iterdir()) == [tmp_path / "bin"]  # no sweep record


def test_run_local_without_python_3_12_says_what_to_install(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYENV_ROOT", "MAXTEXT_SLURM_PYTHON", "VIRTUAL_ENV")}
    env |= {
        "PATH": path_without(tmp_path / "bin", pattern=r"python3.*"),
        "HOME": str(tmp_path),  # no ~/.pyenv
        "JOB_WORKSPACE": str(tmp_path / "ws"),
        "MAXTEXT_SLURM_VENV": str(tmp_path / "venv"),
    }
    res = run([REPO / "run_local.sh", "tiny", "--", "steps=2"], env=env)
    assert_one_line(res, "setup_env.sh", "no Python >= 3.12 found", "install python3.12", "MAXTEXT_SLURM_PYTHON")
    assert not (tmp_path / "ws").exists() and not (tmp_path / "venv").exists()


@pytest.fixture
def saved_tsdb(tmp_path: Path) -> Path:
    """A job dir whose TSDB has only an (empty) WAL: enough for the tools to reach Prometheus."""
    (tmp_path / "job" / "prometheus" / "wal").mkdir(parents=True)
    return tmp_path / "job"


def test_diagnose_without_prometheus_says_what_to_install(tmp_path, saved_tsdb):
    env = {**os.environ, "PATH": path_without(tmp_path / "bin", "prometheus")}
    env.pop("PROMETHEUS_BIN", None)
    res = run([REPO / "utils" / "diagnose.py", saved_tsdb, "--json"], env=env)
    assert_one_line(res, "diagnose.py", "prometheus not found", "apt-get install prometheus", "PROMETHEUS_BIN")


def test_prometheus_sh_without_curl_says_what_to_install(tmp_path, saved_tsdb):
    env = {**os.environ, "PATH": path_without(tmp_path / "bin", "curl")}
    res = run([REPO / "utils" / "prometheus.sh", "query", saved_tsdb, "up"], env=env)
    assert_one_line(res, "prometheus.sh", "curl not found", "apt-get install curl")
