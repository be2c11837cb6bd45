#!/usr/bin/env python3
"""Usage: trainer_guard.py LAUNCHER_PID TRAINER_PGID   (by _ray_actor.py, one per trainer)

A RAY=1 trainer is spawned by a Ray actor in a session of its own, outside the Slurm step's
process tree: when the job is cancelled, Slurm's kill (proctrack/linuxproc or pgid) never reaches
it, and only the launcher's cleanup (`utils/observe/ray_cluster.sh stop`) stops it, which Slurm
cuts short after KillWait. This guard, started beside the trainer in a session of its own and
without the job's MST_RAY_OWNER marker (so that stop leaves it), watches the node's launcher
(_train_with_ray.sh, LAUNCHER_PID, known by its start time: a reused pid is not taken for it).
Once the launcher is gone, however it ended, the trainer's process group (TRAINER_PGID) gets
SIGTERM, then SIGKILL after GRACE seconds if a process of it is left (MaxText takes SIGTERM as a
preemption notice, JAX's, and trains on: a tiny trainer went from step 3,788 to 6,311 in the 15 s
after one; a cancelled job's two trainers were seen still training 28 minutes later). The guard
exits as soon as that group is empty, so a trainer that ends on its own takes its guard with it.
Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL = 0.5  # seconds between looks at the launcher and the group
GRACE = 5.0  # seconds between SIGTERM and SIGKILL


def running_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first: field 3 is [0]); None when the
    process is gone or has ended and waits to be reaped (a zombie: signals reach it, it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields


def start_time(pid: int) -> str | None:
    """The running process's start time (clock ticks since boot, field 22); None: see running_stat."""
    fields = running_stat(pid)
    return fields[19] if fields else None


def group_alive(pgid: int) -> bool:
    """Any process of ours left in the group (one of another user's: the group id was reused)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def live_members(pgid: int) -> bool:
    """Whether a process of the group is still running, not only ended and unreaped (whoever reaps it
    is not up to us). Reads /proc: only while stopping a group, not at every look."""
    return any(
        (fields := running_stat(e.name)) and fields[2] == str(pgid) for e in os.scandir("/proc") if e.name.isdigit()
    )


def _wait_stopped(pgid: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)


def stop_group(pgid: int, grace: float = GRACE) -> None:
    """SIGTERM to the group, SIGKILL to what is left running after grace seconds; returns once nothing
    of it runs (at most a second after the SIGKILL: a killed process takes a moment to end)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    _wait_stopped(pgid, grace)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    _wait_stopped(pgid, 1.0)


def guard(launcher: int, pgid: int, poll: float = POLL, grace: float = GRACE) -> bool:
    """Watch until the group is empty (False) or the launcher is gone and the group was stopped (True)."""
    launcher_since = start_time(launcher)
    # the group stays the trainer's while any member lives, its leader gone or not: the kernel
    # gives no new process the id of a group that still has members
    while group_alive(pgid):
        if launcher_since is None or start_time(launcher) != launcher_since:
            stop_group(pgid, grace)
            return True
        time.sleep(poll)
    return False


def main(argv: list[str]) -> int:
    if argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(argv) != 3 or not all(a.isdigit() and int(a) > 1 for a in argv[1:]):
        print(
            f"trainer_guard.py: want LAUNCHER_PID TRAINER_PGID (two process ids above 1), got {argv[1:]}",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    guard(int(argv[1]), int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
