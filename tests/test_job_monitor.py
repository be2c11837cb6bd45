"""utils/job_monitor.py's rules on a log that grows under the test's hand (no cluster): which
events a job gets and when, each once, also across a restarted monitor; the resubmission plan of
--auto-recover; bad input. The log lines are MaxText 0.2.5's (tests/fixtures/maxtext_0.2.5) in the
launcher's format ("<host>: " prefix, absl stamp). The real jobs are in tests/test_job_monitor_live.py."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, VENV

from monitor import cli, recover
from monitor.watch import ENDED_GRACE, Rules, Watch

T0 = 1795730400.0  # 2026-11-26T22:00:00Z
HEADER = """==================== JOB ====================
job: 41 41-JAX-tiny
scheduler: slurm
model: tiny
nodes: 2 (n1 n2)
overrides: {overrides}
{run}started: {started}
=============================================
"""


class Job:
    """A job dir and its log, written line by line; `step(n, seconds)` appends both hosts' lines."""

    def __init__(
        self, ws: Path, steps: int | None = 200, job_id: str = "41", run: str = "", started: float = T0
    ) -> None:
        self.name = f"{job_id}-JAX-tiny"
        self.dir = ws / self.name
        self.dir.mkdir(parents=True)
        self.log = ws / f"{self.name}.log"
        overrides = ("" if steps is None else f"steps={steps} ") + "log_period=5"  # None: the config's steps
        run_line = f"run: {run} {ws}/{pwd.getpwuid(os.geteuid()).pw_name}/runs/{run} (no checkpoint)\n" if run else ""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
        self.log.write_text(HEADER.format(overrides=overrides, run=run_line, started=when).replace("41", job_id))
        (self.dir / "log").symlink_to(self.log)
        self.t = started + 30

    def line(self, text: str) -> None:
        with self.log.open("a") as f:
            f.write(text + "\n")

    def step(self, n: int, seconds: float) -> None:
        self.t += seconds
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(self.t)) + f".{int(self.t % 1 * 1e6):06d}"
        tok = 64 / seconds
        for h in ("n1", "n2"):
            self.line(
                f"{h}: I{stamp} 1394 metric_logger.py:265] completed step: {n}, seconds: {seconds:.3f}, "
                f"TFLOP/s/device: 0.001, Tokens/s/device: {tok:.3f}, total_weights: 64, loss: 5.000, "
                "lm_loss: 5.000, perplexity: 148.413"
            )

    def finish(self, status: str = "completed") -> None:
        block = [
            "==================== JOB SUMMARY ====================",
            f"status: {status}",
            f"job: 41 {self.name}",
            "nodes: 2 (n1 n2)",
            "stage: train",
            "wall_time: 00:01:40 (100 s)",
            "failed_nodes: none",
            f"job_dir: {self.dir}",
            f"log: {self.log}",
            "=====================================================",
        ]
        for x in block:
            self.line(x)
        (self.dir / "summary.txt").write_text("\n".join(block) + "\n")


def kinds(events) -> list[str]:
    return [e.kind for e in events]


def run_steps(w: Watch, job: Job, steps, seconds: float, now: float, every: int = 5) -> tuple[list, float]:
    """Append steps, polling every `every` steps at the log's own time; (events, last poll time)."""
    out = []
    for i, n in enumerate(steps):
        job.step(n, seconds)
        if i % every == every - 1:
            now = job.t
            out += w.poll(now, "RUNNING")
    now = job.t
    out += w.poll(now, "RUNNING")
    return out, now


