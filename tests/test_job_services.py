"""utils/observe/job_services.sh stop: Prometheus is stopped between two scrapes
(utils/observe/prom_between_scrapes.py).

A scrape that Prometheus's shutdown cancels is saved as failed (`up` 0, "context canceled"), and every
series of that target ends with a staleness marker: a query at the end of the saved TSDB lacks that
node (a CI run lost a Ray metrics port this way; its answer is the slowest). Here a real Prometheus
scrapes a real HTTP endpoint that takes 0.45 s to answer, every 2 s, and is stopped three times:
each time the last saved scrape is a successful one. The window arithmetic has its own cases."""

from __future__ import annotations

import base64
import http.server
import json
import os
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

from helpers.promfixture import free_port
from observe import prom_between_scrapes as pbs


def test_a_quiet_moment_is_after_every_scrape_in_flight_and_before_the_next():
    # target a scraped at 98.9 s (0.3 s long), b at 99.7 s (0.05 s), interval 5 s, now 100 s
    targets = [
        {"lastScrape": "1970-01-01T00:01:38.900000000Z", "lastScrapeDuration": 0.3},
        {"lastScrape": "1970-01-01T00:01:39.700123456Z", "lastScrapeDuration": 0.05},
    ]
    windows = pbs.busy(targets, 5.0, 100.0, 10.0)
    assert pbs.quiet_moment(windows, 100.0, pbs.MARGIN) == 100.0  # nothing in flight now
    # at 103.8 a's next scrape (103.9, up to 1.5 x its 0.3 s, and the margins) is about to start, and b's
    # (104.7) starts before a's window ends: the quiet moment is after b's window
    windows = pbs.busy(targets, 5.0, 103.8, 10.0)
    assert pbs.quiet_moment(windows, 103.8, pbs.MARGIN) == pytest.approx(104.700123 + 1.5 * 0.05 + pbs.MARGIN)
    # at 101 nothing is in flight and a's next scrape is 2.9 s away
    assert pbs.quiet_moment(pbs.busy(targets, 5.0, 101.0, 10.0), 101.0, pbs.MARGIN) == 101.0
    assert pbs._epoch("2026-11-28T09:31:55.123456789Z") == pytest.approx(1795858315.123456)


def test_bad_input_is_one_line():
    res = run([sys.executable, str(REPO / "utils/observe/prom_between_scrapes.py"), "http://127.0.0.1:1"])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "URL INTERVAL" in res.stderr
    # Prometheus not there: no wait at all
    t0 = time.monotonic()
    res = run([sys.executable, str(REPO / "utils/observe/prom_between_scrapes.py"), "http://127.0.0.1:1", "5"])
    assert res.returncode == 0 and time.monotonic() - t0 < 3


class Slow(http.server.BaseHTTPRequestHandler):
    """A metrics endpoint: BODY after DELAY seconds."""

    body, delay = b"slow_metric 1\n", 0.45

    def do_GET(self) -> None:  # noqa: N802
        time.sleep(self.delay)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


class Fast(Slow):
    body, delay = b"# TYPE hw_load1 gauge\nhw_load1 0.5\n", 0.0


def serve(handler: type[Slow]) -> http.server.ThreadingHTTPServer:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture()
def slow_target() -> Iterator[str]:
    srv = serve(Slow)
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def scrapes(port: str) -> int:
    """How many times the Prometheus on PORT has scraped its one target (its samples of `up`)."""
    url = f"http://127.0.0.1:{port}/api/v1/query?query=count_over_time(up%5B1h%5D)"
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            res = json.load(r)["data"]["result"]
    except (OSError, ValueError, KeyError):
        return 0
    return int(float(res[0]["value"][1])) if res else 0


