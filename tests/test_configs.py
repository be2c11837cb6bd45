"""Every configs/*.yml goes through MaxText's own config parser, the way the trainer loads it.

A typo in a GPU config should fail here, on a CPU-only CI machine, rather than on the first step
of a 64-node job. One worker process (this file run as a script, with the pinned venv's Python)
imports MaxText once and, for every config:

1. calls ``pyconfig.initialize(["", CONFIG, "skip_jax_distributed_system=true"])`` and then
   ``train_utils.validate_train_config``: the two checks ``maxtext.trainers.pre_train.train``
   runs before training. The one extra key keeps this lone process from trying to join a JAX
   cluster (on the cluster the trainer joins one from JAX_COORDINATOR_IP, NNODES and NODE_RANK).
   Nothing in the config is changed: ``hardware: gpu`` configs load as they are without a GPU;
2. builds the model abstractly (``jax.eval_shape``: shapes only, no weights allocated) and counts
   its parameters. This step alone sets ``attention=dot_product``, because the GPU kernels
   (Transformer Engine, cuDNN) cannot be traced without a GPU; the kernel does not change any
   parameter shape. It catches what the parser accepts but the model code rejects, such as an
   unknown remat_policy;
3. fills the mesh with MaxText's own ``fill_unspecified_mesh_axes`` for 8 GPUs per node at the
   node counts the config's header names (the parser leaves -1 axes alone, and on one CPU
   device a mistake here would only surface on the cluster).

Running the worker in its own process keeps MaxText's side effects (JAX backend and compilation
cache settings, logging, environment variables) out of the pytest process. The env files are
checked with ``bash -n``, for the export-only format, and by starting XLA's CPU backend with their
XLA_FLAGS, which aborts on an unknown flag or a malformed value.

Run: .venv/bin/python -m pytest tests/test_configs.py  (about 30 s on 2 cores; JAX_PLATFORMS=cpu is forced)
Every test that needs the worker or XLA is marked slow; the fast loop keeps the file-level checks.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import math
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import yaml

from launch import config_header

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yml"))
ENV_FILES = sorted(p for p in CONFIG_DIR.glob("*.env.sh") if p.name != "site.env.sh")  # site settings: no model

GPUS_PER_NODE = 8
GPU_HARDWARE = ("gpu", "gpu_multiprocess")
# MaxText accepts any string for `attention` and only fails in the first training step, so the
# GPU kernels this project uses are listed here.
GPU_ATTENTION = ("cudnn_flash_te", "cudnn_flash_jax", "dot_product")
# The fp32 weights, gradients and Adam moments at the header's minimum node count may take at most
# this share of GPU memory; the rest is for activations, gathered layers and NCCL/RCCL buffers.
STATE_MEMORY_SHARE = 0.6
PARAMS_TOLERANCE = 0.02
EXPORT_RE = re.compile(r"^export [A-Za-z_][A-Za-z0-9_]*=\S")
TIMEOUT_S = 900


# --------------------------------------------------------------------------------------------
# Worker: runs in its own process with MaxText imported (python tests/test_configs.py --worker).
# --------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """JSON-friendly form of a parsed config value (tuples to lists, dtypes to their names)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(getattr(value, "value", None), str):  # enums (decoder_block, ...)
        return value.value
    name = getattr(value, "name", None)  # numpy/jax dtypes
    return name if isinstance(name, str) else str(value)


def _error(e: BaseException) -> dict[str, str]:
    # pyconfig turns errors into SystemExit(2) when pytest is not imported; the cause is kept.
    if isinstance(e, SystemExit) and e.__context__ is not None:
        e = e.__context__
    message = str(e) or repr(e)
    unknown = re.match(r"'(\w+)' not in ((?:'\w+', )*'\w+')", message)
    if unknown:  # MaxText lists every valid key; name the closest ones instead
        valid = re.findall(r"'(\w+)'", unknown.group(2))
        close = difflib.get_close_matches(unknown.group(1), valid, n=3)
        message = f"unknown key {unknown.group(1)!r}" + (
            f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        )
    elif len(message) > 1500:
        message = message[:1500] + " ..."
    frames = "".join(traceback.format_tb(e.__traceback__)[-4:])
    return {"type": type(e).__name__, "message": message, "traceback": frames}


