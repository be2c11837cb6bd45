#!/usr/bin/env python3
"""Per-node metrics exporter: runs every *_metrics_plugin.sh, reads TensorBoard scalars, serves both.

Usage: metrics_exporter.py [--port 9400] [--bind 127.0.0.1] [--interval 5] [--timeout 3]
                           [--plugin-dir DIR] [--state-dir DIR] [--host NAME] [--node-rank N]
                           [--job-dir DIR] [--tensorboard auto|on|off] [--port-file FILE] [--sd-file FILE]
                           [--log FILE] [--restarts N] [--once]

A background thread polls every --interval seconds: it lists the *_metrics_plugin.sh files in --plugin-dir
(so a plugin dropped in mid-job is picked up at the next poll), starts them all at once (`bash FILE`, each
in its own process group, the whole group killed after --timeout), checks their Prometheus text output line
by line and publishes the merged result. In the same thread, on node rank 0 (--tensorboard auto), it reads
what was appended to the job's TensorBoard event files since the last poll (tb_* series).
GET /metrics serves the last completed poll; a scrape never waits for a plugin. If --port is taken
the next free port is used; the real one is printed on stdout
("metrics_exporter: serving http://ADDR:PORT/metrics") and written to --port-file / --sd-file.
--restarts N: how many exporters of this node ran before this one (its supervisor, _train_with_ray.sh,
restarts it when it exits), served as exporter_restarts_total.
--once runs one poll, prints the exposition and exits. The plugin contract is docs/plugins.md; every
series is listed in docs/metrics.md.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import runpy
import selectors
import shutil
import signal
import socket
import socketserver
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "entry.py"))["enter_venv"]()

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

try:
    from observe.exposition import Family, HeldSamples, Labels, Parsed, Sample, parse_exposition, to_metric
    from observe.tb_collector import TensorBoardCollector
except ImportError:  # run as a script by a python without the project's import roots (a container's)
    from exposition import Family, HeldSamples, Labels, Parsed, Sample, parse_exposition, to_metric  # type: ignore[no-redef]
    from tb_collector import TensorBoardCollector  # type: ignore[no-redef]

PLUGIN_SUFFIX = "_metrics_plugin.sh"
RESERVED_PREFIXES = ("exporter_", "tb_")  # the exporter's own series and its TensorBoard collector's
NEVER_AGAIN_EXIT = 64  # a plugin exiting with this code is not run again by this exporter
MAX_OUTPUT_BYTES = 16 << 20  # a plugin printing more than this is killed and counted as a failure
STDERR_TAIL_BYTES = 2048
log = logging.getLogger("metrics_exporter")

# --------------------------------------------------------------------------------------------------
# Running plugins
# --------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    rc: int | None = None  # None: timed out (killed)
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0
    stuck: subprocess.Popen | None = None  # killed but not reaped (e.g. blocked in a kernel read)


@dataclass
class _Running:
    name: str
    proc: subprocess.Popen
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    open_streams: int = 2
    done_at: float | None = None
    too_big: bool = False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_plugins(
    cmds: dict[str, list[str]],
    envs: dict[str, dict[str, str]],
    cwds: dict[str, str],
    timeout: float,
    started: list[subprocess.Popen] | None = None,
) -> dict[str, RunResult]:
    """Start every command at once (own session each), collect stdout/stderr, kill what outlives `timeout`.

    `started`, if given, is cleared and then holds the processes of this call while it runs.
    """
    started = [] if started is None else started
    started.clear()
    t0 = time.monotonic()
    deadline = t0 + timeout
    sel = selectors.DefaultSelector()
    runs: list[_Running] = []
    results: dict[str, RunResult] = {}
    for name, cmd in cmds.items():
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=envs[name],
                cwd=cwds[name],
                start_new_session=True,
            )
        except OSError as exc:
            results[name] = RunResult(rc=127, stderr=str(exc).encode())
            continue
        started.append(proc)
        run = _Running(name, proc)
        runs.append(run)
        sel.register(proc.stdout, selectors.EVENT_READ, (run, run.out))
        sel.register(proc.stderr, selectors.EVENT_READ, (run, run.err))
    while sel.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        for key, _ in sel.select(remaining):
            run, buf = key.data
            chunk = os.read(key.fd, 65536)
            if chunk:
                buf += chunk
                if buf is run.err and len(buf) > STDERR_TAIL_BYTES:
                    del buf[:-STDERR_TAIL_BYTES]
                if len(run.out) > MAX_OUTPUT_BYTES:
                    run.too_big = True
                    _kill_group(run.proc)
                continue
            sel.unregister(key.fileobj)
            key.fileobj.close()
            run.open_streams -= 1
            if run.open_streams == 0:
                run.done_at = time.monotonic()
    for run in runs:
        proc = run.proc
        rc: int | None = None
        if run.open_streams == 0:
            try:
                rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))  # its pipes are closed: exiting
            except subprocess.TimeoutExpired:
                rc = None
        # Kill the whole group: after a timeout, and also anything a finished plugin left behind.
        _kill_group(proc)
        stuck = None
        if rc is None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None and not stream.closed:
                    sel.unregister(stream)
                    stream.close()
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                stuck = proc
        if run.too_big and rc is not None:
            rc = 1
            run.err += b"\nmetrics_exporter: output larger than %d bytes, killed" % MAX_OUTPUT_BYTES
        end = run.done_at if rc is not None and run.done_at is not None else time.monotonic()
        results[run.name] = RunResult(rc, bytes(run.out), bytes(run.err), end - t0, stuck)
    sel.close()
    return results


# --------------------------------------------------------------------------------------------------
# Polling and merging
# --------------------------------------------------------------------------------------------------


@dataclass
class PluginStats:
    runs: int = 0
    failures: int = 0
    timeouts: int = 0
    rejected: int = 0
    last_duration: float = 0.0
    last_success: float = 0.0
    samples: int = 0
    disabled: bool = False
    stuck: subprocess.Popen | None = None
    failing: bool = False


@dataclass
class Config:
    plugin_dir: str
    state_dir: str
    host: str
    node_rank: str = "0"
    job_dir: str = ""
    interval: float = 5.0
    timeout: float = 3.0
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    hold_seconds: float = 900.0  # re-serve a series' newest timestamped sample for this long
    restarts: int = 0  # exporters of this node before this one (--restarts)


class Poller:
    """Discovers and runs the plugins, keeps the last merged result and the self-metrics."""

    def __init__(self, cfg: Config, bash: str | None = None, sources: list[TensorBoardCollector] | None = None) -> None:
        self.cfg = cfg
        self.sources = list(sources or [])  # in-process collectors read at every poll, after the plugins
        self.bash = bash or shutil.which("bash") or "/bin/bash"
        self.stats: dict[str, PluginStats] = {}
        self.families: dict[str, Family] = {}
        self.held = HeldSamples(cfg.hold_seconds)
        self.lock = threading.Lock()
        self.polls = 0
        self.last_cycle = 0.0
        self.last_poll_time = 0.0
        self.running: list[subprocess.Popen] = []  # the current cycle's plugin processes

    def discover(self) -> dict[str, str]:
        """Plugin name (file name without the suffix) -> path, for every plugin file present now."""
        found = {}
        try:
            entries = sorted(os.scandir(self.cfg.plugin_dir), key=lambda e: e.name)
        except OSError as exc:
            log.error("cannot list plugin dir %s: %s", self.cfg.plugin_dir, exc)
            return {}
        for entry in entries:
            if entry.name.endswith(PLUGIN_SUFFIX) and entry.is_file():
                found[entry.name[: -len(PLUGIN_SUFFIX)]] = entry.path
        return found

    def _env(self, state_dir: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "METRICS_HOST": self.cfg.host,
                "JOB_NODE_RANK": self.cfg.node_rank,
                "JOB_DIR": self.cfg.job_dir,
                "METRICS_INTERVAL": f"{self.cfg.interval:g}",
                "METRICS_TIMEOUT": f"{self.cfg.timeout:g}",
                "METRICS_STATE_DIR": state_dir,
                "METRICS_SYSFS_ROOT": self.cfg.sysfs_root,
                "METRICS_PROCFS_ROOT": self.cfg.procfs_root,
                "METRICS_EXPORTER_PID": str(os.getpid()),
                "METRICS_PYTHON": sys.executable,
                "METRICS_NEVER_AGAIN_EXIT": str(NEVER_AGAIN_EXIT),
                "LC_ALL": "C",
            }
        )
        return env

    def poll_once(self) -> None:
        t0 = time.monotonic()
        plugins = self.discover()
        cmds, envs, cwds = {}, {}, {}
        with self.lock:
            self.stats = {n: self.stats.get(n) or PluginStats() for n in plugins}
            for name, path in plugins.items():
                st = self.stats[name]
                if st.disabled:
                    continue
                if st.stuck is not None:
                    if st.stuck.poll() is None:  # the last run is still unkillable: do not pile up another
                        st.timeouts += 1
                        continue
                    st.stuck = None
                state_dir = os.path.join(self.cfg.state_dir, name)
                os.makedirs(state_dir, mode=0o700, exist_ok=True)
                cmds[name], envs[name], cwds[name] = [self.bash, path], self._env(state_dir), state_dir
        results = run_plugins(cmds, envs, cwds, self.cfg.timeout, self.running) if cmds else {}
        for source in self.sources:
            try:
                source.poll()
            except Exception:  # a bug in one source must not cost the plugins' results
                log.exception("reading %s failed", type(source).__name__)
        merged: dict[str, Family] = {}
        seen: set[tuple[str, Labels]] = set()
        with self.lock:
            for name in sorted(results):
                if name in self.stats:
                    self._account(name, results[name], merged, seen)
            self.families = merged
            self.polls += 1
            self.last_cycle = time.monotonic() - t0
            self.last_poll_time = time.time()

    def kill_running(self) -> None:
        """Kill the process groups of plugins still running (used at shutdown)."""
        for proc in list(self.running):
            if proc.poll() is None:
                _kill_group(proc)

    def _account(self, name: str, res: RunResult, merged: dict[str, Family], seen: set[tuple[str, Labels]]) -> None:
        st = self.stats[name]
        st.runs += 1
        st.last_duration = res.duration
        err = res.stderr.decode(errors="replace").strip()
        if res.rc is None:
            st.timeouts += 1
            st.stuck = res.stuck
            self._note_failure(name, st, f"timed out after {self.cfg.timeout:g}s", err)
            return
        if res.rc == NEVER_AGAIN_EXIT:
            st.disabled = True
            log.info("plugin %s exited %d: not running it again (%s)", name, res.rc, err or "no reason given")
            return
        parsed = parse_exposition(res.stdout.decode(errors="replace"))
        refused = self._merge(parsed, merged, seen)
        st.rejected += parsed.rejected + refused
        st.samples = parsed.accepted - refused
        if res.rc != 0 or (parsed.accepted == 0 and parsed.rejected > 0):
            st.failures += 1
            self._note_failure(name, st, f"exit {res.rc}, {parsed.rejected} bad lines", err)
            return
        st.last_success = time.time()
        if st.failing:
            log.info("plugin %s recovered", name)
        st.failing = False

    @staticmethod
    def _note_failure(name: str, st: PluginStats, what: str, err: str) -> None:
        if not st.failing or (st.failures + st.timeouts) % 100 == 0:  # log state changes, then rarely
            log.warning("plugin %s failed (%s): %s", name, what, err[-500:] or "no stderr")
        st.failing = True

    def _merge(self, parsed: Parsed, merged: dict[str, Family], seen: set[tuple[str, Labels]]) -> int:
        """Add one plugin's families to the poll result; returns how many samples were refused."""
        refused = 0
        host = ("host", self.cfg.host)
        for fam in parsed.families.values():
            target = merged.get(fam.name)
            if target is not None and target.type != fam.type and "untyped" in (target.type, fam.type):
                target.type = fam.type if target.type == "untyped" else target.type  # TYPE given by one plugin
                target.help = target.help or fam.help
            if fam.name.startswith(RESERVED_PREFIXES) or (target is not None and target.type != fam.type != "untyped"):
                refused += len(fam.samples)  # reserved prefix, or two plugins declare different types
                continue
            if target is None:
                target = merged[fam.name] = Family(fam.name, fam.type, fam.help)
            for s in fam.samples:
                if all(k != "host" for k, _ in s.labels):
                    s = s._replace(labels=tuple(sorted(s.labels + (host,))))
                if s.ts_ms is not None:
                    self.held.add(target, s)
                    continue
                key = (s.name, s.labels)
                if key in seen:
                    refused += 1
                    continue
                seen.add(key)
                target.samples.append(s)
        return refused

    def run_forever(self, stop: threading.Event) -> None:
        next_t = time.monotonic()
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a bug here must not end the polling thread
                log.exception("poll cycle failed")
            next_t += self.cfg.interval
            now = time.monotonic()
            if next_t < now:
                next_t = now  # overran the interval: start again at once, do not try to catch up
            stop.wait(next_t - now)


