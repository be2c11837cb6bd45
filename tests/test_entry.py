"""utils/entry.py, the start of every thin command of utils/: the tool's modules are imported with one
OpenBLAS thread (numpy starts one per core otherwise), and nothing the tool starts inherits that."""

import os
import subprocess
import textwrap

from conftest import REPO, VENV

TOOL = """
import os, subprocess
import numpy
AT_IMPORT = (os.environ.get("OPENBLAS_NUM_THREADS", "unset"), len(os.listdir("/proc/self/task")))
def main():
    child = subprocess.run(["sh", "-c", 'echo "${OPENBLAS_NUM_THREADS-unset}"'], capture_output=True, text=True)
    print(*AT_IMPORT, child.stdout.strip())
    return 0
"""


def start(tmp_path, env: dict[str, str]) -> list[str]:
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tool.py").write_text(textwrap.dedent(TOOL))
    code = "import entry; entry.run('tool', package='pkg')"
    env = {**env, "PYTHONPATH": f"{REPO / 'utils'}:{tmp_path}"}
    res = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_a_tool_imports_numpy_on_one_thread_and_its_children_do_not_inherit_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    setting, threads, child = start(tmp_path, env)
    assert (setting, threads, child) == ("1", "1", "unset")


def test_your_own_openblas_setting_is_kept(tmp_path):
    setting, threads, child = start(tmp_path, {**os.environ, "OPENBLAS_NUM_THREADS": "2"})
    assert (setting, child) == ("2", "2")
    assert threads == "2"
