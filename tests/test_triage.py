"""utils/triage.py and utils/joblog.py: every failure class on synthetic logs in the launcher's
real format (tests/helpers/logcorpus.py), with and without host/absl prefixes; hang vs a healthy running
job; throughput phases; heartbeat false positives; the CLI; and real local jobs (completed, a
config error, a SIGKILLed trainer, and triage while the job runs)."""

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

import joblog
from dev import failure_class_tables as tables
from diagnosis import failure_classes, triage
from helpers import inproc, logcorpus
from helpers.jobs import bad_job_arg, wait_for, wait_log

TRIAGE = str(REPO / "utils" / "triage.py")
CLASSES_TOOL = str(REPO / "utils" / "dev" / "failure_class_tables.py")
HOSTS = ["n1", "n2", "n3"]
# what each injected failure must be classified as (killed_gloo: a SIGKILLed rank, survivors print Gloo errors)
EXPECTED = {
    None: None,
    **{f: f for f in logcorpus.FAILURES},
    "killed_gloo": "oom_host",
    "preflight": None,
    "time_limit": "stage_timeout",
    **{f: "gpu_error" for f in logcorpus.GPU_ERRORS},
}
EXPECTED_STATUS = {None: "completed", "cancelled": "cancelled", "node_failure": "cancelled", "hang": "hung"}


def report(log: Path, now: float | None = None, **opts) -> dict:
    return triage.triage(str(log), opts=triage.Options(now=now, scheduler=False, **opts))


def job_for(failure, tmp_path: Path, **kw) -> tuple[logcorpus.Job, Path]:
    job = logcorpus.Job(failure=failure, **{"hosts": HOSTS, "steps": 40, "total_steps": 40, **kw})
    return job, logcorpus.write_job(job, tmp_path / "ws")


def assert_evidence_lines_match(r: dict, log: Path) -> None:
    lines = log.read_text().splitlines()
    assert r["evidence"], r
    for e in r["evidence"]:
        if e["file"] == str(log):
            assert lines[e["line"] - 1][:400] == e["text"], e


# --- every failure class, three line formats ------------------------------------------------
FORMATS = {
    "host+absl": {"hosts": HOSTS},
    "host, no absl": {"hosts": HOSTS, "absl": False},
    "one node, no host prefix": {"hosts": ["vm"], "host_prefix": False, "culprit": 0},
}


@pytest.mark.parametrize(
    ("failure", "fmt"),
    [
        (f, fmt)
        for fmt in FORMATS
        for f in [None, *logcorpus.FAILURES]
        if len(FORMATS[fmt]["hosts"]) > 1 or f not in logcorpus.MULTI_NODE
    ],
)
def test_failure_class(failure, fmt, tmp_path):
    kw = FORMATS[fmt]
    job, log = job_for(failure, tmp_path, **kw)
    r = report(log, now=job.start + 5000)
    assert r["failure_class"] == EXPECTED[failure], (r["summary"], r["evidence"])
    assert r["status"] == EXPECTED_STATUS.get(failure, "failed")
    culprit = kw["hosts"][job.culprit % len(kw["hosts"])]
    if failure in (
        "oom_host",
        "oom_device",
        "segfault",
        "collective_error",
        "python_exception",
        "heartbeat_timeout",
        "node_failure",
        "killed_gloo",
        "gpu_health",
        *logcorpus.GPU_ERRORS,
    ):
        assert r["culprit_hosts"] == [culprit], r
    if failure == "heartbeat_false_positive":  # the accused was alive: named, no culprit; the coordinator suspected
        assert r["culprit_hosts"] == [] and r["accused_hosts"] == [culprit], r
        assert r["suspect_hosts"] == [kw["hosts"][0]], r
    if failure == "heartbeat_timeout":
        assert r["accused_hosts"] == r["suspect_hosts"] == [culprit], r
    if failure == "hang" and len(kw["hosts"]) > 1:
        assert r["culprit_hosts"] == [culprit], r  # the rank that is one step behind
    if failure in ("cancelled", "stage_timeout", "time_limit"):
        assert r["culprit_hosts"] == []
    if failure == "preflight":  # outside the failure classes: no class, but the culprit and the reason
        assert r["culprit_hosts"] == [culprit] and "need PREFLIGHT_MIN_FREE_GB" in r["summary"]
    if failure == "gpu_health":  # the bad GPU in the summary; a Slurm job's next steps leave the node out
        assert "gpu 1 (amd 0000:26:00.0): FAILED: 2 uncorrectable ECC/RAS errors" in r["summary"], r["summary"]
        assert any(f"--exclude={culprit} -- steps=40" in s for s in r["next_steps"]), r["next_steps"]
    if failure is not None:
        assert_evidence_lines_match(r, log)
        assert r["next_steps"]
    if r["failure_class"]:  # the registry says what each class cites: no evidence outside it
        cites = failure_classes.BY_NAME[r["failure_class"]].cites
        assert {e["why"] for e in r["evidence"]} <= set(cites), (r["failure_class"], r["evidence"])