# --------------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------------


class ExporterCollector:
    """Custom collector: the plugins' last merged result, the held timestamped samples, and self-metrics."""

    def __init__(self, poller: Poller) -> None:
        self.poller = poller

    def collect(self) -> Iterator[Metric]:
        p = self.poller
        with p.lock:
            families = dict(p.families)
            held = p.held.take(int(time.time() * 1000))
            held_meta = dict(p.held.meta)
            stats = {
                n: PluginStats(
                    **{
                        k: getattr(s, k)
                        for k in (
                            "runs",
                            "failures",
                            "timeouts",
                            "rejected",
                            "last_duration",
                            "last_success",
                            "samples",
                            "disabled",
                        )
                    }
                )
                for n, s in p.stats.items()
            }
            polls, cycle, last_poll = p.polls, p.last_cycle, p.last_poll_time
        extra: dict[str, list[Sample]] = {}
        for fname, s in held:
            extra.setdefault(fname, []).append(s)
        for fname, fam in families.items():
            yield to_metric(fam, fam.samples + extra.pop(fname, []))
        for fname, samples in extra.items():
            typ, doc = held_meta[fname]
            yield to_metric(Family(fname, typ, doc), samples)
        yield from self._self_metrics(stats, polls, cycle, last_poll)

    def _self_metrics(
        self, stats: dict[str, PluginStats], polls: int, cycle: float, last_poll: float
    ) -> Iterator[Metric]:
        host = self.poller.cfg.host
        per_plugin = [
            (
                GaugeMetricFamily,
                "exporter_plugin_duration_seconds",
                "Wall time of the plugin's last run.",
                "last_duration",
            ),
            (CounterMetricFamily, "exporter_plugin_runs", "Runs of the plugin.", "runs"),
            (
                CounterMetricFamily,
                "exporter_plugin_failures",
                "Runs that exited non-zero (not the never-again code) or printed only unparseable output.",
                "failures",
            ),
            (
                CounterMetricFamily,
                "exporter_plugin_timeouts",
                "Runs killed (whole process group) at --timeout.",
                "timeouts",
            ),
            (
                GaugeMetricFamily,
                "exporter_plugin_last_success_timestamp_seconds",
                "Unix time of the plugin's last successful run (0: never).",
                "last_success",
            ),
            (
                CounterMetricFamily,
                "exporter_plugin_lines_rejected",
                "Output lines or samples dropped as malformed, "
                "duplicate, type-clashing or using the reserved exporter_ prefix.",
                "rejected",
            ),
            (GaugeMetricFamily, "exporter_plugin_samples", "Samples accepted from the plugin's last run.", "samples"),
            (
                GaugeMetricFamily,
                "exporter_plugin_disabled",
                "1 if the plugin exited with the never-again code.",
                "disabled",
            ),
        ]
        for cls, name, doc, attr in per_plugin:
            fam = cls(name, doc, labels=["host", "plugin"])
            for plugin, st in sorted(stats.items()):
                fam.add_metric([host, plugin], float(getattr(st, attr)))
            yield fam
        g = GaugeMetricFamily("exporter_poll_cycle_seconds", "Wall time of the last poll cycle.", labels=["host"])
        g.add_metric([host], cycle)
        yield g
        c = CounterMetricFamily("exporter_polls", "Completed poll cycles.", labels=["host"])
        c.add_metric([host], polls)
        yield c
        g = GaugeMetricFamily(
            "exporter_last_poll_timestamp_seconds", "Unix time the last poll cycle ended.", labels=["host"]
        )
        g.add_metric([host], last_poll)
        yield g
        t = os.times()
        c = CounterMetricFamily(
            "exporter_cpu_seconds",
            "CPU time of the exporter (scope=self, all threads) and of its finished plugin processes (scope=plugins).",
            labels=["host", "scope"],
        )
        c.add_metric([host, "self"], t.user + t.system)
        c.add_metric([host, "plugins"], t.children_user + t.children_system)
        yield c
        c = CounterMetricFamily(
            "exporter_held_samples_dropped",
            "Timestamped samples dropped because a series had too many waiting for a scrape.",
            labels=["host"],
        )
        c.add_metric([host], self.poller.held.dropped + sum(s.held.dropped for s in self.poller.sources))
        yield c
        c = CounterMetricFamily(
            "exporter_restarts",
            "Exporters of this node that exited before this one (its supervisor restarted it).",
            labels=["host"],
        )
        c.add_metric([host], self.poller.cfg.restarts)
        yield c


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, ctype, code = generate_latest(self.server.registry), CONTENT_TYPE_PLAIN_0_0_4, 200
        elif path == "/":
            body, ctype, code = b"metrics_exporter: metrics are at /metrics\n", "text/plain; charset=utf-8", 200
        else:
            body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry

    def server_bind(self) -> None:
        # HTTPServer.server_bind would resolve the address with getfqdn(): a DNS lookup that can hang.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


