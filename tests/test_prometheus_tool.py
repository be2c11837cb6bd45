"""utils/prometheus.sh: list, view and query saved TSDBs, never altering them.

Fixture TSDBs are real: blocks backfilled with promtool (promfixture.write_tsdb), and a
WAL-only TSDB written by a real Prometheus that scraped itself and was then killed.
Every test points TMPDIR at its own empty dir, so "no leftover copy" means "still empty",
and finds the Prometheus processes the tool started by their --storage.tsdb.path in it.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
from conftest import REPO, run

from helpers.promfixture import LivePrometheus, binary, free_port, started_prometheus, tsdb_digest, write_tsdb
from helpers.syspath import path_without

TOOL = str(REPO / "utils" / "prometheus.sh")
T0 = 1_714_564_800  # 2024-05-01T12:00:00Z, long before "now": old data, like a finished job
STEP = 60
POINTS = 6 * 60  # 6 hours of 1-minute samples: 3 x 2h blocks + a partial one
LAST = T0 + (POINTS - 1) * STEP
NO_PROXY = {"http": "", "https": ""}

pytestmark = pytest.mark.skipif(
    not (binary("prometheus") and binary("promtool")),
    reason="needs prometheus and promtool (apt-get install prometheus)",
)


def series(offset: int = 0) -> list:
    return [
        ("ray_node_cpu_utilization", {"instance": "n1"}, [(T0 + offset + k * STEP, k % 100) for k in range(POINTS)]),
        ("ray_node_cpu_utilization", {"instance": "n2"}, [(T0 + offset + k * STEP, 50.5) for k in range(POINTS)]),
        ("train_steps_total", {"job": "7"}, [(T0 + offset + k * STEP, 10 * k) for k in range(POINTS)]),
    ]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A finished job's dir: <ws>/101-JAX-llama2-7b-base/prometheus with 2h blocks (read-only to tests)."""
    job = tmp_path_factory.mktemp("saved") / "101-JAX-llama2-7b-base"
    write_tsdb(job / "prometheus", series(), block_hours=2)
    (job / "artifact").mkdir()
    return job


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, LivePrometheus]]:
    """Two real Prometheus servers scraping themselves, started together so that their first
    scrapes (~6 s after start) are waited for once: "killed" (SIGKILLed by the killed fixture) and
    "live" (read while it runs by test_query_live_tsdb, which stops it)."""
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(started_prometheus(tmp_path_factory.mktemp(name) / "prometheus", stop=stop))
            for name, stop in (("killed", signal.SIGKILL), ("live", signal.SIGTERM))
        }


@pytest.fixture(scope="module")
def killed(servers) -> tuple[Path, int]:
    """A WAL-only TSDB from a real Prometheus scraping itself, then SIGKILLed; (tsdb, scrapes seen)."""
    prom = servers["killed"]
    prom.wait_for(2)
    scrapes = prom.scrapes()
    prom.proc.kill()
    prom.proc.wait(timeout=30)
    return prom.tsdb, scrapes


@pytest.fixture()
def tmpdir_env(tmp_path) -> Iterator[dict[str, str]]:
    """Env with TMPDIR = an empty dir; afterwards it must be empty and no Prometheus may use it."""
    tmp = tmp_path / "tooltmp"
    tmp.mkdir()
    yield {"TMPDIR": str(tmp)}
    assert not tool_prometheus_pids(tmp), "a Prometheus started by the tool is still running"
    assert list(tmp.iterdir()) == [], "the tool left its temporary copy behind"


