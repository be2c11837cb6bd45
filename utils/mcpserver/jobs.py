"""list_jobs (the jobs of the workspace) and job_log_excerpt (a bounded piece of one job's log)."""

from __future__ import annotations

import collections
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from mcp.server.mcpserver.exceptions import ToolError

from bridge import paths
from diagnosis import jobdir, locate, tsdb
from mcpserver.reports import Context, triage_report

MAX_JOBS = 500  # list_jobs returns at most this many, newest id first
MAX_LINES = 200  # job_log_excerpt: lines returned at most
MAX_CHARS = 400  # ... and characters per line (a longer line is cut and says so)
MAX_LINE_BYTES = 8192  # bytes of a log line held (and searched by a pattern); the rest is read and dropped
CHUNK = 1 << 16  # the log is read in pieces of this size
MAX_PATTERN = 1000  # characters of a pattern
ADVICE = "give a job of the workspace (list_jobs)"
# docs/security.md "Secret names": the one pattern, utils/launch/secret_names.re (lib.sh reads it too), and
# MaxText's credential keys: a value the launcher missed is still not returned
SECRET_NAME = re.compile((Path(__file__).resolve().parents[1] / "launch" / "secret_names.re").read_text().strip())
SECRET_KEYS = {"HF_ACCESS_TOKEN"}
# NAME=VALUE; VALUE as a shell writes it: bare characters, backslash escapes and quoted strings ("a b",
# 'a b', $'a b') glued together; a quote left open (a line cut short) runs to the line's end
VALUE = r"""(?:"(?:[^"\\]|\\.)*(?:"|$)|\$?'[^']*(?:'|$)|\\.|[^\s"'\\])+"""
ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(" + VALUE + ")?")
REDACTED = "<redacted>"


def is_secret(name: str) -> bool:
    """A secret-looking name (also as _env_NAME or M_NAME)."""
    bare = name.removeprefix("_env_").removeprefix("M_").upper()
    return bool(SECRET_NAME.search(bare)) or bare in SECRET_KEYS


def redact(line: str) -> str:
    """Every NAME=VALUE with a secret-looking NAME as NAME=<redacted>, VALUE whole: up to the next blank
    outside quotes (`HF_TOKEN="a b"` and `hf_access_token='a b'` lose the whole quoted value)."""
    if "=" not in line:
        return line
    return ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}" if is_secret(m.group(1)) else m.group(0), line)


def redact_arg(arg: str) -> str:
    """One argument NAME=VALUE (VALUE whole, blanks and all) with a secret-looking NAME as NAME=<redacted>."""
    name, eq, _ = arg.partition("=")
    return f"{name}={REDACTED}" if eq and re.fullmatch(r"[A-Za-z_]\w*", name) and is_secret(name) else arg


