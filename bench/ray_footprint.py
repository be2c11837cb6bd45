#!/usr/bin/env python3
"""Usage: bench/ray_footprint.py [--repo PATH] [--nodes K] [--window S] [--settle S] [--json] [-- KEY=VALUE ...]

Footprint of a real RAY=1 job, per process and per node. Starts the local Slurm cluster (this
checkout's utils/local_cluster.sh; stopped after if it was not up), submits a RAY=1 tiny job with
PATH/submit.sh (default this checkout, so one script measures a branch before and after), waits
until every node trains (OBSERVE block printed, step 20 done on each node), lets it settle, then
samples every process of the job for --window seconds: CPU time (utime+stime from
/proc/PID/stat, plus the reaped children's time, which is where the exporter's short-lived
plugins land) and RSS/PSS (VmRSS, smaps_rollup). Then it cancels the job.
The job's processes are those whose environment names its job dir (JOB_DIR) or whose working
directory is the bench's private workspace (the job is submitted from there), and all their
descendants (Ray rewrites some workers' environment when it sets their titles). Each is put in
a component by its command line and on a node by MST_RAY_OWNER=<job>:<host>, JOB_HOSTNAME or
SLURMD_NODENAME (else its parent's node).
Prints, per component and node: processes, steady CPU in cores (CPU-s per s), mean RSS and PSS
in MiB; then the totals of Ray itself and of everything RAY=1 adds (all but trainer and launcher).
On a small shared machine the figures are noisy: repeat a run before trusting a difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
HZ = os.sysconf("SC_CLK_TCK")
RUNNING = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")

# (component, pattern on "comm\0cmdline"), first match wins; order is also the table's order
COMPONENTS: list[tuple[str, re.Pattern[str]]] = [
    ("trainer", re.compile(r"maxtext\.trainers|MaxText[./]train")),
    ("GCS", re.compile(r"gcs_server")),
    ("raylet", re.compile(r"/raylet/raylet|^raylet\0")),
    (
        "dashboard",
        re.compile(r"ray/dashboard/dashboard\.py|ray-dashboard-|multiprocessing\.(forkserver|resource_tracker)"),
    ),
    ("dashboard agent", re.compile(r"ray::DashboardAgent|ray/dashboard/agent\.py|ray\.dashboard\.agent")),
    ("runtime-env agent", re.compile(r"ray::RuntimeEnvAgent|runtime_env/agent/main\.py")),
    ("log monitor", re.compile(r"ray/_private/log_monitor\.py")),
    ("monitor", re.compile(r"autoscaler/_private/monitor\.py")),
    ("Ray client server", re.compile(r"ray\.util\.client\.server")),
    ("Ray driver (_ray_actor.py)", re.compile(r"_ray_actor\.py")),
    ("Ray idle workers", re.compile(r"ray::IDLE")),
    ("Ray workers (actors)", re.compile(r"ray::|default_worker\.py")),
    ("Prometheus", re.compile(r"(^|/)prometheus\0|job_services\.sh")),
    ("TensorBoard", re.compile(r"tensorboard\.main|tensorboard_data_server|(^|/)tensorboard\0")),
    ("exporter (+plugins)", re.compile(r"metrics_exporter\.py|_metrics_plugin\.sh")),
]
LAUNCHER = "launcher (bash, srun, ...)"
ORDER = [c for c, _ in COMPONENTS[1:]] + ["trainer", LAUNCHER]
RAY_ITSELF = {c for c, _ in COMPONENTS[1:12]}
NOT_ADDED = {"trainer", LAUNCHER}


@dataclasses.dataclass
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot: tells a reused pid apart
    comm: str
    cmd: str
    env: dict[str, str]
    cwd: str
    ticks: int  # utime + stime
    cticks: int  # cutime + cstime (children reaped so far)


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw_env = Path(f"/proc/{pid}/environ").read_bytes()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    f = stat[stat.rindex(")") + 2 :].split()
    env = {}
    for item in raw_env.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep and key.isidentifier():
            env[key] = value
    return Proc(pid, int(f[1]), int(f[19]), comm, cmd, env, cwd, int(f[11]) + int(f[12]), int(f[13]) + int(f[14]))


def snapshot() -> dict[int, Proc]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (p := read_proc(int(name))):
            out[p.pid] = p
    return out


def job_procs(procs: dict[int, Proc], job_dir: str, ws: str) -> dict[int, Proc]:
    """The job's processes: marked ones (JOB_DIR, or started in the workspace) and their descendants."""
    mine = {
        pid
        for pid, p in procs.items()
        if pid != os.getpid() and (p.env.get("JOB_DIR") == job_dir or p.cwd == ws or p.cwd.startswith(ws + "/"))
    }
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    todo = list(mine)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in mine and c != os.getpid():
                mine.add(c)
                todo.append(c)
    return {pid: procs[pid] for pid in mine}


