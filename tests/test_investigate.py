"""utils/investigate.py: triage first, then the metrics and the step times where the skills hand over.

On every incident family with a TSDB (tests/helpers/corpus.py), five log-only incidents
(tests/helpers/logcorpus.py) and a job directory whose log is gone, the bundle's verdict and culprit
hosts are the injected ones and say which tool decided; the evidence carries file:line for the log
and PromQL with values for the metrics; --metrics never/always change what is read; the next-step
commands run as printed from another directory; bad input is one line.
"""

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

from diagnosis import investigate
from helpers import corpus, inproc, logcorpus
from launch import config_header

TOOL = str(REPO / "utils" / "investigate.py")


@pytest.fixture(autouse=True, scope="module")
def _prometheus() -> None:
    assert shutil.which("prometheus") and shutil.which("promtool"), (
        "needs prometheus and promtool (apt-get install prometheus)"
    )


def bundle(job: Path, ws: Path, metrics: str = "auto") -> dict:
    r = investigate.investigate(str(job), ws, metrics, scheduler=False)
    json.dumps(r)  # every value is JSON
    return r


def cli(*args: str | Path, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """utils/investigate.py ARGS --no-scheduler in this process (helpers/inproc.py; the early reader below
    and test_lint run the command)."""
    return inproc.tool("investigate", *args, "--no-scheduler", env=env, cwd=cwd)


# --- incidents with metrics: every family of the corpus ------------------------------------------
# where the log names the failure, triage decides (the metrics' verdict is kept beside it); otherwise
# diagnose does (thread_leak: clean alone, found against the earlier run the corpus puts beside it)
TRIAGE_DECIDES = {"host_oom": "oom_host", "hang": "hang", "heartbeat_false_positive": "heartbeat_false_positive"}
# ~1.5 CPU-s each (thread_leak two diagnoses): the fast loop runs one of each way to decide (the log
# decides, the metrics name hosts, nothing found); the whole suite runs every family
FAST_CASES = {"hang", "gpu_thermal", "healthy"}
TSDB_CASES = [
    pytest.param(
        f,
        TRIAGE_DECIDES.get(f, v),
        "triage" if f in TRIAGE_DECIDES else ("diagnose" if v != "none" else None),
        id=f,
        marks=() if f in FAST_CASES else pytest.mark.slow,
    )
    for f, v in corpus.FAMILIES.items()
]


@pytest.mark.parametrize(("family", "verdict", "decided_by"), TSDB_CASES)
def test_incident_with_metrics(tmp_path, family, verdict, decided_by):
    inc = corpus.build(family, tmp_path, 1)
    r = bundle(inc.job_dir, tmp_path)
    why = json.dumps({k: r[k] for k in ("verdict", "culprit_hosts", "summary", "ran", "not_checked")}, indent=1)
    assert r["schema"] == "investigate/1" and r["job_name"] == inc.job_dir.name, why
    assert r["verdict"] == verdict and r["decided_by"] == decided_by, why
    assert sorted(r["culprit_hosts"]) == sorted(inc.culprits), why
    if inc.affected:  # fleet-wide (thread_leak, a shared file system): no culprit, the hosts apart
        assert r["scope"] == "fleet" and sorted(r["affected_hosts"]) == sorted(inc.affected), why
    ran = [x["tool"] for x in r["ran"]]
    assert ran[0] == "triage" and "diagnose" in ran, why
    assert r["metrics_verdict"] == inc.verdict, why  # what diagnose said, also where triage decided
    metrics = [e for e in r["evidence"] if e["source"] == "diagnose"]
    if verdict != "none":
        top = metrics[0]
        assert top["queries"] and top["values"] and set(inc.culprits) <= set(top["hosts"] or inc.culprits), top
    if decided_by == "triage":  # the log lines come first, as file:line
        first = r["evidence"][0]
        assert first["source"] == "triage" and Path(first["file"]).exists() and first["line"] >= 1, first
        assert f"the metrics say {inc.verdict}" in r["summary"], r["summary"]
    if family == "thread_leak":
        assert "diagnose --vs" in ran and inc.vs is not None and inc.vs.name in r["summary"], why
    if family == "healthy":
        checks = {c["check"] for c in r["ruled_out"]}
        assert {"failure", "network", "gpu_thermal", "memory"} <= checks, checks


# --- one routing rule: the skill's hand-over table and investigate -----------------------------------
def test_the_skill_hand_over_table_is_investigates_rule():
    """skills/job-log-triage step 4 is generated from investigate.HANDOVER (utils/dev/failure_class_tables.py):
    for every triage answer (each status, each class, one or two phases) the row investigate follows
    is in the skill as written, it sends to tsdb-diagnosis, and investigate reads the metrics exactly then."""
    from dev import failure_class_tables as tables
    from diagnosis import triage

    assert "skills/job-log-triage/SKILL.md" not in tables.stale_docs(), "run utils/dev/failure_class_tables.py"
    skill = (REPO / "skills" / "job-log-triage" / "SKILL.md").read_text()
    rows = {ln.strip() for ln in skill.splitlines() if ln.strip().startswith("|")}
    table = investigate.handover_table()
    assert set(table) <= rows, set(table) - rows
    for status in ("completed", "failed", "running", "hung", "cancelled", "unknown"):
        for cls in (None, *triage.CLASSES):
            for phases in (1, 2):
                tri = {"status": status, "failure_class": cls, "tgs": {"phases": [{}] * phases}}
                row = investigate.handover(tri)
                reason = investigate.metrics_reason(tri, "auto")
                assert (reason is None) == (row is None), (tri, reason)
                if row is not None:
                    line = table[2 + investigate.HANDOVER.index(row)]
                    assert "[tsdb-diagnosis]" in line and line in rows, line
    # the case an agent used to stop at: a completed job, no failure class, one phase, with a TSDB
    done = investigate.handover({"status": "completed", "failure_class": None, "tgs": {"phases": [{}]}})
    assert done is not None and done.skill == "tsdb-diagnosis" and "--vs auto" in done.what
    # classes the log explains go nowhere near the metrics
    assert investigate.handover({"status": "failed", "failure_class": "oom_device", "tgs": {}}) is None


def test_a_short_midrun_slowdown_hands_over_by_its_phases(tmp_path):
    """The corpus' 10-20 minute mid-run dip: triage's three phases are the hand-over (the skill's
    "`tgs.phases` has more than one phase" row, not the completed-job row), the metrics and the step
    times are read for it, and with no metric moving beside the dip nobody is blamed."""
    inc = corpus.build("midrun_slowdown", tmp_path, 1)
    r = bundle(inc.job_dir, tmp_path)
    why = {x["tool"]: x["why"] for x in r["ran"]}
    row = next(h for h in investigate.HANDOVER if h.says.startswith("`tgs.phases` has more than one phase"))
    assert row.reason is not None and why["diagnose"] == row.reason({}), why
    assert why["perf"].startswith("throughput changed during the run"), why
    assert r["verdict"] == "none" and r["culprit_hosts"] == [] and r["metrics_verdict"] == "none", r["summary"]


@pytest.mark.parametrize("twin", ["after", pytest.param("elsewhere", marks=pytest.mark.slow)])
def test_a_later_baseline_and_one_on_other_hosts(tmp_path, twin):
    """The thread leak's clean run has a later id and ran after it (after), or ran before it on hosts of
    another node type (elsewhere): triage reads the leak job as completed and healthy (the skill then
    hands over to tsdb-diagnosis), and investigate finds the leak against that run, as diagnose --vs auto."""
    inc = corpus.build("thread_leak", tmp_path, 4, twin=twin)
    r = bundle(inc.job_dir, tmp_path)
    tri = r["reports"]["triage"]
    assert tri["status"] == "completed" and tri["failure_class"] is None, tri["summary"]
    assert investigate.handover(tri).skill == "tsdb-diagnosis"
    ran = {x["tool"]: x["why"] for x in r["ran"]}
    assert (
        inc.vs.name in ran["diagnose --vs"]
        and ("after this one" if twin == "after" else "on other hosts") in ran["diagnose --vs"]
    ), ran
    assert r["verdict"] == "cpu_contention" and r["decided_by"] == "diagnose", r["summary"]
    assert r["reports"]["diagnose"]["vs"]["auto"]["picked"] == inc.vs.name
    # a leak on every host of the job is fleet-wide: no culprit to exclude, every host affected (on the
    # twin's own hosts, elsewhere, the comparison is job-level: nobody is named)
    assert r["culprit_hosts"] == [] and r["scope"] == "fleet", (r["culprit_hosts"], r.get("scope"))
    if twin == "after":
        assert sorted(r["affected_hosts"]) == sorted(inc.hosts), r["affected_hosts"]


def test_metrics_never_and_always(tmp_path):
    inc = corpus.build("rdma_retransmits", tmp_path, 1)
    r = bundle(inc.job_dir, tmp_path, "never")
    assert [x["tool"] for x in r["ran"]] == ["triage", "perf"] and r["metrics_verdict"] is None
    assert r["verdict"] != "network" and any(c["detail"] == "--metrics never" for c in r["not_checked"]), r
    assert any("utils/diagnose.py" in s and "not read" in s for s in r["next_steps"]), r["next_steps"]
    # a failure the log explains (oom_device is not handed over): auto reads no metrics, always does
    log = logcorpus.write_job(logcorpus.Job(job_id="312", failure="oom_device"), tmp_path / "oom")
    job_dir = log.with_suffix("")
    assert job_dir.is_dir()
    shutil.copytree(inc.job_dir / "prometheus", job_dir / "prometheus")
    r = bundle(log, tmp_path / "oom")
    assert r["verdict"] == "oom_device" and r["metrics_verdict"] is None and r["tsdb"] == str(job_dir / "prometheus")
    assert any(c["check"] == "diagnose" and "no hand-over" in c["detail"] for c in r["not_checked"]), r
    r = bundle(log, tmp_path / "oom", "always")
    assert r["verdict"] == "oom_device" and r["metrics_verdict"] is not None, r["ran"]
    assert r["ran"][1] == {"tool": "diagnose", "why": "asked for (--metrics always)", "seconds": r["ran"][1]["seconds"]}


def test_a_job_dir_without_its_log_is_read_from_the_metrics(tmp_path):
    inc = corpus.build("gpu_ecc", tmp_path, 1)
    inc.log.unlink()
    (inc.job_dir / "log").unlink(missing_ok=True)
    r = bundle(inc.job_dir, tmp_path)
    assert r["verdict"] == "gpu_hardware" and r["decided_by"] == "diagnose" and r["status"] is None, r["summary"]
    assert sorted(r["culprit_hosts"]) == sorted(inc.culprits) and r["job_id"] == inc.job_dir.name.split("-JAX-")[0]
    assert [x["tool"] for x in r["ran"]] == ["diagnose"] and "no log to triage" in r["ran"][0]["why"]
    assert {c["check"] for c in r["not_checked"]} >= {"triage", "perf"}, r["not_checked"]


# --- log-only incidents ------------------------------------------------------------------------
LOG_CASES = [
    ("oom_device", "oom_device", ["n3"], False),  # explained by the log: no metrics, no step times
    ("collective_error", "collective_error", ["n3"], False),
    ("node_failure", "node_failure", ["n3"], False),
    # a GPU that failed (tests/helpers/logcorpus.py GPU_ERRORS): the host is named and the metrics are asked for
    ("gpu_ecc", "gpu_error", ["n3"], False),
    ("gpu_hsa", "gpu_error", ["n3"], False),
    ("hang", "hang", ["n3"], True),
    (None, "none", [], True),
]


@pytest.mark.parametrize(("failure", "verdict", "culprits", "perf"), LOG_CASES, ids=[str(c[0]) for c in LOG_CASES])
def test_log_only_incident(tmp_path, failure, verdict, culprits, perf):
    job = logcorpus.Job(job_id="311", failure=failure, hosts=["n1", "n2", "n3", "n4"], culprit=2, steps=200)
    log = logcorpus.write_job(job, tmp_path)
    r = bundle(log, tmp_path)
    assert r["verdict"] == verdict and r["culprit_hosts"] == culprits, r["summary"]
    assert r["decided_by"] == ("triage" if failure else None) and r["tsdb"] is None
    ran = [x["tool"] for x in r["ran"]]
    assert ran == (["triage", "perf"] if perf else ["triage"]), r["ran"]
    assert not any(e["source"] == "diagnose" for e in r["evidence"])
    if failure:
        e = r["evidence"][0]
        assert e["source"] == "triage" and e["file"] and e["line"] >= 1 and e["text"], e
    else:
        assert any(e["source"] == "perf" and e["kind"] == "throughput" for e in r["evidence"]), r["evidence"]
    if failure in ("collective_error", "hang", None, "gpu_ecc", "gpu_hsa"):  # handed over to the metrics: none here
        assert any(c["check"] == "diagnose" and "saved no TSDB" in c["detail"] for c in r["not_checked"])


# --- the command ---------------------------------------------------------------------------------
def run_tools_as_printed(r: dict, where: Path, env: dict[str, str]) -> list[str]:
    """Run every next step that is a tool of this repository, as printed (split as the shell would), in
    WHERE, in this process (helpers/inproc.py; test_cli runs printed next steps through bash); [commands]."""
    tools = [s.split("   #")[0] for s in r["next_steps"] if s.startswith(str(REPO / "utils") + "/")]
    for cmd in tools:
        argv = shlex.split(cmd)
        assert Path(argv[0]).parent == REPO / "utils", cmd
        res = inproc.tool(Path(argv[0]).stem, *argv[1:], env=env, cwd=where)
        assert res.returncode == 0, (cmd, res.stderr[-2000:])
        if cmd.endswith("--json"):
            out = json.loads(res.stdout)
            assert out.get("job_name") == r["job_name"], (cmd, out.get("job_name"))
    return tools


def test_log_only_next_steps_run_from_another_directory(tmp_path):
    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    elsewhere.mkdir()
    log = logcorpus.write_job(logcorpus.Job(job_id="313", hosts=["n1", "n2", "n3"], steps=100), ws)
    res = cli("313", "--json", cwd=elsewhere, env={"JOB_WORKSPACE": str(ws)})
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["verdict"] == "none" and r["log"] == str(log) and r["status"] == "completed", r["summary"]
    tools = run_tools_as_printed(r, elsewhere, {"JOB_WORKSPACE": "/nonexistent"})
    assert {Path(t.split()[0]).name for t in tools} == {"perf.py", "investigate.py"}, tools


@pytest.mark.slow  # runs every printed tool (~10 CPU-s); the log-only twin below stays in the fast loop
def test_json_and_next_steps_run_from_another_directory(tmp_path):
    """`investigate.py NAME --json` from the workspace's shell; then every printed command that is a
    tool of this repository runs as printed from an unrelated directory and another workspace."""
    ws = tmp_path / "ws"
    inc = corpus.build("rdma_retransmits", ws, 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = cli(inc.job_dir.name, "--json", cwd=elsewhere, env={"JOB_WORKSPACE": str(ws)})
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["verdict"] == "network" and sorted(r["culprit_hosts"]) == sorted(inc.culprits)
    tools = run_tools_as_printed(r, elsewhere, {"JOB_WORKSPACE": "/nonexistent", "TMPDIR": str(tmp_path)})
    assert {Path(t.split()[0]).name for t in tools} >= {"diagnose.py", "perf.py", "investigate.py"}, tools
    # bisect runs 2-node jobs: offered only when the model's config allows them, else the reason
    model = inc.job_dir.name.split("-JAX-", 1)[1]
    fewest = config_header.read_header(REPO / "configs" / f"{model}.yml").minimum()
    if fewest and fewest.nodes > 2:
        assert "sweep.py" not in {Path(t.split()[0]).name for t in tools}, tools
        assert any(s.startswith("no bisect sweep") and f"at least {fewest.nodes} nodes" in s for s in r["next_steps"])
    else:
        assert "sweep.py" in {Path(t.split()[0]).name for t in tools}, tools
    text = cli(inc.job_dir, cwd=elsewhere)
    assert text.returncode == 0 and "Verdict: network on " in text.stdout and "Next steps:" in text.stdout
    assert "query: " in text.stdout and "Ruled out:" in text.stdout


def test_bad_input_is_one_line(tmp_path):
    for args, needle in (
        (["4242"], "no job '4242'"),
        (["/"], "not a job directory"),
        (["4242", "--metrics", "sometimes"], "invalid choice: 'sometimes'"),
    ):
        res = inproc.tool("investigate", *args, env={"JOB_WORKSPACE": str(tmp_path)}, cwd=tmp_path)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and res.stdout == "" and len(lines) == 1, (args, res.stderr)
        assert lines[0].startswith("investigate.py: ") and needle in lines[0], lines[0]


def test_a_reader_that_stops_early_ends_quietly(tmp_path):
    log = logcorpus.write_job(logcorpus.Job(job_id="9", failure="oom_device"), tmp_path)
    proc = subprocess.Popen(
        [TOOL, str(log), "--no-scheduler"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JOB_WORKSPACE": str(tmp_path)},
    )
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and err == "", err
