#!/usr/bin/env python3
"""Incident corpus: complete RAY=1 job directories for the incident families of utils/diagnose.py.

`build(family, workspace, seed, scale)` writes `<workspace>/<id>-JAX-<model>.log` and the job dir
beside it: `prometheus/` (a real TSDB backfilled with promtool through tests/helpers/promfixture.py, with
the series and labels of docs/metrics.md), the `log` symlink, `summary.txt` and `.stages/` records.
Log lines come from tests/helpers/logcorpus.py's writers (header, startup, step lines, JAX heartbeat
block, JOB SUMMARY); only rank 0's step lines are logged, at a sparse cadence (~2000 lines), so
a 24-node 48 h job keeps a small log. Hosts, onset times and magnitudes are drawn from the seed;
per-host hardware traits (temperature offset, power offset, base run queue) come from the host
name, so two jobs on the same hosts look alike.

Families (FAMILIES maps each to the verdict diagnose.py must give):
  healthy                   nothing wrong; checkpoints cause short, mild IO pressure
  hang                      collective deadlock: steps stop, every GPU at 100 % utilization but standby power
  rdma_retransmits          ~1 host in 6 (4 of 24) retransmits (RoCE retrans / ACK timeouts / TCP) from a
                            change point on; throughput drops there (two phases)
  rdma_send_side            1-2 hosts lose what they send from a change point on: their requester-side
                            counters rise (retransmits, ACK timeouts, NAKs received), their 2-4 peers'
                            responder-side ones more (out-of-sequence drops, duplicates); the NIC by seed
                            (seed % 3: mlx5, ionic, bnxt_re); the peers are in notes["peers"]
  rdma_recv_side            1-2 hosts lose what they receive: their responder-side counters rise, their 2-4
                            senders' requester-side ones; the NIC by seed as above
  healthy_ionic             nothing wrong on AMD Pensando (ionic) NICs whose fabric sprays packets over many
                            paths: every host counts out-of-sequence arrivals all run long, one host (behind
                            a busier switch) ten times more; no sender retransmits
  network_burst             one host retransmits (TCP) for 15-25 minutes, then recovers; the run's slowest
                            phase is elsewhere (a later, lasting slowdown no metric explains)
  tcp_link_loss             a 2-node job (collectives over TCP) whose one node's outgoing link drops packets
                            for 5-15 minutes: throughput collapses 5-20x, both hosts' TCP retransmits rise a
                            little (from ~0.05-0.6/s by 1-3/s; timeouts a tenth of that: RTO-bound) and the
                            segments they send fall with the traffic; neither end stands out (the live
                            incident of issue 22 item 8): network, fleet scope (the link), no culprit
  tcp_fleet_loss            the same on a 4-node job whose switch drops packets: every host retransmits
                            (2-12/s, within 2x of each other): network, fleet scope, no culprit
  tcp_local_drop            a 2-node job whose one node's own stack drops 5-25 % of what it sends before
                            its NIC for 5-15 minutes (Ip OutRequests above OutTransmits there; measured live
                            with `drill.sh net --loss 20 --inside`: its peer then counts ~3x its retransmits):
                            network, culprit the dropping node, never its louder peer
  heartbeat_false_positive  JAX declares tasks dead, yet they kept logging and drawing full power (the
                            accused hosts are in notes["accused"]; they are healthy, so no culprit)
  thread_leak               run queue +17 on every host, throughput -1 % (found with --vs against `vs`);
                            fleet-wide: no culprit, every host affected (Incident.affected)
  moe_lb_spike              MoE load-balance loss, loss and grad-norm spikes, every system metric clean; from
                            the first spike on the steps are 12-35 % slower (the seed case's decline)
  grad_spike_brief          one brief grad-norm spike (a few steps) that costs no throughput: no incident
  gpu_thermal               one host's GPUs run hot and clock down (NVIDIA: thermal throttle reasons)
  gpu_power_cap             one host's GPU power limit lowered: power pinned at the cap, clocks down
  gpu_ecc                   one GPU counts ECC/RAS errors and PCIe AER errors
  gpu_xid                   only the kernel log tells: one GPU of one host logs 1-3 GPU error events
                            (hw_gpu_kernel_errors_total: NVIDIA Xid 79 "fallen off the bus", no gpu label, or
                            Xid 48 double-bit ECC; amdgpu gpu_reset on AMD), and the job runs 15-40 % slower
                            from the first on; no RAS/ECC or AER count moves
  cpu_hog                   a stray process on one host: run queue and CPU pressure up, job slower
  io_pressure               checkpoint saves stall on IO (all hosts: shared storage, fleet-wide, no culprit;
                            or one host's slow disk)
  host_oom                  host memory leak on one host, then the kernel OOM killer ends the job
  midrun_slowdown           steps 25-35 % longer for 10-20 minutes in the middle of the run, then as fast as
                            before, and no metric moves with it (no culprit, verdict none): triage must see
                            three phases (the dip's first and last steps are in notes["dip_steps"])

    tests/helpers/corpus.py OUT [--family F ...] [--seed N] [--scale small|full]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import random
import re
import runpy
import sys
import time
from collections.abc import Iterator
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "utils" / "entry.py"))["enter_venv"]()

import numpy as np

from helpers import logcorpus as lc
from helpers.promfixture import write_tsdb

FAMILIES: dict[str, str] = {
    "healthy": "none",
    "hang": "hang",
    "rdma_retransmits": "network",
    "rdma_send_side": "network",
    "rdma_recv_side": "network",
    "healthy_ionic": "none",
    "network_burst": "network",
    "tcp_link_loss": "network",
    "tcp_fleet_loss": "network",
    "tcp_local_drop": "network",
    "heartbeat_false_positive": "heartbeat_false_positive",
    "thread_leak": "cpu_contention",
    "moe_lb_spike": "training_dynamics",
    "gpu_thermal": "gpu_thermal",
    "gpu_power_cap": "gpu_power",
    "gpu_ecc": "gpu_hardware",
    "gpu_xid": "gpu_hardware",
    "cpu_hog": "cpu_contention",
    "io_pressure": "io_pressure",
    "host_oom": "memory",
    "grad_spike_brief": "none",
    "midrun_slowdown": "none",
}
FAMILY_HOSTS = {"tcp_link_loss": 2, "tcp_fleet_loss": 4, "tcp_local_drop": 2}  # families with their own number of hosts
BASE_EPOCH = 1795322400  # 2026-11-22T04:00:00Z, as tests/helpers/logcorpus.py


@dataclasses.dataclass(frozen=True)
class Scale:
    hosts: int = 24
    gpus: int = 8
    hours: float = 48.0
    interval: int = 30  # seconds between exporter samples (the real default is 5)
    nics: int = 8  # RDMA devices per host
    log_lines: int = 2000  # about this many step lines in the log


FULL = Scale()
SMALL = Scale(hosts=12, gpus=2, hours=3.0, interval=60, nics=2, log_lines=400)

VENDORS = {
    # power (W), core/memory clocks (MHz), VRAM, temperature sensors: (idle, under load) in C
    "amd": dict(
        limit=750.0,
        idle=140.0,
        load=640.0,
        clock=2100.0,
        clock_idle=800.0,
        mclock=1300.0,
        vram=192 * 2**30,
        sensors={"edge": (38.0, 60.0), "junction": (42.0, 82.0), "mem": (40.0, 72.0)},
        speed=32.0,
    ),
    "nvidia": dict(
        limit=700.0,
        idle=80.0,
        load=590.0,
        clock=1980.0,
        clock_idle=345.0,
        mclock=2619.0,
        vram=80 * 2**30,
        sensors={"gpu": (35.0, 66.0), "mem": (38.0, 74.0)},
        speed=32.0,
    ),
}
DENSE_MODELS = ("llama3.1-70b", "llama3.1-405b", "qwen3-32b")
MOE_MODELS = ("mixtral-8x22b", "deepseek3-671b", "qwen3-235b-a22b")
# Parameters a token passes through (the active ones for MoE; from the models' published configs), for
# TFLOP/s = 6 * N * tokens/s * (1 + attention share); the attention share is a rough 10 %.
ACTIVE_PARAMS = {
    "llama3.1-70b": 70.6e9,
    "llama3.1-405b": 405.9e9,
    "qwen3-32b": 32.8e9,
    "mixtral-8x22b": 39.1e9,
    "deepseek3-671b": 37.6e9,
    "qwen3-235b-a22b": 22.2e9,
}
ATTENTION_SHARE = 0.10
# Dense bf16 peak TFLOP/s per GPU (vendor data sheets: MI300X 1307.4, H100 SXM 989.4); the corpus runs at
# 36-54 % of it (MFU), the range well-tuned large runs report.
PEAK_TFLOPS = {"amd": 1307.4, "nvidia": 989.4}
MFU = (0.36, 0.54)


def flops_per_token(model: str) -> float:
    """Training FLOPs per token (forward and backward) of a corpus model."""
    return 6 * ACTIVE_PARAMS[model] * (1 + ATTENTION_SHARE)


@dataclasses.dataclass
class Incident:
    """One built job: where it is and what diagnose.py should say about it."""

    family: str
    seed: int
    job_dir: Path
    log: Path
    hosts: list[str]
    verdict: str
    culprits: list[str]  # the hosts at fault (diagnose's culprit_hosts); none for a fleet-wide cause
    affected: list[str] = dataclasses.field(default_factory=list)  # a fleet-wide cause's hosts (every one)
    vs: Path | None = None  # clean twin to diagnose against (--vs)
    window: tuple[float, float] | None = None  # when the incident is active (unix s)
    notes: dict = dataclasses.field(default_factory=dict)


def host_trait(host: str, what: str, lo: float, hi: float) -> float:
    """A stable per-host value in [lo, hi) (the same host looks the same in every job)."""
    h = int.from_bytes(hashlib.sha256(f"{host}/{what}".encode()).digest()[:8], "big")
    return lo + (hi - lo) * (h / 2**64)


def host_names(r: random.Random, n: int, vendor: str) -> list[str]:
    prefix = r.choice(["node", "gpu", "mi300x-" if vendor == "amd" else "h100-"])
    base = r.randrange(1, 400)
    return [f"{prefix}{base + i:03d}" for i in range(n)]


class _Sim:
    """Timeline, steps and per-host system state of one job (numpy arrays over the sample times)."""

    def __init__(
        self,
        family: str,
        seed: int,
        scale: Scale,
        *,
        hosts: list[str] | None = None,
        twin: _Sim | None = None,
        after_twin: bool = True,
        node: dict | None = None,
        drop: tuple[str, ...] = (),
    ) -> None:
        self.family, self.seed, self.scale, self.drop = family, seed, scale, drop
        self.r = random.Random(f"{family}/{seed}")
        self.rng = np.random.default_rng(_seed_int(family, seed))
        r = self.r
        if twin is not None:  # a rerun of the twin's job (an hour after it, or before): same hosts, model and speed
            self.hosts, self.vendor, self.model, self.nic = hosts or twin.hosts, twin.vendor, twin.model, twin.nic
            gap = int(scale.hours * 3600) + 3600
            self.step_time, self.tokens, self.t0 = twin.step_time, twin.tokens, twin.t0 + (gap if after_twin else -gap)
            self.mfu = twin.mfu
        else:
            self.vendor = r.choice(["amd", "nvidia"])
            self.nic = SIDE_NIC.get(family, lambda seed: None)(seed)  # these families pick their NIC
            if self.nic:
                self.vendor = "nvidia" if self.nic == "mlx5" else "amd"
            self.hosts = hosts or host_names(r, FAMILY_HOSTS.get(family, scale.hosts), self.vendor)
            self.model = r.choice(MOE_MODELS if family == "moe_lb_spike" else DENSE_MODELS + MOE_MODELS)
            self.step_time = r.uniform(3.0, 6.0)
            r.choice([8192, 16384, 32768])  # (was the tokens per step; kept so the seeds draw the same jobs)
            self.t0 = BASE_EPOCH + r.randrange(0, 60) * 86400
            # tokens per device and step follow from the model size and the MFU the job runs at
            self.mfu = random.Random(f"{family}/{seed}/mfu").uniform(*MFU)
            peak = PEAK_TFLOPS[self.vendor] * 1e12
            self.tokens = float(round(self.mfu * peak * self.step_time / flops_per_token(self.model)))
        self.moe = self.model in MOE_MODELS
        self.node = node or {}  # another node type: "memory" (x the host memory), "limit" (GPU power limit, W)
        self.spec = VENDORS[self.vendor]
        self.dur = int(scale.hours * 3600)
        self.ts = self.t0 + np.arange(0, self.dur, scale.interval)
        self.t_train = self.t0 + r.randrange(180, 420)
        self.t_stop = float(self.ts[-1]) - 60  # training end (earlier on a failure)
        self.t_last = float(self.ts[-1])  # last exporter sample
        self.compile_s = r.uniform(60, 200)
        self.ckpt_period = r.uniform(30, 60) * 60
        self.ckpt_dur = (20.0, 45.0)
        self.slow: list[tuple[float, float, float]] = []  # (from, to, factor) on step time
        self.culprits: list[str] = []
        self.affected: list[str] = []  # a fleet-wide cause's hosts (no culprit)
        self.accused: list[str] = []  # hosts a heartbeat claim names
        self.window: tuple[float, float] | None = None
        self.notes: dict = {}
        self.t_hang: float | None = None
        self.claim: float | None = None
        self.oom: float | None = None
        self.host_fx: dict[str, dict] = {h: {} for h in self.hosts}
        self.spikes: list[tuple[int, int, float, float, float]] = []  # (step, width, lb x, loss +, grad x)
        self.io = dict(some=(3.0, 8.0), full=(1.0, 4.0), hosts=self.hosts, blocked=(0, 3))
        self.procs_add = 0
        self._plan()
        self._steps()

    # --- families -------------------------------------------------------------------------
    def frac(self, lo: float, hi: float) -> float:
        """A time lo..hi of the way through the training window."""
        return self.t_train + self.r.uniform(lo, hi) * (self.t_stop - self.t_train)

    def pick(self, k: int = 1, skip_head: bool = False) -> list[str]:
        pool = self.hosts[1:] if skip_head else self.hosts
        return sorted(self.r.sample(pool, k), key=self.hosts.index)

    def _plan(self) -> None:
        r, f = self.r, self.family
        if f == "hang":
            self.t_hang = self.frac(0.55, 0.8)
            self.t_stop = self.t_hang
            self.window = (self.t_hang, self.t_last)
        elif f == "rdma_retransmits":
            k = max(1, round(len(self.hosts) / 6))
            self.culprits = self.pick(k)
            t = self.frac(0.3, 0.6)
            kind = r.choice(["roce_adp_retrans", "local_ack_timeout_err", "tcp"])
            self.slow.append((t, np.inf, r.uniform(1.15, 1.45)))
            for h in self.culprits:
                devs = r.sample(range(self.scale.nics), r.randint(1, self.scale.nics))
                self.host_fx[h]["retrans"] = (t, kind, r.uniform(30, 400), devs)
            self.window = (t, self.t_stop)
            self.notes["counter"] = kind
        elif f in ("rdma_send_side", "rdma_recv_side"):
            k = r.choice([1, 1, 2])
            self.culprits = self.pick(k)
            t = self.frac(0.3, 0.6)
            self.slow.append((t, np.inf, r.uniform(1.15, 1.45)))
            rest = [h for h in self.hosts if h not in self.culprits]
            peers = {p for _ in self.culprits for p in r.sample(rest, r.randint(2, 4))}
            while len(peers) <= k:  # the errors gather on the culprits' end: more peers than culprits
                peers.add(r.choice(rest))
            lost = r.uniform(5, 60)  # what the culprits' links lose, /s
            send = f == "rdma_send_side"
            for h in self.culprits:  # the receivers drop every packet after a lost one: more counts there
                self.host_fx[h]["side"] = (t, "requester", lost) if send else (t, "responder", lost * r.uniform(1.5, 4))
            for h in sorted(peers, key=self.hosts.index):
                self.host_fx[h]["side"] = (
                    (t, "responder", lost * r.uniform(1.5, 4)) if send else (t, "requester", r.uniform(3, 30))
                )
            self.window = (t, self.t_stop)
            self.notes["peers"] = sorted(peers, key=self.hosts.index)
        elif f == "healthy_ionic":
            self.notes["reordering_host"] = self.pick(1)[0]
        elif f == "network_burst":
            self.culprits = self.pick(1)
            t, dur = self.frac(0.15, 0.35), r.uniform(15, 25) * 60
            self.host_fx[self.culprits[0]]["tcp_burst"] = (t, t + dur, r.uniform(10, 60))
            self.slow.append((t, t + dur, r.uniform(1.02, 1.06)))
            self.slow.append((self.frac(0.6, 0.8), np.inf, r.uniform(1.15, 1.3)))
            self.window = (t, t + dur)
        elif f in ("tcp_link_loss", "tcp_fleet_loss"):
            t, dur = self.frac(0.3, 0.6), r.uniform(5, 15) * 60
            slower = r.uniform(5, 20)
            self.slow.append((t, t + dur, slower))
            link = f == "tcp_link_loss"
            lossy = self.pick(1)[0] if link else None  # its outgoing link drops: it resends, its peer too
            level = r.uniform(2, 12)
            for h in self.hosts:
                rate = r.uniform(1.5, 3) if h == lossy else r.uniform(1, 2.5) if link else level * r.uniform(0.7, 1.4)
                self.host_fx[h]["tcp_loss"] = (t, t + dur, rate, slower)
            self.affected = list(self.hosts)
            self.window = (t, t + dur)
            self.notes["lossy"] = lossy
        elif f == "tcp_local_drop":
            t, dur = self.frac(0.3, 0.6), r.uniform(5, 15) * 60
            slower = r.uniform(5, 20)
            self.slow.append((t, t + dur, slower))
            self.culprits = self.pick(1)
            share = r.uniform(0.05, 0.25)
            for h in self.hosts:  # the dropping host resends little (a failed send is no retransmit); its peer more
                rate = r.uniform(0.3, 1.5) if h in self.culprits else r.uniform(3, 12)
                self.host_fx[h]["tcp_loss"] = (t, t + dur, rate, slower)
            self.host_fx[self.culprits[0]]["local_drop"] = (t, t + dur, share)
            self.window = (t, t + dur)
        elif f == "heartbeat_false_positive":
            self.accused = self.pick(r.choice([1, 1, 2]), skip_head=True)
            self.claim = self.frac(0.4, 0.85)
            self.t_stop = self.claim
            self.t_last = self.claim + r.uniform(30, 90)
            self.window = (self.claim - 300, self.claim)
        elif f == "thread_leak":
            self.procs_add = 17
            self.slow.append((-np.inf, np.inf, 1.01))
            self.affected = list(self.hosts)
            self.window = (self.t_train, self.t_stop)
        elif f == "moe_lb_spike":
            self.notes["spikes"] = r.randint(1, 3)
            # the seed case: the run got slower from the first spike on and stayed slower
            self.t_spike = self.frac(0.15, 0.8)
            self.notes["slower"] = r.uniform(1.12, 1.35)
            self.slow.append((self.t_spike, np.inf, self.notes["slower"]))
        elif f == "grad_spike_brief":
            self.t_spike = self.frac(0.2, 0.8)
        elif f == "midrun_slowdown":
            t = self.frac(0.3, 0.6)
            self.dip = (t, t + self.r.uniform(10, 20) * 60)
            self.slow.append((*self.dip, r.uniform(1.25, 1.35)))
            self.window = self.dip
        elif f in ("gpu_thermal", "gpu_power_cap", "gpu_ecc", "gpu_xid", "cpu_hog", "host_oom"):
            self.culprits = self.pick(1)
            h = self.culprits[0]
            t = self.t0 if (f != "host_oom" and r.random() < 0.25) else self.frac(0.2, 0.6)
            self.window = (t, self.t_stop)
            if f == "gpu_thermal":
                clock = r.uniform(0.6, 0.8)
                gpus = r.sample(range(self.scale.gpus), r.randint(1, self.scale.gpus))
                self.host_fx[h]["thermal"] = (t, r.uniform(18, 30), clock, gpus, r.choice([0x20, 0x40 | 0x8]))
                self.slow.append((t, np.inf, 0.95 / clock))
            elif f == "gpu_power_cap":
                clock = r.uniform(0.75, 0.88)
                self.host_fx[h]["powercap"] = (t, r.uniform(0.55, 0.75), clock)
                self.slow.append((t, np.inf, 0.97 / clock))
            elif f == "gpu_ecc":
                g = r.randrange(self.scale.gpus)
                self.host_fx[h]["ecc"] = (t, g, r.uniform(0.2, 2.0), r.randint(1, 4), r.uniform(0.05, 0.5))
            elif f == "gpu_xid":
                t = self.frac(0.2, 0.6)  # the exporter's first poll only notes where the log ends: never at t0
                self.window = (t, self.t_stop)
                code = r.choice(["79", "48"]) if self.vendor == "nvidia" else "gpu_reset"
                gpu = None if code == "79" else r.randrange(self.scale.gpus)  # off the bus: bound to no driver
                times = sorted([t] + [r.uniform(t, self.t_stop) for _ in range(r.randint(0, 2))])
                self.host_fx[h]["xid"] = (code, gpu, times)
                self.slow.append((t, np.inf, r.uniform(1.15, 1.4)))
                self.notes["code"] = code
            elif f == "cpu_hog":
                self.host_fx[h]["hog"] = (t, r.randint(25, 60), r.uniform(20, 50))
                self.slow.append((t, np.inf, r.uniform(1.05, 1.25)))
            else:
                self.oom = self.frac(0.5, 0.9)
                self.host_fx[h]["leak"] = (self.frac(0.1, 0.3), self.oom)
                self.notes["leak"] = self.host_fx[h]["leak"]  # (onset, OOM kill): linear decline in between
                self.t_stop = self.oom
                self.t_last = self.oom + r.uniform(60, 120)
                self.window = (self.oom - 600, self.oom)
        elif f == "io_pressure":
            shared = r.random() < 0.5
            hosts = list(self.hosts) if shared else self.pick(1)
            self.ckpt_dur = (180.0, 480.0)
            self.io = dict(some=(60.0, 98.0), full=(40.0, 90.0), hosts=hosts, blocked=(8, 40))
            self.culprits, self.affected = ([], hosts) if shared else (hosts, [])
            self.window = (self.t_train, self.t_stop)
            self.notes["shared"] = shared
        elif f not in ("healthy", "healthy_ionic"):
            raise ValueError(f"unknown family {f!r} (known: {', '.join(FAMILIES)})")
        self.ts = self.ts[self.ts <= self.t_last]

    # --- steps ----------------------------------------------------------------------------
    def factor(self, t: float) -> float:
        out = 1.0
        for lo, hi, k in self.slow:
            if lo <= t < hi:
                out *= k
        return out

    def _steps(self) -> None:
        """Step end times and durations; checkpoint stalls (windows recorded in self.stalls)."""
        r = self.r
        t, step = self.t_train + self.compile_s, 0
        ends, durs, self.stalls = [t], [self.compile_s], []
        noise = self.rng.normal(0, 0.012, size=int((self.t_stop - self.t_train) / (self.step_time * 0.5)) + 10)
        next_ckpt = self.t_train + self.ckpt_period
        while True:
            step += 1
            dur = self.step_time * self.factor(t) * (1 + noise[step % len(noise)])
            if t >= next_ckpt:
                stall = r.uniform(*self.ckpt_dur)
                self.stalls.append((t, t + stall))
                dur += stall
                next_ckpt += self.ckpt_period
            if t + dur > self.t_stop:
                break
            t += dur
            ends.append(t)
            durs.append(dur)
        self.step_end = np.array(ends)
        self.step_dur = np.array(durs)
        self.steps = np.arange(len(ends))
        n = len(ends)
        if self.family == "moe_lb_spike":
            first = min(int(np.searchsorted(self.step_end, self.t_spike)), n - n // 10 - 1)
            self.spikes.append((first, r.randint(20, 300), r.uniform(5, 30), r.uniform(0.2, 1.0), r.uniform(4, 15)))
            for _ in range(self.notes["spikes"] - 1):
                at = r.randrange(first, n - n // 10)
                self.spikes.append((at, r.randint(20, 300), r.uniform(5, 30), r.uniform(0.2, 1.0), r.uniform(4, 15)))
        elif self.family == "grad_spike_brief":  # grad norm only, x4-10 for 3-15 steps
            first = min(int(np.searchsorted(self.step_end, self.t_spike)), n - 20)
            self.spikes.append((first, r.randint(3, 15), 1.0, 0.0, r.uniform(4, 10)))
        if self.family == "midrun_slowdown":  # a step is slow when it starts inside the dip
            a, b = (int(np.searchsorted(self.step_end, t)) + 1 for t in self.dip)
            self.notes["dip_steps"] = (a, b - 1)
        if self.spikes:
            first = min(s[0] for s in self.spikes)
            self.notes["spike_step"] = first
            last = min(max(s[0] + s[1] for s in self.spikes), n - 1)
            self.window = (float(self.step_end[first]), float(self.step_end[last]))

    # --- per-sample state -----------------------------------------------------------------
    def masks(self) -> dict[str, np.ndarray]:
        ts = self.ts
        train = (ts >= self.t_train + self.compile_s) & (ts < self.t_stop)
        stall = np.zeros(len(ts), bool)
        for a, b in self.stalls:
            stall |= (ts >= a) & (ts < b)
        hang = (ts >= self.t_hang) if self.t_hang is not None else np.zeros(len(ts), bool)
        compute = np.where(train & ~stall, 1.0 / np.array([self.factor(t) for t in ts]), 0.0)
        return {
            "train": train,
            "stall": stall,
            "hang": hang,
            "compute": compute,
            "alive": (ts >= self.t_train) & ((ts < self.t_stop) | hang),
        }


def _seed_int(family: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{family}/{seed}".encode()).digest()[:4], "big")


def _after(ts: np.ndarray, t: float) -> np.ndarray:
    return ts >= t


# The RDMA NIC of a job's hosts and its hw_counters file names for the three retransmit-like counters
# the corpus draws (keyed by the mlx5 name): NVIDIA nodes have ConnectX (mlx5), AMD nodes AMD Pensando
# Pollara (ionic) or Broadcom Thor (bnxt_re). Names: tests/fixtures/sysfs/README.md.
RDMA_NICS: dict[str, dict[str, str]] = {
    "mlx5": {
        "roce_adp_retrans": "roce_adp_retrans",
        "local_ack_timeout_err": "local_ack_timeout_err",
        "roce_adp_retrans_to": "roce_adp_retrans_to",
    },
    "ionic": {
        "roce_adp_retrans": "tx_rdma_retx_pkts",
        "local_ack_timeout_err": "tx_rdma_ack_timeout",
        "roce_adp_retrans_to": "req_rx_pkt_seq_err",
    },
    "bnxt_re": {
        "roce_adp_retrans": "seq_err_naks_rcvd",
        "local_ack_timeout_err": "to_retransmits",
        "roce_adp_retrans_to": "oos_drop_count",
    },
}


# The counters each side of a reliable connection counts, per NIC, with the share of a fault's count each
# gets (the requester: the sending end; the responder: the receiving end; utils/launch/rdma_providers.tsv
# `sides`). Names from the drivers (torvalds/linux): mlx5 drivers/infiniband/hw/mlx5/counters.c
# (retrans_q_cnts, out_of_seq_q_cnts, roce_accl_cnts), bnxt_re drivers/infiniband/hw/bnxt_re/hw_counters.c
# (bnxt_re_stat_descs), ionic drivers/infiniband/hw/ionic/ionic_hw_stats.c (the names come from the
# firmware: the Pollara 400's, tests/fixtures/sysfs/README.md).
SIDE_COUNTERS: dict[str, dict[str, dict[str, float]]] = {
    "mlx5": {
        "requester": {"roce_adp_retrans": 0.6, "local_ack_timeout_err": 0.1, "packet_seq_err": 0.3},
        "responder": {"out_of_sequence": 0.9, "duplicate_request": 0.1},
    },
    "bnxt_re": {
        "requester": {"to_retransmits": 0.5, "seq_err_naks_rcvd": 0.35, "missing_resp": 0.15},
        "responder": {"oos_drop_count": 0.9, "dup_req": 0.1},
    },
    "ionic": {
        "requester": {"tx_rdma_retx_pkts": 0.6, "tx_rdma_ack_timeout": 0.1, "req_rx_pkt_seq_err": 0.3},
        "responder": {"resp_rx_outouf_seq": 0.9, "resp_rx_dup_request": 0.1},
    },
}
NICS = ("mlx5", "ionic", "bnxt_re")
# families whose NIC the seed picks (seed % 3), so a few seeds cover every vendor
SIDE_NIC = {
    "rdma_send_side": lambda seed: NICS[seed % 3],
    "rdma_recv_side": lambda seed: NICS[seed % 3],
    "healthy_ionic": lambda seed: "ionic",
}


def _rdma_nic(sim: _Sim) -> tuple[str, dict[str, str]]:
    """(driver, counter names) of the job's NICs, from the first host's name (draws no random number)."""
    if sim.nic:
        return sim.nic, RDMA_NICS[sim.nic]
    if sim.vendor != "amd":
        return "mlx5", RDMA_NICS["mlx5"]
    nic = ("ionic", "bnxt_re")[hashlib.sha256(sim.hosts[0].encode()).digest()[0] % 2]
    return nic, RDMA_NICS[nic]


def _counter(rng: np.random.Generator, rate: np.ndarray, interval: float, start: float = 0.0) -> np.ndarray:
    """Cumulative counter with Poisson increments of rate/s (floats for big rates)."""
    lam = np.maximum(rate, 0) * interval
    inc = np.where(lam > 1e4, lam * (1 + rng.normal(0, 0.02, len(lam))), rng.poisson(np.minimum(lam, 1e4)))
    return start + np.cumsum(np.maximum(inc, 0))


class _Series:
    """Every series of one job, generated lazily (write_openmetrics materialises one at a time)."""

    def __init__(self, sim: _Sim) -> None:
        self.sim = sim
        self.m = sim.masks()
        self.ts_list = sim.ts.tolist()
        self.n = len(sim.ts)

    def noise(self, *key: object, sd: float = 1.0) -> np.ndarray:
        return np.random.default_rng(_seed_int("/".join(map(str, key)), self.sim.seed)).normal(0, sd, self.n)

    def samples(self, values: np.ndarray, digits: int = 2) -> Iterator[tuple[float, float]]:
        vals = np.round(values, digits).tolist() if digits >= 0 else values.astype(np.int64).tolist()
        yield from zip(self.ts_list, vals, strict=True)

    def all(self) -> Iterator[tuple[str, dict, Iterator]]:
        for rank, host in enumerate(self.sim.hosts):
            base = {"host": host, "node_rank": str(rank)}
            yield from self.gpu(host, base)
            yield from self.host(host, base)
            yield from self.rdma(host, base)
        yield from self.tb()

    # --- GPU ------------------------------------------------------------------------------
    def gpu(self, host: str, base: dict) -> Iterator[tuple[str, dict, Iterator]]:
        sim, m, spec, ts = self.sim, self.m, self.sim.spec, self.sim.ts
        fx = sim.host_fx[host]
        for g in range(sim.scale.gpus):
            lab = {**base, "gpu": str(g), "vendor": sim.vendor}
            limit = np.full(self.n, sim.node.get("limit", spec["limit"]))
            clock_k = np.ones(self.n)
            extra_t = np.zeros(self.n)
            throttle = np.where(m["alive"], 0, 1).astype(float)
            if "thermal" in fx and g in fx["thermal"][3]:
                t, dt, ck, _, bits = fx["thermal"]
                on = _after(ts, t) & m["train"]
                extra_t[on] = dt
                clock_k[on] = ck
                throttle[on] = bits
            if "powercap" in fx:
                t, cap, ck = fx["powercap"]
                on = _after(ts, t)
                limit[on] = spec["limit"] * cap
                clock_k[on & m["train"]] = ck
                throttle[on & m["train"]] = 0x4
            if sim.vendor == "nvidia":  # under load the SW power cap flickers on every GPU now and then
                flick = (self.noise(host, g, "flick") > 1.9) & m["train"]
                throttle[flick] = np.maximum(throttle[flick], 0x4)
            load = spec["load"] + host_trait(host, f"pw{g}", -25, 25)
            busy = m["compute"]
            power = spec["idle"] + (load - spec["idle"]) * busy * (1 + 0.015 * self.noise(host, g, "pw"))
            power = np.where(m["hang"], spec["idle"] * 1.12 + 3 * self.noise(host, g, "hpw"), power)
            power = np.minimum(power, limit * 0.985 + 2 * self.noise(host, g, "cap"))
            util = np.where(m["train"] & ~m["stall"], 99.3 + 0.6 * self.noise(host, g, "u"), 0.0)
            util = np.where(m["stall"] & m["train"], 3.0, util)
            util = np.clip(np.where(m["hang"], 100.0, util), 0, 100)
            heat = (power - spec["idle"]) / (spec["load"] - spec["idle"])
            for sensor, (cold, hot) in spec["sensors"].items():
                temp = cold + (hot - cold) * heat + host_trait(host, f"t{g}{sensor}", -3, 3) + extra_t
                yield (
                    "hw_gpu_temperature_celsius",
                    {**lab, "sensor": sensor},
                    self.samples(temp + 0.7 * self.noise(host, g, sensor), 1),
                )
            yield "hw_gpu_power_watts", lab, self.samples(power, 1)
            yield "hw_gpu_power_limit_watts", lab, self.samples(limit, 1)
            yield "hw_gpu_utilization_pct", lab, self.samples(util, 0)
            yield "hw_gpu_memory_utilization_pct", lab, self.samples(util * 0.45, 0)
            active = (m["train"] & ~m["stall"]) | m["hang"]
            core = np.where(
                active, spec["clock"] * clock_k * (0.97 + 0.01 * self.noise(host, g, "ck")), spec["clock_idle"]
            )
            yield "hw_gpu_clock_mhz", {**lab, "type": "core"}, self.samples(core, 0)
            yield "hw_gpu_clock_mhz", {**lab, "type": "memory"}, self.samples(np.full(self.n, spec["mclock"]), 0)
            vram = np.where(m["alive"], spec["vram"] * 0.91, 2**29)
            yield "hw_gpu_vram_used_bytes", lab, self.samples(vram, -1)
            yield "hw_gpu_vram_total_bytes", lab, self.samples(np.full(self.n, spec["vram"]), -1)
            ue, ce, aer = np.zeros(self.n), np.zeros(self.n), np.zeros(self.n)
            if "ecc" in fx and fx["ecc"][1] == g:
                t, _, ce_rate, ue_n, aer_rate = fx["ecc"]
                on = _after(ts, t)
                ce = _counter(self.sim.rng, np.where(on, ce_rate, 0), sim.scale.interval)
                aer = _counter(self.sim.rng, np.where(on, aer_rate, 0), sim.scale.interval)
                hits = np.sort(self.sim.rng.choice(np.flatnonzero(on), size=min(ue_n, int(on.sum())), replace=False))
                ue = np.searchsorted(hits, np.arange(self.n), side="right").astype(float)
            block = "umc" if sim.vendor == "amd" else "total"
            yield "hw_gpu_ras_errors_total", {**lab, "kind": "ue", "block": block}, self.samples(ue, -1)
            yield "hw_gpu_ras_errors_total", {**lab, "kind": "ce", "block": block}, self.samples(ce, -1)
            yield "hw_gpu_pcie_aer_errors_total", {**lab, "severity": "correctable"}, self.samples(aer, -1)
            for sev in ("nonfatal", "fatal"):
                yield "hw_gpu_pcie_aer_errors_total", {**lab, "severity": sev}, self.samples(np.zeros(self.n), -1)
            yield "hw_gpu_pcie_link_width", lab, self.samples(np.full(self.n, 16.0), 0)
            yield "hw_gpu_pcie_link_speed_gts", lab, self.samples(np.full(self.n, spec["speed"]), 1)
            if sim.vendor == "nvidia":
                yield "hw_gpu_throttle_reasons", lab, self.samples(throttle, -1)

    # --- host -----------------------------------------------------------------------------
    def host(self, host: str, base: dict) -> Iterator[tuple[str, dict, Iterator]]:
        sim, m, ts, iv = self.sim, self.m, self.sim.ts, self.sim.scale.interval
        fx, rng = sim.host_fx[host], sim.rng
        ncpu = 192.0
        procs = host_trait(host, "procs", 3, 7) + 1.5 * self.noise(host, "procs") + sim.procs_add * m["alive"]
        cpu_some = host_trait(host, "cpsome", 0.5, 3) + 0.3 * self.noise(host, "cps")
        if "hog" in fx:
            t, add, pres = fx["hog"]
            procs = procs + add * _after(ts, t)
            cpu_some = cpu_some + pres * _after(ts, t)
        procs = np.maximum(np.round(procs), 0)
        io_on = np.zeros(self.n, bool)
        if host in sim.io["hosts"]:
            io_on = m["stall"]
        ckpt = self.noise(host, "io")
        io_some = np.where(
            io_on,
            sim.io["some"][0] + (sim.io["some"][1] - sim.io["some"][0]) * (0.5 + 0.15 * ckpt),
            0.2 + 0.1 * np.abs(ckpt),
        )
        io_full = np.where(
            io_on,
            sim.io["full"][0] + (sim.io["full"][1] - sim.io["full"][0]) * (0.5 + 0.15 * ckpt),
            0.05 * np.abs(ckpt),
        )
        blocked = np.where(
            io_on,
            np.round(
                sim.io["blocked"][0] + (sim.io["blocked"][1] - sim.io["blocked"][0]) * np.clip(0.5 + 0.2 * ckpt, 0, 1)
            ),
            (self.noise(host, "blk") > 1.5) * 1.0,
        )
        total = 2.0 * 2**40 * sim.node.get("memory", 1.0)
        avail = total * (0.78 - 0.18 * m["alive"]) * (1 + 0.002 * self.noise(host, "mem"))
        mem_some, mem_full = np.zeros(self.n), np.zeros(self.n)
        faults = np.full(self.n, 2.0)
        oom = np.zeros(self.n)
        if "leak" in fx:
            a, b = fx["leak"]
            k = np.clip((ts - a) / (b - a), 0, 1) * (ts < b)
            avail = avail * (1 - k) + total * 0.003 * k
            mem_some = np.where(k > 0.9, 40 + 40 * (k - 0.9) * 10, 0)
            mem_full = mem_some * 0.5
            faults = faults + 2000 * (k > 0.9)
            oom = (ts >= b) * 1.0
        oom = oom + int(host_trait(host, "oldoom", 0, 3))
        yield "hw_procs_running", base, self.samples(procs, 0)
        yield "hw_procs_blocked", base, self.samples(blocked, 0)
        load = procs + blocked
        for name in ("hw_load1", "hw_load5", "hw_load15"):
            yield name, base, self.samples(load, 2)
        yield "hw_memory_total_bytes", base, self.samples(np.full(self.n, total), -1)
        yield "hw_memory_available_bytes", base, self.samples(avail, -1)
        dirty = np.where(io_on | m["stall"], 2e10, 1e8) * (1 + 0.1 * np.abs(self.noise(host, "dirty")))
        yield "hw_memory_dirty_bytes", base, self.samples(dirty, -1)
        yield "hw_memory_writeback_bytes", base, self.samples(np.where(m["stall"], 4e9, 0.0), -1)
        yield "hw_memory_shmem_bytes", base, self.samples(np.full(self.n, 2.7e8), -1)
        yield "hw_cpu_pressure_some_pct", base, self.samples(np.maximum(cpu_some, 0), 2)
        yield "hw_io_pressure_some_pct", base, self.samples(np.clip(io_some, 0, 100), 2)
        yield "hw_io_pressure_full_pct", base, self.samples(np.clip(io_full, 0, 100), 2)
        yield "hw_memory_pressure_some_pct", base, self.samples(np.clip(mem_some, 0, 100), 2)
        yield "hw_memory_pressure_full_pct", base, self.samples(np.clip(mem_full, 0, 100), 2)
        yield "hw_tcp_current_established", base, self.samples(np.full(self.n, 180.0) + m["alive"] * 60, 0)
        busy = m["alive"] * 1.0
        user = ncpu * (0.02 + 0.06 * busy) + np.minimum(procs, ncpu) * 0.5
        for mode, rate in (
            ("user", user),
            ("system", ncpu * 0.01 + 0.02 * procs),
            ("iowait", io_some * 0.2),
            ("idle", ncpu - user),
        ):
            yield (
                "hw_cpu_seconds_total",
                {**base, "mode": mode},
                self.samples(_counter(rng, np.maximum(rate, 0), iv, 1e7), 2),
            )
        yield "hw_context_switches_total", base, self.samples(_counter(rng, 4e4 + 800 * procs, iv, 1e9), -1)
        yield "hw_forks_total", base, self.samples(_counter(rng, np.full(self.n, 3.0), iv, 2e5), -1)
        tcp_rate = np.full(self.n, host_trait(host, "tcpre", 0.05, 0.6))
        if fx.get("retrans") and fx["retrans"][1] == "tcp":
            t, _, rate, _ = fx["retrans"]
            tcp_rate = tcp_rate + rate * 8 * _after(ts, t)
        if fx.get("tcp_burst"):
            t, end, rate = fx["tcp_burst"]
            tcp_rate = tcp_rate + rate * _after(ts, t) * ~_after(ts, end)
        segs = np.full(self.n, 3e3)
        if fx.get("tcp_loss"):  # the traffic collapses with the throughput; retransmits rise a little
            t, end, rate, slower = fx["tcp_loss"]
            on = _after(ts, t) & ~_after(ts, end)
            tcp_rate = tcp_rate + rate * on
            segs = np.where(on, 200 + 2800 / slower, segs)
        yield "hw_tcp_retransmits_total", base, self.samples(_counter(rng, tcp_rate, iv, 5e3), -1)
        yield "hw_tcp_out_segments_total", base, self.samples(_counter(rng, segs, iv, 1e8), -1)
        asked = segs * 0.6  # IP packets the host asked to send; all go out, but for its own stack's drops
        sent = asked
        if fx.get("local_drop"):
            t, end, share = fx["local_drop"]
            sent = asked * (1 - share * (_after(ts, t) & ~_after(ts, end)))
        yield "hw_ip_out_requests_total", base, self.samples(np.cumsum(asked * iv) + 1e9, -1)
        yield "hw_ip_out_transmits_total", base, self.samples(np.cumsum(sent * iv) + 1e9, -1)
        yield "hw_tcp_in_segments_total", base, self.samples(_counter(rng, np.full(self.n, 3.2e3), iv, 1e8), -1)
        yield "hw_tcp_timeouts_total", base, self.samples(_counter(rng, tcp_rate * 0.1, iv, 200), -1)
        yield "hw_oom_kills_total", base, self.samples(oom, -1)
        yield "hw_gpu_kernel_log_readable", base, self.samples(np.ones(self.n), 0)
        if "xid" in fx:  # counted from the exporter's start; the series appears with the first event
            code, gpu, times = fx["xid"]
            lab = {**base, "code": code} if gpu is None else {**base, "gpu": str(gpu), "code": code}
            count = np.searchsorted(times, ts, side="right").astype(float)
            on = count > 0
            yield "hw_gpu_kernel_errors_total", lab, zip(ts[on].tolist(), count[on].tolist(), strict=True)
        yield "hw_major_page_faults_total", base, self.samples(_counter(rng, faults, iv, 1e4), -1)
        net = np.full(self.n, 2e6)
        yield "hw_net_receive_bytes_total", {**base, "device": "eth0"}, self.samples(_counter(rng, net, iv, 1e12), -1)
        yield "hw_net_transmit_bytes_total", {**base, "device": "eth0"}, self.samples(_counter(rng, net, iv, 1e12), -1)

    # --- RDMA -----------------------------------------------------------------------------
    def rdma(self, host: str, base: dict) -> Iterator[tuple[str, dict, Iterator]]:
        sim, m, ts, iv, rng = self.sim, self.m, self.sim.ts, self.sim.scale.interval, self.sim.rng
        fx = sim.host_fx[host].get("retrans")
        traffic = 2.2e10 * m["compute"]
        nic, names = _rdma_nic(sim)
        for d in range(sim.scale.nics):
            lab = {**base, "device": f"{nic}_{d}", "port": "1"}
            yield "hw_ib_port_transmit_bytes_total", lab, self.samples(_counter(rng, traffic, iv, 1e14), -1)
            yield "hw_ib_port_receive_bytes_total", lab, self.samples(_counter(rng, traffic, iv, 1e14), -1)
            yield "hw_ib_port_transmit_wait_total", lab, self.samples(_counter(rng, 3e5 * m["compute"], iv, 1e9), -1)
            for counter in ("local_ack_timeout_err", "roce_adp_retrans", "roce_adp_retrans_to"):
                rate = np.full(self.n, 0.002) + self.side_rate(host, nic, names[counter])
                if fx and fx[1] != "tcp" and d in fx[3]:
                    t, kind, r, _ = fx
                    if counter == kind:
                        rate = rate + r / len(fx[3]) * _after(ts, t)
                    elif counter == "roce_adp_retrans_to" and kind == "roce_adp_retrans":
                        rate = rate + r / len(fx[3]) * 0.05 * _after(ts, t)
                yield (
                    "hw_ib_port_transport_errors_total",
                    {**lab, "counter": names[counter]},
                    self.samples(_counter(rng, rate, iv), -1),
                )
            sided = [c for side in SIDE_COUNTERS[nic].values() for c in side if c not in names.values()]
            for counter in sided:  # the other counters of either side, from their own random streams
                rate = np.full(self.n, 0.002) + self.side_rate(host, nic, counter)
                own = np.random.default_rng(_seed_int(f"{host}/{d}/{counter}", sim.seed))
                yield (
                    "hw_ib_port_transport_errors_total",
                    {**lab, "counter": counter},
                    self.samples(_counter(own, rate, iv), -1),
                )
            for counter in ("symbol_error", "link_downed"):
                yield "hw_ib_port_errors_total", {**lab, "counter": counter}, self.samples(np.zeros(self.n), -1)
            yield "hw_ib_port_state", lab, self.samples(np.full(self.n, 4.0), 0)
            yield "hw_ib_port_rate_gbps", lab, self.samples(np.full(self.n, 400.0), 0)

    def side_rate(self, host: str, nic: str, counter: str) -> np.ndarray | float:
        """The per-device rate a side fault (rdma_send_side, rdma_recv_side) or the fabric's reordering
        (healthy_ionic) adds to COUNTER on HOST."""
        sim = self.sim
        if sim.family == "healthy_ionic" and counter == "resp_rx_outouf_seq":
            busy = host == sim.notes["reordering_host"]
            rate = host_trait(host, "reorder", 8, 30) if busy else host_trait(host, "reorder", 0.05, 0.5)
            return rate / sim.scale.nics * self.m["alive"]
        fx = sim.host_fx[host].get("side")
        if not fx:
            return 0.0
        t, side, total = fx
        share = SIDE_COUNTERS[nic][side].get(counter, 0.0)
        return total * share / sim.scale.nics * _after(sim.ts, t)

    # --- TensorBoard (rank 0) -------------------------------------------------------------
    def tb(self) -> Iterator[tuple[str, dict, Iterator]]:
        sim = self.sim
        lab = {"host": sim.hosts[0], "node_rank": "0", "run": self.run_name}
        cols = tb_columns(sim)
        t = np.round(sim.step_end, 3).tolist()
        for name, values in cols.items():
            yield name, lab, zip(t, np.round(values, 6).tolist(), strict=True)

    run_name = ""


def tb_columns(sim: _Sim) -> dict[str, np.ndarray]:
    """The TensorBoard scalars of every step (shared by the TSDB and the log's step lines)."""
    steps, dur = sim.steps, sim.step_dur
    rng = np.random.default_rng(_seed_int("tb", sim.seed))
    loss = 6.061 - steps * 1e-4 + rng.normal(0, 0.01, len(steps))
    lb = np.full(len(steps), 0.012 if sim.moe else 0.0) * (1 + rng.normal(0, 0.04, len(steps)))
    grad = 0.35 + 0.6 * np.exp(-steps / 500) + np.abs(rng.normal(0, 0.03, len(steps)))
    for at, width, lbx, dl, gx in sim.spikes:
        k = np.clip(steps - at, 0, None)
        shape = np.where((steps >= at) & (steps < at + width), np.exp(-k / max(width / 3, 1)), 0.0)
        lb = lb * (1 + (lbx - 1) * shape)
        loss = loss + dl * shape
        grad = grad * (1 + (gx - 1) * shape)
    return {
        "tb_step": steps.astype(float),
        "tb_learning_loss": loss,
        "tb_learning_lm_loss": loss - lb * 0.01,
        "tb_learning_moe_lb_loss": lb,
        "tb_learning_grad_norm": grad,
        "tb_learning_current_learning_rate": np.full(len(steps), 3e-4),
        "tb_perf_step_time_seconds": dur,
        "tb_perf_per_device_tokens_per_sec": sim.tokens / dur,
        "tb_perf_per_device_tflops_per_sec": sim.tokens * flops_per_token(sim.model) / dur / 1e12,
    }


# --- the log ------------------------------------------------------------------------------
_LOSS = re.compile(r"loss: [-\d.]+, lm_loss: [-\d.]+")
_LB = re.compile(r"moe_lb_loss: [\d.]+")
_TFLOPS = re.compile(r"TFLOP/s/device: [\d.]+")


def _step_line(job: lc.Job, w: lc._Writer, host: str, step: int, t: float, dur: float, cols: dict) -> str:
    line = lc.step_line(job, w, host, step, t, dur)
    line = _LOSS.sub(
        f"loss: {cols['tb_learning_loss'][step]:.3f}, lm_loss: {cols['tb_learning_lm_loss'][step]:.3f}", line, count=1
    )
    line = _TFLOPS.sub(f"TFLOP/s/device: {cols['tb_perf_per_device_tflops_per_sec'][step]:.3f}", line, count=1)
    return _LB.sub(f"moe_lb_loss: {cols['tb_learning_moe_lb_loss'][step]:.3f}", line, count=1)


def _log(sim: _Sim, job: lc.Job, workspace: Path) -> tuple[list[str], dict, str, str, float]:
    """(lines, per-host train records, status, first_error, end time)."""
    w = lc._Writer(job)
    hosts, head = sim.hosts, sim.hosts[0]
    out = lc.header(job, workspace)
    limit = int(sim.scale.hours * 3600 * 1.5)
    out = [ln.replace("ray: 0", "ray: 1") for ln in out]
    out = [re.sub(r"train:\d+ \(defaults", f"train:{limit} (defaults", ln) for ln in out]
    for rank, h in enumerate(hosts):
        out += lc.startup(job, w, h, rank, sim.t_train + rank * 0.01)
    cols = tb_columns(sim)
    n = len(sim.steps)
    every = max(1, n // sim.scale.log_lines)
    for s in range(0, n, every):
        out.append(_step_line(job, w, head, s, sim.step_end[s], sim.step_dur[s], cols))
    records = {h: (0, "exit") for h in hosts}
    status, first_error, t_end = "completed", "", sim.t_last
    if sim.family == "hang":
        out += [
            "srun: Job step aborted: Waiting up to 12 seconds for job step to finish.",
            f"slurmstepd-{head}: error: *** JOB {job.job_id} ON {head} CANCELLED AT {lc.iso(sim.t_last)} ***",
            "_job.sbatch: received a stop signal (job state CANCELLED); stopping stage 'train'",
        ]
        out += [f"srun: error: {h}: task {i}: Exited with exit code 143" for i, h in enumerate(hosts)]
        records = {h: (143, "stopped") for h in hosts}
        status = "cancelled"
    elif sim.family == "heartbeat_false_positive":
        tasks = [hosts.index(h) for h in sim.accused]
        for s in range(max(0, n - 3), n):  # every host's last steps before the claim
            for h in hosts:
                out.append(_step_line(job, w, h, s, sim.step_end[s], sim.step_dur[s], cols))
        for h in sim.accused:  # the accused kept training after the claim
            for k in range(1, 3):
                out.append(
                    _step_line(
                        job,
                        w,
                        h,
                        n - 1 + k,
                        sim.claim + k * sim.step_time,
                        sim.step_time,
                        {c: np.append(v, [v[-1]] * 3) for c, v in cols.items()},
                    )
                )
        out += lc.unhealthy_block(w, head, sim.claim, tasks, coordinator=True)
        for h in hosts[1:]:
            out += lc.unhealthy_block(w, h, sim.claim + (5 if h in sim.accused else 0.01), tasks, coordinator=False)
        out.append(f"srun: error: {head}: task 0: Exited with exit code 134")
        records = {h: (134, "exit") for h in hosts}
        status = "failed"
        first_error = w.node(
            head, "F1122 Terminating process because the JAX distributed service detected fatal errors."
        )
    elif sim.family == "host_oom":
        culprit = sim.culprits[0]
        survivors = [h for h in hosts if h != culprit]
        out.append(
            f'{lc.STAGE_SH}: line 46: 13207 Killed                  timeout --kill-after=10 "$limit" "$@" 1>&3 2>&1'
        )
        for h in survivors:
            out += lc.traceback_lines(w, h, lc.GLOO_EXC.format(peer=hosts.index(culprit) + 1))
        out.append(f"srun: error: {culprit}: task {hosts.index(culprit)}: Out Of Memory")
        out += [
            f"slurmstepd-{h}: error: *** STEP {job.job_id}.1 ON {h} CANCELLED AT {lc.iso(sim.oom + 2)} ***"
            for h in survivors
        ]
        records = {h: (143, "stopped") for h in survivors}
        records[culprit] = (137, "exit")
        status = "failed"
        first_error = w.node(culprit, "killed by signal 9 (KILL), e.g. the kernel OOM killer or kill -9")
    else:
        out += [
            w.absl(
                h,
                sim.t_stop + 1,
                "Shutting down PreemptionSyncManager...",
                tid=15100,
                where="preemption_sync_manager.cc:202",
            )
            for h in hosts
        ]
    return out, records, status, first_error, t_end


def _write_job_files(sim: _Sim, job: lc.Job, workspace: Path) -> tuple[Path, Path]:
    job_dir = workspace / job.name
    log = workspace / f"{job.name}.log"
    lines, records, status, first_error, t_end = _log(sim, job, workspace)
    outcome = lc._Outcome(records, status, first_error)
    summary = lc.summary_block(job, workspace, outcome, int(t_end - job.start))
    log.write_text("\n".join(lines + summary) + "\n")
    (job_dir / ".stages" / "preflight").mkdir(parents=True, exist_ok=True)
    (job_dir / ".stages" / "train").mkdir(exist_ok=True)
    for i, h in enumerate(sim.hosts):
        (job_dir / ".stages" / "preflight" / h).write_text(f"rc=0 end={job.start + 4:.3f} reason=exit\n")
        rc, reason = records[h]
        (job_dir / ".stages" / "train" / h).write_text(f"rc={rc} end={t_end + i * 0.01:.3f} reason={reason}\n")
    (job_dir / "summary.txt").write_text("\n".join(summary) + "\n")
    if not (job_dir / "log").is_symlink():
        (job_dir / "log").symlink_to(log)
    os.utime(log, (t_end, t_end))
    return job_dir, log


STOPPED_EARLY = ("hang", "heartbeat_false_positive", "host_oom")


def planned_steps(sim: _Sim) -> int:
    """The job's steps= : a completed job ran all of them (steps 0 .. steps-1); one that stopped early was
    set to run more (a round number above every step it logged)."""
    n = len(sim.steps)
    return n if sim.family not in STOPPED_EARLY else int(math.ceil((n + 3) * 1.25 / 100) * 100)


# What the generated series are a function of besides build()'s arguments: this code, the log
# corpus's and the backfill's, and numpy (its random streams)
_CODE = hashlib.sha256(
    b"".join(Path(f).read_bytes() for f in (__file__, lc.__file__, sys.modules[write_tsdb.__module__].__file__))
    + np.__version__.encode()
).hexdigest()


def _materialise(sim: _Sim, job_id: str, workspace: Path, inputs: str) -> tuple[Path, Path]:
    job = lc.Job(
        hosts=sim.hosts,
        job_id=job_id,
        model=sim.model,
        start=float(sim.t0),
        step_time=sim.step_time,
        tokens_per_step=sim.tokens,
        seed=sim.seed,
        config_lines=3,
        total_steps=planned_steps(sim),
    )
    if (workspace / job.name).exists():
        raise FileExistsError(f"{workspace / job.name} exists")
    job_dir, log = _write_job_files(sim, job, workspace)
    gen = _Series(sim)
    gen.run_name = job.name
    keep = (s for s in gen.all() if not any(s[0].startswith(p) for p in sim.drop))
    write_tsdb(job_dir / "prometheus", keep, inputs=f"corpus {_CODE} {inputs} job {job_id}")
    return job_dir, log


def build(
    family: str,
    workspace: Path | str,
    seed: int = 1,
    scale: Scale = SMALL,
    *,
    job_id: str | None = None,
    drop: tuple[str, ...] = (),
    twin: str = "before",
) -> Incident:
    """Write one incident job (and, for thread_leak, its clean twin first) under workspace.

    drop: metric-name prefixes to leave out of the TSDB (e.g. ("hw_gpu_",) for a job without the GPU plugin).
    twin (thread_leak): where the clean twin ran: "before" (an hour before the leak job, the id before
    its), "after" (an hour after it, the id after its) or "elsewhere" (before it, on other hosts of
    another node type: twice the memory, GPU power limit 1000 W).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    workspace = Path(workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    jid = job_id or str(10000 + _seed_int(family, seed) % 80000)
    inputs = repr((family, seed, scale, drop, twin))  # the series' whole input, with _CODE and the job id
    vs = None
    if family == "thread_leak":
        if twin not in ("before", "after", "elsewhere"):
            raise ValueError(f"twin {twin!r}: give before, after or elsewhere")
        node = {"memory": 2.0, "limit": 1000.0} if twin == "elsewhere" else None
        clean = _Sim("healthy", seed + 7919, scale, node=node, drop=drop)
        moved = [f"x{h}" for h in clean.hosts] if twin == "elsewhere" else None
        sim = _Sim(family, seed, scale, twin=clean, after_twin=twin != "after", hosts=moved, drop=drop)
        nxt = str(int(jid) + 1) if jid.isdigit() else jid + "b"
        vs, _ = _materialise(clean, nxt if twin == "after" else jid, workspace, f"{inputs} twin")
        jid = jid if twin == "after" else nxt
    else:
        sim = _Sim(family, seed, scale, drop=drop)
    job_dir, log = _materialise(sim, jid, workspace, inputs)
    return Incident(
        family,
        seed,
        job_dir,
        log,
        list(sim.hosts),
        FAMILIES[family],
        list(sim.culprits),
        list(sim.affected),
        vs,
        sim.window,
        {
            **sim.notes,
            "vendor": sim.vendor,
            "nic": _rdma_nic(sim)[0],
            "model": sim.model,
            "steps": int(len(sim.steps)),
            "planned_steps": planned_steps(sim),
            "accused": list(sim.accused),
            "t_hang": sim.t_hang,
            "claim": sim.claim,
        },
    )


def main() -> int:
    ap = argparse.ArgumentParser(description="Build incident job directories (see the module docstring).")
    ap.add_argument("workspace", type=Path)
    ap.add_argument("--family", action="append", choices=list(FAMILIES), help="default: every family")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", choices=["small", "full"], default="small")
    a = ap.parse_args()
    for fam in a.family or list(FAMILIES):
        t = time.monotonic()
        inc = build(fam, a.workspace, a.seed, FULL if a.scale == "full" else SMALL)
        print(
            f"{inc.job_dir}  verdict={inc.verdict} culprits={','.join(inc.culprits) or '-'}"
            + (f" vs={inc.vs}" if inc.vs else "")
            + f"  ({time.monotonic() - t:.1f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
