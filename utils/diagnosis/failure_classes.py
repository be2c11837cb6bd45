"""The failure classes of utils/triage.py, one entry each: how a class is detected (a per-host
detector and its priority, or a job-level detector and its place in the decision order), the
summary it explains itself with, the next steps it proposes (templated with the job and its
culprits), the evidence it cites, and the words the docs use for it.
utils/triage.py decides from this table; the failure-class tables of docs/triage.md and
skills/job-log-triage/reference.md are generated from it by utils/dev/failure_class_tables.py
(tests/test_triage.py fails when they differ).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import joblog

if TYPE_CHECKING:  # the detectors read the job through triage's analysis object
    from diagnosis.triage import Host, Triage

REPO = Path(__file__).resolve().parents[2]


# The log's texts (signatures, what an exception line means) are read by utils/joblog.py;
# the detectors below decide from the kinds it gives.
def first_exception(h: Host, kind: str) -> joblog.Event | None:
    """The host's first exception line of this kind (joblog.exception_kind)."""
    return next((x for x in h.events if x.kind == "exception" and joblog.exception_kind(x.text) == kind), None)


# --- per-host detectors: (found, the event that shows it or None) --------------------------
Found = tuple[bool, "joblog.Event | None"]


def on_host_config_error(h: Host) -> Found:
    e = h.first("config_error") or first_exception(h, "config_error")
    return e is not None, e


def on_host_gpu_health(h: Host) -> Found:
    e = h.first("gpu_health")
    return e is not None, e


def on_host_nan_loss(h: Host) -> Found:
    e = h.first("nan_loss")
    return e is not None, e


def on_host_oom_device(h: Host) -> Found:
    e = h.first("oom_device") or first_exception(h, "oom_device")
    return e is not None, e


def on_host_gpu_error(h: Host) -> Found:
    e = h.first("gpu_error") or first_exception(h, "gpu_error")
    return e is not None, e


def on_host_oom_host(h: Host) -> Found:
    e = h.first("oom_host")
    return e is not None, e


def on_host_segfault(h: Host) -> Found:
    e = h.first("segfault", "fatal")
    notice = h.first("death_notice")
    if e is not None and notice is not None and e.line > notice.line and joblog.is_abort(e.text):
        e = None  # the abort that JAX's death notice (an absl fatal) ends in: a consequence
    if e is None and h.exit == 139 and h.reason != "stopped":
        return True, None
    return e is not None, e


def on_host_python_exception(h: Host) -> Found:
    e = first_exception(h, "python_exception")
    return e is not None, e


def on_host_killed(h: Host) -> Found:
    if h.exit == 137 and h.reason == "exit":
        return True, h.first("killed")
    return False, None


def on_host_stage_timeout(h: Host) -> Found:
    e = h.first("stage_timeout")
    return h.reason == "timeout" or e is not None, e


# --- job-level detectors: (class, culprits, summary, confidence) or None --------------------
Verdict = tuple[str | None, list[str], str, str | None]


def on_job_heartbeat(t: Triage, status: str) -> Verdict | None:
    """JAX's coordination service claimed tasks dead: were they (heartbeat_timeout) or not?"""
    claim = joblog.heartbeat_claim(t.scan)
    if claim is None:
        return None
    t_claim = claim.time
    accused = [t.hosts[n] for n in claim.hosts if n in t.hosts]
    t.cite_event(claim.first, HB_CLAIM)
    if not accused:
        return "heartbeat_timeout", [], explain("heartbeat_timeout", "unmapped", tasks=claim.tasks), "medium"
    alive = []
    for h in accused:
        later = t_claim is not None and h.last_step_ts is not None and h.last_step_ts > t_claim
        notice = next(
            (e for e in h.events if e.kind == "death_notice" and (t_claim is None or e.ts is None or e.ts >= t_claim)),
            None,
        )
        if later:
            t.cite_last_step(h, "the accused host logged a step after the claimed time")
        if notice:
            t.cite_event(notice, "the accused host logged its own death notice")
        if later or notice:
            alive.append(h)
    names = [h.name for h in accused]
    t.accused_hosts = names
    if len(alive) == len(accused):  # the accused were healthy: no culprit; look at the coordinator
        t.suspect_hosts = [claim.coordinator] if claim.coordinator else []
        return (
            "heartbeat_false_positive",
            [],
            explain(
                "heartbeat_false_positive",
                accused=", ".join(names),
                they="they" if len(names) > 1 else "it",
                coordinator=claim.coordinator,
            ),
            "high",
        )
    dead = [h for h in accused if h not in alive]
    t.suspect_hosts = [h.name for h in dead]
    for h in dead:
        t.cite_last_step(h, "the accused host's last step")
        t.cite_record(h, "exit record")
    return (
        "heartbeat_timeout",
        [h.name for h in dead],
        explain("heartbeat_timeout", hosts=", ".join(h.name for h in dead)),
        "medium",
    )


