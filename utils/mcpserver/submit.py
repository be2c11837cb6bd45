"""The write tool `submit`, listed only when the owner's config allows it (config.py).

It runs `submit.sh MODEL [ARGS...] --dry-run` from the repository and returns what submit.sh checked
and would submit (secret values are <redacted>, as submit.sh prints them). This server submits
nothing: `confirm: true` is refused with the command to run by hand.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError

from mcpserver.jobs import MAX_CHARS, redact, redact_arg

REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "submit.sh"
MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9._-]+)?")
MAX_OUTPUT_LINES = 200


def submit(model: str, args: list[str] | None = None, confirm: bool = False) -> dict[str, Any]:
    if not MODEL.fullmatch(model):
        raise ToolError(f"submit: '{model}' is not a model name (MODEL[:TAG], e.g. llama2-7b:try1)")
    extra = [a for a in args or [] if a != "--dry-run"]
    argv = [str(SUBMIT), model, *extra]
    shown = shlex.join(map(redact_arg, argv))  # a secret given as an argument is not echoed back
    if confirm:
        raise ToolError(f"submit: this server submits dry runs only; to submit, run it yourself: {shown}")
    dry = [str(SUBMIT), model, "--dry-run", *extra]  # before any `--`: after it, arguments are overrides
    try:
        res = subprocess.run(dry, cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolError(f"submit: submit.sh --dry-run did not finish: {e}") from None
    lines = [redact(ln)[:MAX_CHARS] for ln in (res.stdout + res.stderr).splitlines()]
    return {
        "command": shlex.join(map(redact_arg, dry)),
        "exit_code": res.returncode,
        "ok": res.returncode == 0,
        "output": lines[:MAX_OUTPUT_LINES],
        "truncated": len(lines) > MAX_OUTPUT_LINES,
        "submitted": False,
        "note": "dry run only: this server never submits; run the command without --dry-run yourself",
    }