@pytest.mark.slow
@pytest.mark.serial  # stops at chosen phases of a 2 s scrape interval
def test_stop_leaves_the_last_scrape_of_a_slow_target_successful(tmp_path, slow_target):
    from helpers.promfixture import binary

    for i in range(3):
        job_dir = tmp_path / f"job{i}"
        job_dir.mkdir(mode=0o700)
        env = {**os.environ, "JOB_DIR": str(job_dir), "JOB_HOSTNAME": "n1", "METRICS_INTERVAL": "2",
               "PROMETHEUS_BIN": binary("prometheus") or "prometheus", "MST_PYTHON": str(VENV / "bin/python"),
               "DASHBOARD_BIND": "127.0.0.1"}  # fmt: skip
        (job_dir / "metrics" / "targets").mkdir(parents=True, mode=0o700)
        (job_dir / "metrics" / "targets" / "slow.json").write_text(
            json.dumps([{"targets": [slow_target], "labels": {"host": "n1"}}])
        )
        out = job_dir / "services.out"  # a file, not a pipe: the services it starts keep their output open
        with out.open("w") as f:
            rc = subprocess.run([str(REPO / "utils/observe/job_services.sh"), "start"], env=env, stdout=f,
                                stderr=subprocess.STDOUT, timeout=60).returncode  # fmt: skip
        try:
            assert rc == 0, out.read_text()
            stop_between_scrapes(job_dir, env, i)
        finally:  # what the test started never outlives it
            run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
        res = run([str(REPO / "utils/prometheus.sh"), "query", str(job_dir), "up"], timeout=120)
        assert res.returncode == 0, res.stderr
        ups = json.loads(res.stdout)["data"]["result"]
        assert [u["value"][1] for u in ups] == ["1"], (i, ups)


def stop_between_scrapes(job_dir: Path, env: dict[str, str], i: int) -> None:
    """job_services.sh stop once Prometheus has scraped twice (it hands file_sd targets to its scrapers
    5 s after start), I x 0.73 s later: each stop at another phase of the 2 s interval."""
    port = (job_dir / "metrics" / "run" / "prometheus.port").read_text().strip()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and scrapes(port) < 2:
        time.sleep(0.2)
    time.sleep(0.73 * i)
    res = run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
    assert res.returncode == 0, res.stderr


# --- remote write (METRICS_REMOTE_WRITE_URL) to a second, real Prometheus ----------------------------


