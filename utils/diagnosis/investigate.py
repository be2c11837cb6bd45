"""Usage: investigate.py JOB [--json] [--metrics auto|always|never] [--workspace DIR] [--no-scheduler]

Investigates a job in one go, as the skills would: triage reads the log first (utils/triage.py),
then the metrics (utils/diagnose.py) and the step times (utils/perf.py) are read where they can add
something, by the skills' hand-over rules (docs/investigate.md):

  metrics  the job saved a TSDB (RAY=1) and triage hands over: it hung, its throughput changed
           during the run, a heartbeat was claimed, a collective failed, a host ran out of memory,
           or the log shows no failure at all (a slow run: which host, which resource)
  perf     the job logged steps and failed in no way the log explains (completed, running, hung,
           slowed down): throughput, stalls, hosts slower than their peers

and prints one evidence bundle: the verdict with its culprit hosts, the evidence (log lines as
file:line, PromQL with the values seen, step-time figures), what was ruled out, what could not be
checked, and next steps as commands with absolute paths (they run from any directory).

JOB: a job id, a job name (<id>-JAX-<model>[-<tag>]), a job directory or a log file; ids and names
are looked up in --workspace (default $JOB_WORKSPACE or <repo>/outputs).
--metrics auto (default) reads the TSDB by the rule above; always whenever the job has one; never
reads the log only. --json prints the bundle for programs (schema: docs/investigate.md).
Exit 0 when investigated (whatever the job's state), 2 on bad input, 1 when --metrics always was
asked and the TSDB could not be served.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diagnosis import baseline, cli, locate, triage
from diagnosis.cli import InputError
from diagnosis.min_nodes import min_nodes_notes

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "investigate/1"  # the bundle's "schema" (docs/investigate.md)
PROG = "investigate.py"
TOOLS = {name: REPO / "utils" / f"{name}.py" for name in ("triage", "diagnose", "perf", "sweep", "investigate")}

# triage's classes after which the metrics tell more (skills/job-log-triage, "Hand over")
METRICS_CLASSES = ("hang", "heartbeat_false_positive", "heartbeat_timeout", "collective_error", "oom_host", "gpu_error")
# triage's classes that explain a failure from the log alone: step times add nothing to them
PERF_SILENT = ("config_error", "gpu_health", "gpu_error", "oom_device", "segfault", "python_exception", "node_failure")
SLOW_HOST = 1.05  # perf: a host whose median step is this much above the job's does extra work
EVIDENCE_LINES = 6  # triage evidence items quoted (decisive first)
FINDINGS = 3  # diagnose findings quoted (strongest first)


def tool(name: str) -> str:
    """The absolute command of a tool in utils/ (runs from any directory, finds the venv itself)."""
    return shlex.quote(str(TOOLS[name]))


def _phases(tri: dict) -> int:
    return len((tri.get("tgs") or {}).get("phases") or [])


@dataclasses.dataclass(frozen=True)
class Handover:
    """One row of the routing rule from triage's answer to the next skill: skills/job-log-triage step
    4's table is generated from HANDOVER (utils/dev/failure_class_tables.py), and investigate reads the
    metrics by its rows that have `when` (the first that holds gives the reason)."""

    says: str  # the table's "Triage says" cell
    skill: str  # the skill handed over to (a directory of skills/), "" for none
    what: str  # what to get there
    when: Callable[[dict], bool] | None = None  # on triage's answer: hand over to the metrics (with a TSDB)
    reason: Callable[[dict], str] | None = None  # investigate's `ran[].why` for that hand-over


TSDB_ROW = "and the job has a TSDB"
HANDOVER: tuple[Handover, ...] = (
    Handover(
        f"`hung` (`status` or `failure_class` `hang`), {TSDB_ROW}",
        "tsdb-diagnosis",
        "what the GPUs and hosts did when steps stopped",
        lambda t: t["status"] == "hung" or t["failure_class"] == "hang",
        lambda t: "the job hung: what the GPUs and hosts did when steps stopped",
    ),
    Handover(
        ", ".join(f"`{c}`" for c in METRICS_CLASSES if c != "hang") + f", {TSDB_ROW}",
        "tsdb-diagnosis",
        "the metrics around the failure (power of the accused, memory, retransmits)",
        lambda t: t["failure_class"] in METRICS_CLASSES,
        lambda t: f"{t['failure_class']}: the metrics around the failure (power of the accused, memory, retransmits)",
    ),
    Handover(
        f"`tgs.phases` has more than one phase (throughput changed during the run), {TSDB_ROW}",
        "tsdb-diagnosis",
        "which hosts, which resource, when",
        lambda t: _phases(t) > 1,
        lambda t: "throughput changed during the run: which host and resource, when",
    ),
    Handover(
        "`failure_class` null (also a `completed` job: the log shows no failure), or the user says it is slow "
        f'("why is 8308 TGS so bad"), {TSDB_ROW}',
        "tsdb-diagnosis",
        "whether a host or resource held the job back; when nothing is found, compare with a clean run (its step 5, "
        "`--vs auto`)",
        lambda t: t["failure_class"] is None,
        lambda t: "the log shows no failure: whether a host or resource held the job back",
    ),
    Handover("questions about tokens/s, MFU, step time breakdown, profiles", "performance-analysis", ""),
    Handover(
        "a host named as culprit (`node_failure`, `collective_error` peer, the same host in several jobs) that "
        "should be confirmed or cleared",
        "batch-sweep",
        "(`nodes` or `bisect`)",
    ),
    Handover("`oom_device`: find the largest batch that fits", "batch-sweep", "(`batch`)"),
    Handover("`config_error` (MaxText rejected a key or value)", "model-config-guide", ""),
    Handover(
        "`gpu_health` (the GPU check before training failed: the job never trained)",
        "",
        "quote each culprit's `gpu_health: ... FAILED:` line and give the user the `resubmit without the bad "
        "nodes: ...` command from `next_steps` (the JOB SUMMARY's `resubmit:`) (do not run it)",
    ),
)


def handover_table() -> list[str]:
    """skills/job-log-triage step 4's table (markdown lines), from HANDOVER."""
    out = ["| Triage says | Next skill |", "|---|---|"]
    for h in HANDOVER:
        to = f"[{h.skill}](../{h.skill}/SKILL.md)" if h.skill else "none"
        sep = "" if not h.what else (" " if h.what.startswith("(") else ": ")
        out.append(f"| {h.says} | {to}{sep}{h.what} |")
    return out