def test_a_clean_run_tells_each_event_once_also_after_a_restart(tmp_path):
    job = Job(tmp_path, steps=200)
    w = Watch(job.dir, Rules())
    assert kinds(w.poll(T0, "PENDING")) == ["queued", "running"]  # the log exists: the job runs
    ev, now = run_steps(w, job, range(0, 200), 0.5, T0 + 30)
    assert kinds(ev) == ["first_step", "milestone", "milestone", "milestone"], [e.title for e in ev]
    assert [e.data["percent"] for e in ev[1:]] == [25, 50, 75]
    assert "ETA" in ev[1].title and ev[1].data["eta"] is not None
    job.finish()
    end = w.poll(now + 1, "COMPLETED")
    assert kinds(end) == ["completed"] and end[0].level == "success", [e.title for e in end]
    assert any("wall_time: 00:01:40" in x for x in end[0].lines), end[0].lines
    # a new monitor on the same job: nothing again
    again = Watch(job.dir, Rules())
    assert again.poll(now + 5, "COMPLETED") == [] and again.ended
    recs = [json.loads(x) for x in (job.dir / "monitor/events.jsonl").read_text().splitlines()]
    assert [r["key"] for r in recs] == [
        "queued",
        "running",
        "first_step",
        "milestone:25",
        "milestone:50",
        "milestone:75",
        "end",
    ]
    assert oct((job.dir / "monitor").stat().st_mode & 0o777) == "0o700"
    assert oct((job.dir / "monitor/state.json").stat().st_mode & 0o777) == "0o600"


def test_the_configs_steps_give_milestones_and_eta_when_no_steps_override(tmp_path):
    """A job submitted without `-- steps=`: its header's overrides say nothing of steps, and the number
    comes from the config the job saved (artifact/configs/<model>.yml, as triage reads it)."""
    job = Job(tmp_path, steps=None)
    w = Watch(job.dir, Rules())
    ev, _ = run_steps(w, job, range(0, 40), 0.5, T0)
    assert kinds(ev) == ["running", "first_step"]  # no config saved: no total, no milestone
    (job.dir / "artifact/configs").mkdir(parents=True)
    (job.dir / "artifact/configs/tiny.yml").write_text("base_config: base.yml\nsteps: 200  # the run's length\n")
    ev, _ = run_steps(w, job, range(40, 200), 0.5, job.t)
    assert [e.data["percent"] for e in ev if e.kind == "milestone"] == [25, 50, 75], [e.title for e in ev]
    assert all("ETA 20" in e.title and e.data["eta"] for e in ev if e.kind == "milestone"), [e.title for e in ev]


def test_a_restart_mid_run_goes_on_without_repeats(tmp_path):
    job = Job(tmp_path, steps=1000)
    w = Watch(job.dir, Rules())
    ev, now = run_steps(w, job, range(0, 100), 0.5, T0)
    assert kinds(ev) == ["running", "first_step"]
    w2 = Watch(job.dir, Rules())  # the monitor restarted
    ev2, now = run_steps(w2, job, range(100, 300), 0.5, now)
    assert kinds(ev2) == ["milestone"] and ev2[0].data["percent"] == 25  # step 249


def test_hang_after_the_threshold_not_before_then_resumed(tmp_path):
    job = Job(tmp_path, steps=10000)
    w = Watch(job.dir, Rules(hang_factor=10, hang_floor=45))
    _, now = run_steps(w, job, range(0, 60), 0.5, T0)
    last = now
    assert w.poll(last + 44, "RUNNING") == []  # threshold max(10 x 0.5 s, 45 s) = 45 s
    hang = w.poll(last + 46, "RUNNING")
    assert kinds(hang) == ["hang"] and hang[0].data["step"] == 59 and hang[0].level == "failure"
    assert "no step for 46 s after step 59" in hang[0].title
    assert w.poll(last + 120, "RUNNING") == []  # told once
    job.t = last + 130
    ev, _ = run_steps(w, job, range(60, 65), 0.5, last + 130)
    assert kinds(ev) == ["resumed"]


