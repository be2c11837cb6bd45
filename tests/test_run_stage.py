"""utils/launch/run_stage.sh: every line a stage prints reaches the log at once, with its node's
prefix, while the stage still runs (a hung trainer's last lines are what triage reads), and every
byte of every line reaches it whatever the node's awk (issue 20: Ubuntu 24.04's mawk dropped
every line after the first one over 4096 bytes)."""

import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO

from helpers.jobs import wait_for

PREFIX_LINES = REPO / "utils/launch/prefix_lines.sh"

# The stand-in for Ubuntu 24.04's awk. It mirrors the measurement in issue 20 on an Ubuntu 24.04
# GPU node (mawk 1.3.4 20240123): under -W interactive a line over 4096 bytes is cut at 4096 and
# every later line is dropped (read and discarded: the trainer went on at 100 % GPU), so
#   python3 -c "print('a'*5000); print('after')" | awk -W interactive '{print "x: " $0}'
# prints one 4099-byte line and no "after". Otherwise it is this machine's awk (Debian 12's mawk
# 1.3.4 20200120, which keeps both lines).
UBUNTU_MAWK = """#!{python}
import subprocess, sys
args = sys.argv[1:]
if args[:2] == ["-W", "version"]:
    print("mawk 1.3.4 20240123")
    sys.exit(0)
if args[:2] != ["-W", "interactive"]:
    import os
    os.execv({awk!r}, [{awk!r}, *args])
awk = subprocess.Popen([{awk!r}, *args], stdin=subprocess.PIPE)
for line in sys.stdin.buffer:
    if len(line.rstrip(b"\\n")) > 4096:
        awk.stdin.write(line[:4096] + b"\\n")
        awk.stdin.flush()
        for _ in sys.stdin.buffer:
            pass
        break
    awk.stdin.write(line)
    awk.stdin.flush()
awk.stdin.close()
sys.exit(awk.wait())
"""

# What run_stage.sh ran before issue 20: awk, with -W interactive for mawk (Debian's and Ubuntu's).
OLD_PREFIXER = "awk -W interactive -v h=node3 '{ print h \": \" $0; fflush() }'"

# What the trainer prints: a short line, a 5 KB and a 1 MiB line (MaxText's config dump has lines
# over 4096 bytes), invalid UTF-8 and a NUL byte, a line after them, and a last line without newline.
TRAINER = (
    "import sys; o = sys.stdout.buffer; "
    "o.write(b'start\\n' + b'a' * 5000 + b'\\n' + b'b' * (1 << 20) + b'\\n'"
    " + b'bad \\xff\\xfe utf-8 \\x00 nul\\n' + b'after\\n' + b'last, no newline')"
)
LINES = [b"start", b"a" * 5000, b"b" * (1 << 20), b"bad \xff\xfe utf-8 \x00 nul", b"after", b"last, no newline"]
EXPECTED = b"".join(b"node3: " + line + b"\n" for line in LINES)


@pytest.fixture(params=["debian-awk", "ubuntu-24.04-mawk"])
def awk_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """PATH with this machine's awk, or with the stand-in for Ubuntu 24.04's mawk first."""
    if request.param == "debian-awk":
        return os.environ["PATH"]
    real = shutil.which("awk")
    assert real and "mawk" in subprocess.run([real, "-W", "version"], capture_output=True, text=True).stdout
    bin_dir = tmp_path / "ubuntu-bin"
    bin_dir.mkdir()
    (bin_dir / "awk").write_text(UBUNTU_MAWK.format(python=shutil.which("python3"), awk=real))
    (bin_dir / "awk").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def stage(tmp_path: Path, path: str, *command: str, **kw: object) -> subprocess.Popen:
    env = {**os.environ, "PATH": path, "JOB_DIR": str(tmp_path / "job"), "JOB_HOSTNAME": "node3"}
    return subprocess.Popen(
        [str(REPO / "utils/launch/run_stage.sh"), "train", "300", *command],
        env=env,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **kw,  # type: ignore[arg-type]
    )


def test_the_stand_in_loses_lines_like_ubuntu_mawk_and_so_did_the_old_prefixer(awk_path):
    measured = "python3 -c \"print('a'*5000); print('after')\" | awk -W interactive '{print \"x: \" $0}'"
    old = f"python3 -c '{TRAINER.replace(chr(39), chr(34))}' | {OLD_PREFIXER}"
    env = {**os.environ, "PATH": awk_path}
    got = subprocess.run(["bash", "-c", measured], env=env, capture_output=True, check=True).stdout
    old_out = subprocess.run(["bash", "-c", old], env=env, capture_output=True, check=True).stdout
    if awk_path == os.environ["PATH"]:  # Debian 12's mawk keeps long lines and the ones after them
        assert got == b"x: " + b"a" * 5000 + b"\nx: after\n"
        # ... but not a NUL byte: the rest of that line and its newline were lost, "after" glued on
        assert old_out == EXPECTED.replace(b"\x00 nul\nnode3: ", b"")
    else:  # the measurement on Ubuntu 24.04: one 4099-byte line, nothing after it
        assert got == b"x: " + b"a" * 4096 + b"\n" and len(got.rstrip(b"\n")) == 4099
        assert old_out == b"node3: start\nnode3: " + b"a" * 4096 + b"\n"  # every later line lost


