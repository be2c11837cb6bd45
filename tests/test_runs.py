"""utils/run.py: a run's jobs from their logs, the steps trained and redone, time by kind, goodput
(docs/runs.md). The figures of a real two-job run (run_local.sh --run, MaxText training the tiny
model; the first job killed between two checkpoints) equal a calculation by hand from the logs."""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

from helpers.jobs import summary, trainer_pid, wait_for
from helpers.users import as_user, ensure_users, reachable_base, shared_workspace

RUN_PY = str(REPO / "utils/run.py")
STEP = re.compile(r"^\S+: .*completed step: (\d+), seconds: ([\d.]+),", re.M)


def by_hand(log: Path, ended: bool = True) -> dict:
    """What a person reads off one job log: its steps with their seconds, its start and (ENDED) wall time."""
    text = log.read_text(errors="replace")
    steps: dict[int, float] = {}
    for m in STEP.finditer(text):
        steps.setdefault(int(m.group(1)), float(m.group(2)))
    if not ended:
        return {"steps": steps}
    started = re.search(r"^started: (\S+)$", text, re.M).group(1)
    wall = int(re.search(r"^wall_time: \S+ \((\d+) s\)$", text, re.M).group(1))
    return {
        "steps": steps,
        "started": datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp(),
        "wall": wall,
    }


