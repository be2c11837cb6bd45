"""A run that continues by itself (submit.sh --run ALIAS --continue, utils/run_next.py; docs/runs.md).

On the local Slurm cluster, real MaxText on the CPU: a run whose jobs have a 1-minute time limit and
whose steps need several jobs completes by itself, each job restoring the checkpoint the one before it
saved, a job requeued with `scontrol requeue` (what a preemption with requeue does) goes on without a
second successor, and the last job cancels the one queued behind it; a job whose every rank froze is
stopped by the job's watchdog (the job monitor's hang rule) and resumed on the same node; a crash loop (every job ends
before its first checkpoint) stops after --max-stalled jobs with the reason. Nothing runs between the
jobs but Slurm. Bad input is refused in one line before anything is written."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run
from test_launch_input import assert_rejected, fake_sbatch  # noqa: F401 - fake_sbatch is a fixture

import joblog
from diagnosis import jobdir, runs
from helpers.jobs import job_state, log_has, submit, summary, trainer_pid
from monitor import chain

USER = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
# a tiny model made slow enough (~30 ms a step here) that its steps need several 1-minute jobs
SLOW = ["per_device_batch_size=4", "max_target_length=256", "checkpoint_period=100", "async_checkpointing=false"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--continue"], "--continue needs --run ALIAS"),
        (["--run", "r1", "--continue", "--max-jobs", "0"], "--max-jobs takes 1 .. 1000 jobs, got '0'"),
        (["--run", "r1", "--continue", "--max-jobs=many"], "--max-jobs takes 1 .. 1000 jobs, got 'many'"),
        (["--run", "r1", "--continue", "--max-stalled", "101"], "--max-stalled takes 1 .. 100 jobs, got '101'"),
        (["--run", "r1", "--max-jobs", "5"], "--max-jobs and --max-stalled go with --continue"),
        (["--run", "r1", "--continue", "--max-jobs"], "--max-jobs needs a count"),
    ],
)
def test_bad_continue_input_is_refused(args, message, fake_sbatch, workspace, venv):  # noqa: F811
    res = run([str(REPO / "submit.sh"), "tiny", *args], env={**fake_sbatch, **launcher_env(workspace)})
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, message)


def test_the_next_job_waits_for_this_one_instead_of_the_users_dependency():
    args = ["tiny", "-N", "2", "--run", "r1", "--continue", "--dependency=afterok:5", "-d", "after:4", "-H", "--",
            "steps=10", "-d"]  # fmt: skip
    assert chain.with_dependency(args, "77") == [
        "tiny", "-N", "2", "--run", "r1", "--continue", "--dependency=afterany:77", "--", "steps=10", "-d",
    ]  # fmt: skip


def test_the_docs_name_the_failures_that_stop_a_run():
    """docs/runs.md lists the classes after which a continuing run stops: chain.FINAL_CLASSES, each a class
    of triage's registry."""
    from diagnosis.failure_classes import REGISTRY

    text = (REPO / "docs" / "runs.md").read_text()
    para = text[text.index("the job failed in a way the same job would meet again") :].split("\n   - ", 1)[0]
    assert re.findall(r"`([a-z_]+)`", para) == list(chain.FINAL_CLASSES)
    assert set(chain.FINAL_CLASSES) <= {c.name for c in REGISTRY}


def header_log(ws: Path, job_id: int, alias: str, at_start: int | None, started: str, steps: int = 10000) -> None:
    ckpt = f"latest checkpoint: step {at_start}, training goes on at step {at_start + 1}" if at_start is not None else (
        "no checkpoint: starts from step 0")  # fmt: skip
    (ws / f"{job_id}-JAX-tiny.log").write_text(
        "==================== JOB ====================\n"
        f"job: {job_id} {job_id}-JAX-tiny\nmodel: tiny\noverrides: steps={steps}\n"
        f"run: {alias} {ws}/{USER}/runs/{alias} ({ckpt})\nstarted: {started}\n"
        "=============================================\n"
    )