def component(p: Proc) -> str:
    text = f"{p.comm}\0{p.cmd}\0"
    for name, pat in COMPONENTS:
        if pat.search(text):
            return name
    return LAUNCHER


def node_of(pid: int, procs: dict[int, Proc], cache: dict[int, str]) -> str:
    if pid in cache:
        return cache[pid]
    p = procs.get(pid)
    if p is None:
        return "?"
    owner = p.env.get("MST_RAY_OWNER", "")
    node = owner.partition(":")[2] or p.env.get("JOB_HOSTNAME") or p.env.get("SLURMD_NODENAME") or ""
    if not node:
        node = node_of(p.ppid, procs, cache) if p.ppid > 1 else "?"
    cache[pid] = node
    return node


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB; (0, 0) if the process is gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def sh(args: list[str], env: dict[str, str], cwd: Path | None = None, check: bool = True) -> str:
    res = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **env}, cwd=cwd, check=False)
    if check and res.returncode:
        raise RuntimeError(
            f"{' '.join(args[:2])} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}"
        )
    return res.stdout


def job_state(job_id: str, env: dict[str, str]) -> str:
    m = re.search(r"JobState=(\S+)", sh(["scontrol", "show", "job", "-o", job_id], env, check=False))
    return m.group(1) if m else "GONE"


def wait_steady(log: Path, job_id: str, nodes: int, env: dict[str, str], timeout: float) -> None:
    """Until the OBSERVE block is out and every node has done step 20 (or raise)."""
    end = time.monotonic() + timeout
    step_re = re.compile(r"^(\S+): .*completed step: (\d+),", re.M)
    while time.monotonic() < end:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "falling back to the plain launch" in text:
            raise RuntimeError(f"the RAY=1 job fell back to the plain launch (see {log}): no Ray footprint to measure")
        done = {h for h, s in step_re.findall(text) if int(s) >= 20}
        if "OBSERVE" in text and len(done) >= nodes:
            return
        state = job_state(job_id, env)
        if state not in RUNNING:
            raise RuntimeError(f"job {job_id} ended ({state}) before it trained (see {log})")
        time.sleep(1)
    raise RuntimeError(f"job {job_id} did not reach step 20 on {nodes} node(s) in {timeout:.0f} s (see {log})")


def sample(job_dir: str, ws: str, window: float, mem_every: float) -> tuple[dict[int, Proc], dict, float]:
    """Sample the job's processes for `window` s; returns (processes seen, per-pid figures, seconds)."""
    procs0 = job_procs(snapshot(), job_dir, ws)
    t0 = time.monotonic()
    seen: dict[int, Proc] = dict(procs0)
    last: dict[int, Proc] = dict(procs0)
    mem: dict[int, list[tuple[int, int]]] = {}
    next_mem = t0
    while True:
        now = time.monotonic()
        if now >= next_mem:
            for pid in last:
                if (m := memory_kib(pid)) != (0, 0):
                    mem.setdefault(pid, []).append(m)
            next_mem += mem_every
        if now - t0 >= window:
            break
        time.sleep(min(1.0, t0 + window - now))
        cur = job_procs(snapshot(), job_dir, ws)
        for pid, p in cur.items():
            if pid in seen and seen[pid].start != p.start:
                continue  # pid reused by an unrelated process: ignore
            seen.setdefault(pid, p)
            last[pid] = p
        last = {pid: p for pid, p in last.items() if pid in cur}
    elapsed = time.monotonic() - t0
    figures = {}
    for pid in seen:
        if pid not in last:
            continue  # ended within the window: its time is in its parent's reaped-children time
        first = procs0.get(pid)
        self_ticks = last[pid].ticks - (first.ticks if first else 0)
        child_ticks = last[pid].cticks - (first.cticks if first else 0)
        samples = mem.get(pid) or [memory_kib(pid)]
        figures[pid] = {
            "cpu_s": (self_ticks + child_ticks) / HZ,
            "rss_kib": sum(r for r, _ in samples) / len(samples),
            "pss_kib": sum(s for _, s in samples) / len(samples),
        }
    return {pid: seen[pid] for pid in figures}, figures, elapsed


