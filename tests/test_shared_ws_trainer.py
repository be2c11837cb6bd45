"""The trainer tier in a shared workspace (issue 19, attacks 3, 4 and 9; docs/security.md).

Two real users (tests/helpers/users.py): what a teammate (2775 group directory, umask 002) or any
user of shared scratch (1777) can plant never runs as the victim, and the victim's job stops with
one line that names the path, its owner and mode:
- a core directory planted at the predictable $COREDUMP_DIR/<job name>/<host> (with a `maxtext`
  package and a link at context.txt) is refused; the trainer imports nothing from its working
  directory (python -P);
- an image record ($JOB_DIR/.images/<host>) that is not the victim's, or names another interpreter,
  is refused before anything runs;
- a real MaxText run given the Hugging Face token (hf_access_token=..., _env_HF_TOKEN=...) writes it
  into no TensorBoard event, while the Hugging Face libraries in the trainer's environment read it.
End to end on the local 2-node cluster (marked cluster), against the victim's real jobs: core
directories planted for her next job id on a shared COREDUMP_DIR stop the job in its train stage
with one line per node; an image record and a summary.txt link planted in a copy of her job
directory while the job is held (2775) stop it before its first stage; a job directory planted at
her next id is refused by submit.sh. Links at context.txt and summary.txt point at a file of hers:
it never changes. Each payload would write a canary file; it never appears.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV, launcher_env
from test_shared_ws_launch import (
    UMASK,
    attacker_sh,
    env_of,
    files_under,
    job_id_of,
    next_job_id,
    one_line_refusal,
    release,
)

from helpers.jobs import SUBMITTED, job_state, summary, trainer_pid, wait_for, wait_job_end
from helpers.users import ATTACKER, User, as_user, ensure_users, reachable_base, shared_workspace

PY = VENV / "bin" / "python"
HOST = "node1"
JOB = "77-JAX-tiny"
NODES = ("n1", "n2")  # the local cluster's nodes (utils/local_cluster.sh)
TWO_NODES = ("-N", "2", "--", "steps=3")  # submit.sh arguments: a short job on both nodes


@pytest.fixture
def base():
    d = reachable_base()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def canary(base: Path) -> Path:
    """Where a payload run as the victim would leave its mark (a directory the victim may write:
    otherwise its absence would prove nothing)."""
    d = base / "canaries"
    d.mkdir()
    d.chmod(0o1777)
    return d / "canary"


def payload(canary: Path) -> str:
    """Python that, imported or run as the victim, leaves the canary behind."""
    return f"import os\nopen({str(canary)!r}, 'w').write(str(os.getuid()))\n"


def plant_package(attacker: User, where: Path, canary: Path) -> None:
    """The attacker's `maxtext` package (and a python script) under `where`, made as the attacker."""
    script = (
        f"mkdir -p {where}/maxtext/trainers/pre_train && "
        f"printf %s {payload(canary)!r} | tee {where}/maxtext/__init__.py {where}/maxtext/trainers/__init__.py "
        f"{where}/maxtext/trainers/pre_train/__init__.py {where}/maxtext/trainers/pre_train/train.py > /dev/null"
    )
    res = as_user(attacker, ["bash", "-c", script], umask=0o002)
    assert res.returncode == 0, res.stderr


def victim_job_dir(victim: User, ws: Path, umask: int = 0o022, name: str = JOB) -> Path:
    """The victim's job directory, made as submit.sh makes it (own_dir: 0755, no setgid)."""
    job_dir = ws / name
    res = as_user(victim, ["bash", "-c", f"source {REPO}/utils/launch/lib.sh; own_dir {job_dir}"], umask=umask)
    assert res.returncode == 0, res.stderr
    return job_dir


def job_env(ws: Path, job_dir: Path, **extra: str) -> dict[str, str]:
    return {
        "MST_REPO": str(REPO),
        "MST_VENV": str(VENV),
        "MODEL": "tiny",
        "JOB_WORKSPACE": str(ws),
        "JOB_DIR": str(job_dir),
        "JOB_NAME": job_dir.name,
        "JOB_HOSTNAME": HOST,
        **extra,
    }


