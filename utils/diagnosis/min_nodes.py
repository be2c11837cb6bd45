"""A job's node count against its model's config header (`# Minimum nodes: N with 8x 80 GB GPUs, M with
8x 192 GB GPUs`, read by launch.config_header.read_header): the sweep refuses jobs too small to hold the
model, and investigate suggests a confirming sweep only when its jobs would.
"""

from __future__ import annotations

from pathlib import Path

from diagnosis.cli import InputError
from launch import config_header

REPO = Path(__file__).resolve().parents[2]


def min_nodes_notes(model: str, per_job: int, ignore: bool) -> list[str]:
    """Jobs of PER_JOB nodes against the `# Minimum nodes:` header of MODEL's config
    (config_header.read_header): InputError below the smallest minimum (the training state cannot
    fit on any GPU the header names) unless IGNORE; a note below the 80 GB GPUs' minimum."""
    try:
        head = config_header.read_header(REPO / "configs" / f"{model}.yml")
    except (OSError, ValueError):
        return []
    if not head.min_nodes:
        return []
    n80, n192 = head.min_nodes[0].nodes, head.minimum().nodes
    says = f"configs/{model}.yml says '# Minimum nodes: {head.min_nodes_text}'"
    if per_job < n192:
        if not ignore:
            raise InputError(
                f"{model} needs at least {n192} nodes per job and this sweep plans {per_job}-node jobs ({says}); "
                "sweep with a model that fits, or pass --ignore-min-nodes"
            )
        return [f"--ignore-min-nodes: {per_job}-node jobs, below the minimum of {n192} nodes ({says})"]
    if per_job < n80:
        return [f"{per_job}-node jobs fit only on GPUs with more than 80 GB ({says})"]
    return []