def _check_config(job: dict[str, Any]) -> dict[str, Any]:
    """Parse, build and mesh-check one config; never raises."""
    import jax
    import omegaconf
    from maxtext.common.common_types import MODEL_MODE_TRAIN
    from maxtext.configs import pyconfig
    from maxtext.layers import quantizations
    from maxtext.models import models
    from maxtext.utils import max_utils, maxtext_utils, train_utils

    path = job["path"]
    argv = ["", path, "skip_jax_distributed_system=true"]
    out: dict[str, Any] = {"parse_error": None, "model_error": None, "mesh": {}}
    try:
        cfg = pyconfig.initialize(argv)
        train_utils.validate_train_config(cfg)
    except BaseException as e:  # the error is the result
        out["parse_error"] = _error(e)
        return out
    keys = cfg.get_keys()
    own = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(path), resolve=True)
    out["own_keys"] = {k: _plain(keys.get(k, "<missing>")) for k in own if k != "base_config"}
    for k in ("model_name", "attention", "num_experts"):
        out[k] = _plain(keys[k])
    # Bytes per parameter of the training state: weights, gradients, Adam mu and nu (nu has the
    # weights' dtype in optax).
    out["state_bytes_per_param"] = 2 * cfg.weight_dtype.itemsize + cfg.grad_dtype.itemsize + cfg.mu_dtype.itemsize
    for nodes in job.get("nodes", []):
        try:
            ici = max_utils.fill_unspecified_mesh_axes(list(cfg.ici_parallelism), GPUS_PER_NODE, "ICI")
            shape = dict(zip(cfg.mesh_axes, ici, strict=True))
            if nodes > 1:  # MaxText uses the DCN axes only with more than one slice (node)
                dcn = max_utils.fill_unspecified_mesh_axes(list(cfg.dcn_parallelism), nodes, "DCN")
                shape = {a: i * d for (a, i), d in zip(shape.items(), dcn, strict=True)}
            out["mesh"][str(nodes)] = {"shape": {a: n for a, n in shape.items() if n > 1}, "error": None}
        except BaseException as e:
            out["mesh"][str(nodes)] = {"shape": None, "error": str(e) or repr(e)}
    if not job.get("build_model", True):
        return out
    try:
        # The GPU attention kernels cannot be traced on a CPU; the kernel changes no parameter.
        mcfg = pyconfig.initialize([*argv, "attention=dot_product"])
        mesh = jax.sharding.Mesh(maxtext_utils.create_device_mesh(mcfg), mcfg.mesh_axes)
        quant = quantizations.configure_quantization(mcfg)
        model = models.transformer_as_linen(mcfg, mesh, quant=quant, model_mode=MODEL_MODE_TRAIN)
        abstract = maxtext_utils.get_abstract_param(model, mcfg)
        out["params"] = int(max_utils.calculate_num_params_from_pytree(abstract["params"]))
    except BaseException as e:
        out["model_error"] = _error(e)
    return out


def worker_main() -> int:
    """Read {"jobs": {id: job}} on stdin, write {id: result} as JSON on stdout."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("maxtext").setLevel(logging.WARNING)
    jobs = json.load(sys.stdin)["jobs"]
    results = {job_id: _check_config(job) for job_id, job in jobs.items()}
    sys.stdout.flush()
    print("\n@@RESULTS@@" + json.dumps(results))
    return 0


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def _load_yaml(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    assert isinstance(data, dict), f"{path.name} is not a YAML mapping"
    return data


def _try_yaml(path: Path) -> dict[str, Any]:
    """The config as a mapping, or {} when it is not valid YAML (test_config_loads reports that)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _is_gpu_config(path: Path) -> bool:
    """A config for GPU clusters: not hardware: cpu, and not pinned to the CPU by its env file
    (tiny.yml keeps hardware: gpu for MaxText's multi-process path but runs with JAX_PLATFORMS=cpu)."""
    if _try_yaml(path).get("hardware") not in GPU_HARDWARE:
        return False
    env_file = path.with_name(path.stem + ".env.sh")
    env_text = env_file.read_text(encoding="utf-8") if env_file.is_file() else ""
    return not re.search(r"^\s*export JAX_PLATFORMS=[\"']?cpu[\"']?\s*$", env_text, re.M)


GPU_CONFIGS = [p for p in CONFIGS if _is_gpu_config(p)]


def _header(path: Path) -> tuple[float | None, tuple[config_header.NodeMinimum, ...]]:
    """Parameter count (billions) and the minimum node entries from the comment header."""
    head = config_header.read_header(path)
    return head.params_b, head.min_nodes


def _node_counts(path: Path) -> list[int]:
    _, nodes = _header(path)
    if not nodes:
        return []
    return sorted({m.nodes for m in nodes} | {2 * max(m.nodes for m in nodes)})


