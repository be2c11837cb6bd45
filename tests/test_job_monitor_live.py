"""utils/job_monitor.py on real jobs of the local Slurm cluster, its notifications delivered
through Apprise's generic JSON webhook (json://) to a real HTTP receiver on 127.0.0.1: a completed
job (first step, completion; a restarted monitor sends nothing again), a frozen rank (a hang within
3 x the threshold), a killed rank (a failure naming the node), a notifier that cannot deliver (the
job completes), and self-healing on a 3-node cluster (n2 killed: resubmitted without n2, restores
the run's checkpoint, completes). Each test prints what it measured (run with -s)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, VENV, launcher_env, run

from helpers.jobs import SUBMITTED, own_cache_if_several_nodes, trainer_pid, wait_for, wait_job_end, wait_log
from helpers.users import as_user, ensure_users, reachable_base, shared_workspace
from helpers.webhook import Receiver, notify_conf

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
MONITOR = str(REPO / "utils/job_monitor.py")


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def submit(env: dict[str, str], *args: str) -> tuple[str, Path]:
    res = run([str(REPO / "submit.sh"), *args], env={**env, **own_cache_if_several_nodes(args)})
    assert res.returncode == 0, res.stderr
    m = re.search(r"Submitted job (\d+) \((\S+)\)", res.stdout)
    assert m, res.stdout
    SUBMITTED.append(m.group(1))
    return m.group(1), Path(env["JOB_WORKSPACE"]) / f"{m.group(1)}-{m.group(2)}"


def start_monitor(env: dict[str, str], job_id: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [MONITOR, job_id, "--interval", "2", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(p: subprocess.Popen) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    return out


def monitor_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_completed_job_sends_first_step_and_completion_once(cluster, workspace, receiver, tmp_path):
    """submit.sh --notify starts the monitor detached; a second monitor afterwards sends nothing."""
    env = {**cluster, **launcher_env(workspace), "MST_NOTIFY_CONFIG": str(notify_conf(tmp_path, receiver.port))}
    job_id, job_dir = submit(env, "tiny", "-N", "2", "--notify", "--", "steps=200")
    wait_job_end(cluster, job_id, 300)
    pid_file = job_dir / "monitor/monitor.pid"
    wait_for(lambda: receiver.first(job_id, "completed"), 120, "the completion notification")
    titles = receiver.titles(job_id)
    assert any("first step" in t for t in titles), titles
    done = receiver.first(job_id, "completed")
    assert done["type"] == "success" and "wall_time:" in done["message"], done
    assert len(titles) == len(set(titles)), titles
    wait_for(
        lambda: not pid_file.exists() or not Path(f"/proc/{pid_file.read_text().strip()}").exists(),
        60,
        "the detached monitor to exit",
    )
    n = len(receiver.got)
    res = run([MONITOR, job_id, "--once", "--interval", "1"], env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    time.sleep(1)
    assert len(receiver.got) == n, receiver.got[n:]
    events = [json.loads(x)["key"] for x in (job_dir / "monitor/events.jsonl").read_text().splitlines()]
    assert events.count("end") == 1 and events.count("first_step") == 1, events
    print(f"\nnotifications for job {job_id}: {titles}")


def test_a_frozen_rank_is_a_hang_then_killed_a_failure_naming_its_node(cluster, workspace, receiver, tmp_path):
    """n2's trainer SIGSTOPped: a hang within 3 x the threshold; then SIGKILLed: the job fails and
    the failure names n2 (one job for both, to keep the suite short)."""
    env = {**cluster, **launcher_env(workspace)}
    job_id, job_dir = submit(env, "tiny", "-N", "2", "--", "steps=1000000", "log_period=1000")
    floor = 20.0
    conf = notify_conf(tmp_path, receiver.port)
    mon = start_monitor(env, job_id, "--hang-floor", str(floor), "--notify-config", str(conf))
    log = job_dir.with_suffix(".log")
    try:
        wait_log(log, r"^n2: .*completed step: 40,", 240, "n2 to train")
        pid = trainer_pid(job_id, 1)
        assert pid
        os.kill(pid, signal.SIGSTOP)
        frozen = time.time()
        wait_for(lambda: receiver.first(job_id, "hang"), 3 * floor + 30, "the hang notification")
        hang = receiver.first(job_id, "hang")
        steps = [float(m) for m in re.findall(r"\] completed step: \d+, seconds: ([\d.]+)", log.read_text())]
        p99 = sorted(steps)[int(0.99 * (len(steps) - 1))]
        latency = hang["at"] - frozen
        print(
            f"\nhang told {latency:.1f} s after the freeze (threshold {floor:g} s, p99 step {p99:.3f} s); "
            f"monitor CPU so far {monitor_cpu_seconds(mon.pid):.2f} s"
        )
        assert latency <= 3 * floor, latency
        assert hang["type"] == "failure" and "no step for" in hang["title"], hang
        os.kill(pid, signal.SIGKILL)
        wait_job_end(cluster, job_id, 120)
        wait_for(lambda: receiver.first(job_id, "failed"), 120, "the failure notification")
    finally:
        run(["scancel", job_id], env=cluster)
        out = stop(mon)
    fail = receiver.first(job_id, "failed")
    assert fail["type"] == "failure" and "culprit hosts: n2" in fail["message"], fail
    assert "Traceback" not in out, out


def test_a_notifier_that_cannot_deliver_does_not_stop_the_job(cluster, workspace, tmp_path):
    """The webhook's port is closed: the job completes, the monitor logs the retries and ends."""
    env = {**cluster, **launcher_env(workspace)}
    with socket_port() as port:
        pass  # a port nothing listens on any more
    job_id, job_dir = submit(env, "tiny", "-N", "2", "--", "steps=100")
    mon = start_monitor(env, job_id, "--linger", "5", "--notify-config", str(notify_conf(tmp_path, port)))
    try:
        assert wait_job_end(cluster, job_id, 300) == "COMPLETED"
        mon.wait(timeout=180)
    finally:
        out = stop(mon)
    assert mon.returncode == 0, out
    assert re.search(r"delivery of '\S+' failed \(attempt \d+\)", out), out
    assert "completed: completed" in out and "Traceback" not in out, out