def handover(tri: dict) -> Handover | None:
    """The row of HANDOVER that sends triage's answer to the metrics, or None."""
    return next((h for h in HANDOVER if h.when is not None and h.when(tri)), None)


def metrics_reason(tri: dict | None, mode: str) -> str | None:
    """Why the metrics are worth reading after triage (the hand-over rule, HANDOVER), or None."""
    if mode == "always":
        return "asked for (--metrics always)"
    if mode == "never":
        return None
    if tri is None:
        return "no log to triage: the metrics are the only evidence"
    h = handover(tri)
    return h.reason(tri) if h is not None and h.reason is not None else None


def perf_reason(tri: dict | None) -> str | None:
    """Why the step times are worth reading after triage, or None."""
    if tri is None or (tri.get("progress") or {}).get("last_step") is None:
        return None
    cls, phases = tri["failure_class"], len((tri.get("tgs") or {}).get("phases") or [])
    if cls in PERF_SILENT and phases <= 1:
        return None
    if phases > 1:
        return "throughput changed during the run: step times, stalls and slower hosts"
    if cls is None or cls == "hang" or tri["status"] in ("completed", "running", "hung"):
        return "the job trained: throughput, stalls and hosts slower than their peers"
    return None


def run_triage(job: locate.Job, ws: Path, scheduler: bool) -> dict | None:
    if job.log is None:
        return None
    return triage.triage(str(job.log), ws, triage.Options(scheduler=scheduler))


def run_diagnose(job: locate.Job, ws: Path, vs: Path | None = None, auto: dict | None = None) -> dict:
    from diagnosis import diagnose  # numpy: only when the metrics are read

    r = diagnose.diagnose(diagnose.locate(str(job.dir), ws), diagnose.locate(str(vs), ws) if vs else None, auto=auto)
    r.pop("_report", None)
    return r


def run_perf(job: locate.Job, ws: Path) -> dict:
    from diagnosis import perf

    return perf.perf(str(job.log), ws)


# --- the bundle -----------------------------------------------------------------------------
def triage_evidence(tri: dict) -> list[dict]:
    return [
        {"source": "triage", "kind": "log", **{k: e.get(k) for k in ("file", "line", "text", "host", "why")}}
        for e in tri["evidence"][:EVIDENCE_LINES]
    ]