def test_needle_search_finds_the_same(tmp_path, monkeypatch):
    """Blocks with very many candidate lines are searched by literal needles: same results."""
    monkeypatch.setattr(joblog, "DENSE", 0)
    for failure in logcorpus.FAILURES:
        job, log = job_for(failure, tmp_path / failure)
        r = report(log, now=job.start + 5000)
        assert r["failure_class"] == EXPECTED[failure], failure
        assert_evidence_lines_match(r, log)


def _essentials(r: dict) -> tuple:
    return (
        r["status"],
        r["failure_class"],
        r["culprit_hosts"],
        r["progress"],
        r["tgs"],
        r["hosts"],
        [(e["file"], e["line"], e["text"]) for e in r["evidence"]],
    )


def test_small_blocks_give_the_same_report(tmp_path, monkeypatch):
    """Block boundaries (carry-over, look-ahead, per-host tails) do not change anything."""
    logs = []
    for failure in [None, *logcorpus.FAILURES]:
        job, log = job_for(failure, tmp_path / str(failure), hosts=["n1", "n2", "n3", "n4"], steps=60, total_steps=60)
        logs.append((log, job.start + 5000, report(log, now=job.start + 5000)))
    monkeypatch.setattr(joblog, "BLOCK", 4096)
    monkeypatch.setattr(joblog, "LOOKAHEAD", 2048)
    for log, now, want in logs:
        got = report(log, now=now)
        assert _essentials(got) == _essentials(want), log
        assert got["scan"]["lines"] == len(log.read_text().splitlines())


def test_a_node_that_went_quiet_long_before_the_end(tmp_path, monkeypatch):
    job, log = job_for(None, tmp_path, hosts=["n1", "n2", "n3", "n4"], steps=200, total_steps=200, running=True)
    out, quiet = [], False
    for ln in log.read_text().splitlines(keepends=True):
        quiet = quiet or (ln.startswith("n3: ") and "completed step: 30," in ln)
        if not (quiet and ln.startswith("n3: ") and "completed step: 30," not in ln):
            out.append(ln)
    log.write_text("".join(out))
    for block in (joblog.BLOCK, 4096):
        monkeypatch.setattr(joblog, "BLOCK", block)
        r = report(log, now=job.start + 100000)
        steps = {h["host"]: h["last_step"] for h in r["hosts"]}
        assert steps == {"n1": 199, "n2": 199, "n3": 30, "n4": 199}, block
        assert r["failure_class"] == "hang" and r["culprit_hosts"] == ["n3"]


# --- specific rules -------------------------------------------------------------------------
def test_killed_rank_with_gloo_errors_on_the_survivors(tmp_path):
    job, log = job_for("killed_gloo", tmp_path)
    r = report(log)
    assert r["failure_class"] == "oom_host" and r["culprit_hosts"] == ["n2"] and r["confidence"] == "low"
    assert "SIGKILL" in r["summary"] and "kill -9" in r["summary"]
    texts = " ".join(e["text"] for e in r["evidence"])
    assert "Gloo AllGather failed" in texts, "the survivors' collective error is cited as a consequence"
    assert any(e["file"].endswith("/.stages/train/n2") for e in r["evidence"])
    # only the log, cut before the summary, without srun's exit lines and without a job directory:
    # the culprit is still the silent peer
    bare = tmp_path / "bare.log"
    text = log.read_text()
    text = text[: text.index("==================== JOB SUMMARY")].replace(
        f"job_dir: {log.with_suffix('')}", "job_dir: /gone"
    )
    bare.write_text("".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("srun: error:")))
    r = report(bare)
    assert r["failure_class"] == "collective_error" and r["culprit_hosts"] == ["n2"], r["summary"]
    assert r["status"] == "unknown"


