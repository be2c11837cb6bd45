"""The image stage (utils/launch/image.sh), the agreement of every node's runtime and image, and the
train stage running exactly the recorded image (_container.sh), with real podman and a real image.

The image is made offline: mmdebstrap builds a Debian 12 root file system from Debian's packages (the
essential set plus the shared libraries the pinned Python needs) and `podman import` makes it an image.
It has no MaxText of its own: its `python3` is a two-line script that runs `$MST_VENV/bin/python3`, and the
job mounts the project's environment and the Python it was made from (CONTAINER_MOUNTS, read-only, at the
same paths), so the tiny model really trains inside the container (the wrapper's line in the log and
podman's own event log show that it did). podman runs with a containers.conf and a storage.conf of the
test's own (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF: runc, the ulimits this machine allows, an image
store in the test's temp dir), so the machine's podman settings and store are left alone.

GPU nodes are fixture device roots (MST_DEV_ROOT): an empty `nvidiactl` or `kfd` file stands for the
device node the driver creates (NVIDIA: /dev/nvidiactl, the control device of the nvidia kernel module;
AMD: /dev/kfd, the ROCm compute interface of amdgpu's amdkfd, drivers/gpu/drm/amd/amdkfd/kfd_chardev.c),
which is all the stage looks at.
"""

import base64
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, VENV, launcher_env, run

from helpers.jobs import log_has, submit, summary, triage, wait_job_end
from helpers.registry import Registry

IMAGE_SH = str(REPO / "utils" / "launch" / "image.sh")
HOST = socket.gethostname()
# what the image holds: the essential packages, the libraries of a python built on Debian 12 and jaxlib's
PACKAGES = "libssl3,libffi8,libsqlite3-0,libexpat1,libreadline8,libbz2-1.0,liblzma5,libuuid1,libstdc++6"
WRAPPER = '#!/bin/sh\necho "mst-test-image: python3 is $MST_VENV/bin/python3" >&2\nexec "$MST_VENV/bin/python3" "$@"\n'


# --- podman with the test's own settings and store ----------------------------------------------


def podman_settings(root: Path, store: str = "store") -> dict[str, str]:
    """CONTAINERS_CONF and CONTAINERS_STORAGE_CONF for a podman whose state lives under ROOT."""
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "containers.conf"
    if not conf.exists():
        (root / "libpod").mkdir(exist_ok=True)
        conf.write_text(
            "[containers]\n"
            'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
            "[engine]\n"
            'runtime = "runc"\n'
            f'tmp_dir = "{root}/libpod"\n'
            'events_logger = "file"\n'
            f'events_logfile_path = "{root}/events.log"\n'
        )
    storage = root / f"{store}.conf"
    storage.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/{store}/graph"\nrunroot = "{run_root(root, store)}"\n'
    )
    return {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}


def run_root(root: Path, store: str) -> Path:
    """The store's run root, in a short path: one as long as pytest's temp paths (~50 characters) made every
    `podman run` 20 s slower here (podman 4.3, measured; 33 characters or less: no delay)."""
    return Path(tempfile.gettempdir()) / f"mst-run-{hashlib.sha256(f'{root}/{store}'.encode()).hexdigest()[:10]}"


