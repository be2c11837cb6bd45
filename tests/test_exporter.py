"""Tests of utils/observe/metrics_exporter.py: parsing, plugin scheduling and isolation, serving.

The plugins here are small scripts written by the tests; the real plugins are exercised end to end in
test_http_end_to_end_with_the_real_plugins (on this machine: no GPU, so the GPU plugin retires itself).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from observe import metrics_exporter as mx

REPO = Path(__file__).resolve().parents[1]
UTILS = REPO / "utils"


def plugin(directory: Path, name: str, body: str) -> Path:
    path = directory / f"{name}_metrics_plugin.sh"
    path.write_text("#!/usr/bin/env bash\n" + body)
    return path


def make_poller(tmp_path: Path, timeout: float = 2.0, **cfg: object) -> mx.Poller:
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "job").mkdir(exist_ok=True)
    return mx.Poller(
        mx.Config(
            plugin_dir=str(tmp_path / "plugins"),
            state_dir=str(tmp_path / "state"),
            host="n1",
            node_rank="3",
            job_dir=str(tmp_path / "job"),
            interval=1.0,
            timeout=timeout,
            **cfg,
        )
    )


def scrape(poller: mx.Poller) -> str:
    return mx.generate_latest(mx.ExporterCollector(poller)).decode()


def series(text: str) -> dict[tuple[str, frozenset], float]:
    """Parsed with prometheus_client's own parser, an independent check that the output is valid."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def stat(text: str, name: str, plugin_name: str) -> float:
    return series(text)[(name, frozenset({("host", "n1"), ("plugin", plugin_name)}))]


# ---- the exposition parser -----------------------------------------------------------------------------


def test_parser_keeps_good_lines_and_counts_bad_ones():
    text = "\n".join(
        [
            "# HELP a_total Things\\nthat happened.",
            "# TYPE a_total counter",
            'a_total{x="1",y="q\\"uote\\\\"} 3',
            'a_total{x="2",} 4.5e3',
            "# TYPE h histogram",
            'h_bucket{le="1"} 1',
            'h_bucket{le="+Inf"} 2',
            "h_sum 3",
            "h_count 2",
            "g -Inf",
            "t 1.5 1763779480123",
            "# some comment",
            "",
            "bad{x=1} 2",  # unquoted label value
            "bad2 abc",  # not a number
            'bad3{x="1",x="2"} 1',  # repeated label
            "bad4 1 12.5",  # timestamp must be an integer
            "h_bucket 1",  # bucket without le
            "# TYPE a_total gauge",  # TYPE after its samples
            "# TYPE z nonsense",
            "9starts_with_digit 1",
            'c{__reserved="x"} 1',
            "just garbage",
        ]
    )
    parsed = mx.parse_exposition(text)
    assert parsed.rejected == 10
    assert parsed.accepted == 8
    fams = parsed.families
    assert fams["a_total"].type == "counter" and fams["a_total"].help == "Things\nthat happened."
    assert fams["a_total"].samples[0].labels == (("x", "1"), ("y", 'q"uote\\'))
    assert fams["a_total"].samples[1].value == 4500.0
    assert [s.name for s in fams["h"].samples] == ["h_bucket", "h_bucket", "h_sum", "h_count"]
    assert fams["g"].samples[0].value == float("-inf") and fams["g"].type == "untyped"
    assert fams["t"].samples[0].ts_ms == 1763779480123


def test_timestamps_keep_millisecond_precision(tmp_path):
    p = make_poller(tmp_path)
    plugin(tmp_path / "plugins", "ts", "echo 'ev 1 1763779480123'\necho 'ev 2 1763779481999'\n")
    p.poll_once()
    lines = [ln for ln in scrape(p).splitlines() if ln.startswith("ev{")]
    assert lines == ['ev{host="n1"} 1.0 1763779480123', 'ev{host="n1"} 2.0 1763779481999']


# ---- plugin isolation ---------------------------------------------------------------------------------