def test_collective_error_blames_the_peer_not_the_survivors(tmp_path):
    job, log = job_for("collective_error", tmp_path, culprit=2)
    r = report(log)
    assert r["failure_class"] == "collective_error" and r["culprit_hosts"] == ["n3"]
    assert r["hosts"][2]["end_reason"] == "stopped"
    assert "n1" in r["summary"] and "n2" in r["summary"]  # the reporters are named, not blamed


def test_heartbeat_claim_maps_task_to_host_by_node_rank(tmp_path):
    job, log = job_for("heartbeat_timeout", tmp_path, culprit=2)
    r = report(log)
    assert r["failure_class"] == "heartbeat_timeout" and r["culprit_hosts"] == ["n3"]
    claim = next(e for e in r["evidence"] if "unhealthy" in e["text"])
    assert claim["host"] == "n1"


def test_the_jobs_own_alert_lines_are_no_failure_evidence(tmp_path):
    """The alert relay's lines (docs/job-log.md: `<node>: alert: firing ...`) name OOM kills and Xid
    errors in their summaries and queries; triage must not take them for the trainer's own (seen live: a
    frozen rank's heartbeat timeout triaged as oom_host on n1, from an OOMKill alert about n2)."""
    job, log = job_for("heartbeat_timeout", tmp_path, culprit=2)
    oom = "sum by (host) (increase(hw_oom_kills_total[1m])) >= 1"
    alerts = [
        "n1: alert: firing OOMKill host=n2 check=memory value=4: the kernel OOM-killed 4 process(es) on n2; "
        f"query: {oom}",
        "n1: alert: resolved OOMKill host=n2 check=memory after 2 s",
        "n1: alert: firing GPUKernelErrors host=n2 check=gpu_hardware value=1: n2's kernel logged 1 GPU error events "
        "(Xid, amdgpu RAS or reset): the GPU may be failing; query: sum by (host) (hw_gpu_kernel_errors_total) >= 1",
    ]
    lines = log.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "completed step: 20," in ln)
    log.write_text("\n".join(lines[:at] + alerts + lines[at:]) + "\n")
    r = report(log)
    assert r["failure_class"] == "heartbeat_timeout" and r["culprit_hosts"] == ["n3"], r["summary"]
    assert not [e for e in r["evidence"] if "alert: " in e["text"]], r["evidence"]


def test_heartbeat_false_positive_needs_activity_after_the_claim(tmp_path):
    job, log = job_for("heartbeat_false_positive", tmp_path)
    r = report(log)
    assert r["failure_class"] == "heartbeat_false_positive" and r["culprit_hosts"] == []
    assert r["accused_hosts"] == ["n2"] and r["suspect_hosts"] == ["n1"]
    whys = [e["why"] for e in r["evidence"]]
    assert any("after the claimed time" in w for w in whys) and any("own death notice" in w for w in whys)
    # the same claim without the accused's later lines is a real heartbeat timeout
    job, log = job_for("heartbeat_timeout", tmp_path / "real")
    assert report(log)["failure_class"] == "heartbeat_timeout"


def test_heartbeat_claim_is_one_mapping_for_every_tool(tmp_path):
    # joblog.heartbeat_claim is what triage and diagnose both read: task i is node rank i
    job, log = job_for("heartbeat_timeout", tmp_path, culprit=2)
    claim = joblog.heartbeat_claim(joblog.scan(log))
    assert claim.tasks == [2] and claim.hosts == ["n3"] and claim.coordinator == "n1"
    assert claim.time is not None and claim.first.ts == claim.time and claim.first.host == "n1"
    assert joblog.heartbeat_claim(joblog.scan(job_for(None, tmp_path / "ok")[1])) is None


