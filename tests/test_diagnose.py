"""utils/diagnose.py on the incident corpus (tests/helpers/corpus.py), on a real local job, and its CLI.

Every incident family is built at the small scale for several seeds and diagnosed in-process: the
verdict and the culprit hosts must be the ones the corpus injected, and the deciding finding must carry
its evidence (queries, window, values). Also: --vs finding a thread leak that is invisible alone,
`missing` when families are absent, bad input, `utils/prometheus.sh serve` and `utils/diagnosis/tsdb.py`.
"""

import copy
import json
import os
import re
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from conftest import REPO, VENV, run

from diagnosis import checks, diagnose, load, tsdb, verify
from helpers import corpus, inproc
from helpers.jobs import bad_job_arg
from helpers.promfixture import LivePrometheus, started_prometheus, tsdb_digest, write_tsdb

TOOL = str(REPO / "utils" / "diagnose.py")
PY = str(VENV / "bin" / "python")
SEEDS = (1, 2, 3)


@pytest.fixture(autouse=True, scope="module")
def _prometheus() -> None:
    # tests/run.sh installs them; missing tools are a failure, never a silent skip
    assert shutil.which("prometheus") and shutil.which("promtool"), (
        "needs prometheus and promtool (apt-get install prometheus)"
    )


@pytest.fixture(autouse=True, scope="module")
def live(_prometheus, tmp_path_factory) -> Iterator[LivePrometheus]:
    """A real Prometheus writing a job's TSDB, started with the module: its first scrapes (~6.5 s)
    come while the other tests run (test_live_wal_only_tsdb reads it)."""
    with started_prometheus(tmp_path_factory.mktemp("live") / "job" / "prometheus") as prom:
        yield prom


def diag(job: Path, vs: Path | None = None) -> dict:
    ws = diagnose.default_workspace()
    r = diagnose.diagnose(diagnose.locate(str(job), ws), diagnose.locate(str(vs), ws) if vs else None)
    r.pop("_report", None)
    return r


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    """utils/diagnose.py ARGS in this process (helpers/inproc.py); test_lint runs the command itself."""
    return inproc.tool("diagnose", *args, **kw)


def one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagnose.py: "), res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], res.stderr


def overlaps(a: dict | None, b: tuple[float, float] | None) -> bool:
    return a is None or b is None or (a["start"] <= b[1] and b[0] <= a["end"])


# --- every family, several seeds ------------------------------------------------------------
# Each case builds a corpus and serves its TSDB (~1.5 s). The fast loop runs seed 1 of one family
# of each kind (GPU, kernel-log GPU errors, host, training, heartbeat) that no other fast test below
# diagnoses; the full suite runs every family and seed.
FAST_FAMILIES = {"gpu_thermal", "gpu_xid", "host_oom", "moe_lb_spike", "heartbeat_false_positive"}
assert FAST_FAMILIES <= set(corpus.FAMILIES), FAST_FAMILIES - set(corpus.FAMILIES)
MATRIX = [
    pytest.param(f, s, id=f"{f}-{s}", marks=() if s == 1 and f in FAST_FAMILIES else pytest.mark.slow)
    for f in corpus.FAMILIES
    for s in SEEDS
]


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], tuple[corpus.Incident, dict]]:
    """(family, seed) -> the corpus' incident and diagnose's report on it (with its --vs job), each built
    and diagnosed once per test process: the tests below read them and change nothing (~1.5 s a case)."""
    done: dict[tuple[str, int], tuple[corpus.Incident, dict]] = {}

    def get(family: str, seed: int) -> tuple[corpus.Incident, dict]:
        if (family, seed) not in done:
            inc = corpus.build(family, tmp_path_factory.mktemp(f"{family}-{seed}") / "ws", seed)
            done[family, seed] = inc, diag(inc.job_dir, inc.vs)
        inc, r = done[family, seed]
        return inc, copy.deepcopy(r)

    return get


@pytest.mark.parametrize(("family", "seed"), MATRIX)
def test_family_verdict_and_culprits(incident, family, seed):
    inc, r = incident(family, seed)
    why = f"{family} seed {seed}: {r['summary']}\n" + "\n".join(f"  {f['kind']}: {f['summary']}" for f in r["findings"])
    assert r["verdict"] == inc.verdict, why
    assert sorted(r["culprit_hosts"]) == sorted(inc.culprits), why
    if inc.affected:  # a fleet-wide cause: no culprit, every host it touched listed apart
        assert r["scope"] == "fleet" and sorted(r["affected_hosts"]) == sorted(inc.affected), why
    elif inc.culprits:
        assert r["scope"] == "hosts" and sorted(r["affected_hosts"]) == sorted(inc.culprits), why
    assert not r["insufficient_evidence"] and r["missing"] == []
    if inc.verdict == "none":
        assert not [f for f in r["findings"] if f["kind"] in diagnose.VERDICTS], why
        assert len(r["ruled_out"]) >= 9, r["ruled_out"]
        return
    top = r["findings"][0]
    assert top["kind"] == inc.verdict and top["queries"] and all(top["queries"]) and top["values"], top
    assert overlaps(top["window"], inc.window), (top["window"], inc.window)
    assert inc.verdict not in {c["check"] for c in r["ruled_out"]}
    assert top["verify"] and all(
        c["query"] and sorted(c["expect"]["culprits"]) == sorted(inc.culprits) for c in top["verify"]
    ), top["verify"]
    if family == "heartbeat_false_positive":  # the accused were healthy: named, but no culprit
        assert top["accused_hosts"] == inc.notes["accused"] and top["hosts"] == [], top
        assert top["suspect_hosts"] == [inc.hosts[0]], top  # the coordinator (node rank 0)


# --- findings an agent can check: verify, and the numbers behind a verdict ------------------------
def skill_block(needle: str) -> str:
    """The ```bash block of skills/tsdb-diagnosis/SKILL.md that holds needle, as an agent pastes it."""
    text = (REPO / "skills" / "tsdb-diagnosis" / "SKILL.md").read_text()
    blocks = [b for b in re.findall(r"^ *```bash\n(.*?)^ *```", text, re.S | re.M) if needle in b]
    assert len(blocks) == 1, f"{len(blocks)} blocks hold {needle!r}"
    return textwrap.dedent(blocks[0])


def close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a == pytest.approx(b, rel=1e-4, abs=1e-9))