def diagnose_evidence(diag: dict) -> list[dict]:
    out = []
    for f in diag["findings"][:FINDINGS]:
        item = {"source": "diagnose", "kind": "metrics", "finding": f["kind"], "summary": f["summary"]}
        item |= {k: v for k, v in f.items() if k not in ("kind", "summary")}  # hosts, window, queries, values, ...
        item["tsdb"] = diag["tsdb"]
        out.append(item)
    return out


def perf_evidence(p: dict) -> tuple[list[dict], list[dict]]:
    """(evidence, ruled_out) from perf's report: the throughput, stalls, hosts slower than the rest."""
    ev: list[dict] = []
    ruled: list[dict] = []
    tgs, stalls, st = p.get("tgs") or {}, p.get("stalls") or {}, p.get("step_time") or {}
    if tgs.get("steady") is not None:
        text = f"steady {tgs['steady']:.6g} tokens/s/device (p10 {tgs.get('p10')}, p90 {tgs.get('p90')})"
        if p.get("mfu") is not None:
            text += f", MFU {p['mfu']:.1%} of {p.get('peak_tflops')} TFLOP/s ({p.get('peak_source')})"
        if st.get("median") is not None:
            text += f"; median step {st['median']} s, p95 {st.get('p95')} s"
        ev.append({"source": "perf", "kind": "throughput", "field": "tgs.steady", "value": tgs["steady"], "text": text})
    if stalls.get("count"):
        ev.append(
            {
                "source": "perf",
                "kind": "stalls",
                "field": "stalls",
                "value": stalls.get("share"),
                "text": f"{stalls['count']} stall steps cost {stalls.get('excess_seconds')} s "
                f"({stalls.get('share')} of the wall time); longest: {stalls.get('longest')}",
            }
        )
    hosts = [h for h in p.get("hosts") or [] if h.get("vs_median") is not None]
    slow = [h for h in hosts if h["vs_median"] > SLOW_HOST]
    for h in sorted(slow, key=lambda h: -h["vs_median"])[:4]:
        ev.append(
            {
                "source": "perf",
                "kind": "slow_host",
                "host": h["host"],
                "field": "hosts[].vs_median",
                "value": h["vs_median"],
                "text": f"{h['host']} (rank {h.get('rank')}): median step {h.get('median')} s, "
                f"x{h['vs_median']} the job's median",
            }
        )
    if len(hosts) > 1 and not slow:
        ruled.append(
            {
                "source": "perf",
                "check": "slow_host",
                "detail": f"no host's median step is more than {SLOW_HOST:g}x the job's ({len(hosts)} hosts)",
            }
        )
    return ev, ruled


def decide(tri: dict | None, diag: dict | None, perf_ev: list[dict]) -> dict:
    """verdict, culprit_hosts, confidence, decided_by and summary from what ran.

    A failure class from the log decides (the log shows the error itself); the metrics' verdict
    then corroborates or not. Without a class, the metrics' verdict decides; without one either,
    hosts perf finds slower than the rest are the lead; else nothing is wrong that the tools see."""
    m_verdict = diag["verdict"] if diag else None
    if tri is not None and tri["failure_class"]:
        out = {
            "verdict": tri["failure_class"],
            "scope": tri.get("scope"),
            "culprit_hosts": tri["culprit_hosts"],
            "affected_hosts": tri.get("affected_hosts", tri["culprit_hosts"]),
            "confidence": tri["confidence"],
            "decided_by": "triage",
            "summary": tri["summary"],
        }
        if m_verdict and m_verdict != "none":
            agree = set(diag["culprit_hosts"]) & set(tri["culprit_hosts"]) or not tri["culprit_hosts"]
            out["summary"] += f"; the metrics say {m_verdict}" + (
                f" on {', '.join(diag['culprit_hosts'])}" if diag["culprit_hosts"] else ""
            )
            if agree and out["confidence"] != "high":
                out["confidence"] = "medium" if out["confidence"] == "low" else "high"
        return out
    if m_verdict and m_verdict != "none":
        top = next((f for f in diag["findings"] if f["kind"] == m_verdict), {})
        return {
            "verdict": m_verdict,
            "scope": diag.get("scope"),
            "culprit_hosts": diag["culprit_hosts"],
            "affected_hosts": diag.get("affected_hosts", diag["culprit_hosts"]),
            "confidence": "high" if top.get("score", 0) >= 0.8 else "medium",
            "decided_by": "diagnose",
            "summary": diag["summary"],
        }
    slow = [e["host"] for e in perf_ev if e["kind"] == "slow_host"]
    if slow:
        return {
            "verdict": "slow_host",
            "scope": "hosts",
            "culprit_hosts": slow,
            "affected_hosts": slow,
            "confidence": "low",
            "decided_by": "perf",
            "summary": f"{', '.join(slow)} step slower than the job's median (perf: hosts[].vs_median)",
        }
    status = tri["status"] if tri else "unknown"
    if diag is not None and diag.get("insufficient_evidence"):
        why = "insufficient evidence: " + diag["summary"]
    elif tri is not None and tri["status"] == "failed":
        why = f"the job failed in a way outside triage's classes: {tri['summary']}"
    else:
        why = f"{status}: no incident found" + (" in the log or the metrics" if diag else " in the log")
    return {
        "verdict": "none",
        "scope": None,
        "culprit_hosts": [],
        "affected_hosts": [],
        "confidence": None,
        "decided_by": None,
        "summary": why,
    }


