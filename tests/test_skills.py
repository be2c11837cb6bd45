"""The agent skills in skills/: their form, their links, and every command they quote.

Form: each skills/*/SKILL.md has YAML front matter with `name` (= its directory) and a
`description`, and stays under 400 lines; every relative link (and #anchor) in skills/**/*.md,
CLAUDE.md and AGENTS.md points at something that exists; every skill CLAUDE.md routes to exists
and every skill is routed to.

Commands: every ```bash block of skills/**/*.md is its own test (id: file#block number, counted
from 1 over the file's bash blocks). It runs as written with `bash -euo pipefail` from the
repository root and must exit 0 with no "Traceback" on stderr. The variables the skills tell the
agent to set point at jobs of the incident corpus (tests/helpers/corpus.py), built once per module (the
thread_leak pair when a block first needs it):

  JOB            the job dir of an `rdma_retransmits` incident (a completed RAY=1 job whose
                 throughput drops; diagnose.py says `network`); for blocks that use `--vs`, a
                 `thread_leak` incident; for `sweep.py regress` blocks, a made-up `tiny` baseline
                 job with a recorded submit command (regress needs one, and MODEL must be its model).
                 Blocks of the job-log-triage skill run a second time with JOB = a failed
                 multi-node job without metrics (tests/helpers/logcorpus.py): triage exits 0 for it too.
                 Blocks of the coredump-debug skill get a segfault job (tests/helpers/logcorpus.py) whose
                 crashed host holds a real core: the venv's Python, crashed by SIGSEGV in the
                 core directory utils/launch/coredump.sh prepared (with its context.txt).
  OTHER_JOB      the `thread_leak` incident's clean twin (`Incident.vs`)
  MODEL          tiny
  JOB_WORKSPACE  the corpus workspace, so job ids resolve; TMPDIR a scratch directory

Slurm is stubbed on PATH: `sinfo` lists the incident's hosts (idle); `sbatch`, `srun`, `salloc`,
`scancel`, `scontrol` and `squeue` refuse and exit 97, so no block can submit, cancel or reach a
real cluster.

Blocks that would submit jobs (a `utils/sweep.py` batch/nodes/bisect/regress/models/resume or a
`submit.sh` line without `--dry-run`) are never run. Instead their test asserts that the same
file has a --dry-run twin: a block with the same text but `--dry-run` on each such line (ignoring
`--json` and a trailing `| jq ...`); the twin is run as its own test. So every sweep command a
skill quotes is tested in its --dry-run form. Blocks that are not commands (sample output) use
```json or ```text and are not run. No bash block may kill, cancel or submit (`kill`, `pkill`,
`scancel`, `sbatch`, ...), nor start a Prometheus on a TSDB directory itself; blocks are also
checked with shellcheck (warnings and errors) when it is installed. Running every block must
leave the corpus TSDBs unchanged (the skills' rule: read a copy, never the saved TSDB).

Blocks of the host-commands skill run with MST_HOST_BRIDGE naming a real bridge
(utils/host_bridge.py serve) that serves the corpus workspace; its own PATH leads with stand-ins
for squeue, sacct and scontrol that answer (read-only queries), ahead of the refusing ones.

Blocks that run utils/diagnose.py (each serves a job's TSDB through a fresh Prometheus) or pytest
(the model-config-guide skill's MaxText config check) are marked slow: the fast loop runs the rest.
They are also heavy: each waits, against the block's 180 s, on a process that needs seconds of CPU
(a MaxText parser, a Prometheus), which at nice 19 beside the cluster tests can take longer than
that (CI's whole-suite run timed out on the pytest block, which takes 10 s alone).

Needs prometheus and promtool on PATH and the project venv (numpy, matplotlib). ~60 s on 2 cores,
half of it the model-config-guide skill's own pytest block.
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import REPO, VENV, run

from helpers import corpus, logcorpus
from helpers.promfixture import tsdb_digest

SKILLS = REPO / "skills"
SKILL_FILES = sorted(SKILLS.glob("*/SKILL.md"))
MD_FILES = sorted(SKILLS.rglob("*.md"))
ROUTING = [REPO / "CLAUDE.md", REPO / "AGENTS.md"]
MAX_LINES = 400
BLOCK_TIMEOUT = 180
FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")
SUBMITS = re.compile(r"utils/sweep\.py\s+(batch|nodes|bisect|regress|models|resume)\b|submit\.sh\b")
FORBIDDEN = re.compile(r"(^|[\s;&|(])(kill|pkill|killall|scancel|sbatch|salloc|srun)\b|--storage\.tsdb\.path")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
REFUSE = ("sbatch", "srun", "salloc", "scancel", "scontrol", "squeue")


@dataclass(frozen=True)
class Block:
    file: Path
    number: int  # 1-based among the file's bash blocks
    line: int  # line of the opening fence
    text: str
    lang: str = "bash"
    closed: bool = True

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(REPO).as_posix()}#{self.number}"

    def submits(self) -> bool:
        return any(SUBMITS.search(ln) and "--dry-run" not in ln for ln in self.text.splitlines())


def bash_blocks(path: Path) -> list[Block]:
    """The ```bash blocks of a markdown file, dedented to their fence's indentation (also ```sh,
    ```shell, ```console and unclosed fences, which their test rejects)."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = len(m.group(1)), m.group(2), i
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        closed = i < len(lines)
        i += 1
        if lang in ("bash", "sh", "shell", "console") or not closed:
            out.append(Block(path, len(out) + 1, start + 1, "\n".join(body) + "\n", lang, closed))
    return out


