"""The launcher's settings table (utils/launch/settings.tsv) against every list of settings: the ones the
bash derives from it (SITE_VARS, CONTRACT_VARS, RESERVED_ENV, check_settings, the stage-timeout default),
the ones written by hand (docs/env-contract.md's tables, docs/configs.md's site table, the example site
file, the defaults in the code); old names accepted with a warning; a bad value refused from its row."""

import os
import re
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

TABLE = REPO / "utils" / "launch" / "settings.tsv"
CONTRACT = REPO / "docs" / "env-contract.md"
COLUMNS = ("name", "default", "check", "site", "container", "reserved", "doc")
CHECK = re.compile(
    r"-|bool|int:\d+:\d+|abspath|plainname|plainpath|loopback|exe|enum:[a-z,]+|fn:[a-z_]+|renamed:[A-Z_0-9]+"
)


def rows() -> list[dict[str, str]]:
    out = []
    for line in TABLE.read_text().splitlines():
        if line.startswith("#"):
            continue
        cells = line.split("\t")
        assert len(cells) == len(COLUMNS), line
        out.append(dict(zip(COLUMNS, cells, strict=True)))
    return out


def current() -> list[dict[str, str]]:
    """The rows of names in use (not the old names kept for one release)."""
    return [r for r in rows() if not r["check"].startswith("renamed:")]


def names(column: str) -> list[str]:
    return [r["name"] for r in rows() if r[column] == "yes"]


def bash(script: str, *args: str, env: dict[str, str] | None = None):
    return run(
        [
            "bash",
            "-c",
            f"source {REPO}/utils/launch/lib.sh; source {REPO}/utils/launch/launch_lib.sh; {script}",
            "bash",
            *args,
        ],
        env=env,
    )


def test_table_is_well_formed():
    seen = set()
    for r in rows():
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", r["name"]) and r["name"] not in seen, r["name"]
        seen.add(r["name"])
        assert {r["site"], r["container"], r["reserved"]} <= {"yes", "no"}, r
        assert CHECK.fullmatch(r["check"]), r
        assert r["doc"], r
        if r["check"].startswith("renamed:"):
            assert r["check"].split(":", 1)[1] in {c["name"] for c in current()}, r
        if r["check"].startswith("fn:"):
            fn = r["check"][3:]
            assert bash(f"declare -F {fn}").returncode == 0, f"{r['name']}: no function {fn}"


def doc_tables() -> dict[str, tuple[bool, str | None, str]]:
    """NAME -> (host only, the Default cell or None where the table has none, the section) for every row
    of env-contract.md's variable tables (the Renamed section apart)."""
    text = CONTRACT.read_text().split("## Renamed settings")[0]
    out, section, has_default = {}, "", False
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("| Variable |"):
            has_default = "| Default |" in line
        elif m := re.match(r"^\| `([A-Z_][A-Z0-9_]*)`( \*\(host only\)\*)? \| ([^|]*) \|", line):
            out[m.group(1)] = (bool(m.group(2)), m.group(3).strip() if has_default else None, section)
    return out


def test_env_contract_tables_equal_the_table():
    doc = doc_tables()
    # PATH is reserved (the TRAIN_ENV_OVERRIDES row names it) but is nobody's setting: no table row
    assert set(doc) == {r["name"] for r in current()} - {"PATH"}
    for r in current():
        if r["name"] == "PATH":
            continue
        host_only, default, section = doc[r["name"]]
        passed_in = not host_only and not section.startswith(("Set by the training tier", "Test hooks"))
        assert passed_in == (r["container"] == "yes"), f"{r['name']}: crosses the container? ({section})"
        if default is None:
            assert r["default"] == "-", f"{r['name']}: its table in env-contract.md has no Default column"
        elif r["default"] == "-":
            assert not default.startswith("`"), f"{r['name']}: env-contract.md says {default}, the table none"
        else:
            assert default.startswith(f"`{r['default']}`"), f"{r['name']}: env-contract.md says {default}"


def test_renamed_section_equals_the_table():
    text = CONTRACT.read_text().split("## Renamed settings")[1]
    documented = dict(re.findall(r"^\| `([A-Z_0-9]+)` \| `([A-Z_0-9]+)` \|", text, re.M))
    table = {r["name"]: r["check"].split(":", 1)[1] for r in rows() if r["check"].startswith("renamed:")}
    assert documented == table != {}