def podman(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    res = run(["podman", *args], env=env, timeout=timeout)
    assert res.returncode == 0, f"podman {' '.join(args)}: {res.stderr}"
    return res


def rootfs_tar() -> Path:
    """The image's root file system, built once per machine and kept (a cache keyed by what it holds)."""
    key = hashlib.sha256(f"bookworm essential {PACKAGES} {WRAPPER}".encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"mst-test-image-cache-{os.getuid()}"  # outlives pytest's numbered dirs
    tar = cache / f"rootfs-{key}.tar"
    if tar.exists():
        return tar
    cache.mkdir(parents=True, exist_ok=True)
    part = cache / f".rootfs-{key}.{os.getpid()}.tar"
    hook = (
        f'printf %s {shlex.quote(WRAPPER)} > "$1/usr/local/bin/python3"; chmod 755 "$1/usr/local/bin/python3"; '
        'rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*'
    )
    drop = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale", "info")]
    res = run(
        ["mmdebstrap", "--quiet", "--variant=essential", f"--include={PACKAGES}", *drop,
         f"--customize-hook={hook}", "bookworm", str(part)],
        timeout=600,
    )  # fmt: skip
    if res.returncode != 0:
        part.unlink(missing_ok=True)
        raise AssertionError(f"mmdebstrap failed: {res.stderr[-2000:]}")
    part.rename(tar)
    return tar


@pytest.fixture(scope="module")
def podman_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The test's podman settings and stores (every store is emptied at the end)."""
    root = tmp_path_factory.mktemp("podman")
    podman_settings(root)
    yield root
    for store in root.glob("*.conf"):
        if store.name != "containers.conf" and (root / store.stem).exists():
            env = {"CONTAINERS_CONF": str(root / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(store)}
            run(["podman", "rmi", "-a", "-f"], env=env, timeout=300)
            shutil.rmtree(run_root(root, store.stem), ignore_errors=True)


@pytest.fixture(scope="module")
def image(podman_root: Path) -> dict:
    """The test image in the test's podman store: name, id, the podman settings, a saved .tar of it."""
    root = podman_root
    env = podman_settings(root)
    name = f"localhost/mst-test:{os.getpid()}"
    podman(env, "import", "-q", str(rootfs_tar()), name)
    image_id = podman(env, "image", "inspect", "--format", "{{.Id}}", name).stdout.strip()
    saved = root / "mst-test.tar"
    podman(env, "save", "-q", "-o", str(saved), name)
    return {"name": name, "id": f"sha256:{image_id}", "env": env, "root": root, "tar": saved}


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workspace for the training tests: they share the JAX compilation cache."""
    return tmp_path_factory.mktemp("ws")


def venv_mounts() -> str:
    """CONTAINER_MOUNTS for the project's environment and the Python it was made from."""
    base = run([str(VENV / "bin" / "python"), "-c", "import sys; print(sys.base_prefix)"]).stdout.strip()
    if not base or base.startswith("/usr"):
        pytest.skip(f"the environment's Python lives in {base or '?'}, which cannot be mounted over the image's")
    return f"{VENV}:{VENV}:ro {base}:{base}:ro"


def container_env(image: dict, ws: Path, **extra: str) -> dict[str, str]:
    return launcher_env(
        ws, **{**image["env"], "CONTAINER_IMAGE": image["name"], "CONTAINER_MOUNTS": venv_mounts(), **extra}
    )


def newest_log(ws: Path) -> Path:
    logs = sorted(ws.glob("local-*-JAX-*.log"), key=lambda p: p.stat().st_mtime)
    assert logs, list(ws.iterdir())
    return logs[-1]


def record_of(job_dir: Path, host: str) -> dict[str, str]:
    text = (job_dir / ".images" / host).read_text()
    return dict(kv.split("=", 1) for kv in text.split())


def events(image: dict, job_id: str) -> list[dict]:
    """podman's own record of the containers carrying the job's label."""
    res = podman(
        image["env"], "events", "--stream=false", "--since", "30m", "--filter", f"label=mst.job={job_id}",
        "--format", "json",
    )  # fmt: skip
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


# --- the stage's decisions, node by node ------------------------------------------------------------


def fake_venv(root: Path, accelerator: str | None) -> Path:
    """An environment as utils/setup_env.sh leaves it, as far as the stage reads it: bin/python and the
    accelerator record (none: an environment from before MST_ACCELERATOR, i.e. cpu)."""
    venv = root / f"venv-{accelerator}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(shutil.which("python3") or "/usr/bin/python3")
    if accelerator:
        (venv / ".mst-accelerator").write_text(f"{accelerator} 0123456789abcdef\n")
    return venv


def stage(tmp_path: Path, podman_root: Path, gpu: str = "", venv: str | None = None, **env: str):
    """utils/launch/image.sh on node `node1` (GPU device file `gpu` in a fixture /dev); returns the result
    and the node's record (None when it wrote none)."""
    dev = tmp_path / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    if gpu:
        (dev / gpu).touch()
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)  # made by submit.sh / run_local.sh before the job runs
    full = {
        **podman_settings(podman_root),
        "JOB_DIR": str(job_dir),
        "JOB_HOSTNAME": "node1",
        "MST_DEV_ROOT": str(dev),
        "MST_VENV": str(fake_venv(tmp_path, venv)),
        "CONTAINER_IMAGE": "localhost/mst-absent:1",
        **env,
    }
    res = run([IMAGE_SH], env=full, timeout=120)
    rec = job_dir / ".images" / "node1"
    return res, (rec.read_text().strip() if rec.exists() else None)


def one_failure_line(res: subprocess.CompletedProcess, *needles: str, progress: str = "") -> str:
    """The stage failed with exactly one line (on stderr) holding every needle; stdout is empty, or
    only the progress line it had printed before."""
    assert res.returncode == 1, (res.stdout, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("image: FAILED: "), res.stdout + res.stderr
    assert res.stdout == progress, res.stdout
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def test_cpu_node_without_an_image_runs_natively_under_auto(tmp_path, podman_root):
    res, rec = stage(tmp_path, podman_root)
    assert res.returncode == 0, res.stderr
    assert rec == f"runtime=none python={tmp_path}/venv-None/bin/python accelerator=cpu"
    said = res.stdout.splitlines()[0]
    assert said.startswith("image: no image 'localhost/mst-absent:1' on node1 (") and said.endswith(
        "): this CPU-only node runs natively"
    ), said
    assert "not in the local store of podman" in said and "a localhost/ name is never pulled" in said


@pytest.mark.parametrize(("dev", "acc"), [("nvidiactl", "cuda"), ("kfd", "rocm")])
def test_gpu_node_without_an_image_fails_under_auto(tmp_path, podman_root, dev, acc):
    res, rec = stage(tmp_path, podman_root, gpu=dev, venv=acc)  # even a GPU environment: native is a choice
    one_failure_line(
        res,
        f"node1 has GPUs ({tmp_path}/dev/{dev}) but no image 'localhost/mst-absent:1' could be had",
        "not in the local store of podman",
        "docker: ",
        "set CONTAINER_IMAGE_TAR to a saved .tar",
        f"CONTAINER_RUNTIME=none with a GPU environment (MST_ACCELERATOR={acc} utils/setup_env.sh)",
    )
    assert rec is None


@pytest.mark.parametrize(
    ("dev", "venv", "ok"),
    [
        ("nvidiactl", None, False),  # an environment from before MST_ACCELERATOR: cpu
        ("nvidiactl", "cpu", False),
        ("nvidiactl", "cuda", True),
        ("kfd", "rocm", True),
        ("kfd", "cuda", False),
        ("", "cpu", True),
    ],
)
def test_native_on_a_gpu_node_needs_an_environment_for_that_gpu(tmp_path, podman_root, dev, venv, ok):
    res, rec = stage(tmp_path, podman_root, gpu=dev, venv=venv, CONTAINER_RUNTIME="none")
    if ok:
        assert res.returncode == 0 and res.stderr == "", res.stderr
        assert rec == f"runtime=none python={tmp_path}/venv-{venv}/bin/python accelerator={venv}"
        return
    want = {"nvidiactl": "cuda", "kfd": "rocm"}[dev]
    one_failure_line(
        res,
        f"node1 has GPUs ({tmp_path}/dev/{dev}) but CONTAINER_RUNTIME=none would run the {venv or 'cpu'} environment",
        f"make a {want} one with MST_ACCELERATOR={want} utils/setup_env.sh",
    )
    assert rec is None


def test_explicit_runtime_without_the_image_fails_on_a_cpu_node(tmp_path, podman_root):
    res, rec = stage(tmp_path, podman_root, CONTAINER_RUNTIME="podman")
    one_failure_line(
        res,
        "no image 'localhost/mst-absent:1' could be had on node1 (not in the local store of podman; "
        "no CONTAINER_IMAGE_TAR, and a localhost/ name is never pulled)",
        "or run natively: CONTAINER_RUNTIME=none",
    )
    assert rec is None


def test_docker_without_a_daemon(tmp_path, podman_root):
    if shutil.which("docker") and run(["docker", "version", "--format", "{{.Server.Version}}"]).returncode == 0:
        pytest.skip("a Docker daemon answers on this machine")
    res, _ = stage(tmp_path, podman_root, CONTAINER_RUNTIME="docker")
    one_failure_line(res, "CONTAINER_RUNTIME=docker but ")


MOUNT_SHAPE = "is not SRC:DST or SRC:DST:ro with absolute paths"
BAD_SETTINGS = [
    (
        {"CONTAINER_RUNTIME": "kubernetes"},
        "CONTAINER_RUNTIME='kubernetes' is not one of auto, podman, docker, apptainer, singularity, pyxis, enroot, "
        "none",
    ),
    ({"CONTAINER_IMAGE_TAR": "/no/image.tar"}, "CONTAINER_IMAGE_TAR='/no/image.tar' is not a readable file on node1"),
    ({"CONTAINER_IMAGE_TAR": "NOT_AN_IMAGE"}, "podman load -i"),  # and podman's reason (its Error: line)
    (
        {"CONTAINER_IMAGE": "registry.invalid/team/maxtext:1", "CONTAINER_AUTH_FILE": "OPEN_AUTH"},
        "has mode 644: others can read your registry credentials; chmod 600 it",
    ),
    ({"CONTAINER_MOUNTS": "data:/data"}, f"CONTAINER_MOUNTS entry 'data:/data' {MOUNT_SHAPE}"),
    ({"CONTAINER_MOUNTS": "/data:/data:rw"}, f"CONTAINER_MOUNTS entry '/data:/data:rw' {MOUNT_SHAPE}"),
    ({"CONTAINER_MOUNTS": "/no/data:/data"}, "CONTAINER_MOUNTS entry '/no/data:/data': '/no/data' does not exist"),
    ({"CONTAINER_MOUNTS": f"/tmp:{REPO}"}, f"mounts over '{REPO}', which the launcher mounts already"),
    ({"CONTAINER_MOUNTS": "/tmp:/x /etc:/x/"}, "entry '/etc:/x/' mounts over '/x', which '/tmp:/x' mounts already"),
]


@pytest.mark.parametrize(("setting", "needle"), BAD_SETTINGS)
def test_bad_settings_fail_with_one_line(tmp_path, podman_root, setting, needle):
    secret = "c2VjcmV0LXRva2VuLTQ4MjA="
    if setting.get("CONTAINER_IMAGE_TAR") == "NOT_AN_IMAGE":
        (tmp_path / "notes.tar").write_text("not an image\n")
        setting = {**setting, "CONTAINER_IMAGE_TAR": str(tmp_path / "notes.tar")}
    if setting.get("CONTAINER_AUTH_FILE") == "OPEN_AUTH":
        auth = tmp_path / "auth.json"
        auth.write_text(json.dumps({"auths": {"registry.invalid": {"auth": secret}}}))
        auth.chmod(0o644)
        setting = {**setting, "CONTAINER_AUTH_FILE": str(auth)}
    res, rec = stage(tmp_path, podman_root, **setting)
    loading = f"image: loading {setting['CONTAINER_IMAGE_TAR']} with podman\n" if "load -i" in needle else ""
    one_failure_line(res, needle, progress=loading)
    assert rec is None and secret not in res.stdout + res.stderr


def write_records(job_dir: Path, records: dict[str, str]) -> None:
    (job_dir / ".images").mkdir(parents=True)
    for host, text in records.items():
        (job_dir / ".images" / host).write_text(text + "\n")


POD_A = "runtime=podman image=localhost/m:1 digest=sha256:aaaa source=local"
POD_B = "runtime=podman image=localhost/m:1 digest=sha256:bbbb source=tar"
NATIVE_CPU = "runtime=none python=/v/bin/python accelerator=cpu"
NATIVE_CUDA = "runtime=none python=/v/bin/python accelerator=cuda"


@pytest.mark.parametrize(
    ("records", "odd", "missing"),
    [
        ({"a": POD_A, "b": POD_A, "c": POD_A}, [], []),
        ({"a": POD_A, "b": POD_A.replace("source=local", "source=pull")}, [], []),  # how it came does not matter
        ({"a": POD_A, "b": POD_B, "c": POD_A}, ["b"], []),  # the odd one out, whatever its rank
        ({"a": POD_B, "b": POD_A, "c": POD_A}, ["a"], []),
        ({"a": POD_A, "b": POD_B}, ["b"], []),  # a tie: the first node is the reference
        ({"a": POD_A, "b": NATIVE_CPU, "c": POD_A}, ["b"], []),
        ({"a": NATIVE_CPU, "b": NATIVE_CUDA}, ["b"], []),
        ({"a": POD_A, "c": POD_A}, [], ["b"]),
        ({}, [], ["a", "b"]),
    ],
)
def test_agreement(tmp_path, records, odd, missing):
    nodes = sorted({*records, *odd, *missing, "a", "b"} - ({"c"} - set(records)))
    write_records(tmp_path, records)
    res = run([IMAGE_SH, "--agree"], env={"JOB_DIR": str(tmp_path), "JOB_NODELIST": " ".join(nodes)})
    if not odd and not missing:
        assert res.returncode == 0 and res.stdout.startswith(f"image: all {len(nodes)} node(s) agree: "), res.stdout
        return
    assert res.returncode == 1, res.stdout
    table = [ln for ln in res.stdout.splitlines() if ln.startswith("image:   ")]
    assert [ln.split()[1] for ln in table] == ["node", *nodes]
    for ln in table[1:]:
        host = ln.split()[1]
        assert ln.endswith("<- differs") == (host in odd) and ln.endswith("<- no record") == (host in missing), ln
    line = res.stderr.strip()
    assert len(res.stderr.splitlines()) == 1 and line.startswith("image: FAILED: the nodes do not all run the same")
    if odd:
        assert f": {' '.join(odd)} differ(s) from " in line, line
    if missing:
        assert f"no image record from {' '.join(missing)}" in line, line


def test_bad_argument_exits_2(tmp_path):
    res = run([IMAGE_SH, "--agreee"], env={"JOB_DIR": str(tmp_path)})
    assert res.returncode == 2 and res.stdout == "" and len(res.stderr.splitlines()) == 1, res.stderr
    assert "unexpected argument '--agreee'" in res.stderr


@pytest.mark.slow
@pytest.mark.heavy
def test_pull_with_the_credentials_file(image, tmp_path, podman_root):
    """A registry that wants a login (tests/helpers/registry.py, on 127.0.0.1): without CONTAINER_AUTH_FILE the
    pull is refused and a GPU node says so; with it the image is pulled into a store that lacked it and its
    ID recorded. The credentials appear nowhere in what the stage printed."""
    layout = tmp_path / "oci"
    podman(image["env"], "save", "-q", "--format", "oci-dir", "-o", str(layout), image["name"])
    user, password = "mst", secrets.token_hex(12)
    with Registry(layout, "team/maxtext", "1", user, password) as reg:
        name = f"127.0.0.1:{reg.port}/team/maxtext:1"
        registries = tmp_path / "registries.conf"  # plain HTTP to the test's registry
        registries.write_text(f'[[registry]]\nlocation = "127.0.0.1:{reg.port}"\ninsecure = true\n')
        fresh = podman_settings(image["root"], store=f"pull-{tmp_path.name}")
        settings = {**fresh, "CONTAINERS_REGISTRIES_CONF": str(registries), "CONTAINER_IMAGE": name}
        pulling = f"image: pulling {name} with podman"

        res, rec = stage(tmp_path / "no-auth", podman_root, gpu="nvidiactl", **settings)
        line = one_failure_line(res, f"no image '{name}' could be had", "pull with podman: ", progress=pulling + "\n")
        assert re.search(r"unauthorized|authentication required", line, re.I) and reg.refused > 0, line
        assert reg.served == 0 and rec is None

        auth = tmp_path / "auth.json"
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        auth.write_text(json.dumps({"auths": {f"127.0.0.1:{reg.port}": {"auth": token}}}))
        auth.chmod(0o600)
        res, rec = stage(tmp_path / "auth", podman_root, gpu="nvidiactl", CONTAINER_AUTH_FILE=str(auth), **settings)
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.splitlines()[0] == f"{pulling} (credentials from CONTAINER_AUTH_FILE)"
        assert rec == f"runtime=podman image={name} digest={image['id']} source=pull"
        assert reg.served > 0
        out = res.stdout + res.stderr
        assert password not in out and token not in out and str(auth) not in out  # the path too: redacted elsewhere


# --- MST_ACCELERATOR: the environment for running natively on GPUs ------------------------------------

SETUP_ENV = str(REPO / "utils" / "setup_env.sh")


def test_setup_env_refuses_an_unknown_accelerator(tmp_path):
    res = run([SETUP_ENV], env={"MAXTEXT_SLURM_VENV": str(tmp_path / "venv"), "MST_ACCELERATOR": "gpu"})
    assert res.returncode == 1 and res.stdout == "", res.stderr
    assert res.stderr.splitlines() == [
        "setup_env.sh: MST_ACCELERATOR='gpu' is not one of cpu, cuda (NVIDIA), rocm (AMD)"
    ]
    assert not (tmp_path / "venv").exists()


def recording_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A made environment whose python only records what it is asked to do (installing the CUDA plugin
    for real takes GBs): the stamp of the current requirements, so only the accelerator step runs."""
    venv, calls = tmp_path / "venv", tmp_path / "calls"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = -c ] && echo {tmp_path}/site\nexit 0\n')
    py.chmod(0o755)
    (tmp_path / "site").mkdir()
    reqs = b"".join(f.read_bytes() for f in sorted((REPO / "requirements").glob("*.txt")))
    (venv / ".maxtext-slurm-stamp").write_text(hashlib.sha256(reqs).hexdigest()[:16] + "\n")
    calls.write_text("")
    return venv, calls


def test_setup_env_adds_and_swaps_the_gpu_plugin(tmp_path):
    """MST_ACCELERATOR installs the pinned plugin of requirements/accelerators/ into the environment and
    records it; unset, the environment keeps what it has; a change removes the other plugin first."""
    venv, calls = recording_venv(tmp_path)
    reqs = REPO / "requirements"

    def setup(acc: str | None, *args: str) -> tuple[int, list[str]]:
        env = {"MAXTEXT_SLURM_VENV": str(venv), "MST_ACCELERATOR": acc or ""}  # "": as if unset
        calls.write_text("")
        res = run([SETUP_ENV, *args], env=env)
        pip = [c for c in calls.read_text().splitlines() if c.startswith("-m pip")]
        return res.returncode, pip

    assert setup("cuda", "--check") == (1, [])  # a cpu environment has no CUDA plugin
    rc, pip = setup("cuda")
    assert rc == 0 and pip == [
        f"-m pip install -q --disable-pip-version-check -r {reqs}/accelerators/cuda.txt -c {reqs}/constraints.txt"
    ]
    assert (venv / ".mst-accelerator").read_text().split()[0] == "cuda"
    assert setup(None) == (0, []) and setup("cuda") == (0, []) and setup("cuda", "--check") == (0, [])
    rc, pip = setup("rocm")
    assert rc == 0 and pip == [
        "-m pip uninstall -q -y jax-cuda12-plugin jax-cuda12-pjrt",
        f"-m pip install -q --disable-pip-version-check -r {reqs}/accelerators/rocm.txt -c {reqs}/constraints.txt",
    ]
    rc, pip = setup("cpu")
    assert rc == 0 and pip == ["-m pip uninstall -q -y jax-rocm7-plugin jax-rocm7-pjrt"]
    assert (venv / ".mst-accelerator").read_text().split()[0] == "cpu"


def test_accelerator_pins_fit_the_pinned_jaxlib():
    """jaxlib uses a CUDA plugin only of its own version (jaxlib/plugin_support.py); ROCm plugins skip that
    check, and AMD publishes them by jax release (0.12.0 for jaxlib 0.12.0.1)."""
    pins = dict(re.findall(r"^(jaxlib)==(\S+)$", (REPO / "requirements/maxtext.txt").read_text(), re.M))

    def versions(name: str) -> dict[str, str]:
        text = (REPO / "requirements/accelerators" / f"{name}.txt").read_text()
        return dict(re.findall(r"^([\w-]+)(?:\[[\w-]+\])?==(\S+)$", text, re.M))

    assert versions("cuda") == {"jax-cuda12-plugin": pins["jaxlib"], "jax-cuda12-pjrt": pins["jaxlib"]}
    rocm = versions("rocm")
    assert set(rocm) == {"jax-rocm7-plugin", "jax-rocm7-pjrt"}
    assert all(pins["jaxlib"].startswith(v) for v in rocm.values()), rocm


# --- the stage in a job ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.heavy
def test_job_trains_in_the_recorded_image(image, shared_ws, venv):
    """(1) The image is in the store: the stage records its ID, the train stage runs MaxText in it."""
    env = container_env(image, shared_ws, CONTAINER_RUNTIME="podman")
    res = run([str(REPO / "run_local.sh"), "tiny", "--", "steps=3"], env=env, timeout=600)
    log = newest_log(shared_ws)
    assert res.returncode == 0, log.read_text()[-3000:]
    job_dir = log.with_suffix("")
    rec = record_of(job_dir, HOST)
    assert rec == {"runtime": "podman", "image": image["name"], "digest": image["id"], "source": "local"}
    assert log_has(log, rf"^image: all 1 node\(s\) agree: runtime=podman image=\S+ digest={image['id']} ")
    assert log_has(log, rf"^{HOST}: _container.sh: podman image {re.escape(image['name'])} \({image['id']}\)$")
    # the trainer started through the image's python3 (the host has no such script) and trained
    assert log_has(log, rf"^{HOST}: mst-test-image: python3 is {re.escape(str(VENV))}/bin/python3$")
    assert log_has(log, rf"^{HOST}: .*completed step: 2,")
    assert summary(log)["status"] == "completed"
    # podman ran the recorded image (by its ID) with the job's labels, twice: preflight's attention-kernel
    # check in the interpreter that trains (utils/launch/check_attention.py), then the trainer
    image_python = re.escape(f"{VENV}/bin/python3")
    assert log_has(log, rf"^{HOST}: preflight: attention: dot_product \(.*for {image_python} on {HOST}$")
    job_id = log.name.split("-JAX-")[0]
    started = [e for e in events(image, job_id) if e["Status"] == "start"]
    assert len(started) == 2, started
    for start in started:
        labels = start["Attributes"]
        assert labels["mst.workspace"] == str(shared_ws) and labels["mst.scheduler"] == "local"
        assert start["Image"] in (image["id"], image["name"]), start


@pytest.mark.slow
@pytest.mark.heavy
def test_image_loaded_from_a_saved_tar(image, shared_ws, venv, tmp_path):
    """(2) A node whose store lacks the image (a fresh store) loads CONTAINER_IMAGE_TAR, records the same
    ID as the image that was saved, and trains in it."""
    fresh = podman_settings(image["root"], store=f"fresh-{tmp_path.name}")
    assert run(["podman", "image", "exists", image["name"]], env=fresh).returncode == 1
    env = container_env(image, shared_ws, **fresh, CONTAINER_IMAGE_TAR=str(image["tar"]))
    res = run([str(REPO / "run_local.sh"), "tiny", "--", "steps=2"], env=env, timeout=600)
    log = newest_log(shared_ws)
    assert res.returncode == 0, log.read_text()[-3000:]
    rec = record_of(log.with_suffix(""), HOST)
    assert rec == {"runtime": "podman", "image": image["name"], "digest": image["id"], "source": "tar"}
    assert log_has(log, rf"^{HOST}: image: loading {re.escape(str(image['tar']))} with podman$")
    assert log_has(log, rf"^{HOST}: .*completed step: 1,")
    assert podman(fresh, "image", "inspect", "--format", "{{.Id}}", image["name"]).stdout.strip() == image["id"][7:]


def test_gpu_node_without_the_image_fails_before_training(podman_root, workspace, venv, tmp_path):
    """(3) A GPU node (fixture /dev with nvidiactl) where the image is nowhere: the job fails in the image
    stage with one line that says what was tried and the two ways out; nothing else runs."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()
    settings = podman_settings(podman_root)
    env = launcher_env(workspace, **settings, CONTAINER_IMAGE="localhost/mst-absent:1", MST_DEV_ROOT=str(dev))
    res = run([str(REPO / "run_local.sh"), "tiny", "--", "steps=3"], env=env, timeout=300)
    log = newest_log(workspace)
    assert res.returncode != 0
    text = log.read_text()
    failed = [ln for ln in text.splitlines() if "image: FAILED" in ln and not ln.startswith("first_error")]
    assert len(failed) == 1, text[-3000:]
    line = failed[0]
    assert line.startswith(
        f"{HOST}: image: FAILED: {HOST} has GPUs ({dev}/nvidiactl) but no image 'localhost/mst-absent:1'"
    )
    for needle in ("not in the local store of podman", "CONTAINER_IMAGE_TAR", "CONTAINER_RUNTIME=none",
                   "MST_ACCELERATOR=cuda utils/setup_env.sh"):  # fmt: skip
        assert needle in line, line
    s = summary(log)
    assert s["status"] == "failed" and s["stage"] == "image" and s["failed_nodes"] == f"{HOST} (exit 1)", s
    assert s["first_error"] == line[:400]
    assert f"{HOST}: preflight:" not in text and "_container.sh" not in text and "completed step" not in text
    assert not (log.with_suffix("") / ".images").exists()
    # triage names the stage, the node and the line
    r = triage(log)
    assert r["status"] == "failed" and r["failure_class"] is None and r["culprit_hosts"] == [HOST], r
    assert r["summary"].startswith(f"image stage failed on {HOST}: image: FAILED: {HOST} has GPUs"), r["summary"]
    assert any(e["text"] == line[:400] for e in r["evidence"]), r["evidence"]  # evidence lines are cut at 400


@pytest.mark.slow
@pytest.mark.heavy
def test_a_stage_timeout_ends_the_container(image, tmp_path):
    """A train stage past its limit: run_stage.sh stops _container.sh, and the container goes with it (its
    process 1 would ignore the TERM the runtime forwards; a trainer left running would hold the GPUs)."""
    job_dir = tmp_path / "job"
    write_records(job_dir, {"n1": f"runtime=podman image={image['name']} digest={image['id']} source=local"})
    env = {**image["env"], "JOB_DIR": str(job_dir), "JOB_HOSTNAME": "n1", "JOB_ID": f"stop-{tmp_path.name}",
           "JOB_WORKSPACE": str(tmp_path), "JOB_SCHEDULER": "local", "STAGE_STOP_GRACE": "5"}  # fmt: skip
    script = "echo started; exec sleep 300"
    res = run([str(REPO / "utils/launch/run_stage.sh"), "train", "4", str(REPO / "_container.sh"), "sh", "-c", script],
              env=env, timeout=60)  # fmt: skip
    assert res.returncode == 124, res.stdout + res.stderr
    assert "n1: started" in res.stdout and "stage 'train' exceeded its 4 s limit on n1" in res.stdout
    label = f"label=mst.job={env['JOB_ID']}"
    running = podman(image["env"], "ps", "--filter", label, "--format", "{{.ID}} {{.Status}}").stdout.strip()
    assert running == "", f"the container outlived its stage: {running}"
    # the exited container is removed by podman's cleanup process, which lags under load (a CI run saw
    # it still listed right after the stage): gone within 30 s
    deadline = time.monotonic() + 30
    while (
        left := podman(image["env"], "ps", "-a", "--filter", label, "--format", "{{.ID}} {{.Status}}").stdout.strip()
    ) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == "", f"the stopped container was never removed: {left}"
    # it died and was removed, and nothing ran in it again. Here the record ends `kill died remove`;
    # under load podman adds bookkeeping after the `died` (a CI run had `cleanup` there, and a later one
    # a sequence the report cut short), so the test names what must not come after it: a new start
    said = [e["Status"] for e in events(image, env["JOB_ID"])]
    after = said[said.index("died") + 1 :] if "died" in said else []
    again = {"init", "start", "restart", "attach", "exec", "unpause"} & set(after)
    assert "remove" in after and not again, f"podman's events for the container: {' '.join(said)}"


@pytest.mark.slow
@pytest.mark.heavy
def test_a_stop_signal_while_the_container_starts_leaves_no_container(image, tmp_path):
    """A cancel or a stage timeout can land at any moment of `podman run`'s start-up, where podman's own
    signal proxy loses it (podman 4.3, measured: TERMed then, it exits 0 and leaves the container created;
    a CI run's stage timeout left one running; TERMed at 0.1-0.15 s, before it wrote the ID file, it left
    one created). Whenever the TERM lands, _container.sh returns non-zero and the job's label marks no
    container, running or not, once it has returned."""
    write_records(tmp_path / "job", {"n1": f"runtime=podman image={image['name']} digest={image['id']} source=local"})
    script = "echo started; exec sleep 300"
    results = []
    for i, delay in enumerate((0.1, 0.15, 0.2, 0.25, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0, 1.5, 2.5)):
        job_id = f"start-{i}-{tmp_path.name}"
        env = {**os.environ, **image["env"], "JOB_DIR": str(tmp_path / "job"), "JOB_HOSTNAME": "n1",
               "JOB_ID": job_id, "JOB_WORKSPACE": str(tmp_path), "JOB_SCHEDULER": "local"}  # fmt: skip
        # the whole process group gets the TERM, as timeout(1) and Slurm send it
        proc = subprocess.Popen(
            [str(REPO / "_container.sh"), "sh", "-c", script], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        listed = podman(image["env"], "ps", "-a", "--filter", f"label=mst.job={job_id}", "--format", "{{.Status}}")
        results.append((delay, proc.returncode, "started" in out, listed.stdout.strip()))
    assert all(rc != 0 for _, rc, _, _ in results), results
    assert all(left == "" for *_, left in results), f"containers left (delay, rc, started, left): {results}"
    assert any(started for _, _, started, _ in results), f"no TERM landed after the command started: {results}"


# --- the agreement on the local Slurm cluster -------------------------------------------------------


def per_host_podman(tmp_path: Path, image: dict) -> tuple[str, dict]:
    """A PATH whose podman gives node n2 an image store of its own (as a separate machine has), holding
    a different build under the same name: the same root file system imported with another label."""
    real = shutil.which("podman")
    assert real
    other = podman_settings(image["root"], store=f"n2-{tmp_path.name}")
    podman(other, "import", "-q", "--change", "LABEL=mst.test.build=n2", str(rootfs_tar()), image["name"])
    other_id = "sha256:" + podman(other, "image", "inspect", "--format", "{{.Id}}", image["name"]).stdout.strip()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "podman"
    shim.write_text(
        "#!/bin/sh\n# node n2 has its own image store\n"
        f'[ "$(hostname)" = n2 ] && export CONTAINERS_STORAGE_CONF={other["CONTAINERS_STORAGE_CONF"]}\n'
        f'exec {real} "$@"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return f"{bindir}:{os.environ['PATH']}", {"id": other_id, "settings": other}


@pytest.mark.cluster
def test_nodes_with_different_images_stop_before_training(cluster, image, workspace, venv, tmp_path):
    """(4a) n1 and n2 hold different images under the one name CONTAINER_IMAGE: the job stops after the
    image stage with a per-node table, names n2, and never reaches preflight or training."""
    path, other = per_host_podman(tmp_path, image)
    env = container_env(image, workspace, CONTAINER_RUNTIME="podman", PATH=path)
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=3", **env)
    assert wait_job_end(cluster, job_id, 180) == "FAILED", log.read_text()[-3000:]
    job_dir = log.with_suffix("")
    assert record_of(job_dir, "n1")["digest"] == image["id"] and record_of(job_dir, "n2")["digest"] == other["id"]
    text = log.read_text()
    assert re.search(rf"^image:   n1 +runtime=podman image=\S+ digest={image['id']} source=local$", text, re.M)
    assert re.search(
        rf"^image:   n2 +runtime=podman image=\S+ digest={other['id']} source=local  <- differs$", text, re.M
    )
    assert re.search(
        r"^image: FAILED: the nodes do not all run the same runtime and image: n2 differ\(s\) from n1", text, re.M
    )
    assert ": preflight:" not in text and "completed step" not in text
    s = summary(log)
    assert s["status"] == "failed" and s["stage"] == "image" and "n2 differ(s) from n1" in s.get("first_error", ""), s
    r = triage(log, cluster)
    assert r["failure_class"] is None and r["culprit_hosts"] == ["n2"], r
    assert "do not all run the same" in r["summary"], r["summary"]
    assert any(e["file"].endswith("/.images/n2") for e in r["evidence"]), r["evidence"]


@pytest.mark.cluster
def test_nodes_with_the_same_image_train_in_it(cluster, image, shared_ws, venv):
    """(4b) Both nodes resolve the name to the same ID: the agreement passes and both train in containers."""
    env = container_env(image, shared_ws, CONTAINER_RUNTIME="podman")
    job_id, log = submit(cluster, shared_ws, "tiny", "-N", "2", "--", "steps=3", **env)
    assert wait_job_end(cluster, job_id, 300) == "COMPLETED", log.read_text()[-3000:]
    for host in ("n1", "n2"):
        assert record_of(log.with_suffix(""), host)["digest"] == image["id"]
        assert log_has(log, rf"^{host}: mst-test-image: python3 is ")
        assert log_has(log, rf"^{host}: .*completed step: 2,")
    assert log_has(log, rf"^image: all 2 node\(s\) agree: runtime=podman image=\S+ digest={image['id']} ")
    assert summary(log)["status"] == "completed"
