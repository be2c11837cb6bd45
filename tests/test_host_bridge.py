"""The host command bridge (utils/host_bridge.py, docs/host-bridge.md).

Each test starts a real bridge (`serve`, foreground) in a short private directory under /tmp, with
the server's PATH led by stand-ins where a test needs Slurm's answers (this machine has no Slurm
configuration outside the local cluster, which these tests do not start). The container test runs
the client in the real podman (private storage, a tiny image holding only the Python interpreter's
binary and libraries; its standard library, the repository and the bridge directory mounted
read-only), so the request crosses a mount namespace and a read-only bind mount. The other-uid
tests connect as `nobody` (uid 65534): through the 0700 directory (refused by the kernel) and,
with the directory opened up, to the socket itself (refused by the bridge's SO_PEERCRED check).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

from helpers import logcorpus
from helpers.podman import private_podman, tiny_image

TOOL = REPO / "utils" / "host_bridge.py"
PY = str(VENV / "bin" / "python")
NOBODY = 65534


@dataclass
class Bridge:
    dir: Path
    proc: subprocess.Popen
    env: dict[str, str]
    log: Path

    def call(self, *argv: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        return run([PY, str(TOOL), "call", *argv], env={**self.env, **env}, timeout=timeout, cwd=REPO)

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in (self.dir / "audit.jsonl").read_text().splitlines()]


def stubs(where: Path, scripts: dict[str, str]) -> str:
    """Stand-in commands (name -> sh body) in WHERE; returns the PATH that puts them first."""
    where.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (where / name).write_text(f"#!/bin/sh\n{body}\n")
        (where / name).chmod(0o755)
    return f"{where}:{os.environ['PATH']}"


@contextmanager
def bridge(tmp_path: Path, config: str | None = None, path: str | None = None, **env: str) -> Iterator[Bridge]:
    """A bridge served from this repository for the test's workspace; stopped afterwards."""
    short = Path(tempfile.mkdtemp(prefix="mst-br-", dir="/tmp"))
    cfg_home = tmp_path / "config"
    cfg_home.mkdir(exist_ok=True)
    full = {"XDG_CONFIG_HOME": str(cfg_home), "JOB_WORKSPACE": str(tmp_path / "ws"), **env}
    if path:
        full["PATH"] = path
    args = [PY, str(TOOL), "serve", "--dir", str(short / "b")]
    if config is not None:
        (cfg_home / "bridge.toml").write_text(config)
        (cfg_home / "bridge.toml").chmod(0o600)
        args += ["--config", str(cfg_home / "bridge.toml")]
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        args, env={**os.environ, **full}, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd="/"
    )
    try:
        first = proc.stdout.readline().strip()
        assert first == str(short / "b"), f"serve printed {first!r}: {log.read_text()}"
        yield Bridge(short / "b", proc, {"XDG_CONFIG_HOME": str(cfg_home)}, log)
    finally:
        run([PY, str(TOOL), "stop", "--dir", str(short / "b")], timeout=60)
        proc.wait(timeout=30)
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    logcorpus.write_job(logcorpus.Job(job_id="4242", failure="collective_error", hosts=["n1", "n2"]), ws)
    return ws


