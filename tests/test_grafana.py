"""utils/observe/grafana.py: the Grafana dashboards (provisioning JSON) from utils/observe/dashboards.tsv.
Every panel's query uses only the series of docs/metrics.md, parses (promtool, as a recording rule), and
returns data on the incident corpus's TSDBs (a healthy job, an RDMA incident), served by a real Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run
from test_plugins import documented_metrics

from diagnosis import jobdir, tsdb
from helpers import corpus

TOOL = str(REPO / "utils/observe/grafana.py")
# PromQL's words that are not series: aggregations, their modifiers, operators
WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def written(tmp_path: Path) -> dict[str, dict]:
    res = run([TOOL, "--out", str(tmp_path / "dash")])
    assert res.returncode == 0, res.stderr
    return {p.name: json.loads(p.read_text()) for p in sorted((tmp_path / "dash").glob("*.json"))}


def exprs(boards: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(file, panel title, expr) of every panel."""
    return [(f, p["title"], t["expr"]) for f, b in boards.items() for p in b["panels"] for t in p["targets"]]


def concrete(expr: str) -> str:
    """The expr as Grafana sends it with every host chosen and a 1-minute rate interval."""
    return expr.replace("$__rate_interval", "1m").replace("$host", ".*")


def series_names(expr: str) -> set[str]:
    """The series an expr reads: its names less label matchers, grouping labels, ranges and functions."""
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(by|without|on|ignoring)\s*\([^)]*\)", " ", concrete(expr))
    names = {m.group(1) for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", e)}
    return {n for n in names if n not in WORDS and not n.replace(".", "").isdigit()}


def test_four_dashboards_with_unique_panels_a_datasource_and_a_host_choice(tmp_path):
    boards = written(tmp_path)
    assert list(boards) == ["maxtext-gpus.json", "maxtext-hosts.json", "maxtext-job.json", "maxtext-network.json"]
    assert len({b["uid"] for b in boards.values()}) == 4
    for name, b in boards.items():
        variables = {v["name"]: v for v in b["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["host"]["includeAll"], name
        ids = [p["id"] for p in b["panels"]]
        assert len(ids) == len(set(ids)) and all(p["datasource"]["uid"] == "${datasource}" for p in b["panels"])
        cells = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in b["panels"]}
        assert len(cells) == len(ids), f"{name}: panels on top of each other"
    # a fixed data source instead of the variable
    res = run([TOOL, "--out", str(tmp_path / "fixed"), "--datasource-uid", "central"])
    assert res.returncode == 0 and "path: " + str(tmp_path / "fixed") in res.stdout, res.stdout
    b = json.loads((tmp_path / "fixed/maxtext-job.json").read_text())
    assert {p["datasource"]["uid"] for p in b["panels"]} == {"central"}
    assert "datasource" not in {v["name"] for v in b["templating"]["list"]}


def test_every_query_reads_only_documented_series_and_parses(tmp_path):
    boards = written(tmp_path)
    documented = set(documented_metrics())
    for f, title, expr in exprs(boards):
        names = series_names(expr)
        assert names and names <= documented, f"{f} {title}: {sorted(names - documented)} not in docs/metrics.md"
    # promtool parses each one as the expr of a recording rule (a broken one is named by its rule)
    rules = tmp_path / "rules.yml"
    lines = ["groups:", "  - name: dashboards", "    rules:"]
    for i, (_, _, expr) in enumerate(exprs(boards)):
        lines += [f"      - record: panel_{i}", f"        expr: {json.dumps(concrete(expr))}"]
    rules.write_text("\n".join(lines) + "\n")
    res = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and f"SUCCESS: {len(exprs(boards))} rules found" in res.stdout, res.stdout + res.stderr
    rules.write_text(rules.read_text().replace("rate(", "rate((", 1))
    res = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0, "promtool took a broken expr"


def test_every_panel_shows_data_on_the_corpus(tmp_path):
    """A healthy job and an RDMA incident of the corpus (the series of docs/metrics.md, on 4 hosts with
    GPUs and RDMA NICs): each panel's query returns series on at least one of them."""
    boards = written(tmp_path)
    empty = {(f, title): expr for f, title, expr in exprs(boards)}
    for family in ("healthy", "rdma_retransmits"):
        inc = corpus.build(family, tmp_path / family, 1)
        db = jobdir.tsdb_dir(inc.job_dir)
        start, end = jobdir.tsdb_span(db)
        with tsdb.Served(db) as s:
            for key, expr in list(empty.items()):
                if s.query_range(concrete(expr), start, end, 60):
                    del empty[key]
    assert empty == {}, f"panels without data on the corpus: {empty}"


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "give --out DIR or --list"),
        (["--out"], "--out needs a value"),
        (["--list", "--out", "x"], "give --out DIR or --list"),
        (["--where"], "unknown argument '--where'"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, says):
    res = run([TOOL, *args], cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == "" and res.stderr.startswith("grafana.py: ") and says in res.stderr
    assert len(res.stderr.splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_out_on_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("mine\n")
    res = run([TOOL, "--out", str(tmp_path / "f")])
    assert res.returncode == 2 and "is a file, not a directory" in res.stderr
    assert (tmp_path / "f").read_text() == "mine\n"
