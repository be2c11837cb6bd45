"""utils/mcp_server.py driven by the MCP SDK's own client over stdio (docs/mcp.md).

The server runs as a subprocess on a workspace of incident-corpus jobs (tests/helpers/corpus.py, a real
TSDB each): the tool list is exactly the read-only set without a config, gains `submit` with a 0600
config that enables it and stays read-only with a 0644 one; triage, diagnose and query_tsdb give the
tools' reports (schema, verdict and culprits of the incident); a repeated call is served from the
cache (no second run); bad arguments are error results and the server keeps serving.
"""

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from conftest import REPO
from test_json_schemas import DOCS, SCHEMAS, documented_keys

from helpers import corpus

SERVER = str(REPO / "utils" / "mcp_server.py")
READ_ONLY = {
    "list_jobs",
    "triage",
    "diagnose",
    "verify",
    "perf",
    "investigate",
    "run",
    "query_tsdb",
    "job_log_excerpt",
}
META = "maxtext-slurm/cache"


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> dict:
    assert shutil.which("prometheus") and shutil.which("promtool"), "needs prometheus and promtool"
    root = tmp_path_factory.mktemp("mcp")
    net = corpus.build("rdma_retransmits", root / "ws", 2, job_id="4242")
    hang = corpus.build("hang", root / "ws", 1, job_id="4343")
    leak = corpus.build("thread_leak", root / "ws", 4, job_id="4444")  # and its clean twin 4444 (the leak: 4445)
    return {"root": root, "ws": root / "ws", "net": net, "hang": hang, "leak": leak}


def session(ws: Path, *extra: str, env: dict | None = None, errlog=sys.stderr):
    """An async context: the server on WS, its ClientSession initialized. The MCP SDK is imported
    here, not when the file is collected (0.46 CPU-s in every pytest worker, most of them never
    running these tests)."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=[SERVER, "--workspace", str(ws), *extra],
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": os.environ.get("HOME", "/"), **(env or {})},
    )

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator["ClientSession"]:
        async with stdio_client(params, errlog) as streams, ClientSession(*streams) as s:
            await s.initialize()
            yield s

    return opened()


def tools_with(ws: Path, *extra: str, errlog=sys.stderr) -> set[str]:
    async def go() -> set[str]:
        async with session(ws, *extra, errlog=errlog) as s:
            return {t.name for t in (await s.list_tools()).tools}

    return anyio.run(go)


def test_tool_list_read_only_unless_a_private_config_enables_submit(ws):
    assert tools_with(ws["ws"], "--config", str(ws["root"] / "none.toml")) == READ_ONLY
    conf = ws["root"] / "mcp.toml"
    conf.write_text("allow_submit = true\n")
    conf.chmod(0o600)

    async def confirm() -> None:  # the write tool runs dry runs only: a real submission is refused
        async with session(ws["ws"], "--config", str(conf)) as s:
            assert {t.name for t in (await s.list_tools()).tools} == READ_ONLY | {"submit"}
            r = await s.call_tool("submit", {"model": "llama2-7b", "args": ["-N", "2"], "confirm": True})
            assert r.is_error and "dry runs only" in r.content[0].text, r
            # submit.sh's own checks answer (an unknown model: refused before it sets up the environment, so the
            # result does not depend on the state of the shared .venv); the secret argument is not echoed
            r = await s.call_tool(
                "submit", {"model": "nosuchmodel", "args": ["-N", "2", "--", "_env_HF_TOKEN=sekrit123 two"]}
            )
            assert not r.is_error, r.content
            dry = r.structured_content
            assert not dry["ok"] and dry["exit_code"] != 0 and not dry["submitted"], dry
            assert dry["command"].split()[1:3] == ["nosuchmodel", "--dry-run"], dry["command"]
            assert any("unknown model 'nosuchmodel'" in ln for ln in dry["output"]), dry["output"]
            assert "sekrit123" not in json.dumps(dry) and "two" not in dry["command"], dry
            r = await s.call_tool("submit", {"model": "$(reboot)"})
            assert r.is_error and "not a model name" in r.content[0].text, r

    anyio.run(confirm)
    conf.chmod(0o644)  # readable by others: enables nothing, and the server says why
    with (ws["root"] / "stderr").open("w+") as err:
        assert tools_with(ws["ws"], "--config", str(conf), errlog=err) == READ_ONLY
        err.seek(0)
        assert "has mode 0644" in err.read()


def schema_valid(tool: str, report: dict, job: corpus.Incident) -> None:
    """As tests/test_json_schemas.py checks the commands' --json: the schema, every key documented, the job."""
    assert report.get("schema") == SCHEMAS[tool], report.get("schema")
    assert not set(report) - documented_keys(*DOCS[tool]), sorted(set(report) - documented_keys(*DOCS[tool]))
    if tool == "verify":
        assert report["job_name"] == job.job_dir.name
        return
    assert report["job_id"] == job.job_dir.name.split("-JAX-")[0] and report["job_name"] == job.job_dir.name