def next_steps(job: locate.Job, tri: dict | None, diag: dict | None, verdict: dict, ws: Path) -> list[str]:
    """Commands (absolute paths) for what to look at next, the triage ones first."""
    out: list[str] = []
    seen: set[str] = set()

    def add(cmd: str) -> None:
        if cmd.split("   #")[0] not in seen:
            seen.add(cmd.split("   #")[0])
            out.append(cmd)

    for s in (tri or {}).get("next_steps", []):
        if "# triage again" not in s and "diagnose.py" not in s:  # investigate runs those; its own line is below
            add(s)
    jd = shlex.quote(str(job.dir)) if job.dir else None
    if diag is not None and jd:
        add(f"{tool('diagnose')} {jd} --json   # the whole metrics report (findings, values, queries)")
        if diag["findings"]:
            add(
                f'{tool("diagnose")} {jd} --plot "${{TMPDIR:-/tmp}}"/{shlex.quote(job.name + "-plots")}'
                "   # charts of the evidence"
            )
        if (diag.get("vs") or {}).get("other_tsdb"):
            other = shlex.quote(str(Path(diag["vs"]["other_tsdb"]).parent))
            add(f"{tool('diagnose')} {jd} --vs {other} --json   # the comparison with the baseline run")
        elif diag["verdict"] == "none" and not diag.get("insufficient_evidence"):
            add(
                "no good run of the same model beside this job to compare with; with one (OTHER_JOB): "
                f"{tool('diagnose')} {jd} --vs OTHER_JOB (a cause on every host from the start shows only this way)"
            )
    elif jd and job.dir is not None and (job.dir / "prometheus").is_dir():
        add(f"{tool('diagnose')} {jd}   # the metrics (not read: --metrics never or no hand-over)")
    if tri is not None and (tri.get("progress") or {}).get("last_step") is not None:
        add(f"{tool('perf')} {shlex.quote(str(job.log))} --json   # throughput, MFU, stalls, per-host step times")
    if verdict["culprit_hosts"] and verdict["verdict"] in SWEEP_CONFIRMS:
        kind = SWEEP_CONFIRMS[verdict["verdict"]]
        culprits = verdict["culprit_hosts"]
        every = [x["host"] for x in (tri or {}).get("hosts") or []] or list((diag or {}).get("hosts") or [])
        peers = [h for h in every if h not in culprits]
        nodes = every if kind == "bisect" else culprits + peers[: max(0, 3 - len(culprits))]
        try:  # a sweep's jobs (nodes: 1 node, bisect: 2) must hold the model (its config's minimum nodes)
            min_nodes_notes(model_of(job.name), 2 if kind == "bisect" else 1, ignore=False)
        except InputError as e:
            add(f"no {kind} sweep to confirm the culprits: {e}")
        else:
            add(
                f"{tool('sweep')} {kind} {shlex.quote(model_of(job.name))} --nodes {shlex.quote(','.join(nodes))} "
                "--dry-run   # confirm or clear the culprits with controlled jobs (skills/batch-sweep; without "
                "--dry-run it submits)"
            )
    add(f"{tool('investigate')} {shlex.quote(str(job.log or job.dir))} --json   # investigate again")
    return out


