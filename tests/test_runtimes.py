"""The image stage's Apptainer and Pyxis/enroot runtimes (utils/launch/runtimes/), against recorded command lines.

No package provides apptainer, singularity or enroot here, so a stand-in (tests/fixtures/runtimes/fake_runtime,
installed on PATH under the CLI's name) records the argv and the variables each would carry into the
container, and answers as the documented CLI does. The expected command lines live in
tests/fixtures/runtimes/<cli>.txt, each with the documentation page it follows (the Apptainer user guide,
NVIDIA/enroot's doc/). GPU nodes are fixture /dev trees (MST_DEV_ROOT: an empty `nvidiactl` or `kfd`, as in
tests/test_image_stage.py) with an `infiniband/` directory and tests/fixtures/sysfs/host-libs as the host's
verbs libraries (MST_HOST_ROOT), which utils/launch/netenv.sh --container-args turns into binds.
"""

import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

IMAGE_SH = str(REPO / "utils" / "launch" / "image.sh")
CONTAINER_SH = str(REPO / "_container.sh")
FIX = REPO / "tests" / "fixtures" / "runtimes"
HOST_LIBS = REPO / "tests" / "fixtures" / "sysfs" / "host-libs"
LIB = "/usr/lib/x86_64-linux-gnu"
SECRET = "hf_NotARealTokenButSecretLooking123"


def expected(cli: str) -> dict[str, str]:
    """The fixture's NAME: LINE entries."""
    lines = (FIX / f"{cli}.txt").read_text().splitlines()
    return dict(ln.split(": ", 1) for ln in lines if ln and not ln.startswith("#"))


def rdma_binds() -> list[str]:
    """What netenv.sh --container-args gives for the host-libs fixture (tests/test_netenv.py checks it), as
    SRC:DST[:ro]: the device directory, then the verbs configuration and libraries, read-only."""
    libs = [("libibverbs.so.1", "libibverbs.so.1.15.61.0"), ("libibverbs.so.1.15.61.0", "libibverbs.so.1.15.61.0"),
            ("libibverbs", "libibverbs"), ("libmlx5.so.1", "libmlx5.so.1.25.61.0"),
            ("libmlx5.so.1.25.61.0", "libmlx5.so.1.25.61.0"), ("libionic.so.1", "libionic.so.1.0.61.0"),
            ("libionic.so.1.0.61.0", "libionic.so.1.0.61.0"), ("libefa.so.1", "libefa.so.1.4.61.0"),
            ("libefa.so.1.4.61.0", "libefa.so.1.4.61.0")]  # fmt: skip
    return [f"{HOST_LIBS}/etc/libibverbs.d:/etc/libibverbs.d:ro"] + [
        f"{HOST_LIBS}{LIB}/{real}:{LIB}/{link}:ro" for link, real in libs
    ]


class Node:
    """One node of a job: a fixture /dev, the job directory in a workspace, the fake runtimes on PATH."""

    def __init__(self, tmp: Path, clis: tuple[str, ...], gpu: str = "", host: str = "node1") -> None:
        self.tmp, self.host = tmp, host
        self.ws = tmp / "ws"
        self.job_dir = self.ws / "7-JAX-tiny"
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.dev = tmp / f"dev-{host}"
        (self.dev / "infiniband").mkdir(parents=True, exist_ok=True)
        if gpu:
            (self.dev / gpu).touch()
        self.bin = tmp / f"bin-{'-'.join(clis) or 'none'}"
        if not self.bin.exists():
            self.bin.mkdir()
            for cli in clis:
                (self.bin / cli).symlink_to(FIX / "fake_runtime")
        self.log = tmp / "calls.jsonl"
        self.data = tmp / "data"
        self.data.mkdir(exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment (the variables a node's stage would have), so the passed names are known."""
        return {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.tmp),
            "TMPDIR": str(self.tmp),
            "MST_REPO": str(REPO),
            "JOB_WORKSPACE": str(self.ws),
            "JOB_DIR": str(self.job_dir),
            "JOB_ID": "7",
            "JOB_SCHEDULER": "local",
            "JOB_HOSTNAME": self.host,
            "JOB_NODELIST": "node1 node2",
            "TRAIN_ENV_OVERRIDES": f"HF_TOKEN={SECRET}\n",
            "MST_DEV_ROOT": str(self.dev),
            "MST_HOST_ROOT": str(HOST_LIBS),
            "CONTAINER_MOUNTS": f"{self.data}:/data:ro",
            "FAKE_RUNTIME_LOG": str(self.log),
            **extra,
        }

    def run(self, cmd: list[str], umask: int = 0o022, **extra: str) -> subprocess.CompletedProcess:
        """CMD on this node; its soft locked-memory limit 0 (the runtime must get what netenv.sh allows)."""
        hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]

        def node_limits() -> None:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, hard))
            os.umask(umask)

        return subprocess.run(cmd, env=self.env(**extra), capture_output=True, text=True, timeout=60, check=False,
                              preexec_fn=node_limits)  # fmt: skip

    def calls(self) -> list[dict]:
        return [json.loads(ln) for ln in self.log.read_text().splitlines()] if self.log.exists() else []

    def record(self) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in (self.job_dir / ".images" / self.host).read_text().split())