def test_reports_cache_and_errors(ws):
    net, hang = ws["net"], ws["hang"]

    async def go() -> None:
        async with session(ws["ws"]) as s:
            listed = (await s.call_tool("list_jobs", {})).structured_content
            names = {j["name"]: j for j in listed["jobs"]}
            assert names[net.job_dir.name]["has_tsdb"] and names[net.job_dir.name]["id"] == "4242"

            r = await s.call_tool("triage", {"job": "4343"})
            assert not r.is_error, r.content
            tri = r.structured_content
            schema_valid("triage", tri, hang)
            assert tri["failure_class"] == "hang" or tri["status"] == "hung", (tri["status"], tri["failure_class"])
            assert json.loads(r.content[0].text) == tri
            assert r.meta[META]["cached"] is False

            t = time.monotonic()
            r = await s.call_tool("diagnose", {"job": net.job_dir.name})
            cold = time.monotonic() - t
            assert not r.is_error, r.content
            d = r.structured_content
            schema_valid("diagnose", d, net)
            assert d["verdict"] == net.verdict
            assert sorted(d["culprit_hosts"]) == sorted(net.culprits)
            runs = r.meta[META]["runs"]
            t = time.monotonic()
            again = await s.call_tool("diagnose", {"job": net.job_dir.name})
            warm = time.monotonic() - t
            assert again.structured_content == d
            assert again.meta[META] == {"cached": True, "seconds": 0.0, "runs": runs}  # not run again
            assert warm < cold / 3, (warm, cold)

            h = (await s.call_tool("diagnose", {"job": str(hang.job_dir)})).structured_content
            assert h["verdict"] == "hang", h["verdict"]
            # verify: the diagnosis' checks rerun, match per check; on a comparison, both jobs' TSDBs
            r = await s.call_tool("verify", {"job": "4343"})
            assert not r.is_error, r.content
            v = r.structured_content
            schema_valid("verify", v, hang)
            assert v["match"] is True and v["verdict"] == "hang", v
            assert {"power", "utilization"} <= {c["signal"] for c in v["checks"] if c["kind"] == "hang"}
            assert all(c["match"] for c in v["checks"]) and json.loads(r.content[0].text) == v
            r = await s.call_tool("verify", {"job": "4445", "vs": "auto"})
            assert not r.is_error and r.structured_content["match"] is True, r.content
            assert {c["job"] for c in r.structured_content["checks"]} == {ws["leak"].job_dir.name, ws["leak"].vs.name}
            leak = ws["leak"]  # vs auto: the nearest clean run of the model, as diagnose.py --vs auto
            r = await s.call_tool("diagnose", {"job": "4445", "vs": "auto"})
            assert not r.is_error, r.content
            assert r.structured_content["verdict"] == leak.verdict, r.structured_content["summary"]
            assert r.structured_content["vs"]["auto"]["picked"] == leak.vs.name
            # run: a run with no job here is the tool's one line, as an error result (tests/test_runs.py: figures)
            r = await s.call_tool("run", {"alias": "exp9"})
            assert r.is_error and "run.py: no job of run 'exp9' in " in r.content[0].text, r.content
            for tool, args in (("perf", {}), ("investigate", {"metrics": "never"})):
                r = await s.call_tool(tool, {"job": "4242", **args})
                assert not r.is_error, r.content
                schema_valid(tool, r.structured_content, net)

            q = await s.call_tool("query_tsdb", {"job": "4242", "query": "count by (host) (hw_gpu_power_watts)"})
            assert not q.is_error, q.content
            assert q.structured_content["series_total"] == len(net.hosts)
            rng = await s.call_tool(
                "query_tsdb", {"job": "4242", "query": "avg(hw_gpu_power_watts)", "mode": "range", "step": 600}
            )
            assert not rng.is_error and len(rng.structured_content["series"]) == 1, rng.content
            assert len(rng.structured_content["series"][0]["values"]) > 10

            ex = await s.call_tool("job_log_excerpt", {"job": "4343", "pattern": "JOB SUMMARY", "after": 3})
            assert not ex.is_error, ex.content
            assert "JOB SUMMARY" in ex.structured_content["lines"][-4]["text"]
            ex = (await s.call_tool("job_log_excerpt", {"job": "4343", "before": 1, "after": 1})).structured_content
            cited = tri["evidence"][0]  # no line, no pattern: the line triage cites first
            assert ex["match"]["how"] == "triage_evidence" and ex["match"]["line"] == cited["line"], ex["match"]
            assert [ln["line"] for ln in ex["lines"]] == [cited["line"] - 1, cited["line"], cited["line"] + 1]

            bad = [
                ("triage", {"job": "99999"}, "triage.py: "),
                ("diagnose", {"job": "4242", "vs": "4242"}, "itself"),
                ("query_tsdb", {"job": "4242", "query": "sum(("}, "query_tsdb: "),
                (
                    "query_tsdb",
                    {"job": "4242", "query": "up", "mode": "range", "start": 0, "end": 1e6, "step": 1},
                    "range too large",
                ),
                ("job_log_excerpt", {"job": "4242", "line": 10**9}, "outside the log"),
                ("triage", {"job": "/etc"}, ""),
                ("nope", {}, "Unknown tool"),
            ]
            for name, args, needle in bad:
                r = await s.call_tool(name, args)
                assert r.is_error, (name, args, r)
                text = r.content[0].text
                assert needle in text and "Traceback" not in text and len(text.splitlines()) == 1, text
            # still serving
            assert (await s.call_tool("list_jobs", {})).structured_content["total"] == listed["total"]

    anyio.run(go)


def test_excerpt_keeps_secret_values_redacted(ws):
    log = ws["hang"].log
    text = log.read_text()
    log.write_text(text + "x _env_HF_TOKEN=hf_abc123 hf_access_token=s3cret AWS_SECRET_ACCESS_KEY=<redacted> steps=5\n")

    async def go() -> dict:
        async with session(ws["ws"]) as s:
            r = await s.call_tool("job_log_excerpt", {"job": "4343", "pattern": "_env_HF_TOKEN", "before": 0})
            assert not r.is_error, r.content
            return r.structured_content

    try:
        got = anyio.run(go)
    finally:
        log.write_text(text)
    line = got["lines"][0]["text"]
    assert "hf_abc123" not in line and "s3cret" not in line, line
    assert "_env_HF_TOKEN=<redacted> hf_access_token=<redacted> AWS_SECRET_ACCESS_KEY=<redacted> steps=5" in line
