"""utils/launch/snapshot.sh copies the code whatever the git state around it (issue 20 item 7): a
git checkout of its own (git ls-files: tracked and untracked-but-not-ignored files, its commit in
.submit/git.txt); a snapshot of a snapshot under the git-ignored outputs/ (what every --auto-recover
resubmission with the default workspace makes); a release inside another git checkout that does
not track it; a directory that an outer checkout ignores. Each snapshot holds what a job needs
(submit.sh, _job.sbatch, utils/...), never tests/ or the workspace, can itself be snapshotted again,
and its content hash (the caller's _job.sbatch --snapshot-hash) is stable. On the local cluster: the monitor's
recovery resubmits a job of the default workspace (<repo>/outputs) and the new job completes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

from helpers.jobs import SUBMITTED, log_has, wait_job_end

NEEDED = ("submit.sh", "_job.sbatch", "_container.sh", "utils/launch/snapshot.sh", "utils/launch/lib.sh")


def git(cwd: Path, *args: str) -> str:
    res = run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args])
    assert res.returncode == 0, res.stderr
    return res.stdout


def project(where: Path) -> Path:
    """A copy of this checkout's code as it is now (tests/ aside: snapshots leave it out anyway),
    with a test file that only a copy of the whole tree keeps, as a plain directory."""
    where.mkdir(parents=True)
    files = run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"]).stdout
    keep = "".join(f + "\0" for f in files.split("\0") if f and not f.startswith("tests/") and (REPO / f).exists())
    copy = f"tar -C {REPO} --null -T - -cf - | tar -C {where} -xf -"
    subprocess.run(copy, input=keep, text=True, shell=True, check=True)
    (where / "tests").mkdir(exist_ok=True)
    (where / "tests/test_x.py").write_text("# no job runs tests\n")
    return where


def snapshot(repo: Path, ws: Path, env: dict[str, str] | None = None) -> Path:
    """snapshot.sh (the source's own, as submit.sh runs it) of repo into ws/<user>/.snapshots."""
    parent = ws / "me/.snapshots"
    parent.mkdir(parents=True, exist_ok=True)
    parent.chmod(0o755)
    res = run([str(repo / "utils/launch/snapshot.sh"), str(repo), str(parent), "submit.sh tiny"], env=env)
    assert res.returncode == 0, res.stderr
    return Path(res.stdout.strip())


def tree(d: Path) -> dict[str, bytes | str]:
    """Every path under d but .submit/: a file's bytes, a link's target, a directory's '/'."""
    out: dict[str, bytes | str] = {}
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d).as_posix()
        if rel == ".submit" or rel.startswith(".submit/"):
            continue
        out[rel] = str(p.readlink()) if p.is_symlink() else "/" if p.is_dir() else p.read_bytes()
    return out


def snapshot_hash(d: Path) -> str:
    res = run(["bash", str(REPO / "_job.sbatch"), "--snapshot-hash", str(d)])
    assert res.returncode == 0 and re.fullmatch(r"[0-9a-f]{64}\n", res.stdout), res.stderr
    return res.stdout.strip()


def check_snapshot(snap: Path, source: Path) -> None:
    """What a job needs is there, read-only; tests/ and caches are not; the hash is stable."""
    for f in NEEDED:
        assert (snap / f).is_file(), f"{f} missing from the snapshot of {source}: {sorted(tree(snap))[:20]}"
    assert (snap / "utils/launch/snapshot.sh").read_bytes() == (REPO / "utils/launch/snapshot.sh").read_bytes()
    assert not (snap / "tests").exists() and not (snap / ".git").exists()
    assert not list(snap.rglob("__pycache__")) and not list(snap.rglob("*.pyc"))
    assert not (snap.stat().st_mode & 0o222) and not ((snap / "submit.sh").stat().st_mode & 0o222)
    assert (snap / ".submit/command.txt").read_text() == "submit.sh tiny\n"
    assert snapshot_hash(snap) == snapshot_hash(snap)