def test_the_stage_keeps_every_byte_of_long_lines_and_every_later_line(tmp_path, awk_path):
    log = tmp_path / "log"
    with log.open("wb") as f:
        rc = stage(tmp_path, awk_path, "python3", "-c", TRAINER, stdout=f).wait(timeout=120)
    assert rc == 0
    assert log.read_bytes() == EXPECTED
    assert (tmp_path / "job/.stages/train/node3").read_text().startswith("rc=0 end=")


def test_a_line_after_a_long_one_reaches_the_log_while_the_stage_still_runs(tmp_path, awk_path):
    out = tmp_path / "log"
    trainer = "print('c' * 5000); print('step 8', flush=True); import time; time.sleep(120)"
    with out.open("w") as f:
        proc = stage(tmp_path, awk_path, "python3", "-c", trainer, stdout=f)
    try:
        started = time.monotonic()
        wait_for(lambda: "node3: step 8\n" in out.read_text(), 60, "the line after the long one in the log")
        assert proc.poll() is None and time.monotonic() - started < 60
        assert out.read_text() == "node3: " + "c" * 5000 + "\nnode3: step 8\n"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_line_reaches_the_log_while_the_stage_still_runs(tmp_path):
    out = tmp_path / "log"
    with out.open("w") as f:
        proc = stage(tmp_path, os.environ["PATH"], "bash", "-c", "echo step 7; sleep 120", stdout=f)
    try:
        started = time.monotonic()
        wait_for(lambda: "node3: step 7\n" in out.read_text(), 60, "the line in the log")
        # buffered, it would come only when the command ends (120 s)
        assert proc.poll() is None and time.monotonic() - started < 60
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert (tmp_path / "job/.stages/train/node3").read_text().startswith("rc=143 end=")


# bash reads its input a byte at a time: the 1 MiB line takes it ~10 s of CPU, so the fast loop runs
# the bash prefixer on the 5,000-byte line and the NUL byte only
# (test_without_perl_and_python3_the_bash_prefixer_is_used, test_each_prefixer_writes_..._complete[bash])
# and this full case in the whole suite
@pytest.mark.parametrize(
    "with_", ["perl", "python3", pytest.param("bash", marks=(pytest.mark.slow, pytest.mark.heavy))]
)
def test_each_prefixer_keeps_every_line_and_relayed_prefixes(with_):
    data = b"".join(line + b"\n" for line in LINES[:-1]) + LINES[-1]
    data += b"\nnode5: relayed from node5\nnode9: not a node of the job\n: empty name\n"
    env = {**os.environ, "JOB_NODELIST": "node3 node5"}
    got = subprocess.run(
        [str(PREFIX_LINES), "node3", "--with", with_], input=data, env=env, capture_output=True, check=True
    ).stdout
    want = EXPECTED + b"node5: relayed from node5\nnode3: node9: not a node of the job\nnode3: : empty name\n"
    if with_ == "bash":  # bash cannot hold a NUL byte: the one byte it drops (documented)
        want = want.replace(b"\x00", b"")
    assert got == want


@pytest.mark.parametrize("with_", ["perl", "python3", "bash"])
def test_each_prefixer_writes_a_line_as_soon_as_it_is_complete(with_):
    proc = subprocess.Popen(
        [str(PREFIX_LINES), "node3", "--with", with_], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdin and proc.stdout
        proc.stdin.write(b"step 9\n")
        proc.stdin.flush()  # the input stays open: nothing more comes, as from a hung trainer
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, f"{with_}: the line did not come while the input stayed open"
        assert os.read(proc.stdout.fileno(), 100) == b"node3: step 9\n"
    finally:
        proc.kill()
        proc.wait()


def test_without_perl_and_python3_the_bash_prefixer_is_used(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("perl", "python3"):  # as on a node that has neither
        (bin_dir / name).write_text("#!/bin/sh\nexit 127\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    got = subprocess.run(
        [str(PREFIX_LINES), "node3"], input=b"x\x00y\n" + b"d" * 5000, env=env, capture_output=True, check=True
    ).stdout
    assert got == b"node3: xy\nnode3: " + b"d" * 5000 + b"\n"  # bash's: the NUL byte dropped