def test_hung_plugin_is_killed_and_does_not_hold_up_the_others(tmp_path):
    p = make_poller(tmp_path, timeout=1.0)
    d = tmp_path / "plugins"
    plugin(d, "hang", 'echo "early 1"\nsleep 60 &\necho $! > child.pid\nwait\n')
    plugin(d, "good", "echo 'good_value 42'\n")
    t0 = time.monotonic()
    p.poll_once()
    took = time.monotonic() - t0
    assert 0.9 < took < 30, took  # bounded by --timeout (1 s), not by the hung plugin (60 s)
    text = scrape(p)
    got = series(text)
    assert got[("good_value", frozenset({("host", "n1")}))] == 42
    assert ("early", frozenset({("host", "n1")})) not in got  # a killed run's output is discarded
    assert stat(text, "exporter_plugin_timeouts_total", "hang") == 1
    assert stat(text, "exporter_plugin_failures_total", "hang") == 0
    assert stat(text, "exporter_plugin_timeouts_total", "good") == 0
    child = int((tmp_path / "state/hang/child.pid").read_text())
    try:  # the whole process group was killed: the background sleep too (at most a zombie is left)
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state == "Z"
    except FileNotFoundError:
        pass


def test_plugin_whose_killed_run_lingers_is_skipped(tmp_path):
    """A run that SIGKILL cannot end at once (e.g. blocked in a hung sysfs read) must not pile up new runs.
    Such a process cannot be made on purpose here, so a live `sleep` plays the lingering run."""
    p = make_poller(tmp_path)
    plugin(tmp_path / "plugins", "stuck", "echo run >> runs.log\necho 'stuck_value 1'\n")
    p.poll_once()
    lingering = subprocess.Popen(["sleep", "30"])
    try:
        p.stats["stuck"].stuck = lingering
        p.poll_once()
        assert (tmp_path / "state/stuck/runs.log").read_text().count("run") == 1
        assert stat(scrape(p), "exporter_plugin_timeouts_total", "stuck") == 1
    finally:
        lingering.kill()
        lingering.wait()
    p.poll_once()  # it has died: the plugin runs again
    assert (tmp_path / "state/stuck/runs.log").read_text().count("run") == 2
    assert p.stats["stuck"].stuck is None


def test_crashing_plugin_is_counted_and_retried(tmp_path):
    p = make_poller(tmp_path)
    plugin(tmp_path / "plugins", "crash", "echo 'partial 1'\necho 'boom' >&2\nexit 3\n")
    p.poll_once()
    p.poll_once()
    text = scrape(p)
    assert stat(text, "exporter_plugin_failures_total", "crash") == 2
    assert stat(text, "exporter_plugin_runs_total", "crash") == 2
    assert stat(text, "exporter_plugin_last_success_timestamp_seconds", "crash") == 0
    assert series(text)[("partial", frozenset({("host", "n1")}))] == 1  # what it printed is still served


def test_garbage_lines_are_dropped_good_lines_kept(tmp_path):
    p = make_poller(tmp_path)
    d = tmp_path / "plugins"
    plugin(d, "mixed", "printf '%s\\n' 'ok_a 1' 'this is not a metric' 'ok_b{x=\"y\"} 2' 'ok_c{x=y} 3' '{}'\n")
    plugin(d, "junk", "echo 'complete nonsense'\necho '<html>'\n")
    plugin(d, "other", "echo 'other_value 7'\n")
    p.poll_once()
    text = scrape(p)
    got = series(text)
    assert got[("ok_a", frozenset({("host", "n1")}))] == 1
    assert got[("ok_b", frozenset({("host", "n1"), ("x", "y")}))] == 2
    assert got[("other_value", frozenset({("host", "n1")}))] == 7
    assert stat(text, "exporter_plugin_lines_rejected_total", "mixed") == 3
    assert stat(text, "exporter_plugin_samples", "mixed") == 2
    assert stat(text, "exporter_plugin_failures_total", "mixed") == 0
    assert stat(text, "exporter_plugin_failures_total", "junk") == 1  # nothing usable at all
    assert stat(text, "exporter_plugin_lines_rejected_total", "junk") == 2


