"""A shared JOB_WORKSPACE (issue 19, attacks 2 and 6), end to end on the local Slurm cluster with two
real users (tests/helpers/users.py): the victim submits her real jobs, the attacker, a user of the
same cluster (1777 scratch) or of the same group (2775 project directory, umask 002), does what the
issue describes, and the attack fails: the victim's job runs unaffected or stops with one clear line,
and the canary the attacker's payload would write never appears.

- attack 2: the attacker owns `.snapshots/`, the victim's root or `runs/`, or swaps the victim's
  root (her snapshot and runs) while her job is held: the job runs only code with the hash recorded
  at submit, from a private copy on each node, and only in directories of hers;
- attack 6: a link (or a file of the attacker's) at the job's log path: the job writes nothing into
  it and says why in its Comment and <job dir>/refused.txt.
The run directories of before the per-user roots move to the new place once (fast tests, no cluster).
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

from helpers.jobs import SUBMITTED, job_state, summary, wait_job_end
from helpers.users import ATTACKER, VICTIM, User, as_user, ensure_users, reachable_base, shared_workspace

LIB = REPO / "utils/launch"
UMASK = {"sticky": 0o022, "group": 0o002}


@pytest.fixture
def base():
    d = reachable_base()
    canary_dir = d / "canary"
    canary_dir.mkdir()
    canary_dir.chmod(0o1777)  # where the attacker's payload, run as the victim, would leave its mark
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def users() -> tuple[User, User]:
    return ensure_users()


def env_of(cluster: dict[str, str], ws: Path) -> dict[str, str]:
    return {**cluster, "MAXTEXT_SLURM_VENV": str(VENV), "JOB_WORKSPACE": str(ws)}


def submit_as(user: User, cluster: dict[str, str], ws: Path, kind: str, *args: str) -> subprocess.CompletedProcess:
    res = as_user(user, [str(REPO / "submit.sh"), "tiny", *args], env=env_of(cluster, ws), umask=UMASK[kind])
    m = re.search(r"Submitted job (\d+) ", res.stdout)
    if m:
        SUBMITTED.append(m.group(1))
    return res


def job_id_of(res: subprocess.CompletedProcess) -> str:
    m = re.search(r"Submitted job (\d+) ", res.stdout)
    assert res.returncode == 0 and m, res.stdout + res.stderr
    return m.group(1)


def release(victim: User, cluster: dict[str, str], jid: str) -> None:
    res = as_user(victim, ["scontrol", "release", jid], env=cluster)
    assert res.returncode == 0, res.stderr


def attacker_sh(attacker: User, script: str, umask: int = 0o002) -> None:
    res = as_user(attacker, ["bash", "-ec", script], umask=umask)
    assert res.returncode == 0, res.stderr


def one_line_refusal(res: subprocess.CompletedProcess, *parts: str) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1, res.stdout + res.stderr
    for p in parts:
        assert p in lines[0], lines[0]
    return lines[0]


def files_under(d: Path) -> dict[str, tuple[int, int]]:
    """Every path under d with its size and modification time (what a write or a new file changes)."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns)
    return out


# --- attack 2 (a): someone else made the paths first (1777 scratch) -----------------------------
@pytest.mark.cluster
@pytest.mark.parametrize("planted", ["dir", "link"])
def test_someone_elses_root_is_refused_in_one_line(planted, base, users, cluster, venv):
    """The attacker made $WS/<victim> first (a directory of his, open to all, or a link to one)."""
    victim, attacker = users
    ws = shared_workspace(base, "sticky")
    mine = base / "canary" / "attackers"
    if planted == "link":
        attacker_sh(
            attacker, f"mkdir -p {mine}/.snapshots {mine}/runs; chmod -R 777 {mine}; ln -s {mine} {ws}/{VICTIM}"
        )
    else:
        attacker_sh(attacker, f"mkdir -p {ws}/{VICTIM}/.snapshots {ws}/{VICTIM}/runs; chmod -R 777 {ws}/{VICTIM}")
    before = {p.name: files_under(p) if p.is_dir() else None for p in [*ws.iterdir(), mine]}
    res = submit_as(victim, cluster, ws, "sticky", "--", "steps=3")
    line = one_line_refusal(res, f"refusing the directory {ws}/{VICTIM}: it ", f"owned by {ATTACKER}")
    assert line.startswith("submit.sh: "), line
    assert "Submitted job" not in res.stdout  # nothing submitted, nothing written
    assert {p.name: files_under(p) if p.is_dir() else None for p in [*ws.iterdir(), mine]} == before


