"""What a job asks of Slurm for its GPUs and nodes, decided at submit from the config's header
(utils/launch/config_header.py): --gpus-per-node from "# Minimum nodes: N with 8x ... GPUs" unless a
GPU flag of the user's or the site's asks, none for a CPU config or with SITE_GPU_REQUEST=0; a node
count below the config's minimum refused in one line (--ignore-min-nodes forces); the short names the
configs declare ("# Aliases:"); JOB_GPUS_PER_NODE carried into the job, its header and preflight.

A fake `sbatch` (and `scontrol`) first on PATH records the arguments and the environment the job would
get, so nothing needs a cluster; the GPU nodes are the hand-written fixture trees of
tests/fixtures/gpu/ (see its README for the sources of their format).
"""

import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV

from launch import config_header

FAKE_SBATCH = """#!/bin/sh
printf '%s\\n' "$@" > "$SBATCH_CALLS"
printf 'JOB_GPUS_PER_NODE=%s\\n' "${JOB_GPUS_PER_NODE-<unset>}" > "$SBATCH_CALLS.env"
printf 'MST_GPU_REQUEST=%s\\n' "$MST_GPU_REQUEST" >> "$SBATCH_CALLS.env"
echo 4242
"""
# settings of the caller's shell that would change what these tests see
OWN = ("JOB_GPUS_PER_NODE", "SITE_GPU_REQUEST", "SITE_GPU_MEMORY_GB", "SITE_SBATCH_FLAGS", "SBATCH_GPUS_PER_NODE")


@pytest.fixture()
def env(tmp_path: Path, workspace: Path, venv: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("scontrol", "#!/bin/sh\n")):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in OWN}
    return {
        **base,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "SBATCH_CALLS": str(tmp_path / "sbatch_calls"),
        "MAXTEXT_SLURM_VENV": str(VENV),
        "JOB_WORKSPACE": str(workspace),
        "MST_SITE_FILE": "/dev/null",
    }


def submit(env: dict[str, str], *args: str, repo: Path = REPO, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(repo / "submit.sh"), *args], env={**env, **extra}, capture_output=True, text=True, timeout=300
    )


def dry(env: dict[str, str], *args: str, **extra: str) -> dict[str, str]:
    res = submit(env, *args, "--dry-run", **extra)
    assert res.returncode == 0, res.stderr
    return dict(line.split(": ", 1) for line in res.stdout.splitlines() if ": " in line)