def matches(call: dict, line: str, **values: str) -> None:
    """The recorded argv is the fixture's line with the test's values ({PART}: the stage's partial file)."""
    got = " ".join(call["argv"])
    pattern = re.escape(line)
    for name, value in values.items():
        pattern = pattern.replace(re.escape("{" + name + "}"), re.escape(value))
    pattern = pattern.replace(re.escape("{PART}"), r"\S+/\.images/\.image\.\d+\.(sif|sqsh)")
    assert re.fullmatch(pattern, got), f"\n got: {got}\nwant: {line}"


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


# --- the image: import, pull, a file as it is -----------------------------------------------------------------


def test_apptainer_builds_the_image_once_from_a_saved_tar(tmp_path):
    """Rank 0 builds $JOB_DIR/.images/image.sif from CONTAINER_IMAGE_TAR (docker-archive:) and records its
    sha256; rank 1 builds nothing, waits for it, and records the same bytes."""
    tar = tmp_path / "maxtext.tar"
    tar.write_text("a docker save archive\n")
    want = expected("apptainer")
    n1 = Node(tmp_path, ("apptainer",), gpu="nvidiactl")
    # a group-writable umask (002): the built file is still one the other nodes trust
    res = n1.run([IMAGE_SH], umask=0o002, CONTAINER_RUNTIME="apptainer", CONTAINER_IMAGE_TAR=str(tar),
                 JOB_NODE_RANK="0")  # fmt: skip
    assert res.returncode == 0, res.stderr
    sif = n1.job_dir / ".images" / "image.sif"
    assert n1.record() == {"runtime": "apptainer", "image": str(sif), "digest": sha256(sif), "source": "tar"}
    assert sif.read_text() == f"apptainer image of docker-archive:{tar}\n"
    builds = [c for c in n1.calls() if c["argv"][0] == "build"]
    assert len(builds) == 1
    matches(builds[0], want["build-tar"], TAR=str(tar))
    assert [c["argv"] for c in n1.calls() if c["argv"][0] != "build"] == [want["version"].split()] * 2

    n2 = Node(tmp_path, ("apptainer",), gpu="nvidiactl", host="node2")
    res = n2.run([IMAGE_SH], CONTAINER_RUNTIME="singularity", CONTAINER_IMAGE_TAR=str(tar), JOB_NODE_RANK="1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"image: waiting for node1 (rank 0) to build {sif}\n"), res.stdout
    assert len([c for c in n2.calls() if c["argv"][0] == "build"]) == 1  # still only rank 0's
    assert n2.record()["digest"] == sha256(sif)
    res = n1.run([IMAGE_SH, "--agree"])
    assert res.returncode == 0 and res.stdout.startswith("image: all 2 node(s) agree: runtime=apptainer"), res.stdout


def test_apptainer_pulls_with_the_credentials_file_by_path(tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text('{"auths": {"registry.example": {"auth": "c2VjcmV0"}}}')
    auth.chmod(0o600)
    node = Node(tmp_path, ("apptainer",), gpu="kfd")
    image = "registry.example/team/maxtext:1"
    res = node.run([IMAGE_SH], CONTAINER_RUNTIME="apptainer", CONTAINER_IMAGE=image, CONTAINER_AUTH_FILE=str(auth))
    assert res.returncode == 0, res.stderr
    pull = [c for c in node.calls() if c["argv"][0] == "pull"]
    matches(pull[0], expected("apptainer")["pull"], AUTH=str(auth), IMAGE=image)
    assert "c2VjcmV0" not in json.dumps(node.calls()) + res.stdout + res.stderr
    assert node.record()["source"] == "pull"


def test_a_failed_build_is_one_line_and_the_other_nodes_stop_waiting(tmp_path):
    n1 = Node(tmp_path, ("apptainer",), gpu="nvidiactl")
    image = "registry.example/fail/maxtext:1"
    res = n1.run([IMAGE_SH], CONTAINER_RUNTIME="apptainer", CONTAINER_IMAGE=image)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"image: FAILED: apptainer could not build {n1.job_dir}/.images/image.sif on node1: ")
    assert "unauthorized: authentication required" in res.stderr
    assert not list((n1.job_dir / ".images").glob("*.sif")) and not (n1.job_dir / ".images" / "node1").exists()
    n2 = Node(tmp_path, ("apptainer",), gpu="nvidiactl", host="node2")
    res = n2.run([IMAGE_SH], CONTAINER_RUNTIME="apptainer", CONTAINER_IMAGE=image, JOB_NODE_RANK="1")
    assert res.returncode == 1 and "image: FAILED: node1 (rank 0) could not build" in res.stderr, res.stderr


def test_auto_runs_a_sif_or_sqsh_file_as_it_is(tmp_path):
    """CONTAINER_IMAGE=/path/x.sif under auto: apptainer (podman is not asked); x.sqsh: enroot."""
    for suffix, cli, runtime in (("sif", "apptainer", "apptainer"), ("sqsh", "enroot", "enroot")):
        node = Node(tmp_path / suffix, ("apptainer", "enroot"), gpu="nvidiactl")
        image = tmp_path / f"site.{suffix}"
        image.write_text(f"the site's {suffix}\n")
        res = node.run([IMAGE_SH], CONTAINER_IMAGE=str(image))
        assert res.returncode == 0, res.stderr
        assert node.record() == {"runtime": runtime, "image": str(image), "digest": sha256(image), "source": "file"}
        assert [c["cli"] for c in node.calls()] == [cli]  # only its version check: nothing built


def test_enroot_imports_from_the_registry(tmp_path):
    node = Node(tmp_path, ("enroot",), gpu="nvidiactl")
    res = node.run([IMAGE_SH], CONTAINER_RUNTIME="pyxis", CONTAINER_IMAGE="nvcr.io/nvidia/jax:25.04")
    assert res.returncode == 0, res.stderr
    sqsh = node.job_dir / ".images" / "image.sqsh"
    assert node.record() == {"runtime": "enroot", "image": str(sqsh), "digest": sha256(sqsh), "source": "pull"}
    want = expected("enroot")
    calls = node.calls()
    assert calls[0]["argv"] == want["version"].split()
    matches(calls[-1], want["pull"])


def test_enroot_refuses_an_auth_json(tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text("{}")
    auth.chmod(0o600)
    node = Node(tmp_path, ("enroot",), gpu="nvidiactl")
    res = node.run([IMAGE_SH], CONTAINER_RUNTIME="enroot", CONTAINER_IMAGE="nvcr.io/nvidia/jax:25.04",
                   CONTAINER_AUTH_FILE=str(auth))  # fmt: skip
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "$ENROOT_CONFIG_PATH/.credentials (netrc format)" in res.stderr
    assert not [c for c in node.calls() if c["argv"][0] == "import"]


def test_runtime_not_installed(tmp_path):
    node = Node(tmp_path, ())
    res = node.run([IMAGE_SH], CONTAINER_RUNTIME="apptainer", CONTAINER_IMAGE=str(tmp_path / "x.sif"))
    assert res.returncode == 1 and res.stderr == (
        "image: FAILED: CONTAINER_RUNTIME=apptainer but not installed (nor singularity) on node1; "
        "install it, or use CONTAINER_RUNTIME=auto\n"
    )


def test_nodes_with_different_sif_files_disagree(tmp_path):
    for host, content in (("node1", "build A\n"), ("node2", "build B\n")):
        sif = tmp_path / f"{host}.sif"
        sif.write_text(content)
        node = Node(tmp_path, ("apptainer",), gpu="nvidiactl", host=host)
        assert node.run([IMAGE_SH], CONTAINER_IMAGE=str(sif)).returncode == 0
    res = node.run([IMAGE_SH, "--agree"])
    assert res.returncode == 1, res.stdout
    b = sha256(tmp_path / "node2.sif")
    assert re.search(rf"^image:   node2 +runtime=apptainer image=\S+node2.sif digest={b} source=file  <- differs$",
                     res.stdout, re.M), res.stdout  # fmt: skip
    assert res.stderr.startswith("image: FAILED: the nodes do not all run the same runtime and image: node2 differ(s)")


def test_cleanup_removes_only_what_the_job_built(tmp_path):
    tar = tmp_path / "maxtext.tar"
    tar.write_text("archive\n")
    node = Node(tmp_path, ("apptainer",), gpu="nvidiactl")
    assert node.run([IMAGE_SH], CONTAINER_RUNTIME="apptainer", CONTAINER_IMAGE_TAR=str(tar)).returncode == 0
    own = tmp_path / "site.sif"  # a user's image file is never the job's to remove
    own.write_text("site\n")
    images = node.job_dir / ".images"
    (images / ".image.99.sif").write_text("a build cut short\n")
    res = node.run([IMAGE_SH, "--cleanup"])
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in images.iterdir()) == ["node1"] and own.exists()
    assert f"image: removing {images}/image.sif (built for the job)" in res.stdout.splitlines()
    assert node.run([IMAGE_SH, "--cleanup"]).returncode == 0  # nothing left: nothing to do


# --- the train stage: _container.sh runs the recorded file ------------------------------------------------------


def staged(tmp_path: Path, cli: str, gpu: str, extra_bin: tuple[str, ...] = ()) -> tuple[Node, Path]:
    if platform.machine() != "x86_64":
        pytest.skip("the host-libs fixture has the x86_64 Debian layout")
    node = Node(tmp_path, (cli, *extra_bin), gpu=gpu)
    image = tmp_path / f"site.{'sif' if cli == 'apptainer' else 'sqsh'}"
    image.write_text("image\n")
    res = node.run([IMAGE_SH], CONTAINER_IMAGE=str(image))
    assert res.returncode == 0, res.stderr
    node.log.unlink()
    return node, image


def check_env(node: Node, call: dict, names: list[str]) -> None:
    """Exactly the contract's names reach the container, with their values, and no value is in argv."""
    assert list(call["env"]) == names, call["env"]
    assert call["env"]["TRAIN_ENV_OVERRIDES"] == f"HF_TOKEN={SECRET}\n" and call["env"]["JOB_ID"] == "7"
    assert SECRET not in " ".join(call["argv"])


@pytest.mark.parametrize(("gpu", "kind"), [("nvidiactl", "nvidia"), ("kfd", "amd")])
def test_apptainer_exec(tmp_path, gpu, kind):
    node, sif = staged(tmp_path, "apptainer", gpu)
    res = node.run([CONTAINER_SH, "_train.sh", "--print-env"])
    assert res.returncode == 0 and res.stdout == "fake-apptainer: ran\n", res.stderr
    assert f"_container.sh: apptainer image {sif} ({sha256(sif)})" in res.stderr
    (call,) = [c for c in node.calls() if c["argv"][0] == "exec"]
    want = expected("apptainer")
    rdma = " ".join(f"--bind {b}" for b in [f"{node.dev}/infiniband:/dev/infiniband", *rdma_binds()])
    matches(call, want[f"exec-{kind}"], REPO=str(REPO), WS=str(node.ws), DATA=str(node.data), SIF=str(sif), RDMA=rdma)
    names = want["env"].split()
    check_env(node, {**call, "env": dict(sorted(call["env"].items(), key=lambda kv: names.index(kv[0])))}, names)
    # the RDMA devices' locked memory (netenv.sh: the hard limit here, or unlimited where allowed)
    assert call["memlock"] == resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] != 0