def test_bash_lists_are_the_tables_columns():
    res = bash('settings_names container; echo ---; echo "$SITE_VARS"; echo ---; echo "$STAGE_TIMEOUT_DEFAULTS"')
    container, site, stage = res.stdout.split("---\n")
    assert res.returncode == 0 and container.split() == names("container")
    assert site.split() == names("site")
    assert stage.strip() == next(r["default"] for r in rows() if r["name"] == "STAGE_TIMEOUTS")


def test_reserved_column_is_what_env_overrides_refuse():
    res = bash('for n in "$@"; do is_reserved_env "$n" && echo "$n"; done', *[r["name"] for r in rows()])
    assert res.returncode == 0 and res.stdout.split() == names("reserved")


def test_site_lists_by_hand_equal_the_table():
    """docs/configs.md's table of site settings and the example site file name exactly the site column."""
    text = (REPO / "docs" / "configs.md").read_text().split("| Name | For |")[1].split("\n\n")[0]
    in_doc = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", "\n".join(line.split(" | ")[0] for line in text.splitlines())))
    example = (REPO / "configs" / "site.env.sh.example").read_text()
    in_example = set(re.findall(r"^#?export ([A-Z][A-Z0-9_]*)=", example, re.M))
    assert in_doc == set(names("site")) == in_example


def code_defaults() -> list[tuple[str, str, str]]:
    """(file:line, NAME, literal default) for every ${NAME:-LITERAL} and os.environ.get("NAME", "LITERAL") of the
    launcher and the tools (bench/ sets its own on purpose: gpu_smoke.sh runs natively)."""
    from test_lint import project_files

    out = []
    pat = re.compile(r"\$\{([A-Z][A-Z0-9_]*):-([^}$`\"]*)\}|environ\.get\(\"([A-Z][A-Z0-9_]*)\", \"([^\"]*)\"\)")
    for path in project_files():
        rel = path.relative_to(REPO)
        if rel.parts[0] in {"docs", "tests", "bench"} or rel.suffix not in {".sh", ".py", ".sbatch", ""}:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in pat.finditer(line):
                out.append((f"{rel}:{n}", m.group(1) or m.group(3), m.group(2) if m.group(1) else m.group(4)))
    return out


def test_defaults_in_the_code_are_the_tables():
    # the defaults the code can write as they are (not "-", "<repo>/...", "~/...")
    table = {
        r["name"]: r["default"] for r in rows() if re.fullmatch(r"[\w.,:/-]+", r["default"]) and r["default"] != "-"
    }
    found = [(where, name, value) for where, name, value in code_defaults() if name in table]
    assert len(found) >= 10, found  # the pattern still finds the code's defaults
    wrong = [
        f"{where}: {name} defaults to '{value}', the table says '{table[name]}'"
        for where, name, value in found
        if value and value != table[name]
    ]
    assert not wrong, wrong


BAD = {
    "bool": "2",
    "int": "x1",
    "abspath": "rel/path",
    "plainpath": "rel",
    "plainname": "a b",
    "loopback": "0.0.0.0",
    "exe": "/nonexistent/bin",
    "enum": "bogus",
}


@pytest.mark.parametrize("row", [r for r in rows() if r["check"].split(":")[0] in BAD], ids=lambda r: r["name"])
def test_bad_value_refused_in_one_line_from_its_row(row):
    bad = BAD[row["check"].split(":")[0]]
    res = bash("check_settings", env={row["name"]: bad})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"bash: {row['name']}='{bad}' ") and lines[0].endswith(
        f"; {row['name']} is {row['doc']}"
    )