@pytest.mark.cluster
def test_a_planted_global_snapshots_and_runs_are_never_used(base, users, cluster, venv):
    """The attacker owns $WS/.snapshots and $WS/runs/exp1 (the paths of before): the victim's run
    works in her own root; nothing of hers lands in the attacker's directories."""
    victim, attacker = users
    ws = shared_workspace(base, "sticky")
    attacker_sh(
        attacker, f"mkdir -p {ws}/.snapshots {ws}/runs/exp1/checkpoints/7; chmod -R 777 {ws}/.snapshots {ws}/runs"
    )
    theirs = {d: files_under(ws / d) for d in (".snapshots", "runs")}
    jid = job_id_of(submit_as(victim, cluster, ws, "sticky", "--run", "exp1", "--", "steps=3"))
    assert wait_job_end(cluster, jid, 300) == "COMPLETED"
    log = ws / f"{jid}-JAX-tiny.log"
    assert summary(log)["status"] == "completed"
    text = log.read_text()
    assert f"code: {ws}/{VICTIM}/.snapshots/" in text
    assert f"run: exp1 {ws}/{VICTIM}/runs/exp1 (no checkpoint: starts from step 0)" in text
    assert {d: files_under(ws / d) for d in (".snapshots", "runs")} == theirs
    assert (ws / VICTIM).stat().st_uid == victim.uid and (ws / VICTIM).stat().st_mode & 0o7777 == 0o755


# --- attack 2 (b), (c): a group member swaps the victim's root while her job is held (2775) -----
def swap_root(attacker: User, ws: Path, canary: Path, link_to: Path | None = None) -> None:
    """The attacker renames the victim's root (the workspace is group-writable) and plants a copy of
    it whose utils/launch/lib.sh writes the canary, as a directory of his or as a link to one."""
    target = link_to or ws / VICTIM
    attacker_sh(
        attacker,
        f"""
        mv {ws}/{VICTIM} {ws}/{VICTIM}.gone
        mkdir -p {target}
        cp -r {ws}/{VICTIM}.gone/. {target}/
        chmod -R u+w {target}
        for lib in {target}/.snapshots/*/utils/launch/lib.sh; do
          printf 'touch {canary}\\n' | cat - "$lib" > "$lib.new" && mv "$lib.new" "$lib"
        done
        {f"ln -s {target} {ws}/{VICTIM}" if link_to else ":"}
        """,
    )


@pytest.mark.cluster
@pytest.mark.parametrize("how", ["dir", "link"])
def test_a_swapped_snapshot_never_runs(how, base, users, cluster, venv):
    victim, attacker = users
    ws = shared_workspace(base, "group")
    canary = base / "canary" / "ran"
    jid = job_id_of(submit_as(victim, cluster, ws, "group", "--hold", "--", "steps=3"))
    swap_root(attacker, ws, canary, link_to=base / "canary" / "planted" if how == "link" else None)
    release(victim, cluster, jid)
    assert wait_job_end(cluster, jid, 240) == "FAILED"
    log = ws / f"{jid}-JAX-tiny.log"
    s = summary(log)
    assert s["status"] == "failed" and s["stage"] == "none", s
    assert re.match(
        rf"_job\.sbatch: error: the job's code snapshot {ws}/{VICTIM}/\.snapshots/\S+ is not the code submitted "
        r"\(its sha256 is [0-9a-f]{64}, submitted [0-9a-f]{64}\): someone changed or replaced it; not running it$",
        s["first_error"],
    ), s["first_error"]
    assert "==================== JOB ====================" not in log.read_text()  # not one stage ran
    assert not canary.exists()
    comment = run(["scontrol", "show", "job", jid], env=cluster).stdout
    assert "Comment=_job.sbatch: error: the job's code snapshot" in comment
    # the job's private copy of the code is gone (labelled "slurm ID HOST WORKSPACE")
    assert not [
        d for d in Path("/tmp").glob("mst.*") if (d / "job").is_file() and (d / "job").read_text().endswith(f" {ws}\n")
    ]


