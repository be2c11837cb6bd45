"""utils/job_monitor.py: watch jobs from a login node and tell people what happens (docs/job-monitor.md)."""

from __future__ import annotations

import argparse
import fcntl
import getpass
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import joblog
import trust
from diagnosis import cli, jobdir, locate, scheduler
from diagnosis.cli import InputError
from monitor import notify, recover, store
from monitor.watch import Event, Rules, Watch, span, utc
from trust import UntrustedPath

PROG = "job_monitor.py"
DESCRIPTION = """Watches MaxText jobs from a login node and reports what happens to them: queued ->
running, first step (time to it), 25/50/75 % with an ETA, a hang (no step for max(FACTOR x the
median step time, FLOOR), longer after a checkpoint save or eval line), a slowdown (throughput under
a fraction of the job's own steady value; saves and evals left out), and the end (completed with
the JOB SUMMARY figures, or failed with triage's class, culprit hosts and evidence). Events go to
this monitor's log, to <job dir>/monitor/events.jsonl and, when a notification config exists, to
the destinations in it (Apprise URLs; docs/notifications.md). Each event is sent once: a restarted
monitor goes on from <job dir>/monitor/state.json. JOB: a job id, job name, job dir or log.
--auto-recover N: a job that failed or hung because of specific nodes (triage: node_failure,
gpu_health, heartbeat_timeout, collective_error, hang with a culprit), and with --recover-slowdowns
one slowed down by specific nodes (diagnose on its TSDB: a verdict scoped to some hosts), is
cancelled if still running and resubmitted from its snapshot without those nodes (restoring its
run's latest checkpoint), at most N times, and only from the snapshot recorded at submit
(<job dir>/snapshot.sha256) when its content hash still matches. The monitor acts on a job only
while its directory, monitor/ and log are yours and writable by you only; otherwise it stops
watching that job with one line naming the path. Exit: 0 when every watched job has ended (or
after --stop), 1 when a job was not trusted, 2 on bad input."""