def test_no_first_step_within_the_limit_is_told_once(tmp_path):
    """A job stuck before training (no step line) raises the alarm once the limit has passed."""
    job = Job(tmp_path, steps=100)
    w = Watch(job.dir, Rules(first_step_limit=1800))
    assert kinds(w.poll(T0 + 60, "RUNNING")) == ["running"]
    assert w.poll(T0 + 1799, "RUNNING") == []
    ev = w.poll(T0 + 1801, "RUNNING")
    assert kinds(ev) == ["no_first_step"] and ev[0].level == "failure", ev
    assert ev[0].title == "no first step 30 min 1 s after the start"
    assert ev[0].lines[0].startswith("threshold 30 min 0 s (the default 30 min 0 s); the job is still running")
    assert ev[0].data["quiet_seconds"] == 1801.0 and ev[0].data["threshold_seconds"] == 1800.0
    assert w.poll(T0 + 4000, "RUNNING") == []  # told once
    job.t = T0 + 4000
    ev, _ = run_steps(w, job, range(0, 5), 0.5, T0 + 4000)
    assert "first_step" in kinds(ev)


def test_a_runs_job_learns_its_first_step_limit_from_the_earlier_jobs(tmp_path):
    """A job of a run whose earlier job reached its first step 55 s after its start: 3 x 55 s = 165 s."""
    ws = tmp_path / "ws"
    first = Job(ws, steps=100, job_id="40", run="r", started=T0)
    first.t = T0 + 55
    first.step(0, 5.0)  # began at T0 + 55
    first.step(1, 5.0)
    first.finish("failed")
    job = Job(ws, steps=100, job_id="41", run="r", started=T0 + 600)
    w = Watch(job.dir, Rules(first_step_limit=1800))
    assert kinds(w.poll(T0 + 660, "RUNNING")) == ["running"]
    assert w.poll(T0 + 600 + 164, "RUNNING") == []
    ev = w.poll(T0 + 600 + 166, "RUNNING")
    assert kinds(ev) == ["no_first_step"], ev
    assert "threshold 2 min 45 s (3 x the longest start-up of run r's 1 earlier job(s), 55 s)" in ev[0].lines[0]


def test_the_learned_first_step_limit_waits_for_the_header(tmp_path):
    """Polled before the job wrote its header, the monitor does not settle on the default: once the
    header names the run, the earlier job's start-up sets the limit."""
    ws = tmp_path / "ws"
    first = Job(ws, steps=100, job_id="40", run="r", started=T0)
    first.t = T0 + 55
    first.step(0, 5.0)
    first.finish("failed")
    job = Job(ws, steps=100, job_id="41", run="r", started=T0 + 600)
    header = job.log.read_text()
    job.log.write_text("")
    w = Watch(job.dir, Rules(first_step_limit=1800))
    w.poll(T0 + 610, "RUNNING")  # nothing in the log yet
    job.log.write_text(header)
    assert w.poll(T0 + 600 + 164, "RUNNING") == []
    assert kinds(w.poll(T0 + 600 + 166, "RUNNING")) == ["no_first_step"]


def test_the_hang_threshold_follows_the_step_time(tmp_path):
    job = Job(tmp_path, steps=10000)
    w = Watch(job.dir, Rules(hang_factor=10, hang_floor=45))
    _, now = run_steps(w, job, range(0, 40), 8.0, T0)
    assert w.poll(now + 79, "RUNNING") == []  # 10 x 8 s = 80 s
    assert kinds(w.poll(now + 81, "RUNNING")) == ["hang"]


def test_a_checkpoint_save_after_the_last_step_is_not_a_hang(tmp_path):
    job = Job(tmp_path, steps=10000)
    w = Watch(job.dir, Rules(hang_floor=45, pause_grace=600))
    _, now = run_steps(w, job, range(0, 60), 0.5, T0)
    job.line("n1: I1126 22:01:00.000000 1394 checkpointing.py:598] Saved a checkpoint at step 59.")
    assert w.poll(now + 300, "RUNNING") == []
    assert kinds(w.poll(now + 601, "RUNNING")) == ["hang"]


