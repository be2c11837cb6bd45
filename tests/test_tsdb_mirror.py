"""Where a RAY=1 job's TSDB is written (utils/launch/lib.sh tsdb_place) and how utils/observe/tsdb_mirror.py
copies a node-local TSDB into the job dir, pass by pass. The TSDB trees here are files laid out as
Prometheus lays them out (block dirs named by ULID with meta.json and chunks/, wal/ segments and
checkpoint.N/ dirs, chunks_head/ files, lock, queries.active); tests/test_job_services.py runs the copier
on a real Prometheus."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import REPO, run

from observe import tsdb_mirror

MIRROR = str(REPO / "utils/observe/tsdb_mirror.py")


@pytest.mark.parametrize(
    "fs,place",
    [("nfs", "node_local"), ("nfs4", "node_local"), ("cifs", "node_local"), ("smb2", "node_local"),
     ("fuseblk", "node_local"), ("fuse.sshfs", "node_local"), ("v9fs", "node_local"), ("ext2/ext3", "in_place"),
     ("xfs", "in_place"), ("lustre", "in_place"), ("gpfs", "in_place"), ("tmpfs", "in_place")],
)  # fmt: skip
def test_the_file_system_decides_where_the_tsdb_is_written(fs, place):
    out = run(
        ["bash", "-c", f"source {REPO}/utils/launch/lib.sh && tsdb_place /"], env={**os.environ, "MST_TSDB_FSTYPE": fs}
    )
    assert out.stdout == f"{place} {fs}\n", out.stdout + out.stderr


def test_this_machines_disk_takes_the_tsdb_in_place(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MST_TSDB_FSTYPE"}
    out = run(["bash", "-c", f'source {REPO}/utils/launch/lib.sh && tsdb_place "$0"', str(tmp_path)], env=env)
    assert out.stdout.startswith("in_place "), out.stdout


def block(root: Path, ulid: str, data: bytes) -> None:
    (root / ulid / "chunks").mkdir(parents=True)
    (root / ulid / "meta.json").write_text(json.dumps({"ulid": ulid, "version": 1}))
    (root / ulid / "chunks" / "000001").write_bytes(data)
    (root / ulid / "index").write_bytes(b"index")


def test_each_pass_copies_what_changed_and_follows_compaction(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "wal").mkdir(parents=True)
    (src / "chunks_head").mkdir()
    (src / "wal" / "00000000").write_bytes(b"a" * 1000)
    (src / "chunks_head" / "000001").write_bytes(b"c" * 300)
    block(src, "01HZA0000000000000000000AA", b"x" * 500)
    for f in ("lock", "queries.active"):
        (src / f).write_text("")
    p = tsdb_mirror.mirror(src, dst)
    assert sorted(x.relative_to(dst).as_posix() for x in dst.rglob("*")) == [
        "01HZA0000000000000000000AA", "01HZA0000000000000000000AA/chunks", "01HZA0000000000000000000AA/chunks/000001",
        "01HZA0000000000000000000AA/index", "01HZA0000000000000000000AA/meta.json", "chunks_head",
        "chunks_head/000001", "wal", "wal/00000000"]  # fmt: skip
    assert p.bytes == 1000 + 300 + 500 + 5 + len((src / "01HZA0000000000000000000AA/meta.json").read_bytes())
    # nothing changed: nothing copied
    assert tsdb_mirror.mirror(src, dst).files == 0
    # the WAL grew: only its new bytes are written (appended to the copy)
    with (src / "wal" / "00000000").open("ab") as f:
        f.write(b"b" * 200)
    p = tsdb_mirror.mirror(src, dst)
    assert (p.files, p.bytes) == (1, 200) and (dst / "wal/00000000").read_bytes() == b"a" * 1000 + b"b" * 200
    # a file that is not a longer version of the copy (same size, other content, later time): copied whole
    (src / "chunks_head" / "000001").write_bytes(b"d" * 300)
    t = time.time() + 5
    os.utime(src / "chunks_head" / "000001", (t, t))
    p = tsdb_mirror.mirror(src, dst)
    assert (p.files, p.bytes) == (1, 300) and (dst / "chunks_head/000001").read_bytes() == b"d" * 300
    # a compaction: a new block of the head, the WAL truncated behind a checkpoint, the old block merged away
    block(src, "01HZB0000000000000000000BB", b"y" * 700)
    (src / "wal" / "checkpoint.00000000").mkdir()
    (src / "wal" / "checkpoint.00000000" / "00000000").write_bytes(b"k" * 50)
    (src / "wal" / "00000001").write_bytes(b"n" * 10)
    (src / "wal" / "00000000").unlink()
    (src / "01HZB0000000000000000000BB.tmp-for-creation").mkdir()  # Prometheus' own block in the making
    shutil.rmtree(src / "01HZA0000000000000000000AA")
    p = tsdb_mirror.mirror(src, dst)
    assert sorted(x.name for x in dst.iterdir()) == ["01HZB0000000000000000000BB", "chunks_head", "wal"]
    assert sorted(x.name for x in (dst / "wal").iterdir()) == ["00000001", "checkpoint.00000000"]
    assert p.removed == 2  # the merged block and the truncated segment


def test_bad_input_is_one_line(tmp_path):
    (tmp_path / "src").mkdir()
    cases = {
        (): "expected SRC DST --every SECONDS --stop-file FILE",
        ("src", "dst", "--every", "0", "--stop-file", "s"): "--every '0' must be a number of seconds above 0",
        ("src", "dst", "--every", "5", "--stop-file", "s", "--later", "x"): "expected SRC DST",
        ("nosuch", "dst", "--final"): "the TSDB nosuch is not a directory",
    }
    for args, says in cases.items():
        res = run([MIRROR, *args], cwd=tmp_path)
        lines = res.stderr.splitlines()
        assert res.returncode in (1, 2) and len(lines) == 1 and says in lines[0], res.stderr
        assert lines[0].startswith("tsdb_mirror.py: ")
    assert not (tmp_path / "dst").exists()
    res = run([MIRROR, "--help"])
    assert res.returncode == 0 and res.stdout.startswith("Usage: tsdb_mirror.py SRC DST")