@pytest.fixture()
def receiver(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A second Prometheus with its remote-write receiver on, behind basic auth (user mst, a bcrypt hash of
    the password, as Prometheus' web configuration takes it): (its base URL, the password)."""
    import warnings

    from helpers.promfixture import binary

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # the system's crypt(3): bcrypt ($2b$), which Prometheus' web config accepts

    password = "s3cret-" + os.urandom(6).hex()
    d = tmp_path / "central"
    d.mkdir()
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\n")
    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    (d / "web.yml").write_text(f"basic_auth_users:\n  mst: '{hashed}'\n")
    port = free_port()
    proc = subprocess.Popen(
        [binary("prometheus") or "prometheus", f"--config.file={d / 'prometheus.yml'}",
         f"--storage.tsdb.path={d / 'db'}",
         f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
         f"--web.config.file={d / 'web.yml'}"],
        stdout=subprocess.DEVNULL, stderr=(d / "log").open("w"),
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", password
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def central_series(base: str, password: str, promql: str) -> list[dict]:
    req = urllib.request.Request(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"mst:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return json.load(r)["data"]["result"]
    except (OSError, ValueError, KeyError):
        return []


def start_services(job_dir: Path, target: str, extra: dict[str, str]) -> tuple[dict[str, str], str]:
    from helpers.promfixture import binary

    job_dir.mkdir(mode=0o700)
    env = {**os.environ, "JOB_DIR": str(job_dir), "JOB_HOSTNAME": "n1", "JOB_ID": "4242", "MODEL": "tiny",
           "METRICS_INTERVAL": "1", "PROMETHEUS_BIN": binary("prometheus") or "prometheus",
           "MST_PYTHON": str(VENV / "bin/python"), "DASHBOARD_BIND": "127.0.0.1", **extra}  # fmt: skip
    (job_dir / "metrics" / "targets").mkdir(parents=True, mode=0o700)
    (job_dir / "metrics" / "targets" / "n1.json").write_text(
        json.dumps([{"targets": [target], "labels": {"host": "n1"}}])
    )
    out = job_dir / "services.out"
    with out.open("w") as f:
        rc = subprocess.run([str(REPO / "utils/observe/job_services.sh"), "start"], env=env, stdout=f,
                            stderr=subprocess.STDOUT, timeout=60).returncode  # fmt: skip
    assert rc == 0, out.read_text()
    return env, out.read_text()


@pytest.mark.slow
@pytest.mark.heavy
def test_remote_write_delivers_the_jobs_series_with_its_labels_and_only_with_the_secret(tmp_path, receiver):
    """A job's Prometheus with METRICS_REMOTE_WRITE_URL sends what it scrapes to a central Prometheus (its
    remote-write receiver, basic auth) with job_id, user and model; the password is read from a mode 600
    file by Prometheus itself (in no argv, configuration or log); with a wrong password nothing arrives."""
    import getpass

    base, password = receiver
    srv = serve(Fast)
    target = f"127.0.0.1:{srv.server_address[1]}"
    good, bad = tmp_path / "good.secret", tmp_path / "bad.secret"
    for f, text in ((good, password), (bad, "wrong")):
        f.write_text(text)
        f.chmod(0o600)
    runs = {}
    try:
        for name, secret in (("right", good), ("wrong", bad)):
            env, observe = start_services(tmp_path / name, target, {
                "METRICS_REMOTE_WRITE_URL": f"{base}/api/v1/write", "METRICS_REMOTE_WRITE_USER": "mst",
                "METRICS_REMOTE_WRITE_CREDENTIALS": str(secret)})  # fmt: skip
            runs[name] = env
            assert (f"remote_write: {base}/api/v1/write   labels: job_id=4242 user={getpass.getuser()} model=tiny   "
                    f"auth: basic, user mst, password file {secret}") in observe, observe  # fmt: skip
            if name == "right":
                got: list = []
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and not got:
                    got = central_series(base, password, 'hw_load1{job_id="4242"}')
                    time.sleep(0.5)
                assert got, (tmp_path / name / "metrics/prometheus.log").read_text()[-2000:]
                labels = got[0]["metric"]
                assert (labels["job_id"], labels["user"], labels["model"], labels["host"]) == (
                    "4242", getpass.getuser(), "tiny", "n1")  # fmt: skip
                run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
                central_count = len(central_series(base, password, "count_over_time(hw_load1[1h])"))
            else:  # refused by the receiver: what arrived is only the first job's
                log_file, deadline = tmp_path / name / "metrics/prometheus.log", time.monotonic() + 120
                # the whole phrase: "401" alone is in a timestamp (.401Z) or the receiver's port (:40109)
                while time.monotonic() < deadline and "401 Unauthorized" not in log_file.read_text():
                    time.sleep(0.5)  # the remote write starts once its WAL is replayed (~6 s)
                log = log_file.read_text()
                assert "401 Unauthorized" in log, log[-2000:]
                assert len(central_series(base, password, "count_over_time(hw_load1[1h])")) == central_count
        for name in runs:
            conf = (tmp_path / name / "metrics/prometheus.yml").read_text()
            assert password not in conf and "password_file: '" in conf
            assert password not in (tmp_path / name / "metrics/prometheus.log").read_text()
    finally:
        for env in runs.values():
            run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
        srv.shutdown()


def test_a_refused_remote_write_setting_is_one_observe_line_and_no_remote_write(tmp_path):
    """On the node a credentials file that others can read (or a URL with credentials in it) turns remote
    write off with the reason in the OBSERVE block; the job's own Prometheus runs as always."""
    loose = tmp_path / "loose.secret"
    loose.write_text("token")
    loose.chmod(0o644)
    cases = {
        "loose": (
            {
                "METRICS_REMOTE_WRITE_URL": "https://central.example/api/v1/write",
                "METRICS_REMOTE_WRITE_CREDENTIALS": str(loose),
            },
            "has mode 644: others can read",
        ),  # fmt: skip
        "userinfo": (
            {"METRICS_REMOTE_WRITE_URL": "https://me:pw@central.example/api/v1/write"},
            "must be http(s)://HOST[:PORT]/PATH",
        ),  # fmt: skip
    }
    for name, (extra, says) in cases.items():
        env, observe = start_services(tmp_path / name, "127.0.0.1:1", {**extra, "PROMETHEUS_BIN": "/nonexistent"})
        try:
            line = next(x for x in observe.splitlines() if x.startswith("remote_write:"))
            assert line.startswith("remote_write: off - ") and says in line, line
            assert "\nremote_write:" not in (tmp_path / name / "metrics/prometheus.yml").read_text()
            assert "pw@" not in observe  # the password put in the URL is not shown
        finally:
            run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)


# --- a node not scraped for a while: diagnose says so (missing data, not a healthy node) -------------


class Host(Slow):
    body, delay = b"# TYPE hw_procs_running gauge\nhw_procs_running 3\n# TYPE hw_load1 gauge\nhw_load1 0.5\n", 0.0


@pytest.mark.slow
@pytest.mark.heavy
def test_diagnose_shows_a_node_that_was_not_scraped_as_missing_data(tmp_path):
    """A job's Prometheus (job_services.sh, 1 s scrapes) scrapes n1 and n2; n2's endpoint is gone for ~10 s
    (its exporter killed), and n3 of the header never answers. diagnose names n2's gap with its times and
    n3 as missing for the whole job, in the JSON and the summary, instead of taking them for healthy hosts.
    Heavy: Prometheus must scrape every second during the test's sleeps, which at nice 19 beside the
    cluster tests it cannot be sure to do (a starved scrape loop could leave gaps on n1 as well)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    job_dir = ws / "4242-JAX-tiny"
    n1, n2 = serve(Host), serve(Host)
    port2 = n2.server_address[1]
    env, _ = start_services(job_dir, f"127.0.0.1:{n1.server_address[1]}", {})
    try:
        sd = [{"targets": [f"127.0.0.1:{port2}"], "labels": {"host": "n2"}}]
        (job_dir / "metrics/targets/n2.json").write_text(json.dumps(sd))
        time.sleep(12)
        n2.shutdown()
        n2.server_close()
        gone = time.time()
        time.sleep(10)
        n2 = http.server.ThreadingHTTPServer(("127.0.0.1", port2), Host)
        threading.Thread(target=n2.serve_forever, daemon=True).start()
        back = time.time()
        time.sleep(10)
    finally:
        run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
        n1.shutdown()
        n2.shutdown()
    log = ws / "4242-JAX-tiny.log"
    log.write_text("==================== JOB ====================\njob: 4242 4242-JAX-tiny\nnodes: 3 (n1 n2 n3)\n"
                   "=============================================\n")  # fmt: skip
    (job_dir / "log").symlink_to(log)
    res = run([str(REPO / "utils/diagnose.py"), str(job_dir), "--json"], timeout=300)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    gaps = {g["host"]: g for g in r["data_gaps"]}
    assert set(gaps) == {"n2", "n3"}, r["data_gaps"]
    assert gaps["n2"]["start"] == pytest.approx(gone, abs=3) and gaps["n2"]["end"] == pytest.approx(back, abs=3)
    assert gaps["n3"]["seconds"] >= 25  # never scraped: the whole window
    assert "no data from n2 for " in r["summary"] and "n3 for " in r["summary"], r["summary"]
    text = run([str(REPO / "utils/diagnose.py"), str(job_dir)], timeout=300).stdout
    assert "Missing data: n2 " in text and "not scraped" in text, text


# --- a job dir on NFS: the TSDB on node-local disk, copied into the job dir ------------------------------


def saved_samples(tsdb: Path) -> tuple[float, float]:
    """(samples of hw_load1, time of the last one) in a saved TSDB, read as a user would (prometheus.sh)."""
    out = run([str(REPO / "utils/prometheus.sh"), "query", str(tsdb),
               "count_over_time(hw_load1[1h]) and on() timestamp(hw_load1)"], timeout=120).stdout  # fmt: skip
    res = json.loads(out)["data"]["result"]
    count = float(res[0]["value"][1]) if res else 0.0
    last = json.loads(run([str(REPO / "utils/prometheus.sh"), "query", str(tsdb), "timestamp(hw_load1)"],
                          timeout=120).stdout)["data"]["result"]  # fmt: skip
    return count, float(last[0]["value"][1]) if last else 0.0


@pytest.mark.slow
@pytest.mark.serial  # 1 s scrapes and 5 s copies, what a SIGKILL loses measured in seconds
def test_a_tsdb_on_nfs_is_written_on_node_local_disk_and_copied_into_the_job_dir(tmp_path):
    """MST_TSDB_FSTYPE=nfs (this machine cannot serve NFS: its kernel has no nfsd, /proc/filesystems lists no
    nfs) stands for `stat -f` saying nfs. Prometheus then writes in a private directory of the node's TMPDIR,
    tsdb_mirror.py copies it into <job dir>/prometheus every METRICS_TSDB_COPY_INTERVAL s, and stop copies
    it a last time and removes it. A SIGKILL of every process keeps what the last copy held."""
    srv = serve(Host)
    node = tmp_path / "node"
    node.mkdir()
    extra = {"MST_TSDB_FSTYPE": "nfs", "METRICS_TSDB_COPY_INTERVAL": "5", "TMPDIR": str(node)}
    envs = []  # each start's environment: stopped at the end whatever happened
    try:
        # 1. stopped at the end: everything scraped is in the job dir, nothing is left on the node
        job = tmp_path / "done"
        env, observe = start_services(job, f"127.0.0.1:{srv.server_address[1]}", extra)
        envs.append(env)
        local = [x for x in observe.splitlines() if x.startswith("tsdb_local: ")]
        assert len(local) == 1 and "the job dir is on nfs, which Prometheus does not support" in local[0], observe
        store = Path(local[0].split()[1])
        assert store.parent.parent == node and stat.S_IMODE(store.parent.stat().st_mode) == 0o700
        port = (job / "metrics/run/prometheus.port").read_text().strip()
        copies = job / "metrics/tsdb-copy.log"
        deadline = time.monotonic() + 60  # 8 scrapes and 2 copies: ~12 s on a quiet machine
        while time.monotonic() < deadline and (
            scrapes(port) < 8 or not copies.exists() or len(copies.read_text().splitlines()) < 2
        ):
            time.sleep(0.2)
        assert (store / "queries.active").exists() and not (job / "prometheus/queries.active").exists()  # runs there
        assert (job / "prometheus/wal").is_dir(), "no copy after 60 s with a copy every 5 s"
        assert saved_samples(job / "prometheus")[0] > 0, "the job dir's copy holds no sample while the job runs"
        stopping = time.time()
        stop = run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
        assert "tsdb: the last copy from this node's disk is in" in stop.stdout, stop.stdout + stop.stderr
        assert not store.parent.exists(), "the node-local TSDB was left on the node"
        count, last = saved_samples(job / "prometheus")
        # scraped every 1 s from ~5 s on, until the stop (which waits for a moment between two scrapes)
        assert count >= 8 and last > stopping - 3, (count, stopping - last)
        copies = (job / "metrics/tsdb-copy.log").read_text().splitlines()
        assert len(copies) >= 3 and all(" tsdb_mirror: copied " in x for x in copies), copies

        # 2. SIGKILL of everything (what a node crash does): the job dir keeps what the last copy held
        job = tmp_path / "killed"
        env, observe = start_services(job, f"127.0.0.1:{srv.server_address[1]}", extra)
        envs.append(env)
        log = job / "metrics/tsdb-copy.log"
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 2):
            time.sleep(0.2)
        copied = time.time()  # the second copy just ended: it held everything scraped until now
        time.sleep(3)
        run_dir = job / "metrics/run"
        for f in ("supervisor", "mirror", "prometheus", "relay"):
            os.kill(int((run_dir / f"{f}.pid").read_text()), 9)
        killed = time.time()
        count, last = saved_samples(job / "prometheus")
        assert count >= 5 and copied - last < 3, (count, copied - last)  # 1 s scrapes; a loaded machine
        # what was lost: the samples after the last copy (here ~3 s of 1 s scrapes; at most the copy
        # interval plus one scrape interval), still on the node's disk, in the private directory
        assert killed - last < 5 + 1 + 3, killed - last
        print(f"SIGKILL: the job dir's last sample {killed - last:.1f} s before the kill")
        (node_local,) = [p for p in node.glob("mst.*") if (p / "tsdb").is_dir()]
        assert saved_samples(node_local / "tsdb")[1] > last

        # 3. SIGTERM to every process (scancel, the time limit; the job's cleanup may never run): the
        # copier waits for Prometheus to stop, copies a last time and removes the node's copy
        job = tmp_path / "cancelled"
        env, observe = start_services(job, f"127.0.0.1:{srv.server_address[1]}", extra)
        envs.append(env)
        store = Path(next(x for x in observe.splitlines() if x.startswith("tsdb_local: ")).split()[1])
        run_dir = job / "metrics/run"
        port = (run_dir / "prometheus.port").read_text().strip()
        deadline = time.monotonic() + 60  # the first scrape comes after ~5.5 s
        while time.monotonic() < deadline and scrapes(port) < 2:
            time.sleep(0.2)
        for f in ("supervisor", "mirror", "prometheus", "relay"):
            os.kill(int((run_dir / f"{f}.pid").read_text()), 15)
        termed = time.time()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and store.parent.exists():
            time.sleep(0.2)
        assert not store.parent.exists(), "the node-local TSDB was left on the node"
        count, last = saved_samples(job / "prometheus")
        assert count >= 2 and termed - last < 3, (count, termed - last)
    finally:
        for env in envs:
            run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
        srv.shutdown()