def test_checkpoint_saves_and_evals_are_no_slowdown(tmp_path):
    """Every 20th step saves (a 12 s step) and every 50th evaluates (an 8 s step): no slowdown."""
    job = Job(tmp_path, steps=100000)
    w = Watch(job.dir, Rules())
    events = []
    now = T0
    for n in range(0, 400):
        slow = 12.0 if n % 20 == 19 else 8.0 if n % 50 == 49 else 0.5
        job.step(n, slow)
        if n % 20 == 19:
            job.line(f"n1: I1126 22:01:00.000000 1394 checkpointing.py:598] Saved a checkpoint at step {n}.")
        if n % 50 == 49:
            job.line(f"n1: I1126 22:01:00.000000 1394 train.py:917] Starting eval after train step {n}")
        if n % 3 == 0:
            now = job.t
            events += w.poll(now, "RUNNING")
    assert "slowdown" not in kinds(events) and "hang" not in kinds(events), [e.title for e in events]


def test_a_lasting_slowdown_is_told_once_then_its_recovery(tmp_path):
    job = Job(tmp_path, steps=100000)
    w = Watch(job.dir, Rules(slowdown=0.6))
    ev, now = run_steps(w, job, range(0, 100), 0.5, T0)
    assert "slowdown" not in kinds(ev)
    ev, now = run_steps(w, job, range(100, 140), 1.0, now)  # 50 % of the steady throughput
    slow = [e for e in ev if e.kind == "slowdown"]
    assert len(slow) == 1 and slow[0].level == "warning" and slow[0].data["ratio"] == pytest.approx(0.5, abs=0.01)
    ev, now = run_steps(w, job, range(140, 200), 0.5, now)
    assert kinds(ev) == ["recovered"], [e.title for e in ev]


def test_a_short_dip_is_no_slowdown(tmp_path):
    job = Job(tmp_path, steps=100000)
    w = Watch(job.dir, Rules(slowdown=0.6, window=10))
    ev, now = run_steps(w, job, range(0, 100), 0.5, T0)
    ev, now = run_steps(w, job, range(100, 104), 2.0, now)  # 4 slow steps: under half the window
    ev2, now = run_steps(w, job, range(104, 150), 0.5, now)
    assert "slowdown" not in kinds(ev + ev2)


# --- --auto-recover's plan ------------------------------------------------------------------
@pytest.mark.parametrize(
    "report, exclude",
    [
        ({"failure_class": "node_failure", "culprit_hosts": ["n2"]}, ["n2"]),
        ({"failure_class": "heartbeat_timeout", "culprit_hosts": ["n2"]}, ["n2"]),
        ({"failure_class": "gpu_error", "culprit_hosts": ["n2"]}, ["n2"]),  # its GPU failed (ECC, Xid, HSA)
        ({"failure_class": "hang", "culprit_hosts": ["n1"]}, ["n1"]),
        ({"failure_class": "hang", "culprit_hosts": []}, []),  # no culprit: nothing to leave out
        ({"failure_class": "config_error", "culprit_hosts": ["n1", "n2"]}, []),  # the job's own fault
        ({"failure_class": "oom_device", "culprit_hosts": ["n2"]}, []),
        ({"failure_class": "oom_host", "culprit_hosts": ["n2"], "confidence": "high"}, []),  # out of memory
        ({"failure_class": "oom_host", "culprit_hosts": ["n2"], "confidence": "low"}, ["n2"]),  # SIGKILL
        ({"failure_class": "nan_loss", "culprit_hosts": ["n1"]}, []),
        ({"failure_class": "node_failure", "culprit_hosts": ["n1", "n2"]}, []),  # every node
        ({"failure_class": "node_failure", "scope": "fleet", "culprit_hosts": ["n2"]}, []),  # shared cause
    ],
)
def test_recover_plan(report, exclude):
    got, why = recover.plan(report, ["n1", "n2"])
    assert got == exclude, why
    assert why


def test_resubmit_command_keeps_the_arguments_and_merges_exclude(tmp_path):
    assert recover.with_exclude(["tiny", "-N", "2", "--", "steps=5"], ["n2"]) == [
        "tiny",
        "-N",
        "2",
        "--exclude=n2",
        "--",
        "steps=5",
    ]
    assert recover.with_exclude(["tiny", "-x", "n3", "--exclude=n4"], ["n2", "n3"]) == ["tiny", "--exclude=n3,n4,n2"]
    assert recover.without_monitor(["tiny", "--notify", "--auto-recover", "2", "--run", "r", "--", "--notify"]) == [
        "tiny",
        "--run",
        "r",
        "--",
        "--notify",
    ]
    snap = tmp_path / "snap"
    (snap / ".submit").mkdir(parents=True)
    (snap / ".submit/command.txt").write_text("submit.sh tiny -N 2 -- _env_TOKEN=<redacted>\n")
    with pytest.raises(recover.RecoverError, match="secrets redacted"):
        recover.command_of(snap)


