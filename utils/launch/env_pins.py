"""What a Python environment holds against the project's pins (requirements/), for utils/setup_env.sh
and the JOB header. Standard library only: it also runs under a site's interpreter (--adopt).

  env_pins.py pth                   (the site's PYTHON) the .pth lines that show its site directories to
                                    an environment made from it; one line and exit 1 without jax/jaxlib
  env_pins.py plan REPO             what the environment lacks of the pins, by name: `nodeps SPEC`
                                    (requirements/maxtext.txt) and `deps SPEC` (requirements/tools.txt)
  env_pins.py constraints REPO      pip constraints that keep every installed distribution as it is
                                    and pin the others as requirements/constraints.txt does
  env_pins.py wheels REPO DIR SPEC...  one line naming the SPECs DIR has no wheel for, with the
                                    `pip download` command that fills it; exit 1 (0 if none is missing)
  env_pins.py finish REPO SOURCE    import what the project needs, warn where jax/jaxlib/the GPU plugin/
                                    maxtext differ from the pins, write <env>/.mst-versions, print the
                                    accelerator (cpu|cuda|rocm, from the GPU plugin found)
  env_pins.py versions              the versions line (the record, or read now when there is none)
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import re
import sys
from pathlib import Path

RECORD = ".mst-versions"
# the modules the trainer, the launcher's checks and the RAY=1 exporter import
NEEDED_MODULES = ("jax", "jaxlib", "maxtext", "yaml", "requests", "prometheus_client", "ray")
PEP440 = re.compile(r"^(\d+!)?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9.]+)?$", re.I)
PLUGIN = re.compile(r"^jax[-_](cuda|rocm)(\d+)[-_]plugin$")


def norm(name: str) -> str:
    """A distribution name as PEP 503 normalizes it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> list[tuple[str, str, str]]:
    """The `name[extras]==version` lines of a requirements file: (normalized name, version, the line)."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)$", line)
        if m:
            out.append((norm(m.group(1)), m.group(3), line))
    return out


def installed() -> dict[str, str]:
    """Every distribution this interpreter sees (the first one on sys.path wins, as imports do)."""
    found: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and norm(name) not in found:
            found[norm(name)] = dist.version
    return found


def gpu_plugin(have: dict[str, str]) -> tuple[str, str, str] | None:
    """(accelerator, distribution, version) of JAX's GPU plugin, or of a jaxlib built for a GPU."""
    for name, version in sorted(have.items()):
        m = PLUGIN.match(name)
        if m:
            return m.group(1), name, version
    local = have.get("jaxlib", "").partition("+")[2]
    for acc in ("cuda", "rocm"):
        if acc in local:
            return acc, "jaxlib", have["jaxlib"]
    return None


def versions_line(have: dict[str, str]) -> str:
    plugin = gpu_plugin(have)
    fields = {
        "jax": have.get("jax", "none"),
        "jaxlib": have.get("jaxlib", "none"),
        "plugin": f"{plugin[1]}=={plugin[2]}" if plugin and plugin[1] != "jaxlib" else "none",
        "maxtext": have.get("maxtext", "none"),
        "python": ".".join(map(str, sys.version_info[:3])),
    }
    return " ".join(f"{k}={v}" for k, v in fields.items())


def cmd_pth() -> int:
    have = installed()
    lacking = [n for n in ("jax", "jaxlib") if n not in have]
    if lacking:
        print(
            f"setup_env.sh: --adopt {sys.executable}: it has no {' or '.join(lacking)}; adopt an interpreter "
            "with JAX for the node's GPUs (e.g. the site's module or the image's python3), or make the pinned "
            "environment without --adopt",
            file=sys.stderr,
        )
        return 1
    for d in sys.path:
        if Path(d).name in ("site-packages", "dist-packages") and Path(d).is_dir():
            print(f"import site; site.addsitedir({d!r})")
    return 0


def cmd_plan(repo: Path) -> int:
    have = installed()
    for kind, file in (("nodeps", "maxtext.txt"), ("deps", "tools.txt")):
        for name, _, line in pins(repo / "requirements" / file):
            if name not in have:
                print(kind, line)
    return 0


