"""RAY=1 on the local Slurm cluster: a 2-node job whose saved TSDB answers afterwards, a whole
job killed with SIGKILL that keeps every scraped sample, and the fallback when Ray cannot start."""

import json
import os
import re
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import REPO, run
from jobs import job_state, log_has, submit, summary, trainer_pid, triage, wait_for, wait_job_end

pytestmark = pytest.mark.cluster


def query(tsdb: Path, promql: str, at: float | None = None) -> list[dict]:
    args = [str(REPO / "utils/prometheus.sh"), "query", str(tsdb), promql]
    if at is not None:
        args += ["--time", f"{at:.3f}"]
    res = run(args, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["data"]["result"]


def by_host(result: list[dict]) -> dict[str, float]:
    return {r["metric"].get("host", ""): float(r["value"][1]) for r in result}


def step_times(log: Path, host: str) -> dict[int, float]:
    """Wall time of each 'completed step' line of one host, from the absl prefix."""
    year = datetime.now(UTC).year
    out = {}
    pat = re.compile(rf"^{host}: I(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+) .*completed step: (\d+),")
    for line in log.read_text(errors="replace").splitlines():
        m = pat.match(line)
        if m:
            t = datetime.strptime(f"{year}-{m[1]}-{m[2]} {m[3]}", "%Y-%m-%d %H:%M:%S.%f").astimezone()
            out[int(m[4])] = t.timestamp()
    return out


def test_ray_job_leaves_a_tsdb_that_answers_afterwards(cluster, workspace, venv):
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=40", "log_period=5", RAY="1")
    # while it runs: the trainer is a plain process, with no Ray in it
    pid = wait_for(lambda: trainer_pid(job_id, 1), 240, "the rank 1 trainer")
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not [e for e in env if e.startswith(b"RAY_")], "trainer got Ray's environment"
    assert b"_raylet" not in Path(f"/proc/{pid}/maps").read_bytes(), "trainer has Ray loaded"
    # ... and it runs at the launcher's priority, not at the nice 15 Ray gives its workers
    assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0), "trainer was niced"
    assert wait_job_end(cluster, job_id, 300) == "COMPLETED", log.read_text()[-3000:]
    assert summary(log)["status"] == "completed"
    assert log_has(log, r"^n1: prometheus: http://127\.0\.0\.1:\d+ +tunnel: ssh -N -L (\d+):127\.0\.0\.1:\1 n1$")
    assert log_has(log, r"^n1: ray_dashboard: http://127\.0\.0\.1:\d+ ")
    assert log_has(log, r"^n1: tsdb: .*/prometheus$")

    tsdb = log.with_suffix("") / "prometheus"
    assert set(by_host(query(tsdb, "count by (host) (hw_procs_running)"))) == {"n1", "n2"}
    assert set(by_host(query(tsdb, "count by (host) (hw_tcp_retransmits_total)"))) == {"n1", "n2"}
    assert set(by_host(query(tsdb, 'count by (host) ({__name__=~"ray_node_cpu_utilization|ray_node_mem_used"})'))) == {"n1", "n2"}
    # every step's loss and step time, stamped with the event's wall time, which matches the log
    for name in ("tb_learning_loss", "tb_perf_step_time_seconds"):
        assert by_host(query(tsdb, f"count_over_time({name}[1d])")) == {"n1": 40.0}
    steps = step_times(log, "n1")
    assert sorted(steps) == list(range(40)), "n1's step lines are not attributed to n1"
    last = query(tsdb, "timestamp(tb_learning_loss)")
    assert abs(float(last[0]["value"][1]) - steps[39]) < 3, (last, steps[39])

    # the diagnosis tools on this real job: no GPUs or RDMA here, everything present is clean
    res = run([str(venv / "bin/python"), str(REPO / "utils/diagnose.py"), str(log.with_suffix("")), "--json"], timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    d = json.loads(res.stdout)
    assert d["verdict"] == "none" and d["culprit_hosts"] == [] and not d["insufficient_evidence"], d["summary"]
    assert len(d["hosts"]) == 2 and {"hw_gpu_*", "hw_ib_*"} <= set(d["missing"])
    assert {"network", "cpu_contention", "io_pressure", "memory"} <= {c["check"] for c in d["ruled_out"]}
    assert any(f.startswith("tb_") for f in d["families"])
    t = triage(log, cluster)
    assert t["status"] == "completed" and t["progress"]["last_step"] == 39 and t["tgs"]["steady"] > 0, t["summary"]


def test_sigkill_of_the_whole_job_keeps_every_scraped_sample(cluster, workspace, venv):
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000", RAY="1", METRICS_INTERVAL="1")
    port = wait_for(lambda: log_has(log, r"^n1: prometheus: http://127\.0\.0\.1:(\d+)") and
                    re.search(r"^n1: prometheus: http://127\.0\.0\.1:(\d+)", log.read_text(), re.M).group(1), 240, "Prometheus")
    wait_for(lambda: log_has(log, r"completed step: 20,"), 240, "training")

    def live_count() -> float:
        out = subprocess.run(["curl", "-s", "--noproxy", "*", f"http://127.0.0.1:{port}/api/v1/query",
                              "--data-urlencode", "query=sum(count_over_time(hw_procs_running[1h]))"],
                             capture_output=True, text=True).stdout
        try:  # a restarted Prometheus answers "Service Unavailable" until its WAL is replayed
            result = json.loads(out)["data"]["result"]
        except (ValueError, KeyError):
            return 0.0
        return float(result[0]["value"][1]) if result else 0.0
    wait_for(lambda: live_count() >= 10, 60, "ten scrapes")
    # Prometheus dies mid-job: the job restarts it on the same TSDB and scraping goes on
    tsdb = log.with_suffix("") / "prometheus"

    def prometheus_pid() -> int | None:
        out = subprocess.run(["pgrep", "-f", f"storage.tsdb.path={tsdb}"], capture_output=True, text=True).stdout
        return int(out.split()[0]) if out.split() else None
    first_pid = prometheus_pid()
    assert first_pid
    os.kill(first_pid, signal.SIGKILL)
    wait_for(lambda: (prometheus_pid() or first_pid) != first_pid, 30, "Prometheus to be restarted")
    after_restart = wait_for(lambda: live_count(), 30, "Prometheus to answer again")
    wait_for(lambda: live_count() > after_restart, 30, "scrapes after the restart")
    before = live_count()
    # SIGKILL every process of the job (what a node crash does), Prometheus included
    killed = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if f"JOB_ID={job_id}".encode() in (p / "environ").read_bytes().split(b"\0"):
                    os.kill(int(p.name), signal.SIGKILL)
                    killed.append(p.name)
            except (OSError, ProcessLookupError):
                pass
    assert killed
    run(["scancel", job_id], env=cluster)
    wait_job_end(cluster, job_id, 60)
    assert (tsdb / "wal").is_dir()
    saved = query(tsdb, "sum(count_over_time(hw_procs_running[1h]))")
    assert float(saved[0]["value"][1]) >= before


def test_falls_back_to_the_plain_launch_when_ray_cannot_start(cluster, workspace, venv):
    # an object store below Ray's minimum makes `ray start` fail on every node
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=5", RAY="1",
                         RAY_OBJECT_STORE_BYTES="1000", RAY_JOIN_TIMEOUT="20")
    assert wait_job_end(cluster, job_id, 300) == "COMPLETED", log.read_text()[-3000:]
    assert log_has(log, r"^n1: _train_with_ray.sh: Ray head did not start on n1 .* falling back to the plain launch")
    assert log_has(log, r"^n2: _train_with_ray.sh: .*falling back to the plain launch")
    for host in ("n1", "n2"):
        assert log_has(log, rf"^{host}: .*completed step: 4,")
    assert summary(log)["status"] == "completed"
    assert trainer_pid(job_id, 0) is None


