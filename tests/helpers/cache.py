"""Where the tests keep what is a pure function of its inputs (a shellcheck pass, backfilled TSDB blocks,
the jobs' compiled programs: JAX's compilation cache, which keys them itself), under the hash of those
inputs: $MST_TEST_CACHE/NAME, default $XDG_CACHE_HOME (else ~/.cache)/maxtext-slurm/NAME.
MST_TEST_CACHE=off keeps nothing: every run does all the work again."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str) -> Path | None:
    """The cache dir for NAME (not created), or None when MST_TEST_CACHE=off."""
    root = os.environ.get("MST_TEST_CACHE", "")
    if root == "off":
        return None
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "maxtext-slurm"
    return base / name