def test_hang_versus_healthy_running_job(tmp_path):
    job, log = job_for(None, tmp_path, running=True, steps=60, total_steps=200, step_time=2.0)
    last = report(log, now=0)["progress"]["last_step_time"]
    assert last is not None
    t_last = log.stat().st_mtime  # the generator sets the mtime to the last line's time
    healthy = report(log, now=t_last + 30)
    assert healthy["status"] == "running" and healthy["failure_class"] is None
    assert healthy["progress"]["last_step"] == 59 and healthy["progress"]["total_steps"] == 200
    assert healthy["progress"]["eta_seconds"] == pytest.approx(140 * 2.0, rel=0.1)
    assert healthy["hang"]["threshold_seconds"] == 120  # max(10 x 2 s, 120 s)
    hung = report(log, now=t_last + 600)
    assert hung["status"] == "hung" and hung["failure_class"] == "hang" and hung["progress"]["eta_seconds"] is None
    # the threshold follows the step time: 30 s steps -> 300 s
    job, log = job_for(None, tmp_path / "slow", running=True, steps=30, total_steps=200, step_time=30.0)
    t_last = log.stat().st_mtime
    assert report(log, now=t_last + 250)["status"] == "running"
    assert report(log, now=t_last + 400)["status"] == "hung"
    assert report(log, now=t_last + 250, hang_min_seconds=60, hang_factor=5)["status"] == "hung"


def test_running_job_with_an_error_is_classified_before_it_ends(tmp_path):
    job, log = job_for("python_exception", tmp_path, running=True)
    r = report(log, now=job.start + 60)
    assert r["status"] in ("running", "hung") and r["failure_class"] == "python_exception"


def test_two_throughput_phases(tmp_path):
    job, log = job_for(None, tmp_path, steps=300, total_steps=300, step_time=0.5, phases=[(150, 0.75)])
    r = report(log)
    phases = r["tgs"]["phases"]
    assert len(phases) == 2, phases
    assert abs(phases[1]["start_step"] - 150) <= 3 and phases[0]["start_step"] == 3 and phases[1]["end_step"] == 299
    assert phases[0]["mean"] == pytest.approx(2048 / 0.5, rel=0.03)
    assert phases[1]["mean"] == pytest.approx(2048 / 0.75, rel=0.03)
    assert r["tgs"]["warmup_steps_excluded"] == 3
    assert r["progress"]["steps_per_sec"] == pytest.approx(1 / 0.75, rel=0.05)  # the current phase


def test_steady_rate_is_one_phase_and_excludes_warmup(tmp_path):
    job, log = job_for(None, tmp_path, steps=200, total_steps=200, warmup_time=100.0)
    r = report(log)
    assert len(r["tgs"]["phases"]) == 1
    assert r["tgs"]["steady"] == pytest.approx(2048 / 0.5, rel=0.03)  # step 0 (100 s compile) left out


def test_phase_detection_is_robust_to_noise_and_spikes():
    steps = list(range(400))
    rates = [1000.0 * (1.2 if i % 7 == 0 else 0.9 if i % 5 == 0 else 1.0) for i in steps]
    rates[100] = 10.0  # one checkpoint step
    assert len(triage.throughput_phases(steps, rates, 20, 0.10)) == 1
    rates = rates[:250] + [r * 0.5 for r in rates[250:]]
    got = triage.throughput_phases(steps, rates, 20, 0.10)
    assert [p["start_step"] for p in got] == [0, 250]