def test_plugin_added_mid_run_appears_at_the_next_poll(tmp_path):
    p = make_poller(tmp_path)
    d = tmp_path / "plugins"
    plugin(d, "first", "echo 'first_value 1'\n")
    p.poll_once()
    assert ("late_value", frozenset({("host", "n1")})) not in series(scrape(p))
    plugin(d, "late", "echo 'late_value 2'\n")
    p.poll_once()
    assert series(scrape(p))[("late_value", frozenset({("host", "n1")}))] == 2
    (d / "late_metrics_plugin.sh").unlink()
    p.poll_once()
    text = scrape(p)
    assert ("late_value", frozenset({("host", "n1")})) not in series(text)
    assert 'plugin="late"' not in text


def test_never_again_plugin_is_not_run_again(tmp_path):
    p = make_poller(tmp_path)
    plugin(tmp_path / "plugins", "nogpu", "echo run >> runs.log\necho 'no GPU here' >&2\nexit 64\n")
    for _ in range(3):
        p.poll_once()
    assert (tmp_path / "state/nogpu/runs.log").read_text().count("run") == 1
    text = scrape(p)
    assert stat(text, "exporter_plugin_disabled", "nogpu") == 1
    assert stat(text, "exporter_plugin_runs_total", "nogpu") == 1
    assert stat(text, "exporter_plugin_failures_total", "nogpu") == 0


def test_plugins_run_concurrently(tmp_path):
    """Each plugin waits for the other to have started: run one after the other, the first would wait
    until --timeout killed it and its value would be missing (no wall-clock bound, which a loaded
    machine breaks)."""
    p = make_poller(tmp_path, timeout=20.0)
    d = tmp_path / "plugins"
    for me, other, line in (("one", "two", "slow_one 1"), ("two", "one", "slow_two 2")):
        body = f"touch '{tmp_path}/{me}'\nwhile [ ! -e '{tmp_path}/{other}' ]; do sleep 0.05; done\necho '{line}'\n"
        plugin(d, f"slow{me}", body)
    t0 = time.monotonic()
    p.poll_once()
    took = time.monotonic() - t0
    got = series(scrape(p))
    assert got[("slow_one", frozenset({("host", "n1")}))] == 1 and got[("slow_two", frozenset({("host", "n1")}))] == 2
    assert stat(scrape(p), "exporter_plugin_timeouts_total", "slowone") == 0
    cycle = got[("exporter_poll_cycle_seconds", frozenset({("host", "n1")}))]
    assert 0 < cycle <= took


# ---- contract details ---------------------------------------------------------------------------------


def test_plugin_environment_and_persistent_state_dir(tmp_path):
    p = make_poller(tmp_path, sysfs_root="/fake/sys", procfs_root="/fake/proc")
    plugin(
        tmp_path / "plugins",
        "env",
        r"""
n=0
if [[ -r count ]]; then read -r n < count; fi
n=$((n + 1)); echo "$n" > count
echo "polls_seen $n"
l="rank=\"$JOB_NODE_RANK\",job=\"$JOB_DIR\",interval=\"$METRICS_INTERVAL\",timeout=\"$METRICS_TIMEOUT\""
l+=",sys=\"$METRICS_SYSFS_ROOT\",proc=\"$METRICS_PROCFS_ROOT\",state=\"$METRICS_STATE_DIR\",cwd=\"$PWD\""
l+=",never=\"$METRICS_NEVER_AGAIN_EXIT\",lc=\"$LC_ALL\",exporter=\"$METRICS_EXPORTER_PID\""
echo "env_info{$l} 1"
echo "host_seen{seen=\"$METRICS_HOST\"} 1"
""",
    )
    p.poll_once()
    p.poll_once()
    got = series(scrape(p))
    assert got[("polls_seen", frozenset({("host", "n1")}))] == 2
    state = str(tmp_path / "state/env")
    labels = {
        "rank": "3",
        "job": str(tmp_path / "job"),
        "interval": "1",
        "timeout": "2",
        "sys": "/fake/sys",
        "proc": "/fake/proc",
        "state": state,
        "cwd": state,
        "never": "64",
        "lc": "C",
        "exporter": str(os.getpid()),
        "host": "n1",
    }
    assert got[("env_info", frozenset(labels.items()))] == 1
    assert got[("host_seen", frozenset({("host", "n1"), ("seen", "n1")}))] == 1