class socket_port:
    """A free 127.0.0.1 port (bound while inside the with block)."""

    def __enter__(self) -> int:
        import socket

        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        return self.s.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.s.close()


# --- self-healing on a 3-node cluster ------------------------------------------------------------
@pytest.fixture(scope="module")
def three_nodes() -> Iterator[dict[str, str]]:
    """A 3-node local cluster of this module's own (its own dir and ports), taken down after."""
    top = tempfile.mkdtemp(prefix="mstheal.", dir="/tmp")
    os.chmod(top, 0o755)  # munged insists that every parent of its socket is a+x
    env = {"LOCAL_CLUSTER_DIR": f"{top}/c"}
    tool = str(REPO / "utils/local_cluster.sh")
    try:
        res = run([tool, "up", "3"], env=env, timeout=120)
        assert res.returncode == 0, f"3-node cluster did not come up: {res.stdout}{res.stderr}"
        env["SLURM_CONF"] = f"{top}/c/slurm.conf"
        yield env
    finally:
        run([tool, "down"], env=env, timeout=120)
        shutil.rmtree(top, ignore_errors=True)


def test_self_healing_resubmits_without_the_killed_node_and_restores(three_nodes, workspace, receiver, tmp_path):
    env = {**three_nodes, **launcher_env(workspace), "MST_NOTIFY_CONFIG": str(notify_conf(tmp_path, receiver.port))}
    job_id, job_dir = submit(
        env, "tiny", "-N", "2", "--run", "heal", "--auto-recover", "1", "--", "steps=400", "checkpoint_period=50"
    )
    log = job_dir.with_suffix(".log")
    try:
        wait_log(log, r"^n2: .*completed step: 120,", 240, "n2 to pass a checkpoint")
        os.kill(trainer_pid(job_id, 1) or 0, signal.SIGKILL)
        fault = time.time()
        wait_for(lambda: receiver.first(job_id, "resubmitted as job"), 180, "the resubmission")
        rec = receiver.first(job_id, "resubmitted as job")
        new_id = re.search(r"resubmitted as job (\d+) without n2", rec["title"]).group(1)
        SUBMITTED.append(new_id)
        wait_for(lambda: receiver.first(new_id, "first step"), 240, "the new job's first step")
        new_log = next(workspace.glob(f"{new_id}-*.log"))
        first = receiver.first(new_id, "first step")
        assert wait_job_end(three_nodes, new_id, 300) == "COMPLETED"
        wait_for(lambda: receiver.first(new_id, "completed"), 120, "the new job's completion")
    finally:
        run(["scancel", job_id], env=three_nodes)
    story = [m["title"].split(": ", 1)[1] for m in receiver.got]
    print(
        f"\nself-healing: fault -> resubmitted {rec['at'] - fault:.1f} s, fault -> its first step "
        f"{first['at'] - fault:.1f} s; notifications: {story}"
    )
    failed = receiver.first(job_id, "failed")
    assert failed and "culprit hosts: n2" in failed["message"], receiver.got
    assert "--exclude=n2" in rec["message"] and "restores the latest checkpoint of run heal" in rec["message"], rec
    header = new_log.read_text().split("=" * 45)[0]
    assert re.search(r"^nodes: 2 \(n1 n3\)$", header, re.M), header
    assert re.search(r"first step \((\d+)\)", first["title"]).group(1) not in ("0", "1"), first  # restored
    assert re.search(r"restoring from this run's directory step \d+", new_log.read_text())
    assert rec["at"] < first["at"] and failed["at"] <= rec["at"]