@pytest.fixture()
def fake_sbatch(tmp_path: Path) -> dict[str, str]:
    """sbatch and scontrol that record what the job would get, instead of a cluster."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    seen = tmp_path / "seen"
    (bindir / "sbatch").write_text(
        '#!/bin/sh\necho "new=${MST_RAY_NUM_CPUS-unset} old=${RAY_NUM_CPUS-unset}" > "$SEEN"\necho 4242\n'
    )
    (bindir / "scontrol").write_text("#!/bin/sh\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "SEEN": str(seen)}


@pytest.mark.parametrize(
    ("env", "job_gets", "warning"),
    [
        ({"RAY_NUM_CPUS": "3"}, "new=3 old=unset", "RAY_NUM_CPUS is renamed MST_RAY_NUM_CPUS; its value is used"),
        (
            {"RAY_NUM_CPUS": "3", "MST_RAY_NUM_CPUS": "5"},
            "new=5 old=unset",
            "RAY_NUM_CPUS is renamed MST_RAY_NUM_CPUS, which is set too and wins",
        ),
    ],
)
def test_old_name_works_with_one_warning_and_the_new_name_wins(env, job_gets, warning, fake_sbatch, workspace, venv):
    res = run([str(REPO / "submit.sh"), "tiny"], env={**fake_sbatch, **launcher_env(workspace), **env})
    assert res.returncode == 0, res.stderr
    warned = [line for line in res.stderr.splitlines() if "renamed" in line]
    assert len(warned) == 1 and f"submit.sh: warning: {warning}" in warned[0], res.stderr
    assert Path(fake_sbatch["SEEN"]).read_text().strip() == job_gets


def test_old_name_bad_value_is_refused_under_the_new_name(fake_sbatch, workspace, venv):
    res = run(
        [str(REPO / "submit.sh"), "tiny"], env={**fake_sbatch, **launcher_env(workspace), "RAY_JOIN_TIMEOUT": "5"}
    )
    errors = [line for line in res.stderr.splitlines() if "warning" not in line]
    assert res.returncode == 1 and len(errors) == 1, res.stderr
    assert "MST_RAY_JOIN_TIMEOUT='5' must be a whole number from 10 to 86400" in errors[0]
    assert not Path(fake_sbatch["SEEN"]).exists() and not any(workspace.iterdir())


def test_one_secret_name_pattern():
    """The launcher and the MCP server read utils/launch/secret_names.re; docs/security.md says the same."""
    from mcpserver.jobs import SECRET_NAME

    pattern = (REPO / "utils" / "launch" / "secret_names.re").read_text().strip()
    res = bash('echo "$SECRET_NAME_RE"')
    assert res.stdout.strip() == pattern == SECRET_NAME.pattern
    assert f"`{pattern}`" in (REPO / "docs" / "security.md").read_text()
    names = ["HF_TOKEN", "github_pat", "SENTRY_DSN", "PATH", "KEYBOARD", "TOKENIZER_PATH"]
    shown = bash('for n in "$@"; do is_secret_env "$n" && echo "$n"; done', *names).stdout.split()
    assert shown == [n for n in names if SECRET_NAME.search(n.upper())] == ["HF_TOKEN", "github_pat", "SENTRY_DSN"]


@pytest.mark.parametrize(
    "env, says",
    [
        ({"METRICS_REMOTE_WRITE_URL": "ftp://central/x"}, "METRICS_REMOTE_WRITE_URL='ftp://central/x' must be http(s)"),
        (
            {"METRICS_REMOTE_WRITE_URL": "https://me:hunter2@central/api/v1/write"},
            "METRICS_REMOTE_WRITE_URL='https://<credentials>@central/api/v1/write' must be",
        ),  # fmt: skip
        ({"METRICS_REMOTE_WRITE_URL": "https://central/it's"}, "must be http(s)://HOST[:PORT]/PATH"),
        ({"METRICS_REMOTE_WRITE_CREDENTIALS": "token.txt"}, "must be an absolute path"),
        ({"METRICS_REMOTE_WRITE_CREDENTIALS": "/nonexistent/token"}, "is not a file"),
        ({"METRICS_REMOTE_WRITE_USER": "me and you"}, "must be a name of letters, digits and . _ @ + -"),
    ],
)
def test_remote_write_settings_are_checked_at_launch_in_one_line(env, says):
    res = bash("check_settings", env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and says in lines[0], res.stderr
    assert "hunter2" not in res.stderr


def test_a_remote_write_secret_others_can_read_is_refused(tmp_path):
    f = tmp_path / "token"
    f.write_text("t0ken")
    f.chmod(0o640)
    res = bash("check_settings", env={"METRICS_REMOTE_WRITE_CREDENTIALS": str(f)})
    assert res.returncode == 1 and "has mode 640: others can read your remote write secret; chmod 600 it" in res.stderr
    f.chmod(0o600)
    assert bash("check_settings", env={"METRICS_REMOTE_WRITE_CREDENTIALS": str(f)}).returncode == 0