def one_line(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and len(lines) == 1, (res.returncode, res.stdout, res.stderr)
    return lines[0]


# --- attack 3: COREDUMP_DIR on shared scratch -----------------------------------------------------


@pytest.mark.parametrize(("kind", "umask"), [("sticky", 0o022), ("group", 0o002)])
def test_a_planted_core_directory_is_refused_and_never_imported(base, canary, kind, umask):
    """The attacker makes the victim's predictable core directory first, with a `maxtext` package in
    it and a link at context.txt to a file of the victim's: the victim's trainer stops with one line
    naming the attacker's directory; no payload runs, the linked file is untouched."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, kind)
    (base / "s").mkdir()
    cores = shared_workspace(base / "s", kind)
    planted = cores / JOB / HOST
    plant_package(attacker, planted, canary)
    precious = victim.home / "precious"
    as_user(victim, ["bash", "-c", f"echo mine > {precious}"], check=True)
    res = as_user(attacker, ["ln", "-s", str(precious), str(planted / "context.txt")])
    assert res.returncode == 0, res.stderr
    job_dir = victim_job_dir(victim, ws, umask)
    res = as_user(
        victim,
        [str(REPO / "_train.sh")],
        env=job_env(ws, job_dir, MST_PYTHON=str(PY), ENABLE_COREDUMPS="1", COREDUMP_DIR=str(cores)),
        umask=umask,
        cwd=planted,  # even started from inside the attacker's directory
        timeout=300,
    )
    line = one_line(res)
    assert f"_train.sh: refusing the directory {cores / JOB}: it is owned by mstattacker" in line, line
    assert not canary.exists()
    assert precious.read_text() == "mine\n"


@pytest.mark.parametrize(("kind", "umask"), [("sticky", 0o022), ("group", 0o002)])
def test_the_core_directory_is_the_victims_and_private(base, kind, umask):
    """Without an attacker: the job's directory under a shared COREDUMP_DIR is the victim's (0755),
    the host's is private (0700: a core holds the trainer's memory), context.txt is a new file there."""
    victim, _ = ensure_users()
    ws = shared_workspace(base, kind)
    (base / "s").mkdir()
    cores = shared_workspace(base / "s", kind)
    job_dir = victim_job_dir(victim, ws, umask)
    stand_in = base / "python"  # answers the probes, then stands in for the trainer
    stand_in.write_text(f'#!/bin/bash\n[[ "$1" == -I || "$2" == - ]] && exec {PY} "$@"\npwd; ls -ld .\n')
    stand_in.chmod(0o755)
    res = as_user(
        victim,
        [str(REPO / "_train.sh")],
        env=job_env(ws, job_dir, MST_PYTHON=str(stand_in), ENABLE_COREDUMPS="1", COREDUMP_DIR=str(cores)),
        umask=umask,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    host_dir = cores / JOB / HOST
    assert res.stdout.splitlines()[0] == str(host_dir)
    for d, mode in ((cores / JOB, 0o755), (host_dir, 0o700)):
        st = d.stat()
        assert (st.st_uid, st.st_mode & 0o7777) == (victim.uid, mode), (d, oct(st.st_mode))
    ctx = host_dir / "context.txt"
    assert not ctx.is_symlink() and ctx.stat().st_uid == victim.uid and "python_version: 3." in ctx.read_text()
    assert (job_dir / "cores").resolve() == cores / JOB


# --- COMPILE_CACHE_DIR on shared scratch: JAX's compilation cache holds code ----------------------


def train_with_a_shared_cache(base: Path, kind: str, umask: int, trainer_body: str, plant: str = ""):
    """_train.sh as the victim with COMPILE_CACHE_DIR on shared scratch (kind), after the attacker's
    `plant` script (given CACHES, the shared directory); the trainer is a stand-in that answers the
    interpreter probes and otherwise runs `trainer_body`. Returns (the result, CACHES, the victim, WS)."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, kind)
    (base / "s").mkdir()
    caches = shared_workspace(base / "s", kind)
    if plant:
        res = as_user(attacker, ["bash", "-c", plant.replace("CACHES", str(caches))], umask=0o002)
        assert res.returncode == 0, res.stderr
    job_dir = victim_job_dir(victim, ws, umask)
    trainer = base / "python"
    trainer.write_text(f'#!/bin/bash\n[[ "$1" == -I || "$2" == - ]] && exec {PY} "$@"\n{trainer_body}\n')
    trainer.chmod(0o755)
    res = as_user(
        victim,
        [str(REPO / "_train.sh")],
        env=job_env(ws, job_dir, MST_PYTHON=str(trainer), COMPILE_CACHE_DIR=str(caches)),
        umask=umask,
        timeout=300,
    )
    return res, caches, victim, ws