# --- a container ---------------------------------------------------------------------------------
@pytest.mark.slow  # a podman container start
@pytest.mark.heavy
def test_an_allowlisted_command_runs_from_inside_a_podman_container(tmp_path, workspace):
    """The client in a container (its own mount namespace; bridge dir, repository and Python mounted
    read-only, no network) gets triage's report of a job the container cannot see."""
    if not shutil.which("podman"):
        pytest.skip("podman is not installed")
    if os.geteuid() != 0:
        pytest.skip("the private podman store of these tests is made for root")
    base = Path(sys.base_prefix)
    python = Path(os.path.realpath(base / "bin" / "python3"))
    with private_podman(tmp_path) as podman, bridge(tmp_path) as b:
        tiny_image(podman, tmp_path / "rootfs", [str(python)], "localhost/mst-bridge:1")
        mounts = [f"-v={p}:{p}:ro" for p in (b.dir, REPO, base)]
        container = ["podman", "run", "--rm", "--network=none", *mounts, f"--workdir={REPO}"]
        container += [f"-e=MST_HOST_BRIDGE={b.dir}", "localhost/mst-bridge:1", f"/bin/{python.name}"]
        res = run([*container, "utils/host_bridge.py", "call", "utils/triage.py", "4242", "--json"], env=podman)
        assert res.returncode == 0, res.stderr
        report = json.loads(res.stdout)
        assert (report["job_id"], report["status"], report["failure_class"]) == ("4242", "failed", "collective_error")
        # the job's workspace is not in the container: the report came from the host
        res = run([*container, "-c", f"import os; print(os.path.exists({str(workspace)!r}))"], env=podman)
        assert res.stdout.strip() == "False", res.stdout + res.stderr
        # refused in the container as on the host: 126, the reason on stderr, nothing run
        res = run([*container, "utils/host_bridge.py", "call", "sh", "-c", "id"], env=podman)
        assert res.returncode == 126 and "host_bridge: refused: 'sh' is not on the allowlist" in res.stderr
        allowed, refused = b.audit()
        assert (allowed["argv"], allowed["decision"], allowed["exit"]) == (
            ["utils/triage.py", "4242", "--json"],
            "allowed",
            0,
        )
        assert allowed["uid"] == os.getuid() and allowed["duration_s"] > 0
        assert (refused["argv"], refused["decision"]) == (["sh", "-c", "id"], "refused")


# --- refusals ------------------------------------------------------------------------------------
REFUSED = [
    (["rm", "-rf", "/"], "'rm' is not on the allowlist"),
    (["/usr/bin/squeue"], "not on the allowlist"),
    (["squeue", "-u", "me;id"], "shell metacharacter ';'"),
    (["sacct", "-j", "$(id)"], "shell metacharacter '$'"),
    (["sinfo", "x\nid"], "control character"),
    (["squeue", "-o", "%i`id`"], "shell metacharacter '`'"),
    (["scontrol", "update", "jobid=1", "hold"], "only `scontrol [FLAGS] show ENTITY [NAME]`"),
    (["scontrol", "--quiet", "show", "job", "1"], "scontrol flag '--quiet' is not allowed"),
    (["scontrol", "show", "assoc_mgr"], "scontrol show 'assoc_mgr' is not allowed"),
    (["utils/triage.py", "/etc/passwd"], "path '/etc/passwd' is outside"),
    (["utils/triage.py", "outputs/../../../etc/passwd"], "is outside"),
    (["utils/diagnose.py", "4242", "--plot=/root/plots"], "path '/root/plots' is outside"),
    (["utils/prometheus.sh", "view", "4242"], "prometheus.sh 'view' is not allowed"),
    (["utils/prometheus.sh", "serve", "4242"], "prometheus.sh 'serve' is not allowed"),
    (["utils/sweep.py", "batch", "tiny"], "not on the allowlist"),
    (["submit.sh", "tiny"], "submit.sh without --dry-run is disabled"),
    (["submit.sh", "tiny", "--", "--dry-run"], "submit.sh without --dry-run is disabled"),
    (["scancel", "4242"], "scancel is disabled"),
]


def test_off_the_list_or_with_shell_metacharacters_is_refused_and_logged(tmp_path, workspace):
    marker = tmp_path / "ran"
    path = stubs(tmp_path / "bin", {n: f"touch {marker}" for n in ("squeue", "sacct", "sinfo", "scontrol", "scancel")})
    with bridge(tmp_path, path=path) as b:
        for argv, why in REFUSED:
            res = b.call(*argv)
            assert res.returncode == 126, (argv, res.stdout, res.stderr)
            assert res.stderr.startswith("host_bridge: refused: ") and why in res.stderr, (argv, res.stderr)
            assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.stderr
        assert not marker.exists(), "a refused command ran"
        records = b.audit()
        assert [r["argv"] for r in records] == [a for a, _ in REFUSED]
        assert all(r["decision"] == "refused" and r["uid"] == os.getuid() and r["reason"] for r in records)
        assert (b.dir / "audit.jsonl").stat().st_mode & 0o777 == 0o600
        assert (b.dir.stat().st_mode & 0o777, (b.dir / "sock").stat().st_mode & 0o777) == (0o700, 0o600)