def test_killed_rank_stops_the_ray_job_fast(cluster, workspace, venv):
    """RAY=1: the actor of the node whose trainer dies reports it at once and the driver stops the
    other nodes' trainers: the job ends within 30 s, the JOB SUMMARY names the node."""
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000", RAY="1")
    wait_for(lambda: log_has(log, r"^n2: .*completed step: 3,"), 240, "n2 to train")
    pid = trainer_pid(job_id, 1)
    assert pid, "rank 1 trainer not found"
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_job_end(cluster, job_id, 60)
    assert time.monotonic() - killed_at < 30, "the job took too long to end after the kill"
    s = summary(log)
    assert s["status"] == "failed" and s["failed_nodes"].startswith("n2 (exit 137)"), s
    assert log_has(log, r"^n1: _ray_actor\.py: training on n2 exited with 137; stopping the other nodes")
    assert trainer_pid(job_id, 0) is None, "rank 0 survived"


def test_frozen_rank_hang_then_heartbeat_timeout(cluster, workspace, venv):
    """A rank frozen with SIGSTOP (what a stuck driver call or a swap storm looks like). While the job
    runs, triage says hung; once JAX's coordination service declares the task dead (~1 min), the job
    fails and triage blames the frozen node (heartbeat_timeout, not the survivor's abort), and
    diagnose finds the accused host really stopped (not a heartbeat false positive)."""
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000", RAY="1", METRICS_INTERVAL="2")
    wait_for(lambda: log_has(log, r"^n2: .*completed step: 30,"), 240, "n2 to train")
    pid = trainer_pid(job_id, 1)
    assert pid, "rank 1 trainer not found"
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(20)
        r = triage(log, cluster, "--hang-min-seconds", "15")
        assert r["status"] == "hung" and r["failure_class"] == "hang", r["summary"]
        assert r["hang"]["last_step_age_seconds"] > 15 and r["scheduler_state"] == "RUNNING"
        assert any("py-spy dump" in n for n in r["next_steps"])
        assert wait_job_end(cluster, job_id, 180) == "FAILED", log.read_text()[-3000:]
    finally:
        if job_state(cluster, job_id) in ("RUNNING", "PENDING"):
            run(["scancel", job_id], env=cluster)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert log_has(log, r"stopped sending heartbeats")
    r = triage(log, cluster)
    assert r["failure_class"] == "heartbeat_timeout" and r["culprit_hosts"] == ["n2"], r["summary"]
    res = run([str(venv / "bin/python"), str(REPO / "utils/diagnose.py"), str(log.with_suffix("")), "--json"], timeout=300)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["verdict"] != "heartbeat_false_positive", d["summary"]
    hb = [f for f in d["findings"] if f["kind"] == "heartbeat_timeout"]
    assert hb and hb[0]["hosts"] == ["n2"], d["findings"]