@pytest.mark.parametrize(("kind", "umask"), [("sticky", 0o022), ("group", 0o002)])
def test_a_planted_compile_cache_is_refused_before_the_trainer_runs(base, canary, kind, umask):
    """The attacker makes the victim's predictable cache directory ($COMPILE_CACHE_DIR/<victim>)
    first, with an "entry" in it: a compiled program the victim's JAX would load and run. The
    victim's train stage stops with one line naming the attacker's directory; the trainer never runs."""
    victim_name = ensure_users()[0].name
    d = f"CACHES/{victim_name}"
    plant = f"mkdir {d} && chmod 0777 {d} && echo x > {d}/jit_train_step-0-cache"
    res, caches, _, _ = train_with_a_shared_cache(base, kind, umask, f"echo ran > {canary}", plant)
    line = one_line(res)
    assert f"_train.sh: refusing the directory {caches / victim_name}: it is owned by mstattacker" in line, line
    assert not canary.exists()


@pytest.mark.parametrize(("kind", "umask"), [("sticky", 0o022), ("group", 0o002)])
def test_the_compile_cache_is_the_victims_and_private(base, kind, umask):
    """Without an attacker: the victim's directory under a shared COMPILE_CACHE_DIR is hers and private
    (0700, no setgid bit from a group directory), and MaxText is told to cache there."""
    res, caches, victim, ws = train_with_a_shared_cache(base, kind, umask, 'printf "%s\\n" "$@"')
    assert res.returncode == 0, res.stderr
    mine = caches / victim.name
    assert f"jax_cache_dir={mine}" in res.stdout.splitlines(), res.stdout
    st = mine.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (victim.uid, 0o700), oct(st.st_mode)
    assert not (ws / victim.name / ".jax_cache").exists()