BLOCKS = [b for f in MD_FILES for b in bash_blocks(f)]


def normalised(block: Block) -> list[str]:
    """The block's command lines with --dry-run, --json and a trailing `| jq ...` dropped from the
    submitting lines: a real sweep block and its dry-run twin normalise to the same lines."""
    out = []
    for ln in block.text.splitlines():
        ln = ln.strip()
        if not ln or ln.startswith("#"):
            continue
        if SUBMITS.search(ln):
            ln = re.sub(r"\s+\|\s*jq\b.*$", "", ln)
            ln = " ".join(t for t in ln.split() if t not in ("--dry-run", "--json"))
        out.append(ln)
    return out


# --- form ------------------------------------------------------------------------------------
def front_matter(path: Path) -> dict:
    text = path.read_text()
    assert text.startswith("---\n"), f"{path}: no YAML front matter"
    head, sep, _ = text[4:].partition("\n---\n")
    assert sep, f"{path}: front matter not closed by ---"
    data = yaml.safe_load(head)
    assert isinstance(data, dict), f"{path}: front matter is not a mapping"
    return data


@pytest.mark.parametrize("skill", SKILL_FILES, ids=lambda p: p.parent.name)
def test_front_matter_and_size(skill):
    meta = front_matter(skill)
    assert meta.get("name") == skill.parent.name, f"{skill}: name {meta.get('name')!r} is not the directory's"
    desc = meta.get("description")
    assert isinstance(desc, str) and len(desc) >= 40, f"{skill}: description missing or too short"
    assert len(desc) <= 1024, f"{skill}: description longer than 1024 characters"
    n = len(skill.read_text().splitlines())
    assert n < MAX_LINES, f"{skill}: {n} lines (keep it under {MAX_LINES}; move details to reference.md)"


# Claude Code finds project skills in .claude/skills/<name>/SKILL.md: each is a link to skills/<name>
# (skills/ stays the one source). allowed-tools pre-approves what a skill runs: read-only tools only.
WRITES = re.compile(r"\b(scancel|sbatch|srun|salloc|kill|pkill|rm|submit\.sh|Write|Edit)\b|auto-recover|--detach")


