"""The job monitor in a shared workspace (issue 19, attack 1): a teammate who can write into the
workspace tries to make the victim's monitor (`--auto-recover`) run the teammate's submit.sh. Two
real users (tests/helpers/users.py) in a 1777 and a 2775 workspace; the victim's job is laid out
the way submit.sh makes it (job dir 0755, log 0644, snapshot.sha256, snapshot under the victim's
own root), its log failed on n2 where the test needs a failure to recover from. Every attack ends
with one line naming the path, its owner and mode, and the payload's canary never appears. The
same attack end to end on the local cluster is in tests/test_job_monitor_live.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import REPO, VENV

from helpers.users import as_user, ensure_users, reachable_base, shared_workspace
from monitor.watch import Rules, Watch

NAME = "local-41-JAX-tiny"  # a run_local-style id: the test needs no Slurm
UMASK = {"sticky": 0o022, "group": 0o002}  # what a user of each kind of workspace has

# As the victim: the job submit.sh would have made (umask 022 inside submit.sh), with a snapshot
# whose submit.sh only records that it ran (and prints what the real one prints).
SETUP = r"""
import os, pwd, subprocess, sys
from pathlib import Path
import trust
ws, repo, log_text, log_mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4], 8)
os.umask(0o022)
me = pwd.getpwuid(os.geteuid()).pw_name
snap = trust.own_dir(trust.own_dir(trust.own_dir(ws / me) / ".snapshots") / "s1")
trust.own_dir(snap / ".submit")
(snap / "submit.sh").write_text(
    "#!/bin/bash\nprintf '%s\\n' \"$*\" > \"$JOB_WORKSPACE/resubmitted-from-the-snapshot\"\n"
    "umask 022; mkdir -p \"$JOB_WORKSPACE/local-99-JAX-tiny\"\necho 'Submitted job local-99 (JAX-tiny) on 2 node(s)'\n")
(snap / "submit.sh").chmod(0o755)
(snap / ".submit/command.txt").write_text("submit.sh tiny -N 2 -- steps=100\n")
h = subprocess.run(["bash", f"{repo}/_job.sbatch", "--snapshot-hash", str(snap)], capture_output=True, text=True,
                   check=True).stdout.strip()
name = "local-41-JAX-tiny"
job = trust.own_dir(ws / name)
fd = trust.create_new(ws / f"{name}.log", 0o644)
os.write(fd, log_text.encode())
os.fchmod(fd, log_mode)
os.close(fd)
(job / "artifact").symlink_to(snap)
(job / "log").symlink_to(ws / f"{name}.log")
fd = trust.create_new(job / "snapshot.sha256", 0o644)
os.write(fd, f"{h}  {snap}\n".encode())
os.close(fd)
"""

# As the attacker: a snapshot of the attacker's whose submit.sh writes the canary as whoever runs it.
PAYLOAD = r"""
set -e
p=$1
mkdir -p "$p/.submit"
printf '#!/bin/bash\nid -un > "$JOB_WORKSPACE/CANARY"\necho "Submitted job local-66 (JAX-tiny)"\n' > "$p/submit.sh"
chmod 755 "$p/submit.sh"
echo 'submit.sh tiny' > "$p/.submit/command.txt"
"""


def header(n_steps: int = 10) -> str:
    lines = [
        "==================== JOB ====================",
        f"job: local-41 {NAME}",
        "scheduler: slurm",
        "model: tiny",
        "nodes: 2 (n1 n2)",
        "overrides: steps=100",
        "started: 2026-11-26T22:00:00Z",
        "=============================================",
    ]
    for n in range(n_steps):
        for h in ("n1", "n2"):
            lines.append(
                f"{h}: I1126 22:00:{10 + n:02d}.000000 1394 metric_logger.py:265] completed step: {n}, seconds: 0.500, "
                "TFLOP/s/device: 0.001, Tokens/s/device: 128.000, total_weights: 64, loss: 5.000, lm_loss: 5.000, "
                "perplexity: 148.413"
            )
    return "\n".join(lines) + "\n"


# n2's trainer SIGKILLed: triage blames n2 (a node fault --auto-recover acts on)
FAILED_ON_N2 = """==================== JOB SUMMARY ====================
status: failed
job: local-41 local-41-JAX-tiny
nodes: 2 (n1 n2)
stage: train
wall_time: 00:01:40 (100 s)
failed_nodes: n2 (exit 137)
=====================================================
"""


@pytest.fixture
def users():
    return ensure_users()


@pytest.fixture
def base():
    d = reachable_base()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def victim_job(victim, ws: Path, log_text: str, log_mode: int = 0o644) -> Path:
    res = as_user(
        victim,
        [str(VENV / "bin/python"), "-c", SETUP, str(ws), str(REPO), log_text, f"{log_mode:o}"],
        env={"PYTHONPATH": str(REPO / "utils")},
    )
    assert res.returncode == 0, res.stderr
    return ws / NAME


def payload(attacker, where: Path) -> str:
    """The attacker's snapshot at `where`; its content hash (so a record can name it correctly)."""
    res = as_user(attacker, ["bash", "-c", PAYLOAD, "payload", str(where)])
    assert res.returncode == 0, res.stderr
    res = as_user(attacker, ["bash", str(REPO / "_job.sbatch"), "--snapshot-hash", str(where)])
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def attack(attacker, script: str, ws: Path) -> None:
    """Run the attacker's shell lines (each may fail: a teammate tries what the workspace lets her)."""
    as_user(attacker, ["bash", "-c", script, "attack", str(ws)], umask=0o002)


