"""The job monitor's notifications (utils/monitor/notify.py) through Apprise's generic JSON
webhook (json://) to a real HTTP server on 127.0.0.1: delivery, the 0600 rule on the config,
a destination that is down (retried, delivered once it is up, never raised), each key once
across a restarted monitor, and no token in any output or file."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import REPO, VENV

from helpers.promfixture import free_port
from monitor import notify

TOKEN = "s3cr3tT0kenXYZ"


class Receiver:
    """HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it; start() again on the same port."""

    def __init__(self, port: int = 0) -> None:
        self.got: list[dict] = []
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                got.append(json.loads(self.rfile.read(n) or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def conf(tmp_path: Path, port: int, mode: int = 0o600) -> Path:
    p = tmp_path / "notify.conf"
    p.write_text(f"# the test's webhook\njson://monitor:{TOKEN}@127.0.0.1:{port}/hook\n")
    p.chmod(mode)
    return p


def monitor_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV / "bin/python"), str(REPO / "utils/job_monitor.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": "/nonexistent"},
    )


def test_a_message_arrives_with_title_body_and_type(tmp_path, receiver):
    n = notify.load(conf(tmp_path, receiver.port))
    assert n.send("job 7: hang", "no step for 50 s", "failure") is True
    assert len(receiver.got) == 1
    m = receiver.got[0]
    assert (m["title"], m["message"], m["type"]) == ("job 7: hang", "no step for 50 s", "failure"), m
    assert TOKEN not in " ".join(n.destinations()) and "127.0.0.1" in n.destinations()[0]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_config_others_can_open_is_refused(tmp_path, receiver, mode):
    p = conf(tmp_path, receiver.port, mode)
    with pytest.raises(notify.NotifyConfigError) as e:
        notify.load(p)
    assert str(e.value) == f"notify config {p} is open to others (mode {mode:04o}): it holds credentials; chmod 600 {p}"
    r = monitor_cli("--check-notify", "--notify-config", str(p))
    assert r.returncode == 2 and r.stdout == "" and r.stderr.strip() == f"job_monitor.py: {e.value}", r.stderr
    assert receiver.got == []


def test_missing_empty_foreign_configs_are_refused(tmp_path):
    with pytest.raises(notify.NotifyConfigError, match="does not exist"):
        notify.load(tmp_path / "none.conf")
    empty = tmp_path / "empty.conf"
    empty.write_text("# nothing yet\nnot a url\n")
    empty.chmod(0o600)
    with pytest.raises(notify.NotifyConfigError, match="holds no destination Apprise accepts"):
        notify.load(empty)
    with pytest.raises(notify.NotifyConfigError, match="not a regular file"):
        notify.load(tmp_path)
    if os.getuid() == 0:  # CI runs as root: a file of another user
        other = conf(tmp_path, 9)
        os.chown(other, 65534, 65534)
        with pytest.raises(notify.NotifyConfigError, match="belongs to uid 65534, not to you"):
            notify.load(other)


def test_a_destination_that_is_down_is_retried_and_delivered_once(tmp_path):
    port = free_port()
    n = notify.load(conf(tmp_path, port))
    logged: list[str] = []
    box = notify.Outbox(tmp_path / "outbox.json", n, logged.append)
    box.put("7:hang:59", "job 7: hang", "no step", "failure")
    assert n.send("x", "y") is False  # nothing listens: False, no exception
    assert box.flush(now=1000.0) == 0 and box.pending() == ["7:hang:59"]
    assert logged == ["notify: delivery of '7:hang:59' failed (attempt 1), retrying in 10 s"], logged
    assert box.flush(now=1005.0) == 0 and len(logged) == 1  # not due yet
    r = Receiver(port)
    try:
        assert box.flush(now=1011.0) == 1 and box.pending() == []
        assert box.flush(now=5000.0) == 0
        box.put("7:hang:59", "job 7: hang", "no step", "failure")  # the same event again: ignored
        assert box.flush(now=6000.0) == 0
        again = notify.Outbox(tmp_path / "outbox.json", n, logged.append)  # a restarted monitor
        again.put("7:hang:59", "job 7: hang", "no step", "failure")
        assert again.flush(now=7000.0) == 0 and again.pending() == []
    finally:
        r.close()
    assert [m["title"] for m in r.got] == ["job 7: hang"]
    assert oct((tmp_path / "outbox.json").stat().st_mode & 0o777) == "0o600"
    for text in [*logged, (tmp_path / "outbox.json").read_text()]:
        assert TOKEN not in text


def test_backoff_doubles_up_to_ten_minutes(tmp_path):
    n = notify.load(conf(tmp_path, free_port()))
    logged: list[str] = []
    box = notify.Outbox(tmp_path / "outbox.json", n, logged.append)
    box.put("k", "t", "b", "info")
    t = 0.0
    for _ in range(8):
        box.flush(now=t)
        t += 10_000
    waits = [float(x.rsplit("retrying in ", 1)[1].split()[0]) for x in logged]
    assert waits == [10, 20, 40, 80, 160, 320, 600, 600], waits


def test_without_a_notifier_the_outbox_only_records(tmp_path):
    logged: list[str] = []
    box = notify.Outbox(tmp_path / "outbox.json", None, logged.append)
    box.put("k", "t", "b", "info")
    assert box.flush() == 0 and box.pending() == [] and logged == []
    assert json.loads((tmp_path / "outbox.json").read_text())[0]["key"] == "k"


def test_send_test_and_check_never_show_the_token(tmp_path, receiver):
    p = conf(tmp_path, receiver.port)
    r = monitor_cli("--check-notify", "--notify-config", str(p))
    assert r.returncode == 0 and r.stdout.startswith("json://monitor:****@127.0.0.1"), r.stdout + r.stderr
    r2 = monitor_cli("--send-test", "--notify-config", str(p))
    assert r2.returncode == 0 and r2.stdout.strip() == "delivered", r2.stdout + r2.stderr
    assert receiver.got and receiver.got[-1]["title"] == "[maxtext-slurm] test notification"
    for out in (r.stdout, r.stderr, r2.stdout, r2.stderr):
        assert TOKEN not in out
    down = conf(tmp_path, free_port())
    r3 = monitor_cli("--send-test", "--notify-config", str(down))
    assert r3.returncode == 1 and "not delivered" in r3.stdout and TOKEN not in r3.stdout + r3.stderr


def test_a_symlinked_config_is_refused_and_apprise_logs_nothing(tmp_path, caplog):
    real = conf(tmp_path, 9)
    link = tmp_path / "link.conf"
    link.symlink_to(real)
    with pytest.raises(notify.NotifyConfigError, match="cannot be opened"):
        notify.load(link)  # O_NOFOLLOW: a link another user could point elsewhere is not followed
    bad = tmp_path / "bad.conf"
    bad.write_text(f"json://u:{TOKEN}@127.0.0.1:9/x\nnotaservice://u:{TOKEN}@host/\n")
    bad.chmod(0o600)
    with caplog.at_level("DEBUG"):
        notify.load(bad).send("t", "b")
    assert TOKEN not in caplog.text and not [r for r in caplog.records if r.name.startswith("apprise")]


def test_submit_notify_refuses_an_open_config_before_submitting(tmp_path, receiver):
    """submit.sh --notify checks the config first: one line, exit 1, nothing submitted or written."""
    ws = tmp_path / "ws"
    ws.mkdir()
    p = conf(tmp_path, receiver.port, 0o644)
    r = subprocess.run(
        [str(REPO / "submit.sh"), "tiny", "--notify", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MAXTEXT_SLURM_VENV": str(VENV), "JOB_WORKSPACE": str(ws), "MST_NOTIFY_CONFIG": str(p)},
    )
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"submit.sh: --notify: notify config {p} is open to others (mode 0644): it holds credentials; "
        f"chmod 600 {p} (docs/notifications.md; or submit without --notify)"
    ], r.stderr
    assert list(ws.iterdir()) == [] and receiver.got == []
    p.chmod(0o600)
    ok = subprocess.run(
        [str(REPO / "submit.sh"), "tiny", "--notify", "--auto-recover", "2", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MAXTEXT_SLURM_VENV": str(VENV), "JOB_WORKSPACE": str(ws), "MST_NOTIFY_CONFIG": str(p)},
    )
    assert ok.returncode == 0, ok.stderr
    assert "monitor: " in ok.stdout and "--detach --auto-recover 2" in ok.stdout, ok.stdout
    assert TOKEN not in ok.stdout + ok.stderr