@pytest.mark.slow
@pytest.mark.heavy
def test_the_trainer_imports_nothing_from_its_working_directory(base, canary):
    """Started (without core dumps) in a directory everyone can write, holding the attacker's
    `maxtext` package: the real MaxText runs (here: stops at a bad key, after its imports) and the
    payload never does (python -P, PYTHONSAFEPATH=1)."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, "sticky")
    plant_package(attacker, ws, canary)
    job_dir = victim_job_dir(victim, ws)
    res = as_user(
        victim,
        [str(REPO / "_train.sh")],
        env=job_env(ws, job_dir, MST_PYTHON=str(PY), TRAIN_OVERRIDES="steps=not-a-number\n"),
        cwd=ws,
        timeout=600,
    )
    assert res.returncode != 0
    assert "steps" in res.stderr and "maxtext" in res.stderr.lower(), res.stderr[-2000:]
    assert not canary.exists()


# --- end to end: the victim's real jobs on the local cluster -------------------------------------


def precious_file(victim: User) -> Path:
    """A file of the victim's that the attacker's links point at: it must never change."""
    path = victim.home / "precious"
    as_user(victim, ["bash", "-c", f"echo mine > {path}"], check=True)
    return path


def submit_victim(victim: User, cluster: dict[str, str], ws: Path, kind: str, *args: str, **env: str) -> str:
    """submit.sh tiny ARGS as the victim, in the workspace's umask, with ENV; the job's id."""
    res = as_user(
        victim, [str(REPO / "submit.sh"), "tiny", *args], env={**env_of(cluster, ws), **env}, umask=UMASK[kind]
    )
    jid = job_id_of(res)
    SUBMITTED.append(jid)
    return jid


def node_lines(log: Path, text: str) -> dict[str, list[str]]:
    """The lines of each node (its "n1: " prefix, taken off) in the log that hold text."""
    out: dict[str, list[str]] = {}
    for ln in log.read_text(errors="replace").splitlines():
        host, sep, rest = ln.partition(": ")
        if sep and host in NODES and text in rest:
            out.setdefault(host, []).append(rest)
    return out


@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_core_directories_planted_for_the_next_job_stop_it_with_one_line(kind, base, canary, cluster, venv):
    """The attacker predicts the victim's next job id and makes its core directories on the shared
    COREDUMP_DIR first (1777 scratch; a 2775 group directory under umask 002), for both nodes, each
    with a `maxtext` package and a link at context.txt to a file of the victim's. The victim's
    ENABLE_COREDUMPS=1 job stops in its train stage, with one line naming the attacker's directory
    and its owner on each node that got to its check; no payload ran, the linked file and the
    attacker's tree are unchanged."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, kind)
    (base / "s").mkdir()
    cores = shared_workspace(base / "s", kind)
    precious = precious_file(victim)
    jid = next_job_id(attacker, cluster)
    top = cores / f"{jid}-JAX-tiny"
    for host in NODES:
        plant_package(attacker, top / host, canary)
        attacker_sh(attacker, f"ln -s {precious} {top / host / 'context.txt'}")
    planted = files_under(top)
    got = submit_victim(victim, cluster, ws, kind, *TWO_NODES, ENABLE_COREDUMPS="1", COREDUMP_DIR=str(cores))
    assert got == str(jid)  # the prediction held: the planted directories are this job's
    assert wait_job_end(cluster, got, 240) == "FAILED"
    log = ws / f"{jid}-JAX-tiny.log"
    refusal = f"_train.sh: refusing the directory {top}: it is owned by {ATTACKER}"
    s = summary(log)
    assert s["stage"] == "train" and refusal in s.get("first_error", ""), log.read_text()[-3000:]
    said = node_lines(log, "_train.sh: ")
    # one line on each node that got to the check (the first refusal fails the step, and Slurm may stop
    # the other node before its own check: measured once on a quiet 2-core machine, n1 said nothing)
    assert said and set(said) <= set(NODES) and all(len(lines) == 1 for lines in said.values()), said
    assert all(refusal in lines[0] for lines in said.values()), said
    assert not node_lines(log, "completed step")  # the trainer never started
    assert not canary.exists()
    assert precious.read_text() == "mine\n"
    assert files_under(top) == planted


def test_an_old_python_is_refused_with_one_line(tmp_path):
    """A Python without -P (older than 3.11) would import from the working directory: refused."""
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/bash\n[[ "$*" == *platform* ]] && { echo 3.10.12; exit 0; }\nexit 1\n')
    old.chmod(0o755)
    job_dir = tmp_path / JOB
    job_dir.mkdir()
    env = {**os.environ, **job_env(tmp_path, job_dir, MST_PYTHON=str(old))}
    res = subprocess.run([str(REPO / "_train.sh")], env=env, capture_output=True, text=True, timeout=120)
    line = one_line(res)
    assert f"the trainer's Python '{old}' is 3.10.12: older than 3.11" in line, line


# --- attack 4: .images/<host> ---------------------------------------------------------------------


def record_line(python: Path) -> str:
    return f"runtime=none python={python} accelerator=cpu\n"


def write_record(python: Path, path: Path) -> str:
    """Shell that writes a native record naming `python` at `path`."""
    return f"echo {shlex.quote(record_line(python).strip())} > {path}"


def evil_python(attacker: User, base: Path, canary: Path) -> Path:
    """The attacker's `python`: any run of it leaves the canary."""
    evil = base / "evil"
    evil.mkdir()
    shutil.chown(evil, attacker.name)
    script = evil / "python"
    res = as_user(
        attacker, ["bash", "-c", f"printf '#!/bin/bash\\nid -u > {canary}\\n' > {script}; chmod 755 {script}"]
    )
    assert res.returncode == 0, res.stderr
    return script