def _broken_copies(tmp: Path, paths: list[Path], beyond: bool) -> dict[str, dict[str, Any]]:
    """Deliberately broken variants of paths (and, with beyond, of the first GPU config for the checks
    beyond the parser): the harness must be able to fail."""
    jobs: dict[str, dict[str, Any]] = {}
    for path in paths:
        data = _try_yaml(path)
        typo = {("per_device_batch_sizee" if k == "per_device_batch_size" else k): v for k, v in data.items()}
        typo.setdefault("per_device_batch_sizee", 1)
        f = tmp / f"typo-{path.name}"
        f.write_text(yaml.safe_dump(typo, sort_keys=False), encoding="utf-8")
        jobs[f"typo:{path.stem}"] = {"path": str(f), "build_model": False}
        f = tmp / f"badyaml-{path.name}"
        f.write_text(path.read_text(encoding="utf-8") + "steps: [50\n", encoding="utf-8")
        jobs[f"badyaml:{path.stem}"] = {"path": str(f), "build_model": False}
    if not beyond:
        return jobs
    # A value the parser accepts but the model code rejects.
    gpu = GPU_CONFIGS or CONFIGS
    data = {**_try_yaml(gpu[0]), "remat_policy": "fulll"}
    f = tmp / f"remat-{gpu[0].name}"
    f.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    jobs["remat"] = {"path": str(f)}
    # Two unspecified (-1) DCN axes: only the mesh check can see it.
    data = {**_try_yaml(gpu[0]), "dcn_data_parallelism": -1, "dcn_fsdp_parallelism": -1}
    f = tmp / f"mesh-{gpu[0].name}"
    f.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    jobs["mesh"] = {"path": str(f), "build_model": False, "nodes": [2]}
    return jobs


def _worker_env() -> dict[str, str]:
    # M_<KEY> variables override MaxText config keys; keep them (and stray XLA/JAX settings) out.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("M_", "XLA_", "JAX_", "LIBTPU_", "TPU_")) and k != "PYTHONPATH"
    }
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return env


def _selected(session: pytest.Session) -> dict[str, set[str]]:
    """test name -> the config stems its selected tests of this module read ("" for one without a path):
    `pytest tests/test_configs.py -k llama3.1-8b` (the model-config-guide skill's check) loads that
    config alone, not all of them (~10 CPU-s less)."""
    out: dict[str, set[str]] = {}
    for item in session.items:
        if isinstance(item, pytest.Function) and item.module.__name__ == __name__:
            path = item.callspec.params.get("path") if hasattr(item, "callspec") else None
            out.setdefault(item.originalname, set()).add(path.stem if isinstance(path, Path) else "")
    return out


@pytest.fixture(scope="module")
def results(
    venv: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> dict[str, dict[str, Any]]:
    """Results of the one worker process for the selected tests' configs and broken copies."""
    tmp = tmp_path_factory.mktemp("configs")
    chosen = _selected(request.session)
    parsed = chosen.get("test_config_loads", set())
    built = chosen.get("test_model_builds", set()) | chosen.get("test_gpu_config_contract", set())
    jobs: dict[str, dict[str, Any]] = {
        f"config:{p.stem}": {"path": str(p), "nodes": _node_counts(p), "build_model": p.stem in built}
        for p in CONFIGS
        if p.stem in parsed | built
    }
    broken = [p for p in CONFIGS if p.stem in chosen.get("test_broken_copies_are_rejected", set())]
    jobs.update(_broken_copies(tmp, broken, "test_checks_beyond_the_parser_can_fail" in chosen))
    proc = subprocess.run(
        [str(venv / "bin/python"), str(Path(__file__).resolve()), "--worker"],
        input=json.dumps({"jobs": jobs}),
        capture_output=True,
        text=True,
        cwd=tmp,  # MaxText derives a local output directory from the working directory
        env=_worker_env(),
        timeout=TIMEOUT_S,
        check=False,
    )
    marker = "\n@@RESULTS@@"
    assert proc.returncode == 0 and marker in proc.stdout, (
        f"config worker failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return json.loads(proc.stdout.rsplit(marker, 1)[1])


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _parsed(results: dict[str, dict[str, Any]], path: Path) -> dict[str, Any]:
    res = results[f"config:{path.stem}"]
    err = res["parse_error"]
    if err:
        pytest.fail(f"MaxText rejects {path.name}: {err['type']}: {err['message']}\n{err['traceback']}", pytrace=False)
    return res


def test_there_are_gpu_configs() -> None:
    assert GPU_CONFIGS, "no GPU configs in configs/"


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=_ids(CONFIGS))
def test_config_loads(results: dict[str, dict[str, Any]], path: Path) -> None:
    res = _parsed(results, path)
    data = _load_yaml(path)
    assert data.get("base_config") == "base.yml", 'configs inherit MaxText\'s packaged base: base_config: "base.yml"'
    model = data.get("model_name", "default")
    assert res["model_name"] == model
    if model != "default":
        assert path.stem.startswith(model), f"{path.name} loads the MaxText preset {model!r}: name the file after it"
    # The parser merges base.yml < this file < the model preset: a key set here that the preset
    # also sets is silently replaced. Every key written in the file must survive as written.
    changed = {
        k: (v, res["own_keys"][k]) for k, v in data.items() if k != "base_config" and not _same(v, res["own_keys"][k])
    }
    why = (
        f"; the MaxText preset models/{model}.yml wins over the file for the keys it sets" if model != "default" else ""
    )
    assert not changed, f"keys of {path.name} do not take effect (file value, parsed value): {changed}{why}"


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=_ids(CONFIGS))
def test_model_builds(results: dict[str, dict[str, Any]], path: Path) -> None:
    res = _parsed(results, path)
    err = res["model_error"]
    if err:
        pytest.fail(
            f"MaxText cannot build the model of {path.name}: {err['type']}: {err['message']}\n{err['traceback']}"
        )
    assert res["params"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=_ids(CONFIGS))