def again_and_again(snap: Path, ws: Path) -> list[Path]:
    """The snapshot snapshotted by its own snapshot.sh, and that one again: the same code each time."""
    chain = [snap]
    for _ in range(2):
        nxt = snapshot(chain[-1], ws)
        check_snapshot(nxt, chain[-1])
        assert tree(nxt) == tree(snap)
        assert snapshot_hash(nxt) != snapshot_hash(chain[-1])  # its own .submit/ record
        chain.append(nxt)
    return chain


def test_a_snapshot_of_a_snapshot_under_the_ignored_outputs_keeps_the_code(tmp_path):
    """The default workspace <repo>/outputs (git-ignored): an --auto-recover resubmission runs the
    snapshot's own submit.sh, which snapshots the snapshot. It used to get only .submit/."""
    repo = project(tmp_path / "maxtext-slurm")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "c")
    commit = git(repo, "rev-parse", "HEAD").strip()
    (repo / "utils/__pycache__").mkdir()
    (repo / "utils/__pycache__/x.pyc").write_bytes(b"cache")  # ignored by the project's .gitignore
    (repo / "README.md").write_text("changed\n")  # uncommitted: in the snapshot and its git.diff
    ws = repo / "outputs"
    first = snapshot(repo, ws)
    check_snapshot(first, repo)
    assert not (first / "outputs").exists()
    assert f"commit: {commit}\n" in (first / ".submit/git.txt").read_text()
    assert "+changed" in (first / ".submit/git.diff").read_text()
    chain = again_and_again(first, ws)
    for s in chain[1:]:
        rec = (s / ".submit/git.txt").read_text()
        assert "commit: none (not a git checkout of its own" in rec and f"source: {chain[chain.index(s) - 1]}\n" in rec
        assert f"  commit: {commit}\n" in rec, rec  # the first snapshot's record, carried along
        assert (s / ".submit/git.diff").read_text() == (first / ".submit/git.diff").read_text()
    assert (chain[-1] / "README.md").read_text() == "changed\n"


@pytest.mark.parametrize("how", ["untracked", "ignored"])
def test_a_release_inside_another_git_checkout_is_copied_whole(tmp_path, how):
    """A release tarball unpacked under a $HOME kept in git: the outer checkout does not track it
    (untracked), or ignores it. The snapshot is the release's code; git.txt names no commit of the
    outer checkout and git.diff carries none of its changes."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine\n")
    if how == "ignored":
        (home / ".gitignore").write_text("opt/\n")
    git(home, "init", "-q")
    git(home, "add", "-A")
    git(home, "commit", "-qm", "home")
    (home / "notes.txt").write_text("private change\n")
    repo = project(home / "opt/maxtext-slurm")
    (repo / "utils/__pycache__").mkdir()
    (repo / "utils/__pycache__/x.pyc").write_bytes(b"cache")
    (repo / "outputs").mkdir()
    (repo / "outputs/old.log").write_text("old job\n")
    ws = repo / "outputs"
    snap = snapshot(repo, ws)
    check_snapshot(snap, repo)
    assert not (snap / "outputs").exists()
    rec = (snap / ".submit/git.txt").read_text()
    assert "commit: none (not a git checkout of its own; the whole tree was copied)\n" in rec, rec
    assert git(home, "rev-parse", "HEAD").strip() not in rec
    assert (snap / ".submit/git.diff").read_text() == ""
    again_and_again(snap, ws)


def test_a_checkout_of_its_own_inside_another_uses_its_own_git(tmp_path):
    """A clone of the project inside a $HOME kept in git: its own files and commit, not the outer's."""
    home = tmp_path / "home"
    home.mkdir()
    git(home, "init", "-q")
    repo = project(home / "src/maxtext-slurm")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "c")
    (repo / "scratch.bin").write_text("ignored\n")
    (repo / ".git/info/exclude").write_text("scratch.bin\n")
    snap = snapshot(repo, tmp_path / "ws")
    check_snapshot(snap, repo)
    assert not (snap / "scratch.bin").exists()
    assert f"commit: {git(repo, 'rev-parse', 'HEAD').strip()}\n" in (snap / ".submit/git.txt").read_text()