# --- the command ------------------------------------------------------------------------------
def monitor(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV / "bin/python"), str(REPO / "utils/job_monitor.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **env},
    )


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "give JOB ... or --all"),
        (["1", "--all"], "give JOB ... or --all"),
        (["41", "--slowdown", "1.5"], "--slowdown: '1.5' must be a fraction of the steady throughput"),
        (["41", "--interval", "0"], "--interval: '0' must be a positive number"),
        (["41", "--interval", "soon"], "--interval: 'soon' is not a number"),
        (["41", "--hang-factor", "nan"], "--hang-factor: 'nan' must be a positive number"),
        (["41", "--auto-recover", "11"], "--auto-recover: '11' must be 0 .. 10"),
        (["41", "--auto-recover", "2.5"], "--auto-recover: '2.5' is not a whole number"),
        (["41", "--linger", "-1"], "--linger: '-1' must be 0 or more"),
        (["41", "--since", "1h"], "unrecognized arguments: --since 1h (see job_monitor.py --help)"),
        (["977"], "977"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, says):
    Job(tmp_path / "ws")
    r = monitor(*args, "--no-notify", JOB_WORKSPACE=str(tmp_path / "ws"))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("job_monitor.py: ") and says in lines[0], r.stderr
    assert not (tmp_path / "ws/41-JAX-tiny/monitor").exists()


def test_the_options_default_to_the_rules_defaults():
    """job_monitor.py's options (declared once in monitor/cli.py) are the Rules a caller gets by default."""
    a = cli.build_parser().parse_args(["41"])
    fields = ("hang_factor", "hang_floor", "pause_grace", "slowdown", "first_step_limit")
    assert {f: getattr(a, f) for f in fields} == {f: getattr(Rules(), f) for f in fields}


def test_once_then_status(tmp_path):
    job = Job(tmp_path / "ws", steps=100)
    for n in range(3):
        job.step(n, 0.5)
    ws = str(tmp_path / "ws")
    r = monitor("41", "--no-notify", "--once", JOB_WORKSPACE=ws)
    assert r.returncode == 0 and "first_step: first step (0)" in r.stdout, r.stdout + r.stderr
    r = monitor("41", "--status", JOB_WORKSPACE=ws)
    assert r.returncode == 0 and r.stdout.startswith("41-JAX-tiny: running, last step 2"), r.stdout


def continuing_job(ws: Path, job_id: str, started: float) -> Job:
    """A job of run r submitted with --continue (its header's continue: line)."""
    job = Job(ws, job_id=job_id, run="r", started=started)
    text = job.log.read_text().replace("started: ", "continue: job 1 of at most 20 (max stalled 3)\nstarted: ", 1)
    job.log.write_text(text)
    return job