@pytest.mark.parametrize(
    "marks, now, stalled",
    [
        ([None], None, 1),  # the first job saved nothing
        ([None], 99, 0),  # ... or a checkpoint
        ([None, 99, 99], 99, 2),  # two jobs in a row without a new one after one that saved
        ([None, 99, 99], 199, 0),
        ([99, 199, 199, 199], 199, 3),
    ],
)
def test_jobs_without_a_new_checkpoint_are_counted_from_the_headers(tmp_path, monkeypatch, marks, now, stalled):
    ws = tmp_path / "ws"
    (ws / USER / "runs" / "r1" / "checkpoints").mkdir(parents=True)
    if now is not None:
        (ws / USER / "runs" / "r1" / "checkpoints" / str(now)).mkdir()
        (ws / USER / "runs" / "r1" / "checkpoints" / f"{now + 100}.orbax-checkpoint-tmp-1").mkdir()  # not saved
    for i, m in enumerate(marks):
        header_log(ws, 10 + i, "r1", m, f"2026-11-28T08:0{i}:00Z")
    header_log(ws, 99, "other", None, "2026-11-28T08:09:00Z")  # another run's job
    job_dir = ws / f"{9 + len(marks)}-JAX-tiny"
    job_dir.mkdir()
    for k, v in {"JOB_DIR": str(job_dir), "JOB_ID": str(9 + len(marks)), "JOB_WORKSPACE": str(ws), "MST_RUN": "r1",
                 "MST_CONTINUE": "20 3"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    assert chain.stalled(chain.Job()) == stalled


def test_the_watchdog_stopping_two_jobs_in_a_row_stops_the_run(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    (ws / USER / "runs" / "r1" / "checkpoints" / "500").mkdir(parents=True)
    header_log(ws, 10, "r1", None, "2026-11-28T08:00:00Z")
    header_log(ws, 11, "r1", 500, "2026-11-28T08:05:00Z")
    for j in (10, 11):
        (ws / f"{j}-JAX-tiny" / "watchdog").mkdir(parents=True, mode=0o700)
    os.chmod(ws / "10-JAX-tiny", 0o755)
    os.chmod(ws / "11-JAX-tiny", 0o755)
    for k, v in {"JOB_DIR": str(ws / "11-JAX-tiny"), "JOB_ID": "11", "JOB_WORKSPACE": str(ws), "MST_RUN": "r1",
                 "MST_CONTINUE": "20 3", "MST_RUN_AFTER": "10"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    evidence = {"kind": "hang", "title": "hang: no step for 50 s after step 612", "culprits": []}
    (ws / "11-JAX-tiny" / "watchdog" / "stopped.json").write_text(json.dumps(evidence))
    assert chain.stop_reason(chain.Job(), "failed", None) is None  # once: the next job resumes
    first = {**evidence, "kind": "no_first_step", "title": "no first step 6m 0s after the start"}
    (ws / "10-JAX-tiny" / "watchdog" / "stopped.json").write_text(json.dumps(first))
    assert chain.stop_reason(chain.Job(), "failed", None) == (
        "the watchdog stopped two jobs in a row: job 10: no first step 6m 0s after the start; "
        "job 11: hang: no step for 50 s after step 612"
    )


def test_a_job_cut_off_after_its_last_checkpoint_ends_the_run(tmp_path, monkeypatch):
    """The time limit can come while MaxText ends, after it saved the last step: the run is complete, and
    the job says so rather than queue a job that would train nothing."""
    ws = tmp_path / "ws"
    (ws / USER / "runs" / "r1" / "checkpoints" / "99").mkdir(parents=True)
    header_log(ws, 10, "r1", 50, "2026-11-28T08:00:00Z", steps=100)
    (ws / "10-JAX-tiny").mkdir()
    for k, v in {"JOB_DIR": str(ws / "10-JAX-tiny"), "JOB_ID": "10", "JOB_WORKSPACE": str(ws), "MST_RUN": "r1",
                 "MST_CONTINUE": "20 3"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    why = "run r1 is complete: its checkpoint of step 99 ends its 100 steps"
    assert chain.stop_reason(chain.Job(), "timeout", "TIMEOUT") == why
    (ws / USER / "runs" / "r1" / "checkpoints" / "99").rename(ws / USER / "runs" / "r1" / "checkpoints" / "98")
    assert chain.stop_reason(chain.Job(), "timeout", "TIMEOUT") is None  # one step to go


# --- the local Slurm cluster ------------------------------------------------------------------------


def jobs_of_run(ws: Path, alias: str) -> list[tuple[int, Path]]:
    return sorted((int(p.name.split("-")[0]), p) for p, _ in runs.logs_of(alias, ws))


def ours_active(cluster: dict[str, str], name: str = "JAX-tiny") -> list[str]:
    out = run(["squeue", "-h", "-u", USER, "-n", name, "-o", "%i %T"], env=cluster).stdout
    return out.split("\n") if out.strip() else []


def wait_run_end(cluster: dict[str, str], ws: Path, alias: str, timeout: float) -> None:
    """Until the run's last job has ended and nothing of the run is queued (jobs started by jobs)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        logs = jobs_of_run(ws, alias)
        if logs and not ours_active(cluster) and "JOB SUMMARY" in logs[-1][1].read_text(errors="replace"):
            return
        time.sleep(2)
    raise AssertionError(f"run {alias} still going after {timeout} s: {ours_active(cluster)}")


def steps_in(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"completed step: (\d+),", log.read_text(errors="replace"))]


# The one-minute run's steps: more than the requeued job's rerun trains before its limit (1,400-1,670 here
# in a quiet hour, at 30 steps a second; a machine 2.3 times as fast would train them all). A busy machine
# trains far fewer a job (a whole-suite run here: 370-730 a job, and 8 jobs ended at step 3,928), so the
# run may take up to MAX_JOBS jobs of ~90 s each; the test's wait for its end bounds a hang, not the speed
STEPS = 4000
MAX_JOBS = 16
LAST = STEPS - 1


@pytest.mark.cluster
def test_a_run_with_a_one_minute_limit_continues_by_itself_and_survives_a_requeue(cluster, workspace, venv):
    alias = "cont1"
    first, log1 = submit(cluster, workspace, "tiny", "--run", alias, "--continue", f"--max-jobs={MAX_JOBS}", "--time=1",
                         "--", f"steps={STEPS}", *SLOW)  # fmt: skip
    # the first job, once it saved a checkpoint, is requeued (a preemption with requeue): it runs again
    # under its id (Slurm delays a requeued job 2 minutes; the test lets it start at once)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(s >= 150 for s in steps_in(log1)):
        time.sleep(1)
    assert any(s >= 150 for s in steps_in(log1)), log1.read_text(errors="replace")[-3000:]
    assert run(["scontrol", "requeue", first], env=cluster).returncode == 0
    deadline = time.monotonic() + 120
    while job_state(cluster, first) != "PENDING" and time.monotonic() < deadline:
        time.sleep(1)
    run(["scontrol", "update", f"JobId={first}", "StartTime=now"], env=cluster)
    wait_run_end(cluster, workspace, alias, MAX_JOBS * 120)
    assert_continued(workspace, alias)
    assert ours_active(cluster) == []


def assert_continued(workspace: Path, alias: str) -> None:
    """What the one-minute run left: its jobs' logs, decisions and checkpoints (see the test)."""
    jobs = jobs_of_run(workspace, alias)
    ids = [j for j, _ in jobs]
    text = {j: p.read_text(errors="replace") for j, p in jobs}
    report = runs.account(alias, workspace)
    assert report["done"] and report["highest_step"] == LAST, report
    # at least one time limit met and passed (how many depends on the machine's speed: in a quiet hour here
    # the requeued job's rerun and two more jobs, in a busy one four or more)
    assert len([j for j, log in jobs if steps_in(log)]) >= 2, f"{STEPS} steps took only {ids} jobs of 1 minute"
    assert any(summary(log)["status"] == "timeout" for _, log in jobs[:-1]), "no job of the run met its time limit"
    # the requeued job ran twice under its id and queued one next job only
    assert text[ids[0]].count("==================== JOB ====================") == 2, text[ids[0]][-3000:]
    assert f"run_next: job {ids[1]} (queued by this job's earlier run) goes on with run {alias}" in text[ids[0]]
    queued = [int(m) for j in ids for m in re.findall(r"^run_next: queued job (\d+) ", text[j], re.M)]
    assert queued[: len(ids) - 1] == ids[1:], (queued, ids)
    # every job that trained restored the checkpoint the run had when it started, each one a newer one
    marks = []
    for j, log in jobs[1:]:
        if not steps_in(log):
            continue
        mark = joblog.checkpoint_at_start(jobdir.header(log)["run"])
        assert mark is not None and re.search(rf"restoring from this run's directory step {mark}$", text[j], re.M)
        assert steps_in(log)[0] == mark + 1, (j, steps_in(log)[:3])
        marks.append(mark)
    assert marks == sorted(set(marks)), marks
    # jobs cut by the time limit say so and go on (the last one that trained may have finished its steps)
    for j in [j for j, log in jobs[1:-1] if steps_in(log) and steps_in(log)[-1] < LAST]:
        s = summary(workspace / f"{j}-JAX-tiny.log")
        assert s["status"] == "timeout", (j, s)
        assert re.search(
            rf"^run_next: job \d+ goes on with run {alias} \(timeout, Slurm state TIMEOUT\)$", text[j], re.M
        )
    # the end: the last job that trained cancelled the job behind it, the run being complete (it completed,
    # or the time limit came while MaxText ended, after its last checkpoint); or, when that job could not
    # tell, the job behind it found the run complete at its start and trained nothing
    last = summary(jobs[-1][1])
    done = (rf"^run_next: run {alias} stops: (the run is complete: MaxText trained to its steps|run {alias} is "
            rf"complete: its checkpoint of step {LAST} ends its {STEPS} steps); cancelled job (\d+)$")  # fmt: skip
    m = re.search(done, text[ids[-1]], re.M)
    if m:
        assert last["status"] in ("completed", "timeout"), last
        cancelled = m.group(2)
        assert not (workspace / f"{cancelled}-JAX-tiny.log").exists()
        assert not (workspace / f"{cancelled}-JAX-tiny").exists()
    else:
        found = (
            rf"^run_next: run {alias} is complete: its checkpoint of step {LAST} ends its {STEPS} steps: "
            r"this job trains"
        )
        assert re.search(found, text[ids[-1]], re.M), text[ids[-1]][-3000:]
        assert last["status"] == "completed" and last["stage"] == "none" and not steps_in(jobs[-1][1]), last
    # run.py shows each job's decision; the job monitor, started on the first job after the run ended,
    # follows the chain to its end, which carries the run's accounting
    # (the requeued job's runs each count as a job: the first ended by the requeue, then its rerun)
    first = [j for j in report["jobs"] if j["id"] == str(ids[0])]
    assert [(j["attempt"], j["attempts"]) for j in first] == [(1, 2), (2, 2)], first
    decided = [j["run_next"] or "" for j in report["jobs"] if j["attempt"] == j["attempts"]]
    assert all(re.match(r"job \d+ goes on with run ", d) for d in decided[:-1]), decided
    assert re.match(rf"run {alias} (stops|is complete): ", decided[-1]), decided
    res = run([str(REPO / "utils/job_monitor.py"), str(ids[0]), "--no-notify", "--interval", "0.2", "--linger", "0",
               "--workspace", str(workspace)], timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    events = [json.loads(x) for x in (workspace / f"{ids[-1]}-JAX-tiny/monitor/events.jsonl").read_text().splitlines()]
    end = next(e for e in events if e["key"] == "end")
    assert end["data"]["run"]["accounting"]["goodput"] == report["goodput"], end
    assert end["title"].endswith(f"; run {alias} is done"), end
    # for the closing note: from each job's end to the next job's first step; the run's goodput
    gaps = []
    for a, b in zip(report["jobs"], report["jobs"][1:], strict=False):
        if a["started"] and a["wall_seconds"] and b["first_step_at"]:
            gaps.append(round(b["first_step_at"] - (a["started"] + a["wall_seconds"]), 1))
    print(f"\nrun {alias}: jobs {ids}, goodput {report['goodput']}, end-to-first-step gaps (s) {gaps}")


@pytest.mark.cluster
def test_a_crash_loop_stops_after_max_stalled_jobs_with_the_reason(cluster, workspace, venv):
    """Every job ends before its first checkpoint (its train stage's limit, 4 s, is shorter than the
    start-up; with 8 s a quiet machine reached step 0 and saved it): a failure worth retrying, once; the
    second job in a row without a new checkpoint stops the run and cancels the third."""
    alias = "loop1"
    submit(cluster, workspace, "tiny", "--run", alias, "--continue", "--max-stalled", "2", "--", "steps=50",
           STAGE_TIMEOUTS="train:4")  # fmt: skip
    wait_run_end(cluster, workspace, alias, 300)
    jobs = jobs_of_run(workspace, alias)
    assert len(jobs) == 2, jobs
    (j1, log1), (j2, log2) = jobs
    assert summary(log1)["status"] == "stage_timeout" and summary(log2)["status"] == "stage_timeout"
    assert log_has(log1, rf"^run_next: job {j2} goes on with run {alias} \(stage_timeout\)$")
    m = re.search(
        rf"^run_next: run {alias} stops: 2 jobs in a row saved no new checkpoint \(at most 2\); cancelled job (\d+)$",
        log2.read_text(),
        re.M,
    )
    assert m, log2.read_text()[-3000:]
    assert not (workspace / f"{m.group(1)}-JAX-tiny.log").exists()
    assert ours_active(cluster) == []


@pytest.mark.cluster
def test_your_scancel_stops_the_run_in_the_job_queued_behind(cluster, workspace, venv):
    """slurmctld shows a job you cancel COMPLETING when its stop signal comes, so the job queued behind it
    asks how it ended when it starts: CANCELLED, so it trains nothing, queues nothing, and the run stops."""
    alias = "stop1"
    first, log1 = submit(cluster, workspace, "tiny", "--run", alias, "--continue", "--", "steps=5000", *SLOW)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not steps_in(log1):
        time.sleep(1)
    assert steps_in(log1), log1.read_text(errors="replace")[-3000:]
    assert run(["scancel", first], env=cluster).returncode == 0
    wait_run_end(cluster, workspace, alias, 300)
    jobs = jobs_of_run(workspace, alias)
    assert [j for j, _ in jobs][0] == int(first) and len(jobs) == 2, jobs
    (_, log2) = jobs[1]
    assert summary(log1)["status"] == "cancelled"
    assert log_has(log2, rf"^run_next: run {alias} stops: job {first} before this one was cancelled \(scancel\): this "
                   r"job trains nothing$")  # fmt: skip
    s = summary(log2)
    assert s["status"] == "cancelled" and s["stage"] == "none", s
    assert not log_has(log2, "completed step") and not log_has(log2, r"^run_next: queued job")


def watchdog_stopped(workspace: Path, alias: str, title: str, kind: str) -> tuple:
    """The two jobs of a run whose watchdog stopped the first: ((j1, log1), (j2, log2), the match of the first
    job's watchdog line, TITLE a regex of its title, and its stopped.json, of KIND and blaming no host)."""
    jobs = jobs_of_run(workspace, alias)
    assert len(jobs) == 2, jobs
    (j1, log1), (j2, log2) = jobs
    said = (rf"^run_next: watchdog: {title} .*: stopping the train stage; "
            rf"job {j2} resumes from the run's latest checkpoint on the same nodes \((n\d)\)$")  # fmt: skip
    m = re.search(said, log1.read_text(), re.M)
    assert m, log1.read_text(errors="replace")[-3000:]
    evidence = json.loads((workspace / f"{j1}-JAX-tiny" / "watchdog" / "stopped.json").read_text())
    assert evidence["kind"] == kind and evidence["culprits"] == [], evidence
    return (j1, log1), (j2, log2), m, evidence


@pytest.mark.cluster
def test_a_hang_on_every_rank_is_stopped_and_resumed_once_on_the_same_node(cluster, workspace, venv):
    """Every rank of the first job freezes (SIGSTOP) after a checkpoint: no host to blame. The job's watchdog
    (the monitor's hang rule: no step for max(10 x median step, MST_WATCHDOG_HANG_FLOOR), 15 s here) stops
    its train stage, asks Slurm to run the queued next job on the same node, and that job restores the
    checkpoint and completes the run."""
    alias = "hang1"
    ckpt = ["per_device_batch_size=4", "max_target_length=256", "checkpoint_period=100", "async_checkpointing=false"]
    # the first job runs on n2 (n1 busy meanwhile), so "the same node" is not simply the first free one
    res = run(
        ["sbatch", "--parsable", "--exclusive", "-w", "n1", "-J", "blocker", "-o", "/dev/null", "--wrap", "sleep 600"],
        env=cluster,
    )
    assert res.returncode == 0, res.stderr
    blocker = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while job_state(cluster, blocker) != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    first, log1 = submit(cluster, workspace, "tiny", "--run", alias, "--continue", "--", "steps=300", *ckpt,
                         MST_WATCHDOG_HANG_FLOOR="15")  # fmt: skip
    deadline = time.monotonic() + 120
    while not jobdir.header(log1) and time.monotonic() < deadline:
        time.sleep(0.5)
    run(["scancel", blocker], env=cluster)
    assert jobdir.header(log1).get("nodes") == "1 (n2)", jobdir.header(log1)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(s >= 150 for s in steps_in(log1)):
        time.sleep(0.5)
    pid = trainer_pid(first, 0)
    assert pid and any(s >= 150 for s in steps_in(log1)), log1.read_text(errors="replace")[-3000:]
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    wait_run_end(cluster, workspace, alias, 600)

    (j1, log1), (j2, log2), m, _ = watchdog_stopped(
        workspace, alias, r"hang: no step for (.+?) after step (\d+)", "hang"
    )
    node = m.group(3)
    assert node == "n2"
    assert jobdir.header(log1)["nodes"] == f"1 ({node})" and jobdir.header(log2)["nodes"] == f"1 ({node})"
    assert log_has(log1, rf"^run_next: job {j2} goes on with run {alias} \(failed\)$")
    mark = int(m.group(2)) // 100 * 100  # the checkpoint before the freeze (every 100 steps)
    assert log_has(log2, rf"restoring from this run's directory step {mark}$") and steps_in(log2)[0] == mark + 1
    assert summary(log2)["status"] == "completed" and steps_in(log2)[-1] == 299
    print(f"\nhang: frozen at step {m.group(2)}, stopped after {m.group(1)} without a step, "
          f"run done {time.monotonic() - frozen_at:.0f} s after the freeze")  # fmt: skip


@pytest.mark.cluster
def test_a_trainer_that_never_reaches_step_0_is_stopped_within_the_limit_and_resumed(cluster, workspace, venv):
    """The first job's trainer freezes (SIGSTOP) before its first step (stuck in start-up: distributed
    init, compilation). With MST_WATCHDOG_FIRST_STEP_LIMIT=60 the job's watchdog stops the train stage
    about a minute after the start, the job queued behind it runs on the same node and completes the run."""
    alias = "nofirst1"
    first, log1 = submit(cluster, workspace, "tiny", "--run", alias, "--continue", "--", "steps=30",
                         MST_WATCHDOG_FIRST_STEP_LIMIT="60")  # fmt: skip
    deadline, pid = time.monotonic() + 180, None
    while time.monotonic() < deadline and not (pid := trainer_pid(first, 0)):
        time.sleep(0.2)
    assert pid, log1.read_text(errors="replace")[-3000:]
    os.kill(pid, signal.SIGSTOP)
    assert not steps_in(log1), "the trainer reached a step before it was frozen"
    wait_run_end(cluster, workspace, alias, 420)

    (_, log1), (_, log2), m, evidence = watchdog_stopped(
        workspace, alias, r"no first step (.+?) after the start", "no_first_step"
    )
    started = jobdir.started(jobdir.header(log1))
    assert started and 60 <= evidence["at"] - started <= 60 + 30, (evidence["at"], started)  # within the limit
    assert not steps_in(log1) and jobdir.header(log2)["nodes"] == jobdir.header(log1)["nodes"]
    assert summary(log2)["status"] == "completed" and steps_in(log2)[-1] == 29
    print(f"\nno first step: stopped {evidence['at'] - started:.0f} s after the start ({m.group(1)})")


def test_the_watchdog_takes_its_settings_and_defaults_to_the_monitors_rules():
    """MST_WATCHDOG_* (utils/launch/settings.tsv, site-settable) set the watchdog's rules; their table
    defaults are the job monitor's own."""
    from monitor.watch import Rules

    rows = [ln.split("\t") for ln in (REPO / "utils/launch/settings.tsv").read_text().splitlines() if ln[:1] != "#"]
    table = {r[0]: r[1] for r in rows}
    assert {n: float(table[n]) for n in chain.WATCHDOG_SETTINGS} == {
        n: getattr(Rules(), f) for n, f in chain.WATCHDOG_SETTINGS.items()
    }
    r = chain.watchdog_rules({"MST_WATCHDOG_HANG_FLOOR": "300", "MST_WATCHDOG_PAUSE_GRACE": "0"})
    assert (r.hang_floor, r.pause_grace, r.first_step_limit, r.hang_factor) == (300.0, 0.0, 1800.0, 10.0)
