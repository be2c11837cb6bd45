#!/usr/bin/env python3
"""Usage: tsdb_mirror.py SRC DST --every SECONDS --stop-file FILE [--pid-file FILE] [--remove DIR]
       tsdb_mirror.py SRC DST --final
(by utils/observe/job_services.sh, for a job directory on a file system Prometheus does not support)

Keeps DST, the TSDB directory <job dir>/prometheus on shared storage, a copy of SRC, the TSDB the
job's Prometheus writes on node-local disk. One pass copies what changed since the last one, in the
order that never loses a sample to a compaction running meanwhile: the WAL (segments whose size or
time changed, checkpoints) and the head chunks first, then the blocks; then it removes from DST what
Prometheus removed from SRC (compacted blocks, truncated segments). Blocks and checkpoints are
copied beside their final name and renamed into place; a segment or chunk file that grew gets its
new bytes appended (Prometheus only appends to them), any other change is copied whole and renamed
over. A reader of DST (utils/prometheus.sh copies it before it serves it) sees whole blocks; the
WAL's last record may be cut, which Prometheus repairs in the copy it opens. lock and
queries.active are never copied.

  --every S --stop-file F   a pass every S seconds until F exists, then exit 0 (job_services.sh stop
                            copies a last time itself); a failed pass prints one line, the next tries again
  --pid-file P              on SIGTERM (scancel or the time limit: Slurm signals every process of the
                            job at once, and the job's cleanup may be cut short) wait up to 10 s for the
                            process in P (Prometheus, signalled too) to exit, copy a last time, exit
  --remove DIR              after that last copy succeeded, remove DIR (a private directory of ours)
  --final                   one pass, after Prometheus stopped
Each pass prints one line: UTC time, files and bytes copied, entries removed, seconds taken.
Exit 1 with one line when the final pass failed. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TMP = ".tmp-for-creation"  # Prometheus' own suffix: skipped by readers, deleted by Prometheus on open
GONE = ".tmp-for-deletion"


@dataclass
class Pass:
    files: int = 0
    bytes: int = 0
    removed: int = 0

    def line(self, took: float) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        done = f"copied {self.files} file(s), {self.bytes} bytes; removed {self.removed}"
        return f"{when} tsdb_mirror: {done}; {took:.2f} s"


def _tail_matches(src: Path, dst: Path, size: int) -> bool:
    """dst's last bytes (up to 4 KiB of its size) are src's at the same offset: src grew past it."""
    n = min(size, 4096)
    with open(src, "rb") as a, open(dst, "rb") as b:
        a.seek(size - n)
        b.seek(size - n)
        return a.read(n) == b.read(n)


def _update_file(src: Path, dst: Path, p: Pass) -> None:
    """A WAL segment or head chunk file: Prometheus only appends to them (pages are padded on
    close, never rewritten), so a copy that is a prefix of src gets the new bytes appended; any
    other change is copied whole beside and renamed over it. Unchanged: same size and second."""
    st = src.stat()
    try:
        d = dst.stat()
    except FileNotFoundError:
        d = None
    if d is not None and d.st_size == st.st_size and int(d.st_mtime) == int(st.st_mtime):
        return
    if d is not None and 0 < d.st_size < st.st_size and _tail_matches(src, dst, d.st_size):
        with open(src, "rb") as a, open(dst, "r+b") as b:
            a.seek(d.st_size)
            b.seek(d.st_size)
            shutil.copyfileobj(a, b)
            grown = b.tell() - d.st_size
            mtime = os.fstat(a.fileno()).st_mtime_ns
        os.utime(dst, ns=(mtime, mtime))
        p.files += 1
        p.bytes += grown
        return
    tmp = dst.with_name(dst.name + TMP)
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)
    p.files += 1
    p.bytes += dst.stat().st_size


def _copy_dir(src: Path, dst: Path, p: Pass) -> None:
    """A directory that never changes once named (a block, a WAL checkpoint): copied whole once."""
    if dst.is_dir():
        return
    tmp = dst.with_name(dst.name + TMP)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp, symlinks=True)
    except (FileNotFoundError, shutil.Error):  # compacted or truncated away meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        return
    os.rename(tmp, dst)
    for f in dst.rglob("*"):
        if f.is_file():
            p.files += 1
            p.bytes += f.stat().st_size


def _remove(path: Path, p: Pass) -> None:
    if path.is_dir() and not path.is_symlink():
        gone = path.with_name(path.name + GONE)
        os.rename(path, gone)
        shutil.rmtree(gone)
    else:
        path.unlink(missing_ok=True)
    p.removed += 1


def _mirror_flat(src: Path, dst: Path, p: Pass) -> set[str]:
    """wal/ or chunks_head/: numbered files copied when changed, checkpoint dirs copied once.
    Returns the names SRC held."""
    if not src.is_dir():
        return set()
    dst.mkdir(exist_ok=True)
    names = set()
    for e in os.scandir(src):
        if e.name.endswith(".tmp") or TMP in e.name:
            continue
        names.add(e.name)
        if e.is_dir(follow_symlinks=False):
            _copy_dir(Path(e.path), dst / e.name, p)
        elif e.is_file(follow_symlinks=False):
            try:
                _update_file(Path(e.path), dst / e.name, p)
            except FileNotFoundError:  # removed by Prometheus meanwhile (a truncated segment)
                (dst / (e.name + TMP)).unlink(missing_ok=True)
    return names


def _prune(dst: Path, keep: set[str], p: Pass) -> None:
    if dst.is_dir():
        for e in os.scandir(dst):
            if e.name not in keep:
                _remove(Path(e.path), p)


def mirror(src: Path, dst: Path) -> Pass:
    """One pass: DST holds what SRC holds now (see the module's docstring for the order)."""
    p = Pass()
    dst.mkdir(exist_ok=True)
    flat = {d: _mirror_flat(src / d, dst / d, p) for d in ("wal", "chunks_head")}
    blocks = set()
    for e in os.scandir(src):
        if e.is_dir(follow_symlinks=False) and ".tmp" not in e.name and (Path(e.path) / "meta.json").is_file():
            blocks.add(e.name)
            _copy_dir(Path(e.path), dst / e.name, p)
    for d, names in flat.items():
        _prune(dst / d, names, p)
    _prune(dst, blocks | set(flat), p)  # never lock or queries.active
    return p


USAGE = "expected SRC DST --every SECONDS --stop-file FILE [--pid-file FILE] [--remove DIR], or SRC DST --final"


@dataclass
class Args:
    src: Path
    dst: Path
    every: float | None = None  # None: --final
    stop_file: Path | None = None
    pid_file: Path | None = None
    remove: Path | None = None


def _args(argv: list[str]) -> Args | str:
    """The arguments, or the one line saying what is wrong."""
    if len(argv) == 3 and argv[2] == "--final":
        return Args(Path(argv[0]), Path(argv[1]))
    if len(argv) < 6 or len(argv) % 2:
        return f"{USAGE}; see --help"
    opts = dict(zip(argv[2::2], argv[3::2], strict=True))
    unknown = set(opts) - {"--every", "--stop-file", "--pid-file", "--remove"}
    if unknown or "--every" not in opts or "--stop-file" not in opts or len(opts) != len(argv[2::2]):
        return f"{USAGE}; see --help"
    try:
        every = float(opts["--every"])
    except ValueError:
        every = 0.0
    if not every > 0:
        return f"--every '{opts['--every']}' must be a number of seconds above 0"
    path = {k: Path(v) for k, v in opts.items()}
    return Args(Path(argv[0]), Path(argv[1]), every, path["--stop-file"], path.get("--pid-file"), path.get("--remove"))


def _wait_gone(pid_file: Path | None, limit: float = 10.0) -> None:
    """Up to LIMIT s for the process in PID_FILE (the job's Prometheus) to exit: its shutdown writes the
    last of its WAL. Only waits: it never signals it."""
    try:
        pid = int(pid_file.read_text().strip()) if pid_file else 0
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + limit
    while pid > 0 and time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:  # not ours (the pid was reused): nothing of ours to wait for
            return
        time.sleep(0.1)


def _remove_private(d: Path) -> str | None:
    """Remove D when it is a private directory of ours (mode 700, not a link); else why not."""
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
        return f"{d} is not a private directory of ours (mode 700): not removing it"
    shutil.rmtree(d)
    return None


def _final(src: Path, dst: Path) -> int:
    began = time.monotonic()
    try:
        p = mirror(src, dst)
    except OSError as e:
        print(f"tsdb_mirror.py: the last copy into {dst} failed: {e}; the TSDB stays in {src}", file=sys.stderr)
        return 1
    print(p.line(time.monotonic() - began), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print((__doc__ or "").strip())
        return 0
    a = _args(argv)
    if isinstance(a, str):
        print(f"tsdb_mirror.py: {a}", file=sys.stderr)
        return 2
    if not a.src.is_dir():
        print(f"tsdb_mirror.py: the TSDB {a.src} is not a directory", file=sys.stderr)
        return 1
    if a.every is None:
        return _final(a.src, a.dst)
    assert a.stop_file is not None
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    due = time.monotonic() + a.every
    while not stopping:
        if a.stop_file.exists():  # job_services.sh stop: it copies a last time itself
            return 0
        if time.monotonic() < due:
            time.sleep(0.2)
            continue
        began = time.monotonic()
        try:
            print(mirror(a.src, a.dst).line(time.monotonic() - began), flush=True)
        except OSError as e:
            print(f"tsdb_mirror.py: a copy into {a.dst} failed: {e}; trying again in {a.every:g} s", flush=True)
        due = began + a.every
    # SIGTERM: the job is cancelled or at its time limit, and Slurm signals all of its processes at
    # once; its cleanup may be cut short before job_services.sh stop runs. Prometheus got the signal too.
    _wait_gone(a.pid_file)
    rc = _final(a.src, a.dst)
    if rc == 0 and a.remove is not None:
        why = _remove_private(a.remove)
        if why:
            print(f"tsdb_mirror.py: {why}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
