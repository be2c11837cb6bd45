#!/usr/bin/env python3
"""Usage: bench/mcp_latency.py [--family F] [--seed N] [--runs N] [--big] [--cache DIR]

MCP round-trip latency of utils/mcp_server.py as an agent sees it: the server started over stdio by the
MCP SDK's own client, then triage and diagnose on one incident job, each called twice: cold (the tool
runs; diagnose serves the TSDB through one Prometheus) and cached (the second, identical call). Each run
starts a fresh server (an empty cache); the figures are the medians over --runs, with the server's
start (spawn and initialize) apart. Default: a small corpus job (tests/helpers/corpus.py, 12 hosts x
2 GPUs x 3 h) built in a temporary directory. --big: the 24-host job of bench/diagnose_sweep.py from its
cache (~/.cache/maxtext-slurm/diagnose-bench; build it with that bench first).
"""

import argparse
import json
import os
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "utils" / "entry.py"))["enter_venv"]()

from helpers import corpus

REPO = Path(__file__).resolve().parent.parent
META = "maxtext-slurm/cache"


def bench_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "maxtext-slurm" / "diagnose-bench"


def big_job(cache: Path, family: str, seed: int) -> tuple[Path, dict]:
    """The diagnose_sweep job of FAMILY and SEED at 24 hosts (the 5 s scrape interval preferred)."""
    found = sorted(cache.glob(f"{family}-s{seed}-24x*/incident.json"), key=lambda p: p.parent.name.endswith("-5s"))
    if not found:
        sys.exit(f"mcp_latency.py: no 24-host {family} job in {cache}: run bench/diagnose_sweep.py --runs 0 first")
    rec = json.loads(found[-1].read_text())
    return Path(rec["job_dir"]), rec


async def one_run(job: Path) -> dict:
    # the MCP SDK only when a run starts (its import is ~1 CPU-s, more than all the rest of --help)
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=[str(REPO / "utils" / "mcp_server.py"), "--workspace", str(job.parent)],
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": os.environ.get("HOME", "/")},
    )
    out: dict = {}
    t = time.monotonic()
    async with stdio_client(params) as streams, ClientSession(*streams) as s:
        await s.initialize()
        out["start"] = time.monotonic() - t
        for tool in ("triage", "diagnose"):
            for phase in ("cold", "cached"):
                t = time.monotonic()
                r = await s.call_tool(tool, {"job": job.name})
                out[f"{tool} {phase}"] = time.monotonic() - t
                if r.is_error:
                    sys.exit(f"mcp_latency.py: {tool} failed: {r.content[0].text}")
                assert r.meta[META]["cached"] is (phase == "cached"), r.meta
                out[f"{tool} result"] = r.structured_content
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="mcp_latency.py",
        usage=__doc__.splitlines()[0].removeprefix("Usage: "),
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--family", default="rdma_retransmits", choices=list(corpus.FAMILIES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3, help="fresh servers, each with a cold and a cached call (3)")
    ap.add_argument("--big", action="store_true", help="the 24-host job of bench/diagnose_sweep.py's cache")
    ap.add_argument("--cache", type=Path, default=bench_cache(), help="bench/diagnose_sweep.py's cache")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be 1 or more")
    with tempfile.TemporaryDirectory(prefix="mcp-latency-") as tmp:
        if a.big:
            job, rec = big_job(a.cache, a.family, a.seed)
            verdict, culprits, what = rec["verdict"], rec["culprits"], f"{rec['hosts']} hosts, {rec['scale']}"
        else:
            inc = corpus.build(a.family, Path(tmp) / "ws", a.seed)
            job, verdict, culprits = inc.job_dir, inc.verdict, inc.culprits
            what = f"small corpus: {len(inc.hosts)} hosts"
        print(f"job: {job} ({what})")
        import anyio

        runs = [anyio.run(one_run, job) for _ in range(a.runs)]
    d = runs[-1]["diagnose result"]
    ok = d["verdict"] == verdict and sorted(d["culprit_hosts"]) == sorted(culprits)
    print(
        f"diagnose verdict {d['verdict']} culprits {','.join(d['culprit_hosts']) or '-'}: {'right' if ok else 'WRONG'}"
    )
    for k in ("start", "triage cold", "triage cached", "diagnose cold", "diagnose cached"):
        xs = [r[k] for r in runs]
        print(
            f"{k:16s} median {statistics.median(xs) * 1000:9.1f} ms   runs: " + " ".join(f"{x * 1000:.1f}" for x in xs)
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