def cmd_constraints(repo: Path) -> int:
    have = installed()
    for name, version in sorted(have.items()):
        if PEP440.match(version):  # pip refuses the whole file over one odd (distro) version
            print(f"{name}=={version}")
    for name, _, line in pins(repo / "requirements" / "constraints.txt"):
        if name not in have:
            print(line)
    return 0


def wheel_key(filename: str) -> tuple[str, str] | None:
    """(normalized name, version) of a wheel or sdist file name."""
    m = re.match(r"^(.+?)-([^-]+?)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$", filename) or re.match(
        r"^(.+)-([^-]+)\.(tar\.gz|zip)$", filename
    )
    return (norm(m.group(1)), m.group(2)) if m else None


def cmd_wheels(repo: Path, wheelhouse: Path, specs: list[str]) -> int:
    there = {wheel_key(p.name) for p in wheelhouse.iterdir()} if wheelhouse.is_dir() else set()
    pinned = {name: line for name, _, line in pins(repo / "requirements" / "constraints.txt")}
    missing = []
    for spec in specs:
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?(?:==(\S+))?", spec.strip())
        if not m:
            continue
        name, version = norm(m.group(1)), m.group(3)
        if version is None:  # a dependency pip asked for: the version constraints.txt pins
            line = pinned.get(name, name)
            version = line.partition("==")[2] or None
        if version is not None and (name, version) in there:
            continue
        missing.append(f"{name}=={version}" if version else name)
    if not missing:
        return 0
    py = "python{}.{}".format(*sys.version_info[:2])
    print(
        f"setup_env.sh: the wheelhouse {wheelhouse} has no wheel for {', '.join(missing)}; on a machine with "
        f"network and the same Python ({py}) and platform, run: {py} -m pip download --dest {wheelhouse} "
        f"--no-deps {' '.join(missing)}",
        file=sys.stderr,
    )
    return 1


def cmd_finish(repo: Path, source: str) -> int:
    for mod in NEEDED_MODULES:
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any failure to import is the one line
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(f"setup_env.sh: {sys.prefix} cannot import {mod} ({why}); the project needs it", file=sys.stderr)
            return 1
    have = installed()
    reqs = repo / "requirements"
    want = {name: (v, line) for name, v, line in pins(reqs / "maxtext.txt") if name in ("jax", "jaxlib", "maxtext")}
    plugin = gpu_plugin(have)
    if plugin and plugin[1] != "jaxlib":
        acc_pins = [p for p in pins(reqs / "accelerators" / f"{plugin[0]}.txt") if p[0].endswith("-plugin")]
        if acc_pins:
            want[plugin[1]] = acc_pins[0][1:]
    for name, (version, line) in want.items():
        if have.get(name) != version:
            print(
                f"setup_env.sh: warning: {name} {have.get(name, 'none')} differs from the pin {line}; kept "
                "(the environment uses what the adopted interpreter has)",
                file=sys.stderr,
            )
    (Path(sys.prefix) / RECORD).write_text(f"{versions_line(have)} source={source}\n")
    print(plugin[0] if plugin else "cpu")
    return 0


def cmd_versions() -> int:
    record = Path(sys.prefix) / RECORD
    line = record.read_text().splitlines()[0] if record.is_file() else ""
    print(line or versions_line(installed()))
    return 0


def main(argv: list[str]) -> int:
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "pth" and not args:
        return cmd_pth()
    if cmd in ("plan", "constraints") and len(args) == 1:
        return cmd_plan(Path(args[0])) if cmd == "plan" else cmd_constraints(Path(args[0]))
    if cmd == "wheels" and len(args) >= 2:
        return cmd_wheels(Path(args[0]), Path(args[1]), args[2:])
    if cmd == "finish" and len(args) == 2:
        return cmd_finish(Path(args[0]), args[1])
    if cmd == "versions" and not args:
        return cmd_versions()
    print("env_pins.py: expected pth, plan REPO, constraints REPO, wheels REPO DIR SPEC..., finish REPO SOURCE "
          "or versions (see its docstring)", file=sys.stderr)  # fmt: skip
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