def test_broken_copies_are_rejected(results: dict[str, dict[str, Any]], path: Path) -> None:
    typo = results[f"typo:{path.stem}"]["parse_error"]
    assert typo is not None, f"a copy of {path.name} with per_device_batch_sizee was accepted"
    assert "per_device_batch_sizee" in typo["message"]
    bad = results[f"badyaml:{path.stem}"]["parse_error"]
    assert bad is not None, f"a copy of {path.name} with invalid YAML was accepted"
    assert "yaml" in (bad["type"] + bad["traceback"]).lower()


@pytest.mark.slow
def test_checks_beyond_the_parser_can_fail(results: dict[str, dict[str, Any]]) -> None:
    remat = results["remat"]
    assert remat["parse_error"] is None, "the parser was expected to accept remat_policy: fulll"
    assert remat["model_error"] is not None and "remat" in remat["model_error"]["message"].lower()
    mesh = results["mesh"]["mesh"]["2"]
    assert mesh["error"] is not None, "two -1 DCN axes were expected to be rejected"


@pytest.mark.slow
@pytest.mark.parametrize("path", GPU_CONFIGS, ids=_ids(GPU_CONFIGS))
def test_gpu_config_contract(results: dict[str, dict[str, Any]], path: Path) -> None:
    """Header, attention kernel, defaults, mesh and memory of a GPU config."""
    res = _parsed(results, path)
    data = _load_yaml(path)
    params_b, nodes = _header(path)
    assert params_b is not None, f"{path.name}: header needs '# Parameters: <N>B'"
    assert [(m.gpus, m.gpu_gb) for m in nodes] == [(GPUS_PER_NODE, 80), (GPUS_PER_NODE, 192)], (
        f"{path.name}: header needs '# Minimum nodes: N with 8x 80 GB GPUs, M with 8x 192 GB GPUs'"
    )
    assert 1 <= nodes[1].nodes <= nodes[0].nodes
    assert res["attention"] in GPU_ATTENTION, (
        f"{path.name}: attention {res['attention']!r} is not one of {GPU_ATTENTION}"
    )
    for key, want in (("dataset_type", "synthetic"), ("enable_checkpointing", False)):
        assert data.get(key) == want, f"{path.name}: set {key}: {want} (runs without data or storage by default)"
    for key in ("per_device_batch_size", "max_target_length", "remat_policy", "steps", "log_period"):
        assert key in data, f"{path.name}: set {key} explicitly"
    if res["num_experts"] > 1:
        assert data.get("megablox") is False, f"{path.name}: megablox is a TPU kernel; set megablox: false on GPU"

    for n, mesh in res["mesh"].items():
        assert mesh["error"] is None, (
            f"{path.name}: no valid mesh for {n} node(s) x {GPUS_PER_NODE} GPUs: {mesh['error']}"
        )

    err = res["model_error"]
    if err:
        pytest.fail(f"MaxText cannot build the model of {path.name}: {err['type']}: {err['message']}")
    params = res["params"]
    assert abs(params_b * 1e9 - params) <= PARAMS_TOLERANCE * params, (
        f"{path.name}: header says {params_b}B parameters, MaxText builds {params / 1e9:.2f}B"
    )
    for n, gpus, gpu_gb in nodes:
        per_gpu = params * res["state_bytes_per_param"] / (n * gpus)
        assert per_gpu <= STATE_MEMORY_SHARE * gpu_gb * 1e9, (
            f"{path.name}: at {n} node(s) of 8x {gpu_gb} GB the training state alone is "
            f"{per_gpu / 1e9:.1f} GB per GPU (limit {STATE_MEMORY_SHARE:.0%}); raise the minimum node count"
        )


