"""The one trust rule for shared workspaces (utils/trust.py and its bash twin in
utils/launch/lib.sh): a path decides what runs only when it is ours, not a link, and writable by
nobody else. Shown with a second real user (tests/helpers/users.py) in a 1777 and a 2775 workspace."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

import trust
from helpers.users import as_user, ensure_users, reachable_base, shared_workspace

LIB = REPO / "utils/launch/lib.sh"


@pytest.fixture
def base():
    d = reachable_base()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def bash_lib(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source {LIB}; PROG=t; {code}"], capture_output=True, text=True)


@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_someone_elses_path_is_refused_in_both_languages(base, kind):
    _, attacker = ensure_users()
    ws = shared_workspace(base, kind)
    planted = ws / ".snapshots"
    res = as_user(attacker, ["mkdir", str(planted)], umask=0o002)
    assert res.returncode == 0, res.stderr
    with pytest.raises(trust.UntrustedPath, match=rf"{planted}: it is owned by mstattacker \(mode [02]775\)"):
        trust.check(planted, "the snapshot directory")
    res = bash_lib(f"check_trusted {planted} 'the snapshot directory'")
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert f"t: refusing the snapshot directory {planted}: it is owned by mstattacker" in res.stderr
    # own_dir will not adopt it either
    res = bash_lib(f"own_dir {planted}")
    assert res.returncode == 1 and "owned by mstattacker" in res.stderr


def test_a_link_and_a_group_writable_file_are_refused(tmp_path):
    target = tmp_path / "target"
    target.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(trust.UntrustedPath, match=r"symbolic link \(to .*target\)"):
        trust.check(link, "the record")
    with pytest.raises(trust.UntrustedPath, match="symbolic link"):
        trust.open_trusted(link, "the record")
    target.chmod(0o664)
    with pytest.raises(trust.UntrustedPath, match=r"writable by others \(mode 0664\)"):
        trust.read_trusted(target, "the record")
    assert "writable by others (mode 0664)" in bash_lib(f"check_trusted {target} x").stderr
    target.chmod(0o644)
    assert trust.read_trusted(target, "the record") == b"x"
    assert bash_lib(f"check_trusted {target} x").returncode == 0


def test_own_dir_in_a_group_workspace_drops_setgid_and_group_write(base):
    ws = shared_workspace(base, "group")
    d = trust.own_dir(ws / "mine")
    assert oct(d.stat().st_mode & 0o7777) == "0o755"
    res = bash_lib(f"umask 002; own_dir {ws}/mine2 700")
    assert res.returncode == 0, res.stderr
    assert oct((ws / "mine2").stat().st_mode & 0o7777) == "0o700"
    trust.check_under(ws, ws / "mine", "x")


def test_new_file_never_writes_through_a_link(tmp_path):
    victim_file = tmp_path / "bashrc"
    victim_file.write_text("keep\n")
    log = tmp_path / "job.log"
    log.symlink_to(victim_file)
    res = bash_lib(f"new_file {log}")
    assert res.returncode == 1 and "exists already" in res.stderr
    with pytest.raises(trust.UntrustedPath, match="exists already"):
        trust.create_new(log)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert bash_lib(f"new_file {tmp_path}/dangling").returncode == 1
    assert not (tmp_path / "nowhere").exists()
    assert victim_file.read_text() == "keep\n"
    res = bash_lib(f"umask 002; new_file {tmp_path}/fresh.log")
    assert res.returncode == 0 and oct((tmp_path / "fresh.log").stat().st_mode & 0o777) == "0o644"
    fd = trust.create_new(tmp_path / "fresh2")
    os.close(fd)
    assert Path(tmp_path / "fresh2").stat().st_mode & 0o777 == 0o600


def snapshot_hash(d: Path) -> str:
    res = subprocess.run(["bash", str(REPO / "_job.sbatch"), "--snapshot-hash", str(d)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_snapshot_hash_sees_every_change_but_not_modes(tmp_path):
    snap = tmp_path / "snap"
    (snap / "utils/launch").mkdir(parents=True)
    (snap / "utils/launch/lib.sh").write_text("echo hi\n")
    (snap / "_train.sh").write_text("exit 0\n")
    first = snapshot_hash(snap)
    assert len(first) == 64
    copy = tmp_path / "copy"
    shutil.copytree(snap, copy)
    (copy / "_train.sh").chmod(0o500)  # a copy under another umask: same code, same hash
    assert snapshot_hash(copy) == first
    (copy / "utils/launch/lib.sh").write_text("echo hi \n")
    assert snapshot_hash(copy) != first
    shutil.rmtree(copy)
    shutil.copytree(snap, copy)
    (copy / "utils/__pycache__").mkdir()  # planted bytecode is code too
    (copy / "utils/__pycache__/x.pyc").write_bytes(b"\0")
    assert snapshot_hash(copy) != first
    shutil.rmtree(copy / "utils/__pycache__")
    (copy / "link").symlink_to("/etc/passwd")
    assert snapshot_hash(copy) != first
