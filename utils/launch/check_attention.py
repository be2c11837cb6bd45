#!/usr/bin/env python3
"""Usage: check_attention.py CONFIG.yml   (with the project's utils/ on the import path: PYTHONPATH)

Can this interpreter run the attention kernel the job asks for? Run by the interpreter that will run
MaxText (preflight runs it through _container.sh on every node, natively or in the node's image).
The kernel is the config's `attention` value, or the last attention=VALUE line of the overrides in
the TRAIN_OVERRIDES environment variable (MaxText's default, autoselected, when neither sets it);
the modules it needs are utils/launch/attention_kernels.tsv's. Each module is looked up with
importlib's finders, without running any package's code (Transformer Engine's start-up loads CUDA
libraries: not here), so it takes well under a second on any node.

Prints "attention: KERNEL: ..." on stdout, exit 0 when the modules are there; one line
"attention: FAILED: ..." with the kernel asked for, what is missing and the two ways out, exit 1;
exit 2 on bad usage or a config that cannot be read.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import NamedTuple

import yaml

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_kernels.tsv")
MAXTEXT_DEFAULT = "autoselected"  # maxtext/configs/base.yml


class Kernel(NamedTuple):
    """A row of attention_kernels.tsv."""

    modules: tuple[str, ...]
    what: str
    get: str


def load_table(path: str = TABLE) -> dict[str, Kernel]:
    """attention value -> its row (raises ValueError on a malformed row)."""
    table: dict[str, Kernel] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 4 or not cols[0]:
                raise ValueError(f"{path}:{n}: expected 4 tab-separated columns: attention modules kernel get")
            modules = () if cols[1] == "-" else tuple(cols[1].split())
            table[cols[0]] = Kernel(modules, cols[2], cols[3])
    return table


def requested(config_path: str, overrides: str) -> tuple[str, str]:
    """(attention value, where it comes from): the last attention= override, else the config's key,
    else MaxText's default (raises OSError or yaml.YAMLError when the config cannot be read)."""
    # the config and override reader, imported here: --help needs no import path
    from launch.check_config import load_yaml, parse_value  # noqa: PLC0415

    value, source = None, ""
    for line in overrides.split("\n"):
        key, eq, raw = line.partition("=")
        if eq and key.strip() == "attention":
            value, source = parse_value(raw), f"the override attention={raw}"
    if value is None:
        data = load_yaml(config_path)
        if isinstance(data, dict) and "attention" in data:
            value, source = data["attention"], f"configs/{os.path.basename(config_path)}"
    if value is None:
        return MAXTEXT_DEFAULT, f"MaxText's default (configs/{os.path.basename(config_path)} sets no attention)"
    return str(value), source


def module_present(name: str) -> bool:
    """True when NAME (a.b.c) can be found on sys.path; no package's __init__ runs."""
    parts = name.split(".")
    spec = importlib.util.find_spec(parts[0])  # a top-level name: found, not imported
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    return spec is not None


def jaxlib_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return "(none installed)"


def check(config_path: str, overrides: str, table: dict[str, Kernel] | None = None) -> tuple[bool, str]:
    """(ok, the line to print)."""
    table = load_table() if table is None else table
    value, source = requested(config_path, overrides)
    if value not in table:
        return False, (
            f"attention: FAILED: {source} asks for attention={value}, which MaxText does not know "
            f"(one of {', '.join(table)}); set attention=dot_product or another of those"
        )
    kernel = table[value]
    missing = [m for m in kernel.modules if not module_present(m)]
    where = f"{sys.executable} on {os.environ.get('JOB_HOSTNAME') or os.uname().nodename}"
    if missing:
        get = kernel.get.replace("JAXLIB", jaxlib_version())
        return False, (
            f"attention: FAILED: {source} asks for attention={value} ({kernel.what}), which needs "
            f"{' and '.join(missing)}, not installed for {where}; run with the override "
            f"`-- attention=dot_product` (plain XLA attention: slower, more memory), or with {get}"
        )
    needs = f"{', '.join(kernel.modules)} found" if kernel.modules else "needs no extra module"
    return True, f"attention: {value} ({kernel.what}, from {source}): {needs} for {where}"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) != 2:
        print("check_attention.py: expected one argument, the config (CONFIG.yml); see --help", file=sys.stderr)
        return 2
    try:
        ok, line = check(argv[1], os.environ.get("TRAIN_OVERRIDES", ""))
    except OSError as e:
        print(f"attention: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"attention: cannot check the attention kernel: {e}", file=sys.stderr)
        return 2
    except yaml.YAMLError as e:
        print(f"attention: cannot read {argv[1]}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