def test_a_workspace_inside_a_plain_tree_is_left_out(tmp_path):
    """A workspace of the user's choosing inside a tree that is no git checkout: never copied into
    its own snapshots (each would hold every earlier one)."""
    repo = project(tmp_path / "maxtext-slurm")
    ws = repo / "runs-here"
    one = snapshot(repo, ws)
    two = snapshot(repo, ws)
    check_snapshot(two, repo)
    assert not (two / "runs-here").exists() and tree(one) == tree(two)


# The resubmission script: the monitor's own recovery (utils/monitor/recover.py of this checkout)
# on a job directory, as `job_monitor.py --auto-recover` runs it after a node fault.
RESUBMIT = """
import json, sys
from pathlib import Path
from monitor import recover, store
job_dir = Path(sys.argv[1])
print(json.dumps(recover.resubmit(job_dir, store.Dir.open(job_dir), ["n2"], {})))
"""


@pytest.mark.cluster
def test_auto_recover_resubmits_in_the_default_workspace(cluster, tmp_path):
    """A job submitted with the default workspace (<repo>/outputs, git-ignored): the monitor's
    recovery runs its snapshot's own submit.sh, which snapshots the snapshot under outputs/. The new
    job is submitted there, without n2, from the same code, and completes (it used to fail at
    sbatch: "Unable to open file .../_job.sbatch")."""
    repo = project(tmp_path / "maxtext-slurm")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "c")
    env = {k: v for k, v in os.environ.items() if k != "JOB_WORKSPACE"}
    env.update(cluster, MAXTEXT_SLURM_VENV=str(VENV))
    res = subprocess.run(
        [str(repo / "submit.sh"), "tiny", "-N", "1", "--", "steps=2"], env=env, capture_output=True, text=True
    )
    m = re.search(r"Submitted job (\d+) \((\S+)\)", res.stdout)
    assert res.returncode == 0 and m, res.stderr
    SUBMITTED.append(m.group(1))
    ws = repo / "outputs"
    job_dir = ws / f"{m.group(1)}-{m.group(2)}"
    assert (job_dir / "snapshot.sha256").is_file(), sorted(ws.iterdir())
    run(["scancel", m.group(1)], env=cluster)  # what it does is not the point: its resubmission is

    res = subprocess.run(
        [str(VENV / "bin/python"), "-c", RESUBMIT, str(job_dir)],
        env={**env, "PYTHONPATH": str(REPO / "utils")},  # this checkout's monitor
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    new = json.loads(res.stdout)
    SUBMITTED.append(new["job_id"])
    assert "--exclude=n2" in new["command"] and Path(new["job_dir"]).parent == ws
    state = wait_job_end(cluster, new["job_id"], 300)
    log = ws / f"{new['name']}.log"
    assert state == "COMPLETED", log.read_text()[-3000:] if log.exists() else state
    assert log_has(log, r"^n1: .*completed step: 1,")
    snap = (Path(new["job_dir"]) / "artifact").resolve()
    first = (job_dir / "artifact").resolve()
    assert snap.parent == first.parent and first.parent.parent.parent == ws  # <ws>/<user>/.snapshots
    assert tree(snap) == tree(first) and (snap / "_job.sbatch").is_file()
    rec = (snap / ".submit/git.txt").read_text()
    assert "not a git checkout of its own" in rec and f"  commit: {git(repo, 'rev-parse', 'HEAD').strip()}" in rec


def test_a_checkout_git_will_not_read_is_copied_whole_and_said_so(tmp_path):
    """A checkout of someone else's (git: "dubious ownership"): the whole tree, and git.txt says why
    it names no commit rather than claiming it is no checkout."""
    repo = project(tmp_path / "maxtext-slurm")
    git(repo, "init", "-q")
    run(["chown", "-R", "nobody", str(repo)])
    snap = snapshot(repo, tmp_path / "ws", {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"})
    check_snapshot(snap, repo)
    rec = (snap / ".submit/git.txt").read_text()
    assert "commit: unknown (git cannot read this checkout: fatal: detected dubious ownership" in rec, rec
