"""utils/setup_env.sh --adopt PYTHON and --wheelhouse DIR, with no network: pip's index is a closed port
(PIP_INDEX_URL=http://127.0.0.1:9/simple, proxies unset), so anything that would download fails.

The adopted interpreters are the project's own environment (a venv: its site directory reaches the new
environment through a .pth) and "sites" made here from it: a venv of the same base Python whose
site-packages links every distribution of the project's environment but the ones a test leaves out. A
site's GPU plugin is a stand-in (no GPU and no CUDA here): a dist-info directory with the METADATA of JAX's
CUDA 13 plugin (`jax-cuda13-plugin`, the distribution `pip install "jax[cuda13]"` installs, per JAX's
installation guide, https://docs.jax.dev/en/latest/installation.html), which is all setup_env.sh reads of
it. The wheelhouse's wheel is made here from an installed pure-Python distribution: its files as its RECORD
lists them, zipped with a new RECORD (the wheel format, PEP 427 / packaging.python.org's "Binary
distribution format").
"""

import base64
import hashlib
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

from helpers.jobs import log_has, summary

SETUP_ENV = str(REPO / "utils" / "setup_env.sh")
SITE_PACKAGES = VENV / "lib" / "python3.12" / "site-packages"
OFFLINE = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_NO_INDEX": "", "PIP_FIND_LINKS": ""}
DROP_ENV = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "PIP_CONFIG_FILE")


def setup_env(venv: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV and k != "MST_ACCELERATOR"}
    env.update(OFFLINE, MAXTEXT_SLURM_VENV=str(venv), PIP_CONFIG_FILE=os.devnull, **extra)
    return subprocess.run([SETUP_ENV, *args], env=env, capture_output=True, text=True, timeout=300)


def version_in(python: Path | str, dist: str) -> str:
    res = run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"])
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def base_python() -> str:
    return run([str(VENV / "bin" / "python"), "-c", "import sys; print(sys._base_executable)"]).stdout.strip()


def dist_files(name: str) -> tuple[Path, list[str]]:
    """The installed distribution NAME of the project's environment: its dist-info and RECORD's paths."""
    (info,) = SITE_PACKAGES.glob(f"{name}-*.dist-info")
    paths = [line.split(",")[0] for line in (info / "RECORD").read_text().splitlines() if line]
    return info, paths


def make_site(root: Path, drop: tuple[str, ...] = (), versions: dict[str, str] | None = None, plugin: str = "") -> Path:
    """A site's interpreter: a venv whose site-packages links the project's environment's entries, less the
    distributions DROP; VERSIONS: dist-info copies claiming another version; PLUGIN: a stand-in GPU plugin
    dist-info `NAME==VERSION`. Returns its python."""
    res = run([base_python(), "-m", "venv", "--without-pip", str(root)])
    assert res.returncode == 0, res.stderr
    site = root / "lib" / "python3.12" / "site-packages"
    skip = {"maxtext_slurm.pth"}
    for name in drop:
        info, paths = dist_files(name)
        skip |= {p.split("/")[0] for p in paths}
    changed = {dist_files(name)[0].name: v for name, v in (versions or {}).items()}
    for entry in SITE_PACKAGES.iterdir():
        if entry.name in skip:
            continue
        if entry.name in changed:
            name = entry.name.split("-")[0]
            (site / f"{name}-{changed[entry.name]}.dist-info").mkdir()
            meta = re.sub(r"(?m)^Version: .*$", f"Version: {changed[entry.name]}", (entry / "METADATA").read_text())
            (site / f"{name}-{changed[entry.name]}.dist-info" / "METADATA").write_text(meta)
            continue
        (site / entry.name).symlink_to(entry)
    if plugin:
        name, version = plugin.split("==")
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root / "bin" / "python"


def wheel_of(name: str, dest: Path) -> Path:
    """A py3-none-any wheel of the installed pure-Python distribution NAME, from the files its RECORD lists."""
    info, paths = dist_files(name)
    assert "Root-Is-Purelib: true" in (info / "WHEEL").read_text()
    dest.mkdir(parents=True, exist_ok=True)
    whl = dest / f"{info.name.removesuffix('.dist-info')}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(whl, "w") as z:
        for p in paths:
            if "__pycache__" in p or p.startswith("..") or p.split("/")[-1] in ("RECORD", "INSTALLER", "REQUESTED"):
                continue
            data = (SITE_PACKAGES / p).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            z.writestr(p, data)
            record.append(f"{p},sha256={digest},{len(data)}")
        record.append(f"{info.name}/RECORD,,")
        z.writestr(f"{info.name}/RECORD", "\n".join(record) + "\n")
    return whl