def test_host_label_added_only_where_missing(tmp_path):
    p = make_poller(tmp_path)
    plugin(tmp_path / "plugins", "h", 'echo \'m{a="1"} 1\'\necho \'m{host="other",a="2"} 2\'\n')
    p.poll_once()
    got = series(scrape(p))
    assert got[("m", frozenset({("host", "n1"), ("a", "1")}))] == 1
    assert got[("m", frozenset({("host", "other"), ("a", "2")}))] == 2


def test_duplicates_type_clashes_and_reserved_names_are_rejected(tmp_path):
    p = make_poller(tmp_path)
    d = tmp_path / "plugins"
    plugin(d, "a", "echo '# TYPE shared counter'\necho 'shared 1'\necho 'dup_total 1'\n")
    plugin(d, "b", "echo '# TYPE shared gauge'\necho 'shared 2'\necho 'dup_total 5'\necho 'exporter_polls_total 9'\n")
    p.poll_once()
    text = scrape(p)
    assert stat(text, "exporter_plugin_lines_rejected_total", "a") == 0
    assert stat(text, "exporter_plugin_lines_rejected_total", "b") == 3
    assert 'exporter_polls_total{host="n1"} 1.0' in text
    assert series(text)[("dup_total", frozenset({("host", "n1")}))] == 1


def test_counter_type_is_announced_once_and_untyped_samples_join_it(tmp_path):
    p = make_poller(tmp_path)
    d = tmp_path / "plugins"
    plugin(d, "a", "echo '# HELP x_total X.'\necho '# TYPE x_total counter'\necho 'x_total{n=\"a\"} 1'\n")
    plugin(d, "b", "echo 'x_total{n=\"b\"} 2'\n")
    p.poll_once()
    text = scrape(p)
    assert text.count("# TYPE x_total counter") == 1
    got = series(text)
    assert got[("x_total", frozenset({("host", "n1"), ("n", "a")}))] == 1
    assert got[("x_total", frozenset({("host", "n1"), ("n", "b")}))] == 2


def test_timestamped_samples_are_served_once_then_only_the_newest(tmp_path):
    p = make_poller(tmp_path)
    now = int(time.time() * 1000)
    plugin(tmp_path / "plugins", "ev", f"echo 'ev 1 {now - 2000}'\necho 'ev 2 {now - 1000}'\necho 'plain 5'\n")
    p.poll_once()
    first = [ln for ln in scrape(p).splitlines() if ln.startswith("ev{")]
    assert first == [f'ev{{host="n1"}} 1.0 {now - 2000}', f'ev{{host="n1"}} 2.0 {now - 1000}']
    again = [ln for ln in scrape(p).splitlines() if ln.startswith("ev{")]
    assert again == [f'ev{{host="n1"}} 2.0 {now - 1000}']  # Prometheus drops this exact duplicate
    p.poll_once()  # the plugin repeats itself: nothing new to serve
    assert [ln for ln in scrape(p).splitlines() if ln.startswith("ev{")] == again
    p.poll_once()
    p.poll_once()  # several polls between two scrapes: nothing is lost
    plugin(tmp_path / "plugins", "ev", f"echo 'ev 3 {now}'\n")
    p.poll_once()
    plugin(tmp_path / "plugins", "ev", f"echo 'ev 4 {now + 1}'\n")
    p.poll_once()
    assert [ln for ln in scrape(p).splitlines() if ln.startswith("ev{")] == [
        f'ev{{host="n1"}} 3.0 {now}',
        f'ev{{host="n1"}} 4.0 {now + 1}',
    ]


# ---- serving ------------------------------------------------------------------------------------------


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return resp.read().decode()


