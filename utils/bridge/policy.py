"""Which commands the host bridge runs, with which arguments, and how (docs/host-bridge.md#allowlist).

`plan(argv, policy)` returns the `Plan` to run (the argv as it will be executed, without a shell,
and its time limit) or raises `Refused` with a reason of one line. It knows nothing of sockets or
processes; the server applies the plan (and, for scancel, the ownership check that needs squeue).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from bridge import paths

REPO = Path(__file__).resolve().parents[2]

SLURM_QUERIES = ("squeue", "sacct", "sinfo")
# the repository's read-only tools (utils/NAME) and what each may do
TOOLS = ("triage.py", "diagnose.py", "perf.py", "investigate.py", "prometheus.sh")
PROMETHEUS_SUBCOMMANDS = ("list", "query")
SCONTROL_FLAGS = ("-d", "--details", "-o", "--oneliner", "--json", "--yaml", "-a", "--all")
SCONTROL_ENTITIES = (
    "job",
    "node",
    "partition",
    "reservation",
    "step",
    "config",
    "hostnames",
    "hostlist",
    "hostlistsorted",
    "topology",
    "licenses",
)
# seconds, by kind; the config's timeout_s replaces them all
TIMEOUTS = {"slurm": 60.0, "tool": 900.0, "submit": 300.0, "scancel": 60.0}
# characters a shell would act on: no argument may hold one (PromQL: see PROMQL_BAD)
SHELL_CHARS = set(";|&$`<>\\'\"(){}*?!~")
PROMQL_BAD = set(";$`")
JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")
MAX_ARGS = 256
MAX_ARG_LEN = 4096


class BridgeError(Exception):
    """Set-up or use that cannot go on (no bridge, a bad config): one line, exit 2."""


class Refused(Exception):
    """The request is not run; the message (one line) says why."""


@dataclass
class Policy:
    """What this bridge allows: the owner's settings (server.Config) turned into rules."""

    owner: str  # the owner's user name (scancel --user)
    roots: list[Path] = field(default_factory=lambda: [REPO])  # where path arguments may point
    allow_submit: bool = False
    allow_scancel: bool = False
    timeout_s: float | None = None
    repo: Path = REPO
    # where the tools look jobs up unless given --workspace (their $JOB_WORKSPACE, else <repo>/outputs)
    workspace: Path = field(default_factory=lambda: Path(os.environ.get("JOB_WORKSPACE") or REPO / "outputs"))


@dataclass
class Plan:
    argv: list[str]  # what runs (argv[0] a command on PATH or a file of the repository)
    kind: str  # slurm, tool, submit, scancel
    timeout_s: float
    runs_repo_code: bool  # a file of the repository runs: the code check applies
    cancel_ids: list[str] = field(default_factory=list)  # scancel: jobs whose owner must be checked


def check_chars(arg: str, bad: set[str] = SHELL_CHARS) -> None:
    for c in arg:
        if ord(c) < 0x20 or ord(c) == 0x7F:
            raise Refused(f"argument {arg!r} holds a control character ({ord(c):#04x})")
        if c in bad:
            raise Refused(f"argument {arg!r} holds the shell metacharacter {c!r} (no shell runs here; not allowed)")


def path_values(arg: str, repo: Path = REPO) -> list[str]:
    """The parts of ARG that name a file: ARG itself, or the value of --opt=VALUE / KEY=VALUE,
    when it looks like a path (/x, ./x, ../x, a/b; not a URL such as gs://b/x) or names something
    that exists in the tools' working directory, the repository (`--workspace NAME`, a bare NAME)."""
    values = [arg]
    if "=" in arg:
        values.append(arg.split("=", 1)[1])
    out = []
    for v in values:
        if v.startswith("-") and v is arg:
            continue
        looks = v in (".", "..") or v.startswith(("/", "./", "../")) or ("/" in v and "://" not in v)
        if looks or (v and "://" not in v and os.path.lexists(repo / v)):
            out.append(v)
    return out


def tool_workspace(args: list[str], policy: Policy) -> Path:
    """The workspace the tool looks a job up in: its --workspace (as the tool reads it, from the
    repository), else the bridge's (policy.workspace)."""
    ws = policy.workspace
    for i, a in enumerate(args):
        if a == "--workspace" and i + 1 < len(args):
            ws = policy.repo / args[i + 1]
        elif a.startswith("--workspace="):
            ws = policy.repo / a.split("=", 1)[1]
    return Path(os.path.realpath(ws))


def job_entries(word: str, workspace: Path) -> list[Path]:
    """What a job id or name WORD names in WORKSPACE (diagnosis/locate.py's lookup): <name>, <name>.log,
    and for an id every <id>-JAX-* entry."""
    if not word or "/" in word or word in (".", "..") or word.startswith("-"):
        return []
    key = word.split("=", 1)[-1].removesuffix(".log")
    if not key or "/" in key:
        return []
    found = [workspace / n for n in (key, f"{key}.log") if os.path.lexists(workspace / n)]
    if "-JAX-" not in key:
        try:
            with os.scandir(workspace) as entries:
                found += [Path(e.path) for e in entries if e.name.startswith(f"{key}-JAX-")]
        except OSError:
            pass
    return found


