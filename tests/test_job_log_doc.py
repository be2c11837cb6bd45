"""docs/job-log.md stays true to the launcher: every key the JOB header and the JOB SUMMARY can print
is in its tables, and every key its tables name is one the scripts print (the diagnosis tools and
agents read the log by that document)."""

import re

from conftest import REPO

DOC = (REPO / "docs" / "job-log.md").read_text()


def doc_keys(section: str) -> set[str]:
    """The `key` names in the first column of the table under a '### SECTION' heading."""
    body = DOC.split(f"### {section}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    keys: set[str] = set()
    for row in re.findall(r"^\| ([^|]+) \|", body, re.M):
        keys.update(re.findall(r"`([a-z_]+)`", row))
    return keys


def test_header_keys_are_documented():
    script = (REPO / "utils/launch/job_header.sh").read_text()
    printed = set(re.findall(r"^(?:\$\{\w+_line\})?([a-z_]+): ", script, re.M))
    printed |= set(re.findall(r'\w+_line\+?="([a-z_]+): ', script))
    assert {"job", "nodes", "started", "site", "run"} <= printed, printed
    assert printed == doc_keys("JOB header")


def test_summary_keys_are_documented():
    script = (REPO / "utils/launch/job_summary.sh").read_text()
    printed = set(re.findall(r"""(?:echo|printf) ['"]([a-z_]+): """, script))
    assert {"status", "stage", "failed_nodes", "cores", "resubmit"} <= printed, printed
    assert printed == doc_keys("JOB SUMMARY")
