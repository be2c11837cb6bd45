#!/usr/bin/env python3
"""Synthetic job logs in the launcher's real format, for the triage tests and benchmark.

A `Job` describes a run (hosts, steps, step time, throughput phases, a failure to inject);
`write_job(job, workspace)` writes `<workspace>/<id>-JAX-<model>[-<tag>].log` and its job
directory (`log` symlink, `artifact/configs/<model>.yml`, `.stages/<stage>/<host>` records,
`summary.txt`) as utils/launch/job_header.sh, utils/launch/run_stage.sh, utils/launch/job_summary.sh, srun and
MaxText/JAX 0.12 would. Failure texts are the ones those programs print (see the comments);
`tests/helpers/logcorpus.py DIR [--hosts N] [--steps N]` writes one job for a quick look.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import time
from pathlib import Path

FAILURES = (
    "oom_host",
    "oom_device",
    "segfault",
    "collective_error",
    "python_exception",
    "config_error",
    "heartbeat_timeout",
    "heartbeat_false_positive",
    "stage_timeout",
    "cancelled",
    "node_failure",
    "hang",
    "killed_gloo",
    "preflight",
    "time_limit",
    "gpu_health",
    "nan_loss",
    "no_steps",
    "gpu_ecc",
    "gpu_nccl",
    "gpu_hsa",
)
GPU_ERRORS = ("gpu_ecc", "gpu_nccl", "gpu_hsa")  # classed gpu_error (the host's own GPU failed)
MULTI_NODE = ("collective_error", "heartbeat_timeout", "heartbeat_false_positive", "node_failure")
PY = "/opt/venv/lib/python3.12/site-packages"
STAGE_SH = "/ws/.snapshots/20261122T043000Z-AbC123/utils/launch/run_stage.sh"


@dataclasses.dataclass
class Job:
    hosts: list[str] = dataclasses.field(default_factory=lambda: ["n1", "n2"])
    job_id: str = "4242"
    model: str = "tiny"
    tag: str = ""
    scheduler: str = "slurm"
    steps: int = 20  # steps every host completes (fewer on a failing host)
    total_steps: int | None = None  # the steps= override (None: no override)
    config_steps: int | None = None  # steps: in artifact/configs/<model>.yml (None: not written)
    start: float = 1795322400.0  # epoch of the header's started: (2026-11-22T04:00:00Z)
    step_time: float = 0.5
    phases: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (from_step, step_time)
    warmup_time: float = 20.0  # seconds of step 0 (compilation)
    tokens_per_step: float = 2048.0  # tokens per device per step
    rampup_steps: int = 0  # steps logged as [Rampup Batch Size Phase] lines
    host_prefix: bool = True
    absl: bool = True
    config_lines: int = 30  # "Config param" lines per host
    failure: str | None = None  # one of FAILURES
    culprit: int = 1  # index into hosts of the failing host
    fail_step: int | None = None  # last step the culprit completes (default steps // 2)
    running: bool = False  # no JOB SUMMARY and no train records yet
    seed: int = 1

    @property
    def name(self) -> str:
        return f"{self.job_id}-JAX-{self.model}" + (f"-{self.tag}" if self.tag else "")


def absl_stamp(epoch: float, level: str = "I", tid: int = 140495106636672, where: str = "metric_logger.py:265") -> str:
    """An absl log prefix in the local time zone, like Python's absl logging and the C++ logger."""
    tm = time.localtime(epoch)
    us = int(round((epoch - int(epoch)) * 1e6)) % 1000000
    clock = f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}.{us:06d}"
    return f"{level}{tm.tm_mon:02d}{tm.tm_mday:02d} {clock} {tid} {where}] "


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class _Writer:
    """Formats lines the way the launcher writes them (host prefix, absl prefix)."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def node(self, host: str, text: str) -> str:
        return f"{host}: {text}" if self.job.host_prefix else text

    def absl(
        self,
        host: str,
        epoch: float,
        text: str,
        level: str = "I",
        where: str = "metric_logger.py:265",
        tid: int = 140495106636672,
    ) -> str:
        prefix = absl_stamp(epoch, level, tid, where) if self.job.absl else ""
        return self.node(host, prefix + text)


def step_time_at(job: Job, step: int) -> float:
    t = job.step_time
    for start, value in job.phases:
        if step >= start:
            t = value
    return t


def step_line(job: Job, w: _Writer, host: str, step: int, epoch: float, seconds: float) -> str:
    if step < job.rampup_steps:
        body = (
            f"[Rampup Batch Size Phase], completed step: {step}, seconds: {seconds:.3f}, total_weights: 64, "
            f"loss: {6.1 - step * 0.001:.3f}, lm_loss: {6.1 - step * 0.001:.3f}, perplexity: 445.001"
        )
    else:
        tgs = job.tokens_per_step / seconds
        # MaxText prints the loss with "%.3f": "nan" once training diverged (nan_loss: from the fail step on)
        loss = "nan" if job.failure == "nan_loss" and step >= _default_fail_step(job) else f"{6.061 - step * 1e-4:.3f}"
        body = (
            f"completed step: {step}, seconds: {seconds:.3f}, TFLOP/s/device: {tgs * 1e-6:.3f}, "
            f"Tokens/s/device: {tgs:.3f}, total_weights: {int(job.tokens_per_step)}, loss: {loss}, "
            f"lm_loss: {loss}, perplexity: {'nan' if loss == 'nan' else '429.005'}"
        )
        if step % 3 == 0:
            body += ", moe_lb_loss: 0.010"
    return w.absl(host, epoch, body)


def header(job: Job, workspace: Path) -> list[str]:
    overrides = f"steps={job.total_steps} " if job.total_steps is not None else ""
    return [
        "==================== JOB ====================",
        f"job: {job.job_id} {job.name}",
        f"scheduler: {job.scheduler}",
        f"model: {job.model}" + (f" (tag {job.tag})" if job.tag else ""),
        f"nodes: {len(job.hosts)} ({' '.join(job.hosts)})",
        "coordinator: 10.0.0.1:61442",
        "stage_timeouts: image:1800,preflight:600,train:86400"
        " (defaults image:1800,preflight:600,train:86400; set STAGE_TIMEOUTS)",
        "container: auto localhost/maxtext-slurm:latest",
        "ray: 0",
        f"code: {workspace}/.snapshots/20261122T043000Z-AbC123",
        f"overrides: {overrides} ",
        "env_overrides:  ",
        f"job_dir: {workspace}/{job.name}",
        f"log: {workspace}/{job.name}.log",
        f"started: {iso(job.start)}",
        "=============================================",
    ]


def startup(job: Job, w: _Writer, host: str, rank: int, t: float) -> list[str]:
    n = len(job.hosts)
    lines = [
        w.node(host, f"preflight: host {host}, 2 CPUs, 22.6 GiB memory available, kernel 6.1.0"),
        w.node(host, "preflight: ok"),
        w.node(host, f"_train.sh: rank {rank}/{n}, coordinator 10.0.0.1:61442, env set: NNODES={n} NODE_RANK={rank} "),
        w.node(
            host,
            "[transformers] PyTorch was not found. Models won't be available and only tokenizers, "
            "configuration and file/data utilities can be used.",
        ),
        w.absl(
            host, t, "Attempting to initialize the jax distributed system for GPU backend...", where="max_utils.py:272"
        ),
        w.absl(
            host,
            t + 0.5,
            "Coordination agent has successfully connected.",
            tid=13217,
            where="coordination_service_agent.cc:197",
        ),
        w.absl(host, t + 0.6, "Jax distributed system initialized on GPU!", where="max_utils.py:274"),
    ]
    for i in range(job.config_lines):
        lines.append(w.absl(host, t + 0.7, f"Config param option_{i:04d}: value_{i}", where="pyconfig.py:591"))
    lines.append(w.absl(host, t + 1, "System Information: Jax Version: 0.12.0.1", where="max_utils.py:835"))
    lines.append(
        w.absl(
            host,
            t + 1.5,
            "\tMemstats unavailable, error: 'NoneType' object is not subscriptable",
            where="max_utils.py:788",
        )
    )
    return lines


def traceback_lines(w: _Writer, host: str, exc: str) -> list[str]:
    return [
        w.node(host, s)
        for s in (
            "Traceback (most recent call last):",
            '  File "<frozen runpy>", line 198, in _run_module_as_main',
            f'  File "{PY}/maxtext/trainers/pre_train/train.py", line 1402, in train_loop',
            "    state, metrics = p_train_step(state, example_batch, nextrng)",
            "                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            exc,
        )
    ]


# The GPU errors a trainer dies of, as the programs print them:
# - CUDA driver API: CUDA_ERROR_ECC_UNCORRECTABLE = 214, "uncorrectable ECC error encountered" (cuGetErrorName /
#   cuGetErrorString; CUDA Driver API reference, "Error Handling"); XLA prefixes the failed call, as TensorFlow did
#   in "failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered"
#   (github.com/nagadit/DeepFaceLab_Linux/issues/89).
# - NCCL: "<host>:<pid>:<tid> [<dev>] NCCL WARN Cuda failure '<cudaGetErrorString>'" and the API's result string
#   for ncclUnhandledCudaError, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)" (nccl src/misc).
# - ROCm (HIP runtime rocdevice.cpp): ":0:rocdevice.cpp :2660: <us> us: <pid>: [tid:0x...] Device::callbackQueue
#   aborting with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory beyond
#   the largest legal address. code: 0x29", then the abort (github.com/parthenon-hpc-lab/parthenon/issues/1101).
GPU_ERROR_TEXT = {
    "gpu_ecc": "jaxlib._jax.XlaRuntimeError: INTERNAL: Failed to synchronize GPU stream: CUDA_ERROR_ECC_UNCORRECTABLE: "
    "uncorrectable ECC error encountered",
    "gpu_nccl": "n0:4711:4790 [3] NCCL WARN Cuda failure 'uncorrectable ECC error encountered'",
    "gpu_hsa": ":0:rocdevice.cpp            :2660: 556940992572 us: 32834: [tid:0x7f9e41945700] Device::callbackQueue "
    "aborting with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory beyond "
    "the largest legal address. code: 0x29",
}


def gpu_error_lines(w: _Writer, host: str, fail: str, t: float) -> list[str]:
    """What the culprit prints when its GPU fails (GPU_ERROR_TEXT), then how the trainer ends."""
    first = w.node(host, GPU_ERROR_TEXT[fail])
    if fail == "gpu_ecc":
        return traceback_lines(w, host, GPU_ERROR_TEXT[fail])
    if fail == "gpu_nccl":
        exc = (
            "jaxlib._jax.XlaRuntimeError: INTERNAL: NCCL operation ncclGroupEnd() failed: unhandled cuda error (run "
            "with NCCL_DEBUG=INFO for details). Last NCCL warning(error) log entry (may be unrelated) 'Cuda failure "
            "'uncorrectable ECC error encountered''."
        )
        return [first, *traceback_lines(w, host, exc)]
    return [  # gpu_hsa: the runtime aborts the process (SIGABRT, exit 134)
        first,
        w.node(host, "Fatal Python error: Aborted"),
        w.node(host, ""),
        w.node(host, "Current thread 0x00007fb077d90b80 (most recent call first):"),
        w.node(host, f'  File "{PY}/maxtext/trainers/pre_train/train.py", line 957 in training_loop_iteration'),
    ]


GLOO_EXC = (
    "ValueError: UNKNOWN: Gloo AllGather failed: [external/xla++third_party_ext+gloo/gloo/transport/tcp/"
    "pair.cc:538] Read error [10.0.0.{peer}]:27549: Connection reset by peer"
)


def unhealthy_block(w: _Writer, host: str, t: float, tasks: list[int], coordinator: bool) -> list[str]:
    """What JAX 0.12 prints when the coordination service stops hearing from tasks (measured)."""
    lines = []
    if coordinator:
        lines.append(
            w.absl(
                host,
                t,
                "[5262243515087626946] Use error polling to propagate the following error to "
                "all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):",
                level="E",
                tid=22534,
                where="coordination_service.cc:1518",
            )
        )
        lines += [w.node(host, str(k)) for k in tasks]
        lines.append(
            w.node(
                host,
                "The tasks have crashed. Check the task logs for an earlier error, or scheduler events "
                "(e.g. preemption, eviction) to debug further. "
                "[type.googleapis.com/tensorflow.CoordinationServiceError='']",
            )
        )
    lines.append(
        w.absl(
            host,
            t + 0.001,
            "Polled an error from coordination service (this can be an error from this or another task).",
            level="E",
            tid=22545,
            where="coordination_service_agent.cc:288",
        )
    )
    lines.append(
        w.absl(
            host,
            t + 0.002,
            "Terminating process because the JAX distributed service detected fatal errors. "
            "This most likely indicates that another task died; see the other task logs for "
            "more details. Disable Python buffering, i.e. `python -u`, to be sure to see all "
            "the previous output. absl::Status: UNAVAILABLE: The following tasks are unhealthy "
            "(stopped sending heartbeats):",
            level="F",
            tid=22545,
            where="client.h:86",
        )
    )
    lines += [w.node(host, str(k)) for k in tasks]
    lines.append(
        w.node(
            host,
            "The tasks have crashed. Check the task logs for an earlier error, or scheduler events "
            "(e.g. preemption, eviction) to debug further.",
        )
    )
    lines.append(w.node(host, ""))
    lines.append(
        w.node(
            host,
            "RPC: /xla.coordination.CoordinationService/PollForError "
            "[type.googleapis.com/tensorflow.CoordinationServiceError='']",
        )
    )
    lines.append(w.node(host, "*** Check failure stack trace: ***"))
    lines.append(w.node(host, "    @     0x7fa3b5ef81b4  absl::lts_20260526::log_internal::LogMessage::SendToLog()"))
    return lines


@dataclasses.dataclass
class _Outcome:
    """Per-host end of the last stage: (rc, reason) or None for no record."""

    records: dict[str, tuple[int, str] | None]
    status: str
    summary_first_error: str = ""
    stage: str = "train"
    resubmit: str = ""


def _default_fail_step(job: Job) -> int:
    return job.fail_step if job.fail_step is not None else max(job.steps // 2, 3)


def body(job: Job, w: _Writer) -> tuple[list[str], _Outcome, float]:
    """Startup, steps and the failure; returns (lines, outcome, time of the last line)."""
    rng = random.Random(job.seed)
    hosts = job.hosts
    out: list[str] = []
    t0 = job.start + 5
    for rank, host in enumerate(hosts):
        out += startup(job, w, host, rank, t0 + rank * 0.01)
    fail = job.failure
    if len(hosts) < 2 and fail in MULTI_NODE:
        raise ValueError(f"failure {fail} needs at least two hosts")
    culprit = hosts[job.culprit % len(hosts)]
    fstep = _default_fail_step(job)
    records: dict[str, tuple[int, str] | None] = {h: (0, "exit") for h in hosts}
    status = "completed"
    first_error = ""

    if fail == "preflight":
        # utils/launch/preflight.sh: a check failed on one node; the train stage never starts
        bad = hosts[job.culprit % len(hosts)]
        out = [ln for ln in out if ": preflight: ok" not in ln and ln != "preflight: ok"]
        out.append(w.node(bad, "preflight: FAILED: only 3 GiB free on /tmp (need PREFLIGHT_MIN_FREE_GB=5)"))
        out.append(f"srun: error: {bad}: task {hosts.index(bad)}: Exited with exit code 1")
        records = {h: (1, "exit") if h == bad else (143, "stopped") for h in hosts}
        first = w.node(bad, "preflight: FAILED: only 3 GiB free on /tmp (need PREFLIGHT_MIN_FREE_GB=5)")
        return out, _Outcome(records, "failed", first, stage="preflight"), t0 + 1

    if fail == "gpu_health":
        # utils/launch/gpu_health.sh in preflight (one GPU with uncorrectable errors on the culprit); the
        # node checks run to the end on every node (srun --kill-on-bad-exit=0) and train never starts
        out = []
        for host in hosts:
            out.append(w.node(host, f"preflight: host {host}, 2 CPUs, 22.6 GiB memory available, kernel 6.1.0"))
            for i, bus in enumerate(("0000:05:00.0", "0000:26:00.0")):
                if host == culprit and i == 1:
                    out.append(
                        w.node(host, f"gpu_health: gpu 1 (amd {bus}): FAILED: 2 uncorrectable ECC/RAS errors (umc 2)")
                    )
                else:
                    out.append(
                        w.node(
                            host,
                            f"gpu_health: gpu {i} (amd {bus}): ok: 0 uncorrectable errors, "
                            "0.2 of 191.9 GiB in use, no process",
                        )
                    )
            if host == culprit:
                out.append(w.node(host, f"gpu_health: verdict {host}: FAILED: 2 amd GPU(s), 1 unhealthy (gpu 1)"))
                out.append(
                    w.node(host, "preflight: FAILED: gpu 1 (amd 0000:26:00.0): 2 uncorrectable ECC/RAS errors (umc 2)")
                )
            else:
                out.append(w.node(host, f"gpu_health: verdict {host}: ok: 2 amd GPU(s), healthy"))
                out.append(w.node(host, "preflight: ok"))
        out.append(f"srun: error: {culprit}: task {hosts.index(culprit)}: Exited with exit code 1")
        out.append("_job.sbatch: preflight failed; per node:")
        for host in hosts:
            why = (
                "FAILED: gpu 1 (amd 0000:26:00.0): 2 uncorrectable ECC/RAS errors (umc 2)" if host == culprit else "ok"
            )
            out.append(f"_job.sbatch:   {host}: {why}")
        command = f"submit.sh {job.model} -N {len(hosts)} -- steps={job.total_steps or job.steps}"
        resubmit = command.replace(" -- ", f" --exclude={culprit} -- ") if job.scheduler == "slurm" else ""
        records = {h: (1, "exit") if h == culprit else (0, "exit") for h in hosts}
        first = w.node(culprit, "gpu_health: gpu 1 (amd 0000:26:00.0): FAILED: 2 uncorrectable ECC/RAS errors (umc 2)")
        return out, _Outcome(records, "failed", first, stage="preflight", resubmit=resubmit), t0 + 1

    if fail == "config_error":
        for host in hosts:
            out.append(
                w.absl(
                    host,
                    t0 + 2,
                    "Ignoring invalid/unsupported field from YAML/CLI: 'per_device_batch_sizee'",
                    level="W",
                    where="pyconfig.py:270",
                )
            )
            out.append(w.absl(host, t0 + 2, "=" * 80, level="E", where="pyconfig.py:392"))
            out.append(
                w.absl(
                    host,
                    t0 + 2,
                    "MAXTEXT CONFIG ERROR: 'per_device_batch_sizee' not in 'emb_dim', 'mlp_dim'.",
                    level="E",
                    where="pyconfig.py:393",
                )
            )
            out += traceback_lines(w, host, "ValueError: 'per_device_batch_sizee' not in 'emb_dim', 'mlp_dim'.")
            records[host] = (1, "exit")
        first_error = w.node(hosts[0], "ValueError: 'per_device_batch_sizee' not in 'emb_dim', 'mlp_dim'.")
        return out, _Outcome(records, "failed", first_error), t0 + 3

    if fail == "no_steps":
        # every node exited 0 but no step line reached the log (issue 20's first GPU run: Ubuntu 24.04's mawk
        # under -W interactive cut MaxText's `Config param logical_axis_rules` line at 4096 characters and
        # dropped every later line while the GPU trained)
        rules = "(" + ", ".join(f"('activation_{i:03d}', ('data', 'fsdp', 'tensor'))" for i in range(120)) + ")"
        for host in hosts:
            stamp = absl_stamp(t0 + 0.8, where="pyconfig.py:591") if job.absl else ""
            out.append(w.node(host, (stamp + "Config param logical_axis_rules: " + rules)[:4096]))
        return out, _Outcome(records, "completed", ""), t0 + 60

    t = t0 + 10.0
    # steps each host completes
    last = {h: job.steps - 1 for h in hosts}
    if fail in (
        "oom_host",
        "oom_device",
        "segfault",
        "python_exception",
        "collective_error",
        "heartbeat_timeout",
        "node_failure",
        "killed_gloo",
        "heartbeat_false_positive",
        *GPU_ERRORS,
    ):
        for h in hosts:
            last[h] = fstep + (0 if h == culprit else 1)
        if fail in ("oom_device", "python_exception"):
            last = {h: fstep for h in hosts}
        if fail == "heartbeat_false_positive":
            last = {h: fstep for h in hosts}
    if fail in ("hang", "stage_timeout", "cancelled", "time_limit", "nan_loss"):
        last = {h: fstep for h in hosts}
    if fail == "hang":
        last[culprit] = fstep - 1
    seconds_of: dict[int, float] = {}
    step_end: dict[int, float] = {}
    for step in range(max(last.values()) + 1):
        sec = job.warmup_time if step == 0 else step_time_at(job, step) * (1 + rng.uniform(-0.03, 0.03))
        seconds_of[step] = sec
        t += sec
        step_end[step] = t
        order = list(hosts)
        rng.shuffle(order)
        for h in order:
            if step <= last[h]:
                out.append(step_line(job, w, h, step, t + rng.uniform(0, 0.004), sec))
        if step % 5 == 0 and step <= last[hosts[0]]:
            out.append(
                w.absl(
                    hosts[0],
                    t + 0.005,
                    "To see full metrics 'tensorboard --logdir=/ws/run/tensorboard/'",
                    where="metric_logger.py:393",
                )
            )
    t_fail = step_end.get(fstep, t) + 1.0
    survivors = [h for h in hosts if h != culprit]
    peer_ip = job.culprit % len(hosts) + 1

    if fail is None:
        for h in hosts:
            out.append(
                w.absl(
                    h,
                    t + 0.1,
                    "Shutting down PreemptionSyncManager...",
                    tid=15100,
                    where="preemption_sync_manager.cc:202",
                )
            )
    elif fail in ("oom_host", "killed_gloo"):
        # the culprit is SIGKILLed (kernel OOM killer): it prints nothing; bash in run_stage.sh reports
        # "Killed" without a host prefix; survivors get Gloo errors; srun reports the task
        out.append(
            f'{STAGE_SH}: line 46: 13207 Killed                  timeout --kill-after=10 "$limit" "$@" 1>&3 2>&1'
        )
        for h in survivors:
            out += traceback_lines(w, h, GLOO_EXC.format(peer=peer_ip))
        rank = hosts.index(culprit)
        if fail == "oom_host":
            out.append(f"srun: error: {culprit}: task {rank}: Out Of Memory")
        else:
            out.append(f"srun: error: {culprit}: task {rank}: Exited with exit code 137")
        out.append("srun: launch/slurm: _step_signal: Terminating StepId=4242.1")
        for h in survivors:
            out.append(f"slurmstepd-{h}: error: *** STEP {job.job_id}.1 ON {h} CANCELLED AT {iso(t_fail)} ***")
        records.update({h: (143, "stopped") for h in survivors})
        records[culprit] = (137, "exit")
        status = "failed"
        first_error = w.node(culprit, "killed by signal 9 (KILL), e.g. the kernel OOM killer or kill -9")
    elif fail == "oom_device":
        out += traceback_lines(
            w,
            culprit,
            "jaxlib._jax.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 25.50GiB.",
        )
        out.append(f"srun: error: {culprit}: task {hosts.index(culprit)}: Exited with exit code 1")
        records.update({h: (143, "stopped") for h in survivors})
        records[culprit] = (1, "exit")
        status = "failed"
        first_error = w.node(
            culprit, "jaxlib._jax.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 25.50GiB."
        )
    elif fail == "segfault":
        # real order: bash's job-control notice (unprefixed) can land before the prefixed Python dump
        out.append(
            f'{STAGE_SH}: line 46: 11808 Segmentation fault      timeout --kill-after=10 "$limit" "$@" 1>&3 2>&1'
        )
        out += [
            w.node(culprit, s)
            for s in (
                "Fatal Python error: Segmentation fault",
                "",
                "Current thread 0x00007fb077d90b80 (most recent call first):",
                f'  File "{PY}/maxtext/trainers/pre_train/train.py", line 957 in training_loop_iteration',
                "",
                "Extension modules: numpy._core._multiarray_umath, jaxlib.cpu_feature_guard (total: 2)",
            )
        ]
        for h in survivors:
            out += traceback_lines(w, h, GLOO_EXC.format(peer=peer_ip))
        out.append(f"srun: error: {culprit}: task {hosts.index(culprit)}: Exited with exit code 139")
        records.update({h: (143, "stopped") for h in survivors})
        records[culprit] = (139, "exit")
        status = "failed"
        first_error = w.node(culprit, "Fatal Python error: Segmentation fault")
    elif fail == "python_exception":
        out += traceback_lines(w, culprit, "ZeroDivisionError: division by zero")
        out.append(f"srun: error: {culprit}: task {hosts.index(culprit)}: Exited with exit code 1")
        records.update({h: (143, "stopped") for h in survivors})
        records[culprit] = (1, "exit")
        status = "failed"
        first_error = w.node(culprit, "ZeroDivisionError: division by zero")
    elif fail in GPU_ERRORS:
        out += gpu_error_lines(w, culprit, fail, t_fail)
        for h in survivors:  # the peers' collectives fail: a consequence
            out += traceback_lines(w, h, GLOO_EXC.format(peer=peer_ip))
        code = 134 if fail == "gpu_hsa" else 1
        out.append(f"srun: error: {culprit}: task {hosts.index(culprit)}: Exited with exit code {code}")
        records.update({h: (143, "stopped") for h in survivors})
        records[culprit] = (code, "exit")
        status = "failed"
        first_error = w.node(culprit, GPU_ERROR_TEXT[fail])
    elif fail == "collective_error":
        # the culprit froze (no more output); the survivors' collectives fail, they exit 1 and srun
        # stops the culprit
        for h in survivors:
            out += traceback_lines(w, h, GLOO_EXC.format(peer=peer_ip))
        out.append(f"srun: error: {survivors[0]}: task {hosts.index(survivors[0])}: Exited with exit code 1")
        records.update({h: (1, "exit") for h in survivors})
        records[culprit] = (143, "stopped")
        status = "failed"
        first_error = w.node(survivors[0], GLOO_EXC.format(peer=peer_ip))
    elif fail in ("heartbeat_timeout", "heartbeat_false_positive"):
        task = hosts.index(culprit)
        t_claim = t_fail + 100
        if fail == "heartbeat_false_positive":
            # the accused keeps training past the claim and then logs its own death notice
            for k in range(1, 4):
                out.append(step_line(job, w, culprit, fstep + k, t_claim + k * job.step_time, job.step_time))
        out += unhealthy_block(w, hosts[0], t_claim, [task], coordinator=True)
        for h in hosts[1:]:
            if h != culprit or fail == "heartbeat_false_positive":
                out += unhealthy_block(w, h, t_claim + (5 if h == culprit else 0.01), [task], coordinator=False)
        out.append(f"srun: error: {hosts[0]}: task 0: Exited with exit code 134")
        records.update({h: (134, "exit") for h in hosts})
        records[culprit] = (143, "stopped") if fail == "heartbeat_timeout" else (134, "exit")
        status = "failed"
        first_error = w.node(
            hosts[0], "F1122 Terminating process because the JAX distributed service detected fatal errors."
        )
    elif fail == "stage_timeout":
        for h in hosts:
            out.append(w.node(h, "run_stage.sh: stage 'train' exceeded its 25 s limit on " + h))
        records = {h: (124, "timeout") for h in hosts}
        status = "stage_timeout"
        first_error = w.node(hosts[0], "run_stage.sh: stage 'train' exceeded its 25 s limit on " + hosts[0])
    elif fail == "cancelled":
        out.append("srun: Job step aborted: Waiting up to 12 seconds for job step to finish.")
        out.append(f"slurmstepd-{hosts[0]}: error: *** JOB {job.job_id} ON {hosts[0]} CANCELLED AT {iso(t_fail)} ***")
        out.append("_job.sbatch: received a stop signal (job state CANCELLED); stopping stage 'train'")
        for h in hosts:
            out.append(f"srun: error: {h}: task {hosts.index(h)}: Exited with exit code 143")
        records = {h: (143, "stopped") for h in hosts}
        records[hosts[-1]] = None  # seen on the local cluster: scancel ended a node before it recorded
        status = "cancelled"
    elif fail == "time_limit":
        # sbatch --time ran out: slurmstepd's notice, then _job.sbatch's trap (job state TIMEOUT)
        out.append(
            f"slurmstepd-{hosts[0]}: error: *** JOB {job.job_id} ON {hosts[0]} CANCELLED AT {iso(t_fail)} "
            "DUE TO TIME LIMIT ***"
        )
        out.append("_job.sbatch: received a stop signal (job state TIMEOUT); stopping stage 'train'")
        records = {h: (143, "stopped") for h in hosts}
        status = "timeout"
    elif fail == "node_failure":
        out.append(f"srun: error: Node failure on {culprit}")
        out.append(
            f"slurmstepd-{hosts[0]}: error: *** JOB {job.job_id} ON {hosts[0]} CANCELLED AT {iso(t_fail + 30)} "
            "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
        )
        records.update({h: (143, "stopped") for h in survivors})
        records[culprit] = None
        status = "cancelled"
    elif fail == "nan_loss":
        # MaxText 0.2.5 (common/metric_logger.py): every host logs the step whose loss is nan, then
        # "Aborting training due to NaN loss." and sys.exit(1) (tests/fixtures/maxtext_0.2.5/nan_loss_steps.log)
        for h in hosts:
            out.append(w.absl(h, t_fail - 0.9, "Aborting training due to NaN loss.", where="metric_logger.py:349"))
        out.append(f"srun: error: {culprit}: task {hosts.index(culprit)}: Exited with exit code 1")
        records = {h: (1, "exit") for h in hosts}
        status = "failed"
        first_error = ""
    elif fail == "hang":
        pass  # nothing more: every rank waits in a collective
    return out, _Outcome(records, status, first_error), (t_fail if fail else t + 1)


def steps_value(job: Job, lines: list[str]) -> str:
    """The JOB SUMMARY's `steps:` (utils/launch/job_summary.sh through joblog.steps_seen): the step lines
    of the first host that printed one, "FIRST..LAST (N lines[ on HOST])", or "none"."""
    ref, steps = None, []
    for ln in lines:
        if "completed step: " not in ln:
            continue
        host = ln.split(": ", 1)[0] if job.host_prefix else None
        if not steps:
            ref = host
        if host == ref:
            steps.append(int(ln.split("completed step: ", 1)[1].split(",", 1)[0]))
    if not steps:
        return "none"
    return f"{steps[0]}..{steps[-1]} ({len(steps)} lines{f' on {ref}' if ref else ''})"


def summary_block(job: Job, workspace: Path, o: _Outcome, wall: int, steps: str = "none") -> list[str]:
    failed = [
        f"{h} (exit {rc}{'' if reason == 'exit' else reason})"
        for h, r in o.records.items()
        if r and r[0] != 0 and r[1] != "stopped"
        for rc, reason in [r]
    ]
    culprit = next((f.split()[0] for f in failed), "")
    stopped = [h for h, r in o.records.items() if r and r[1] == "stopped"]
    missing = [h for h, r in o.records.items() if r is None]
    lines = [
        "==================== JOB SUMMARY ====================",
        f"status: {o.status}",
        f"job: {job.job_id} {job.name}",
        f"nodes: {len(job.hosts)} ({' '.join(job.hosts)})",
        f"stage: {o.stage}",
        f"steps: {steps}",
        f"wall_time: {wall // 3600:02d}:{wall % 3600 // 60:02d}:{wall % 60:02d} ({wall} s)",
        f"failed_nodes: {' '.join(failed) or 'none'}",
    ]
    if culprit:
        lines.append(f"first_failure: {culprit}")
    if stopped:
        lines.append(f"stopped_nodes: {' '.join(stopped)}")
    if missing:
        lines.append(f"no_exit_record: {' '.join(missing)}")
    if o.summary_first_error:
        lines.append(f"first_error: {o.summary_first_error}")
    if o.resubmit:
        lines.append(f"resubmit: {o.resubmit}")
    lines += [
        f"job_dir: {workspace}/{job.name}",
        f"log: {workspace}/{job.name}.log",
        "=====================================================",
    ]
    return lines


def write_job(job: Job, workspace: Path) -> Path:
    """Write the log and the job directory; returns the log path."""
    workspace.mkdir(parents=True, exist_ok=True)
    w = _Writer(job)
    log = workspace / f"{job.name}.log"
    job_dir = workspace / job.name
    (job_dir / ".stages" / "preflight").mkdir(parents=True, exist_ok=True)
    lines, outcome, t_end = body(job, w)
    ended = not job.running and job.failure != "hang"
    text = header(job, workspace) + lines
    steps = steps_value(job, lines)
    if ended:
        text += summary_block(job, workspace, outcome, int(t_end - job.start), steps)
    log.write_text("\n".join(text) + "\n")
    link = job_dir / "log"
    if not link.is_symlink():
        link.symlink_to(log)
    for h in job.hosts:
        (job_dir / ".stages" / "preflight" / h).write_text(f"rc=0 end={job.start + 4:.3f} reason=exit\n")
    if ended:
        stage_dir = job_dir / ".stages" / outcome.stage
        stage_dir.mkdir(exist_ok=True)
        for i, (h, r) in enumerate(outcome.records.items()):
            if r is not None:
                end = t_end + (0 if h == job.hosts[job.culprit % len(job.hosts)] else 2 + i * 0.01)
                (stage_dir / h).write_text(f"rc={r[0]} end={end:.3f} reason={r[1]}\n")
        (job_dir / "summary.txt").write_text(
            "\n".join(summary_block(job, workspace, outcome, int(t_end - job.start), steps)) + "\n"
        )
    if job.config_steps is not None:
        cfg = job_dir / "artifact" / "configs"
        cfg.mkdir(parents=True, exist_ok=True)
        (cfg / f"{job.model}.yml").write_text(f'base_config: "base.yml"\nsteps: {job.config_steps}\nlog_period: 5\n')
    os.utime(log, (t_end, t_end))
    return log


def write_big_log(path: Path, hosts: int, min_lines: int, seed: int = 7, absl: bool = True) -> int:
    """A healthy running-then-completed job on HOSTS nodes with at least MIN_LINES lines (benchmark);
    streamed to disk in blocks. Returns the number of lines."""
    names = [f"node{i:03d}" for i in range(1, hosts + 1)]
    steps = min_lines // hosts + 1
    job = Job(
        hosts=names,
        steps=steps,
        total_steps=steps,
        config_lines=900,
        step_time=1.2,
        phases=[(steps // 2, 1.5)],
        warmup_time=60.0,
        seed=seed,
        absl=absl,
    )
    w = _Writer(job)
    rng = random.Random(seed)
    count = 0
    with path.open("w") as f:
        head = header(job, path.parent)
        t0 = job.start + 5
        for rank, host in enumerate(names):
            head += startup(job, w, host, rank, t0)
        f.write("\n".join(head) + "\n")
        count += len(head)
        t = t0 + 30
        block: list[str] = []
        for step in range(steps):
            sec = job.warmup_time if step == 0 else step_time_at(job, step) * (1 + rng.uniform(-0.03, 0.03))
            t += sec
            for h in names:
                block.append(step_line(job, w, h, step, t + rng.uniform(0, 0.004), sec))
            if step % 100 == 0:
                block.append(
                    w.absl(
                        names[0],
                        t,
                        "To see full metrics 'tensorboard --logdir=/ws/run/tensorboard/'",
                        where="metric_logger.py:393",
                    )
                )
            if len(block) > 20000:
                f.write("\n".join(block) + "\n")
                count += len(block)
                block = []
        outcome = _Outcome({h: (0, "exit") for h in names}, "completed")
        block += summary_block(job, path.parent, outcome, int(t - job.start))
        f.write("\n".join(block) + "\n")
        count += len(block)
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workspace", type=Path)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--failure", choices=FAILURES)
    ap.add_argument("--running", action="store_true")
    a = ap.parse_args()
    job = Job(hosts=[f"n{i}" for i in range(1, a.hosts + 1)], steps=a.steps, failure=a.failure, running=a.running)
    print(write_job(job, a.workspace))


if __name__ == "__main__":
    main()
