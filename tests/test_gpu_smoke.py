"""bench/gpu_smoke.sh: its pipeline (GPU check, GPU plugin, two run_local.sh runs, perf.py, one table)
end to end on this machine's CPU with --cpu; without a GPU and without --cpu, one line and exit 2.
On a GPU node it runs the scaled-down qwen3-8b instead (README "Benchmarks")."""

import os
import re

import pytest
from conftest import REPO, launcher_env, run

SMOKE = REPO / "bench" / "gpu_smoke.sh"
HAS_GPU = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


def test_help():
    res = run([str(SMOKE), "--help"])
    assert res.returncode == 0
    assert res.stdout.startswith("Usage: bench/gpu_smoke.sh [--python PY")
    assert "--cpu" in res.stdout


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_no_gpu_is_one_line(tmp_path):
    res = run([str(SMOKE), "--workspace", str(tmp_path / "ws")], env=launcher_env(tmp_path))
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.splitlines() == [
        f"gpu_smoke.sh: no GPU on {os.uname().nodename} (no /dev/nvidiactl or /dev/kfd): "
        "run it on a GPU node, or with --cpu for the same pipeline on this CPU"
    ]
    assert not (tmp_path / "ws").exists()


def test_bad_usage_is_one_line(tmp_path):
    res = run([str(SMOKE), "--cpu", "--steps", "0"], env=launcher_env(tmp_path))
    assert res.returncode == 2 and res.stderr.splitlines() == [
        "gpu_smoke.sh: --steps takes a whole number from 1 to 99999, got '0'"
    ]


@pytest.mark.slow
@pytest.mark.heavy
def test_cpu_pipeline_end_to_end(tmp_path, venv):
    ws = tmp_path / "ws"
    res = run([str(SMOKE), "--cpu", "--steps", "6", "--workspace", str(ws)], env=launcher_env(ws), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("gpu_health: ") and ": ok" in lines[0], lines[0]
    assert lines[1] == "gpu plugin: no GPU (exit 64)"
    assert lines[2].split()[:3] == ["run", "exit", "steps"]
    rows = {line.split()[0]: line for line in lines[3:5]}
    assert set(rows) == {"default", "dot_product"}
    for line in rows.values():
        # steps 0..5 seen, the log complete, and a step time in seconds
        m = re.match(r"\S+\s+0\s+0\.\.5 \(6 lines on \S+\)\s+yes\s+(\d+\.\d{3})\s", line)
        assert m, line
        assert float(m.group(1)) > 0
    assert lines[-1] == f"workspace: {ws}"
    logs = sorted(ws.glob("local-*-JAX-tiny.log"))
    assert len(logs) == 2
    command = logs[1].parent / logs[1].stem / "artifact" / ".submit" / "command.txt"
    assert "attention=dot_product" in command.read_text()