@pytest.mark.slow  # pip installs into a new environment
@pytest.mark.heavy
def test_adopt_the_projects_environment_offline(tmp_path):
    """Everything is present: nothing is installed, the versions and the accelerator are recorded, --check
    and later calls are instant, and the new environment imports MaxText and the adopted JAX."""
    env = tmp_path / "env"
    py = VENV / "bin" / "python"
    res = setup_env(env, "--adopt", str(py))
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr and "installing" not in res.stderr, res.stderr
    want = {d: version_in(py, d) for d in ("jax", "jaxlib", "maxtext")}
    record = (env / ".mst-versions").read_text().split()
    assert record == [
        f"jax={want['jax']}", f"jaxlib={want['jaxlib']}", "plugin=none", f"maxtext={want['maxtext']}",
        f"python={run([str(py), '-c', 'import platform; print(platform.python_version())']).stdout.strip()}",
        f"source=adopted:{py}",
    ]  # fmt: skip
    assert (env / ".mst-accelerator").read_text() == "cpu adopted\n"
    assert not list((env / "lib" / "python3.12" / "site-packages").glob("jax*"))  # the adopted one, not a copy
    imp = run([str(env / "bin" / "python"), "-c", "import jax, maxtext; print(jax.__file__, maxtext.__file__)"])
    assert imp.returncode == 0 and imp.stdout.split() == [str(SITE_PACKAGES / "jax" / "__init__.py"),
                                                          str(SITE_PACKAGES / "maxtext" / "__init__.py")]  # fmt: skip
    for args in (("--check",), (), ("--adopt", str(py))):
        again = setup_env(env, *args)
        assert again.returncode == 0 and again.stderr == "", (args, again.stderr)
    # the JOB header shows them
    head = run([str(REPO / "utils" / "launch" / "job_header.sh")], env={"MST_VENV": str(env)}).stdout
    assert f"environment: {env} {' '.join(record)}\n" in head
    # another interpreter is not adopted over it
    other = setup_env(env, "--adopt", base_python())
    assert other.returncode == 1 and len(other.stderr.splitlines()) == 1, other.stderr
    assert f"{env} already holds an environment (adopted from {py}); remove it" in other.stderr


@pytest.mark.slow  # pip installs into a new environment
@pytest.mark.heavy
def test_wheelhouse_fills_what_the_site_lacks(tmp_path):
    """A site with another JAX version and a CUDA plugin, without termcolor (a MaxText pin): termcolor comes
    from the wheelhouse, the site's versions are kept and each difference is one warning, the accelerator
    is cuda, and the image stage accepts the environment on an NVIDIA node."""
    site_py = make_site(tmp_path / "site", drop=("termcolor",), versions={"jax": "0.11.2"},
                        plugin="jax-cuda13-plugin==0.11.2")  # fmt: skip
    wheelhouse = tmp_path / "wheels"
    wheel_of("termcolor", wheelhouse)
    env = tmp_path / "env"
    res = setup_env(env, "--adopt", str(site_py), "--wheelhouse", str(wheelhouse))
    assert res.returncode == 0, res.stderr
    pins = (REPO / "requirements" / "maxtext.txt").read_text()
    jax_pin = re.search(r"^jax==\S+$", pins, re.M).group(0)
    cuda_pin = re.search(
        r"^jax-cuda12-plugin\S*==\S+$", (REPO / "requirements/accelerators/cuda.txt").read_text(), re.M
    )
    kept = "kept (the environment uses what the adopted interpreter has)"
    warnings = [ln for ln in res.stderr.splitlines() if "warning" in ln]
    assert warnings == [
        f"setup_env.sh: warning: jax 0.11.2 differs from the pin {jax_pin}; {kept}",
        f"setup_env.sh: warning: jax-cuda13-plugin 0.11.2 differs from the pin {cuda_pin.group(0)}; {kept}",
    ]
    term = run([str(env / "bin" / "python"), "-c", "import termcolor, importlib.metadata as m; "
                "print(termcolor.__file__, m.version('termcolor'))"]).stdout.split()  # fmt: skip
    assert term == [
        str(env / "lib/python3.12/site-packages/termcolor/__init__.py"),
        version_in(VENV / "bin/python", "termcolor"),
    ]
    record = (env / ".mst-versions").read_text()
    assert record.startswith("jax=0.11.2 ") and " plugin=jax-cuda13-plugin==0.11.2 " in record
    assert (env / ".mst-accelerator").read_text() == "cuda adopted\n"
    assert setup_env(env, "--check", MST_ACCELERATOR="cuda").returncode == 0
    assert setup_env(env, "--check", MST_ACCELERATOR="rocm").returncode == 1
    rocm = setup_env(env, MST_ACCELERATOR="rocm")
    assert rocm.returncode == 1 and len(rocm.stderr.splitlines()) == 1, rocm.stderr
    assert "whose JAX runs on cuda; MST_ACCELERATOR=rocm cannot change that" in rocm.stderr
    # the image stage (CONTAINER_RUNTIME=none) on a node with NVIDIA's device file
    dev, job = tmp_path / "dev", tmp_path / "job"
    dev.mkdir(), job.mkdir()
    (dev / "nvidiactl").touch()
    stage = run([str(REPO / "utils/launch/image.sh")], env={"JOB_DIR": str(job), "JOB_HOSTNAME": "node1",
                "MST_DEV_ROOT": str(dev), "MST_VENV": str(env), "CONTAINER_RUNTIME": "none"})  # fmt: skip
    assert stage.returncode == 0, stage.stderr
    assert (job / ".images" / "node1").read_text() == f"runtime=none python={env}/bin/python accelerator=cuda\n"