# verdicts whose culprits a sweep confirms or clears (skills/tsdb-diagnosis, "Hand over")
SWEEP_CONFIRMS = {
    "network": "bisect",
    "gpu_thermal": "nodes",
    "gpu_power": "nodes",
    "gpu_hardware": "nodes",
    "cpu_contention": "nodes",
    "slow_host": "nodes",
    "node_failure": "nodes",
}


def model_of(name: str) -> str:
    """The model in a job name <id>-JAX-<model>[-<tag>]: the longest head of what follows -JAX- that
    names a config in configs/ (a tag has dashes too), else all of it."""
    rest = name.partition("-JAX-")[2] or name
    parts = rest.split("-")
    for n in range(len(parts), 0, -1):
        if (REPO / "configs" / ("-".join(parts[:n]) + ".yml")).is_file():
            return "-".join(parts[:n])
    return rest


def investigate(arg: str, workspace: Path | None = None, metrics: str = "auto", scheduler: bool = True) -> dict:
    """The evidence bundle for JOB (see docs/investigate.md); InputError for bad input. A TSDB that
    cannot be served is a not_checked item (and `metrics_error`), not an exception."""
    ws = workspace or locate.default_workspace()
    job = locate.find(arg, ws)
    t0 = time.monotonic()
    ran: list[dict] = []
    skipped: list[dict] = []

    def timed(name: str, why: str, fn: Any) -> Any:
        t = time.monotonic()
        r = fn()
        ran.append({"tool": name, "why": why, "seconds": round(time.monotonic() - t, 3)})
        return r

    tri = None
    if job.log is not None:
        tri = timed(
            "triage", "first: status, failure and culprits from the log", lambda: run_triage(job, ws, scheduler)
        )
    else:
        skipped.append({"tool": "triage", "why": f"{job.path} has no log yet"})

    has_tsdb = job.dir is not None and (job.dir / "prometheus").is_dir()
    want = metrics_reason(tri, metrics)
    diag, metrics_error = None, None
    if want and has_tsdb:
        from diagnosis import tsdb

        try:
            diag = timed("diagnose", want, lambda: run_diagnose(job, ws))
            picked = baseline.pick(job.dir) if diag["verdict"] == "none" and not diag["insufficient_evidence"] else None
            if picked is not None:  # skills/tsdb-diagnosis step 5: a cause on every host shows only against a good run
                other, auto = picked
                why = f"no incident alone: compared with {other.name}, {auto['why']}"
                diag = timed("diagnose --vs", why, lambda: run_diagnose(job, ws, other, auto))
        except (tsdb.TSDBError, InputError) as e:
            metrics_error = cli.one_line(e)
            skipped.append({"tool": "diagnose", "why": f"the TSDB could not be read: {metrics_error}"})
    elif want:
        skipped.append({"tool": "diagnose", "why": f"{want}, but the job saved no TSDB (not a RAY=1 job)"})
    else:
        skipped.append(
            {
                "tool": "diagnose",
                "why": "--metrics never"
                if metrics == "never"
                else f"no hand-over: the log explains the failure ({tri['failure_class'] if tri else '?'})",
            }
        )

    pwhy = perf_reason(tri)
    p = timed("perf", pwhy, lambda: run_perf(job, ws)) if pwhy else None
    if p is None:
        trained = tri is not None and (tri.get("progress") or {}).get("last_step") is not None
        no_steps = "no step lines" if tri is not None else "no log"
        skipped.append({"tool": "perf", "why": "the log explains the failure" if trained else no_steps})
    p_ev, p_ruled = perf_evidence(p) if p else ([], [])

    verdict = decide(tri, diag, p_ev)
    evidence = (triage_evidence(tri) if tri else []) + (diagnose_evidence(diag) if diag else []) + p_ev
    if verdict["decided_by"] == "diagnose":  # the deciding source first
        evidence.sort(key=lambda e: e["source"] != "diagnose")
    ruled_out = [{"source": "diagnose", **c} for c in (diag or {}).get("ruled_out", [])] + p_ruled
    if tri is not None and tri["failure_class"] is None and tri["status"] in ("completed", "running"):
        ruled_out.insert(0, {"source": "triage", "check": "failure", "detail": f"{tri['status']}: {tri['summary']}"})
    not_checked = [{"source": s["tool"], "check": s["tool"], "detail": s["why"]} for s in skipped]
    if diag is not None:
        not_checked += [
            {"source": "diagnose", "check": s["check"], "detail": "no data: needs " + " or ".join(s["needs"])}
            for s in diag.get("skipped", [])
        ]
        if diag.get("missing"):
            gone = ", ".join(diag["missing"])
            not_checked.append({"source": "diagnose", "check": "missing families", "detail": gone})
    job_id, job_name = (tri["job_id"], tri["job_name"]) if tri else (locate.job_id_of(job.name), job.name)
    return {
        "schema": SCHEMA,
        "job_id": job_id,
        "job_name": job_name,
        "job_dir": str(job.dir) if job.dir else None,
        "log": str(job.log) if job.log else None,
        "tsdb": diag["tsdb"] if diag else (str(job.dir / "prometheus") if has_tsdb else None),
        "status": tri["status"] if tri else None,
        **verdict,
        "metrics_verdict": diag["verdict"] if diag else None,
        "evidence": evidence,
        "ruled_out": ruled_out,
        "not_checked": not_checked,
        "next_steps": next_steps(job, tri, diag, verdict, ws),
        "ran": ran,
        "metrics_error": metrics_error,
        "reports": {"triage": tri, "diagnose": diag, "perf": p},
        "seconds": round(time.monotonic() - t0, 3),
    }