def test_a_continuing_run_is_followed_to_its_end_which_carries_the_runs_accounting(tmp_path):
    """`job_monitor.py FIRST` on a run that continues by itself (--continue): each job's end says what the
    job decided (its run_next line), the monitor goes on with the job it queued, and the run's last end
    carries utils/run.py's accounting (jobs, steps, goodput)."""
    ws = tmp_path / "ws"
    first = continuing_job(ws, "41", T0)
    for n in range(10):
        first.step(n, 0.5)
    first.finish("timeout")
    first.line("run_next: job 42 goes on with run r (timeout, Slurm state TIMEOUT)")
    (first.dir / "next").write_text("42 42-JAX-tiny\n")
    second = continuing_job(ws, "42", T0 + 200)
    for n in range(10, 200):
        second.step(n, 0.5)
    second.finish("completed")
    second.line("run_next: run r stops: the run is complete: MaxText trained to its steps; cancelled job 43")
    r = monitor("41", "--no-notify", "--interval", "0.1", "--linger", "0", JOB_WORKSPACE=str(ws))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "42-JAX-tiny: watching" in r.stdout, r.stdout
    ends = {}
    for job in (first, second):
        events = [json.loads(x) for x in (job.dir / "monitor/events.jsonl").read_text().splitlines()]
        ends[job.name] = next(e for e in events if e["key"] == "end")
    e1, e2 = ends["41-JAX-tiny"], ends["42-JAX-tiny"]
    assert e1["title"].endswith("; run r goes on as job 42") and e1["level"] == "info", e1
    assert "run_next: job 42 goes on with run r (timeout, Slurm state TIMEOUT)" in e1["lines"]
    assert e1["data"]["run"]["next_job_dir"] == str(second.dir) and "accounting" not in e1["data"]["run"]
    assert e2["kind"] == "completed" and e2["title"] == "completed; run r is done" and e2["level"] == "success", e2
    acct = e2["data"]["run"]["accounting"]
    assert acct["jobs"] == ["41", "42"] and acct["done"] and acct["highest_step"] == 199
    # the figures are run.py's: 200 steps of 0.5 s in 2 jobs of 100 s on 2 nodes each
    assert acct["goodput"] == pytest.approx(200 * 0.5 * 2 / (2 * 100 * 2), abs=1e-4)
    assert any(x.startswith("run r: 2 job(s), steps 0..199 of 200 (done)") for x in e2["lines"]), e2["lines"]
    assert any(x.startswith("goodput: 50.0 %") for x in e2["lines"]), e2["lines"]


def test_a_continuing_jobs_end_waits_for_its_decision(tmp_path):
    """The JOB SUMMARY comes a moment before the job's run_next decision: the end is told with it."""
    job = continuing_job(tmp_path / "ws", "41", T0)
    for n in range(3):
        job.step(n, 0.5)
    job.finish("timeout")
    w = Watch(job.dir, Rules())
    assert "end" not in [e.key for e in w.poll(job.t + 1, None)]
    job.line("run_next: run r stops: 3 jobs in a row saved no new checkpoint (at most 3); cancelled job 42")
    (end,) = [e for e in w.poll(job.t + 2, None) if e.key == "end"]
    assert end.title.endswith("; run r stops") and end.data["run"]["decision"] == "stops", end
    # without a decision, the end is told ENDED_GRACE after the summary
    other = continuing_job(tmp_path / "ws2", "51", T0)
    other.finish("failed")
    w = Watch(other.dir, Rules())
    assert "end" not in [e.key for e in w.poll(T0 + 10, None)]
    assert "end" not in [e.key for e in w.poll(T0 + 10 + ENDED_GRACE - 1, None)]
    (end,) = [e for e in w.poll(T0 + 10 + ENDED_GRACE, None) if e.key == "end"]
    assert "run_next" not in " ".join(end.lines) and not end.title.endswith("goes on as job 52"), end