def test_a_short_dip_in_the_middle_is_its_own_phase():
    """A 2-hour run at 4.5 s/step (1600 steps), steps 29 % longer for 14 minutes (187 steps) in the
        middle: no single cut passes the median test (the dip is a minority on either side), the best pair
        of cuts does. A flat series with 5 % noise, a dip shallower than 10 % and one of fewer than half of
    --phase-min-steps steps (the median of every 20-step stretch is fast) stay whole."""
    rng = random.Random(7)
    steps = list(range(1600))
    noise = [1 + rng.gauss(0, 0.012) for _ in steps]
    dip = [1000.0 / (1.29 if 700 <= i < 887 else 1.0) * noise[i] for i in steps]
    got = triage.throughput_phases(steps, dip, 20, 0.10)
    assert [(p["start_step"], p["end_step"]) for p in got] == [(0, 699), (700, 886), (887, 1599)], got
    assert got[1]["mean"] == pytest.approx(1000 / 1.29, rel=0.01) and got[0]["mean"] == pytest.approx(1000, rel=0.01)
    flat = [1000.0 * (1 + rng.gauss(0, 0.05)) for _ in steps]
    assert len(triage.throughput_phases(steps, flat, 20, 0.10)) == 1
    shallow = [1000.0 / (1.08 if 700 <= i < 887 else 1.0) * noise[i] for i in steps]
    assert len(triage.throughput_phases(steps, shallow, 20, 0.10)) == 1  # 7 % < --phase-threshold
    short = [1000.0 / (1.29 if 700 <= i < 709 else 1.0) * noise[i] for i in steps]
    assert len(triage.throughput_phases(steps, short, 20, 0.10)) == 1  # 9 steps: under half --phase-min-steps


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_midrun_slowdown_is_three_phases(tmp_path, seed):
    """The corpus' 10-20 minute mid-run slowdown (steps 25-35 % longer, then as fast as before): triage
    reports three phases, the middle one from the dip's first to its last step within two logged
    steps (the corpus logs every ~6th step), and hands over to the metrics."""
    from helpers import corpus

    inc = corpus.build("midrun_slowdown", tmp_path / "ws", seed)
    r = triage.triage(str(inc.log), tmp_path / "ws", triage.Options(scheduler=False))
    ph = r["tgs"]["phases"]
    assert r["status"] == "completed" and r["failure_class"] is None, r["summary"]
    assert len(ph) == 3, ph
    first, last = inc.notes["dip_steps"]
    tol = 2 * inc.notes["steps"] / corpus.SMALL.log_lines
    assert abs(ph[1]["start_step"] - first) <= tol and abs(ph[1]["end_step"] - last) <= tol, (ph, first, last)
    assert 1.2 < ph[0]["mean"] / ph[1]["mean"] < 1.4 and ph[2]["mean"] == pytest.approx(ph[0]["mean"], rel=0.02), ph
    assert any("diagnose.py" in n for n in r["next_steps"]), r["next_steps"]


def test_rampup_lines_and_optional_fields(tmp_path):
    job, log = job_for(None, tmp_path, rampup_steps=10, steps=50, total_steps=50)
    r = report(log)
    assert r["progress"]["last_step"] == 49
    assert r["tgs"]["steady"] == pytest.approx(2048 / 0.5, rel=0.03)
    assert r["tgs"]["phases"][0]["start_step"] >= 10  # ramp-up lines carry no Tokens/s


# --- MaxText 0.2.5's own step lines (tests/fixtures/maxtext_0.2.5, recorded from real runs) -------
MAXTEXT_LINES = REPO / "tests" / "fixtures" / "maxtext_0.2.5"


def maxtext_log(tmp_path: Path, name: str, prefix: str = "n1: ") -> Path:
    """A fixture's lines as a log, each behind PREFIX (the launcher's "<host>: ", or none)."""
    log = tmp_path / name
    log.write_text("".join(prefix + ln for ln in (MAXTEXT_LINES / name).read_text().splitlines(keepends=True)))
    return log


@pytest.mark.parametrize("prefix", ["n1: ", ""])
def test_real_rampup_lines_carry_no_rate_and_are_never_steady(tmp_path, prefix):
    # MaxText 0.2.5 writes "[Rampup Batch Size Phase], completed step: ..." (a comma after the marker)
    log = maxtext_log(tmp_path, "rampup_steps.log", prefix)
    for st in (joblog.scan(log).steps, next(iter(joblog.read_steps(log).hosts.values()))):
        assert st.step == list(range(8)) and st.rampup == 4
        assert st.tokens[:4] == [None] * 4 and st.tokens[4] == pytest.approx(15434.704)
        assert st.loss == pytest.approx([6.061, 6.144, 6.083, 6.060, 6.079, 6.076, 6.074, 6.073])
        assert st.final_loss() == pytest.approx(6.073)
        assert st.steady_rows(1) == ([5, 6, 7], 1)
    r = report(log)
    # steps 4-6 are the warm-up, 0-3 ramp-up: the steady rate is step 7's alone
    assert r["tgs"]["steady"] == pytest.approx(15717.092) and r["tgs"]["warmup_steps_excluded"] == 3


def test_real_nan_loss_is_read(tmp_path):
    log = maxtext_log(tmp_path, "nan_loss_steps.log")
    for st in (joblog.scan(log).steps, joblog.read_steps(log).hosts["n1"]):
        assert st.step == [0, 1, 2] and st.loss[:2] == pytest.approx([6.123, 5.545])
        assert math.isnan(st.loss[2]) and math.isnan(st.final_loss())
    assert joblog.Steps().final_loss() is None