def test_scrape_does_not_wait_for_a_running_poll(tmp_path):
    """The plugin's poll runs until the test has scraped: a scrape that waited for the poll would never
    answer (the request's timeout fails the test), whatever the machine's load."""
    p = make_poller(tmp_path, timeout=60.0)
    gate = tmp_path / "scraped"
    plugin(
        tmp_path / "plugins",
        "slow",
        f"touch '{tmp_path}/running'\nwhile [ ! -e '{gate}' ]; do sleep 0.05; done\necho 'slow_value 1'\n",
    )
    registry = mx.CollectorRegistry(auto_describe=False)
    registry.register(mx.ExporterCollector(p))
    server = mx.bind_server("127.0.0.1", 0, registry)
    stop = threading.Event()
    threads = [
        threading.Thread(target=server.serve_forever, daemon=True),
        threading.Thread(target=p.run_forever, args=(stop,), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        deadline = time.monotonic() + 30
        while not (tmp_path / "running").exists():  # the first poll is now running
            assert time.monotonic() < deadline, "the plugin never started"
            time.sleep(0.05)
        text = get(url, timeout=20)
        gate.touch()
        assert "slow_value" not in text and 'exporter_polls_total{host="n1"} 0.0' in text
        deadline = time.monotonic() + 30
        while "slow_value" not in text and time.monotonic() < deadline:
            time.sleep(0.1)
            text = get(url)
        assert 'slow_value{host="n1"} 1.0' in text
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        p.kill_running()
        threads[1].join(5)


@pytest.mark.serial  # 0.5 s polls within 20 s, and a stop: at nice 19 (part A) the stop took over 10 s
def test_http_end_to_end_with_the_real_plugins(tmp_path):
    """The exporter as the launcher starts it, with utils/'s plugins on this machine's /proc and /sys (no GPU:
    the GPU plugin retires itself), and a TensorBoard event file that its collector serves with the event's time."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    job = tmp_path / "job"
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(job / "outputs/run1/tensorboard/run1"))
    w.add_scalar("learning/loss", 6.125, 3, walltime=1763779480.123)
    w.close()
    port_file, sd_file = tmp_path / "port", tmp_path / "sd.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(UTILS / "observe" / "metrics_exporter.py"),
            "--port",
            str(busy),
            "--interval",
            "0.5",
            "--job-dir",
            str(job),
            "--state-dir",
            str(tmp_path / "state"),
            "--host",
            "n1",
            "--node-rank",
            "0",
            "--port-file",
            str(port_file),
            "--sd-file",
            str(sd_file),
            "--log",
            str(tmp_path / "exporter.log"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("metrics_exporter: serving http://127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        assert port > busy  # moved up past the taken port
        assert port_file.read_text().strip() == str(port)
        assert f'"127.0.0.1:{port}"' in sd_file.read_text()
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 20
        text = ""
        while time.monotonic() < deadline:
            text = get(url)
            if 'plugin="gpu"' in text and "hw_procs_running" in text and "tb_learning_loss" in text:
                break
            time.sleep(0.2)
        got = series(text)
        assert got[("hw_procs_running", frozenset({("host", "n1")}))] >= 1
        if not any(Path("/sys/class/drm").glob("card*")) and not Path("/proc/driver/nvidia").exists():
            assert stat(text, "exporter_plugin_disabled", "gpu") == 1
        assert stat(text, "exporter_plugin_failures_total", "host") == 0
        assert stat(text, "exporter_plugin_lines_rejected_total", "host") == 0
        assert 'tb_learning_loss{host="n1",run="run1"} 6.125 1763779480123' in text.splitlines()
        assert 'tb_step{host="n1",run="run1"} 3.0 1763779480123' in text.splitlines()
        assert 'plugin="tb"' not in text  # read in the exporter, no plugin
        with pytest.raises(urllib.error.HTTPError):
            get(f"http://127.0.0.1:{port}/nothing")
    finally:
        proc.terminate()
        rc = proc.wait(30)  # a hang bound: it stops in well under a second when it gets the CPU
        taken.close()
    assert rc == 0
    assert not port_file.exists() and not sd_file.exists()