def say(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {msg}", flush=True)


def fail(msg: str) -> int:
    return cli.fail(PROG, msg)


# The monitor's options, declared once (cli.Option): the parser below is built from them; a bad value
# is one line naming the option and what would be right, exit 2, before anything is watched.
OPTIONS = (
    cli.Option("all", "every job of yours that Slurm lists (new ones too)", bool),
    cli.Option("workspace", "where jobs are found (default $JOB_WORKSPACE or <repo>/outputs)", Path),
    cli.Option("interval", "seconds between polls", float, 10.0, gt=0),
    cli.Option("hang_factor", "hang: no step for FACTOR x median step", float, 10.0, gt=0, note="10"),
    cli.Option("hang_floor", "... and at least this many seconds", float, 45.0, gt=0, note="45"),
    cli.Option("pause_grace", "after a save/eval line: at least this", float, 600.0, ge=0, note="600"),
    cli.Option(
        "first_step_limit",
        "no first step this many seconds after the start: an alarm (a run's job: 3 x its earlier jobs' start-up)",
        float,
        1800.0,
        gt=0,
        note="1800",
    ),
    cli.Option(
        "slowdown",
        "slowdown under this fraction of steady",
        float,
        0.6,
        gt=0,
        lt=1,
        must="a fraction of the steady throughput, more than 0 and less than 1",
        note="0.6",
    ),
    cli.Option(
        "notify_config",
        "Apprise config, mode 0600 (default $MST_NOTIFY_CONFIG or ~/.config/maxtext-slurm/notify.conf when it exists)",
        Path,
    ),
    cli.Option("no_notify", "log and events.jsonl only", bool),
    cli.Option(
        "auto_recover",
        "resubmit without the culprit nodes, at most N times",
        int,
        0,
        ge=0,
        le=10,
        must="0 .. 10 resubmissions",
        metavar="N",
        note="",
    ),
    cli.Option(
        "recover_slowdowns",
        "--auto-recover also a slowdown that diagnose pins on some nodes (RAY=1 jobs: from their TSDB)",
        bool,
    ),
    cli.Option("detach", "run in the background (pid file and log in the monitor dir)", bool),
    cli.Option("stop", "stop the detached monitor of these jobs (or of --all)", bool),
    cli.Option("status", "print each job's monitor state and exit", bool),
    cli.Option("once", "poll once and exit (for cron)", bool),
    cli.Option("check_notify", "load the notification config, print its destinations, exit", bool),
    cli.Option("send_test", "send one test notification and exit (0: delivered)", bool),
    cli.Option(
        "linger",
        "after the last job ended, retry undelivered notifications this long",
        float,
        600.0,
        ge=0,
        note="600 s",
    ),
)


def build_parser() -> cli.Parser:
    ap = cli.Parser(prog=PROG, description=DESCRIPTION)
    ap.add_argument("jobs", nargs="*", metavar="JOB", help="job id, job name, job dir or log file")
    cli.add_options(ap, OPTIONS)
    return ap


def check(a: argparse.Namespace) -> str | None:
    """What is wrong with the parsed arguments together (each value alone is checked by its type)."""
    if bool(a.jobs) == a.all and not (a.check_notify or a.send_test):
        return "give JOB ... or --all (not both)"
    return None


# --- scheduler ---------------------------------------------------------------------------
def my_jobs(ws: Path) -> list[Path]:
    """Job dirs in ws of the jobs Slurm lists for this user."""
    return [ws / f"{i}-{n}" for i, n in scheduler.my_jobs() if (ws / f"{i}-{n}").is_dir()]


# --- the monitor ----------------------------------------------------------------------------
class Monitor:
    def __init__(self, a: argparse.Namespace, ws: Path, notifier: notify.Notifier | None) -> None:
        self.a, self.ws, self.notifier = a, ws, notifier
        self.rules = Rules(a.hang_factor, a.hang_floor, a.pause_grace, a.slowdown, first_step_limit=a.first_step_limit)
        self.watches: dict[Path, Watch] = {}
        self.outboxes: dict[Path, notify.Outbox] = {}
        self.locks: dict[Path, int] = {}
        self.refused: dict[Path, str] = {}  # jobs not watched or no longer: a path not ours to trust
        self.stop = False

    def refuse(self, job_dir: Path, why: str) -> None:
        """Stop acting on a job: one line in the log and, when configured, one notification (sent
        directly: its outbox is in the directory that is not trusted)."""
        if job_dir in self.refused:
            return
        self.refused[job_dir] = why
        say(f"{job_dir.name}: not watched (nothing resubmitted): {why}")
        if self.notifier is not None:
            self.notifier.send(
                f"[maxtext-slurm] job {job_dir.name}: not watched, a path is not trusted", why, "failure"
            )

    def add(self, job_dir: Path, recover_left: int | None = None) -> None:
        if job_dir in self.watches or job_dir in self.refused:
            return
        try:
            w = Watch(job_dir, self.rules)
        except UntrustedPath as e:
            self.refuse(job_dir, str(e))
            return
        try:
            fd = w.home.open_private("lock", "the monitor lock", os.O_RDWR)
        except UntrustedPath as e:
            w.close()
            self.refuse(job_dir, str(e))
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            w.close()
            say(f"{job_dir.name}: watched by another monitor already; left to it")
            return
        try:
            outbox = notify.Outbox(w.home.path / "outbox.json", self.notifier, say, home=w.home)
        except UntrustedPath as e:
            os.close(fd)
            w.close()
            self.refuse(job_dir, str(e))
            return
        self.locks[job_dir] = fd
        if recover_left is not None:
            w.s["recover_left"] = recover_left
        else:  # never more than this monitor's own --auto-recover allows
            try:
                saved = int(w.s.get("recover_left", self.a.auto_recover))
            except (TypeError, ValueError):
                saved = 0
            w.s["recover_left"] = max(0, min(saved, self.a.auto_recover))
        self.watches[job_dir] = w
        self.outboxes[job_dir] = outbox
        say(f"{job_dir.name}: watching (state {w.s['phase']}, {len(w.s['sent'])} event(s) sent before)")

    def tell(self, w: Watch, ev: Event) -> None:
        body = "\n".join(ev.lines)
        say(f"{w.name}: {ev.kind}: {ev.title}" + "".join(f"\n    {x}" for x in ev.lines))
        title = f"[maxtext-slurm] job {w.job_id or w.name} ({w.name}): {ev.title}"
        self.outboxes[w.dir].put(f"{w.name}:{ev.key}", title, body, ev.level)

    def poll(self) -> None:
        if self.a.all:
            for d in my_jobs(self.ws):
                self.add(d)
        for w in list(self.watches.values()):
            if w.ended:
                continue
            now = time.time()
            events = w.poll(now, scheduler.slurm_state(w.job_id))
            for ev in events:
                self.tell(w, ev)
                slow = ev.kind == "slowdown" and self.a.recover_slowdowns
                if w.refused is None and (ev.kind == "hang" or slow or (ev.key == "end" and ev.kind == "failed")):
                    self.maybe_recover(w, ev)
                nxt = (ev.data.get("run") or {}).get("next_job_dir") if ev.key == "end" else None
                if nxt and w.refused is None:  # a continuing run goes on: watch its next job too
                    self.add(Path(nxt), recover_left=int(w.s.get("recover_left") or 0))
            if w.refused is not None:
                self.refused[w.dir] = w.refused
                if not any(e.kind == "untrusted" for e in events):
                    say(f"{w.name}: untrusted: stopped watching (nothing resubmitted)\n    {w.refused}")
        for ob in self.outboxes.values():
            ob.flush()

    def maybe_recover(self, w: Watch, ev: Event) -> None:
        left = int(w.s.get("recover_left") or 0)
        if left <= 0 or w.s.get("recovered_as"):
            return
        now = time.time()
        if ev.kind == "hang":
            try:  # the hang's culprit, while the job still runs
                rep = w.triage(now, scheduler=True)
            except UntrustedPath as e:
                self.stop_watch(w, str(e), now)
                return
            except Exception as e:  # noqa: BLE001
                rep = {"status": "running", "failure_class": None, "summary": f"triage failed: {e}"}
            if rep.get("failure_class") in (None, "hang") and not rep.get("culprit_hosts"):
                rep = {**rep, "failure_class": "hang"}
        elif ev.kind == "slowdown":
            rep = slowdown_report(w)
        else:
            rep = w.report or {}
        nodes = locate_nodes(w)
        exclude, why = recover.plan(rep, nodes)
        key = f"recovery:{ev.key}"
        if not exclude:
            w.emit(out := [], Event(key, "recovery", "warning", why, [rep.get("summary") or ""], at=now))
            for e in out:
                self.tell(w, e)
            w.save()
            return
        if ev.kind in ("hang", "slowdown"):  # still running: stop it first
            cancel(w.job_id)
            end = time.time() + 120
            settled = (None, scheduler.GONE, "CANCELLED", "FAILED", "COMPLETED")
            while time.time() < end and scheduler.slurm_state(w.job_id) not in settled:
                time.sleep(1)
        try:
            w.jd.verify()
        except UntrustedPath as e:
            self.stop_watch(w, str(e), now)
            return
        try:
            new = recover.resubmit(w.dir, w.jd, exclude, w.s.get("header") or {})
        except recover.RecoverError as e:
            w.emit(out := [], Event(key, "recovery", "failure", f"could not resubmit: {e}", [why], at=now))
        else:
            run = (w.s.get("header") or {}).get("run")
            restore = (
                f"restores the latest checkpoint of run {run.split()[0]}" if run else "no --run alias: starts over"
            )
            w.s["recovered_as"] = new["job_id"]
            w.emit(
                out := [],
                Event(
                    key,
                    "recovery",
                    "warning",
                    f"resubmitted as job {new['job_id']} without {','.join(exclude)} ({left - 1} more allowed)",
                    [why, f"evidence: {rep.get('summary') or ''}", f"command: {new['command']}", restore],
                    {"new_job_id": new["job_id"], "excluded": exclude, "failure_class": rep.get("failure_class")},
                    now,
                ),
            )
            self.add(Path(new["job_dir"]), recover_left=left - 1)
            if Path(new["job_dir"]) in self.watches:
                self.watches[Path(new["job_dir"])].s["recovered_from"] = w.job_id
        for e in out:
            self.tell(w, e)
        w.save()

    def stop_watch(self, w: Watch, why: str, now: float) -> None:
        """w is no longer trusted: tell it once and act on it no more."""
        w.stop(why, now, out := [])
        for e in out:
            self.tell(w, e)
        self.refused[w.dir] = why

    def done(self) -> bool:
        return not self.a.all and all(w.ended for w in self.watches.values())

    def pending(self) -> int:
        return sum(len(ob.pending()) for ob in self.outboxes.values())

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stop", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "stop", True))
        while not self.stop:
            self.poll()
            if self.a.once:
                return 1 if self.refused else 0
            if self.done():
                end = time.time() + self.a.linger
                while self.pending() and time.time() < end and not self.stop:
                    time.sleep(min(self.a.interval, 5))
                    for ob in self.outboxes.values():
                        ob.flush()
                if self.pending():
                    say(f"giving up on {self.pending()} undelivered notification(s) (see the lines above)")
                say("every watched job has ended")
                return 1 if self.refused else 0
            t = time.time() + self.a.interval
            while time.time() < t and not self.stop:
                time.sleep(min(0.5, t - time.time()))
        say("stopped")
        return 0


# diagnose's verdicts that name a node's own fault (a slowdown pinned there); never training_dynamics
# (the model), heartbeat_false_positive (the accused were healthy) or none
NODE_VERDICTS = ("network", "gpu_thermal", "gpu_power", "gpu_hardware", "cpu_contention", "io_pressure", "memory")


def slowdown_report(w: Watch) -> dict:
    """--recover-slowdowns: diagnose on the running job's TSDB (a private copy of it), as a report
    recover.plan reads: class `slowdown` with the culprits of a verdict scoped to some hosts, else none."""
    from diagnosis import diagnose  # numpy and the checks: loaded only when a slowdown asks for it

    try:
        r = diagnose.diagnose(diagnose.locate(str(w.dir)))
    except Exception as e:  # noqa: BLE001 - no TSDB (RAY=0), or it cannot be served: no recovery
        return {"failure_class": None, "status": "slow", "summary": f"diagnose could not run: {e}"}
    pinned = r.get("verdict") in NODE_VERDICTS and r.get("scope") == "hosts" and r.get("culprit_hosts")
    return {
        "failure_class": "slowdown" if pinned else None,
        "status": f"slow ({r.get('verdict')})",
        "scope": r.get("scope"),
        "culprit_hosts": r.get("culprit_hosts") or [],
        "summary": f"diagnose: {r.get('summary')}",
    }


def locate_nodes(w: Watch) -> list[str]:
    return joblog.Scan(path="", header=w.s.get("header") or {}).nodes()


def cancel(job_id: str) -> None:
    """scancel this job (the user's own, hung; --auto-recover asked for it)."""
    if re.fullmatch(r"\d+(_\d+)?", job_id or ""):
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60, check=False)