def lost_hosts(t: Triage, status: str) -> list[Host]:
    """Nodes that vanished: named by a node-failure notice, or without an exit record once the
    stage ended (JOB SUMMARY's no_exit_record, or Slurm NODE_FAIL)."""
    s = t.scan
    names = {e.host for e in s.events if e.kind == "node_failure" and e.host}
    # a stop request (scancel, time limit) can end a node's stage before it records its exit:
    # then a missing record alone is no node failure
    stopped = (
        s.summary.get("status") in ("cancelled", "timeout")
        or any(e.kind == "cancel" and e.data.get("level") == "job" for e in s.events)
        or t.sched in ("CANCELLED", "PREEMPTED", "TIMEOUT")
    )
    if not stopped or names or t.sched == "NODE_FAIL":
        names |= set(s.summary.get("no_exit_record", "").split())
    if t.sched == "NODE_FAIL" or any(e.kind == "node_failure" and not e.host for e in s.events):
        recs = t.records.get(t.stage or "", {})
        if recs:
            names |= {n for n in s.nodes() if n not in recs}
    return [t.hosts[n] for n in names if n in t.hosts]


def on_job_node_failure(t: Triage, status: str) -> Verdict | None:
    lost = lost_hosts(t, status)
    if not lost:
        return None
    for h in lost:
        t.cite_event(h.first("node_failure"), "node lost")
        t.cite_last_step(h, "its last step")
    t.cite_summary("no_exit_record", "no exit record from these nodes")
    names = [h.name for h in lost]
    return "node_failure", names, explain("node_failure", hosts=", ".join(names)), "medium"


def reports_collective(h: Host) -> bool:
    return h.first("collective") is not None or first_exception(h, "collective") is not None


def on_job_collective(t: Triage, status: str) -> Verdict | None:
    """Survivors report a failed collective: blame the peer that stopped first."""
    reporters = [h for h in t.hosts.values() if reports_collective(h)]
    if not reporters:
        return None
    for h in reporters[:2]:
        t.cite_event(h.first("collective"), "collective error reported by a survivor")
    peers = [h for h in t.hosts.values() if h not in reporters]
    pool = peers or list(t.hosts.values())

    def key(h: Host) -> tuple:
        gone = h.exit is None and h.record is None
        return (
            0 if h.exit not in (None, 0, 143) else 1,
            h.last_step if h.last_step is not None else -1,
            h.last_step_ts or h.last_ts or math.inf,
            0 if gone else 1,
        )

    ordered = sorted(pool, key=key)
    culprit = ordered[0]
    unique = len(ordered) == 1 or key(ordered[0])[:2] != key(ordered[1])[:2]
    t.cite_last_step(culprit, "the peer's last step (it stopped first)")
    t.cite_record(culprit, "exit record")
    conf = "medium" if peers and unique else "low"
    return (
        "collective_error",
        [culprit.name] if unique or peers else [],
        explain(
            "collective_error",
            reporters=", ".join(h.name for h in reporters),
            culprit=culprit.name,
            how="stopped printing first" if peers else "is behind the others",
        ),
        conf,
    )


def _job_stops(t: Triage) -> list[joblog.Event]:
    return [e for e in t.scan.events if e.kind == "cancel" and e.data.get("level") == "job"]


def on_job_time_limit(t: Triage, status: str) -> Verdict | None:
    limit = [e for e in _job_stops(t) if e.data.get("due_to") == "TIME LIMIT"]
    if not (t.scan.summary.get("status") in ("stage_timeout", "timeout") or t.sched == "TIMEOUT" or limit):
        return None
    t.cite_event(limit[0] if limit else None, "Slurm's time limit")
    t.cite_summary("status", "the job summary")
    return "stage_timeout", t.laggards(), explain("stage_timeout", "slurm"), "high"


def on_job_cancelled(t: Triage, status: str) -> Verdict | None:
    cancels = _job_stops(t)
    if not (status == "cancelled" or cancels or t.sched in ("CANCELLED", "PREEMPTED")):
        return None
    preempted = t.sched == "PREEMPTED" or any(e.data.get("due_to") == "PREEMPTION" for e in cancels)
    for e in cancels[:2]:
        t.cite_event(e, "the stop request")
    t.cite_summary("status", "the job summary")
    how = "preempted by the scheduler" if preempted else "cancelled (scancel or a stop signal)"
    return "cancelled", [], explain("cancelled", how=how), "high"


NO_STEPS_STOP = "where a node's output stops (its last line before the JOB SUMMARY)"


def on_job_no_steps(t: Triage, status: str) -> Verdict | None:
    """A job that ended `completed` (every node exited 0) without a single step line in its log's last
    run: it trained nothing that reached the log. Never a healthy job; only for status completed."""
    if status != "completed" or t.scan.steps.step:
        return None
    tail = joblog.last_lines(t.scan)
    for line, text in tail:
        t.cite(line, text, NO_STEPS_STOP, joblog.split_host(text, set(t.scan.nodes()) or None)[0])
    t.cite_summary("steps", "the job summary found no step line")
    t.cite_summary("status", "the job summary says completed")
    where = f"; the nodes' output stops at line {tail[-1][0]}: {tail[-1][1][:160]!r}" if tail else ""
    return "no_steps", [], explain("no_steps", where=where), "high"


