"""`call`: what an agent runs (in a container or not) to have the host run one command.

Sends {"argv": [...]} to the bridge's socket and prints the answer: the command's stdout and
stderr as they were, then exits with the command's status. The bridge's own outcomes have the
exit codes podman uses for its own: 125 the bridge cannot be reached or answered nonsense, 126
the bridge refused the command (the reason on stderr); 124 is a command killed at its time
limit. Runs under Python 3.8 or newer.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from bridge.policy import BridgeError

UNREACHABLE = 125
REFUSED = 126
SOCKET = "sock"
MAX_ANSWER = 256 << 20


def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")) / "maxtext-slurm"


def address_file() -> Path:
    """Where `serve` writes its directory's path (0600) for `call` and `stop` to read."""
    return config_home() / "host-bridge"


def find_dir(given: str | None) -> Path:
    """The bridge's directory: --dir, else $MST_HOST_BRIDGE, else the one the last `serve` wrote."""
    if given:
        return Path(given)
    if os.environ.get("MST_HOST_BRIDGE"):
        return Path(os.environ["MST_HOST_BRIDGE"])
    try:
        text = address_file().read_text().strip()
    except OSError:
        text = ""
    if not text:
        raise BridgeError(
            "which bridge? set MST_HOST_BRIDGE=DIR or give --dir DIR (DIR: what `utils/host_bridge.py serve` "
            f"printed on the host); {address_file()} does not name one"
        )
    return Path(text)


def call(directory: Path, argv: list[str], timeout: float) -> int:
    path = directory / SOCKET
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        try:
            sock.sendall(json.dumps({"argv": argv}).encode() + b"\n")
        except BrokenPipeError:
            pass  # the bridge answered (a refusal) before it read all: the answer is there to read
        buf = bytearray()
        while len(buf) <= MAX_ANSWER:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    except OSError as e:
        print(f"host_bridge: cannot reach the bridge at {path}: {e.strerror or e}", file=sys.stderr)
        return UNREACHABLE
    finally:
        sock.close()
    try:
        answer = json.loads(bytes(buf))
        if answer.get("refused"):
            print(f"host_bridge: refused: {answer['refused']}", file=sys.stderr)
            return REFUSED
        code = int(answer["exit"])
    except (ValueError, KeyError, TypeError, AttributeError):
        print(f"host_bridge: the bridge at {path} gave no answer (stopped while it ran?)", file=sys.stderr)
        return UNREACHABLE
    for stream, text in ((sys.stdout, answer.get("stdout", "")), (sys.stderr, answer.get("stderr", ""))):
        try:
            stream.buffer.write(text.encode("utf-8", "surrogateescape"))
            stream.flush()
        except BrokenPipeError:
            pass
    return code
