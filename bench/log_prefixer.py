#!/usr/bin/env python3
"""Usage: bench/log_prefixer.py [--lines N] [--tool perl|python3|bash|mawk|sed ...]

Throughput and CPU of the log prefixer every stage's output goes through (run_stage.sh ->
utils/launch/prefix_lines.sh), next to the awk and sed commands it replaces. Feeds N MaxText-like
absl lines (~115 bytes) through a pipe (as from a trainer: a pipe, not a file, so a tool that reads
one byte per system call shows it) into each tool writing to a file, and prints lines/s, the
tool's user+system CPU seconds per million lines, and whether every byte came out: the same N
lines, then a 5 KB and a 1 MiB line, a line of invalid UTF-8 with a NUL byte and a line after them.
"mawk" is `awk -W interactive` (what run_stage.sh ran before issue 20), "sed" is `sed -u`.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOST = "node3"
COMMANDS = {
    "perl": [str(REPO / "utils/launch/prefix_lines.sh"), HOST, "--with", "perl"],
    "python3": [str(REPO / "utils/launch/prefix_lines.sh"), HOST, "--with", "python3"],
    "bash": [str(REPO / "utils/launch/prefix_lines.sh"), HOST, "--with", "bash"],
    "mawk": ["awk", "-W", "interactive", "-v", f"h={HOST}", '{ print h ": " $0; fflush() }'],
    "sed": ["sed", "-u", f"s/^/{HOST}: /"],
}


def corpus(n: int) -> bytes:
    lines = (
        b"I1122 04:35:44.775712 140230 train.py:%d] completed step: %d, seconds: 0.638, "
        b"TFLOP/s/device: 150.6, Tokens/s/device: 12832, loss: 7.%03d\n" % (i % 900, i, i % 1000)
        for i in range(n)
    )
    return b"".join(lines) + b"a" * 5000 + b"\n" + b"b" * (1 << 20) + b"\nbad \xff\xfe \x00 nul\nafter\n"


def run(tool: str, data: bytes, tmp: Path) -> tuple[float, float, str]:
    """Seconds, CPU seconds of the tool, and whether its output is every input line prefixed."""
    src = tmp / "in"
    src.write_bytes(data)
    out = tmp / f"out-{tool}"
    env = {**os.environ, "LC_ALL": "C"}
    with src.open("rb") as f, out.open("wb") as o:
        start = time.monotonic()
        cat = subprocess.Popen(["cat"], stdin=f, stdout=subprocess.PIPE)
        proc = subprocess.Popen(COMMANDS[tool], stdin=cat.stdout, stdout=o, env=env)
        assert cat.stdout
        cat.stdout.close()
        _, _, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - start
        cat.wait()
        proc.returncode = 0
    want = b"".join(HOST.encode() + b": " + line + b"\n" for line in data.splitlines())
    got = out.read_bytes()
    kept = "yes" if got == want else "all but the NUL byte" if got == want.replace(b"\x00", b"") else "NO"
    return seconds, usage.ru_utime + usage.ru_stime, kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[2].strip())
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--tool", action="append", choices=list(COMMANDS), help="default: all")
    args = ap.parse_args()
    data = corpus(args.lines)
    load = f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    print(f"{load}; {args.lines} lines ({len(data) / 1e6:.1f} MB with the long ones) through a pipe")
    print(f"{'tool':8} {'lines/s':>10} {'CPU s/M lines':>14}  every byte kept")
    with tempfile.TemporaryDirectory() as tmp:
        for tool in args.tool or list(COMMANDS):
            seconds, cpu, whole = run(tool, data, Path(tmp))
            n = args.lines + 4
            print(f"{tool:8} {n / seconds:10,.0f} {cpu / n * 1e6:14.2f}  {whole}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