@pytest.mark.parametrize(("gpu", "kind"), [("nvidiactl", "nvidia"), ("kfd", "amd")])
def test_enroot_start_of_the_image(tmp_path, gpu, kind):
    """With squashfuse and fuse-overlayfs (stand-ins: only their presence is looked at) the .sqsh starts as is."""
    node, sqsh = staged(tmp_path, "enroot", gpu)
    for tool in ("squashfuse", "fuse-overlayfs"):
        (node.bin / tool).symlink_to(shutil.which("true") or "/bin/true")
    res = node.run([CONTAINER_SH, "_train.sh", "--print-env"])
    assert res.returncode == 0 and res.stdout == "fake-enroot: ran\n", res.stderr
    (call,) = node.calls()
    rdma = " ".join(f"--mount {m}" for m in enroot_mounts([f"{node.dev}/infiniband:/dev/infiniband", *rdma_binds()]))
    matches(call, expected("enroot")[f"exec-{kind}"], REPO=str(REPO), WS=str(node.ws), DATA=str(node.data),
            SQSH=str(sqsh), RDMA=rdma)  # fmt: skip
    names = expected("apptainer")["env"].split() + (["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"] if
                                                    kind == "nvidia" else [])  # fmt: skip
    check_env(node, call, names)
    if kind == "nvidia":
        assert call["env"]["NVIDIA_VISIBLE_DEVICES"] == "all"