# --- text -------------------------------------------------------------------------------------
def utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))


def render(r: dict) -> str:
    head = f"job {r['job_id']} ({r['job_name']})" + (f": {r['status'].upper()}" if r["status"] else "")
    lines = [head]
    v = f"Verdict: {r['verdict']}"
    if r["culprit_hosts"]:
        v += f" on {' '.join(r['culprit_hosts'])}"
    if r["decided_by"]:
        v += f"   (decided by {r['decided_by']}, confidence {r['confidence']})"
    lines += [v, f"  {r['summary']}"]
    lines.append("Ran: " + "; ".join(f"{x['tool']} ({x['seconds']:.1f} s): {x['why']}" for x in r["ran"]))
    if r["evidence"]:
        lines.append("Evidence:")
    for e in r["evidence"]:
        if e["kind"] == "log":
            lines.append(f"  [triage] {Path(e['file']).name if e['line'] != 1 else e['file']}:{e['line']}: {e['text']}")
            if e.get("why"):
                lines.append(f"      ({e['why']})")
        elif e["kind"] == "metrics":
            w = e.get("window")
            when = f" [{utc(w['start'])} .. {utc(w['end'])}]" if w else ""
            lines.append(f"  [diagnose] {e['finding']}{when}: {e['summary']}")
            for q in e.get("queries") or []:
                if q:
                    lines.append(f"      query: {q}")
        else:
            lines.append(f"  [perf] {e['text']}")
    if r["ruled_out"]:
        lines.append("Ruled out:")
        lines += [f"  - {c['check']}: {c['detail']}" for c in r["ruled_out"]]
    if r["not_checked"]:
        lines.append("Not checked:")
        lines += [f"  - {c['check']}: {c['detail']}" for c in r["not_checked"]]
    lines.append("Next steps:")
    lines += [f"  {s}" for s in r["next_steps"]]
    lines.append(f"({r['seconds']:.1f} s)")
    return "\n".join(lines)


# The options of investigate.py, declared once: its parser below and the MCP tool `investigate` (cli.Option).
OPTIONS = (
    cli.JSON,
    cli.Option(
        "metrics",
        "read the TSDB: auto (when triage hands over or the log shows no failure), always, never",
        default="auto",
        choices=("auto", "always", "never"),
    ),
    cli.WORKSPACE,
    cli.Option(
        "no_scheduler",
        "do not ask Slurm (scontrol) about the job",
        bool,
        cli_only="the MCP tool never asks Slurm (a job's result depends on its files only)",
    ),
)


def build_parser() -> cli.Parser:
    return cli.tool_parser(PROG, __doc__, "JOB", "job id, job name, job directory or log file", OPTIONS)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a: argparse.Namespace = ap.parse_args(argv)
    try:
        r = investigate(a.job, a.workspace, a.metrics, not a.no_scheduler)
    except InputError as e:
        return cli.fail(PROG, e)
    cli.emit(r, a.json, render)
    if a.metrics == "always" and r["metrics_error"]:
        return cli.fail(PROG, f"the metrics could not be read: {r['metrics_error']}", cli.FAILED)
    return cli.OK