def test_read_only_commands_run_with_their_arguments_and_exit_status(tmp_path, workspace):
    """Slurm queries pass through as argv (spaces, %, brackets and PromQL intact, no shell)."""
    path = stubs(
        tmp_path / "bin",
        {
            "squeue": 'for a in "$@"; do printf "<%s>" "$a"; done; echo; echo warn >&2; exit 3',
            "scontrol": 'echo "scontrol $*"',
        },
    )
    with bridge(tmp_path, path=path) as b:
        res = b.call("squeue", "--me", "-o", "%.10i %j", "-w", "n[1-4]")
        assert (res.returncode, res.stdout, res.stderr) == (3, "<--me><-o><%.10i %j><-w><n[1-4]>\n", "warn\n")
        res = b.call("scontrol", "-d", "show", "job", "4242")
        assert (res.returncode, res.stdout) == (0, "scontrol -d show job 4242\n")
        res = b.call("utils/prometheus.sh", "query", "4242", 'sum(rate(x{host=~"n1|n2"}[5m])) / 2')
        assert "refused" not in res.stderr, res.stderr  # the PromQL's | { " / are PromQL, not a shell's
        res = b.call("utils/triage.py", str(workspace / "4242-JAX-tiny"), "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["job_id"] == "4242", res.stderr
        res = b.call("submit.sh", "tiny", "--dry-run", "--", "steps=5")
        assert res.returncode == 0 and "dry run: nothing submitted" in res.stdout, res.stderr


def test_another_uid_cannot_use_the_owners_bridge(tmp_path, workspace):
    """As nobody: the 0700 directory stops the connection; with the directory and the socket opened
    up by hand, the bridge itself refuses the caller (SO_PEERCRED) and logs it."""
    if os.geteuid() != 0:
        pytest.skip("connecting as another uid needs root")
    as_nobody = (
        "import os, sys; from bridge import client; from pathlib import Path\n"
        f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
        "sys.exit(client.call(Path(sys.argv[1]), ['squeue', '--me'], 30))\n"
    )
    env = {"PYTHONPATH": f"{REPO / 'utils'}"}
    with bridge(tmp_path) as b:
        res = run([PY, "-c", as_nobody, str(b.dir)], env=env, timeout=60)
        assert res.returncode == 125 and "Permission denied" in res.stderr, res.stderr
        assert b.audit() == []  # it never reached the bridge
        for d in (b.dir.parent, b.dir):
            d.chmod(0o755)
        (b.dir / "sock").chmod(0o777)
        res = run([PY, "-c", as_nobody, str(b.dir)], env=env, timeout=60)
        assert res.returncode == 126, res.stderr
        assert f"refused: uid {NOBODY} is not the bridge's owner (uid {os.getuid()})" in res.stderr
        (record,) = b.audit()
        assert record["uid"] == NOBODY and record["decision"] == "refused" and record["argv"] == ["squeue", "--me"]
        assert f"refused a caller with uid {NOBODY}" in b.log.read_text()


# --- the owner's config --------------------------------------------------------------------------
def test_a_config_others_may_read_is_refused(tmp_path):
    cfg = tmp_path / "bridge.toml"
    cfg.write_text("allow_scancel = true\n")
    cfg.chmod(0o644)
    short = Path(tempfile.mkdtemp(prefix="mst-br-", dir="/tmp"))
    try:
        res = run([PY, str(TOOL), "serve", "--dir", str(short / "b"), "--config", str(cfg)], timeout=60)
        assert res.returncode == 2, res.stderr
        assert res.stderr == (
            f"host_bridge.py: config {cfg} may be read or written by group or others (mode 0644); chmod 600 it\n"
        )
        assert not (short / "b" / "sock").exists()
        cfg.write_text("allow_everything = true\n")
        cfg.chmod(0o600)
        res = run([PY, str(TOOL), "serve", "--dir", str(short / "c"), "--config", str(cfg)], timeout=60)
        assert res.returncode == 2 and "unknown key 'allow_everything'" in res.stderr, res.stderr
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_scancel_when_enabled_cancels_only_the_owners_jobs(tmp_path):
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    path = stubs(
        tmp_path / "bin",
        {"squeue": f'printf "7 {me}\\n8 alice\\n"', "scancel": 'echo "scancel $*"'},
    )
    with bridge(tmp_path, config="allow_scancel = true\n", path=path) as b:
        res = b.call("scancel", "7")
        assert (res.returncode, res.stdout) == (0, f"scancel --user={me} 7\n"), res.stderr
        res = b.call("scancel", "8")
        assert res.returncode == 126 and f"job 8 is not a job of {me} in the queue" in res.stderr
        res = b.call("scancel", "9")
        assert res.returncode == 126 and "job 9 is not a job of" in res.stderr
        res = b.call("scancel", "--state=PENDING")
        assert res.returncode == 126 and "scancel takes job ids only" in res.stderr
        # submission stays off unless allow_submit says otherwise
        res = b.call("submit.sh", "tiny")
        assert res.returncode == 126 and "submit.sh without --dry-run is disabled" in res.stderr


def test_time_limit_and_output_cap(tmp_path):
    path = stubs(
        tmp_path / "bin",
        {"squeue": "sleep 60 & wait", "sinfo": "head -c 100000 /dev/zero | tr '\\0' x; echo; exit 0"},
    )
    with bridge(tmp_path, config="timeout_s = 2\nmax_output_bytes = 1000\n", path=path) as b:
        t = time.monotonic()
        res = b.call("squeue")
        assert res.returncode == 124 and "killed after 2 s" in res.stderr, res.stderr
        assert time.monotonic() - t < 15
        res = b.call("sinfo")
        assert res.returncode == 0 and res.stdout == "x" * 1000, len(res.stdout)
        assert "output cut at 1000 bytes per stream (had 100001)" in res.stderr
        squeue, sinfo = b.audit()
        assert squeue["timed_out"] and squeue["exit"] == 124 and sinfo["truncated"]


def test_changed_repository_code_is_refused_until_restart(scratch_repo, tmp_path):
    """An agent that can write the repository must not get its edited tool run on the host."""
    short = Path(tempfile.mkdtemp(prefix="mst-br-", dir="/tmp"))
    tool = scratch_repo / "utils" / "host_bridge.py"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    proc = subprocess.Popen(
        [PY, str(tool), "serve", "--dir", str(short / "b")],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == str(short / "b")
        call = [PY, str(tool), "call", "--dir", str(short / "b"), "utils/perf.py", "--help"]
        assert run(call, env=env).returncode == 0
        with (scratch_repo / "utils" / "diagnosis" / "perf.py").open("a") as f:
            f.write("\n# changed\n")
        res = run(call, env=env)
        assert res.returncode == 126, res.stderr
        assert "the repository's code changed since the bridge started (utils/diagnosis/perf.py)" in res.stderr
    finally:
        run([PY, str(tool), "stop", "--dir", str(short / "b")], env=env)
        proc.wait(timeout=30)
        shutil.rmtree(short, ignore_errors=True)


# --- the command line ----------------------------------------------------------------------------
@pytest.mark.parametrize("sub", [[], ["serve"], ["call"], ["stop"]])
def test_help(sub):
    res = run([PY, str(TOOL), *sub, "--help"], timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("Usage: host_bridge.py"), res.stdout + res.stderr


def test_bad_input_is_one_line(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "none"), "MST_HOST_BRIDGE": ""}
    cases = [
        (["call"], 2, "call needs a command"),
        (["call", "squeue"], 2, "which bridge? set MST_HOST_BRIDGE=DIR"),
        (["call", "--dir", str(tmp_path / "nope"), "squeue"], 125, "cannot reach the bridge at"),
        (["stop", "--dir", str(tmp_path)], 2, "no bridge runs in"),
        (["serve", "--dir", "/proc/1/nope"], 2, "cannot make /proc/1/nope"),
        (["serve", "--dir", str(tmp_path)], 2, "is not a directory of yours with mode 0700"),
        (["frobnicate"], 2, "invalid choice"),
    ]
    tmp_path.chmod(0o755)
    for args, code, text in cases:
        res = run([PY, str(TOOL), *args], env=env, timeout=60)
        assert res.returncode == code and text in res.stderr, (args, res.returncode, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr


def test_serve_writes_its_directory_for_call_and_stop(tmp_path, workspace):
    """Without --dir: a new 0700 directory; its path in the 0600 address file, which call and stop
    read when neither --dir nor MST_HOST_BRIDGE says otherwise; --detach returns at once."""
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "JOB_WORKSPACE": str(workspace), "MST_HOST_BRIDGE": ""}
    res = run([PY, str(TOOL), "serve", "--detach"], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    where = Path(res.stdout.strip())
    try:
        address = tmp_path / "cfg" / "maxtext-slurm" / "host-bridge"
        assert address.read_text() == f"{where}\n" and address.stat().st_mode & 0o777 == 0o600
        assert where.stat().st_mode & 0o777 == 0o700
        res = run([PY, str(TOOL), "call", "utils/perf.py", "4242", "--json"], env=env, timeout=120)
        assert res.returncode == 0 and json.loads(res.stdout)["job_id"] == "4242", res.stderr
        res = run([PY, str(TOOL), "stop"], env=env, timeout=60)
        assert res.returncode == 0 and "stopped" in res.stdout, res.stderr
        assert not (where / "sock").exists() and (where / "audit.jsonl").exists()
    finally:
        run([PY, str(TOOL), "stop", "--dir", str(where)], timeout=60)
        shutil.rmtree(where, ignore_errors=True)


def test_round_trip_latency(tmp_path):
    """A call's cost over the command's: the client (a fresh Python) and the socket round trip."""
    path = stubs(tmp_path / "bin", {"sinfo": "echo ok"})
    with bridge(tmp_path, path=path) as b:
        times = []
        for _ in range(10):
            t = time.monotonic()
            assert b.call("sinfo").stdout == "ok\n"
            times.append(time.monotonic() - t)
    times.sort()
    print(f"host_bridge call round trip: median {times[5] * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms")
    assert times[5] < 2.0


# --- the policy alone ----------------------------------------------------------------------------
def test_policy_paths_promql_and_what_the_config_enables(tmp_path):
    """policy.plan without a server: links out of a workspace are followed (and refused), PromQL
    keeps its own characters and is not a path, and the config's switches do what they say."""
    from bridge.policy import Policy, Refused, plan

    ws = tmp_path / "ws"
    (ws / "job").mkdir(parents=True)
    (ws / "escape").symlink_to("/etc")
    policy = Policy("me", [REPO, ws])

    def refused(argv: list[str], p: Policy = policy) -> str:
        with pytest.raises(Refused) as e:
            plan(argv, p)
        return str(e.value)

    assert plan(["utils/triage.py", str(ws / "job")], policy).argv == [
        str(REPO / "utils" / "triage.py"),
        str(ws / "job"),
    ]
    assert "is outside" in refused(["utils/triage.py", str(ws / "escape" / "passwd")])
    assert "is outside" in refused(["utils/perf.py", "4242", f"--workspace={ws}/escape"])
    assert "is outside" in refused(["./submit.sh", "tiny", "--dry-run", "--", "base_output_directory=/var/tmp/x"])
    assert plan(["submit.sh", "tiny", "--dry-run", "--", "dataset_path=gs://bucket/c4"], policy).kind == "submit"
    q = plan(["prometheus.sh", "query", "4242", "--time", "1700000000", 'rate(a{h=~"n1|n2"}[1m]) > 0'], policy)
    assert q.argv[0] == str(REPO / "utils" / "prometheus.sh") and q.timeout_s == 900
    assert "shell metacharacter ';'" in refused(["prometheus.sh", "query", "4242", "up; id"])
    assert "shell metacharacter '|'" in refused(["prometheus.sh", "query", "4242", "up", "--time", "a|b"])
    assert plan(["scontrol", "--help"], policy).argv == ["scontrol", "--help"]
    assert plan(["scontrol", "show", "node", "n[1-4]", "-o"], policy).timeout_s == 60
    if not (REPO / "utils" / "investigate.py").exists():  # allowed once it exists
        assert "not on the allowlist" in refused(["utils/investigate.py"])
    assert "argv must be a non-empty list" in refused("squeue")  # type: ignore[arg-type]
    assert "at most 256 arguments" in refused(["squeue", *["-v"] * 300])
    enabled = Policy("me", [REPO, ws], allow_submit=True, allow_scancel=True, timeout_s=5)
    assert plan(["submit.sh", "tiny", "-N", "2"], enabled).timeout_s == 5
    assert plan(["scancel", "12", "13_4"], enabled).argv == ["scancel", "--user=me", "12", "13_4"]
    assert "job ids only" in refused(["scancel", "--signal=KILL", "12"], enabled)
