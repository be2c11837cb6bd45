"""Shared fixtures: the pinned Python environment, the local Slurm cluster, scratch repos."""

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("MAXTEXT_SLURM_VENV", REPO / ".venv"))


def _python3_without_a_shim() -> None:
    """The utils/ commands start through `#!/usr/bin/env python3` (then re-execute under the
    project's environment). Where python3 on PATH is a version manager's shim, a script (pyenv's
    runs bash and `pyenv exec`: 45-55 ms of CPU per start here against ~10 for the interpreter), a
    private directory that links python3 to the interpreter the shim runs goes first on PATH for
    the tests' commands: the same interpreter, started without the shim. Done once, in the first
    pytest process (xdist's workers inherit the PATH); removed when that process ends."""
    found = shutil.which("python3")
    try:
        with open(found or "", "rb") as f:
            if f.read(2) != b"#!":
                return
        ask = [found or "python3", "-c", "import sys; print(sys.executable)"]
        res = subprocess.run(ask, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return
    target = res.stdout.strip()
    if res.returncode != 0 or not target or Path(target).resolve() == Path(found).resolve():
        return
    link_dir = tempfile.mkdtemp(prefix="mst-python3.")
    atexit.register(shutil.rmtree, link_dir, ignore_errors=True)
    os.symlink(target, os.path.join(link_dir, "python3"))
    os.environ["PATH"] = link_dir + os.pathsep + os.environ.get("PATH", "")


if "PYTEST_XDIST_WORKER" not in os.environ:
    _python3_without_a_shim()


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Run a command, capture text output, never raise on a non-zero exit."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False, **kw)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before -m selects: a test that uses the local cluster carries the `cluster` mark, so that
    -m "not cluster" (and tests/run.sh --fast) never starts a cluster."""
    unmarked = [
        item.nodeid
        for item in items
        if "cluster" in getattr(item, "fixturenames", ()) and item.get_closest_marker("cluster") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"these tests use the cluster fixture without @pytest.mark.cluster: {unmarked}")
    # heavy picks, among the slow tests, those the whole suite keeps at normal priority (tests/run.sh)
    heavy_only = [
        item.nodeid for item in items if item.get_closest_marker("heavy") and not item.get_closest_marker("slow")
    ]
    if heavy_only:
        raise pytest.UsageError(f"these tests are marked heavy without slow (heavy is a kind of slow): {heavy_only}")
    # whole files per worker (--dist loadfile, in this order): the longest files first, so that none
    # of them starts last and runs alone at the end
    longest = LONGEST_CLUSTER_FILES if os.environ.get("MST_CLUSTER_PER_WORKER") == "1" else LONGEST_FILES
    rank = {name: i for i, name in enumerate(longest)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# The fast loop's files (and part A's) in this order, the rest after them: their seconds on one of
# four workers (tests/run.sh --fast on 2 cores); test_skills.py, last in file order, had started at
# 52 s and ended the loop alone at 65 s: 31, 13, 13, 12, 10, 10, 9, 8, 7, 7, 6, 6
LONGEST_FILES = (
    "test_diagnose.py",
    "test_skills.py",
    "test_prometheus_tool.py",
    "test_host_bridge.py",
    "test_mcp_server.py",
    "test_launch_input.py",
    "test_investigate.py",
    "test_mcp_bridge_paths.py",
    "test_cli.py",
    "test_gpu_request.py",
    "test_site.py",
    "test_notify.py",
)
# tests/run.sh's phase B on two workers takes whole files in this order, the rest after them: their
# seconds in one process (pytest -m "cluster or serial" --durations=0 on 2 cores, summed per file):
# 356, 325, 284, 173, 112, 102, 49, 43, 38
LONGEST_CLUSTER_FILES = (
    "test_ray_job.py",
    "test_run_continue.py",
    "test_job_monitor_live.py",
    "test_sweep.py",
    "test_slurm_jobs.py",
    "test_shared_ws_ray.py",
    "test_image_stage.py",
    "test_shared_cluster.py",
    "test_resume.py",
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """MST_NO_SKIPS=1 (.ci/run sets it): a skipped test fails with its reason. On CI's machine
    (root, Debian, every package of utils/setup_system.sh) every test can run, so a skip there
    means a test that did not run would be counted as fine."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("MST_NO_SKIPS") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under MST_NO_SKIPS=1 (CI runs every test): {reason}"


@pytest.fixture(scope="session")
def venv() -> Path:
    res = run([str(REPO / "utils/setup_env.sh")], timeout=1800)
    assert res.returncode == 0, res.stderr
    return VENV


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    """The local multi-node Slurm cluster (2 nodes), started here if it is not up yet.

    Left running when it was already up before the session (another suite may use it);
    stopped at the end otherwise.
    """
    tool = str(REPO / "utils/local_cluster.sh")
    own: dict[str, str] = {}
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if os.environ.get("MST_CLUSTER_PER_WORKER") == "1" and worker.startswith("gw"):
        # tests/run.sh's phase B: each worker its own cluster, its jobs numbered apart
        top = tempfile.mkdtemp(prefix="mstc.", dir="/tmp")  # short: Unix sockets live under it
        os.chmod(top, 0o755)  # munged insists that every parent of its socket is a+x
        own = {"LOCAL_CLUSTER_DIR": f"{top}/c", "LOCAL_CLUSTER_FIRST_JOB_ID": str(1 + 100000 * (int(worker[2:]) + 1))}
    was_up = run([tool, "status"], env=own).returncode == 0
    res = run([tool, "up", "2"], env=own, timeout=120)
    assert res.returncode == 0, f"local cluster did not come up: {res.stdout}{res.stderr}"
    env: dict[str, str] = {}
    for line in run([tool, "env"], env=own).stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            env[key] = value.strip("'\"")
    assert "SLURM_CONF" in env
    if own:
        env["LOCAL_CLUSTER_DIR"] = own["LOCAL_CLUSTER_DIR"]
    yield env
    if not was_up:
        run([tool, "down"], env=own, timeout=120)
    if own:
        shutil.rmtree(Path(own["LOCAL_CLUSTER_DIR"]).parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def _cancel_jobs_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails half-way must not leave its job training on the shared cluster (a
    million-step job would slow every later test): cancel what it submitted."""
    yield
    from helpers import jobs

    ids, jobs.SUBMITTED[:] = list(jobs.SUBMITTED), []
    if ids and "cluster" in request.fixturenames:
        run(["scancel", *ids], env=request.getfixturevalue("cluster"))


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture()
def scratch_repo(tmp_path: Path, venv: Path) -> Path:
    """A throw-away copy of the launcher (code only) whose configs/ a test may change. Not tests/:
    its fixtures are nine in ten of the repository's files (0.25 CPU-s a copy with them, 0.01
    without)."""
    dest = tmp_path / "repo"
    skip = shutil.ignore_patterns(".git", ".venv", "outputs", ".local_cluster", "__pycache__", ".*_cache")

    def ignore(where: str, names: list[str]) -> set[str]:
        return skip(where, names) | ({"tests"} if Path(where) == REPO else set())

    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    return dest


def launcher_env(workspace: Path, **extra: str) -> dict[str, str]:
    """Environment for running the launchers in tests: shared venv, given workspace, and one JAX
    compilation cache for every test's jobs (COMPILE_CACHE_DIR, a site setting; JAX keys each
    program by its HLO, compile options, devices and versions): the suite's trainers run a few
    programs, and a hit saves start-up CPU (a tiny run_local job: 22.9 -> 15.0 CPU-s, 3 pairs).
    COMPILE_CACHE_DIR="" in extra (or MST_TEST_CACHE=off) gives the job its own cache in the workspace."""
    from helpers.cache import cache_dir

    env = {"MAXTEXT_SLURM_VENV": str(VENV), "JOB_WORKSPACE": str(workspace)}
    if (jax := cache_dir("jax")) is not None:
        env["COMPILE_CACHE_DIR"] = str(jax)
    return {**env, **extra}
