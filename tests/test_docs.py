"""The docs name what exists: every repository path a markdown doc names is in the clone, and the
command tables (README's Layout row, docs/layout.md's blocks for utils/, utils/dev/ and bench/) list
exactly the programs of their folder (the files with a #! line)."""

import re

from conftest import REPO

DOCS = [
    REPO / "README.md",
    REPO / "CLAUDE.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "skills").rglob("*.md")),
]
# a path under one of the project's folders, as prose or code names it (not inside a URL or a longer path)
REPO_PATH = re.compile(r"(?<![\w/.$~-])((?:utils|tests|bench|docs|skills|configs|requirements|\.ci)/[\w./-]*\w)")
# a placeholder segment: MODEL.yml, NAME, TOOL.py
PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z_]+(\.\w+)?(/|$)")
NOT_IN_A_CLONE = {
    "configs/site.env.sh": "the site's own file, git-ignored (the clone has configs/site.env.sh.example)",
    "configs/base.yml": "MaxText's packaged config, which every config of ours starts from",
    "configs/x.yml": "the made-up config of an example error message",
}


def test_paths_the_docs_name_exist():
    missing = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for path in REPO_PATH.findall(line):
                if (REPO / path).exists() or path in NOT_IN_A_CLONE or PLACEHOLDER.search(path):
                    continue
                missing.append(f"{doc.relative_to(REPO)}:{number}: {path}")
    assert missing == [], "paths the docs name that the clone does not have:\n" + "\n".join(missing)


def test_the_exceptions_are_still_needed():
    """Each path NOT_IN_A_CLONE lets through is still named somewhere and still missing."""
    text = "\n".join(doc.read_text() for doc in DOCS)
    for path in NOT_IN_A_CLONE:
        assert path in text and not (REPO / path).exists(), path


def test_agents_md_is_a_link_to_claude_md():
    """One set of agent instructions: AGENTS.md (read by agents other than Claude Code) is CLAUDE.md."""
    agents = REPO / "AGENTS.md"
    assert agents.is_symlink() and agents.resolve() == (REPO / "CLAUDE.md").resolve()


def programs(folder: str) -> set[str]:
    """The programs directly in FOLDER: its files with a #! line."""
    return {p.name for p in (REPO / folder).iterdir() if p.is_file() and p.read_bytes()[:2] == b"#!"}


def layout_block(folder: str) -> set[str]:
    """The program names of docs/layout.md's block for FOLDER: the names that open its lines (before
    the description), from the line that opens with FOLDER to the next blank line."""
    lines = (REPO / "docs" / "layout.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(folder + " "))
    names = set()
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        for word in line.split():
            if not re.fullmatch(r"[\w-]+\.(sh|py)", word):
                break
            names.add(word)
    return names


def test_layout_lists_exactly_the_programs():
    for folder in ("utils/", "utils/dev/", "bench/"):
        assert layout_block(folder) == programs(folder), f"docs/layout.md's {folder} block"


def test_readme_layout_row_lists_exactly_the_commands():
    row = next(ln for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("| `utils/*.sh`"))
    assert set(re.findall(r"`([\w-]+\.(?:sh|py))`", row)) == programs("utils/")
