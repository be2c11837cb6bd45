"""One self-contained HTML page of a diagnosis: `utils/diagnose.py JOB --report DIR` (docs/diagnose.md,
"Report page").

The page holds the verdict and its summary, the culprit hosts, every deciding finding with its evidence
(summary, window, values, PromQL, the command that checks it) and its per-host chart, the job's
throughput phases, loss / tokens/s / TFLOP/s over time, the comparison with --vs, and what was ruled
out or missing. Charts are matplotlib figures saved as SVG and put inline, the CSS is inline: the page
needs no network and no other file. Every string that came from the job (host names, log text,
queries) is escaped.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
import re
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from diagnosis import evidence as ev

try:
    import joblog
except ImportError:  # pragma: no cover - part of the repo; without it the step lines are not read
    joblog = None

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: #1d2330;
       margin: 0 auto; max-width: 1040px; padding: 16px 24px 48px; background: #fff; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #dde; }
h3 { font-size: 15px; margin: 18px 0 6px; } h4 { font-size: 13px; margin: 10px 0 4px; color: #445; }
.verdict { display: inline-block; padding: 1px 10px; border-radius: 10px; background: #c62828; color: #fff; }
.verdict.v-none { background: #2e7d32; }
.summary { font-size: 15px; background: #f5f6fa; border-left: 4px solid #c62828; padding: 8px 12px; }
.host { font-family: ui-monospace, "DejaVu Sans Mono", monospace; background: #fdecea; color: #b71c1c;
        padding: 0 5px; border-radius: 4px; margin-right: 4px; }
.meta, .muted { color: #667; font-size: 12px; }
pre { background: #f5f6fa; padding: 6px 10px; overflow-x: auto; font-size: 12px; white-space: pre-wrap;
      word-break: break-all; margin: 4px 0; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
td, th { border: 1px solid #dde; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f0f1f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 6px 0; } figure svg { width: 100%; height: auto; }
.finding { border: 1px solid #dde; border-radius: 6px; padding: 4px 14px 10px; margin: 12px 0; }
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _hosts(hosts: list[str]) -> str:
    return " ".join(f'<span class="host">{_e(h)}</span>' for h in hosts) or '<span class="muted">none</span>'


# values in unix s, shown in UTC
TIMES = ("start", "end", "ended", "last_step_time", "last_tb_step_time", "last_step_logged", "leak_onset", "claim_time")


def _num(v: object, key: str = "") -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if key in TIMES and 1e8 < v < 1e11:
        return ev.utc(v)
    if isinstance(v, int) or not math.isfinite(v):
        return str(v) if math.isfinite(v) else "n/a"
    return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.10g}"  # unix times and byte counts whole


def _flat(v: object) -> bool:
    return isinstance(v, dict) and all(not isinstance(x, dict | list) for x in v.values())


def _value(v: object, key: str = "", limit: int = 600) -> str:
    """A finding's value as one readable line: numbers rounded, {host: x} as "host x, ...", times in UTC."""
    if _flat(v):
        text = ", ".join(f"{k} {_num(x, str(k))}" for k, x in v.items())
    elif isinstance(v, list) and v and all(_flat(x) for x in v):
        text = "; ".join(_value(x) for x in v)
    elif isinstance(v, dict | list):
        text = json.dumps(v, separators=(", ", ": "))
    else:
        text = _num(v, key)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _window(w: dict | None) -> str:
    return f"{ev.utc(w['start'])} .. {ev.utc(w['end'])} ({ev.dur(w['end'] - w['start'])})" if w else "whole run"


# --- charts ---------------------------------------------------------------------------------------
def _svg(fig: Any) -> str:
    """The figure as an inline <svg> element (no XML prolog, no metadata block)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)


def _figure(kind: str, svg: str, caption: str) -> str:
    return f'<figure data-chart="{_e(kind)}">{svg}<figcaption class="muted">{_e(caption)}</figcaption></figure>'


def _hours(t: np.ndarray, x0: float) -> np.ndarray:
    return (np.asarray(t, float) - x0) / 3600


def _axis(ax: Any, d: ev.Data) -> None:
    """The time axis every chart shares: the data's whole range, in hours since its start."""
    x0 = float(d.grid[0])
    pad = 0.01 * (d.end - x0) / 3600
    ax.set_xlim(-pad, (d.end - x0) / 3600 + pad)
    ax.set_xlabel(f"hours since {ev.utc(x0)}")