@pytest.mark.cluster
def test_a_run_redirected_to_the_attackers_directory_is_never_read_or_written(base, users, cluster, venv):
    """The attacker's directory holds what looks like the run's checkpoint (step 40) and an exact copy
    of the victim's snapshot (the code check alone would pass): the job stops before it reads or
    writes a checkpoint, because the victim's root is now his link."""
    victim, attacker = users
    ws = shared_workspace(base, "group")
    jid = job_id_of(submit_as(victim, cluster, ws, "group", "--hold", "--run", "exp1", "--", "steps=3"))
    theirs = base / "canary" / "theirs"
    attacker_sh(
        attacker,
        f"""
        mv {ws}/{VICTIM} {ws}/{VICTIM}.gone
        mkdir -p {theirs}
        cp -r {ws}/{VICTIM}.gone/. {theirs}/
        mkdir -p {theirs}/runs/exp1/checkpoints/40/items
        echo planted > {theirs}/runs/exp1/checkpoints/40/items/data
        ln -s {theirs} {ws}/{VICTIM}
        """,
    )
    before = files_under(theirs)
    release(victim, cluster, jid)
    assert wait_job_end(cluster, jid, 240) == "FAILED"
    s = summary(ws / f"{jid}-JAX-tiny.log")
    assert s["stage"] == "none" and s["first_error"].startswith(
        f"_job.sbatch: error: refusing the job's code snapshot {ws}/{VICTIM}: it is a symbolic link (to {theirs}), "
        f"owned by {ATTACKER}"
    ), s
    assert files_under(theirs) == before
    assert not list(ws.glob(f"{jid}-JAX-tiny/{jid}-JAX-tiny/checkpoints"))


# --- attack 6: a link at the job's log path ------------------------------------------------------
def next_job_id(user: User, cluster: dict[str, str]) -> int:
    """What the attacker does to predict the victim's next job id."""
    res = as_user(user, ["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"], env=cluster)
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    as_user(user, ["scancel", str(jid)], env=cluster)
    return jid + 1


def victims_canary(victim: User) -> Path:
    canary = victim.home / "canary.bashrc"
    res = as_user(victim, ["bash", "-c", f"cp ~/.bashrc {canary} 2>/dev/null || echo 'alias ll=ls' > {canary}"])
    assert res.returncode == 0, res.stderr
    return canary


@pytest.mark.cluster
def test_a_link_planted_at_the_next_log_path_is_refused_at_submit(base, users, cluster, venv):
    victim, attacker = users
    ws = shared_workspace(base, "sticky")
    canary = victims_canary(victim)
    before = canary.read_bytes()
    jid = next_job_id(attacker, cluster)
    log = ws / f"{jid}-JAX-tiny.log"
    attacker_sh(attacker, f"ln -s {canary} {log}", umask=0o022)
    res = submit_as(victim, cluster, ws, "sticky", "--", "steps=3")
    one_line_refusal(
        res,
        f"refusing the log path {log}: it is a symbolic link (to {canary}), owned by {ATTACKER}",
        "ask them to remove it",
    )
    assert job_state(cluster, str(jid)) in {"CANCELLED", "UNKNOWN"}  # the held job never ran
    assert canary.read_bytes() == before


@pytest.mark.cluster
@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_log_swapped_while_the_job_is_held_gets_not_one_line(planted, base, users, cluster, venv):
    """2775: the attacker renames the victim's log (made by submit.sh) and plants a link to the
    victim's file, or a file of his own: Slurm opens it, the job writes nothing into it, and the
    victim reads why in one line (the job's Comment, <job dir>/refused.txt)."""
    victim, attacker = users
    ws = shared_workspace(base, "group")
    canary = victims_canary(victim)
    before = canary.read_bytes()
    jid = job_id_of(submit_as(victim, cluster, ws, "group", "--hold", "--", "steps=3"))
    log = ws / f"{jid}-JAX-tiny.log"
    plant = f"ln -s {canary} {log}" if planted == "link" else f": > {log}; chmod 666 {log}"
    attacker_sh(attacker, f"mv {log} {log}.gone; {plant}")
    release(victim, cluster, jid)
    assert wait_job_end(cluster, jid, 240) == "FAILED"
    assert canary.read_bytes() == before
    if planted == "file":
        assert log.stat().st_size == 0  # the attacker's file got none of the victim's output
    why = f"job {jid} wrote nothing and stopped: its log is not the file submit.sh made: "
    why += (
        f"{log} is a symbolic link (to {canary}), owned by {ATTACKER}, not the log submit.sh made"
        if planted == "link"
        else f"the job's output {log} is owned by {ATTACKER} (mode 666), not by you"
    )
    assert (ws / f"{jid}-JAX-tiny" / "refused.txt").read_text() == why + "\n"
    assert f"Comment={why}" in run(["scontrol", "show", "job", jid], env=cluster).stdout