def check_paths(args: list[str], policy: Policy) -> None:
    """Every path ARGS name, and every workspace entry a job id or name among them names, must lead
    (links followed, each link ours or root's) into the repository, a workspace or a config path."""
    roots = [Path(os.path.realpath(r)) for r in policy.roots]
    where = ", ".join(str(r) for r in roots)

    def confine(value: str | Path, what: str) -> None:
        try:
            paths.confine(value, roots, what, base=policy.repo)
        except paths.Outside as e:
            if e.link:
                raise Refused(str(e)) from None  # names the link, its owner and its target
            leads = f"; it leads to {e.real} ({paths.describe(e.real)})" if e.real != str(value) else ""
            raise Refused(f"{what} {str(value)!r} is outside the repository and workspaces ({where}){leads}") from None

    for arg in args:
        for value in path_values(arg, policy.repo):
            confine(value, "path")
    workspace = tool_workspace(args, policy)
    for arg in args:
        for entry in job_entries(arg, workspace):
            confine(entry, "job")


def tool_name(word: str, repo: Path) -> str | None:
    """utils/NAME, ./utils/NAME, <repo>/utils/NAME or NAME for a tool; submit.sh likewise."""
    for name in (*TOOLS, "submit.sh"):
        home = repo / "submit.sh" if name == "submit.sh" else repo / "utils" / name
        if word == name or ("/" in word and os.path.realpath(repo / word) == os.path.realpath(home)):
            return name if home.is_file() else None
    return None


def plan(argv: list[str], policy: Policy) -> Plan:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Refused("argv must be a non-empty list of strings")
    if len(argv) > MAX_ARGS or any(len(a) > MAX_ARG_LEN for a in argv):
        raise Refused(f"at most {MAX_ARGS} arguments of {MAX_ARG_LEN} characters each")
    cmd, args = argv[0], argv[1:]
    check_chars(cmd)

    def limit(kind: str) -> float:
        return policy.timeout_s or TIMEOUTS[kind]

    if cmd in SLURM_QUERIES:
        for a in args:
            check_chars(a)
        return Plan([cmd, *args], "slurm", limit("slurm"), False)
    if cmd == "scontrol":
        return Plan(["scontrol", *scontrol_args(args)], "slurm", limit("slurm"), False)
    if cmd == "scancel":
        if not policy.allow_scancel:
            raise Refused("scancel is disabled (the owner enables it with allow_scancel = true in the bridge's config)")
        bad = [a for a in args if not JOB_ID.match(a)]
        if not args or bad:
            raise Refused("scancel takes job ids only (digits, ARRAYID_TASK), no options: " + " ".join(bad or ["none"]))
        return Plan(["scancel", f"--user={policy.owner}", *args], "scancel", limit("scancel"), False, list(args))
    name = tool_name(cmd, policy.repo)
    if name is None:
        tools = [f"utils/{t}" for t in TOOLS if (policy.repo / "utils" / t).is_file()]
        allowed = ", ".join([*SLURM_QUERIES, "scontrol show", *tools, "submit.sh --dry-run"])
        raise Refused(f"{cmd!r} is not on the allowlist ({allowed})")
    if name == "submit.sh":
        head = args[: args.index("--")] if "--" in args else args
        for a in args:
            check_chars(a)
        check_paths(args, policy)
        dry = "--dry-run" in head or head in (["--help"], ["-h"])
        if not dry and not policy.allow_submit:
            raise Refused("submit.sh without --dry-run is disabled (the owner enables it with allow_submit = true)")
        return Plan([str(policy.repo / "submit.sh"), *args], "submit", limit("submit"), True)
    if name == "prometheus.sh":
        promql = prometheus_args(args)
        for i, a in enumerate(args):
            check_chars(a, PROMQL_BAD if i == promql else SHELL_CHARS)
        check_paths([a for i, a in enumerate(args) if i != promql], policy)
    else:
        for a in args:
            check_chars(a)
        check_paths(args, policy)
    return Plan([str(policy.repo / "utils" / name), *args], "tool", limit("tool"), True)


def scontrol_args(args: list[str]) -> list[str]:
    """scontrol: `show ENTITY [NAME]` with the read-only flags, or --help/--version alone."""
    if args in (["--help"], ["-h"], ["--version"], ["-V"], ["--usage"]):
        return args
    words = []
    for a in args:
        check_chars(a)
        if a.startswith("-"):
            if a not in SCONTROL_FLAGS:
                raise Refused(f"scontrol flag {a!r} is not allowed (allowed: {' '.join(SCONTROL_FLAGS)})")
        else:
            words.append(a)
    if len(words) not in (2, 3) or words[0] != "show":
        raise Refused("scontrol: only `scontrol [FLAGS] show ENTITY [NAME]` is allowed")
    if words[1] not in SCONTROL_ENTITIES:
        raise Refused(f"scontrol show {words[1]!r} is not allowed (allowed: {' '.join(SCONTROL_ENTITIES)})")
    return args


def prometheus_args(args: list[str]) -> int | None:
    """prometheus.sh: list [WORKSPACE] or query JOB PROMQL [--time T | --range S E STEP] (or
    --help). Returns the index of the PromQL argument in ARGS (its own character rule), if any."""
    if not args or args[0] in ("--help", "-h"):
        return None
    if args[0] not in PROMETHEUS_SUBCOMMANDS:
        raise Refused(f"prometheus.sh {args[0]!r} is not allowed (allowed: list, query)")
    if args[0] == "list":
        return None
    positional, i, rest = [], 1, False
    while i < len(args):
        a = args[i]
        if not rest and a == "--":
            rest = True
        elif not rest and a in ("--time", "--range"):
            i += 1 if a == "--time" else 3
        elif rest or not a.startswith("-"):
            positional.append(i)
        i += 1
    return positional[1] if len(positional) > 1 else None
