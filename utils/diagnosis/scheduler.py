"""What Slurm says about a job, asked in one place for the tools that read (the job monitor) and the
one that submits (the sweep): a job's state from `scontrol show job -o ID`.

Read-only: nothing here submits or cancels.
"""

from __future__ import annotations

import re
import subprocess

GONE = "GONE"  # Slurm no longer knows the id (it ended long enough ago, or never existed)


def slurm_state(job_id: str) -> str | None:
    """JobState from `scontrol show job -o ID`; GONE when Slurm no longer knows the id; None when
    Slurm could not be asked (try again later). scontrol runs in its own session: a Ctrl-C meant
    for the caller never reaches it half-way."""
    try:
        res = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            start_new_session=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bJobState=([A-Z_]+)", res.stdout)
    if m:
        return m.group(1)
    return GONE if "Invalid job id" in res.stderr else None