def enroot_mounts(binds: list[str]) -> list[str]:
    out = []
    for b in binds:
        src, dst, *opt = b.split(":")
        out.append(f"{src}:{dst}:none:x-create=auto,rbind{',' + opt[0] if opt else ''}")
    return out


def test_enroot_unpacks_and_removes_its_container_without_fuse(tmp_path):
    """Without squashfuse/fuse-overlayfs: create in a private ENROOT_DATA_PATH, start, remove, and the
    directory is gone; the command's exit status is the stage's."""
    if shutil.which("squashfuse") and shutil.which("fuse-overlayfs"):
        pytest.skip("squashfuse and fuse-overlayfs are installed here")
    node, sqsh = staged(tmp_path, "enroot", "nvidiactl")
    res = node.run([CONTAINER_SH, "_train.sh", "--print-env"], FAKE_RUNTIME_RC="3")
    assert res.returncode == 3, res.stderr
    calls = node.calls()
    assert [c["argv"][0] for c in calls] == ["create", "start", "remove"]
    want = expected("enroot")
    values = {"JOB_ID": "7", "HOST": "node1", "SQSH": str(sqsh), "REPO": str(REPO), "WS": str(node.ws),
              "DATA": str(node.data)}  # fmt: skip
    matches(calls[0], want["create"], **values)
    rdma = " ".join(f"--mount {m}" for m in enroot_mounts([f"{node.dev}/infiniband:/dev/infiniband", *rdma_binds()]))
    matches(calls[1], want["start-created"], RDMA=rdma, **values)
    matches(calls[2], want["remove"], **values)
    data = Path(calls[1]["ENROOT_DATA_PATH"])
    assert data.parent == tmp_path and not data.exists()  # the unpacked root file system went with it