# --- start, detach, stop ---------------------------------------------------------------------
def monitor_home(a: argparse.Namespace, ws: Path, dirs: list[Path]) -> store.Dir:
    """Where the pid file and log of a detached monitor go: the job's monitor/, or for --all and
    several jobs .monitor/ in your own root of the workspace ($JOB_WORKSPACE/<user>/). UntrustedPath
    when that is not yours alone."""
    if len(dirs) == 1 and not a.all:
        top = store.Dir.open(dirs[0])
        name, what = "monitor", "the monitor directory"
    else:
        top = store.Dir.open(trust.own_dir(ws / getpass.getuser()), "your directory in the workspace")
        name, what = ".monitor", "the monitor directory"
    try:
        return top.sub(name, what)
    finally:
        top.close()


def pid_alive(home: store.Dir) -> int | None:
    """The pid in the home's monitor.pid when that process is a job monitor of this user, else None."""
    try:
        pid = int((home.read("monitor.pid", "the monitor's pid file", limit=64) or b"").strip())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        uid = Path(f"/proc/{pid}").stat().st_uid
    except (OSError, ValueError):
        return None
    return pid if b"job_monitor" in cmd and uid == os.getuid() else None


def detach(argv: list[str], home: store.Dir) -> int:
    pid_file, log = home.path / "monitor.pid", home.path / "monitor.log"
    if (pid := pid_alive(home)) is not None:
        return fail(f"a monitor already runs for this (pid {pid}, {pid_file}); stop it with --stop")
    args = [a for a in argv if a != "--detach"]
    fd = home.open_private("monitor.log", "the monitor's log", os.O_WRONLY | os.O_APPEND)
    script = Path(__file__).resolve().parents[1] / "job_monitor.py"
    p = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdin=subprocess.DEVNULL,
        stdout=fd,
        stderr=fd,
        start_new_session=True,
    )
    os.close(fd)
    home.write("monitor.pid", f"{p.pid}\n".encode())
    print(f"monitor started: pid {p.pid}\n  log:  {log}\n  stop: {PROG} {' '.join(args)} --stop")
    return 0


