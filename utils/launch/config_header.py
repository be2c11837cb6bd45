#!/usr/bin/env python3
"""Usage: config_header.py aliases CONFIG_DIR
       config_header.py minimum CONFIG.yml [GPU_MEMORY_GB]

The comment header of a model config (configs/*.yml; docs/configs.md "The config header"), read in
this one place (standard library only, any python3: the launchers call it before the project's
Python environment exists):
  # Parameters: 315.7B (about 83B active per token)
  # Minimum nodes: 16 with 8x 80 GB GPUs, 8 with 8x 192 GB GPUs
  # Aliases: 70b
aliases   prints "ALIAS MODEL" per alias the configs in CONFIG_DIR declare (the short names
          utils/launch/lib.sh resolve_model takes); one line on stderr and status 1 when two configs
          declare one alias, an alias is a config's own name, or an Aliases line is malformed.
minimum   prints "NODES<TAB>GPUS<TAB>WHY" for the config: the minimum node count that applies
          (minimum() below: the fewest of the header's, or the one for GPUs of GPU_MEMORY_GB,
          SITE_GPU_MEMORY_GB), its GPUs per node, and the header's words for the reasons;
          nothing when the header names no minimum (a CPU config); status 1 and one line on a
          malformed Minimum nodes line or an unreadable file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

PARAMS = re.compile(
    r"^# Parameters: ([0-9]+(?:\.[0-9]+)?)B(?: \(about ([0-9]+(?:\.[0-9]+)?)B active per token\))?", re.M
)
NODES_LINE = re.compile(r"^# Minimum nodes:(.*)$", re.M)
NODES_ENTRY = re.compile(r"([1-9][0-9]*) with ([1-9][0-9]*)x ([1-9][0-9]*) GB GPUs")
ALIASES_LINE = re.compile(r"^# Aliases:(.*)$", re.M)
ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NODES_SHAPE = "'# Minimum nodes: N with Gx M GB GPUs[, N with Gx M GB GPUs ...]'"


class HeaderError(ValueError):
    """A header line that does not say what its documented shape says; one line."""


class NodeMinimum(NamedTuple):
    """One entry of the Minimum nodes line: NODES nodes with GPUS GPUs of GPU_GB GB each."""

    nodes: int
    gpus: int
    gpu_gb: int

    def __str__(self) -> str:
        return f"{self.nodes} with {self.gpus}x {self.gpu_gb} GB GPUs"


class ConfigHeader(NamedTuple):
    """What a config's comment header says; None or empty where it says nothing."""

    params_b: float | None  # parameters, billions
    active_b: float | None  # parameters active per token (MoE), billions
    min_nodes: tuple[NodeMinimum, ...]  # the Minimum nodes line's entries, in its order
    aliases: tuple[str, ...]  # short names of the config (resolve_model)

    def minimum(self, gpu_gb: int | None = None) -> NodeMinimum | None:
        """The minimum that applies: without GPU_GB the fewest nodes of the header's entries (a
        job below it fits on none of the GPUs the header names); with GPU_GB (the site's GPUs,
        SITE_GPU_MEMORY_GB) the entry of the largest GPUs not larger than those, or, on GPUs
        smaller than every entry's, the entry of the smallest GPUs (a lower bound)."""
        if not self.min_nodes:
            return None
        if gpu_gb is None:
            return min(self.min_nodes, key=lambda m: (m.nodes, -m.gpu_gb))
        fitting = [m for m in self.min_nodes if m.gpu_gb <= gpu_gb]
        if fitting:
            return max(fitting, key=lambda m: (m.gpu_gb, -m.nodes))
        return min(self.min_nodes, key=lambda m: (m.gpu_gb, -m.nodes))

    @property
    def min_nodes_text(self) -> str:
        """The Minimum nodes line's entries as the header writes them."""
        return ", ".join(str(m) for m in self.min_nodes)


