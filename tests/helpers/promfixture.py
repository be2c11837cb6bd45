"""Real Prometheus TSDBs for tests.

write_tsdb() turns series into TSDB blocks with promtool's OpenMetrics backfill, the same
on-disk format a job's Prometheus leaves behind:

    from helpers.promfixture import write_tsdb

    t0 = 1_714_564_800  # unix seconds
    write_tsdb(job_dir / "prometheus", [
        ("ray_node_cpu_utilization", {"instance": "n1"}, [(t0 + 15 * i, 42.0) for i in range(240)]),
        ("ray_node_network_sent_total", {"instance": "n1"}, [(t0, 0), (t0 + 15, 1e6)]),
    ])

Each series is (metric name, labels, samples); samples are (unix seconds, value) pairs,
any order, no duplicate timestamps within a series. Values may be int, float, NaN or
+-inf. Series with the same name may come in any order (they are grouped by name, as
OpenMetrics requires). No `# TYPE` lines are written, so any name works (`_total` included)
and every metric is typed "unknown", which PromQL does not care about.

Speed: the text is written in one pass (~2 M samples/s here) and promtool re-reads the
file once per block it cuts, so by default blocks are sized to cover the whole time span
in one go (block_hours=None). Pass block_hours=2 for the layout of a real Prometheus
(2h blocks) at the cost of one pass per 2 hours of data.

running_prometheus() starts a real Prometheus that scrapes itself into a TSDB dir: kill it
with SIGKILL and the dir is WAL-only, like a job killed before its first 2h block was cut.
started_prometheus() starts one without waiting, so that several wait for their first scrapes
(~6 s) at the same time.
tsdb_digest() hashes every file under a dir (to prove something left it unaltered).
Both binaries come from PROMETHEUS_BIN / PROMTOOL_BIN, else PATH (apt-get install prometheus).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from helpers.cache import cache_dir

Sample = tuple[float, float]
Series = tuple[str, Mapping[str, str], Iterable[Sample]]

TWO_HOURS = 7200


def binary(name: str) -> str | None:
    """Path of `prometheus` or `promtool`: $PROMETHEUS_BIN / $PROMTOOL_BIN, else PATH, else None."""
    return os.environ.get(f"{name.upper()}_BIN") or shutil.which(name)


def _need(name: str) -> str:
    path = binary(name)
    if not path:
        raise RuntimeError(f"{name} not found: apt-get install prometheus, or set {name.upper()}_BIN")
    return path


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write_openmetrics(series: Iterable[Series], out: Path) -> tuple[float, float] | None:
    """Write series as an OpenMetrics text file; returns (first, last) sample time, or None if empty."""
    by_name: dict[str, list[tuple[Mapping[str, str], Iterable[Sample]]]] = {}
    for name, labels, samples in series:
        by_name.setdefault(name, []).append((labels, samples))
    lo = hi = None
    with open(out, "w", encoding="utf-8", buffering=1 << 20) as fh:
        for name, members in by_name.items():
            for labels, samples in members:
                pts = samples if isinstance(samples, list) else list(samples)
                if any(pts[i][0] >= pts[i + 1][0] for i in range(len(pts) - 1)):
                    pts = sorted(pts)
                if not pts:
                    continue
                lo = pts[0][0] if lo is None else min(lo, pts[0][0])
                hi = pts[-1][0] if hi is None else max(hi, pts[-1][0])
                lab = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                prefix = f"{name}{{{lab}}} " if lab else f"{name} "
                fh.write("".join([f"{prefix}{v} {t}\n" for t, v in pts]))
        fh.write("# EOF\n")
    return None if lo is None else (lo, hi)


def write_tsdb(
    out_dir: Path | str, series: Iterable[Series], *, block_hours: int | None = None, inputs: str | None = None
) -> Path:
    """Backfill series into TSDB blocks under out_dir (created; may already hold blocks). Returns out_dir.

    block_hours: block length, a multiple of 2; None = big enough that all samples land in
    at most 2 blocks (fastest). Raises RuntimeError with promtool's output if it fails.
    The blocks are a function of the OpenMetrics text, the block length and promtool's version, so
    they are kept under that hash (cached_blocks, helpers/cache.py) and a second backfill of the same
    series copies them. inputs: a caller's complete description of what series yields (the incident
    corpus: its code, family, seed, scale, job id): a second backfill with the same inputs copies the
    blocks without generating the series at all (a link to their entry, `in-<hash>`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    root = cache_dir("tsdb-blocks")
    link = None
    if inputs is not None and root is not None:
        version = _promtool_version(_need("promtool"))
        key = hashlib.sha256(version + f"\0{block_hours}\0{inputs}".encode()).hexdigest()
        link = root / f"in-{key}"
        if link.is_dir():  # a link whose entry was pruned is no hit
            os.utime(link)
            for made in sorted(link.iterdir()):
                shutil.copytree(made, out / made.name, copy_function=shutil.copy)
            return out
    with tempfile.TemporaryDirectory(prefix="promfixture.") as tmp:
        om = Path(tmp) / "series.om"
        span = write_openmetrics(series, om)
        if span is None:
            return out
        if block_hours is None:  # promtool rounds down to Prometheus' block ranges: 2h, 6h, 18h, 54h, ...
            block = TWO_HOURS
            while block <= span[1] - span[0]:
                block *= 3
        elif block_hours < 2 or block_hours % 2:
            raise ValueError(f"block_hours must be a multiple of 2, got {block_hours}")
        else:
            block = block_hours * 3600
        blocks = cached_blocks(om, block)
        for made in sorted(blocks.iterdir()):
            shutil.copytree(made, out / made.name, copy_function=shutil.copy)
        if link is not None and blocks.parent == root:
            link.unlink(missing_ok=True)  # a link to a pruned entry
            with contextlib.suppress(FileExistsError):  # another worker linked it first
                link.symlink_to(blocks.name)
    return out


def _promtool_version(promtool: str) -> bytes:
    """promtool's --version output (part of every cache key), asked once per binary."""
    if promtool not in _VERSIONS:
        res = subprocess.run([promtool, "--version"], capture_output=True, check=False)
        _VERSIONS[promtool] = res.stdout + res.stderr
    return _VERSIONS[promtool]


_VERSIONS: dict[str, bytes] = {}


KEEP_UNUSED_S = 7 * 86400


def _prune(root: Path) -> None:
    """Drop the entries (and half-made ones) no backfill used for a week: each change of the corpus makes
    new ones (~40 MB for the fast loop's)."""
    for entry in root.iterdir():
        if entry.is_symlink() and not entry.exists():  # an inputs link whose entry went
            entry.unlink(missing_ok=True)
            continue
        try:
            if entry.stat().st_mtime < time.time() - KEEP_UNUSED_S:
                shutil.rmtree(entry, ignore_errors=True)
        except FileNotFoundError:  # another worker removed it first
            continue


def cached_blocks(om: Path, block: int) -> Path:
    """The block dirs promtool backfills from the OpenMetrics file OM with BLOCK-second blocks, in a dir
    of their own: the cache's entry for (promtool's version, BLOCK, OM's text), made on a miss (in a
    private dir, then renamed, so parallel test workers never see half an entry); without a cache, a
    fresh dir beside OM."""
    promtool = _need("promtool")
    root = cache_dir("tsdb-blocks")
    if root is None:
        dest = om.parent / "blocks"
    else:
        key = hashlib.sha256(_promtool_version(promtool) + f"\0{block}\0".encode())
        with open(om, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                key.update(chunk)
        dest = root / key.hexdigest()
        if dest.is_dir():
            os.utime(dest)  # in use: kept by _prune
            return dest
        root.mkdir(parents=True, exist_ok=True)
        _prune(root)
    made = Path(tempfile.mkdtemp(prefix=".new.", dir=root or om.parent))
    cmd = [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet"]
    cmd += [f"--max-block-duration={block}s", str(om), str(made)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError:
        shutil.rmtree(made, ignore_errors=True)
        raise
    if run.returncode:
        shutil.rmtree(made, ignore_errors=True)
        raise RuntimeError(f"promtool backfill failed ({run.returncode}): {run.stderr.strip() or run.stdout.strip()}")
    try:
        made.rename(dest)
    except OSError:  # another worker made the same entry first: use that one
        shutil.rmtree(made, ignore_errors=True)
    return dest


def tsdb_digest(root: Path | str) -> dict[str, tuple[str, int, int]]:
    """{relative path: (sha256, size, mtime_ns)} of every file and dir under root (dirs: ("dir", 0, 0))."""
    root = Path(root)
    digest: dict[str, tuple[str, int, int]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_dir() and not path.is_symlink():
            digest[rel] = ("dir", 0, 0)
        else:
            st = path.lstat()
            digest[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns)
    return digest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prom_get(url: str, path: str, **params: str) -> dict:
    """GET url+path?params from a Prometheus HTTP API, decoded JSON (no proxy)."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}{path}{query}", timeout=10) as resp:
        return json.loads(resp.read())


@dataclass
class LivePrometheus:
    url: str
    tsdb: Path
    proc: subprocess.Popen
    log: Path

    def scrapes(self) -> int:
        """Number of `up` samples stored so far (1 per scrape)."""
        res = prom_get(self.url, "/api/v1/query", query="count_over_time(up[1h])")["data"]["result"]
        return int(res[0]["value"][1]) if res else 0

    def wait_for(self, min_scrapes: int, timeout: float = 30) -> None:
        """Return once min_scrapes are stored (the first lands ~5.5 s after start: targets are
        applied on a 5 s tick); RuntimeError with the log's tail if not within timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.scrapes() >= min_scrapes:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"prometheus did not store {min_scrapes} scrapes in {timeout}s:\n{tail}")
            time.sleep(0.25)


@contextmanager
def started_prometheus(tsdb: Path | str, *, stop: signal.Signals = signal.SIGKILL) -> Iterator[LivePrometheus]:
    """A real Prometheus scraping itself every second into tsdb, yielded as soon as it is started
    (several can then wait for their first scrapes at the same time: LivePrometheus.wait_for).

    On exit stops it with `stop` unless it has ended (default SIGKILL: a killed job, which leaves
    only wal/ and chunks_head/, no blocks).
    """
    tsdb = Path(tsdb)
    tsdb.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="promfixture.") as tmp:
        cfg = Path(tmp) / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n"
            f"  - job_name: self\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        )
        cmd = [_need("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}"]
        cmd += [f"--web.listen-address=127.0.0.1:{port}"]
        with open(Path(tmp) / "log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield LivePrometheus(f"http://127.0.0.1:{port}", tsdb, proc, Path(tmp) / "log")
        finally:
            if proc.poll() is None:
                proc.send_signal(stop)
            proc.wait(timeout=30)


@contextmanager
def running_prometheus(
    tsdb: Path | str, *, min_scrapes: int = 2, timeout: float = 30, stop: signal.Signals = signal.SIGKILL
) -> Iterator[LivePrometheus]:
    """started_prometheus(), yielded once min_scrapes are stored (a live TSDB, ~6.5 s for 2)."""
    with started_prometheus(tsdb, stop=stop) as live:
        live.wait_for(min_scrapes, timeout)
        yield live


def sample_series(
    names: Sequence[str], start: int, *, minutes: int = 60, step: int = 15, instances: int = 2
) -> list[Series]:
    """Simple deterministic series for quick fixtures: value = minutes since start (+ instance index)."""
    return [
        (name, {"instance": f"n{i}"}, [(start + k, k / 60 + i) for k in range(0, minutes * 60, step)])
        for name in names
        for i in range(instances)
    ]