VERIFY_FAST = {"healthy", "heartbeat_false_positive", "gpu_xid", "gpu_thermal"}  # gpu_xid: the kernel-log query
SKILL_VERIFY_FAST = {"healthy", "gpu_xid"}  # the skill's block as written: nothing to check, and checks that match
# The skill's step 4 on one family of each shape of check it meets (every family's checks themselves are
# rerun by test_verify_reproduces_every_deciding_value): culprits against their peers, higher (gpu_xid)
# and lower (gpu_thermal's clock); the accused alive like their peers (heartbeat_false_positive); a
# level against its baseline (hang, grad_spike_brief under a `none` verdict); a job-level check without
# either (io_pressure); a finding that is not the verdict (healthy_ionic); a job the corpus compares
# (thread_leak, diagnosed alone as the skill does); nothing to check (healthy)
SKILL_VERIFY_FAMILIES = SKILL_VERIFY_FAST | {
    "gpu_thermal",
    "heartbeat_false_positive",
    "hang",
    "grad_spike_brief",
    "io_pressure",
    "healthy_ionic",
    "thread_leak",
}
assert SKILL_VERIFY_FAMILIES <= set(corpus.FAMILIES), SKILL_VERIFY_FAMILIES - set(corpus.FAMILIES)
# The signals that decide a verdict, each of which its finding must check (besides the one its summary leads with)
DECIDING = {
    "gpu_thermal": {"temperature", "clock"},
    "hang": {"power", "utilization"},
    "training_dynamics": {"tokens_before", "tokens_after"},
}
JQ_LIB = str(REPO / "skills" / "tsdb-diagnosis")