def monitor(victim, ws: Path, *args: str, umask: int = 0o022):
    """The victim's monitor, once, with --auto-recover 1 (what submit.sh --auto-recover 1 starts)."""
    return as_user(
        victim,
        [str(VENV / "bin/python"), str(REPO / "utils/job_monitor.py"), NAME, "--once", "--no-notify", *args],
        env={"JOB_WORKSPACE": str(ws), "MAXTEXT_SLURM_VENV": str(VENV)},
        umask=umask,
        timeout=300,
    )


def events(job: Path) -> list[dict]:
    f = job / "monitor/events.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def nothing_ran(ws: Path) -> None:
    assert not (ws / "CANARY").exists(), "the attacker's submit.sh ran as the victim"
    assert not (ws / "resubmitted-from-the-snapshot").exists(), "resubmitted although it must not"


@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_a_planted_artifact_link_is_never_run_the_recorded_snapshot_is(users, base, kind):
    """The control: the victim's job failed on n2, the monitor resubmits without n2 - from the snapshot
    recorded in snapshot.sha256, though `artifact` names the attacker's payload. The attacker cannot
    change the job dir (0755) at all; the test points the link at the payload itself."""
    victim, attacker = users
    ws = shared_workspace(base, kind)
    job = victim_job(victim, ws, header() + FAILED_ON_N2)
    pay = ws / "payload"
    payload(attacker, pay)
    res = as_user(attacker, ["ln", "-sfn", str(pay), str(job / "artifact")])
    assert res.returncode != 0 and "Permission denied" in res.stderr
    (job / "artifact").unlink()
    (job / "artifact").symlink_to(pay)  # however it came to name another snapshot
    res = monitor(victim, ws, "--auto-recover", "1", umask=UMASK[kind])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resubmitted as job local-99 without n2" in res.stdout, res.stdout
    assert not (ws / "CANARY").exists()
    assert "--exclude=n2" in (ws / "resubmitted-from-the-snapshot").read_text()
    # the monitor's own files stay private under the victim's umask
    assert (job / "monitor").stat().st_mode & 0o7777 == 0o700
    assert (job / "monitor/state.json").stat().st_mode & 0o777 == 0o600
    assert (job / "monitor/events.jsonl").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_a_job_dir_others_can_write_is_refused_before_anything(users, base, kind):
    """A job dir made under umask 002 (before submit.sh made it 0755): in the group workspace the
    attacker replaces artifact and snapshot.sha256 (her payload, its right hash) and plants monitor/
    state with a budget; the monitor refuses the dir with one line and starts nothing."""
    victim, attacker = users
    ws = shared_workspace(base, kind)
    job = victim_job(victim, ws, header() + FAILED_ON_N2)
    mode = "2775" if kind == "group" else "0775"  # what mkdir under umask 002 made there
    as_user(victim, ["chmod", mode, str(job)], check=True)
    pay = ws / "payload"
    h = payload(attacker, pay)
    attack(
        attacker,
        f"""cd "$1/{NAME}"
        ln -sfn {pay} artifact; rm -f snapshot.sha256; printf '%s  %s\\n' {h} {pay} > snapshot.sha256
        mkdir -p monitor; echo '{{"job_id": "local-41", "recover_left": 5}}' > monitor/state.json""",
        ws,
    )
    if kind == "group":  # the group can write the dir: the attack is in place
        assert (job / "monitor").stat().st_uid == attacker.uid
    res = monitor(victim, ws, "--auto-recover", "1", umask=UMASK[kind])
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    assert (
        res.stderr
        == f"job_monitor.py: refusing the job directory {job}: it is writable by others (mode {mode}); "
        + ("the monitor acts only on a job directory, log and state of yours that nobody else can write\n")
    )
    nothing_ran(ws)