# --- attack 1 of issue 19 on a real job in a group workspace ---------------------------------------
def test_a_teammate_cannot_make_the_victims_monitor_resubmit_her_code(cluster, receiver):
    """The victim submits with --auto-recover 1 in a 2775 group workspace under umask 002. While the
    job trains, a teammate tries attack 1: replace `artifact`, plant monitor state, append a JOB
    SUMMARY blaming n2 (all refused by the file system: the job dir is 0755, the log 0644), then
    moves the job dir and log aside and puts her own in their place (payload snapshot with its right
    hash, a state with a budget, a failed log). The monitor stops with one line naming the path and
    its owner, the payload's canary never appears, and the victim's job trains on."""
    victim, attacker = ensure_users()
    base = reachable_base()
    try:
        ws = shared_workspace(base, "group")
        conf = victim.home / f"notify-{base.name}.conf"
        res = as_user(
            victim, ["bash", "-c", f"umask 077; echo json://127.0.0.1:{receiver.port}/hook > {conf}"], check=True
        )
        env = {**cluster, "MAXTEXT_SLURM_VENV": str(VENV), "JOB_WORKSPACE": str(ws), "MST_NOTIFY_CONFIG": str(conf)}
        res = as_user(
            victim,
            [
                str(REPO / "submit.sh"),
                "tiny",
                "-N",
                "2",
                "--auto-recover",
                "1",
                "--",
                "steps=1000000",
                "log_period=1000",
            ],
            env=env,
            umask=0o002,
            cwd=REPO,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        m = re.search(r"Submitted job (\d+) \((\S+)\)", res.stdout)
        assert m and "monitor: pid" in res.stdout, res.stdout + res.stderr
        job_id, name = m.group(1), f"{m.group(1)}-{m.group(2)}"
        SUBMITTED.append(job_id)
        job, log = ws / name, ws / f"{name}.log"
        wait_log(log, r"^n2: .*completed step: 20,", 300, "the victim's job to train")
        pay = ws / "payload"
        h = _attacker_payload(attacker, pay)
        summary = (
            "==================== JOB SUMMARY ====================\\nstatus: failed\\nfailed_nodes: n2 (exit 137)\\n"
        )
        tried = as_user(
            attacker,
            [
                "bash",
                "-c",
                f"""ln -sfn {pay} {job}/artifact && echo REPLACED-ARTIFACT
                mkdir {job}/monitor/x 2>/dev/null && echo PLANTED-STATE
                echo '{{"recover_left": 5}}' > {job}/monitor/state.json && echo PLANTED-STATE
                printf '{summary}' >> {log} && echo APPENDED""",
            ],
            umask=0o002,
        )
        assert not re.search(r"REPLACED|PLANTED|APPENDED", tried.stdout), tried.stdout + tried.stderr
        swap = as_user(
            attacker,
            [
                "bash",
                "-c",
                f"""set -e; cd {ws}
                mv {name} {name}.away; mv {name}.log {name}.log.away
                mkdir {name}; ln -s {pay} {name}/artifact; printf '%s  %s\\n' {h} {pay} > {name}/snapshot.sha256
                mkdir {name}/monitor; echo '{{"job_id": "{job_id}", "recover_left": 5}}' > {name}/monitor/state.json
                {{ head -c 4000 {name}.log.away; printf '{summary}'; }} > {name}.log
                ln -s {ws}/{name}.log {name}/log""",
            ],
            umask=0o002,
        )
        assert swap.returncode == 0, swap.stderr
        said = wait_for(lambda: receiver.first(job_id, "stopped watching"), 60, "the monitor to say why it stopped")
        assert f"refusing the job directory {job}: it is owned by mstattacker (mode 2775)" in said["message"], said
        steps = len(re.findall(r"completed step", (ws / f"{name}.log.away").read_text()))
        time.sleep(25)  # two more polls of the detached monitor, and the job trains on
        assert not (ws / "CANARY").exists(), "the attacker's submit.sh ran as the victim"
        assert len(re.findall(r"completed step", (ws / f"{name}.log.away").read_text())) > steps
        state = run(["scontrol", "show", "job", "-o", job_id], env=cluster).stdout
        assert "JobState=RUNNING" in state, state
        mon_log = (ws / f"{name}.away/monitor/monitor.log").read_text()
        assert f"{name}: untrusted: stopped watching" in mon_log, mon_log
        assert "resubmitted as job" not in mon_log and "Traceback" not in mon_log, mon_log
        print(f"\nattack 1 on job {job_id}: the monitor said: {said['message']}")
    finally:
        if "job_id" in locals():
            run(["scancel", job_id], env=cluster)
        shutil.rmtree(base, ignore_errors=True)
        (victim.home / f"notify-{base.name}.conf").unlink(missing_ok=True)


def _attacker_payload(attacker, where: Path) -> str:
    """A snapshot of the attacker's whose submit.sh writes the canary as whoever runs it; its hash."""
    script = (
        f"mkdir -p {where}/.submit; printf '#!/bin/bash\\nid -un > \"$JOB_WORKSPACE/CANARY\"\\n' > {where}/submit.sh; "
        f"chmod 755 {where}/submit.sh; echo 'submit.sh tiny' > {where}/.submit/command.txt"
    )
    assert as_user(attacker, ["bash", "-c", script]).returncode == 0
    res = as_user(attacker, ["bash", str(REPO / "_job.sbatch"), "--snapshot-hash", str(where)])
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()