def bind_server(bind: str, port: int, registry: CollectorRegistry, tries: int = 100) -> _Server:
    """HTTP server on the first free port >= `port` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    server_cls = type("_BoundServer", (_Server,), {"address_family": family})
    last: OSError | None = None
    for candidate in range(port, port + tries) if port else [0]:
        try:
            server = server_cls((bind, candidate), _Handler)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            last = exc
            continue
        server.registry = registry
        return server
    raise OSError(errno.EADDRINUSE, f"no free port in {port}..{port + tries - 1} on {bind}") from last


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _default_host() -> str:
    return os.environ.get("METRICS_HOST") or os.environ.get("JOB_HOSTNAME") or socket.gethostname().split(".")[0]


class StateDirError(Exception):
    """--state-dir names a directory that is not private to this user."""


def private_state_dir(path: str | None) -> str:
    """The directory for the plugins' state.

    None: a new directory with a random name in $TMPDIR or /tmp (tempfile.mkdtemp: created
    atomically with mode 0700), removed again at exit. A given path is created with mode 0700 when
    missing; either way it must then be a directory (not a symbolic link) owned by this user that
    nobody else can enter, or StateDirError says why not."""
    if path is None:
        return tempfile.mkdtemp(prefix="metrics_exporter-")
    path = os.path.abspath(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise StateDirError(f"--state-dir {path}: cannot create it: {e.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise StateDirError(f"--state-dir {path} is a symbolic link; give a directory of yours with mode 0700")
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise StateDirError(
            f"--state-dir {path} is not private (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}); give a directory of yours with mode 0700"
        )
    return path


def _write_atomic(path: str, text: str) -> None:
    """Write ``path`` whole: a new file (never through a link, 0644) renamed over it."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    ap.add_argument("--port", type=int, default=9400, help="first port to try; moves up if taken (default 9400)")
    ap.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between polls (default 5)")
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds each plugin may run (default 3)")
    ap.add_argument(
        "--plugin-dir",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins"),
        help="where *_metrics_plugin.sh live (default: this script's directory)",
    )
    ap.add_argument(
        "--job-dir",
        default=os.environ.get("JOB_DIR", os.getcwd()),
        help="the job's directory, passed to plugins as JOB_DIR (default $JOB_DIR or cwd)",
    )
    ap.add_argument(
        "--host",
        default=_default_host(),
        help="value of the host label (default $METRICS_HOST, $JOB_HOSTNAME or the short hostname)",
    )
    ap.add_argument(
        "--node-rank",
        default=os.environ.get("JOB_NODE_RANK", "0"),
        help="passed to plugins as JOB_NODE_RANK (default $JOB_NODE_RANK or 0)",
    )
    ap.add_argument(
        "--tensorboard",
        choices=("auto", "on", "off"),
        default="auto",
        help="read the TensorBoard event files under --job-dir: auto = on node rank 0 only (MaxText "
        "writes them there), or on every node with TB_METRICS_ALL_NODES=1 (default auto)",
    )
    ap.add_argument(
        "--state-dir",
        help="parent of the per-plugin state dirs: a directory of yours with mode 0700, "
        "made if missing (default: a new private dir in $TMPDIR or /tmp, removed at exit)",
    )
    ap.add_argument("--sysfs-root", default=os.environ.get("METRICS_SYSFS_ROOT", "/sys"))
    ap.add_argument("--procfs-root", default=os.environ.get("METRICS_PROCFS_ROOT", "/proc"))
    ap.add_argument("--port-file", help="write the port actually used to this file")
    ap.add_argument("--sd-file", help="write a Prometheus file_sd target list (JSON) for this exporter here")
    ap.add_argument("--log", help="append the log here instead of stderr")
    ap.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="exporters of this node that ran before this one (served as exporter_restarts_total; default 0)",
    )
    ap.add_argument("--once", action="store_true", help="run one poll, print the exposition, exit")
    args = ap.parse_args(argv)
    if args.interval <= 0 or args.timeout <= 0:
        ap.error("--interval and --timeout must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        filename=args.log,
        level=logging.INFO,
        format="%(asctime)s metrics_exporter[%(process)d] %(levelname)s %(message)s",
    )
    job_dir = os.path.abspath(args.job_dir)
    try:
        state_dir = private_state_dir(args.state_dir)
    except StateDirError as e:
        print(f"metrics_exporter.py: {e}", file=sys.stderr)
        if args.log:
            log.error("%s", e)
        return 2
    cfg = Config(
        plugin_dir=os.path.abspath(args.plugin_dir),
        state_dir=state_dir,
        host=args.host,
        node_rank=str(args.node_rank),
        job_dir=job_dir,
        interval=args.interval,
        timeout=args.timeout,
        sysfs_root=args.sysfs_root,
        procfs_root=args.procfs_root,
        restarts=max(0, args.restarts),
    )
    try:
        return serve(args, cfg)
    finally:
        if args.state_dir is None:  # made here: nobody else knows it
            shutil.rmtree(state_dir, ignore_errors=True)