def test_bad_input_is_one_line(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for args, want in (
        (["nope"], f"run.py: no job of run 'nope' in {ws} (submit.sh ... --run nope starts one)"),
        (["../x"], "run.py: bad run alias '../x': use letters, digits, . _ - only, as given to --run"),
        (["x", "--workspace", str(tmp_path / "missing")], "run.py: cannot read workspace"),
    ):
        res = run([RUN_PY, *args], env={"JOB_WORKSPACE": str(ws)})
        assert res.returncode == 2 and res.stdout == "", res
        assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith(want), res.stderr


def test_another_users_log_naming_your_run_is_not_your_run(tmp_path):
    """In a shared workspace (1777) another user writes a job log whose header names your run (its
    alias and your run directory): it is not counted."""
    _, attacker = ensure_users()
    base = reachable_base()
    try:
        ws = shared_workspace(base, "sticky")
        header = (
            "==================== JOB ====================\n"
            f"job: 99 99-JAX-tiny\nrun: r {ws}/{getpass.getuser()}/runs/r (no checkpoint: starts from step 0)\n"
            "started: 2026-11-28T05:00:00Z\n=============================================\n"
        )
        res = as_user(attacker, ["bash", "-c", f"printf %s {shlex.quote(header)} > {ws}/99-JAX-tiny.log"])
        assert res.returncode == 0, res.stderr
        res = run([RUN_PY, "r", "--workspace", str(ws)])
        assert res.returncode == 2 and res.stderr.startswith("run.py: no job of run 'r' in "), res
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.heavy
def test_a_run_of_two_jobs_is_accounted_as_by_hand(workspace, venv):
    env = launcher_env(workspace)
    # job 1: checkpoints every 5 steps, killed (SIGKILL, as the OOM killer would) after step 12
    proc = subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--run", "r", "--", "steps=100000", "checkpoint_period=5"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first = wait_for(lambda: list(workspace.glob("local-*.log")), 60, "the log")[0]
        job_id = first.name.split("-JAX-")[0]
        pid = wait_for(lambda: trainer_pid(job_id, 0), 120, "the trainer")
        wait_for(lambda: max(by_hand(first, ended=False)["steps"], default=-1) >= 12, 180, "step 12")
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # job 2 restores the latest checkpoint and trains past where job 1 stopped
    hand1 = by_hand(first)
    last1 = max(hand1["steps"])
    # ... saving about every 2 s at the step time job 1 measured (--checkpoint-every; its first 3 steps left out)
    res = run(
        [str(REPO / "run_local.sh"), "tiny", "--run", "r", "--checkpoint-every", "2", "--", f"steps={last1 + 4}"],
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:]
    second = next(p for p in workspace.glob("local-*.log") if p != first)
    hand2 = by_hand(second)
    steady = [hand1["steps"][n] for n in sorted(hand1["steps"])[3:]]
    period = max(1, int(2 // statistics.median(steady)))
    assert re.search(rf"^overrides: steps={last1 + 4} checkpoint_period={period}$", second.read_text(), re.M), period
    restart = min(hand2["steps"])  # the step after the checkpoint it restored
    assert summary(first)["status"] == "failed" and summary(second)["status"] == "completed"
    assert 0 < restart <= last1 and restart % 5 == 1, (restart, last1)  # checkpoints at 0, 5, 10 ...

    res = run([RUN_PY, "r", "--json"], env={"JOB_WORKSPACE": str(workspace)})
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    j1, j2 = r["jobs"]
    assert (j1["log"], j2["log"]) == (str(first), str(second))
    redone = {s: t for s, t in hand1["steps"].items() if s >= restart}
    assert j1["steps"] == [0, last1] and j1["steps_trained"] == len(hand1["steps"])
    assert j1["steps_redone"] == len(redone) == last1 - restart + 1
    assert j1["time"]["redone"] == pytest.approx(sum(redone.values()), abs=1e-3)
    assert j1["time"]["productive"] == pytest.approx(sum(hand1["steps"].values()) - sum(redone.values()), abs=1e-3)
    assert j2["steps"] == [restart, last1 + 3] and j2["steps_redone"] == 0 and j2["restored_from_step"] == restart - 1
    assert j2["time"]["productive"] == pytest.approx(sum(hand2["steps"].values()), abs=1e-3)
    for j, hand in ((j1, hand1), (j2, hand2)):
        assert j["started"] == hand["started"] and j["wall_seconds"] == hand["wall"]
        assert j["nodes"] and 0 < j["time"]["startup"] < hand["wall"]
        t = j["time"]
        # the kinds add up to the wall time (started: and wall_time: are whole seconds, 1 s each)
        assert t["startup"] + t["productive"] + t["redone"] + t["other"] == pytest.approx(hand["wall"], abs=2.0)
    productive = sum(hand1["steps"].values()) - sum(redone.values()) + sum(hand2["steps"].values())
    assert r["goodput"] == pytest.approx(productive / (hand1["wall"] + hand2["wall"]), abs=1e-4)
    assert r["steps_redone"] == len(redone) and r["highest_step"] == last1 + 3 and r["done"]
    # the text form says the same
    text = run([RUN_PY, "r"], env={"JOB_WORKSPACE": str(workspace)}).stdout
    assert text.startswith(f"run r: 2 job(s), steps 0..{last1 + 3} of {last1 + 4} (done); ")
    assert f"goodput: {100 * r['goodput']:.1f} %" in text


def requeued_log(ws: Path) -> Path:
    """A --run job requeued once (scontrol requeue, a preemption): its first run on n1 trained steps
    0..12 (1 s each) and was stopped; Slurm reran it under its id on n2, appending to its log, where it
    restored the checkpoint of step 9 and trained 10..20 (0.5 s each)."""
    user = getpass.getuser()

    def run_text(node: str, started: str, hhmm: str, steps: range, seconds: float, restore: int | None,
                 status: str, wall: int) -> str:  # fmt: skip
        ckpt = f"latest checkpoint: step {restore}, training goes on at step {restore + 1}" if restore is not None \
            else "no checkpoint: starts from step 0"  # fmt: skip
        lines = [
            "==================== JOB ====================",
            "job: 77 77-JAX-tiny",
            "model: tiny",
            f"nodes: 1 ({node})",
            "overrides: steps=21",
            f"code: {ws}/{user}/.snapshots/20261206T095900Z-abc123/maxtext-slurm",
            f"run: rq {ws}/{user}/runs/rq ({ckpt})",
            f"started: {started}",
            "=============================================",
        ]
        if restore is not None:
            restored = f"restoring from this run's directory step {restore}"
            lines.append(f"{node}: I1206 {hhmm}:20.000000 1 checkpointing.py:705] {restored}")
        for i, n in enumerate(steps):
            lines.append(
                f"{node}: I1206 {hhmm}:{30 + i:02d}.000000 1 metric_logger.py:265] completed step: {n}, "
                f"seconds: {seconds:.3f}, TFLOP/s/device: 0.001, Tokens/s/device: 64.000, loss: 5.000"
            )
        lines += ["==================== JOB SUMMARY ====================", f"status: {status}",
                  f"wall_time: 00:01:{wall - 60:02d} ({wall} s)", "=" * 53]  # fmt: skip
        return "\n".join(lines) + "\n"

    log = ws / "77-JAX-tiny.log"
    log.write_text(
        run_text("n1", "2026-12-06T10:00:00Z", "10:00", range(13), 1.0, None, "cancelled", 70)
        + "_job.sbatch: the log already holds an earlier run's output; this run starts at the JOB header below\n"
        + run_text("n2", "2026-12-06T10:03:00Z", "10:03", range(10, 21), 0.5, 9, "completed", 80)
    )
    return log


def test_the_kinds_of_time_add_up_to_the_wall_time_when_step_lines_come_late(tmp_path):
    """MaxText timed 30 steps of 2 s each, but their lines reached the log in a burst, 1 s apart (a pipe
    that waited on a loaded node): the first step seems to begin 28 s after the start, and start-up plus
    the steps would be 88 s of a 70 s job. Start-up gets what the steps leave: 10 s, the kinds sum to 70."""
    user = getpass.getuser()
    ws = tmp_path / "ws"
    ws.mkdir()
    lines = [
        "==================== JOB ====================",
        "job: 78 78-JAX-tiny",
        "model: tiny",
        "nodes: 1 (n1)",
        "overrides: steps=30",
        f"code: {ws}/{user}/.snapshots/20261206T095900Z-abc123/maxtext-slurm",
        f"run: late {ws}/{user}/runs/late (no checkpoint: starts from step 0)",
        "started: 2026-12-06T10:00:00Z",
        "=============================================",
        *(
            f"n1: I1206 10:00:{30 + n:02d}.000000 1 metric_logger.py:265] completed step: {n}, seconds: 2.000, "
            "TFLOP/s/device: 0.001, Tokens/s/device: 64.000, loss: 5.000"
            for n in range(30)
        ),
        "==================== JOB SUMMARY ====================",
        "status: completed",
        "wall_time: 00:01:10 (70 s)",
        "=" * 53,
    ]
    (ws / "78-JAX-tiny.log").write_text("\n".join(lines) + "\n")
    res = run([RUN_PY, "late", "--json"], env={"JOB_WORKSPACE": str(ws)})
    assert res.returncode == 0, res.stderr
    t = json.loads(res.stdout)["jobs"][0]["time"]
    assert t["productive"] == pytest.approx(60.0) and t["startup"] == pytest.approx(10.0), t
    assert t["startup"] + t["productive"] + t["redone"] + t["other"] == pytest.approx(70.0), t


def test_a_requeued_jobs_runs_each_count_as_a_job(tmp_path):
    """A requeued job's log holds two runs (the second possibly on other nodes): scan() reads the last
    one's steps, and run.py accounts for both, the first one's steps after the restored checkpoint as
    redone, as a person would from the log."""
    import joblog

    ws = tmp_path / "ws"
    ws.mkdir()
    log = requeued_log(ws)
    last = joblog.scan(log)
    assert last.runs == 2 and last.steps.host == "n2" and list(last.steps.step) == list(range(10, 21))
    res = run([RUN_PY, "rq", "--json"], env={"JOB_WORKSPACE": str(ws)})
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    j1, j2 = r["jobs"]
    assert (j1["id"], j1["attempt"], j1["attempts"], j1["nodes"]) == ("77", 1, 2, ["n1"])
    assert (j2["id"], j2["attempt"], j2["attempts"], j2["nodes"]) == ("77", 2, 2, ["n2"])
    assert j1["steps"] == [0, 12] and j1["steps_redone"] == 3 and j1["status"] == "cancelled"
    assert j2["steps"] == [10, 20] and j2["restored_from_step"] == 9 and j2["status"] == "completed"
    assert j1["time"]["productive"] == pytest.approx(10.0) and j1["time"]["redone"] == pytest.approx(3.0)
    assert r["goodput"] == pytest.approx((10 * 1.0 + 11 * 0.5) / (70 + 80), abs=1e-4) and r["done"]
    # queued: from the submission (09:59:00) to the start; the rerun from the first run's end (10:01:10)
    assert j1["time"]["queued"] == pytest.approx(60.0) and j2["time"]["queued"] == pytest.approx(110.0)
    text = run([RUN_PY, "rq"], env={"JOB_WORKSPACE": str(ws)}).stdout
    assert re.search(r"^77#1 +cancelled ", text, re.M) and re.search(r"^77#2 +completed ", text, re.M), text