def test_a_missing_wheel_is_one_line(tmp_path):
    site_py = make_site(tmp_path / "site", drop=("termcolor",))
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    version = version_in(VENV / "bin/python", "termcolor")
    res = setup_env(tmp_path / "env", "--adopt", str(site_py), "--wheelhouse", str(wheelhouse))
    assert res.returncode == 1 and res.stdout == "", res.stderr
    assert res.stderr.splitlines() == [
        f"setup_env.sh: the wheelhouse {wheelhouse} has no wheel for termcolor=={version}; on a machine with network "
        f"and the same Python (python3.12) and platform, run: python3.12 -m pip download --dest {wheelhouse} "
        f"--no-deps termcolor=={version}"
    ]
    assert not (tmp_path / "env").exists()
    # a new (pinned) environment from an empty wheelhouse: every pin named, nothing made
    fresh = setup_env(tmp_path / "fresh", "--wheelhouse", str(wheelhouse), MAXTEXT_SLURM_PYTHON=base_python())
    assert fresh.returncode == 1 and len(fresh.stderr.splitlines()) == 1, fresh.stderr
    named = re.search(r"has no wheel for (.*); on a machine", fresh.stderr).group(1).split(", ")
    assert "maxtext==0.2.5" in named and "ray==2.60.0" in named and len(named) > 100
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("kind", ["no-jax", "not-python", "old"])
def test_an_interpreter_without_jax_is_refused(tmp_path, kind):
    if kind == "no-jax":
        python = str(tmp_path / "bare" / "bin" / "python")
        assert run([base_python(), "-m", "venv", "--without-pip", str(tmp_path / "bare")]).returncode == 0
        needle = f"--adopt {python}: it has no jax or jaxlib; adopt an interpreter with JAX"
    elif kind == "not-python":
        python, needle = "/bin/true", "--adopt /bin/true: not a Python >= 3.12"
    else:
        python = str(tmp_path / "old-python")
        Path(python).write_text("#!/bin/sh\necho False\n")  # what an older Python says to the version test
        Path(python).chmod(0o755)
        needle = f"--adopt {python}: not a Python >= 3.12 (MaxText 0.2.5 needs it)"
    res = setup_env(tmp_path / "env", "--adopt", python)
    assert res.returncode == 1 and res.stdout == "", res.stderr
    assert len(res.stderr.splitlines()) == 1 and needle in res.stderr, res.stderr
    assert not (tmp_path / "env").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--adopt"], "--adopt needs a value"),
        (["--wheelhouse", "/nonexistent"], "--wheelhouse '/nonexistent' is not a directory"),
        (["--adopt", "/nonexistent/python"], "--adopt '/nonexistent/python' is not an executable Python"),
    ],
)
def test_bad_arguments(tmp_path, args, needle):
    res = setup_env(tmp_path / "env", *args)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and needle in res.stderr, res.stderr
    assert not (tmp_path / "env").exists()


@pytest.mark.slow
@pytest.mark.heavy
def test_run_local_trains_natively_on_the_adopted_environment(tmp_path, workspace):
    env = tmp_path / "env"
    assert setup_env(env, "--adopt", str(VENV / "bin" / "python")).returncode == 0
    res = run(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=2"],
        env={"MAXTEXT_SLURM_VENV": str(env), "JOB_WORKSPACE": str(workspace), "CONTAINER_RUNTIME": "none"},
        timeout=600,
    )
    (log,) = workspace.glob("local-*-JAX-*.log")
    assert res.returncode == 0, log.read_text()[-3000:]
    record = (env / ".mst-versions").read_text().strip()
    assert log_has(log, rf"^environment: {re.escape(str(env))} {re.escape(record)}$")
    assert log_has(log, rf"runtime=none python={re.escape(str(env))}/bin/python accelerator=cpu")
    assert log_has(log, r"completed step: 1,")
    assert summary(log)["status"] == "completed"
