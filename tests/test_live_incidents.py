"""Live incidents: a real RAY=1 job on a 2-node local cluster whose nodes have their own network
namespace and PSI (`local_cluster.sh up 2 --netns`), one fault injected on n2 with utils/drill.sh,
then both tools asked what happened: diagnose's verdict and culprit and triage's. A killed and a
frozen rank are in tests/test_ray_job.py. Each test prints the time from the end of the job to each
tool's answer (run with -s to see it)."""

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, run

from helpers.jobs import job_state, log_has, submit, triage, wait_for, wait_job_end
from helpers.webhook import Receiver, notify_conf

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.machine]

TOOL = str(REPO / "utils/local_cluster.sh")
DRILL = str(REPO / "utils/drill.sh")


@pytest.fixture(scope="module")
def netns_cluster() -> Iterator[dict[str, str]]:
    yield from _netns_cluster(2)


def _netns_cluster(nodes: int) -> Iterator[dict[str, str]]:
    """A --netns cluster of this module's own (its own dir, bridge and subnet), taken down after."""
    top = tempfile.mkdtemp(prefix="mstlive.", dir="/tmp")  # short: Unix sockets live under it
    os.chmod(top, 0o755)  # munged insists that every parent of its socket is a+x
    d = f"{top}/c"
    env = {"LOCAL_CLUSTER_DIR": d}
    try:
        res = run([TOOL, "up", str(nodes), "--netns"], env=env, timeout=120)
        assert res.returncode == 0, f"--netns cluster did not come up: {res.stdout}{res.stderr}"
        env["SLURM_CONF"] = f"{d}/slurm.conf"
        yield env
    finally:
        run([DRILL, "clear"], env=env)
        run([TOOL, "down"], env=env, timeout=120)
        shutil.rmtree(top, ignore_errors=True)


def findings(d: dict) -> str:
    """Every finding of a diagnose --json answer, one per line, for a failing assertion."""
    return d["summary"] + "".join(f"\n  {f['kind']} {f['score']} {f['hosts']}: {f['summary']}" for f in d["findings"])


@pytest.fixture()
def disk_workspace(workspace: Path) -> Iterator[Path]:
    """The job workspace on a disk: the IO drill refuses a directory in memory (a tmpfs /tmp), so
    then the workspace goes under the repository's outputs/ (ignored by git)."""
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(workspace)], capture_output=True, text=True).stdout.strip()
    if fs not in ("tmpfs", "ramfs"):
        yield workspace
        return
    (REPO / "outputs").mkdir(exist_ok=True)
    ws = Path(tempfile.mkdtemp(prefix="live-io.", dir=REPO / "outputs"))
    try:
        yield ws
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def drill(cluster: dict[str, str], *args: str, **env: str) -> None:
    res = run([DRILL, *args], env={**cluster, **env})
    assert res.returncode == 0, res.stderr


def start(cluster: dict[str, str], workspace: Path, steps: int, nodes: int = 2) -> tuple[str, Path]:
    """A RAY=1 job of `steps` steps, scraped every 2 s; returns once n2 has done step 40. 1000 steps
    keep an idle machine training (~0.05 s a step) well past a 20 s fault that starts now: the metrics
    end with the job, so a job that ends within the fault shows only its start."""
    # 3 CPU devices cannot split the tiny model's weights (fsdp 3): replicate them, split the batch
    mesh = ["ici_fsdp_parallelism=1", "ici_data_parallelism=-1"] if nodes % 2 else []
    job_id, log = submit(
        cluster, workspace, "tiny", "-N", str(nodes), "--", f"steps={steps}", "log_period=5", *mesh,
        RAY="1", METRICS_INTERVAL="2",
    )  # fmt: skip

    def trained() -> bool:
        if log_has(log, r"^n2: .*completed step: 40,"):
            return True
        assert job_state(cluster, job_id) in ("PENDING", "RUNNING", "CONFIGURING"), log.read_text()[-3000:]
        return False

    wait_for(trained, 420, "n2 to train")
    return job_id, log


def answers(cluster: dict[str, str], venv: Path, job_id: str, log: Path, name: str) -> tuple[dict, dict]:
    """Wait for the job's end, then diagnose --json and triage --json, timed from the end."""
    try:
        state = wait_job_end(cluster, job_id, 300)
    finally:
        if job_state(cluster, job_id) in ("PENDING", "RUNNING"):
            run(["scancel", job_id], env=cluster)
    ended = time.monotonic()
    res = run([str(venv / "bin/python"), str(REPO / "utils/diagnose.py"), str(log.with_suffix("")), "--json"])
    took_d = time.monotonic() - ended
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    d = json.loads(res.stdout)
    t0 = time.monotonic()
    t = triage(log, cluster)
    took_t = time.monotonic() - t0
    print(
        f"\nlive {name}: job {state}; diagnose {d['verdict']} {d['culprit_hosts']} {took_d:.1f} s after the end;"
        f" triage {t['status']}/{t.get('failure_class')} {t.get('culprit_hosts')} {took_t:.1f} s; {d['summary']}"
    )
    return d, t


