"""Every tool's JSON names its schema, and every top-level key it prints is in its doc's table.

Each tool (triage, diagnose, verify, perf, sweep, investigate) runs as a user runs it on one job of the
incident corpus (a RAY=1 job with a log, a TSDB and a recorded submit command); its JSON must carry
"schema": "<tool>/<version>" (SCHEMAS), and each top-level key must be a first-column name of the table in the doc's
JSON section (docs/<tool>.md). A key added to a report without its row fails here.
"""

import json
import re
from pathlib import Path

import pytest
from conftest import REPO

from helpers import corpus, inproc

# tool -> (its doc, the heading of the section whose table lists the report's top-level keys)
DOCS = {
    "triage": ("docs/triage.md", "## JSON report"),
    "diagnose": ("docs/diagnose.md", "## JSON report"),
    "verify": ("docs/diagnose.md", "## Verify"),
    "perf": ("docs/perf.md", "## JSON report"),
    "sweep": ("docs/sweep.md", "## The record"),
    "investigate": ("docs/investigate.md", "## JSON report"),
}

# tool -> the schema its JSON names (the number changes when a field changes meaning)
SCHEMAS = {tool: f"{tool}/1" for tool in DOCS} | {"diagnose": "diagnose/2"}


def documented_keys(doc: str, heading: str) -> set[str]:
    """The `names` in the first column of the tables in DOC's section HEADING."""
    text = (REPO / doc).read_text()
    assert heading in text, f"{doc} has no section '{heading}'"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            keys |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return keys


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    job = corpus.build("rdma_retransmits", ws, 2, job_id="4242").job_dir
    (job / "artifact" / ".submit").mkdir(parents=True)
    model = job.name.split("-JAX-")[1]
    (job / "artifact" / ".submit" / "command.txt").write_text(f"submit.sh {model} -N 2 -- steps=80\n")
    return job


def report(tool: str, job: Path) -> dict:
    args = {
        "triage": [job, "--json", "--no-scheduler"],
        "diagnose": [job, "--json", "--plot", job.parent / "plots"],  # --plot: its `plots` key too
        "verify": [job, "--json"],
        "perf": [job, "--json"],
        "sweep": ["regress", job.name.split("-JAX-")[1], "--baseline", job, "--dry-run", "--json"],
        "investigate": [job, "--json", "--no-scheduler"],
    }[tool]
    res = inproc.tool(tool, *args, env={"JOB_WORKSPACE": str(job.parent)})  # helpers/inproc.py
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("tool", DOCS)
def test_schema_and_every_key_documented(tool, job):
    r = report(tool, job)
    assert r.get("schema") == SCHEMAS[tool], r.get("schema")
    known = documented_keys(*DOCS[tool])
    assert not set(r) - known, f"{DOCS[tool][0]} does not document {sorted(set(r) - known)}"
    if tool in ("triage", "diagnose", "perf", "investigate"):  # one name for the job in every report
        assert r["job_id"] == "4242" and r["job_name"] == job.name, (r["job_id"], r["job_name"])
    if tool == "investigate":  # the reports it carries are the tools' own, schema and all
        assert {k: v["schema"] for k, v in r["reports"].items() if v} == {
            "triage": "triage/1",
            "diagnose": SCHEMAS["diagnose"],
            "perf": "perf/1",
        }
