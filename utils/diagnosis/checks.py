"""The registry of diagnose's checks (playbooks), the way failure_classes.py serves triage: each check
reads the loaded Data and adds findings (with their evidence) or a clean/skipped entry to the Report;
CHECKS is their order and NEEDS the metric families each one reads. diagnose.py runs them all (run_all).
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Callable

import numpy as np

from diagnosis import jobdir, tsdb
from diagnosis.alerts import RULES
from diagnosis.evidence import (
    Data,
    Finding,
    Report,
    deviation_fraction,
    dur,
    fmt,
    nanmed,
    peer_median,
    robust_sd,
    robust_z,
    series_plot,
    utc,
    window_medians,
    window_of,
)
from diagnosis.rdma import SIDES, is_rdma_retransmit, side_of

try:
    import joblog  # the one parser of the job log format (utils/joblog.py)
except ImportError:  # pragma: no cover - joblog is part of the repo; without it log facts are missing
    joblog = None

HB_TIMEOUT = 100.0  # JAX's default heartbeat timeout, seconds
# The numbers a check shares with the job's alert rules (alerts.tsv: one row per signal)
TCP, LINK = RULES["TCPRetransmitsStandOut"], RULES["IBLinkErrorsStandOut"]
RDMA_REQ, RDMA_RESP = RULES["RDMARequesterRetransmitsStandOut"], RULES["RDMAResponderErrorsStandOut"]
PEER_RATIO = TCP.peer or 4.0  # a host stands out at this many times its peers' rate
HOT_ABOVE_PEERS = RULES["GPUHotterThanPeers"].value  # degrees C
GPU_SEVERE_ERRORS = RULES["GPUUncorrectableErrors"].value  # uncorrectable or kernel GPU errors: this many is enough
RUNQ = RULES["CPURunQueueAbovePeers"]  # run queue above peers: value tasks and peer x their level
IO_FULL, IO_SOME = RULES["IOStall"].value, RULES["IOPressure"].value  # PSI percent
OOM_KILLS = RULES["OOMKill"].value
TRAIN_COST_PCT = 5.0  # a training-scalar spike is an incident when tokens/s fell by more than this from it on

# The checks and the families each needs (any one of them is enough to run it).
NEEDS: dict[str, tuple[str, ...]] = {
    "hang": ("hw_gpu_utilization_pct", "hw_gpu_power_watts"),
    "heartbeat_false_positive": ("hw_gpu_power_watts", "tb_step"),
    "network": ("hw_tcp_retransmits_total", "hw_ib_port_transport_errors_total", "hw_ib_port_errors_total"),
    "gpu_thermal": ("hw_gpu_temperature_celsius", "hw_gpu_clock_mhz", "hw_gpu_throttle_reasons"),
    "gpu_power": ("hw_gpu_power_limit_watts", "hw_gpu_power_watts", "hw_gpu_throttle_reasons"),
    "gpu_hardware": (
        "hw_gpu_ras_errors_total",
        "hw_gpu_pcie_aer_errors_total",
        "hw_gpu_pcie_link_width",
        "hw_gpu_kernel_errors_total",
    ),
    "cpu_contention": ("hw_procs_running", "hw_cpu_pressure_some_pct"),
    "io_pressure": ("hw_io_pressure_full_pct", "hw_io_pressure_some_pct", "hw_procs_blocked"),
    "memory": ("hw_oom_kills_total", "hw_memory_available_bytes", "hw_memory_pressure_full_pct"),
    "training_dynamics": ("tb_learning_loss", "tb_learning_moe_lb_loss", "tb_learning_grad_norm"),
    "throughput": ("tb_perf_per_device_tokens_per_sec", "tb_perf_step_time_seconds"),
}
# absent without a gap in the evidence: NVIDIA only (absent on AMD); a series that appears with the first event
OPTIONAL = {"hw_gpu_throttle_reasons", "hw_gpu_kernel_errors_total"}


def _spin_tail(util: dict[str, np.ndarray], power: dict[str, np.ndarray], hosts: list[str]) -> tuple[int, dict]:
    """Index where the trailing run of "GPUs busy at low power on >= 75 % of the hosts" starts (size if none),
    and each host's full-power reference (90th percentile of its power while its GPUs were busy)."""
    ref, spin = {}, []
    for h in hosts:
        u, p = util.get(h), power.get(h)
        if u is None or p is None:
            continue
        busy = np.nan_to_num(u) >= 90
        ref[h] = float(np.nanpercentile(p[busy], 90)) if np.isfinite(p[busy]).any() else math.nan
        with np.errstate(invalid="ignore"):
            spin.append(busy & (p <= 0.5 * ref[h]))
    if not spin:
        return 0, ref
    frac = np.mean(np.vstack(spin), axis=0)
    i = frac.size
    while i > 0 and frac[i - 1] >= 0.75:
        i -= 1
    return i, ref