@pytest.mark.parametrize("skill", SKILL_FILES, ids=lambda p: p.parent.name)
def test_discoverable_by_claude_code_with_read_only_tools(skill):
    link = REPO / ".claude" / "skills" / skill.parent.name
    assert link.is_symlink() and link.resolve() == skill.parent.resolve(), f"{link} must link to {skill.parent}"
    tools = front_matter(skill).get("allowed-tools")
    assert isinstance(tools, str) and "Read" in tools, f"{skill}: allowed-tools missing"
    assert not WRITES.search(tools), f"{skill}: allowed-tools must stay read-only: {tools}"
    assert all(re.fullmatch(r"(Read|Grep|Glob|Bash\([^()]+:\*\))", t.strip()) for t in tools.split(",")), tools


def test_claude_skills_folder_holds_only_skills():
    found = {p.name for p in (REPO / ".claude" / "skills").iterdir()}
    assert found == {p.parent.name for p in SKILL_FILES}, found


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", path.read_text(), re.M)}


@pytest.mark.parametrize("doc", MD_FILES + ROUTING, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # links inside code are not links
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target} (no {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not bad, f"{doc}: broken links: {bad}"


def test_claude_md_routes_to_every_skill():
    routes = set(re.findall(r"\(skills/([^/)]+)/SKILL\.md\)", (REPO / "CLAUDE.md").read_text()))
    assert routes, "CLAUDE.md routes to no skill"
    missing = sorted(r for r in routes if not (SKILLS / r / "SKILL.md").is_file())
    assert not missing, f"CLAUDE.md routes to skills that do not exist: {missing}"
    unrouted = sorted(p.parent.name for p in SKILL_FILES if p.parent.name not in routes)
    assert not unrouted, f"skills that CLAUDE.md does not route to: {unrouted}"


# --- commands --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    """The corpus jobs and the environment every block runs in."""
    for tool in ("prometheus", "promtool"):
        assert shutil.which(tool), f"{tool} is not on PATH"
    assert (VENV / "bin" / "python").exists(), f"no venv at {VENV}"
    root = tmp_path_factory.mktemp("skills")
    ws = root / "ws"
    net = corpus.build("rdma_retransmits", ws, 2)
    base = logcorpus.Job(job_id="4300", model="tiny", hosts=["n1"], steps=30, total_steps=30)
    logcorpus.write_job(base, ws)
    submit = ws / base.name / "artifact" / ".submit"
    submit.mkdir(parents=True)
    (submit / "command.txt").write_text("submit.sh tiny -N 1 -- steps=30\n")
    failed = logcorpus.Job(job_id="4301", failure="collective_error", hosts=["n1", "n2", "n3", "n4"], steps=60)
    logcorpus.write_job(failed, ws)
    stubs = root / "bin"
    stubs.mkdir()
    sinfo = "".join(f"{h} idle\\n" for h in net.hosts)
    (stubs / "sinfo").write_text(f"#!/bin/sh\nprintf '{sinfo}'\n")
    for name in REFUSE:
        (stubs / name).write_text(
            f"#!/bin/sh\necho 'test_skills: {name} refused (a skill block must not reach Slurm)' >&2\nexit 97\n"
        )
    for p in stubs.iterdir():
        p.chmod(0o755)
    tmp = root / "tmp"
    tmp.mkdir()
    env = {
        "PATH": f"{stubs}:{os.environ.get('PATH', '')}:/usr/bin",
        "JOB_WORKSPACE": str(ws),
        "TMPDIR": str(tmp),
        "JOB": str(net.job_dir),
        "MODEL": "tiny",
    }
    return {
        "env": env,
        "ws": ws,
        "baseline": ws / base.name,
        "failed": ws / failed.name,
        "digests": {net.job_dir / "prometheus": tsdb_digest(net.job_dir / "prometheus")},
    }


@pytest.fixture(scope="module")
def leak(jobs) -> dict[str, str]:
    """The thread_leak incident (JOB of --vs blocks) and its clean twin (OTHER_JOB), built in the
    corpus workspace when a block first needs them."""
    inc = corpus.build("thread_leak", jobs["ws"], 4)
    for db in (inc.job_dir / "prometheus", inc.vs / "prometheus"):
        jobs["digests"][db] = tsdb_digest(db)
    return {"JOB": str(inc.job_dir), "OTHER_JOB": str(inc.vs)}


@pytest.fixture(scope="module")
def crashed(jobs) -> str:
    """A failed job whose culprit left a core: the job log from the corpus writer, the core made
    for real (the project's Python, SIGSEGV in a nested call, in the directory and with the
    context.txt that _train.sh's core set-up makes)."""
    job = logcorpus.Job(job_id="4302", failure="segfault", hosts=["n1", "n2"], steps=20)
    job_dir = jobs["ws"] / job.name
    logcorpus.write_job(job, jobs["ws"])
    crash = "import ctypes\ndef load_batch():\n    ctypes.string_at(0)\n"
    crash += "def train_step():\n    load_batch()\ntrain_step()\n"
    script = (
        f'source {REPO}/utils/launch/lib.sh; source {REPO}/utils/launch/coredump.sh; core_setup "$PY"; '
        'exec "$PY" -c "$CRASH"'
    )
    env = {**os.environ, "JOB_DIR": str(job_dir), "JOB_NAME": job.name, "JOB_HOSTNAME": "n2"}
    res = run(["bash", "-c", script], env={**env, "PY": str(VENV / "bin" / "python"), "CRASH": crash}, timeout=60)
    assert res.returncode == -signal.SIGSEGV, res.stderr
    assert list((job_dir / "cores" / "n2").glob("core*")), "no core was written (kernel.core_pattern?)"
    return str(job_dir)


@pytest.fixture(scope="module")
def host_bridge(jobs) -> Iterator[str]:
    """The directory of a host bridge for the host-commands skill (see the module's docstring)."""
    root = Path(tempfile.mkdtemp(prefix="mst-sk-", dir="/tmp"))  # a short socket path
    slurm = root / "slurm"
    slurm.mkdir()
    answers = {
        "squeue": "echo '     JOBID PARTITION                           NAME    STATE       TIME NODELIST(REASON)'",
        "sacct": "echo 'JobID|State|ExitCode|Elapsed|NodeList'",
        "scontrol": 'echo "JobId=$4 JobState=FAILED"',
    }
    for name, body in answers.items():
        (slurm / name).write_text(f"#!/bin/sh\n{body}\n")
        (slurm / name).chmod(0o755)
    env = {**os.environ, **jobs["env"], "PATH": f"{slurm}:{jobs['env']['PATH']}", "XDG_CONFIG_HOME": str(root)}
    tool = [str(VENV / "bin" / "python"), str(REPO / "utils" / "host_bridge.py")]
    proc = subprocess.Popen(
        [*tool, "serve", "--dir", str(root / "b")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout and proc.stdout.readline().strip() == str(root / "b")
        yield str(root / "b")
    finally:
        run([*tool, "stop", "--dir", str(root / "b")], env=env, timeout=60)
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def block_envs(block: Block, jobs: dict, request: pytest.FixtureRequest) -> list[dict[str, str]]:
    """The environments a block runs in: one, and for the triage skill also a failed job without
    metrics (triage exits 0 for it too; the "no TSDB" branch runs)."""
    env = dict(jobs["env"])
    if "--vs" in block.text or "OTHER_JOB" in block.text:
        leak = request.getfixturevalue("leak")
        env["OTHER_JOB"] = leak["OTHER_JOB"]
        if "--vs" in block.text:
            env["JOB"] = leak["JOB"]
    if re.search(r"utils/sweep\.py\s+regress\b", block.text):
        env["JOB"] = str(jobs["baseline"])
    if block.file.parent.name == "job-log-triage":
        return [env, {**env, "JOB": str(jobs["failed"])}]
    if block.file.parent.name == "host-commands":
        return [{**env, "MST_HOST_BRIDGE": request.getfixturevalue("host_bridge")}]
    if block.file.parent.name == "coredump-debug":
        return [{**env, "JOB": request.getfixturevalue("crashed")}]
    return [env]


def test_skills_quote_commands():
    assert len(BLOCKS) >= 10, f"only {len(BLOCKS)} bash blocks in skills/"


# slow and heavy: see the module's docstring
HEAVY = re.compile(r"utils/diagnose\.py|-m pytest\b")


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, id=b.id, marks=[pytest.mark.slow, pytest.mark.heavy] if HEAVY.search(b.text) else [])
        for b in BLOCKS
    ],
)
def test_bash_block(block, jobs, request):
    where = f"{block.id} ({block.file.relative_to(REPO)}:{block.line})"
    assert block.closed, f"{where}: the code fence is never closed"
    assert block.lang == "bash", f"{where}: commands go in ```bash blocks (got ```{block.lang})"
    for ln in block.text.splitlines():
        assert not FORBIDDEN.search(ln.split("#", 1)[0]), f"{where}: a skill block must not run this: {ln}"
    if shutil.which("shellcheck"):
        res = run(["shellcheck", "-s", "bash", "-S", "warning", "-e", "SC2154", "-"], input=block.text, timeout=60)
        assert res.returncode == 0, f"{where}: shellcheck:\n{res.stdout}{res.stderr}"
    if block.submits():
        twins = [
            b
            for b in BLOCKS
            if b.file == block.file
            and b is not block
            and not b.submits()
            and "--dry-run" in b.text
            and normalised(b) == normalised(block)
        ]
        assert twins, (
            f"{where} submits jobs and is not run; the same file needs its --dry-run twin (the same "
            f"block with --dry-run on each submitting line):\n{block.text}"
        )
        return
    for env in block_envs(block, jobs, request):
        t = time.monotonic()
        res = run(["bash", "-euo", "pipefail", "-c", block.text], env=env, cwd=REPO, timeout=BLOCK_TIMEOUT)
        report = (
            f"{where} with JOB={env['JOB']} exited {res.returncode} after {time.monotonic() - t:.1f} s\n"
            f"--- block\n{block.text}--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"
        )
        assert res.returncode == 0, report
        assert "Traceback" not in res.stderr, report


def test_every_submitting_block_has_a_dry_run_twin():
    """Covered block by block above; this says it once for the whole set (and that there are some)."""
    real = [b for b in BLOCKS if b.submits()]
    dry = [b for b in BLOCKS if not b.submits() and re.search(r"utils/sweep\.py\s+\w+.*--dry-run", b.text)]
    assert dry, "no sweep --dry-run block in the skills"
    orphans = [b.id for b in real if not any(d.file == b.file and normalised(d) == normalised(b) for d in dry)]
    assert not orphans, f"sweep blocks without a --dry-run twin: {orphans}"


def test_blocks_left_the_saved_tsdbs_alone(jobs):
    """Runs after the blocks (file order): reading a job's metrics must never write its TSDB."""
    assert {db: tsdb_digest(db) for db in jobs["digests"]} == jobs["digests"]


def test_twin_rule_catches_a_missing_dry_run(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(
        '```bash\nutils/sweep.py batch "$MODEL" --values 1,2 --dry-run\n```\n\n'
        '```bash\nutils/sweep.py batch "$MODEL" --values 1,2 --json | jq .result\n```\n\n'
        '   ```bash\n   utils/sweep.py nodes "$MODEL" --nodes all\n   ```\n\n```json\n{}\n```\n'
    )
    dry, real, orphan = bash_blocks(md)
    assert not dry.submits() and real.submits() and orphan.submits()
    assert normalised(dry) == normalised(real) and normalised(orphan) != normalised(dry)
    assert orphan.text == 'utils/sweep.py nodes "$MODEL" --nodes all\n'  # dedented to its fence