@pytest.mark.parametrize("family, seed", [("gpu_thermal", 2), ("healthy", 1)])
def test_recover_slowdowns_resubmits_without_the_hosts_diagnose_pins(tmp_path, monkeypatch, family, seed):
    """--recover-slowdowns: a slowdown event makes the monitor diagnose the running job's TSDB (the corpus'
    incident, a real Prometheus serving it); a verdict scoped to some hosts cancels the job and resubmits
    it without them; a healthy job's slowdown (no host to blame) resubmits nothing and says why."""
    from diagnosis import jobdir
    from helpers import corpus
    from monitor.watch import Event

    ws = tmp_path / "ws"
    inc = corpus.build(family, ws, seed)
    calls: list = []
    monkeypatch.setattr(cli, "cancel", lambda job_id: calls.append(("cancel", job_id)))
    monkeypatch.setattr(cli.scheduler, "slurm_state", lambda *a, **k: "CANCELLED")
    (ws / "99-JAX-next").mkdir()

    def resubmit(job_dir, jd, exclude, header):
        calls.append(("resubmit", exclude))
        return {"job_id": "99", "job_dir": str(ws / "99-JAX-next"), "command": "submit.sh ... --exclude=..."}

    monkeypatch.setattr(cli.recover, "resubmit", resubmit)
    a = cli.build_parser().parse_args([inc.job_dir.name, "--auto-recover", "1", "--recover-slowdowns", "--no-notify"])
    mon = cli.Monitor(a, ws, None)
    mon.add(inc.job_dir)
    w = mon.watches[inc.job_dir]
    w.s["header"] = jobdir.header(inc.log)
    mon.maybe_recover(w, Event("slowdown:1", "slowdown", "warning", "throughput fell", [], at=T0))
    events = [json.loads(x) for x in (inc.job_dir / "monitor/events.jsonl").read_text().splitlines()]
    (rec,) = [e for e in events if e["kind"] == "recovery"]
    if family == "healthy":
        assert calls == [] and rec["title"].startswith("not recovering: "), rec
    else:
        assert calls == [("cancel", w.job_id), ("resubmit", inc.culprits)], calls
        assert rec["title"] == f"resubmitted as job 99 without {','.join(inc.culprits)} (0 more allowed)", rec
        assert rec["data"]["failure_class"] == "slowdown" and any("diagnose: gpu_thermal" in x for x in rec["lines"])


def test_a_requeued_continuing_jobs_end_still_says_its_decision(tmp_path):
    """A continuing run's first job requeued once: its log holds two runs; the end (read after both)
    still knows the run and says the decision of the last run."""
    ws = tmp_path / "ws"
    job = continuing_job(ws, "41", T0)
    head = job.log.read_text()
    for n in range(5):
        job.step(n, 0.5)
    job.finish("cancelled")
    job.line("run_next: job 42 goes on with run r (cancelled, Slurm state COMPLETING)")
    job.line(head.rstrip("\n"))  # Slurm reran it under its id: a second JOB header
    job.line("run_next: job 42 (queued by this job's earlier run) goes on with run r when this job ends")
    for n in range(3, 9):
        job.step(n, 0.5)
    job.finish("timeout")
    job.line("run_next: job 42 goes on with run r (timeout, Slurm state TIMEOUT)")
    (job.dir / "next").write_text("42 42-JAX-tiny\n")
    (end,) = [e for e in Watch(job.dir, Rules()).poll(job.t + 1, None) if e.key == "end"]
    assert end.title.endswith("; run r goes on as job 42"), end
    assert end.lines[-1] == "run_next: job 42 goes on with run r (timeout, Slurm state TIMEOUT)", end.lines


def test_a_continuing_job_stopped_by_its_watchdog_says_so_at_its_end(tmp_path):
    job = continuing_job(tmp_path / "ws", "41", T0)
    job.line("run_next: watchdog: no first step 1 min 0 s after the start (threshold 1 min 0 s): stopping the train "
             "stage; job 42 resumes from the run's latest checkpoint on the same nodes (n1 n2)")  # fmt: skip
    job.finish("failed")
    job.line("run_next: job 42 goes on with run r (failed)")
    (end,) = [e for e in Watch(job.dir, Rules()).poll(job.t + 1, None) if e.key == "end"]
    assert end.lines[-2].startswith("run_next: watchdog: no first step 1 min 0 s after the start"), end.lines
    assert end.data["run"]["watchdog"].startswith("watchdog: no first step") and end.level == "warning", end


