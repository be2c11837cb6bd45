"""utils/sweep.py: exact commands of --dry-run, bad input, the decision logic on made-up results,
and small real sweeps on the local Slurm cluster (batch, nodes, regress, Ctrl-C)."""

import getpass
import json
import math
import os
import pwd
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, VENV, launcher_env, run

import joblog
import sweep.batch
import sweep.bisect
import sweep.loop
import sweep.models
import sweep.nodes
import sweep.policy
import sweep.record
import sweep.regress
from helpers import inproc
from helpers.jobs import job_state, trainer_pid, wait_for

TOOL = str(REPO / "utils" / "sweep.py")
SUBMIT = str(REPO / "submit.sh")
FAST = ["--poll", "0.5", "--timeout", "240"]


def sweep_run(workspace: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300):
    """utils/sweep.py ARGS: in this process (helpers/inproc.py) unless it talks to the local cluster
    (ENV with SLURM_CONF: a real sweep, which TIMEOUT bounds); test_help_runs_with_the_shebang runs the command."""
    full = {**launcher_env(workspace), **(env or {})}
    if "SLURM_CONF" not in full:
        return inproc.tool("sweep", *args, env=full)
    return run([str(VENV / "bin" / "python"), TOOL, *args], env=full, timeout=timeout)


def as_json(res) -> dict:
    assert res.stdout.strip(), res.stderr
    return json.loads(res.stdout)


