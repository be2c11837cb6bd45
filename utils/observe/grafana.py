#!/usr/bin/env python3
"""Usage: grafana.py --out DIR [--datasource-uid UID]
       grafana.py --list

Writes the project's Grafana dashboards as provisioning JSON, one file a dashboard, into DIR (made
when missing; files of the same names are replaced): maxtext-job.json (throughput, step time, loss,
learning rate), maxtext-gpus.json (utilization, power, temperature, clocks, memory, RAS/ECC and
PCIe errors), maxtext-network.json (NIC and TCP, RDMA traffic, transport and port errors) and
maxtext-hosts.json (CPU, pressure, memory, run queue, OOM kills). The panels are the rows of
utils/observe/dashboards.tsv, over the series of docs/metrics.md only, so they work on a job's TSDB
(utils/prometheus.sh view JOB, then a Prometheus data source at the address it prints) and on a
central Prometheus that holds the same series. Each dashboard asks for the Prometheus data source
(a variable; --datasource-uid UID fixes it instead) and the hosts to show (the host label).
Then point Grafana at DIR: a file provider (provisioning/dashboards/*.yaml) with `path: DIR`; the
lines of one are printed after the files are written. --list prints each dashboard's panels.
Exit 0; 2 with one line for bad input. Standard library only.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().with_name("dashboards.tsv")
COLUMNS = ["dashboard", "title", "unit", "legend", "expr"]
TITLES = {
    "job": "MaxText job: training",
    "gpus": "MaxText job: GPUs per host",
    "network": "MaxText job: network and RDMA per host",
    "hosts": "MaxText job: host pressure",
}
HOST_QUERY = "label_values(hw_procs_running, host)"  # every node's exporter serves it (host plugin)


class BadInput(Exception):
    pass


def panels() -> dict[str, list[dict[str, str]]]:
    """dashboard -> its panel rows, in the table's order."""
    lines = [ln for ln in TABLE.read_text().splitlines() if ln and not ln.startswith("#")]
    out: dict[str, list[dict[str, str]]] = {}
    rows = list(csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))
    if rows[0] != COLUMNS:
        raise ValueError(f"{TABLE}: the header is {rows[0]}, not {COLUMNS}")
    for n, row in enumerate(rows[1:], 2):
        if len(row) != len(COLUMNS) or row[0] not in TITLES:
            raise ValueError(f"{TABLE}: row {n} is not {len(COLUMNS)} fields of a known dashboard: {row}")
        out.setdefault(row[0], []).append(dict(zip(COLUMNS, row)))  # noqa: B905 - any python3 runs this
    return out


def dashboard(name: str, rows: list[dict[str, str]], ds_uid: str | None) -> dict:
    """One dashboard: time series panels two a row, a data source and a host variable."""
    ds = {"type": "prometheus", "uid": ds_uid or "${datasource}"}
    variables = [] if ds_uid else [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                    "query": "prometheus", "current": {}, "hide": 0}]  # fmt: skip
    variables.append(
        {
            "name": "host",
            "label": "Hosts",
            "type": "query",
            "datasource": ds,
            "definition": HOST_QUERY,
            "query": {"query": HOST_QUERY, "refId": "hosts"},
            "refresh": 2,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
            "sort": 1,
            "hide": 0,
        }
    )
    out = []
    for i, row in enumerate(rows):
        out.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": row["title"],
                "datasource": ds,
                "gridPos": {"x": 12 * (i % 2), "y": 8 * (i // 2), "w": 12, "h": 8},
                "fieldConfig": {"defaults": {"unit": row["unit"]}, "overrides": []},
                "options": {
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"},
                },
                "targets": [{"refId": "A", "datasource": ds, "expr": row["expr"], "legendFormat": row["legend"]}],
            }
        )
    return {
        "uid": f"maxtext-slurm-{name}",
        "title": TITLES[name],
        "tags": ["maxtext-slurm"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables},
        "panels": out,
    }


def write(out: Path, ds_uid: str | None) -> list[Path]:
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file, not a directory (give a directory for the dashboards)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"--out {out}: cannot make the directory ({e.strerror})") from None
    written = []
    for name, rows in panels().items():
        path = out / f"maxtext-{name}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(dashboard(name, rows, ds_uid), indent=2) + "\n")
        os.replace(tmp, path)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    out, ds_uid, listing = None, None, False
    args = list(argv)
    try:
        while args:
            a = args.pop(0)
            if a in ("--out", "--datasource-uid"):
                if not args or not args[0] or args[0].startswith("--"):
                    raise BadInput(f"{a} needs a value (see --help)")
                v = args.pop(0)
                if a == "--out":
                    out = Path(v)
                else:
                    ds_uid = v
            elif a == "--list":
                listing = True
            else:
                raise BadInput(f"unknown argument '{a}': give --out DIR or --list (see --help)")
        if listing == (out is not None):
            raise BadInput("give --out DIR or --list (see --help)")
        if listing:
            for name, rows in panels().items():
                print(f"maxtext-{name}.json: {TITLES[name]}")
                for r in rows:
                    print(f"  {r['title']}: {r['expr']}")
            return 0
        assert out is not None
        written = write(out, ds_uid)
    except BadInput as e:
        print(f"grafana.py: {e}", file=sys.stderr)
        return 2
    for p in written:
        print(f"wrote {p}")
    print(
        "\n# a Grafana file provider for them (provisioning/dashboards/maxtext-slurm.yaml):\n"
        "apiVersion: 1\nproviders:\n  - name: maxtext-slurm\n    type: file\n    folder: maxtext-slurm\n"
        f"    options:\n      path: {out.resolve()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