def test_nan_loss_names_the_step_and_blames_no_node(tmp_path):
    # every host logs the step whose loss is nan, then MaxText's abort line, and exits 1
    job, log = job_for("nan_loss", tmp_path, fail_step=12)
    r = report(log, now=job.start + 5000)
    assert r["failure_class"] == "nan_loss" and r["confidence"] == "high", r
    assert r["culprit_hosts"] == [], r  # the training diverged, not a node
    assert r["summary"].startswith("the loss became NaN at step 12 (loss 6.06 at step 11)"), r["summary"]
    whys = {e["why"]: e["text"] for e in r["evidence"]}
    assert whys["MaxText stopped: the loss is not a number"].endswith("Aborting training due to NaN loss.")
    assert "completed step: 12," in whys["the first step whose loss is not a number"], whys
    assert any("loss: (nan|-?inf)" in s for s in r["next_steps"]), r["next_steps"]
    # the recorded MaxText 0.2.5 lines (no JOB header): the same verdict, step 2, loss 5.545 before it
    r = report(maxtext_log(tmp_path, "nan_loss_steps.log"))
    assert r["failure_class"] == "nan_loss" and r["culprit_hosts"] == [], r
    assert r["summary"].startswith("the loss became NaN at step 2 (loss 5.545 at step 1): MaxText stopped"), r
    # an Inf abort (abort_on_inf_loss) says Inf and names that flag
    inf = tmp_path / "inf.log"
    inf.write_text(log.read_text().replace("loss: nan", "loss: inf").replace("due to NaN loss", "due to Inf loss"))
    r = report(inf, now=job.start + 5000)
    assert r["failure_class"] == "nan_loss" and "became Inf at step 12" in r["summary"], r["summary"]
    assert "abort_on_inf_loss" in r["summary"]


def test_warmup_counts_steps_not_rows():
    # a log without host prefixes from two processes holds every step twice
    st = joblog.Steps(step=[0, 0, 1, 1, 2, 2, 3, 3], seconds=[1.0] * 8, tokens=[1.0] * 8, tflops=[1.0] * 8)
    assert st.steady_rows(3) == ([6, 7], 3)
    assert st.steady_rows(9) == ([6, 7], 3)  # never all: the last step stays
    assert st.steady_rows(0) == (list(range(8)), 0)


def test_year_boundary(tmp_path):
    start = time.mktime((2026, 12, 31, 23, 59, 0, 0, 0, -1))
    job, log = job_for(None, tmp_path, start=start, steps=200, total_steps=200, step_time=1.0)
    r = report(log)
    assert r["progress"]["last_step_time"].startswith("2027-01-01"), r["progress"]
    assert r["progress"]["steps_per_sec"] == pytest.approx(1.0, rel=0.05)


def test_total_steps_from_the_config_in_the_artifact(tmp_path):
    job, log = job_for(None, tmp_path, total_steps=None, config_steps=1234, running=True)
    assert report(log, now=job.start + 60)["progress"]["total_steps"] == 1234


def test_requeued_log_reports_the_last_run(tmp_path):
    _, first = job_for("python_exception", tmp_path / "a")
    _, second = job_for(None, tmp_path / "b")
    both = tmp_path / "4242-JAX-tiny.log"
    both.write_text(first.read_text() + second.read_text())
    r = report(both)
    assert r["status"] == "completed" and r["failure_class"] is None
    assert any("2 runs" in n for n in r["notes"])


def test_json_schema(tmp_path):
    job, log = job_for("segfault", tmp_path)
    r = report(log)
    for key in ("job_id", "status", "failure_class", "culprit_hosts", "evidence", "progress", "tgs", "next_steps"):
        assert key in r
    assert r["job_id"] == "4242" and r["status"] in ("completed", "failed", "running", "hung", "cancelled", "unknown")
    assert r["failure_class"] in triage.CLASSES
    assert set(r["progress"]) >= {"last_step", "total_steps", "steps_per_sec", "eta_seconds"}
    assert set(r["tgs"]) >= {"steady", "phases"}
    assert all(set(e) >= {"file", "line", "text"} for e in r["evidence"])
    json.dumps(r)