def container_train(victim: User, ws: Path, job_dir: Path, umask: int) -> subprocess.CompletedProcess:
    return as_user(
        victim,
        [str(REPO / "_container.sh"), "_train.sh"],
        env=job_env(ws, job_dir),
        umask=umask,
        timeout=300,
    )


def test_a_record_in_a_renamed_and_replanted_job_dir_is_refused(base, canary):
    """2775 workspace: the teammate renames the victim's job dir (allowed: no sticky bit) and plants
    a copy holding `.images/<host>` with python=<his script>: the train stage refuses his directory."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, "group")
    evil = evil_python(attacker, base, canary)
    job_dir = victim_job_dir(victim, ws, 0o002)
    script = (
        f"mv {job_dir} {ws}/moved && mkdir -p {job_dir}/.images && chmod 755 {job_dir} {job_dir}/.images && "
        f"{write_record(evil, job_dir / '.images' / HOST)} && chmod 644 {job_dir}/.images/{HOST}"
    )
    res = as_user(attacker, ["bash", "-c", script], umask=0o002)
    assert res.returncode == 0, res.stderr
    line = one_line(container_train(victim, ws, job_dir, 0o002))
    assert f"_container.sh: refusing the image record {job_dir}: it is owned by mstattacker" in line, line
    assert not canary.exists()


@pytest.mark.parametrize(("kind", "umask"), [("sticky", 0o022), ("group", 0o002)])
def test_a_record_in_a_group_writable_job_dir_is_refused_and_never_written(base, canary, kind, umask):
    """A job dir its group may write (an older launcher's, mode 2775 under umask 002): in a 2775
    workspace it is the team's group, and the teammate plants `.images/` with his record; in 1777
    scratch it is the victim's own group and planting fails. Either way the image stage will not
    write there and the train stage will not read it."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, kind)
    evil = evil_python(attacker, base, canary)
    job_dir = ws / JOB
    as_user(victim, ["bash", "-c", f"mkdir {job_dir} && chmod 2775 {job_dir}"], check=True, umask=umask)
    line = record_line(evil).strip()
    plant = as_user(
        attacker,
        ["bash", "-c", f"mkdir {job_dir}/.images && echo {shlex.quote(line)} > {job_dir}/.images/{HOST}"],
        umask=0o002,
    )
    assert (plant.returncode == 0) == (kind == "group"), plant.stderr
    stage = as_user(
        victim, [str(REPO / "utils/launch/image.sh")], env=job_env(ws, job_dir, CONTAINER_RUNTIME="none"), umask=umask
    )
    refusal = one_line(stage)
    assert refusal.startswith("image: FAILED: refusing "), refusal
    assert "writable by others (mode 2775)" in refusal or "owned by mstattacker" in refusal, refusal
    if kind == "group":
        assert (job_dir / ".images" / HOST).read_text() == line + "\n"  # the stage wrote nothing there
        train = one_line(container_train(victim, ws, job_dir, umask))
        assert f"_container.sh: refusing the image record {job_dir}: it is writable by others (mode 2775)" in train
    assert not canary.exists()


def test_a_record_naming_another_interpreter_is_refused(base, canary):
    """Even the victim's own record runs only this job's environment's interpreter."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, "sticky")
    evil = evil_python(attacker, base, canary)
    job_dir = victim_job_dir(victim, ws)
    record = job_dir / ".images" / HOST
    script = f"source {REPO}/utils/launch/lib.sh; own_dir {record.parent}; {write_record(evil, record)}"
    as_user(victim, ["bash", "-c", script], check=True)
    line = one_line(container_train(victim, ws, job_dir, 0o022))
    assert f"names python={evil}, not this job's environment's {PY}" in line, line
    assert not canary.exists()


def test_the_image_stage_writes_a_private_record_that_the_train_stage_reads(base):
    """Without an attacker, in a 2775 workspace under umask 002: the stage's record and its directory
    are the victim's and writable by nobody else, and the train stage accepts them."""
    victim, _ = ensure_users()
    ws = shared_workspace(base, "group")
    job_dir = victim_job_dir(victim, ws, 0o002)
    stage = as_user(
        victim, [str(REPO / "utils/launch/image.sh")], env=job_env(ws, job_dir, CONTAINER_RUNTIME="none"), umask=0o002
    )
    assert stage.returncode == 0, stage.stderr
    for p, mode in ((job_dir / ".images", 0o755), (job_dir / ".images" / HOST, 0o644)):
        st = p.lstat()
        assert (st.st_uid, st.st_mode & 0o7777) == (victim.uid, mode), (p, oct(st.st_mode))
    env = job_env(ws, job_dir)
    res = as_user(victim, [str(REPO / "_container.sh"), "bash", "-c", 'echo "$MST_PYTHON"'], env=env, umask=0o002)
    assert res.returncode == 0 and res.stdout.strip() == str(PY), res.stderr


# --- attack 9: no secret in TensorBoard -----------------------------------------------------------


def tb_texts(job_dir: Path) -> dict[str, str]:
    """Every text summary of the job's TensorBoard events (tag -> value), read with TensorBoard's reader."""
    from tensorboard.backend.event_processing import event_accumulator

    texts: dict[str, str] = {}
    files = list(job_dir.rglob("events.out.tfevents.*"))
    assert files, "no TensorBoard events"
    for f in files:
        acc = event_accumulator.EventAccumulator(str(f), size_guidance={event_accumulator.TENSORS: 0})
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            for ev in acc.Tensors(tag):
                values = ev.tensor_proto.string_val
                texts[tag] = " ".join(v.decode(errors="replace") for v in values)
    return texts


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["hf_access_token", "_env_HF_TOKEN"])
def test_the_hugging_face_token_never_reaches_tensorboard(workspace, venv, how):
    """A real (tiny, CPU) MaxText run with the token and another secret (_env_DB_PASSWORD): no event holds
    the token (TensorBoard's own reader), the rest of MaxText's config is there; the trainer's
    environment hands it to the Hugging Face libraries (HF_TOKEN_PATH, a private file), and neither
    HF_TOKEN nor M_HF_ACCESS_TOKEN is in it. Every user can read any process's argv (ps): no process
    shows either secret while the job runs, and neither the log nor the recorded command holds one
    (the command shows both overrides redacted)."""
    token = f"hf_canary{how.strip('_')[:3]}Zq81x"
    pw = "correct horse battery"
    proc = subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=30", f"{how}={token}", f"_env_DB_PASSWORD={pw}"],
        env={**os.environ, **launcher_env(workspace)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        log = wait_for(lambda: list(workspace.glob("local-*.log")), 60, "the log")[0]
        job_id = log.name.split("-JAX-")[0]
        pid = wait_for(lambda: trainer_pid(job_id, 0), 300, "the trainer process")
        argvs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert token not in argvs and "horse" not in argvs
        environ = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        assert not {"HF_TOKEN", "M_HF_ACCESS_TOKEN", "HUGGING_FACE_HUB_TOKEN"} & environ.keys()
        token_file = Path(environ["HF_TOKEN_PATH"])
        st = token_file.stat()
        assert st.st_mode & 0o077 == 0 and token_file.parent.stat().st_mode & 0o077 == 0
        # what MaxText's Hugging Face downloads send (it passes token=None: they read the file)
        got = subprocess.run(
            [str(PY), "-P", "-c", "import huggingface_hub; print(huggingface_hub.get_token())"],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert got.stdout.strip() == token, got.stderr
        assert proc.wait(timeout=900) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    texts = tb_texts(log.with_suffix(""))
    by_key = {t.split("/")[0]: v for t, v in texts.items()}
    assert by_key["hf_access_token"].strip() in ("", "None"), by_key["hf_access_token"]  # logged, unset
    assert by_key["base_emb_dim"].strip() == "64" and by_key["run_name"].strip() == log.stem  # the rest is there
    for tag, value in texts.items():
        assert token not in tag and token not in value, tag
    command = (log.with_suffix("") / "artifact" / ".submit" / "command.txt").read_text()
    for text in (log.read_text(errors="replace"), command):
        assert token not in text and "horse" not in text
    assert f"{how}=<redacted> _env_DB_PASSWORD=<redacted>" in command, command
    raw = b"".join(f.read_bytes() for f in log.with_suffix("").rglob("events.out.tfevents.*"))
    assert token.encode() not in raw
    wait_for(lambda: not token_file.exists(), 30, "the token file to go with the trainer")


@pytest.mark.cluster
def test_an_image_record_planted_while_the_job_is_held_never_runs(base, canary, cluster, venv):
    """2775 group workspace, umask 002: while the victim's job is held, the teammate renames her job
    directory (0755: he cannot write into it, but the workspace lets him rename it) and plants a copy
    holding `.images/<host>` for both nodes with python=<his script>, and a link at summary.txt to a
    file of hers. Released, the job stops before its first stage with one line naming his directory
    and its owner; his script never runs, her file is unchanged, nothing lands in his directory."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, "group")
    evil = evil_python(attacker, base, canary)
    precious = precious_file(victim)
    jid = submit_victim(victim, cluster, ws, "group", "--hold", *TWO_NODES)
    job_dir = ws / f"{jid}-JAX-tiny"
    attacker_sh(
        attacker,
        f"""
        mv {job_dir} {job_dir}.gone
        mkdir {job_dir} {job_dir}/.images
        cp -P {job_dir}.gone/* {job_dir}/  # artifact and log links, snapshot.sha256: a faithful copy
        {" && ".join(write_record(evil, job_dir / ".images" / host) for host in NODES)}
        chmod 755 {job_dir} {job_dir}/.images
        chmod 644 {job_dir}/.images/*
        ln -s {precious} {job_dir}/summary.txt
        """,
    )
    planted = files_under(job_dir)
    release(victim, cluster, jid)
    assert wait_job_end(cluster, jid, 240) == "FAILED"
    log = ws / f"{jid}-JAX-tiny.log"
    s = summary(log)
    refusal = f"_job.sbatch: error: refusing the job directory {job_dir}: it is owned by {ATTACKER}"
    assert s["stage"] == "none" and s["first_error"].startswith(refusal), s
    assert "==================== JOB ====================" not in log.read_text()  # not one stage ran
    assert not canary.exists()
    assert precious.read_text() == "mine\n"
    assert files_under(job_dir) == planted


@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_a_job_directory_planted_at_the_next_id_is_refused_at_submit(kind, base, canary, cluster, venv):
    """The attacker predicts the victim's next job id and makes its job directory first (1777
    scratch; 2775 group directory), with `.images/<host>` naming his script and a link at
    summary.txt: submit.sh refuses with one line and cancels the held job; nothing ran."""
    victim, attacker = ensure_users()
    ws = shared_workspace(base, kind)
    evil = evil_python(attacker, base, canary)
    precious = precious_file(victim)
    jid = next_job_id(attacker, cluster)
    job_dir = ws / f"{jid}-JAX-tiny"
    records = " && ".join(write_record(evil, job_dir / ".images" / host) for host in NODES)
    attacker_sh(attacker, f"mkdir -p {job_dir}/.images && {records} && ln -s {precious} {job_dir}/summary.txt")
    planted = files_under(job_dir)
    res = as_user(victim, [str(REPO / "submit.sh"), "tiny", *TWO_NODES], env=env_of(cluster, ws), umask=UMASK[kind])
    line = one_line_refusal(res, f"refusing the job dir path {job_dir}: it ", f"owned by {ATTACKER}")
    assert line.startswith("submit.sh: ") and "ask them to remove it" in line, line
    assert job_state(cluster, str(jid)) in {"CANCELLED", "UNKNOWN"}  # the held job never ran
    assert not canary.exists()
    assert precious.read_text() == "mine\n"
    assert files_under(job_dir) == planted
