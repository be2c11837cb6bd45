"""One watched job: what happened since the last poll, as events (docs/job-monitor.md).

`Watch.poll(now, state)` reads what the job log gained (joblog.Follower, the one parser of the
log) and the scheduler's state, and returns the new events; every event has a key that is sent
once, and the watch's state (log offset, step statistics, keys already sent) is saved in
<job dir>/monitor/state.json, so a restarted monitor goes on where it stopped, without repeats.
The job directory, its monitor/ and the log are used only while they are ours to trust (store.py,
utils/trust.py); otherwise the watch stops with one `untrusted` event naming the path.
The rules (hang by step progress, slowdown against the job's own steady step time, with checkpoint
saves and evals left out) are in `Rules` and `_check_*`; triage is asked once the job has ended.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import statistics
import time
from pathlib import Path
from typing import BinaryIO

import joblog
from diagnosis import cli, jobdir, locate, runs, triage
from monitor import store
from trust import UntrustedPath

ENDED_GRACE = 60.0  # seconds to wait for the JOB SUMMARY once Slurm says the job has ended
REQUEUED_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}  # after a JOB SUMMARY: requeued
RECENT = 50  # step times kept for the hang threshold and the slowdown window
FIRST_STEP_FACTOR = 3.0  # a run's job: no first step for 3 x the longest start-up of its earlier jobs ...
FIRST_STEP_FLOOR = 120.0  # ... and at least this many seconds
STEADY = 200  # steady step times kept for the job's own reference


@dataclasses.dataclass
class Rules:
    """When the monitor speaks (utils/job_monitor.py's options)."""

    hang_factor: float = 10.0  # hung: no step for FACTOR x the median recent step time ...
    hang_floor: float = 45.0  # ... and at least this many seconds
    pause_grace: float = 600.0  # after a checkpoint save or eval line: at least this long
    slowdown: float = 0.6  # slow: throughput under this fraction of the job's steady value
    window: int = 20  # steps in the rolling median of the slowdown rule
    warmup: int = joblog.WARMUP_STEPS  # first steps left out (compilation, first data)
    milestones: tuple[int, ...] = (25, 50, 75)  # percent of the planned steps
    # no first step this long after the job started: stuck before training (distributed init,
    # compilation, a checkpoint's restore). A job of a run whose earlier jobs reached a step takes
    # FIRST_STEP_FACTOR x their longest start-up instead (at least FIRST_STEP_FLOOR).
    first_step_limit: float = 1800.0


@dataclasses.dataclass
class Event:
    """One thing to tell: kind (queued, running, first_step, milestone, hang, resumed, slowdown,
    recovered, requeued, alert, alert_resolved, completed, failed, cancelled, recovery, ...), level (info,
    success, warning, failure), a one-line title and the evidence lines."""

    key: str
    kind: str
    level: str
    title: str
    lines: list[str]
    data: dict = dataclasses.field(default_factory=dict)
    at: float = 0.0

    def record(self) -> dict:
        return {"at": utc(self.at), **{k: v for k, v in dataclasses.asdict(self).items() if k != "at"}}


def utc(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def span(seconds: float) -> str:
    s = int(round(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Watch:
    """One job, by its directory: state in <job dir>/monitor/. Raises trust.UntrustedPath when the
    job directory, monitor/ or the state in it is not ours to trust."""

    def __init__(self, job_dir: Path, rules: Rules, home: str = "monitor") -> None:
        """home: the directory in the job directory for the watch's state and events (the in-job watchdog
        of a continuing run keeps its own, utils/run_next.py watch)."""
        self.dir = job_dir
        self.rules = rules
        self.jd = store.Dir.open(job_dir)
        try:
            self.home = self.jd.sub(home, f"the {home} directory")
        except BaseException:
            self.jd.close()
            raise
        self.name = job_dir.name
        self.job_id = locate.job_id_of(self.name) or ""
        self.refused: str | None = None  # why the watch stopped: a path not ours to trust
        self.log_ident: tuple[int, int] | None = None  # the log first read: never another file
        self.s: dict = {
            "job_id": self.job_id,
            "offset": 0,
            "sent": [],
            "phase": "submitted",
            "host": None,
            "last_step": None,
            "first_step": None,
            "last_progress": None,
            "first_step_at": None,
            "running_at": None,
            "recent": [],
            "steady": [],
            "window": [],
            "pause_step": None,
            "pause_at": None,
            "slow": False,
            "slow_episodes": 0,
            "ended_seen": None,
            "summary_seen": False,
            "summary_at": None,
            "run_next": [],  # a continuing run's lines of the job's last run (joblog.run_next_decision)
            "header": {},
        }
        try:
            saved = self.home.read_json("state.json", "the monitor state")  # None: a damaged state, start over
        except BaseException:
            self.close()
            raise
        if isinstance(saved, dict):
            if saved.get("job_id") not in (None, self.job_id):
                self.close()
                raise UntrustedPath(
                    f"refusing the monitor state {self.home.path}/state.json: it is job {saved.get('job_id')}'s, "
                    f"not job {self.job_id}'s (a job directory moved?)"
                )
            self.s.update(saved)
        self.follower: joblog.Follower | None = None

    def close(self) -> None:
        self.home.close()
        self.jd.close()

    # --- state --------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        return self.s["phase"] == "ended" or self.refused is not None

    def save(self) -> None:
        if self.follower is not None:
            self.s["offset"] = self.follower.offset
        self.home.write_json("state.json", self.s)

    def emit(self, out: list[Event], ev: Event) -> None:
        """Queue ev unless its key was sent before (also by an earlier monitor)."""
        if ev.key in self.s["sent"]:
            return
        self.s["sent"].append(ev.key)
        ev.data.setdefault("job_id", self.job_id)
        ev.data.setdefault("job", self.name)
        out.append(ev)
        self.home.append("events.jsonl", "the monitor's events", (json.dumps(ev.record()) + "\n").encode())

    def log_path(self) -> Path | None:
        return locate.log_of(self.dir)

    def open_log(self, log: Path) -> BinaryIO:
        """The job log, opened only when it is ours, a regular file that nobody else can write,
        and the same file as at the first read (FileNotFoundError before it exists)."""
        fd = store.open_file(log, "the job log", log)
        if fd is None:
            raise FileNotFoundError(log)
        st = os.fstat(fd)
        if self.log_ident is None:
            self.log_ident = (st.st_dev, st.st_ino)
        elif (st.st_dev, st.st_ino) != self.log_ident:
            os.close(fd)
            raise UntrustedPath(
                f"refusing the job log {log}: it was replaced by another file since the monitor first read it"
            )
        return os.fdopen(fd, "rb")

    def triage(self, now: float, scheduler: bool) -> dict:
        """Triage's report on the trusted log and job directory, read through descriptors that were
        checked (a path swapped meanwhile cannot feed it another file)."""
        log = self.log_path()
        if log is None:
            raise FileNotFoundError(f"{self.dir} has no log yet")
        with self.open_log(log) as f:
            proc = f"/proc/self/fd/{f.fileno()}"
            rep = triage.Triage(Path(proc), self.jd.proc, triage.Options(now=now, scheduler=scheduler)).report()
        names = {str(self.jd.proc): str(self.dir), proc: str(log)}
        text = re.sub(r"/proc/self/fd/\d+", lambda m: names.get(m.group(0), m.group(0)), json.dumps(rep))
        return json.loads(text)

    # --- one poll -----------------------------------------------------------------------
    def poll(self, now: float, sched: str | None) -> list[Event]:
        """New events; sched is Slurm's JobState (None when unknown: no Slurm, id forgotten). A path
        not ours to trust stops the watch: one `untrusted` event, nothing acted on after it."""
        out: list[Event] = []
        if self.ended:
            return out
        try:
            self.jd.verify()
            self._poll(now, sched, out)
        except UntrustedPath as e:
            self.stop(str(e), now, out)
        return out

    def stop(self, why: str, now: float, out: list[Event]) -> None:
        """Stop acting on this job because of ``why`` (a trust refusal): one event, kept in the
        monitor's own directory (held open: the path may be someone else's by now)."""
        self.refused = why
        ev = Event(
            f"untrusted:{hashlib.sha256(why.encode()).hexdigest()[:12]}",  # told once per reason
            "untrusted",
            "failure",
            "stopped watching: a path is not trusted (nothing resubmitted)",
            [why],
            at=now,
        )
        try:
            self.emit(out, ev)
            self.save()
        except (OSError, UntrustedPath):
            out.append(ev)

    def _poll(self, now: float, sched: str | None, out: list[Event]) -> None:
        s = self.s
        if sched == "PENDING":
            self.emit(out, Event("queued", "queued", "info", "queued", [f"Slurm state {sched}"], at=now))
        log = self.log_path()
        if log is not None and self.follower is None:
            self.follower = joblog.Follower(log, s["offset"], self.open_log)
        if sched == "RUNNING" or (self.follower is not None and log is not None and log.exists()):
            if s["running_at"] is None:
                s["running_at"] = now
                s["phase"] = "running"
            self.emit(out, Event("running", "running", "info", "running", [f"log: {log}"], at=now))
        if self.follower is not None:
            ticks = self.follower.read()
            self._header(ticks, log)
            self._ticks(ticks, now, out)
            self._header(ticks, log)  # a requeued job's new run cleared it
        ended = sched is not None and sched not in triage.RUNNING_STATES
        if ended and s["ended_seen"] is None:
            s["ended_seen"] = now
        if s["summary_seen"] and sched in REQUEUED_STATES:
            self._requeued(now, sched, out)  # Slurm queued it again: its next run goes on in the same log
        elif s["summary_seen"] and (self._deciding(now) or self._settling(now, sched)):
            pass  # its decision (a continuing run's) or Slurm's word on how it ended is a moment away
        elif s["summary_seen"] or (ended and now - s["ended_seen"] >= ENDED_GRACE) or sched == "GONE":
            self._end(now, sched, out)
        elif s["phase"] == "running" and s["last_step"] is not None and not ended:
            self._check_hang(now, out)
        elif s["phase"] == "running" and s["last_step"] is None and not ended:
            self._check_first_step(now, out)
        self.save()

    def _header(self, ticks: list[joblog.Tick], log: Path | None) -> None:
        """The job's JOB header (its first), once the log has lines."""
        if ticks and not self.s["header"] and log is not None:
            try:
                with self.open_log(log) as f:
                    self.s["header"] = jobdir.read_header(f)
            except FileNotFoundError:
                pass

    def _alert(self, a: joblog.Alert | None, now: float, out: list[Event]) -> None:
        """An alert of the job's Prometheus (utils/observe/alert_rules.yml) started or stopped firing:
        event `alert` (warning: the host, what it means, the query) or `alert_resolved` (info)."""
        if a is None:
            return
        fired = self.s.setdefault("alerts", {})
        key = f"{a.name}:{a.host}"
        if a.state == "firing":
            fired[key] = fired.get(key, 0) + 1
            lines = [a.summary or "", f"query: {a.query}" if a.query else "",
                     f"then: utils/diagnose.py {self.dir} (its {a.check} check reads the same signal)"]  # fmt: skip
            data = {"alert": a.name, "host": a.host, "check": a.check, "value": a.value, "query": a.query}
            ev = Event(f"alert:{key}:{fired[key]}", "alert", "warning", f"{a.name} on {a.host}",
                       [x for x in lines if x], data, now)  # fmt: skip
        else:
            ev = Event(f"alert_resolved:{key}:{fired.get(key, 0)}", "alert_resolved", "info",
                       f"{a.name} on {a.host} resolved after {a.seconds} s", [], {"alert": a.name, "host": a.host,
                       "check": a.check, "seconds": a.seconds}, now)  # fmt: skip
        self.emit(out, ev)

    def _ticks(self, ticks: list[joblog.Tick], now: float, out: list[Event]) -> None:
        s, r = self.s, self.rules
        for t in ticks:
            if t.kind == "summary":
                s["summary_seen"] = True
                s["summary_at"] = s.get("summary_at") or now
            elif t.kind == "run_next" and t.text is not None:
                s["run_next"] = [*s.get("run_next", []), t.text][-20:]
            elif t.kind == "alert" and t.text is not None:
                self._alert(joblog.alert(t.text), now, out)
            elif t.kind in ("save", "eval"):
                s["pause_step"], s["pause_at"] = t.step, now
            elif t.kind == "header" and (s.get("run_next") or s["summary_seen"]):  # a requeued job's next run
                s.update(run_next=[], summary_seen=False, summary_at=None, requeue_told=False)
                if s["last_step"] is not None:
                    s.update(last_step=None, host=None, recent=[], window=[], steady=[], slow=False, header={})
            elif t.kind == "header" and s["last_step"] is not None:
                # a requeued job starts a new run in the same log: count its steps afresh
                s.update(last_step=None, host=None, recent=[], window=[], steady=[], slow=False, header={})
            elif t.kind == "step":
                if s["host"] is None:
                    s["host"] = t.host
                if t.host != s["host"]:
                    continue
                if s["last_step"] is not None and t.step <= s["last_step"]:
                    continue
                first = s["first_step"] is None
                s["last_step"], s["last_progress"] = t.step, now
                if first:
                    s["first_step"], s["first_step_at"] = t.step, now
                    since = now - (s["running_at"] or now)
                    self.emit(
                        out,
                        Event(
                            "first_step",
                            "first_step",
                            "info",
                            f"first step ({t.step}) after {span(since)}",
                            [
                                f"step {t.step}: {t.seconds:.3f} s"
                                + (f", loss {t.loss:.3f}" if t.loss is not None else "")
                            ],
                            {"step": t.step, "seconds_to_first_step": round(since, 1)},
                            now,
                        ),
                    )
                    if s.get("hung_at") is not None:
                        s["hung_at"] = None
                if s.get("hung_at") is not None:
                    self.emit(
                        out,
                        Event(
                            f"resumed:{s['hung_at']}",
                            "resumed",
                            "success",
                            f"steps resumed at step {t.step}",
                            [f"no step after step {s['hung_at']} for a while; now step {t.step}"],
                            {"step": t.step},
                            now,
                        ),
                    )
                    s["hung_at"] = None
                s["recent"] = (s["recent"] + [t.seconds])[-RECENT:]
                # a save or eval and the window of steps after it (an async save runs beside them)
                # count toward neither the steady value nor the slowdown window
                near_pause = s["pause_step"] is not None and s["pause_step"] - 1 <= t.step <= s["pause_step"] + r.window
                if t.tokens is not None and t.step - (s["first_step"] or 0) >= r.warmup and not near_pause:
                    s["window"] = (s.get("window", []) + [t.seconds])[-r.window :]
                    self._check_slowdown(t, now, out)
                self._milestone(t, now, out)

    def _milestone(self, t: joblog.Tick, now: float, out: list[Event]) -> None:
        total = jobdir.planned_steps(self.s["header"], self.dir)
        if not total or t.step is None:
            return
        done = t.step + 1
        for pct in self.rules.milestones:
            if done >= total * pct / 100 and done < total:
                med = statistics.median(self.s["recent"]) if self.s["recent"] else math.nan
                left = (total - done) * med
                eta = f"ETA {utc(now + left)} (in {span(left)})" if math.isfinite(left) else "ETA unknown"
                self.emit(
                    out,
                    Event(
                        f"milestone:{pct}",
                        "milestone",
                        "info",
                        f"{pct} %: step {t.step} of {total}, {eta}",
                        [f"median step time {med:.3f} s over the last {len(self.s['recent'])} steps"],
                        {
                            "percent": pct,
                            "step": t.step,
                            "steps": total,
                            "eta": utc(now + left) if math.isfinite(left) else None,
                        },
                        now,
                    ),
                )

    def _check_slowdown(self, t: joblog.Tick, now: float, out: list[Event]) -> None:
        s, r = self.s, self.rules
        if not s["slow"]:
            s["steady"] = (s["steady"] + [t.seconds])[-STEADY:]
        window = s["window"]
        if len(s["steady"]) < 2 * r.window or len(window) < r.window:
            return
        ref, cur = statistics.median(s["steady"]), statistics.median(window)
        if cur <= 0 or ref <= 0:
            return
        ratio = ref / cur  # throughput now vs steady
        if not s["slow"] and ratio < r.slowdown:
            s["slow"] = True
            s["slow_episodes"] += 1
            self.emit(
                out,
                Event(
                    f"slowdown:{s['slow_episodes']}",
                    "slowdown",
                    "warning",
                    f"slowdown: {ratio * 100:.0f} % of the job's steady throughput at step {t.step}",
                    [
                        f"median step time {cur:.3f} s over the last {r.window} steps vs {ref:.3f} s steady "
                        f"(threshold {r.slowdown * 100:.0f} %)",
                        f"find the cause: utils/triage.py {self.job_id or self.dir}; utils/diagnose.py {self.dir}",
                    ],
                    {"step": t.step, "ratio": round(ratio, 3), "step_seconds": cur, "steady_seconds": ref},
                    now,
                ),
            )
        elif s["slow"] and ratio >= min(0.9, (1 + r.slowdown) / 2):
            s["slow"] = False
            self.emit(
                out,
                Event(
                    f"recovered:{s['slow_episodes']}",
                    "recovered",
                    "success",
                    f"throughput back to {ratio * 100:.0f} % of steady at step {t.step}",
                    [f"median step time {cur:.3f} s vs {ref:.3f} s steady"],
                    {"step": t.step, "ratio": round(ratio, 3)},
                    now,
                ),
            )

    def hang_threshold(self, now: float) -> float:
        s, r = self.s, self.rules
        med = statistics.median(s["recent"]) if s["recent"] else 0.0
        limit = max(r.hang_factor * med, r.hang_floor)
        if s["pause_at"] is not None and s["pause_step"] is not None and s["pause_step"] >= (s["last_step"] or 0):
            limit = max(limit, r.pause_grace)  # saving or evaluating after the last step
        return limit

    def _check_hang(self, now: float, out: list[Event]) -> None:
        s = self.s
        quiet = now - s["last_progress"]
        limit = self.hang_threshold(now)
        if quiet < limit or s.get("hung_at") == s["last_step"]:
            return
        s["hung_at"] = s["last_step"]
        med = statistics.median(s["recent"]) if s["recent"] else math.nan
        self.emit(
            out,
            Event(
                f"hang:{s['last_step']}",
                "hang",
                "failure",
                f"hang: no step for {span(quiet)} after step {s['last_step']}",
                [
                    f"threshold {span(limit)} (max({self.rules.hang_factor:g} x median step {med:.3f} s, "
                    f"{self.rules.hang_floor:g} s)); the job is still running",
                    f"find the cause: utils/triage.py {self.job_id or self.dir}",
                ],
                {"step": s["last_step"], "quiet_seconds": round(quiet, 1), "threshold_seconds": round(limit, 1)},
                now,
            ),
        )

    def first_step_limit(self) -> tuple[float, str]:
        """(seconds, why): how long the job may run without a step, learned once from its run's
        earlier jobs (utils/run.py's start-up) when it has any that trained, else the rule's default.
        Kept once the job's header has been read (before that, the default, asked again next time)."""
        s = self.s
        if not s["header"]:
            return self.rules.first_step_limit, f"the default {span(self.rules.first_step_limit)}"
        if s.get("first_step_limit") is None:
            limit, why = self.rules.first_step_limit, f"the default {span(self.rules.first_step_limit)}"
            words = s["header"].get("run", "").split()
            if words:
                try:
                    earlier = runs.startups(words[0], self.dir.parent, before=jobdir.started(s["header"]))
                except (OSError, cli.InputError):
                    earlier = []
                if earlier:
                    limit = max(FIRST_STEP_FACTOR * max(earlier), FIRST_STEP_FLOOR)
                    why = (
                        f"{FIRST_STEP_FACTOR:g} x the longest start-up of run {words[0]}'s "
                        f"{len(earlier)} earlier job(s), {span(max(earlier))}"
                    )
            s["first_step_limit"], s["first_step_why"] = limit, why
        return s["first_step_limit"], s["first_step_why"]

    def _check_first_step(self, now: float, out: list[Event]) -> None:
        s = self.s
        started = jobdir.started(s["header"]) or s["running_at"]
        if started is None or s.get("no_first_step_told"):
            return
        limit, why = self.first_step_limit()
        quiet = now - started
        if quiet < limit:
            return
        s["no_first_step_told"] = True
        self.emit(
            out,
            Event(
                "no_first_step",
                "no_first_step",
                "failure",
                f"no first step {span(quiet)} after the start",
                [
                    f"threshold {span(limit)} ({why}); the job is still running: stuck before training "
                    "(distributed init, compilation, a checkpoint's restore)?",
                    f"find the cause: utils/triage.py {self.job_id or self.dir}",
                ],
                {"quiet_seconds": round(quiet, 1), "threshold_seconds": round(limit, 1)},
                now,
            ),
        )

    def _settling(self, now: float, sched: str | None) -> bool:
        """The JOB SUMMARY is written and Slurm still says COMPLETING (a cancel, a time limit or a
        requeue: which one shows a moment later), for at most ENDED_GRACE seconds."""
        return sched == "COMPLETING" and now - (self.s.get("summary_at") or now) < ENDED_GRACE

    def _requeued(self, now: float, sched: str, out: list[Event]) -> None:
        """Told once per requeue: the job ended a run and Slurm queued it again (preemption with requeue,
        scontrol requeue); the watch goes on with its next run (a new JOB header in the same log)."""
        s = self.s
        if s.get("requeue_told"):  # this requeue's (a new JOB header clears it)
            return
        n = int(s.get("requeues") or 0) + 1
        s["requeues"], s["requeue_told"] = n, True
        summ = self.summary()
        self.emit(
            out,
            Event(
                f"requeued:{n}",
                "requeued",
                "warning",
                f"requeued by Slurm (run {n} of the job ended: {summ.get('status') or 'no summary'})",
                [f"Slurm state {sched}: it runs again under its id, appending to its log; still watching"]
                + [f"{k}: {summ[k]}" for k in ("stage", "steps", "wall_time") if k in summ],
                {"requeues": n, "status": summ.get("status")},
                now,
            ),
        )

    def _deciding(self, now: float) -> bool:
        """A job of a continuing run (header `continue:`) that wrote its JOB SUMMARY but not yet its
        decision (its run_next line after it), for at most ENDED_GRACE seconds."""
        s = self.s
        if not (s["header"] or {}).get("continue") or joblog.run_next_end(s.get("run_next") or []):
            return False
        return now - (s.get("summary_at") or now) < ENDED_GRACE

    def _run_end(self, rep: dict, kind: str, level: str, title: str, lines: list[str]) -> tuple[str, str, dict]:
        """For a job of a run (--run): what its run does now. A continuing run's decision (its run_next
        line) goes into the lines; when the run goes on, the title says so and the next job's directory is
        in the data (the monitor watches it next); when it does not, the run's accounting (utils/run.py)
        is added. Returns (level, title, data)."""
        alias = ((self.s["header"] or {}).get("run") or "").split()[:1]
        if not alias:
            return level, title, {}
        alias = alias[0]
        said = self.s.get("run_next") or []
        decision = joblog.run_next_end(said)
        data: dict = {"alias": alias}
        stopped = [x for x in said if joblog.run_next_decision(x)[0] == "watchdog"]
        if stopped:  # the job's own watchdog stopped it (a hang or no first step): why, before what came of it
            lines.append(f"run_next: {stopped[-1]}")
            data["watchdog"] = stopped[-1]
        if decision:
            what, job_id = joblog.run_next_decision(decision)
            lines.append(f"run_next: {decision}")
            data["decision"], data["decision_text"] = what, decision
            if what == "goes_on" and job_id:
                data["next_job_id"] = job_id
                try:
                    nxt = jobdir.parse_next(self.jd.read(jobdir.NEXT, "the next job's record", limit=512))
                except OSError:
                    nxt = None
                if nxt and nxt[0] == job_id:
                    data["next_job_dir"] = str(self.dir.parent / nxt[1])
                status = self.summary().get("status") or rep.get("status")
                level = "info" if status in ("timeout", "completed") else "warning"  # a time limit: as planned
                return level, f"{title}; run {alias} goes on as job {job_id}", data
        try:
            acct = runs.account(alias, self.dir.parent)
        except Exception as e:  # noqa: BLE001 - the end is told even when the run cannot be accounted
            lines.append(f"run {alias}: no accounting ({e})")
            return level, title, data
        text = runs.render(acct).splitlines()
        lines += text[:3]
        data["accounting"] = {k: acct[k] for k in ("planned_steps", "highest_step", "done", "goodput", "node_seconds")}
        data["accounting"]["jobs"] = [j["id"] for j in acct["jobs"]]
        if acct["done"]:
            return "success", f"{title}; run {alias} is done", data
        if decision:
            return level, f"{title}; run {alias} stops", data
        return level, title, data

    def _end(self, now: float, sched: str | None, out: list[Event]) -> None:
        s = self.s
        s["phase"] = "ended"
        try:
            rep = self.triage(now, scheduler=False)
        except UntrustedPath:
            raise
        except Exception as e:  # noqa: BLE001 - the end is told even when triage cannot read the log
            rep = {"status": "failed" if sched != "COMPLETED" else "completed", "summary": f"triage failed: {e}"}
        status = rep.get("status") or "unknown"
        kind = {"completed": "completed", "cancelled": "cancelled"}.get(status, "failed")
        level = {"completed": "success", "cancelled": "warning"}.get(kind, "failure")
        lines = [rep.get("summary") or status]
        summ = self.summary()
        if kind == "completed":
            prog = rep.get("progress") or {}
            tgs = rep.get("tgs") or {}
            lines += [f"{k}: {summ[k]}" for k in ("wall_time", "nodes") if k in summ]
            if prog.get("last_step") is not None:
                lines.append(
                    f"last step {prog['last_step']}" + (f" of {prog['total_steps']}" if prog.get("total_steps") else "")
                )
            if tgs.get("steady"):
                lines.append(f"steady Tokens/s/device {tgs['steady']:.1f}")
        else:
            keys = ("stage", "steps", "failed_nodes", "first_failure", "first_error")
            lines += [f"{k}: {summ[k]}" for k in keys if k in summ]
            if rep.get("culprit_hosts"):
                lines.append(f"culprit hosts: {' '.join(rep['culprit_hosts'])}")
            ev = next((e for e in rep.get("evidence") or [] if e.get("text")), None)
            if ev:
                lines.append(f"evidence: {ev.get('host') or ''} {ev['text'][:300]}".replace("  ", " "))
        title = {
            "completed": "completed",
            "cancelled": "cancelled",
        }.get(kind, f"failed: {rep.get('failure_class') or 'unclassified'}")
        level, title, run = self._run_end(rep, kind, level, title, lines)
        self.emit(
            out,
            Event(
                "end",
                kind,
                level,
                title,
                lines,
                {
                    "status": status,
                    "failure_class": rep.get("failure_class"),
                    "culprit_hosts": rep.get("culprit_hosts") or [],
                    "summary": summ,
                    **({"run": run} if run else {}),
                },
                now,
            ),
        )
        self.report = rep

    report: dict | None = None

    def summary(self) -> dict[str, str]:
        """The JOB SUMMARY's fields (summary.txt in the job dir, a file of ours that nobody else can
        write), {} before the job wrote it."""
        try:
            data = self.jd.read(jobdir.SUMMARY, "the job summary", limit=jobdir.SUMMARY_LIMIT)
        except OSError:
            return {}
        if data is None:
            return {}
        return jobdir.parse_summary(data)
