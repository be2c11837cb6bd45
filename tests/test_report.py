"""utils/diagnose.py --report DIR: the one-page HTML incident report, as a user sees it.

Incidents from the corpus (tests/helpers/corpus.py: a network one and a hang, a thread leak with --vs
auto) are diagnosed through the command line with --report, and each page is loaded in headless
Chromium: the DOM it builds (title, verdict, one chart per deciding finding plus the phases chart,
the culprit hosts, no external references) and a screenshot that is not blank. Bad DIR: one line,
exit 2, nothing written. Strings from the job are escaped (a crafted report).
"""

import html
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import run
from PIL import Image

from diagnosis import diagnose, report
from helpers import corpus, inproc

CHROMIUM = shutil.which("chromium")
SIZE = (1500, 1100)  # the screenshot's height and width: the top of the page (docs/images/incident-report.png)


@pytest.fixture(autouse=True, scope="module")
def _tools() -> None:
    # tests/run.sh installs them (utils/setup_system.sh tests, observe); missing is a failure, not a skip
    assert shutil.which("prometheus"), "needs prometheus (apt-get install prometheus)"
    assert CHROMIUM, "needs chromium (utils/setup_system.sh tests, or apt-get install --no-install-recommends chromium)"


class Page(HTMLParser):
    """What a loaded page shows: its title, the verdict, the charts by kind, host badges, links."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.title = self.verdict = ""
        self.charts: list[str] = []
        self.svgs = 0
        self.hosts: list[str] = []
        self.refs: list[str] = []  # src/href values
        self.tags: set[str] = set()
        self._in: str | None = None
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        self.svgs += tag == "svg"
        if tag == "figure" and a.get("data-chart"):
            self.charts.append(a["data-chart"] or "")
        self.refs += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href", "action")]
        if tag == "title" and not self.title:
            self._in = "title"
        elif a.get("id") == "verdict":
            self._in = "verdict"
        elif "host" in (a.get("class") or "").split():
            self._in = "host"

    def handle_data(self, data: str) -> None:
        if self._in == "title":
            self.title += data
        elif self._in == "verdict":
            self.verdict += data
        elif self._in == "host":
            self.hosts.append(data)

    def handle_endtag(self, tag: str) -> None:
        self._in = None


def chromium(page: Path, *args: str) -> subprocess.CompletedProcess:
    # as root Chromium refuses to start without --no-sandbox; its profile goes beside the page's folder
    profile = page.parent.parent / "chromium-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}"]
    return run([*cmd, *args, page.as_uri()], timeout=60)


def view(page: Path, png: Path | None = None) -> tuple[Page, np.ndarray | None]:
    """The page as Chromium builds it (--dump-dom) and, with PNG, its screenshot (one start for both)."""
    shot = [f"--window-size={SIZE[1]},{SIZE[0]}", f"--screenshot={png}"] if png else []
    res = chromium(page, *shot, "--dump-dom")
    assert res.returncode == 0 and "<svg" in res.stdout, res.stderr[-2000:]
    assert png is None or png.is_file(), res.stderr[-2000:]
    return Page(res.stdout), np.asarray(Image.open(png).convert("RGB")) if png else None


def diagnose_cli(*args: object) -> dict:
    res = inproc.tool("diagnose", *args, "--json")  # helpers/inproc.py
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("report")


INCIDENTS = {"rdma_retransmits": "4242", "hang": "5151"}  # family -> job id
_built: dict[str, corpus.Incident] = {}


def incident(ws: Path, family: str) -> corpus.Incident:
    """The corpus incident of FAMILY (seed 2), built once per module."""
    if family not in _built:
        _built[family] = corpus.build(family, ws / family, 2, job_id=INCIDENTS[family])
    return _built[family]


# one Chromium start each (~8 s of CPU): the whole suite loads every page; the fast loop checks the
# pages' content without a browser (the tests below)
@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("family", INCIDENTS)
def test_report_page_in_chromium(ws, tmp_path, family):
    inc = incident(ws, family)
    r = diagnose_cli(inc.job_dir, "--report", tmp_path / "out")
    page = Path(r["report_page"])
    assert page == tmp_path / "out" / f"{inc.job_dir.name}-report.html" and page.is_file()
    assert r["verdict"] == inc.verdict and sorted(r["culprit_hosts"]) == sorted(inc.culprits)

    dom, png = view(page, tmp_path / "page.png")
    assert inc.job_dir.name in dom.title and inc.verdict in dom.title, dom.title
    assert dom.verdict == inc.verdict
    deciding = [f for f in r["findings"] if f["kind"] in diagnose.VERDICTS]
    assert deciding and dom.charts.count("finding") == len(deciding), (dom.charts, [f["kind"] for f in r["findings"]])
    assert dom.charts.count("phases") == 1 and dom.charts.count("training") == 1, dom.charts
    assert dom.svgs == len(dom.charts)  # every chart is an inline SVG, and nothing else is
    assert set(inc.culprits) <= set(dom.hosts), (inc.culprits, dom.hosts)
    text = page.read_text()
    chart = text.split('<figure data-chart="finding">', 1)[1].split("</figure>", 1)[0]
    for h in inc.culprits:  # named in the finding's chart too (culprits in colour, in its legend)
        assert f">{h}</text>" in chart, h
    assert not [u for u in dom.refs if u.startswith(("http://", "https://", "//"))], dom.refs
    assert not dom.tags & {"script", "link", "img", "iframe", "object"}, dom.tags
    for f in deciding:  # its evidence: the PromQL and the command that checks it
        assert all(html.escape(q) in text for q in f["queries"] if q), f["queries"]
        assert not f["verify"] or html.escape(f"utils/prometheus.sh query {inc.job_dir}/prometheus") in text

    assert png is not None and png.shape[:2] == SIZE and (tmp_path / "page.png").stat().st_size > 20_000
    assert png.std() > 20 and len(np.unique(png.reshape(-1, 3), axis=0)) > 100  # text and charts, not blank
    if family == "rdma_retransmits" and os.environ.get("MST_REPORT_SCREENSHOT"):  # docs/images/incident-report.png
        shutil.copyfile(tmp_path / "page.png", os.environ["MST_REPORT_SCREENSHOT"])


@pytest.mark.slow  # a Chromium start and two diagnoses
def test_report_with_vs_auto_has_the_comparison(ws, tmp_path):
    inc = corpus.build("thread_leak", ws / "leak", 1)
    r = diagnose_cli(inc.job_dir, "--vs", "auto", "--workspace", ws / "leak", "--report", tmp_path)
    assert r["vs"]["other"] == inc.vs.name and r["verdict"] == "cpu_contention"
    dom, _ = view(Path(r["report_page"]))
    text = Path(r["report_page"]).read_text()
    assert f"Compared with {inc.vs.name}" in text and "hw_procs_running" in text.split('id="vs"')[1]
    assert dom.charts.count("finding") >= 1 and dom.charts.count("phases") == 1


def test_bad_report_dir_is_one_line(ws, tmp_path):
    inc = incident(ws, "rdma_retransmits")
    afile = tmp_path / "a-file"
    afile.write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    # root writes into a 0555 directory, but not into sysfs (no regular files there)
    bad = [afile, afile / "sub", *([ro, ro / "sub"] if os.geteuid() else [Path("/sys/report")])]
    for out in bad:
        res = inproc.tool("diagnose", inc.job_dir, "--report", out)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and "--report" in lines[0], res.stderr
        assert "Traceback" not in res.stderr and res.stdout == ""
    assert afile.read_text() == "x" and list(ro.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "ro"]  # nothing written


def test_strings_from_the_job_are_escaped(tmp_path):
    evil = '<script>alert("x")</script><img src="http://evil.example/x.png">'
    r = {
        "job_name": "7-JAX-tiny",
        "verdict": "none",
        "summary": evil,
        "culprit_hosts": [evil],
        "insufficient_evidence": True,
        "tsdb": "/ws/7/prometheus",
        "log": None,
        "range": None,
        "hosts": [],
        "phases": [],
        "findings": [
            {
                "kind": "host_outlier",
                "summary": evil,
                "hosts": [evil],
                "window": None,
                "queries": [evil],
                "values": {evil: evil},
                "score": 0.2,
                "verify": None,
            }
        ],  # fmt: skip
        "ruled_out": [{"check": "hang", "families": [], "detail": evil}],
        "skipped": [],
        "missing": ["hw_*", "tb_*"],
        "notes": [evil],
        "vs": None,
        "_report": None,
    }
    text = report.page(r)
    assert "<script" not in text and "<img" not in text and "&lt;script&gt;" in text
    out = report.write(r, tmp_path / "new")
    assert out == tmp_path / "new" / "7-JAX-tiny-report.html" and "&lt;script&gt;" in out.read_text()
    assert [p.name for p in (tmp_path / "new").iterdir()] == [out.name]


def test_without_tensorboard_the_training_chart_comes_from_the_step_lines(tmp_path):
    inc = corpus.build("healthy", tmp_path, 3, drop=("tb_",))
    r = diagnose.diagnose(diagnose.locate(str(inc.job_dir)))
    text = report.page(r)
    assert r["verdict"] == "none" and "tb_*" in r["missing"]
    assert text.count('data-chart="training"') == 1 and "from the log&#x27;s step lines" in text
    assert 'data-chart="phases"' not in text and "no throughput series" in text
    assert "none: no check found an incident" in text and 'class="verdict v-none"' in text