def _phases_chart(d: ev.Data, plt: Any) -> str | None:
    y = d.tb.get("tokens")
    unit = "tokens/s/device"
    if y is None or not np.isfinite(y).any():
        st = d.tb.get("step_time")
        if st is None or not np.isfinite(st).any():
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            y, unit = 1.0 / st, "steps/s"
    x0 = float(d.grid[0])
    fig, ax = plt.subplots(figsize=(10, 3.0))
    ax.plot(_hours(d.grid, x0), y, color="tab:blue", lw=1)
    for i, p in enumerate(d.phases):
        a, b = (p["start"] - x0) / 3600, (p["end"] - x0) / 3600
        ax.axvspan(a, b, color="tab:orange" if i % 2 else "tab:green", alpha=0.12)
        ax.hlines(p["level"], a, b, colors="black", lw=2)
        ax.annotate(
            f"phase {i + 1}: {ev.fmt(p['level'])}",
            ((a + b) / 2, p["level"]),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 3),
            textcoords="offset points",
        )
    ax.set_ylabel(unit)
    _axis(ax, d)
    ax.set_title(f"{d.target.name}: throughput and its phases (shaded)")
    fig.tight_layout()
    return _svg(fig)


def _finding_chart(f: ev.Finding, d: ev.Data, plt: Any) -> str:
    x0 = float(d.grid[0])
    fig, ax = plt.subplots(figsize=(10, 3.2))
    ev.draw_hosts(ax, f, x0)
    _axis(ax, d)
    fig.tight_layout()
    return _svg(fig)