def jq_check(prom: tsdb.Served, check: dict) -> dict:
    """verify.jq's check($v) on Prometheus' own answer to the check's range query (as utils/prometheus.sh
    query prints it)."""
    rg = {"query": check["query"], "start": check["start"], "end": check["end"], "step": check["step"]}
    raw = requests.post(f"{prom.url}/api/v1/query_range", data=rg, timeout=60).text
    res = run(["jq", "-c", "-L", JQ_LIB, "--argjson", "v", json.dumps(check), 'include "verify"; check($v)'], input=raw)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def summary_numbers(f: dict, r: dict) -> list[tuple[str, float | None, float | None]]:
    """(what, the number the finding's summary and values give, the number its verify check got) for the
    numbers a finding quotes of its deciding signals."""
    by = {(c["signal"], c["job"] == r["job_name"]): c["expect"] for c in f["verify"]}
    v, out = f["values"], []
    if f["kind"] == "gpu_thermal":
        for h, x in v["hosts"].items():
            out += [("temp", x["temp_c"], by["temperature", True]["culprits"][h]),
                    ("peer temp", x["peer_temp_c"], by["temperature", True]["peers_median"]),
                    ("clock", x["min_core_clock_mhz"], by["clock", True]["culprits"][h]),
                    ("peer clock", x["peer_core_clock_mhz"], by["clock", True]["peers_median"])]  # fmt: skip
    if f["kind"] == "gpu_power" and ("power_limit", True) in by:
        for h, x in v["hosts"].items():
            out += [("limit", x["power_limit_w"], by["power_limit", True]["culprits"][h]),
                    ("peer limit", x["peer_power_limit_w"], by["power_limit", True]["peers_median"])]  # fmt: skip
    if f["kind"] == "hang":
        for signal, key in (("power", "power_median_w"), ("utilization", "util_min_median")):
            e = by[signal, True]
            peers = [x for h, x in v[key].items() if h not in f["culprit_hosts"]]
            out.append((signal, float(np.median(peers)), e.get("peers_median", e.get("hosts_median"))))
    if f["kind"] == "training_dynamics":
        out += [(k, x["peak"], by[k, True]["job"]) for k, x in v.items() if isinstance(x, dict) and "peak" in x]
        out += [("tokens before", v["throughput_cost"]["before"], by["tokens_before", True]["job"]),
                ("tokens after", v["throughput_cost"]["after"], by["tokens_after", True]["job"])]  # fmt: skip
    if "families" in v and r["vs"]["shared_hosts"] in (0, len(r["hosts"])):
        for row in v["families"][:3]:
            for mine, key in ((True, "this_median"), (False, "other_median")):
                e = by[row["family"], mine]
                if "culprits" not in e or not e["culprits"]:  # every host's level (or the job's)
                    out.append((f"{row['family']} {key}", row[key], e.get("hosts_median", e.get("job"))))
    return out


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=() if f in VERIFY_FAST else pytest.mark.slow) for f in corpus.FAMILIES]
)
def test_verify_reproduces_every_deciding_value(incident, family):
    """Every finding's verify checks (with --vs where the corpus compares two jobs), rerun by utils/verify.py's
    runner and by verify.jq on Prometheus' own answers, give every value diagnose expects within 1e-4; they
    cover every deciding signal (both jobs of a comparison), and the numbers the summary quotes are theirs."""
    inc, r = incident(family, 1)
    checks = [(f, c) for f in r["findings"] for c in f["verify"]]
    res = verify.rerun(r)
    assert res["schema"] == "verify/1" and res["match"] is True, verify.render(res)
    assert len(res["checks"]) == len(checks)
    for row, (f, c) in zip(res["checks"], checks, strict=True):
        assert row["expect"] == c["expect"] and row["signal"] == c["signal"], row
        for k, want in c["expect"].items():
            if isinstance(want, dict):
                assert all(close(row["got"][k][h], x) for h, x in want.items()), (f["kind"], row)
            else:
                assert close(row["got"][k], want), (f["kind"], c["signal"], row)
    tsdbs = {c["tsdb"] for _, c in checks}
    for path in tsdbs:
        with tsdb.Served(path) as prom:
            for f, c in checks:
                if c["tsdb"] == path:
                    out = jq_check(prom, c)
                    assert out["match"] is True and out["signal"] == c["signal"], (f["kind"], out, c)
    for f in r["findings"]:
        signals = {c["signal"] for c in f["verify"]}
        assert DECIDING.get(f["kind"], set()) <= signals, (f["kind"], signals)
        if f["kind"] == "training_dynamics":
            assert {k for k, x in f["values"].items() if isinstance(x, dict) and "peak" in x} <= signals
        if "families" in f["values"] or "other_median" in f["values"]:  # a comparison: both jobs checked
            assert {c["job"] for c in f["verify"]} == {r["job_name"], r["vs"]["other"]}, f["verify"]
        for what, said, checked in summary_numbers(f, r):
            assert close(said, checked), (f["kind"], what, said, checked)
    deciding = next((f for f in r["findings"] if f["kind"] == r["verdict"]), None)
    if deciding is not None:
        assert deciding["verify"], deciding
        assert all(sorted(c["expect"]["culprits"]) == sorted(r["culprit_hosts"]) for c in deciding["verify"])


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(f, marks=() if f in SKILL_VERIFY_FAST else pytest.mark.slow)
        for f in corpus.FAMILIES
        if f in SKILL_VERIFY_FAMILIES
    ],
)
def test_skill_verify_step_on_each_shape_of_check(tmp_path, incident, family):
    """The skill's check step (step 4), both ways as written: utils/verify.py "$JOB" says every check matches,
    and the by-hand block reruns each check of the deciding finding through utils/prometheus.sh and gets
    diagnose's values; they show the signal (culprits vs peers, the level vs its baseline). No finding:
    the block says so and exits 0."""
    inc, r = incident(family, 1)
    if inc.vs is not None:  # the skill diagnoses JOB alone
        r = diag(inc.job_dir)
    env = {"JOB": str(inc.job_dir), "JOB_WORKSPACE": str(inc.job_dir.parent), "TMPDIR": str(tmp_path)}
    one = run(["bash", "-euo", "pipefail", "-c", skill_block("utils/verify.py")], env=env, cwd=REPO, timeout=180)
    n = sum(len(f["verify"]) for f in r["findings"])
    assert one.returncode == 0 and f"{n}/{n} checks match" in one.stdout, (one.stdout, one.stderr)
    res = run(["bash", "-euo", "pipefail", "-c", skill_block('include "verify"')], env=env, cwd=REPO, timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, (res.stdout, res.stderr)
    chosen = next((f for f in r["findings"] if f["kind"] == r["verdict"]), r["findings"][0] if r["findings"] else None)
    if chosen is None or not chosen["verify"]:
        assert res.stdout.strip() == f"nothing to check: no finding with a verify query (verdict {r['verdict']})"
        return
    outs = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == len(chosen["verify"]), res.stdout
    for out, v in zip(outs, chosen["verify"], strict=True):
        assert out["match"] is True and out["expect"] == v["expect"] and out["signal"] == v["signal"], (out, v)
        got, want = out["got"], v["expect"]
        assert sorted(got) == sorted(want)
        for group in ("culprits", "accused"):
            assert sorted(got.get(group, {})) == sorted(want.get(group, {}))
            assert all(close(got[group][h], want[group][h]) for h in want.get(group, {})), (got, want)
        for k in ("peers_median", "hosts_median", "job"):
            assert close(got.get(k), want.get(k)), (k, got, want)
        if chosen["kind"] == r["verdict"] != "none":
            assert sorted(want["culprits"]) == sorted(r["culprit_hosts"])
        # the values show the deciding signal
        ref = want.get("peers_median")
        if want["culprits"] and ref is not None:
            sign = {"higher": 1, "lower": -1}[v["direction"]]
            assert all(sign * (x - ref) > 0 for x in want["culprits"].values()), v
        elif "accused" in want:  # alive like their peers
            assert v["direction"] == "same" and all(x >= 0.7 * ref for x in want["accused"].values()), v
        elif v.get("baseline") is not None:
            level = want.get("hosts_median", want.get("job"))
            assert (level > v["baseline"]) == (v["direction"] == "higher"), v


def test_verify_says_mismatch_when_the_metrics_do_not_show_it(incident):
    """A report whose expected value is not what the TSDB holds (a doctored peers' median): the check is a
    MISMATCH, the result says so, and utils/verify.py's own run of the job matches (exit 0)."""
    inc, r = incident("gpu_thermal", 1)
    r["findings"][0]["verify"][1]["expect"]["peers_median"] *= 1.01
    res = verify.rerun(r)
    assert res["match"] is False and res["mismatches"] == 1, verify.render(res)
    bad = next(c for c in res["checks"] if not c["match"])
    assert bad["signal"] == "clock" and bad["kind"] == "gpu_thermal"
    text = verify.render(res)
    assert "MISMATCH gpu_thermal clock" in text and "do not report a finding" in text, text
    ok = run([PY, str(REPO / "utils" / "verify.py"), inc.job_dir.name, "--workspace", inc.job_dir.parent], timeout=120)
    assert ok.returncode == 0 and "match    gpu_thermal clock" in ok.stdout, (ok.stdout, ok.stderr)


def test_verify_cli_help_and_bad_input(tmp_path):
    tool = str(REPO / "utils" / "verify.py")
    res = run([PY, tool, "--help"])
    assert res.returncode == 0 and res.stdout.startswith("Usage: verify.py JOB") and "--vs" in res.stdout
    for args, needle in (([str(tmp_path / "nope")], "does not exist"), ([], "required")):
        bad = run([PY, tool, *args])
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("verify.py: ") and needle in lines[0]


STEP_LINE = re.compile(r"completed step: (\d+), seconds: ([\d.]+), TFLOP/s/device: ([\d.]+), Tokens/s/device: ([\d.]+)")


@pytest.mark.parametrize(("family", "seed"), [("moe_lb_spike", s) for s in SEEDS] + [("heartbeat_false_positive", 1)])
def test_corpus_reproduces_the_seed_cases(tmp_path, family, seed):
    """Step numbers stay below steps=, TFLOP/s is 36-54 % of the GPU's bf16 peak and is 6 * N * tokens/s
    (+ attention) for the model; the MoE load-balance case runs 12-35 % slower from its first spike on."""
    inc = corpus.build(family, tmp_path, seed)
    text = inc.log.read_text()
    planned = int(re.search(r"^overrides: steps=(\d+)", text, re.M).group(1))
    rows = [(int(m[1]), float(m[2]), float(m[3]), float(m[4])) for m in STEP_LINE.finditer(text)]
    assert rows and max(r[0] for r in rows) < planned, (max(r[0] for r in rows), planned)
    steady = [r for r in rows if r[0] >= 1]
    peak = corpus.PEAK_TFLOPS[inc.notes["vendor"]]
    top = float(np.percentile([r[2] for r in steady], 90))
    assert 0.36 * peak <= top <= 0.55 * peak, (top, peak)
    per_token = corpus.flops_per_token(inc.notes["model"]) / 1e12
    assert all(r[2] == pytest.approx(r[3] * per_token, rel=0.01, abs=0.002) for r in steady)
    if family == "moe_lb_spike":
        at = inc.notes["spike_step"]
        before = np.median([r[1] for r in steady if r[0] < at])
        after = np.median([r[1] for r in steady if r[0] >= at])
        assert 1.11 <= after / before <= 1.36, (after / before, inc.notes["slower"])


def test_thread_leak_is_invisible_without_vs(tmp_path):
    inc = corpus.build("thread_leak", tmp_path, 4)
    alone = diag(inc.job_dir)
    assert alone["verdict"] == "none", alone["summary"]
    r = diag(inc.job_dir, inc.vs)
    assert r["verdict"] == "cpu_contention" and r["scope"] == "fleet", r["summary"]
    assert r["culprit_hosts"] == [] and r["affected_hosts"] == inc.hosts, r["summary"]  # 12 hosts, none to exclude
    ranked = {row["family"]: row for row in r["vs"]["ranked"]}
    procs = ranked["hw_procs_running"]
    assert 15 <= procs["this_median"] - procs["other_median"] <= 19, procs
    assert -0.02 < ranked["tb_tokens"]["relative"] < 0, ranked["tb_tokens"]  # throughput -1 %
    assert r["vs"]["shared_hosts"] == len(inc.hosts)
    assert r["findings"][0]["summary"].startswith(f"vs {inc.vs.name}: hw_procs_running")


def test_heartbeat_claim_without_a_time_is_skipped_not_ruled_out(tmp_path):
    inc = corpus.build("heartbeat_false_positive", tmp_path, 1)
    text = inc.log.read_text()
    # the same claim, its absl stamps gone: there is a claim, but no time to line it up with the metrics
    absl = re.compile(r"^(\S+: )[IWEF]\d{4} \S+ +\d+ [^\]\s]*\] (.*unhealthy \(stopped sending heartbeats\))", re.M)
    inc.log.write_text(absl.sub(r"\1\2", text))
    r = diag(inc.job_dir)
    assert r["verdict"] != "heartbeat_false_positive", r["summary"]
    assert "heartbeat_false_positive" in {s["check"] for s in r["skipped"]}, r["skipped"]
    assert "heartbeat_false_positive" not in {c["check"] for c in r["ruled_out"]}
    assert any("heartbeat claim has no absl time stamp" in n for n in r["notes"]), r["notes"]


def test_memory_finding_gives_the_leak_onset_and_rate(tmp_path):
    inc = corpus.build("host_oom", tmp_path, 2)
    r = diag(inc.job_dir)
    (h,) = inc.culprits
    got = r["findings"][0]["values"]["hosts"][h]
    onset, oom = inc.notes["leak"]  # the corpus' leak: a straight decline from onset to the OOM kill
    level = nanmed_available(r, h, onset)
    rate = level / (oom - onset)  # down to ~0 at the kill
    assert abs(got["leak_onset"] - onset) <= 0.05 * (oom - onset), (got, onset)
    assert got["leak_bytes_per_s"] == pytest.approx(rate, rel=0.1), (got, rate)
    assert got["leak_gib_per_h"] == pytest.approx(got["leak_bytes_per_s"] * 3600 / 2**30, rel=1e-3)
    assert f"leaking {diagnose.fmt(got['leak_gib_per_h'])} GiB/h from {diagnose.utc(got['leak_onset'])}" in r["summary"]


def nanmed_available(r: dict, host: str, before: float) -> float:
    """The host's available memory before the leak, read back from the TSDB."""
    with tsdb.Served(r["tsdb"]) as prom:
        rows = prom.query(f'hw_memory_available_bytes{{host="{host}"}}', before - 60)
    return float(rows[0]["value"][1])


def test_training_spike_cost_decides_incident_or_not(tmp_path, incident):
    """The MoE case: the run stayed 12-35 % slower from the spike on (training_dynamics, with the cost);
    a brief grad-norm spike that cost nothing is named but is no incident."""
    moe, r = incident("moe_lb_spike", 1)
    top = r["findings"][0]
    assert r["verdict"] == "training_dynamics" and top["kind"] == "training_dynamics", r["summary"]
    cost = top["values"]["throughput_cost"]
    assert cost["pct"] == pytest.approx((1 / moe.notes["slower"] - 1) * 100, abs=2.0), cost
    assert cost["after"] < cost["before"] and cost["unit"] == "tokens/s/device"
    assert f"({cost['pct']:+.1f} %)" in top["summary"]
    brief = corpus.build("grad_spike_brief", tmp_path / "brief", 1)
    r = diag(brief.job_dir)
    assert r["verdict"] == "none" and r["culprit_hosts"] == [], r["summary"]
    (spike,) = [f for f in r["findings"] if f["kind"] == "training_spike"]
    assert abs(spike["values"]["throughput_cost"]["pct"]) < 2 and "grad_norm" in spike["values"], spike
    assert overlaps(spike["window"], brief.window)
    ruled = {c["check"]: c["detail"] for c in r["ruled_out"]}
    assert ruled["training_dynamics"].startswith("a brief spike that settled and cost no throughput"), ruled


# TCP retransmits per second of two nodes on diagnose's 5 s grid over a RAY=1 job's training, measured
# live (tests/test_live_incidents.py, heavy IO on n2 while the rest of the suite loaded the machine): both
# retransmitted 0.05-0.1 % of the ~12,000 segments/s they sent; n1 is 4x n2 at 6 of the last 11 points.
LIVE_N1 = [0.0, 3.8, 9.2, 6.2, 6.6, 4.2, 7.4, 3.4, 8.4, 5.2, 11.8, 4.2, 10.2, 10.2, 3.6, 6.4, 7.8, 5.6, 10.0, 9.8, 6.0]
LIVE_N2 = [0.0, 2.2, 2.4, 4.4, 2.6, 7.0, 3.4, 4.4, 6.4, 6.2, 2.4, 3.6, 5.2, 1.2, 5.8, 3.2, 1.2, 6.4, 1.2, 2.4, 1.0]


def test_two_noisy_hosts_make_no_burst_but_a_real_one_stands_out():
    """The burst rule (a host >= the floor and 4x its peers at 3+ points) also wants 4x on average from
    its first such point to its last: two hosts' noise, where one is 4x the other now and then, is no
    burst (it was diagnosed `network` on the healthy n1 before); 30 segments/s more on n1 for 8 points is."""
    per = {"n1": np.array(LIVE_N1), "n2": np.array(LIVE_N2)}
    m = np.ones(len(LIVE_N1), bool)
    floor = checks.TCP.value
    assert checks._network_bursts(per, floor, m) == {}
    burst = np.array(LIVE_N1) + 30 * ((np.arange(len(LIVE_N1)) >= 6) & (np.arange(len(LIVE_N1)) < 14))
    found = checks._network_bursts({"n1": burst, "n2": np.array(LIVE_N2)}, floor, m)
    assert list(found) == ["n1"] and found["n1"][6:14].all() and found["n1"].sum() >= 8


def test_a_short_midrun_slowdown_is_a_phase_and_blames_no_host(tmp_path):
    """The corpus' 10-20 minute dip (steps 25-35 % longer) in a 3-hour run, with no metric moving beside it:
    the TSDB's tokens/s shows the same three phases as triage (the rule of utils/diagnosis/phases.py), the
    middle one on the dip within two grid steps, and diagnose invents no culprit."""
    inc = corpus.build("midrun_slowdown", tmp_path, 1)
    r = diag(inc.job_dir)
    ph = r["phases"]
    assert len(ph) == 3, ph
    step = corpus.SMALL.interval  # the grid step of a 3-hour job (at least the scrape interval)
    assert abs(ph[1]["start"] - inc.window[0]) <= 2 * step and abs(ph[1]["end"] - inc.window[1]) <= 2 * step, (
        ph,
        inc.window,
    )
    assert 1.2 < ph[0]["level"] / ph[1]["level"] < 1.4 and ph[2]["level"] == pytest.approx(ph[0]["level"], rel=0.02)
    assert r["verdict"] == "none" and r["culprit_hosts"] == [], r["summary"]


def test_text_output_says_when_it_shows_only_some_queries(incident):
    _, r = incident("moe_lb_spike", 1)
    n = len(r["findings"][0]["queries"])
    assert n > 2, r["findings"][0]["queries"]
    text = diagnose.render(r)
    assert f"(showing 2 of its {n} queries: --json lists them all)" in text, text
    first = r["findings"][0]["verify"][0]
    assert f"check {first['signal']}: max of {first['query']}" in text, text


def copy_job(src: Path, name: str, edit: Callable[[str], str] = lambda t: t) -> Path:
    """Another job in src's workspace with src's metrics: its log and summary.txt passed through edit."""
    dst = src.with_name(name)
    shutil.copytree(src, dst, symlinks=True)
    (dst / "log").unlink()
    log = dst.with_name(f"{name}.log")
    log.write_text(edit(src.with_name(f"{src.name}.log").read_text().replace(src.name, name)))
    (dst / "log").symlink_to(log)
    (dst / "summary.txt").write_text(edit((src / "summary.txt").read_text().replace(src.name, name)))
    return dst


@pytest.mark.slow  # five job copies, three diagnoses (~8 CPU-s); --vs auto's one-line refusal stays fast
def test_vs_auto_picks_the_nearest_clean_run_of_the_model_on_the_same_hosts(tmp_path):
    inc = corpus.build("thread_leak", tmp_path / "ws", 4)  # the leak job and its clean twin, an hour before it
    model = inc.notes["model"]
    # decoys: the same run failed; the same model on other hosts, a minute later (nearer, but no shared
    # host); the leak job itself under another id (its time overlaps the leak job's: never a baseline)
    copy_job(inc.vs, f"10-JAX-{model}", lambda t: t.replace("status: completed", "status: failed"))
    other = copy_job(inc.vs, f"11-JAX-{model}", lambda t: re.sub(r"\b(node|gpu|h100-|mi300x-)(\d+)", r"x\1\2", t))
    for meta in other.glob("prometheus/*/meta.json"):
        m = json.loads(meta.read_text())
        meta.write_text(json.dumps({**m, "maxTime": m["maxTime"] + 60_000}))
    copy_job(inc.job_dir, f"12-JAX-{model}")
    # a workspace the user set holds other jobs of the model (the README's first command makes outputs/):
    # the baseline still comes from the job's own directory
    elsewhere = tmp_path / "outputs"
    nearer = shutil.copytree(inc.vs, elsewhere / f"13-JAX-{model}")  # the twin, ended a minute later
    for meta in nearer.glob("prometheus/*/meta.json"):
        m = json.loads(meta.read_text())
        meta.write_text(json.dumps({**m, "maxTime": m["maxTime"] + 60_000}))
    env = {"JOB_WORKSPACE": str(elsewhere)}
    res = cli(inc.job_dir, "--vs", "auto", "--json", env=env)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["vs"]["other"] == inc.vs.name and r["verdict"] == "cpu_contention", r["summary"]
    auto = r["vs"]["auto"]
    assert auto["picked"] == inc.vs.name and auto["shared_hosts"] == len(inc.hosts) and auto["when"] == "before"
    assert auto["candidates"] == 2 and "shares hosts" in auto["why"], auto  # the twin and 11- (13- is not beside it)
    text = cli(inc.job_dir, "--vs", "auto", env=env).stdout
    assert f"Compared with: {inc.vs.name} (--vs auto: the nearest clean {model} run: it ended" in text, text
    # without --vs: nothing found, and the report says a baseline exists
    alone = cli(inc.job_dir, "--json", env=env)
    r = json.loads(alone.stdout)
    assert r["verdict"] == "none" and f"try --vs auto (it would compare with {inc.vs.name})" in r["summary"]
    assert any("--vs auto" in n and inc.vs.name in n for n in r["notes"]), r["notes"]
    assert json.loads(cli(inc.job_dir, "--vs", inc.vs, "--json").stdout)["vs"]["auto"] is None


@pytest.mark.parametrize("twin", ["after", pytest.param("elsewhere", marks=pytest.mark.slow)])
def test_vs_auto_takes_a_later_run_and_says_when_no_host_is_shared(tmp_path, twin):
    """The clean run has a later id and ran after the leak job (after), or ran before it on other
    hosts of another node type: half the memory, GPU power limit 700-750 W vs 1000 W (elsewhere).
    Both are picked; across hosts the report says so in one line and the node-type differences never
    decide: the run queue does."""
    inc = corpus.build("thread_leak", tmp_path, 4, twin=twin)
    res = cli(inc.job_dir, "--vs", "auto", "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    auto = r["vs"]["auto"]
    assert auto["picked"] == inc.vs.name and auto["when"] == ("after" if twin == "after" else "before"), auto
    assert r["verdict"] == "cpu_contention", r["summary"]
    assert "nan" not in json.dumps([f["summary"] for f in r["findings"]]) and "n/a" not in r["summary"], r["summary"]
    for row in r["vs"]["ranked"]:  # a difference and its percentage have the same sign
        assert (row["this_median"] - row["other_median"]) * row["relative"] >= 0, row
    across = [n for n in r["notes"] if n.startswith("no shared hosts")]
    deciding = {f["kind"] for f in r["findings"] if f["kind"] in diagnose.VERDICTS}
    if twin == "after":
        # a rise on every host is fleet-wide: every host affected, none to exclude
        assert r["culprit_hosts"] == [] and sorted(r["affected_hosts"]) == sorted(inc.hosts), r["culprit_hosts"]
        assert not across, r["notes"]
        return
    assert r["vs"]["shared_hosts"] == 0 and len(across) == 1 and "on other hosts" in auto["why"], r["notes"]
    assert deciding == {"cpu_contention"} and r["culprit_hosts"] == [], (deciding, r["summary"])
    informational = {f["values"]["family"] for f in r["findings"] if f["kind"] == "vs_difference"}
    assert {"hw_memory_total_bytes", "hw_gpu_power_limit_watts"} <= informational, informational
    assert across[0] in cli(inc.job_dir, "--vs", "auto").stdout


def test_vs_auto_without_a_clean_run_beside_it_is_one_line(tmp_path):
    inc = corpus.build("healthy", tmp_path, 5)
    first = json.loads(cli(inc.job_dir, "--json").stdout)
    assert "--vs auto" not in first["summary"] and not any("--vs auto" in n for n in first["notes"])
    one_line_error(
        cli(inc.job_dir, "--vs", "auto"), "--vs auto: no clean completed run of the same model", inc.job_dir.name
    )


def test_vs_with_the_job_itself_is_refused(network_job):
    job = network_job.job_dir
    one_line_error(cli(job, "--vs", job), "itself")
    one_line_error(cli(job, "--vs", "4242", "--workspace", job.parent), "is 4242-JAX-", "itself")
    one_line_error(cli(job, "--vs", job / "prometheus"), "itself")


# --- missing families -------------------------------------------------------------------------
# the GPU plugin's names (docs/metrics.md); the host plugin's hw_gpu_kernel_* (read from the kernel log) stay
GPU_PLUGIN = tuple(
    f"hw_gpu_{n}" for n in "clock info memory_utilization pcie power ras temperature throttle utilization vram".split()
)


@pytest.mark.parametrize(
    "drop", [("hw_gpu_", "hw_ib_"), (*GPU_PLUGIN, "hw_ib_")], ids=["no-hw_gpu", "host-plugin-only"]
)
def test_missing_gpu_and_rdma_plugins(tmp_path, drop):
    """No GPU or RDMA plugin: both collapse to a pattern, also when the host plugin's kernel-log
    counters (hw_gpu_kernel_*, on every node) are there."""
    inc = corpus.build("healthy", tmp_path, 5, drop=drop)
    r = diag(inc.job_dir)
    assert r["verdict"] == "none" and not r["insufficient_evidence"]
    assert {"hw_gpu_*", "hw_ib_*"} <= set(r["missing"]), r["missing"]
    skipped = {s["check"] for s in r["skipped"]}
    assert {"hang", "gpu_thermal", "gpu_power", "gpu_hardware"} <= skipped, skipped
    assert "no data for" in r["summary"]


@pytest.mark.parametrize("family", ["rdma_retransmits", "hang"])
def test_found_without_tensorboard(tmp_path, family):
    """No tb_* (no steps, no phases): network falls back to hosts far above their peers over the whole
    run, hang to the trailing stretch where GPUs are busy at low power."""
    inc = corpus.build(family, tmp_path, 6, drop=("tb_",))
    r = diag(inc.job_dir)
    assert r["verdict"] == inc.verdict and sorted(r["culprit_hosts"]) == sorted(inc.culprits), r["summary"]
    assert "tb_*" in r["missing"] and r["phases"] == []
    assert overlaps(r["findings"][0]["window"], inc.window)


def test_no_hw_or_tb_is_insufficient_evidence(tmp_path):
    t0 = 1_795_322_400
    write_tsdb(
        tmp_path / "prometheus",
        [
            ("ray_node_cpu_utilization", {"host": f"n{i}"}, [(t0 + 15 * k, 40.0 + i) for k in range(240)])
            for i in range(3)
        ],
    )
    res = cli(tmp_path / "prometheus", "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["verdict"] == "none" and r["insufficient_evidence"] is True
    assert {"hw_*", "tb_*"} <= set(r["missing"]) and r["culprit_hosts"] == []
    text = cli(tmp_path / "prometheus")
    assert "insufficient evidence" in text.stdout.lower(), text.stdout


def test_live_wal_only_tsdb(live):
    """A running Prometheus' TSDB (WAL only, written while we read): served from a copy, not touched."""
    live.wait_for(2, 30)
    res = cli(live.tsdb.parent, "--json")
    assert live.proc.poll() is None  # it ran while read
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["insufficient_evidence"] is True and r["range"] is not None


# --- CLI ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def network_job(tmp_path_factory) -> corpus.Incident:
    return corpus.build("rdma_retransmits", tmp_path_factory.mktemp("cli"), 2, job_id="4242")


def test_cli_json_text_and_plots(network_job, tmp_path):
    before = tsdb_digest(network_job.job_dir / "prometheus")
    res = cli(network_job.job_dir, "--json", "--plot", tmp_path / "png")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["verdict"] == "network" and sorted(r["culprit_hosts"]) == sorted(network_job.culprits)
    assert r["plots"] and all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in r["plots"])
    assert Path(r["plots"][0]).name == "1-network.png"
    for key in ("verdict", "culprit_hosts", "findings", "ruled_out", "missing", "range", "phases", "skipped"):
        assert key in r
    assert len(r["phases"]) >= 2
    text = cli("4242", "--workspace", network_job.job_dir.parent)  # by job id
    assert text.returncode == 0 and "Verdict: network" in text.stdout and "Ruled out:" in text.stdout, text.stdout
    via_tsdb = cli(network_job.job_dir / "prometheus", "--json")  # the TSDB dir itself
    assert json.loads(via_tsdb.stdout)["verdict"] == "network"
    here = cli(".", "--json", cwd=network_job.job_dir)  # from inside the job dir
    assert here.returncode == 0 and "Traceback" not in here.stderr, here.stderr
    assert json.loads(here.stdout)["job_name"] == network_job.job_dir.name
    assert tsdb_digest(network_job.job_dir / "prometheus") == before


def test_help():
    res = cli("--help")
    assert res.returncode == 0 and "Usage" in res.stdout and "--vs" in res.stdout


def test_bad_input(tmp_path, network_job):
    one_line_error(cli(tmp_path / "nope"), "does not exist")
    one_line_error(cli("999999", "--workspace", tmp_path), "no job '999999'")
    (tmp_path / "plain").mkdir()
    one_line_error(cli(tmp_path / "plain"), "neither a job dir nor a TSDB")
    job = tmp_path / "7-JAX-tiny"
    (job / ".stages").mkdir(parents=True)
    one_line_error(cli(job), "no saved metrics")
    one_line_error(cli(network_job.job_dir, "--vs", tmp_path / "nope"), "does not exist")
    one_line_error(cli(network_job.job_dir, "--frobnicate"), "unrecognized arguments")
    one_line_error(cli(), "required")
    # empty, '.', a file, a dangling link, a name too long: one line each, saying what to give
    one_line_error(cli(""), "empty JOB argument", "give a job id")
    one_line_error(cli(".", cwd=tmp_path), "neither a job dir nor a TSDB")
    one_line_error(cli(bad_job_arg("binary", tmp_path)), "is not a directory")
    one_line_error(cli(bad_job_arg("dangling", tmp_path)), "dangling symlink", "give a job id")
    one_line_error(cli(bad_job_arg("long", tmp_path)), "File name too long", "give a job id")
    one_line_error(cli(network_job.job_dir, "--vs", ""), "empty --vs argument")
    # --plot into a file is refused before anything is served
    one_line_error(cli(network_job.job_dir, "--plot", tmp_path / "x.log" / "png"), "is not a directory")


# the real local RAY=1 job is diagnosed in tests/test_ray_job.py (it runs one on the local cluster)


# --- utils/prometheus.sh serve and utils/diagnosis/tsdb.py -----------------------------------------------
def test_prometheus_serve_until_stdin_closes(tmp_path, network_job):
    db = network_job.job_dir / "prometheus"
    before = tsdb_digest(db)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [str(REPO / "utils" / "prometheus.sh"), "serve", str(network_job.job_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        line = proc.stdout.readline().split()
        fields = dict(kv.split("=", 1) for kv in line)
        assert fields["url"].startswith("http://127.0.0.1:") and int(fields["first_ms"]) < int(fields["last_ms"])
        assert len(list(tmp.iterdir())) == 1  # the private copy
        with tsdb.Served(db) as second:  # a second server at the same time: another port
            assert second.url != fields["url"] and second.first == int(fields["first_ms"]) / 1000
            rows = second.query("count(hw_procs_running)", second.last)
            assert int(float(rows[0]["value"][1])) == len(network_job.hosts)
            with pytest.raises(tsdb.TSDBError, match="parse error"):
                second.query("rate(x[5m]", second.last)
    finally:
        proc.stdin.close()
        rc = proc.wait(timeout=30)
    assert rc == 0, proc.stderr.read()
    assert list(tmp.iterdir()) == []
    assert tsdb_digest(db) == before


def test_tsdb_resolve_errors(tmp_path):
    with pytest.raises(tsdb.TSDBError, match="does not exist"):
        tsdb.resolve(tmp_path / "x")
    (tmp_path / "j" / "prometheus").mkdir(parents=True)
    with pytest.raises(tsdb.TSDBError, match="no saved metrics yet"):
        tsdb.resolve(tmp_path / "j")


def test_counter_rates_bridge_missed_scrapes():
    """A host with a bad network misses scrapes: the increase across the gap is its rate there
    (the live packet-loss incident lost two of n2's scrapes and, before, nearly all its rate)."""
    nan = float("nan")
    got = load._rates({"hw_tcp_retransmits_total": {"n2": np.array([0, 10, nan, nan, 40, 50, 5])}}, 2.0)
    r = got["hw_tcp_retransmits_total"]["n2"]
    assert np.isnan(r[0]) and np.isnan(r[6])  # nothing before the first sample; a reset is no rate
    assert r[1:6].tolist() == [5.0, 5.0, 5.0, 5.0, 5.0]


@pytest.mark.parametrize("seed", [1, 3])
def test_io_pressure_scope(tmp_path, seed):
    """A shared file system that stalls every host's checkpoint (seed 1) is fleet-wide: no culprit to
    exclude, every host in affected_hosts; one host's slow disk (seed 3) names that host."""
    inc = corpus.build("io_pressure", tmp_path, seed)
    r = diag(inc.job_dir)
    assert r["verdict"] == "io_pressure", r["summary"]
    if inc.notes["shared"]:
        assert r["scope"] == "fleet" and r["culprit_hosts"] == [] and r["affected_hosts"] == inc.hosts, r["summary"]
        assert r["findings"][0]["scope"] == "fleet" and r["findings"][0]["culprit_hosts"] == []
        assert "fleet-wide" in diagnose.render(r)
    else:
        assert r["scope"] == "hosts" and r["culprit_hosts"] == r["affected_hosts"] == inc.culprits, r["summary"]


# --- a loss every host feels: each host against its own fast moments -----------------------------
@pytest.mark.parametrize(("family", "seed", "extent"), [("tcp_link_loss", 1, "link"), ("tcp_fleet_loss", 2, "fleet")])
def test_loss_every_host_felt_is_a_fleet_wide_network_incident(tmp_path, family, seed, extent):
    """One node's outgoing link of a 2-node job drops packets (both ends resend alike: the live incident of
    issue 22 item 8, read as `none` before), or a 4-node job's switch does (every host): no host stands
    out from its peers, but each one's own retransmits rose when throughput collapsed. Network, fleet
    scope, no culprit to exclude, every host named with its rate before and in the slowdown, and per
    segment sent (the rates are RTO-bound: a few per second, though the loss is large)."""
    inc = corpus.build(family, tmp_path, seed)
    r = diag(inc.job_dir)
    assert r["verdict"] == "network" and r["scope"] == "fleet", r["summary"]
    assert r["culprit_hosts"] == [] and r["affected_hosts"] == inc.hosts == inc.affected, r["summary"]
    top = r["findings"][0]
    v = top["values"]
    assert top["kind"] == "network" and v["extent"] == extent and v["signal"] == "hw_tcp_retransmits_total", v
    assert overlaps(top["window"], inc.window), (top["window"], inc.window)
    for h in inc.hosts:  # each host's own rise, in the summary too
        assert v["rate_per_s"][h] >= 3 * v["rate_before_per_s"][h] and v["rate_per_s"][h] >= 1, v
        before, during = diagnose.fmt(v["rate_before_per_s"][h]), diagnose.fmt(v["rate_per_s"][h])
        assert f"{h} {before} -> {during}/s" in top["summary"], top["summary"]
        seg = v["per_segment"][h]
        assert seg["retransmits_per_segment"] >= 5 * seg["retransmits_per_segment_before"] > 0, seg
        assert 0 < seg["timeouts_per_segment"] < seg["retransmits_per_segment"], seg
    assert v["rto_bound"] is True and "per segment sent" in top["summary"], top["summary"]
    assert v["throughput"]["slow"] <= 0.3 * v["throughput"]["fast"], v["throughput"]
    assert ("both ends of the job's only link" if extent == "link" else "every host (4)") in top["summary"]
    ver = top["verify"][0]
    assert ver["expect"]["culprits"] == {} and ver["expect"]["hosts_median"] > ver["baseline"] > 0, ver
    assert "fleet-wide: every host" in diagnose.render(r)


def _net_data(retrans: dict[str, np.ndarray], segs: dict[str, np.ndarray], tokens: np.ndarray) -> load.Data:
    n = tokens.size
    d = load.Data(diagnose.Target("j", Path("/nonexistent"), None, None), 0.0, 60.0 * (n - 1), 60.0, 60.0, set())
    d.names = {"hw_tcp_retransmits_total", "hw_tcp_out_segments_total", "tb_perf_per_device_tokens_per_sec"}
    d.grid, d.hosts = 60.0 * np.arange(n), sorted(retrans)
    d.rates = {"hw_tcp_retransmits_total": retrans, "hw_tcp_out_segments_total": segs}
    d.tb = {"tokens": tokens}
    d.queries = {"counters": 'sum by (__name__, host) ({__name__=~"hw_.+_total"})'}
    d.train = (0.0, d.end)
    return d


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_host_dropping_what_it_sends_is_named_not_its_louder_peer(tmp_path, seed):
    """tcp_local_drop: the peer retransmits more (a failed send is no retransmit), but the dropping host's
    own IP counters (OutRequests above OutTransmits) name it; the peer is no culprit."""
    inc = corpus.build("tcp_local_drop", tmp_path, seed)
    r = diag(inc.job_dir)
    net = next(f for f in r["findings"] if f["kind"] == "network")
    (bad,) = inc.culprits
    (peer,) = [h for h in inc.hosts if h != bad]
    v = net["values"]
    assert r["verdict"] == "network" and r["culprit_hosts"] == [bad] and net["scope"] == "hosts", r["summary"]
    assert v["side"] == "local" and v["retransmits_per_s"][peer] > v["retransmits_per_s"][bad], v
    assert 0.02 < v["dropped_share"][bad] < 0.3 and f"{bad} dropped what it sent before the NIC" in net["summary"]
    assert overlaps(net["window"], inc.window), (net["window"], inc.window)


def test_local_drops_count_only_with_the_jobs_own_slowdown():
    """A host whose stack drops 5 % of its packets all run long (a firewall rule on other traffic) while
    the job runs at one speed is no incident; the same drops only while throughput collapsed name it."""
    from diagnosis import checks
    from diagnosis.evidence import Report

    n = 60
    flat = np.full(n, 1000.0)
    dip = flat.copy()
    dip[30:40] = 100.0
    for tokens, want in ((flat, None), (dip, ["n2"])):
        lost = np.zeros(n)
        lost[30:40] = 50.0
        steady = want is None
        d = _net_data({h: np.full(n, 0.1) for h in ("n1", "n2")}, {h: np.full(n, 3000.0) for h in ("n1", "n2")}, tokens)
        req = {h: np.full(n, 1000.0) for h in ("n1", "n2")}
        out = {"n1": req["n1"].copy(), "n2": req["n2"] - (50.0 if steady else lost)}
        d.rates |= {"hw_ip_out_requests_total": req, "hw_ip_out_transmits_total": out}
        rep = Report(d)
        checks.check_network(d, rep)
        got = [f.hosts for f in rep.findings if f.kind == "network" and f.values.get("side") == "local"]
        assert got == ([] if steady else [want]), [f.summary for f in rep.findings]


def test_a_dip_early_in_the_slow_phase_is_no_warm_up():
    """The series of a live `drill.sh net --loss 20 --inside` on n2 (2 nodes, 5 s grid, measured): the
    fault began a few steps into training, so the slow phase starts where training starts. The dip in it
    is the incident, not compilation: n2's drops there name it (the CI run that read `none`)."""
    from diagnosis import checks
    from diagnosis.evidence import Report

    nan = np.nan
    steps = [1533, 1364, 65, 68, 38, 1286, 1381, 1685, 1475, 1413, 1553, 1484, 1477, 1424, 1392]
    tokens = np.array([nan] * 5 + steps + [nan])
    lost = np.array([0.0] * 6 + [42.6, 64, 64, 123.6, 60] + [0.0] * 10)
    n = tokens.size
    d = _net_data({"n1": np.full(n, 2.0), "n2": np.full(n, 1.0)}, {h: np.full(n, 3000.0) for h in ("n1", "n2")}, tokens)
    d.train = (5 * 60.0, 19 * 60.0)
    d.phases = [
        {"start": 5 * 60.0, "end": 11 * 60.0, "level": 1286.0, "unit": "tokens/s/device"},
        {"start": 11 * 60.0, "end": 19 * 60.0, "level": 1476.0, "unit": "tokens/s/device"},
    ]
    req = {h: np.full(n, 1000.0) for h in ("n1", "n2")}
    d.rates |= {"hw_ip_out_requests_total": req, "hw_ip_out_transmits_total": {"n1": req["n1"], "n2": req["n2"] - lost}}
    sf = checks.slow_fast(d)
    assert sf is not None and sf.slow[7:10].all() and sf.fast[12:19].all(), sf
    rep = Report(d)
    checks.check_network(d, rep)
    assert [(f.hosts, f.values["side"]) for f in rep.findings] == [(["n2"], "local")], [f.summary for f in rep.findings]
    # a loaded machine: the job never reached full speed before the fault (every step slow until then),
    # no phases found; the fall into the dip ends the warm-up, so the dip still counts
    d.phases = []
    d.tb["tokens"][5:7] = (300.0, 900.0)
    sf = checks.slow_fast(d)
    assert sf is not None and not sf.slow[5] and sf.slow[6:10].all(), sf
    rep = Report(d)
    checks.check_network(d, rep)
    assert [f.hosts for f in rep.findings] == [["n2"]], [f.summary for f in rep.findings]


def test_more_traffic_is_no_loss_per_segment_sent():
    """The self-comparison reads TCP per segment sent: every host's retransmits up 5x in the slow stretch
    is a network incident when the segments sent fell with the throughput, none when they rose as much
    (more traffic, e.g. a checkpoint over the network, the same share of it resent)."""
    from diagnosis import checks
    from diagnosis.evidence import Report

    tokens = np.full(60, 1000.0)
    slow = (np.arange(60) >= 30) & (np.arange(60) < 40)
    tokens[slow] = 100.0
    retr = np.where(slow, 2.5, 0.5)
    for segs, verdict in ((np.where(slow, 300.0, 3000.0), "network"), (np.where(slow, 15000.0, 3000.0), None)):
        d = _net_data({"n1": retr, "n2": retr * 1.1}, {"n1": segs, "n2": segs}, tokens)
        rep = Report(d)
        checks.check_network(d, rep)
        kinds = [f.kind for f in rep.findings]
        assert kinds == ([verdict] if verdict else []), [f.summary for f in rep.findings]
        if verdict:
            assert rep.findings[0].hosts == ["n1", "n2"] and rep.findings[0].values["extent"] == "link"
            assert rep.findings[0].window == (29 * 60.0, 39 * 60.0)
        else:
            assert "none rose on every host" in rep.ruled_out[0]["detail"], rep.ruled_out
