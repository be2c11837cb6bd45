"""A job whose nodes all exit 0 but whose log holds not one step line (issue 20: on an Ubuntu 24.04 node
mawk cut MaxText's long `Config param` line at 4096 characters and dropped every later line while the
GPU trained) is never healthy: the JOB SUMMARY says `steps: none`, triage says `failed`/`no_steps` with
where each node's output stops, the job monitor's end event is a failure, and a sweep keeps it as a
failure, not a measurement. The logs are tests/helpers/logcorpus.py's (failure "no_steps")."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import REPO, VENV, run
from test_sweep import FakeSweep, batch_params

import sweep.batch
import sweep.loop
from diagnosis import triage
from helpers import logcorpus
from monitor.watch import Rules, Watch

SUMMARY = str(REPO / "utils" / "launch" / "job_summary.sh")


def write(ws: Path, failure: str | None, job_id: str, **kw) -> tuple[logcorpus.Job, Path]:
    job = logcorpus.Job(failure=failure, job_id=job_id, **{"hosts": ["n1", "n2"], **kw})
    return job, logcorpus.write_job(job, ws)


def summary_of(log: Path, stage: str = "train", **env: str) -> dict[str, str]:
    """job_summary.sh on the log without its JOB SUMMARY (as the launcher runs it at the job's end)."""
    text = log.read_text()
    log.write_text(text[: text.index("==================== JOB SUMMARY")])
    res = run(
        [SUMMARY, "completed", stage],
        env={
            "JOB_ID": "1",
            "JOB_NAME": log.stem,
            "JOB_DIR": str(log.with_suffix("")),
            "JOB_LOG": str(log),
            "JOB_NODELIST": "n1 n2",
            "MST_VENV": str(VENV),
            **env,
        },
    )
    assert res.returncode == 0, res.stderr
    return dict(ln.split(": ", 1) for ln in res.stdout.splitlines() if ": " in ln)


def test_first_error_passes_over_maxtexts_no_op_notes(tmp_path):
    """MaxText says it stubs a left-out optional module with a line naming ModuleNotFoundError (a real
    job's log, MaxText 0.2.5 with requirements/maxtext.txt); a failed job's first_error is the error
    after it, not that note (a SIGKILLed Ray job's summary named it)."""
    job_dir = tmp_path / "1-JAX-tiny"
    (job_dir / ".stages" / "train").mkdir(parents=True)
    (job_dir / ".stages" / "train" / "n1").write_text("rc=137 end=1.0 reason=exit\n")
    log = tmp_path / "1-JAX-tiny.log"
    log.write_text(
        "==================== JOB ====================\n"
        "n1: [NO-OP] ml_goodput_measurement: dependency missing; using stub. (ModuleNotFoundError)\n"
        "n1: I1207 14:51:44.984457    9838 coordination_service_agent.cc:275] Polling for error\n"
        "n1: /tmp/x/_train.sh: line 9:  7676 Killed                  python -m maxtext\n"
    )
    env = {"JOB_ID": "1", "JOB_NAME": "1-JAX-tiny", "JOB_DIR": str(job_dir), "JOB_LOG": str(log)}
    res = run([SUMMARY, "failed", "train"], env={**env, "JOB_NODELIST": "n1", "MST_VENV": str(VENV)})
    got = dict(ln.split(": ", 1) for ln in res.stdout.splitlines() if ": " in ln)
    assert got["first_error"] == "n1: /tmp/x/_train.sh: line 9:  7676 Killed                  python -m maxtext", got


def test_job_summary_reports_the_steps_seen(tmp_path):
    _, log = write(tmp_path, None, "1", steps=20)
    s = summary_of(log)
    assert s["status"] == "completed" and s["steps"] == "0..19 (20 lines on n2)", s
    assert (log.with_suffix("") / "summary.txt").read_text().count("steps: 0..19 (20 lines on n2)") == 1
    _, log = write(tmp_path, "no_steps", "2")
    s = summary_of(log)
    assert s["status"] == "completed" and s["steps"] == "none", s
    # the same for a log without host prefixes
    _, log = write(tmp_path, None, "3", steps=5, hosts=["vm"], host_prefix=False)
    assert summary_of(log)["steps"] == "0..4 (5 lines)"


def test_job_summary_without_a_python_says_unknown_not_a_guess(tmp_path):
    _, log = write(tmp_path, None, "4", steps=5)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\nexit 1\n")  # an interpreter too old to run joblog.py
    (fake / "python3").chmod(0o755)
    s = summary_of(log, MST_VENV=str(tmp_path / "no-venv"), PATH=f"{fake}:/usr/bin:/bin")
    assert s["steps"].startswith("unknown (no Python 3.11 or newer here"), s


def test_job_summary_before_training_has_no_steps(tmp_path):
    _, log = write(tmp_path, "preflight", "5")
    assert summary_of(log, stage="preflight")["steps"] == "none"


def test_triage_fails_it_with_where_the_log_stops(tmp_path):
    job, log = write(tmp_path, "no_steps", "6")
    res = run([str(REPO / "utils" / "triage.py"), str(log), "--json", "--no-scheduler"])
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert (r["status"], r["failure_class"], r["culprit_hosts"], r["confidence"]) == ("failed", "no_steps", [], "high")
    lines = log.read_text().splitlines()
    stops = [e for e in r["evidence"] if e["why"].startswith("where a node's output stops")]
    # each node's last line before the JOB SUMMARY: the cut config line (4096 characters after the prefix)
    assert [e["host"] for e in stops] == ["n1", "n2"], r["evidence"]
    for e in stops:
        assert "Config param logical_axis_rules" in e["text"] and len(lines[e["line"] - 1]) == len("n1: ") + 4096
    assert r["evidence"][0] in stops  # decisive first
    assert {"steps: none", "status: completed"} <= {e["text"] for e in r["evidence"]}
    assert "no step line" in r["summary"] and f"line {stops[-1]['line']}" in r["summary"]
    assert any("log_config=false" in s for s in r["next_steps"]), r["next_steps"]
    text = run([str(REPO / "utils" / "triage.py"), str(log), "--no-scheduler"]).stdout
    assert "FAILED - no_steps" in text and "COMPLETED" not in text, text


def test_a_healthy_job_is_still_completed(tmp_path):
    _, log = write(tmp_path, None, "7", steps=20)
    r = triage.triage(str(log), opts=triage.Options(scheduler=False))
    assert (r["status"], r["failure_class"]) == ("completed", None)


def test_the_monitor_ends_it_as_a_failure(tmp_path):
    job, log = write(tmp_path, "no_steps", "8")
    w = Watch(log.with_suffix(""), Rules())
    events = w.poll(job.start + 120, "COMPLETED")
    end = [e for e in events if e.key == "end"]
    assert len(end) == 1, [(e.kind, e.title) for e in events]
    e = end[0]
    assert (e.kind, e.level, e.title) == ("failed", "failure", "failed: no_steps"), e
    assert e.data["status"] == "failed" and e.data["failure_class"] == "no_steps"
    assert "steps: none" in e.lines and any("Config param logical_axis_rules" in x for x in e.lines), e.lines


def test_a_sweep_keeps_it_as_a_failure_not_a_measurement(tmp_path):
    """The sweep reads each job's result with triage (sweep.loop.read_result): a no_steps job is failed,
    unmeasured, and the policy's mark_failed; the sweep goes on and the best value is a measured one."""
    ws = tmp_path / "ws"

    class LogSweep(FakeSweep):
        def finish(self, job):
            failure = {"bs2": "no_steps"}.get(job.label)
            _, log = write(ws, failure, job.job_id, steps=20)
            job.log, job.job_dir = str(log), str(log.with_suffix(""))
            sweep.loop.read_result(job)

    sw = LogSweep("batch", batch_params(["1", "2", "4"]), {}, tmp_path)
    sweep.batch.drive_batch(sw)
    by = {j.label: j for j in sw.jobs}
    assert (by["bs2"].status, by["bs2"].failure_class, by["bs2"].measured) == ("failed", "no_steps", False)
    assert by["bs1"].measured and by["bs4"].measured
    assert [(d["label"], d["action"], d["failure_class"]) for d in sw.decisions] == [("bs2", "mark_failed", "no_steps")]
    assert "no step line" in sw.decisions[0]["reason"]
    assert sw.result["best"]["value"] in ("1", "4") and sw.stop_reason is None