def _step_lines(log: Path | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Loss, tokens/s and TFLOP/s per device over time from the log's step lines (one host's), by name."""
    if log is None or joblog is None:
        return {}
    try:
        table = joblog.read_steps(log, joblog.scan(log).steps.clock)
    except (OSError, ValueError):
        return {}
    st = next(iter(table.hosts.values()), None)
    if st is None:
        return {}
    rows = [(st.ts(i), i) for i in range(len(st.step))]
    rows = [(t, i) for t, i in rows if t is not None]
    out = {}
    for name, col in (("loss", st.loss), ("tokens", st.tokens), ("tflops", st.tflops)):
        pts = [(t, col[i]) for t, i in rows if col[i] is not None]
        if pts:
            out[name] = (np.array([p[0] for p in pts]), np.array([p[1] for p in pts], float))
    return out


def _training_chart(d: ev.Data, log: Path | None, plt: Any) -> tuple[str, str] | None:
    """(svg, where the data came from): loss, tokens/s/device and TFLOP/s/device over time."""
    names = {"loss": "loss", "tokens": "tokens/s/device", "tflops": "TFLOP/s/device"}
    series = {k: (d.grid, d.tb[k]) for k in names if k in d.tb and np.isfinite(d.tb[k]).any()}
    source = "TensorBoard scalars in the TSDB (tb_learning_loss, tb_perf_*), per query step"
    if not series:
        series, source = _step_lines(log), "the log's step lines"
    if not series:
        return None
    x0 = float(d.grid[0])
    fig, axes = plt.subplots(len(series), 1, figsize=(10, 1.9 * len(series) + 0.6), sharex=True, squeeze=False)
    for ax, (k, (t, y)) in zip(axes[:, 0], series.items(), strict=True):
        ax.plot(_hours(t, x0), y, lw=1, color="tab:purple" if k == "loss" else "tab:blue")
        ax.set_ylabel(names[k])
    axes[0][0].set_title("training over time")
    _axis(axes[-1][0], d)
    fig.tight_layout()
    return _svg(fig), source


# --- the page ---------------------------------------------------------------------------------------
def _finding(i: int, fj: dict, f: ev.Finding | None, d: ev.Data | None, tsdb: str, plt: Any) -> str:
    parts = [
        f'<article class="finding" data-kind="{_e(fj["kind"])}"><h3>{i}. {_e(fj["kind"])} '
        f'<span class="muted">[{_e(_window(fj["window"]))}] score {fj["score"]}</span></h3>',
        f"<p>{_e(fj['summary'])}</p>",
        f"<p>Hosts: {_hosts(fj['hosts'])}</p>",
    ]
    for key in ("accused_hosts", "suspect_hosts"):
        if key in fj:
            parts.append(f"<p>{_e(key.replace('_', ' ').capitalize())}: {_hosts(fj[key])}</p>")
    if f is not None and f.plot and d is not None and d.grid.size:
        what = "culprits in colour, peers grey" if f.plot["highlight"] else "every host alike"
        parts.append(_figure("finding", _finding_chart(f, d, plt), f"{f.plot['title']} ({what}; window shaded)"))
    if fj["values"]:
        rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_value(v, k))}</td></tr>" for k, v in fj["values"].items())
        parts.append(f"<h4>Values</h4><table>{rows}</table>")
    if fj["queries"]:
        parts.append("<h4>PromQL</h4>" + "".join(f"<pre>{_e(q)}</pre>" for q in fj["queries"] if q))
    checks = fj.get("verify") or []
    if checks:
        parts.append("<h4>Check it yourself</h4>")
    for v in checks:
        cmd = "utils/prometheus.sh query {} {} --range {} {} {}".format(
            *map(shlex.quote, (v["tsdb"], v["query"])),
            *(f"{float(v[k]):.3f}".rstrip("0").rstrip(".") for k in ("start", "end", "step")),
        )
        e = v["expect"]
        got = "; ".join(f"{k}: {_value(x)}" for k, x in e.items() if x not in ({}, None))
        parts.append(
            f"<pre>{_e(cmd)}</pre>"
            f'<p class="muted">{_e(v["signal"])} ({_e(v["job"])}): {_e(v["reducer"])} of each series -> {_e(got)} '
            f"{_e(v.get('unit') or '')}; {_e(v.get('shows') or '')} (direction: {_e(v.get('direction'))})</p>"
        )
    return "".join(parts) + "</article>"


def _table(head: list[str], rows: list[list[object]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{_e(_num(c))}</td>' if isinstance(c, float) else f"<td>{_e(c)}</td>" for c in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def page(r: dict) -> str:
    """The HTML page of diagnose's report R (with its "_report" for the charts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep: ev.Report | None = r.get("_report")
    d = rep.data if rep is not None else None
    objs: list[ev.Finding | None] = [None] * len(r["findings"])
    if rep is not None and len(rep.findings) == len(objs):
        objs = list(rep.findings)  # r["findings"] is rep.findings (sorted) as JSON, in the same order
    pairs = list(zip(r["findings"], objs, strict=True))
    deciding = [(fj, f) for fj, f in pairs if fj["kind"] in ev.VERDICTS]
    other = [fj for fj, _ in pairs if fj["kind"] not in ev.VERDICTS]
    name, verdict = r["job_name"], r["verdict"]
    out = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(name)}: {_e(verdict)}</title><style>{CSS}</style></head><body>",
        f'<header><h1>{_e(name)}: <span class="verdict v-{_e(verdict)}" id="verdict">{_e(verdict)}</span></h1>',
        f'<p class="summary">{_e(r["summary"])}</p>',
        f"<p>Culprit hosts: {_hosts(r['culprit_hosts'])}</p>",
    ]
    if r["insufficient_evidence"]:
        out.append("<p><strong>Insufficient evidence:</strong> no hardware or training metrics to judge from.</p>")
    rg = r.get("range")
    meta = [f"TSDB {r['tsdb']}", f"log {r['log'] or 'none'}"]
    if rg:
        span = f"{ev.utc(rg['start'])} .. {ev.utc(rg['end'])} ({ev.dur(rg['end'] - rg['start'])})"
        grid = f"query step {rg['step']:g} s, scrape ~{rg['interval']:.3g} s"
        meta.insert(0, f"data {span}, {len(r['hosts'])} hosts, {grid}")
    if r.get("vs"):
        auto = r["vs"].get("auto")
        meta.append(f"compared with {r['vs']['other']}" + (f" (--vs auto: {auto['why']})" if auto else ""))
    meta.append(f"made by utils/diagnose.py --report at {ev.utc(time.time())}")
    out.append('<p class="meta">' + "<br>".join(_e(m) for m in meta) + "</p></header>")

    with matplotlib.rc_context({"svg.fonttype": "none", "text.parse_math": False, "font.size": 9}):
        out.append('<section id="phases"><h2>Throughput phases</h2>')
        chart = _phases_chart(d, plt) if d is not None and d.grid.size else None
        if chart:
            out.append(_figure("phases", chart, "tokens/s per device over the run; phases shaded, their medians black"))
        if r["phases"]:
            rows = [
                [
                    ev.utc(p["start"]),
                    ev.utc(p["end"]),
                    ev.dur(p["end"] - p["start"]),
                    float(p["level"]),
                    p.get("unit", ""),
                ]
                for p in r["phases"]
            ]
            out.append(_table(["start", "end", "length", "median", "unit"], rows))
        else:
            out.append('<p class="muted">no throughput series (tb_perf_*) in the TSDB</p>')
        out.append("</section>")

        out.append('<section id="findings"><h2>Deciding findings</h2>')
        if not deciding:
            out.append('<p class="muted">none: no check found an incident</p>')
        for i, (fj, f) in enumerate(deciding, 1):
            out.append(_finding(i, fj, f, d, r["tsdb"], plt))
        out.append("</section>")

        training = _training_chart(d, Path(r["log"]) if r["log"] else None, plt) if d is not None else None
        out.append('<section id="training"><h2>Loss, tokens/s, TFLOP/s</h2>')
        if training:
            out.append(_figure("training", training[0], f"from {training[1]}"))
        else:
            out.append('<p class="muted">no training series: no tb_* scalars and no step lines</p>')
        out.append("</section>")

    vs = r.get("vs")
    if vs:
        out.append(f'<section id="vs"><h2>Compared with {_e(vs["other"])}</h2>')
        out.append(f'<p class="muted">{_e(vs["shared_hosts"])} shared hosts; effect = difference / noise</p>')
        rows = [
            [
                x["family"],
                float(x["effect"]),
                f"{x['relative'] * 100:+.1f} %",
                x["hosts"],
                float(x["this_median"]),
                float(x["other_median"]),
            ]
            for x in vs["ranked"]
        ]
        out.append(
            _table(["family", "effect", "relative", "hosts", "this job", vs["other"]], rows)
            if rows
            else '<p class="muted">no family differs</p>'
        )
        out.append("</section>")

    out.append('<section id="checks"><h2>Other findings and checks</h2>')
    if other:
        out.append("<h4>Informational findings</h4><ul>")
        out += [f"<li><b>{_e(fj['kind'])}</b> {_hosts(fj['hosts'])} {_e(fj['summary'])}</li>" for fj in other]
        out.append("</ul>")
    if r["ruled_out"]:
        out.append('<h4>Ruled out</h4><ul id="ruled-out">')
        out += [f"<li><b>{_e(c['check'])}</b>: {_e(c['detail'])}</li>" for c in r["ruled_out"]]
        out.append("</ul>")
    if r["skipped"]:
        items = ", ".join(f"{s['check']} (needs {' or '.join(s['needs'])})" for s in r["skipped"])
        out.append(f"<h4>Not checked (no data)</h4><p>{_e(items)}</p>")
    out.append(f'<h4>Missing families</h4><p id="missing">{_e(", ".join(r["missing"]) or "none")}</p>')
    if r.get("notes"):
        out.append("<h4>Notes</h4><ul>" + "".join(f"<li>{_e(n)}</li>" for n in r["notes"]) + "</ul>")
    out.append("</section></body></html>\n")
    return "\n".join(out)


def path_for(r: dict, out: Path) -> Path:
    """Where the page of report R goes in directory OUT: OUT/<job name>-report.html."""
    return out / f"{r['job_name']}-report.html"


def write(r: dict, out: Path) -> Path:
    """Write the page to OUT/<job name>-report.html (made whole, then moved in place); its path.
    OSError when OUT cannot be made or written (nothing is left behind)."""
    text = page(r)
    out.mkdir(parents=True, exist_ok=True)
    dest = path_for(r, out)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