def tool_prometheus_pids(tmp: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if f"--storage.tsdb.path={tmp}" in cmdline:
                pids.append(int(proc.name))
    return pids


def tool(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return run([TOOL, *map(str, args)], env=env, timeout=timeout)


def query_ok(*args: str, env: dict[str, str]) -> dict:
    res = tool("query", *args, env=env)
    assert res.returncode == 0, res.stderr
    body = json.loads(res.stdout)
    assert body["status"] == "success"
    return body["data"]


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode != 0
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("prometheus.sh: "), res.stderr
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in lines[0], res.stderr


# --- help and usage ---------------------------------------------------------------


def test_help():
    res = tool("--help")
    assert res.returncode == 0 and "Usage" in res.stdout
    for cmd in ("list", "view", "query"):
        assert f"utils/prometheus.sh {cmd} " in res.stdout
        sub = tool(cmd, "--help")
        assert sub.returncode == 0, sub.stderr
        assert sub.stdout.startswith(f"utils/prometheus.sh {cmd} "), sub.stdout
        assert all(f"utils/prometheus.sh {other} " not in sub.stdout for other in {"list", "view", "query"} - {cmd})
    assert "--bind 0.0.0.0" in tool("view", "--help").stdout
    assert "RFC3339" in tool("query", "--help").stdout


def test_no_command_prints_usage():
    res = tool()
    assert res.returncode != 0 and "Usage" in res.stderr


def test_unknown_command():
    assert_one_line_error(tool("show"), "unknown command 'show'", "list, view or query")


# --- list -----------------------------------------------------------------------------


def test_list(tmp_path, saved, killed):
    ws = tmp_path / "ws"
    shutil.copytree(saved, ws / saved.name)
    write_tsdb(ws / "102-JAX-qwen3-8b" / "prometheus", series(offset=86400))  # a day later
    unfinished = ws / "102-JAX-qwen3-8b" / "prometheus" / "01HWJ4YQ3M0000000000000000.tmp-for-creation"
    unfinished.mkdir()  # a compaction in progress: not a block yet, ignored
    (unfinished / "meta.json").write_text('{"minTime": 1000, "maxTime": 2000}')
    shutil.copytree(killed[0], ws / "103-JAX-tiny-killed" / "prometheus")  # WAL only, written just now
    (ws / "104-JAX-tiny" / "artifact").mkdir(parents=True)  # no metrics (RAY=0)
    (ws / "105-JAX-tiny" / "prometheus").mkdir(parents=True)  # Prometheus never wrote anything
    before = tsdb_digest(ws)

    res = tool("list", ws)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["JOB", "SIZE", "FIRST", "(UTC)", "LAST", "(UTC)", "WAL", "LAST", "WRITE", "(UTC)"]
    jobs = [line.split()[0] for line in lines[1:]]
    with_data = ["103-JAX-tiny-killed", "102-JAX-qwen3-8b", "101-JAX-llama2-7b-base"]  # newest first
    assert [j for j in jobs if j in with_data] == with_data
    assert set(jobs) == {"103-JAX-tiny-killed", "102-JAX-qwen3-8b", "101-JAX-llama2-7b-base", "105-JAX-tiny"}
    row = dict(zip(jobs, lines[1:], strict=True))
    assert "2024-05-01 12:00:00  2024-05-01 17:59:00  -" in row["101-JAX-llama2-7b-base"]
    assert "2024-05-02 12:00:00  2024-05-02 17:59:00  -" in row["102-JAX-qwen3-8b"]
    killed_cols = row["103-JAX-tiny-killed"].split()
    assert killed_cols[2:4] == ["-", "-"]  # no blocks yet
    wal_write = datetime.strptime(" ".join(killed_cols[4:6]), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    assert abs(wal_write.timestamp() - time.time()) < 600
    size = row["101-JAX-llama2-7b-base"].split()[1]
    assert re.fullmatch(r"[0-9.]+[KMG]", size), size
    assert tsdb_digest(ws) == before

    # default workspace: $JOB_WORKSPACE
    assert tool("list", env={"JOB_WORKSPACE": str(ws)}).stdout == res.stdout


def test_list_bad_workspace(tmp_path):
    assert_one_line_error(tool("list", tmp_path / "nope"), str(tmp_path / "nope"), "JOB_WORKSPACE")


# --- query ----------------------------------------------------------------------------


def test_query_defaults_to_end_of_data(saved, tmpdir_env):
    before = tsdb_digest(saved)
    start = time.monotonic()
    data = query_ok(saved, "ray_node_cpu_utilization", env=tmpdir_env)
    print(f"query latency (command to result): {time.monotonic() - start:.2f}s")
    assert data["resultType"] == "vector"
    got = {r["metric"]["instance"]: r["value"] for r in data["result"]}
    assert got == {"n1": [LAST, str((POINTS - 1) % 100)], "n2": [LAST, "50.5"]}
    assert tsdb_digest(saved) == before


def test_a_second_backfill_of_the_same_series_copies_the_cached_blocks(tmp_path, monkeypatch, tmpdir_env):
    """write_tsdb keeps promtool's blocks under the hash of the series' text (tests/helpers/cache.py): the
    same series again is the same blocks without promtool (its binary gone), and Prometheus reads them;
    other series are a new entry; one unused for a week goes; MST_TEST_CACHE=off runs promtool each time."""
    monkeypatch.setenv("MST_TEST_CACHE", str(tmp_path / "cache"))
    first = write_tsdb(tmp_path / "a" / "prometheus", series(), block_hours=2)
    entries = list((tmp_path / "cache" / "tsdb-blocks").iterdir())
    assert len(entries) == 1 and sorted(p.name for p in entries[0].iterdir()) == sorted(p.name for p in first.iterdir())
    hidden = tmp_path / "bin"
    hidden.mkdir()
    (hidden / "promtool").symlink_to(binary("promtool"))
    monkeypatch.setenv("PROMTOOL_BIN", str(hidden / "promtool"))  # the same promtool, then gone
    write_tsdb(tmp_path / "b" / "prometheus", series(), block_hours=2)  # its --version is asked first
    (hidden / "promtool").unlink()
    with pytest.raises(FileNotFoundError):
        write_tsdb(tmp_path / "c" / "prometheus", series(offset=60), block_hours=2)  # a miss needs promtool
    assert list((tmp_path / "cache" / "tsdb-blocks").iterdir()) == entries  # and leaves nothing half-made
    second = write_tsdb(tmp_path / "d" / "prometheus", series(), block_hours=2)  # a hit does not
    content = lambda d: {k: v[:2] for k, v in tsdb_digest(d).items()}  # noqa: E731 (mtimes differ)
    assert content(second) == content(first)
    data = query_ok(str(tmp_path / "d"), "train_steps_total", env=tmpdir_env)
    assert [r["value"] for r in data["result"]] == [[LAST, str(10 * (POINTS - 1))]]
    # an entry no backfill used for a week goes at the next miss; one in use stays
    old = tmp_path / "cache" / "tsdb-blocks" / "0ld"
    old.mkdir()
    os.utime(old, (time.time() - 8 * 86400,) * 2)
    os.utime(entries[0], (time.time() - 8 * 86400,) * 2)
    write_tsdb(tmp_path / "f" / "prometheus", series(), block_hours=2)  # a hit: entries[0] in use again
    monkeypatch.delenv("PROMTOOL_BIN")
    write_tsdb(tmp_path / "g" / "prometheus", series(offset=120), block_hours=2)  # a miss
    assert not old.exists() and entries[0].is_dir()
    monkeypatch.setenv("PROMTOOL_BIN", str(hidden / "promtool"))
    monkeypatch.setenv("MST_TEST_CACHE", "off")
    with pytest.raises(FileNotFoundError):
        write_tsdb(tmp_path / "e" / "prometheus", series(), block_hours=2)


def test_a_backfill_with_the_same_inputs_needs_no_series(tmp_path, monkeypatch):
    """write_tsdb(inputs=...) (the incident corpus: its code and arguments): the same inputs again
    give the same blocks without reading the series at all; other inputs are no hit; a link whose
    entry was pruned is no hit either: the blocks are made and linked again."""
    monkeypatch.setenv("MST_TEST_CACHE", str(tmp_path / "cache"))

    def untouched():
        raise AssertionError("the series were read on a hit")
        yield  # a generator

    content = lambda d: {k: v[:2] for k, v in tsdb_digest(d).items()}  # noqa: E731 (mtimes differ)
    first = write_tsdb(tmp_path / "a" / "prometheus", series(), block_hours=2, inputs="corpus x seed 1")
    second = write_tsdb(tmp_path / "b" / "prometheus", untouched(), block_hours=2, inputs="corpus x seed 1")
    assert content(second) == content(first) and content(first)
    with pytest.raises(AssertionError, match="were read"):
        write_tsdb(tmp_path / "c" / "prometheus", untouched(), block_hours=2, inputs="corpus x seed 2")
    root = tmp_path / "cache" / "tsdb-blocks"
    (link,) = root.glob("in-*")
    shutil.rmtree(link.resolve())  # pruned
    third = write_tsdb(tmp_path / "d" / "prometheus", series(), block_hours=2, inputs="corpus x seed 1")
    chunks = lambda d: sorted(v for k, v in content(d).items() if "/chunks/" in k)  # noqa: E731 (new block ids)
    assert chunks(third) == chunks(first) and link.resolve().is_dir()  # made again, linked again


def test_query_time_formats_and_tsdb_dir(saved, tmpdir_env):
    at = T0 + 90 * STEP  # 2024-05-01T13:30:00Z
    unix = query_ok(saved, "train_steps_total", "--time", str(at), env=tmpdir_env)
    rfc = query_ok(saved / "prometheus", "train_steps_total", "--time", "2024-05-01T13:30:00Z", env=tmpdir_env)
    assert unix == rfc
    assert unix["result"][0]["value"] == [at, "900"]


def test_query_range(saved, tmpdir_env):
    data = query_ok(
        saved, "rate(train_steps_total[5m])", "--range", "2024-05-01T14:00:00Z", str(T0 + 3 * 3600), "5m",
        env=tmpdir_env,
    )  # fmt: skip
    assert data["resultType"] == "matrix"
    values = data["result"][0]["values"]
    assert [v[0] for v in values] == list(range(T0 + 2 * 3600, T0 + 3 * 3600 + 1, 300))
    assert {round(float(v[1]), 6) for v in values} == {round(10 / 60, 6)}


def test_query_copy_across_filesystems(saved):
    """TMPDIR on another filesystem (tmpfs): hard links fail, blocks are copied instead."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == saved.stat().st_dev:
        pytest.skip("no /dev/shm on a filesystem of its own")
    tmp = Path(tempfile.mkdtemp(prefix="test-prometheus-tool.", dir=shm))
    try:
        before = tsdb_digest(saved)
        data = query_ok(saved, "sum(ray_node_cpu_utilization)", env={"TMPDIR": str(tmp)})
        assert data["result"][0]["value"] == [LAST, str((POINTS - 1) % 100 + 50.5)]
        assert list(tmp.iterdir()) == []
        assert tsdb_digest(saved) == before
    finally:
        shutil.rmtree(tmp)


def test_bad_promql(saved, tmpdir_env):
    before = tsdb_digest(saved)
    res = tool("query", saved, "sum(rate(train_steps_total[5m]) by", env=tmpdir_env)
    assert res.returncode == 1
    assert_one_line_error(res, "query failed", "bad_data", "parse error")
    assert tsdb_digest(saved) == before


def test_query_killed_job_wal_only(killed, tmpdir_env):
    """The realistic case: a job killed before its first block was cut leaves wal/ only."""
    tsdb, scrapes = killed
    assert (tsdb / "wal").is_dir()
    assert not any((d / "meta.json").exists() for d in tsdb.iterdir())
    before = tsdb_digest(tsdb)
    data = query_ok(tsdb, "count_over_time(up[1h])", env=tmpdir_env)
    assert int(data["result"][0]["value"][1]) >= scrapes
    data = query_ok(tsdb, "prometheus_build_info", env=tmpdir_env)
    assert data["result"], "the scraped samples are not in the copy"
    assert tsdb_digest(tsdb) == before


def test_prometheus_alters_a_tsdb_it_opens(tmp_path, saved, killed):
    """Why the tool copies: Prometheus writes into the TSDB dir it opens, even with nothing to scrape."""
    config = tmp_path / "prometheus.yml"
    config.write_text("scrape_configs: []\n")
    for src in (saved / "prometheus", killed[0]):
        tsdb = tmp_path / src.parent.name
        shutil.copytree(src, tsdb)
        before = tsdb_digest(tsdb)
        port = free_port()
        cmd = [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tsdb}"]
        proc = subprocess.Popen(
            [*cmd, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/-/ready", proxies=NO_PROXY, timeout=5).ok:
                        break
                except requests.ConnectionError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        after = tsdb_digest(tsdb)
        assert any(name.startswith("wal/0") for name in set(after) - set(before)), "expected a new WAL segment"


def test_query_live_tsdb(servers, tmpdir_env):
    """A job still running: the tool reads a copy and does not disturb the live Prometheus."""
    live = servers["live"]
    tsdb = live.tsdb
    live.wait_for(2)
    seen = live.scrapes()
    data = query_ok(tsdb, "count_over_time(up[1h])", env=tmpdir_env)
    assert int(data["result"][0]["value"][1]) >= seen - 1  # the copy may be a scrape behind
    names = {p.name for p in tsdb.iterdir()}
    assert names <= {"wal", "chunks_head", "queries.active", "lock"}, names
    deadline = time.monotonic() + 20
    while live.scrapes() <= seen + 1:  # still scraping and writing after the copy
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert live.proc.poll() is None
    live.proc.terminate()
    assert live.proc.wait(timeout=30) == 0


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["{missing}", "up"], ["does not exist", "job dir"]),
        (["{file}", "up"], ["is not a directory", "job dir"]),
        (["{random}", "up"], ["neither a job dir nor a TSDB", "meta.json"]),
        (["{empty_job}", "up"], ["no saved metrics yet"]),
        (["{saved}", "up", "--time", "yesterday"], ["bad --time 'yesterday'", "RFC3339"]),
        (["{saved}", "up", "--time", "2024-02-30T00:00:00Z"], ["bad --time", "RFC3339"]),
        (["{saved}", "up", "--range", "1714564800", "1714568400", "often"], ["bad STEP 'often'"]),
        (["{saved}", "up", "--range", "1714564800"], ["--range needs START END STEP"]),
        (["{saved}", "up", "--time", "1", "--range", "1", "2", "3"], ["either --time or --range"]),
        (["{saved}", "up", "--frobnicate"], ["unknown option --frobnicate"]),
        (["{saved}"], ["needs JOB_DIR_OR_TSDB and one 'PROMQL'"]),
    ],
)
def test_query_bad_input(tmp_path, saved, tmpdir_env, args, needles):
    (tmp_path / "file").write_text("not a tsdb\n")
    (tmp_path / "random" / "sub").mkdir(parents=True)
    (tmp_path / "empty_job" / "prometheus").mkdir(parents=True)
    paths = {
        "missing": tmp_path / "missing",
        "file": tmp_path / "file",
        "random": tmp_path / "random",
        "empty_job": tmp_path / "empty_job",
        "saved": saved,
    }
    before = tsdb_digest(tmp_path)
    res = tool("query", *(a.format(**paths) for a in args), env=tmpdir_env)
    assert_one_line_error(res, *needles)
    assert tsdb_digest(tmp_path) == before


def test_prometheus_missing(saved, tmp_path, tmpdir_env):
    res = tool("query", saved, "up", env={**tmpdir_env, "PROMETHEUS_BIN": str(tmp_path / "nope")})
    assert_one_line_error(res, "PROMETHEUS_BIN=", "not an executable")
    # nothing on PATH either: a PATH with every tool the script needs, but no prometheus
    res = tool("query", saved, "up", env={**tmpdir_env, "PATH": path_without(tmp_path / "bin", "prometheus")})
    assert_one_line_error(res, "prometheus not found", "apt-get install prometheus", "PROMETHEUS_BIN")


# --- view -----------------------------------------------------------------------------


class View:
    """utils/prometheus.sh view in the background; reads its banner up to the Ctrl-C line."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [TOOL, "view", *map(str, args)],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # as from a terminal: a suite started in the background (`tests/run.sh &`) ignores SIGINT,
            # and bash cannot trap a signal that was ignored when it started
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: list[str] = []
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C"):
                break
        assert self.lines and self.lines[-1].startswith("Ctrl-C"), self.lines + [self.proc.stderr.read()]
        self.banner = "\n".join(self.lines)
        self.url = re.search(r"^Open: +(\S+)", self.banner, re.M).group(1)
        self.port = int(re.search(r"://[^/]+:(\d+)", self.url).group(1))
        self.api = f"http://127.0.0.1:{self.port}"

    def stop(self) -> int:
        """Ctrl-C; returns the exit status (the test fails, after a SIGTERM, if it does not stop)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            raise


def test_view(saved, tmpdir_env):
    before = tsdb_digest(saved)
    block_file = next((saved / "prometheus").glob("*/index"))
    view = View(saved, env=tmpdir_env)
    pids = tool_prometheus_pids(Path(tmpdir_env["TMPDIR"]))
    try:
        assert len(pids) == 1
        assert block_file.stat().st_nlink == 2  # same filesystem: blocks are hard-linked, not copied
        assert view.url.startswith(f"http://127.0.0.1:{view.port}/")
        assert "Data:    2024-05-01 12:00:00 .. 2024-05-01 17:59:00 UTC (5h59m)" in view.banner
        assert "g0.range_input=359m" in view.url and "g0.end_input=2024-05-01%2017%3A59" in view.url
        assert re.search(rf"^Tunnel: +ssh -N -L {view.port}:127.0.0.1:{view.port} \S+", view.banner, re.M)
        page = requests.get(view.url, proxies=NO_PROXY, timeout=10)
        assert page.status_code == 200
        body = requests.get(
            f"{view.api}/api/v1/query",
            params={"query": "train_steps_total", "time": LAST},
            proxies=NO_PROXY,
            timeout=10,
        ).json()
        assert body["data"]["result"][0]["value"] == [LAST, str(10 * (POINTS - 1))]
    finally:
        rc = view.stop()
    assert rc == 0, view.proc.stderr.read()
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
    assert block_file.stat().st_nlink == 1
    assert tsdb_digest(saved) == before


def test_view_port_taken_explicit(saved, tmpdir_env):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        res = tool("view", saved, "--port", port, env=tmpdir_env)
    assert_one_line_error(res, f"port {port} is in use", "--port")


def test_view_default_port_moves_up_and_bind_all(saved, tmpdir_env):
    sock = socket.socket()
    # SO_REUSEADDR: an earlier test's connections to 9190 may linger in TIME_WAIT; without it the
    # bind fails although nobody listens, and the tool rightly takes 9190
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", 9190))
        sock.listen()
    except OSError:
        pass  # someone else listens on 9190: taken all the same
    try:
        view = View(saved, "--bind", "0.0.0.0", env=tmpdir_env)
        try:
            assert view.port > 9190
            assert "Warning: listening on all interfaces" in view.banner
            assert "Tunnel:" not in view.banner
            assert requests.get(f"{view.api}/-/ready", proxies=NO_PROXY, timeout=10).status_code == 200
        finally:
            assert view.stop() == 0
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--port", "http"], ["bad --port 'http'"]),
        (["--port", "70000"], ["bad --port '70000'"]),
        (["--bind", "localhost;rm"], ["bad --bind"]),
        (["--port"], ["--port needs a value"]),
    ],
)
def test_view_bad_input(saved, tmpdir_env, args, needles):
    assert_one_line_error(tool("view", saved, *args, env=tmpdir_env), *needles)


def test_view_not_a_tsdb(tmp_path, tmpdir_env):
    (tmp_path / "job" / "log").mkdir(parents=True)
    assert_one_line_error(tool("view", tmp_path / "job", env=tmpdir_env), "neither a job dir nor a TSDB")
    assert_one_line_error(tool("view", env=tmpdir_env), "view needs JOB_DIR_OR_TSDB")