def test_a_record_naming_a_missing_file_is_refused(tmp_path):
    node, sif = staged(tmp_path, "apptainer", "nvidiactl")
    sif.unlink()
    res = node.run([CONTAINER_SH, "_train.sh"])
    assert res.returncode == 1 and "names no image file" in res.stderr and not node.log.exists(), res.stderr
    assert os.path.exists(node.job_dir / ".images" / "node1")


# --- a whole job ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.heavy
def test_a_job_trains_through_apptainer_and_removes_the_image_it_built(workspace, venv, tmp_path):
    """run_local.sh with CONTAINER_RUNTIME=apptainer and a saved archive: the image stage builds image.sif,
    the train stage goes through `apptainer exec` (the stand-in runs the command with only the
    APPTAINERENV_ variables, the project's environment standing in for the image's python3) and trains;
    at the job's end the built file is gone, the record stays."""
    tar = tmp_path / "maxtext.tar"
    tar.write_text("archive\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").symlink_to(FIX / "fake_runtime")
    env = {
        "MAXTEXT_SLURM_VENV": str(venv),
        "JOB_WORKSPACE": str(workspace),
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "CONTAINER_RUNTIME": "apptainer",
        "CONTAINER_IMAGE_TAR": str(tar),
        "FAKE_RUNTIME_PATH": f"{venv}/bin:/usr/bin:/bin",
    }
    res = subprocess.run([str(REPO / "run_local.sh"), "tiny", "--", "steps=2"], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    (log,) = workspace.glob("local-*-JAX-*.log")
    text = log.read_text()
    assert res.returncode == 0, text[-3000:]
    job_dir = log.with_suffix("")
    sif = job_dir / ".images" / "image.sif"
    host = os.uname().nodename
    for pattern in (rf"^{host}: image: building {re.escape(str(sif))} with apptainer from {re.escape(str(tar))}$",
                    rf"^{host}: _container.sh: apptainer image {re.escape(str(sif))} \(sha256:[0-9a-f]{{64}}\)$",
                    rf"^{host}: fake-apptainer: running \S+/_train.sh from {re.escape(str(sif))}$",
                    rf"^{host}: .*completed step: 1,",
                    rf"^image: removing {re.escape(str(sif))} \(built for the job\)$"):  # fmt: skip
        assert re.search(pattern, text, re.M), pattern
    assert "status: completed" in text
    assert not sif.exists() and (job_dir / ".images" / host).exists()