# --- next steps ---------------------------------------------------------------------------
@dataclasses.dataclass
class Job:
    """What a class's next steps are templated with."""

    log: str  # the log path, shell-quoted
    job_id: str
    scheduler: str | None  # the header's scheduler: slurm, local, ...
    status: str
    culprits: list[str]
    command: str | None  # the job's submit command (artifact/.submit/command.txt)
    resubmit: str | None  # the JOB SUMMARY's resubmit: line (that command without the bad nodes)
    job_dir: Path | None
    coordinator: str  # node rank 0

    @property
    def slurm(self) -> bool:
        return self.scheduler == "slurm"

    @property
    def first(self) -> str | None:
        return self.culprits[0] if self.culprits else None

    def show_node(self) -> str:
        return f"scontrol show node {self.first}; " if self.slurm and self.first else ""


TRAINER = "$(pgrep -f maxtext.trainers.pre_train.train | head -1)"


def steps_oom_host(j: Job) -> list[str]:
    dmesg = "dmesg -T | grep -i -E 'out of memory|killed process|oom'"
    out = [(dmesg if j.scheduler == "local" else f'ssh {j.first or "HOST"} "{dmesg}"') + "   # confirm the OOM killer"]
    if j.slurm:
        out.append(f"sacct -j {j.job_id} -o JobID,State,ExitCode,MaxRSS,MaxRSSNode   # peak host memory per step")
    out.append(
        "lower host memory use (smaller per_device_batch_size, fewer data-loader workers) and rerun"
        + (f": {j.command}" if j.command else "")
    )
    return out


def steps_nan_loss(j: Job) -> list[str]:
    return [
        f"grep -a -n -m3 -E 'loss: (nan|-?inf)' {j.log}   # the first steps whose loss is not a number",
        f"grep -a -n -B2 -m1 -E 'loss: (nan|-?inf)' {j.log}   # the loss just before (rising: divergence; "
        "finite and flat: one bad batch or an overflow)",
        "rerun with a lower learning_rate or a longer warm-up (warmup_steps_fraction), and check the data"
        + (f": {j.command} learning_rate=<smaller>" if j.command else ""),
    ]


def steps_oom_device(j: Job) -> list[str]:
    return [
        "rerun with a smaller per_device_batch_size or stronger rematerialisation (remat_policy=full)"
        + (f": {j.command} per_device_batch_size=<smaller>" if j.command else "")
    ]


def steps_segfault(j: Job) -> list[str]:
    """The job's core files (ENABLE_COREDUMPS=1) opened the way skills/coredump-debug says, else how to get one."""
    cores = core_files(j.job_dir, j.first) if j.job_dir else []
    if not cores:
        where = f"{shlex.quote(str(j.job_dir))}/cores/{j.first or '*'}" if j.job_dir else "<job dir>/cores/<host>"
        return [
            f"ls -la {where}   # core dumps (ENABLE_COREDUMPS=1)",
            "no core: rerun with ENABLE_COREDUMPS=1 and follow skills/coredump-debug/SKILL.md",
        ]
    core = cores[0]
    spy = Path(sys.prefix) / "bin" / "py-spy"
    python = core_python(core.parent) or "<the python in context.txt>"
    q = shlex.quote
    return [
        f"cat {q(str(core.parent / 'context.txt'))}   # the binaries and versions that read this core",
        f"{q(str(spy))} dump --core {q(str(core))}   # the Python stack of every thread",
        f"gdb -batch -ex 'thread apply all bt' {q(python)} {q(str(core))}   # the native stacks",
        "follow skills/coredump-debug/SKILL.md for the rest (containers: gdb inside the same image)",
    ]