def dry_json(workspace: Path, *args: str) -> dict:
    """A --dry-run --json sweep that must succeed: its record."""
    res = sweep_run(workspace, *args, "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    return as_json(res)


def commands(rec: dict) -> list[str]:
    return [j["command"] for j in rec["jobs"]]


# --- a made-up baseline job (header, step lines, summary, recorded command) -------------------------
def fake_job(workspace: Path, job_id: str, command: str, model: str = "tiny") -> None:
    name = f"{job_id}-JAX-{model}-base"
    lines = [
        "==================== JOB ====================",
        f"job: {job_id} {name}",
        "scheduler: slurm",
        f"model: {model} (tag base)",
        "nodes: 1 (n1)",
        "overrides: steps=10",
        f"job_dir: {workspace / name}",
        "started: 2026-11-22T05:00:00Z",
        "=============================================",
    ]
    for s in range(10):
        lines.append(
            f"n1: I1122 05:00:{10 + s:02d}.000000 1 metric_logger.py:265] completed step: {s}, seconds: 0.010, "
            f"TFLOP/s/device: 0.005, Tokens/s/device: {1000 + s}.000, total_weights: 64, loss: {6.1 - s / 100:.3f}"
        )
    lines += [
        "==================== JOB SUMMARY ====================",
        "status: completed",
        f"job: {job_id} {name}",
        "nodes: 1 (n1)",
        "stage: train",
        "failed_nodes: none",
        "=====================================================",
    ]
    (workspace / f"{name}.log").write_text("\n".join(lines) + "\n")
    submit_dir = workspace / name / "artifact" / ".submit"
    submit_dir.mkdir(parents=True)
    (submit_dir / "command.txt").write_text(command + "\n")


# --- dry runs: the exact commands -----------------------------------------------------------------
def test_help_runs_with_the_shebang():
    res = run([TOOL, "--help"], timeout=30)
    assert res.returncode == 0 and "Usage: sweep.py" in res.stdout, res.stderr
    for kind in ("batch", "nodes", "bisect", "regress", "models"):
        assert kind in res.stdout


def test_dry_run_batch(workspace):
    res = sweep_run(
        workspace,
        "batch",
        "tiny:exp",
        "--values",
        "4,1,2,2",
        "--steps",
        "5",
        "-N",
        "2",
        "--dry-run",
        "--json",
        "--",
        "--exclude=n9",
        "-t",
        "10:00",
        "--",
        "remat_policy=full",
        "_env_A=1",
    )
    assert res.returncode == 0, res.stderr
    rec = as_json(res)
    assert rec["state"] == "dry_run" and rec["record"] is None
    assert commands(rec) == [
        f"{SUBMIT} tiny:exp-bs{v} -N 2 --exclude=n9 -t 10:00 -- "
        f"per_device_batch_size={v} steps=5 remat_policy=full _env_A=1"
        for v in (1, 2, 4)
    ]
    assert [j["value"] for j in rec["jobs"]] == ["1", "2", "4"]
    assert not (workspace / "sweeps").exists() and not list(workspace.iterdir()), "a dry run writes nothing"
    # KEY=VALUE tokens without a second `--` are overrides; the human text lists the same commands
    res = sweep_run(
        workspace,
        "batch",
        "tiny",
        "--values",
        "8",
        "--key",
        "remat_policy_x",
        "--dry-run",
        "--",
        "-p",
        "gpu",
        "ici_fsdp_parallelism=2",
    )
    assert res.returncode == 0, res.stderr
    assert f"{SUBMIT} tiny:bs8 -N 1 -p gpu -- remat_policy_x=8 steps=30 ici_fsdp_parallelism=2" in res.stdout


@pytest.fixture()
def fake_sinfo(tmp_path):
    """A made-up cluster for dry runs: sinfo lists a1..a5 (usable) and a6 (down)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "sinfo"
    stub.write_text("#!/bin/sh\nprintf 'a1 idle\\na2 mix\\na3 alloc\\na4 idle\\na5 idle\\na6 down*\\na1 idle\\n'\n")
    stub.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_dry_run_nodes_and_bisect(workspace, fake_sinfo):
    res = sweep_run(
        workspace, "nodes", "tiny", "--nodes", "a2,a4", "--steps", "5", "--dry-run", "--json", env=fake_sinfo
    )
    assert res.returncode == 0, res.stderr
    assert commands(as_json(res)) == [f"{SUBMIT} tiny:node-{n} -N 1 -w {n} -- steps=5" for n in ("a2", "a4")]
    res = sweep_run(workspace, "nodes", "tiny", "--dry-run", "--json", env=fake_sinfo)
    rec = as_json(res)
    assert [j["node"] for j in rec["jobs"]] == ["a1", "a2", "a3", "a4", "a5"]
    assert rec["params"]["unavailable"] == [{"node": "a6", "state": "down*"}]
    res = sweep_run(workspace, "nodes", "tiny", "--nodes", "a1,a9", "--dry-run", env=fake_sinfo)
    assert res.returncode == 2 and "unknown node(s) a9" in res.stderr, res.stderr
    res = sweep_run(workspace, "bisect", "tiny", "--nodes", "all", "--dry-run", "--json", env=fake_sinfo)
    assert res.returncode == 0, res.stderr
    rec = as_json(res)
    assert commands(rec) == [
        f"{SUBMIT} tiny:pair-{a}-{b} -N 2 -w {a},{b} -- steps=30" for a, b in (("a1", "a2"), ("a3", "a4"), ("a5", "a1"))
    ]
    assert "round 2" in rec["notes"][0]
    assert not list(workspace.iterdir()), "a dry run writes nothing"


def test_plans_below_the_configs_minimum_nodes_are_refused(workspace, fake_sinfo):
    # configs/qwen3-235b-a22b.yml: "# Minimum nodes: 16 with 8x 80 GB GPUs, 8 with 8x 192 GB GPUs"
    for args, per_job in (
        (["nodes", "qwen3-235b-a22b", "--nodes", "a1,a2"], 1),
        (["bisect", "qwen3-235b-a22b", "--nodes", "all"], 2),
        (["batch", "qwen3-235b-a22b", "--values", "1,2", "-N", "4"], 4),
    ):
        res = sweep_run(workspace, *args, "--dry-run", env=fake_sinfo)
        assert res.returncode == 2 and not res.stdout, res.stdout + res.stderr
        err = res.stderr.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"needs at least 8 nodes per job and this sweep plans {per_job}-node jobs" in err, err
        assert "--ignore-min-nodes" in err, err
        res = sweep_run(workspace, *args, "--dry-run", "--json", "--ignore-min-nodes", env=fake_sinfo)
        assert res.returncode == 0, res.stderr
        assert any("below the minimum of 8 nodes" in n for n in as_json(res)["notes"])
        # submit.sh refuses such jobs too: each one carries the flag
        assert all(" --ignore-min-nodes" in c for c in commands(as_json(res))), commands(as_json(res))
    # at or above the 192 GB minimum, below the 80 GB one: planned, with a note naming both numbers
    res = sweep_run(workspace, "batch", "qwen3-235b-a22b", "--values", "1", "-N", "8", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    rec = as_json(res)
    assert commands(rec) == [f"{SUBMIT} qwen3-235b-a22b:bs1 -N 8 -- per_device_batch_size=1 steps=30"]
    assert any("fit only on GPUs with more than 80 GB" in n and "16 with 8x 80 GB" in n for n in rec["notes"])
    res = sweep_run(workspace, "batch", "qwen3-235b-a22b", "--values", "1", "-N", "16", "--dry-run", "--json")
    assert res.returncode == 0 and as_json(res)["notes"] == [], res.stderr
    assert not list(workspace.iterdir()), "a dry run writes nothing"


def test_dry_run_regress(workspace):
    fake_job(workspace, "77", "submit.sh tiny:base -N 2 -t 10 -- steps=10 remat_policy=full")
    res = sweep_run(workspace, "regress", "tiny", "--baseline", "77", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    rec = as_json(res)
    # the baseline's sbatch flags are shown, not replayed
    assert commands(rec) == [f"{SUBMIT} tiny:base -N 2 -- steps=10 remat_policy=full"]
    assert rec["params"]["not_replayed"] == {"sbatch": ["-t", "10"], "env": []}
    assert any("NOT replayed: -t 10 (add --replay-sbatch" in n for n in rec["notes"]), rec["notes"]
    base = rec["params"]["baseline"]
    assert base["tgs_steady"] == pytest.approx(1006.0) and base["final_loss"] == pytest.approx(6.01)
    assert base["command_owner_is_you"] is True and base["command_owner"]
    # --steps and -N replace the recorded values; extra overrides replace by key; --replay-sbatch replays -t 10
    res = sweep_run(
        workspace,
        "regress",
        "tiny",
        "--baseline",
        "77",
        "--steps",
        "12",
        "-N",
        "1",
        "--replay-sbatch",
        "--dry-run",
        "--json",
        "--",
        "--",
        "remat_policy=minimal",
    )
    assert res.returncode == 0, res.stderr
    rec = as_json(res)
    assert commands(rec) == [f"{SUBMIT} tiny:base -N 1 -t 10 -- steps=12 remat_policy=minimal"]
    assert rec["params"]["same_steps"] is False


def test_regress_never_replays_a_redacted_value(workspace):
    # whole-value redaction as the launcher writes it (NAME=<redacted>), next to a %q-quoted value
    fake_job(workspace, "78", "submit.sh tiny:base -N 1 -- steps=10 run_name=a\\ b _env_HF_TOKEN=<redacted>")
    res = sweep_run(workspace, "regress", "tiny", "--baseline", "78", "--dry-run")
    assert res.returncode == 0, res.stderr  # the environment is not replayed: nothing redacted is submitted
    assert f"{SUBMIT} tiny:base -N 1 -- steps=10 'run_name=a b'" in res.stdout
    assert "_env_HF_TOKEN=<redacted>' (add --replay-env" in res.stdout, res.stdout
    res = sweep_run(workspace, "regress", "tiny", "--baseline", "78", "--replay-env")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "'_env_HF_TOKEN' was redacted" in res.stderr and "cannot be replayed" in res.stderr, res.stderr
    # a value given after `-- --` replaces the redacted one
    res = sweep_run(
        workspace,
        "regress",
        "tiny",
        "--baseline",
        "78",
        "--replay-env",
        "--dry-run",
        "--json",
        "--",
        "--",
        "_env_HF_TOKEN=mine",
    )
    assert res.returncode == 0 and commands(as_json(res))[0].endswith("_env_HF_TOKEN=mine"), res.stderr
    # a redacted MaxText credential: MaxText overrides are replayed, so it is refused unless given
    fake_job(workspace, "80", "submit.sh tiny:base -N 1 -- steps=10 hf_access_token=<redacted>")
    res = sweep_run(workspace, "regress", "tiny", "--baseline", "80")
    assert res.returncode == 2 and "'hf_access_token' was redacted" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    fake_job(workspace, "79", "submit.sh tiny:base -N 1 -- steps=10")
    res = sweep_run(workspace, "regress", "llama3.1-8b", "--baseline", "79")
    assert res.returncode == 2 and "trained 'tiny'" in res.stderr, res.stderr
    assert not (workspace / getpass.getuser() / "sweeps").exists()


FAKE_SLURM = {  # record what submit.sh hands to sbatch (argv and environment); every job ends at once
    "sbatch": '#!/bin/bash\nn=$(( $(cat "$CALLS/n" 2>/dev/null || echo 500) + 1 )); echo "$n" > "$CALLS/n"\n'
    'printf "%s\\n" "$@" > "$CALLS/$n.argv"; env > "$CALLS/$n.env"; echo "$n"\n',
    "scontrol": '#!/bin/bash\n[[ "$1" == show ]] && echo "JobId=${4:-$3} JobState=COMPLETED"; exit 0\n',
}


@pytest.fixture()
def fake_slurm(tmp_path):
    bin_dir, calls = tmp_path / "fakebin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    for name, text in FAKE_SLURM.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)}, calls


def test_regress_replays_sbatch_flags_and_env_only_when_asked(workspace, fake_slurm, tmp_path):
    """A teammate's (or an attacker's) command.txt in a shared workspace: its sbatch flags and
    _env_ values are not submitted as you unless you ask for them."""
    env, calls = fake_slurm
    target = tmp_path / "victim" / "bashrc"
    fake_job(workspace, "77", f"submit.sh tiny:base -N 1 --output={target} -- steps=10 _env_LD_PRELOAD=/x.so")

    def regress(*flags: str) -> tuple[dict, str, str, str]:
        before = set(calls.glob("*.argv"))
        res = sweep_run(workspace, "regress", "tiny", "--baseline", "77", "--json", "--poll", "0.2", *flags, env=env)
        rec = as_json(res)
        new = sorted(set(calls.glob("*.argv")) - before)
        argv = new[0].read_text() if new else ""
        sb_env = new[0].with_suffix(".env").read_text() if new else ""
        return rec, argv, sb_env, res.stderr

    rec, argv, seen, err = regress()
    job = rec["jobs"][0]
    assert job["job_id"] and argv, (job, argv)  # submitted through submit.sh to (the fake) sbatch
    assert str(target) not in argv and "LD_PRELOAD=/x.so" not in seen, (argv, seen)
    assert str(target) not in job["command"] and "LD_PRELOAD" not in job["command"]
    # ... but shown: in the record and on stderr before anything is submitted
    assert rec["params"]["not_replayed"] == {"sbatch": [f"--output={target}"], "env": ["_env_LD_PRELOAD=/x.so"]}
    assert any(f"NOT replayed: --output={target}" in n for n in rec["notes"]), rec["notes"]
    assert any("NOT replayed: _env_LD_PRELOAD=/x.so" in n for n in rec["notes"]), rec["notes"]
    assert f"note: the baseline's sbatch flags are NOT replayed: --output={target}" in err, err

    rec, argv, seen, _ = regress("--replay-env")
    assert "_env_LD_PRELOAD=/x.so" in rec["jobs"][0]["command"]
    assert "LD_PRELOAD=/x.so" in seen and str(target) not in argv, seen

    rec, argv, seen, _ = regress("--replay-sbatch")
    job = rec["jobs"][0]
    assert f"--output={target}" in job["command"]
    # handed to submit.sh: sbatch gets it, or submit.sh refuses it by name (it contradicts its own --output)
    assert f"--output={target}" in argv or (job["status"] == "submit_failed" and "--output" in job["note"]), job
    assert not target.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give command.txt to another user")
def test_regress_names_the_owner_of_a_foreign_command_txt(workspace):
    fake_job(workspace, "77", "submit.sh tiny:base -N 1 -p gpu -- steps=10")
    os.chown(workspace / "77-JAX-tiny-base" / "artifact" / ".submit" / "command.txt", 65534, 65534)
    res = sweep_run(workspace, "regress", "tiny", "--baseline", "77", "--dry-run", "--json")
    rec = as_json(res)
    owner = pwd.getpwuid(65534).pw_name
    assert rec["params"]["baseline"]["command_owner"] == owner and not rec["params"]["baseline"]["command_owner_is_you"]
    assert any(f"is owned by {owner}, not by you" in n for n in rec["notes"]), rec["notes"]


BAD = [
    (["batch", "tiny", "--values", "1,x"], "not a positive number"),
    (["batch", "tiny", "--values", "0"], "not a positive number"),
    (["batch", "tiny"], "--values"),
    (["batch", "nosuchmodel", "--values", "1"], "unknown model"),
    (["batch", "tiny:bad/tag", "--values", "1"], "bad tag"),
    (["batch", "tiny", "--values", "1", "--steps", "0"], "positive whole number"),
    (["batch", "tiny", "--values", "1", "--max-parallel", "0"], "positive whole number"),
    (["batch", "tiny", "--values", "1", "--", "-N", "2"], "set by the sweep"),
    (["batch", "tiny", "--values", "1", "--", "--", "per_device_batch_size=2"], "use --values"),
    (["batch", "tiny", "--values", "1", "--", "--", "notanoverride"], "KEY=VALUE"),
    (["nodes", "tiny", "--nodes", "n1,n9"], "unknown node"),
    (["nodes", "tiny", "--nodes", "n1,n1"], "twice"),
    (["nodes", "tiny", "--", "-w", "n1"], "set by the sweep"),
    (["bisect", "tiny", "--nodes", "n1,n2"], "at least 3 usable nodes"),
    (["regress", "tiny", "--baseline", "424242"], "no job '424242'"),
    (["show", "/nonexistent/record.json"], "cannot read record"),
    (["show", ""], "is empty"),
    (["resume", "/"], "not a regular file"),
    (["regress", "tiny", "--baseline", ""], "empty JOB argument"),
    (["regress", "tiny", "--baseline", "/"], "not a job directory"),
    (["regress", "tiny", "--baseline", "7" * 300], "File name too long"),
    (["batch", "tiny", "--values", "1", "--workspace", "/etc/passwd"], "is not a directory"),
    (["frobnicate", "tiny"], "invalid choice"),
]


@pytest.mark.cluster
@pytest.mark.parametrize("args,why", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input(cluster, workspace, args, why):
    res = sweep_run(workspace, *args, env=cluster, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert why in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not res.stdout, res.stdout + res.stderr
    assert not list(workspace.iterdir()), "nothing may be submitted or written on bad input"


def test_incomplete_record_is_one_line(tmp_path):
    for i, text in enumerate(['{"sweep": "batch", "version": 1}', '{"sweep": "regress", "version": 1, "jobs": [1]}']):
        path = tmp_path / f"{i}.json"
        path.write_text(text)
        for kind in ("show", "resume"):
            res = run([str(VENV / "bin" / "python"), TOOL, kind, str(path)], timeout=60)
            assert res.returncode == 2 and "not a complete sweep record" in res.stderr, res.stderr
            assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


# --- the decisions, on made-up results ------------------------------------------------------------
class FakeSweep(sweep.loop.Sweep):
    """The sweep loop with submit.sh and Slurm replaced by a table of outcomes."""

    def __init__(self, kind: str, params: dict, outcomes: dict, tmp: Path) -> None:
        super().__init__(kind, "tiny", params, sweep.loop.Options(tmp, poll=0.01), [])
        self.outcomes, self.submitted = outcomes, []

    def submit(self, job):
        self.submitted.append(job.label)
        job.job_id, job.status = str(len(self.submitted)), "submitted"

    def poll(self, job):
        return True

    def finish(self, job):
        status, cls, rate, *culprits = self.outcomes[job.label]
        job.status, job.failure_class, job.tgs_steady = status, cls, rate
        job.culprit_hosts = list(culprits)


def test_batch_stops_going_up_at_the_first_oom(tmp_path):
    params = {
        "model": "tiny",
        "tag": "",
        "sbatch": [],
        "overrides": [],
        "values": ["1", "2", "4", "8"],
        "key": "per_device_batch_size",
        "nodes": 1,
        "steps": 5,
    }
    outcomes = {
        "bs1": ("completed", None, 100.0),
        "bs2": ("completed", None, 150.0),
        "bs4": ("failed", "oom_device", None),
    }
    sw = FakeSweep("batch", params, outcomes, tmp_path)
    sweep.batch.drive_batch(sw)
    assert sw.submitted == ["bs1", "bs2", "bs4"]
    r = sw.result
    assert r["best"]["value"] == "2" and r["largest_fitting"] == "2"
    assert r["first_oom"] == {"value": "4", "job_id": "3", "failure_class": "oom_device"} and r["skipped"] == ["8"]
    assert "ran out of memory" in sw.jobs[3].note


# --- the failure policy (utils/sweep/policy.py) ------------------------------------------
@pytest.mark.parametrize(
    "status, cls, culprits, retried, earlier, action",
    [
        ("completed", None, [], False, [], "keep"),
        ("failed", "oom_device", [], False, [], "skip_value"),
        ("failed", "oom_host", [], False, ["oom_host"], "skip_value"),  # larger values failing too is expected
        ("failed", "gpu_health", ["n3"], False, [], "exclude_node_retry"),
        ("failed", "gpu_error", ["n3"], False, [], "exclude_node_retry"),
        ("failed", "node_failure", ["n3"], False, [], "exclude_node_retry"),
        ("failed", "node_failure", ["n3", "n4"], False, [], "mark_failed"),  # not one culprit
        ("failed", "gpu_health", ["n3"], True, [], "mark_failed"),  # once only
        ("failed", "config_error", [], False, [], "stop"),
        ("failed", "hang", [], False, [], "retry"),
        ("timeout", None, [], False, [], "retry"),  # cancelled at --timeout: a hang
        ("timeout", None, [], True, [], "mark_failed"),
        ("failed", "python_exception", [], False, [], "mark_failed"),
        ("failed", "python_exception", [], False, ["python_exception"], "stop"),  # every job the same
        ("failed", "python_exception", [], False, ["segfault"], "mark_failed"),
        ("submit_failed", None, [], False, ["submit_failed"], "stop"),  # compared by status without a class
        ("failed", "hang", [], False, ["hang"], "stop"),
    ],
)
def test_failure_policy_per_class(status, cls, culprits, retried, earlier, action):
    d = sweep.policy.decide(status, cls, culprits, retried, earlier)
    assert d["action"] == action, d
    assert d["reason"]


def test_failure_policy_is_documented():
    doc = (REPO / "docs" / "sweep.md").read_text()
    for cls, action, _why in sweep.policy.table():
        assert f"| `{cls}` | `{action}` |" in doc, (cls, action)


def test_candidate_only_failures():
    base = {"a": True, "b": True, "c": False, "d": True}
    cand = {"a": False, "b": False, "c": False, "d": True}
    assert sweep.policy.candidate_only_failures(base, cand) == ["a", "b"]


def batch_params(values, key="per_device_batch_size"):
    return {
        "model": "tiny",
        "tag": "",
        "sbatch": [],
        "overrides": [],
        "values": values,
        "key": key,
        "nodes": 1,
        "steps": 5,
    }


def test_policy_in_a_sweep_excludes_a_bad_node_and_retries_once(tmp_path):
    outcomes = {
        "bs1": ("completed", None, 100.0),
        "bs2": ("failed", "gpu_health", None, "n7"),
        "bs2-retry": ("completed", None, 120.0),
        "bs4": ("timeout", None, None),
        "bs4-retry": ("timeout", None, None),
    }
    sw = FakeSweep("batch", batch_params(["1", "2", "4"]), outcomes, tmp_path)
    sweep.batch.drive_batch(sw)
    assert sw.submitted == ["bs1", "bs2", "bs4", "bs2-retry", "bs4-retry"]
    retry = next(j for j in sw.jobs if j.label == "bs2-retry")
    assert "--exclude=n7 --" in retry.command and retry.info["retry_of"] == "bs2"
    acts = [(d["label"], d["action"]) for d in sw.decisions]
    assert acts == [("bs2", "exclude_node_retry"), ("bs4", "retry"), ("bs4-retry", "mark_failed")]
    assert sw.decisions[0]["excluded_node"] == "n7" and sw.decisions[0]["culprit_hosts"] == ["n7"]
    assert sw.result["best"]["value"] == "2" and sw.stop_reason is None
    assert [r["value"] for r in sw.result["values"]] == ["1", "2", "4"]  # a retried job counts by its retry


def test_policy_every_value_hanging_twice_stops_the_sweep(tmp_path):
    outcomes = {label: ("failed", "hang", None) for v in "124" for label in (f"bs{v}", f"bs{v}-retry")}
    sw = FakeSweep("batch", batch_params(["1", "2", "4"]), outcomes, tmp_path)
    sweep.batch.drive_batch(sw)
    # each value is retried once (a job and its retry count once), then two hung values stop it
    assert [(d["label"], d["action"]) for d in sw.decisions] == [
        ("bs1", "retry"),
        ("bs2", "retry"),
        ("bs4", "retry"),
        ("bs1-retry", "mark_failed"),
        ("bs2-retry", "stop"),
    ]
    assert "every job so far failed the same way (hang" in (sw.stop_reason or "")
    assert next(j for j in sw.jobs if j.label == "bs4-retry").status == "skipped"


def test_policy_stops_the_sweep_on_a_config_error(tmp_path):
    outcomes = {"bs1": ("failed", "config_error", None)}
    sw = FakeSweep("batch", batch_params(["1", "2", "4"]), outcomes, tmp_path)
    sweep.batch.drive_batch(sw)
    assert sw.submitted == ["bs1"] and "config does not load" in (sw.stop_reason or "")
    assert [j.status for j in sw.jobs] == ["failed", "skipped", "skipped"]
    assert sw.decisions[0]["action"] == "stop" and sw.to_json()["decisions"][0]["label"] == "bs1"


def test_policy_does_not_retry_what_nodes_measures(tmp_path):
    outcomes = {"node-a1": ("failed", "gpu_health", None, "a1"), "node-a2": ("completed", None, 100.0)}
    p = {**batch_params([]), "nodes": ["a1", "a2"], "unavailable": [], "z": 3.5, "min_deviation_pct": 5.0}
    sw = FakeSweep("nodes", p, outcomes, tmp_path)
    sweep.nodes.drive_nodes(sw)
    assert sw.submitted == ["node-a1", "node-a2"] and sw.decisions[0]["action"] == "mark_failed"


def test_dry_run_env_sweep_keeps_each_value_one_token(workspace):
    flags = ["--xla_gpu_enable_latency_hiding_scheduler=true --xla_foo='a b'", "--xla_gpu_enable_triton_gemm=false"]
    rec = dry_json(
        workspace,
        "batch",
        "tiny",
        "--key",
        "_env_XLA_FLAGS",
        f"--value={flags[0]}",
        f"--value={flags[1]}",
        "--steps",
        "3",
    )
    assert [j["label"] for j in rec["jobs"]] == ["v1", "v2"] and [j["value"] for j in rec["jobs"]] == flags
    for job, v in zip(rec["jobs"], flags, strict=True):
        argv = shlex.split(job["command"])
        assert argv[:4] == [SUBMIT, f"tiny:{job['label']}", "-N", "1"]
        assert argv[argv.index("--") + 1 :] == [f"_env_XLA_FLAGS={v}", "steps=3"]
    # free-form values are for _env_ keys; numbers go through --values
    bad = sweep_run(workspace, "batch", "tiny", "--value", "x", "--dry-run")
    assert bad.returncode == 2 and "_env_" in bad.stderr
    bad = sweep_run(workspace, "batch", "tiny", "--dry-run")
    assert bad.returncode == 2 and "--values" in bad.stderr


# --- models: every config at its documented node count, one or two commits -------------------------
def test_dry_run_models_plan(workspace):
    rec = dry_json(workspace, "models", "--models", "tiny,llama3.1-70b", "--nodes", "a1,a2,a3,a4,a5", "--steps", "4")
    assert rec["params"]["nodes_per_model"] == {"tiny": 1, "llama3.1-70b": 4}  # the header's 80 GB minimum
    assert rec["params"]["node_lists"] == {"tiny": ["a1"], "llama3.1-70b": ["a1", "a2", "a3", "a4"]}
    assert commands(rec) == [
        f"{SUBMIT} tiny:models -N 1 -w a1 -- steps=4 dataset_type=synthetic",
        f"{SUBMIT} llama3.1-70b:models -N 4 -w a1,a2,a3,a4 -- steps=4 dataset_type=synthetic",
    ]
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    rec = dry_json(workspace, "models", "--models", "tiny", "--commits", f"{head},HEAD~1")
    base, cand = rec["params"]["commits"]
    assert base == head and len(cand) == 40
    assert [j["commit"] for j in rec["jobs"]] == [base, cand]
    assert commands(rec)[0].startswith(
        f"{workspace}/{getpass.getuser()}/sweeps/checkouts/{base[:12]}/submit.sh tiny:c{base[:8]} -N 1 --"
    )
    assert not list(workspace.iterdir()), "a dry run makes no checkout"
    for bad, why in (
        (["--commits", "nosuchref"], "not a commit"),
        (["--nodes", "a1,a2", "--models", "llama3.1-70b"], "needs 4 node(s)"),
        (["--", "--", "dataset_type=hf"], "synthetic"),
    ):
        res = sweep_run(workspace, "models", "--models", "tiny", "--dry-run", *bad)
        assert res.returncode == 2 and why in res.stderr, (bad, res.stderr)


def models_params(commits):
    return {
        "model": "tiny,qwen3-8b,llama3.1-8b",
        "models": ["tiny", "qwen3-8b", "llama3.1-8b"],
        "tag": "",
        "commits": commits,
        "nodes_per_model": {"tiny": 1, "qwen3-8b": 1, "llama3.1-8b": 1},
        "node_lists": {},
        "steps": 5,
        "sbatch": [],
        "overrides": [],
    }


def test_models_side_by_side_table_and_early_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep.models, "checkout_of", lambda sw, sha: tmp_path / sha)
    a, b = "a" * 40, "b" * 40
    outcomes = {
        f"tiny@{a[:8]}": ("completed", None, 100.0),
        f"tiny@{b[:8]}": ("completed", None, 90.0),
        f"qwen3-8b@{a[:8]}": ("completed", None, 50.0),
        f"qwen3-8b@{b[:8]}": ("failed", "python_exception", None),
        f"llama3.1-8b@{a[:8]}": ("completed", None, 40.0),
        f"llama3.1-8b@{b[:8]}": ("failed", "segfault", None),
    }
    sw = FakeSweep("models", models_params([a, b]), outcomes, tmp_path)
    sweep.models.drive_models(sw)
    assert sw.jobs[1].command.startswith(
        f"{tmp_path / b}/submit.sh tiny:c{b[:8]} -N 1 -- steps=5 dataset_type=synthetic"
    )
    rows = {r["model"]: r for r in sw.result["models"]}
    assert rows["tiny"]["tgs_delta_pct"] == -10.0 and rows["qwen3-8b"]["tgs_delta_pct"] is None
    assert "qwen3-8b" in (sw.stop_reason or "") and "llama3.1-8b" in sw.stop_reason  # two candidate-only failures
    table = "\n".join(sweep.models.models_table(sw.result))
    assert "-10.00%" in table and "python_exception" in table and "segfault" in table


def test_models_one_commit_has_no_delta(tmp_path):
    outcomes = {m: ("completed", None, 10.0) for m in ("tiny", "qwen3-8b", "llama3.1-8b")}
    sw = FakeSweep("models", models_params([]), outcomes, tmp_path)
    sweep.models.drive_models(sw)
    assert sw.submitted == ["tiny", "qwen3-8b", "llama3.1-8b"] and sw.stop_reason is None
    assert all(r["tgs_delta_pct"] is None for r in sw.result["models"])
    assert "3 of 3 job(s) measured" in sw.result["conclusion"]


def test_regress_sees_a_diverged_loss(tmp_path):
    # the rerun's log ends as MaxText 0.2.5 does when the loss turns nan (recorded lines)
    fixture = REPO / "tests" / "fixtures" / "maxtext_0.2.5" / "nan_loss_steps.log"
    log = tmp_path / "4243-JAX-tiny.log"
    log.write_text("".join(f"n1: {ln}" for ln in fixture.read_text().splitlines(keepends=True)))
    job = sweep.loop.Job(label="rerun", command="submit.sh tiny", status="submitted", log=str(log))
    sweep.loop.read_result(job)
    assert job.final_loss != job.final_loss and job.last_step == 2  # nan, read by joblog
    base = {"job_id": "77", "status": "completed", "tgs_steady": 5000.0, "final_loss": 5.545, "last_step": 2}
    base["command"] = "submit.sh tiny"
    r = sweep.regress.regress_result(base, job, 3.0, 1.0, True)
    assert r["loss_verdict"] == "changed" and r["loss_delta"] is None, r
    assert "final loss nan vs 5.545: changed" in r["conclusion"]
    assert (
        sweep.regress.regress_result({**base, "final_loss": float("nan")}, job, 3.0, 1.0, True)["loss_verdict"]
        == "same"
    )


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def test_a_diverged_loss_keeps_the_record_strict_json(tmp_path):
    # the nan of a diverged run and an inf are written as strings: strict JSON parsers read the record
    params = {"model": "tiny", "tag": "", "sbatch": [], "overrides": [], "values": ["1", "2"]}
    params |= {"key": "per_device_batch_size", "nodes": 1, "steps": 5}
    sw = FakeSweep("batch", params, {"bs1": ("completed", None, 100.0), "bs2": ("failed", None, None)}, tmp_path)
    sweep.batch.drive_batch(sw)
    sw.jobs[0].final_loss, sw.jobs[1].final_loss = float("nan"), float("-inf")
    sw.open_record()
    rec = json.loads(sw.record.read_text(), parse_constant=_no_constants)
    assert [j["final_loss"] for j in rec["jobs"]] == ["nan", "-inf"]
    assert "  bs1 " in sweep.record.render(rec) and " nan" in sweep.record.render(rec).splitlines()[2]
    # read back (resume): floats again
    jobs = [sweep.loop.Job.from_json(j) for j in rec["jobs"]]
    assert math.isnan(jobs[0].final_loss) and jobs[1].final_loss == float("-inf") and jobs[0].tgs_steady == 100.0
    # the --json output of show is strict too
    res = run([str(VENV / "bin" / "python"), TOOL, "show", str(sw.record), "--json"], timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout, parse_constant=_no_constants)["jobs"][0]["final_loss"] == "nan"
    # a resumed regress compares with the baseline's "nan" as with a nan
    job = sweep.loop.Job(label="rerun", command="submit.sh tiny", status="completed", tgs_steady=100.0, final_loss=5.0)
    base = {"job_id": "7", "status": "completed", "tgs_steady": 100.0, "final_loss": "nan", "last_step": 2}
    r = sweep.regress.regress_result({**base, "command": "submit.sh tiny"}, job, 3.0, 1.0, True)
    assert r["loss_verdict"] == "changed" and "final loss 5 vs nan: changed" in r["conclusion"], r


def test_nodes_outliers_are_robust():
    rates = {"n1": 100.0, "n2": 101.0, "n3": 99.0, "n4": 100.5, "n5": 60.0, "n6": 99.5}
    got = sweep.nodes.mad_outliers(rates, z=3.5, min_deviation=0.05)
    assert [o["node"] for o in got["outliers"]] == ["n5"] and got["outliers"][0]["direction"] == "slow"
    # identical nodes (MAD 0) with a 1 % wobble: not an outlier (below the 5 % floor)
    assert not sweep.nodes.mad_outliers({"a": 100.0, "b": 100.0, "c": 100.0, "d": 99.0}, 3.5, 0.05)["outliers"]
    assert "at least 3" in sweep.nodes.mad_outliers({"a": 1.0, "b": 2.0}, 3.5, 0.05)["note"]


def test_bisect_names_the_node_that_is_bad_with_every_partner(tmp_path):
    params = {
        "model": "tiny",
        "tag": "",
        "sbatch": [],
        "overrides": [],
        "nodes": ["n1", "n2", "n3", "n4", "n5", "n6"],
        "steps": 5,
        "slow_threshold_pct": 10.0,
    }
    ok = ("completed", None, 100.0)
    outcomes = {
        "r1-n1-n2": ok,
        "r1-n3-n4": ("completed", None, 50.0),
        "r1-n5-n6": ok,
        "r2-n3-n1": ("failed", "collective_error", None),
        "r2-n4-n2": ok,
    }
    sw = FakeSweep("bisect", params, outcomes, tmp_path)
    sweep.bisect.drive_bisect(sw)
    assert sw.submitted == ["r1-n1-n2", "r1-n3-n4", "r1-n5-n6", "r2-n3-n1", "r2-n4-n2"]
    r = sw.result
    assert [s["node"] for s in r["suspects"]] == ["n3"]
    assert [e["job_id"] for e in r["suspects"][0]["evidence"]] == ["2", "4"]
    assert [e["verdict"] for e in r["suspects"][0]["evidence"]] == ["slow", "failed"]
    assert "n3" in r["conclusion"] and r["suspect_pairs"] == []
    # odd count: the last node pairs with the first; its cross-check uses another good node
    sw = FakeSweep(
        "bisect",
        {**params, "nodes": ["n1", "n2", "n3", "n4", "n5"]},
        {"r1-n1-n2": ok, "r1-n3-n4": ok, "r1-n5-n1": ("failed", None, None), "r2-n5-n2": ok},
        tmp_path,
    )
    sweep.bisect.drive_bisect(sw)
    assert sw.submitted[-1] == "r2-n5-n2" and sw.result["suspects"] == []
    assert sw.result["suspect_pairs"] == [["n5", "n1"]]
    # every pair bad: no single node to blame, and no cross-check is possible
    sw = FakeSweep(
        "bisect",
        {**params, "nodes": ["n1", "n2", "n3", "n4"]},
        {"r1-n1-n2": ("failed", None, None), "r1-n3-n4": ("failed", None, None)},
        tmp_path,
    )
    sweep.bisect.drive_bisect(sw)
    assert sw.submitted == ["r1-n1-n2", "r1-n3-n4"] and "every pair" in sw.result["conclusion"]


# --- real sweeps on the local cluster ---------------------------------------------------------------
@pytest.fixture(scope="module")
def batch_run(cluster, venv, tmp_path_factory):
    ws = tmp_path_factory.mktemp("sweep-batch")
    res = sweep_run(
        ws,
        "batch",
        "tiny",
        "--values",
        "1,2",
        "--steps",
        "5",
        "-N",
        "1",
        "--max-parallel",
        "2",
        "--json",
        *FAST,
        env=cluster,
    )
    return ws, res


@pytest.mark.cluster
def test_batch_real(cluster, batch_run):
    ws, res = batch_run
    assert res.returncode == 0, res.stderr
    rec = as_json(res)
    assert rec["state"] == "done" and [j["status"] for j in rec["jobs"]] == ["completed", "completed"], rec["jobs"]
    assert all(j["tgs_steady"] and j["final_loss"] for j in rec["jobs"])
    best = max(rec["jobs"], key=lambda j: j["tgs_steady"])
    assert rec["result"]["best"] == {"value": best["value"], "job_id": best["job_id"], "tgs_steady": best["tgs_steady"]}
    assert rec["result"]["largest_fitting"] == "2"
    saved = json.loads(Path(rec["record"]).read_text())
    assert Path(rec["record"]).parent == ws / getpass.getuser() / "sweeps" and saved["jobs"] == rec["jobs"]
    assert commands(rec) == [f"{SUBMIT} tiny:bs{v} -N 1 -- per_device_batch_size={v} steps=5" for v in (1, 2)]
    show = run([str(VENV / "bin" / "python"), TOOL, "show", rec["record"]])
    assert show.returncode == 0 and "best per_device_batch_size=" in show.stdout
    # resuming a finished sweep submits nothing and finds the same result
    again = sweep_run(ws, "resume", rec["record"], "--json", env=cluster)
    assert again.returncode == 0, again.stderr
    assert "submitted job" not in again.stderr and as_json(again)["result"] == rec["result"]


@pytest.mark.cluster
def test_nodes_real(cluster, workspace, venv):
    res = sweep_run(
        workspace,
        "nodes",
        "tiny",
        "--nodes",
        "all",
        "--steps",
        "5",
        "--max-parallel",
        "2",
        "--json",
        *FAST,
        env=cluster,
    )
    assert res.returncode == 0, res.stderr
    rec = as_json(res)
    assert sorted(rec["result"]["rates"]) == ["n1", "n2"], rec["result"]
    for j in rec["jobs"]:
        assert joblog.scan(j["log"]).nodes() == [j["node"]], "each job must run on the node it measures"
    assert rec["result"]["failing"] == [] and "outliers need at least 3" in rec["result"]["conclusion"]


def real_sweep(workspace: Path, cluster: dict[str, str], args: str, *extra: str):
    """A short sweep on the local cluster: ARGS (shell words) and EXTRA (tokens kept whole)."""
    return sweep_run(workspace, *shlex.split(args), *FAST, *extra, env=cluster)


@pytest.mark.cluster
@pytest.mark.slow
def test_models_two_commits_real(cluster, workspace, venv):
    """tiny (the config that runs on CPU) on two commits, each from its scratch clone: a side-by-side table."""
    res = real_sweep(
        workspace, cluster, "models --models tiny --commits HEAD~1,HEAD --steps 5 --nodes n1 --max-parallel 2"
    )
    assert res.returncode == 0, res.stderr
    record = next((workspace / getpass.getuser() / "sweeps").glob("*-models.json"))
    rec = json.loads(sweep_run(workspace, "show", str(record), "--json").stdout)
    assert rec["state"] == "done", rec
    row = rec["result"]["models"][0]
    assert [r["status"] for r in row["runs"]] == ["completed", "completed"], rec["jobs"]
    assert row["tgs_delta_pct"] is not None and row["node_list"] == ["n1"]
    for job in rec["jobs"]:  # each job ran the code of its own commit
        git = (Path(job["job_dir"]) / "artifact" / ".submit" / "git.txt").read_text()
        assert f"commit: {job['commit']}" in git, git
    text = sweep_run(workspace, "show", str(record)).stdout
    assert "delta" in text and f"{row['tgs_delta_pct']:+.2f}%" in text, text


@pytest.mark.cluster
@pytest.mark.slow
def test_a_config_error_stops_the_sweep_real(cluster, workspace, venv):
    res = real_sweep(
        workspace, cluster, "batch tiny --values 1,2 --steps 3 --json", "--", "--", "enable_streaming_diloco=true"
    )
    rec = as_json(res)
    assert rec["state"] == "stopped" and "config does not load" in rec["stop_reason"], rec
    assert [(j["status"], j["failure_class"]) for j in rec["jobs"]] == [("failed", "config_error"), ("skipped", None)]
    assert rec["decisions"][0]["action"] == "stop" and rec["decisions"][0]["evidence"]


@pytest.mark.cluster
@pytest.mark.slow
def test_env_sweep_real(cluster, workspace, venv):
    values = [
        "--xla_force_host_platform_device_count=1",
        "--xla_force_host_platform_device_count=1 --xla_dump_hlo_as_text",
    ]
    args = "batch tiny --key _env_XLA_FLAGS --steps 3 --max-parallel 2 --json"
    res = real_sweep(workspace, cluster, args, *(f"--value={v}" for v in values))
    assert res.returncode == 0, res.stderr
    rec = as_json(res)
    assert [j["status"] for j in rec["jobs"]] == ["completed", "completed"], rec["jobs"]
    for job, v in zip(rec["jobs"], values, strict=True):  # the value reached submit.sh as one argument
        cmd = (Path(job["job_dir"]) / "artifact" / ".submit" / "command.txt").read_text()
        assert f"_env_XLA_FLAGS={v}" in shlex.split(cmd), cmd


@pytest.mark.cluster
def test_regress_real(cluster, batch_run):
    ws, first = batch_run
    base = next(j for j in as_json(first)["jobs"] if j["value"] == "1")
    res = sweep_run(ws, "regress", "tiny", "--baseline", base["job_id"], "--json", *FAST, env=cluster)
    rec = as_json(res)
    r = rec["result"]
    assert r["verdict"] in ("same", "faster", "regression"), r
    assert res.returncode == (1 if r["verdict"] == "regression" else 0), res.stderr
    assert r["baseline"]["job_id"] == base["job_id"] and r["tgs_delta_pct"] is not None
    assert r["loss_verdict"] == "same", r  # same command, same synthetic data: same loss
    rerun = rec["jobs"][0]
    recorded = (Path(rerun["job_dir"]) / "artifact" / ".submit" / "command.txt").read_text().strip()
    assert recorded == r["baseline"]["command"] == "submit.sh tiny:bs1 -N 1 -- per_device_batch_size=1 steps=5"


@pytest.mark.cluster
def test_ctrl_c_cancels_only_the_sweeps_jobs(cluster, workspace, venv):
    env = {**cluster, **launcher_env(workspace)}
    other = run(["sbatch", "--parsable", "-w", "n2", "-o", "/dev/null", "--wrap", "sleep 120"], env=env).stdout.strip()
    assert other.isdigit()
    try:
        proc = subprocess.Popen(
            [
                str(VENV / "bin" / "python"),
                TOOL,
                "batch",
                "tiny:int",
                "--values",
                "1,2",
                "--steps",
                "100000",
                "--json",
                "--poll",
                "0.2",
                "--",
                "-w",
                "n1",
            ],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        records = workspace / getpass.getuser() / "sweeps"

        def submitted() -> str | None:
            for p in records.glob("*-batch.json"):
                try:
                    return json.loads(p.read_text())["jobs"][0]["job_id"]
                except (ValueError, KeyError, IndexError):
                    return None
            return None

        mine = str(wait_for(submitted, 60, "the sweep to submit its first job"))
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        rec = json.loads(out)
        assert rec["state"] == "interrupted" and [j["status"] for j in rec["jobs"]] == ["interrupted", "skipped"]
        assert wait_for(lambda: job_state(cluster, mine) == "CANCELLED", 30, "the sweep's job to be cancelled")
        assert job_state(cluster, other) in ("RUNNING", "PENDING"), "a job the sweep did not submit was touched"
    finally:
        run(["scancel", other], env=env)


@pytest.mark.cluster
@pytest.mark.slow
def test_a_hung_job_is_cancelled_and_retried_once_real(cluster, workspace, venv):
    """The first job's trainer is frozen (SIGSTOP) at step 40: the sweep sees the hang by the job
    monitor's rule (no step for 45 s), cancels it long before --timeout, retries it once, and the
    retry completes."""
    p = subprocess.Popen(
        [str(VENV / "bin" / "python"), TOOL, "batch", "tiny", "--values", "1", "--steps", "300", "--json", *FAST],
        env={**os.environ, **launcher_env(workspace), **cluster},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid = None
    try:
        log = wait_for(lambda: next(workspace.glob("*-JAX-tiny-bs1.log"), None), 120, "the first job's log")
        wait_for(lambda: "completed step: 40," in log.read_text(errors="replace"), 240, "the first job to train")
        pid = trainer_pid(log.name.split("-")[0], 0)
        assert pid
        os.kill(pid, signal.SIGSTOP)
        out, err = p.communicate(timeout=400)
    finally:
        if pid and Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.communicate()
    rec = json.loads(out)
    assert [(j["label"], j["status"]) for j in rec["jobs"]] == [("bs1", "timeout"), ("bs1-retry", "completed")], err
    assert "the job monitor's hang rule" in rec["jobs"][0]["note"], rec["jobs"][0]
    assert rec["decisions"][0]["action"] == "retry", rec["decisions"]
    assert rec["result"]["largest_fitting"] == "1", rec["result"]