def table(procs: dict[int, Proc], figures: dict, elapsed: float) -> dict:
    cache: dict[int, str] = {}
    rows: dict[tuple[str, str], dict] = {}
    for pid, p in procs.items():
        key = (component(p), node_of(pid, procs, cache))
        r = rows.setdefault(key, {"procs": 0, "cores": 0.0, "rss_mib": 0.0, "pss_mib": 0.0, "pids": []})
        r["procs"] += 1
        r["cores"] += figures[pid]["cpu_s"] / elapsed
        r["rss_mib"] += figures[pid]["rss_kib"] / 1024
        r["pss_mib"] += figures[pid]["pss_kib"] / 1024
        r["pids"].append(pid)
    return rows


def print_table(rows: dict, nodes: list[str], header: str) -> None:
    print(header)
    cols = "".join(f" | {n:>5} {'cores':>6} {'RSS':>6} {'PSS':>6}" for n in nodes)
    print(f"{'component':<27}{cols}")
    print(f"{'':<27}" + "".join(f" | {'procs':>5} {'':>6} {'MiB':>6} {'MiB':>6}" for _ in nodes))

    def line(name: str, get: dict) -> str:
        out = f"{name:<27}"
        for n in nodes:
            r = get.get(n)
            out += (
                f" | {r['procs']:>5} {r['cores']:>6.3f} {r['rss_mib']:>6.0f} {r['pss_mib']:>6.0f}"
                if r
                else f" | {'-':>5} {'-':>6} {'-':>6} {'-':>6}"
            )
        return out

    for comp in ORDER:
        print(line(comp, {n: rows[(comp, n)] for n in nodes if (comp, n) in rows}))
    for label, comps in (("= Ray itself", RAY_ITSELF), ("= all RAY=1 adds", set(ORDER) - NOT_ADDED)):
        tot = {}
        for n in nodes:
            rs = [rows[(c, n)] for c in comps if (c, n) in rows]
            if rs:
                tot[n] = {k: sum(r[k] for r in rs) for k in ("procs", "cores", "rss_mib", "pss_mib")}
        print(line(label, tot))


def cluster_env(tool: str, env: dict[str, str]) -> dict[str, str]:
    out = dict(env)
    for line in sh([tool, "env"], env).splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            out[key] = value.strip("'\"")
    return out


def stop_job(job_id: str, job_dir: str, ws: str, env: dict[str, str]) -> list[str]:
    """Cancel the job, wait for it and its processes to end; returns what was left and had to be killed."""
    sh(["scancel", job_id], env, check=False)
    end = time.monotonic() + 90
    while time.monotonic() < end and (job_state(job_id, env) in RUNNING or job_procs(snapshot(), job_dir, ws)):
        time.sleep(1)
    left = job_procs(snapshot(), job_dir, ws)
    for sig in ("TERM", "KILL"):
        for pid, p in job_procs(snapshot(), job_dir, ws).items():
            if pid in left and left[pid].start == p.start:  # the same process, not a reused pid
                subprocess.run(["kill", f"-{sig}", str(pid)], capture_output=True, check=False)
        time.sleep(2 if left else 0)
    return [f"{pid} {p.cmd[:80]}" for pid, p in sorted(left.items())]