def test_packet_loss_on_one_node_is_a_network_incident_there(netns_cluster, workspace, venv, tmp_path):
    """5 % of what n2 sends dropped for 20 s: the job slows down, n2 retransmits, n1 does not;
    the job's Prometheus fires TCPRetransmitsStandOut for n2 while it happens, and the job monitor
    delivers it to a webhook (utils/diagnosis/alerts.tsv, utils/observe/alert_relay.py);
    diagnose blames the network on n2; the job itself completes (triage: completed)."""
    job_id, log = start(netns_cluster, workspace, 1000)
    hook = Receiver()
    mon = subprocess.Popen(
        [str(REPO / "utils/job_monitor.py"), job_id, "--interval", "2",
         "--notify-config", str(notify_conf(tmp_path, hook.port))],
        env={**os.environ, **netns_cluster, "JOB_WORKSPACE": str(workspace)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        drill(netns_cluster, "net", "--loss", "5", "--node", "n2")
        began = time.time()
        try:
            time.sleep(20)
        finally:
            drill(netns_cluster, "clear")
        fired = wait_for(lambda: hook.first(job_id, "TCPRetransmitsStandOut on n2"), 120, "the alert at the webhook")
        print(f"\nlive alert: at the webhook {fired['at'] - began:.0f} s after the loss began")
    finally:
        if mon.poll() is None:
            mon.terminate()
        said = mon.communicate(timeout=60)[0]
        hook.server.shutdown()
    assert "query: sum by (host) (rate(hw_tcp_retransmits_total[1m]))" in fired["message"], fired
    assert log_has(log, r"^n1: alert: firing TCPRetransmitsStandOut host=n2 check=network value=[0-9.e+]+: n2 "), said
    assert not log_has(log, r"^n1: alert: firing \S+ host=n1 check=network "), "a network alert about the healthy node"
    d, t = answers(netns_cluster, venv, job_id, log, "net --loss 5")
    assert d["verdict"] == "network" and d["culprit_hosts"] == ["n2"], findings(d)
    net = next(f for f in d["findings"] if f["kind"] == "network")
    assert "hw_tcp_retransmits_total" in net["values"]["signal"]
    assert net["values"]["rate_per_s"]["n2"] > 4 * net["values"]["peer_median_per_s"], net["values"]
    assert t["status"] == "completed" and t["failure_class"] is None, t["summary"]


def test_heavy_io_on_the_workspace_is_io_pressure_on_that_node(netns_cluster, disk_workspace, venv):
    """20 s of direct-IO writers in n2's cgroup, throttled like a slow disk: n2's own PSI (not the
    machine's) shows the stall."""
    workspace = disk_workspace
    job_id, log = start(netns_cluster, workspace, 1000)
    drill(netns_cluster, "io", "--seconds", "20", "--node", "n2", JOB_WORKSPACE=str(workspace))
    d, t = answers(netns_cluster, venv, job_id, log, "io")
    assert d["verdict"] == "io_pressure" and d["culprit_hosts"] == ["n2"], findings(d)
    assert t["status"] == "completed" and t["failure_class"] is None, t["summary"]
    assert not [p for p in workspace.iterdir() if p.name.startswith(".drill-io")], "the IO drill left its files"


def test_memory_limit_oom_kills_the_trainer_of_one_node(netns_cluster, workspace, venv):
    """n2's trainer in a 256 MiB memory cgroup with a hog: the kernel OOM-kills it, the job fails;
    triage blames n2 (oom_host); diagnose finds the OOM kill. The kernel's oom_kill counter
    (/proc/vmstat) is the machine's, and the local nodes share one kernel, so every node shows it and
    the finding is fleet-wide (no culprit) here: n2 must be among its hosts. On a real cluster each
    node has its own kernel and only n2's counter rises (tests/test_diagnose.py's oom corpus)."""
    job_id, log = start(netns_cluster, workspace, 5000)
    drill(netns_cluster, "oom", "--node", "n2")
    try:
        d, t = answers(netns_cluster, venv, job_id, log, "oom")
    finally:
        drill(netns_cluster, "clear")
    assert t["status"] == "failed" and t["failure_class"] == "oom_host" and t["culprit_hosts"] == ["n2"], t["summary"]
    mem = next(f for f in d["findings"] if f["kind"] == "memory")
    assert d["verdict"] == "memory" and "n2" in mem["hosts"], findings(d)
    assert mem["values"]["hosts"]["n2"]["oom_kills"] >= 1, mem["values"]


# --- the matrix: each fault with 2 and with 3 nodes ---------------------------------------------
# Packet loss at 5 % and 20 %, made on the node's bridge port (its peers' side of the wire) and
# inside its own namespace (its kernel sees the drops; both ends of a lossy connection then
# retransmit on timeouts alike), heavy IO, an OOM kill, a frozen and a killed rank; n2 is always
# the node at fault. The whole suite runs the rows in SUITE; MST_LIVE_MATRIX=1 generates every row
# (about 2.5 min each: `MST_LIVE_MATRIX=1 tests/run.sh tests/test_live_incidents.py -k matrix -s`).
@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    nodes: int
    fault: tuple[str, ...]  # utils/drill.sh's arguments (--node n2 added)
    verdict: str  # diagnose's verdict: network, io_pressure, memory; "-" for the failed-rank rows (triage's)


LOSS = [
    Case(f"loss{pct}-{where}-{n}n", n, ("net", "--loss", pct, *(("--inside",) if where == "inside" else ())), "network")
    for n in (2, 3)
    for pct in ("5", "20")
    for where in ("bridge", "inside")
]
OTHERS = [
    Case(f"{kind}-{n}n", n, (kind,), verdict)
    for n in (2, 3)
    for kind, verdict in (("io", "io_pressure"), ("oom", "memory"), ("freeze", "-"), ("kill", "-"))
]
# in the whole suite: the 2-node incident that read `none` (issue 22 item 8) and then named the
# healthy end (n1 retransmits ~3x what n2 does); the 2-node bridge loss, IO and OOM rows are the
# tests above
SUITE = {"loss20-inside-2n"}
MATRIX = [c for c in LOSS + OTHERS if os.environ.get("MST_LIVE_MATRIX") == "1" or c.name in SUITE]


@pytest.fixture(scope="module")
def netns_cluster3() -> Iterator[dict[str, str]]:
    yield from _netns_cluster(3)


def _assert_network(d: dict, case: Case) -> None:
    """n2 named, never a peer: on the bridge n2 retransmits what is lost; inside its namespace n1
    retransmits more (~3x measured) but n2's own stack counts what it dropped (IP OutRequests above
    OutTransmits), which decides."""
    net = next((f for f in d["findings"] if f["kind"] == "network"), None)
    assert d["verdict"] == "network" and net is not None and d["culprit_hosts"] == ["n2"], findings(d)
    if "--inside" in case.fault:
        assert net["values"]["side"] == "local" and net["values"]["dropped_share"]["n2"] > 0.01, net["values"]


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: c.name)
def test_matrix(case: Case, request, workspace, venv):
    cluster = request.getfixturevalue("netns_cluster" if case.nodes == 2 else "netns_cluster3")
    if case.fault[0] == "io":
        workspace = request.getfixturevalue("disk_workspace")
    job_id, log = start(cluster, workspace, 5000 if case.fault[0] in ("oom", "freeze", "kill") else 1000, case.nodes)
    env = {"JOB_WORKSPACE": str(workspace)} if case.fault[0] == "io" else {}
    try:
        drill(cluster, *case.fault, "--node", "n2", **env)
        if case.fault[0] == "net":
            time.sleep(20)
            drill(cluster, "clear")
        d, t = answers(cluster, venv, job_id, log, case.name)
    finally:
        drill(cluster, "clear")
    if case.verdict == "network":
        _assert_network(d, case)
        assert t["status"] == "completed", t["summary"]
    elif case.verdict == "io_pressure":
        assert d["verdict"] == "io_pressure" and d["culprit_hosts"] == ["n2"], findings(d)
        assert t["status"] == "completed", t["summary"]
    elif case.verdict == "memory":  # the local nodes share one kernel's oom_kill counter (see above)
        mem = next(f for f in d["findings"] if f["kind"] == "memory")
        assert d["verdict"] == "memory" and "n2" in mem["hosts"], findings(d)
        assert t["failure_class"] == "oom_host" and t["culprit_hosts"] == ["n2"], t["summary"]
    elif case.fault[0] == "freeze":  # JAX declares n2's task dead: triage blames it, diagnose agrees
        assert t["failure_class"] == "heartbeat_timeout" and t["culprit_hosts"] == ["n2"], t["summary"]
        assert d["verdict"] != "heartbeat_false_positive", findings(d)
        assert set(d["culprit_hosts"]) <= {"n2"}, findings(d)
    else:  # killed: the job fails at once, naming n2
        assert t["status"] == "failed" and t["culprit_hosts"] == ["n2"], t["summary"]
        assert set(d["culprit_hosts"]) <= {"n2"}, findings(d)
