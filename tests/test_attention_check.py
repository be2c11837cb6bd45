"""The attention-kernel check (utils/launch/check_attention.py, attention_kernels.tsv): preflight fails a
job whose config asks for a kernel the trainer's interpreter cannot import (cudnn_flash_te without
Transformer Engine), with one line and the two ways out; the override attention=dot_product passes;
run_local.sh refuses before the job starts with CONTAINER_RUNTIME=none; submit.sh warns.

Transformer Engine cannot be installed here (its JAX part compiles against CUDA), so a stand-in
package stands for it: a directory transformer_engine/jax/ with __init__.py files, the layout of
NVIDIA's transformer_engine-2.20.2-py3-none-any.whl (transformer_engine/__init__.py,
transformer_engine/jax/__init__.py; PyPI "transformer-engine"). Its top __init__ raises, so a test
passes only when the check finds the module without running TE's code, as on a real node, where
that code loads CUDA libraries. What is tested is the check, not TE."""

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, VENV, launcher_env, run

from launch import check_attention
from launch.check_config import load_yaml

PREFLIGHT = REPO / "utils" / "launch" / "preflight.sh"
GPU_FIX = REPO / "tests" / "fixtures" / "gpu" / "nvidia-healthy"
FAKE_SMI_DIR = REPO / "tests" / "fixtures" / "nvidia_h100" / "bin"
TE_LINE = (
    "configs/qwen3-8b.yml asks for attention=cudnn_flash_te (Transformer Engine's fused cuDNN attention), "
    "which needs transformer_engine.jax, not installed for "
)


def stub_te(root: Path) -> Path:
    """A directory for PYTHONPATH holding the stand-in transformer_engine/jax package."""
    (root / "transformer_engine" / "jax").mkdir(parents=True)
    (root / "transformer_engine" / "__init__.py").write_text('raise ImportError("the check must not run TE")\n')
    (root / "transformer_engine" / "jax" / "__init__.py").write_text("")
    return root


def preflight(tmp_path: Path, model: str, overrides: str = "", pythonpath: str = "") -> subprocess.CompletedProcess:
    """preflight.sh on a fixture node with healthy GPUs, natively with the shared environment."""
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JOB_", "PREFLIGHT_", "MST_", "CONTAINER_")) and k not in ("PYTHONPATH", "MODEL")
    }
    env = {
        **clean,
        "MST_SYSFS_ROOT": str(GPU_FIX / "sys"),
        "MST_PROCFS_ROOT": str(GPU_FIX / "proc"),
        "MST_DEV_ROOT": str(GPU_FIX / "dev"),
        "FAKE_NVIDIA_SMI_DIR": str(GPU_FIX),
        "PATH": f"{FAKE_SMI_DIR}:{os.environ['PATH']}",
        "JOB_HOSTNAME": "n7",
        "JOB_ID": "4242",
        "JOB_DIR": str(job_dir),
        "MODEL": model,
        "TRAIN_OVERRIDES": overrides,
        "CONTAINER_RUNTIME": "none",
        "MST_VENV": str(VENV),
    }
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([str(PREFLIGHT)], env=env, capture_output=True, text=True, timeout=120)


def test_preflight_fails_cudnn_flash_te_without_transformer_engine(tmp_path):
    res = preflight(tmp_path, "qwen3-8b")
    assert res.returncode == 1
    failed = [line for line in res.stderr.splitlines() if line.startswith("preflight: FAILED: ")]
    assert len(failed) == 1, res.stderr
    line = failed[0]
    assert line.startswith(f"preflight: FAILED: {TE_LINE}{VENV}/bin/python on n7; "), line
    assert "`-- attention=dot_product`" in line and "transformer-engine[jax]" in line
    assert "jaxlib 0.12.0" in line  # the environment's own jaxlib, which TE must be built against
    report = (tmp_path / "job" / ".preflight" / "n7").read_text()
    assert report == f"FAILED: {line.removeprefix('preflight: FAILED: ')}\n"


