"""What the diagnosis commands share (utils/diagnosis/locate.py and cli.py), through the commands.

One rule for JOB in triage, diagnose, perf, sweep and investigate: a job id and the job's name find the same job; an
id that two jobs share is an error that names both; the results submit.sh moved aside for a newer job
of the same name (launch_lib.sh move_aside_job, run here for real) never match. And a report piped into a
reader that stops early ends quietly, with the tool's own exit status.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

from helpers import corpus, inproc, logcorpus

TOOLS = ("triage", "diagnose", "perf", "sweep", "investigate")


def tool(name: str, *args: str | Path, ws: Path) -> subprocess.CompletedProcess:
    """utils/<name>.py ARGS with the workspace given as $JOB_WORKSPACE (as a user's shell has it), run in
    this process (helpers/inproc.py: the tools' main; test_lint and the early reader below run the commands)."""
    return inproc.tool(name, *args, env={"JOB_WORKSPACE": str(ws)})


def job_args(name: str, job: str, model: str = "tiny") -> list[str]:
    """The arguments that make tool NAME read JOB and print JSON (sweep: a dry-run regress of MODEL)."""
    return {
        "triage": [job, "--json", "--no-scheduler"],
        "diagnose": [job, "--json"],
        "perf": [job, "--json"],
        "investigate": [job, "--json", "--no-scheduler"],
        "sweep": ["regress", model, "--baseline", job, "--dry-run", "--json"],
    }[name]


def one_line_error(res: subprocess.CompletedProcess, name: str, *needles: str) -> str:
    assert res.returncode == 2 and res.stdout == "", (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{name}.py: ") and "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def move_aside(base: Path, **env: str) -> subprocess.CompletedProcess:
    """What submit.sh does to an earlier job's log and dir (BASE.log, BASE) before a new job of the same name."""
    script = 'source utils/launch/lib.sh; source utils/launch/launch_lib.sh; move_aside_job "$1"'
    res = run(["bash", "-c", script, "_", str(base)], cwd=REPO, env={"PROG": "submit.sh", **env})
    assert res.returncode == 0 and "moved it to" in res.stderr, res.stderr
    return res


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """Job 4242 (a RAY=1 job: log, job dir with its TSDB and submit command) after an earlier job of
    the same name, whose log and dir submit.sh moved aside; the earlier job failed, the new one did not."""
    ws = tmp_path_factory.mktemp("ws")
    job = corpus.build("rdma_retransmits", ws, 2, job_id="4242").job_dir
    model = job.name.split("-JAX-")[1]
    (job / "artifact" / ".submit").mkdir(parents=True)
    (job / "artifact" / ".submit" / "command.txt").write_text(f"submit.sh {model} -N 2 -- steps=80\n")
    new = ws / "new"
    shutil.copytree(job, new / job.name, symlinks=True)
    shutil.copy2(ws / f"{job.name}.log", new / f"{job.name}.log")
    shutil.rmtree(job)
    logcorpus.write_job(logcorpus.Job(job_id="4242", model=model, failure="oom_device"), ws)  # the earlier job
    move_aside(job)
    for p in (new / job.name, new / f"{job.name}.log"):
        p.rename(ws / p.name)  # the new job, whose dir's `log` link names the same path as the earlier one's did
    new.rmdir()
    return ws


def the_job(ws: Path) -> Path:
    return next(p for p in ws.iterdir() if p.is_dir() and ".earlier-" not in p.name)


# one lookup rule (jobdir.py) serves every tool: the fast loop asks two of them, the whole suite all
@pytest.mark.parametrize(
    "name", [pytest.param(t, marks=() if t in ("triage", "diagnose") else pytest.mark.slow) for t in TOOLS]
)
def test_id_and_name_find_the_new_job_never_the_earlier_one(name, ws):
    job = the_job(ws)
    assert len(list(ws.glob("4242-JAX-*.earlier-*"))) == 2  # the earlier job's dir and log, moved aside
    seen = set()
    for arg in ("4242", job.name, f"{job.name}.log"):
        if name == "diagnose" and arg != job.name:
            continue  # one Prometheus is enough here; diagnose's id lookup is in tests/test_diagnose.py
        res = tool(name, *job_args(name, arg, job.name.split("-JAX-")[1]), ws=ws)
        assert res.returncode == 0, (arg, res.stderr)
        r = json.loads(res.stdout)
        if name == "sweep":
            base = r["params"]["baseline"]
            assert base["job_id"] == "4242" and base["command_file"].startswith(str(job) + "/"), base
            seen.add(base["command_file"])
        elif name == "diagnose":
            assert r["job_name"] == job.name and r["job_id"] == "4242" and r["verdict"] == "network", r
            assert r["tsdb"] == str(job / "prometheus")
            seen.add(r["tsdb"])
        else:
            assert r["job_dir"] == str(job) and r["log"] == str(ws / f"{job.name}.log"), r
            assert r["job_name"] == job.name
            seen.add(r["job_dir"])
    assert len(seen) == 1


def test_the_earlier_job_as_a_path_is_read_with_its_own_log(ws):
    earlier = next(p for p in ws.iterdir() if p.is_dir() and ".earlier-" in p.name)
    res = tool("triage", earlier, "--json", "--no-scheduler", ws=ws)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    # its `log` link names the new job's log; the log moved aside with it is the one that belongs to it
    assert r["log"] == str(ws / earlier.name.replace(".earlier-", ".log.earlier-")), r["log"]
    assert r["failure_class"] == "oom_device" and r["job_dir"] == str(earlier)


def test_triage_next_steps_run_the_commands_on_the_same_job(ws):
    """The commands triage prints (diagnose.py for the metrics, triage again) run as printed and read
    this job, whatever the workspace of the shell that runs them."""
    job = the_job(ws)
    r = json.loads(tool("triage", "4242", "--json", "--no-scheduler", ws=ws).stdout)
    diagnose, again = r["next_steps"][-2:]
    assert "# triage again" in again and "diagnose.py" in diagnose, r["next_steps"]
    res = run(["bash", "-c", again.split("   #")[0] + " --no-scheduler"], env={"JOB_WORKSPACE": "/nonexistent"})
    assert res.returncode == 0 and json.loads(res.stdout)["job_dir"] == str(job), res.stderr
    res = run(["bash", "-c", diagnose.split("   #")[0] + " --json"], env={"JOB_WORKSPACE": "/nonexistent"}, timeout=120)
    assert res.returncode == 0 and json.loads(res.stdout)["job_name"] == job.name, res.stderr


def test_only_earlier_results_match_nothing(tmp_path):
    logcorpus.write_job(logcorpus.Job(job_id="51", model="tiny"), tmp_path)
    move_aside(tmp_path / "51-JAX-tiny")
    for name in TOOLS:
        one_line_error(tool(name, *job_args(name, "51"), ws=tmp_path), name, f"no job '51' in {tmp_path}")
    res = tool("triage", "51-JAX-tiny", ws=tmp_path)  # nor a name (the same lookup in every tool)
    one_line_error(res, "triage", "no job '51-JAX-tiny'", "looked for 51-JAX-tiny.log and 51-JAX-tiny/")


def test_an_earlier_jobs_log_and_dir_move_aside_under_one_suffix(tmp_path):
    """The log and the dir of an earlier job go aside under one suffix (triage pairs them by it),
    also when the clock ticks between the two moves, and never onto an earlier pair's names."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ticks = tmp_path / "ticks"
    (bindir / "date").write_text(  # a clock one second later at every call
        f'#!/bin/bash\nn=$(($(cat {ticks} 2>/dev/null || echo 0) + 1)); echo "$n" > {ticks}\n'
        'printf "20261207T1200%02dZ\\n" "$n"\n'
    )
    (bindir / "date").chmod(0o755)
    path = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    for round_ in (1, 2):
        logcorpus.write_job(logcorpus.Job(job_id="51", model="tiny"), tmp_path)
        ticks.write_text("0")  # the second round's clock reads the first's second again
        move_aside(tmp_path / "51-JAX-tiny", **path)
        logs = sorted(p.name.split(".log.", 1)[1] for p in tmp_path.glob("51-JAX-tiny.log.earlier-*"))
        dirs = sorted(p.name.split(".", 1)[1] for p in tmp_path.glob("51-JAX-tiny.earlier-*") if p.is_dir())
        assert logs == dirs and len(logs) == round_, (logs, dirs)
    assert "earlier-20261207T120001Z" in logs, logs


def test_an_id_two_jobs_share_is_an_error_that_names_both(tmp_path):
    for model in ("tiny", "qwen3-8b"):  # Slurm's ids restart after a state reset: the same id, two jobs
        logcorpus.write_job(logcorpus.Job(job_id="77", model=model), tmp_path)
    for name in TOOLS:
        line = one_line_error(tool(name, *job_args(name, "77"), ws=tmp_path), name, "job id 77 is ambiguous")
        assert "77-JAX-qwen3-8b, 77-JAX-tiny" in line and "give one of these job names" in line
    res = tool("triage", *job_args("triage", "77-JAX-tiny"), ws=tmp_path)  # the name says which
    assert res.returncode == 0 and json.loads(res.stdout)["job_dir"] == str(tmp_path / "77-JAX-tiny"), res.stderr


def test_the_root_directory_is_no_job(tmp_path):
    for name in TOOLS:
        line = one_line_error(tool(name, *job_args(name, "/"), ws=tmp_path), name, "give a job id")
        assert ("neither a job dir nor a TSDB" if name == "diagnose" else "not a job directory") in line


@pytest.mark.parametrize("name", TOOLS)
def test_a_reader_that_stops_early_ends_the_report_quietly(name, ws, tmp_path):
    """`tool ... | head -1`: the pipe is closed before the report is written; no traceback, exit 0."""
    job = the_job(ws)
    for as_json in (True, False):
        args = job_args(name, job.name, job.name.split("-JAX-")[1])
        if not as_json:
            args = [a for a in args if a != "--json"]
        proc = subprocess.Popen(
            [str(VENV / "bin" / "python"), str(REPO / "utils" / f"{name}.py"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "JOB_WORKSPACE": str(ws)},
        )
        proc.stdout.close()  # the reader is gone before the tool writes
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0 and err == "", err
        if name in ("diagnose", "investigate"):
            break  # one Prometheus start is enough


@pytest.mark.parametrize("name", TOOLS)
def test_without_the_environment_each_tool_says_so_in_one_line(name, tmp_path):
    """Run directly by a python3 that has none of the project's packages and no environment to re-enter:
    one line naming what is missing and utils/setup_env.sh, exit 2, no traceback."""
    script = REPO / "utils" / f"{name}.py"
    args = job_args(name, "4242")
    env = {"MAXTEXT_SLURM_VENV": str(tmp_path / "no-venv"), "JOB_WORKSPACE": str(tmp_path)}
    # -S: no site-packages, as a login node's bare python3 (the tool must not need numpy to say so)
    res = run(["/usr/bin/python3", "-S", str(script), *args], env=env, cwd=tmp_path, timeout=60)
    lines = res.stderr.strip().splitlines()
    assert "Traceback" not in res.stderr and len(lines) == 1 and lines[0].startswith(f"{name}.py: "), res.stderr
    assert res.returncode == 2, res.stderr
    if "needs" not in lines[0]:  # a tool on the standard library alone runs: it finds no job 4242 there
        assert name != "diagnose" and "no job '4242'" in lines[0], res.stderr
    else:  # numpy (diagnose) or a Python 3.11 are missing: the environment is what to make
        assert "needs the Python package" in lines[0] or "needs Python 3.11" in lines[0], res.stderr
        assert str(REPO / "utils" / "setup_env.sh") in lines[0] and str(tmp_path / "no-venv") in lines[0]


def test_diagnose_with_no_prometheus_binary_is_one_line(ws, tmp_path):
    res = run(
        [str(REPO / "utils" / "diagnose.py"), the_job(ws).name],
        env={"JOB_WORKSPACE": str(ws), "PROMETHEUS_BIN": "/nonexistent"},
        cwd=tmp_path,
        timeout=120,
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and res.stdout == "" and len(lines) == 1, (res.returncode, res.stderr)
    assert lines[0].startswith("diagnose.py: ") and "PROMETHEUS_BIN=/nonexistent is not an executable" in lines[0]


def test_sweep_records_carry_their_schema_and_the_resume_command_is_the_tool(tmp_path):
    """An interrupted sweep prints `<repo>/utils/sweep.py resume RECORD` (runnable from anywhere); its
    record says "schema": "sweep/1", and a record written before ("version": 1) still reads."""
    import sweep.loop
    import sweep.record

    sw = sweep.loop.Sweep(
        "batch", "tiny", {"model": "tiny", "values": ["1"]}, sweep.loop.Options(tmp_path), ["batch", "tiny"]
    )
    sw.record, sw.state = tmp_path / "sweeps" / "x-batch.json", "interrupted"
    rec = sw.to_json()
    assert rec["schema"] == "sweep/1" and "version" not in rec
    line = sweep.record.render(rec).splitlines()[-1]
    cmd = line.split("continue with: ")[1].split()
    assert cmd[0] == str(REPO / "utils" / "sweep.py") and cmd[1:] == ["resume", str(sw.record)], line
    old = {k: v for k, v in rec.items() if k != "schema"} | {"version": 1}
    for i, r in enumerate((rec, old)):
        (tmp_path / f"{i}.json").write_text(json.dumps(r))
        res = run([cmd[0], "show", str(tmp_path / f"{i}.json"), "--json"], cwd=tmp_path, timeout=60)
        assert res.returncode == 0 and json.loads(res.stdout)["sweep"] == "batch", res.stderr
    (tmp_path / "2.json").write_text(json.dumps(rec | {"schema": "sweep/2"}))
    res = run([cmd[0], "show", str(tmp_path / "2.json")], cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "is not a sweep record (schema sweep/1)" in res.stderr, res.stderr