def refused(res: subprocess.CompletedProcess, env: dict[str, str], workspace: Path) -> str:
    """The one line of a refusal; nothing submitted, nothing written (no snapshot, no job dir)."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode != 0 and len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert not Path(env["SBATCH_CALLS"]).exists(), "sbatch was called"
    assert not any(workspace.iterdir()), list(workspace.iterdir())
    return lines[0]


def site(tmp_path: Path, text: str) -> str:
    path = tmp_path / "site.env.sh"
    path.write_text(text)
    return str(path)


def test_short_name_resolves_and_asks_for_the_configs_gpus(env, workspace):
    out = dry(env, "70b", "-N", "8")
    assert out["model"].startswith("llama2-70b ("), out
    assert out["sbatch"].endswith(
        "--nodes=8 --output=" + f"{workspace}/%j-JAX-llama2-70b.log --gpus-per-node=8 <snapshot>/_job.sbatch"
    )
    assert out["gpus"] == (
        "8 per node (configs/llama2-70b.yml), asked by --gpus-per-node=8; preflight fails a node that shows fewer"
    )
    assert not any(workspace.iterdir())
    assert dry(env, "mixtral", "-N", "4")["model"].startswith("mixtral-8x22b (")  # the seeds' mixtral
    assert dry(env, "405b", "-N", "8")["model"].startswith("llama3.1-405b (")  # a unique substring, no alias


def test_an_ambiguous_name_lists_its_candidates(env, workspace):
    line = refused(submit(env, "8b"), env, workspace)
    assert line == "submit.sh: ambiguous model '8b' matches: llama3.1-8b qwen3-8b; give more of the name"


def test_fewer_nodes_than_the_config_needs_are_refused(env, workspace):
    line = refused(submit(env, "llama2-70b", "-N", "1"), env, workspace)
    assert line.startswith("submit.sh: llama2-70b needs at least 2 nodes, -N 1 is fewer (")
    assert "'# Minimum nodes: 4 with 8x 80 GB GPUs, 2 with 8x 192 GB GPUs'" in line
    assert line.endswith("give -N 2 or more, or --ignore-min-nodes to submit anyway")
    # the site's GPUs pick the entry: 80 GB (and 141 GB, between the two) need 4 nodes, 192 GB 2
    for gb, need in (("80", 4), ("141", 4), ("192", 2)):
        res = submit(env, "llama2-70b", "-N", "2", "--dry-run", SITE_GPU_MEMORY_GB=gb)
        if need > 2:
            line = refused(res, env, workspace)
            assert (
                f"needs at least {need} nodes" in line and f"4 with 8x 80 GB GPUs for SITE_GPU_MEMORY_GB={gb}" in line
            )
        else:
            assert res.returncode == 0, res.stderr
    # from the site file, the same
    res = submit(env, "70b", "-N", "3", MST_SITE_FILE=site(workspace.parent, "export SITE_GPU_MEMORY_GB=80\n"))
    assert "needs at least 4 nodes" in refused(res, env, workspace)


def test_ignore_min_nodes_submits(env, workspace):
    res = submit(env, "llama2-70b", "-N", "1", "--ignore-min-nodes")
    assert res.returncode == 0, res.stderr
    argv = Path(env["SBATCH_CALLS"]).read_text().splitlines()
    assert "--nodes=1" in argv and "--gpus-per-node=8" in argv and "--ignore-min-nodes" not in argv
    (command,) = workspace.glob("*/.snapshots/*/.submit/command.txt")  # what a resubmission replays
    assert "submit.sh llama2-70b -N 1 --ignore-min-nodes" in command.read_text()
    out = dry(env, "llama2-70b", "-N", "1", "--ignore-min-nodes")
    assert out["min_nodes"].startswith("ignored (--ignore-min-nodes): configs/llama2-70b.yml says")


@pytest.mark.parametrize(
    ("flags", "shown", "gpus"),
    [
        (["--gpus-per-node=4"], "--gpus-per-node=4", "4 per node, asked by your --gpus-per-node=4"),
        (["--gpus-per-node", "h100:4"], "--gpus-per-node h100:4", "4 per node, asked by your --gpus-per-node h100:4"),
        (["--gres=gpu:a100:2"], "--gres=gpu:a100:2", "2 per node, asked by your --gres=gpu:a100:2"),
        (["-G", "16"], "-G 16", "4 per node, asked by your -G 16"),  # 16 over -N 4
    ],
)
def test_your_gpu_flag_wins(env, flags, shown, gpus):
    out = dry(env, "70b", "-N", "4", *flags)
    assert out["sbatch"].endswith(f".log {shown} <snapshot>/_job.sbatch"), out["sbatch"]
    assert "--gpus-per-node=8" not in out["sbatch"]
    assert out["gpus"] == f"{gpus}; preflight fails a node that shows fewer"


def test_a_gpu_flag_without_a_per_node_count_is_not_checked(env):
    out = dry(env, "70b", "-N", "3", "-G", "16")  # 16 GPUs over 3 nodes: no count per node
    assert "--gpus-per-node" not in out["sbatch"]
    assert out["gpus"].startswith("asked by your -G 16; the count per node is not known here: not checked")


def test_site_settings_for_gpus(env, tmp_path):
    # a cluster that gives whole nodes: no request, the config's count still checked in preflight
    out = dry(env, "70b", "-N", "4", MST_SITE_FILE=site(tmp_path, "export SITE_GPU_REQUEST=0\n"))
    assert "--gpus" not in out["sbatch"]
    assert out["gpus"] == (
        "8 per node (configs/llama2-70b.yml), not asked of Slurm: SITE_GPU_REQUEST=0 (whole nodes);"
        " preflight fails a node that shows fewer"
    )
    # nodes of 4 GPUs: the site's count is asked and checked; yours wins over it
    four = site(tmp_path, "export JOB_GPUS_PER_NODE=4\n")
    out = dry(env, "70b", "-N", "4", MST_SITE_FILE=four)
    assert out["sbatch"].endswith(".log --gpus-per-node=4 <snapshot>/_job.sbatch")
    assert out["gpus"].startswith("4 per node (JOB_GPUS_PER_NODE=4, the site file), asked by --gpus-per-node=4")
    assert dry(env, "70b", "-N", "4", "--gres=gpu:2", MST_SITE_FILE=four)["gpus"].startswith(
        "2 per node, asked by your"
    )
    # a GPU flag among the site's sbatch flags is the request: none added
    out = dry(env, "70b", "-N", "4", MST_SITE_FILE=site(tmp_path, 'export SITE_SBATCH_FLAGS="--gpus-per-node=8"\n'))
    assert out["sbatch"].count("--gpus-per-node=8") == 1
    assert out["gpus"].startswith("8 per node, asked by the site's --gpus-per-node=8")
    # 0 in your environment: no GPUs asked or checked
    out = dry(env, "70b", "-N", "4", JOB_GPUS_PER_NODE="0")
    assert "--gpus" not in out["sbatch"] and out["gpus"] == "none (JOB_GPUS_PER_NODE=0, your environment)"


def test_bad_gpu_settings_are_refused(env, workspace):
    line = refused(submit(env, "70b", "-N", "4", SITE_GPU_REQUEST="no"), env, workspace)
    # the check and the doc of the setting's row in utils/launch/settings.tsv
    assert line == (
        "submit.sh: SITE_GPU_REQUEST='no' must be 0 or 1; SITE_GPU_REQUEST is whether submit.sh asks Slurm"
        " for each node's GPUs (1) or the cluster gives whole nodes (0)"
    )
    line = refused(submit(env, "70b", "-N", "4", SITE_GPU_MEMORY_GB="80GB"), env, workspace)
    assert line == (
        "submit.sh: SITE_GPU_MEMORY_GB='80GB' must be a whole number from 1 to 100000;"
        " SITE_GPU_MEMORY_GB is the memory of one of the cluster's GPUs in GB"
    )


def test_a_cpu_config_asks_for_no_gpu(env):
    out = dry(env, "tiny", "-N", "2")
    assert "--gpus" not in out["sbatch"] and "--gres" not in out["sbatch"]
    assert out["gpus"] == "none (configs/tiny.yml names no GPUs: none asked, no GPU count check)"


def test_the_count_reaches_the_job_header_and_preflight(env, workspace, tmp_path):
    """JOB_GPUS_PER_NODE goes with the job (sbatch's environment); its header says it, and preflight
    on a node that shows 4 GPUs (fixture nvidia-healthy) fails with one line."""
    res = submit(env, "70b", "-N", "2")
    assert res.returncode == 0, res.stderr
    job_env = dict(ln.split("=", 1) for ln in Path(env["SBATCH_CALLS"] + ".env").read_text().splitlines())
    assert job_env["JOB_GPUS_PER_NODE"] == "8"
    header = subprocess.run(
        [str(REPO / "utils/launch/job_header.sh")], env={**env, **job_env}, capture_output=True, text=True, timeout=60
    )
    assert f"gpus: {job_env['MST_GPU_REQUEST']}\n" in header.stdout and "gpus: 8 per node (" in header.stdout
    from test_gpu_health import FIX, preflight

    pf = preflight(tmp_path, FIX / "nvidia-healthy", JOB_GPUS_PER_NODE=job_env["JOB_GPUS_PER_NODE"])
    assert pf.returncode == 1
    assert pf.stderr.splitlines() == ["preflight: FAILED: GPUs: 4 GPU(s) visible, JOB_GPUS_PER_NODE=8 expected"]
    assert preflight(tmp_path, FIX / "nvidia-healthy", JOB_GPUS_PER_NODE="4").returncode == 0


# --- the header reader ----------------------------------------------------------------------------------
def configs(tmp_path: Path, **headers: str) -> Path:
    d = tmp_path / "configs"
    d.mkdir()
    for name, head in headers.items():
        (d / f"{name}.yml").write_text(f"{head}\nbase_config: base.yml\n")
    return d


def test_an_alias_two_configs_declare_is_an_error(tmp_path):
    d = configs(tmp_path, a70="# Aliases: 70b", b70="# Aliases: x 70b")
    with pytest.raises(
        config_header.HeaderError, match="alias '70b' is declared by configs/a70.yml and configs/b70.yml"
    ):
        config_header.read_aliases(d)
    res = subprocess.run(
        [str(REPO / "utils/launch/config_header.py"), "aliases", str(d)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "declared by" in res.stderr


def test_an_alias_that_is_a_config_name_is_an_error(tmp_path):
    with pytest.raises(config_header.HeaderError, match="alias 'b' is the name of configs/b.yml"):
        config_header.read_aliases(configs(tmp_path, a="# Aliases: b", b="# b"))


def test_a_malformed_minimum_line_stops_the_launch(scratch_repo, env, workspace):
    (scratch_repo / "configs" / "odd.yml").write_text("# Minimum nodes: four\nbase_config: base.yml\n")
    line = refused(submit(env, "odd", repo=scratch_repo), env, workspace)
    assert line.startswith("submit.sh: configs/odd.yml: '# Minimum nodes: four' is not of the shape")


def test_the_minimum_rule():
    head = config_header.parse_header("# Minimum nodes: 4 with 8x 80 GB GPUs, 2 with 8x 192 GB GPUs\n")
    assert head.minimum() == (2, 8, 192)
    assert [head.minimum(gb).nodes for gb in (40, 80, 141, 192, 288)] == [4, 4, 4, 2, 2]
    assert config_header.parse_header("# tiny\n").minimum() is None