# --- the failure-class registry and the docs generated from it ------------------------------
def test_docs_tables_are_generated_from_the_registry(tmp_path):
    res = run([sys.executable, CLASSES_TOOL, "--check"])
    assert res.returncode == 0, res.stderr  # docs/triage.md and the skill's reference.md match the registry
    assert tables.stale_docs() == []
    # a hand edit of a generated row is drift: --check names the file, a rewrite restores the table
    for rel in tables.GENERATED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text())
    for rel, (name, table) in tables.GENERATED.items():
        text = (REPO / rel).read_text()
        row = next(ln for ln in table() if "`oom_device`" in ln)
        assert row in text, rel
        (tmp_path / rel).write_text(text.replace(row, row.removesuffix(" |") + " (edited) |"))
        assert tables.stale_docs(tmp_path) == [rel]
        assert tables.regenerate((tmp_path / rel).read_text(), name, table()) == text
        (tmp_path / rel).write_text(text)
    # every class a report can carry is in the generated skill table, in the registry's order
    rows = [
        ln for ln in failure_classes.class_table() if ln.startswith("| `") and not ln.startswith("| `failure_class`")
    ]
    assert [ln.split("`")[1] for ln in rows] == list(triage.CLASSES)


def test_failure_class_tables_cli(tmp_path):
    res = run([sys.executable, CLASSES_TOOL, "--help"])
    assert res.returncode == 0 and res.stdout.startswith("Usage: utils/dev/failure_class_tables.py")
    res = run([sys.executable, CLASSES_TOOL, "--bogus"])
    assert res.returncode == 2 and res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("failure_class_tables.py: unknown arguments") and "--check" in res.stderr


# --- the command line -----------------------------------------------------------------------
def test_cli_help_json_text_and_lookup(tmp_path):
    res = inproc.tool("triage", "--help")
    assert res.returncode == 0 and res.stdout.startswith("Usage: triage.py") and "--json" in res.stdout
    job, log = job_for("oom_device", tmp_path)
    ws = log.parent
    for arg in (str(log), str(log.with_suffix("")), job.job_id):
        res = inproc.tool("triage", arg, "--json", "--workspace", str(ws), "--no-scheduler")
        assert res.returncode == 0, res.stderr
        r = json.loads(res.stdout)
        assert r["failure_class"] == "oom_device" and r["job_dir"] == str(log.with_suffix(""))
    res = inproc.tool("triage", job.job_id, "--no-scheduler", env={"JOB_WORKSPACE": str(ws)})
    assert res.returncode == 0 and "oom_device on n2" in res.stdout.splitlines()[0], res.stdout
    assert "evidence:" in res.stdout and "next steps:" in res.stdout


BAD_JOBS = {  # kind of JOB argument -> what the one line must say
    "nosuchjob": "no job 'nosuchjob'",
    "/nonexistent/x.log": "no such job, directory or log",
    "binary": "binary",
    "text": "not a job log",
    "empty": "not a job log",
    "": "empty JOB argument",
    ".": "not a job directory",
    "dir": "not a job directory",
    "fifo": "not a regular file",
    "dangling": "dangling symlink",
    "long": "File name too long",
}


