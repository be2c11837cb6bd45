"""The job's alert rules (utils/observe/alert_rules.yml): generated from utils/diagnosis/alerts.tsv, the table
whose numbers diagnose's checks use too; valid for promtool; and each alert, in `promtool test rules`, stays
quiet while every host is alike and fires for the one host that has its fault, with the summary and query
a user is told. The series are synthetic, named and labelled as docs/metrics.md says."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO, run

from diagnosis import alerts, checks, load

RULES_FILE = REPO / "utils/observe/alert_rules.yml"
HOSTS = ("n1", "n2", "n3")
STEPS = 60  # samples, 5 s apart; the fault starts at sample 24 (120 s)


def promtool() -> str:
    tool = shutil.which("promtool")
    if not tool:
        pytest.fail("promtool is missing (Debian: apt-get install prometheus)")
    return tool


def test_the_rules_file_is_the_table_and_promtool_takes_it():
    res = run([str(REPO / "utils/dev/alert_rules.py"), "--check"])
    assert res.returncode == 0, res.stderr
    res = run([promtool(), "check", "rules", str(RULES_FILE)])
    assert res.returncode == 0 and f"SUCCESS: {len(alerts.RULES) + 6} rules found" in res.stdout, (
        res.stdout + res.stderr
    )


def test_diagnose_uses_the_tables_numbers():
    """One source: the numbers the checks compare with are the table's (a change of a row moves both)."""
    r = alerts.RULES
    assert (
        checks.TCP.value == r["TCPRetransmitsStandOut"].value and checks.PEER_RATIO == r["TCPRetransmitsStandOut"].peer
    )
    assert checks.HOT_ABOVE_PEERS == r["GPUHotterThanPeers"].value
    assert (checks.RUNQ.value, checks.RUNQ.peer) == (r["CPURunQueueAbovePeers"].value, r["CPURunQueueAbovePeers"].peer)
    assert (checks.IO_FULL, checks.IO_SOME) == (r["IOStall"].value, r["IOPressure"].value)
    assert checks.OOM_KILLS == r["OOMKill"].value and load.GAP_INTERVALS == r["NodeNotScraped"].value
    assert {x.check for x in r.values()} <= {*checks.NEEDS, "data_gaps"}


def counter(labels: str, slope: float) -> list[tuple[str, str]]:
    """n2's counter rises SLOPE per second from 120 s on; n1's and n3's stay flat."""
    out = []
    for h in HOSTS:
        per_step = slope * 5 if h == "n2" else 0
        values = f"0x24 0+{per_step:g}x{STEPS - 25}" if per_step else f"0x{STEPS - 1}"
        out.append((f"{{host={json.dumps(h)}{labels}}}", values))
    return out


def gauge(labels: str, normal: float, faulty: float) -> list[tuple[str, str]]:
    return [
        (f"{{host={json.dumps(h)}{labels}}}", f"{normal:g}x24 {faulty if h == 'n2' else normal:g}x{STEPS - 25}")
        for h in HOSTS
    ]


def jump(labels: str, to: float, appears: bool = False) -> list[tuple[str, str]]:
    """n2's counter goes from 0 to TO at 120 s (APPEARS: the series starts there, as the kernel-error counter
    does with its first event)."""
    before = "_x23 _" if appears else "0x24"
    return [(f"{{host={json.dumps(h)}{labels}}}", f"{before} {to:g}x{STEPS - 25}" if h == "n2" else f"0x{STEPS - 1}")
            for h in HOSTS if h == "n2" or not appears]  # fmt: skip


# the increase form's alerts: the labels of their counter's series besides host
COUNTERS = {
    "OOMKill": "",
    "GPUUncorrectableErrors": ',gpu="0",kind="ue",block="total"',
    "GPUKernelErrors": ',gpu="0",code="79"',
}
# alert -> (metric, its series, the value the summary shows, when it is evaluated)
CASES = {
    "TCPRetransmitsStandOut": ("hw_tcp_retransmits_total", counter("", 50), "50", "250s"),
    "RDMARequesterRetransmitsStandOut": (
        "hw_ib_port_transport_errors_total",
        counter(',device="mlx5_0",port="1",counter="roce_adp_retrans"', 5),
        "5",
        "250s",
    ),  # fmt: skip
    "RDMAResponderErrorsStandOut": (
        "hw_ib_port_transport_errors_total",
        counter(',device="mlx5_0",port="1",counter="out_of_sequence"', 5),
        "5",
        "250s",
    ),  # fmt: skip
    "IBLinkErrorsStandOut": (
        "hw_ib_port_errors_total",
        counter(',device="mlx5_0",port="1",counter="symbol_error"', 0.5),
        "0.5",
        "250s",
    ),
    "GPUHotterThanPeers": ("hw_gpu_temperature_celsius", gauge(',gpu="0",sensor="edge"', 60, 80), "20", "250s"),
    "GPUUncorrectableErrors": ("hw_gpu_ras_errors_total", jump(COUNTERS["GPUUncorrectableErrors"], 2), "2", "130s"),
    "GPUKernelErrors": ("hw_gpu_kernel_errors_total", jump(COUNTERS["GPUKernelErrors"], 1, appears=True), "1", "130s"),
    "CPURunQueueAbovePeers": ("hw_procs_running", gauge("", 4, 20), "16", "250s"),
    "IOStall": ("hw_io_pressure_full_pct", gauge("", 0, 50), "50", "250s"),
    "IOPressure": ("hw_io_pressure_some_pct", gauge("", 0, 100), "100", "250s"),
    "OOMKill": ("hw_oom_kills_total", jump(COUNTERS["OOMKill"], 2), "2", "130s"),
    "NodeNotScraped": ("up", gauge("", 1, 0), "0", "250s"),
}


