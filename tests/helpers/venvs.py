"""Views of the project's Python environment for tests of the image stage's native-GPU rule.

A GPU node runs natively (CONTAINER_RUNTIME=none) only with an environment made for its GPUs
(`MST_ACCELERATOR=cuda|rocm utils/setup_env.sh`, recorded in `<venv>/.mst-accelerator`). Installing JAX's GPU
plugin takes GBs, and no test machine has a GPU to use it, so tests of jobs on fixture GPU nodes run with a
view of the CPU environment that carries that record: its own `pyvenv.cfg` and `bin/python` (Python finds
the environment next to the interpreter it was started as) and links to the real `lib/`, so MaxText imports
as from the real one. Only the record is not true: nothing the tests run needs the plugin.
"""

import hashlib
import shutil
from pathlib import Path

from conftest import REPO, VENV, run


def labelled_venv(dest: Path, accelerator: str) -> Path:
    """DEST: the project's environment as an environment made with MST_ACCELERATOR=ACCELERATOR. The record is
    the one utils/setup_env.sh writes (the accelerator and the hash of its pins), and setup_env.sh --check
    must find the view ready: the launchers run setup_env.sh, which would otherwise install the plugin
    through the view's lib/ link into the real environment."""
    (dest / "bin").mkdir(parents=True)
    (dest / "bin" / "python").symlink_to(VENV / "bin" / "python3")
    (dest / "bin" / "python3").symlink_to("python")
    (dest / "lib").symlink_to(VENV / "lib")
    for name in ("pyvenv.cfg", ".maxtext-slurm-stamp"):
        shutil.copy(VENV / name, dest / name)
    pins = (REPO / "requirements" / "accelerators" / f"{accelerator}.txt").read_bytes()
    (dest / ".mst-accelerator").write_text(f"{accelerator} {hashlib.sha256(pins).hexdigest()[:16]}\n")
    res = run(
        [str(REPO / "utils" / "setup_env.sh"), "--check"], env={"MAXTEXT_SLURM_VENV": str(dest), "MST_ACCELERATOR": ""}
    )
    assert res.returncode == 0, f"setup_env.sh would install into the view {dest}: {res.stderr}"
    return dest