def check_hang(d: Data, rep: Report) -> None:
    util, power = d.gpu_min.get("hw_gpu_utilization_pct"), d.gauges.get("hw_gpu_power_watts")
    if not util or not power:
        return rep.skipped.append({"check": "hang", "needs": ["hw_gpu_utilization_pct", "hw_gpu_power_watts"]})
    first, ref = _spin_tail(util, power, d.hosts)
    steps = d.tb.get("steps")
    last = None
    if steps is not None and np.nansum(steps) > 0:
        last = float(d.grid[np.flatnonzero(np.nan_to_num(steps) > 0)[-1]])
        first = max(first, int(np.searchsorted(d.grid, last + d.step, side="left")))
    need = max(3, int(300 // d.step))
    if d.grid.size - first < need:
        return rep.clean(
            "hang",
            "steps advanced until the end of the data"
            if last and last >= d.end - need * d.step
            else "no tail with busy GPUs at low power",
            NEEDS["hang"],
        )
    start = last if last is not None else float(d.grid[first] - d.step)
    tail = d.mask((start, d.end))  # the finding's window: what its verify checks reduce
    idle = [h for h in d.hosts if h in util and np.nanmean(util[h][tail] < 50) > 0.8]
    spinning = [h for h in ref if h not in idle]
    rep.findings.append(
        Finding(
            "hang",
            f"{'steps stopped' if last else 'GPUs went quiet'} at {utc(start)} ({dur(d.end - start)} before the "
            f"end of the data) while the GPUs of {len(spinning)}/{len(ref)} hosts stayed 100 % busy at standby "
            f"power: a collective deadlock"
            + (f"; {', '.join(idle)} had idle GPUs (never entered the collective)" if idle else ""),
            idle,
            (start, d.end),
            [d.queries["gpu_min"], d.queries["gauges"]] + ([d.queries["tb:steps"]] if "tb:steps" in d.queries else []),
            {
                "last_step_time": last,
                "hosts_spinning": len(spinning),
                "hosts": len(ref),
                "util_min_median": {h: nanmed(util[h][tail]) for h in ref},
                "power_median_w": {h: nanmed(power[h][tail]) for h in ref},
                "power_full_w": ref,
            },
            0.97,
            plot=series_plot("GPU power per host (max GPU)", "W", power, d, idle),
        )
    )


def check_heartbeat(d: Data, rep: Report, prom: tsdb.Served) -> None:
    log = d.target.log
    if log is None or joblog is None:
        rep.missing.add("job log" if log is None else "utils/joblog.py")
        return rep.skipped.append({"check": "heartbeat_false_positive", "needs": ["job log"]})
    if jobdir.summary(d.target.job_dir).get("status") == "completed":  # a heartbeat claim ends the job
        return rep.clean("heartbeat_false_positive", f"the job completed ({jobdir.SUMMARY})", [jobdir.SUMMARY])
    try:
        scan = joblog.scan(log)
    except (OSError, ValueError) as e:  # a binary or unreadable log (joblog.NotALog is a ValueError)
        rep.missing.add("job log")
        rep.notes.append(f"the job log could not be read ({e}): heartbeat claims not checked")
        return rep.skipped.append({"check": "heartbeat_false_positive", "needs": ["job log"]})
    claim = joblog.heartbeat_claim(scan)
    if claim is None:
        return rep.clean("heartbeat_false_positive", "the log holds no heartbeat claim", ["log"])
    if claim.time is None:
        rep.notes.append("the log's heartbeat claim has no absl time stamp: it cannot be lined up with the metrics")
        return rep.skipped.append({"check": "heartbeat_false_positive", "needs": ["job log"]})
    t_claim, tasks, accused = claim.time, claim.tasks, claim.hosts
    power = d.gauges.get("hw_gpu_power_watts", {})
    # "Alive up to the claim" must hold right before it: a host that froze or died stops at least one
    # heartbeat timeout (tens of seconds; ~56 s measured with JAX 0.12) before the claim, so a longer
    # look-back would count the work it did before it stopped.
    near = max(20.0, 2.5 * d.interval)
    q = f"max by (host) (min_over_time(hw_gpu_power_watts[{int(near)}s]))"
    at_claim = (
        {r["metric"]["host"]: float(r["value"][1]) for r in prom.query(q, t_claim) if "host" in r["metric"]}
        if power
        else {}
    )
    # training is synchronous: a step completed just before the claim means every host took part in it
    qs = "timestamp(tb_step)"
    rows = prom.query(qs, t_claim) if "tb_step" in d.names else []
    last_tb = max((float(r["value"][1]) for r in rows), default=math.nan)
    steps_to_claim = math.isfinite(last_tb) and last_tb >= t_claim - near
    alive, dead, values = [], [], {}
    for h in accused:
        base = nanmed(power[h][d.mask()]) if h in power else math.nan
        ratio = at_claim.get(h, math.nan) / base if base and math.isfinite(base) else math.nan
        seen = scan.hosts.get(h)
        last_step = seen.last_step_ts if seen else None
        logged = last_step is not None and last_step >= t_claim - near
        values[h] = {
            "power_at_claim_w": at_claim.get(h, math.nan),
            "power_training_w": base,
            "last_step_logged": last_step,
            "last_step": seen.last_step if seen else None,
        }
        (alive if (ratio >= 0.7 or logged or steps_to_claim) else dead).append(h)
    queries = [q + f"   @ {t_claim:.0f}"] + ([qs + f"   @ {t_claim:.0f}"] if rows else [])
    win = (t_claim - HB_TIMEOUT, t_claim)
    vals = {
        "claim_time": t_claim,
        "tasks": tasks,
        "hosts": values,
        "near_seconds": near,
        "last_tb_step_time": last_tb if math.isfinite(last_tb) else None,
    }
    if accused and not dead:
        rep.findings.append(
            Finding(
                "heartbeat_false_positive",
                f"JAX declared task(s) {tasks} ({', '.join(accused)}) dead at {utc(t_claim)}, "
                "but they were alive up to "
                f"the claim (GPU power in the last {near:.0f} s "
                f"{', '.join(fmt(values[h]['power_at_claim_w']) + ' W' for h in accused)}"
                + (f"; the last step {t_claim - last_tb:.0f} s before it" if steps_to_claim else "")
                + f"): the heartbeats were lost, not the hosts (look at the coordinator {claim.coordinator or '?'} "
                "and the network around that time)",
                [],  # the accused hosts were healthy: no culprit
                win,
                queries,
                vals,
                0.96,
                plot=series_plot("GPU power per host (max GPU)", "W", power, d, accused) if power else None,
                extra={"accused_hosts": accused, "suspect_hosts": [claim.coordinator] if claim.coordinator else []},
            )
        )
    elif dead:
        rep.findings.append(
            Finding(
                "heartbeat_timeout",
                f"{', '.join(dead)} stopped ({'GPU power fell, ' if power else ''}no steps"
                + (f"; the last one {t_claim - last_tb:.0f} s" if math.isfinite(last_tb) else "")
                + f" before JAX's heartbeat claim at {utc(t_claim)}): a real loss of the host or its process",
                dead,
                win,
                queries,
                vals,
                0.5,
                decides=False,
                extra={"accused_hosts": accused, "suspect_hosts": dead},
            )
        )
        rep.clean(
            "heartbeat_false_positive",
            "the accused hosts really stopped before the claim",
            ["hw_gpu_power_watts", "tb_step"],
        )


def _phase_windows(d: Data) -> tuple[dict, dict] | None:
    if len(d.phases) < 2:
        return None
    fast = max(d.phases, key=lambda p: p["level"])
    slow = min(d.phases, key=lambda p: p["level"])
    return (fast, slow) if slow["level"] <= 0.95 * fast["level"] else None


# What each network signal's side says about the faulty end (the finding's "side" and "why").
SIDE_WHY = {
    "requester": (
        "the requester side (the sending end: retransmits, ACK timeouts, NAKs received) rose on these hosts "
        "while their peers see at most the responder-side symptoms: what these hosts send is lost (their "
        "NIC, cable or switch port on the way out)"
    ),
    "responder": (
        "the responder side (the receiving end: out-of-sequence drops, duplicate requests) rose on these hosts "
        "while their peers, the senders, retransmit: what these hosts receive is lost (their NIC, cable or "
        "switch port on the way in)"
    ),
    "sender": (
        "TCP counts retransmits and timeouts at the sender: what these hosts send (or the ACKs coming back) "
        "is lost on their path"
    ),
    "link": "the port's own link errors: the host's NIC, cable or switch port",
    "local": (
        "these hosts' own network stack dropped packets before they reached the NIC (IP OutRequests minus "
        "OutTransmits: a firewall rule, a failing route or qdisc, a driver refusing to send): what they send never "
        "leaves, and their peers' retransmits and timeouts follow from it, whichever end counts more of them"
    ),
}
SIDE_SHORT = {
    "requester": "requester side, the sending end: what these hosts send is lost",
    "responder": "responder side, the receiving end: what these hosts receive is lost",
    "sender": "TCP counts retransmits at the sender: what these hosts send is lost",
    "link": "the port's own link errors",
}


@dataclasses.dataclass
class _Signal:
    key: str  # the series selector (a d.rates key, or the side's counters as counter=~"...")
    per: dict[str, np.ndarray]
    floor: float  # rate floor, /s
    side: str  # requester / responder (RDMA), sender (TCP), link (port errors)
    counters: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)  # RDMA: counter -> per


def _network_signals(d: Data) -> list[_Signal]:
    """Per-host counter rates that mean retransmission or link trouble, with a rate floor (/s). The RDMA
    retransmit counters are summed per side (utils/launch/rdma_providers.tsv `sides`), so the end that
    counts them, not the counter with the biggest numbers, decides."""
    out: list[_Signal] = []
    sides: dict[str, dict[str, dict[str, np.ndarray]]] = {s: {} for s in SIDES}
    for key, per in d.rates.items():
        name = key.split("{")[0]
        counter = re.search(r'counter="([^"]+)"', key)
        if name in ("hw_tcp_retransmits_total", "hw_tcp_timeouts_total"):
            out.append(_Signal(key, per, TCP.value, "sender"))
        elif name == "hw_ib_port_transport_errors_total" and counter and is_rdma_retransmit(counter.group(1)):
            sides[side_of(counter.group(1)) or "requester"][counter.group(1)] = per
        elif name == "hw_ib_port_errors_total":
            out.append(_Signal(key, per, LINK.value, "link"))
    for side, counters in sides.items():
        if counters:
            hosts = {h for per in counters.values() for h in per}
            per = {h: _nansum([c[h] for c in counters.values() if h in c]) for h in hosts}
            names = "|".join(sorted(counters))
            floor = (RDMA_REQ if side == "requester" else RDMA_RESP).value
            out.append(_Signal(f'hw_ib_port_transport_errors_total{{counter=~"{names}"}}', per, floor, side, counters))
    return out


def _nansum(xs: list[np.ndarray]) -> np.ndarray:
    """Sum at each grid point of the finite values (NaN where none is)."""
    a = np.vstack(xs)
    return np.where(np.isfinite(a).any(axis=0), np.nansum(a, axis=0), np.nan)


def _network_bursts(per: dict[str, np.ndarray], floor: float, m: np.ndarray) -> dict[str, np.ndarray]:
    """Hosts whose rate was at least the floor and PEER_RATIO x the median of the other hosts at the same
    moments, for 3 or more grid points of the training window, and on average over the stretch from the
    first of them to the last as well: a fault for part of the run (no throughput phases found, the
    whole-run mean diluted). The stretch's mean keeps two hosts' noise out: picked where one happens
    to be 4x the other, any noisy pair looks like a burst (measured live: two nodes each retransmitting
    3-12 TCP segments/s, 0.05 % of what they sent, one 4x the other at 6 of 11 points in a row, 2.6x
    on average there). host -> those grid points."""
    out = {}
    for h, v in per.items():
        rest = [per[o] for o in per if o != h]
        if not rest:
            continue
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            om = np.nan_to_num(np.nanmedian(np.vstack(rest), axis=0))
        hit = m & (np.nan_to_num(v) >= np.maximum(floor, PEER_RATIO * om))
        if hit.sum() < 3:
            continue
        at = np.flatnonzero(hit)
        stretch = m.copy()
        stretch[: at[0]] = stretch[at[-1] + 1 :] = False
        mean = float(np.mean(np.nan_to_num(v[stretch])))
        if mean >= max(floor, PEER_RATIO * float(np.mean(om[stretch]))):
            out[h] = hit
    return out if len(out) <= max(1, len(per) // 2) else {}


@dataclasses.dataclass
class _StandOut:
    """The hosts one signal singles out, their rates in the window and before it, and how."""

    sig: _Signal
    bad: list[str]
    r_slow: dict[str, float]
    r_fast: dict[str, float]
    peer: float  # the median of the hosts not singled out
    score: float
    win: tuple[float, float] | None
    how: str
    mask: np.ndarray  # the window's grid points

    @property
    def weight(self) -> float:
        return sum(self.r_slow[h] for h in self.bad) / self.sig.floor


def _stand_out(d: Data, sig: _Signal, pw: tuple[dict, dict] | None) -> _StandOut | None:
    """The hosts whose rate of SIG stands out: in the slow phase (against the fast one and the peers),
    else far above their peers over the whole run, else in a burst; None when no host (or more than half)."""
    per, floor = sig.per, sig.floor
    bad: list[str] = []
    if pw:
        fast, slow = pw
        mf, ms = d.mask((fast["start"], fast["end"])), d.mask((slow["start"], slow["end"]))
        r_fast = {h: float(np.nanmean(v[mf])) if mf.any() else math.nan for h, v in per.items()}
        r_slow = {h: float(np.nanmean(v[ms])) if ms.any() else math.nan for h, v in per.items()}
        z = robust_z(r_slow, floor / 4)
        peer = nanmed(list(r_slow.values()))
        # each host against the median of the OTHER hosts (with 2 hosts the culprit is half the median)
        others = {h: nanmed([r for o, r in r_slow.items() if o != h]) for h in r_slow}
        bad = [
            h
            for h in d.hosts
            if h in r_slow
            and r_slow[h] >= max(floor, PEER_RATIO * np.nan_to_num(others[h]))
            and r_slow[h] >= 4 * np.nan_to_num(r_fast.get(h, 0)) + floor / 2
            and (z[h] >= 4 or len(per) < 3)
        ]
        score, win, m = 0.82, (slow["start"], slow["end"]), ms
        how = (
            f"rose in the slow phase ({utc(slow['start'])} .. {utc(slow['end'])}: "
            f"{fmt(slow['level'])} vs {fmt(fast['level'])} {slow.get('unit', '')})"
        )
    if not bad:  # no phases, or the fault was not in the slowest phase (a short one elsewhere)
        m = d.mask()
        r_slow = {h: float(np.nanmean(v[m])) if m.any() else math.nan for h, v in per.items()}
        r_fast = {}
        z = robust_z(r_slow, floor / 4)
        peer = nanmed(list(r_slow.values()))
        bad = [h for h in d.hosts if h in r_slow and r_slow[h] >= max(4 * floor, 10 * peer) and z[h] >= 6]
        score, win, how = 0.65, d.train, "are far above their peers over the whole run"
        burst = {} if bad else _network_bursts(per, floor, m)
        if burst:
            m = np.logical_or.reduce(list(burst.values()))
            bad = [h for h in d.hosts if h in burst]
            r_slow = {h: float(np.nanmean(v[m])) for h, v in per.items()}
            w = window_of(d.grid, m, d.step)
            score, win = 0.75, w or d.train
            how = f"burst above every peer ({utc(win[0])} .. {utc(win[1])})"
    if not bad or len(bad) > max(1, len(per) // 2):
        return None
    rest = nanmed([r for h, r in r_slow.items() if h not in bad])
    return _StandOut(sig, bad, r_slow, r_fast, rest if math.isfinite(rest) else peer, score, win, how, m)


def _rdma_end(d: Data, req: _StandOut | None, resp: _StandOut | None, sigs: dict[str, _Signal]) -> _StandOut | None:
    """Which end of the lossy RDMA connections is at fault. A send-side fault raises the requester side
    on the culprits and the responder side on their peers (often more: every packet after a lost one
    is dropped out of sequence there); a receive-side fault the other way round. The end where the
    errors gather (fewer hosts) is the culprit; a tie goes to the requester side (the sender counts
    what it lost). A responder side alone, without any sender retransmitting, is reordering, not loss."""
    if req and resp:
        if set(req.bad) & set(resp.bad) or len(req.bad) <= len(resp.bad):
            return req
        return resp
    if req:
        return req
    if resp and "requester" in sigs:
        req = sigs["requester"].per
        before = (lambda v: _before(d, v)) if resp.r_fast else (lambda v: 0.0)
        rose = sum(_mean(req[h], resp.mask) - before(req[h]) for h in req if h not in resp.bad)
        return resp if rose >= sigs["requester"].floor else None
    return None


def _mean(v: np.ndarray, m: np.ndarray) -> float:
    """Mean of the finite values of v under m (0 when none is)."""
    x = v[m & np.isfinite(v)]
    return float(x.mean()) if x.size else 0.0


def _before(d: Data, v: np.ndarray) -> float:
    """The rate in the job's fastest throughput phase (what the host's counters do when all is well)."""
    pw = _phase_windows(d)
    m = d.mask((pw[0]["start"], pw[0]["end"])) if pw else np.zeros(0, bool)
    return _mean(v, m) if m.any() else 0.0


# The job's own slow and fast moments (compared by every rate-based check with each host's own rates):
# throughput at or below SLOW x the job's fast level (the 90th percentile of the training window) is
# slow, at or above FAST x it fast; the slowest throughput phase, where phases exist, is slow too.
SLOW, FAST = 0.8, 0.9
FLEET_RISE = 3.0  # a host rose with the slowdown: slow-window rate >= this x its fast-window rate (and + floor)
RTO_BOUND = 0.05  # TCP timeouts >= this share of the retransmits: the connections wait on the retransmit timer


@dataclasses.dataclass
class SlowFast:
    """The job's slow and fast grid points (training window), and its throughput in each."""

    slow: np.ndarray
    fast: np.ndarray
    slow_level: float
    fast_level: float
    unit: str

    def windows(self, grid: np.ndarray, step: float) -> list[tuple[float, float]]:
        """The slow stretches, (start, end) each."""
        edges = np.flatnonzero(np.diff(np.concatenate([[0], self.slow.astype(int), [0]])))
        return [(float(grid[a] - step), float(grid[b - 1])) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def slow_fast(d: Data) -> SlowFast | None:
    """Split the training window into the job's slow and fast moments by its throughput (tokens/s/device,
    else 1 / step time). A grid point without a step of its own takes the next step's value (a step's
    rate covers the time before its end, so a collapse whose steps are sparse still counts). A slow
    stretch at the very start (compilation, warm-up) is left out; it ends where throughput falls to half
    or less (a fault before full speed is no warm-up). None without 3 slow and 3 fast points."""
    y, unit = d.tb.get("tokens"), "tokens/s/device"
    if y is None or not np.isfinite(y).any():
        y, unit = d.tb.get("step_time"), "steps/s"
        if y is None or not np.isfinite(y).any():
            return None
        with np.errstate(divide="ignore"):
            y = 1.0 / y
    m = d.mask()
    v = np.where(m, y, np.nan)
    idx = np.flatnonzero(np.isfinite(v))
    if idx.size < 6:
        return None
    filled = np.full_like(v, np.nan)  # back-fill: each point up to a step's end takes that step's rate
    prev = idx[0]
    filled[prev] = v[prev]
    for i in idx[1:]:
        filled[prev + 1 : i + 1] = v[i]
        prev = i
    ref = float(np.percentile(v[idx], 90))
    if not ref > 0:
        return None
    ok = np.isfinite(filled)
    slow = ok & (np.nan_to_num(filled) <= SLOW * ref)
    lead = idx[0]  # compilation / warm-up: slow from the first step on while it speeds up; a fall to half
    while lead < slow.size and slow[lead]:  # or less ends it (a fault before full speed is no warm-up)
        if lead + 1 < slow.size and filled[lead + 1] < 0.5 * filled[lead]:
            break
        lead += 1
    pw = _phase_windows(d)
    if pw:  # the slow phase counts whole but for the warm-up found above by throughput alone
        slow |= ok & d.mask((pw[1]["start"], pw[1]["end"]))
    slow[:lead] = False
    fast = ok & ~slow & (np.nan_to_num(filled) >= FAST * ref)
    if slow.sum() < 3 or fast.sum() < 3:
        return None
    return SlowFast(slow, fast, nanmed(v[slow]), nanmed(v[fast]), unit)


def _tcp_per_segment(d: Data, hosts: list[str], ms: np.ndarray, mf: np.ndarray) -> tuple[dict, bool]:
    """TCP retransmits and timeouts per segment sent (hw_tcp_out_segments_total) on HOSTS in the window MS
    and before it (MF, may be empty), and whether the window is RTO-bound (timeouts >= RTO_BOUND of the
    retransmits: the connections wait on the timer, so per second the loss looks small)."""
    segs = d.rates.get("hw_tcp_out_segments_total", {})
    retr = d.rates.get("hw_tcp_retransmits_total", {})
    tmo = d.rates.get("hw_tcp_timeouts_total", {})
    out: dict = {}
    for h in hosts:
        if h not in segs:
            continue
        row = {}
        for name, m in (("", ms), ("_before", mf)):
            sent = _mean(segs[h], m) if m.any() else math.nan
            for what, per in (("retransmits", retr), ("timeouts", tmo)):
                if h in per and sent > 0:
                    row[f"{what}_per_segment{name}"] = _mean(per[h], m) / sent
        out[h] = row
    r_sum = sum(_mean(retr[h], ms) for h in hosts if h in retr)
    t_sum = sum(_mean(tmo[h], ms) for h in hosts if h in tmo)
    return out, r_sum > 0 and t_sum >= RTO_BOUND * r_sum


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.3g} %"


def _fleet_rise(d: Data, sig: _Signal, sf: SlowFast) -> dict | None:
    """Every host's own rate of SIG in the job's slow moments against its fast ones: when each of the
    job's (two or more) hosts rose (>= FLEET_RISE x its fast rate, by at least the signal's floor / 10 for
    TCP, else its floor; for TCP also per segment sent, so more traffic alone is no rise), {host: (slow,
    fast)}; else None."""
    floor = sig.floor / 10 if sig.side == "sender" else sig.floor
    segs = d.rates.get("hw_tcp_out_segments_total", {}) if sig.side == "sender" else {}
    out = {}
    for h in d.hosts:
        v = sig.per.get(h)
        if v is None:
            return None
        slow, fast = _mean(v, sf.slow), _mean(v, sf.fast)
        if not (slow >= FLEET_RISE * fast and slow - fast >= floor):
            return None
        if h in segs:
            s_slow, s_fast = _mean(segs[h], sf.slow), _mean(segs[h], sf.fast)
            if s_slow > 0 and s_fast > 0 and slow / s_slow < FLEET_RISE * fast / s_fast:
                return None
        out[h] = (slow, fast)
    return out if len(out) >= 2 else None


FLEET_WHY = {
    "link": (
        "both hosts of the job rose together with the slowdown: the loss is on the job's only link, and a lossy "
        "direction makes both ends resend (one end loses its data, the other the ACKs it waits for), so neither "
        "end can be named from these counters (look at both NICs, cables and switch ports, e.g. with "
        "`utils/bisect_nodes.sh`)"
    ),
    "fleet": (
        "every host rose together with the slowdown: the loss is on what all of them share (a switch, the "
        "fabric's configuration, congestion), not on one host"
    ),
}


def _network_fleet(d: Data, rep: Report, signals: list[_Signal], sf: SlowFast) -> bool:
    """The self-comparison: a network fault every host felt (or both ends of a 2-node job's link) raises
    no host above its peers, but each host's own rate rose in the job's slow moments. Adds the finding
    (scope fleet: every host named, no culprit) and says whether it did."""
    rises = {s.key: (s, r) for s in signals if (r := _fleet_rise(d, s, sf))}
    if not rises:
        return False
    sig, rise = max(rises.values(), key=lambda sr: sum(x[0] for x in sr[1].values()) / sr[0].floor)
    hosts = [h for h in d.hosts if h in rise]
    extent = "link" if len(d.hosts) == 2 else "fleet"
    wins = sf.windows(d.grid, d.step)
    # the finding's window: the slow stretch where the hosts' rates were highest (a slowdown may have several)
    win = max(wins, key=lambda w: sum(_mean(sig.per[h], d.mask(w)) for h in hosts))
    what = "TCP " + sig.key.removeprefix("hw_tcp_").removesuffix("_total") if sig.side == "sender" else sig.key
    values = {
        "signal": sig.key,
        "side": sig.side,
        "extent": extent,
        "why": FLEET_WHY[extent],
        "rate_per_s": {h: rise[h][0] for h in hosts},
        "rate_before_per_s": {h: rise[h][1] for h in hosts},
        "throughput": {"slow": sf.slow_level, "fast": sf.fast_level, "unit": sf.unit},
        "slow_windows": [{"start": a, "end": b} for a, b in wins],
        "phases": d.phases,
    }
    seg_text = ""
    if sig.side == "sender":
        per_seg, rto = _tcp_per_segment(d, hosts, sf.slow, sf.fast)
        values["per_segment"], values["rto_bound"] = per_seg, rto
        if per_seg and rto:
            seg_text = (
                "; RTO-bound (timeouts "
                + ", ".join(f"{h} {fmt(_mean(d.rates['hw_tcp_timeouts_total'][h], sf.slow))}/s" for h in hosts)
                + "), so per segment sent: "
                + ", ".join(
                    f"{h} {_pct(per_seg[h].get('retransmits_per_segment_before'))} -> "
                    f"{_pct(per_seg[h].get('retransmits_per_segment'))}"
                    for h in hosts
                    if h in per_seg
                )
            )
    where = "both ends of the job's only link" if extent == "link" else f"every host ({len(hosts)})"
    q = f"sum by (host) (rate({sig.key}[{int(max(d.step, 4 * d.interval))}s]))"
    rep.findings.append(
        Finding(
            "network",
            f"{what} rose on {where} when throughput fell ({fmt(sf.fast_level)} -> {fmt(sf.slow_level)} {sf.unit}, "
            f"most in {utc(win[0])} .. {utc(win[1])}): "
            + ", ".join(f"{h} {fmt(rise[h][1])} -> {fmt(rise[h][0])}/s" for h in hosts)
            + seg_text
            + ("; no single host to blame: " + ("either end may be at fault" if extent == "link" else "shared cause")),
            hosts,
            win,
            [d.queries["counters"] + f"   # {sig.key}: rate by host", q],
            values,
            0.7,
            plot=series_plot(f"rate({sig.key}) per host", "/s", sig.per, d, []),
        )
    )
    return True


LOCAL_DROP_SHARE = 0.005  # a host's own stack dropped >= this share of what it asked IP to send (in its window)
LOCAL_DROP_MIN = 50.0  # ... and at least this many packets over the job


def _local_drops(d: Data, sf: SlowFast | None) -> dict[str, dict] | None:
    """Hosts whose own stack dropped what they sent before their NIC: rate(hw_ip_out_requests_total) -
    rate(hw_ip_out_transmits_total) per host (0 on a healthy host; forwarded packets count only in
    transmits, so the difference is clipped at 0). Only drops in the job's slow moments count, at
    FLEET_RISE x their rate in its fast ones or more: a host that drops steadily (a firewall rule on
    some other traffic) is no incident. {host: {dropped, share, window}} for a subset of the hosts over
    LOCAL_DROP_SHARE and LOCAL_DROP_MIN, else None (a kernel before Linux 6.3 has no OutTransmits, or
    the job never slowed down, SF None: then nothing is said)."""
    req, out = d.rates.get("hw_ip_out_requests_total", {}), d.rates.get("hw_ip_out_transmits_total", {})
    if not req or not out or sf is None:
        return None
    bad = {}
    for h in d.hosts:
        if h not in req or h not in out:
            return None
        drop = np.clip(np.nan_to_num(req[h] - out[h]), 0, None)
        hit = (drop >= 1.0) & sf.slow
        if not hit.any() or _mean(drop, sf.slow) < FLEET_RISE * _mean(drop, sf.fast):
            continue
        asked = float(np.nansum(np.where(hit, req[h], 0.0)))
        dropped = float(drop[hit].sum()) * d.step
        share = float(drop[hit].sum()) / asked if asked > 0 else math.nan
        if dropped >= LOCAL_DROP_MIN and share >= LOCAL_DROP_SHARE:
            bad[h] = {"dropped": dropped, "share": share, "window": window_of(d.grid, hit, d.step), "per": drop}
    return bad if bad and len(bad) < len(d.hosts) else None


def _network_local(d: Data, rep: Report, bad: dict[str, dict]) -> None:
    """The finding for hosts whose own stack dropped what they sent (their peers may count more retransmits)."""
    hosts = sorted(bad)
    lo = min(bad[h]["window"][0] for h in hosts)
    hi = max(bad[h]["window"][1] for h in hosts)
    q = (
        f"clamp_min(sum by (host) (rate(hw_ip_out_requests_total[{int(max(d.step, 4 * d.interval))}s])) - "
        f"sum by (host) (rate(hw_ip_out_transmits_total[{int(max(d.step, 4 * d.interval))}s])), 0)"
    )
    values = {
        "signal": "hw_ip_out_requests_total - hw_ip_out_transmits_total",
        "side": "local",
        "why": SIDE_WHY["local"],
        "dropped_packets": {h: bad[h]["dropped"] for h in hosts},
        "dropped_share": {h: bad[h]["share"] for h in hosts},
        "retransmits_per_s": {
            h: _mean(v, d.mask((lo, hi))) for h, v in d.rates.get("hw_tcp_retransmits_total", {}).items()
        },
        "phases": d.phases,
    }
    rep.findings.append(
        Finding(
            "network",
            f"{', '.join(hosts)} dropped what {'it' if len(hosts) == 1 else 'they'} sent before the NIC: "
            + ", ".join(
                f"{h} {fmt(bad[h]['dropped'])} packets ({_pct(bad[h]['share'])} of its IP packets, loopback included)"
                for h in hosts
            )
            + f" in {utc(lo)} .. {utc(hi)}; the peers' retransmits follow from it (IP OutRequests above OutTransmits)",
            hosts,
            (lo, hi),
            [d.queries["counters"] + "   # hw_ip_out_requests_total, hw_ip_out_transmits_total", q],
            values,
            0.9,
            plot=series_plot(
                "packets dropped before the NIC per host", "/s", {h: bad[h]["per"] for h in bad}, d, hosts
            ),
        )
    )


def check_network(d: Data, rep: Report) -> None:
    sf = slow_fast(d)  # the job's slow and fast moments: the local-drop rule and the self-comparison
    local = _local_drops(d, sf)
    if local:  # direct evidence of the end at fault: it wins over who counts the most retransmits
        return _network_local(d, rep, local)
    signals = _network_signals(d)
    if not signals:
        return rep.skipped.append({"check": "network", "needs": list(NEEDS["network"])})
    pw = _phase_windows(d)
    found = {s.key: _stand_out(d, s, pw) for s in signals}
    rdma = {s.side: s for s in signals if s.side in SIDES}
    side = {s.side: found[s.key] for s in signals if s.side in SIDES}
    end = _rdma_end(d, side.get("requester"), side.get("responder"), rdma)
    cands = [x for s in signals if s.side not in SIDES and (x := found[s.key])] + ([end] if end else [])
    best = max(cands, key=lambda x: x.weight, default=None)
    if best is None and sf is not None and _network_fleet(d, rep, signals, sf):
        return None
    if best is None:
        detail = "no host's retransmit or link-error rate stands out" + (" (not even in the slow phase)" if pw else "")
        if sf is not None:
            detail += "; none rose on every host in the job's slow moments against its fast ones"
        return rep.clean("network", detail, NEEDS["network"])
    sig, bad, r = best.sig, best.bad, best.r_slow
    what = sig.key
    values = {
        "signal": sig.key,
        "side": sig.side,
        "why": SIDE_WHY[sig.side],
        "rate_per_s": {h: r[h] for h in bad},
        "peer_median_per_s": best.peer,
        "rate_before_per_s": {h: best.r_fast.get(h, math.nan) for h in bad},
        "phases": d.phases,
    }
    if sig.counters:  # RDMA: the counters that rose on the culprits, and the other side on their peers
        mine = {c: sum(_mean(per[h], best.mask) for h in bad if h in per) for c, per in sig.counters.items()}
        top = [c for c, x in sorted(mine.items(), key=lambda kv: -kv[1]) if x > 0][:3]
        what = f"RDMA {sig.side}-side counters ({', '.join(top)})"
        values["counters_per_s"] = {c: mine[c] for c in top}
        other = rdma.get("responder" if sig.side == "requester" else "requester")
        if other:
            peers = {h: _mean(v, best.mask) for h, v in other.per.items() if h not in bad}
            values["peers_other_side"] = other.side
            values["peers_other_side_per_s"] = dict(sorted(peers.items(), key=lambda kv: -kv[1])[:8])
    seg_text = ""
    if sig.side == "sender":  # TCP: per segment sent too (the loss, whatever the traffic)
        mf = np.zeros(d.grid.size, bool)
        if best.r_fast and pw:
            mf = d.mask((pw[0]["start"], pw[0]["end"]))
        per_seg, rto = _tcp_per_segment(d, bad, best.mask, mf)
        if per_seg:
            values["per_segment"], values["rto_bound"] = per_seg, rto
            if rto:
                seg_text = "; RTO-bound, per segment sent: " + ", ".join(
                    f"{h} {_pct(per_seg[h].get('retransmits_per_segment'))}" for h in bad if h in per_seg
                )
    q = f"sum by (host) (rate({sig.key}[{int(max(d.step, 4 * d.interval))}s]))"
    rep.findings.append(
        Finding(
            "network",
            f"{what} {best.how} on {', '.join(bad)}: "
            + ", ".join(f"{h} {fmt(r[h])}/s" for h in bad)
            + f" (peer median {fmt(best.peer)}/s){seg_text}; {SIDE_SHORT[sig.side]}",
            bad,
            best.win,
            [d.queries["counters"] + f"   # {sig.key}: rate by host", q],
            values,
            best.score,
            plot=series_plot(f"rate({what}) per host", "/s", sig.per, d, bad),
        )
    )


def check_gpu_thermal(d: Data, rep: Report) -> None:
    temps = {k: v for k, v in d.gauges.items() if k.startswith("hw_gpu_temperature_celsius")}
    clock = d.gpu_min.get("hw_gpu_clock_mhz", {})
    thr = d.throttle.get("thermal", {})
    if not temps and not thr:
        return rep.skipped.append({"check": "gpu_thermal", "needs": ["hw_gpu_temperature_celsius"]})
    m = d.mask()
    hot: dict[str, float] = {}
    for key, per in temps.items():
        if "mem" in key:
            continue
        for h, f in deviation_fraction(per, m, lambda v, p: v >= p + HOT_ABOVE_PEERS).items():
            hot[h] = max(hot.get(h, 0.0), f)
    slow = deviation_fraction(clock, m, lambda v, p: v <= 0.9 * p) if clock else {}
    thr_frac = {h: float(np.nanmean(np.nan_to_num(v[m]) > 0)) for h, v in thr.items()} if thr else {}
    thr_peer = nanmed([thr_frac.get(h, 0.0) for h in d.hosts]) if thr else 0.0
    bad = [
        h
        for h in d.hosts
        if (hot.get(h, 0) >= 0.1 and (slow.get(h, 0) >= 0.05 or thr_frac.get(h, 0) >= 0.05))
        or (thr_frac.get(h, 0) >= 0.1 and thr_peer < 0.02 and hot.get(h, 0) >= 0.02)
    ]
    if not bad or len(bad) > max(1, len(d.hosts) // 2):
        return rep.clean(
            "gpu_thermal",
            "no host runs hotter than its peers with lower clocks or thermal throttling",
            NEEDS["gpu_thermal"],
        )
    key = next((k for k in temps if "junction" in k), next((k for k in temps if "mem" not in k), None))
    per = temps.get(key, {}) if key else {}
    hit = np.zeros(d.grid.size, bool)
    for h in bad:
        if h in per:
            hit |= m & (per[h] >= peer_median(per, h) + 10)
    win = window_of(d.grid, hit, d.step) or d.train
    # over the finding's window, the peers' level the median of theirs: the numbers its verify checks give
    temp, peer_temp = window_medians(per, d.mask(win), bad)
    clk, peer_clk = window_medians(clock, d.mask(win), bad)
    vals = {
        h: {
            "temp_c": temp.get(h, math.nan),
            "peer_temp_c": peer_temp,
            "min_core_clock_mhz": clk.get(h, math.nan),
            "peer_core_clock_mhz": peer_clk,
            "hot_fraction": hot.get(h, 0.0),
            "throttle_fraction": thr_frac.get(h, math.nan),
        }
        for h in bad
    }
    qs = [d.queries.get("gauges", ""), d.queries.get("gpu_min", "")] + ([d.queries["throttle:thermal"]] if thr else [])
    rep.findings.append(
        Finding(
            "gpu_thermal",
            f"GPUs on {', '.join(bad)} run hot and clock down while their peers don't: "
            + "; ".join(
                f"{h} {fmt(v['temp_c'])}C vs {fmt(v['peer_temp_c'])}C, core clock {fmt(v['min_core_clock_mhz'])} "
                f"vs {fmt(v['peer_core_clock_mhz'])} MHz"
                for h, v in vals.items()
            ),
            bad,
            win,
            qs,
            {"sensor": key, "hosts": vals},
            0.85,
            plot=series_plot(f"{key} (max GPU per host)", "C", per, d, bad) if per else None,
        )
    )


def check_gpu_power(d: Data, rep: Report) -> None:
    limit = d.gpu_min.get("hw_gpu_power_limit_watts", {})
    power = d.gauges.get("hw_gpu_power_watts", {})
    thr = d.throttle.get("power", {})
    if not limit and not thr:
        return rep.skipped.append({"check": "gpu_power", "needs": ["hw_gpu_power_limit_watts"]})
    m = d.mask()
    capped = deviation_fraction(limit, m, lambda v, p: v <= 0.9 * p) if limit else {}
    thr_frac = {h: float(np.nanmean(np.nan_to_num(v[m]) > 0)) for h, v in thr.items()}
    thr_peer = nanmed([thr_frac.get(h, 0.0) for h in d.hosts]) if thr else 0.0
    bad = [h for h in d.hosts if capped.get(h, 0) >= 0.1 or (thr_frac.get(h, 0) >= 0.3 and thr_peer < 0.1)]
    if not bad or len(bad) > max(1, len(d.hosts) // 2):
        return rep.clean(
            "gpu_power",
            "no host has a lower GPU power limit or more power-cap throttling than its peers",
            NEEDS["gpu_power"],
        )
    hit = np.zeros(d.grid.size, bool)
    for h in bad:
        if h in limit:
            hit |= m & (limit[h] <= 0.9 * peer_median(limit, h))
    if not hit.any():
        hit = m
    win = window_of(d.grid, hit, d.step)
    lim, peer_lim = window_medians(limit, d.mask(win), bad)
    drawn, _ = window_medians(power, d.mask(win), bad)
    vals = {
        h: {
            "power_limit_w": lim.get(h, math.nan),
            "peer_power_limit_w": peer_lim,
            "power_w": drawn.get(h, math.nan),
            "capped_fraction": capped.get(h, 0.0),
            "power_throttle_fraction": thr_frac.get(h, math.nan),
        }
        for h in bad
    }
    rep.findings.append(
        Finding(
            "gpu_power",
            f"GPU power capped on {', '.join(bad)}: "
            + "; ".join(
                f"{h} limit {fmt(v['power_limit_w'])} W vs peers {fmt(v['peer_power_limit_w'])} W, drawing "
                f"{fmt(v['power_w'])} W"
                for h, v in vals.items()
            ),
            bad,
            win,
            [d.queries.get("gpu_min", "")] + ([d.queries["throttle:power"]] if thr else []),
            {"hosts": vals},
            0.84,
            plot=series_plot("GPU power limit (min GPU per host)", "W", limit, d, bad) if limit else None,
        )
    )


def check_gpu_hardware(d: Data, rep: Report) -> None:
    fams = [k for k in d.deltas if k.startswith(("hw_gpu_ras", "hw_gpu_pcie_aer", "hw_gpu_kernel_errors"))]
    width = d.gpu_min.get("hw_gpu_pcie_link_width", {})
    if not fams and not width:
        return rep.skipped.append({"check": "gpu_hardware", "needs": list(NEEDS["gpu_hardware"])})
    bad: dict[str, list[str]] = {}
    for key in fams:
        per = d.deltas[key]
        # any kernel GPU error event (Xid, amdgpu RAS/reset) is rare on a healthy node: one is enough
        severe = "{ue}" in key or "{fatal}" in key or "{nonfatal}" in key or key.startswith("hw_gpu_kernel_errors")
        peer = nanmed(list(per.values()))
        for h, inc in per.items():
            if (severe and inc >= GPU_SEVERE_ERRORS) or (not severe and inc >= max(100, 10 * peer)):
                bad.setdefault(h, []).append(f"{key} +{inc:g}")
    m = d.mask()
    if width:
        for h, f in deviation_fraction(width, m, lambda v, p: v < p).items():
            if f >= 0.5:
                bad.setdefault(h, []).append(f"PCIe link width {nanmed(width[h][m]):g} < peers")
    if not bad or len(bad) > max(1, len(d.hosts) // 2):
        return rep.clean(
            "gpu_hardware",
            "no RAS/ECC or PCIe AER error counts, no kernel GPU error events (Xid, amdgpu RAS/reset), no degraded "
            "PCIe link",
            NEEDS["gpu_hardware"],
        )
    hosts = [h for h in d.hosts if h in bad]
    severe = any("{ue}" in s or "fatal" in s or "kernel_errors" in s for h in hosts for s in bad[h])
    ce = d.rates.get(next((k for k in d.rates if k.startswith("hw_gpu_ras_errors_total") and 'kind="ce"' in k), ""), {})
    rep.findings.append(
        Finding(
            "gpu_hardware",
            "GPU hardware errors on " + "; ".join(f"{h}: {', '.join(bad[h])}" for h in hosts),
            hosts,
            d.train,
            [
                d.queries[f"delta:{k}"]
                for k in ("hw_gpu_ras_errors_total", "hw_gpu_pcie_aer_errors_total", "hw_gpu_kernel_errors_total")
                if f"delta:{k}" in d.queries
            ],
            {"errors": bad},
            0.9 if severe else 0.7,
            plot=series_plot("rate(hw_gpu_ras_errors_total{kind=ce}) per host", "/s", ce, d, hosts) if ce else None,
        )
    )


def check_cpu(d: Data, rep: Report) -> None:
    procs = d.gauges.get("hw_procs_running", {})
    if not procs:
        return rep.skipped.append({"check": "cpu_contention", "needs": ["hw_procs_running"]})
    m = d.mask()
    frac = deviation_fraction(procs, m, lambda v, p: v - p >= np.maximum(RUNQ.value, (RUNQ.peer or 0) * p))
    bad = [h for h in d.hosts if frac.get(h, 0) >= 0.2]
    pw = _phase_windows(d)
    if not bad and pw and len(procs) >= 2:
        fast, slow = pw
        mf, ms = d.mask((fast["start"], fast["end"])), d.mask((slow["start"], slow["end"]))
        rise = {h: nanmed(v[ms]) - nanmed(v[mf]) for h, v in procs.items()}
        base = {h: nanmed(v[mf]) for h, v in procs.items()}
        up = [h for h in d.hosts if h in rise and rise[h] >= max(8, 0.5 * base[h])]
        if len(up) >= 0.75 * len(procs):
            rep.findings.append(
                Finding(
                    "cpu_contention",
                    f"the run queue rose on {len(up)}/{len(procs)} hosts when throughput dropped "
                    f"(median +{nanmed(list(rise.values())):.0f} tasks)",
                    up,
                    (slow["start"], slow["end"]),
                    [d.queries["gauges"] + "   # hw_procs_running"],
                    {"rise": rise, "before": base},
                    0.7,
                    plot=series_plot("hw_procs_running per host", "tasks", procs, d, up),
                )
            )
            return
    cpu = d.gauges.get("hw_cpu_pressure_some_pct", {})
    # more runnable tasks is contention only when they wait for a CPU: the host's CPU pressure
    # ('some') must be above its peers' at those moments too (a big host absorbs a few extra
    # threads; two scrapes of one busy machine differ by chance)
    unfelt = []
    for h in list(bad):
        if h in cpu and len(cpu) >= 2:
            at = m & (procs[h] - peer_median(procs, h) >= 8)
            with np.errstate(all="ignore"):
                excess = nanmed((cpu[h] - peer_median(cpu, h))[at])
            if math.isfinite(excess) and excess < 5:
                bad.remove(h)
                unfelt.append(h)
    if not bad or len(bad) > max(1, len(d.hosts) // 2):
        detail = "run queues are alike on every host" + (" and did not rise with the slowdown" if pw else "")
        if unfelt:
            detail = (
                f"run queue above the peers on {', '.join(unfelt)} without CPU pressure above theirs: no contention"
            )
        return rep.clean("cpu_contention", detail, NEEDS["cpu_contention"])
    hit = np.zeros(d.grid.size, bool)
    for h in bad:
        hit |= m & (procs[h] - peer_median(procs, h) >= 8)
    vals = {
        h: {
            "procs_running": nanmed(procs[h][hit]),
            "peer_procs_running": nanmed(peer_median(procs, h)[hit]),
            "cpu_pressure_some_pct": nanmed(cpu[h][hit]) if h in cpu else math.nan,
            "peer_cpu_pressure_some_pct": nanmed(peer_median(cpu, h)[hit]) if h in cpu else math.nan,
            "fraction": frac[h],
        }
        for h in bad
    }
    rep.findings.append(
        Finding(
            "cpu_contention",
            "run queue far above the peers on "
            + "; ".join(
                f"{h}: {v['procs_running']:.0f} runnable vs {v['peer_procs_running']:.0f}" for h, v in vals.items()
            ),
            bad,
            window_of(d.grid, hit, d.step),
            [d.queries["gauges"] + "   # hw_procs_running, hw_cpu_pressure_some_pct"],
            {"hosts": vals},
            0.75,
            plot=series_plot("hw_procs_running per host", "tasks", procs, d, bad),
        )
    )


def check_io(d: Data, rep: Report) -> None:
    full, some = d.peaks.get("hw_io_pressure_full_pct", {}), d.peaks.get("hw_io_pressure_some_pct", {})
    if not full and not some:
        return rep.skipped.append({"check": "io_pressure", "needs": ["hw_io_pressure_full_pct"]})
    m = (d.grid >= d.start) & (d.grid <= d.end)
    hit_of = {}
    for h in d.hosts:
        f, s = full.get(h), some.get(h)
        hit = np.zeros(d.grid.size, bool)
        if f is not None:
            hit |= np.nan_to_num(f) >= IO_FULL
        if s is not None:
            hit |= np.nan_to_num(s) >= IO_SOME
        if (hit & m).sum() >= 2:
            hit_of[h] = hit & m
    if not hit_of:
        peak = max((np.nanmax(v) for v in full.values() if np.isfinite(v).any()), default=math.nan)
        return rep.clean("io_pressure", f"IO pressure stayed low (peak 'full' {fmt(peak)} %)", NEEDS["io_pressure"])
    bad = [h for h in d.hosts if h in hit_of]
    anyhit = np.logical_or.reduce(list(hit_of.values()))
    tok = d.tb.get("tokens")
    dip = math.nan
    if tok is not None and np.isfinite(tok[anyhit]).any():
        dip = nanmed(tok[anyhit]) / nanmed(tok[~anyhit & d.mask()])
    vals = {
        h: {
            "io_full_peak_pct": float(np.nanmax(full[h])) if h in full else math.nan,
            "io_some_peak_pct": float(np.nanmax(some[h])) if h in some else math.nan,
            "minutes_pressured": float(hit_of[h].sum() * d.step / 60),
        }
        for h in bad
    }
    every = len(bad) == len(d.hosts)
    rep.findings.append(
        Finding(
            "io_pressure",
            ("every host" if every else ", ".join(bad)) + " stalled on IO (PSI 'full' up to "
            f"{fmt(max(v['io_full_peak_pct'] for v in vals.values()))} %) in {int(_runs(anyhit))} episode(s)"
            + (f"; throughput in those windows was {dip * 100:.0f} % of the rest" if math.isfinite(dip) else ""),
            bad,
            window_of(d.grid, anyhit, d.step),
            [d.queries[k] for k in d.queries if k.startswith("peak:hw_io")],
            {"hosts": vals, "throughput_ratio_in_windows": dip},
            0.72,
            plot=series_plot("max_over_time(hw_io_pressure_full_pct) per host", "%", full, d, bad) if full else None,
        )
    )


def _runs(mask: np.ndarray) -> int:
    return int(np.sum(mask[1:] & ~mask[:-1]) + (1 if mask.size and mask[0] else 0))


def check_memory(d: Data, rep: Report) -> None:
    kills = d.deltas.get("hw_oom_kills_total", {})
    avail, total = d.gauges.get("hw_memory_available_bytes", {}), d.gauges.get("hw_memory_total_bytes", {})
    mfull = d.peaks.get("hw_memory_pressure_full_pct", {})
    if not kills and not avail and not mfull:
        return rep.skipped.append({"check": "memory", "needs": list(NEEDS["memory"])})
    killed = [h for h in d.hosts if kills.get(h, 0) >= OOM_KILLS]
    low = []
    for h in d.hosts:
        if h in avail and h in total and np.isfinite(avail[h]).any():
            if np.nanmin(avail[h] / total[h]) <= 0.03:
                low.append(h)
        if h in mfull and np.nanmax(np.nan_to_num(mfull[h])) >= 20 and h not in low:
            low.append(h)
    bad = killed or low
    if not bad or (not killed and len(low) > max(1, len(d.hosts) // 2)):
        return rep.clean("memory", "no OOM kill, host memory never ran out", NEEDS["memory"])
    ref = avail.get(bad[0])
    hit = np.zeros(d.grid.size, bool)
    for h in bad:
        if h in avail and h in total:
            hit |= (avail[h] / total[h]) <= 0.1
    vals = {
        h: {
            "oom_kills": kills.get(h, 0.0),
            "min_available_pct": float(np.nanmin(avail[h] / total[h]) * 100) if h in avail and h in total else math.nan,
            "memory_pressure_full_peak_pct": float(np.nanmax(mfull[h])) if h in mfull else math.nan,
            **_leak(d, avail.get(h)),
        }
        for h in bad
    }
    what = "the kernel OOM killer killed a process" if killed else "host memory ran out (no OOM kill recorded)"

    def leak_text(v: dict) -> str:
        if v["leak_onset"] is None:
            return ""
        return f", leaking {fmt(v['leak_gib_per_h'])} GiB/h from {utc(v['leak_onset'])}"

    rep.findings.append(
        Finding(
            "memory",
            f"{what} on {', '.join(bad)}: "
            + "; ".join(
                f"{h} available memory down to {fmt(v['min_available_pct'])} %{leak_text(v)}" for h, v in vals.items()
            ),
            bad,
            window_of(d.grid, hit, d.step) or d.train,
            [
                d.queries.get("delta:hw_oom_kills_total", ""),
                d.queries.get("gauges", "") + "   # hw_memory_available_bytes",
            ],
            {"hosts": vals},
            0.93 if killed else 0.6,
            plot=series_plot("hw_memory_available_bytes per host", "B", avail, d, bad) if ref is not None else None,
        )
    )


def _leak(d: Data, avail: np.ndarray | None) -> dict:
    """When a host's available memory began its decline to the minimum and how fast it fell: a line fitted
    to the decline (from the first quarter of the drop to the minimum) and traced back to the level it
    left (the median of the training window's first tenth). None/NaN without a decline of >= 5 %."""
    none = {"leak_onset": None, "leak_bytes_per_s": math.nan, "leak_gib_per_h": math.nan}
    if avail is None:
        return none
    ok = np.flatnonzero(d.mask() & np.isfinite(avail))
    if ok.size < 6:
        return none
    t, y = d.grid[ok], avail[ok]
    low = int(np.argmin(y))
    level = float(np.median(y[: max(3, y.size // 10)]))
    drop = level - float(y[low])
    if low < 3 or drop < 0.05 * level:
        return none
    above = np.flatnonzero(y[:low] >= level - 0.25 * drop)
    first = int(above[-1]) if above.size else 0
    if low - first < 2:
        return none
    slope, icept = np.polyfit(t[first : low + 1] - t[0], y[first : low + 1], 1)
    if slope >= 0:
        return none
    onset = min(max(t[0] + (level - icept) / slope, float(t[0])), float(t[low]))
    return {
        "leak_onset": float(onset),
        "leak_bytes_per_s": float(-slope),
        "leak_gib_per_h": float(-slope * 3600 / 2**30),
    }


def _spikes(d: Data, key: str, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """Windows where the max of a scalar jumps above its trailing median by `ratio` (and the baseline)."""
    y = d.tb.get(key)
    if y is None:
        return np.zeros(d.grid.size, bool), np.full(d.grid.size, np.nan)
    base = np.full(y.size, np.nan)
    hist: list[float] = []
    for i, v in enumerate(y):
        if len(hist) >= 5:
            base[i] = float(np.median(hist[-15:]))
        if math.isfinite(v):
            hist.append(v)
    with np.errstate(invalid="ignore"):
        if key == "loss":
            resid = y - base
            sd = max(robust_sd(resid), 0.01)
            hit = (resid >= np.maximum(8 * sd, 0.03 * np.abs(base))) & (resid >= 0.1)
        else:
            hit = (y >= ratio * base) & (y - base >= 1e-6) & (base > 0)
    return hit & d.mask(), base


def check_training(d: Data, rep: Report) -> None:
    present = [k for k in ("loss", "moe_lb_loss", "grad_norm") if k in d.tb]
    if not present:
        return rep.skipped.append({"check": "training_dynamics", "needs": list(NEEDS["training_dynamics"])})
    found, anyhit = {}, np.zeros(d.grid.size, bool)
    for key, ratio in (("loss", 0.0), ("moe_lb_loss", 2.5), ("grad_norm", 3.0)):
        if key not in d.tb:
            continue
        hit, base = _spikes(d, key, ratio)
        if hit.any():
            i = int(np.nanargmax(np.where(hit, d.tb[key] / np.where(base > 0, base, np.nan), -np.inf)))
            step = d.tb.get("step")
            found[key] = {
                "peak": float(d.tb[key][i]),
                "baseline": float(base[i]),
                "at": float(d.grid[i]),
                "step": float(step[i]) if step is not None else None,
                "windows": int(_runs(hit)),
            }
            anyhit |= hit
    if not found:
        return rep.clean(
            "training_dynamics", "no loss, MoE load-balance loss or grad-norm spike", NEEDS["training_dynamics"]
        )
    key = max(found, key=lambda k: found[k]["peak"] / max(found[k]["baseline"], 1e-12))
    win = window_of(d.grid, anyhit, d.step)
    cost = _throughput_cost(d, win)
    m = d.mask()
    back = all(_settled(k, d.tb[k][m], v["baseline"]) for k, v in found.items())
    # A spike that cost no throughput and settled back is worth knowing, not an incident.
    brief = cost is not None and cost["pct"] > -TRAIN_COST_PCT and back
    text = "; ".join(
        f"{k} {fmt(v['peak'])} vs baseline {fmt(v['baseline'])} at {utc(v['at'])}"
        + (f" (step ~{v['step']:.0f})" if v["step"] is not None else "")
        for k, v in found.items()
    )
    costs = (
        f"; tokens/s {fmt(cost['before'])} before, {fmt(cost['after'])} from the spike on ({cost['pct']:+.1f} %)"
        if cost
        else "; no tokens/s to tell its throughput cost"
    )
    if brief:
        rep.clean("training_dynamics", f"a brief spike that settled and cost no throughput ({text}{costs})", present)
    rep.findings.append(
        Finding(
            "training_spike" if brief else "training_dynamics",
            ("a brief training-scalar spike, no throughput cost: " if brief else "training scalars spiked: ")
            + text
            + costs,
            [],
            win,
            [d.queries[f"tb:{k}"] for k in found],
            {**found, "throughput_cost": cost},
            0.4 if brief else 0.45,
            decides=not brief,
            plot={
                "title": f"{key} (max per window)",
                "unit": "",
                "series": {"job": (d.grid, d.tb[key])},
                "highlight": ["job"],
            },
        )
    )


def _throughput_cost(d: Data, win: tuple[float, float] | None) -> dict | None:
    """Median tokens/s/device over the training window before a spike and from the spike on."""
    tok = d.tb.get("tokens")
    if tok is None or win is None:
        return None
    m = d.mask() & np.isfinite(tok)
    before, after = nanmed(tok[m & (d.grid < win[0])]), nanmed(tok[m & (d.grid >= win[0])])
    if not (math.isfinite(before) and math.isfinite(after)) or before <= 0:
        return None
    return {"before": before, "after": after, "pct": (after / before - 1) * 100, "unit": "tokens/s/device"}


def _settled(key: str, y: np.ndarray, baseline: float) -> bool:
    """Whether a scalar ended the run back near the level it spiked from."""
    ok = y[np.isfinite(y)]
    if not ok.size:
        return True
    end = float(np.median(ok[-max(3, ok.size // 20) :]))
    return end <= baseline + 0.1 if key == "loss" else end <= 1.5 * baseline


def _medians(d: Data) -> dict[str, dict[str, float]]:
    m = d.mask()
    out = {}
    for fam in (d.gauges, d.rates):
        for key, per in fam.items():
            out[key] = {h: nanmed(v[m]) for h, v in per.items()}
    return out


def _noise(d: Data) -> dict[str, dict[str, float]]:
    m = d.mask()
    out = {}
    for fam in (d.gauges, d.rates):
        for key, per in fam.items():
            out[key] = {h: robust_sd(v[m]) for h, v in per.items()}
    return out


def abs_floor(key: str, med: float) -> float:
    """The smallest per-host difference worth reporting for a family (by its unit)."""
    name = key.split("{")[0]
    for suffix, floor in (
        ("_pct", 2.0),
        ("_celsius", 3.0),
        ("_watts", 20.0),
        ("_mhz", 100.0),
        ("_gts", 1.0),
        ("_width", 1.0),
        ("_seconds_total", 1.0),
        ("_total", 1.0),
    ):
        if name.endswith(suffix):
            return floor
    return max(0.1 * abs(med), 2.0) if not name.endswith("_bytes") else max(0.05 * abs(med), 1.0)


def check_outliers(d: Data, rep: Report) -> None:
    """Every hw_ family: hosts whose median is far from the other hosts' (robust z-score)."""
    if len(d.hosts) < 3:
        rep.notes.append("per-host outliers need at least 3 hosts")
        return
    found = []
    for key, per in _medians(d).items():
        if not key.startswith("hw_") or len(per) < 3:
            continue
        med = nanmed(list(per.values()))
        floor = abs_floor(key, med)
        z = robust_z(per, floor / 2)
        for h, zz in z.items():
            dev = per[h] - med
            if abs(zz) >= 6 and abs(dev) >= max(0.25 * abs(med), floor):
                found.append((abs(zz), key, h, per[h], med, zz))
    found.sort(reverse=True)
    for _, key, h, v, med, zz in found[:8]:
        rep.findings.append(
            Finding(
                "host_outlier",
                f"{h}: {key} median {fmt(v)} vs {fmt(med)} on the other hosts (robust z {zz:+.0f})",
                [h],
                d.train,
                [d.queries["gauges" if key in d.gauges else "counters"] + f"   # {key}"],
                {"family": key, "host_median": v, "hosts_median": med, "robust_z": zz},
                0.2 + min(abs(zz), 50) / 500,
                decides=False,
            )
        )


# --- the registry ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Check:
    """One playbook: NAME as the report names it (a verdict, or "outliers"), and RUN(data, report,
    prom), which adds its findings, or a clean or skipped entry, to the report."""

    name: str
    run: Callable[[Data, Report, tsdb.Served], None]


def _data_only(check: Callable[[Data, Report], None]) -> Callable[[Data, Report, tsdb.Served], None]:
    """A check that reads only the loaded Data (not the TSDB again)."""
    return lambda d, rep, _prom: check(d, rep)


# Every check, in the order they run (a verdict's order among equals in the report follows it).
CHECKS: tuple[Check, ...] = (
    Check("hang", _data_only(check_hang)),
    Check("heartbeat_false_positive", check_heartbeat),
    Check("network", _data_only(check_network)),
    Check("gpu_thermal", _data_only(check_gpu_thermal)),
    Check("gpu_power", _data_only(check_gpu_power)),
    Check("gpu_hardware", _data_only(check_gpu_hardware)),
    Check("cpu_contention", _data_only(check_cpu)),
    Check("io_pressure", _data_only(check_io)),
    Check("memory", _data_only(check_memory)),
    Check("training_dynamics", _data_only(check_training)),
    Check("outliers", _data_only(check_outliers)),
)


def run_all(d: Data, rep: Report, prom: tsdb.Served) -> None:
    """Run every check of CHECKS on one job's Data, in order."""
    for check in CHECKS:
        check.run(d, rep, prom)