def test_every_alert_has_a_case():
    assert set(CASES) == set(alerts.RULES)


@pytest.mark.parametrize("name", list(CASES))
def test_each_alert_is_quiet_on_alike_hosts_and_fires_for_the_faulty_one(tmp_path: Path, name: str):
    metric, series, value, at = CASES[name]
    rule = alerts.RULES[name]
    inputs = [(f"{metric}{labels}", values) for labels, values in series]
    if metric not in (
        "up",
        alerts.SCRAPED,
    ):  # every host's exporter is scraped (the increase form asks whether it was a window ago)
        inputs += [(f'{alerts.SCRAPED}{{host="{h}"}}', f"4x{STEPS - 1}") for h in HOSTS]
    if name == "GPUHotterThanPeers":  # HBM runs hotter by design: a memory sensor is not compared
        inputs.append(('hw_gpu_temperature_celsius{host="n1",gpu="0",sensor="mem"}', f"100x{STEPS - 1}"))
    summary = rule.summary.replace("{host}", "n2").replace("{value}", value)
    promtool_test(tmp_path, inputs, [
        {"eval_time": "100s", "alertname": name, "exp_alerts": []},
        {"eval_time": at, "alertname": name, "exp_alerts": [{
            "exp_labels": {"host": "n2", "check": rule.check},
            "exp_annotations": {"summary": summary, "query": alerts.query(rule)},
        }]},
    ])  # fmt: skip


def promtool_test(tmp_path: Path, inputs: list[tuple[str, str]], expected: list[dict]) -> None:
    """`promtool test rules` of the rules file on INPUTS (series, values 5 s apart): EXPECTED alerts."""
    test = {
        "rule_files": [str(RULES_FILE)],
        "evaluation_interval": "5s",
        "tests": [{
            "interval": "5s",
            "input_series": [{"series": s, "values": v} for s, v in inputs],
            "alert_rule_test": expected,
        }],
    }  # fmt: skip
    f = tmp_path / "test.yml"
    f.write_text(json.dumps(test))  # YAML is a superset of JSON
    res = run([promtool(), "test", "rules", str(f)])
    assert res.returncode == 0, res.stdout + res.stderr


# An old count, 4 since before the job, must fire nothing at any moment (each scenario is a live cause of a
# false alert): scenario -> the values of the counter (and, first, its exporter's series). Ray's target on
# each host, the only `up` with a host label, is scraped from 0 s in both.
OLD_COUNT = {
    # the exporter first scraped at 5 s: OOMKill fired live (value=4) one minute after its first scrape
    "exporter scraped after Ray": (f"_ 4x{STEPS - 2}", f"_ 4x{STEPS - 2}"),
    # one missed scrape of the counter at 60 s (its staleness marker), its exporter answering
    "a missed scrape": (f"4x11 stale 4x{STEPS - 14}", f"4x{STEPS - 1}"),
}


@pytest.mark.parametrize("scenario", list(OLD_COUNT))
@pytest.mark.parametrize("name", list(COUNTERS))
def test_an_old_count_fires_nothing(tmp_path: Path, name: str, scenario: str):
    counter, exporter = OLD_COUNT[scenario]
    inputs = [(f"{CASES[name][0]}{{host={json.dumps(h)}{COUNTERS[name]}}}", counter) for h in HOSTS]
    inputs += [(f'{alerts.SCRAPED}{{host="{h}"}}', exporter) for h in HOSTS]
    inputs += [(f'up{{host="{h}"}}', f"1x{STEPS - 1}") for h in HOSTS]
    quiet = [{"eval_time": f"{t}s", "alertname": name, "exp_alerts": []} for t in range(0, 5 * (STEPS - 1), 5)]
    promtool_test(tmp_path, inputs, quiet)


def test_the_recorded_series_are_documented():
    documented = set(re.findall(r"`(mst:[a-z_:]+)`", (REPO / "docs/metrics.md").read_text()))
    recorded = {alerts.record_name(r) for r in alerts.RULES.values() if r.form in ("stand_out", "above_peers")}
    assert documented == recorded