def stop(home: store.Dir) -> int:
    pid_file = home.path / "monitor.pid"
    pid = pid_alive(home)
    if pid is None:
        print(f"no monitor runs for this ({pid_file} names none of yours)")
        return 0
    os.kill(pid, signal.SIGTERM)
    end = time.time() + 15
    while time.time() < end and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    try:
        os.unlink("monitor.pid", dir_fd=home.fd)
    except FileNotFoundError:
        pass
    print(f"monitor pid {pid} stopped")
    return 0


def read_state(d: Path) -> dict | None:
    """The monitor state of job dir d (None: not watched yet), read only when trusted."""
    if not os.path.lexists(d / "monitor"):
        return None
    jd = store.Dir.open(d)
    try:
        home = store.Dir.open(d / "monitor", "the monitor directory")
        try:
            s = home.read_json("state.json", "the monitor state")
        finally:
            home.close()
    finally:
        jd.close()
    return s if isinstance(s, dict) else None


def status(dirs: list[Path]) -> int:
    for d in dirs:
        try:
            s = read_state(d)
        except UntrustedPath as e:
            print(f"{d.name}: {e}")
            continue
        if s is None:
            print(f"{d.name}: not watched yet")
            continue
        step = s.get("last_step")
        ago = f", last step {step} {span(time.time() - s['last_progress'])} ago" if step is not None else ""
        print(f"{d.name}: {s.get('phase')}{ago}; events sent: {', '.join(s.get('sent') or []) or 'none'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if (why := check(a)) is not None:
        return fail(why)
    if a.check_notify or a.send_test:
        path = a.notify_config or notify.default_config_path()
        try:
            n = notify.load(path)
        except notify.NotifyConfigError as e:
            return fail(str(e))
        if a.check_notify:
            print("\n".join(n.destinations()))
            return 0
        ok = n.send("[maxtext-slurm] test notification", f"sent by {PROG} --send-test from {os.uname().nodename}")
        print("delivered" if ok else "not delivered (a destination refused it or could not be reached)")
        return 0 if ok else 1
    ws = a.workspace or locate.default_workspace()
    dirs: list[Path] = []
    for j in a.jobs:
        try:
            found = locate.find(j, ws)
        except InputError as e:
            return fail(str(e))
        if found.dir is None:
            return fail(f"{j}: no job directory (the monitor keeps its state there)")
        dirs.append(found.dir)
    if a.status:
        try:
            mine = sorted(p for _, p in jobdir.listing(ws) if p.is_dir() and p.stat().st_uid == os.geteuid())
        except OSError:
            mine = []
        return status(dirs if dirs else mine)
    try:  # a job whose directory is not ours alone is refused before anything is started
        for d in dirs:
            store.Dir.open(d).close()
        home = monitor_home(a, ws, dirs)
    except UntrustedPath as e:
        return fail(str(e))
    if a.stop:
        return stop(home)
    notifier = None
    if not a.no_notify:
        path = a.notify_config or notify.default_config_path()
        if a.notify_config or path.exists():
            try:
                notifier = notify.load(path)
            except notify.NotifyConfigError as e:
                return fail(str(e))
    if a.detach:
        return detach(argv, home)
    mon = Monitor(a, ws, notifier)
    say(
        f"monitor pid {os.getpid()}: {len(dirs) or 'all'} job(s), every {a.interval:g} s; notifications: "
        + (", ".join(notifier.destinations()) if notifier else "none (log and events.jsonl only)")
    )
    for d in dirs:
        mon.add(d)
    return mon.run()


__all__ = ["main", "utc"]