@pytest.mark.parametrize("bad", BAD_JOBS)
def test_cli_bad_input_is_one_line_exit_2(bad, tmp_path):
    arg = bad_job_arg(bad, tmp_path)
    res = inproc.tool("triage", arg, "--workspace", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 2, res.stdout
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith("triage.py: ") and BAD_JOBS[bad] in res.stderr, res.stderr
    if bad not in ("binary", "text", "empty"):  # a file that is no log needs no hint; a wrong path does
        assert "give a job id" in res.stderr, res.stderr


@pytest.mark.parametrize(
    "option",
    [
        ["--hang-factor", "nan"],
        ["--hang-factor", "0.5"],
        ["--warmup-steps", "-1"],
        ["--phase-min-steps", "x"],
        ["--now=-5"],
        ["--hang-min-seconds", "inf"],
    ],
)
def test_cli_bad_option_is_one_line_exit_2(option, tmp_path):
    _, log = job_for("oom_device", tmp_path)
    res = inproc.tool("triage", str(log), "--no-scheduler", *option)
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("triage.py: argument "), res.stderr


# --- real jobs (run_local.sh) ----------------------------------------------------------------
def _start(workspace: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--", *overrides],
        env={**os.environ, **launcher_env(workspace)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _trainer_pid(job_id: str) -> int | None:
    out = subprocess.run(["pgrep", "-f", "maxtext.trainers.pre_train.train"], capture_output=True, text=True).stdout
    for pid in out.split():
        try:
            if f"JOB_ID={job_id}\0".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                return int(pid)
        except OSError:
            pass
    return None


@pytest.fixture(scope="module")
def real_jobs(tmp_path_factory, venv):
    """Three real local jobs run side by side: steps=5, a config MaxText refuses at start-up (valid
    keys and types, which the launcher's schema check lets through, but an inconsistent pair), and a
    long run whose trainer is SIGKILLed after triage has looked at it while it ran."""
    base = tmp_path_factory.mktemp("real")
    ws = {k: base / k for k in ("ok", "config", "killed")}
    for w in ws.values():
        w.mkdir()
    procs = {
        "ok": _start(ws["ok"], "steps=5"),
        "config": _start(ws["config"], "enable_streaming_diloco=true"),
        "killed": _start(ws["killed"], "steps=100000"),
    }
    out: dict = {}
    try:
        log = wait_for(lambda: list(ws["killed"].glob("local-*-JAX-tiny.log")), 60, "the long job's log")[0]
        wait_log(log, r"completed step: 3,", 120, "the long job to train")
        job_id = log.name.split("-JAX-")[0]
        out["running"] = json.loads(run([TRIAGE, str(log), "--json"]).stdout)
        pid = wait_for(lambda: _trainer_pid(job_id), 30, "the trainer process")
        os.kill(pid, signal.SIGKILL)
        for p in procs.values():
            p.wait(timeout=180)
        for k, w in ws.items():
            out[k] = json.loads(run([TRIAGE, str(next(w.glob("local-*-JAX-tiny.log"))), "--json"]).stdout)
        yield out
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.heavy
def test_real_completed_job(real_jobs):
    r = real_jobs["ok"]
    assert r["status"] == "completed" and r["failure_class"] is None, r["summary"]
    assert r["progress"]["last_step"] == 4 and r["progress"]["total_steps"] == 5
    assert r["progress"]["eta_seconds"] == 0 and r["tgs"]["steady"] > 0


@pytest.mark.slow
@pytest.mark.heavy
def test_real_config_error(real_jobs):
    r = real_jobs["config"]
    assert r["status"] == "failed" and r["failure_class"] == "config_error", r["summary"]
    assert "MaxText rejected the configuration" in r["summary"] and r["confidence"] == "high"
    # pydantic's reason, from the lines under its "1 validation error for MaxTextConfig"
    assert "enable_diloco must be True when enable_streaming_diloco is True" in r["summary"], r["summary"]
    assert any("MAXTEXT CONFIG ERROR" in e["text"] for e in r["evidence"])


@pytest.mark.slow
@pytest.mark.heavy
def test_real_job_while_running(real_jobs):
    r = real_jobs["running"]
    assert r["status"] == "running" and r["failure_class"] is None, r["summary"]
    assert r["progress"]["last_step"] >= 3 and r["progress"]["total_steps"] == 100000
    assert r["progress"]["steps_per_sec"] and r["progress"]["eta_seconds"] > 0


@pytest.mark.slow
@pytest.mark.heavy
def test_real_sigkilled_trainer(real_jobs):
    r = real_jobs["killed"]
    assert r["status"] == "failed" and r["failure_class"] == "oom_host", r["summary"]
    assert r["confidence"] == "low" and "SIGKILL" in r["summary"] and len(r["culprit_hosts"]) == 1
    rec = next(e for e in r["evidence"] if "/.stages/train/" in e["file"])
    assert rec["text"].startswith("rc=137 ")


def test_cancel_of_a_job_that_had_hung_is_a_hang(tmp_path):
    """The corpus' collective deadlock: steps stop, an hour later someone cancels the job. The
    cancel only ended it; the cause is the hang, with the last step line as evidence."""
    from helpers import corpus  # builds the job dir (log, stage records, TSDB) like a real RAY=1 job leaves it

    inc = corpus.build("hang", tmp_path / "ws", seed=2)
    res = inproc.tool("triage", str(inc.job_dir), "--json", "--no-scheduler")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["status"] == "cancelled" and r["failure_class"] == "hang", r["summary"]
    assert r["hang"]["before_end"] and r["hang"]["last_step_age_seconds"] > r["hang"]["threshold_seconds"]
    assert "completed step: " in r["evidence"][0]["text"] and "before the job was cancelled" in r["summary"]
    assert any("diagnose.py" in n for n in r["next_steps"]), r["next_steps"]