# --- the run directories of before (no cluster) --------------------------------------------------
def prepare(ws: Path, alias: str = "exp1") -> subprocess.CompletedProcess:
    script = (
        f'source "{LIB}/lib.sh"; source "{LIB}/launch_lib.sh"; source "{LIB}/run_alias.sh"; PROG=submit.sh\n'
        f"export JOB_WORKSPACE={ws} MST_RUN={alias}; make_user_root; run_prepare\n"
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


USER = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()


def test_a_run_of_before_moves_to_the_users_root_once(tmp_path):
    ws = tmp_path / "ws"
    (ws / "runs" / "exp1" / "checkpoints" / "12").mkdir(parents=True)
    res = prepare(ws)
    new = ws / USER / "runs" / "exp1"
    assert res.returncode == 0 and res.stderr == (
        f"submit.sh: run 'exp1': moved its directory {ws}/runs/exp1 to {new} (runs live in your own root now)\n"
    )
    assert (new / "checkpoints" / "12").is_dir() and not (ws / "runs" / "exp1").exists()
    res = prepare(ws)  # once: the next submission says nothing
    assert res.returncode == 0 and res.stderr == ""


@pytest.mark.parametrize("case", ["group-writable", "locked", "both"])
def test_a_run_of_before_that_cannot_move_is_refused_with_the_mv_command(case, tmp_path):
    ws = tmp_path / "ws"
    old = ws / "runs" / "exp1"
    (old / "checkpoints" / "12").mkdir(parents=True)
    new = ws / USER / "runs" / "exp1"
    if case == "group-writable":
        (ws / "runs").chmod(0o2775)
        want = f"refusing the earlier run directory {ws}/runs: it is writable by others (mode 2775); "
        want += f"if its checkpoints are yours, check them and move them yourself: mv -T {old} {new}"
    elif case == "locked":
        (old / "lock").mkdir()
        want = f"its earlier directory {old} is held by a job ({old}/lock); when that job has ended: mv -T {old} {new}"
    else:
        new.mkdir(parents=True)
        want = f"run 'exp1' has two directories: {old} (from before the per-user layout) and {new}"
    line = one_line_refusal(prepare(ws), want)
    assert line.startswith("submit.sh: ")
    assert (old / "checkpoints" / "12").is_dir()  # nothing moved


def test_an_untrusted_run_directory_is_never_claimed(tmp_path):
    """run_claim (the job side) refuses a run directory that is a link, with one line."""
    ws = tmp_path / "ws"
    other = tmp_path / "elsewhere"
    (other / "checkpoints").mkdir(parents=True)
    (ws / USER / "runs").mkdir(parents=True)
    (ws / USER / "runs" / "exp1").symlink_to(other)
    (ws / "9-JAX-tiny").mkdir()
    script = (
        f'source "{LIB}/lib.sh"; source "{LIB}/run_alias.sh"; PROG=_job.sbatch\n'
        f"export JOB_WORKSPACE={ws} MST_RUN=exp1 JOB_ID=9 JOB_NAME=9-JAX-tiny JOB_DIR={ws}/9-JAX-tiny; run_claim\n"
    )
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    one_line_refusal(
        res, f"_job.sbatch: refusing the directory {ws}/{USER}/runs/exp1: it is a symbolic link (to {other})"
    )
    assert list(other.rglob("*")) == [other / "checkpoints"] and not (ws / "9-JAX-tiny" / "9-JAX-tiny").exists()


def test_the_job_refuses_code_without_its_hash(tmp_path):
    """_job.sbatch --code-copy: the copy is made in a private directory and checked; a snapshot
    changed after submit (or no hash) gives one line and leaves nothing behind."""
    snap = tmp_path / "snap"
    shutil.copytree(LIB, snap / "utils" / "launch")
    good = run(["bash", str(REPO / "_job.sbatch"), "--snapshot-hash", str(snap)]).stdout.strip()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    res = subprocess.run(
        ["bash", str(REPO / "_job.sbatch"), "--code-copy", str(snap), good, "local 1 h /ws"],
        capture_output=True,
        text=True,
        env=env,
    )
    copy = Path(res.stdout.strip())
    assert res.returncode == 0 and copy.name == "repo" and copy.parent.name.startswith("mst."), res.stderr
    assert copy.parent.stat().st_mode & 0o777 == 0o700 and (copy / "utils/launch/lib.sh").is_file()
    assert (copy.parent / "job").read_text() == "local 1 h /ws\n"
    shutil.rmtree(copy.parent)
    (snap / "utils/launch/lib.sh").write_text("touch /tmp/never\n")
    for sha in (good, ""):
        res = subprocess.run(
            ["bash", str(REPO / "_job.sbatch"), "--code-copy", str(snap), sha, "local 1 h /ws"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert res.returncode == 1 and res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
        assert ("is not the code submitted" if sha else "came without the hash of its code") in res.stderr
    assert not list(tmp_path.glob("mst.*"))