def test_a_requeued_job_is_watched_through_its_next_run(tmp_path):
    """Slurm requeues the job (preemption, scontrol requeue): its JOB SUMMARY comes while Slurm says
    COMPLETING, then PENDING. The monitor tells `requeued` once and goes on watching; the next run (a new
    JOB header in the same log) ends the watch. A cancel (COMPLETING, then CANCELLED) ends it as before."""
    job = Job(tmp_path / "ws")
    head = job.log.read_text()
    w = Watch(job.dir, Rules())
    w.poll(T0, "PENDING")  # queued at first
    for n in range(5):
        job.step(n, 0.5)
    job.finish("cancelled")
    assert "end" not in [e.key for e in w.poll(job.t + 1, "COMPLETING")]
    got = w.poll(job.t + 2, "PENDING") + w.poll(job.t + 30, "PENDING") + w.poll(job.t + 400, "PENDING")
    assert kinds(got) == ["requeued"] and got[0].title.startswith("requeued by Slurm (run 1 of the job ended"), got
    job.line(head.rstrip("\n"))
    for n in range(3, 9):
        job.step(n, 0.5)
    job.finish("completed")
    (end,) = [e for e in w.poll(job.t + 1, "COMPLETED") if e.key == "end"]
    assert end.kind == "completed" and w.ended
    # a cancel: COMPLETING at the summary, then CANCELLED: the end, no requeue
    other = Job(tmp_path / "ws2", job_id="51")
    w2 = Watch(other.dir, Rules())
    other.step(0, 0.5)
    other.finish("cancelled")
    assert "end" not in [e.key for e in w2.poll(other.t + 1, "COMPLETING")]
    got = w2.poll(other.t + 3, "CANCELLED")
    assert [e.kind for e in got if e.key == "end"] == ["cancelled"] and "requeued" not in kinds(got), got
    # COMPLETING that lasts: the end after ENDED_GRACE all the same
    third = Job(tmp_path / "ws3", job_id="61")
    w3 = Watch(third.dir, Rules())
    third.finish("cancelled")
    assert "end" not in [e.key for e in w3.poll(third.t + 1, "COMPLETING")]
    assert "end" in [e.key for e in w3.poll(third.t + 1 + ENDED_GRACE, "COMPLETING")]


def test_an_alert_of_the_jobs_prometheus_is_an_event_with_its_host_and_query_once(tmp_path):
    """utils/observe/alert_relay.py's lines (docs/job-log.md): a firing alert is one warning event naming the
    host, what it means and the query; its end one info event; the same alert firing again later is told
    again; a restarted monitor repeats nothing."""
    from diagnosis import alerts

    rule = alerts.RULES["TCPRetransmitsStandOut"]
    query = alerts.query(rule)
    job = Job(tmp_path, steps=200)
    w = Watch(job.dir, Rules())
    w.poll(T0, "RUNNING")
    ev, now = run_steps(w, job, range(0, 10), 0.5, T0 + 30)
    firing = f"n1: alert: firing {rule.alert} host=n2 check=network value=48.2: n2 retransmits 48.2 TCP segments/s, 4x its peers or more: packet loss on its NIC, cable or switch port; query: {query}"  # noqa: E501
    job.line(firing)
    job.line("n1: alerting about nothing: not an alert line")
    ev, now = run_steps(w, job, range(10, 20), 0.5, now)
    alert = [e for e in ev if e.kind == "alert"]
    assert len(alert) == 1 and alert[0].level == "warning" and alert[0].title == f"{rule.alert} on n2", ev
    assert alert[0].lines[:2] == [
        "n2 retransmits 48.2 TCP segments/s, 4x its peers or more: packet loss on its NIC, cable or switch port",
        f"query: {query}",
    ]
    assert alert[0].data["job_id"] == "41" and alert[0].data["host"] == "n2"
    assert alert[0].data["check"] == "network" and alert[0].data["value"] == "48.2"
    job.line(f"n1: alert: resolved {rule.alert} host=n2 check=network after 45 s")
    job.line(firing)
    ev, now = run_steps(w, job, range(20, 30), 0.5, now)
    assert [(e.kind, e.title) for e in ev if e.kind.startswith("alert")] == [
        ("alert_resolved", f"{rule.alert} on n2 resolved after 45 s"),
        ("alert", f"{rule.alert} on n2"),
    ]
    again = Watch(job.dir, Rules())
    assert [e for e in again.poll(now + 1, "RUNNING") if e.kind.startswith("alert")] == []