def test_planted_monitor_state_is_refused_and_a_budget_is_never_raised(users, base):
    """An attacker's monitor/ (planted while the job dir was group-writable, then tightened): refused.
    The victim's own state asking for 5 resubmissions: a monitor without --auto-recover resubmits none."""
    victim, attacker = users
    ws = shared_workspace(base, "group")
    job = victim_job(victim, ws, header() + FAILED_ON_N2)
    as_user(victim, ["chmod", "g+w", str(job)], check=True)
    attack(attacker, f'mkdir "$1/{NAME}/monitor"; echo \'{{"recover_left": 5}}\' > "$1/{NAME}/monitor/state.json"', ws)
    as_user(victim, ["chmod", "755", str(job)], check=True)
    res = monitor(victim, ws, "--auto-recover", "1", umask=0o002)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"refusing the monitor directory {job}/monitor: it is owned by mstattacker (mode 0775)" in res.stderr
    assert res.stderr.count("\n") == 1
    nothing_ran(ws)
    shutil.rmtree(job / "monitor")
    as_user(
        victim,
        ["bash", "-c", f"umask 077; mkdir {job}/monitor; echo '{{\"recover_left\": 5}}' > {job}/monitor/state.json"],
        check=True,
    )
    res = monitor(victim, ws)  # no --auto-recover
    assert res.returncode == 0, res.stdout + res.stderr
    assert "failed: " in res.stdout and "resubmitted" not in res.stdout, res.stdout
    nothing_ran(ws)


@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_a_fake_job_summary_in_a_log_others_can_write_is_not_acted_on(users, base, kind):
    """The victim's healthy job, its log group-writable (made under umask 002 before submit.sh made
    it 0644): the attacker appends a JOB SUMMARY blaming n2. The monitor stops with one event naming
    the log, its owner and mode, and resubmits nothing."""
    victim, attacker = users
    ws = shared_workspace(base, kind)
    job = victim_job(victim, ws, header(), log_mode=0o664)
    if kind == "sticky":  # the log's group is the victim's own: only the test can add the line
        with open(ws / f"{NAME}.log", "a") as f:
            f.write(FAILED_ON_N2)
    else:
        attack(attacker, f"printf '%s' '{FAILED_ON_N2}' >> \"$1/{NAME}.log\"", ws)
    assert "JOB SUMMARY" in (ws / f"{NAME}.log").read_text()
    res = monitor(victim, ws, "--auto-recover", "1", umask=UMASK[kind])
    assert res.returncode == 1, res.stdout + res.stderr
    why = f"refusing the job log {ws}/{NAME}.log: it is writable by others (mode 0664)"
    assert why in res.stdout and "untrusted: stopped watching" in res.stdout, res.stdout
    ev = [e for e in events(job) if e["kind"] != "running"]
    assert [e["kind"] for e in ev] == ["untrusted"] and why in ev[0]["lines"][0], ev
    nothing_ran(ws)


def test_someone_elses_log_put_in_place_is_refused(users, base):
    """Group workspace: the attacker renames the victim's log away and puts her own, with a JOB
    SUMMARY blaming n2, at its path."""
    victim, attacker = users
    ws = shared_workspace(base, "group")
    victim_job(victim, ws, header())
    log = ws / f"{NAME}.log"
    attack(attacker, f"mv {log} {log}.away; printf '%s%s' '{header()}' '{FAILED_ON_N2}' > {log}", ws)
    assert log.stat().st_uid == attacker.uid
    res = monitor(victim, ws, "--auto-recover", "1", umask=0o002)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"refusing the job log {log}: it is owned by mstattacker (mode 0664), not by you (mstvictim)" in res.stdout
    assert "resubmitted as job" not in res.stdout
    nothing_ran(ws)
    sticky = shared_workspace(base, "sticky")
    victim_job(victim, sticky, header())
    res = as_user(attacker, ["mv", f"{sticky}/{NAME}.log", f"{sticky}/x"])
    assert res.returncode != 0 and "Operation not permitted" in res.stderr