def test_preflight_passes_with_transformer_engine_importable(tmp_path):
    res = preflight(tmp_path, "qwen3-8b", pythonpath=str(stub_te(tmp_path / "site")))
    assert res.returncode == 0, res.stderr
    assert (
        "preflight: attention: cudnn_flash_te (Transformer Engine's fused cuDNN attention, from configs/qwen3-8b.yml): "
        f"transformer_engine.jax found for {VENV}/bin/python on n7"
    ) in res.stdout.splitlines()
    assert res.stdout.splitlines()[-1] == "preflight: ok"


def test_the_dot_product_override_passes_preflight(tmp_path):
    res = preflight(tmp_path, "qwen3-8b", overrides="steps=3\nattention=dot_product")
    assert res.returncode == 0, res.stderr
    ok = "preflight: attention: dot_product (plain XLA attention, from the override attention=dot_product)"
    assert ok in res.stdout


def test_a_kernel_maxtext_does_not_know_is_refused(tmp_path):
    res = preflight(tmp_path, "tiny", overrides="attention=flash_te")
    assert res.returncode == 1
    why = "the override attention=flash_te asks for attention=flash_te, which MaxText does not know"
    assert f"preflight: FAILED: {why}" in res.stderr


def test_the_check_does_not_run_the_package(tmp_path, monkeypatch):
    """A module present on disk is found without its package's code running (the stub's raises)."""
    monkeypatch.syspath_prepend(str(stub_te(tmp_path / "site")))
    assert check_attention.module_present("transformer_engine.jax")
    assert not check_attention.module_present("transformer_engine.pytorch")
    assert not check_attention.module_present("no_such_package.jax")
    assert "transformer_engine" not in sys.modules


def test_the_table_covers_every_kernel_the_configs_use():
    table = check_attention.load_table()
    configs = (REPO / "configs").glob("*.yml")
    used = {load_yaml(str(p)).get("attention", check_attention.MAXTEXT_DEFAULT) for p in configs}
    assert {"cudnn_flash_te", "cudnn_flash_jax", "dot_product"} <= used
    assert used <= set(table), used - set(table)
    assert table["cudnn_flash_te"].modules == ("transformer_engine.jax",)


def test_the_table_names_maxtexts_kernels():
    """The kernels are MaxText's own list (validate_attention_kernel in the installed MaxText)."""
    spec = importlib.util.find_spec("maxtext")
    if spec is None:
        pytest.skip("MaxText is not installed in this interpreter")
    source = Path(spec.submodule_search_locations[0], "configs", "pyconfig_deprecated.py").read_text()
    func = next(n for n in ast.walk(ast.parse(source)) if getattr(n, "name", "") == "validate_attention_kernel")
    names = next(ast.literal_eval(n.value) for n in ast.walk(func) if isinstance(n, ast.Assign))
    assert set(check_attention.load_table()) == set(names)


def test_run_local_refuses_before_the_job_starts(workspace):
    env = launcher_env(workspace, CONTAINER_RUNTIME="none")
    res = run([str(REPO / "run_local.sh"), "qwen3-8b"], env=env, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"run_local.sh: {TE_LINE}"), lines[0]
    assert not any(workspace.iterdir())


def test_submit_warns_with_a_native_runtime(workspace):
    env = launcher_env(workspace, CONTAINER_RUNTIME="none")
    res = run([str(REPO / "submit.sh"), "qwen3-8b", "--dry-run"], env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"submit.sh: warning: {TE_LINE}" in res.stderr
    quiet = run(
        [str(REPO / "submit.sh"), "qwen3-8b", "--dry-run", "--", "attention=dot_product"],
        env=env,
        timeout=120,
    )
    assert quiet.returncode == 0 and "asks for attention" not in quiet.stderr, quiet.stderr