def core_files(job_dir: Path, host: str | None) -> list[Path]:
    """Core files under JOB_DIR/cores/HOST (every host when None), newest first."""
    found = [p for p in (job_dir / "cores").glob(f"{host or '*'}/core*") if p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def core_python(core_dir: Path) -> str | None:
    """The trainer's interpreter that utils/launch/coredump.sh recorded in context.txt."""
    try:
        lines = (core_dir / "context.txt").read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((ln.split(": ", 1)[1] for ln in lines if ln.startswith("python: ") and ln[8:].strip()), None)


def steps_python_exception(j: Job) -> list[str]:
    return [f"grep -a -n -B30 -m1 'Traceback' {j.log}   # the full traceback"]


def steps_config_error(j: Job) -> list[str]:
    return [
        "fix the override named in the error (spelling, or a key MaxText does not have) and resubmit"
        + (f"; the job ran: {j.command}" if j.command else "")
    ]


def steps_collective_error(j: Job) -> list[str]:
    return [
        f"check {j.first or 'the peer'}: {j.show_node()}dmesg, GPU/NIC errors; "
        "rerun with _env_NCCL_DEBUG=INFO for NCCL/RCCL details"
    ]


def steps_heartbeat_timeout(j: Job) -> list[str]:
    return [
        f"check why {j.first or 'the host'} stopped: {j.show_node()}dmesg (OOM, GPU Xid), its last lines in the log"
    ]


def steps_heartbeat_false_positive(j: Job) -> list[str]:
    return [
        f"inspect the coordinator host {j.coordinator} (CPU starvation, network) around the claim time; "
        "consider a longer jax.distributed heartbeat timeout (heartbeat_timeout_seconds)"
    ]


def steps_hang(j: Job) -> list[str]:
    if j.status not in ("running", "hung"):
        return [
            "the processes are gone: if it hangs again, triage it while it hangs and collect stacks "
            "(py-spy dump on each node) before cancelling"
        ]
    if j.slurm:
        return [
            f"srun --jobid {j.job_id} --overlap -w {j.first or '<host>'} py-spy dump --pid {TRAINER}"
            "   # where each rank is stuck",
            f"scancel {j.job_id}   # once stacks are collected",
        ]
    return [f"py-spy dump --pid {TRAINER}   # where it is stuck"]


def steps_stage_timeout(j: Job) -> list[str]:
    return [
        "if training was still progressing, raise the limit: STAGE_TIMEOUTS=train:<seconds> "
        + (j.command or "submit.sh ...")
    ]


def steps_cancelled(j: Job) -> list[str]:
    return [f"sacct -j {j.job_id} -o JobID,State,ExitCode,Start,End   # who/what ended it"] if j.slurm else []


def steps_gpu_health(j: Job) -> list[str]:
    hosts = ",".join(j.culprits) or "<host>"
    out = [f"grep -a -E '^({hosts.replace(',', '|')}): gpu_health: ' {j.log}   # each GPU's line and the verdict"]
    if j.resubmit:
        out.append(f"resubmit without the bad nodes: {j.resubmit}")
    elif j.slurm:
        out.append(f"resubmit without the bad nodes: {j.command or 'submit.sh MODEL'} (add --exclude={hosts})")
    if j.slurm:
        out.append(f"scontrol show node {hosts}   # tell the admins: a GPU reset, a cleanup or a drain")
    return out


def steps_gpu_error(j: Job) -> list[str]:
    host = j.first or "HOST"
    check = "dmesg -T | grep -a -E 'NVRM: Xid|amdgpu.*(RAS|uncorrectable|GPU reset)'"
    out = [
        (check if j.scheduler == "local" else f'ssh {host} "{check}"') + "   # the kernel's GPU error events",
        (
            "nvidia-smi -q -d ECC,ROW_REMAPPER   # NVIDIA: uncorrectable ECC errors, rows pending remapping; "
            "AMD: amd-smi metric --ecc"
        ),
    ]
    if j.resubmit:
        out.append(f"resubmit without the node: {j.resubmit}")
    elif j.slurm:
        out.append(f"resubmit without the node: {j.command or 'submit.sh MODEL'} (add --exclude={host})")
    if j.slurm:
        out.append(f"scontrol show node {host}   # tell the admins: a GPU reset, a drain or a repair")
    return out


def steps_node_failure(j: Job) -> list[str]:
    if not j.slurm:
        return []
    return [
        f"scontrol show node {j.first or '<host>'}; sinfo -R   # the node's state and reason",
        f"resubmit without it: {j.command or 'submit.sh MODEL'} (add --exclude={','.join(j.culprits) or '<host>'})",
    ]


def steps_no_steps(j: Job) -> list[str]:
    return [
        f"grep -a -n -E '^[^ :]+: ' {j.log} | tail -20   # what the nodes printed last: where the log stops",
        "if it stops in MaxText's config dump (`Config param ...`, perhaps cut at 4096 characters), the node's "
        "log path dropped lines (a long line through mawk -W interactive, Ubuntu 24.04): rerun with "
        "log_config=false to confirm" + (f": {j.command} log_config=false" if j.command else ""),
        "check where the trainer's output goes: steps= and log_period in the overrides and the config, "
        "and the trainer's stderr (run it by hand: ./run_local.sh MODEL -- steps=5)",
    ]


# --- the table ----------------------------------------------------------------------------
TSDB = "[tsdb-diagnosis](../tsdb-diagnosis/SKILL.md)"
SWEEP = "[batch-sweep](../batch-sweep/SKILL.md)"
# what a per-host root cause cites, decisive first (the class's own first line is added in front); a
# heartbeat claim is cited too when there is one (it comes after the root cause: a consequence)
HB_CLAIM = "the coordination service's claim"
ROOT_CITES = (
    "exit record of the first node that failed",
    "the culprit's last step",
    "first node to fail (job summary)",
    "a survivor's collective error (consequence)",
    HB_CLAIM,
)


@dataclasses.dataclass(frozen=True)
class FailureClass:
    """One failure class. Per-host root causes have `priority` (1 wins) and `on_host`; classes
    decided for the whole job have `rule` (their place in docs/triage.md's decision order) and,
    except hang (decided from the step times in triage.py), `on_job`."""

    name: str
    summary: dict[str, str]  # variant -> explanation template (str.format)
    next_steps: Callable[[Job], list[str]]
    cites: tuple[str, ...]  # the `why` of each evidence item it can cite
    decided_by: str  # skill table: what decides it (markdown)
    culprit: str  # skill table: who is blamed
    check_next: str  # skill table: what to check, which skill takes over
    rule: int = 1
    priority: int | None = None
    on_host: Callable[[Host], Found] | None = None
    on_job: Callable[[Triage, str], Verdict | None] | None = None
    host_evidence: str = ""  # docs table: the evidence on the culprit host
    reported_as: str | None = None  # a root cause reported under another class
    doc_label: str = ""  # docs table: its name, when it is no class of its own
    metrics_why: str = ""  # why the job's metrics are worth a look


REGISTRY: tuple[FailureClass, ...] = (
    FailureClass(
        "config_error",
        priority=1,
        on_host=on_host_config_error,
        summary={"": "MaxText rejected the configuration on {host}{detail}"},
        next_steps=steps_config_error,
        cites=("configuration rejected", "the exception"),
        host_evidence="`MAXTEXT CONFIG ERROR` (pyconfig), a pydantic `ValidationError`, a `yaml.*Error`, or an "
        "exception `'<key>' not in '<valid fields>'`.",
        decided_by="`MAXTEXT CONFIG ERROR`, pydantic `ValidationError`, `yaml.*Error`, "
        "`'<key>' not in '<valid fields>'`",
        culprit="the host that printed it (all hosts usually do)",
        check_next="The key or value named in the error; [model-config-guide](../model-config-guide/SKILL.md).",
    ),
    FailureClass(
        "gpu_health",
        priority=2,
        on_host=on_host_gpu_health,
        summary={"": "the GPU health check before training failed on {hosts}: {detail}"},
        next_steps=steps_gpu_health,
        cites=(
            "GPU health check failed on this node",
            "exit record of the node's preflight",
            "the command that leaves the bad nodes out",
        ),
        host_evidence="utils/launch/gpu_health.sh in preflight: `gpu_health: gpu N (VENDOR BUS): FAILED: ...` "
        "(uncorrectable ECC/RAS errors, another user's process, GPU memory not released, rows pending "
        "remapping), `gpu_health: HOST: FAILED: ...` (fewer GPUs than `JOB_GPUS_PER_NODE`, nvidia-smi failing) "
        "or its verdict `gpu_health: verdict HOST: FAILED: ...`. Every host with it is a culprit.",
        decided_by="`gpu_health: ... FAILED: ...` lines of the preflight GPU check: uncorrectable ECC/RAS errors, "
        "another user's process, GPU memory not released, GPU count below `JOB_GPUS_PER_NODE`",
        culprit="every host whose GPU check failed",
        check_next="The JOB SUMMARY's `resubmit:` line (the command with `--exclude=` the bad nodes, in "
        "`next_steps`); tell the admins (GPU reset, cleanup or drain).",
    ),
    FailureClass(
        "nan_loss",
        priority=3,
        on_host=on_host_nan_loss,
        summary={
            "": "the loss became {what} at step {step}{after}: MaxText stopped training ({flag}); the training "
            "itself diverged (learning rate, data, numerics), no node is at fault",
            "no_step": "MaxText stopped training because the loss became {what} ({flag}); the step lines carry no "
            "loss: the training itself diverged (learning rate, data, numerics), no node is at fault",
        },
        next_steps=steps_nan_loss,
        cites=("MaxText stopped: the loss is not a number", "the first step whose loss is not a number"),
        host_evidence="MaxText's `Aborting training due to NaN loss.` / `... Inf loss.` (`abort_on_nan_loss`, "
        "`abort_on_inf_loss`: true by default), after the step line whose loss is `nan`/`inf`; it exits 1. "
        "Any host with it decides (every host computes the same loss), whatever else exited first.",
        decided_by="`Aborting training due to NaN loss.` (or `Inf loss.`) on any host; `summary` names the first "
        "step whose loss is `nan`/`inf` and the last finite loss",
        culprit="none (the job's own training diverged; every host sees the same loss)",
        check_next="The loss before the step (in `next_steps`): a rising loss is divergence (lower `learning_rate`, "
        "longer warm-up), a sudden one a bad batch or an overflow; TensorBoard's loss curve.",
    ),
    FailureClass(
        "oom_device",
        priority=4,
        on_host=on_host_oom_device,
        summary={"": "device memory exhausted on {host}{detail}"},
        next_steps=steps_oom_device,
        cites=("the first error on the culprit", *ROOT_CITES),
        host_evidence="`RESOURCE_EXHAUSTED` or `Out of memory while trying to allocate` (an XLA error line or the "
        "exception).",
        decided_by="`RESOURCE_EXHAUSTED` / `Out of memory while trying to allocate`",
        culprit="the first host to fail",
        check_next=f"Smaller `per_device_batch_size` or `remat_policy=full`; {SWEEP} `batch` for the largest value "
        "that fits.",
    ),
    FailureClass(
        "gpu_error",
        priority=5,
        on_host=on_host_gpu_error,
        metrics_why="a GPU error",
        summary={"": "a GPU failed on {host} (its own hardware, not the training){detail}"},
        next_steps=steps_gpu_error,
        cites=("the first error on the culprit", *ROOT_CITES),
        host_evidence="A GPU error in the host's own lines or its exception: CUDA `CUDA_ERROR_ECC_UNCORRECTABLE` / "
        "`uncorrectable ECC error encountered`, the kernel's `NVRM: Xid` / `GPU has fallen off the bus`, NCCL/RCCL "
        "`unhandled cuda error` (a CUDA call failed on this host), ROCm `HSA_STATUS_ERROR_*` or `rocdevice.cpp ... "
        "aborting`. Ahead of the segfault (SIGABRT) and the exception the error ends in.",
        decided_by="`CUDA_ERROR_ECC_UNCORRECTABLE`, `uncorrectable ECC error`, `NVRM: Xid`, `GPU has fallen off the "
        "bus`, NCCL/RCCL `unhandled cuda error`, `HSA_STATUS_ERROR_*`, `rocdevice.cpp ... aborting`",
        culprit="the host whose GPU failed",
        check_next=f"The host's kernel log (Xid, amdgpu RAS, GPU reset) and ECC counters (in `next_steps`); resubmit "
        f"with `--exclude=HOST`; with a TSDB, {TSDB} (`gpu_hardware`: RAS/ECC counts and "
        "`hw_gpu_kernel_errors_total`).",
    ),
    FailureClass(
        "oom_host",
        priority=6,
        on_host=on_host_oom_host,
        summary={"": "{host} ran out of host memory (the kernel/cgroup OOM killer ended it){detail}"},
        next_steps=steps_oom_host,
        cites=("the first error on the culprit", *ROOT_CITES, "bash: the stage's process was killed"),
        host_evidence="srun's `task N: Out Of Memory`, kernel `oom-kill` / `Out of memory: Killed process` / "
        "`invoked oom-killer` text.",
        decided_by="srun's `task N: Out Of Memory`, kernel `oom-kill` text; also exit 137 with no message (then "
        "`confidence` low: `kill -9` and the scheduler look the same)",
        culprit="the host killed",
        check_next=f"`dmesg` on the host, `sacct -j ID -o JobID,State,ExitCode,MaxRSS,MaxRSSNode`; with a TSDB, the "
        f"`memory` check of {TSDB}.",
    ),
    FailureClass(
        "segfault",
        priority=7,
        on_host=on_host_segfault,
        summary={"": "native crash on {host}{exit}{detail}"},
        next_steps=steps_segfault,
        cites=("the first error on the culprit", *ROOT_CITES),
        host_evidence="`Segmentation fault`, `Fatal Python error`, absl's `*** SIGSEGV received at time=`, an absl "
        "`F` (fatal) line that is not JAX's distributed-service death notice, or exit 139. Not the "
        "abort that follows the death notice on the same host (`Fatal Python error: Aborted`, SIGABRT, "
        "exit 134: measured on a survivor of a frozen rank)",
        decided_by="`Segmentation fault`, `Fatal Python error`, `*** SIGSEGV received`, an absl `F` line (not JAX's "
        "death notice), exit 139",
        culprit="the host that crashed",
        check_next="Core dumps (`ENABLE_COREDUMPS=1`), the stack in the log.",
    ),
    FailureClass(
        "python_exception",
        priority=8,
        on_host=on_host_python_exception,
        summary={"": "Python exception on {host}{detail}"},
        next_steps=steps_python_exception,
        cites=("the first error on the culprit", ROOT_CITES[0], "the exception", *ROOT_CITES[1:]),
        host_evidence="The exception line after `Traceback (most recent call last):` when it is none of the others "
        "and not a consequence (collective, coordination/heartbeat, KeyboardInterrupt/SystemExit).",
        decided_by="the exception after `Traceback (most recent call last):` that is not a consequence (collective, "
        "coordination, KeyboardInterrupt)",
        culprit="the first host to fail",
        check_next="`grep -a -n -B30 -m1 'Traceback' LOG` (in `next_steps`).",
    ),
    FailureClass(
        "killed",
        priority=9,
        on_host=on_host_killed,
        reported_as="oom_host",
        doc_label="killed (reported as `oom_host`, confidence low)",
        summary={
            "": "{host} was killed by SIGKILL (exit 137) and printed no error of its own: the usual cause is "
            "the kernel OOM killer, but kill -9 or the scheduler look the same"
        },
        next_steps=steps_oom_host,
        cites=(*ROOT_CITES, "bash: the stage's process was killed"),
        host_evidence="Exit 137 (SIGKILL) with `reason=exit`, and none of the above: the kernel OOM killer is the "
        "usual cause but `kill -9` or the scheduler look the same; `summary` says so and `next_steps` "
        "says how to check (`dmesg`, `sacct ... MaxRSS`).",
        decided_by="",
        culprit="",
        check_next="",
    ),
    FailureClass(
        "stage_timeout",
        priority=10,
        on_host=on_host_stage_timeout,
        rule=5,
        on_job=on_job_time_limit,
        summary={
            "": "stage '{stage}' ran past its time limit{extra}",
            "slurm": "the job ran past its Slurm time limit",
        },
        next_steps=steps_stage_timeout,
        cites=("stage time limit", "exit record", "Slurm's time limit", "the job summary", HB_CLAIM),
        host_evidence="Its stage record says `reason=timeout`, or run_stage.sh's `stage 'S' exceeded its N s limit "
        "on HOST`.",
        decided_by="a stage record with `reason=timeout`, run_stage.sh's `exceeded its N s limit`, or the job's time "
        "limit (`status: timeout`, `DUE TO TIME LIMIT`)",
        culprit="hosts whose last step is behind (often none)",
        check_next="Was it still progressing (`progress`, `tgs.phases`)? Then raise `STAGE_TIMEOUTS=train:<s>` or "
        "the time limit; if it had stopped, treat it as a hang.",
    ),
    FailureClass(
        "heartbeat_false_positive",
        rule=2,
        on_job=on_job_heartbeat,
        metrics_why="a heartbeat claim",
        summary={
            "": "JAX declared {accused} dead (missed heartbeats) but {they} still logged after the claim, so "
            "{they} did not crash: suspect the coordinator ({coordinator}) or the network missing "
            "heartbeats, or a freeze longer than the heartbeat timeout (swap, SIGSTOP) on {accused}"
        },
        next_steps=steps_heartbeat_false_positive,
        cites=(
            "the coordination service's claim",
            "the accused host logged a step after the claimed time",
            "the accused host logged its own death notice",
        ),
        decided_by="JAX's `tasks are unhealthy (stopped sending heartbeats)` / `Task N heartbeat timeout`, and every "
        "accused host logged a step or its own death notice after the claim",
        culprit="none (the accused were alive: `accused_hosts`); `suspect_hosts` is the coordinator",
        check_next=f"The coordinator (node rank 0) and the network; with a TSDB, {TSDB} checks the accused hosts' "
        "GPU power at the claim time.",
    ),
    FailureClass(
        "heartbeat_timeout",
        rule=2,
        on_job=on_job_heartbeat,
        metrics_why="a heartbeat claim",
        summary={
            "": "{hosts} stopped sending heartbeats (no output after the claim): it died, froze or lost the network",
            "unmapped": "JAX reported tasks {tasks} unhealthy (not mapped to hosts)",
        },
        next_steps=steps_heartbeat_timeout,
        cites=(
            "the coordination service's claim",
            "the accused host logged a step after the claimed time",
            "the accused host logged its own death notice",
            "the accused host's last step",
            "exit record",
        ),
        decided_by="the same claim, but an accused host went silent",
        culprit="the silent accused hosts",
        check_next="Why it stopped: `scontrol show node`, `dmesg` (OOM, GPU Xid), its last log lines.",
    ),
    FailureClass(
        "node_failure",
        rule=3,
        on_job=on_job_node_failure,
        summary={"": "node(s) {hosts} vanished without an exit record (node failure)"},
        next_steps=steps_node_failure,
        cites=("node lost", "its last step", "no exit record from these nodes"),
        decided_by="JOB SUMMARY `no_exit_record:` (not alone in a job that was cancelled or timed out: the stop can "
        "beat the record), `Node failure on HOST`, `CANCELLED AT ... DUE TO NODE FAILURE`, Slurm "
        "`NODE_FAIL`",
        culprit="those hosts",
        check_next=f"`scontrol show node HOST; sinfo -R`; resubmit with `--exclude=HOST` if the user wants; {SWEEP} "
        "`nodes` to test the node.",
    ),
    FailureClass(
        "collective_error",
        rule=4,
        on_job=on_job_collective,
        summary={"": "collective failed on {reporters}; the peer that {how} is {culprit}"},
        next_steps=steps_collective_error,
        cites=("collective error reported by a survivor", "the peer's last step (it stopped first)", "exit record"),
        decided_by="Gloo/NCCL/RCCL errors on some hosts: those are survivors",
        culprit="the peer that died first (failing exit code, else lowest last step, else earliest last line); "
        "`medium`, or `low` if every host reported",
        check_next=f"The culprit's `dmesg`, GPU/NIC errors; rerun with `_env_NCCL_DEBUG=INFO`; {SWEEP} `bisect` if "
        "it repeats.",
    ),
    FailureClass(
        "cancelled",
        rule=6,
        on_job=on_job_cancelled,
        summary={"": "the job was {how}; no node failed first"},
        next_steps=steps_cancelled,
        cites=("the stop request", "the job summary"),
        decided_by="JOB SUMMARY `status: cancelled`, `received a stop signal`, `*** JOB <id> ... CANCELLED AT`, Slurm "
        "`CANCELLED`/`PREEMPTED`",
        culprit="none",
        check_next="`sacct -j ID -o JobID,State,ExitCode,Start,End`: who or what ended it.",
    ),
    FailureClass(
        "hang",
        rule=7,
        metrics_why="the job hangs",
        summary={
            "running": "no step for {age:.0f} s (> {threshold:.0f} s) while the job still runs{behind}",
            "before_end": "hung: no step for {age:.0f} s (> {threshold:.0f} s) before the job was {ended}; the "
            "{stop} only ended it{behind}",
        },
        next_steps=steps_hang,
        cites=(
            "this host is behind the others",
            "the newest step line in the log",
            "the newest step line: nothing after it until the end",  # then what the stop had cited:
            "the stop request",
            "Slurm's time limit",
            "the job summary",
            "stage time limit",
            "exit record",
            HB_CLAIM,
        ),
        decided_by="running job, no step for longer than the threshold; or a `cancelled`/`stage_timeout` job whose "
        "last step was older than the threshold when it ended (the cancel only ended a hang)",
        culprit="hosts behind the others; none when all stopped at the same step (`low`)",
        check_next=f"Stacks: `py-spy dump` through `srun --overlap` (in `next_steps`); with a TSDB, {TSDB} (`hang` "
        "check: GPUs busy at standby power = collective deadlock).",
    ),
    FailureClass(
        "no_steps",
        rule=8,
        on_job=on_job_no_steps,
        summary={
            "": "the job ended completed (every node exited 0) but its log holds no step line: it trained "
            "nothing that reached the log (MaxText's output lost on the way, or a trainer that never "
            "stepped){where}"
        },
        next_steps=steps_no_steps,
        cites=("the job summary says completed", "the job summary found no step line", NO_STEPS_STOP),
        decided_by="status `completed` (JOB SUMMARY, records or Slurm) and not one step line in the log's last run "
        "(JOB SUMMARY `steps: none`); `status` becomes `failed`",
        culprit="none; the evidence is where the nodes' output stops",
        check_next="The log's last node lines (where it stops: a cut `Config param` line is a log path that "
        "drops lines), `log_config=false`, the trainer's stderr (`./run_local.sh`).",
    ),
)
BY_NAME = {fc.name: fc for fc in REGISTRY}
# the failure_class values a report can carry
CLASSES = tuple(fc.name for fc in REGISTRY if fc.reported_as is None)
# per-host root causes, highest priority first
ROOT_CAUSES = tuple(sorted((fc for fc in REGISTRY if fc.on_host), key=lambda fc: fc.priority or 0))
# job-level detectors in decision order (one detector can decide several classes)
JOB_RULES = tuple(dict.fromkeys(fc.on_job for fc in sorted(REGISTRY, key=lambda fc: fc.rule) if fc.on_job))
# the row for a failed job outside the classes (skill table)
UNCLASSIFIED = (
    "null, failed",
    "the image stage (`image: FAILED: ...` on a node, hosts named; unprefixed: the nodes' images differ, "
    "the table's `<- differs`/`<- no record` rows name them), a preflight check other than the GPUs "
    "(`preflight: FAILED: ...`, e.g. disk; hosts named), a job refused "
    "before its first stage because another job holds its run (`run 'ALIAS' is in use by job ID ...`, no host, "
    "`high`) or a non-zero exit with no known text (first such host, `low`)",
    "as named",
    "Read `summary` and the host's last lines; a refused run: wait for the holder, or resubmit with "
    "`--dependency=afterany:ID`.",
)


def explain(name: str, variant: str = "", **fields: Any) -> str:
    """The class's one-line summary, its template filled with fields."""
    return BY_NAME[name].summary[variant].format(**fields)


def reported(name: str) -> str:
    """The failure_class a root cause is reported as."""
    return BY_NAME[name].reported_as or name


# --- generated documentation --------------------------------------------------------------
def root_cause_table() -> list[str]:
    """docs/triage.md: the per-host root causes by priority."""
    rows = ["| Root cause | Evidence on that host |", "|---|---|"]
    return rows + [f"| {fc.doc_label or f'`{fc.name}`'} | {fc.host_evidence} |" for fc in ROOT_CAUSES]


def class_table() -> list[str]:
    """skills/job-log-triage/reference.md: every class, what decides it, who is blamed, what next."""
    rows = [
        "| `failure_class` | Decided by (on the culprit's own lines) | Culprit | Check next / hand over |",
        "|---|---|---|---|",
    ]
    rows += [
        f"| `{fc.name}` | {fc.decided_by} | {fc.culprit} | {fc.check_next} |"
        for fc in REGISTRY
        if fc.reported_as is None
    ]
    return rows + ["| " + " | ".join(UNCLASSIFIED) + " |"]