def main() -> int:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--repo", type=Path, default=HERE, help="checkout whose submit.sh launches the job (default this one)"
    )
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the job (default 2)")
    ap.add_argument("--window", type=float, default=45, help="seconds sampled in steady state (default 45)")
    ap.add_argument("--settle", type=float, default=15, help="seconds waited after every node trains (default 15)")
    ap.add_argument(
        "--start-timeout", type=float, default=600, help="seconds allowed to reach steady state (default 600)"
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON (per component, node and pid)")
    ap.add_argument("--keep", action="store_true", help="keep the job's workspace (its log and job dir) and say where")
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    repo = a.repo.resolve()
    if not (repo / "submit.sh").is_file() or not (repo / "_train_with_ray.sh").is_file():
        ap.error(f"--repo: {repo} is not a checkout of this project (no submit.sh / _train_with_ray.sh)")
    if not 1 <= a.nodes <= 16 or a.window < 5 or a.settle < 0:
        ap.error(f"--nodes must be 1..16, --window >= 5, --settle >= 0; got {a.nodes}, {a.window}, {a.settle}")
    bad = [o for o in overrides if "=" not in o or o.startswith("steps=")]
    if bad:
        ap.error(
            f"after --: MaxText KEY=VALUE overrides only, steps excluded (the job runs until sampled); got {bad[0]!r}"
        )
    venv = Path(os.environ.get("MAXTEXT_SLURM_VENV", HERE / ".venv"))
    if not os.access(venv / "bin" / "python", os.X_OK):
        ap.error(f"no Python at {venv}/bin/python: set MAXTEXT_SLURM_VENV to the project's environment")

    commit = sh(["git", "-C", str(repo), "log", "-1", "--format=%h"], {}, check=False).strip() or "?"
    dirty = (
        " + uncommitted changes"
        if sh(["git", "-C", str(repo), "status", "--porcelain", "-uno"], {}, check=False).strip()
        else ""
    )
    tool = str(HERE / "utils" / "local_cluster.sh")
    base_env = {"MAXTEXT_SLURM_VENV": str(venv)}
    started = subprocess.run([tool, "status"], capture_output=True, check=False).returncode != 0
    sh([tool, "up", str(max(2, a.nodes))], base_env)
    env = cluster_env(tool, base_env)
    ws = Path(tempfile.mkdtemp(prefix="ray_footprint."))
    job_id = ""
    job_dir = ""
    leftovers: list[str] = []
    try:
        out = sh(
            [str(repo / "submit.sh"), "tiny", "-N", str(a.nodes), "--", "steps=100000000", *overrides],
            {**env, "RAY": "1", "JOB_WORKSPACE": str(ws)},
            cwd=ws,
        )
        m = re.search(r"Submitted job (\d+) \((\S+)\)", out)
        if not m:
            raise RuntimeError(f"submit.sh printed no job id: {out.strip()!r}")
        job_id, name = m.groups()
        log, job_dir = ws / f"{job_id}-{name}.log", str(ws / f"{job_id}-{name}")
        print(f"job {job_id} from {repo} ({commit}{dirty}); waiting for steady state", file=sys.stderr)
        wait_steady(log, job_id, a.nodes, env, a.start_timeout)
        time.sleep(a.settle)
        print(f"sampling {a.window:.0f} s", file=sys.stderr)
        procs, figures, elapsed = sample(job_dir, str(ws), a.window, max(5.0, a.window / 4))
        if job_state(job_id, env) not in RUNNING:
            raise RuntimeError(f"job {job_id} ended while it was sampled (see {log})")
    finally:
        if job_id:
            leftovers = stop_job(job_id, job_dir, str(ws), env)
        if a.keep:
            print(f"kept: {ws}", file=sys.stderr)
        else:
            subprocess.run(["chmod", "-R", "u+w", str(ws)], check=False)
            shutil.rmtree(ws, ignore_errors=True)
        if started:
            sh([tool, "down"], env, check=False)
    rows = table(procs, figures, elapsed)
    nodes = sorted({n for _, n in rows})
    if a.json:
        print(
            json.dumps(
                {
                    "repo": str(repo),
                    "commit": commit + dirty,
                    "window_s": round(elapsed, 1),
                    "rows": [{"component": c, "node": n, **r} for (c, n), r in sorted(rows.items())],
                    "left_after_cancel": leftovers,
                },
                indent=1,
            )
        )
    else:
        print_table(
            rows,
            nodes,
            f"RAY=1 footprint: {a.nodes}-node tiny job, {repo} at {commit}{dirty}; "
            f"{elapsed:.0f} s window in steady state; cores = CPU-s per s; RSS/PSS = mean MiB",
        )
        if leftovers:
            print(
                f"left {len(leftovers)} process(es) behind after scancel (stopped by this bench): "
                + "; ".join(leftovers)
            )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print(f"ray_footprint.py: {e}", file=sys.stderr)
        sys.exit(1)