def test_a_renamed_and_replaced_job_dir_is_refused(users, base):
    """Group workspace: the attacker moves the victim's job dir aside and makes her own in its place,
    with her payload, its right hash, a state with a budget and a failed log. The monitor refuses it."""
    victim, attacker = users
    ws = shared_workspace(base, "group")
    job = victim_job(victim, ws, header())
    pay = ws / "payload"
    h = payload(attacker, pay)
    attack(
        attacker,
        f"""cd "$1"; mv {NAME} {NAME}.away; mkdir {NAME}; cd {NAME}
        ln -s {pay} artifact; printf '%s  %s\\n' {h} {pay} > snapshot.sha256
        printf '%s%s' '{header()}' '{FAILED_ON_N2}' > own.log; ln -s "$PWD/own.log" log
        mkdir monitor; echo '{{"job_id": "local-41", "recover_left": 5}}' > monitor/state.json""",
        ws,
    )
    assert job.stat().st_uid == attacker.uid
    res = monitor(victim, ws, "--auto-recover", "1", umask=0o002)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith(
        f"job_monitor.py: refusing the job directory {job}: it is owned by mstattacker (mode 2775), not by you"
    )
    nothing_ran(ws)


def test_a_job_dir_swapped_while_watched_stops_the_watch(tmp_path, users):
    """In-process (the test's user is the victim here): a watched job dir replaced by the attacker's,
    or by another directory of the victim's own, stops the watch with one event; the state stays in
    the original monitor/ (held open)."""
    _, attacker = users
    base = reachable_base()
    try:
        ws = shared_workspace(base, "group")
        job = ws / NAME
        job.mkdir(mode=0o755)
        job.chmod(0o755)
        (ws / f"{NAME}.log").write_text(header())
        (job / "log").symlink_to(ws / f"{NAME}.log")
        w = Watch(job, Rules())
        assert [e.kind for e in w.poll(1e9, None)] == ["running", "first_step"]
        job.rename(ws / "moved")
        job.mkdir(mode=0o755)
        job.chmod(0o755)  # ours, but not the directory the watch opened
        ev = w.poll(1e9 + 5, None)
        assert [e.kind for e in ev] == ["untrusted"] and "was replaced by another directory" in ev[0].lines[0]
        assert w.ended and w.poll(1e9 + 10, None) == []
        assert [json.loads(x)["kind"] for x in (ws / "moved/monitor/events.jsonl").read_text().splitlines()][-1] == (
            "untrusted"
        )
        assert not (job / "monitor").exists()
        shutil.rmtree(job)
        os.rename(ws / "moved", job)
        w2 = Watch(job, Rules())
        as_user(attacker, ["bash", "-c", f"mv {job} {job}.away && mkdir {job}"], umask=0o002, check=True)
        ev = w2.poll(1e9 + 20, None)
        assert "refusing the job directory" in ev[0].lines[0] and "owned by mstattacker" in ev[0].lines[0]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_snapshot_changed_since_submit_is_not_resubmitted(users, base):
    """The recorded hash no longer matches (the snapshot changed after submit): no resubmission, one
    event naming the snapshot and the record. And in a group workspace whose .snapshots the victim
    made group-writable, the attacker's snapshot put in its place is refused by owner and mode."""
    victim, attacker = users
    ws = shared_workspace(base, "group")
    job = victim_job(victim, ws, header() + FAILED_ON_N2)
    snap = ws / "mstvictim/.snapshots/s1"
    as_user(victim, ["bash", "-c", f"echo 'echo changed' >> {snap}/submit.sh"], check=True)
    res = monitor(victim, ws, "--auto-recover", "1", umask=0o002)
    assert res.returncode == 0, res.stdout + res.stderr
    rec = [e for e in events(job) if e["kind"] == "recovery"]
    assert len(rec) == 1 and rec[0]["title"].startswith(
        f"could not resubmit: refusing the job's snapshot {snap}: its "
    ), rec
    assert f"recorded at submit ({job}/snapshot.sha256)" in rec[0]["title"]
    nothing_ran(ws)

    (base / "second").mkdir(mode=0o755)
    ws2 = shared_workspace(base / "second", "group")
    job = victim_job(victim, ws2, header() + FAILED_ON_N2)
    snaps = ws2 / "mstvictim/.snapshots"
    as_user(victim, ["chmod", "g+w", str(snaps)], check=True)  # made under umask 002 before
    pay = ws2 / "payload"
    payload(attacker, pay)
    attack(attacker, f"mv {snaps}/s1 {snaps}/old && cp -r {pay} {snaps}/s1", ws2)
    res = monitor(victim, ws2, "--auto-recover", "1", umask=0o002)
    rec = [e for e in events(job) if e["kind"] == "recovery"]
    assert len(rec) == 1, res.stdout
    assert f"refusing the job's snapshot {snaps}: it is writable by others (mode 0775)" in rec[0]["title"], rec
    nothing_ran(ws2)
