"""A RAY=1 job's actor (_ray_actor.py NodeTrainer) hands the trainer's output back byte for byte:
lines of 5 KB and 1 MiB whole, invalid UTF-8 as written, every later line after them, and the saved
job environment reaches the trainer unchanged even where a value is not UTF-8. The actor class is
used here without Ray (it is a plain class that the driver wraps with ray.remote); the whole RAY=1 job
is tests/test_ray_job.py."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ray_actor", REPO / "_ray_actor.py")
assert _spec and _spec.loader
ray_actor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ray_actor)

TRAINER = r"""
import os, sys
out = sys.stdout.buffer
out.write(b"step 0\n")
out.write(b"a" * 5000 + b"\n")
out.write(b"b" * (1 << 20) + b"\n")
out.write(b"bad \xff\xfe utf-8 \xc3\n")
out.write(b"env " + os.environb[b"ODD"] + b"\n")
out.write(b"after")
"""


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "scratch"
    d.mkdir(mode=0o700)
    env = {b"PATH": os.environb.get(b"PATH", b"/usr/bin:/bin"), b"ODD": b"x\xe9y\xff"}
    (d / "job.env").write_bytes(b"".join(k + b"=" + v + b"\0" for k, v in env.items()))
    monkeypatch.setenv("MST_JOB_SCRATCH", str(d))
    monkeypatch.delenv("MST_REPO", raising=False)
    return d


def test_every_byte_of_every_line_comes_back(scratch: Path, tmp_path: Path) -> None:
    trainer = ray_actor.NodeTrainer("n1", [sys.executable, "-c", TRAINER])
    trainer.env["JOB_DIR"] = str(tmp_path / "job")
    trainer.start()
    lines: list[bytes] = []
    deadline = time.monotonic() + 60
    rc = None
    while rc is None and time.monotonic() < deadline:
        got, rc = trainer.drain(wait=1.0)
        lines += got
    lines += trainer.drain()[0]
    assert rc == 0
    assert lines == [
        b"step 0",
        b"a" * 5000,
        b"b" * (1 << 20),
        b"bad \xff\xfe utf-8 \xc3",
        b"env x\xe9y\xff",
        b"after",
    ]
    assert (tmp_path / "job" / ".stages" / "train" / "n1").read_text().startswith("rc=0 ")