def parse_header(text: str, name: str = "config") -> ConfigHeader:
    """The header in TEXT; raises HeaderError on a Minimum nodes or Aliases line of another shape."""
    params = PARAMS.search(text)
    nodes: tuple[NodeMinimum, ...] = ()
    line = NODES_LINE.search(text)
    if line:
        parts = [p.strip() for p in line.group(1).split(",")]
        found = [NODES_ENTRY.fullmatch(p) for p in parts]
        if not parts or not all(found):
            raise HeaderError(f"{name}: '# Minimum nodes:{line.group(1)}' is not of the shape {NODES_SHAPE}")
        nodes = tuple(NodeMinimum(*(int(g) for g in m.groups())) for m in found if m)
    aliases: tuple[str, ...] = ()
    line = ALIASES_LINE.search(text)
    if line:
        aliases = tuple(re.split(r"[\s,]+", line.group(1).strip()))
        if not all(ALIAS.fullmatch(a) for a in aliases):
            raise HeaderError(
                f"{name}: '# Aliases:{line.group(1)}' is not a list of short names "
                "(letters, digits, . _ -, separated by spaces), e.g. '# Aliases: 70b'"
            )
    return ConfigHeader(
        float(params.group(1)) if params else None,
        float(params.group(2)) if params and params.group(2) else None,
        nodes,
        aliases,
    )


def read_header(path: str | Path) -> ConfigHeader:
    """The header of the config at PATH (raises OSError when it cannot be read, HeaderError when
    a line is malformed)."""
    p = Path(path)
    return parse_header(p.read_text(encoding="utf-8"), f"configs/{p.name}")


def read_aliases(config_dir: str | Path) -> dict[str, str]:
    """{alias: model} over the configs of CONFIG_DIR; HeaderError on a clash."""
    configs = sorted(Path(config_dir).glob("*.yml"))
    names = {p.stem for p in configs}
    table: dict[str, str] = {}
    for p in configs:
        for alias in read_header(p).aliases:
            if alias in names:
                raise HeaderError(f"configs/{p.name}: alias '{alias}' is the name of configs/{alias}.yml; drop it")
            if alias in table and table[alias] != p.stem:
                raise HeaderError(
                    f"alias '{alias}' is declared by configs/{table[alias]}.yml and configs/{p.name}; keep it in one"
                )
            table[alias] = p.stem
    return table


def minimum_line(path: str | Path, gpu_gb: int | None) -> str:
    """The `minimum` mode's output line (empty when the header names no minimum)."""
    head = read_header(path)
    m = head.minimum(gpu_gb)
    if m is None:
        return ""
    says = f"configs/{Path(path).name} says '# Minimum nodes: {head.min_nodes_text}'"
    if gpu_gb is None:
        why = f"{says}; the fewest, on the largest GPUs: SITE_GPU_MEMORY_GB picks by your GPUs' memory"
    elif m.gpu_gb <= gpu_gb:
        why = f"{says}; {m} for SITE_GPU_MEMORY_GB={gpu_gb}"
    else:
        why = f"{says}; at least {m} on GPUs of SITE_GPU_MEMORY_GB={gpu_gb}, smaller than any it names"
    return f"{m.nodes}\t{m.gpus}\t{why}"


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    try:
        if len(argv) == 2 and argv[0] == "aliases":
            for alias, model in sorted(read_aliases(argv[1]).items()):
                print(alias, model)
            return 0
        if len(argv) in (2, 3) and argv[0] == "minimum":
            gpu_gb = None
            if len(argv) == 3:
                if not re.fullmatch(r"[1-9][0-9]{0,5}", argv[2]):
                    raise HeaderError(f"GPU memory '{argv[2]}' is not a whole number of GB (e.g. 192)")
                gpu_gb = int(argv[2])
            line = minimum_line(argv[1], gpu_gb)
            if line:
                print(line)
            return 0
    except HeaderError as e:
        print(f"config_header.py: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"config_header.py: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    print(__doc__.split("\n\n")[0], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