def serve(args: argparse.Namespace, cfg: Config) -> int:
    """Poll and serve until SIGTERM/SIGINT (or one poll with --once)."""
    tb_on = args.tensorboard == "on" or (
        args.tensorboard == "auto" and (cfg.node_rank == "0" or os.environ.get("TB_METRICS_ALL_NODES") == "1")
    )
    sources = [TensorBoardCollector(cfg.job_dir, cfg.host, cfg.hold_seconds, skip_dir=cfg.state_dir)] if tb_on else []
    poller = Poller(cfg, sources=sources)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(poller))
    for source in sources:
        registry.register(source)
    if args.once:
        poller.poll_once()
        sys.stdout.write(generate_latest(registry).decode())
        return 0

    server = bind_server(args.bind, args.port, registry)
    port = server.server_address[1]
    url_host = f"[{args.bind}]" if ":" in args.bind else args.bind
    written = []
    if args.port_file:
        _write_atomic(args.port_file, f"{port}\n")
        written.append(args.port_file)
    if args.sd_file:
        # No "host" target label: the samples carry host already, Prometheus would rename it exported_host.
        target = [{"targets": [f"{url_host}:{port}"], "labels": {"node_rank": cfg.node_rank}}]
        _write_atomic(args.sd_file, json.dumps(target) + "\n")
        written.append(args.sd_file)
    print(f"metrics_exporter: serving http://{url_host}:{port}/metrics", flush=True)
    log.info(
        "serving http://%s:%d/metrics; plugins from %s every %gs (timeout %gs), state in %s; TensorBoard "
        "events under %s: %s",
        url_host,
        port,
        cfg.plugin_dir,
        cfg.interval,
        cfg.timeout,
        cfg.state_dir,
        cfg.job_dir,
        "read" if tb_on else f"not read (--tensorboard {args.tensorboard}, node rank {cfg.node_rank})",
    )

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    poll_thread = threading.Thread(target=poller.run_forever, args=(stop,), name="poll", daemon=True)
    poll_thread.start()
    while not stop.wait(3600):
        pass
    log.info("stopping")
    server.shutdown()
    poller.kill_running()
    poll_thread.join(timeout=cfg.timeout + 1)
    poller.kill_running()
    for path in written:
        try:
            os.unlink(path)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
