"""The real podman on a private storage, and tiny images made from this machine's programs.

`private_podman(tmp_path)` yields the environment (CONTAINERS_STORAGE_CONF, CONTAINERS_CONF) of a
podman whose images and containers live under tmp_path and are removed afterwards, so tests
never touch the machine's own store. `tiny_image(env, rootfs, programs, tag)` copies each program
with the libraries ldd lists into rootfs/ (the program under /bin) and imports it as TAG.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import run


@contextmanager
def private_podman(tmp_path: Path) -> Iterator[dict[str, str]]:
    conf = tmp_path / "podman"
    conf.mkdir()
    # conmon's sockets live under runroot: a short path (a Unix socket path has at most 107 bytes; under
    # pytest's tmp_path podman waits 20 s for a container that exited and conmon could not report)
    runroot = tempfile.mkdtemp(prefix="mst-", dir="/tmp")
    (conf / "storage.conf").write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{conf}/root"\nrunroot = "{runroot}"\n')
    (conf / "containers.conf").write_text(
        '[engine]\nruntime = "runc"\n[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
    )
    env = {"CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"), "CONTAINERS_CONF": str(conf / "containers.conf")}
    try:
        yield env
    finally:
        run(["podman", "rm", "-a", "-f"], env=env)
        run(["podman", "rmi", "-a", "-f"], env=env)
        shutil.rmtree(runroot, ignore_errors=True)


def libraries(program: Path) -> set[Path]:
    """The shared libraries ldd says PROGRAM loads (absolute paths)."""
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True).stdout.split()
    return {Path(p) for p in out if p.startswith("/")}


def tiny_image(env: dict[str, str], rootfs: Path, programs: list[str], tag: str) -> None:
    for prog in programs:
        path = Path(shutil.which(prog) or f"/bin/{prog}").resolve()
        for f in {path} | libraries(path):
            dest = rootfs / "bin" / Path(prog).name if f == path else rootfs / str(f).lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dest)
    tar = rootfs.parent / f"{rootfs.name}.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    res = run(["podman", "import", str(tar), tag], env=env)
    assert res.returncode == 0, res.stderr