def open_log(ctx: Context, prog: str, log: Path) -> BinaryIO:
    """LOG opened for reading, never through a link, and only when what was opened is a regular file
    whose real path (the kernel's, /proc/self/fd: no race with a rename) lies in the workspace."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO does not block
    except OSError as e:
        raise ToolError(f"{prog}: cannot open the job log {log} (links are not followed): {e.strerror}") from None
    f = os.fdopen(fd, "rb", buffering=0)
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = f"it is not a regular file (owner {paths.owner(st.st_uid)}, mode {stat.filemode(st.st_mode)})"
    else:
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = str(log)  # no /proc: the checks before the open stand
        if not Path(real).is_relative_to(ctx.workspace):
            why = f"it was opened as {real}, outside the workspace {ctx.workspace}"
    if why:
        f.close()
        raise ToolError(f"{prog}: refusing job log {log}: {why}; {ADVICE}")
    return f


def lines(f: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[str, int]]:
    """The lines of F as (text, bytes dropped): at most LIMIT bytes of a line are kept, the rest is read
    and dropped, so that memory stays bounded (about CHUNK + LIMIT) whatever the file holds."""
    held = bytearray()
    dropped = 0
    while chunk := f.read(CHUNK):
        at = 0
        while at < len(chunk):
            nl = chunk.find(b"\n", at)
            end = len(chunk) if nl < 0 else nl
            room = limit - len(held)
            if room > 0:
                held += chunk[at : min(end, at + room)]
            dropped += max(0, end - at - max(room, 0))
            if nl < 0:
                break
            yield held.decode(errors="replace"), dropped
            held, dropped, at = bytearray(), 0, nl + 1
    if held or dropped:
        yield held.decode(errors="replace"), dropped


def list_jobs(ctx: Context) -> dict[str, Any]:
    """The jobs of the workspace: directories and logs named <id>-JAX-<model>[-<tag>] (not the earlier
    results submit.sh moved aside). A link is listed only when it is ours and leads into the workspace."""
    ws = ctx.workspace
    try:
        entries = list(jobdir.listing(ws))
    except OSError as e:
        raise ToolError(f"mcp_server.py: cannot read the workspace {ws}: {e.strerror or e}") from None
    names: dict[str, dict[str, Any]] = {}
    for name, p in entries:
        if p.is_symlink():
            try:
                paths.confine(p, [ws], "job")
            except paths.Outside:
                continue
        names.setdefault(name, {})
    jobs = []
    for name in names:
        d = ws / name
        is_dir = d.is_dir()
        log = jobdir.log_of(d) if is_dir else (ws / f"{name}.log")
        jobs.append(
            {
                "name": name,
                "id": locate.job_id_of(name),
                "status": jobdir.summary(d).get("status") if is_dir else None,
                "has_tsdb": is_dir and tsdb.is_tsdb(jobdir.tsdb_dir(d)),
                "has_log": log is not None and log.is_file(),
                "dir": str(d) if is_dir else None,
            }
        )

    def order(j: dict) -> tuple:
        jid = j["id"] or ""
        return (int(jid) if jid.isdigit() else -1, j["name"])

    jobs.sort(key=order, reverse=True)
    return {
        "workspace": str(ws),
        "jobs": jobs[:MAX_JOBS],
        "total": len(jobs),
        "truncated": len(jobs) > MAX_JOBS,
    }


def job_log_excerpt(
    ctx: Context,
    job: str,
    line: int | None = None,
    pattern: str | None = None,
    before: int = 20,
    after: int = 20,
) -> dict[str, Any]:
    """LINE's neighbourhood, else the first match of PATTERN (searched in each line as it would be shown:
    its first MAX_LINE_BYTES, secret values redacted), else the line triage cites first (its decisive
    evidence; else the log's end): at most MAX_LINES lines, each cut at MAX_CHARS characters, secret values
    redacted."""
    prog = "job_log_excerpt"
    found = ctx.find(prog, job, need_log=True)
    assert found.log is not None
    if line is not None and pattern is not None:
        raise ToolError(f"{prog}: give line or pattern, not both")
    rx = None
    if pattern is not None:
        if len(pattern) > MAX_PATTERN:
            raise ToolError(f"{prog}: a pattern of {len(pattern)} characters; at most {MAX_PATTERN}")
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ToolError(f"{prog}: pattern {pattern!r} is not a regular expression: {e}") from None
    before, after = max(0, before), max(0, after)
    if before + after + 1 > MAX_LINES:
        raise ToolError(f"{prog}: before + after + 1 = {before + after + 1} lines; at most {MAX_LINES}")
    how, why = ("line" if line is not None else "pattern"), None
    if line is None and rx is None:
        try:
            evidence = triage_report(ctx, found).value.get("evidence") or []
        except ToolError:  # not a job log triage can read: the log's end
            evidence = []
        first = next((e for e in evidence if e.get("file") == str(found.log) and e.get("line")), None)
        line, how, why = (first["line"], "triage_evidence", first.get("why")) if first else (None, "end", None)
    # a pattern sees each line as it would be shown, secret values redacted: it cannot test a secret
    test = (lambda n, text: n == line) if line is not None else (lambda n, text: bool(rx and rx.search(redact(text))))
    window: collections.deque[tuple[int, str, int]] = collections.deque(maxlen=before + 1)
    center, total, tail = None, 0, []
    with open_log(ctx, prog, found.log) as f:
        try:  # streamed, each line held up to MAX_LINE_BYTES: a log of gigabytes (or one giant line) is never held
            for total, (text, dropped) in enumerate(lines(f), 1):
                if center is None:
                    window.append((total, text, dropped))
                    if test(total, text):
                        center = total
                elif len(tail) < after:
                    tail.append((total, text, dropped))
        except OSError as e:
            raise ToolError(f"{prog}: cannot read {found.log}: {e.strerror or e}") from None
    if line is not None and center is None:  # (triage cites lines of this log: only a given line is outside)
        raise ToolError(f"{prog}: line {line} is outside the log (1..{total})")
    if center is None and rx is not None:
        return {
            "job": found.name,
            "log": str(found.log),
            "match": None,
            "lines": [],
            "total_lines": total,
            "lines_cut": 0,
        }
    if center is None:  # nothing triage cites: the log's end
        center = total
    out = []
    cut = 0
    for n, text, dropped in [*window, *tail]:
        text = redact(text)
        if len(text) > MAX_CHARS or dropped:
            more = len(text) - MAX_CHARS + dropped
            text, cut = text[:MAX_CHARS] + f" [... {more} more characters]", cut + 1
        out.append({"line": n, "text": text})
    return {
        "job": found.name,
        "log": str(found.log),
        "match": {"how": how, "line": center, **({"why": why} if why else {})},
        "lines": out,
        "total_lines": total,
        "lines_cut": cut,
    }