def test_headers_parse_and_aliases_are_unique() -> None:
    """Every config's header reads (a malformed Minimum nodes or Aliases line stops the launch); each
    alias is declared once, is no config's name, and the launcher's resolver takes it to its config."""
    for path in CONFIGS:
        config_header.read_header(path)
    aliases = config_header.read_aliases(CONFIG_DIR)  # HeaderError on an alias two configs declare
    assert aliases.get("70b") == "llama2-70b", aliases  # the seeds' short name (`submit.sh 70b -N 8`)
    script = 'source utils/launch/lib.sh; for a in "$@"; do resolve_model "$a" configs; done'
    res = subprocess.run(
        ["bash", "-c", script, "resolve", *aliases], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == list(aliases.values())


def test_config_names_are_not_prefixes_of_each_other() -> None:
    # The launcher resolves a model name by exact match, then by unique prefix.
    names = [p.stem for p in CONFIGS]
    clashes = [(a, b) for a in names for b in names if a != b and b.startswith(a)]
    assert not clashes, f"config names that are prefixes of others: {clashes}"


@pytest.mark.parametrize("env_file", ENV_FILES, ids=_ids(ENV_FILES))
def test_env_file_format(env_file: Path) -> None:
    assert (CONFIG_DIR / env_file.name.replace(".env.sh", ".yml")).is_file(), f"{env_file.name} has no config"
    res = subprocess.run(["bash", "-n", str(env_file)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"bash -n {env_file.name}: {res.stderr}"
    for i, line in enumerate(env_file.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        assert not stripped or stripped.startswith("#") or EXPORT_RE.match(stripped), (
            f"{env_file.name}:{i}: only 'export NAME=VALUE' lines and comments are allowed: {line!r}"
        )


def _sourced_exports(env_file: Path) -> dict[str, str]:
    """The variables env_file exports, with their values after bash has sourced it."""
    names = re.findall(r"^\s*export ([A-Za-z_][A-Za-z0-9_]*)=", env_file.read_text(encoding="utf-8"), re.M)
    script = 'set -euo pipefail; source "$1"; shift; for n in "$@"; do printf "%s=%s\\0" "$n" "${!n-}"; done'
    res = subprocess.run(
        ["bash", "-c", script, "_", str(env_file), *names],
        capture_output=True,
        text=True,
        env=_worker_env(),
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, f"sourcing {env_file.name} failed: {res.stderr}"
    return dict(item.split("=", 1) for item in res.stdout.split("\0") if item)


@functools.cache
def _start_xla(python: str, exports: tuple[tuple[str, str], ...]) -> tuple[int, str]:
    """Exit status and stderr of starting XLA's CPU backend with these variables (cached: most
    env files export the same flags)."""
    res = subprocess.run(
        [python, "-c", "import jax; jax.devices()"],
        capture_output=True,
        text=True,
        env={**_worker_env(), **dict(exports), "JAX_PLATFORMS": "cpu"},
        timeout=120,
        check=False,
    )
    return res.returncode, res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("env_file", ENV_FILES, ids=_ids(ENV_FILES))
def test_env_file_xla_flags_exist(venv: Path, env_file: Path) -> None:
    exports = _sourced_exports(env_file)
    rc, stderr = _start_xla(str(venv / "bin/python"), tuple(sorted(exports.items())))
    assert rc == 0, f"XLA rejects the environment of {env_file.name} ({exports}):\n{stderr[-3000:]}"


@pytest.mark.slow
def test_xla_flag_check_can_fail(venv: Path) -> None:
    rc, stderr = _start_xla(
        str(venv / "bin/python"), (("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_schedulerr=true"),)
    )
    assert rc != 0 and "Unknown flag" in stderr


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.exit(worker_main())
